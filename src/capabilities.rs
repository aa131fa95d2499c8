//! `Capabilities`: what a backend can do, as plain data the manager and callers check.

use serde::{Deserialize, Serialize};

/// What a backend supports. Plain data: check a field, do not probe by calling.
///
/// Methods that need a capability say so in their docs and return
/// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) when it is missing.
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
    /// Host directories from the spec can be mounted.
    pub host_mounts: bool,
    /// Read-only host mounts are enforced against the sandbox's own processes.
    pub read_only_mounts_enforced: bool,
    /// `Network::None` actually cuts the sandbox off the network.
    pub network_isolation: bool,
    /// `Limits` (cpu, memory, pids) are enforced.
    pub resource_limits: bool,
    /// Ports inside the sandbox can be exposed to the caller.
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
            resource_limits: false,
            port_exposure: false,
            incremental_snapshot: false,
            symlinks: false,
            files_while_paused: false,
            interactive_exec: false,
        }
    }
}
