//! The mock's archive import: an archive checked and applied to a copy of a sandbox's
//! tree, which replaces the tree only once every entry has passed.

use bytes::Bytes;

use crate::archive::{self, EntryKind, ImportMode, ImportOptions};
use crate::error::{Error, Result};
use crate::path::SandboxPath;
use crate::raw::archive::{read_entries_with, EntryChecker};

use super::tree::*;

/// `files` with the archive `data` imported into `path`, as `options` say.
pub(super) fn imported(
    files: &Tree,
    path: &SandboxPath,
    data: Vec<u8>,
    options: ImportOptions,
) -> Result<Tree> {
    let dest = resolve(files, path, true)?;
    let mut files = files.clone();
    if !is_dir(&files, &dest) {
        if files.contains_key(&dest) {
            return Err(Error::invalid_input(format!("{path} is not a directory")));
        }
        add_parents(&mut files, &dest)?;
        files.insert(dest.clone(), Node::Dir { mode: 0o755 });
    }
    let mut checker = EntryChecker::new(options.limits);
    match options.mode {
        ImportMode::Replace => files.retain(|p, _| !p.starts_with(&dest) || *p == dest),
        _ => {
            for (p, node) in children(&files, &dest) {
                if matches!(node, Node::Symlink(_)) {
                    checker.assume_existing_symlink(
                        p.strip_prefix(&dest).unwrap_or_else(SandboxPath::root),
                    );
                }
            }
        }
    }
    let mut apply =
        |entry: &archive::CheckedEntry, content: &mut dyn std::io::Read| -> Result<()> {
            let target = if dest.is_root() {
                entry.path.clone()
            } else {
                dest.join(entry.path.as_str())?
            };
            add_parents(&mut files, &target)?;
            let node = match &entry.kind {
                EntryKind::File => {
                    let mut buf = Vec::with_capacity(entry.size as usize);
                    content
                        .read_to_end(&mut buf)
                        .map_err(|e| Error::io(format_args!("reading {}", entry.path), e))?;
                    Node::File {
                        data: Bytes::from(buf),
                        mode: entry.mode,
                    }
                }
                EntryKind::Dir => {
                    if let Some(Node::Dir { .. }) = files.get(&target) {
                        return Ok(());
                    }
                    Node::Dir { mode: entry.mode }
                }
                EntryKind::Symlink(t) => Node::Symlink(t.clone()),
                EntryKind::HardLink(src) => {
                    let src = if dest.is_root() {
                        src.clone()
                    } else {
                        dest.join(src.as_str())?
                    };
                    match files.get(&src) {
                        Some(n @ Node::File { .. }) => n.clone(),
                        _ => {
                            return Err(Error::permission_denied(format!(
                                "hard link {} has no file to point to",
                                entry.path
                            )))
                        }
                    }
                }
            };
            if let Some(Node::Dir { .. }) = files.get(&target) {
                files.retain(|p, _| !p.starts_with(&target));
            }
            files.insert(target, node);
            Ok(())
        };
    read_entries_with(
        checker,
        std::io::Cursor::new(data),
        &options.limits,
        &mut apply,
    )?;
    Ok(files)
}
