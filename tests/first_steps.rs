//! The README's first steps, run as the README writes them, against a fresh install: the built
//! `envlens serve` with its own embedded PostgreSQL in an empty data folder, then the README's
//! `sh` block (between `<!-- first-steps` and `<!-- /first-steps -->`) in bash, with the
//! built `envlens` on the `PATH`. Only the address changes, so that tests can run side by side.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README's block of first steps.
fn readme_block() -> String {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let start = readme
        .find("<!-- first-steps")
        .expect("README.md has the first-steps block");
    let rest = &readme[start..];
    let body = &rest[rest.find("```sh\n").expect("an sh block") + 6..];
    body[..body.find("```").unwrap()].to_owned()
}

/// `envlens serve`, stopped (SIGTERM, as Ctrl-C would) when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
    }
}

/// A command as the user's shell runs it: the data folder and nothing else configured.
fn envlens_env<'a>(cmd: &'a mut Command, data_dir: &Path) -> &'a mut Command {
    cmd.env("ENVLENS_DATA_DIR", data_dir)
        .env_remove("DATABASE_URL")
        .env_remove("ENVLENS_INTERNAL_SECRET_FILE")
        .env_remove("ENVLENS_SESSION_SECRET_FILE")
        .env_remove("ENVLENS_WEBHOOK_TOKEN_FILE")
        .env_remove("ENVLENS_LISTEN")
        .current_dir(ROOT)
}

fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn serve(data_dir: &Path, address: &str) -> Serve {
    let mut child = envlens_env(&mut Command::new(env!("CARGO_BIN_EXE_envlens")), data_dir)
        .args(["serve", "--listen", address])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("envlens listening on") {
                let _ = tx.send(line);
            }
        }
    });
    let serve = Serve(child);
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("`envlens serve` did not start listening");
    assert!(
        line.contains(&format!("http://{address}/-/graphql-explorer")),
        "{line}"
    );
    serve
}

fn bash(script: &str, data_dir: &Path) -> Output {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_envlens")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    envlens_env(&mut Command::new("bash"), data_dir)
        .args(["-euo", "pipefail", "-c", script])
        .env("PATH", path)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_readme_first_steps_work_on_a_fresh_install() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("no curl on this machine: the README's first steps use it");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Reachable by the `postgres` user when the tests run as root, so that the embedded
    // cluster lives in the data folder and goes with it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data_dir = dir.path().join(".envlens");
    let address = free_address();
    let _serve = serve(&data_dir, &address);

    // Before the import, the mirror is empty, and the error says what to do.
    let before = bash("envlens token --user root", &data_dir);
    assert!(!before.status.success());
    assert!(
        text(&before.stderr).contains("envlens identity import examples/identity.json"),
        "{}",
        text(&before.stderr)
    );

    let script = readme_block().replace("localhost:8080", &address);
    let out = bash(&script, &data_dir);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "the first steps failed ({}):\n{script}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let (first, rest) = stdout.split_once('\n').unwrap();
    assert_eq!(
        first,
        "imported examples/identity.json: 2 groups, 1 projects, 3 users, 2 members"
    );
    let answers: Vec<Value> = serde_json::Deserializer::from_str(rest)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {rest}"));
    assert_eq!(
        answers,
        vec![
            json!({"id": 1, "username": "root", "admin": true}),
            json!({"data": {"currentUser": {"username": "root"}, "project": {"fullPath": "acme/platform/shop"}}}),
            json!({"groups": 2, "projects": 1, "users": 3, "members": 2}),
        ]
    );

    // `GET /` is the dashboard, which asks to sign in first; the explorer is served too.
    let dashboard = bash(
        &format!("curl -s -o /dev/null -w '%{{http_code}} %{{redirect_url}}' {address}/"),
        &data_dir,
    );
    assert!(
        text(&dashboard.stdout).starts_with(&format!("303 http://{address}/-/sign-in")),
        "{}",
        text(&dashboard.stdout)
    );
    let explorer = bash(
        &format!("curl -s -o /dev/null -w '%{{http_code}}' {address}/-/graphql-explorer"),
        &data_dir,
    );
    assert_eq!(text(&explorer.stdout), "200");
}

#[test]
fn identity_import_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join(".envlens");
    let bad = dir.path().join("bad.json");
    for (contents, expected) in [
        (
            r#"{"users": [{"id": "one", "username": "root"}]}"#,
            "users[0].id",
        ),
        ("{\"users\": [", "malformed JSON"),
        (r#"{"people": []}"#, "unknown field `people`"),
    ] {
        std::fs::write(&bad, contents).unwrap();
        let out = envlens_env(&mut Command::new(env!("CARGO_BIN_EXE_envlens")), &data_dir)
            .args(["identity", "import"])
            .arg(&bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{contents}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{contents}: {stderr}");
        assert!(stderr.contains("bad.json"), "{stderr}");
    }
    let missing = envlens_env(&mut Command::new(env!("CARGO_BIN_EXE_envlens")), &data_dir)
        .args(["identity", "import", "no-such-file.json"])
        .output()
        .unwrap();
    assert!(text(&missing.stderr).contains("cannot read no-such-file.json"));
    // Nothing was started for files that could not be read.
    assert!(!data_dir.exists());
}
