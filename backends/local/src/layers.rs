//! Frozen layers: read-only layers that clones of overlay sandboxes share.
//!
//! A clone of an overlay sandbox that nothing holds open copies nothing. The source's
//! upper layer is *frozen*: unmounted, moved to `<root>/layers/<name>`, and stacked
//! as a read-only layer above the template for both sandboxes, each of which writes to
//! a fresh, empty upper layer of its own. Neither sees the other's writes, and no
//! file is copied, so a clone costs about what a create does, whatever the source
//! changed.
//!
//! ```text
//! <root>/layers/.lock     taken (flock) by whatever adds, names or removes a layer
//! <root>/layers/<name>/   a frozen upper layer, never written again
//! <root>/sandboxes/<id>/layers
//!                         the layers of that sandbox, top first, one name a line
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
use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use rustix::mount::UnmountFlags;
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

/// Mounts the sandbox's overlay over `names` and the template.
pub(crate) fn mount(
    root: &Path,
    dir: &SandboxDir,
    names: &[String],
    template: &Path,
) -> Result<()> {
    let lowers = lowers(root, names, template);
    let lowers: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
    let workspace = dir.workspace();
    fs::create_dir_all(&workspace).map_err(|e| Error::io("creating the workspace directory", e))?;
    sandcell::raw::overlay::mount_layers(&lowers, &dir.upper(), &dir.work(), &workspace)
}

/// The exclusive lock on the layers of a backend root, across processes; released
/// on drop.
pub(crate) struct LayersLock {
    _file: fs::File,
}

/// Takes the lock, waiting for another holder (a freeze or a destroy: milliseconds).
pub(crate) fn lock(root: &Path) -> Result<LayersLock> {
    let dir = layers_dir(root);
    fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format_args!("creating {}", dir.display()), e))?;
    let path = dir.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format_args!("opening {}", path.display()), e))?;
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
    let mut text = names.join("\n");
    text.push('\n');
    fs::write(dir.layers(), text).map_err(|e| Error::io("writing the layers of a sandbox", e))
}

/// Records the sandbox's frozen layers (atomically: a temp file renamed over).
pub(crate) fn write(dir: &SandboxDir, names: &[String]) -> Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir.path())
        .map_err(|e| Error::io("writing the layers of a sandbox", e))?;
    for name in names {
        writeln!(tmp, "{name}").map_err(|e| Error::io("writing the layers of a sandbox", e))?;
    }
    tmp.persist(dir.layers())
        .map_err(|e| Error::io("writing the layers of a sandbox", e.error))?;
    Ok(())
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
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.watching())
        .map_err(|e| Error::io("opening the watch lock of a sandbox", e))
}

/// What [`freeze`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frozen {
    /// The upper layer is now the named frozen layer, on top of the sandbox's stack.
    Layer(String),
    /// The upper layer holds nothing: the stack beneath it is the whole workspace, and
    /// nothing changed.
    Empty,
    /// Something holds the workspace (or the stack is full): nothing changed.
    Busy,
}

/// Freezes the upper layer of the sandbox in `dir`, whose stack is `names` over
/// `template`: it is unmounted (refused while anything holds it), moved under the
/// layers directory, and the sandbox remounted over it with an empty upper layer.
///
/// The caller holds the [`lock`] and keeps this process's own operations from opening
/// the workspace meanwhile; the sandbox's processes should be frozen. On an error the
/// sandbox is put back as it was, wherever that is still possible.
pub(crate) fn freeze(
    root: &Path,
    dir: &SandboxDir,
    names: &[String],
    template: &Path,
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
    let mut frozen = vec![name.clone()];
    frozen.extend(names.iter().cloned());
    {
        // Checked before anything changes: the stack must stay mountable.
        let lowers = lowers(root, &frozen, template);
        let lowers: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
        if !sandcell::raw::overlay::layers_fit(&lowers, &dir.upper(), &dir.work()) {
            return Ok(Frozen::Busy);
        }
    }
    // Watched (here or in another process): leave it mounted. Held until the end, so
    // no watch starts meanwhile.
    let watching = open_watching(dir)?;
    match rustix::fs::flock(&watching, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(Frozen::Busy),
        Err(e) => return Err(Error::io("checking for watches", e.into())),
    }
    match rustix::mount::unmount(dir.workspace(), UnmountFlags::empty()) {
        Ok(()) => {}
        Err(rustix::io::Errno::BUSY) => return Ok(Frozen::Busy),
        Err(e) => {
            return Err(Error::io(
                format_args!("unmounting {}", dir.workspace().display()),
                e.into(),
            ))
        }
    }
    let layer = layer_path(root, &name);
    if let Err(e) = fs::rename(dir.upper(), &layer) {
        let _ = mount(root, dir, names, template);
        return Err(Error::io("freezing an upper layer", e));
    }
    let remounted = (|| {
        fs::create_dir(dir.upper()).map_err(|e| Error::io("making a new upper layer", e))?;
        mount(root, dir, &frozen, template)?;
        if let Err(e) = write(dir, &frozen) {
            let _ = rustix::mount::unmount(dir.workspace(), UnmountFlags::empty());
            return Err(e);
        }
        Ok(())
    })();
    if let Err(e) = remounted {
        // Back as it was: the old upper layer in place, mounted over the old stack.
        let _ = fs::remove_dir(dir.upper());
        if fs::rename(&layer, dir.upper()).is_ok() {
            let _ = mount(root, dir, names, template);
        }
        return Err(e);
    }
    Ok(Frozen::Layer(name))
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
        match fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format_args!("removing {}", path.display()), e)),
        }
    }
    Ok(())
}
