//! Snapshots in and out of the database: only what is not stored yet is compressed and
//! written, under the environment's lock so that retention never collects a manifest that a
//! snapshot being written names.

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;
use sqlx::PgPool;

use super::snapshot::{self, Entry, Hash, Snapshot};
use crate::db::history::{self as db, SnapshotRow};
use crate::error::{Error, Result};
use crate::resources::health::HealthStatus;
use crate::resources::listing::ListError;

fn internal(message: String) -> Error {
    Error::Internal(anyhow::anyhow!(message))
}

/// Writes the manifests and chunks of `snap` that the environment lacks; returns the chunk
/// hashes, in order.
async fn put_content(
    conn: &mut sqlx::PgConnection,
    environment_id: i64,
    snap: &Snapshot,
) -> Result<Vec<Vec<u8>>> {
    let hashes: Vec<Vec<u8>> = snap.manifests.keys().map(|h| h.to_vec()).collect();
    let missing = db::missing_manifests(conn, environment_id, &hashes).await?;
    if !missing.is_empty() {
        let bodies: Vec<Vec<u8>> = missing
            .iter()
            .filter_map(|h| {
                let key: Hash = h.as_slice().try_into().ok()?;
                snap.manifests
                    .get(&key)
                    .map(|text| snapshot::compress(text))
            })
            .collect();
        db::insert_manifests(conn, environment_id, &missing, &bodies).await?;
    }
    let chunks = snapshot::chunks(&snap.entries);
    let hashes: Vec<Vec<u8>> = chunks.iter().map(|c| c.hash.to_vec()).collect();
    let missing: HashSet<Vec<u8>> = db::missing_chunks(conn, environment_id, &hashes)
        .await?
        .into_iter()
        .collect();
    if !missing.is_empty() {
        let (new_hashes, bodies): (Vec<Vec<u8>>, Vec<Vec<u8>>) = chunks
            .into_iter()
            .filter(|c| missing.contains(c.hash.as_slice()))
            .map(|c| (c.hash.to_vec(), c.body))
            .unzip();
        db::insert_chunks(conn, environment_id, &new_hashes, &bodies).await?;
    }
    Ok(hashes)
}

/// Stores the first snapshot of a deployment (as the settled one too when `settled`: the group
/// is not PROGRESSING, or for a pull-based deployment HEALTHY), then applies retention. False when the deployment had one already (nothing
/// is written then).
pub async fn save_first(
    pool: &PgPool,
    deployment_id: i64,
    environment_id: i64,
    snap: &Snapshot,
    errors: &[ListError],
    settled: bool,
    keep: i64,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    db::lock_environment(&mut tx, environment_id).await?;
    if db::snapshot(&mut tx, deployment_id).await?.is_some() {
        return Ok(false);
    }
    let chunks = put_content(&mut tx, environment_id, snap).await?;
    let errors = (!errors.is_empty()).then(|| {
        Value::Array(
            errors
                .iter()
                .map(|e| serde_json::json!({"apiVersion": e.api_version, "kind": e.kind, "code": e.code, "message": e.message}))
                .collect(),
        )
    });
    let inserted = db::insert_snapshot(
        &mut tx,
        &db::NewSnapshot {
            deployment_id,
            environment_id,
            health: snap.health.as_str(),
            health_message: snap.health_message.as_deref(),
            chunks: &chunks,
            errors,
            settled,
        },
    )
    .await?;
    if db::prune(&mut tx, environment_id, keep).await? > 0 {
        collect_manifests(&mut tx, environment_id).await?;
    }
    tx.commit().await?;
    Ok(inserted)
}

/// Forgets the manifests that no chunk the environment keeps names.
async fn collect_manifests(conn: &mut sqlx::PgConnection, environment_id: i64) -> Result<()> {
    let bodies = db::all_chunks(conn, environment_id).await?;
    let mut keep = HashSet::new();
    for entry in snapshot::read_chunks(&bodies).map_err(internal)? {
        if let Some(hash) = snapshot::unhex(&entry.manifest) {
            keep.insert(hash.to_vec());
        }
    }
    let keep: Vec<Vec<u8>> = keep.into_iter().collect();
    db::delete_manifests_except(conn, environment_id, &keep).await?;
    Ok(())
}

/// Stores the settled snapshot of a deployment whose first one is stored. False when it had
/// settled already, or its snapshot went with retention.
pub async fn save_settled(pool: &PgPool, first: &SnapshotRow, snap: &Snapshot) -> Result<bool> {
    let mut tx = pool.begin().await?;
    db::lock_environment(&mut tx, first.environment_id).await?;
    let chunks = put_content(&mut tx, first.environment_id, snap).await?;
    let same = chunks == first.chunks;
    let settled = db::settle(
        &mut tx,
        first.deployment_id,
        snap.health.as_str(),
        snap.health_message.as_deref(),
        (!same).then_some(chunks.as_slice()),
        snap.health == HealthStatus::Healthy,
    )
    .await?;
    tx.commit().await?;
    Ok(settled)
}

/// Marks the settling of a deployment as ended without a second look (its rollout was
/// overtaken, or the cluster could not be read by the deadline).
pub async fn settle_unseen(pool: &PgPool, first: &SnapshotRow) -> Result<bool> {
    let mut conn = pool.acquire().await?;
    db::settle(
        &mut conn,
        first.deployment_id,
        &first.health,
        first.health_message.as_deref(),
        None,
        false,
    )
    .await
}

