//! The process groups a sandbox without cgroups is known by, so destroy, reset, pause
//! and metrics reach its processes from any process sharing the root.
//!
//! A group id alone names nothing for long: once the group's last process is gone its
//! number can be any new process's, of any program of the same user, and a stale `1`
//! would make `kill(-1)` of it (ADVERSARIAL 47). So a group is recorded by a process in
//! it, as the kernel knows that process (pid, session, start time in clock ticks after
//! boot), and signalled only while that very process is still in it: while one of its
//! processes is, the kernel gives the group's id to no one else, and no process outside
//! the sandbox's session can join it. Ids below 2 are never signalled.
//!
//! A command's group is recorded by its leader while the leader lives. When the leader
//! is reaped, its entry goes; the processes still in the group then (background jobs of
//! a command that ended) are recorded instead, a few of them, so reset and destroy
//! still reach them. Entries whose process is gone are pruned.
//!
//! The entries are empty files in `<sandbox>/process-groups/`, named
//! `<pgid>-<pid>-<session>-<start>`: adding and removing one is a single `open` or
//! `unlink`, so processes sharing the root need no lock and a crash leaves no
//! half-written list. The `groups` file of older versions (bare ids) cannot be
//! verified and is ignored.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sandcell::{Error, Result};

/// The directory of a sandbox's group entries, in its sandbox directory.
pub(crate) const GROUPS_DIR: &str = "process-groups";

/// How many of the processes a command leaves in its group record it after the leader
/// is gone: enough that the group outlives a few of them exiting.
const REMAINING: usize = 4;

/// A process in a group, as `/proc/<pid>/stat` describes it: with the start time, a pid
/// names one process only, since a pid is reused only after its process is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// Field 5: its process group.
    pub(crate) pgid: i32,
    pid: i32,
    /// Field 6: its session.
    session: i32,
    /// Field 22: when it started.
    start: u64,
}

impl Member {
    /// Process `pid` as it is now, or `None` if it is gone (or `pid` is not above 1, or
    /// its group is not: neither names anything that could be a sandbox's).
    pub(crate) fn of(pid: i32) -> Option<Member> {
        if pid <= 1 {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses; fields follow the last ')',
        // the first of them field 3.
        let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        let member = Member {
            pgid: fields.get(2)?.parse().ok()?,
            pid,
            session: fields.get(3)?.parse().ok()?,
            start: fields.get(19)?.parse().ok()?,
        };
        (member.pgid > 1).then_some(member)
    }

    /// Whether the group is verifiably still the one recorded: this very process (the
    /// same start time and session) is still in it. A zombie counts: it keeps its pid
    /// and group until it is reaped.
    pub(crate) fn verified(&self) -> bool {
        Member::of(self.pid).is_some_and(|now| now == *self)
    }

    fn file_name(&self) -> String {
        format!("{}-{}-{}-{}", self.pgid, self.pid, self.session, self.start)
    }

    fn parse(name: &str) -> Option<Member> {
        let mut parts = name.split('-');
        let member = Member {
            pgid: parts.next()?.parse().ok()?,
            pid: parts.next()?.parse().ok()?,
            session: parts.next()?.parse().ok()?,
            start: parts.next()?.parse().ok()?,
        };
        (parts.next().is_none() && member.pgid > 1 && member.pid > 1).then_some(member)
    }
}

/// One sandbox's entries.
#[derive(Debug, Clone)]
pub(crate) struct Groups {
    dir: PathBuf,
}

impl Groups {
    /// The entries of the sandbox whose directory is `sandbox`.
    pub(crate) fn new(sandbox: &Path) -> Groups {
        Groups {
            dir: sandbox.join(GROUPS_DIR),
        }
    }

    /// Records the group `leader` leads, and returns its entry for
    /// [`Groups::leader_reaped`]; call it before the leader can be reaped (its parent
    /// has not waited for it yet). `None` if `leader` leads no group any more.
    pub(crate) fn add(&self, leader: i32) -> Result<Option<Member>> {
        let Some(member) = Member::of(leader).filter(|m| m.pgid == leader) else {
            return Ok(None);
        };
        self.prune();
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("recording a process group", e)),
        }
        self.record(&member)
            .map_err(|e| Error::io("recording a process group", e))?;
        Ok(Some(member))
    }

    fn record(&self, member: &Member) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.dir.join(member.file_name()))
            .map(drop)
    }

    /// The group's leader was reaped: from here its pid, and the group's id once the
    /// group is empty, may be another process's. The group is recorded by the processes
    /// still in it instead, if any; it is forgotten otherwise.
    pub(crate) fn leader_reaped(&self, leader: &Member) {
        if crate::process::group_alive(leader.pgid) {
            for member in crate::process::group_members(leader.pgid)
                .into_iter()
                .filter_map(Member::of)
                .filter(|m| m.pgid == leader.pgid)
                .take(REMAINING)
            {
                if let Err(e) = self.record(&member) {
                    tracing::debug!(error = %e, "could not record a process group");
                }
            }
        }
        self.forget(leader);
    }

    /// Removes an entry. One already gone is not an error, and one that cannot be
    /// removed only lingers unverifiable.
    pub(crate) fn forget(&self, member: &Member) {
        if let Err(e) = std::fs::remove_file(self.dir.join(member.file_name())) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(error = %e, "could not forget a process group");
            }
        }
    }

    /// Every entry, verified or not.
    pub(crate) fn recorded(&self) -> Vec<Member> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| Member::parse(e.file_name().to_str()?))
            .collect()
    }

    /// The ids of the groups that are verifiably still the sandbox's
    /// ([`Member::verified`]): the only ones ever signalled.
    pub(crate) fn live(&self) -> Vec<i32> {
        let mut live: Vec<i32> = self
            .recorded()
            .into_iter()
            .filter(Member::verified)
            .map(|member| member.pgid)
            .collect();
        live.sort_unstable();
        live.dedup();
        live
    }

    /// Forgets the entries whose process is gone, so they do not pile up.
    fn prune(&self) {
        for member in self.recorded() {
            if !member.verified() {
                self.forget(&member);
            }
        }
    }
}

#[cfg(test)]
mod tests;
