//! What envlens asks of clusters: a client per agent, discovery of their kinds, the listing of
//! an environment's resources, the `user_access` grants and impersonation under which it asks,
//! and the proxy for the browser. The decisions over what comes back live in `resources`.

pub mod clusters;
pub mod discovery;
pub mod fetch;
pub mod grants;
pub mod observe;
pub mod proxy;
pub mod watch;
