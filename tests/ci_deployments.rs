//! CI/CD ID tokens (SPEC 12.2) against the in-process GitLab: GitLab's own tokens pass, every
//! kind of forgery is refused, and the key set is fetched again only as often as it must.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use envlens::gitlab::api::{GitLab, Policy};
use envlens::gitlab::id_token::{IdTokens, Refused};
use serde_json::json;

use crate::support::gitlab::{Signer, TestGitLab};

const AUDIENCE: &str = "https://envlens.example.com";

async fn verifier(gitlab: &TestGitLab) -> IdTokens {
    let client = GitLab::new(&gitlab.url, None, Arc::default(), Policy::default()).unwrap();
    IdTokens::new(client, AUDIENCE).with_refetch_interval(REFETCH)
}

const REFETCH: std::time::Duration = std::time::Duration::from_millis(300);

#[tokio::test]
async fn gitlabs_own_tokens_name_the_job() {
    let gitlab = TestGitLab::start().await;
    let tokens = verifier(&gitlab).await;
    for signer in [Signer::Rsa, Signer::Ec] {
        let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), signer);
        let job = tokens
            .verify(&token)
            .await
            .unwrap_or_else(|e| panic!("{signer:?}: {e}"));
        assert_eq!(job.project_id, "42");
        assert_eq!(job.project_path, "acme/apps/web");
        assert_eq!(job.job_id, "302");
        assert_eq!(job.ref_protected, "true");
        assert_eq!(job.environment.as_deref(), Some("production"));
        assert_eq!(job.deployment_tier.as_deref(), Some("production"));
        assert_eq!(job.user_id.as_deref(), Some("2"));
    }
    // One fetch of the key set served both.
    assert_eq!(gitlab.key_fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn every_forgery_is_refused() {
    let gitlab = TestGitLab::start().await;
    let tokens = verifier(&gitlab).await;
    let now = chrono::Utc::now().timestamp();
    let with = |changes: serde_json::Value| {
        let mut claims = gitlab.job_claims(AUDIENCE);
        for (k, v) in changes.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "another key",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Forged),
        ),
        (
            "an unknown kid",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::UnknownKid),
        ),
        (
            "alg none",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::NoAlgorithm),
        ),
        (
            "HS256 with the public key",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::HmacWithPublicKey),
        ),
        (
            "RS384",
            gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rs384),
        ),
        (
            "another audience",
            gitlab.sign(
                &with(json!({"aud": "https://elsewhere.example.com"})),
                Signer::Rsa,
            ),
        ),
        (
            "another issuer",
            gitlab.sign(
                &with(json!({"iss": "https://gitlab.evil.example"})),
                Signer::Rsa,
            ),
        ),
        (
            "expired",
            gitlab.sign(
                &with(json!({"exp": now - 60, "iat": now - 400, "nbf": now - 400})),
                Signer::Rsa,
            ),
        ),
        (
            "not yet valid",
            gitlab.sign(&with(json!({"nbf": now + 120})), Signer::Rsa),
        ),
        ("no expiry", {
            let mut claims = gitlab.job_claims(AUDIENCE);
            claims.as_object_mut().unwrap().remove("exp");
            gitlab.sign(&claims, Signer::Rsa)
        }),
        ("not a JWT", "glpat-xxxxxxxxxxxxxxxxxxxx".to_owned()),
        ("a tampered payload", {
            let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rsa);
            let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
            use base64::Engine;
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            let mut claims: serde_json::Value =
                serde_json::from_slice(&b64.decode(&parts[1]).unwrap()).unwrap();
            claims["project_id"] = json!("1");
            parts[1] = b64.encode(claims.to_string());
            parts.join(".")
        }),
    ];
    for (what, token) in cases {
        match tokens.verify(&token).await {
            Ok(job) => panic!("{what}: accepted as {job:?}"),
            Err(Refused::Keys(e)) => panic!("{what}: GitLab unreachable? {e}"),
            Err(_) => {}
        }
    }
    // The set was fetched once: the unknown kid came within the refetch interval.
    assert_eq!(gitlab.key_fetches.load(Ordering::SeqCst), 1);
    // Past the interval an unknown kid fetches it again, once for a whole burst.
    // (Signed first: RSA signing is slow in a debug build.)
    let burst = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::UnknownKid);
    tokio::time::sleep(REFETCH + std::time::Duration::from_millis(50)).await;
    for _ in 0..20 {
        assert!(tokens.verify(&burst).await.is_err());
    }
    assert_eq!(gitlab.key_fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn gitlab_unreachable_is_not_a_refusal_of_the_token() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let policy = Policy {
        attempts: 2,
        backoff: std::time::Duration::from_millis(10),
        ..Policy::default()
    };
    let tokens = IdTokens::new(
        GitLab::new(&url, None, Arc::default(), policy).unwrap(),
        AUDIENCE,
    );
    let gitlab = TestGitLab::start().await;
    let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rsa);
    assert!(matches!(tokens.verify(&token).await, Err(Refused::Keys(_))));
}

