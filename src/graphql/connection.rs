//! `ClusterAgent.connection` (SPEC 14): how envlens reaches the agent's cluster and how its
//! last request there went, read from the cluster connections without asking any cluster.

use std::sync::Arc;

use async_graphql::{Context, Enum, SimpleObject};

use super::types::{project, ClusterAgent, Result, Time};
use crate::k8s::clusters::{Clusters, ConnectionKind};
use crate::k8s::connection::ConnectionStatus;

#[derive(SimpleObject)]
pub struct AgentConnection {
    kind: AgentConnectionKind,
    status: AgentConnectionStatus,
    /// Why, when the status is not CONNECTED.
    message: Option<String>,
    /// When the cluster was last asked.
    checked_at: Option<Time>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum AgentConnectionKind {
    /// Through GitLab's agent server, as the agent.
    Kas,
    /// A context of a kubeconfig file.
    Kubeconfig,
    /// envlens' own service account.
    InCluster,
    /// No connection is configured.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum AgentConnectionStatus {
    Connected,
    AgentNotConnected,
    TokenRefused,
    Unreachable,
    NotConfigured,
    NotChecked,
}

/// The connection of `agent`.
pub(super) async fn of(ctx: &Context<'_>, agent: &ClusterAgent) -> Result<AgentConnection> {
    let project = project(ctx, agent.0.project_id).await?;
    let clusters: &Arc<Clusters> = ctx.data_unchecked();
    let connection = clusters.connection(agent.0.id, &project.0.full_path, &agent.0.name);
    Ok(AgentConnection {
        kind: match connection.kind {
            Some(ConnectionKind::Kas) => AgentConnectionKind::Kas,
            Some(ConnectionKind::Kubeconfig) => AgentConnectionKind::Kubeconfig,
            Some(ConnectionKind::InCluster) => AgentConnectionKind::InCluster,
            None => AgentConnectionKind::None,
        },
        status: match connection.status {
            ConnectionStatus::Connected => AgentConnectionStatus::Connected,
            ConnectionStatus::AgentNotConnected => AgentConnectionStatus::AgentNotConnected,
            ConnectionStatus::TokenRefused => AgentConnectionStatus::TokenRefused,
            ConnectionStatus::Unreachable => AgentConnectionStatus::Unreachable,
            ConnectionStatus::NotConfigured => AgentConnectionStatus::NotConfigured,
            ConnectionStatus::NotChecked => AgentConnectionStatus::NotChecked,
        },
        message: connection.message,
        checked_at: connection.checked_at.map(Time),
    })
}
