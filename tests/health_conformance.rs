//! Argo CD's own health tests, run through envlens: every assertion of gitops-engine's
//! `pkg/health/health_test.go` (an `expectations.json` over Argo CD's test manifests) through
//! the rules and through the `envlens health` binary.
//!
//! Argo CD's manifests are Argo CD's, so they are not committed here: they are read from the
//! folder `ENVLENS_ARGOCD_MATERIAL` names, else from `material/argocd-health` of the `shared/`
//! folder beside the checkout (`testdata/`, `testdata-extra/`, `testdata-inline/`,
//! `expectations.json`, and a NOTICE naming argo-cd's commit). Without either, the tests say so
//! and pass over them; the rules' own unit tests cover the same cases with objects of ours.

use std::path::{Path, PathBuf};
use std::process::Command;

use envlens::resources::health::{health, Health};
use envlens::resources::manifests;
use envlens::resources::tree::TreeBuf;
use serde_json::Value;

/// The folder of Argo CD's health test material, when this machine has it.
fn material() -> Option<PathBuf> {
    let found = [
        std::env::var_os("ENVLENS_ARGOCD_MATERIAL").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/material/argocd-health")),
    ]
    .into_iter()
    .flatten()
    .find(|dir| dir.join("expectations.json").is_file());
    if found.is_none() {
        eprintln!(
            "Argo CD's health test material is not on this machine \
             (ENVLENS_ARGOCD_MATERIAL, ../shared/material/argocd-health): skipped"
        );
    }
    found
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
    serde_json::from_str(&text).unwrap()
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
    let Some(dir) = material() else { return };
    let expectations = expectations(&dir);
    assert_eq!(expectations.len(), 54, "health_test.go's assertions");
    let mut differences = Vec::new();
    for e in &expectations {
        let parsed = manifests::parse(&manifest(&dir, &e.file));
        assert!(parsed.errors.is_empty(), "{}: {:?}", e.file, parsed.errors);
        assert_eq!(parsed.objects.len(), 1, "{}", e.file);
        let got = health(&TreeBuf::from(&parsed.objects[0]));
        differences.extend(disagreement(e, got.as_ref()));
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

#[test]
fn every_assertion_of_argo_cds_health_test_through_envlens_health() {
    let Some(material) = material() else { return };
    let expectations = expectations(&material);
    // The inline Workflows, with their kind, as files of their own.
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = expectations
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let path = dir.path().join(format!("{i}.yaml"));
            std::fs::write(&path, manifest(&material, &e.file)).unwrap();
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
    // statefulset-ondelete.yaml repeats `updateStrategy`: read as kubectl reads it, with a warning.
    let repeated = expectations
        .iter()
        .position(|e| e.file.ends_with("statefulset-ondelete.yaml"))
        .unwrap();
    assert_eq!(
        stderr.trim(),
        format!(
            "warning: {}: document 1 (line 94, column 3): duplicate mapping key: updateStrategy; the later value is used",
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
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
