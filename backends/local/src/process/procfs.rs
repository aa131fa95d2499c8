//! Processes as `/proc` shows them: a process's parent, group and start time, the
//! living descendants of a command, and the process groups a command's tree holds.

use rustix::process::{Pid, Signal};

/// What `/proc/<pid>/stat` says of a process that matters here.
pub(super) struct ProcStat {
    pid: i32,
    /// Field 3: `R`, `S`, `T` (stopped), `Z` (zombie) ...
    pub(super) state: char,
    /// Field 4.
    ppid: i32,
    /// Field 5.
    pgrp: i32,
}

pub(super) fn proc_stat(pid: i32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; fields follow the last ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    Some(ProcStat {
        pid,
        state: fields.next()?.chars().next()?,
        ppid: fields.next()?.parse().ok()?,
        pgrp: fields.next()?.parse().ok()?,
    })
}

/// Every process this host (or container) shows in `/proc`.
pub(super) fn all_processes() -> impl Iterator<Item = ProcStat> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_stat)
}

/// The processes beneath `leader` that have not exited (zombies left out).
pub(super) fn living_descendants(leader: i32) -> Vec<i32> {
    let mut children: std::collections::HashMap<i32, Vec<ProcStat>> = Default::default();
    for process in all_processes() {
        children.entry(process.ppid).or_default().push(process);
    }
    let mut found = Vec::new();
    let mut queue = vec![leader];
    while let Some(parent) = queue.pop() {
        for child in children.get(&parent).map_or(&[][..], Vec::as_slice) {
            queue.push(child.pid);
            if child.state != 'Z' {
                found.push(child.pid);
            }
        }
    }
    found
}

/// The group `pgid` as the kernel's calls take it, refusing ids below 2: `kill(-1)`
/// would signal every process this one may, and 0 or a negative id some other process
/// or group than the one meant.
fn group(pgid: i32) -> Option<Pid> {
    Pid::from_raw(pgid.max(0)).filter(|_| pgid > 1)
}

/// Sends `signal` to every process of the group; a group that is gone is not an error.
pub(crate) fn signal_group(pgid: i32, signal: Signal) {
    if let Some(pid) = group(pgid) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// The processes of group `pgid`.
pub(crate) fn group_members(pgid: i32) -> Vec<i32> {
    if group(pgid).is_none() {
        return Vec::new();
    }
    all_processes()
        .filter(|p| p.pgrp == pgid)
        .map(|p| p.pid)
        .collect()
}

/// The process groups of `leader`'s children other than its own.
pub(super) fn child_groups(leader: i32) -> Vec<i32> {
    let mut groups: Vec<i32> = all_processes()
        .filter(|p| p.ppid == leader && p.pgrp != leader)
        .map(|p| p.pgrp)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// Whether any process of the group is still there (zombies included).
pub(crate) fn group_alive(pgid: i32) -> bool {
    match group(pgid) {
        Some(pid) => rustix::process::test_kill_process_group(pid).is_ok(),
        None => false,
    }
}
