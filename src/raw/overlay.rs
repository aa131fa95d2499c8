//! Overlay workspaces on this host: a shared read-only lower directory, a private upper
//! layer per sandbox, and the changes the upper layer holds. The local backend's
//! overlay workspaces and Docker's host-directory workspaces are both made here.

use std::ffi::{CStr, OsStr};
use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::MountFlags;

use crate::backend::Changes;
use crate::error::{Error, ErrorKind, Result};
use crate::path::SandboxPath;

/// Whether `path` holds a character overlayfs mount options cannot carry (`,`, `:`,
/// `\`): such a path cannot be a layer.
pub fn has_unsafe_chars(path: &Path) -> bool {
    path.to_string_lossy().contains([',', ':', '\\'])
}

/// `path` checked as an overlay's shared lower layer, and made canonical: the
/// backends' template and project directories.
///
/// # Errors
/// As the path fails to resolve (`NotFound` for a missing one); `InvalidInput` for a
/// path that is not a directory or holds a character overlayfs cannot take
/// ([`has_unsafe_chars`]).
pub fn lower_dir(path: &Path) -> Result<PathBuf> {
    let canonical = fs::canonicalize(path).map_err(|e| Error::io(path.display(), e))?;
    if !canonical.is_dir() {
        return Err(Error::invalid_input(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    if has_unsafe_chars(&canonical) {
        return Err(Error::invalid_input(format!(
            "{} contains ',', ':' or '\\', which overlayfs cannot take",
            canonical.display()
        )));
    }
    Ok(canonical)
}

/// Mounts an overlay of `lower` (read-only, shared) and `upper` (private; `work` is
/// overlayfs's scratch directory on the same file system) at `target`. `upper` and
/// `work` are created when missing; the mount is `nosuid,nodev`, and its root keeps
/// `lower`'s mode.
///
/// `redirect_dir=off` whatever the kernel's default: a renamed lower directory is then
/// copied up whole, so the upper layer alone holds every change and [`changes`] never
/// needs to follow a redirect into the lower one.
///
/// # Errors
/// `NotFound` (or another I/O error) for a layer that cannot be opened;
/// `Unsupported` when the kernel refuses the mount (no root or `CAP_SYS_ADMIN`, no
/// overlayfs, an upper file system it cannot use).
pub fn mount(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    mount_layers(&[lower], upper, work, target)
}

/// [`mount`] over a chain of read-only layers, `lowers[0]` on top and the last one at
/// the bottom (the template, whose mode the root keeps). The frozen layers a clone
/// shares with its source sit between the template and the upper layer.
///
/// # Errors
/// As [`mount`]; `InvalidInput` also for no lower layer, or for a chain whose mount
/// options do not fit the page the kernel reads them from ([`layers_fit`]).
pub fn mount_layers(lowers: &[&Path], upper: &Path, work: &Path, target: &Path) -> Result<()> {
    if !layers_fit(lowers, upper, work) {
        return Err(Error::invalid_input(format!(
            "an overlay of {} lower layers does not fit the {MAX_OPTIONS} bytes of mount \
             options mount(2) reads",
            lowers.len()
        )));
    }
    for d in [upper, work] {
        fs::create_dir_all(d)
            .map_err(|e| Error::io(format_args!("creating {}", d.display()), e))?;
    }
    // Each layer is named to the kernel by a descriptor of this process's rather than
    // by its path: overlayfs shows its options as given in every mount table that
    // lists it, the sandbox's own included, and a host path there tells a sandbox
    // where its files are on the host.
    let layers = lowers
        .iter()
        .copied()
        .chain([upper, work])
        .map(|layer| {
            rustix::fs::open(
                layer,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Error::io(format_args!("opening layer {}", layer.display()), e.into()))
        })
        .collect::<Result<Vec<_>>>()?;
    let named = |fd: &std::os::fd::OwnedFd| {
        use std::os::fd::AsRawFd;
        format!("/proc/self/fd/{}", fd.as_raw_fd())
    };
    let (lower_fds, rest) = layers.split_at(lowers.len());
    let lowerdir = lower_fds.iter().map(named).collect::<Vec<_>>().join(":");
    let options = format!(
        "lowerdir={lowerdir},upperdir={},workdir={},redirect_dir=off",
        named(&rest[0]),
        named(&rest[1])
    );
    let options = std::ffi::CString::new(options)
        .map_err(|_| Error::invalid_input("overlay mount options contain a NUL byte"))?;
    rustix::mount::mount(
        "overlay",
        target,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(options.as_c_str()),
    )
    .map_err(|e| {
        Error::with_source(
            ErrorKind::Unsupported,
            format!(
                "mounting an overlay workspace failed ({e}); mounting needs root or CAP_SYS_ADMIN"
            ),
            std::io::Error::from(e),
        )
    })?;
    // The overlay root takes the upper dir's mode; keep the bottom layer's.
    if let Some(meta) = lowers.last().and_then(|bottom| fs::metadata(bottom).ok()) {
        let _ = fs::set_permissions(
            target,
            fs::Permissions::from_mode(meta.permissions().mode() & 0o777),
        );
    }
    Ok(())
}

/// Whether an overlay of these layers can be mounted at all: there is a lower layer,
/// and the options naming every layer by descriptor fit in the one page `mount(2)`
/// reads them from (about 150 lower layers).
pub fn layers_fit(lowers: &[&Path], upper: &Path, work: &Path) -> bool {
    let _ = (upper, work);
    !lowers.is_empty() && options_len(lowers.len()) <= MAX_OPTIONS
}

/// The longest mount options `mount(2)` takes: one page, its NUL included.
const MAX_OPTIONS: usize = 4095;

/// The most the options of an overlay of `lowers` layers named by descriptor can take:
/// each descriptor's number at its widest.
fn options_len(lowers: usize) -> usize {
    const LAYER: usize = "/proc/self/fd/".len() + 10;
    "lowerdir=".len()
        + lowers * (LAYER + 1)
        + ",upperdir=".len()
        + LAYER
        + ",workdir=".len()
        + LAYER
        + ",redirect_dir=off".len()
}

/// Lower-layer paths an upper layer deletes: whiteouts (0:0 character devices) and
/// opaque directories (which hide everything of the lower layer beneath them), sorted.
///
/// The layer is walked through descriptors (see `walk_layer`), so a sandbox changing its
/// upper layer meanwhile cannot lead the walk out of it.
pub fn upper_deletions(upper: &Path) -> Result<Vec<SandboxPath>> {
    let mut deleted = Vec::new();
    walk_layer(upper, &mut |rel, dir, name, st| {
        let kind = FileType::from_raw_mode(st.st_mode);
        let deletes = match kind {
            FileType::CharacterDevice => st.st_rdev == 0,
            FileType::Directory => is_opaque(dir, name),
            _ => false,
        };
        if deletes {
            deleted.push(SandboxPath::new(&rel.to_string_lossy())?);
        }
        Ok(())
    })?;
    deleted.sort();
    Ok(deleted)
}

/// Calls `visit` with every entry beneath the host directory `layer`: its path
/// relative to `layer`, its directory's descriptor, its name and its status (not
/// following a symlink). Each directory is opened from `layer`'s descriptor with no
/// symlink followed on the way, so the walk holds two descriptors at a time and never
/// leaves `layer`; one swapped for a symlink mid-walk fails it.
fn walk_layer(
    layer: &Path,
    visit: &mut dyn FnMut(&Path, BorrowedFd<'_>, &CStr, &rustix::fs::Stat) -> Result<()>,
) -> Result<()> {
    let root = rustix::fs::open(
        layer,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format_args!("reading {}", layer.display()), e.into()))?;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let reading = |e: Errno| {
            Error::io(
                format_args!("reading {}", layer.join(&rel_dir).display()),
                e.into(),
            )
        };
        let dir = crate::archive::pack::open_beneath(root.as_fd(), &rel_dir).map_err(reading)?;
        for name in super::tree::list_names(dir.as_fd()).map_err(reading)? {
            let rel = rel_dir.join(OsStr::from_bytes(name.to_bytes()));
            let st = match rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => {
                    return Err(Error::io(
                        format_args!("inspecting {}", rel.display()),
                        e.into(),
                    ))
                }
            };
            visit(&rel, dir.as_fd(), &name, &st)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                stack.push(rel);
            }
        }
    }
    Ok(())
}

