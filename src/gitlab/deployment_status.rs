//! Deployment statuses, and which of two reports of a deployment's status wins: hooks may
//! arrive late, twice, or before the deployment's creation call.

use chrono::{DateTime, Utc};

// Declared in GitLab's order (the GraphQL enum's); `ALL` is the lattice order.
/// The status of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, async_graphql::Enum)]
pub enum DeploymentStatus {
    Created,
    Running,
    Success,
    Failed,
    Canceled,
    Skipped,
    Blocked,
}

impl DeploymentStatus {
    /// In the order a deployment's life goes: later ranks higher.
    pub const ALL: [DeploymentStatus; 7] = [
        DeploymentStatus::Created,
        DeploymentStatus::Blocked,
        DeploymentStatus::Running,
        DeploymentStatus::Skipped,
        DeploymentStatus::Success,
        DeploymentStatus::Canceled,
        DeploymentStatus::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Created => "created",
            DeploymentStatus::Blocked => "blocked",
            DeploymentStatus::Running => "running",
            DeploymentStatus::Skipped => "skipped",
            DeploymentStatus::Success => "success",
            DeploymentStatus::Canceled => "canceled",
            DeploymentStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// GitLab's finished statuses: a deployment in one of them is over.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            DeploymentStatus::Success | DeploymentStatus::Canceled | DeploymentStatus::Failed
        )
    }

    /// Position in the lattice, for two reports with the same timestamp: later in a
    /// deployment's life ranks higher.
    fn rank(self) -> u8 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u8
    }
}

/// One report of a deployment's status. `changed_at` is `None` for the creation call, which
/// carries no status time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusReport {
    pub status: DeploymentStatus,
    pub changed_at: Option<DateTime<Utc>>,
}

impl StatusReport {
    /// Finished beats unfinished whatever the clocks say; then the later status change; then
    /// the lattice. A redelivery is equal, so it never supersedes.
    fn key(&self) -> (bool, Option<DateTime<Utc>>, u8) {
        (
            self.status.is_finished(),
            self.changed_at,
            self.status.rank(),
        )
    }

    pub fn supersedes(&self, stored: &StatusReport) -> bool {
        self.key() > stored.key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeploymentStatus::*;

    fn at(status: DeploymentStatus, second: Option<u32>) -> StatusReport {
        StatusReport {
            status,
            changed_at: second
                .map(|s| DateTime::from_timestamp(1_800_000_000 + s as i64, 0).unwrap()),
        }
    }

    #[test]
    fn statuses_round_trip() {
        for s in DeploymentStatus::ALL {
            assert_eq!(DeploymentStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(DeploymentStatus::parse("SUCCESS"), None);
    }

    #[test]
    fn finished_is_never_overwritten_by_unfinished_or_older() {
        assert!(!at(Running, Some(9)).supersedes(&at(Success, Some(5))));
        assert!(!at(Failed, Some(4)).supersedes(&at(Success, Some(5))));
        assert!(at(Failed, Some(6)).supersedes(&at(Success, Some(5))));
        // A late creation call (no time) never rolls a deployment back.
        assert!(!at(Created, None).supersedes(&at(Running, Some(1))));
    }

    #[test]
    fn unfinished_reports_apply_in_time_order() {
        assert!(at(Running, Some(2)).supersedes(&at(Created, Some(1))));
        assert!(!at(Created, Some(1)).supersedes(&at(Running, Some(2))));
        assert!(at(Success, Some(1)).supersedes(&at(Running, Some(2))));
        // Same time: the lattice decides.
        assert!(at(Running, Some(1)).supersedes(&at(Created, Some(1))));
        assert!(!at(Created, Some(1)).supersedes(&at(Running, Some(1))));
    }

    #[test]
    fn a_redelivery_is_a_no_op() {
        for s in DeploymentStatus::ALL {
            assert!(!at(s, Some(3)).supersedes(&at(s, Some(3))));
        }
    }
}
