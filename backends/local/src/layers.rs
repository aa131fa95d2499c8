//! Frozen layers: read-only layers that clones of overlay sandboxes share.
//!
//! A clone of an overlay sandbox that nothing holds open copies nothing. The source's
//! upper layer is *frozen*: unmounted, its entries moved to `<root>/layers/<name>`,
//! and that layer stacked read-only above the template for both sandboxes, each of
//! which writes to a fresh, empty upper layer of its own. Neither sees the other's
//! writes, and no file is copied, so a clone costs about what a create does, whatever
//! the source changed.
//!
//! ```text
//! <root>/layers/.lock     taken (flock) by whatever adds, names or removes a layer
//! <root>/layers/<name>/   a frozen upper layer, never written again
//! <root>/sandboxes/<id>/layers
//!                         the layers of that sandbox, top first, one name a line
//! <root>/sandboxes/<id>/upper.<name>/ work.<name>/
//!                         what the source wrote to before the freeze that made <name>,
//!                         removed once its old overlay is torn down ([`Retired`])
//! ```
//!
//! A layer is removed when the last sandbox naming it is destroyed. The list lives in a
//! file of its own rather than in `meta.json`, so the status changes that rewrite the
//! metadata never race a freeze.
//!
//! Freezing needs the source's overlay unmounted, which the kernel allows only when no
//! process holds a file, a directory or a working directory in it: that refusal
//! (`EBUSY`) is the test of idleness. Watches hold no descriptor in the workspace (a
//! watch must not keep a destroyed sandbox's mount alive), so each holds a shared lock
//! on the sandbox's `watching` file instead. A busy or watched sandbox is cloned by
//! copying its upper layer, sharing the layers it already has.

use std::fs;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use rustix::mount::{OpenTreeFlags, UnmountFlags};
use sandcell::{Error, Result};

use crate::layout::SandboxDir;

/// The deepest stack of frozen layers a sandbox gets by freezing; past it a clone
/// copies. Every layer is one more lookup on a miss in the upper layer.
pub(crate) const MAX_FROZEN: usize = 32;

/// The directory holding the frozen layers under a backend root.
fn layers_dir(root: &Path) -> PathBuf {
    root.join("layers")
}

/// Where the frozen layer `name` is.
pub(crate) fn layer_path(root: &Path, name: &str) -> PathBuf {
    layers_dir(root).join(name)
}

/// The lower layers of a sandbox's overlay, top first: its frozen layers, then the
/// template.
pub(crate) fn lowers(root: &Path, names: &[String], template: &Path) -> Vec<PathBuf> {
    names
        .iter()
        .map(|name| layer_path(root, name))
        .chain([template.to_path_buf()])
        .collect()
}

/// Mounts the sandbox's overlay over `names` and the template; with an `owner`, the
/// template through an idmapped view (see [`crate::materialize::materialize`]).
pub(crate) fn mount(
    root: &Path,
    dir: &SandboxDir,
    names: &[String],
    template: &Path,
    owner: Option<&crate::owner::SandboxOwner>,
) -> Result<()> {
    let workspace = dir.workspace();
    fs::create_dir_all(&workspace).map_err(|e| Error::io("creating the workspace directory", e))?;
    if let Some(owner) = owner {
        // The upper layer is the overlay's root: the owner's, as every change in it.
        fs::create_dir_all(dir.upper()).map_err(|e| Error::io("creating an upper layer", e))?;
        owner.chown(&dir.upper())?;
    }
    let mount = |template: &Path| {
        let lowers = lowers(root, names, template);
        let lowers: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
        sandcell::raw::overlay::mount_layers(&lowers, &dir.upper(), &dir.work(), &workspace)
    };
    match owner {
        None => mount(template),
        Some(owner) => crate::materialize::with_view(dir, owner, template, mount),
    }
}

/// The exclusive lock on the layers of a backend root, across processes; released
/// on drop.
pub(crate) struct LayersLock {
    _file: fs::File,
}

/// Takes the lock, waiting for another holder (a freeze or a destroy: milliseconds).
pub(crate) fn lock(root: &Path) -> Result<LayersLock> {
    let dir = layers_dir(root);
    let path = dir.join(".lock");
    let file = match open_lock_file(&path) {
        // Only this process and the overlays it mounts (as root) read the layers: no
        // sandbox owner may list or open them (`crate::root_dir`).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            sandcell::raw::private_dir::create_private_dir_all(&dir)
                .map_err(|e| Error::io(format_args!("creating {}", dir.display()), e))
                .and_then(|()| {
                    open_lock_file(&path)
                        .map_err(|e| Error::io(format_args!("opening {}", path.display()), e))
                })
        }
        opened => opened.map_err(|e| Error::io(format_args!("opening {}", path.display()), e)),
    }?;
    rustix::fs::flock(&file, FlockOperation::LockExclusive)
        .map_err(|e| Error::io(format_args!("locking {}", path.display()), e.into()))?;
    Ok(LayersLock { _file: file })
}

