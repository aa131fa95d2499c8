//! Per-sandbox control groups: membership a process cannot leave with `setsid`, a kill
//! that reaches every member, freezing, and pids/memory/cpu limits.
//!
//! Works on pure cgroup v2 and on hybrid hosts (v2 for membership, kill and freeze;
//! v1 `pids`, `memory` and `cpu` hierarchies for limits). Sandbox cgroups are created
//! beneath the cgroup this process is in, and their paths are stored with the sandbox,
//! so another process can find them again.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use sandcell::{Error, Limits, Result, SandboxId};
use serde::{Deserialize, Serialize};

/// Where each usable hierarchy is, for this process.
#[derive(Debug, Clone, Default)]
pub(crate) struct CgroupRoots {
    /// cgroup v2: membership, `cgroup.kill`, `cgroup.freeze`; limits if its controllers are on.
    unified: Option<PathBuf>,
    /// v1 hierarchies for limits on hybrid hosts.
    pids_v1: Option<PathBuf>,
    memory_v1: Option<PathBuf>,
    cpu_v1: Option<PathBuf>,
}

impl CgroupRoots {
    /// Finds the mounted hierarchies this process can create children in.
    pub(crate) fn detect() -> Self {
        let mut roots = CgroupRoots::default();
        let (Ok(mountinfo), Ok(own)) = (
            std::fs::read_to_string("/proc/self/mountinfo"),
            std::fs::read_to_string("/proc/self/cgroup"),
        ) else {
            return roots;
        };
        // "hierarchy-id:controllers:path" per line; v2 is "0::path".
        let own_path = |controller: &str| -> Option<String> {
            own.lines().find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
                let matches = if controller.is_empty() {
                    ctrls.is_empty()
                } else {
                    ctrls.split(',').any(|c| c == controller)
                };
                matches.then(|| path.to_owned())
            })
        };
        for line in mountinfo.lines() {
            // Fields: ... mount-point ... " - " fstype source super-options
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).unwrap_or_default();
            let mut right = right.split(' ');
            let fstype = right.next().unwrap_or_default();
            let options = right.nth(1).unwrap_or_default();
            let base = |rel: Option<String>| {
                rel.map(|r| Path::new(mount_point).join(r.trim_start_matches('/')))
                    .filter(|p| writable(p))
            };
            match fstype {
                "cgroup2" => roots.unified = base(own_path("")),
                "cgroup" => {
                    for controller in ["pids", "memory", "cpu"] {
                        if options.split(',').any(|o| o == controller) {
                            let found = base(own_path(controller));
                            match controller {
                                "pids" => roots.pids_v1 = roots.pids_v1.take().or(found),
                                "memory" => roots.memory_v1 = roots.memory_v1.take().or(found),
                                _ => roots.cpu_v1 = roots.cpu_v1.take().or(found),
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        roots
    }

    /// Whether sandboxes get a cgroup at all.
    pub(crate) fn available(&self) -> bool {
        self.unified.is_some()
    }

    /// Whether every limit kind in [`Limits`] can be enforced.
    pub(crate) fn enforces_limits(&self) -> bool {
        let v2 = |c: &str| self.unified.as_deref().is_some_and(|u| v2_controller(u, c));
        self.available()
            && (self.pids_v1.is_some() || v2("pids"))
            && (self.memory_v1.is_some() || v2("memory"))
            && (self.cpu_v1.is_some() || v2("cpu"))
    }

    /// Creates the sandbox's cgroups and applies `limits`. A limit no hierarchy can
    /// enforce is `Unsupported`, and nothing is left behind.
    pub(crate) fn create(&self, id: &SandboxId, limits: &Limits) -> Result<Option<SandboxCgroups>> {
        let Some(unified) = &self.unified else {
            if limits.pids.is_some() || limits.memory_bytes.is_some() || limits.cpu_millis.is_some()
            {
                return Err(Error::unsupported(
                    "backend local cannot enforce cpu, memory or pids limits here: no writable cgroup v2 hierarchy (are you root?)",
                ));
            }
            return Ok(None);
        };
        let leaf = |root: &Path| root.join("sandcell").join(id.as_str());
        let mut cg = SandboxCgroups {
            unified: leaf(unified),
            pids: None,
            memory: None,
            cpu: None,
        };
        let result = (|| {
            make_dir(&cg.unified)?;
            if let Some(max) = limits.pids {
                cg.pids = Some(self.limit_dir(&cg.unified, &self.pids_v1, "pids", id)?);
                write_file(cg.pids.as_deref(), "pids.max", &max.to_string())?;
            }
            // Each directory is recorded before anything is written to it, so a write
            // that fails leaves nothing behind (`remove` takes what is recorded).
            if let Some(bytes) = limits.memory_bytes {
                let dir = self.limit_dir(&cg.unified, &self.memory_v1, "memory", id)?;
                cg.memory = Some(dir.clone());
                let file = if dir == cg.unified {
                    "memory.max"
                } else {
                    "memory.limit_in_bytes"
                };
                write_file(Some(&dir), file, &bytes.to_string())?;
            }
            if let Some(millis) = limits.cpu_millis {
                let dir = self.limit_dir(&cg.unified, &self.cpu_v1, "cpu", id)?;
                cg.cpu = Some(dir.clone());
                let quota = u64::from(millis) * 100; // microseconds per 100 ms period
                if dir == cg.unified {
                    write_file(Some(&dir), "cpu.max", &format!("{quota} 100000"))?;
                } else {
                    write_file(Some(&dir), "cpu.cfs_period_us", "100000")?;
                    write_file(Some(&dir), "cpu.cfs_quota_us", &quota.to_string())?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(Some(cg)),
            Err(e) => {
                cg.remove();
                Err(e)
            }
        }
    }

    /// The directory enforcing `controller`: the v2 leaf if v2 has it on, else a v1 leaf.
    fn limit_dir(
        &self,
        v2_leaf: &Path,
        v1_root: &Option<PathBuf>,
        controller: &str,
        id: &SandboxId,
    ) -> Result<PathBuf> {
        if let Some(parent) = v2_leaf.parent() {
            if v2_controller(parent, controller) || enable_v2_controller(parent, controller) {
                return Ok(v2_leaf.to_path_buf());
            }
        }
        let Some(root) = v1_root else {
            return Err(Error::unsupported(format!(
                "backend local cannot enforce the {controller} limit here: the {controller} cgroup controller is not available"
            )));
        };
        let dir = root.join("sandcell").join(id.as_str());
        make_dir(&dir)?;
        Ok(dir)
    }
}

/// One sandbox's cgroup directories, stored in its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SandboxCgroups {
    pub(crate) unified: PathBuf,
    pub(crate) pids: Option<PathBuf>,
    pub(crate) memory: Option<PathBuf>,
    pub(crate) cpu: Option<PathBuf>,
}

impl SandboxCgroups {
    fn dirs(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.unified.as_path())
            .chain(self.pids.as_deref())
            .chain(self.memory.as_deref().filter(|m| *m != self.unified))
            .chain(self.cpu.as_deref().filter(|c| *c != self.unified))
    }

    /// `cgroup.procs` of every directory, opened for a child to join before it execs.
    pub(crate) fn join_fds(&self) -> Result<Vec<OwnedFd>> {
        self.dirs().map(procs_fd).collect()
    }

    /// A cgroup of one command's own beneath the sandbox's v2 cgroup (limits still
    /// apply from above): whatever the command starts stays in it, `setsid` and double
    /// forks included, so a timeout or kill can end all of it.
    pub(crate) fn command(&self) -> Result<CommandCgroup> {
        let dir = self.unified.join(format!(
            "cmd-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..16]
        ));
        make_dir(&dir)?;
        Ok(CommandCgroup { dir })
    }

    /// Like [`join_fds`](Self::join_fds), joining `command`'s v2 cgroup instead of the
    /// sandbox's own.
    pub(crate) fn join_fds_for(&self, command: &CommandCgroup) -> Result<Vec<OwnedFd>> {
        std::iter::once(command.dir.as_path())
            .chain(self.dirs().skip(1))
            .map(procs_fd)
            .collect()
    }

    /// Kills every member, its commands' cgroups included, and waits (up to `wait`)
    /// until none is left.
    pub(crate) fn kill_all(&self, wait: Duration) {
        kill_tree(&self.unified, wait);
    }

    /// What the cgroups account for now: CPU time (v2 `cpu.stat`, kept for processes
    /// that ended), memory in use (v2 `memory.current` or v1 `memory.usage_in_bytes`,
    /// where a memory controller is on) and the processes in them.
    pub(crate) fn usage(&self) -> Usage {
        let cpu_time = std::fs::read_to_string(self.unified.join("cpu.stat"))
            .ok()
            .and_then(|stat| {
                stat.lines().find_map(|line| {
                    let micros = line.strip_prefix("usage_usec ")?.trim().parse().ok()?;
                    Some(Duration::from_micros(micros))
                })
            });
        let read_u64 = |path: PathBuf| -> Option<u64> {
            std::fs::read_to_string(path).ok()?.trim().parse().ok()
        };
        let memory_bytes = read_u64(self.unified.join("memory.current")).or_else(|| {
            self.memory
                .as_ref()
                .and_then(|dir| read_u64(dir.join("memory.usage_in_bytes")))
        });
        Usage {
            cpu_time,
            memory_bytes,
            processes: subtree_pids(&self.unified).len() as u64,
        }
    }

    /// Freezes (`true`) or thaws the cgroup; `false` if this kernel has no v2 freezer.
    pub(crate) fn freeze(&self, frozen: bool) -> Result<bool> {
        let file = self.unified.join("cgroup.freeze");
        if !file.exists() {
            return Ok(false);
        }
        std::fs::write(&file, if frozen { "1" } else { "0" })
            .map_err(|e| Error::io(format_args!("writing {}", file.display()), e))?;
        Ok(true)
    }

    /// Freezes the sandbox's processes, if it has any and this kernel has the v2
    /// freezer, until the guard drops: what a clone reads is then one moment of it.
    pub(crate) fn frozen_while_held(&self) -> Option<ThawOnDrop<'_>> {
        if !self.is_populated() {
            return None;
        }
        self.frozen()
    }

    /// [`SandboxCgroups::frozen_while_held`] for a caller that knows the sandbox has
    /// processes.
    pub(crate) fn frozen(&self) -> Option<ThawOnDrop<'_>> {
        matches!(self.freeze(true), Ok(true)).then_some(ThawOnDrop(self))
    }

    /// Whether any process is in the sandbox's cgroups.
    pub(crate) fn is_populated(&self) -> bool {
        populated(&self.unified)
    }

    /// Removes the directories, the commands' cgroups first; best effort. A process
    /// that joined after the last kill keeps a directory busy, so busy means kill
    /// again, then retry.
    pub(crate) fn remove(&self) {
        if let Ok(children) = std::fs::read_dir(&self.unified) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                CommandCgroup { dir: child.path() }.remove_when_empty(Duration::from_secs(1));
            }
        }
        for dir in self.dirs() {
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                        self.kill_all(Duration::from_millis(100));
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Thaws what [`SandboxCgroups::frozen_while_held`] froze.
pub(crate) struct ThawOnDrop<'a>(&'a SandboxCgroups);

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.freeze(false);
    }
}

