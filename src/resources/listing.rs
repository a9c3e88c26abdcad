//! What the cluster answered for one environment, before assembly into a view: the data that
//! `k8s::fetch` produces and `group` assembles, kept here so that the pure side does not import
//! the side that does I/O.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::object::Object;

/// A group version whose discovery failed, e.g. an aggregated API whose server is down (503). Its
/// kinds are left out until a later refresh succeeds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryFailure {
    /// e.g. `metrics.k8s.io/v1beta1`.
    pub group_version: String,
    /// The HTTP status, when the cluster answered.
    pub code: Option<u16>,
    pub message: String,
}

/// A kind that could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ListError {
    pub api_version: String,
    pub kind: String,
    /// The HTTP status, when the cluster answered (403, 404, 500, …); `None` for a timeout or a
    /// connection failure.
    pub code: Option<u16>,
    /// The `Status` message when the answer carried one.
    pub message: String,
}

/// One Event about a resource, flattened from a core/v1 Event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ResourceEvent {
    /// `Normal` or `Warning`.
    pub event_type: String,
    pub reason: String,
    pub message: String,
    /// How many times it happened (`count`, or `series.count`), at least 1.
    pub count: u32,
    /// `firstTimestamp`, else `eventTime`, else the Event's creation.
    pub first_seen: Option<DateTime<Utc>>,
    /// `series.lastObservedTime`, else `lastTimestamp`, else `eventTime`, else `first_seen`.
    pub last_seen: Option<DateTime<Utc>>,
    /// The component that reported it (`source.component` or `reportingComponent`).
    pub source: Option<String>,
}

/// What the cluster answered for one environment, before assembly into a view.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub namespace: String,
    pub label_selector: String,
    /// The label-selected objects, one per uid, `apiVersion` and `kind` filled in. Shared, not
    /// copied, with the watch cache when they come from it.
    pub selected: Vec<Arc<Object>>,
    /// The objects whose ownership chain leads to a selected one (and the Endpoints and
    /// EndpointSlices of selected Services), one per uid, none of them selected.
    pub owned: Vec<Arc<Object>>,
    /// Events by the uid of the object they are about (only objects above), most recent first.
    pub events: HashMap<String, Vec<ResourceEvent>>,
    /// Kinds that failed to list (the Events included, as `v1 Event`), by apiVersion and kind.
    pub errors: Vec<ListError>,
    /// Group versions left out because their discovery failed.
    pub unavailable: Arc<[DiscoveryFailure]>,
    /// Said by the source of the listing, e.g. a watch cache that is out of date for a kind.
    pub warnings: Vec<String>,
}
