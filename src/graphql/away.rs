//! The views of the watch cache's shared groups while their agent's circuit is open (SPEC 14):
//! [`ResourceGroup::while_away`] of the same group for the same opening is one `Arc`, so that
//! each is copied and rendered once (`splice::Rendered` keeps texts by a group's identity), as
//! a reachable group's view is, rather than on every view of an agent that is away.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use crate::k8s::circuit::Open;
use crate::resources::group::ResourceGroup;

/// Groups whose away view is kept at most (as many as `splice::Rendered` keeps texts of).
const MAX_GROUPS: usize = 16;

/// The group shown (a `Weak`, so that its address is not reused while the entry lives), the
/// opening of the circuit, and the group as shown while it is open.
type Entry = (Weak<ResourceGroup>, Open, Arc<ResourceGroup>);

/// Away views by the identity of the group they show and the opening they say.
#[derive(Default)]
pub struct AwayViews {
    entries: Mutex<VecDeque<Entry>>,
}

impl AwayViews {
    /// `group` as shown while the circuit is `open`: the view kept for it, else made now.
    pub fn of(&self, group: &Arc<ResourceGroup>, open: &Open) -> Arc<ResourceGroup> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(shown, _, _)| shown.strong_count() > 0);
        let ptr = Arc::as_ptr(group);
        if let Some((_, _, away)) = entries
            .iter()
            .find(|(shown, said, _)| shown.as_ptr() == ptr && said == open)
        {
            return away.clone();
        }
        // A group has one opening at a time: a new one replaces what the last one said.
        entries.retain(|(shown, _, _)| shown.as_ptr() != ptr);
        if entries.len() >= MAX_GROUPS {
            entries.pop_front();
        }
        let away = Arc::new(group.while_away(open.since, &open.said()));
        entries.push_back((Arc::downgrade(group), open.clone(), away.clone()));
        away
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::connection::ConnectionStatus;

    fn open(message: &str) -> Open {
        Open {
            status: ConnectionStatus::AgentNotConnected,
            message: Some(message.to_owned()),
            since: "2026-11-27T14:03:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn one_view_per_group_and_opening_while_the_group_lives() {
        let views = AwayViews::default();
        let group = Arc::new(ResourceGroup::unreadable(
            "shop",
            "app=web",
            503,
            "x".into(),
        ));
        let gone = open("agent 7 is not connected");
        let first = views.of(&group, &gone);
        assert_eq!(
            *first,
            group.while_away(gone.since, &gone.said()),
            "what while_away shows"
        );
        assert!(Arc::ptr_eq(&first, &views.of(&group, &gone)));

        // Another group, or the same group for another opening: a view of its own.
        let other = Arc::new(ResourceGroup::unreadable("shop", "app=db", 503, "x".into()));
        assert!(!Arc::ptr_eq(&first, &views.of(&other, &gone)));
        let refused = open("token refused");
        let again = views.of(&group, &refused);
        assert!(!Arc::ptr_eq(&first, &again));
        assert!(again.warnings.iter().any(|w| w.contains("token refused")));

        // A group dropped everywhere else takes its views with it.
        let weak = Arc::downgrade(&again);
        drop(again);
        drop(group);
        views.of(&other, &gone);
        assert_eq!(weak.strong_count(), 0);
    }

    #[test]
    fn bounded() {
        let views = AwayViews::default();
        let groups: Vec<_> = (0..MAX_GROUPS + 5)
            .map(|i| {
                Arc::new(ResourceGroup::unreadable(
                    "ns",
                    &i.to_string(),
                    503,
                    "x".into(),
                ))
            })
            .collect();
        for group in &groups {
            views.of(group, &open("away"));
        }
        assert_eq!(views.entries.lock().unwrap().len(), MAX_GROUPS);
    }
}
