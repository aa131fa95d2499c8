//! The kernel watches one file watch holds: which directory each watch descriptor is
//! on, within a cap per watch.
//!
//! Every kernel watch of this process counts against its user's
//! `fs.inotify.max_user_watches`, which every process of that user shares (for a root
//! backend: every root process on the host). A recursive watch adds one per
//! directory, and a sandbox makes directories as fast as it likes; without caps one
//! watch of a sandbox's tree could leave the host's other programs none. This cap is
//! one watch's; the sandbox's and the process's are the instance's
//! ([`super::instance`]).

use std::collections::HashMap;

use sandcell::SandboxPath;

/// The most directories one watch follows: well past a large repository's, well short
/// of a host's budget.
pub(crate) const MAX_PER_WATCH: usize = 16_384;

/// Watch descriptor → the directory's path in the workspace.
#[derive(Default)]
pub(crate) struct WatchedDirs {
    dirs: HashMap<i32, SandboxPath>,
}

impl WatchedDirs {
    /// Whether this watch may follow one more directory.
    pub(crate) fn has_room(&self) -> bool {
        self.dirs.len() < MAX_PER_WATCH
    }

    /// Records the directory a descriptor is on (a descriptor already held names the
    /// directory again: the kernel answers it for a directory already watched).
    pub(crate) fn insert(&mut self, wd: i32, path: SandboxPath) {
        self.dirs.insert(wd, path);
    }

    /// Forgets a descriptor (let go, or gone with its directory).
    pub(crate) fn remove(&mut self, wd: i32) {
        self.dirs.remove(&wd);
    }

    /// Keeps only the descriptors `keep` answers `true` for.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(i32) -> bool) {
        self.dirs.retain(|wd, _| keep(*wd));
    }

    pub(crate) fn get(&self, wd: i32) -> Option<&SandboxPath> {
        self.dirs.get(&wd)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&i32, &SandboxPath)> {
        self.dirs.iter()
    }

    pub(crate) fn paths_mut(&mut self) -> impl Iterator<Item = &mut SandboxPath> {
        self.dirs.values_mut()
    }
}
