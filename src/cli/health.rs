//! `envlens health`: the health of the Kubernetes objects in manifest files, judged by the very
//! rules the service applies to a live environment ([`crate::resources::health::health`]).
//!
//! Reading and printing only; the parsing is [`crate::resources::manifests`]. Everything writes to
//! `impl Write` so the tests see exactly what a terminal would.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::resources::health::{health_with, Customizations, Health};
use crate::resources::manifests;
use crate::resources::tree::TreeBuf;

pub use crate::config::OutputFormat as Format;

/// One object's identity and health, in input order.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub api_version: Option<String>,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// None when no rule applies to the kind (a ConfigMap), which is not `Unknown`.
    pub health: Option<Health>,
}

impl Report {
    pub fn of(object: &Value, custom: &Customizations) -> Self {
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Report {
            api_version: text("/apiVersion"),
            kind: text("/kind").unwrap_or_default(),
            namespace: text("/metadata/namespace").filter(|ns| !ns.is_empty()),
            name: text("/metadata/name").unwrap_or_default(),
            health: health_with(&TreeBuf::from(object), || Some(object.clone()), custom),
        }
    }
}

/// Reads `files` (`-`, or no file at all, for standard input), prints one report per object to
/// `out`, and explains every file or document that could not be read on `err`, naming it.
/// Returns how many could not be read: the objects that could are printed all the same.
pub fn run(
    files: &[PathBuf],
    format: Format,
    custom: &Customizations,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<usize> {
    let stdin_only = [PathBuf::from("-")];
    let files = if files.is_empty() {
        &stdin_only[..]
    } else {
        files
    };
    let mut reports = Vec::new();
    let mut failures = 0;
    for file in files {
        let (name, text) = match read_input(file, stdin) {
            Ok(read) => read,
            Err(e) => {
                writeln!(err, "error: {}: {e}", file.display())?;
                failures += 1;
                continue;
            }
        };
        let parsed = manifests::parse(&text);
        for warning in &parsed.warnings {
            writeln!(err, "warning: {name}: {warning}")?;
        }
        for problem in &parsed.errors {
            writeln!(err, "error: {name}: {problem}")?;
        }
        failures += parsed.errors.len();
        reports.extend(parsed.objects.iter().map(|o| Report::of(o, custom)));
    }
    match format {
        Format::Table => write_table(&reports, out)?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, &reports)?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(failures)
}

/// The display name and text of one input; `-` is standard input (read once: a second `-`
/// finds it empty, as `cat - -` does).
fn read_input(file: &Path, stdin: &mut dyn Read) -> io::Result<(String, String)> {
    let mut text = String::new();
    if file == Path::new("-") {
        stdin.read_to_string(&mut text)?;
        return Ok(("<stdin>".into(), text));
    }
    std::fs::File::open(file)?.read_to_string(&mut text)?;
    Ok((file.display().to_string(), text))
}

/// `KIND  NAME  HEALTH  MESSAGE`, columns three spaces apart as kubectl prints them; `-` for a
/// kind without a health rule. Nothing at all when there is no object.
pub fn write_table(reports: &[Report], out: &mut dyn Write) -> io::Result<()> {
    if reports.is_empty() {
        return Ok(());
    }
    let rows: Vec<[String; 4]> = reports
        .iter()
        .map(|r| {
            let name = match &r.namespace {
                Some(ns) => format!("{ns}/{}", r.name),
                None => r.name.clone(),
            };
            let (status, message) = match &r.health {
                Some(h) => (h.status.as_str(), h.message.as_deref().unwrap_or("")),
                None => ("-", ""),
            };
            [
                one_line(&r.kind),
                one_line(&name),
                status.to_string(),
                one_line(message),
            ]
        })
        .collect();
    let header = ["KIND", "NAME", "HEALTH", "MESSAGE"].map(String::from);
    let mut widths = [0usize; 3];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 3));
        }
        line.push_str(&row[3]);
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Container termination messages span lines and may hold escape sequences: a row stays one
/// line of plain text.
fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_on(stdin: &str, files: &[PathBuf], format: Format) -> (usize, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let none = Customizations::default();
        let failures = run(
            files,
            format,
            &none,
            &mut stdin.as_bytes(),
            &mut out,
            &mut err,
        )
        .expect("writing to memory");
        (
            failures,
            String::from_utf8(out).expect("utf-8"),
            String::from_utf8(err).expect("utf-8"),
        )
    }

    const MIXED: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop, generation: 2}
