//! How much a workspace holds on disk: a walk that holds a bounded number of
//! descriptors whatever the tree's shape.
//!
//! Descriptors are this process's to share with every other sandbox it serves: a walk
//! holding one per directory waiting to be read (30,000 subdirectories in one sandbox)
//! made every other sandbox's calls fail with `EMFILE` meanwhile, and its own figure
//! came out short. This one goes depth first with only names waiting, on the shared
//! [`DirStack`], which keeps [`OPEN_LEVELS`](sandcell::raw::tree::OPEN_LEVELS) directories of its path open.

use std::os::fd::AsFd;

use rustix::fs::AtFlags;
use sandcell::raw::tree::{is_mount_root, DirStack};
use sandcell::{FileKind, Result};

use super::meta::Meta;
use super::{fail, list_names, open_subdir, Workspace};

impl Workspace {
    /// Bytes of the regular files in the workspace, on its own file system (host
    /// mounts left out, bound ones from the same file system too), walked without
    /// following symlinks and holding at most [`OPEN_LEVELS`](sandcell::raw::tree::OPEN_LEVELS) + 2 descriptors at once.
    /// An entry that vanishes or moves mid-walk is skipped: the figure is a reading,
    /// not a snapshot.
    pub(crate) fn disk_usage(&self) -> Result<u64> {
        let measuring = |e| fail("measuring the workspace", e);
        let top = open_subdir(self.root.as_fd(), c".").map_err(measuring)?;
        let dev = rustix::fs::fstat(&top).map_err(measuring)?.st_dev;
        let mut names = list_names(top.as_fd()).map_err(measuring)?;
        names.reverse();
        let mut total = 0u64;
        let mut stack = DirStack::new();
        stack.push(top, c".".to_owned(), names).map_err(measuring)?;
        while let Some(level) = stack.top_mut() {
            let Some(name) = level.data.pop() else {
                // Climbing back to a directory moved away meanwhile ends the walk.
                if stack.pop().is_err() {
                    break;
                }
                continue;
            };
            let Ok(dir) = level.fd() else { break };
            let Ok(st) = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let meta = Meta::of(&st);
            match meta.kind {
                FileKind::File => total = total.saturating_add(meta.size),
                FileKind::Dir if st.st_dev == dev => {
                    let Ok(sub) = open_subdir(dir, &name) else {
                        continue;
                    };
                    // Checked on the descriptor: the name may lead elsewhere since its
                    // `stat`, and a bound host directory has the same device.
                    if !rustix::fs::fstat(&sub).is_ok_and(|st| st.st_dev == dev)
                        || is_mount_root(sub.as_fd())
                    {
                        continue;
                    }
                    let mut names = list_names(sub.as_fd()).unwrap_or_default();
                    names.reverse();
                    let _ = stack.push(sub, name, names);
                }
                _ => {}
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests;
