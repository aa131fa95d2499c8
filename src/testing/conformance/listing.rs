//! Listing cases: a directory past one wire frame is listed whole, and one past
//! [`MAX_DIR_ENTRIES`] is refused before it is held.

use super::files::plant;
use super::{assert_kind, p, spec, with_sandbox};
use crate::testing::RawTar;
use crate::MAX_DIR_ENTRIES;
use crate::{ErrorKind, SandboxBackend, SandboxBackendExt, SandboxId, SandboxPath};

/// Numbers from here on are six digits, so names sort as the numbers do.
const FIRST: usize = 100_000;

/// Creates empty files `big/N` for N in `range`: by a shell loop of builtins where there
/// is a shell (an archive of 100,000 entries takes a local import most of a minute),
/// else by an archive.
async fn numbered(b: &dyn SandboxBackend, id: &SandboxId, range: std::ops::Range<usize>) {
    if b.capabilities().shell {
        let script = format!(
            "mkdir -p big && i={} && while [ $i -lt {} ]; do : > big/$i; i=$((i+1)); done",
            range.start, range.end
        );
        let out = b.run_shell(id, &script).await.unwrap();
        assert!(out.success(), "creating the files: {out:?}");
    } else {
        let tar = range
            .fold(RawTar::new(), |tar, i| tar.file(&format!("big/{i}"), b""))
            .finish();
        plant(b, id, tar).await;
    }
}

/// `list_dir` answers a directory of 20,000 entries whole and sorted (over a
/// megabyte of listing, more than one frame of a wire protocol), and refuses one of
/// more than [`MAX_DIR_ENTRIES`] with `LimitExceeded`, leaving the sandbox usable.
pub async fn huge_directories_are_refused_not_held(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        const LISTED: usize = 20_000;
        numbered(b, &id, FIRST..FIRST + LISTED).await;
        let entries = b.list_dir(&id, &p("big")).await.expect("a large listing");
        assert_eq!(entries.len(), LISTED, "every entry is listed");
        assert_eq!(entries[0].name, "100000");
        assert_eq!(entries[LISTED - 1].path, p("big/119999"), "sorted by name");

        numbered(b, &id, FIRST + LISTED..FIRST + MAX_DIR_ENTRIES + 1).await;
        assert_kind(
            b.list_dir(&id, &p("big")).await,
            ErrorKind::LimitExceeded,
            "a directory of more than MAX_DIR_ENTRIES entries",
        );
        // The refusal ended that call only: the sandbox still answers.
        let root = b.list_dir(&id, &SandboxPath::root()).await.unwrap();
        assert!(root.iter().any(|e| e.name == "big"), "{root:?}");
    })
    .await;
}