spec: {replicas: 2, paused: false}
status: {observedGeneration: 2, replicas: 2, updatedReplicas: 2, availableReplicas: 1}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.k8s.io}
status:
  conditions:
  - type: Available
    status: \"True\"
    reason: Passed
    message: all checks passed
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop}
spec: {restartPolicy: Always}
status:
  phase: Failed
  message: |
    The node was low on resource: memory.
    Container app was using 2Gi.
";

    #[test]
    fn table_from_standard_input() {
        let (failures, out, err) = run_on(MIXED, &[], Format::Table);
        assert_eq!((failures, err.as_str()), (0, ""));
        assert_eq!(
            out,
            "\
KIND         NAME                     HEALTH        MESSAGE
Deployment   shop/web                 Progressing   Waiting for rollout to finish: 1 of 2 updated replicas are available...
ConfigMap    shop/settings            -
APIService   v1beta1.metrics.k8s.io   Healthy       Passed: all checks passed
Pod          shop/web-1               Degraded      The node was low on resource: memory. Container app was using 2Gi.
"
        );
    }

    #[test]
    fn json_output() {
        let (failures, out, _) = run_on(MIXED, &[PathBuf::from("-")], Format::Json);
        assert_eq!(failures, 0);
        let got: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(
            got,
            serde_json::json!([
                {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "web",
                 "health": {"status": "Progressing", "message": "Waiting for rollout to finish: 1 of 2 updated replicas are available..."}},
                {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "shop", "name": "settings", "health": null},
                {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "namespace": null,
                 "name": "v1beta1.metrics.k8s.io", "health": {"status": "Healthy", "message": "Passed: all checks passed"}},
                {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-1",
                 "health": {"status": "Degraded", "message": "The node was low on resource: memory.\nContainer app was using 2Gi.\n"}},
            ])
        );
        // Keys in the documented order.
        assert!(out.starts_with("[\n  {\n    \"apiVersion\": \"apps/v1\",\n    \"kind\": \"Deployment\",\n    \"namespace\": \"shop\",\n    \"name\": \"web\",\n    \"health\": {\n      \"status\": \"Progressing\",\n      \"message\": "), "{out}");
    }

    #[test]
    fn empty_input() {
        assert_eq!(
            run_on("", &[], Format::Table),
            (0, String::new(), String::new())
        );
        assert_eq!(
            run_on("# nothing\n", &[], Format::Json),
            (0, "[]\n".into(), String::new())
        );
    }

    #[test]
    fn errors_name_the_file_and_document_and_the_rest_is_printed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.yaml");
        let bad = dir.path().join("bad.yaml");
        std::fs::write(
            &good,
            "kind: Service\napiVersion: v1\nmetadata: {name: a}\n",
        )
        .expect("write");
        std::fs::write(
            &bad,
            "kind: Service\napiVersion: v1\nmetadata: {name: b}\n---\nmetadata: {name: c}\n",
        )
        .expect("write");
        let missing = dir.path().join("missing.yaml");
        let files = [good, bad.clone(), missing.clone(), PathBuf::from("-")];
        let (failures, out, err) = run_on("kind: [", &files, Format::Table);
        assert_eq!(failures, 3);
        assert_eq!(
            out,
            "KIND      NAME   HEALTH    MESSAGE\nService   a      Healthy\nService   b      Healthy\n"
        );
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert_eq!(
            lines[0],
            format!(
                "error: {}: document 2 (line 5): not a Kubernetes object: it has no kind",
                bad.display()
            )
        );
        assert!(
            lines[1].starts_with(&format!("error: {}: ", missing.display())),
            "{err}"
        );
        assert!(
            lines[2].starts_with("error: <stdin>: document 1 (line 1"),
            "{err}"
        );
    }

    #[test]
    fn one_line_cells() {
        assert_eq!(one_line("a\n  b\tc\u{1b}[31m d "), "a b c [31m d");
    }
}
