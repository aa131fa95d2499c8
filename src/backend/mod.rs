//! `SandboxBackend`: the contract every backend implements, and its `# Behavior` lists.
//!
//! The trait is minimal and object-safe; `Box<dyn SandboxBackend>` and
//! `Arc<dyn SandboxBackend>` implement it too, so a backend can be picked at run time.
//! Everything built on top (run-and-collect, directory upload, glob, grep, edits) lives
//! in [`SandboxBackendExt`](crate::SandboxBackendExt). Each `# Behavior` item is checked
//! by the conformance suite in [`testing`](crate::testing) (feature `testing`).

// The `# Behavior` lists link the conformance cases, which exist with the feature.
#![cfg_attr(not(feature = "testing"), allow(rustdoc::broken_intra_doc_links))]

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use crate::archive::ImportOptions;
use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::exec::ExecRequest;
use crate::fs::{DirEntry, FileInfo};
use crate::metrics::SandboxMetrics;
use crate::path::SandboxPath;
use crate::process::Process;
use crate::sandbox::{LabelSelector, SandboxId, SandboxInfo};
use crate::spec::SandboxSpec;
use crate::watch::{WatchOptions, WatchStream};

mod forward;

/// A stream of bytes, used for tar archives in and out of sandboxes.
pub type ByteStream = BoxStream<'static, Result<Bytes>>;

/// What changed in a workspace since its template, from [`SandboxBackend::export_changes`].
#[non_exhaustive]
pub struct Changes {
    /// Changed and added entries, as an uncompressed tar relative to the workspace root.
    pub tar: ByteStream,
    /// Template paths that no longer exist (a replaced directory is listed too, and its
    /// new contents are in `tar`).
    pub deleted: Vec<SandboxPath>,
}

impl Changes {
    /// Assembles a change set ([`raw::changes`](crate::raw::changes) for backends).
    pub(crate) fn new(tar: ByteStream, deleted: Vec<SandboxPath>) -> Self {
        Changes { tar, deleted }
    }
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("deleted", &self.deleted)
            .finish_non_exhaustive()
    }
}

