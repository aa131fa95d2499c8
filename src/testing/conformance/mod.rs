//! The conformance suite: every `# Behavior` promise of [`SandboxBackend`], checked once.
//!
//! Each case is a plain async function taking the backend. A case whose capability the
//! backend lacks does not skip: it checks the refusal instead (`Unsupported`, nothing
//! created). Cases panic on failure, like `assert!`.
//!
//! A backend's tests run the suite with [`conformance_tests!`](crate::conformance_tests),
//! which generates one `#[test]` per case, so every failing case is named by cargo and
//! the first failure hides none of the others; [`run_all`] runs every case in turn on
//! one backend value, for a quick check or a wrapper.
//!
//! The hostile cases also check that nothing changed: the workspace is fingerprinted
//! before and after, and symlinks used for escapes point at a fresh host directory that
//! must still be empty afterwards.

mod archives;
mod capabilities;
mod clone;
mod disk;
mod exec;
mod ext;
mod files;
mod fixture;
mod host;
mod identity;
mod kernel;
mod lifecycle;
mod listing;
mod manager;
mod neighbours;
mod observe;
mod pty;
mod races;
mod snapshots;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};

use crate::{
    ByteStream, ErrorKind, FileKind, SandboxBackend, SandboxBackendExt, SandboxId, SandboxPath,
    SandboxSpec,
};

pub use archives::{archive_round_trip, hostile_archives_are_rejected};
pub use capabilities::{claimed_capabilities_work, create_refuses_what_it_cannot_honour};
pub use clone::clone_is_independent;
pub use disk::disk_limit_is_enforced;
pub use exec::{
    background_processes_by_id, background_processes_live_until_reset,
    commands_start_with_default_signals, exec_basics, exec_missing_program_is_not_found,
    timeouts_end_every_descendant,
};
pub use ext::{ext_editing_and_search, ext_upload_download};
pub use files::{
    files_round_trip, hostile_paths_are_rejected, prefix_confusion, read_only_mounts_refuse_writes,
    remove_mkdir_rename, symlink_escapes_are_refused,
};
pub use fixture::{run_case, CaseFuture, Fixture, SharedBackend};
pub use host::{
    commands_inherit_no_descriptors, host_helpers_ignore_loader_variables, LoaderPayload,
};
pub use identity::processes_are_never_host_root;
pub use kernel::{kernel_keyrings_are_refused, terminal_injection_is_refused};
pub use lifecycle::{
    create_rejects_bad_specs, lifecycle, pause_resume, published_ports, reset_keeps_workspace,
    unknown_sandbox_is_not_found,
};
pub use listing::huge_directories_are_refused_not_held;
pub use manager::{manager_housekeeping, manager_sessions};
pub use neighbours::manager_neighbours;
pub use observe::{metrics_report_use, watch_outlives_a_clone, watch_reports_changes_in_order};
pub use pty::pty_terminal;
pub use races::walks_never_follow_a_racing_sandbox_out;
pub use snapshots::{
    hostile_snapshots_are_rejected, incremental_snapshot_round_trip, snapshot_round_trip,
};

/// The label every conformance sandbox carries.
pub const TEST_LABEL: (&str, &str) = ("sandcell.test", "conformance");

/// The spec conformance sandboxes are created from.
pub fn spec() -> SandboxSpec {
    let spec = SandboxSpec::new("default").label(TEST_LABEL.0, TEST_LABEL.1);
    match fixture::case_run() {
        Some(run) => spec.label(fixture::CASE_LABEL, run),
        None => spec,
    }
}

pub(crate) fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

pub(crate) fn stream(data: Bytes) -> ByteStream {
    futures::stream::once(async move { Ok(data) }).boxed()
}

/// Creates a sandbox, runs `body`, and destroys the sandbox even if `body` panics.
pub async fn with_sandbox<'a, F, Fut>(b: &'a dyn SandboxBackend, spec: SandboxSpec, body: F)
where
    F: FnOnce(SandboxId) -> Fut,
    Fut: Future<Output = ()> + 'a,
{
    let info = b.create(&spec).await.expect("create a conformance sandbox");
    let result = AssertUnwindSafe(body(info.id.clone())).catch_unwind().await;
    let destroyed = b.destroy(&info.id).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    destroyed.expect("destroy the conformance sandbox");
}

/// A comparable picture of a workspace: every path with its kind and contents (file
/// bytes, or a symlink's target).
pub type Fingerprint = Vec<(String, FileKind, Vec<u8>)>;

/// Takes a [`Fingerprint`] of the whole workspace.
pub async fn fingerprint(b: &dyn SandboxBackend, id: &SandboxId) -> Fingerprint {
    let mut out = Vec::new();
    for entry in b
        .walk(id, &SandboxPath::root())
        .await
        .expect("walk the workspace")
    {
        let content = match entry.kind {
            FileKind::File => b.read(id, &entry.path).await.expect("read a file").to_vec(),
            FileKind::Symlink => b
                .stat(id, &entry.path)
                .await
                .expect("stat a symlink")
                .symlink_target
                .unwrap_or_default()
                .into_bytes(),
            _ => Vec::new(),
        };
        out.push((entry.path.as_str().to_owned(), entry.kind, content));
    }
    out
}

pub(crate) fn assert_kind<T: std::fmt::Debug>(
    result: crate::Result<T>,
    kind: ErrorKind,
    what: &str,
) {
    match result {
        Ok(v) => panic!("{what}: expected a {kind} error, got Ok({v:?})"),
        Err(e) => assert_eq!(e.kind(), kind, "{what}: wrong error kind for {e}"),
    }
}

