//! File watching with inotify: a kernel watch per directory (every directory beneath,
//! for a recursive watch, added as they appear) on the process's one inotify instance
//! ([`instance`]), and events turned into workspace-relative [`WatchEvent`]s.
//!
//! Directories are resolved inside the workspace by the contained operations and
//! watched through their open descriptor (`/proc/self/fd/N`), so the kernel watches the
//! directory that was resolved, never one a link leads to; subdirectories are opened
//! with `O_NOFOLLOW`. Names come from the kernel and are joined to the watched path,
//! so an event can only name something beneath it.
//!
//! A recursive watch follows at most [`budget::MAX_PER_WATCH`] directories, a
//! sandbox's watches (or a group's, [`budget_group`]) together at most
//! [`instance::MAX_PER_GROUP`] distinct ones, and all the process's watches at most half
//! the user's inotify limit; past any of them, the consumer gets one `Overflow`
//! (rescan) and what lies beyond is not watched.

mod budget;
mod instance;

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use std::path::PathBuf;

use rustix::fs::inotify::ReadFlags;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sandcell::{Error, Result, SandboxPath, WatchEvent, WatchEventKind, WatchSender};

use crate::contained::{list_names, open_subdir, Workspace};
use budget::WatchedDirs;
use instance::{AddError, Delivery, Instance, Raw, Subscription};
use sandcell::raw::tree::DirStack;

/// How long a rename's first half waits for its second in a later read. The kernel
/// queues both halves in one rename, but a reader can come between them, and the
/// renaming thread can be preempted there on a busy host; a move out of the watch is
/// reported this much later.
const RENAME_PAIRING: Duration = Duration::from_millis(50);

/// One watch: its share of the inotify instance and which directory each kernel
/// watch is on.
pub(crate) struct Watcher {
    events: Subscription,
    /// Kernel watch descriptor → the directory's path in the workspace.
    dirs: WatchedDirs,
    /// Whether a directory went unwatched for the caps since the consumer was told
    /// (one `Overflow` per time the watch reaches them, not one per directory).
    capped: bool,
    /// The watched directory's kernel watch.
    root_wd: i32,
    /// The watched directory as the caller named it (events are named beneath it).
    root: SandboxPath,
    /// Where it really is in the workspace (links in `root` resolved).
    real_root: SandboxPath,
    /// The workspace's host path.
    workspace: PathBuf,
    recursive: bool,
    sender: WatchSender,
    /// The sandbox's watch lock, held shared while the watch lives: no clone unmounts
    /// the workspace from under it (`crate::layers::hold_for_watch`).
    _holding: std::fs::File,
}

impl Watcher {
    /// Starts watching the directory open as `dir` (at workspace path `root`); with
    /// `recursive`, every directory beneath it too. Events made after this returns are
    /// reported.
    pub(crate) fn start(
        workspace: &Workspace,
        root: SandboxPath,
        (recursive, group): (bool, std::sync::Arc<str>),
        sender: WatchSender,
        holding: std::fs::File,
    ) -> Result<Self> {
        let dir = workspace.open_dir(&root)?;
        let real = workspace.resolve_dir(&root)?;
        let real_root = real
            .strip_prefix(workspace.root_path())
            .ok()
            .and_then(|rel| SandboxPath::new(&rel.to_string_lossy()).ok())
            .ok_or_else(|| {
                Error::permission_denied(format!("{root} resolves outside the workspace"))
            })?;
        let events = Instance::shared()
            .map_err(|e| Error::io("starting a file watch", e))?
            .subscribe(group);
        let mut watcher = Watcher {
            events,
            dirs: WatchedDirs::default(),
            capped: false,
            root_wd: -1,
            root: root.clone(),
            real_root,
            workspace: workspace.root_path().to_path_buf(),
            recursive,
            sender,
            _holding: holding,
        };
        watcher.root_wd = watcher
            .add(dir.as_fd(), root.clone())
            .map_err(|e| match e {
                // The budgets are spent (its group's: its own watches hold them).
                Errno::NOSPC => Error::limit_exceeded(format!(
                    "watching {root}: the directories this sandbox's watches may follow \
                     are all watched; end a watch first"
                )),
                e => Error::io(format_args!("watching {root}"), e.into()),
            })?;
        if recursive {
            watcher.add_beneath(dir.as_fd(), &root, &mut None);
        }
        Ok(watcher)
    }

