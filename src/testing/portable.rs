//! Snapshots that move between backends: a workspace holding every kind of entry a
//! snapshot carries, and the check that a snapshot of it taken on one backend restores
//! whole on another.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use sandcell::testing::{portable, MockBackend};
//! use sandcell::SandboxSpec;
//!
//! let (here, there) = (MockBackend::new(), MockBackend::new());
//! portable::snapshot_moves(&here, SandboxSpec::default(), &there, SandboxSpec::default()).await;
//! # }
//! ```

use std::collections::BTreeMap;
use std::io::Cursor;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use sha2::{Digest, Sha256};

use super::RawTar;
use crate::archive::ImportOptions;
use crate::snapshot::{capture, restore, PackOptions};
use crate::{
    ErrorKind, EventKind, FileKind, ReleaseMode, SandboxBackend, SandboxId, SandboxManager,
    SandboxPath, SandboxSpec, SessionKey,
};

/// The size of the fixture's binary file: 20 MB.
pub const BLOB_BYTES: usize = 20_000_000;

/// One entry of a workspace, as compared between backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory and its permission bits.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A regular file: permission bits, size and SHA-256 of its content.
    File {
        /// Permission bits.
        mode: u32,
        /// Size in bytes.
        size: u64,
        /// The content's SHA-256, in hex.
        sha256: String,
    },
    /// A symlink and its target as stored.
    Symlink {
        /// The link's target.
        target: String,
    },
}