/// The frozen layers of the sandbox in `dir`, top first (none for a sandbox that was
/// never frozen, or is not an overlay).
pub(crate) fn read(dir: &SandboxDir) -> Result<Vec<String>> {
    match fs::read_to_string(dir.layers()) {
        Ok(text) => Ok(text
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io("reading the layers of a sandbox", e)),
    }
}

/// Records the frozen layers of a sandbox being made (its directory is not yet a
/// sandbox to anyone else, so a plain write will do).
pub(crate) fn write_new(dir: &SandboxDir, names: &[String]) -> Result<()> {
    fs::write(dir.layers(), listing(names))
        .map_err(|e| Error::io("writing the layers of a sandbox", e))
}

/// Records the sandbox's frozen layers (atomically: a temp file renamed over).
pub(crate) fn write(dir: &SandboxDir, names: &[String]) -> Result<()> {
    dir.write_atomically(
        &dir.layers(),
        listing(names).as_bytes(),
        "writing the layers of a sandbox",
    )
}

/// The text of a layers file: one name a line, top first.
fn listing(names: &[String]) -> String {
    let mut text = names.join("\n");
    text.push('\n');
    text
}

/// Held (a shared lock on the sandbox's `watching` file) by a live watch, in any
/// process: [`freeze`] does not unmount a workspace a watch holds, since the unmount
/// would end the watch.
pub(crate) fn hold_for_watch(dir: &SandboxDir) -> Result<fs::File> {
    let file = open_watching(dir)?;
    rustix::fs::flock(&file, FlockOperation::LockShared)
        .map_err(|e| Error::io("holding a watched workspace", e.into()))?;
    Ok(file)
}

fn open_watching(dir: &SandboxDir) -> Result<fs::File> {
    open_lock_file(&dir.watching()).map_err(|e| Error::io("opening the watch lock of a sandbox", e))
}

/// Opens (made where missing, never truncated) a file that is only ever flock'ed.
fn open_lock_file(path: &Path) -> std::io::Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// What [`freeze`] did.
#[derive(Debug)]
pub(crate) enum Frozen {
    /// The upper layer's entries are in a new frozen layer and the sandbox is
    /// unmounted: [`Staged::remount`] puts it on top of that layer.
    Layer(Staged),
    /// The upper layer holds nothing: the stack beneath it is the whole workspace, and
    /// nothing changed.
    Empty,
    /// Something holds the workspace (or the stack is full): nothing changed.
    Busy,
}