// ---- `POST /api/v4/ci/deployments`, joined with GitLab's Deployment Hook ----

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::config::Limits;
use envlens::gitlab::Instance;
use envlens::state::AppState;

use crate::support::{keys, postgres, TestApp, TestResponse};

/// acme/apps/web (42) may deploy through agent 7 `acme/agents:prod` (its ci_access names the
/// group acme/apps); acme/other/api (43) may not. envlens knows the test GitLab.
async fn app_beside(gitlab: &TestGitLab) -> TestApp {
    let database = postgres::fresh_database().await;
    let api = GitLab::new(&gitlab.url, None, Arc::default(), Policy::default()).unwrap();
    let instance = Instance::new(api, AUDIENCE, std::time::Duration::from_secs(60), None);
    let state = AppState::new((*database).clone(), keys(), Limits::default()).with_gitlab(instance);
    let app = TestApp::owning(state, database);
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"}, {"id": 3, "full_path": "acme/other"}],
        "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"},
                     {"id": 42, "full_path": "acme/apps/web", "visibility": "private"},
                     {"id": 43, "full_path": "acme/other/api", "visibility": "private"}],
        "users": [], "members": []
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/7",
            &json!({"project_id": 10, "name": "prod"}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    let config =
        json!({"ci_access": {"groups": [{"id": "acme/apps", "default_namespace": "apps"}]}});
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": 7, "agent_config": config}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    app
}

async fn from_job(app: &TestApp, token: &str, body: serde_json::Value) -> TestResponse {
    app.send(
        Request::post("/api/v4/ci/deployments")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
    )
    .await
}

/// GitLab's Deployment Hook for deployment `id` of job `job` (its documented shape).
async fn hook(app: &TestApp, id: i64, job: i64, project: (i64, &str), status: &str) {
    let body = json!({
        "object_kind": "deployment", "status": status, "status_changed_at": "2026-11-24 10:00:00 +0100",
        "deployment_id": id, "deployable_id": job, "deployable_url": format!("https://gitlab.example.com/{}/-/jobs/{job}", project.1),
        "environment": "production", "environment_tier": "production", "environment_slug": "production",
        "environment_external_url": null,
        "project": {"id": project.0, "name": "web", "path_with_namespace": project.1, "visibility_level": 0},
        "short_sha": "714a629c", "user": {"id": 2, "username": "dev"}, "user_url": "https://gitlab.example.com/dev",
        "commit_url": "https://gitlab.example.com/c", "commit_title": "Deploy", "ref": "main"
    });
    let res = app.hook("Deployment Hook", body.to_string(), None).await;
    assert!(res.status.is_success(), "{}", res.text());
}

