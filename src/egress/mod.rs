//! Network allowlists: what a sandbox with
//! [`Network::Allowlist`](crate::Network::Allowlist) may connect to, decided outside
//! the sandbox, and what its metrics count of it ([`EgressCount`]).
//!
//! A backend that enforces an allowlist gives the sandbox no route out except to an
//! egress proxy it runs outside the sandbox's reach
//! ([`raw::egress`](crate::raw::egress) holds the proxy for backends). A tool that
//! ignores the proxy has no other way out, so it fails closed.

mod allowlist;
pub(crate) mod env;
pub(crate) mod host_networks;
pub(crate) mod proxy;
pub(crate) mod relay;
pub(crate) mod served;
mod sni;

pub use allowlist::{is_private, reaches_host, Allowlist, Rule};
pub use proxy::EgressCount;
pub(crate) use proxy::EgressProxy;
