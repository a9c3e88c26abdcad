//! The environment's timeline (SPEC 17), pure: its entries (the cluster's Events of the group's
//! resources and envlens' own events), their order (newest first by last time, then by id),
//! the opaque cursors of its pages, a page merged from both sources, and the health marks that
//! envlens' own `HealthChanged` and `GroupHealthChanged` events come from.

use std::cmp::Ordering;
use std::collections::HashSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};

use super::group::{Resource, ResourceGroup};
use super::health::{Health, HealthStatus};

/// Who wrote an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A Kubernetes Event, read from the watch cache.
    Kubernetes,
    /// envlens' own, kept in PostgreSQL.
    Envlens,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Kubernetes => "KUBERNETES",
            Source::Envlens => "ENVLENS",
        }
    }
}

/// One entry of the timeline. A Kubernetes Event series is one entry: its count, its first
/// and its last time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The Event's uid, or `envlens-<n>` for envlens' own.
    pub id: String,
    /// `Normal` or `Warning`.
    pub event_type: String,
    pub reason: String,
    pub message: String,
    pub count: u32,
    pub first_time: DateTime<Utc>,
    pub last_time: DateTime<Utc>,
    /// The resource it is about, when it is about one.
    pub resource_uid: Option<String>,
    pub source: Source,
}

/// The `type`s a filter may name: the two Kubernetes knows.
pub const TYPES: [&str; 2] = ["Normal", "Warning"];

/// The id of envlens' own event `n`: ordered as the numbers are, among themselves.
pub fn envlens_id(n: i64) -> String {
    format!("envlens-{n:019}")
}

/// Newest first: by last time, then by id (descending), so that equal times still page in a
/// fixed order.
pub fn newest_first(a: &Entry, b: &Entry) -> Ordering {
    b.last_time
        .cmp(&a.last_time)
        .then_with(|| b.id.as_str().cmp(a.id.as_str()))
}

/// Where a page ends: the last time and id of its last entry. Opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub last_time: DateTime<Utc>,
    pub id: String,
}

impl Cursor {
    pub fn of(entry: &Entry) -> Cursor {
        Cursor {
            last_time: entry.last_time,
            id: entry.id.clone(),
        }
    }

    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}|{}", self.last_time.timestamp_micros(), self.id))
    }

    /// `None` for text that is not a cursor of this list.
    pub fn decode(text: &str) -> Option<Cursor> {
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let (micros, id) = text.split_once('|')?;
        Some(Cursor {
            last_time: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            id: id.to_owned(),
        })
    }

    /// Whether `entry` comes after this cursor, newest first.
    pub fn before(&self, entry: &Entry) -> bool {
        (entry.last_time, entry.id.as_str()) < (self.last_time, self.id.as_str())
    }
}

/// What a page shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub after: Option<Cursor>,
    /// Only entries whose last time is at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Only these types; every type when `None`.
    pub types: Option<Vec<String>>,
}

impl Filter {
    pub fn admits(&self, entry: &Entry) -> bool {
        self.after.as_ref().is_none_or(|c| c.before(entry))
            && self.since.is_none_or(|s| entry.last_time >= s)
            && self
                .types
                .as_ref()
                .is_none_or(|t| t.contains(&entry.event_type))
    }
}

/// The Kubernetes Events of a namespace, newest first, each once by uid (the core API and
/// `events.k8s.io` serve the same objects), shared between pages while the namespace does not
/// change.
#[derive(Debug, Clone, Default)]
pub struct Events {
    sorted: Vec<Entry>,
}

impl Events {
    pub fn new(entries: impl IntoIterator<Item = Entry>) -> Events {
        let mut seen = HashSet::new();
        let mut sorted: Vec<Entry> = entries
            .into_iter()
            .filter(|e| seen.insert(e.id.clone()))
            .collect();
        sorted.sort_by(newest_first);
        Events { sorted }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// Up to `limit` of those about a resource in `group` that `filter` admits, newest first.
    pub fn page(&self, group: &HashSet<&str>, filter: &Filter, limit: usize) -> Vec<Entry> {
        // Sorted newest first: the entries before the cursor are skipped by a binary search.
        let start = match &filter.after {
            Some(c) => self.sorted.partition_point(|e| !c.before(e)),
            None => 0,
        };
        self.sorted[start..]
            .iter()
            .filter(|e| {
                e.resource_uid
                    .as_deref()
                    .is_some_and(|uid| group.contains(uid))
                    && filter.admits(e)
            })
            .take(limit)
            .cloned()
            .collect()
    }
}

/// Both sources' candidates merged newest first, at most `limit`.
pub fn merge(mut a: Vec<Entry>, b: Vec<Entry>, limit: usize) -> Vec<Entry> {
    a.extend(b);
    a.sort_by(newest_first);
    a.truncate(limit);
    a
}

/// The key of the group's own mark among its resources' (uids are never empty).
pub const GROUP_KEY: &str = "";

/// The health of a resource (or of the group, keyed [`GROUP_KEY`]) as envlens records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthMark {
    pub key: String,
    pub health: HealthStatus,
    /// The event's message: who, which health, and why.
    pub message: String,
}

