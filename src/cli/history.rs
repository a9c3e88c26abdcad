//! `envlens history`: what a deployment changed in its cluster (SPEC 10), for ops scripts and
//! people at a terminal. Reads the snapshots from the database as `serve` stores them; like
//! `envlens token`, it is for whoever may open the database, so no `user_access` applies.

use std::io::Write;

use anyhow::Context;
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::config::{HistoryArgs, HistoryFormat};
use crate::db::history as db;
use crate::history::diff::{self, describe_patch};
use crate::history::snapshot::Entry;
use crate::history::store;

/// A deployment id as given: `101` or `gid://gitlab/Deployment/101`.
fn deployment_id(flag: &str, text: &str) -> anyhow::Result<i64> {
    text.trim()
        .trim_start_matches("gid://gitlab/Deployment/")
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .with_context(|| format!("{flag}: `{text}` is not a deployment id"))
}

/// The changes of the deployment `args` name, as one JSON object (see [`HistoryFormat::Json`]).
pub async fn changes(conn: &mut PgConnection, args: &HistoryArgs) -> anyhow::Result<Value> {
    let id = match (&args.deployment, &args.project, &args.environment) {
        (Some(id), _, _) => deployment_id("--deployment", id)?,
        (None, Some(project), Some(environment)) => {
            db::find_deployment(conn, project, environment, args.iid)
                .await?
                .with_context(|| match args.iid {
                    Some(iid) => format!("no deployment {iid} of {project} to {environment}"),
                    None => format!("no successful deployment of {project} to {environment}"),
                })?
        }
        _ => anyhow::bail!(
            "name a deployment: --deployment <id>, or --project <path> --environment <name>"
        ),
    };
    let since = args
        .since
        .as_deref()
        .map(|s| deployment_id("--since", s))
        .transpose()?;
    let Some(row) = db::snapshot(conn, id).await? else {
        let why = match db::job(conn, id).await? {
            None => "no snapshot was asked for: it has not succeeded, or has no agent".to_owned(),
            Some(job) => match (job.phase.as_str(), job.last_error) {
                ("superseded", _) => {
                    "a newer deployment of the environment succeeded before its snapshot".into()
                }
                (phase, Some(error)) => {
                    format!("{phase} after {} attempt(s): {error}", job.attempts)
                }
                (phase, None) => format!("{phase}: not taken yet"),
            },
        };
        anyhow::bail!("deployment {id} has no snapshot ({why})");
    };
    let compared = store::compare(conn, id, since)
        .await?
        .context("the snapshot went while it was read")?;
    let report = diff::report(&compared.before, &compared.after, &compared.manifests);
    let with = |e: &Entry, more: Value| {
        let mut v = identity(e);
        if let (Value::Object(v), Value::Object(more)) = (&mut v, more) {
            v.extend(more);
        }
        v
    };
    let (health, message) = match &row.settled_health {
        Some(h) => (h, &row.settled_message),
        None => (&row.health, &row.health_message),
    };
    Ok(json!({
        "deployment": id,
        "since": compared.since,
        "takenAt": row.taken_at,
        "settledAt": row.settled_at,
        "health": health.to_uppercase(),
        "healthMessage": message,
        "timeToHealthy": row.time_to_healthy,
        "images": report.images.iter().map(|(e, c)| with(e, json!({
            "container": c.container, "before": c.before, "after": c.after}))).collect::<Vec<_>>(),
        "added": report.added.iter().map(|e| identity(e)).collect::<Vec<_>>(),
        "removed": report.removed.iter().map(|e| identity(e)).collect::<Vec<_>>(),
        "modified": report.modified.iter().map(|(e, patch)| with(e, json!({"patch": patch}))).collect::<Vec<_>>(),
    }))
}

fn identity(e: &Entry) -> Value {
    json!({"apiVersion": e.api_version, "kind": e.kind, "namespace": e.namespace, "name": e.name})
}

/// `apiVersion Kind namespace/name`.
fn name(v: &Value) -> String {
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    let ns = v["namespace"]
        .as_str()
        .map(|ns| format!("{ns}/"))
        .unwrap_or_default();
    format!(
        "{} {} {ns}{}",
        text("apiVersion"),
        text("kind"),
        text("name")
    )
}

