//! Walking a sandbox's tree a directory at a time, within bounds on the entries
//! visited and on the paths held: the directories waiting their turn, and what the
//! walk keeps.
//!
//! Each listing is bounded by the backend (`MAX_DIR_ENTRIES`, `MAX_LISTING_BYTES`), but
//! a tree is as many listings as it has directories: a walk keeping every path it met
//! held 425 MiB for 3.6 MB of hard links under a deep directory, per call (FINDINGS9
//! G1).

use crate::backend::SandboxBackend;
use crate::error::{Error, Result};
use crate::fs::{DirEntry, FileKind};
use crate::path::SandboxPath;
use crate::sandbox::SandboxId;

/// Most entries [`walk`](crate::SandboxBackendExt::walk) answers; past it the walk is
/// `LimitExceeded` (walk a directory beneath).
pub const WALK_MAX_ENTRIES: usize = 100_000;
/// Most bytes of paths a walk holds, in what it answers (or matched) and in the
/// directories waiting their turn; past it the walk is `LimitExceeded`.
pub const WALK_MAX_BYTES: usize = 64 << 20;
/// Most entries [`glob`](crate::SandboxBackendExt::glob) looks at; past it the glob is
/// `LimitExceeded`.
pub const GLOB_MAX_VISITED: usize = 1_000_000;
/// Most paths [`glob`](crate::SandboxBackendExt::glob) answers; past it the glob is
/// `LimitExceeded` (narrow the pattern).
pub const GLOB_MAX_MATCHES: usize = 10_000;

/// What an entry held by a walk costs: its path twice (its own, and its name within
/// it) and its other fields.
pub(crate) fn entry_bytes(entry: &DirEntry) -> usize {
    2 * entry.path.as_str().len() + 128
}

/// Hands every entry beneath `root` to `visit`, depth first in name order (symlinks
/// listed, not followed), looking at no more than `max_entries`.
pub(crate) async fn each_entry<B, F>(
    backend: &B,
    id: &SandboxId,
    root: &SandboxPath,
    max_entries: usize,
    mut visit: F,
) -> Result<()>
where
    B: SandboxBackend + ?Sized,
    F: FnMut(DirEntry) -> Result<()> + Send,
{
    let mut waiting = vec![root.clone()];
    let mut waiting_bytes = root.as_str().len();
    let mut visited = 0usize;
    while let Some(dir) = waiting.pop() {
        waiting_bytes -= dir.as_str().len();
        let entries = backend.list_dir(id, &dir).await?;
        visited += entries.len();
        if visited > max_entries {
            return Err(Error::limit_exceeded(format!(
                "walking {root}: more than {max_entries} entries; walk a directory beneath it"
            )));
        }
        let subdirs: Vec<SandboxPath> = entries
            .iter()
            .filter(|e| e.kind == FileKind::Dir)
            .map(|e| e.path.clone())
            .collect();
        for entry in entries {
            visit(entry)?;
        }
        for sub in subdirs.into_iter().rev() {
            waiting_bytes += sub.as_str().len();
            waiting.push(sub);
        }
        if waiting_bytes > WALK_MAX_BYTES {
            return Err(Error::limit_exceeded(format!(
                "walking {root}: more than {WALK_MAX_BYTES} bytes of directories waiting; \
                 walk a directory beneath it"
            )));
        }
    }
    Ok(())
}
