//! The group of a sandbox's own at `Isolation::Landlock` under root: the only group that
//! may pass through the sandbox's directory, so no other sandbox reaches anything
//! beneath it, not even what Landlock leaves unmediated (ADVERSARIAL 37).
//!
//! Every sandbox of a root backend runs as the same owner uid ([`crate::owner`]), and
//! a Landlock ruleset does not mediate file metadata (stat, chmod, utime, readlink) or
//! connecting to a path-named Unix socket: with only the ruleset, a sandbox that
//! learned a neighbour's id (mount tables and `/proc/<pid>/cgroup` name them) could
//! change the modes of the neighbour's files or talk to its servers. So each sandbox's
//! directory `sandboxes/<id>` is `0710`, root's, with a group of its own, and its
//! commands hold that group as their one supplementary group: a neighbour's commands
//! may not search the directory, and no path beneath it resolves for them. The host
//! reaches a sandbox's files as root, or through descriptors it opened as root.
//!
//! The groups are the [`GROUPS`] ids after the owner's gid. A group is free when no
//! directory in `sandboxes/` has it and no process holds it (one that outlived its
//! sandbox, where no cgroup ended it); the backend picks one while holding a lock, so
//! its own concurrent creates never share one.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sandcell::{Error, ErrorKind, Result, SandboxId};

/// How many groups follow the owner's gid: as many sandboxes as one root backend may
/// hold at once at `Isolation::Landlock`.
pub(crate) const GROUPS: u32 = 65_536;

/// The groups of a root backend's sandboxes at `Isolation::Landlock`.
#[derive(Debug)]
pub(crate) struct SandboxGroups {
    /// The first of the [`GROUPS`] ids.
    first: u32,
    /// Held from picking a group until a directory has it.
    picking: std::sync::Mutex<()>,
}

impl SandboxGroups {
    /// The groups after `owner_gid`; fails where this process's user namespace does
    /// not map them all, or the host's group database names one of them (a sandbox
    /// holding it would be a member of that group).
    pub(crate) fn after(owner_gid: u32) -> Result<SandboxGroups> {
        let first = owner_gid
            .checked_add(1)
            .filter(|first| first.checked_add(GROUPS).is_some())
            .ok_or_else(|| {
                Error::invalid_input(format!(
                    "a root backend at Isolation::Landlock gives each sandbox one of the {GROUPS} \
                     group ids after its owner's ({owner_gid}), which runs past the largest id; \
                     choose a smaller LocalConfig::sandbox_uid"
                ))
            })?;
        let last = first + (GROUPS - 1);
        if !crate::owner::range_is_mapped("gid_map", first, last) {
            return Err(Error::unsupported(format!(
                "a root backend at Isolation::Landlock gives each sandbox one of the group ids \
                 {first} to {last}, which this process's user namespace does not all map (see \
                 /proc/self/gid_map); choose a LocalConfig::sandbox_uid whose next {GROUPS} ids \
                 it maps"
            )));
        }
        if let Some(name) = known_group_in(first, last) {
            return Err(Error::invalid_input(format!(
                "a root backend at Isolation::Landlock gives each sandbox one of the group ids \
                 {first} to {last}, but /etc/group names {name} among them: a sandbox holding \
                 it would be a member; choose another LocalConfig::sandbox_uid"
            )));
        }
        Ok(SandboxGroups {
            first,
            picking: std::sync::Mutex::new(()),
        })
    }

    /// Gives the new sandbox directory `dir` (in `sandboxes`) a group no other sandbox
    /// directory there has, making it `0710` and root's; answers the group.
    pub(crate) fn assign(&self, id: &SandboxId, sandboxes: &Path, dir: &Path) -> Result<u32> {
        let _picking = self.picking.lock().unwrap_or_else(|p| p.into_inner());
        let mut taken = std::collections::HashSet::new();
        let entries = std::fs::read_dir(sandboxes)
            .map_err(|e| Error::io("listing the sandboxes' groups", e))?;
        for entry in entries.flatten() {
            if let Ok(meta) = entry.metadata() {
                taken.insert(meta.gid());
            }
        }
        // A process of a destroyed sandbox that outlived it (without cgroups, one that
        // left its session is not killed) still holds that sandbox's group.
        taken.extend(held_by_processes());
        // Start where the (random) id points, so picks rarely meet.
        let start = id
            .as_str()
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
            % GROUPS;
        let group = (0..GROUPS)
            .map(|k| self.first + (start + k) % GROUPS)
            .find(|gid| !taken.contains(gid))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::LimitExceeded,
                    format!(
                        "every one of the {GROUPS} sandbox groups is in use: this backend holds \
                         as many sandboxes at Isolation::Landlock as it can"
                    ),
                )
            })?;
        let failed = |e| Error::io("giving the sandbox directory its group", e);
        std::os::unix::fs::lchown(dir, Some(0), Some(group)).map_err(failed)?;
        let passage = std::os::unix::fs::PermissionsExt::from_mode(crate::root_dir::PASSAGE);
        std::fs::set_permissions(dir, passage).map_err(failed)?;
        Ok(group)
    }
}

/// The supplementary groups of every process on the host (`/proc/<pid>/status`).
fn held_by_processes() -> std::collections::HashSet<u32> {
    let mut held = std::collections::HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return held;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if let Some(groups) = status.lines().find_map(|l| l.strip_prefix("Groups:")) {
            held.extend(
                groups
                    .split_whitespace()
                    .filter_map(|g| g.parse::<u32>().ok()),
            );
        }
    }
    held
}

/// The name of a group in `/etc/group` whose id is between `first` and `last`.
fn known_group_in(first: u32, last: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let gid: u32 = fields.nth(1)?.parse().ok()?;
        (first..=last).contains(&gid).then(|| name.to_owned())
    })
}
