//! How much a workspace holds on disk: a walk that holds a bounded number of
//! descriptors whatever the tree's shape.
//!
//! Descriptors are this process's to share with every other sandbox it serves: a walk
//! holding one per directory waiting to be read (30,000 subdirectories in one sandbox)
//! made every other sandbox's calls fail with `EMFILE` meanwhile, and its own figure
//! came out short. This one goes depth first with only directories' names waiting, on the shared
//! [`DirStack`], which keeps [`OPEN_LEVELS`](sandcell::raw::tree::OPEN_LEVELS) directories of its path open.

use std::ffi::CString;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::AtFlags;
use sandcell::raw::tree::{for_each_name, is_mount_root, DirStack};
use sandcell::{FileKind, Result};

use super::meta::Meta;
use super::{fail, open_subdir, Workspace};

impl Workspace {
    /// Bytes of the regular files in the workspace, on its own file system (host
    /// mounts left out, bound ones from the same file system too), walked without
    /// following symlinks and holding at most [`OPEN_LEVELS`](sandcell::raw::tree::OPEN_LEVELS) + 2 descriptors at once.
    /// A directory's files are counted as it is read, so only names of directories
    /// wait: a directory of millions of hard links (they cost no inodes) costs no
    /// memory. An entry that vanishes or moves mid-walk is skipped: the figure is a
    /// reading, not a snapshot.
    pub(crate) fn disk_usage(&self) -> Result<u64> {
        let measuring = |e| fail("measuring the workspace", e);
        let top = open_subdir(self.root.as_fd(), c".").map_err(measuring)?;
        let dev = rustix::fs::fstat(&top).map_err(measuring)?.st_dev;
        let mut total = 0u64;
        let subdirs = read_level(top.as_fd(), dev, &mut total).map_err(measuring)?;
        let mut stack = DirStack::new();
        stack
            .push(top, c".".to_owned(), subdirs)
            .map_err(measuring)?;
        while let Some(level) = stack.top_mut() {
            let Some(name) = level.data.pop() else {
                // Climbing back to a directory moved away meanwhile ends the walk.
                if stack.pop().is_err() {
                    break;
                }
                continue;
            };
            let Ok(dir) = level.fd() else { break };
            let Ok(sub) = open_subdir(dir, &name) else {
                continue;
            };
            // Checked on the descriptor: the name may lead elsewhere since its `stat`,
            // and a bound host directory has the same device.
            if !rustix::fs::fstat(&sub).is_ok_and(|st| st.st_dev == dev)
                || is_mount_root(sub.as_fd())
            {
                continue;
            }
            let subdirs = read_level(sub.as_fd(), dev, &mut total).unwrap_or_default();
            let _ = stack.push(sub, name, subdirs);
        }
        Ok(total)
    }
}

/// Adds the bytes of the regular files in the directory open as `dir` to `total`, and
/// answers the names of its subdirectories on device `dev`.
fn read_level(dir: BorrowedFd<'_>, dev: u64, total: &mut u64) -> rustix::io::Result<Vec<CString>> {
    let mut subdirs = Vec::new();
    for_each_name(dir, |name| {
        if let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            let meta = Meta::of(&st);
            match meta.kind {
                FileKind::File => *total = total.saturating_add(meta.size),
                FileKind::Dir if st.st_dev == dev => subdirs.push(name.to_owned()),
                _ => {}
            }
        }
        ControlFlow::Continue(())
    })?;
    Ok(subdirs)
}

#[cfg(test)]
mod tests;
