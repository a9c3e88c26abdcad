//! Kubernetes resources of an environment: their health and their dependency graph, pure
//! over the objects so they test without a cluster.

pub mod cli;
pub mod discovery;
pub mod fetch;
pub mod graph;
pub mod group;
pub mod health;
pub mod manifests;
pub mod object;
pub mod tree;