/// A reading of [`SandboxCgroups::usage`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) cpu_time: Option<Duration>,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) processes: u64,
}

/// One command's cgroup (see [`SandboxCgroups::command`]).
#[derive(Debug)]
pub(crate) struct CommandCgroup {
    dir: PathBuf,
}

impl CommandCgroup {
    /// Sends `signal` to every member.
    pub(crate) fn signal_all(&self, signal: rustix::process::Signal) {
        for pid in subtree_pids(&self.dir) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, signal);
            }
        }
    }

    /// Whether no process is left in it.
    pub(crate) fn is_empty(&self) -> bool {
        !populated(&self.dir)
    }

    /// Kills every member and waits (up to `wait`) until none is left.
    pub(crate) fn kill_all(&self, wait: Duration) {
        kill_tree(&self.dir, wait);
    }

    /// Removes the cgroup if it is (or, within `wait`, becomes) empty; a command's
    /// background processes that outlived it keep it until the sandbox goes.
    pub(crate) fn remove_when_empty(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        while populated(&self.dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Drop for CommandCgroup {
    /// Removes the cgroup if it is empty (rmdir(2) refuses one that is not): a
    /// command that never started leaves nothing, and one whose background processes
    /// outlived it keeps its cgroup until the sandbox is reset or destroyed.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn procs_fd(dir: &Path) -> Result<OwnedFd> {
    let path = dir.join("cgroup.procs");
    rustix::fs::open(&path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| Error::io(format_args!("opening {}", path.display()), e.into()))
}

/// The processes in cgroup `dir` and every cgroup beneath it.
fn subtree_pids(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            pids.extend(subtree_pids(&child.path()));
        }
    }
    pids
}

