//! How an agent's connection did when last used (SPEC 14's `AgentConnection.status`): each
//! cluster's client records the outcome of its requests in its [`Condition`], and a change is
//! logged once, so that an operator sees an agent drop or come back without reading every
//! request's line.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use chrono::{DateTime, Utc};
use tower::{Layer, Service};

use crate::k8s::circuit::Circuit;
use crate::k8s::clusters::ConnectionKind;
use crate::telemetry::Metrics;

/// SPEC 14's `AgentConnectionStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionStatus {
    /// The cluster answered.
    Connected,
    /// GitLab's agent server has no connection from the agent's agentk.
    AgentNotConnected,
    /// GitLab's agent server refused envlens' token for the agent.
    TokenRefused,
    /// Nothing answered (or KAS cannot be used: its address is unknown).
    Unreachable,
    /// No connection is configured for the agent (SPEC 6).
    NotConfigured,
    /// Configured, not used yet.
    NotChecked,
}

impl ConnectionStatus {
    /// As the metrics name it.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionStatus::Connected => "connected",
            ConnectionStatus::AgentNotConnected => "agent_not_connected",
            ConnectionStatus::TokenRefused => "token_refused",
            ConnectionStatus::Unreachable => "unreachable",
            ConnectionStatus::NotConfigured => "not_configured",
            ConnectionStatus::NotChecked => "not_checked",
        }
    }
}

/// The last outcome: its status, a message for the ones that are not [`Connected`], and when.
///
/// [`Connected`]: ConnectionStatus::Connected
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub status: ConnectionStatus,
    pub message: Option<String>,
    pub at: DateTime<Utc>,
}

/// The last outcome of one agent's connection; clones share it. Counted in the metrics by
/// kind and status while it lives (`envlens_agent_connections`), each change of status too.
#[derive(Debug, Clone)]
pub struct Condition {
    agent: Option<i64>,
    shared: Arc<Shared>,
    /// Opened and closed by the outcomes recorded ([`Circuit::outcome`]).
    circuit: Circuit,
}

#[derive(Debug)]
struct Shared {
    kind: ConnectionKind,
    metrics: Arc<Metrics>,
    last: Mutex<Option<Checked>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let last = self.last.get_mut().unwrap_or_else(|e| e.into_inner());
        let status = last
            .as_ref()
            .map_or(ConnectionStatus::NotChecked, |c| c.status);
        self.metrics
            .agent_connection(self.kind.label(), Some(status.label()), None);
    }
}

impl Condition {
    /// For the connection of `agent` (`None`: an entry by path, whose id is not known here),
    /// reached as `kind`, counted in `metrics`.
    pub fn new(agent: Option<i64>, kind: ConnectionKind, metrics: Arc<Metrics>) -> Self {
        metrics.agent_connection(
            kind.label(),
            None,
            Some(ConnectionStatus::NotChecked.label()),
        );
        Condition {
            agent,
            shared: Arc::new(Shared {
                kind,
                metrics,
                last: Mutex::default(),
            }),
            circuit: Circuit::default(),
        }
    }

    /// The agent's circuit: whether its requests are sent now.
    pub fn circuit(&self) -> &Circuit {
        &self.circuit
    }

    /// Records an outcome; logs and counts when the status differs from the last one.
    pub fn record(&self, status: ConnectionStatus, message: Option<String>) {
        let mut last = self.shared.last.lock().unwrap_or_else(|e| e.into_inner());
        self.circuit.outcome(status, message.as_deref());
        let before = last
            .as_ref()
            .map_or(ConnectionStatus::NotChecked, |c| c.status);
        if before != status {
            self.shared.metrics.agent_connection(
                self.shared.kind.label(),
                Some(before.label()),
                Some(status.label()),
            );
            let agent = self.agent.map_or_else(|| "-".to_owned(), |a| a.to_string());
            let detail = message.as_deref().unwrap_or("");
            match status {
                ConnectionStatus::Connected => {
                    tracing::info!(agent, status = ?status, "agent's cluster connection is up")
                }
                _ => {
                    tracing::warn!(agent, status = ?status, detail, "agent's cluster connection is down")
                }
            }
        }
        *last = Some(Checked {
            status,
            message,
            at: Utc::now(),
        });
    }

    /// The last outcome; `None` before the first request.
    pub fn get(&self) -> Option<Checked> {
        self.shared
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Records each answer of a cluster reached directly (a kubeconfig context, the pod's account):
/// any answer is [`ConnectionStatus::Connected`], no answer [`ConnectionStatus::Unreachable`].
#[derive(Clone)]
pub struct RecordLayer {
    pub condition: Condition,
}

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            condition: self.condition.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Record<S> {
    inner: S,
    condition: Condition,
}

impl<S, B, R> Service<Request<B>> for Record<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Error: std::fmt::Display,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        let condition = self.condition.clone();
        Box::pin(async move {
            let answer = answer.await;
            match &answer {
                Ok(_) => condition.record(ConnectionStatus::Connected, None),
                Err(e) => condition.record(ConnectionStatus::Unreachable, Some(e.to_string())),
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_outcome() {
        let metrics = Arc::new(Metrics::default());
        let condition = Condition::new(Some(7), ConnectionKind::Kas, metrics.clone());
        assert_eq!(condition.get(), None);
        condition.record(ConnectionStatus::AgentNotConnected, Some("gone".into()));
        let first = condition.get().unwrap();
        assert_eq!(first.status, ConnectionStatus::AgentNotConnected);
        assert_eq!(first.message.as_deref(), Some("gone"));
        condition.record(ConnectionStatus::Connected, None);
        let now = condition.get().unwrap();
        assert_eq!(
            (now.status, now.message),
            (ConnectionStatus::Connected, None)
        );
        assert!(now.at >= first.at);

        let text = metrics.render(None);
        for line in [
            r#"envlens_agent_connections{kind="kas",status="connected"} 1"#,
            r#"envlens_agent_connections{kind="kas",status="agent_not_connected"} 0"#,
            r#"envlens_agent_connections{kind="kas",status="not_checked"} 0"#,
            r#"envlens_agent_status_changes_total{kind="kas",status="agent_not_connected"} 1"#,
            r#"envlens_agent_status_changes_total{kind="kas",status="connected"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // A connection no longer kept is no longer counted.
        let clone = condition.clone();
        drop(condition);
        assert!(metrics
            .render(None)
            .contains(r#"envlens_agent_connections{kind="kas",status="connected"} 1"#));
        drop(clone);
        assert!(metrics
            .render(None)
            .contains(r#"envlens_agent_connections{kind="kas",status="connected"} 0"#));
    }
}
