//! The implementor API: what a backend author, an agent inside a sandbox or an outside
//! state store needs, and an application that only uses sandboxes does not.
//!
//! | item | for |
//! |---|---|
//! | [`wire`] | the wire protocol: one sandbox's operations over any byte stream ([`wire::WireClient`], [`wire::serve`]) |
//! | [`stream`] | bridges between [`ByteStream`]s and blocking readers and writers |
//! | [`archive`] | the entry checker every import obeys, and host-directory pack and unpack |
//! | [`ProcessControl`], [`process`], [`finished_process`], [`limit_output`] | assembling the [`Process`] a backend's `exec` returns |
//! | [`changes`] | assembling the [`Changes`] of `export_changes` |
//! | [`overlay`] | overlay workspaces on this host: mount, and the changes of an upper layer (Linux) |
//! | [`private_dir`] | default host-state directories, created `0700` and checked to be this user's alone |
//! | [`secret_file`] | a server's secret files (tokens, private keys), refused when other users may read them |
//! | [`tree`] | directory trees walked through descriptors without following links: list, remove, copy, move (Linux) |
//! | [`decide_claim`] | the claim rule every [`StateStore`](crate::store::StateStore) applies atomically |
//! | [`ListingLimit`] | a directory listing counted as it is read, against [`MAX_DIR_ENTRIES`](crate::MAX_DIR_ENTRIES) and [`MAX_LISTING_BYTES`](crate::MAX_LISTING_BYTES) |
//! | [`TenantSlots`] | places counted per tenant, for a server bounding what each tenant holds at once |
//! | [`read_at_most`], [`read_within`] | a read with a byte cap, the file sized before it is read (servers facing untrusted callers), within a [`budget::ByteBudget`] |
//!
//! These are as stable as the rest of the crate; they live apart so the user API stays
//! small.

mod bounded;
pub mod budget;
mod forward;
#[cfg(unix)]
pub mod host_tool;
#[cfg(target_os = "linux")]
pub mod overlay;
pub mod private_dir;
pub mod secret_file;
pub mod stream;
mod tenant_slots;
#[cfg(target_os = "linux")]
pub mod tree;
pub mod wire;

/// The egress proxy that enforces allowlists, for backends: a backend gives a sandbox
/// with [`Network::Allowlist`](crate::Network::Allowlist) no route out except to an
/// [`EgressProxy`](egress::EgressProxy) it runs outside the sandbox's reach, and sets
/// the usual proxy variables ([`proxy_env`](egress::proxy_env)) for the tools that
/// honour them. The allowlist itself is [`crate::egress::Allowlist`].
pub mod egress {
    pub use crate::egress::env::proxy_env;
    pub use crate::egress::host_networks::{host_networks, on_host_network};
    pub use crate::egress::proxy::{EgressProxy, DENIED_HEADER, OTHER_HOSTS};
    pub use crate::egress::relay::{relay, Socket};
    pub use crate::egress::served::ServedProxies;
}

use bytes::Bytes;

pub use crate::backend::check_read_limit;
use crate::backend::{ByteStream, Changes};
use crate::exec::ExitStatus;
pub use crate::fs::ListingLimit;
use crate::path::SandboxPath;
pub use crate::process::ProcessControl;
use crate::process::{Process, ProcessStdin};
pub use crate::store::decide_claim;
pub use bounded::{read_at_most, read_within};
#[doc(inline)]
pub use forward::forward_backend;
pub use forward::Routed;
pub use tenant_slots::TenantSlots;

/// Archive checks and host-directory archives, for backends that read or write tars.
pub mod archive {
    pub use crate::archive::check::{
        read_entries, read_entries_with, CheckedEntry, EntryChecker, EntryKind,
    };
    pub use crate::archive::pack::{normalize_tar, pack_dir_tar};
    pub use crate::archive::unpack::{unpack_to_dir, unpack_to_dir_with};
}

/// A [`Process`] from a backend's parts: its control, stdin (`None` when the request
/// gave its bytes), stdout and stderr.
pub fn process(
    control: Box<dyn ProcessControl>,
    stdin: Option<ProcessStdin>,
    stdout: ByteStream,
    stderr: ByteStream,
) -> Process {
    Process::new(control, stdin, stdout, stderr)
}

/// A command that already ran, its whole output in hand (a buffered exec API): waiting
/// answers `status`; kill and signals do nothing.
pub fn finished_process(stdout: Bytes, stderr: Bytes, status: ExitStatus) -> Process {
    Process::finished(stdout, stderr, status)
}

/// `process` holding `guard` until the command ends, whether or not its handle is
/// dropped first (dropping a handle does not end a command): for a caller counting
/// running commands, such as a server's cap per tenant.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use sandcell::{raw, ExitStatus};
///
/// let running = Arc::new(tokio::sync::Semaphore::new(1));
/// let slot = running.clone().try_acquire_owned().unwrap();
/// let done = raw::finished_process("".into(), "".into(), ExitStatus::exited(0));
/// let mut process = raw::hold_until_exit(done, slot);
/// assert_eq!(running.available_permits(), 0);
/// process.wait().await.unwrap();
/// assert_eq!(running.available_permits(), 1);
/// # }
/// ```
pub fn hold_until_exit(process: Process, guard: impl Send + Sync + 'static) -> Process {
    process.holding(Box::new(guard))
}

/// `process` with the output cap the sandbox's spec asks for (`Limits::output_bytes`),
/// which collectors use when the request sets none.
pub fn limit_output(process: Process, limit: Option<usize>) -> Process {
    process.with_output_limit(limit)
}

/// The [`Changes`] of `export_changes`: the tar of changed and added entries, and the
/// template paths that no longer exist.
pub fn changes(tar: ByteStream, deleted: Vec<SandboxPath>) -> Changes {
    Changes::new(tar, deleted)
}

/// A watch's two ends, for backends implementing
/// [`SandboxBackend::watch`](crate::SandboxBackend::watch): the [`WatchSender`](crate::WatchSender)
/// to feed (bounded, with overflow) and the stream to return. `root` is the watched
/// directory.
pub fn watch_channel(root: crate::SandboxPath) -> (crate::WatchSender, crate::WatchStream) {
    crate::watch::channel(root)
}