impl HealthMark {
    /// `Warning` for a health that needs someone: Degraded, Missing, Unknown.
    pub fn event_type(&self) -> &'static str {
        match self.health {
            HealthStatus::Degraded | HealthStatus::Missing | HealthStatus::Unknown => "Warning",
            _ => "Normal",
        }
    }

    pub fn reason(&self) -> &'static str {
        if self.key == GROUP_KEY {
            "GroupHealthChanged"
        } else {
            "HealthChanged"
        }
    }
}

fn said(health: &Health) -> String {
    match &health.message {
        Some(m) => format!("{}: {m}", health.status.as_str()),
        None => health.status.as_str().to_owned(),
    }
}

fn group_mark(health: &Health) -> HealthMark {
    HealthMark {
        key: GROUP_KEY.to_owned(),
        health: health.status,
        message: format!("The group is {}", said(health)),
    }
}

fn resource_mark(r: &Resource) -> Option<HealthMark> {
    let health = r.health.as_ref()?;
    Some(HealthMark {
        key: r.uid.clone(),
        health: health.status,
        message: format!("{} {} is {}", r.kind, r.name, said(health)),
    })
}

/// What a recorder last sent of each mark: the mark's key ([`key_hash`]) with its health, one
/// `u64` each, sorted. The keys hashed, not the uids, and the health in the hash's low bits:
/// a health keeper holds one of these per environment (SPEC 18), 8 bytes a resource (a map of
/// the hashes was ~27).
#[derive(Debug, Default, Clone)]
pub struct Sent(Box<[u64]>);

/// The low bits of a [`Sent`] entry, which hold the health.
const HEALTH_BITS: u64 = 0b111;

fn packed(key: u64, health: HealthStatus) -> u64 {
    let code = match health {
        HealthStatus::Healthy => 0,
        HealthStatus::Suspended => 1,
        HealthStatus::Progressing => 2,
        HealthStatus::Missing => 3,
        HealthStatus::Degraded => 4,
        HealthStatus::Unknown => 5,
    };
    (key & !HEALTH_BITS) | code
}

impl Sent {
    pub fn new() -> Self {
        Sent::default()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Marks held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The entry of `key` (a [`key_hash`]), the health in its low bits.
    fn get(&self, key: u64) -> Option<u64> {
        let key = key & !HEALTH_BITS;
        self.0
            .binary_search_by(|e| (e & !HEALTH_BITS).cmp(&key))
            .ok()
            .map(|i| self.0[i])
    }

    /// Forgets the mark of `key` (a [`key_hash`]): it is sent again with the next change.
    pub fn remove(&mut self, key: u64) {
        let key = key & !HEALTH_BITS;
        if self.get(key).is_some() {
            self.0 = self
                .0
                .iter()
                .copied()
                .filter(|e| e & !HEALTH_BITS != key)
                .collect();
        }
    }
}

/// A mark's key (a uid, or [`GROUP_KEY`]) as [`Sent`] holds it: the same in every process.
pub fn key_hash(key: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(key, &mut h);
    std::hash::Hasher::finish(&h)
}

/// The marks of `group` (as its feed last read it) whose health differs from what `sent`
/// holds, with `sent` brought up to date: everything the first time, then only changes. A
/// resource gone from the group is forgotten; one with no health now keeps its last mark.
pub fn changes(sent: &mut Sent, group: &ResourceGroup) -> Vec<HealthMark> {
    let mut next: Vec<u64> = Vec::with_capacity(group.resources.len() + 1);
    let marks = std::iter::once(group_mark(&group.health))
        .chain(group.resources.iter().filter_map(resource_mark))
        .filter(|m| {
            let entry = packed(key_hash(&m.key), m.health);
            next.push(entry);
            sent.get(entry) != Some(entry)
        })
        .collect();
    // Kept as they were: the group's resources with no mark now.
    next.extend(
        group
            .resources
            .iter()
            .filter(|r| r.health.is_none())
            .filter_map(|r| sent.get(key_hash(&r.uid))),
    );
    next.sort_unstable_by_key(|e| e & !HEALTH_BITS);
    next.dedup_by_key(|e| *e & !HEALTH_BITS);
    sent.0 = next.into_boxed_slice();
    marks
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn entry(id: &str, secs: i64, event_type: &str, about: &str) -> Entry {
        let t = Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap();
        Entry {
            id: id.into(),
            event_type: event_type.into(),
            reason: "R".into(),
            message: "m".into(),
            count: 1,
            first_time: t,
            last_time: t,
            resource_uid: Some(about.into()),
            source: Source::Kubernetes,
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        let c = Cursor::of(&entry("u-1", 5, "Normal", "p"));
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        assert_eq!(Cursor::decode("not a cursor!"), None);
        assert_eq!(Cursor::decode(&URL_SAFE_NO_PAD.encode("12")), None);
        assert_eq!(Cursor::decode(&URL_SAFE_NO_PAD.encode("x|u")), None);
    }

    #[test]
    fn pages_follow_each_other_without_gaps_or_repeats() {
        // Equal times are ordered by id, so a cursor in the middle of them is exact.
        let events = Events::new((0..25).map(|i| entry(&format!("u{i:02}"), i / 3, "Normal", "p")));
        let group = HashSet::from(["p"]);
        let mut filter = Filter::default();
        let mut seen = Vec::new();
        loop {
            let page = events.page(&group, &filter, 7);
            if page.is_empty() {
                break;
            }
            filter.after = Some(Cursor::of(page.last().unwrap()));
            seen.extend(page.into_iter().map(|e| e.id));
        }
        let mut expected: Vec<String> = (0..25).map(|i| format!("u{i:02}")).collect();
        expected.sort_by(|a, b| b.cmp(a));
        assert_eq!(seen, expected);
    }

    #[test]
    fn an_event_is_shown_once_and_only_for_the_group() {
        let events = Events::new([
            entry("same", 1, "Normal", "p"),
            entry("same", 1, "Normal", "p"),
            entry("other", 2, "Warning", "not-ours"),
        ]);
        let shown = events.page(&HashSet::from(["p"]), &Filter::default(), 10);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].id, "same");
    }

