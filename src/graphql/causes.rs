//! `ResourceGroup.causes` and `KubernetesResource.cause` (SPEC 17): the causes that
//! [`crate::resources::cause`] finds in the shared group, named by uid, and the previous log
//! lines of a crashed container, read only when `logLines` is asked for, as the viewer, for at
//! most [`LOG_PODS`] Pods a view ([`crate::k8s::previous_log`] keeps them 30 s).

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_graphql::parser::types::{Field, Selection, SelectionSet};
use async_graphql::registry::Registry;
use async_graphql::{
    ComplexObject, Context, ContextSelectionSet, OutputType, Positioned, ServerResult,
    SimpleObject, Value, ID,
};
use axum::http::HeaderMap;

use crate::k8s::previous_log::{LogTarget, PreviousLogs};
use crate::resources::cause::{Cause, Explained};
use crate::resources::group;

/// The most Pods whose previous log one view reads.
pub const LOG_PODS: usize = 5;

/// Why a resource is not healthy: the path from it (a root of the group, for `causes`) down to
/// the resource that explains it, and the reason in the cluster's words.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct ResourceCause {
    /// The uid of the resource the path starts at.
    root: ID,
    /// Uids from the root to the resource that explains it, both included.
    path: Vec<ID>,
    /// The cluster's reason, e.g. `ImagePullBackOff`, `Unschedulable`, `FailedCreate`.
    reason: String,
    /// The cluster's message.
    message: String,
    /// One line for a person, e.g. "Deployment api: container web of Pod api-7f9c4-x2kq
    /// cannot pull image registry/api:1.4.2 (ImagePullBackOff)".
    sentence: String,
    #[graphql(skip)]
    logs: Option<LogRequest>,
}

#[ComplexObject]
impl ResourceCause {
    /// The last 20 lines the crashed container's previous run printed (a crash loop, an OOM
    /// kill); null for other causes, for a viewer the cluster does not let read the Pod's log,
    /// and past the fifth Pod of a view.
    async fn log_lines(&self) -> Option<Vec<String>> {
        let request = self.logs.as_ref()?;
        request.view.admit(&request.pod, &request.container)?;
        let view = &request.view;
        let lines = view
            .cache
            .read(LogTarget {
                client: &view.client,
                agent: view.agent,
                headers: &view.headers,
                namespace: &view.namespace,
                pod: &request.pod,
                container: &request.container,
                timeout: view.timeout,
            })
            .await?;
        Some(lines.to_vec())
    }
}

/// How one view of a group reads previous logs: as whom, from where, and how many Pods so far.
pub struct LogView {
    pub client: kube::Client,
    pub agent: i64,
    /// The viewer's impersonation headers (and the request id's), as the listing was sent.
    pub headers: HeaderMap,
    pub namespace: String,
    pub timeout: Duration,
    pub cache: Arc<PreviousLogs>,
    /// The containers read in this view.
    read: Mutex<Vec<(String, String)>>,
}

impl LogView {
    pub fn new(
        client: kube::Client,
        agent: i64,
        headers: HeaderMap,
        namespace: String,
        timeout: Duration,
        cache: Arc<PreviousLogs>,
    ) -> Self {
        LogView {
            client,
            agent,
            headers,
            namespace,
            timeout,
            cache,
            read: Mutex::default(),
        }
    }

    /// Whether this view may read the container's log: one it read already, or one of its
    /// first [`LOG_PODS`] Pods.
    fn admit(&self, pod: &str, container: &str) -> Option<()> {
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        if read.iter().any(|(p, c)| p == pod && c == container) {
            return Some(());
        }
        let pods = read
            .iter()
            .map(|(p, _)| p)
            .collect::<std::collections::BTreeSet<_>>();
        if !pods.contains(&pod.to_owned()) && pods.len() >= LOG_PODS {
            return None;
        }
        read.push((pod.to_owned(), container.to_owned()));
        Some(())
    }
}

/// A crashed container whose previous log a cause may show.
struct LogRequest {
    view: Arc<LogView>,
    pod: String,
    container: String,
}

impl ResourceCause {
    /// `cause` of `group`, its resources named by uid.
    pub fn new(group: &group::ResourceGroup, cause: Cause, logs: Option<&Arc<LogView>>) -> Self {
        let uid = |i: usize| ID(group.resources[i].uid.clone());
        ResourceCause {
            root: uid(cause.root),
            path: cause.path.iter().map(|&i| uid(i)).collect(),
            logs: cause.logs.zip(logs).map(|(log, view)| LogRequest {
                view: view.clone(),
                pod: group.resources[log.pod].name.clone(),
                container: log.container,
            }),
            reason: cause.reason,
            message: cause.message,
            sentence: cause.sentence,
        }
    }
}

/// `causes` of a shared group.
pub struct Causes {
    pub group: Arc<group::ResourceGroup>,
    pub logs: Option<Arc<LogView>>,
}

impl OutputType for Causes {
    fn type_name() -> Cow<'static, str> {
        Vec::<ResourceCause>::type_name()
    }

    fn qualified_type_name() -> String {
        Vec::<ResourceCause>::qualified_type_name()
    }

    fn create_type_info(registry: &mut Registry) -> String {
        Vec::<ResourceCause>::create_type_info(registry)
    }

    async fn resolve(
        &self,
        ctx: &ContextSelectionSet<'_>,
        field: &Positioned<Field>,
    ) -> ServerResult<Value> {
        let group = &self.group;
        let causes: Vec<ResourceCause> = Explained::new(group)
            .causes()
            .into_iter()
            .map(|cause| ResourceCause::new(group, cause, self.logs.as_ref()))
            .collect();
        OutputType::resolve(&causes, ctx, field).await
    }
}

/// Whether `selection` asks for the field `name` at its top (`cause` of resources, which
/// [`crate::graphql::plain`] does not write).
pub fn selects(selection: &SelectionSet, name: &str) -> bool {
    selection.items.iter().any(|item| match &item.node {
        Selection::Field(field) => field.node.name.node == name,
        _ => false,
    })
}

/// The cause of every resource of `group`, from each down ([`Explained::cause_of`]).
pub fn of_each(
    group: &group::ResourceGroup,
    logs: Option<&Arc<LogView>>,
) -> Vec<Option<ResourceCause>> {
    let explained = Explained::new(group);
    (0..group.resources.len())
        .map(|i| {
            explained
                .cause_of(i)
                .map(|cause| ResourceCause::new(group, cause, logs))
        })
        .collect()
}

/// The log cache of the schema's requests, when the request carries one.
pub fn cache(ctx: &Context<'_>) -> Arc<PreviousLogs> {
    ctx.data_opt::<Arc<PreviousLogs>>()
        .cloned()
        .unwrap_or_default()
}
