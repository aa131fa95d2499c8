//! sandcell: isolated workspaces ("sandboxes") for AI coding and CLI agents.
//!
//! An agent framework needs somewhere to run commands and edit files that is not the
//! host it runs on, that survives a restart, and that behaves the same whether it is a
//! directory on this machine, a Docker container or a remote VM. sandcell gives one
//! contract for all of them:
//!
//! - [`SandboxBackend`]: the minimal, object-safe trait a backend implements —
//!   lifecycle, processes, files and tar archives — each method with a `# Behavior` list.
//! - [`SandboxBackendExt`]: conveniences on top (run-and-collect, text files,
//!   `edit_file`, glob, grep, directory upload and download, `execute_code`).
//! - [`snapshot`]: the portable snapshot format (normalized tar + zstd + a manifest with
//!   sha256), verified before anything is committed.
//! - [`archive`]: the checks every archive import obeys (no `..`, no absolute paths, no
//!   writes through symlinks, no devices, caps on size, entries, depth and names).
//! - [`SandboxManager`]: sessions over any backend — acquire (reuse, restore, create),
//!   release, snapshots, per-tenant limits, reaping, reconcile, warm pools, events.
//! - [`store`]: where the manager keeps state ([`store::StateStore`]) and snapshots
//!   ([`store::SnapshotStore`]).
//! - [`SandboxConfig`]: a backend and manager settings chosen in a config file.
//! - [`testing`] (feature `testing`): an in-memory [`testing::MockBackend`] and the
//!   conformance suite every backend runs.
//! - [`raw`]: the implementor API — the wire protocol, stream bridges, the archive
//!   checker, the parts of a `Process` and of `Changes`, the claim rule of a state
//!   store. An application using sandboxes never needs it.
//!
//! | feature | what it adds |
//! |---|---|
//! | `sqlite` (default) | [`store::SqliteStateStore`], used by `ManagerBuilder::data_dir` |
//! | `object-store` | [`store::ObjectSnapshotStore`] over any `object_store` |
//! | `testing` | `MockBackend` and the conformance suites |
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # async fn demo() -> sandcell::Result<()> {
//! use sandcell::{SandboxBackend, SandboxBackendExt, SandboxSpec};
//! use sandcell::testing::MockBackend;
//!
//! let backend = MockBackend::new();
//! let sandbox = backend.create(&SandboxSpec::new("default")).await?;
//! let path = "src/main.py".parse()?;
//! backend.write_string(&sandbox.id, &path, "print('hi')\n").await?;
//! backend.edit_file(&sandbox.id, &path, "'hi'", "'hello'").await?;
//! assert_eq!(backend.read_to_string(&sandbox.id, &path).await?, "print('hello')\n");
//! assert_eq!(backend.glob(&sandbox.id, "**/*.py").await?, vec![path]);
//! backend.destroy(&sandbox.id).await?;
//! # Ok(())
//! # }
//! # #[cfg(feature = "testing")]
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # Conventions
//!
//! - **Builders.** A method that takes `self` and returns it with one setting changed
//!   is named after that setting: `ExecRequest::new(argv).cwd(..).timeout(..)`,
//!   `SandboxSpec::new(t).limits(..).label(k, v)`. Where a getter already has that name
//!   the setter is `set_<name>` (`Error::set_operation`). `with_` names a constructor
//!   that takes one more part (`Error::with_source`).
//! - **Durations** in config files and messages are seconds or strings such as `"15m"`
//!   ([`config::duration`]).
//! - **Errors** are one [`Error`] with a [`kind`](Error::kind) to match on; kinds cross
//!   every protocol by their snake_case [`name`](ErrorKind::name).

pub mod archive;
mod backend;
pub mod background;
mod capabilities;
pub mod code;
pub mod config;
pub mod egress;
mod error;
mod exec;
mod ext;
mod fs;
pub mod json_lines;
mod limits;
pub mod manager;
mod metrics;
mod path;
mod process;
pub mod raw;
mod sandbox;
pub mod services;
pub mod snapshot;
mod spec;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod watch;

/// What the crate's exported macros name, not part of its API.
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    pub use bytes::Bytes;
}

pub use backend::{ByteStream, Changes, SandboxBackend};
pub use capabilities::Capabilities;
pub use config::{BackendRegistry, SandboxConfig};
pub use error::{Error, ErrorKind, Result};
pub use exec::{ExecOutput, ExecRequest, ExitStatus, TerminalSize, DEFAULT_OUTPUT_LIMIT};
pub use ext::{
    EditOutcome, GrepMatch, GrepOutput, Language, SandboxBackendExt, GLOB_MAX_MATCHES,
    GLOB_MAX_VISITED, GREP_MAX_BYTES, GREP_MAX_FILE_BYTES, GREP_MAX_LINE_BYTES, GREP_MAX_MATCHES,
    WALK_MAX_BYTES, WALK_MAX_ENTRIES,
};
pub use fs::{DirEntry, FileInfo, FileKind, MAX_DIR_ENTRIES, MAX_LISTING_BYTES};
pub use limits::Limits;
pub use manager::{
    EventKind, ManagerBuilder, ManagerEvent, ManagerSettings, ReleaseMode, SandboxHandle,
    SandboxManager,
};
pub use metrics::SandboxMetrics;
pub use path::{SandboxPath, MAX_NAME_LEN, MAX_PATH_LEN};
pub use process::{Process, ProcessEvent, ProcessStdin};
pub use sandbox::{LabelSelector, SandboxId, SandboxInfo, SandboxStatus};
pub use spec::{Mount, Network, SandboxSpec};
pub use store::SessionKey;
pub use watch::{WatchEvent, WatchEventKind, WatchOptions, WatchSender, WatchStream};

/// Locks a std mutex, ignoring poison: every critical section in this crate swaps whole,
/// finished values, so the data behind a poisoned lock is still consistent.
pub(crate) fn lock_unpoisoned<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
