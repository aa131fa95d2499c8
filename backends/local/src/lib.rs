//! sandcell-local: sandboxes as directories and process groups on this host.
//!
//! A sandbox is a directory under a root; its workspace is made from a template by an
//! overlay mount (the template is a shared read-only lower layer, each sandbox writes to
//! its own upper layer) or by a copy. Each command runs in its own process group with a
//! clean environment; timeouts and kills take the whole group (SIGTERM, a grace period,
//! SIGKILL). File operations are contained to the workspace by the kernel (`openat2`
//! with `RESOLVE_BENEATH`), so an in-workspace symlink can never lead a read or write
//! outside. Archives go through sandcell's archive checks.
//!
//! # Capabilities
//!
//! One row per [`Capabilities`](sandcell::Capabilities) field, checked against
//! `capabilities()` by `tests/conformance.rs`:
//!
//! | capability | local |
//! |---|---|
//! | `shell` | where `sh` is on the default PATH |
//! | `python` | where `python3` is on the default PATH |
//! | `pause` | yes (the cgroup freezer; SIGSTOP / SIGCONT where there is no cgroup) |
//! | `reset` | yes (kills every process, keeps the workspace) |
//! | `host_mounts` | as root (bind mounts) |
//! | `read_only_mounts_enforced` | at `Landlock` and `Namespaces`; not at `None`, where a root process could remount |
//! | `network_isolation` | at `Landlock` (no IPv4, IPv6 or packet sockets) and `Namespaces` (a network namespace of its own); not at `None` |
//! | `network_full` | below `Namespaces` the host's, where it may be shared; at `Namespaces` as root only, a veth of the sandbox's own with NAT and no route to the host's addresses, its loopback or other sandboxes (ADVERSARIAL 38) |
//! | `network_allowlist` | at `Namespaces`, and at `Landlock` as root with cgroup v2 and Landlock ABI 4 (TCP only, to the egress proxy's port, by Landlock and a connect filter on the cgroup) |
//! | `network_update` | wherever allowlists are |
//! | `cpu_limit`, `memory_limit`, `pids_limit` | where cgroups are writable; otherwise asking for a limit is `Unsupported` |
//! | `disk_limit` | as root with loop devices, for overlay and copied workspaces: everything the sandbox writes is on an ext4 file system of its own of that size (a sparse image); otherwise `Unsupported` |
//! | `choose_user` | no (commands run as the sandbox's owner) |
//! | `port_exposure` | below `Namespaces`, for a sandbox with `Network::Full` (its processes share the host network) |
//! | `incremental_snapshot` | overlay workspaces (the upper layer, whiteouts as deletions) |
//! | `symlinks` | yes |
//! | `files_while_paused` | yes (file operations are the host's) |
//! | `interactive_exec` | yes |
//! | `pty` | yes |
//! | `watch` | yes (inotify on the host) |
//! | `metrics` | yes (the cgroup's counters, the workspace's bytes) |
//! | `clone` | every workspace but `InPlace` |
//!
//! Isolation levels:
//! - [`Isolation::Landlock`], the default: processes may write only beneath their
//!   workspace and temp directory, read only the system's directories
//!   ([`SYSTEM_READABLE`] less [`SYSTEM_HIDDEN`]: no home directories, no
//!   `/etc/shadow`), cannot mount (so read-only mounts hold), and without a network
//!   cannot open network sockets, the host's loopback included. A kernel without
//!   Landlock fails `build()` with an error naming what is missing and the opt-out.
//!   When the backend runs as root, commands run as an unprivileged owner uid
//!   ([`LocalConfig::sandbox_uid`]) with no capability, so what other users may not
//!   read (root-only files anywhere) they may not either; their workspace, its
//!   template and host mounts are theirs through idmapped views, as at `Namespaces`.
//!   Sandboxes outside namespaces share their uid, so what only the uid guards is
//!   closed to them: each sandbox's directory has a group of its own (as root), each
//!   command an IPC namespace of its own (as root; System V IPC is refused
//!   otherwise), and a seccomp filter refuses changing another process's scheduling or
//!   limits by its id (`renice -p`, `taskset -p`, `prlimit --pid`, and so
//!   `pthread_setaffinity_np` on a thread, fail with `EPERM`; id 0, the caller, works)
//!   and answers `clone3` with `ENOSYS` (C libraries fall back to `clone`).
//! - [`Isolation::None`], the explicit opt-out: trust-based; processes run as the caller
//!   with a clean environment, in their own process group and cgroup, and can read
//!   and write whatever the caller can.
//! - [`Isolation::Namespaces`]: user, mount, pid, network, IPC and UTS namespaces, one set
//!   per sandbox (made by bubblewrap, joined by every command with `nsenter`): the
//!   workspace at `/workspace`, read-only system directories, private `/tmp`, `/proc` and
//!   `/dev`, no network unless the spec asks, and no capabilities. Needs `bwrap`,
//!   `nsenter` and `setpriv`; without them `build()` fails and says what to install.
//!
//! A level the host cannot provide fails at `build()`; it never runs with less isolation
//! than asked for.
//!
//! Commands start without a fork and are waited for through pidfds: Linux 5.4 or later
//! (older kernels answer `Unsupported` to an exec).
//!
//! ```no_run
//! # async fn demo() -> sandcell::Result<()> {
//! use sandcell::{SandboxBackend, SandboxBackendExt, SandboxSpec};
//!
//! let backend = sandcell_local::LocalBackend::builder()
//!     .root("/tmp/sandcell-demo")
//!     .build()?;
//! let sb = backend.create(&SandboxSpec::default()).await?;
//! backend.write_string(&sb.id, &"hello.txt".parse()?, "hi").await?;
//! let out = backend.run_shell(&sb.id, "cat hello.txt").await?;
//! assert_eq!(out.stdout_str(), "hi");
//! backend.destroy(&sb.id).await?;
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]

mod backend;
mod cgroup;
mod child;
mod clone;
mod config;
mod contained;
mod egress;
mod groups;
mod import;
mod landlock;
mod layers;
mod layout;
mod loopdev;
mod materialize;
mod namespace;
mod network;
mod owner;
mod pinned;
mod process;
mod quota;
mod root_dir;
mod sandbox_group;
mod seccomp;
mod spawn;
mod sys;
mod terminal;
mod watch;

pub use backend::LocalBackend;
pub use config::{Isolation, LocalBackendBuilder, LocalConfig, WorkspaceStrategy};
pub use landlock::{SYSTEM_HIDDEN, SYSTEM_READABLE};
pub use seccomp::confine_this_process;