/// The changes as lines for people.
pub fn text(changes: &Value, out: &mut impl Write) -> std::io::Result<()> {
    let time = |k: &str| changes[k].as_str().unwrap_or("-").to_owned();
    writeln!(out, "deployment {}", changes["deployment"])?;
    let health = changes["health"].as_str().unwrap_or_default();
    match changes["settledAt"].as_str() {
        Some(settled) => writeln!(
            out,
            "snapshot taken {}, settled {settled}: {health}",
            time("takenAt")
        )?,
        None => writeln!(
            out,
            "snapshot taken {}: {health}, settling",
            time("takenAt")
        )?,
    }
    if let Some(message) = changes["healthMessage"].as_str() {
        writeln!(out, "  {message}")?;
    }
    if let Some(seconds) = changes["timeToHealthy"].as_f64() {
        writeln!(out, "time to healthy: {seconds:.1} s")?;
    }
    match changes["since"].as_i64() {
        Some(since) => writeln!(out, "compared with deployment {since}")?,
        None => writeln!(out, "no earlier snapshot: every resource is new")?,
    }
    let list = |k: &str| changes[k].as_array().cloned().unwrap_or_default();
    let images = list("images");
    if !images.is_empty() {
        writeln!(out, "\nimages:")?;
        for i in &images {
            let side = |k: &str| i[k].as_str().unwrap_or("(none)").to_owned();
            writeln!(
                out,
                "  {} {}: {} -> {}",
                name(i),
                i["container"].as_str().unwrap_or_default(),
                side("before"),
                side("after")
            )?;
        }
    }
    for (title, key) in [("added", "added"), ("removed", "removed")] {
        let items = list(key);
        if !items.is_empty() {
            writeln!(out, "\n{title}:")?;
            for item in &items {
                writeln!(out, "  {}", name(item))?;
            }
        }
    }
    let modified = list("modified");
    if !modified.is_empty() {
        writeln!(out, "\nmodified:")?;
        for m in &modified {
            writeln!(out, "  {}", name(m))?;
            let ops = m["patch"].as_array().cloned().unwrap_or_default();
            for line in describe_patch(&ops) {
                writeln!(out, "    {line}")?;
            }
        }
    }
    if images.is_empty()
        && list("added").is_empty()
        && list("removed").is_empty()
        && modified.is_empty()
    {
        writeln!(out, "\nno changes")?;
    }
    Ok(())
}

/// Prints the changes in the chosen format.
pub fn print(changes: &Value, format: HistoryFormat, out: &mut impl Write) -> std::io::Result<()> {
    match format {
        HistoryFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, changes)?;
            writeln!(out)
        }
        HistoryFormat::Text => text(changes, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_as_numbers_or_global_ids() {
        assert_eq!(deployment_id("--deployment", "101").unwrap(), 101);
        assert_eq!(
            deployment_id("--deployment", "gid://gitlab/Deployment/7").unwrap(),
            7
        );
        let err = deployment_id("--since", "gid://gitlab/Project/7").unwrap_err();
        assert!(err.to_string().starts_with("--since"), "{err}");
        assert!(deployment_id("--since", "0").is_err());
    }

    #[test]
    fn text_names_images_additions_removals_and_patches() {
        let changes = json!({
            "deployment": 4, "since": 1, "takenAt": "2026-11-21T10:05:00Z",
            "settledAt": "2026-11-21T10:05:30Z", "health": "HEALTHY", "healthMessage": null,
            "timeToHealthy": 30.04,
            "images": [{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "web",
                        "container": "app", "before": "web:1", "after": "web:2"}],
            "added": [{"apiVersion": "v1", "kind": "ConfigMap", "namespace": "shop", "name": "new"}],
            "removed": [],
            "modified": [{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "web",
                          "patch": [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "web:2"}]}]
        });
        let mut out = Vec::new();
        text(&changes, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "deployment 4\nsnapshot taken 2026-11-21T10:05:00Z, settled 2026-11-21T10:05:30Z: HEALTHY\n\
             time to healthy: 30.0 s\ncompared with deployment 1\n\nimages:\n  \
             apps/v1 Deployment shop/web app: web:1 -> web:2\n\nadded:\n  v1 ConfigMap shop/new\n\n\
             modified:\n  apps/v1 Deployment shop/web\n    \
             replace /spec/template/spec/containers/0/image = \"web:2\"\n"
        );
    }
}
