//! The database restarted under the replicas (SPEC 16; `docs/replicas.md`, "PostgreSQL"):
//! a highly available PostgreSQL fails over by dropping every connection and answering again
//! at the same address a moment later. Here the test's own PostgreSQL is killed under a load
//! of deployment creations through two replicas and restarted at once. Every creation a
//! replica acknowledged is in the database afterwards, the replicas ride through (no exit, no
//! answer but a success or a 503), the agent's connection is owned again by the replica
//! rendezvous hashing picks, and a change in the cluster after the restart reaches a view on
//! either replica.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envlens::auth::INTERNAL_HEADER;
use envlens::config::{DatabaseArgs, Limits};
use envlens::db::Database;
use envlens::state::AppState;
use serde_json::json;

use super::ownership::{production, settled, setup_on};
use super::Replica;
use crate::support::environment::{self, gitlab_labels, meta, NS, PROJECT, SLUG};
use crate::support::kube_api::KubeApi;
use crate::support::*;

/// A deployment creation as GitLab sends it, into an environment of its own (the production
/// group's deployments stay as seeded).
fn creation(id: i64) -> serde_json::Value {
    json!({
        "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": "abc",
                       "tag": false, "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": PROJECT, "full_path": "acme/apps/web"},
        "environment": {"id": 500, "name": "load", "slug": "load", "tier": "testing"},
        "job": {"id": id, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": NS}
    })
}

fn running(replica: &Replica) -> bool {
    // SAFETY: signal 0 checks that our own child exists.
    unsafe { libc::kill(replica.child.id() as libc::pid_t, 0) == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restarted_under_load_is_ridden_through_and_nothing_acknowledged_is_lost() {
    let api = KubeApi::new();
    environment::environment(&api);
    let cluster = tempfile::tempdir().unwrap();
    let served = api.serve(cluster.path()).await;
    // The test's own PostgreSQL (the shared test server serves every other test), in memory
    // where there is a tmpfs: a restart after a crash syncs the file system first.
    let shm = Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap(),
        false => tempfile::tempdir().unwrap(),
    };
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let database = Database::open(&DatabaseArgs {
        database_url: None,
        ..crate::embedded::serve_args(dir.path())
    })
    .await
    .unwrap();
    let embedded = database.embedded.as_ref().unwrap();
    let url = embedded.url(envlens::db::DATABASE);
    let pool = database.pool.clone();
    let app = TestApp::serving(
        AppState::new(pool.clone(), keys(), Limits::default()),
        pool.pg().clone(),
    );
    let setup = setup_on(&served, url.clone(), app).await;
    let replicas = Arc::new([setup.replica(&url).await, setup.replica(&url).await]);
    let owner = setup.settled_owner(&replicas[..]).await;
    production(owner);
    assert!(settled(&api).await > 0, "the owner watches the namespace");

    // Creations through both replicas, two at a time, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2_i64)
        .map(|w| {
            let (replicas, stop) = (replicas.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                // Bounded: a few thousand requests at most, whatever the machine.
                for n in 0..5_000_i64 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = 1_000_000 * (w + 1) + n;
                    let (status, body) = replicas[(n % 2) as usize].post(
                        "/api/v4/internal/deployments",
                        &[(INTERNAL_HEADER, &internal_token())],
                        &creation(id),
                    );
                    if status == 503 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    answers.push((id, status, body));
                }
                answers
            })
        })
        .collect();

    // Under load for a moment, then the postmaster is killed; this process restarts it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = embedded.pid().expect("running");
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while embedded.restarts().load(Ordering::Relaxed) == 0 || embedded.pid().is_none() {
        assert!(Instant::now() < deadline, "PostgreSQL was not restarted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The load goes on against the restarted server until each replica has acknowledged a
    // creation there, and a little longer.
    let back = Instant::now();
    for replica in replicas.iter() {
        loop {
            let id = 9_000_000 + back.elapsed().as_millis() as i64;
            let (status, _) = replica.post(
                "/api/v4/internal/deployments",
                &[(INTERNAL_HEADER, &internal_token())],
                &creation(id),
            );
            if status == 201 {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(60),
                "replica {} never acknowledged a creation after the restart ({status}):\n{}",
                replica.id,
                replica.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for worker in workers {
        answers.extend(worker.join().unwrap());
    }

    // Every answer a success or a 503; some met the outage; every success is kept.
    let mut acknowledged = Vec::new();
    let mut unavailable = 0;
    for (id, status, body) in &answers {
        match status {
            201 => acknowledged.push(*id),
            503 => unavailable += 1,
            other => panic!("creation {id}: {other} {body}"),
        }
    }
    assert!(
        unavailable > 0,
        "no creation met the outage: nothing was tested"
    );
    let kept: Vec<i64> = sqlx::query_scalar("SELECT id FROM deployments WHERE id = ANY($1)")
        .bind(&acknowledged)
        .fetch_all(pool.pg())
        .await
        .unwrap();
    assert_eq!(
        kept.len(),
        acknowledged.len(),
        "acknowledged creations lost: {} of {} kept",
        kept.len(),
        acknowledged.len()
    );
    eprintln!(
        "{} creations, {} acknowledged and kept, {unavailable} answered 503",
        answers.len(),
        acknowledged.len()
    );

    // Both replicas rode through; the connection is owned again, by the rendezvous pick.
    for replica in replicas.iter() {
        assert!(
            running(replica),
            "replica {} exited:\n{}",
            replica.id,
            replica.logs()
        );
    }
    setup.settled_owner(&replicas[..]).await;
    // A change in the cluster after the restart reaches a view through either replica.
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta(NS, "after-restart", "uid-cm-after", gitlab_labels(SLUG, "web"))}));
    for replica in replicas.iter() {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let group = production(replica);
            let seen = group["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "after-restart");
            if seen {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica {} never shows the change: {group}\n{}",
                replica.id,
                replica.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
