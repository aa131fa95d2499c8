//! Making a workspace from a template (overlay mount or copy) and taking it down again.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};
use sandcell::{Error, ErrorKind, Result};

use crate::config::WorkspaceStrategy;
use crate::layout::SandboxDir;
use crate::owner::SandboxOwner;

/// Creates the sandbox's workspace from `template` and returns the strategy used
/// ("overlay" or "copy").
///
/// With an `owner` (a root backend's sandboxes), the workspace is the
/// owner's: an overlay's upper layer is, and its template is seen through an idmapped
/// view; a copy is given to it.
pub(crate) fn materialize(
    dir: &SandboxDir,
    template: &Path,
    strategy: WorkspaceStrategy,
    owner: Option<&SandboxOwner>,
) -> Result<&'static str> {
    let workspace = dir.workspace();
    if strategy == WorkspaceStrategy::InPlace {
        match owner {
            // The template itself, seen through a view as the owner's; destroy
            // unmounts the view and leaves the template.
            Some(owner) => {
                fs::create_dir(&workspace)
                    .map_err(|e| Error::io("creating the workspace directory", e))?;
                owner.view(template, &workspace, true)?;
            }
            // A link the workspace is opened through (once, by a trusted path);
            // removing the sandbox directory removes the link, never the template.
            None => std::os::unix::fs::symlink(template, &workspace)
                .map_err(|e| Error::io("linking the workspace to its template", e))?,
        }
        return Ok("in_place");
    }
    fs::create_dir_all(&workspace).map_err(|e| Error::io("creating the workspace directory", e))?;
    let copy = || {
        copy_tree(template, &workspace)?;
        match owner {
            Some(owner) => owner.chown_tree(&workspace),
            None => Ok(()),
        }
        .map(|()| "copy")
    };
    match strategy {
        WorkspaceStrategy::Copy | WorkspaceStrategy::InPlace => copy(),
        WorkspaceStrategy::Overlay => mount_overlay(dir, template, owner).map(|()| "overlay"),
        WorkspaceStrategy::Auto => match mount_overlay(dir, template, owner) {
            Ok(()) => Ok("overlay"),
            Err(e) => {
                tracing::info!(error = %e, "overlay mount not possible, copying the template instead");
                let _ = fs::remove_dir_all(dir.upper());
                let _ = fs::remove_dir_all(dir.work());
                copy()
            }
        },
    }
}

fn mount_overlay(dir: &SandboxDir, template: &Path, owner: Option<&SandboxOwner>) -> Result<()> {
    let mount = |lower: &Path| {
        sandcell::raw::overlay::mount(lower, &dir.upper(), &dir.work(), &dir.workspace())
    };
    let mounted = match owner {
        None => mount(template),
        Some(owner) => {
            // The upper layer is the overlay's root and takes every change: the owner's.
            fs::create_dir_all(dir.upper())
                .map_err(|e| Error::io("creating the upper layer", e))?;
            owner.chown(&dir.upper())?;
            with_view(dir, owner, template, mount)
        }
    };
    mounted.map_err(|e| match e.kind() {
        ErrorKind::Unsupported => Error::new(
            ErrorKind::Unsupported,
            format!("{e}, or use WorkspaceStrategy::Copy"),
        ),
        _ => e,
    })
}

/// Runs `f` with an idmapped view of `source` (see [`SandboxOwner::view`]) mounted in
/// the sandbox directory, then detaches the view: an overlay made over it in `f`
/// keeps its own reference to its layers.
pub(crate) fn with_view<T>(
    dir: &SandboxDir,
    owner: &SandboxOwner,
    source: &Path,
    f: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let at = dir.path().join("view");
    fs::create_dir(&at).map_err(|e| Error::io("creating a directory for a view", e))?;
    let result = owner.view(source, &at, false).and_then(|()| {
        let result = f(&at);
        let _ = rustix::mount::unmount(&at, UnmountFlags::DETACH);
        result
    });
    let _ = fs::remove_dir(&at);
    result
}

/// Bind-mounts the spec's host directories into the workspace, read-only where asked.
/// Runs at create time, before any sandbox process exists, with targets resolved
/// inside the workspace by the contained file operations. With an `owner`, each is an
/// idmapped view, so what root owns in it is the sandbox's; `group` is the sandbox's
/// own (`crate::sandbox_group`).
pub(crate) fn attach_mounts(
    dir: &SandboxDir,
    mounts: &[sandcell::Mount],
    owner: Option<&SandboxOwner>,
    group: Option<u32>,
) -> Result<()> {
    if mounts.is_empty() {
        return Ok(());
    }
    let ws = crate::contained::Workspace::open(&dir.workspace())?;
    for m in mounts {
        let meta = fs::metadata(&m.host)
            .map_err(|e| Error::io(format_args!("mount source {}", m.host.display()), e))?;
        if !meta.is_dir() {
            return Err(Error::invalid_input(format!(
                "mount source {} is not a directory",
                m.host.display()
            )));
        }
        let target = {
            // The mount point is made as the owner: the workspace may be a view that
            // shows nothing as root's. (The view itself is made as root.)
            let _owner = owner.map(|owner| owner.assume(group));
            ws.mkdir(&m.target)?;
            ws.resolve_dir(&m.target)?
        };
        match owner {
            Some(owner) => owner.view(&m.host, &target, !m.read_only)?,
            None => rustix::mount::mount_bind(&m.host, &target).map_err(|e| {
                Error::io(
                    format_args!("bind-mounting {} at {}", m.host.display(), m.target),
                    e.into(),
                )
            })?,
        }
        if m.read_only {
            rustix::mount::mount_remount(
                &target,
                MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                "",
            )
            .map_err(|e| Error::io(format_args!("making {} read-only", m.target), e.into()))?;
        }
    }
    Ok(())
}

/// Unmounts everything mounted beneath the sandbox directory (host mounts, then the
/// overlay), deepest first, and fails if anything is still mounted afterwards: the
/// directory must never be deleted while a host directory is mounted inside it.
pub(crate) fn unmount_all(dir: &SandboxDir) -> Result<()> {
    for _ in 0..3 {
        let mut points = mounts_beneath(dir.path());
        if points.is_empty() {
            return Ok(());
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for point in points {
            match rustix::mount::unmount(&point, UnmountFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
                Err(_) => {
                    let _ = rustix::mount::unmount(&point, UnmountFlags::DETACH);
                }
            }
        }
    }
    match mounts_beneath(dir.path()).first() {
        None => Ok(()),
        Some(left) => Err(Error::new(
            ErrorKind::Backend,
            format!(
                "{} is still mounted; refusing to delete the sandbox directory",
                left.display()
            ),
        )),
    }
}

/// Mount points at or beneath `root`, from /proc/self/mountinfo.
fn mounts_beneath(root: &Path) -> Vec<std::path::PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| std::path::PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(root))
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes (`\040`).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
