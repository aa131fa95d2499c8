//! The disk-usage walk: the right figure for wide, deep and hostile trees, with few
//! descriptors.

use super::*;
use rustix::fs::{Mode, OFlags};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::symlink;
use std::path::Path;

/// A file of `size` bytes at `name` in directory `dir`.
fn file_at(dir: BorrowedFd<'_>, name: &str, size: usize) -> u64 {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    rustix::io::write(&fd, &vec![b'x'; size]).unwrap();
    size as u64
}

/// A comb `depth` levels deep beneath `root`: at each level a leaf directory `a` with a
/// file of one byte, and the next level, named `name_len` bytes of `z` (so the walk
/// comes back up through each level with work left there). Made a level at a time
/// from the one above, holding one descriptor, so no path grows past `PATH_MAX`.
/// Answers the bytes it wrote.
fn comb(root: &Path, depth: usize, name_len: usize) -> u64 {
    let open = |dir: BorrowedFd<'_>, name: &str| {
        rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    };
    let next = "z".repeat(name_len);
    let mut dir = open(rustix::fs::CWD, root.to_str().unwrap());
    let mut bytes = 0;
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, "a", Mode::from_raw_mode(0o755)).unwrap();
        bytes += file_at(dir.as_fd(), "a/f", 1);
        rustix::fs::mkdirat(&dir, next.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        dir = open(dir.as_fd(), &next);
    }
    bytes
}

/// `count` directories side by side in `root`, every hundredth with a file of 3 bytes.
fn wide(root: &Path, count: usize) -> u64 {
    let mut bytes = 0;
    for i in 0..count {
        let dir = root.join(format!("w{i}"));
        std::fs::create_dir(&dir).unwrap();
        if i % 100 == 0 {
            std::fs::write(dir.join("f"), b"abc").unwrap();
            bytes += 3;
        }
    }
    bytes
}

#[test]
fn the_figure_counts_each_file_once_and_follows_no_link() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("big"), vec![0u8; 100_000]).unwrap();

    let mut expected = 0;
    std::fs::write(root.join("top"), b"12345").unwrap();
    expected += 5;
    expected += wide(&root, 300);
    let deep = root.join("deep");
    std::fs::create_dir(&deep).unwrap();
    // Names long enough that coming back up means a path past `PATH_MAX`.
    expected += comb(&deep, 100, 250);
    symlink(outside.path(), root.join("out")).unwrap();
    symlink(outside.path().join("big"), root.join("big")).unwrap();
    symlink("deep", root.join("loop")).unwrap();

    let ws = Workspace::open(&root).unwrap();
    assert_eq!(ws.disk_usage().unwrap(), expected);
}

/// Run as a process of its own whose descriptor limit is 64, so a walk that held one
/// descriptor per directory waiting or per level could not open them and came out
/// short. 3,000 directories side by side are past even the usual limit of 1,024 (the
/// issue's 30,000 cost this disk a minute and a half to remove, and show nothing more).
#[test]
fn a_few_descriptors_are_enough_for_any_tree() {
    const CHILD: &str = "SANDCELL_TEST_FEW_DESCRIPTORS";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "contained::usage::tests::a_few_descriptors_are_enough_for_any_tree",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    // Alone in this process (the test above started it for this test only).
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let mut expected = wide(&root, 3_000);
    let deep = root.join("deep");
    std::fs::create_dir(&deep).unwrap();
    expected += comb(&deep, 2_000, 1);
    let ws = Workspace::open(&root).unwrap();

    // Only the soft limit, so it can be raised again: removing the tree afterwards
    // holds a descriptor per level, and at 64 it would leave the tree behind.
    let nofile = rustix::process::Resource::Nofile;
    let before = rustix::process::getrlimit(nofile);
    let low = rustix::process::Rlimit {
        current: Some(64),
        maximum: before.maximum,
    };
    rustix::process::setrlimit(nofile, low).unwrap();
    let usage = ws.disk_usage();
    rustix::process::setrlimit(nofile, before).unwrap();
    assert_eq!(usage.unwrap(), expected);
    drop(ws);
    dir.close().unwrap();
}
