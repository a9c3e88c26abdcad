//! The HTTP pieces under the router of `lib.rs`: the JSON extractor, the middleware around
//! every route, and the operational endpoints. None of them names `AppState`: each takes the
//! sub-state it needs through `FromRef`.

pub mod client_address;
pub mod extract;
pub mod middleware;
pub mod ops;
pub mod server;
