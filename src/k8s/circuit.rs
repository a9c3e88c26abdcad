//! A circuit per agent (SPEC 14): once GitLab's agent server has said that the agent is not
//! connected, or that it refuses envlens' token, asking again is pointless for a while, and each
//! asking would cost a viewer KAS' wait for the agent (20 s). So the circuit opens: the agent's
//! requests are answered at once with the same 503 as the one that opened it, and only a single
//! probe at a time is let through, after a backoff (1 s doubling to 60 s). Whatever the probe
//! brings back decides: the same failure keeps the circuit open, anything else closes it.
//!
//! The circuit only decides whether a request is sent; the outcomes come from the agent's
//! [`crate::k8s::connection::Condition`], which opens and closes it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::k8s::connection::ConnectionStatus;

/// The first wait before a probe, doubled after each failed probe up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why the circuit is open, since when, and what was said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    pub status: ConnectionStatus,
    pub message: Option<String>,
    pub since: DateTime<Utc>,
}

impl Open {
    /// What was said, for messages.
    pub fn said(&self) -> String {
        self.message.clone().unwrap_or_else(|| "no answer".into())
    }
}

#[derive(Debug)]
struct Opened {
    open: Open,
    backoff: Duration,
    next_probe: Instant,
    probing: bool,
}

/// One agent's circuit; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Circuit {
    state: Arc<Mutex<Option<Opened>>>,
    /// Told when an open circuit closes, so that what waits out a backoff of its own (the
    /// watch cache's kinds) goes on at once rather than up to 30 s after the agent is back.
    closed: Arc<tokio::sync::Notify>,
}

/// What a request may do now.
#[derive(Debug)]
pub enum Admission {
    /// The circuit is closed: send it.
    Send,
    /// The circuit is open and this request is its probe: send it, holding the guard until
    /// its outcome is recorded.
    Probe(ProbeGuard),
    /// The circuit is open: answer at once with why.
    Refuse(Open),
}

/// Whether a status opens the circuit: the ones that KAS answers only after its wait, or that
/// will not change before someone changes the token.
pub fn opens(status: ConnectionStatus) -> bool {
    matches!(
        status,
        ConnectionStatus::AgentNotConnected | ConnectionStatus::TokenRefused
    )
}

impl Circuit {
    fn lock(&self) -> MutexGuard<'_, Option<Opened>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request may be sent now.
    pub fn admit(&self) -> Admission {
        let mut state = self.lock();
        let Some(opened) = state.as_mut() else {
            return Admission::Send;
        };
        if opened.probing || Instant::now() < opened.next_probe {
            return Admission::Refuse(opened.open.clone());
        }
        opened.probing = true;
        Admission::Probe(ProbeGuard {
            circuit: self.clone(),
        })
    }

    /// An outcome of the agent's requests: a status that [`opens`] it opens the circuit (an
    /// open one stays as it is: requests sent before it opened come back with the same
    /// failure); any other closes an open one only while its probe is out: a request sent
    /// before the circuit opened (a stream cut as the agent went) says nothing of now.
    pub fn outcome(&self, status: ConnectionStatus, message: Option<&str>) {
        let mut state = self.lock();
        if !opens(status) {
            if state.as_ref().is_some_and(|o| o.probing) {
                *state = None;
                self.closed.notify_waiters();
            }
            return;
        }
        match state.as_mut() {
            Some(opened) => {
                // The same failure for a new reason (a token refused while the agent is away)
                // is the one to repeat.
                opened.open.status = status;
                opened.open.message = message.map(str::to_owned);
            }
            None => {
                *state = Some(Opened {
                    open: Open {
                        status,
                        message: message.map(str::to_owned),
                        since: Utc::now(),
                    },
                    backoff: FIRST_BACKOFF,
                    next_probe: Instant::now() + FIRST_BACKOFF,
                    probing: false,
                })
            }
        }
    }

    /// Why the circuit is open, when it is.
    pub fn open(&self) -> Option<Open> {
        self.lock().as_ref().map(|o| o.open.clone())
    }

    /// Resolves when the circuit next closes (never, while it stays closed). It counts from
    /// the call, not from the first poll, so a closing between the two is not missed.
    pub fn closes(&self) -> tokio::sync::futures::OwnedNotified {
        self.closed.clone().notified_owned()
    }
}

