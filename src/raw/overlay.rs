//! Overlay workspaces on this host: a shared read-only lower directory, a private upper
//! layer per sandbox, and the changes the upper layer holds. The local backend's
//! overlay workspaces and Docker's host-directory workspaces are both made here.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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
/// `InvalidInput` for a path overlayfs cannot take ([`has_unsafe_chars`]);
/// `Unsupported` when the kernel refuses the mount (no root or `CAP_SYS_ADMIN`, no
/// overlayfs, an upper file system it cannot use).
pub fn mount(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    for path in [lower, upper, work] {
        if has_unsafe_chars(path) {
            return Err(Error::invalid_input(format!(
                "{} contains ',', ':' or '\\', which overlayfs cannot take",
                path.display()
            )));
        }
    }
    for d in [upper, work] {
        fs::create_dir_all(d)
            .map_err(|e| Error::io(format_args!("creating {}", d.display()), e))?;
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off",
        lower.display(),
        upper.display(),
        work.display()
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
    // The overlay root takes the upper dir's mode; keep the lower's.
    if let Ok(meta) = fs::metadata(lower) {
        let _ = fs::set_permissions(
            target,
            fs::Permissions::from_mode(meta.permissions().mode() & 0o777),
        );
    }
    Ok(())
}

/// Lower-layer paths an upper layer deletes: whiteouts (0:0 character devices) and
/// opaque directories (which hide everything of the lower layer beneath them), sorted.
pub fn upper_deletions(upper: &Path) -> Result<Vec<SandboxPath>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut deleted = Vec::new();
    let mut stack = vec![upper.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir)
            .map_err(|e| Error::io(format_args!("reading {}", dir.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format_args!("reading {}", dir.display()), e))?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path)
                .map_err(|e| Error::io(format_args!("inspecting {}", path.display()), e))?;
            let rel = || -> Result<SandboxPath> {
                let rel = path.strip_prefix(upper).unwrap_or(&path);
                SandboxPath::new(&rel.to_string_lossy())
            };
            if meta.file_type().is_char_device() && meta.rdev() == 0 {
                deleted.push(rel()?);
            } else if meta.is_dir() {
                if is_opaque(&path) {
                    deleted.push(rel()?);
                }
                stack.push(path);
            }
        }
    }
    deleted.sort();
    Ok(deleted)
}

fn is_opaque(dir: &Path) -> bool {
    ["trusted.overlay.opaque", "user.overlay.opaque"]
        .iter()
        .any(|name| {
            let mut value = [0u8; 4];
            matches!(rustix::fs::lgetxattr(dir, *name, &mut value), Ok(n) if value[..n] == *b"y")
        })
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
