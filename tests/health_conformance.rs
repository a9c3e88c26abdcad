//! Argo CD's own health tests, run through envlens: every assertion of gitops-engine's
//! `pkg/health/health_test.go` (54, in an `expectations.json`) through the rules and through
//! the `envlens health` binary.
//!
//! The manifests are fixtures of our own, committed in `tests/fixtures/argocd_health/`:
//! written from Argo CD's test manifests (the same apiVersion and kind, the same fields and
//! values the health rules read) with names, ids, images and times of ours; the folder's README
//! names the repository, commit and files they were written from. When this machine also has
//! Argo CD's own manifests (the folder `ENVLENS_ARGOCD_MATERIAL` names, else
//! `material/argocd-health` of the `shared/` folder beside the checkout: `testdata/`,
//! `testdata-extra/`, `testdata-inline/`, `expectations.json`), the same assertions run on
//! them as well.

use std::path::{Path, PathBuf};
use std::process::Command;

use envlens::resources::health::{health, Health};
use envlens::resources::manifests;
use envlens::resources::tree::TreeBuf;
use serde_json::Value;

/// One set of Argo CD's health test cases: a folder holding `expectations.json` and the
/// manifests it names.
struct Cases {
    dir: PathBuf,
    /// Where `statefulset-ondelete.yaml` repeats `updateStrategy` (line, column), as Argo CD's
    /// file does: `envlens health` reads it as kubectl does, with one warning there.
    repeated_key_at: (usize, usize),
}

/// Our fixtures, always; Argo CD's own manifests too when this machine has them.
fn case_sets() -> Vec<Cases> {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/argocd_health");
    assert!(
        committed.join("expectations.json").is_file(),
        "{} is missing",
        committed.display()
    );
    let mut sets = vec![Cases {
        dir: committed,
        repeated_key_at: (84, 3),
    }];
    let material = [
        std::env::var_os("ENVLENS_ARGOCD_MATERIAL").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/material/argocd-health")),
    ]
    .into_iter()
    .flatten()
    .find(|dir| dir.join("expectations.json").is_file());
    match material {
        Some(dir) => sets.push(Cases {
            dir,
            repeated_key_at: (94, 3),
        }),
        None => eprintln!(
            "Argo CD's own health test manifests are not on this machine \
             (ENVLENS_ARGOCD_MATERIAL, ../shared/material/argocd-health): our fixtures only"
        ),
    }
    sets
}

/// One assertion of Argo CD's test: `status` "" where it asserts no health at all, `message`
/// null where it does not check the message.
#[derive(serde::Deserialize)]
struct Expectation {
    test: String,
    file: String,
    status: String,
    message: Option<String>,
}

fn expectations(dir: &Path) -> Vec<Expectation> {
    let text = std::fs::read_to_string(dir.join("expectations.json")).unwrap();
    let expectations: Vec<Expectation> = serde_json::from_str(&text).unwrap();
    assert_eq!(
        expectations.len(),
        54,
        "{}: health_test.go's assertions",
        dir.display()
    );
    expectations
}

/// The manifest of an assertion. TestGetArgoWorkflowHealth builds objects without apiVersion
/// and kind and calls the Workflow rule directly; here they go through the kind's dispatch.
fn manifest(dir: &Path, file: &str) -> String {
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    if file.starts_with("testdata-inline/") {
        format!("apiVersion: argoproj.io/v1alpha1\nkind: Workflow\n{text}")
    } else {
        text
    }
}

/// Where envlens and Argo CD's assertion differ, in words; None when they agree.
fn disagreement(e: &Expectation, got: Option<&Health>) -> Option<String> {
    let status = got.map_or("", |h| h.status.as_str());
    let message = got.and_then(|h| h.message.as_deref()).unwrap_or("");
    let agrees = status == e.status && e.message.as_deref().is_none_or(|m| m == message);
    (!agrees).then(|| {
        format!(
            "{} {}: want {:?} {:?}, got {status:?} {message:?}",
            e.test, e.file, e.status, e.message
        )
    })
}

