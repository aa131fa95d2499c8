//! `Capabilities`: what a backend can do, as plain data the core checks in one place.

use serde::{Deserialize, Serialize};

/// What a backend supports. Plain data: check a field, do not probe by calling.
///
/// Fields come in two groups, and each is enforced in one place:
///
/// | group | fields | enforced by |
/// |---|---|---|
/// | gate **calls** | `pause`, `reset`, `port_exposure`, `incremental_snapshot`, `interactive_exec`, `files_while_paused`, `shell`, `python`, `symlinks`, `watch`, `metrics`, `clone`, `network_update` | the method itself answers [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (or `InvalidState` for `files_while_paused`) when the field is false, and the conformance suite checks every field that is true has a working method (`claimed_capabilities_work`; `watch_reports_changes_in_order`, `metrics_report_use` and `clone_is_independent` for the last three) |
/// | gate **request fields** | `pty` | [`ExecRequest::check_supported`](crate::ExecRequest::check_supported), called by every backend's `exec`: a terminal the backend cannot give is `Unsupported` and nothing runs |
/// | gate **spec fields** | `network_isolation`, `network_full`, `network_allowlist`, `host_mounts`, `cpu_limit`, `memory_limit`, `pids_limit`, `disk_limit`, `choose_user` | [`SandboxSpec::check_supported`](crate::SandboxSpec::check_supported), called by every backend's `create` and by the manager before it: a spec asking for what the backend cannot honour is `Unsupported`, naming the field, and nothing is created |
/// | inform | `read_only_mounts_enforced` | nothing: it says how strong a read-only mount is |
///
/// Spec fields every backend honours need no capability: `template`, `env`, `labels`,
/// `workdir`, `command_timeout`, `limits.output_bytes`, and
/// [`Network::Default`](crate::Network::Default), which is the strictest policy the
/// backend enforces (see [`Capabilities::default_network`]).
///
/// New fields may be added in minor releases, so a backend starts from
/// [`Capabilities::none`] and sets the fields it supports:
///
/// ```
/// let mut caps = sandcell::Capabilities::none();
/// caps.pause = true;
/// assert!(caps.pause && !caps.shell);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Capabilities {
    /// `exec` runs real processes with a POSIX `sh` and `PATH` utilities inside the sandbox.
    pub shell: bool,
    /// `execute_code(Language::Python, ..)` can run: `python3` is on the sandbox's `PATH`.
    pub python: bool,
    /// `pause`/`resume` freeze and thaw the sandbox.
    pub pause: bool,
    /// `reset` recreates the runtime while keeping the workspace.
    pub reset: bool,
    /// Host directories from the spec's `mounts` can be mounted (read-only ones
    /// read-only).
    pub host_mounts: bool,
    /// Read-only host mounts hold even against a sandbox process that tries to remount
    /// them or reach the host path another way. Informative: it gates nothing.
    pub read_only_mounts_enforced: bool,
    /// [`Network::None`](crate::Network::None) is enforced: the sandbox is cut off the
    /// network (loopback only).
    pub network_isolation: bool,
    /// [`Network::Full`](crate::Network::Full) can be granted.
    pub network_full: bool,
    /// [`Network::Allowlist`](crate::Network::Allowlist) is enforced.
    pub network_allowlist: bool,
    /// [`set_network`](crate::SandboxBackend::set_network) replaces a running sandbox's
    /// allowlist.
    pub network_update: bool,
    /// `Limits::cpu_millis` is enforced.
    pub cpu_limit: bool,
    /// `Limits::memory_bytes` is enforced.
    pub memory_limit: bool,
    /// `Limits::pids` is enforced.
    pub pids_limit: bool,
    /// `Limits::disk_bytes` is enforced.
    pub disk_limit: bool,
    /// `SandboxSpec::user` is honoured: commands run as that user.
    pub choose_user: bool,
    /// Ports inside the sandbox can be exposed to the caller, for a sandbox that has a
    /// network (`publish_port` on one created with `Network::None` may be
    /// `Unsupported`).
    pub port_exposure: bool,
    /// The backend can export only what changed since its template.
    pub incremental_snapshot: bool,
    /// Symlinks can exist inside the workspace (and archives may carry them).
    pub symlinks: bool,
    /// Files can be read, written and archived while the sandbox is paused. Without it
    /// those calls are `InvalidState` on a paused sandbox (its files are reached
    /// through its own processes), and the manager resumes a paused session around a
    /// snapshot.
    pub files_while_paused: bool,
    /// `exec` answers as the command starts: output streams while it runs, stdin can be
    /// written after the start, and kill and signals reach it. Without it, `exec` runs
    /// the command to its end (bounded by its timeout) before answering, with only
    /// `request.stdin` as input; background processes need this capability.
    pub interactive_exec: bool,
    /// `exec` can run a command on a terminal
    /// ([`ExecRequest::pty`](crate::ExecRequest::pty)), and
    /// [`Process::resize`](crate::Process::resize) resizes it.
    pub pty: bool,
    /// [`watch`](crate::SandboxBackend::watch) reports changes beneath a workspace
    /// directory as they happen.
    pub watch: bool,
    /// [`metrics`](crate::SandboxBackend::metrics) reads a sandbox's resource use.
    pub metrics: bool,
    /// [`clone_sandbox`](crate::SandboxBackend::clone_sandbox) copies a running sandbox
    /// into an independent one.
    pub clone: bool,
}

impl Capabilities {
    /// A backend that supports nothing optional; backends start from this.
    pub const fn none() -> Self {
        Capabilities {
            shell: false,
            python: false,
            pause: false,
            reset: false,
            host_mounts: false,
            read_only_mounts_enforced: false,
            network_isolation: false,
            network_full: false,
            network_allowlist: false,
            network_update: false,
            cpu_limit: false,
            memory_limit: false,
            pids_limit: false,
            disk_limit: false,
            choose_user: false,
            port_exposure: false,
            incremental_snapshot: false,
            symlinks: false,
            files_while_paused: false,
            interactive_exec: false,
            pty: false,
            watch: false,
            metrics: false,
            clone: false,
        }
    }

    /// What [`Network::Default`](crate::Network::Default) means on this backend: the
    /// strictest policy it enforces. `None` where the backend cuts a sandbox off the
    /// network, otherwise `Full`, since that is what such a sandbox gets; the sandbox's
    /// [`SandboxInfo::network`](crate::SandboxInfo::network) reports the outcome.
    ///
    /// ```
    /// use sandcell::{Capabilities, Network};
    /// let mut caps = Capabilities::none();
    /// assert_eq!(caps.default_network(), Network::Full);
    /// caps.network_isolation = true;
    /// assert_eq!(caps.default_network(), Network::None);
    /// ```
    pub fn default_network(&self) -> crate::Network {
        if self.network_isolation {
            crate::Network::None
        } else {
            crate::Network::Full
        }
    }
}
