//! Recorded groups: verified by a process in them, never below 2, handed over to what a
//! command leaves running.

use super::*;
use std::os::unix::process::CommandExt;

/// A process started by the test in a group of its own, killed when dropped.
struct Started(std::process::Child);

impl Started {
    fn new(script: &str) -> Started {
        let child = std::process::Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Started(child)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        crate::process::signal_group(self.pid(), rustix::process::Signal::KILL);
        let _ = self.0.wait();
    }
}

#[test]
fn a_group_is_known_by_its_process_and_never_below_2() {
    let mut started = Started::new("exec sleep 300");
    let pid = started.pid();
    let dir = tempfile::tempdir().unwrap();
    let groups = Groups::new(dir.path());
    let leader = groups.add(pid).unwrap().unwrap();
    assert!(leader.verified());
    assert_eq!(groups.live(), vec![pid]);

    // Another process with the same pid (as after reuse) started at another time.
    let other = Member {
        start: leader.start + 1,
        ..leader
    };
    assert!(!other.verified());
    groups.forget(&leader);
    assert!(groups.recorded().is_empty());
    for name in [
        other.file_name(),
        "1-1-1-1".to_owned(),
        "0-0-0-0".to_owned(),
        format!("{pid}-1-1-1-1"),
        format!("-{pid}-{pid}-1-1"),
        format!("{pid}"),
        "junk".to_owned(),
    ] {
        std::fs::write(dir.path().join(GROUPS_DIR).join(name), "").unwrap();
    }
    assert_eq!(groups.recorded(), vec![other]);
    assert!(groups.live().is_empty(), "nothing unverified is live");
    for pid in [1, 0, -1, -pid] {
        assert_eq!(Member::of(pid), None, "{pid}");
    }
    // A new entry prunes the stale one.
    let mut second = Started::new("exec sleep 300");
    groups.add(second.pid()).unwrap().unwrap();
    assert_eq!(groups.live(), vec![second.pid()]);
    assert_eq!(groups.recorded().len(), 1, "the stale entry is pruned");

    crate::process::signal_group(pid, rustix::process::Signal::KILL);
    started.0.wait().unwrap();
    assert!(
        !leader.verified(),
        "a reaped leader's group is no longer its"
    );
    crate::process::signal_group(second.pid(), rustix::process::Signal::KILL);
    second.0.wait().unwrap();
}

#[test]
fn what_a_command_leaves_running_keeps_its_group_known() {
    let dir = tempfile::tempdir().unwrap();
    let groups = Groups::new(dir.path());

    // Ends at once, leaving nothing: forgotten.
    let mut quick = Started::new("exit 0");
    let leader = groups.add(quick.pid()).unwrap().unwrap();
    quick.0.wait().unwrap();
    groups.leader_reaped(&leader);
    assert!(groups.recorded().is_empty());

    // Ends, leaving a background job in its group: known by the job.
    let mut parent = Started::new("sleep 300 >/dev/null & echo $!");
    let pgid = parent.pid();
    let leader = groups.add(pgid).unwrap().unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut parent.0.stdout.take().unwrap(), &mut out).unwrap();
    parent.0.wait().unwrap();
    groups.leader_reaped(&leader);
    let job: i32 = out.trim().parse().unwrap();
    let recorded = groups.recorded();
    assert_eq!(recorded.len(), 1);
    assert_eq!((recorded[0].pgid, recorded[0].pid), (pgid, job));
    assert_eq!(groups.live(), vec![pgid]);
    crate::process::signal_group(pgid, rustix::process::Signal::KILL);
}