/// Whether directory `name` of `dir` is marked opaque. Only the `trusted.` mark counts:
/// every overlay here is mounted by root, where overlayfs writes that one and keeps a
/// sandbox from setting it, while a `user.overlay.opaque` is an ordinary extended
/// attribute any sandbox process may set on its own directories.
fn is_opaque(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    let Ok(fd) = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut value = [0u8; 4];
    matches!(rustix::fs::fgetxattr(&fd, c"trusted.overlay.opaque", &mut value), Ok(n) if value[..n] == *b"y")
}

/// The changes an upper layer holds, as `export_changes` returns them: its files as a
/// tar (whiteouts left out) and the lower paths it deletes.
pub async fn changes(upper: PathBuf) -> Result<Changes> {
    let deleted = {
        let upper = upper.clone();
        tokio::task::spawn_blocking(move || upper_deletions(&upper))
            .await
            .map_err(|e| {
                Error::with_source(
                    ErrorKind::Backend,
                    "listing an upper layer's deletions failed",
                    e,
                )
            })??
    };
    let tar = super::stream::writer_to_stream(move |out| {
        crate::archive::pack::pack_dir_tar(&upper, out).map(|_| ())
    });
    Ok(super::changes(tar, deleted))
}

/// The changes of a stack of layers over a template, as `export_changes` returns them:
/// `merged` is the mounted view, open (an `O_PATH` descriptor will do; it is read
/// through, and held until the tar is written, so the mount cannot go meanwhile),
/// `layers` every layer above the template (the upper one and the frozen ones beneath
/// it, in any order).
///
/// The deleted paths are every layer's whiteouts and opaque directories: one a higher
/// layer brought back is in the tar too, and a restore deletes before it unpacks. The
/// tar holds what the merged view shows at every path some layer holds, so a file a
/// higher layer deleted is left out, and one it changed is read as it is now.
pub async fn changes_of_layers(
    merged: std::os::fd::OwnedFd,
    layers: Vec<PathBuf>,
) -> Result<Changes> {
    let (deleted, touched) = tokio::task::spawn_blocking(move || {
        let mut deleted = Vec::new();
        let mut touched = std::collections::HashSet::new();
        for layer in &layers {
            deleted.extend(upper_deletions(layer)?);
            collect_paths(layer, &mut touched)?;
        }
        deleted.sort();
        deleted.dedup();
        Ok::<_, Error>((deleted, touched))
    })
    .await
    .map_err(|e| {
        Error::with_source(
            ErrorKind::Backend,
            "listing the layers of a workspace failed",
            e,
        )
    })??;
    let tar = super::stream::writer_to_stream(move |out| {
        use std::os::fd::AsRawFd;
        // Every path is resolved through the descriptor, whatever is mounted where now.
        let through = PathBuf::from(format!("/proc/self/fd/{}", merged.as_raw_fd()));
        let packed =
            crate::archive::pack::pack_selected_tar(&through, out, &|rel| touched.contains(rel));
        drop(merged);
        packed.map(|_| ())
    });
    Ok(super::changes(tar, deleted))
}

/// Adds the path (relative to `layer`) of every entry beneath `layer` to `paths`.
fn collect_paths(layer: &Path, paths: &mut std::collections::HashSet<PathBuf>) -> Result<()> {
    walk_layer(layer, &mut |rel, _, _, _| {
        paths.insert(rel.to_path_buf());
        Ok(())
    })
}