#[test]
fn every_assertion_of_argo_cds_health_test_through_the_rules() {
    for cases in case_sets() {
        let dir = &cases.dir;
        let mut differences = Vec::new();
        for e in &expectations(dir) {
            let parsed = manifests::parse(&manifest(dir, &e.file));
            assert!(parsed.errors.is_empty(), "{}: {:?}", e.file, parsed.errors);
            assert_eq!(parsed.objects.len(), 1, "{}", e.file);
            let got = health(&TreeBuf::from(&parsed.objects[0]));
            differences.extend(disagreement(e, got.as_ref()));
        }
        assert!(
            differences.is_empty(),
            "{}:\n{}",
            dir.display(),
            differences.join("\n")
        );
    }
}

#[test]
fn every_assertion_of_argo_cds_health_test_through_envlens_health() {
    for cases in case_sets() {
        let expectations = expectations(&cases.dir);
        // The inline Workflows, with their kind, as files of their own.
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = expectations
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let path = dir.path().join(format!("{i}.yaml"));
                std::fs::write(&path, manifest(&cases.dir, &e.file)).unwrap();
                path
            })
            .collect();
        let output = Command::new(env!("CARGO_BIN_EXE_envlens"))
            .args(["health", "-o", "json"])
            .args(&files)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        // statefulset-ondelete.yaml repeats `updateStrategy`: read as kubectl reads it, with a
        // warning.
        let repeated = expectations
            .iter()
            .position(|e| e.file.ends_with("statefulset-ondelete.yaml"))
            .unwrap();
        let (line, column) = cases.repeated_key_at;
        assert_eq!(
            stderr.trim(),
            format!(
                "warning: {}: document 1 (line {line}, column {column}): duplicate mapping key: updateStrategy; the later value is used",
                files[repeated].display()
            )
        );
        let reports: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(reports.len(), expectations.len());
        let mut differences = Vec::new();
        for (e, report) in expectations.iter().zip(&reports) {
            let got: Option<Health> = match &report["health"] {
                Value::Null => None,
                h => Some(Health {
                    status: serde_json::from_value(h["status"].clone()).unwrap(),
                    message: h["message"].as_str().map(str::to_string),
                }),
            };
            differences.extend(disagreement(e, got.as_ref()));
        }
        assert!(
            differences.is_empty(),
            "{}:\n{}",
            cases.dir.display(),
            differences.join("\n")
        );
    }
}

/// Every committed manifest has its assertions (as many as health_test.go's, checked by
/// `expectations`), and where Argo CD's own material is on the machine, our transcription of
/// health_test.go asserts what the material's does, in the same order.
#[test]
fn the_fixtures_are_health_test_gos_cases() {
    let sets = case_sets();
    let ours = &sets[0].dir;
    let expected = expectations(ours);
    let mut named: Vec<String> = expected.iter().map(|e| e.file.clone()).collect();
    named.sort();
    named.dedup();
    let mut files = Vec::new();
    for folder in ["testdata", "testdata-extra", "testdata-inline"] {
        for entry in std::fs::read_dir(ours.join(folder)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            files.push(format!("{folder}/{name}"));
        }
    }
    files.sort();
    assert_eq!(
        named, files,
        "every committed manifest, and only they, has its assertions"
    );
    // Where Argo CD's own material is here, its expectations.json asserts what ours does.
    let asserted = |e: &Expectation| (e.test.clone(), e.status.clone(), e.message.clone());
    for material in &sets[1..] {
        let theirs = expectations(&material.dir);
        let first_difference = expected
            .iter()
            .zip(&theirs)
            .position(|(a, b)| asserted(a) != asserted(b));
        if let Some(i) = first_difference {
            panic!(
                "assertion {} differs: ours {} {:?}, {}'s {} {:?}",
                i + 1,
                expected[i].file,
                asserted(&expected[i]),
                material.dir.display(),
                theirs[i].file,
                asserted(&theirs[i])
            );
        }
    }
}
