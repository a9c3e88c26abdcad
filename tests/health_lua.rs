//! Health scripts in Argo CD's format (SPEC 11): every `health_test.yaml` under
//! tests/fixtures/lua, as Argo CD's own test of its scripts runs them, through the rules and
//! through `envlens health --customizations`.

use std::path::{Path, PathBuf};
use std::process::Command;

use envlens::resources::health::{health_with, Customizations, Health};
use envlens::resources::manifests;
use envlens::resources::tree::Tree;
use serde_json::Value;

const FOLDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lua");

/// Argo CD's `health_test.yaml`.
#[derive(serde::Deserialize)]
struct Tests {
    tests: Vec<Case>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    health_status: Expected,
    input_path: String,
}

/// No status: the script gives no health.
#[derive(serde::Deserialize)]
struct Expected {
    status: Option<String>,
    message: Option<String>,
}

/// Every case of every `health_test.yaml`: (input file, expected status and message).
fn cases() -> Vec<(PathBuf, Option<(String, String)>)> {
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from(FOLDER)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().unwrap() == "health_test.yaml" {
                let tests: Tests =
                    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                for case in tests.tests {
                    let expected = case.health_status;
                    let expected = expected
                        .status
                        .map(|s| (s, expected.message.unwrap_or_default()));
                    found.push((dir.join(case.input_path), expected));
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

#[test]
fn every_health_test_through_the_rules() {
    let custom = Customizations::load(Some(Path::new(FOLDER)), &Default::default()).unwrap();
    assert_eq!(custom.len(), 4, "health.lua files");
    let cases = cases();
    assert_eq!(cases.len(), 13, "cases");
    for (input, expected) in cases {
        let parsed = manifests::parse(&std::fs::read_to_string(&input).unwrap());
        assert_eq!(parsed.objects.len(), 1, "{}", input.display());
        let object = &parsed.objects[0];
        let got = health_with(&Tree::from(object), || Some(object.clone()), &custom);
        assert_eq!(said(got.as_ref()), expected, "{}", input.display());
    }
}

#[test]
fn every_health_test_through_envlens_health() {
    let cases = cases();
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

#[test]
fn a_script_that_does_not_compile_stops_envlens_health_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("example.com/Widget");
    std::fs::create_dir_all(&script).unwrap();
    std::fs::write(script.join("health.lua"), "return {status = ").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_envlens"))
        .args(["health", "--customizations"])
        .arg(dir.path())
        .arg("-")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("example.com/Widget/health.lua:1:"),
        "{stderr}"
    );
}
