//! The kernel watches a file watch holds: which directory each watch descriptor is on,
//! counted against a cap per watch and a budget the whole process shares.
//!
//! Every kernel watch of this process counts against its user's
//! `fs.inotify.max_user_watches`, which every process of that user shares (for a root
//! backend: every root process on the host). A recursive watch adds one per
//! directory, and a sandbox makes directories as fast as it likes; without a cap one
//! watch of a sandbox's tree could leave the host's other programs none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use sandcell::SandboxPath;

/// The most directories one watch follows: well past a large repository's, well short
/// of a host's budget.
pub(crate) const MAX_PER_WATCH: usize = 16_384;

/// Kernel watches every watch of this process holds.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// What this process's watches may hold together: half the user's limit, leaving the
/// rest to the user's other programs.
fn process_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()
            .and_then(|max| max.trim().parse::<usize>().ok())
            .map_or(MAX_PER_WATCH, |max| max / 2)
    })
}

/// Watch descriptor → the directory's path in the workspace, each entry counted in
/// [`HELD`] from [`reserve`](WatchedDirs::reserve) until it is removed or the map
/// dropped (with the inotify instance, whose kernel watches go with it).
#[derive(Default)]
pub(crate) struct WatchedDirs {
    dirs: HashMap<i32, SandboxPath>,
}

impl WatchedDirs {
    /// Takes room for one more kernel watch: `false` when this watch, or the process,
    /// holds all it may.
    pub(crate) fn reserve(&self) -> bool {
        if self.dirs.len() >= MAX_PER_WATCH {
            return false;
        }
        let budget = process_budget();
        HELD.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
            (held < budget).then_some(held + 1)
        })
        .is_ok()
    }

    /// Gives back a reservation that made no kernel watch.
    pub(crate) fn unreserve(&self) {
        HELD.fetch_sub(1, Ordering::SeqCst);
    }

    /// Records a reserved kernel watch. The kernel answers an existing descriptor for
    /// a directory already watched: that made no new watch, so its reservation goes
    /// back.
    pub(crate) fn insert(&mut self, wd: i32, path: SandboxPath) {
        if self.dirs.insert(wd, path).is_some() {
            self.unreserve();
        }
    }

    /// Forgets a kernel watch (removed, or gone with its directory).
    pub(crate) fn remove(&mut self, wd: i32) {
        if self.dirs.remove(&wd).is_some() {
            self.unreserve();
        }
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

impl Drop for WatchedDirs {
    fn drop(&mut self) {
        HELD.fetch_sub(self.dirs.len(), Ordering::SeqCst);
    }
}