    #[test]
    fn filters_by_type_and_time() {
        let events = Events::new([
            entry("a", 1, "Normal", "p"),
            entry("b", 2, "Warning", "p"),
            entry("c", 3, "Warning", "p"),
        ]);
        let group = HashSet::from(["p"]);
        let warnings = Filter {
            types: Some(vec!["Warning".into()]),
            ..Filter::default()
        };
        let ids: Vec<_> = events
            .page(&group, &warnings, 10)
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, ["c", "b"]);
        let since = Filter {
            since: Some(Utc.timestamp_opt(1_700_000_002, 0).unwrap()),
            ..Filter::default()
        };
        let ids: Vec<_> = events
            .page(&group, &since, 10)
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, ["c", "b"]);
    }

    #[test]
    fn envlens_ids_order_as_their_numbers() {
        assert!(envlens_id(9) < envlens_id(10));
        let merged = merge(
            vec![entry("k", 1, "Normal", "p")],
            vec![entry(&envlens_id(3), 2, "Normal", "p")],
            1,
        );
        assert_eq!(merged[0].id, envlens_id(3));
    }

    #[test]
    fn only_changed_health_is_recorded_and_gone_resources_forgotten() {
        use crate::resources::group::ResourceGroup;
        let pod = |uid: &str, status| {
            let object = crate::resources::object::Object::parse_text(
                format!(r#"{{"metadata": {{"name": "{uid}", "uid": "{uid}"}}}}"#).into(),
                "v1",
                "Pod",
            )
            .unwrap();
            Resource {
                uid: uid.into(),
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: Some("ns".into()),
                name: uid.into(),
                labels: serde_json::json!({}),
                created_at: None,
                health: Some(Health {
                    status,
                    message: None,
                }),
                object: std::sync::Arc::new(object),
                events: Vec::new(),
            }
        };
        let group = |resources: Vec<Resource>, status| ResourceGroup {
            namespace: "ns".into(),
            label_selector: String::new(),
            health: Health {
                status,
                message: None,
            },
            resources,
            edges: Vec::new(),
            warnings: Vec::new(),
            errors: Vec::new(),
        };
        let mut sent = Sent::new();
        let first = group(vec![pod("a", HealthStatus::Healthy)], HealthStatus::Healthy);
        assert_eq!(changes(&mut sent, &first).len(), 2);
        assert!(
            changes(&mut sent, &first).is_empty(),
            "the same health is not a change"
        );
        let broken = group(
            vec![pod("a", HealthStatus::Degraded)],
            HealthStatus::Degraded,
        );
        let marks = changes(&mut sent, &broken);
        let reasons: Vec<_> = marks.iter().map(|m| (m.reason(), m.event_type())).collect();
        assert_eq!(
            reasons,
            [
                ("GroupHealthChanged", "Warning"),
                ("HealthChanged", "Warning")
            ]
        );
        assert_eq!(marks[1].message, "Pod a is Degraded");
        let gone = group(Vec::new(), HealthStatus::Healthy);
        changes(&mut sent, &gone);
        assert_eq!(sent.len(), 1, "only the group's own mark is left");
    }
}
