//! Trees of any depth through the host-side tree walks (`raw::tree`): a sandbox makes
//! a chain of directories tens of thousands deep with `mkdir d; cd d` in a loop, and
//! the copy (clones), the removal (destroy, file API, staging clean-up) and `std`'s
//! `remove_dir_all` they replace must neither recurse (a thread's stack overflowing
//! aborts the whole host process) nor hold a descriptor per level (the host process
//! runs out, failing every other sandbox's calls).

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Deeper than a 2 MiB stack (tokio's threads) takes a recursive walk through:
/// `std::fs::remove_dir_all` gave out between 10,000 and 20,000 levels.
const DEPTH: usize = 25_000;

/// The descriptors a walk may hold on top of what the process had: a few per side.
const SPARE_FDS: u64 = 48;

/// A temporary directory on tmpfs (`/dev/shm`) where this host has one: a disk-backed
/// file system that journals every `mkdir` and `rmdir` (CI's takes about a millisecond
/// each) spends minutes on the chains here.
fn fast_tempdir() -> tempfile::TempDir {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let shm = Path::new("/dev/shm");
    let on_tmpfs = rustix::fs::statfs(shm).is_ok_and(|fs| fs.f_type as u64 == TMPFS_MAGIC);
    match on_tmpfs.then(|| tempfile::tempdir_in(shm)) {
        Some(Ok(dir)) => dir,
        _ => tempfile::tempdir().unwrap(),
    }
}

fn open_dir(dir: impl AsFd, name: &str) -> OwnedFd {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

/// Makes `root/d/d/.../d/bottom`, `depth` directories deep.
fn make_chain(root: &Path, depth: usize) {
    let mut dir =
        rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        dir = open_dir(&dir, "d");
    }
    rustix::fs::openat(
        &dir,
        "bottom",
        OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
}

/// How deep the chain at `root` goes, and whether its bottom file is there.
fn measure_chain(root: &Path) -> (usize, bool) {
    let mut dir =
        rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let mut depth = 0;
    while let Ok(next) = rustix::fs::openat(
        &dir,
        "d",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        dir = next;
        depth += 1;
    }
    let bottom = rustix::fs::statat(&dir, "bottom", rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok();
    (depth, bottom)
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// Runs `f` on a thread with tokio's stack size, as the backends' blocking calls run.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn copies_and_removals_of_a_deep_chain_neither_recurse_nor_hold_a_descriptor_per_level() {
    let base = fast_tempdir();
    let src = base.path().join("src");
    std::fs::create_dir(&src).unwrap();
    make_chain(&src, DEPTH);

    // Every walk below runs with only a few descriptors to spare.
    let (soft, hard) = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .zip(rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum)
        .unwrap();
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(open_fds() + SPARE_FDS),
            maximum: Some(hard),
        },
    )
    .unwrap();

    let (from, to) = (src.clone(), base.path().join("copy"));
    let copied = on_small_stack(move || sandcell::raw::tree::copy_tree(&from, &to));
    let layer = base.path().join("layer");
    let (from, to) = (src.clone(), layer.clone());
    let layer_copied = on_small_stack(move || sandcell::raw::tree::copy_layer(&from, &to));

    // The file API's removal: remove_tree beneath an open parent.
    let copy = base.path().join("copy");
    let measured = copied.as_ref().ok().map(|()| measure_chain(&copy));
    let parent = base.path().to_owned();
    let removed_tree = on_small_stack(move || {
        let parent = rustix::fs::open(&parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        sandcell::raw::tree::remove_tree(parent.as_fd(), &CString::new("copy").unwrap())
    });
    // Destroy's removal of a whole sandbox directory.
    let (l, s) = (layer.clone(), src.clone());
    let removed_layer = on_small_stack(move || sandcell::raw::tree::remove_dir_all(&l));
    let removed_src = on_small_stack(move || sandcell::raw::tree::remove_dir_all(&s));

    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        },
    )
    .unwrap();
    copied.unwrap();
    assert_eq!(
        measured,
        Some((DEPTH, true)),
        "the copy holds the whole chain"
    );
    layer_copied.unwrap();
    removed_tree.unwrap();
    removed_layer.unwrap();
    removed_src.unwrap();
    for gone in ["copy", "layer", "src"] {
        assert!(
            !base.path().join(gone).exists(),
            "{gone} is still there after its removal"
        );
    }
}