/// The fixture's 20 MB binary: every byte value, in an order that does not repeat
/// within a compression window, so neither zstd nor a lost chunk goes unnoticed.
fn blob() -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..BLOB_BYTES)
        .map(|_| {
            // xorshift64: cheap and deterministic.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// The fixture's entries with their content: (path, kind, mode, content or target).
fn fixture() -> Vec<(&'static str, FileKind, u32, Vec<u8>)> {
    vec![
        ("README.md", FileKind::File, 0o644, b"# portable\n".to_vec()),
        ("bin", FileKind::Dir, 0o755, Vec::new()),
        (
            "bin/run.sh",
            FileKind::File,
            0o755,
            b"#!/bin/sh\necho run\n".to_vec(),
        ),
        ("secrets", FileKind::Dir, 0o700, Vec::new()),
        (
            "secrets/key",
            FileKind::File,
            0o600,
            b"not a real key\n".to_vec(),
        ),
        ("src", FileKind::Dir, 0o755, Vec::new()),
        ("src/a", FileKind::Dir, 0o755, Vec::new()),
        ("src/a/b", FileKind::Dir, 0o755, Vec::new()),
        (
            "src/a/b/deep.txt",
            FileKind::File,
            0o644,
            b"nested\n".to_vec(),
        ),
        ("src/up", FileKind::Symlink, 0o777, b"../README.md".to_vec()),
        ("empty", FileKind::Dir, 0o755, Vec::new()),
        (
            "readme-link",
            FileKind::Symlink,
            0o777,
            b"README.md".to_vec(),
        ),
        (
            "dangling",
            FileKind::Symlink,
            0o777,
            b"does/not/exist".to_vec(),
        ),
        ("data.bin", FileKind::File, 0o644, blob()),
    ]
}

/// The fixture as an uncompressed tar, for `import_tar`.
pub fn fixture_tar() -> Bytes {
    let mut tar = RawTar::new();
    for (path, kind, mode, data) in fixture() {
        tar = match kind {
            FileKind::Dir => tar.entry(tar::EntryType::Directory, path, "", mode, b""),
            FileKind::Symlink => {
                let target = String::from_utf8(data).unwrap_or_default();
                tar.entry(tar::EntryType::Symlink, path, &target, mode, b"")
            }
            _ => tar.entry(tar::EntryType::Regular, path, "", mode, &data),
        };
    }
    tar.finish()
}

/// The fixture as [`workspace_tree`] should see it.
pub fn fixture_tree() -> BTreeMap<String, Entry> {
    fixture()
        .into_iter()
        .map(|(path, kind, mode, data)| {
            let entry = match kind {
                FileKind::Dir => Entry::Dir { mode },
                FileKind::Symlink => Entry::Symlink {
                    target: String::from_utf8(data).unwrap_or_default(),
                },
                _ => Entry::File {
                    mode,
                    size: data.len() as u64,
                    sha256: hex::encode(Sha256::digest(&data)),
                },
            };
            (path.to_owned(), entry)
        })
        .collect()
}

/// Every entry of a sandbox's workspace, by path, read through the backend's file API.
pub async fn workspace_tree(b: &dyn SandboxBackend, id: &SandboxId) -> BTreeMap<String, Entry> {
    let mut tree = BTreeMap::new();
    let mut dirs = vec![SandboxPath::root()];
    while let Some(dir) = dirs.pop() {
        let entries = b
            .list_dir(id, &dir)
            .await
            .unwrap_or_else(|e| panic!("listing {dir:?} on {}: {e}", b.name()));
        for entry in entries {
            let info = b
                .stat(id, &entry.path)
                .await
                .unwrap_or_else(|e| panic!("stat of {:?} on {}: {e}", entry.path, b.name()));
            let value = match info.kind {
                FileKind::Dir => {
                    dirs.push(entry.path.clone());
                    Entry::Dir { mode: info.mode }
                }
                FileKind::Symlink => Entry::Symlink {
                    target: info.symlink_target.unwrap_or_default(),
                },
                _ => {
                    let data = b.read(id, &entry.path).await.unwrap_or_else(|e| {
                        panic!("reading {:?} on {}: {e}", entry.path, b.name())
                    });
                    Entry::File {
                        mode: info.mode,
                        size: data.len() as u64,
                        sha256: hex::encode(Sha256::digest(&data)),
                    }
                }
            };
            tree.insert(entry.path.as_str().to_owned(), value);
        }
    }
    tree
}

/// Asserts that every entry of the fixture is in `tree`, equal.
fn assert_holds_fixture(tree: &BTreeMap<String, Entry>, what: &str) {
    for (path, expected) in fixture_tree() {
        assert_eq!(
            tree.get(&path),
            Some(&expected),
            "{what}: {path} differs from the fixture"
        );
    }
}

/// A sandbox on `b` from `spec` holding the fixture, checked through `b`'s file API.
pub async fn filled_sandbox(b: &dyn SandboxBackend, spec: &SandboxSpec) -> SandboxId {
    let info = b.create(spec).await.expect("creating the source sandbox");
    if let Err(e) = fill(b, &info.id).await {
        let _ = b.destroy(&info.id).await;
        panic!("{e}");
    }
    info.id
}

/// Imports the fixture into sandbox `id` of `b` and checks it through `b`'s file API.
async fn fill(b: &dyn SandboxBackend, id: &SandboxId) -> Result<(), String> {
    let tar = futures::stream::once(async { Ok(fixture_tar()) }).boxed();
    b.import_tar(id, &SandboxPath::root(), tar, ImportOptions::merge())
        .await
        .map_err(|e| format!("importing the fixture on {}: {e}", b.name()))?;
    assert_holds_fixture(
        &workspace_tree(b, id).await,
        &format!("the fixture imported on {}", b.name()),
    );
    Ok(())
}

/// Two managers over `a` and `b` sharing one in-memory state store, one in-memory
/// snapshot store and one manager id (as the CLI's processes do): the pair
/// [`session_moves`] moves a session between.
pub async fn sharing_managers<A: SandboxBackend, B: SandboxBackend>(
    a: A,
    b: B,
) -> (SandboxManager<A>, SandboxManager<B>) {
    let state = crate::store::InMemoryStateStore::new();
    let snapshots = crate::store::InMemorySnapshotStore::new();
    let first = SandboxManager::builder(a)
        .state_store(state.clone())
        .snapshot_store(snapshots.clone())
        .manager_id("host-1")
        .build()
        .await
        .expect("building the first manager");
    let second = SandboxManager::builder(b)
        .state_store(state)
        .snapshot_store(snapshots)
        .manager_id("host-1")
        .build()
        .await
        .expect("building the second manager");
    (first, second)
}

/// Moves session `key` from a manager over one backend to a manager over another; both
/// share one state store and one snapshot store (and one manager id, as the CLI's
/// processes do). Checks, in order:
///
/// - while the session is live on `from`, every change through `to` (acquire, snapshot,
///   suspend, restore) is `InvalidState` naming `from`'s backend, and its record is left
///   as it was, lease included;
/// - once suspended through `from`, an acquire through `to` restores its latest snapshot
///   there (a `Restored` event) and the record says it lives on `to`'s backend now;
/// - the restored workspace holds the fixture, and `from` is refused in turn.
///
/// The session is purged at the end; `from`'s backend lists no sandbox of it.
pub async fn session_moves<A: SandboxBackend, B: SandboxBackend>(
    from: &SandboxManager<A>,
    to: &SandboxManager<B>,
    key: &SessionKey,
    spec: &SandboxSpec,
) {
    let (here, there) = (from.backend().name(), to.backend().name());
    let route = format!("session {key} from {here} to {there}");
    let handle = from
        .acquire(key, spec)
        .await
        .unwrap_or_else(|e| panic!("{route}: acquiring on {here}: {e}"));
    if let Err(e) = fill(from.backend(), handle.id()).await {
        let _ = from.release(key, ReleaseMode::Purge).await;
        panic!("{route}: {e}");
    }
    drop(handle);
    let live = from.session(key).await.unwrap().expect("the live record");
    let refused = [
        ("acquire", to.acquire(key, spec).await.map(drop)),
        ("snapshot", to.snapshot(key).await.map(drop)),
        ("suspend", to.release(key, ReleaseMode::Suspend).await),
        ("destroy", to.release(key, ReleaseMode::Destroy).await),
    ];
    for (what, result) in refused {
        let err = result.expect_err(&format!(
            "{route}: {what} through {there} while live on {here}"
        ));
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidState,
            "{route}: {what}: {err}"
        );
        assert!(
            err.to_string()
                .contains(&format!("live on the {here} backend")),
            "{route}: {what}: {err}"
        );
    }
    assert_eq!(
        from.session(key).await.unwrap().as_ref(),
        Some(&live),
        "{route}: a refused change leaves the record as it was"
    );

    from.release(key, ReleaseMode::Suspend)
        .await
        .unwrap_or_else(|e| panic!("{route}: suspending on {here}: {e}"));
    let mut events = to.subscribe();
    let handle = to
        .acquire(key, spec)
        .await
        .unwrap_or_else(|e| panic!("{route}: acquiring on {there}: {e}"));
    let mut restored = false;
    while let Some(Some(event)) = events.next().now_or_never() {
        restored |= event.kind == EventKind::Restored && event.session.as_ref() == Some(key);
    }
    let tree = workspace_tree(to.backend(), handle.id()).await;
    drop(handle);
    let record = to.session(key).await.unwrap().expect("the moved record");
    let again = from.acquire(key, spec).await.map(drop);
    let leftover = from.backend().list(&Default::default()).await;
    to.release(key, ReleaseMode::Purge)
        .await
        .unwrap_or_else(|e| panic!("{route}: purging on {there}: {e}"));
    assert!(
        restored,
        "{route}: the acquire on {there} restored the snapshot"
    );
    assert_eq!(
        record.backend, there,
        "{route}: the session lives on {there} now"
    );
    assert_holds_fixture(&tree, &format!("{route}, restored"));
    let err = again.expect_err(&format!("{route}: {here} is refused once it moved"));
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{route}: {err}");
    let leftover = leftover.unwrap_or_else(|e| panic!("{route}: listing {here}: {e}"));
    assert!(
        leftover.iter().all(|s| s
            .labels
            .get(crate::manager::LABEL_SESSION)
            .map(String::as_str)
            != Some(key.session())),
        "{route}: {here} still holds a sandbox of the session: {leftover:?}"
    );
}

/// Snapshots a workspace holding the fixture on `from` (a sandbox from `from_spec`)
/// and restores it into a new sandbox on `to` (from `to_spec`): the restored workspace
/// equals the source entry for entry (content, modes, symlinks, empty directories), and
/// holds the fixture. Both sandboxes are destroyed at the end.
pub async fn snapshot_moves(
    from: &dyn SandboxBackend,
    from_spec: SandboxSpec,
    to: &dyn SandboxBackend,
    to_spec: SandboxSpec,
) {
    let route = format!("{} to {}", from.name(), to.name());
    let source = filled_sandbox(from, &from_spec).await;
    let before = workspace_tree(from, &source).await;
    let (manifest, blob) = capture(
        from,
        &source,
        &SandboxPath::root(),
        Vec::new(),
        &PackOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("snapshot on {}: {e}", from.name()));
    assert_eq!(manifest.backend, from.name());
    let target = to
        .create(&to_spec)
        .await
        .unwrap_or_else(|e| panic!("creating the target sandbox on {}: {e}", to.name()));
    let restored = restore(
        to,
        &target.id,
        &SandboxPath::root(),
        Cursor::new(blob),
        &manifest,
        ImportOptions::default(),
    )
    .await;
    let after = match restored {
        Ok(()) => Some(workspace_tree(to, &target.id).await),
        Err(e) => {
            eprintln!("{route}: restore failed: {e}");
            None
        }
    };
    let _ = from.destroy(&source).await;
    let _ = to.destroy(&target.id).await;
    let after = after.unwrap_or_else(|| panic!("{route}: the restore failed"));
    let differing: Vec<_> = before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .collect();
    assert!(
        differing.is_empty(),
        "{route}: these entries differ: {:?}",
        differing
            .iter()
            .map(|p| (p, before.get(*p), after.get(*p)))
            .collect::<Vec<_>>()
    );
    assert_holds_fixture(&after, &format!("restored {route}"));
}
