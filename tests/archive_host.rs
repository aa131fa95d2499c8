//! Hostile archives against the host-directory unpacker: every one fails with its typed
//! error, the destination keeps its old contents, nothing appears outside it, and no
//! staging directory is left behind.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::Read;
use std::path::Path;

use sandcell::archive::ArchiveLimits;
use sandcell::snapshot::{self, PackOptions, SnapshotManifest};
use sandcell::testing::{hostile_archives, RawTar};
use sandcell::ErrorKind;

/// A parent directory holding `dest` (with an old file) and an empty `outside`.
fn layout() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("dest");
    let outside = root.path().join("outside");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join("old.txt"), "old").unwrap();
    fs::create_dir(&outside).unwrap();
    (root, dest, outside)
}

fn assert_untouched(root: &Path, dest: &Path, outside: &Path, what: &str) {
    assert_eq!(
        fs::read_to_string(dest.join("old.txt")).unwrap(),
        "old",
        "{what}: dest changed"
    );
    assert_eq!(
        fs::read_dir(dest).unwrap().count(),
        1,
        "{what}: dest gained entries"
    );
    assert_eq!(
        fs::read_dir(outside).unwrap().count(),
        0,
        "{what}: something was written outside"
    );
    let names: Vec<_> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{what}: leftovers beside dest: {names:?}");
}

#[test]
fn hostile_entries_leave_everything_untouched() {
    // The same list the conformance suite runs against backends. Each case gets a fresh
    // layout whose own "outside" directory the symlinks and absolute entries aim at.
    let count = hostile_archives("/").len();
    for i in 0..count {
        let (root, dest, outside) = layout();
        let case = hostile_archives(outside.to_str().unwrap()).swap_remove(i);
        let err = sandcell::raw::archive::unpack_to_dir(
            std::io::Cursor::new(case.tar),
            &dest,
            &case.options.limits,
        )
        .unwrap_err();
        assert_eq!(err.kind(), case.expected, "{}: {err}", case.name);
        assert_untouched(root.path(), &dest, &outside, case.name);
    }
}

#[test]
fn corrupt_and_bomb_blobs_leave_dest_untouched() {
    let (root, dest, outside) = layout();
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("a.txt"), vec![b'a'; 100_000]).unwrap();
    let mut blob = Vec::new();
    let packed = snapshot::pack_dir(src.path(), &mut blob, &PackOptions::default()).unwrap();
    let manifest = SnapshotManifest::new(&packed, "test", "default");

    let mut flipped = blob.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x55;
    let err = snapshot::unpack_to_dir(
        std::io::Cursor::new(flipped),
        &manifest,
        &dest,
        &ArchiveLimits::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert_untouched(root.path(), &dest, &outside, "flipped byte");

    let mut trailing = blob.clone();
    trailing.extend_from_slice(b"garbage after the frame");
    let err = snapshot::unpack_to_dir(
        std::io::Cursor::new(trailing),
        &manifest,
        &dest,
        &ArchiveLimits::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert_untouched(root.path(), &dest, &outside, "trailing garbage");

    let mut bomb = Vec::new();
    let mut enc = zstd::stream::write::Encoder::new(&mut bomb, 3).unwrap();
    std::io::copy(&mut std::io::repeat(0).take(256 << 20), &mut enc).unwrap();
    enc.finish().unwrap();
    let mut bomb_manifest = manifest.clone();
    bomb_manifest.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bomb));
    let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
    let err = snapshot::unpack_to_dir(std::io::Cursor::new(bomb), &bomb_manifest, &dest, &limits)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert_untouched(root.path(), &dest, &outside, "zstd bomb");

    // The good blob replaces the destination.
    snapshot::unpack_to_dir(
        std::io::Cursor::new(blob),
        &manifest,
        &dest,
        &ArchiveLimits::default(),
    )
    .unwrap();
    assert!(!dest.join("old.txt").exists());
    assert_eq!(fs::read(dest.join("a.txt")).unwrap().len(), 100_000);
    assert_eq!(
        fs::read_dir(root.path()).unwrap().count(),
        2,
        "no staging or old copy left"
    );
}

