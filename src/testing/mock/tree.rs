//! The mock's file tree: paths resolved the way a kernel would, entries as `FileInfo`,
//! and subtrees written as tar.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::archive::entry_header;
use crate::error::{Error, Result};
use crate::fs::{FileInfo, FileKind};
use crate::path::SandboxPath;

/// One entry of a sandbox's tree.
#[derive(Debug, Clone)]
pub(super) enum Node {
    File { data: Bytes, mode: u32 },
    Dir { mode: u32 },
    Symlink(String),
}

/// A sandbox's files, by path.
pub(super) type Tree = BTreeMap<SandboxPath, Node>;

pub(super) fn add_parents(tree: &mut Tree, path: &SandboxPath) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = path.parent();
    while let Some(dir) = p {
        if dir.is_root() {
            break;
        }
        match tree.get(&dir) {
            Some(Node::Dir { .. }) => break,
            Some(_) => {
                return Err(Error::invalid_input(format!(
                    "{dir} is not a directory (needed for {path})"
                )))
            }
            None => missing.push(dir.clone()),
        }
        p = dir.parent();
    }
    for dir in missing {
        tree.insert(dir, Node::Dir { mode: 0o755 });
    }
    Ok(())
}

pub(super) fn escape(path: &SandboxPath) -> Error {
    Error::permission_denied(format!("{path} resolves outside the workspace"))
}

/// Resolves symlinks in `path` the way the kernel would, refusing to leave the root.
pub(super) fn resolve(tree: &Tree, path: &SandboxPath, follow_last: bool) -> Result<SandboxPath> {
    let mut resolved: Vec<String> = Vec::new();
    let mut pending: VecDeque<String> = path.components().map(str::to_owned).collect();
    let mut hops = 0;
    while let Some(component) = pending.pop_front() {
        match component.as_str() {
            "" | "." => continue,
            ".." => {
                if resolved.pop().is_none() {
                    return Err(escape(path));
                }
                continue;
            }
            _ => resolved.push(component),
        }
        let current = SandboxPath::new(&resolved.join("/"))?;
        if let Some(Node::Symlink(target)) = tree.get(&current) {
            if pending.is_empty() && !follow_last {
                break;
            }
            hops += 1;
            if hops > 40 {
                return Err(Error::invalid_input(format!(
                    "{path}: too many levels of symbolic links"
                )));
            }
            if target.starts_with('/') {
                return Err(escape(path));
            }
            resolved.pop();
            let mut next: VecDeque<String> = target.split('/').map(str::to_owned).collect();
            next.extend(pending);
            pending = next;
        }
    }
    SandboxPath::new(&resolved.join("/"))
}

pub(super) fn is_dir(tree: &Tree, path: &SandboxPath) -> bool {
    path.is_root() || matches!(tree.get(path), Some(Node::Dir { .. }))
}

pub(super) fn children<'a>(
    tree: &'a Tree,
    dir: &'a SandboxPath,
) -> impl Iterator<Item = (&'a SandboxPath, &'a Node)> + 'a {
    tree.range(dir.clone()..)
        .skip_while(move |(p, _)| *p == dir)
        .take_while(move |(p, _)| p.starts_with(dir))
}

pub(super) fn info_of(path: SandboxPath, node: &Node) -> FileInfo {
    match node {
        Node::File { data, mode } => FileInfo::new(path, FileKind::File, data.len() as u64, *mode),
        Node::Dir { mode } => FileInfo::new(path, FileKind::Dir, 0, *mode),
        Node::Symlink(target) => FileInfo::new(path, FileKind::Symlink, target.len() as u64, 0o777)
            .symlink_target(Some(target.clone())),
    }
}

pub(super) fn not_found(path: &SandboxPath) -> Error {
    Error::not_found(format!("{path} does not exist"))
}

/// Writes nodes (paths relative to the archive root) as a tar archive.
pub(super) fn write_tar<'a>(
    nodes: impl Iterator<Item = (SandboxPath, &'a Node)>,
) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (rel, node) in nodes {
        let res = match node {
            Node::File { data, mode } => {
                let mut h = entry_header(tar::EntryType::Regular, *mode, data.len() as u64, 0);
                builder.append_data(&mut h, rel.as_str(), &data[..])
            }
            Node::Dir { mode } => {
                let mut h = entry_header(tar::EntryType::Directory, *mode, 0, 0);
                builder.append_data(&mut h, rel.as_str(), std::io::empty())
            }
            Node::Symlink(target) => {
                let mut h = entry_header(tar::EntryType::Symlink, 0o777, 0, 0);
                builder.append_link(&mut h, rel.as_str(), target)
            }
        };
        res.map_err(|e| Error::io(format_args!("archiving {rel}"), e))?;
    }
    builder
        .into_inner()
        .map_err(|e| Error::io("finishing archive", e))
}

pub(super) fn kind_of(node: &Node) -> FileKind {
    match node {
        Node::File { .. } => FileKind::File,
        Node::Dir { .. } => FileKind::Dir,
        Node::Symlink(_) => FileKind::Symlink,
    }
}

pub(super) fn same_node(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (Node::File { data: x, mode: m }, Node::File { data: y, mode: n }) => x == y && m == n,
        (Node::Dir { mode: m }, Node::Dir { mode: n }) => m == n,
        (Node::Symlink(x), Node::Symlink(y)) => x == y,
        _ => false,
    }
}