/// Whether any process is in `dir` or beneath it (`cgroup.events` says so in one read
/// where the kernel has it).
fn populated(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => events.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => !subtree_pids(dir).is_empty(),
    }
}

/// Kills every process in `dir` and beneath it (`cgroup.kill` where the kernel has it,
/// which forks cannot outrun), and waits up to `wait` until none is left.
fn kill_tree(dir: &Path, wait: Duration) {
    let kill_file = dir.join("cgroup.kill");
    let has_kill_file = kill_file.exists();
    let deadline = Instant::now() + wait;
    while populated(dir) && Instant::now() <= deadline {
        if has_kill_file {
            let _ = std::fs::write(&kill_file, "1");
        } else {
            for pid in subtree_pids(dir) {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn writable(path: &Path) -> bool {
    rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_ok()
}

fn v2_controller(dir: &Path, controller: &str) -> bool {
    std::fs::read_to_string(dir.join("cgroup.subtree_control"))
        .is_ok_and(|s| s.split_whitespace().any(|c| c == controller))
}

/// Turns a v2 controller on for `dir`'s children, if the parent offers it.
fn enable_v2_controller(dir: &Path, controller: &str) -> bool {
    let offered = std::fs::read_to_string(dir.join("cgroup.controllers"))
        .is_ok_and(|s| s.split_whitespace().any(|c| c == controller));
    offered && std::fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}")).is_ok()
}

fn make_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format_args!("creating cgroup {}", dir.display()), e))
}

