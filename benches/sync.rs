//! One sync pass (SPEC 12.3) of 1,000 projects against the in-process GitLab of the tests
//! (`tests/support/gitlab_rest.rs`, no rate limit), into envlens' embedded PostgreSQL: the
//! first pass into an empty mirror, then a pass over the unchanged GitLab, which should write
//! nothing. Each round starts from an empty mirror; medians over the rounds.
//!
//! `cargo bench --bench sync -- [rounds] [projects]` (defaults 5 and 1000). `DATABASE_URL`
//! names a server to use instead of the embedded one.

#[path = "../tests/support/gitlab_rest.rs"]
#[allow(dead_code)]
mod gitlab_rest;

use std::sync::Arc;
use std::time::Duration;

use envlens::gitlab::api::{GitLab, Policy, Token};
use envlens::ingest::sync::{pass, Report, Scope};
use gitlab_rest as rest;

/// acme > acme/team-<t> (10 subgroups); projects spread over them; every 10th project holds
/// an agent with a configuration file; 2 members and 2 environments a project; 200 users, 3
/// members a group.
fn populate(r: &rest::Rest, projects: i64) {
    r.with(|d| {
        d.groups.push(rest::group(1, "acme"));
        for t in 0..10 {
            d.groups.push(rest::group(2 + t, &format!("acme/team-{t}")));
            d.group_members.insert(
                2 + t,
                (0..3).map(|m| rest::member(1 + (t * 3 + m) % 200, &format!("user{}", 1 + (t * 3 + m) % 200), 30)).collect(),
            );
        }
        for u in 1..=200 {
            d.users.push(rest::user(u, &format!("user{u}"), u == 1));
        }
        for p in 0..projects {
            let id = 10_000 + p;
            let path = format!("acme/team-{}/svc-{p}", p % 10);
            d.projects.push(rest::project(id, &path, Some("main")));
            d.project_members.insert(
                id,
                vec![rest::member(1 + p % 200, &format!("user{}", 1 + p % 200), 30), rest::member(1 + (p + 7) % 200, &format!("user{}", 1 + (p + 7) % 200), 20)],
            );
            d.environments.insert(
                id,
                vec![
                    rest::environment(100_000 + 2 * p, "production", None, None, None),
                    rest::environment(100_001 + 2 * p, "staging", None, None, None),
                ],
            );
            if p % 10 == 0 {
                d.agents.insert(id, vec![rest::agent(50_000 + p, "prod", (id, &path))]);
                d.files.insert(
                    (id, ".gitlab/agents/prod/config.yaml".into(), "main".into()),
                    format!("ci_access:\n  groups:\n    - id: acme/team-{}\nuser_access:\n  access_as:\n    agent: {{}}\n  projects:\n    - id: {path}\n", p % 10),
                );
            }
        }
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    let projects: i64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);

    let r = rest::Rest::default();
    populate(&r, projects);
    let router = axum::Router::new()
        .fallback(rest::handle)
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let data = tempfile::tempdir().unwrap();
    let database = envlens::db::Database::open(&envlens::config::DatabaseArgs {
        data_dir: data.path().to_owned(),
        database_url: std::env::var("DATABASE_URL").ok(),
        postgres_bin_dir: None,
        database_max_connections: 8,
        database_acquire_timeout: Duration::from_secs(10),
    })
    .await
    .expect("database");
    let db = database.pool.pg().clone();
    let api = GitLab::new(
        &url,
        Some(Token::new(rest::API_TOKEN)),
        Arc::default(),
        Policy::default(),
    )
    .unwrap();
    let scope = Scope {
        groups: vec!["acme".into()],
        max_projects: 100_000,
        timeout: Duration::from_secs(3600),
    };
    let metrics = envlens::telemetry::Metrics::default();
    let mut first = Vec::new();
    let mut second = Vec::new();
    let mut reports: Vec<(Report, Report)> = Vec::new();
    for round in 1..=rounds {
        sqlx::query(
            "TRUNCATE namespaces, projects, users, members, cluster_agents, environments CASCADE",
        )
        .execute(&db)
        .await
        .unwrap();
        let a = pass(&db, &api, &scope, &metrics, &mut |_: &str| {})
            .await
            .expect("first pass");
        let b = pass(&db, &api, &scope, &metrics, &mut |_: &str| {})
            .await
            .expect("second pass");
        println!("round {round}: first: {a}\nround {round}: again: {b}");
        first.push(a.seconds);
        second.push(b.seconds);
        reports.push((a, b));
    }
    let (a, b) = &reports[0];
    println!(
        "{projects} projects, {rounds} rounds: first pass median {:.2} s ({} requests, {:.2} per project, {} rows written); \
         unchanged GitLab median {:.2} s ({} requests, {} rows written)",
        median(first),
        a.requests,
        a.requests as f64 / projects as f64,
        a.rows_written,
        median(second),
        b.requests,
        b.rows_written
    );
    database.close().await;
}
