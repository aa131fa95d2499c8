//! Reads with a byte cap, for a server facing untrusted callers: the backend contract's
//! `read` answers a whole file, so a caller asking for a huge (or sparse) one would
//! have the server hold all of it. [`read_at_most`] sizes the file first and refuses
//! it before reading.

use bytes::Bytes;

use crate::backend::SandboxBackend;
use crate::error::{Error, Result};
use crate::fs::FileKind;
use crate::path::SandboxPath;
use crate::raw::budget::{ByteBudget, Reservation};
use crate::sandbox::SandboxId;

/// Most symbolic links followed while sizing a file, as Linux's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;

/// Reads `path` unless it holds more than `max_bytes`: `LimitExceeded` naming the
/// size and the limit, before a byte is read.
///
/// The file is sized with `stat`, following symbolic links whose targets stay in the
/// workspace. The read itself is [`SandboxBackend::read_limited`], so a file that grows
/// between the two calls (or whose size cannot be told first) is refused at
/// `max_bytes` too, by a backend that overrides it without holding more.
pub async fn read_at_most(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    path: &SandboxPath,
    max_bytes: u64,
) -> Result<Bytes> {
    size_at_most(backend, id, path, max_bytes).await?;
    backend.read_limited(id, path, max_bytes).await
}

/// [`read_at_most`] within `budget`: the file's size (with room to grow by a quarter
/// and 64 KiB, at most `max_bytes`; `max_bytes` where it cannot be told first) is
/// reserved before it is read, and the read is limited to what was reserved, so a
/// file that grows past it meanwhile is `LimitExceeded` rather than held over the
/// budget. The reservation is the caller's to hold while the bytes are. Past the
/// budget it is `LimitExceeded`, before a byte is read.
pub async fn read_within(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    path: &SandboxPath,
    max_bytes: u64,
    budget: &ByteBudget,
) -> Result<(Bytes, Reservation)> {
    let size = size_at_most(backend, id, path, max_bytes).await?;
    // What is reserved is what the read may hold: the size seen, with room for a file
    // being appended to meanwhile (a log), never past `max_bytes`.
    let room = match size {
        Some(size) => size
            .saturating_add(size / 4)
            .saturating_add(GROWTH)
            .min(max_bytes),
        None => max_bytes,
    };
    let held = budget.try_reserve(room)?;
    let data = backend.read_limited(id, path, room).await?;
    Ok((data, held))
}

/// Growth allowed beyond a quarter of the size seen while a file is read within a
/// budget.
const GROWTH: u64 = 64 * 1024;

/// The size of the file `path` leads to (following links that stay in the workspace),
/// `LimitExceeded` past `max_bytes`; `None` where it cannot be told first.
async fn size_at_most(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    path: &SandboxPath,
    max_bytes: u64,
) -> Result<Option<u64>> {
    let mut current = path.clone();
    for _ in 0..MAX_LINKS {
        let info = backend.stat(id, &current).await?;
        if info.kind != FileKind::Symlink {
            if info.kind == FileKind::File && info.size > max_bytes {
                return Err(too_large(path, info.size, max_bytes));
            }
            return Ok((info.kind == FileKind::File).then_some(info.size));
        }
        match info
            .symlink_target
            .as_deref()
            .and_then(|t| resolve(&current, t))
        {
            Some(next) => current = next,
            None => break,
        }
    }
    Ok(None)
}

/// Where a link at `link` with the relative `target` leads, lexically; `None` for an
/// absolute target or one that climbs out of the workspace.
fn resolve(link: &SandboxPath, target: &str) -> Option<SandboxPath> {
    if target.starts_with('/') {
        return None;
    }
    let parent = link.parent()?;
    let mut parts: Vec<&str> = parent.components().collect();
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    SandboxPath::new(&parts.join("/")).ok()
}

fn too_large(path: &SandboxPath, size: u64, max_bytes: u64) -> Error {
    Error::limit_exceeded(format!(
        "{path} holds {size} bytes, over the {max_bytes}-byte limit of one read: read it \
         in parts with a command (`head -c`, `tail -c`), or export its directory as an \
         archive"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_within_the_workspace_only() {
        let link = SandboxPath::new("a/b/link").unwrap();
        assert_eq!(resolve(&link, "c").unwrap().as_str(), "a/b/c");
        assert_eq!(resolve(&link, "../c").unwrap().as_str(), "a/c");
        assert_eq!(resolve(&link, "./../../c").unwrap().as_str(), "c");
        assert!(resolve(&link, "../../../c").is_none());
        assert!(resolve(&link, "/etc/passwd").is_none());
    }
}
