//! The integration tests: one binary, a fresh PostgreSQL database per test, the router
//! driven without a socket.

mod support;

mod agents;
mod auth;
mod deployments;
mod embedded;
mod graphql;
mod health_cli;
mod identity;
mod kube_api;
mod leases;
mod ops;
mod proxy;
mod resource_fetch;
mod resource_group;
mod shutdown;
mod telemetry;
mod watch_cache;
