//! Deployment history (SPEC 10): what each successful deployment left in its cluster, and
//! how long its rollout took to become healthy.
//!
//! - [`snapshot`] (pure): a resource group as stored: manifests stripped of what the cluster
//!   writes, Secrets masked, hashed, chunked and compressed;
//! - [`diff`] (pure): what changed between two snapshots (RFC 6902 patches, images);
//! - [`store`]: writing and reading snapshots through `db::history`, retention;
//! - [`worker`]: the jobs, claimed from the database, that take the snapshots (`serve` runs it).

pub mod diff;
pub mod snapshot;
pub mod store;
pub mod worker;