/// A directory moved out from under a removal while the walk is beneath it: the walk
/// climbs back through `..`, finds another directory there, and stops, rather than
/// remove what the moved directory's new parent holds.
#[test]
fn a_removal_climbing_back_into_a_moved_directory_stops() {
    let base = fast_tempdir();
    let tree = base.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    // Deeper than the levels a walk keeps open, so the climb reopens through `..`.
    make_chain(&tree, 3 * sandcell::raw::tree::OPEN_LEVELS);
    let keep = base.path().join("keep");
    std::fs::create_dir(&keep).unwrap();
    std::fs::write(keep.join("precious"), "x").unwrap();

    let mut stack = sandcell::raw::tree::DirStack::new();
    let top = rustix::fs::open(&tree, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    stack.push(top, CString::new("tree").unwrap(), ()).unwrap();
    for _ in 0..2 * sandcell::raw::tree::OPEN_LEVELS {
        let next = open_dir(stack.top().unwrap().fd().unwrap(), "d");
        stack.push(next, CString::new("d").unwrap(), ()).unwrap();
    }
    // The shallowest level the walk holds open moves beneath `keep`: climbing back
    // out of it through `..` reaches `keep`, not the directory it came from.
    let mut moved = tree.clone();
    for _ in 0..sandcell::raw::tree::OPEN_LEVELS {
        moved.push("d");
    }
    std::fs::rename(moved.join("d"), keep.join("d")).unwrap();
    let mut climbed = Ok(());
    while stack.depth() > 1 {
        if let Err(e) = stack.pop() {
            climbed = Err(e);
            break;
        }
    }
    assert_eq!(climbed, Err(rustix::io::Errno::STALE));
    assert!(keep.join("precious").exists());
}

/// ADVERSARIAL 40: wide directories are removed a batch of names at a time, and only the directory
/// being cleared holds names: whatever the tree's shape (directories of many thousand
/// hard links, which cost no inodes, nested under each other and placed between
/// batches), everything goes. Before, each directory's names were read whole and every
/// level above kept its own: 2 million links held some 500 MB.
#[test]
fn wide_directories_are_removed_a_batch_at_a_time() {
    let base = fast_tempdir();
    let tree = base.path().join("wide");
    std::fs::create_dir(&tree).unwrap();
    let file = base.path().join("one-file");
    std::fs::write(&file, "x").unwrap();
    let fill = |dir: &Path, prefix: &str, links: usize| {
        for i in 0..links {
            std::fs::hard_link(&file, dir.join(format!("{prefix}-{i:06}"))).unwrap();
        }
    };
    fill(&tree, "link", 20_000);
    let mut dir = tree.clone();
    for level in 0..3 {
        for side in 0..3 {
            let sub = dir.join(format!("sub-{level}-{side}"));
            std::fs::create_dir(&sub).unwrap();
            fill(&sub, "link", 1_000 * (side + 1));
        }
        dir = dir.join(format!("sub-{level}-1"));
        fill(&dir, "more", 5_000);
    }
    sandcell::raw::tree::remove_dir_all(&tree).unwrap();
    assert!(!tree.exists(), "everything removed");
    let left = rustix::fs::stat(&file).unwrap().st_nlink;
    assert_eq!(left, 1, "every link went");
}

/// ADVERSARIAL 40: a directory past what one walk holds of it (`MAX_WALK_NAME_BYTES` of names, here
/// in 250-byte hard links) is refused as the reading passes the cap, as `EFBIG`, which
/// reads as `LimitExceeded`; one just under it is listed whole.
#[test]
fn a_directory_too_large_to_walk_is_refused_as_a_limit() {
    use sandcell::raw::tree::{held_walk_bytes, list_names, MAX_WALK_NAME_BYTES};

    let base = fast_tempdir();
    let dir = base.path().join("many");
    std::fs::create_dir(&dir).unwrap();
    let file = base.path().join("one-file");
    std::fs::write(&file, "x").unwrap();
    let name = |i: usize| format!("{i:0250}");
    let under = MAX_WALK_NAME_BYTES / 250;
    for i in 0..under {
        std::fs::hard_link(&file, dir.join(name(i))).unwrap();
    }
    let open = || rustix::fs::open(&dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let listed = list_names(open().as_fd()).unwrap();
    assert_eq!(listed.len(), under);
    // Held, it draws on the pool all walks share (all but a thread's allowance).
    assert!(held_walk_bytes() >= MAX_WALK_NAME_BYTES - (1 << 20));
    drop(listed);
    std::fs::hard_link(&file, dir.join(name(under))).unwrap();
    let refused = list_names(open().as_fd()).unwrap_err();
    assert_eq!(refused, rustix::io::Errno::FBIG);
    let error = sandcell::Error::io("listing many", refused.into());
    assert_eq!(error.kind(), sandcell::ErrorKind::LimitExceeded, "{error}");
    // A copy (a clone) of it is refused as a limit too, naming no host path
    // (ADVERSARIAL 41: a server passes a limit's message to its client).
    let copied = sandcell::raw::tree::copy_tree(&dir, &base.path().join("copy")).unwrap_err();
    assert_eq!(
        copied.kind(),
        sandcell::ErrorKind::LimitExceeded,
        "{copied}"
    );
    let base_path = base.path().to_str().unwrap();
    assert!(!copied.to_string().contains(base_path), "{copied}");
    assert!(
        !base.path().join("copy").exists(),
        "a failed copy is removed"
    );
    sandcell::raw::tree::remove_dir_all(&dir).unwrap();
}