fn host_dir_is_empty(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
}

/// Checks a backend without a shell refuses to run shell code, in a sandbox of its own:
/// what a shell case asserts instead of skipping.
async fn shell_is_refused(b: &dyn SandboxBackend, case: &str) {
    with_sandbox(b, spec(), |id| async move {
        assert_kind(
            b.execute_code(&id, crate::Language::Sh, "true").await,
            ErrorKind::Unsupported,
            &format!("{case}: shell code without the shell capability"),
        );
    })
    .await;
}

/// Polls `check` up to 200 times, 10 ms apart: bounds a wait for something the kernel
/// does asynchronously (reaping, freezing); it measures nothing.
async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Runs every case on `b` in turn, printing each name. A backend's own tests use
/// [`conformance_tests!`](crate::conformance_tests) instead, which runs each case as a
/// test of its own.
pub async fn run_all(b: &dyn SandboxBackend) {
    crate::__conformance_cases!(crate::__conformance_run_all[b]);
}

/// The suite's cases, in the order [`run_all`] runs them: the one list both it and
/// [`conformance_tests!`](crate::conformance_tests) expand, so a new case is added here
/// once. (`manager_sessions`, `manager_housekeeping` and `manager_neighbours` take the
/// backend shared and are listed by the test macro.)
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($then:path [$($args:tt)*]) => {
        $then! { [$($args)*]
            lifecycle
            create_rejects_bad_specs
            create_refuses_what_it_cannot_honour
            claimed_capabilities_work
            unknown_sandbox_is_not_found
            pause_resume
            reset_keeps_workspace
            published_ports
            files_round_trip
            remove_mkdir_rename
            huge_directories_are_refused_not_held
            hostile_paths_are_rejected
            prefix_confusion
            symlink_escapes_are_refused
            read_only_mounts_refuse_writes
            archive_round_trip
            hostile_archives_are_rejected
            snapshot_round_trip
            incremental_snapshot_round_trip
            hostile_snapshots_are_rejected
            ext_editing_and_search
            ext_upload_download
            exec_basics
            exec_missing_program_is_not_found
            commands_start_with_default_signals
            background_processes_live_until_reset
            timeouts_end_every_descendant
            background_processes_by_id
            pty_terminal
            watch_reports_changes_in_order
            metrics_report_use
            disk_limit_is_enforced
            clone_is_independent
            watch_outlives_a_clone
            host_helpers_ignore_loader_variables
            commands_inherit_no_descriptors
            walks_never_follow_a_racing_sandbox_out
            terminal_injection_is_refused
            kernel_keyrings_are_refused
            processes_are_never_host_root
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_run_all {
    ([$b:ident] $($case:ident)*) => {
        $(
            eprintln!("conformance[{}]: {}", $b.name(), stringify!($case));
            $crate::testing::conformance::$case($b).await;
        )*
    };
}

/// Generates the conformance suite as tests: one `#[test]` per case, plus
/// `manager_sessions`, `manager_housekeeping` and `manager_neighbours`, each on a fresh
/// backend from `setup` (an `async fn` or closure
/// answering a [`Fixture`](crate::testing::conformance::Fixture)). Put it in a module
/// of its own per backend variant; cargo then names each case as
/// `module::case`.
///
/// ```no_run
/// mod mock {
///     async fn setup() -> sandcell::testing::conformance::Fixture {
///         sandcell::testing::conformance::Fixture::new(sandcell::testing::MockBackend::new())
///     }
///     sandcell::conformance_tests!(setup);
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($setup:expr) => {
        $crate::__conformance_cases!($crate::__conformance_tests[$setup]);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ([$setup:expr] $($case:ident)*) => {
        $(
            #[test]
            fn $case() {
                fn case(
                    backend: &$crate::testing::conformance::SharedBackend,
                ) -> $crate::testing::conformance::CaseFuture<'_> {
                    ::std::boxed::Box::pin($crate::testing::conformance::$case(&**backend))
                }
                $crate::testing::conformance::run_case(stringify!($case), $setup, case);
            }
        )*

        #[test]
        fn manager_sessions() {
            fn case(
                backend: &$crate::testing::conformance::SharedBackend,
            ) -> $crate::testing::conformance::CaseFuture<'_> {
                ::std::boxed::Box::pin($crate::testing::conformance::manager_sessions(
                    ::std::sync::Arc::clone(backend),
                ))
            }
            $crate::testing::conformance::run_case("manager_sessions", $setup, case);
        }

        #[test]
        fn manager_housekeeping() {
            fn case(
                backend: &$crate::testing::conformance::SharedBackend,
            ) -> $crate::testing::conformance::CaseFuture<'_> {
                ::std::boxed::Box::pin($crate::testing::conformance::manager_housekeeping(
                    ::std::sync::Arc::clone(backend),
                ))
            }
            $crate::testing::conformance::run_case("manager_housekeeping", $setup, case);
        }

        #[test]
        fn manager_neighbours() {
            fn case(
                backend: &$crate::testing::conformance::SharedBackend,
            ) -> $crate::testing::conformance::CaseFuture<'_> {
                ::std::boxed::Box::pin($crate::testing::conformance::manager_neighbours(
                    ::std::sync::Arc::clone(backend),
                ))
            }
            $crate::testing::conformance::run_case("manager_neighbours", $setup, case);
        }
    };
}
