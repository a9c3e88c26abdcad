//! Health scripts in Argo CD's format (SPEC 11): every `health_test.yaml` under
//! tests/fixtures/lua and tests/fixtures/lua-argocd, as Argo CD's own test of its scripts
//! (`TestLuaHealthScript`) runs them, through the rules and through
//! `envlens health --customizations`; and, when `ENVLENS_ARGOCD_CUSTOMIZATIONS` names a copy of
//! Argo CD's whole `resource_customizations`, every one of its health tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use envlens::resources::health::{health_with, Customizations, Health};
use envlens::resources::manifests;
use envlens::resources::tree::TreeBuf;
use serde_json::Value;

const FOLDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lua");
/// Argo CD's scripts that use `goto`, with their tests (see its README).
const ARGOCD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lua-argocd");

/// A field of Argo CD's `health_test.yaml`. Argo CD reads it with `sigs.k8s.io/yaml`, which
/// goes through Go's JSON and so matches names in any case (one of its tests says `inputpath`).
fn field<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    value
        .as_object()?
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
}

fn text(value: &Value, name: &str) -> String {
    field(value, name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Every case of every `health_test.yaml` under `folder`: (input file, expected status and
/// message; None where Argo CD expects its empty health).
fn cases(folder: &Path) -> Vec<(PathBuf, Option<(String, String)>)> {
    let mut found = Vec::new();
    let mut dirs = vec![folder.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().unwrap() == "health_test.yaml" {
                let tests: Value =
                    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let tests = field(&tests, "tests").and_then(Value::as_array);
                for case in tests.into_iter().flatten() {
                    // No status: Argo CD's empty health, which is no health here.
                    let expected = field(case, "healthStatus").unwrap_or(&Value::Null);
                    let status = text(expected, "status");
                    let expected =
                        (!status.is_empty()).then(|| (status, text(expected, "message")));
                    found.push((dir.join(text(case, "inputPath")), expected));
                }
            }
        }
    }
    found.sort();
    found
}

fn said(health: Option<&Health>) -> Option<(String, String)> {
    health.map(|h| {
        let message = h.message.clone().unwrap_or_default();
        (h.status.as_str().to_string(), message)
    })
}

/// The cases of `folder`'s tests where the script does not say what Argo CD expects, in words,
/// and how many cases there are. As Argo CD's `TestLuaHealthScript`: the script for the first
/// object of each input alone, where Argo CD's controller and [`health_with`] first say
/// "Pending deletion" of an object being deleted.
fn differences(folder: &Path) -> (Vec<String>, usize) {
    let custom = Customizations::load(Some(folder), &Default::default()).unwrap();
    let cases = cases(folder);
    let mut differences = Vec::new();
    for (input, expected) in &cases {
        let name = input.strip_prefix(folder).unwrap_or(input).display();
        // Argo CD reads the first document of the file.
        let parsed = manifests::parse(&std::fs::read_to_string(input).unwrap());
        let Some(object) = parsed.objects.first() else {
            differences.push(format!("{name}: no object read: {:?}", parsed.errors));
            continue;
        };
        let got = said(custom.script_health(object).flatten().as_ref());
        if &got != expected {
            differences.push(format!("{name}: want {expected:?}, got {got:?}"));
        }
    }
    (differences, cases.len())
}

#[test]
fn every_health_test_through_the_rules() {
    let custom = Customizations::load(Some(Path::new(FOLDER)), &Default::default()).unwrap();
    assert_eq!(custom.len(), 4, "health.lua files");
    let cases = cases(Path::new(FOLDER));
    assert_eq!(cases.len(), 13, "cases");
    for (input, expected) in cases {
        let parsed = manifests::parse(&std::fs::read_to_string(&input).unwrap());
        assert_eq!(parsed.objects.len(), 1, "{}", input.display());
        let object = &parsed.objects[0];
        let got = health_with(&TreeBuf::from(object), || Some(object.clone()), &custom);
        assert_eq!(said(got.as_ref()), expected, "{}", input.display());
    }
}

/// Argo CD's scripts with `goto` (3scale, Gateway API) pass their own tests.
#[test]
fn argo_cds_scripts_with_goto_pass_their_own_tests() {
    let custom = Customizations::load(Some(Path::new(ARGOCD)), &Default::default()).unwrap();
    // The nine with `goto`, and 3scale's ActiveDoc, whose kind two DeveloperUser cases name.
    assert_eq!(custom.len(), 10, "health.lua files");
    let (differences, cases) = differences(Path::new(ARGOCD));
    assert_eq!(cases, 46, "cases");
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// Every health test of Argo CD's `resource_customizations`, from the folder
/// `ENVLENS_ARGOCD_CUSTOMIZATIONS` names (docs/health.md says how to get it at Argo CD's
/// head): at least 99% agree, each difference printed. Without the variable, skipped.
#[test]
fn argo_cds_resource_customizations_agree_with_their_own_tests() {
    let Some(folder) = std::env::var_os("ENVLENS_ARGOCD_CUSTOMIZATIONS") else {
        eprintln!("ENVLENS_ARGOCD_CUSTOMIZATIONS is not set: Argo CD's health tests skipped");
        return;
    };
    let (differences, cases) = differences(Path::new(&folder));
    let agree = cases - differences.len();
    eprintln!("{agree} of {cases} of Argo CD's health tests agree; the others:");
    for difference in &differences {
        eprintln!("  {difference}");
    }
    assert!(cases > 1000, "{cases} cases: not Argo CD's whole folder?");
    assert!(agree * 100 >= cases * 99, "{agree} of {cases} agree");
}

#[test]
fn every_health_test_through_envlens_health() {
    let cases = cases(Path::new(FOLDER));
    let output = Command::new(env!("CARGO_BIN_EXE_envlens"))
        .args(["health", "-o", "json", "--customizations", FOLDER])
        .args(cases.iter().map(|(input, _)| input))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reports: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reports.len(), cases.len());
    for ((input, expected), report) in cases.iter().zip(&reports) {
        let got = report["health"].as_object().map(|h| {
            let text = |key: &str| h.get(key).and_then(Value::as_str).unwrap_or("").to_string();
            (text("status"), text("message"))
        });
        assert_eq!(&got, expected, "{}", input.display());
    }
}

/// A folder with a script that does not compile: `envlens health` warns, naming it, judges
/// that script's kind `Unknown` with the reason, and every other kind by its script.
#[test]
fn a_script_that_does_not_compile_costs_envlens_health_only_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, script) in [
        (
            "Gadget",
            "return {status = 'Healthy', message = obj.metadata.name}",
        ),
        ("Widget", "return {status = "),
    ] {
        let folder = dir.path().join("example.com").join(kind);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("health.lua"), script).unwrap();
    }
    let manifests = dir.path().join("objects.yaml");
    std::fs::write(
        &manifests,
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\n\
         apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g}\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_envlens"))
        .args(["health", "-o", "json", "--customizations"])
        .arg(dir.path())
        .arg(&manifests)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("WARN") && stderr.contains("example.com/Widget/health.lua:1:"),
        "{stderr}"
    );
    let reports: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reports[0]["health"]["status"], "Unknown");
    let message = reports[0]["health"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("does not compile: example.com/Widget/health.lua:1:"),
        "{message}"
    );
    assert_eq!(
        reports[1]["health"],
        serde_json::json!({"status": "Healthy", "message": "g"})
    );
}
