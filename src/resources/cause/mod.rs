//! Why an environment is unhealthy (SPEC 17): from each root of the group's graph that is not
//! healthy, the path down to the resource that explains it, and the reason in the cluster's own
//! words.
//!
//! Pure over an assembled [`ResourceGroup`] (its objects, their health, their Events and the
//! edges), so every reason is tested from fixtures written the way the kubelet, the scheduler
//! and the controllers write them. The catalogue has one file per family of kinds, as `health`
//! does: `pods` (containers that cannot pull, crash, are killed for memory or fail a probe;
//! Pods that cannot be scheduled), `workloads` (rollouts past their deadline, controllers that
//! cannot create Pods, failed Jobs), `network` (Services without a ready endpoint, Ingresses to
//! a Service that is not there), `storage` (claims left Pending), `autoscaling` (autoscalers that
//! cannot scale), `conditions` (Flux's and Argo CD's objects and any custom resource whose
//! conditions say it fails).
//!
//! The walk: every resource gets its own finding (a catalogued reason, else its health when
//! that is not healthy), and the explanation of a resource is the best explanation among its
//! children's, else its own finding. A catalogued reason beats a bare health, a worse health a
//! better one, and on a tie the deeper resource wins: a Deployment past its progress deadline is
//! explained by the Pod below it that cannot pull its image. Each resource is visited once
//! (linear in resources and edges), iteratively, so a long or cyclic chain of owners in a
//! malformed cluster neither recurses deeply nor loops.

mod autoscaling;
mod conditions;
mod network;
mod pods;
mod storage;
#[cfg(test)]
mod tests;
mod workloads;

use super::graph::EdgeType;
use super::group::{Resource, ResourceGroup};
use super::health::HealthStatus;
use super::listing::ResourceEvent;

/// The longest a message is quoted in a sentence; the whole of it is in [`Cause::message`].
const SENTENCE_MESSAGE_CHARS: usize = 160;

/// Why a root of the group is not healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// The resource the path starts at, an index into the group's resources.
    pub root: usize,
    /// From the root to the resource that explains it, both included.
    pub path: Vec<usize>,
    /// The cluster's reason, e.g. `ImagePullBackOff`, `FailedCreate`, `Unschedulable`.
    pub reason: String,
    /// The cluster's message, whole.
    pub message: String,
    /// One line for a person, e.g. "Deployment api: container web of Pod api-7f9c-x2kq
    /// cannot pull image registry/api:1.4.2 (ImagePullBackOff)".
    pub sentence: String,
    /// The container whose previous run's log tells more (a crash loop, an OOM kill).
    pub logs: Option<PreviousLog>,
}

/// A container's previous run, whose log a crash explains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousLog {
    /// The Pod, an index into the group's resources.
    pub pod: usize,
    pub container: String,
}

/// What the catalogue says of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub reason: String,
    pub message: String,
    /// The container at fault, for a Pod.
    pub container: Option<String>,
    /// What is wrong, after the subject: "cannot pull image registry/api:1.4.2".
    pub says: String,
    /// Whether the container's previous log explains it.
    pub logs: bool,
    /// How bad: the catalogued reasons are all as bad as Degraded, a bare health is itself.
    pub severity: HealthStatus,
    /// From the catalogue, or only the resource's health.
    pub catalogued: bool,
}

impl Finding {
    /// A catalogued reason.
    pub(crate) fn new(reason: &str, message: &str, says: String) -> Finding {
        Finding {
            reason: reason.to_owned(),
            message: message.to_owned(),
            container: None,
            says,
            logs: false,
            severity: HealthStatus::Degraded,
            catalogued: true,
        }
    }

    fn rank(&self) -> (bool, u8) {
        (self.catalogued, self.severity.severity())
    }
}

/// What a rule of the catalogue reads of one resource: the resource and its children.
pub(crate) struct Look<'g> {
    pub group: &'g ResourceGroup,
    pub resource: &'g Resource,
    children: &'g [(u32, EdgeType)],
}