/// The contract a sandbox backend implements.
///
/// Common behavior for every method taking an id: an unknown or destroyed sandbox is
/// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound). For every method taking a
/// [`SandboxPath`]: the path is resolved inside the workspace; symlinks are followed only
/// while the resolution stays inside, and a resolution that would leave the workspace
/// is [`ErrorKind::PermissionDenied`](crate::ErrorKind::PermissionDenied) with nothing
/// read or written outside.
#[async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// A short name for logs, manifests and errors (`"local"`, `"docker"`, `"mock"`).
    fn name(&self) -> &str;

    /// What this backend supports: each capability claimed works, and each operation
    /// it does not claim answers `Unsupported`.
    ///
    /// Checked by [`claimed_capabilities_work`](crate::testing::conformance::claimed_capabilities_work).
    fn capabilities(&self) -> Capabilities;

    /// Creates a sandbox from `spec`.
    ///
    /// # Behavior
    /// - An invalid spec is `InvalidInput` and creates nothing.
    /// - An unknown template is `NotFound` and creates nothing.
    /// - The new sandbox is `Running`, carries the spec's labels, and has an id no other
    ///   live sandbox of this backend has.
    ///
    /// Checked by [`lifecycle`](crate::testing::conformance::lifecycle),
    /// [`create_rejects_bad_specs`](crate::testing::conformance::create_rejects_bad_specs),
    /// [`create_refuses_what_it_cannot_honour`](crate::testing::conformance::create_refuses_what_it_cannot_honour).
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo>;

    /// Reports on one sandbox.
    ///
    /// # Behavior
    /// - Returns what `create` returned, with the current status.
    /// - A destroyed sandbox is `NotFound`.
    ///
    /// Checked by [`lifecycle`](crate::testing::conformance::lifecycle),
    /// [`unknown_sandbox_is_not_found`](crate::testing::conformance::unknown_sandbox_is_not_found).
    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo>;

    /// Lists live sandboxes whose labels match `selector`.
    ///
    /// # Behavior
    /// - Only sandboxes matching every condition of the selector are listed.
    /// - Destroyed sandboxes are not listed.
    ///
    /// Checked by [`lifecycle`](crate::testing::conformance::lifecycle).
    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>>;

    /// Destroys a sandbox: its processes, its workspace, everything it holds.
    ///
    /// # Behavior
    /// - Idempotent: destroying an unknown or already destroyed sandbox succeeds.
    /// - Afterwards `inspect` is `NotFound` and `list` does not show it.
    ///
    /// Checked by [`lifecycle`](crate::testing::conformance::lifecycle),
    /// [`unknown_sandbox_is_not_found`](crate::testing::conformance::unknown_sandbox_is_not_found).
    async fn destroy(&self, id: &SandboxId) -> Result<()>;

    /// Freezes every process of the sandbox. Needs [`Capabilities::pause`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`.
    /// - Afterwards the status is `Paused`; files can still be read.
    ///
    /// Checked by [`pause_resume`](crate::testing::conformance::pause_resume).
    async fn pause(&self, id: &SandboxId) -> Result<()> {
        let _ = id;
        Err(crate::Error::unsupported(format!(
            "backend {} does not support pause",
            self.name()
        )))
    }

    /// Thaws a paused sandbox. Needs [`Capabilities::pause`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`.
    /// - Afterwards the status is `Running`; resuming a running sandbox succeeds.
    ///
    /// Checked by [`pause_resume`](crate::testing::conformance::pause_resume).
    async fn resume(&self, id: &SandboxId) -> Result<()> {
        let _ = id;
        Err(crate::Error::unsupported(format!(
            "backend {} does not support resume",
            self.name()
        )))
    }

    /// Kills every process and recreates the runtime, keeping the workspace. Needs
    /// [`Capabilities::reset`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`.
    /// - Files in the workspace are unchanged; the status is `Running`.
    ///
    /// Checked by
    /// [`reset_keeps_workspace`](crate::testing::conformance::reset_keeps_workspace),
    /// [`background_processes_live_until_reset`](crate::testing::conformance::background_processes_live_until_reset).
    async fn reset(&self, id: &SandboxId) -> Result<()> {
        let _ = id;
        Err(crate::Error::unsupported(format!(
            "backend {} does not support reset",
            self.name()
        )))
    }

    /// Makes `port` inside the sandbox reachable at `127.0.0.1:port` on this host. Needs
    /// [`Capabilities::port_exposure`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`; an unknown sandbox is `NotFound`.
    /// - Until [`unpublish_port`](Self::unpublish_port) or the sandbox's destroy, a
    ///   connection to `127.0.0.1:port` reaches whatever listens on `port` inside the
    ///   sandbox on all of its addresses (`0.0.0.0`).
    /// - Publishing a port already published for the same sandbox succeeds.
    ///
    /// Checked by [`published_ports`](crate::testing::conformance::published_ports).
    async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        let _ = (id, port);
        Err(crate::Error::unsupported(format!(
            "backend {} cannot expose ports to this host",
            self.name()
        )))
    }

    /// Undoes [`publish_port`](Self::publish_port).
    ///
    /// # Behavior
    /// - Idempotent: a port that is not published, or a sandbox that is gone, succeeds.
    ///
    /// Checked by [`published_ports`](crate::testing::conformance::published_ports).
    async fn unpublish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        let _ = (id, port);
        Ok(())
    }

    /// Starts a command.
    ///
    /// # Behavior
    /// - An invalid request (empty argv, NUL bytes) is `InvalidInput`.
    /// - A program that is not on the sandbox's `PATH` is `NotFound`.
    /// - A paused sandbox is `InvalidState`.
    /// - `cwd` outside the workspace or missing is `InvalidInput`/`NotFound`/`PermissionDenied`.
    /// - Stdout and stderr stream separately; `request.stdin` is written then closed.
    /// - The environment holds the spec's env plus the request's, no host variables.
    /// - When `request.timeout` (or the spec's default) passes, the process and its
    ///   children are killed and `wait` reports `timed_out`.
    /// - `Process::kill` ends the process and its children.
    /// - The process carries the spec's `Limits::output_bytes` as its default output cap
    ///   ([`Process::output_limit`](crate::Process::output_limit)).
    ///
    /// Checked by [`exec_basics`](crate::testing::conformance::exec_basics),
    /// [`exec_missing_program_is_not_found`](crate::testing::conformance::exec_missing_program_is_not_found),
    /// [`timeouts_end_every_descendant`](crate::testing::conformance::timeouts_end_every_descendant),
    /// [`commands_start_with_default_signals`](crate::testing::conformance::commands_start_with_default_signals),
    /// [`background_processes_by_id`](crate::testing::conformance::background_processes_by_id).
    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process>;

    /// Reads a whole file.
    ///
    /// # Behavior
    /// - A missing file is `NotFound`; a directory is `InvalidInput`.
    ///
    /// Checked by [`files_round_trip`](crate::testing::conformance::files_round_trip),
    /// [`hostile_paths_are_rejected`](crate::testing::conformance::hostile_paths_are_rejected),
    /// [`symlink_escapes_are_refused`](crate::testing::conformance::symlink_escapes_are_refused).
    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes>;

    /// Reads a whole file of at most `max_bytes`: the read a server facing untrusted
    /// callers makes, since a sandboxed program may grow the file while it is read.
    ///
    /// # Behavior
    /// - A file holding more than `max_bytes` is `LimitExceeded`; a backend that
    ///   overrides this holds at most `max_bytes` and one chunk of it meanwhile.
    /// - Otherwise as [`read`](Self::read).
    ///
    /// Checked by [`files_round_trip`](crate::testing::conformance::files_round_trip).
    ///
    /// The default reads the whole file and then checks it: bounded in what it answers,
    /// not in what it held. The local and Docker backends override it.
    async fn read_limited(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<Bytes> {
        let data = self.read(id, path).await?;
        check_read_limit(path, data.len() as u64, max_bytes)?;
        Ok(data)
    }

    /// Writes a whole file, creating missing parent directories and replacing the file
    /// if it exists.
    ///
    /// # Behavior
    /// - Writing the root or over a directory is `InvalidInput`.
    /// - Reading the file back gives exactly `data`.
    ///
    /// Checked by [`files_round_trip`](crate::testing::conformance::files_round_trip),
    /// [`read_only_mounts_refuse_writes`](crate::testing::conformance::read_only_mounts_refuse_writes),
    /// [`symlink_escapes_are_refused`](crate::testing::conformance::symlink_escapes_are_refused).
    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()>;

    /// Metadata of a path, without following a final symlink.
    ///
    /// # Behavior
    /// - A missing path is `NotFound`.
    /// - A symlink is reported as [`FileKind::Symlink`](crate::FileKind::Symlink) with its target.
    ///
    /// Checked by [`files_round_trip`](crate::testing::conformance::files_round_trip).
    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo>;

    /// Lists a directory, sorted by name.
    ///
    /// # Behavior
    /// - A missing directory is `NotFound`; a file is `InvalidInput`.
    /// - Entries' paths are the directory's path joined with their name.
    /// - A directory of more than [`MAX_DIR_ENTRIES`](crate::MAX_DIR_ENTRIES) entries, or
    ///   whose names and paths total over [`MAX_LISTING_BYTES`](crate::MAX_LISTING_BYTES),
    ///   is `LimitExceeded`; the backend stops reading it there
    ///   ([`raw::ListingLimit`](crate::raw::ListingLimit)).
    ///
    /// Checked by [`files_round_trip`](crate::testing::conformance::files_round_trip),
    /// [`huge_directories_are_refused_not_held`](crate::testing::conformance::huge_directories_are_refused_not_held).
    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>>;

    /// Removes a file, symlink or directory (a non-empty directory only when `recursive`).
    ///
    /// # Behavior
    /// - A missing path is `NotFound`; the root is `InvalidInput`.
    /// - A non-empty directory without `recursive` is `InvalidInput` and removes nothing.
    /// - A symlink is removed itself; its target is untouched.
    ///
    /// Checked by
    /// [`remove_mkdir_rename`](crate::testing::conformance::remove_mkdir_rename).
    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()>;

    /// Creates a directory and any missing parents; succeeds if it exists.
    ///
    /// # Behavior
    /// - A file in the way is `AlreadyExists`.
    ///
    /// Checked by
    /// [`remove_mkdir_rename`](crate::testing::conformance::remove_mkdir_rename).
    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()>;

    /// Renames a file or directory, replacing a file at `to`.
    ///
    /// # Behavior
    /// - A missing `from` is `NotFound`; renaming the root is `InvalidInput`.
    /// - Moving a directory into itself is `InvalidInput`.
    ///
    /// Checked by
    /// [`remove_mkdir_rename`](crate::testing::conformance::remove_mkdir_rename),
    /// [`prefix_confusion`](crate::testing::conformance::prefix_confusion).
    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()>;

    /// Exports `path` (a directory) as an uncompressed tar stream whose entries are
    /// relative to `path`.
    ///
    /// # Behavior
    /// - Symlinks are exported as symlinks, never followed.
    /// - Only files, directories and links are exported; modes are masked to `0o777`.
    /// - A missing directory is `NotFound`.
    ///
    /// Checked by
    /// [`archive_round_trip`](crate::testing::conformance::archive_round_trip),
    /// [`walks_never_follow_a_racing_sandbox_out`](crate::testing::conformance::walks_never_follow_a_racing_sandbox_out).
    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream>;

    /// What changed in the workspace since its template. Needs
    /// [`Capabilities::incremental_snapshot`].
    ///
    /// # Behavior
    /// - Without the capability (or for a sandbox whose workspace cannot tell): `Unsupported`.
    /// - Deleting the listed paths from a fresh sandbox of the same template, then merging
    ///   the tar into its root, reproduces this workspace.
    ///
    /// Checked by
    /// [`incremental_snapshot_round_trip`](crate::testing::conformance::incremental_snapshot_round_trip).
    async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
        let _ = id;
        Err(crate::Error::unsupported(format!(
            "backend {} does not support incremental snapshots",
            self.name()
        )))
    }

    /// Watches the directory `path` of the workspace (and, with
    /// `options.recursive`, every directory beneath it). Needs [`Capabilities::watch`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`. A missing directory is `NotFound`; a
    ///   file is `InvalidInput`.
    /// - The stream is live when this returns: every change made afterwards beneath
    ///   `path` arrives as a [`WatchEvent`](crate::WatchEvent), in the order it
    ///   happened, with a workspace-relative path. A rename within the watch is one
    ///   `Renamed` event; a move out is `Removed`, a move in `Created`.
    /// - Nothing outside the workspace is reported, and symlinks are not followed.
    /// - A consumer that falls behind by more than
    ///   [`WATCH_BUFFER`](crate::watch::WATCH_BUFFER) events gets one `Overflow` event in
    ///   place of those lost; memory stays bounded.
    /// - Dropping the stream ends the watch and frees what it held. The stream ends
    ///   when the sandbox is destroyed.
    ///
    /// Checked by
    /// [`watch_reports_changes_in_order`](crate::testing::conformance::watch_reports_changes_in_order),
    /// [`watch_outlives_a_clone`](crate::testing::conformance::watch_outlives_a_clone).
    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        let _ = (id, path, options);
        Err(crate::Error::unsupported(format!(
            "backend {} cannot watch files",
            self.name()
        )))
    }

    /// Replaces the network allowlist of a running sandbox. Needs
    /// [`Capabilities::network_update`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`.
    /// - The sandbox must have been created with a
    ///   [`Network::Allowlist`](crate::Network::Allowlist) (an empty one allows nothing
    ///   yet); one created with another policy is `Unsupported`, as is asking for a
    ///   policy other than an allowlist. A malformed entry is `InvalidInput`.
    /// - New connections follow the new list at once; connections already open stay
    ///   open. [`inspect`](Self::inspect) reports the new list.
    ///
    /// Checked by
    /// [`egress::allowlist_is_enforced`](crate::testing::egress::allowlist_is_enforced).
    async fn set_network(&self, id: &SandboxId, network: &crate::Network) -> Result<()> {
        let _ = (id, network);
        Err(crate::Error::unsupported(format!(
            "backend {} cannot change a running sandbox's network",
            self.name()
        )))
    }

    /// Reads the sandbox's resource use now. Needs [`Capabilities::metrics`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`.
    /// - Fields the backend cannot know are `None`; `disk_bytes` counts at least the
    ///   bytes of the files written into the workspace.
    ///
    /// Checked by
    /// [`metrics_report_use`](crate::testing::conformance::metrics_report_use),
    /// [`disk_limit_is_enforced`](crate::testing::conformance::disk_limit_is_enforced).
    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics> {
        let _ = id;
        Err(crate::Error::unsupported(format!(
            "backend {} does not report metrics",
            self.name()
        )))
    }

    /// Copies a running sandbox into a new, independent one carrying `labels` (not the
    /// source's). Needs [`Capabilities::clone`].
    ///
    /// # Behavior
    /// - Without the capability: `Unsupported`.
    /// - The clone's workspace holds what the source's held at the call; afterwards
    ///   writes to either are not seen by the other.
    /// - The clone is `Running`, has its own id, and has the source's template, env,
    ///   limits and network. Processes are not copied.
    /// - Destroying either leaves the other as it is.
    ///
    /// Checked by
    /// [`clone_is_independent`](crate::testing::conformance::clone_is_independent).
    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        let _ = (id, labels);
        Err(crate::Error::unsupported(format!(
            "backend {} cannot clone a sandbox",
            self.name()
        )))
    }

    /// Imports an uncompressed tar stream into the directory `path` (created if missing).
    ///
    /// # Behavior
    /// - Every entry is checked with [`raw::archive::EntryChecker`](crate::raw::archive::EntryChecker) and `options.limits`;
    ///   the first hostile entry fails the import with its typed error.
    /// - An error item in `tar` fails the import with that error.
    /// - Atomic: on any error, the workspace is exactly as before the call.
    /// - [`ImportMode::Replace`](crate::archive::ImportMode::Replace) leaves `path` holding
    ///   exactly the archive's entries; `Merge` keeps what the archive does not replace.
    /// - Entries beneath a symlink already in the workspace are `PermissionDenied`.
    ///
    /// Checked by
    /// [`archive_round_trip`](crate::testing::conformance::archive_round_trip),
    /// [`hostile_archives_are_rejected`](crate::testing::conformance::hostile_archives_are_rejected).
    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()>;
}

/// `LimitExceeded` for a read of `path` that came to `size` bytes, over `max_bytes`:
/// what [`SandboxBackend::read_limited`] answers.
pub fn check_read_limit(path: &SandboxPath, size: u64, max_bytes: u64) -> Result<()> {
    if size <= max_bytes {
        return Ok(());
    }
    Err(crate::Error::limit_exceeded(format!(
        "{path} holds more than {max_bytes} bytes, the limit of one read: read it in \
         parts with a command (`head -c`, `tail -c`), or export its directory as an archive"
    )))
}

impl std::fmt::Debug for dyn SandboxBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxBackend")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}
