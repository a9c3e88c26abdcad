//! How the process is configured: flags and `ENVLENS_` variables ([`flags`]), read once at
//! start-up, and the configuration file of `--config` ([`file`]).

pub mod cidr;
pub mod file;
mod flags;

pub use flags::*;
