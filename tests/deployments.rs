//! Deployment-job creation (`agent_deployments` rows under GitLab's `ci_access` rules) and
//! deployment status hooks.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::*;

const DEPLOYMENTS: &str = "/api/v4/internal/deployments";
const FLUX: &str = "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/web";

/// acme (1) > acme/platform (2) > acme/platform/web (3); beta (4).
/// Projects: acme/agents (10, home of agent 7 `prod`), acme/platform/web/app (11),
/// acme/platform/api (12), acme/other (13), beta/x (14).
async fn setup() -> TestApp {
    let app = TestApp::new().await;
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/platform"},
                   {"id": 3, "full_path": "acme/platform/web"}, {"id": 4, "full_path": "beta"}],
        "projects": [
            {"id": 10, "full_path": "acme/agents", "visibility": "private"},
            {"id": 11, "full_path": "acme/platform/web/app", "visibility": "private"},
            {"id": 12, "full_path": "acme/platform/api", "visibility": "private"},
            {"id": 13, "full_path": "acme/other", "visibility": "private"},
            {"id": 14, "full_path": "beta/x", "visibility": "private"}
        ]
    })).await;
    assert_eq!(res.status, 200);
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/kubernetes/agents/7",
            &json!({"project_id": 10, "name": "prod"}),
        )
        .await;
    assert_eq!(res.status, 201);
    app
}

