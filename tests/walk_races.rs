//! Host-side walks of a tree that a sandbox process changes while they run
//! (ADVERSARIAL 42, 43): a thread swaps files and directories for symlinks to a host
//! directory in a tight loop while the tree is packed, listed as an overlay layer or
//! unpacked into, hundreds of rounds each. A round may fail (the tree changed under
//! it); none may read the host file or write beside it.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use sandcell::archive::ArchiveLimits;

const ROUNDS: usize = 300;
const SECRET: &[u8] = b"host-secret-4f1d8c";

/// A host directory the walks must never reach: a secret file and an empty directory.
struct Host {
    _dir: tempfile::TempDir,
    secret: PathBuf,
    outside: PathBuf,
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    fs::write(&secret, SECRET).unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    Host {
        secret,
        outside,
        _dir: dir,
    }
}

/// Runs `swap` in a loop on a thread until the returned guard is dropped.
struct Swapper {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<u64>>,
}

impl Swapper {
    fn start(mut swap: impl FnMut() + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut swaps = 0;
            while !flag.load(Ordering::Relaxed) {
                swap();
                swaps += 1;
            }
            swaps
        });
        Swapper {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Exchanges two names atomically, as a sandbox process would with `renameat2`.
fn exchange(a: &Path, b: &Path) {
    let _ = rustix::fs::renameat_with(
        rustix::fs::CWD,
        a,
        rustix::fs::CWD,
        b,
        rustix::fs::RenameFlags::EXCHANGE,
    );
}

/// A tree of files with, beside each, a symlink to the secret, and a directory beside a
/// symlink to the outside directory: the swapper exchanges each pair over and over.
fn swapping_tree(root: &Path, host: &Host) -> Swapper {
    let mut pairs = Vec::new();
    for i in 0..20 {
        let file = root.join(format!("f{i}"));
        fs::write(&file, b"ordinary").unwrap();
        let link = root.join(format!("l{i}"));
        std::os::unix::fs::symlink(&host.secret, &link).unwrap();
        pairs.push((file, link));
    }
    let dir = root.join("d");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("inner"), b"ordinary").unwrap();
    let dir_link = root.join("dl");
    std::os::unix::fs::symlink(host.secret.parent().unwrap(), &dir_link).unwrap();
    pairs.push((dir, dir_link));
    Swapper::start(move || {
        for (a, b) in &pairs {
            exchange(a, b);
        }
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn packing_a_changing_tree_never_reads_a_host_file() {
    let host = host();
    let tree = tempfile::tempdir().unwrap();
    let swapper = swapping_tree(tree.path(), &host);
    let mut packed = 0;
    for round in 0..ROUNDS {
        let mut tar = Vec::new();
        if sandcell::raw::archive::pack_dir_tar(tree.path(), &mut tar).is_ok() {
            packed += 1;
        }
        assert!(
            !contains(&tar, SECRET),
            "round {round}: the pack read the host file through a swapped-in symlink"
        );
    }
    assert!(swapper.stop() > 0);
    assert!(packed > 0, "no round packed at all");
}

#[test]
fn an_overlay_layers_changes_never_read_a_host_file() {
    let host = host();
    let upper = tempfile::tempdir().unwrap();
    let swapper = swapping_tree(upper.path(), &host);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for round in 0..ROUNDS {
        let Ok(changes) = runtime.block_on(sandcell::raw::overlay::changes(upper.path().into()))
        else {
            continue;
        };
        let tar = runtime.block_on(collect(changes.tar));
        assert!(
            !contains(&tar, SECRET),
            "round {round}: the change set read the host file"
        );
        // The secret's directory holds only `secret` and `outside`: a deletion under
        // a followed link would name one of them.
        assert!(
            changes
                .deleted
                .iter()
                .all(|p| !p.as_str().contains("secret") && !p.as_str().contains("outside")),
            "round {round}: the layer walk listed the host directory"
        );
    }
    swapper.stop();
}

async fn collect(stream: sandcell::ByteStream) -> Vec<u8> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut stream = stream;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => out.extend_from_slice(&bytes),
            Err(_) => break,
        }
    }
    out
}

/// An archive of `dirs` directories of `files` files each.
fn wide_archive(dirs: usize, files: usize) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for d in 0..dirs {
        for f in 0..files {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(4);
            builder
                .append_data(&mut h, format!("sub{d}/f{f}"), &b"data"[..])
                .unwrap();
        }
    }
    builder.into_inner().unwrap()
}

#[test]
fn unpacking_beside_a_swapping_process_never_writes_outside() {
    let host = host();
    let parent = tempfile::tempdir().unwrap();
    let dest = parent.path().join("dest");
    let archive = wide_archive(4, 100);
    // The attacker watches the parent for the staging directory and swaps each
    // directory the unpack makes in it for a symlink to the outside directory.
    let watched = parent.path().to_path_buf();
    let outside = host.outside.clone();
    let swapper = Swapper::start(move || {
        let Ok(entries) = fs::read_dir(&watched) else {
            return;
        };
        for entry in entries.flatten() {
            let staging = entry.path();
            if !entry
                .file_name()
                .to_string_lossy()
                .starts_with(".sandcell-")
            {
                continue;
            }
            for d in 0..4 {
                let sub = staging.join(format!("sub{d}"));
                if fs::rename(&sub, staging.join(format!("moved{d}"))).is_ok() {
                    let _ = std::os::unix::fs::symlink(&outside, &sub);
                }
            }
        }
    });
    let limits = ArchiveLimits::default();
    let mut unpacked = 0;
    for round in 0..ROUNDS / 3 {
        if sandcell::raw::archive::unpack_to_dir(&archive[..], &dest, &limits).is_ok() {
            unpacked += 1;
        }
        let written = fs::read_dir(&host.outside).unwrap().count();
        assert_eq!(
            written, 0,
            "round {round}: the unpack wrote {written} entries outside through a swapped-in symlink"
        );
    }
    assert!(swapper.stop() > 0);
    // Rounds the swapper lost still unpack, so the test exercised the real path.
    let _ = unpacked;
    let mut secret = Vec::new();
    fs::File::open(&host.secret)
        .unwrap()
        .read_to_end(&mut secret)
        .unwrap();
    assert_eq!(secret, SECRET);
}
