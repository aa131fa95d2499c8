//! Resource limits of a sandbox (CPU, memory, processes, disk, output), the limits
//! recommended for untrusted code, and how unset limits take defaults.

use serde::{Deserialize, Serialize};

use crate::capabilities::Capabilities;

/// Resource limits; `None` means "backend default".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Limits {
    /// CPU limit in thousandths of a core (1500 = one and a half cores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    /// Memory limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Maximum number of processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// Maximum disk the sandbox may use, in bytes: what it writes to its workspace
    /// (and, on the local backend, its temp directory). Needs
    /// [`Capabilities::disk_limit`](crate::Capabilities::disk_limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Default cap on collected output per stream, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<usize>,
}

impl Limits {
    /// No limits set.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the CPU limit in thousandths of a core.
    pub fn cpu_millis(mut self, v: u32) -> Self {
        self.cpu_millis = Some(v);
        self
    }
    /// Sets the memory limit in bytes.
    pub fn memory_bytes(mut self, v: u64) -> Self {
        self.memory_bytes = Some(v);
        self
    }
    /// Sets the process limit.
    pub fn pids(mut self, v: u32) -> Self {
        self.pids = Some(v);
        self
    }
    /// Sets the disk limit in bytes.
    pub fn disk_bytes(mut self, v: u64) -> Self {
        self.disk_bytes = Some(v);
        self
    }
    /// Sets the default output cap per stream in bytes.
    pub fn output_bytes(mut self, v: usize) -> Self {
        self.output_bytes = Some(v);
        self
    }

    /// The limits a sandbox should get when whoever asks for it sets none: one core,
    /// 512 MiB of memory, 1024 processes and 10 GiB of disk. `sandcell-server`'s
    /// faces, `sandcell mcp` and the CLI give these to every sandbox by default, so a
    /// runaway command (a fork bomb, an allocation loop, a file that fills the disk)
    /// stops at its own sandbox's limit rather than the host's.
    ///
    /// ```
    /// use sandcell::Limits;
    /// let limits = Limits::recommended();
    /// assert_eq!(limits.pids, Some(1024));
    /// assert_eq!(limits.memory_bytes, Some(512 << 20));
    /// ```
    pub fn recommended() -> Limits {
        Limits::new()
            .cpu_millis(1000)
            .memory_bytes(512 << 20)
            .pids(1024)
            .disk_bytes(10 << 30)
    }

    /// These limits with each one left unset taken from `defaults`.
    ///
    /// ```
    /// use sandcell::Limits;
    /// let asked = Limits::new().pids(64);
    /// let given = asked.with_defaults(&Limits::recommended());
    /// assert_eq!(given.pids, Some(64));
    /// assert_eq!(given.cpu_millis, Some(1000));
    /// ```
    pub fn with_defaults(self, defaults: &Limits) -> Limits {
        Limits {
            cpu_millis: self.cpu_millis.or(defaults.cpu_millis),
            memory_bytes: self.memory_bytes.or(defaults.memory_bytes),
            pids: self.pids.or(defaults.pids),
            disk_bytes: self.disk_bytes.or(defaults.disk_bytes),
            output_bytes: self.output_bytes.or(defaults.output_bytes),
        }
    }

    /// Like [`with_defaults`](Limits::with_defaults), but only for the limits `caps`
    /// says the backend enforces: a default the backend cannot honour is left unset
    /// rather than making every spec fail [`SandboxSpec::check_supported`](crate::SandboxSpec::check_supported) (a limit
    /// the caller set itself is kept, and still refused there).
    ///
    /// ```
    /// use sandcell::{Capabilities, Limits};
    /// let mut caps = Capabilities::none();
    /// caps.pids_limit = true;
    /// let given = Limits::new().with_enforced_defaults(&Limits::recommended(), &caps);
    /// assert_eq!(given.pids, Some(1024));
    /// assert_eq!(given.memory_bytes, None);
    /// ```
    pub fn with_enforced_defaults(self, defaults: &Limits, caps: &Capabilities) -> Limits {
        let defaults = Limits {
            cpu_millis: defaults.cpu_millis.filter(|_| caps.cpu_limit),
            memory_bytes: defaults.memory_bytes.filter(|_| caps.memory_limit),
            pids: defaults.pids.filter(|_| caps.pids_limit),
            disk_bytes: defaults.disk_bytes.filter(|_| caps.disk_limit),
            // The manager caps output on every backend.
            output_bytes: defaults.output_bytes,
        };
        self.with_defaults(&defaults)
    }
}