/// Begins freezing the upper layer of the sandbox in `dir`, whose stack is `names`
/// over `template`: its overlay is unmounted (refused while anything holds it) and the
/// upper layer's entries move into a new layer under the layers directory. The layer
/// is then complete, and a clone can mount it while [`Staged::remount`] mounts the
/// sandbox again.
///
/// The entries move rather than the directory itself: the old overlay lives on until
/// the [`Retired`] is dropped, and the kernel marks its upper and work directories as
/// in use meanwhile (a new overlay taking one of them as a layer would log a warning
/// and, with `index=on`, be refused). So the sandbox gets new upper and work
/// directories too, and the old ones go with the `Retired`.
///
/// The caller holds the [`lock`] and keeps this process's own operations from opening
/// the workspace until the remount; the sandbox's processes should be frozen. On an
/// error the sandbox is put back as it was, wherever that is still possible.
pub(crate) fn freeze(
    root: &Path,
    dir: &SandboxDir,
    names: &[String],
    template: &Path,
    owner: Option<std::sync::Arc<crate::owner::SandboxOwner>>,
) -> Result<Frozen> {
    let upper_is_empty = fs::read_dir(dir.upper())
        .map_err(|e| Error::io("reading an upper layer", e))?
        .next()
        .is_none();
    if upper_is_empty {
        return Ok(Frozen::Empty);
    }
    if names.len() >= MAX_FROZEN {
        return Ok(Frozen::Busy);
    }
    let name = uuid::Uuid::new_v4().simple().to_string();
    let mut stack = vec![name.clone()];
    stack.extend(names.iter().cloned());
    {
        // Checked before anything changes: the stack must stay mountable.
        let lowers = lowers(root, &stack, template);
        let lowers: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
        if !sandcell::raw::overlay::layers_fit(&lowers, &dir.upper(), &dir.work()) {
            return Ok(Frozen::Busy);
        }
    }
    // Watched (here or in another process): leave it mounted. Held until the remount,
    // so no watch starts meanwhile.
    let watching = open_watching(dir)?;
    match rustix::fs::flock(&watching, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(Frozen::Busy),
        Err(e) => return Err(Error::io("checking for watches", e.into())),
    }
    // Busy is found first without the pin below, whose release costs the kernel a
    // grace period (a millisecond here). `MNT_EXPIRE` answers busy or not, and leaves
    // an idle mount marked "expired", a mark the next access to it clears (the pin
    // is one); a second call in a row would unmount it, which is then done.
    let unmounted = match rustix::mount::unmount(dir.workspace(), UnmountFlags::EXPIRE) {
        Err(rustix::io::Errno::BUSY) => return Ok(Frozen::Busy),
        Ok(()) => true,
        // Idle; or a kernel without the flag, for the unmount below to answer.
        Err(_) => false,
    };
    // A detached copy of the mount keeps the overlay alive through the unmount, which
    // then only takes it out of the tree. Without one (a kernel before 5.2) the
    // unmount tears it down at once: slower, and otherwise the same.
    let pin = if unmounted {
        None
    } else {
        let pin = rustix::mount::open_tree(
            rustix::fs::CWD,
            dir.workspace(),
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .ok();
        match rustix::mount::unmount(dir.workspace(), UnmountFlags::empty()) {
            Ok(()) => pin,
            Err(rustix::io::Errno::BUSY) => return Ok(Frozen::Busy),
            Err(e) => {
                return Err(Error::io(
                    format_args!("unmounting {}", dir.workspace().display()),
                    e.into(),
                ))
            }
        }
    };
    let staged = Staged {
        root: root.to_path_buf(),
        dir: dir.clone(),
        template: template.to_path_buf(),
        owner,
        layer: layer_path(root, &name),
        stack,
        retired: Retired {
            pin,
            dirs: vec![
                dir.path().join(format!("upper.{name}")),
                dir.path().join(format!("work.{name}")),
            ],
        },
        _watching: watching,
    };
    let moved = fs::create_dir(&staged.layer)
        .map_err(|e| Error::io("making a frozen layer", e))
        .and_then(|()| move_entries(&dir.upper(), &staged.layer));
    match moved {
        Ok(()) => Ok(Frozen::Layer(staged)),
        Err(e) => {
            staged.undo();
            Err(e)
        }
    }
}

/// A freeze half done: the new layer complete, the sandbox unmounted. Dropped without
/// [`Staged::remount`] or [`Staged::undo`], the sandbox stays unmounted.
#[derive(Debug)]
pub(crate) struct Staged {
    root: PathBuf,
    dir: SandboxDir,
    template: PathBuf,
    owner: Option<std::sync::Arc<crate::owner::SandboxOwner>>,
    layer: PathBuf,
    /// The sandbox's stack once remounted, the new layer first.
    stack: Vec<String>,
    retired: Retired,
    /// The exclusive lock on the sandbox's `watching` file, so no watch starts on the
    /// bare mount point.
    _watching: fs::File,
}

impl Staged {
    /// The frozen layers beneath the sandbox once remounted, top first.
    pub(crate) fn stack(&self) -> &[String] {
        &self.stack
    }

    /// Mounts the sandbox over the new layer with an empty upper layer of its own and
    /// records its stack. Then [`Staged::into_retired`] answers what to dispose of
    /// once the clone is made; on an error the sandbox is left unmounted, for
    /// [`Staged::undo`].
    pub(crate) fn remount(&self) -> Result<()> {
        let dir = &self.dir;
        fs::rename(dir.upper(), &self.retired.dirs[0])
            .map_err(|e| Error::io("retiring an upper layer", e))?;
        fs::rename(dir.work(), &self.retired.dirs[1])
            .map_err(|e| Error::io("retiring a work directory", e))?;
        mount(
            &self.root,
            dir,
            &self.stack,
            &self.template,
            self.owner.as_deref(),
        )?;
        write(dir, &self.stack).inspect_err(|_| {
            let _ = rustix::mount::unmount(dir.workspace(), UnmountFlags::empty());
        })
    }

    /// What a remounted sandbox no longer uses.
    pub(crate) fn into_retired(self) -> Retired {
        self.retired
    }

    /// Puts the sandbox back as it was: its entries back in its own upper layer,
    /// mounted over its old stack. Nothing else may have the new layer mounted. Best
    /// effort: each step is tried whatever state a failure left.
    pub(crate) fn undo(mut self) {
        let dir = &self.dir;
        let _ = rustix::mount::unmount(dir.workspace(), UnmountFlags::empty());
        for (fresh, old) in [dir.upper(), dir.work()].iter().zip(&self.retired.dirs) {
            if old.exists() {
                // Made by a failed remount, and written by nothing.
                let _ = sandcell::raw::tree::remove_dir_all(fresh);
                let _ = fs::rename(old, fresh);
            }
        }
        if self.layer.exists() {
            let _ = move_entries(&self.layer, &dir.upper());
            let _ = fs::remove_dir(&self.layer);
        }
        // The old overlay must be gone before its directories are mounted again.
        drop(self.retired.pin.take());
        self.retired.dirs.clear();
        let _ = mount(
            &self.root,
            dir,
            &self.stack[1..],
            &self.template,
            self.owner.as_deref(),
        );
    }
}

/// What a freeze took out of use: the unmounted overlay, still alive (pinned by a
/// detached copy of its mount) so that its teardown is not on the clone's path, and
/// the directories it wrote to. Dropping it tears the overlay down (which evicts
/// every entry the mount cached, about 1.5 µs a file, and syncs the file system under
/// it) and removes the directories.
#[derive(Debug)]
pub(crate) struct Retired {
    pin: Option<rustix::fd::OwnedFd>,
    dirs: Vec<PathBuf>,
}

impl Retired {
    /// Hands the teardown to a thread of the lowest priority, so that it takes no
    /// time from the work it was deferred past. Done here instead when there is no
    /// such thread, or when it is [`REAPER_BACKLOG`] teardowns behind.
    pub(crate) fn dispose(self) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::mpsc::Sender;
        use std::sync::{Mutex, OnceLock};
        static REAPER: OnceLock<Option<Mutex<Sender<Retired>>>> = OnceLock::new();
        static WAITING: AtomicUsize = AtomicUsize::new(0);
        let reaper = REAPER.get_or_init(|| {
            let (sender, retired) = std::sync::mpsc::channel::<Retired>();
            std::thread::Builder::new()
                .name("sandcell-reaper".to_owned())
                .spawn(move || {
                    // Linux's nice value is the calling thread's.
                    let _ = rustix::process::setpriority_process(None, 19);
                    for old in retired {
                        drop(old);
                        WAITING.fetch_sub(1, Ordering::Relaxed);
                    }
                })
                .ok()
                .map(|_| Mutex::new(sender))
        });
        let Some(reaper) = reaper else { return };
        if WAITING.fetch_add(1, Ordering::Relaxed) >= REAPER_BACKLOG {
            WAITING.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        // A send fails only if the thread is gone; the teardown is then done here.
        let _ = reaper.lock().unwrap_or_else(|p| p.into_inner()).send(self);
    }
}

/// How many teardowns [`Retired::dispose`] queues before it does them itself.
const REAPER_BACKLOG: usize = 64;

impl Drop for Retired {
    fn drop(&mut self) {
        drop(self.pin.take());
        for dir in &self.dirs {
            // Gone already where the sandbox was destroyed meanwhile.
            let _ = sandcell::raw::tree::remove_dir_all(dir);
        }
    }
}

/// Moves every entry of the directory `from` into the directory `to`, on the same
/// file system.
fn move_entries(from: &Path, to: &Path) -> Result<()> {
    // Listed whole first: a directory read while it changes may miss entries.
    let entries = fs::read_dir(from)
        .and_then(|entries| {
            entries
                .map(|entry| entry.map(|e| e.file_name()))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| Error::io(format_args!("listing {}", from.display()), e))?;
    for entry in entries {
        fs::rename(from.join(&entry), to.join(&entry)).map_err(|e| {
            Error::io(
                format_args!("moving {} into a frozen layer", entry.to_string_lossy()),
                e,
            )
        })?;
    }
    Ok(())
}

/// Removes those of `names` that no sandbox under `root` names any more. The caller
/// holds the [`lock`], and has removed the sandbox that named them.
pub(crate) fn release(root: &Path, names: &[String]) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let mut unused: Vec<&String> = names.iter().collect();
    let sandboxes = root.join("sandboxes");
    let entries = match fs::read_dir(&sandboxes) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Error::io(
                format_args!("listing {}", sandboxes.display()),
                e,
            ))
        }
    };
    for entry in entries.flatten() {
        if unused.is_empty() {
            return Ok(());
        }
        let text = match fs::read_to_string(entry.path().join(crate::layout::LAYERS_FILE)) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            // Unreadable: keep every layer rather than remove one in use.
            Err(e) => return Err(Error::io("reading the layers of a sandbox", e)),
        };
        unused.retain(|name| !text.lines().any(|line| line == name.as_str()));
    }
    for name in unused {
        let path = layer_path(root, name);
        match sandcell::raw::tree::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format_args!("removing {}", path.display()), e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