impl<'g> Look<'g> {
    /// The children of the resource, with the kind of edge that links each.
    pub fn children(&self) -> impl Iterator<Item = (&'g Resource, EdgeType)> + 'g {
        let group = self.group;
        self.children
            .iter()
            .map(move |&(child, kind)| (&group.resources[child as usize], kind))
    }

    /// Whether the resource's health is known and not healthy (a suspension is asked for).
    pub fn unhealthy(&self) -> bool {
        self.resource
            .health
            .as_ref()
            .is_some_and(|h| !matches!(h.status, HealthStatus::Healthy | HealthStatus::Suspended))
    }

    /// The most recent Event of `reason`s (in that order of preference), of type `Warning` when
    /// `warning`.
    pub fn event(&self, reasons: &[&str], warning: bool) -> Option<&'g ResourceEvent> {
        reasons
            .iter()
            .find_map(|reason| self.event_where(reason, warning, |_| true))
    }

    /// The most recent Event of `reason` that `fits`.
    pub fn event_where(
        &self,
        reason: &str,
        warning: bool,
        fits: impl Fn(&ResourceEvent) -> bool,
    ) -> Option<&'g ResourceEvent> {
        self.resource
            .events
            .iter()
            .find(|e| e.reason == reason && (!warning || e.event_type == "Warning") && fits(e))
    }
}

/// The catalogue's finding for one resource, or its health when that is not healthy.
fn finding(look: &Look) -> Option<Finding> {
    let r = look.resource;
    let object = &r.object.view;
    let group = super::health::fields::api_group(object);
    let found = match (group, r.kind.as_str()) {
        ("", "Pod") => pods::pod(look),
        ("", "Service") => network::service(look),
        ("networking.k8s.io" | "extensions", "Ingress") => network::ingress(look),
        ("", "PersistentVolumeClaim") => storage::claim(look),
        ("apps", "Deployment") => workloads::deployment(look),
        ("apps", "ReplicaSet" | "StatefulSet" | "DaemonSet") => workloads::controller(look),
        ("batch", "Job") => workloads::job(look),
        ("autoscaling", "HorizontalPodAutoscaler") => autoscaling::hpa(look),
        _ => conditions::failing(look),
    };
    found.or_else(|| {
        let health = r.health.as_ref().filter(|_| look.unhealthy())?;
        Some(Finding {
            reason: health.status.as_str().to_owned(),
            message: health.message.clone().unwrap_or_default(),
            container: None,
            says: match &health.message {
                Some(message) => format!(
                    "is {}: {}",
                    health.status.as_str().to_lowercase(),
                    quote(message)
                ),
                None => format!("is {}", health.status.as_str().to_lowercase()),
            },
            logs: false,
            severity: health.status,
            catalogued: false,
        })
    })
}

/// The explanations of a group: what each resource's cause is, found in one walk.
pub struct Explained<'g> {
    group: &'g ResourceGroup,
    /// Per resource: the child its explanation goes on to, or itself when its own finding
    /// explains it; `NONE` when nothing does.
    next: Vec<u32>,
    findings: Vec<Option<Finding>>,
    /// Whether a resource has an incoming edge (`APPLIES` edges, when there are, do not count).
    has_parent: Vec<bool>,
}

const NONE: u32 = u32::MAX;