async fn agent_row(app: &TestApp, deployment: i64) -> Option<(i64, String)> {
    sqlx::query_as(
        "SELECT agent_id, kubernetes_namespace FROM agent_deployments WHERE deployment_id = $1",
    )
    .bind(deployment)
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_hook_first_then_the_job_records_the_agent() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    hook(&app, 9001, 302, (42, "acme/apps/web"), "running").await;
    let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Rsa);
    let body = json!({"agent": "acme/agents:prod", "namespace": "shop"});
    let res = from_job(&app, &token, body.clone()).await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"deployment_id": 9001,
        "agent_deployment": {"agent_id": 7, "kubernetes_namespace": "shop", "flux_resource_path": null}})
    );
    // A retried job gets the same answer; another namespace for the same job is a conflict.
    let again = from_job(&app, &token, body).await;
    assert_eq!((again.status, again.json()), (res.status, res.json()));
    let other = from_job(
        &app,
        &token,
        json!({"agent": "acme/agents:prod", "namespace": "other"}),
    )
    .await;
    assert_eq!(other.status, 409, "{}", other.text());
    assert_eq!(agent_row(&app, 9001).await, Some((7, "shop".to_owned())));
}

#[tokio::test]
async fn the_job_first_then_the_hook_records_the_agent() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let token = gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Ec);
    // GitLab 18's shape, the namespace left to the authorizing entry's default.
    let res = from_job(
        &app,
        &token,
        json!({"agent": "acme/agents:prod", "dashboard": {"flux_resource_path": null}}),
    )
    .await;
    assert_eq!(
        res.status,
        422,
        "dashboard without its namespace: {}",
        res.text()
    );
    let res = from_job(&app, &token, json!({"agent": "acme/agents:prod"})).await;
    assert_eq!(res.status, 202, "{}", res.text());
    assert_eq!(res.json()["deployment_id"], serde_json::Value::Null);
    // Decided already: the agent, and the namespace of the authorizing entry.
    assert_eq!(
        res.json()["agent_deployment"],
        json!({"agent_id": 7, "kubernetes_namespace": "apps", "flux_resource_path": null})
    );
    assert_eq!(agent_row(&app, 9002).await, None);
    hook(&app, 9002, 302, (42, "acme/apps/web"), "running").await;
    assert_eq!(agent_row(&app, 9002).await, Some((7, "apps".to_owned())));
    // The success hook, redelivered, changes nothing more.
    hook(&app, 9002, 302, (42, "acme/apps/web"), "success").await;
    hook(&app, 9002, 302, (42, "acme/apps/web"), "success").await;
    assert_eq!(agent_row(&app, 9002).await, Some((7, "apps".to_owned())));
    // The job's retry now has the deployment's answer.
    let res = from_job(&app, &token, json!({"agent": "acme/agents:prod"})).await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(res.json()["deployment_id"], 9002);
}

