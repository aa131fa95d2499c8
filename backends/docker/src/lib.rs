//! `sandcell-docker`: sandcell sandboxes as hardened Docker containers, through the
//! engine API ([bollard](https://docs.rs/bollard)).
//!
//! | piece | what it does |
//! |---|---|
//! | [`DockerBackend`] | [`SandboxBackend`](sandcell::SandboxBackend) over containers: create, inspect, list by label, destroy, pause (freezer), reset (restart, workspace kept), exec, files, archives |
//! | [`ImageSpec`] | where a template's image comes from: pull, build, multi-stage build with cache keys, import of a root file system |
//! | `sandcell-agent` | a static binary the backend adds to each image and runs as the container's keep-alive process; commands and file operations reach it over one persistent connection |
//!
//! Containers are hardened by default: every capability dropped, `no-new-privileges`,
//! pids/memory/cpu limits from the spec, no network unless the spec asks for it, an init
//! process, the image's (or the configured) user, the workspace at `/workspace`, labels
//! for reconcile. Host mounts from the spec are bind mounts, read-only where asked.
//!
//! One row per [`Capabilities`](sandcell::Capabilities) field, checked against
//! `capabilities()` by `tests/conformance.rs`:
//!
//! | capability | docker |
//! |---|---|
//! | `shell` | yes |
//! | `python` | once every template's image is prepared and has `python3` on its `PATH` |
//! | `pause` | yes (the engine's freezer) |
//! | `reset` | yes (a restart; the workspace is kept) |
//! | `host_mounts`, `read_only_mounts_enforced` | yes (bind mounts; no capability to remount) |
//! | `network_isolation` | yes |
//! | `network_full` | on an operator's named network, or a network of the sandbox's own where the engine is on this host with its firewall rules (`nft`) |
//! | `network_allowlist`, `network_update` | with the agent, on an engine on this host |
//! | `cpu_limit`, `memory_limit`, `pids_limit` | yes |
//! | `disk_limit` | no |
//! | `choose_user` | yes |
//! | `port_exposure` | yes (a forwarder on this host's loopback to the container's address; not for a sandbox without a network) |
//! | `incremental_snapshot` | when every template has a host-directory workspace |
//! | `symlinks` | yes |
//! | `files_while_paused` | no (the agent is frozen with the container) |
//! | `interactive_exec`, `pty` | yes |
//! | `watch`, `metrics` | with the agent |
//! | `clone` | yes |
//!
//! Without an agent binary, commands run through the engine's exec API (about 60 ms a
//! call, against about 1 ms through the agent) and file operations are `Unsupported`.

mod agent;
mod archive;
mod backend;
mod config;
mod egress;
mod engine;
mod error;
mod firewall;
mod hardening;
mod host_workspace;
mod image;
mod ports;
mod probe;
mod task;
mod task_network;
#[cfg(feature = "testing")]
pub mod testing;
mod ulimits;
mod user;

pub use backend::DockerBackend;
pub use user::UNPRIVILEGED_USER;

/// Locks a mutex, recovering the data if a panicking holder poisoned it: every value kept
/// under these locks stays consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub use config::{
    BuildStage, DockerBackendBuilder, DockerConfig, ImageProgress, ImageSpec, ProgressFn,
    PullPolicy, SidecarSpec,
};