/// The probe's turn: when dropped with the circuit still open (the probe failed, or was given
/// up), the next probe waits twice as long.
#[derive(Debug)]
pub struct ProbeGuard {
    circuit: Circuit,
}

impl ProbeGuard {
    /// Why the circuit this probe tests is open (`None` if it closed meanwhile).
    pub fn open_for(&self) -> Option<ConnectionStatus> {
        self.circuit.lock().as_ref().map(|o| o.open.status)
    }
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        let mut state = self.circuit.lock();
        if let Some(opened) = state.as_mut() {
            opened.backoff = (opened.backoff * 2).min(MAX_BACKOFF);
            opened.next_probe = Instant::now() + opened.backoff;
            opened.probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(a: &Admission) -> bool {
        matches!(a, Admission::Refuse(_))
    }

    #[test]
    fn opens_refuses_probes_once_and_closes() {
        let circuit = Circuit::default();
        assert!(matches!(circuit.admit(), Admission::Send));
        circuit.outcome(ConnectionStatus::AgentNotConnected, Some("gone"));
        let Admission::Refuse(open) = circuit.admit() else {
            panic!("open")
        };
        assert_eq!(open.status, ConnectionStatus::AgentNotConnected);
        assert_eq!(open.message.as_deref(), Some("gone"));
        // Due for a probe: one request goes, the others are refused meanwhile.
        circuit.lock().as_mut().unwrap().next_probe = Instant::now();
        let probe = circuit.admit();
        assert!(matches!(probe, Admission::Probe(_)));
        assert!(refused(&circuit.admit()));
        // It failed: the next probe waits twice as long.
        circuit.outcome(ConnectionStatus::AgentNotConnected, Some("gone"));
        drop(probe);
        let backoff = circuit.lock().as_ref().unwrap().backoff;
        assert_eq!(backoff, FIRST_BACKOFF * 2);
        assert!(refused(&circuit.admit()));
        // The next one comes back: closed, and it stays closed when its guard goes.
        circuit.lock().as_mut().unwrap().next_probe = Instant::now();
        let probe = circuit.admit();
        circuit.outcome(ConnectionStatus::Connected, None);
        drop(probe);
        assert!(matches!(circuit.admit(), Admission::Send));
        assert_eq!(circuit.open(), None);
    }

    #[tokio::test]
    async fn a_closing_wakes_who_waits_for_it() {
        let circuit = Circuit::default();
        circuit.outcome(ConnectionStatus::AgentNotConnected, None);
        let waiting = circuit.closes();
        let not_yet = circuit.closes();
        // Outcomes that leave it open, or of requests that are no probe, wake nobody.
        circuit.outcome(ConnectionStatus::Connected, None);
        circuit.outcome(ConnectionStatus::AgentNotConnected, None);
        assert!(futures_util::FutureExt::now_or_never(not_yet).is_none());
        circuit.lock().as_mut().unwrap().next_probe = Instant::now();
        let _probe = circuit.admit();
        circuit.outcome(ConnectionStatus::Connected, None);
        // Asked for before the closing, polled only after it: woken.
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken");
    }

    #[test]
    fn only_the_probe_closes_it() {
        let circuit = Circuit::default();
        circuit.outcome(ConnectionStatus::AgentNotConnected, None);
        // A request sent before it opened, cut off as the agent went.
        circuit.outcome(ConnectionStatus::Unreachable, Some("connection reset"));
        assert!(refused(&circuit.admit()));
        circuit.lock().as_mut().unwrap().next_probe = Instant::now();
        let _probe = circuit.admit();
        circuit.outcome(ConnectionStatus::Unreachable, Some("connection refused"));
        assert_eq!(circuit.open(), None);
    }

    #[test]
    fn backoff_is_bounded_and_other_failures_do_not_open() {
        let circuit = Circuit::default();
        circuit.outcome(ConnectionStatus::Unreachable, Some("refused"));
        assert!(matches!(circuit.admit(), Admission::Send));
        circuit.outcome(ConnectionStatus::TokenRefused, None);
        for _ in 0..10 {
            circuit.lock().as_mut().unwrap().next_probe = Instant::now();
            drop(circuit.admit());
        }
        assert_eq!(circuit.lock().as_ref().unwrap().backoff, MAX_BACKOFF);
    }
}
