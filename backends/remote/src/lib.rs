//! `sandcell-remote`: sandcell sandboxes as remote machines behind a Fly-Machines-style
//! HTTP API or E2B's, as clients; the crate `sandcell-server` hosts such an API over
//! any sandcell backend, speaking the bodies of [`protocol`] and [`e2b::api`].
//!
//! | piece | what it does |
//! |---|---|
//! | [`FlyBackend`] (module [`fly`]) | [`SandboxBackend`](sandcell::SandboxBackend) over the Fly Machines API: lifecycle through the [`ControlPlane`]; commands, files and archives over sandcell's wire protocol on one upgraded connection per machine (sandcell-server), or over the plain `exec` (shell scripts, base64 chunks) on a Fly endpoint without them |
//! | [`FlyMachines`] | the Fly Machines control plane: create (resolving lost answers by name), get, list, wait (looping past the API's 60 s cap), suspend, start, stop, restart, destroy, exec |
//! | [`E2bBackend`] (module [`e2b`]) | [`SandboxBackend`](sandcell::SandboxBackend) over E2B's control plane and each sandbox's envd, on E2B or on sandcell-server's E2B face |
//! | [`RetryPolicy`], [`RateLimits`] | retries of calls safe to repeat (connection errors, 408, 429 with `Retry-After`, 5xx) with capped exponential backoff; client-side token buckets per machine and action |
//!
//! What each client can do, one row per [`Capabilities`](sandcell::Capabilities) field
//! (checked against `capabilities()` by `tests/exec_files.rs`). Against sandcell-server,
//! [`FlyBackend`] has the served backend's capabilities, whatever they are; the column
//! below is a plain Fly Machines endpoint's.
//!
//! | capability | Fly endpoint | E2B |
//! |---|---|---|
//! | `shell` | yes | yes |
//! | `python` | no | no (the template's) |
//! | `pause` | yes (suspend) | yes |
//! | `reset` | where the workspace is on a volume (`FlyConfig::workspace_survives_restart`) | no |
//! | `host_mounts`, `read_only_mounts_enforced` | no | no |
//! | `network_isolation` | no | yes |
//! | `network_full` | yes | yes |
//! | `network_allowlist`, `network_update` | no | yes (`allowOut`, changed in place) |
//! | `cpu_limit`, `memory_limit` | yes (the guest's size) | no (the template's) |
//! | `pids_limit`, `disk_limit`, `choose_user`, `port_exposure` | no | no |
//! | `incremental_snapshot` | no | no |
//! | `symlinks` | yes | yes |
//! | `files_while_paused` | no | no |
//! | `interactive_exec`, `pty`, `watch`, `metrics` | no | yes |
//! | `clone` | no | no |
//!
//! Creates are never retried blindly: every create carries a unique machine name, and
//! an attempt whose answer is lost is resolved by looking that name up, so one create
//! makes at most one machine.

pub mod e2b;
mod exec_files;
pub mod fly;
mod http;
mod plain_exec;
pub mod protocol;

pub use e2b::{E2bBackend, E2bConfig};
pub use fly::{ControlPlane, FlyBackend, FlyConfig, FlyMachines, MachineState};
pub use http::{RateLimit, RateLimits, RetryPolicy};

/// The Fly client's old name.
#[deprecated(
    since = "0.1.0",
    note = "renamed `FlyBackend`, beside `e2b::E2bBackend`"
)]
pub type RemoteBackend = FlyBackend;

/// The Fly client's configuration's old name.
#[deprecated(since = "0.1.0", note = "renamed `FlyConfig`, beside `e2b::E2bConfig`")]
pub type RemoteConfig = FlyConfig;

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

/// Puts a backend's secret into its `options` from the environment: `{key}_env` names
/// the variable holding it (`default_var` when neither `key` nor `{key}_env` is given;
/// `None`, the key is then simply absent). Giving both is `InvalidInput`, and so is a
/// named variable that is not set, so a config file need never carry the secret.
pub(crate) fn secret_from_env(
    options: &mut serde_json::Value,
    backend: &str,
    key: &str,
    default_var: Option<&str>,
) -> sandcell::Result<()> {
    let Some(object) = options.as_object_mut() else {
        return Ok(());
    };
    let env_key = format!("{key}_env");
    let named = object.remove(&env_key);
    if object.contains_key(key) {
        return match named {
            Some(_) => Err(sandcell::Error::invalid_input(format!(
                "invalid {backend} backend options: give {key} or {env_key}, not both"
            ))),
            None => Ok(()),
        };
    }
    let name = match named {
        Some(name) => name.as_str().map(str::to_owned).ok_or_else(|| {
            sandcell::Error::invalid_input(format!(
                "invalid {backend} backend options: {env_key} is a variable name"
            ))
        })?,
        None => match default_var {
            Some(name) => name.to_owned(),
            None => return Ok(()),
        },
    };
    let secret = std::env::var(&name).map_err(|_| {
        sandcell::Error::invalid_input(format!(
            "the {backend} backend's {key} is read from {name}, which is not set"
        ))
    })?;
    object.insert(key.to_owned(), secret.into());
    Ok(())
}

/// A sandbox's details for [`SandboxInfo::details`](sandcell::SandboxInfo): the pairs
/// whose value is not empty.
pub(crate) fn details_of(pairs: &[(&str, &String)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| ((*k).to_owned(), (*v).clone()))
        .collect()
}
