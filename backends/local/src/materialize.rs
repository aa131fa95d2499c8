//! Making a workspace from a template (overlay mount or copy) and taking it down again.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};
use sandcell::{Error, ErrorKind, Result};

use crate::config::WorkspaceStrategy;
use crate::layout::SandboxDir;

/// Creates the sandbox's workspace from `template` and returns the strategy used
/// ("overlay" or "copy").
pub(crate) fn materialize(
    dir: &SandboxDir,
    template: &Path,
    strategy: WorkspaceStrategy,
) -> Result<&'static str> {
    let workspace = dir.workspace();
    fs::create_dir_all(&workspace).map_err(|e| Error::io("creating the workspace directory", e))?;
    match strategy {
        WorkspaceStrategy::Copy => copy_tree(template, &workspace).map(|()| "copy"),
        WorkspaceStrategy::Overlay => mount_overlay(dir, template).map(|()| "overlay"),
        WorkspaceStrategy::Auto => match mount_overlay(dir, template) {
            Ok(()) => Ok("overlay"),
            Err(e) => {
                tracing::info!(error = %e, "overlay mount not possible, copying the template instead");
                let _ = fs::remove_dir_all(dir.upper());
                let _ = fs::remove_dir_all(dir.work());
                copy_tree(template, &workspace).map(|()| "copy")
            }
        },
    }
}

fn mount_overlay(dir: &SandboxDir, template: &Path) -> Result<()> {
    let (upper, work, workspace) = (dir.upper(), dir.work(), dir.workspace());
    for d in [&upper, &work] {
        fs::create_dir_all(d)
            .map_err(|e| Error::io(format_args!("creating {}", d.display()), e))?;
    }
    if crate::config::has_overlay_unsafe_chars(dir.path()) {
        return Err(Error::invalid_input(format!(
            "sandbox path {} contains ',', ':' or '\\\\', which overlayfs cannot take",
            dir.path().display()
        )));
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        template.display(),
        upper.display(),
        work.display()
    );
    let options = std::ffi::CString::new(options)
        .map_err(|_| Error::invalid_input("overlay mount options contain a NUL byte"))?;
    rustix::mount::mount(
        "overlay",
        &workspace,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(options.as_c_str()),
    )
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Unsupported,
                format!("mounting an overlay workspace failed ({e}); mounting needs root or CAP_SYS_ADMIN, or use WorkspaceStrategy::Copy"),
                std::io::Error::from(e),
            )
        })?;
    // The overlay root takes the upper dir's mode; keep the template's.
    if let Ok(meta) = fs::metadata(template) {
        let _ = fs::set_permissions(
            &workspace,
            fs::Permissions::from_mode(meta.permissions().mode() & 0o777),
        );
    }
    Ok(())
}

/// Template paths an overlay upper layer deletes: whiteouts (0:0 character devices)
/// and opaque directories (which hide everything of the template beneath them).
pub(crate) fn upper_deletions(upper: &Path) -> Result<Vec<sandcell::SandboxPath>> {
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
            let rel = || -> Result<sandcell::SandboxPath> {
                let rel = path.strip_prefix(upper).unwrap_or(&path);
                sandcell::SandboxPath::new(&rel.to_string_lossy())
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

/// Unmounts the workspace if it is a mount point; succeeds if it is not mounted.
pub(crate) fn unmount(dir: &SandboxDir) -> Result<()> {
    let workspace = dir.workspace();
    match rustix::mount::unmount(&workspace, UnmountFlags::empty()) {
        Ok(()) => Ok(()),
        // Not a mount point (copy strategy, or already unmounted), or gone.
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(rustix::io::Errno::BUSY) => rustix::mount::unmount(&workspace, UnmountFlags::DETACH)
            .map_err(|e| Error::io(format_args!("unmounting {}", workspace.display()), e.into())),
        Err(e) => Err(Error::io(
            format_args!("unmounting {}", workspace.display()),
            e.into(),
        )),
    }
}

/// Copies a template tree: files with their modes, directories, symlinks as links;
/// special files are skipped.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        let entries = fs::read_dir(&src)
            .map_err(|e| Error::io(format_args!("reading {}", src.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format_args!("reading {}", src.display()), e))?;
            let (s, d) = (entry.path(), dst.join(entry.file_name()));
            let ft = entry
                .file_type()
                .map_err(|e| Error::io(format_args!("inspecting {}", s.display()), e))?;
            if ft.is_dir() {
                fs::create_dir(&d)
                    .map_err(|e| Error::io(format_args!("creating {}", d.display()), e))?;
                stack.push((s, d));
            } else if ft.is_file() {
                fs::copy(&s, &d)
                    .map_err(|e| Error::io(format_args!("copying {}", s.display()), e))?;
            } else if ft.is_symlink() {
                let target = fs::read_link(&s)
                    .map_err(|e| Error::io(format_args!("reading link {}", s.display()), e))?;
                std::os::unix::fs::symlink(target, &d)
                    .map_err(|e| Error::io(format_args!("creating link {}", d.display()), e))?;
            }
        }
        let mode = fs::metadata(&src)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0o755);
        fs::set_permissions(&dst, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io(format_args!("setting mode of {}", dst.display()), e))?;
    }
    Ok(())
}
