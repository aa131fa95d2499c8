//! The mock's file watching: every change to a sandbox's tree, reported to the watches
//! that cover it.

use crate::path::SandboxPath;
use crate::watch::{WatchEvent, WatchEventKind, WatchSender};

use super::tree::{same_node, Node, Tree};
use super::MockSandbox;

/// One live watch on a sandbox.
#[derive(Debug)]
pub(super) struct MockWatch {
    pub(super) dir: SandboxPath,
    pub(super) recursive: bool,
    pub(super) sender: WatchSender,
}

impl MockWatch {
    fn covers(&self, path: &SandboxPath) -> bool {
        path != &self.dir
            && path.starts_with(&self.dir)
            && (self.recursive || path.parent().as_ref() == Some(&self.dir))
    }
}

impl MockSandbox {
    /// Replaces the tree with `files`, reporting every difference to the watches.
    pub(super) fn commit(&mut self, files: Tree) {
        if !self.watches.is_empty() {
            for event in diff(&self.files, &files) {
                self.notify(event);
            }
        }
        self.files = files;
    }

    /// Replaces the tree with `files`, in which `from` was moved to `to`.
    pub(super) fn commit_rename(&mut self, files: Tree, from: &SandboxPath, to: &SandboxPath) {
        self.watches.retain_mut(|w| {
            let event = match (w.covers(from), w.covers(to)) {
                (true, true) => WatchEvent::renamed(from.clone(), to.clone()),
                (true, false) => WatchEvent::new(WatchEventKind::Removed, from.clone()),
                (false, true) => WatchEvent::new(WatchEventKind::Created, to.clone()),
                (false, false) => return !w.sender.is_closed(),
            };
            w.sender.send(event)
        });
        self.files = files;
    }

    fn notify(&mut self, event: WatchEvent) {
        self.watches
            .retain_mut(|w| !w.covers(&event.path) || w.sender.send(event.clone()));
    }
}

/// What changed from `old` to `new`: removals deepest first, then creations and
/// changes parents first.
fn diff(old: &Tree, new: &Tree) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    for (path, before) in old.iter().rev() {
        let replaced = new
            .get(path)
            .is_some_and(|now| std::mem::discriminant(now) != std::mem::discriminant(before));
        if !new.contains_key(path) || replaced {
            events.push(WatchEvent::new(WatchEventKind::Removed, path.clone()));
        }
    }
    for (path, now) in new {
        let kind = match old.get(path) {
            None => WatchEventKind::Created,
            Some(before) if std::mem::discriminant(now) != std::mem::discriminant(before) => {
                WatchEventKind::Created
            }
            Some(before) if same_node(before, now) => continue,
            Some(Node::File { data, .. }) if matches!(now, Node::File { data: d, .. } if d != data) => {
                WatchEventKind::Modified
            }
            Some(Node::Symlink(_)) => WatchEventKind::Created,
            Some(_) => WatchEventKind::Attributes,
        };
        events.push(WatchEvent::new(kind, path.clone()));
    }
    events
}
