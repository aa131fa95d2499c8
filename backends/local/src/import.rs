//! Archive import into a workspace: unpacked into a hidden staging directory beside
//! the destination (same file system), checked entry by entry, then moved into place.

use std::path::PathBuf;

use sandcell::archive::{ImportMode, ImportOptions};
use sandcell::{Error, ErrorKind, FileKind, Result, SandboxPath};

use crate::contained::Workspace;

/// Unpacks into a hidden staging directory inside the workspace (same file system, so
/// the final moves are renames), then moves the result into place. Every check runs
/// before anything outside the staging directory changes.
pub(crate) fn import(
    ws: &Workspace,
    dest: &SandboxPath,
    reader: impl std::io::Read,
    options: ImportOptions,
) -> Result<()> {
    let dest = match ws.stat(dest) {
        Ok(info) if info.kind == FileKind::Dir => real_path(ws, dest)?,
        Ok(info) if info.kind == FileKind::Symlink => real_path(ws, dest)?,
        Ok(_) => {
            return Err(Error::invalid_input(format!(
                "cannot import into {dest}: it is not a directory"
            )))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => dest.clone(),
        Err(e) => return Err(e),
    };
    let staging_name = format!(".sandcell-import-{}", uuid::Uuid::new_v4().simple());
    let staging = SandboxPath::new(&staging_name)?;
    let merge = options.mode != ImportMode::Replace;
    sandcell::raw::archive::unpack_to_dir_with(
        reader,
        &ws.root_path().join(&staging_name),
        &options.limits,
        |entry| {
            if merge {
                let target = dest.join(entry.path.as_str())?;
                if let Some(link) = ws.symlink_ancestor(&target)? {
                    return Err(Error::permission_denied(format!(
                    "archive entry {} would be written through the symlink {link} already in the workspace",
                    entry.path
                )));
                }
            }
            Ok(())
        },
    )?;
    let moved = (|| {
        ws.mkdir(&dest)?;
        if !merge {
            // The staging directory may itself sit in `dest` (a restore into the root).
            for entry in ws
                .list_dir(&dest)?
                .into_iter()
                .filter(|e| e.path != staging)
            {
                ws.remove(&entry.path, true)?;
            }
        }
        move_tree(ws, &staging, &dest)
    })();
    let cleaned = ws.remove(&staging, true);
    moved?;
    cleaned
}

/// The path `path` resolves to inside the workspace (following in-workspace links).
fn real_path(ws: &Workspace, path: &SandboxPath) -> Result<SandboxPath> {
    let host: PathBuf = ws.resolve_dir(path)?;
    let rel = host
        .strip_prefix(ws.root_path())
        .map_err(|_| Error::permission_denied(format!("{path} resolves outside the workspace")))?;
    SandboxPath::new(&rel.to_string_lossy())
}

/// Moves everything in `from` into `to`, merging directories and replacing the rest.
fn move_tree(ws: &Workspace, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
    for entry in ws.list_dir(from)? {
        let target = to.join(&entry.name)?;
        let existing = match ws.stat(&target) {
            Ok(info) => Some(info.kind),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        match (entry.kind, existing) {
            (FileKind::Dir, Some(FileKind::Dir)) => move_tree(ws, &entry.path, &target)?,
            (_, Some(_)) => {
                ws.remove(&target, true)?;
                ws.rename(&entry.path, &target)?;
            }
            (_, None) => ws.rename(&entry.path, &target)?,
        }
    }
    Ok(())
}