#[test]
fn pack_then_unpack_preserves_modes_links_and_skips_specials() {
    use std::os::unix::fs::PermissionsExt;
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    fs::create_dir_all(s.join("bin")).unwrap();
    fs::write(s.join("bin/run.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(s.join("bin/run.sh"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::write(s.join("ro.txt"), "ro").unwrap();
    fs::set_permissions(s.join("ro.txt"), fs::Permissions::from_mode(0o444)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", s.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("bin/run.sh", s.join("rel-link")).unwrap();
    let fifo = s.join("pipe");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());

    let mut tar = Vec::new();
    let stats = sandcell::raw::archive::pack_dir_tar(s, &mut tar).unwrap();
    assert_eq!(stats.skipped, 1, "the FIFO is skipped");
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("restored");
    sandcell::raw::archive::unpack_to_dir(
        std::io::Cursor::new(tar),
        &dest,
        &ArchiveLimits::default(),
    )
    .unwrap();
    let mode = |p: &str| {
        fs::symlink_metadata(dest.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(
        mode("bin/run.sh"),
        0o755,
        "setuid bit masked off when packing"
    );
    assert_eq!(mode("ro.txt"), 0o444);
    assert_eq!(
        fs::read_link(dest.join("abs-link")).unwrap(),
        Path::new("/etc/passwd"),
        "stored, not followed"
    );
    assert_eq!(
        fs::read_link(dest.join("rel-link")).unwrap(),
        Path::new("bin/run.sh")
    );
    assert!(!dest.join("pipe").exists());
}

#[test]
fn conflicting_entries_are_invalid_input_and_change_nothing() {
    let (root, dest, outside) = layout();
    let tar = RawTar::new()
        .file("a", b"file")
        .file("a/b", b"beneath a file")
        .finish();
    let err = sandcell::raw::archive::unpack_to_dir(
        std::io::Cursor::new(tar),
        &dest,
        &ArchiveLimits::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_untouched(root.path(), &dest, &outside, "file then entry beneath it");
}

/// A tree with names past the 100-byte ustar field, to exercise GNU and pax long names.
fn long_name_tree(root: &Path) -> String {
    let long_dir = "d".repeat(120);
    let long_file = format!("{long_dir}/{}.txt", "f".repeat(150));
    fs::create_dir_all(root.join(&long_dir)).unwrap();
    fs::write(root.join(&long_file), "long").unwrap();
    std::os::unix::fs::symlink(&long_file, root.join("link-with-a-long-target")).unwrap();
    fs::write(root.join("short.txt"), "short").unwrap();
    long_file
}

#[test]
fn archives_from_gnu_tar_import_in_every_format() {
    let src = tempfile::tempdir().unwrap();
    let long_file = long_name_tree(src.path());
    for format in ["gnu", "pax", "posix"] {
        let out = std::process::Command::new("tar")
            .args(["--format", format, "-cf", "-", "-C"])
            .arg(src.path())
            .arg(".")
            .output()
            .expect("GNU tar is installed");
        assert!(out.status.success(), "tar --format {format} failed");
        let dest_root = tempfile::tempdir().unwrap();
        let dest = dest_root.path().join("x");
        sandcell::raw::archive::unpack_to_dir(
            std::io::Cursor::new(out.stdout),
            &dest,
            &ArchiveLimits::default(),
        )
        .unwrap_or_else(|e| panic!("format {format}: {e}"));
        assert_eq!(
            fs::read_to_string(dest.join(&long_file)).unwrap(),
            "long",
            "{format}"
        );
        assert_eq!(
            fs::read_link(dest.join("link-with-a-long-target")).unwrap(),
            Path::new(&long_file)
        );
    }
}

#[test]
fn global_pax_headers_such_as_git_archive_writes_are_skipped() {
    let tar = RawTar::new()
        .entry(
            tar::EntryType::XGlobalHeader,
            "pax_global_header",
            "",
            0o666,
            b"52 comment=0123456789abcdef0123456789abcdef01234567\n",
        )
        .file("README", b"hi")
        .finish();
    let dest_root = tempfile::tempdir().unwrap();
    let dest = dest_root.path().join("x");
    let stats = sandcell::raw::archive::unpack_to_dir(
        std::io::Cursor::new(tar),
        &dest,
        &ArchiveLimits::default(),
    )
    .unwrap();
    assert_eq!(stats.entries, 1);
    assert_eq!(fs::read_to_string(dest.join("README")).unwrap(), "hi");
    assert!(!dest.join("pax_global_header").exists());
}

#[test]
fn our_archives_extract_with_gnu_tar() {
    let src = tempfile::tempdir().unwrap();
    let long_file = long_name_tree(src.path());
    let mut tar = Vec::new();
    sandcell::raw::archive::pack_dir_tar(src.path(), &mut tar).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("tar")
        .args(["-xf", "-", "-C"])
        .arg(dest.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("GNU tar is installed");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &tar).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(
        fs::read_to_string(dest.path().join(&long_file)).unwrap(),
        "long"
    );
    assert_eq!(
        fs::read_to_string(dest.path().join("short.txt")).unwrap(),
        "short"
    );
}

/// The raw tar stream is bounded on its own: endless data after the end marker stops
/// at the limits' stream size, without any decompression layer involved.
#[test]
fn endless_plain_tar_stream_is_cut_off() {
    let (root, dest, outside) = layout();
    let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
    let tar = RawTar::new().file("f", b"x").finish();
    let endless = std::io::Cursor::new(tar.to_vec()).chain(std::io::repeat(0));
    let err = sandcell::raw::archive::unpack_to_dir(endless, &dest, &limits).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert_untouched(root.path(), &dest, &outside, "endless stream");
}

/// The decompressor is bounded on its own, before any tar parsing sees the bytes.
#[test]
fn decompression_stops_at_the_stream_cap() {
    let mut bomb = Vec::new();
    let mut enc = zstd::stream::write::Encoder::new(&mut bomb, 3).unwrap();
    std::io::copy(&mut std::io::repeat(7).take(64 << 20), &mut enc).unwrap();
    enc.finish().unwrap();
    let src = tempfile::tempdir().unwrap();
    let mut blob = Vec::new();
    let packed = snapshot::pack_dir(src.path(), &mut blob, &PackOptions::default()).unwrap();
    let mut manifest = SnapshotManifest::new(&packed, "test", "default");
    manifest.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bomb));
    let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
    let mut reader =
        snapshot::verified_tar_reader(std::io::Cursor::new(bomb), &manifest, &limits).unwrap();
    let err = std::io::copy(&mut reader, &mut std::io::sink()).unwrap_err();
    assert_eq!(
        sandcell::Error::io("reading", err).kind(),
        ErrorKind::LimitExceeded
    );
}