#[tokio::test]
async fn an_unauthorized_project_gets_the_reason_and_no_row() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let mut claims = gitlab.job_claims(AUDIENCE);
    claims["project_id"] = json!("43");
    claims["project_path"] = json!("acme/other/api");
    hook(&app, 9003, 302, (43, "acme/other/api"), "running").await;
    let res = from_job(
        &app,
        &gitlab.sign(&claims, Signer::Rsa),
        json!({"agent": "acme/agents:prod"}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(
        res.json()["reason"]
            .as_str()
            .unwrap()
            .contains("acme/other/api"),
        "{}",
        res.text()
    );
    assert_eq!(agent_row(&app, 9003).await, None);
}

/// A job that may not use the agent is told so at once, before GitLab's hook names its
/// deployment (the decision needs none), and the hook then records the same refusal.
#[tokio::test]
async fn a_refused_job_is_told_before_the_hook() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let mut claims = gitlab.job_claims(AUDIENCE);
    claims["project_id"] = json!("43");
    claims["project_path"] = json!("acme/other/api");
    let token = gitlab.sign(&claims, Signer::Rsa);
    let res = from_job(&app, &token, json!({"agent": "acme/agents:prod"})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let answer = res.json();
    assert_eq!(answer["deployment_id"], serde_json::Value::Null);
    assert_eq!(answer["agent_deployment"], serde_json::Value::Null);
    let reason = answer["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("acme/other/api"), "{reason}");
    assert!(!reason.contains("waiting"), "{reason}");
    // An agent that does not exist, likewise.
    let mut other = gitlab.job_claims(AUDIENCE);
    other["job_id"] = json!("303");
    let res = from_job(
        &app,
        &gitlab.sign(&other, Signer::Rsa),
        json!({"agent": "acme/agents:nope"}),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(
        res.json()["reason"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{}",
        res.text()
    );
    // The hook names the deployment: no row, the same reason kept for the job's retry.
    hook(&app, 9005, 302, (43, "acme/other/api"), "running").await;
    assert_eq!(agent_row(&app, 9005).await, None);
    let res = from_job(&app, &token, json!({"agent": "acme/agents:prod"})).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"deployment_id": 9005, "agent_deployment": null, "reason": reason})
    );
}

#[tokio::test]
async fn forged_tokens_get_401_and_write_nothing() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let body = json!({"agent": "acme/agents:prod", "namespace": "shop"});
    let mut expired = gitlab.job_claims(AUDIENCE);
    expired["exp"] = json!(chrono::Utc::now().timestamp() - 60);
    let tokens = [
        gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::Forged),
        gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::NoAlgorithm),
        gitlab.sign(&gitlab.job_claims(AUDIENCE), Signer::HmacWithPublicKey),
        gitlab.sign(
            &gitlab.job_claims("https://elsewhere.example.com"),
            Signer::Rsa,
        ),
        gitlab.sign(&expired, Signer::Rsa),
    ];
    for token in &tokens {
        let res = from_job(&app, token, body.clone()).await;
        assert_eq!(res.error(401)["code"], "unauthorized");
    }
    let res = app
        .send(
            Request::post("/api/v4/ci/deployments")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 401);
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM ci_deployment_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(kept, 0);
    // A job without an environment deploys nothing: 422.
    let mut claims = gitlab.job_claims(AUDIENCE);
    claims.as_object_mut().unwrap().remove("environment");
    let res = from_job(&app, &gitlab.sign(&claims, Signer::Rsa), body).await;
    assert_eq!(res.error(422)["field"], "environment");
}

// ---- GitLab's own tokens as bearer tokens (SPEC 12.4) ----

#[tokio::test]
async fn gitlab_tokens_are_checked_with_gitlab_and_cached() {
    let gitlab = TestGitLab::start().await;
    let app = app_beside(&gitlab).await;
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/identity",
            &json!({
                "groups": [], "projects": [], "users": [{"id": 2, "username": "dev"}], "members": []
            }),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    gitlab.accept_token("glpat-dev-token", 2, "dev");
    gitlab.accept_token("glpat-stranger", 99, "stranger");
    let me = |token: &'static str| {
        Request::get("/api/user")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    let res = app.send(me("glpat-dev-token")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"id": 2, "username": "dev", "admin": false})
    );
    // Reused for the cache's time: GitLab is asked once.
    let again = app.send(me("glpat-dev-token")).await;
    assert_eq!(again.status, 200);
    assert_eq!(gitlab.token_checks.load(Ordering::SeqCst), 1);
    // A token GitLab refuses: 401.
    assert_eq!(
        app.send(me("glpat-revoked")).await.error(401)["code"],
        "unauthorized"
    );
    // One of a user the mirror does not know: GitLab vouches for them, so they are added
    // (SPEC 13), from their profile.
    let res = app.send(me("glpat-stranger")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["username"], "stranger");
    // GitLab down: 503, never a pass (a token not seen before).
    gitlab.failing.store(true, Ordering::SeqCst);
    gitlab.accept_token("glpat-new", 2, "dev");
    let res = app.send(me("glpat-new")).await;
    assert_eq!(res.error(503)["code"], "unavailable", "{}", res.text());
    // GraphQL takes the same token.
    gitlab.failing.store(false, Ordering::SeqCst);
    let res = app
        .send(
            Request::post("/api/graphql")
                .header(header::AUTHORIZATION, "Bearer glpat-dev-token")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    json!({"query": "{ currentUser { username } }"}).to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["data"]["currentUser"]["username"], "dev");
}