fn write_file(dir: Option<&Path>, file: &str, value: &str) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    let path = dir.join(file);
    // The error names the limit, not the host's cgroup path: it reaches clients.
    std::fs::write(&path, value).map_err(|e| {
        Error::io(
            format_args!("setting the sandbox's limit {file} to {value}"),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit the kernel refuses at its write (a CPU quota of 0, which a spec's
    /// validation stops sooner) leaves none of the sandbox's directories behind, in
    /// the v2 leaf or a v1 hierarchy: each is recorded before the first write to it.
    #[test]
    fn a_refused_limit_leaves_no_cgroup_behind() {
        let roots = CgroupRoots::detect();
        let Some(unified) = roots.unified.clone() else {
            let missing = Err("no writable cgroup hierarchy (run as root)".to_owned());
            sandcell::testing::require_or_skip("CGROUPS", "cgroups", missing);
            return;
        };
        let id = SandboxId::generate("cgtest");
        let limits = Limits::new().cpu_millis(0);
        let err = roots.create(&id, &limits).unwrap_err();
        // It reaches clients: the limit is named, the host's cgroup path is not.
        assert!(err.to_string().contains("cpu"), "{err}");
        assert!(!err.to_string().contains("/sys/"), "{err}");
        let leaves = [Some(unified), roots.cpu_v1.clone()]
            .into_iter()
            .flatten()
            .map(|root| root.join("sandcell").join(id.as_str()));
        for leaf in leaves {
            assert!(!leaf.exists(), "{} was left behind: {err}", leaf.display());
        }
    }
}