    /// Adds a kernel watch on the directory open as `dir`.
    fn add(&mut self, dir: BorrowedFd<'_>, path: SandboxPath) -> rustix::io::Result<i32> {
        let added = if self.dirs.has_room() {
            // The watched directory itself may use the reserve: a watch within its
            // group's budget is never refused outright for others' spending.
            self.events.add(dir, self.root_wd < 0)
        } else {
            Err(AddError::Budget)
        };
        match added {
            Ok(wd) => {
                self.dirs.insert(wd, path);
                Ok(wd)
            }
            Err(AddError::Budget) => {
                // Past the caps nothing beneath is watched: what changes there is
                // lost, and the consumer is told so (rescan), once.
                if !self.capped {
                    self.capped = true;
                    let _ = self.sender.overflowed();
                }
                Err(Errno::NOSPC)
            }
            Err(AddError::Kernel(e)) => Err(e),
        }
    }

    /// Watches every directory beneath `dir` (at `path`). With `report`, everything
    /// found is also collected there as created: it appeared in a directory that was
    /// not watched yet, and the events of its making were never seen.
    ///
    /// Depth first with a bounded number of descriptors ([`DirStack`]): a descriptor
    /// per directory waiting its turn let a sandbox that moved a tree of thirty
    /// thousand directories into a watched one run the host process out of them.
    fn add_beneath(
        &mut self,
        dir: BorrowedFd<'_>,
        path: &SandboxPath,
        report: &mut Option<Vec<WatchEvent>>,
    ) {
        let Ok(top) = open_subdir(dir, c".") else {
            return;
        };
        let subdirs = self.watch_entries(top.as_fd(), path, report);
        let mut stack = DirStack::new();
        if stack.push(top, c".".to_owned(), subdirs).is_err() {
            return;
        }
        while let Some(level) = stack.top_mut() {
            let Some((name, at)) = level.data.pop() else {
                // A directory moved away meanwhile ends the walk: what is left in it
                // is reported when it is moved back into the watch.
                if stack.pop().is_err() {
                    return;
                }
                continue;
            };
            let Ok(sub) = level.fd().and_then(|fd| open_subdir(fd, &name)) else {
                continue;
            };
            let subdirs = self.watch_entries(sub.as_fd(), &at, report);
            if stack.push(sub, name, subdirs).is_err() {
                return;
            }
        }
    }

    /// Watches each directory in the directory open as `dir` (at `path`), reporting
    /// what it holds where asked, and answers the directories watched (entered last
    /// first, the order the walk always took).
    fn watch_entries(
        &mut self,
        dir: BorrowedFd<'_>,
        path: &SandboxPath,
        report: &mut Option<Vec<WatchEvent>>,
    ) -> Vec<(CString, SandboxPath)> {
        let mut subdirs = Vec::new();
        let Ok(names) = list_names(dir) else {
            // Unlisted (a directory past the walk limits, or the host's listings at
            // their cap): nothing beneath is watched, and the consumer is told that
            // events may be missing (rescan), rather than left blind without a word.
            let _ = self.sender.overflowed();
            return subdirs;
        };
        for name in names {
            let Some(child) = join(path, &name) else {
                continue;
            };
            match open_subdir(dir, &name) {
                Ok(sub) => {
                    if self.add(sub.as_fd(), child.clone()).is_ok() {
                        if let Some(found) = report.as_mut() {
                            found.push(WatchEvent::new(WatchEventKind::Created, child.clone()));
                        }
                        subdirs.push((name, child));
                    }
                }
                // Not a directory (or a link, not followed): a file.
                Err(_) => {
                    if let Some(found) = report.as_mut() {
                        found.push(WatchEvent::new(WatchEventKind::Created, child));
                    }
                }
            }
        }
        subdirs
    }

