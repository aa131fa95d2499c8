//! The properties hostile bytes are checked against, one function per entry point, so
//! the property tests (`tests/fuzz.rs`) and the coverage-guided harnesses (`fuzz/`)
//! check the same thing. Each function takes any bytes and panics when the property
//! fails; a fuzzer reports the panic as a crash.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::archive::ArchiveLimits;
use crate::raw::archive::unpack_to_dir;
use crate::testing::MockBackend;
use crate::{ErrorKind, SandboxBackend, SandboxPath, SandboxSpec};

/// Small limits, so an input that tries to exhaust them is cheap.
pub fn small_limits() -> ArchiveLimits {
    ArchiveLimits::default()
        .max_bytes(256 << 10)
        .max_entries(64)
        .max_depth(8)
        .max_name_len(64)
}

/// Every path beneath `root` (links not followed), sorted.
fn tree(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            out.push(path.clone());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out.sort();
    out
}

fn mode(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions())
}

/// Unpacks `tar` (any bytes) into a destination that already holds a file, beside a
/// canary directory, with [`small_limits`], and checks the outcome: on success only
/// the destination changed and everything in it lies beneath it; on failure the error
/// is typed (invalid input, permission, limit or corruption) and nothing changed at
/// all. Either way nothing outside the destination appeared, vanished or changed
/// mode.
///
/// # Panics
/// When the property fails (that is the point), or the scratch directory cannot be
/// made.
pub fn check_unpack(tar: &[u8]) {
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path().join("dest");
    let canary = scratch.path().join("canary");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("before.txt"), "before").unwrap();
    std::fs::create_dir(&canary).unwrap();
    std::fs::write(canary.join("keep.txt"), "keep").unwrap();
    let canary_mode = mode(&canary);
    let outside = |root: &Path| -> Vec<PathBuf> {
        tree(root)
            .into_iter()
            .filter(|p| !p.starts_with(&dest))
            .collect()
    };
    let outside_before = outside(scratch.path());

    let result = unpack_to_dir(tar, &dest, &small_limits());

    assert_eq!(
        outside_before,
        outside(scratch.path()),
        "something changed outside the destination"
    );
    assert_eq!(std::fs::read(canary.join("keep.txt")).unwrap(), b"keep");
    assert_eq!(mode(&canary), canary_mode, "the canary's mode changed");
    match result {
        Ok(_) => {
            for path in tree(&dest) {
                assert!(path.starts_with(&dest));
            }
        }
        Err(e) => {
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::InvalidInput
                        | ErrorKind::PermissionDenied
                        | ErrorKind::LimitExceeded
                        | ErrorKind::Corrupt
                ),
                "an untyped refusal: {e:?}"
            );
            assert_eq!(
                tree(&dest),
                [dest.join("before.txt")],
                "a refused archive left the destination as it was"
            );
        }
    }
}

/// Feeds `input` (any bytes, as a client would send them, then the end of the
/// connection) to the wire protocol's server over a [`MockBackend`] sandbox, and
/// checks that the server closes its side, ends without a panic within ten seconds
/// each way, and leaves the backend answering for the sandbox.
///
/// # Panics
/// When the property fails.
pub fn check_wire_server(input: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = Arc::new(MockBackend::new());
        let sandbox = backend.create(&SandboxSpec::default()).await.unwrap();
        let (server_end, mut client_end) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(server_end);
        let served = tokio::spawn(crate::raw::wire::serve(
            backend.clone() as Arc<dyn SandboxBackend>,
            sandbox.id.clone(),
            read,
            write,
        ));
        // The write may fail once the server has refused the stream and gone; that is
        // an answer too.
        let _ = client_end.write_all(input).await;
        let _ = client_end.shutdown().await;
        let drained = tokio::time::timeout(Duration::from_secs(10), async {
            let mut sink = Vec::new();
            let _ = client_end.read_to_end(&mut sink).await;
        })
        .await;
        drop(client_end);
        let outcome = tokio::time::timeout(Duration::from_secs(10), served).await;
        assert!(drained.is_ok(), "the server kept the connection open");
        let joined = outcome.expect("the server ended once the client went");
        assert!(joined.is_ok(), "the server task panicked: {joined:?}");
        backend
            .list_dir(&sandbox.id, &SandboxPath::root())
            .await
            .unwrap();
    });
}