async fn configure(app: &TestApp, ci_access: Value) {
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": 7, "agent_config": {"ci_access": ci_access}}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A creation call; `project` is (id, path).
fn body(
    deployment: i64,
    project: (i64, &str),
    env: &str,
    protected_ref: bool,
    kubernetes: Option<Value>,
) -> Value {
    let mut body = json!({
        "deployment": {"id": deployment, "iid": deployment % 100 + 1, "status": "created", "ref": "main", "sha": "0a1b2c3d4e5f",
                       "tag": false, "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": project.0, "full_path": project.1},
        "environment": {"id": 1000 + project.0 * 10 + env.len() as i64, "name": env, "slug": env.replace('/', "-"), "tier": "production"},
        "job": {"id": 5000 + deployment, "name": "deploy", "protected_ref": protected_ref, "user_id": 3}
    });
    if let Some(k) = kubernetes {
        body["kubernetes"] = k;
    }
    body
}

fn k8s(agent: &str, namespace: &str) -> Option<Value> {
    Some(json!({"agent": agent, "namespace": namespace}))
}

async fn create(app: &TestApp, body: &Value) -> TestResponse {
    app.internal(Method::POST, DEPLOYMENTS, body).await
}

/// Whether the creation wrote the row: Ok(namespace) or Err(reason).
async fn outcome(app: &TestApp, body: &Value) -> Result<String, String> {
    let res = create(app, body).await;
    let json = res.json();
    match res.status.as_u16() {
        201 => Ok(json["agent_deployment"]["kubernetes_namespace"]
            .as_str()
            .unwrap()
            .to_owned()),
        200 => Err(json["reason"].as_str().unwrap().to_owned()),
        other => panic!("{other}: {json}"),
    }
}

#[tokio::test]
async fn the_blueprint_example_records_the_agent_deployment() {
    let app = setup().await;
    configure(&app, json!({"projects": [{"id": "acme/platform/web/app"}]})).await;
    let res = create(
        &app,
        &body(
            101,
            (11, "acme/platform/web/app"),
            "production",
            true,
            k8s("acme/agents:prod", "apps"),
        ),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        res.json(),
        json!({"deployment_id": 101, "agent_deployment": {"agent_id": 7, "kubernetes_namespace": "apps",
                                                          "flux_resource_path": null}})
    );
    assert_eq!(
        app.rows("SELECT * FROM agent_deployments").await,
        vec![
            json!({"deployment_id": 101, "agent_id": 7, "kubernetes_namespace": "apps", "flux_resource_path": null})
        ]
    );
    assert_eq!(app.rows("SELECT id, iid, project_id, environment_id, status, ref, sha, tag, job_id FROM deployments").await, vec![
        json!({"id": 101, "iid": 2, "project_id": 11, "environment_id": 1120, "status": "created", "ref": "main", "sha": "0a1b2c3d4e5f", "tag": false, "job_id": 5101}),
    ]);
    assert_eq!(
        app.rows("SELECT id, project_id, name, slug, tier FROM environments")
            .await,
        vec![
            json!({"id": 1120, "project_id": 11, "name": "production", "slug": "production", "tier": "production"}),
        ]
    );
}

#[tokio::test]
async fn ci_access_rules() {
    struct Case {
        name: &'static str,
        ci_access: Value,
        project: (i64, &'static str),
        env: &'static str,
        protected: bool,
        namespace: Option<&'static str>,
        expect: Result<&'static str, &'static str>,
    }
    let cases = [
        Case { name: "explicit project entry", ci_access: json!({"projects": [{"id": "acme/platform/api"}]}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: Some("apps"), expect: Ok("apps") },
        Case { name: "paths match case-insensitively", ci_access: json!({"projects": [{"id": "ACME/Platform/API"}]}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: Some("apps"), expect: Ok("apps") },
        Case { name: "the agent's own configuration project is always authorized", ci_access: json!({}),
               project: (10, "acme/agents"), env: "anything", protected: false, namespace: Some("ops"), expect: Ok("ops") },
        Case { name: "a group entry covers projects of subgroups", ci_access: json!({"groups": [{"id": "acme/platform"}]}),
               project: (11, "acme/platform/web/app"), env: "production", protected: false, namespace: Some("web"), expect: Ok("web") },
        Case { name: "a group entry does not cover a sibling group", ci_access: json!({"groups": [{"id": "acme/platform"}]}),
               project: (13, "acme/other"), env: "production", protected: false, namespace: Some("x"), expect: Err("is not authorized to use agent acme/agents:prod") },
        Case { name: "a subgroup entry does not cover its parent's projects", ci_access: json!({"groups": [{"id": "acme/platform/web"}]}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: Some("x"), expect: Err("is not authorized") },
        Case { name: "no authorization at all", ci_access: json!({}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: Some("x"), expect: Err("is not authorized") },
        Case { name: "another top-level group is never resolved", ci_access: json!({"projects": [{"id": "beta/x"}]}),
               project: (14, "beta/x"), env: "production", protected: false, namespace: Some("x"), expect: Err("is not authorized") },
        Case { name: "environment pattern matches", ci_access: json!({"projects": [{"id": "acme/platform/api", "environments": ["review/*", "production"]}]}),
               project: (12, "acme/platform/api"), env: "review/feature-1", protected: false, namespace: Some("review"), expect: Ok("review") },
        Case { name: "environment not listed", ci_access: json!({"projects": [{"id": "acme/platform/api", "environments": ["review/*", "production"]}]}),
               project: (12, "acme/platform/api"), env: "staging", protected: false, namespace: Some("x"),
               expect: Err("does not allow environment \"staging\" for project acme/platform/api: its ci_access entry allows only review/*, production") },
        Case { name: "protected branches only, unprotected ref", ci_access: json!({"groups": [{"id": "acme", "protected_branches_only": true}]}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: Some("x"),
               expect: Err("only from protected branches and tags (protected_branches_only), and \"main\" is not protected") },
        Case { name: "protected branches only, protected ref", ci_access: json!({"groups": [{"id": "acme", "protected_branches_only": true}]}),
               project: (12, "acme/platform/api"), env: "production", protected: true, namespace: Some("x"), expect: Ok("x") },
        Case { name: "the project entry wins over a looser group entry", ci_access: json!({
                   "projects": [{"id": "acme/platform/api", "environments": ["production"]}], "groups": [{"id": "acme"}]}),
               project: (12, "acme/platform/api"), env: "staging", protected: false, namespace: Some("x"), expect: Err("does not allow environment") },
        Case { name: "the project entry wins over the configuration project", ci_access: json!({
                   "projects": [{"id": "acme/agents", "protected_branches_only": true}]}),
               project: (10, "acme/agents"), env: "production", protected: false, namespace: Some("x"), expect: Err("protected_branches_only") },
        Case { name: "the configuration project wins over a group entry", ci_access: json!({"groups": [{"id": "acme", "environments": ["production"]}]}),
               project: (10, "acme/agents"), env: "staging", protected: false, namespace: Some("x"), expect: Ok("x") },
        Case { name: "the nearest ancestor group wins", ci_access: json!({"groups": [
                   {"id": "acme", "environments": ["staging"]}, {"id": "acme/platform/web", "environments": ["production"]}, {"id": "acme/platform"}]}),
               project: (11, "acme/platform/web/app"), env: "staging", protected: false, namespace: Some("x"), expect: Err("allows only production") },
        Case { name: "the winning entry's default namespace", ci_access: json!({"groups": [{"id": "acme", "default_namespace": "team-a"}]}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: None, expect: Ok("team-a") },
        Case { name: "no namespace anywhere: Kubernetes' default", ci_access: json!({"groups": [{"id": "acme"}]}),
               project: (12, "acme/platform/api"), env: "production", protected: false, namespace: None, expect: Ok("default") },
    ];
    for (i, case) in cases.iter().enumerate() {
        let app = setup().await;
        configure(&app, case.ci_access.clone()).await;
        let kubernetes = match case.namespace {
            Some(ns) => json!({"agent": "acme/agents:prod", "namespace": ns}),
            None => json!({"agent": "acme/agents:prod"}),
        };
        let got = outcome(
            &app,
            &body(
                200 + i as i64,
                case.project,
                case.env,
                case.protected,
                Some(kubernetes),
            ),
        )
        .await;
        match (&got, &case.expect) {
            (Ok(ns), Ok(expected)) => assert_eq!(ns, expected, "{}", case.name),
            (Err(reason), Err(expected)) => {
                assert!(reason.contains(expected), "{}: {reason}", case.name)
            }
            _ => panic!("{}: got {got:?}, expected {:?}", case.name, case.expect),
        }
        let rows = app
            .rows("SELECT count(*) AS n FROM agent_deployments")
            .await;
        assert_eq!(
            rows[0]["n"],
            if got.is_ok() { 1 } else { 0 },
            "{}",
            case.name
        );
        // The deployment is stored whatever the outcome.
        assert_eq!(
            app.rows("SELECT count(*) AS n FROM deployments").await[0]["n"],
            1,
            "{}",
            case.name
        );
    }
}

#[tokio::test]
async fn unknown_agent_and_no_kubernetes_section_still_store_the_deployment() {
    let app = setup().await;
    let reason = outcome(
        &app,
        &body(
            301,
            (12, "acme/platform/api"),
            "production",
            true,
            k8s("acme/agents:staging", "x"),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(
        reason,
        "agent acme/agents:staging does not exist: project acme/agents has no agent named staging"
    );
    let reason = outcome(
        &app,
        &body(302, (12, "acme/platform/api"), "production", true, None),
    )
    .await
    .unwrap_err();
    assert!(reason.contains("no kubernetes section"), "{reason}");
    // A project and environment envlens did not know yet are stored too.
    let reason = outcome(&app, &body(303, (99, "gamma/new"), "review/a", true, None))
        .await
        .unwrap_err();
    assert!(!reason.is_empty());
    assert_eq!(
        app.rows("SELECT id FROM deployments ORDER BY id").await,
        vec![json!({"id": 301}), json!({"id": 302}), json!({"id": 303})]
    );
    assert_eq!(
        app.rows("SELECT full_path, visibility FROM projects WHERE id = 99")
            .await,
        vec![json!({"full_path": "gamma/new", "visibility": "private"})]
    );
}

#[tokio::test]
async fn a_configuration_change_applies_to_the_next_deployment_only() {
    let app = setup().await;
    configure(&app, json!({"projects": [{"id": "acme/platform/api"}]})).await;
    let first = body(
        401,
        (12, "acme/platform/api"),
        "production",
        false,
        k8s("acme/agents:prod", "apps"),
    );
    assert_eq!(outcome(&app, &first).await, Ok("apps".into()));
    configure(
        &app,
        json!({"projects": [{"id": "acme/platform/api", "environments": ["staging"]}]}),
    )
    .await;
    let second = body(
        402,
        (12, "acme/platform/api"),
        "production",
        false,
        k8s("acme/agents:prod", "apps"),
    );
    assert!(outcome(&app, &second)
        .await
        .unwrap_err()
        .contains("does not allow environment"));
    // The first deployment's row stays; its replay still answers as the first time did.
    assert_eq!(outcome(&app, &first).await, Ok("apps".into()));
    // And a replay of the refused one stays refused even after access is granted again.
    configure(&app, json!({"projects": [{"id": "acme/platform/api"}]})).await;
    assert!(outcome(&app, &second)
        .await
        .unwrap_err()
        .contains("does not allow environment"));
    assert_eq!(
        app.rows("SELECT deployment_id FROM agent_deployments")
            .await,
        vec![json!({"deployment_id": 401})]
    );
}

#[tokio::test]
async fn replays_are_idempotent_and_changes_are_conflicts() {
    let app = setup().await;
    configure(&app, json!({"groups": [{"id": "acme"}]})).await;
    let original = body(
        501,
        (12, "acme/platform/api"),
        "production",
        false,
        k8s("acme/agents:prod", "apps"),
    );
    let first = create(&app, &original).await;
    assert_eq!(first.status, 201);
    let before = app.fingerprint().await;
    let again = create(&app, &original).await;
    assert_eq!((again.status, again.json()), (first.status, first.json()));
    for changed in [
        body(
            501,
            (12, "acme/platform/api"),
            "production",
            false,
            k8s("acme/agents:prod", "other"),
        ),
        body(
            501,
            (12, "acme/platform/api"),
            "production",
            false,
            k8s("acme/agents:other", "apps"),
        ),
        body(501, (12, "acme/platform/api"), "production", false, None),
    ] {
        let res = create(&app, &changed).await;
        assert!(res.error(409)["message"].as_str().unwrap().starts_with(
            "deployment 501 was created with agent acme/agents:prod and namespace apps"
        ));
    }
    assert_eq!(app.fingerprint().await, before);
}

/// GitLab 18.4's `dashboard` keys and the deprecated ones (SPEC 4.3): the example
/// records the dashboard's namespace, not the agent's default one.
#[tokio::test]
async fn both_shapes_of_the_kubernetes_section_are_taken() {
    let app = setup().await;
    configure(
        &app,
        json!({"groups": [{"id": "acme", "default_namespace": "default"}]}),
    )
    .await;
    let project = (12, "acme/platform/api");
    let dashboard = json!({"agent": "acme/agents:prod", "dashboard": {"namespace": "web", "flux_resource_path": FLUX}});
    let res = create(
        &app,
        &body(601, project, "production", true, Some(dashboard.clone())),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        res.json()["agent_deployment"],
        json!({"agent_id": 7, "kubernetes_namespace": "web", "flux_resource_path": FLUX})
    );
    let deprecated =
        json!({"agent": "acme/agents:prod", "namespace": "web", "flux_resource_path": FLUX});
    let res = create(
        &app,
        &body(602, project, "staging", true, Some(deprecated.clone())),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());
    // GitLab 18's managed resources are GitLab's to create: taken, nothing to record.
    let managed = json!({"agent": "acme/agents:prod", "dashboard": {"namespace": "web"},
                         "managed_resources": {"enabled": true}});
    let res = create(&app, &body(603, project, "review/x", true, Some(managed))).await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        app.rows("SELECT deployment_id, kubernetes_namespace, flux_resource_path FROM agent_deployments ORDER BY 1")
            .await,
        vec![
            json!({"deployment_id": 601, "kubernetes_namespace": "web", "flux_resource_path": FLUX}),
            json!({"deployment_id": 602, "kubernetes_namespace": "web", "flux_resource_path": FLUX}),
            json!({"deployment_id": 603, "kubernetes_namespace": "web", "flux_resource_path": null}),
        ]
    );

    // A replay in the other shape asks for the same thing: the same answer, nothing written.
    let before = app.fingerprint().await;
    let first = create(
        &app,
        &body(601, project, "production", true, Some(dashboard)),
    )
    .await;
    let other_shape = create(
        &app,
        &body(601, project, "production", true, Some(deprecated)),
    )
    .await;
    assert_eq!(
        (other_shape.status, other_shape.json()),
        (first.status, first.json())
    );
    // Another Flux resource, or none, is a conflict.
    let other_path = FLUX.replace("/web", "/api");
    for kubernetes in [
        json!({"agent": "acme/agents:prod", "dashboard": {"namespace": "web", "flux_resource_path": other_path}}),
        json!({"agent": "acme/agents:prod", "dashboard": {"namespace": "web"}}),
    ] {
        let res = create(
            &app,
            &body(601, project, "production", true, Some(kubernetes)),
        )
        .await;
        let message = res.error(409)["message"].as_str().unwrap().to_owned();
        assert_eq!(
            message.split(", not ").next().unwrap(),
            format!("deployment 601 was created with agent acme/agents:prod, namespace web and Flux resource path {FLUX}")
        );
    }
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn concurrent_deliveries_of_one_deployment_create_one_row() {
    let app = setup().await;
    configure(&app, json!({"groups": [{"id": "acme"}]})).await;
    let body = body(
        601,
        (12, "acme/platform/api"),
        "production",
        false,
        k8s("acme/agents:prod", "apps"),
    );
    let results = futures_util::future::join_all((0..16).map(|_| create(&app, &body))).await;
    for res in &results {
        assert_eq!(res.status, 201, "{}", res.text());
        assert_eq!(
            res.json()["agent_deployment"]["kubernetes_namespace"],
            "apps"
        );
    }
    assert_eq!(
        app.rows("SELECT count(*) AS n FROM agent_deployments")
            .await,
        vec![json!({"n": 1})]
    );
    // And different deployments concurrently, into one new environment: all recorded.
    let bodies: Vec<Value> = (0..16)
        .map(|i| {
            let mut b = body.clone();
            b["deployment"]["id"] = json!(700 + i);
            b["environment"] = json!({"id": 77, "name": "review/x", "slug": "review-x"});
            b
        })
        .collect();
    let results = futures_util::future::join_all(bodies.iter().map(|b| create(&app, b))).await;
    assert!(
        results.iter().all(|r| r.status == 201),
        "{:?}",
        results.iter().map(|r| r.text()).collect::<Vec<_>>()
    );
    assert_eq!(
        app.rows("SELECT count(*) AS n FROM agent_deployments")
            .await,
        vec![json!({"n": 17})]
    );
}

fn deployment_hook(id: i64, status: &str, at: &str) -> String {
    json!({
        "object_kind": "deployment", "status": status, "status_changed_at": at, "deployment_id": id, "deployable_id": 5000 + id,
        "deployable_url": "https://gitlab.example.com/acme/platform/api/-/jobs/1", "environment": "production",
        "environment_tier": "production", "environment_slug": "production", "environment_external_url": null,
        "project": {"id": 12, "name": "api", "web_url": "https://gitlab.example.com/acme/platform/api", "namespace": "platform",
                    "path_with_namespace": "acme/platform/api", "visibility_level": 0, "default_branch": "main"},
        "short_sha": "0a1b2c3d", "user": {"id": 3, "username": "ann"}, "commit_url": "https://gitlab.example.com/c", "commit_title": "Deploy",
        "ref": "main"
    }).to_string()
}

async fn deployment_state(app: &TestApp, id: i64) -> Value {
    app.rows(&format!("SELECT status, to_char(finished_at AT TIME ZONE 'UTC', 'HH24:MI:SS') AS finished, environment_id FROM deployments WHERE id = {id}")).await[0].clone()
}

#[tokio::test]
async fn status_hooks_in_order() {
    let app = setup().await;
    create(
        &app,
        &body(801, (12, "acme/platform/api"), "production", false, None),
    )
    .await;
    for (status, at) in [
        ("running", "2026-11-21 10:01:00 UTC"),
        ("success", "2026-11-21 11:05:00 +0100"),
    ] {
        let res = app
            .hook("Deployment Hook", deployment_hook(801, status, at), None)
            .await;
        assert_eq!(res.json()["applied"], true, "{}", res.text());
    }
    assert_eq!(
        deployment_state(&app, 801).await,
        json!({"status": "success", "finished": "10:05:00", "environment_id": 1130})
    );
}

#[tokio::test]
async fn status_hooks_out_of_order_and_twice() {
    let app = setup().await;
    // The success hook first, before even the creation call.
    let success = deployment_hook(802, "success", "2026-11-21 10:05:00 UTC");
    assert_eq!(
        app.hook("Deployment Hook", success.clone(), Some("d-3"))
            .await
            .json()["applied"],
        true
    );
    assert_eq!(
        deployment_state(&app, 802).await,
        json!({"status": "success", "finished": "10:05:00", "environment_id": null})
    );
    // Then the older running hook, and a redelivery of the success one.
    let running = app
        .hook(
            "Deployment Hook",
            deployment_hook(802, "running", "2026-11-21 10:01:00 UTC"),
            Some("d-2"),
        )
        .await;
    assert_eq!(running.json()["applied"], false);
    let again = app.hook("Deployment Hook", success, Some("d-3")).await;
    assert_eq!(
        again.json(),
        json!({"applied": false, "outcome": "duplicate", "reason": "already delivered"})
    );
    // Even an unfinished hook that claims to be newer cannot reopen a finished deployment.
    let late = app
        .hook(
            "Deployment Hook",
            deployment_hook(802, "running", "2026-11-21 12:00:00 UTC"),
            None,
        )
        .await;
    assert_eq!(late.json()["applied"], false);
    // The creation call completes it and keeps the finished status.
    let created = create(
        &app,
        &body(802, (12, "acme/platform/api"), "production", false, None),
    )
    .await;
    assert_eq!(created.status, 200);
    assert_eq!(
        deployment_state(&app, 802).await,
        json!({"status": "success", "finished": "10:05:00", "environment_id": 1130})
    );
    assert_eq!(
        app.rows("SELECT iid, job_id, sha, environment_name FROM deployments")
            .await,
        vec![json!({"iid": 3, "job_id": 5802, "sha": "0a1b2c3d4e5f", "environment_name": null})]
    );
}

#[tokio::test]
async fn a_newer_finished_status_replaces_an_older_one() {
    let app = setup().await;
    app.hook(
        "Deployment Hook",
        deployment_hook(803, "failed", "2026-11-21 10:05:00 UTC"),
        None,
    )
    .await;
    app.hook(
        "Deployment Hook",
        deployment_hook(803, "success", "2026-11-21 10:09:00 UTC"),
        None,
    )
    .await;
    app.hook(
        "Deployment Hook",
        deployment_hook(803, "canceled", "2026-11-21 10:07:00 UTC"),
        None,
    )
    .await;
    assert_eq!(deployment_state(&app, 803).await["status"], "success");
    assert_eq!(deployment_state(&app, 803).await["finished"], "10:09:00");
}

#[tokio::test]
async fn bad_creation_calls_name_their_field_and_change_nothing() {
    let app = setup().await;
    configure(&app, json!({"groups": [{"id": "acme"}]})).await;
    let before = app.fingerprint().await;
    let good = body(
        901,
        (12, "acme/platform/api"),
        "production",
        true,
        k8s("acme/agents:prod", "apps"),
    );
    // Sets (or adds) the value at `pointer`.
    let with = |pointer: &str, value: Value| {
        let mut b = good.clone();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        b.pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert(key.to_owned(), value);
        b
    };
    let without = |parent: &str, key: &str| {
        let mut b = good.clone();
        b.pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove(key);
        b
    };
    let cases = [
        (with("/deployment/id", json!(0)), "deployment.id"),
        (with("/deployment/id", json!("101")), "deployment.id"),
        (with("/deployment/iid", json!(-1)), "deployment.iid"),
        (
            with("/deployment/status", json!("done")),
            "deployment.status",
        ),
        (
            with("/deployment/created_at", json!("yesterday")),
            "deployment.created_at",
        ),
        (with("/project/id", json!(-5)), "project.id"),
        (
            with("/project/full_path", json!("acme/")),
            "project.full_path",
        ),
        (without("/project", "full_path"), "project.full_path"),
        (with("/environment/id", json!(0)), "environment.id"),
        (with("/environment/name", json!("")), "environment.name"),
        (with("/environment/slug", json!(" ")), "environment.slug"),
        (with("/environment/tier", json!("prod")), "environment.tier"),
        (with("/job/id", json!(0)), "job.id"),
        (with("/job/name", json!("")), "job.name"),
        (
            with("/job/protected_ref", json!("yes")),
            "job.protected_ref",
        ),
        (
            with("/kubernetes/agent", json!("acme/agents")),
            "kubernetes.agent",
        ),
        (
            with("/kubernetes/agent", json!("acme/agents:Prod")),
            "kubernetes.agent",
        ),
        (
            with("/kubernetes/agent", json!(":prod")),
            "kubernetes.agent",
        ),
        (
            with("/kubernetes/namespace", json!("Apps")),
            "kubernetes.namespace",
        ),
        (
            with("/kubernetes/namespace", json!("a".repeat(64))),
            "kubernetes.namespace",
        ),
        (
            with("/kubernetes/namespace", json!("-apps")),
            "kubernetes.namespace",
        ),
        (without("/kubernetes", "agent"), "kubernetes.agent"),
        // GitLab 18's keys: an unknown key anywhere in the section is named, never dropped.
        (
            with("/kubernetes/dashbord", json!({})),
            "kubernetes.dashbord",
        ),
        (
            with(
                "/kubernetes/dashboard",
                json!({"namespace": "apps", "namspace": "x"}),
            ),
            "kubernetes.dashboard.namspace",
        ),
        (
            with(
                "/kubernetes/managed_resources",
                json!({"enabled": true, "x": 1}),
            ),
            "kubernetes.managed_resources.x",
        ),
        (
            with("/kubernetes/managed_resources", json!({"enabled": "yes"})),
            "kubernetes.managed_resources.enabled",
        ),
        (
            with("/kubernetes/dashboard", json!("apps")),
            "kubernetes.dashboard",
        ),
        (
            with(
                "/kubernetes",
                json!({"agent": "acme/agents:prod", "dashboard": {"namespace": "Apps"}}),
            ),
            "kubernetes.dashboard.namespace",
        ),
        (
            with(
                "/kubernetes",
                json!({"agent": "acme/agents:prod", "dashboard": {"flux_resource_path": FLUX}}),
            ),
            "kubernetes.dashboard.namespace",
        ),
        // Set in both places: named by its deprecated place.
        (
            with("/kubernetes/dashboard", json!({"namespace": "apps"})),
            "kubernetes.namespace",
        ),
        (
            with("/kubernetes/flux_resource_path", json!("")),
            "kubernetes.flux_resource_path",
        ),
        (
            with(
                "/kubernetes/flux_resource_path",
                json!(format!("{FLUX}/{}", "x".repeat(200))),
            ),
            "kubernetes.flux_resource_path",
        ),
        (
            with(
                "/kubernetes",
                json!({"agent": "acme/agents:prod", "dashboard": {"namespace": "apps", "flux_resource_path": "a\u{0}b"}}),
            ),
            "kubernetes.dashboard.flux_resource_path",
        ),
        (
            with(
                "/kubernetes",
                json!({"agent": "acme/agents:prod", "flux_resource_path": FLUX}),
            ),
            "kubernetes.namespace",
        ),
        (without("", "deployment"), "deployment"),
        (without("", "job"), "job"),
    ];
    for (body, field) in cases {
        let res = create(&app, &body).await;
        assert_eq!(res.error(422)["field"], field, "{body}");
    }
    let res = app
        .internal_raw(
            Method::POST,
            DEPLOYMENTS,
            &internal_token(),
            "{\"deployment\":".into(),
        )
        .await;
    assert_eq!(res.error(400)["code"], "bad_request");
    assert_eq!(app.fingerprint().await, before);
}

#[tokio::test]
async fn bad_deployment_hooks_name_their_field_and_change_nothing() {
    let app = setup().await;
    let before = app.fingerprint().await;
    let good: Value =
        serde_json::from_str(&deployment_hook(1001, "running", "2026-11-21 10:00:00 UTC")).unwrap();
    let with = |key: &str, value: Value| {
        let mut b = good.clone();
        b[key] = value;
        b.to_string()
    };
    let cases = [
        (with("object_kind", json!("build")), "object_kind"),
        (with("deployment_id", json!(0)), "deployment_id"),
        (with("status", json!("finished")), "status"),
        (
            with("status_changed_at", json!("soon")),
            "status_changed_at",
        ),
        (with("environment", json!("")), "environment"),
        (
            with("project", json!({"id": 12})),
            "project.path_with_namespace",
        ),
        (
            with(
                "project",
                json!({"id": 12, "path_with_namespace": "a/b", "visibility_level": 5}),
            ),
            "project.visibility_level",
        ),
    ];
    for (body, field) in cases {
        let res = app.hook("Deployment Hook", body.clone(), None).await;
        assert_eq!(res.error(422)["field"], field, "{body}");
    }
    assert_eq!(app.fingerprint().await, before);
}

/// A fresh creation is read and written in two statements (`check_fresh`, `create_fresh`);
/// whatever overtakes it between them (the project moved, GitLab's hook creating the
/// deployment, another environment taking the name) has the write leave every row of the
/// call alone (no claim, no deployment, no row, no reason), so that the call's transaction of
/// steps then records it as a call that came at that moment would be.
#[tokio::test]
async fn a_fresh_creation_overtaken_between_its_statements_writes_nothing() {
    use envlens::db::deployments::{
        check_fresh, create_fresh, AgentDeployment, Creation, Environment, FreshCreation,
        NewDeployment,
    };
    use envlens::gitlab::deployment_status::{DeploymentStatus, StatusReport};

    let app = setup().await;
    configure(&app, json!({"groups": [{"id": "acme"}]})).await;
    let counts = || async {
        app.rows(
            "SELECT (SELECT count(*) FROM deployments) AS deployments,
                    (SELECT count(*) FROM deployment_creations) AS claims,
                    (SELECT count(*) FROM agent_deployments) AS agent_rows,
                    (SELECT count(*) FROM environments WHERE id = 1130) AS environments",
        )
        .await[0]
            .clone()
    };
    // Checks deployment `id` fresh, lets `overtake` run, then writes it: whether it was.
    let attempt = |id: i64, overtake: &'static str| {
        let db = app.db.clone();
        async move {
            let environment = Environment {
                id: 1130,
                project_id: 12,
                name: "production",
                slug: "production",
                tier: Some("production"),
            };
            let new = NewDeployment {
                id,
                iid: Some(1),
                project_id: 12,
                environment_id: Some(1130),
                environment_name: "production",
                report: StatusReport {
                    status: DeploymentStatus::Created,
                    changed_at: None,
                },
                git_ref: Some("main"),
                sha: None,
                tag: Some(false),
                job_id: Some(5000 + id),
                created_at: None,
            };
            let fresh = FreshCreation {
                project_full_path: "acme/platform/api",
                environment: &environment,
                deployment: &new,
                agent: Some(("acme/agents", "prod")),
            };
            let mut conn = db.acquire().await.unwrap();
            let found = check_fresh(&mut conn, &fresh).await.unwrap();
            let found = found.expect("fresh before it is overtaken");
            let agent = found.expect("the agent");
            assert_eq!(agent.groups.len(), 1, "acme's entry: {agent:?}");
            sqlx::raw_sql(overtake).execute(&db).await.unwrap();
            let creation = Creation {
                agent: Some("acme/agents:prod".into()),
                namespace: Some("apps".into()),
                flux_resource_path: None,
                reason: None,
            };
            let row = AgentDeployment {
                agent_id: agent.agent_id,
                kubernetes_namespace: "apps".into(),
                flux_resource_path: None,
            };
            create_fresh(&mut conn, &fresh, &creation, Some(&row))
                .await
                .unwrap()
        }
    };
    // The call GitLab makes again for deployment `id`, which records it.
    let call = |id| {
        body(
            id,
            (12, "acme/platform/api"),
            "production",
            false,
            k8s("acme/agents:prod", "apps"),
        )
    };
    let none = json!({"deployments": 0, "claims": 0, "agent_rows": 0, "environments": 0});

    // The project moved: not written, not even the environment.
    let moved = "UPDATE projects SET path = 'api2', full_path = 'acme/platform/api2' WHERE id = 12";
    assert!(!attempt(901, moved).await);
    assert_eq!(counts().await, none);
    // The call itself moves it back and records the deployment.
    assert_eq!(outcome(&app, &call(901)).await, Ok("apps".to_owned()));
    assert_eq!(
        app.rows("SELECT full_path FROM projects WHERE id = 12")
            .await,
        vec![json!({"full_path": "acme/platform/api"})]
    );

    // GitLab's hook created the deployment meanwhile: neither claimed nor given a row; the call
    // completes the deployment as after any hook.
    let hooked = "INSERT INTO deployments (id, project_id, environment_name, status, job_id)
                  VALUES (902, 12, 'production', 'running', 5902)";
    assert!(!attempt(902, hooked).await);
    let after_hook = json!({"deployments": 2, "claims": 1, "agent_rows": 1, "environments": 1});
    assert_eq!(counts().await, after_hook);
    assert_eq!(outcome(&app, &call(902)).await, Ok("apps".to_owned()));
    assert_eq!(
        deployment_state(&app, 902).await,
        json!({"status": "running", "finished": null, "environment_id": 1130})
    );

    // Another environment of the project took the name (GitLab deleted and recreated it): the
    // write fails whole; the call replaces that environment.
    let renamed = "DELETE FROM environments WHERE id = 1130;
                   INSERT INTO environments (id, project_id, name, slug) VALUES (1999, 12, 'production', 'production')";
    assert!(!attempt(903, renamed).await);
    assert_eq!(
        app.rows("SELECT id FROM environments WHERE project_id = 12")
            .await,
        vec![json!({"id": 1999})]
    );
    assert_eq!(
        app.rows("SELECT count(*) AS n FROM deployment_creations WHERE deployment_id = 903")
            .await,
        vec![json!({"n": 0})]
    );
    assert_eq!(outcome(&app, &call(903)).await, Ok("apps".to_owned()));
    assert_eq!(
        app.rows("SELECT id FROM environments WHERE project_id = 12")
            .await,
        vec![json!({"id": 1130})]
    );
}
