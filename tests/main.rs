//! The integration tests: one binary, a fresh PostgreSQL database per test, the router
//! driven without a socket.

mod agents;
mod auth;
mod bad_input;
mod chart;
mod ci_deployments;
mod connections;
mod deployments;
mod embedded;
mod environment_lookup;
mod explorer;
mod first_steps;
mod fuzz;
mod gitlab_frontend;
mod gitlab_sync;
mod graphql;
mod health_cli;
mod health_conformance;
mod health_lua;
mod identity;
mod kube_api;
mod leases;
mod ops;
mod proxy;
mod resource_fetch;
mod resource_group;
mod shutdown;
mod support;
mod system_hooks;
mod telemetry;
mod test_databases;
mod watch_cache;