impl<'g> Explained<'g> {
    /// Walks the group once.
    pub fn new(group: &'g ResourceGroup) -> Explained<'g> {
        let n = group.resources.len();
        // Children as one array, sliced per parent (edges come sorted by uid, not by index).
        let mut start = vec![0u32; n + 1];
        let mut has_parent = vec![false; n];
        for e in &group.edges {
            if (e.from as usize) < n && (e.to as usize) < n {
                start[e.from as usize + 1] += 1;
                has_parent[e.to as usize] = true;
            }
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut children = vec![(0u32, EdgeType::Owner); start[n] as usize];
        for e in &group.edges {
            if (e.from as usize) < n && (e.to as usize) < n {
                children[fill[e.from as usize] as usize] = (e.to, e.kind);
                fill[e.from as usize] += 1;
            }
        }
        let children_of = |i: usize| &children[start[i] as usize..start[i + 1] as usize];

        let mut findings: Vec<Option<Finding>> = Vec::with_capacity(n);
        for (i, resource) in group.resources.iter().enumerate() {
            findings.push(finding(&Look {
                group,
                resource,
                children: children_of(i),
            }));
        }

        // Post-order over every resource: 0 unseen, 1 on the stack, 2 done.
        let mut next = vec![NONE; n];
        // Per resource: the rank of its explanation.
        let mut rank = vec![(false, 0u8); n];
        let mut state = vec![0u8; n];
        let mut stack: Vec<(u32, u32)> = Vec::new();
        for first in 0..n {
            if state[first] != 0 {
                continue;
            }
            state[first] = 1;
            stack.push((first as u32, 0));
            while let Some(&mut (node, ref mut child)) = stack.last_mut() {
                let kids = children_of(node as usize);
                if let Some(&(kid, _)) = kids.get(*child as usize) {
                    *child += 1;
                    if state[kid as usize] == 0 {
                        state[kid as usize] = 1;
                        stack.push((kid, 0));
                    }
                    continue;
                }
                stack.pop();
                let node = node as usize;
                state[node] = 2;
                // The best child's explanation (the first on a tie); a child still on the
                // stack closes a cycle and explains nothing here.
                let mut best: Option<usize> = None;
                for &(kid, _) in kids {
                    let kid = kid as usize;
                    if state[kid] == 2
                        && next[kid] != NONE
                        && best.is_none_or(|b| rank[kid] > rank[b])
                    {
                        best = Some(kid);
                    }
                }
                // Deeper wins a tie with the resource's own finding.
                let own = findings[node].as_ref().map(Finding::rank);
                match (best, own) {
                    (Some(kid), own) if own.is_none_or(|own| rank[kid] >= own) => {
                        next[node] = kid as u32;
                        rank[node] = rank[kid];
                    }
                    (_, Some(own)) => {
                        next[node] = node as u32;
                        rank[node] = own;
                    }
                    _ => {}
                }
            }
        }
        Explained {
            group,
            next,
            findings,
            has_parent,
        }
    }

    /// The cause of each root (a resource no edge leads to) that has one, in resource order.
    pub fn causes(&self) -> Vec<Cause> {
        (0..self.group.resources.len())
            .filter(|&i| !self.has_parent[i])
            .filter_map(|i| self.cause_of(i))
            .collect()
    }

    /// Why the resource at `index` is not healthy, from it down: `None` when nothing at it or
    /// below it explains anything.
    pub fn cause_of(&self, index: usize) -> Option<Cause> {
        if *self.next.get(index)? == NONE {
            return None;
        }
        let mut path = vec![index];
        let mut at = index;
        while self.next[at] as usize != at {
            at = self.next[at] as usize;
            // Each step goes to a resource finished before its parent: no step returns.
            if path.len() > self.group.resources.len() {
                return None;
            }
            path.push(at);
        }
        let finding = self.findings[at].as_ref()?;
        let root = &self.group.resources[index];
        let leaf = &self.group.resources[at];
        Some(Cause {
            root: index,
            sentence: sentence(root, leaf, index == at, finding),
            path,
            reason: finding.reason.clone(),
            message: finding.message.clone(),
            logs: finding
                .logs
                .then(|| finding.container.clone())
                .flatten()
                .map(|container| PreviousLog { pod: at, container }),
        })
    }
}

/// The causes of the group's roots ([`Explained::causes`]).
pub fn causes(group: &ResourceGroup) -> Vec<Cause> {
    Explained::new(group).causes()
}

/// "<Kind> <root>: <subject> <says> (<reason>)", or "<Kind> <name> <says> (<reason>)" when the
/// root explains itself.
fn sentence(root: &Resource, leaf: &Resource, itself: bool, finding: &Finding) -> String {
    let reason = &finding.reason;
    let says = &finding.says;
    match (&finding.container, itself) {
        (None, true) => format!("{} {} {says} ({reason})", root.kind, root.name),
        (Some(container), true) => format!(
            "{} {}: container {container} {says} ({reason})",
            root.kind, root.name
        ),
        (None, false) => format!(
            "{} {}: {} {} {says} ({reason})",
            root.kind, root.name, leaf.kind, leaf.name
        ),
        (Some(container), false) => format!(
            "{} {}: container {container} of {} {} {says} ({reason})",
            root.kind, root.name, leaf.kind, leaf.name
        ),
    }
}

/// A message as a sentence quotes it: one line, at most [`SENTENCE_MESSAGE_CHARS`] characters.
pub(crate) fn quote(message: &str) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = line.trim_end_matches('.');
    match line.char_indices().nth(SENTENCE_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}
