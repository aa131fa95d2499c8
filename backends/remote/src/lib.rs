//! `sandcell-remote`: sandcell sandboxes as remote machines behind a Fly-Machines-style
//! HTTP API, and `sandcell-server` (feature `server`) to host such an API over any
//! sandcell backend.
//!
//! | piece | what it does |
//! |---|---|
//! | [`RemoteBackend`] | [`SandboxBackend`](sandcell::SandboxBackend) over the API: lifecycle through the [`ControlPlane`]; commands, files and archives over sandcell's wire protocol on one upgraded connection per machine (sandcell-server), or over the plain `exec` (shell scripts, base64 chunks) on a Fly endpoint without them |
//! | [`FlyMachines`] | the Fly Machines control plane: create (resolving lost answers by name), get, list, wait (looping past the API's 60 s cap), suspend, start, stop, restart, destroy, exec |
//! | [`RetryPolicy`], [`RateLimits`] | retries of calls safe to repeat (connection errors, 408, 429 with `Retry-After`, 5xx) with capped exponential backoff; client-side token buckets per machine and action |
//! | [`server`] | the axum router `sandcell-server` serves |
//!
//! Creates are never retried blindly: every create carries a unique machine name, and
//! an attempt whose answer is lost is resolved by looking that name up, so one create
//! makes at most one machine.

mod backend;
pub mod e2b;
mod exec_files;
mod fly;
mod http;
mod plain_exec;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;
mod state;
mod wires;

pub use backend::{RemoteBackend, RemoteConfig};
pub use fly::{ControlPlane, FlyMachines};
pub use http::{RateLimit, RateLimits, RetryPolicy};
pub use state::MachineState;

/// Locks a mutex, recovering the data if a panicking holder poisoned it: every value kept
/// under these locks stays consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Checks a name that goes into URL paths (an app): letters, digits, `-` and `_`.
pub(crate) fn check_name(what: &str, name: &str) -> sandcell::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(sandcell::Error::invalid_input(format!(
            "{what} {name:?} must be 1-63 letters, digits, '-' or '_'"
        )))
    }
}