    /// Forgets the kernel watches on `path` and beneath it.
    fn forget_beneath(&mut self, path: &SandboxPath) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, p)| p.starts_with(path))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(wd);
            self.capped = false;
            self.events.remove(wd);
        }
    }

    /// Renames the watches on `from` and beneath it to lie beneath `to`.
    fn move_beneath(&mut self, from: &SandboxPath, to: &SandboxPath) {
        for path in self.dirs.paths_mut() {
            if let Some(rest) = path.strip_prefix(from) {
                let moved = if rest.is_root() {
                    Some(to.clone())
                } else {
                    to.join(rest.as_str()).ok()
                };
                if let Some(moved) = moved {
                    *path = moved;
                }
            }
        }
    }

    fn emit(&mut self, event: WatchEvent) {
        let _ = self.sender.send(event);
    }

    /// Reports events until the consumer drops the stream or the watched directory
    /// goes (removed, or unmounted with its sandbox).
    pub(crate) async fn run(mut self) {
        let mut pending_from: Option<(u32, SandboxPath, bool)> = None;
        let mut batch = Vec::new();
        loop {
            let received = if self.sender.has_pending() {
                tokio::select! {
                    received = self.events.recv(&mut batch) => received,
                    alive = self.sender.flush() => {
                        if !alive {
                            return;
                        }
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    received = self.events.recv(&mut batch) => received,
                    () = self.sender.closed() => return,
                }
            };
            if !received {
                return;
            }
            let mut root_gone = self.take(&mut batch, &mut pending_from);
            if let Some((cookie, from, is_dir)) = pending_from.take() {
                // The other half of a rename may be in the next read.
                match tokio::time::timeout(RENAME_PAIRING, self.events.recv(&mut batch)).await {
                    Ok(true) => {
                        pending_from = Some((cookie, from, is_dir));
                        root_gone |= self.take(&mut batch, &mut pending_from);
                        if let Some((_, from, is_dir)) = pending_from.take() {
                            self.moved_out(from, is_dir);
                        }
                    }
                    _ => self.moved_out(from, is_dir),
                }
            }
            if !self.sender.send_pending() || root_gone {
                return;
            }
        }
    }

    /// Turns what the instance handed over into watch events; `true` once the
    /// watched directory itself is gone.
    fn take(
        &mut self,
        batch: &mut Vec<Delivery>,
        pending_from: &mut Option<(u32, SandboxPath, bool)>,
    ) -> bool {
        let mut root_gone = false;
        for delivery in batch.drain(..) {
            match delivery {
                Delivery::Event(raw) => root_gone |= self.handle(raw, pending_from),
                Delivery::Overflow => {
                    let _ = self.sender.overflowed();
                }
            }
        }
        if self.events.take_lost() {
            // Events were dropped, the kernel's word that a directory went among them
            // perhaps: keep only what the instance still holds for this watch.
            let _ = self.sender.overflowed();
            let events = &self.events;
            self.dirs.retain(|wd| events.holds(wd));
            root_gone |= !self.events.holds(self.root_wd);
        }
        root_gone
    }

    /// Turns one kernel event into watch events; `true` once the watched directory
    /// itself is gone.
    fn handle(&mut self, raw: Raw, pending_from: &mut Option<(u32, SandboxPath, bool)>) -> bool {
        if raw.mask.contains(ReadFlags::IGNORED) || raw.mask.contains(ReadFlags::UNMOUNT) {
            self.dirs.remove(raw.wd);
            self.capped = false;
            return raw.wd == self.root_wd;
        }
        if raw.mask.contains(ReadFlags::DELETE_SELF) {
            return raw.wd == self.root_wd;
        }
        let (Some(dir), Some(name)) = (self.dirs.get(raw.wd), raw.name.as_deref()) else {
            return false;
        };
        let Some(path) = join(dir, name) else {
            return false;
        };
        let is_dir = raw.mask.contains(ReadFlags::ISDIR);
        if raw.mask.contains(ReadFlags::MOVED_TO) {
            match pending_from.take() {
                Some((cookie, from, _)) if cookie == raw.cookie => {
                    if is_dir {
                        self.move_beneath(&from, &path);
                    }
                    self.emit(WatchEvent::renamed(from, path));
                    return false;
                }
                Some((_, from, from_dir)) => self.moved_out(from, from_dir),
                None => {}
            }
            self.created(path, is_dir, raw.wd);
            return false;
        }
        if let Some((_, from, from_dir)) = pending_from.take() {
            self.moved_out(from, from_dir);
        }
        if raw.mask.contains(ReadFlags::MOVED_FROM) {
            *pending_from = Some((raw.cookie, path, is_dir));
        } else if raw.mask.contains(ReadFlags::CREATE) {
            self.created(path, is_dir, raw.wd);
        } else if raw.mask.contains(ReadFlags::DELETE) {
            if is_dir {
                self.forget_beneath(&path);
            }
            self.emit(WatchEvent::new(WatchEventKind::Removed, path));
        } else if raw.mask.contains(ReadFlags::MODIFY) {
            self.emit(WatchEvent::new(WatchEventKind::Modified, path));
        } else if raw.mask.contains(ReadFlags::ATTRIB) {
            self.emit(WatchEvent::new(WatchEventKind::Attributes, path));
        }
        false
    }

    /// Something appeared at `path` (made, or moved in); a directory is watched too in
    /// a recursive watch, and what it already holds reported.
    ///
    /// The new directory is watched before its creation is reported, so a consumer that
    /// has seen the creation knows later changes inside it arrive in order.
    fn created(&mut self, path: SandboxPath, is_dir: bool, parent_wd: i32) {
        let created = WatchEvent::new(WatchEventKind::Created, path.clone());
        if !(is_dir && self.recursive) {
            self.emit(created);
            return;
        }
        let mut found = Some(Vec::new());
        self.watch_new_dir(&path, parent_wd, &mut found);
        self.emit(created);
        for event in found.unwrap_or_default() {
            self.emit(event);
        }
    }

    /// Watches the directory just made at `path`, and everything beneath it (reported
    /// into `found`).
    fn watch_new_dir(
        &mut self,
        path: &SandboxPath,
        parent_wd: i32,
        found: &mut Option<Vec<WatchEvent>>,
    ) {
        let Some(name) = path.file_name().and_then(|n| CString::new(n).ok()) else {
            return;
        };
        // Opened through the parent's watch path, itself resolved from the root with
        // O_NOFOLLOW at each step.
        let Some(parent) = self.dirs.get(parent_wd).cloned() else {
            return;
        };
        if let Some(parent_fd) = self.reopen(&parent) {
            if let Ok(sub) = open_subdir(parent_fd.as_fd(), &name) {
                if self.add(sub.as_fd(), path.clone()).is_ok() {
                    self.add_beneath(sub.as_fd(), path, found);
                }
            }
        }
    }

    /// Something left the watch by a rename whose other half is outside it.
    fn moved_out(&mut self, path: SandboxPath, is_dir: bool) {
        if is_dir {
            self.forget_beneath(&path);
        }
        self.emit(WatchEvent::new(WatchEventKind::Removed, path));
    }

    /// Opens the watched directory at `path` again: from the workspace root (a host
    /// path no sandbox process controls), beneath it and without following any link,
    /// so a directory swapped for a link since is not followed.
    fn reopen(&self, path: &SandboxPath) -> Option<OwnedFd> {
        let rest = path.strip_prefix(&self.root)?;
        let real = if rest.is_root() {
            self.real_root.clone()
        } else if self.real_root.is_root() {
            rest
        } else {
            self.real_root.join(rest.as_str()).ok()?
        };
        let workspace = rustix::fs::open(
            &self.workspace,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let rel = if real.is_root() { "." } else { real.as_str() };
        rustix::fs::openat2(
            &workspace,
            rel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
        )
        .ok()
    }
}

/// Whose budget of kernel watches a watch of sandbox `id` spends: its group's by
/// [`LocalConfig::watch_budget_label`](crate::LocalConfig::watch_budget_label), else its
/// own.
pub(crate) fn budget_group(
    config: &crate::LocalConfig,
    id: &sandcell::SandboxId,
    labels: &std::collections::BTreeMap<String, String>,
) -> std::sync::Arc<str> {
    match config
        .watch_budget_label
        .as_ref()
        .and_then(|label| labels.get(label))
    {
        Some(value) => format!("label:{value}").into(),
        None => format!("sandbox:{id}").into(),
    }
}

/// `dir` joined with a kernel-given name, if the name makes a valid workspace path.
fn join(dir: &SandboxPath, name: &CStr) -> Option<SandboxPath> {
    let name = name.to_str().ok()?;
    if dir.is_root() {
        SandboxPath::new(name).ok()
    } else {
        dir.join(name).ok()
    }
}