/// The resources a snapshot row shows: the settled ones when it settled, else the first ones.
pub async fn entries(conn: &mut sqlx::PgConnection, row: &SnapshotRow) -> Result<Vec<Entry>> {
    let hashes = row.settled_chunks.as_ref().unwrap_or(&row.chunks);
    let bodies = db::chunk_bodies(conn, row.environment_id, hashes).await?;
    if bodies.len() != hashes.len() {
        return Err(internal(format!(
            "the snapshot of deployment {} names a chunk that is not stored",
            row.deployment_id
        )));
    }
    snapshot::read_chunks(&bodies).map_err(internal)
}

/// The manifests (canonical JSON text) that `entries` name, by hex hash.
pub async fn manifest_texts<'a>(
    conn: &mut sqlx::PgConnection,
    environment_id: i64,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Result<BTreeMap<String, String>> {
    let mut hashes: Vec<Vec<u8>> = entries
        .into_iter()
        .filter_map(|e| snapshot::unhex(&e.manifest))
        .map(|h| h.to_vec())
        .collect();
    hashes.sort();
    hashes.dedup();
    let mut out = BTreeMap::new();
    for (hash, body) in db::manifests(conn, environment_id, &hashes).await? {
        let text = String::from_utf8(snapshot::decompress(&body).map_err(internal)?)
            .map_err(|_| internal("a stored manifest is not UTF-8".into()))?;
        let key: Hash = hash
            .as_slice()
            .try_into()
            .map_err(|_| internal("a stored manifest hash is not 32 bytes".into()))?;
        out.insert(snapshot::hex(&key), text);
    }
    Ok(out)
}

/// The manifests (as JSON) that `entries` name, by hex hash.
pub async fn manifests<'a>(
    conn: &mut sqlx::PgConnection,
    environment_id: i64,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Result<BTreeMap<String, Value>> {
    manifest_texts(conn, environment_id, entries)
        .await?
        .into_iter()
        .map(|(hash, text)| {
            serde_json::from_str(&text)
                .map(|value| (hash, value))
                .map_err(|e| internal(format!("a stored manifest does not parse: {e}")))
        })
        .collect()
}

/// Two snapshots of an environment, read for comparing: the deployment's own and its base's.
pub struct Compared {
    /// The deployment compared with, when there is one.
    pub since: Option<i64>,
    pub before: Vec<Entry>,
    pub after: Vec<Entry>,
    /// The manifests of the resources that changed, by hex hash.
    pub manifests: BTreeMap<String, Value>,
}

/// A deployment's snapshot and its base's, their resources read but not compared yet: a reader
/// may leave out what its viewer may not see before [`changed_manifests`] reads the rest.
pub struct Pair {
    pub after: SnapshotRow,
    pub before: Option<SnapshotRow>,
    pub new: Vec<Entry>,
    pub old: Vec<Entry>,
}

/// Reads `deployment_id`'s snapshot and its base: `since` (which must be a deployment of the
/// same environment with a snapshot), or the environment's newest earlier deployment with a
/// snapshot. `None` when the deployment has no snapshot.
pub async fn pair(
    conn: &mut sqlx::PgConnection,
    deployment_id: i64,
    since: Option<i64>,
) -> Result<Option<Pair>> {
    let Some(after) = db::snapshot(conn, deployment_id).await? else {
        return Ok(None);
    };
    let before = match since {
        Some(id) => {
            let row = db::snapshot(conn, id).await?;
            match row {
                Some(row) if row.environment_id == after.environment_id => Some(row),
                Some(_) => {
                    return Err(Error::invalid(
                        "since",
                        format!("deployment {id} is not a deployment of the same environment"),
                    ))
                }
                None => {
                    return Err(Error::invalid(
                        "since",
                        format!("deployment {id} has no snapshot"),
                    ))
                }
            }
        }
        None => db::previous_snapshot(conn, after.environment_id, deployment_id).await?,
    };
    let new = entries(conn, &after).await?;
    let old = match &before {
        Some(row) => entries(conn, row).await?,
        None => Vec::new(),
    };
    Ok(Some(Pair {
        after,
        before,
        new,
        old,
    }))
}

/// The manifests of what changed from `old` to `new` (resources of `environment_id`), by hex
/// hash: what a report of the changes shows.
pub async fn changed_manifests(
    conn: &mut sqlx::PgConnection,
    environment_id: i64,
    old: &[Entry],
    new: &[Entry],
) -> Result<BTreeMap<String, Value>> {
    let changes = super::diff::compare(old, new);
    let wanted = changes
        .added
        .iter()
        .chain(&changes.removed)
        .copied()
        .chain(changes.modified.iter().flat_map(|(b, a)| [*b, *a]));
    manifests(conn, environment_id, wanted).await
}

/// [`pair`] and the [`changed_manifests`] of all their resources: for a reader who may see
/// every kind (`envlens history`, with the database's credentials).
pub async fn compare(
    conn: &mut sqlx::PgConnection,
    deployment_id: i64,
    since: Option<i64>,
) -> Result<Option<Compared>> {
    let Some(pair) = pair(conn, deployment_id, since).await? else {
        return Ok(None);
    };
    let manifests =
        changed_manifests(conn, pair.after.environment_id, &pair.old, &pair.new).await?;
    Ok(Some(Compared {
        since: pair.before.map(|b| b.deployment_id),
        before: pair.old,
        after: pair.new,
        manifests,
    }))
}
