//! The containment tests: files round-tripping, the reference error kinds, and the
//! fixture (a workspace beside a host directory that must never be touched) that
//! `escapes` turns hostile trees and racing processes on.

use super::export::exactly;
use super::*;
use rustix::fs::FileType;
use std::collections::BTreeMap;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"TOP-SECRET-bytes-that-live-outside-the-workspace";

fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

/// A workspace and, next to it, a host directory that must never be touched.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: Workspace,
    outside: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let ws = Workspace::open(&root).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), SECRET).unwrap();
        Fixture {
            _dir: dir,
            root,
            ws,
            outside,
        }
    }

    fn host(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn link(&self, at: &str, target: impl AsRef<Path>) {
        let at = self.host(at);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        symlink(target, at).unwrap();
    }

    /// The outside directory's files and their contents.
    fn outside_snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        snapshot(self.outside.path())
    }
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let ty = entry.file_type().unwrap();
        if ty.is_dir() {
            for (k, v) in snapshot(&entry.path()) {
                out.insert(format!("{name}/{k}"), v);
            }
            out.insert(name, b"<dir>".to_vec());
        } else if ty.is_symlink() {
            out.insert(name, b"<link>".to_vec());
        } else {
            out.insert(name, std::fs::read(entry.path()).unwrap());
        }
    }
    out
}

fn kind<T: fmt::Debug>(r: Result<T>) -> ErrorKind {
    r.unwrap_err().kind()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

type TarEntry = (String, tar::EntryType, Option<String>, Vec<u8>);

fn tar_entries(data: &[u8]) -> Vec<TarEntry> {
    let mut archive = tar::Archive::new(data);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let ty = e.header().entry_type();
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut content = Vec::new();
            e.read_to_end(&mut content).unwrap();
            (path, ty, link, content)
        })
        .collect()
}

fn export(ws: &Workspace, dir: &str) -> Result<(Vec<u8>, PackStats)> {
    let mut out = Vec::new();
    let stats = ws.export_tar(&p(dir), &mut out)?;
    Ok((out, stats))
}

#[test]
fn files_round_trip() {
    let f = Fixture::new();
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    f.ws.write(&p("rt/deep/er/bin.dat"), &data).unwrap();
    assert_eq!(f.ws.read(&p("rt/deep/er/bin.dat"), u64::MAX).unwrap(), data);
    f.ws.write(&p("rt/deep/er/bin.dat"), b"short").unwrap();
    assert_eq!(
        f.ws.read(&p("rt/deep/er/bin.dat"), u64::MAX).unwrap(),
        b"short"
    );
    f.ws.write(&p("rt/empty"), b"").unwrap();
    assert!(f.ws.read(&p("rt/empty"), u64::MAX).unwrap().is_empty());
    f.ws.write(&p("rt/b.txt"), b"bb").unwrap();

    let st = f.ws.stat(&p("rt/b.txt")).unwrap();
    assert_eq!(
        (st.kind, st.size, st.path.clone()),
        (FileKind::File, 2, p("rt/b.txt"))
    );
    assert!(st.modified.is_some());
    assert!(st.symlink_target.is_none());
    let dir = f.ws.stat(&p("rt/deep")).unwrap();
    assert_eq!((dir.kind, dir.size), (FileKind::Dir, 0));
    assert_eq!(f.ws.stat(&SandboxPath::root()).unwrap().kind, FileKind::Dir);

    let listed: Vec<_> =
        f.ws.list_dir(&p("rt"))
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.path, e.kind, e.size))
            .collect();
    assert_eq!(
        listed,
        vec![
            ("b.txt".to_owned(), p("rt/b.txt"), FileKind::File, 2),
            ("deep".to_owned(), p("rt/deep"), FileKind::Dir, 0),
            ("empty".to_owned(), p("rt/empty"), FileKind::File, 0),
        ]
    );
    let top: Vec<_> =
        f.ws.list_dir(&SandboxPath::root())
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
    assert_eq!(top, vec![p("rt")]);
    assert_eq!(std::fs::read(f.host("rt/b.txt")).unwrap(), b"bb");
}

#[test]
fn write_keeps_an_existing_mode_and_creates_plain_files() {
    let f = Fixture::new();
    f.ws.write(&p("x.sh"), b"#!/bin/sh\n").unwrap();
    let mode = f.ws.stat(&p("x.sh")).unwrap().mode;
    // 0o644 less whatever the process umask takes away.
    assert_eq!(mode & 0o711, 0o600, "{mode:o}");
    std::fs::set_permissions(f.host("x.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    f.ws.write(&p("x.sh"), b"echo hi\n").unwrap();
    assert_eq!(f.ws.stat(&p("x.sh")).unwrap().mode, 0o750);
    assert_eq!(f.ws.read(&p("x.sh"), u64::MAX).unwrap(), b"echo hi\n");
}

#[test]
fn errors_have_the_reference_kinds() {
    let f = Fixture::new();
    f.ws.write(&p("d/file"), b"1").unwrap();
    f.ws.write(&p("full/inner/x"), b"1").unwrap();
    f.link("loop", "loop");
    let root = SandboxPath::root();
    use ErrorKind::*;

    assert_eq!(kind(f.ws.read(&p("missing"), u64::MAX)), NotFound);
    assert_eq!(kind(f.ws.read(&p("d"), u64::MAX)), InvalidInput);
    assert_eq!(kind(f.ws.read(&root, u64::MAX)), InvalidInput);
    assert_eq!(kind(f.ws.read(&p("d/file/below"), u64::MAX)), NotFound);
    assert_eq!(kind(f.ws.read(&p("loop"), u64::MAX)), InvalidInput);

    assert_eq!(kind(f.ws.write(&root, b"x")), InvalidInput);
    assert_eq!(kind(f.ws.write(&p("d"), b"x")), InvalidInput);
    assert_eq!(kind(f.ws.write(&p("d/file/below"), b"x")), InvalidInput);
    assert_eq!(kind(f.ws.write(&p("loop"), b"x")), InvalidInput);

    assert_eq!(kind(f.ws.stat(&p("missing"))), NotFound);
    assert_eq!(kind(f.ws.stat(&p("d/missing"))), NotFound);
    assert_eq!(kind(f.ws.stat(&p("d/file/below"))), NotFound);

    assert_eq!(kind(f.ws.list_dir(&p("d/file"))), InvalidInput);
    assert_eq!(kind(f.ws.list_dir(&p("nope"))), NotFound);
    assert_eq!(kind(f.ws.list_dir(&p("d/file/below"))), NotFound);

    assert_eq!(kind(f.ws.remove(&root, true)), InvalidInput);
    assert_eq!(kind(f.ws.remove(&p("nope"), false)), NotFound);
    assert_eq!(kind(f.ws.remove(&p("full"), false)), InvalidInput);
    assert_eq!(
        f.ws.read(&p("full/inner/x"), u64::MAX).unwrap(),
        b"1",
        "a refused remove removes nothing"
    );

    assert_eq!(kind(f.ws.mkdir(&p("d/file"))), AlreadyExists);
    assert_eq!(kind(f.ws.mkdir(&p("d/file/below"))), AlreadyExists);

    assert_eq!(kind(f.ws.rename(&root, &p("x"))), InvalidInput);
    assert_eq!(kind(f.ws.rename(&p("d"), &root)), InvalidInput);
    assert_eq!(kind(f.ws.rename(&p("nope"), &p("x"))), NotFound);
    assert_eq!(kind(f.ws.rename(&p("d"), &p("d/new/inside"))), InvalidInput);
    assert!(
        !f.host("d/new").exists(),
        "a refused move creates no parents"
    );
    assert_eq!(kind(f.ws.rename(&p("d/file"), &p("full"))), AlreadyExists);

    assert_eq!(kind(f.ws.open_dir(&p("d/file"))), InvalidInput);
    assert_eq!(kind(f.ws.open_dir(&p("nope"))), NotFound);
    assert_eq!(kind(f.ws.resolve_dir(&p("d/file"))), InvalidInput);
    assert_eq!(kind(f.ws.resolve_dir(&p("nope"))), NotFound);

    assert_eq!(kind(export(&f.ws, "nope")), NotFound);
    assert_eq!(kind(export(&f.ws, "d/file")), InvalidInput);

    let err = f.ws.write(&p("d"), b"x").unwrap_err();
    assert!(err.to_string().starts_with("writing d: "), "{err}");
    assert_eq!(
        kind(Workspace::open(&f.root.join("no-such-workspace"))),
        NotFound
    );
}

#[test]
fn mkdir_creates_parents_and_is_idempotent() {
    let f = Fixture::new();
    f.ws.mkdir(&p("mk/a/b")).unwrap();
    f.ws.mkdir(&p("mk/a/b")).unwrap();
    f.ws.mkdir(&SandboxPath::root()).unwrap();
    assert!(f.host("mk/a/b").is_dir());
    f.link("mk/ln", "a");
    f.ws.mkdir(&p("mk/ln"))
        .expect("an in-workspace link to a directory is a directory");
    f.ws.mkdir(&p("mk/ln/c/d")).unwrap();
    assert!(f.host("mk/a/c/d").is_dir());
    assert_eq!(f.ws.stat(&p("mk/ln")).unwrap().kind, FileKind::Symlink);
}

#[test]
fn rename_moves_files_dirs_and_links() {
    let f = Fixture::new();
    f.ws.write(&p("mv/a/b/f"), b"1").unwrap();
    f.ws.rename(&p("mv/a/b/f"), &p("mv/new/parents/g")).unwrap();
    assert_eq!(f.ws.read(&p("mv/new/parents/g"), u64::MAX).unwrap(), b"1");
    assert_eq!(kind(f.ws.stat(&p("mv/a/b/f"))), ErrorKind::NotFound);

    f.ws.write(&p("mv/other"), b"2").unwrap();
    f.ws.rename(&p("mv/other"), &p("mv/new/parents/g"))
        .expect("replaces a file");
    assert_eq!(f.ws.read(&p("mv/new/parents/g"), u64::MAX).unwrap(), b"2");

    f.ws.rename(&p("mv/a"), &p("mv/moved")).unwrap();
    assert_eq!(f.ws.stat(&p("mv/moved/b")).unwrap().kind, FileKind::Dir);

    f.ws.write(&p("mv/plain"), b"3").unwrap();
    f.ws.rename(&p("mv/moved"), &p("mv/plain"))
        .expect("a directory replaces a file");
    assert_eq!(f.ws.stat(&p("mv/plain/b")).unwrap().kind, FileKind::Dir);

    f.ws.rename(&p("mv/plain"), &p("mv/plain"))
        .expect("renaming onto itself does nothing");

    f.link("mv/link", "new/parents/g");
    f.ws.rename(&p("mv/link"), &p("mv/link2")).unwrap();
    let st = f.ws.stat(&p("mv/link2")).unwrap();
    assert_eq!(st.kind, FileKind::Symlink, "the link itself moved");
    assert_eq!(st.symlink_target.as_deref(), Some("new/parents/g"));
    assert_eq!(f.ws.read(&p("mv/new/parents/g"), u64::MAX).unwrap(), b"2");

    // Into itself through an in-workspace link: the kernel refuses it.
    f.link("mv/via", "plain");
    assert_eq!(
        kind(f.ws.rename(&p("mv/plain"), &p("mv/via/b/x"))),
        ErrorKind::InvalidInput
    );
}

#[test]
fn remove_files_links_and_trees() {
    let f = Fixture::new();
    f.ws.write(&p("rm/f"), b"1").unwrap();
    f.ws.write(&p("rm/tree/a/b/c"), b"1").unwrap();
    f.ws.mkdir(&p("rm/empty")).unwrap();
    f.link("rm/link", "tree");
    f.ws.remove(&p("rm/link"), true).unwrap();
    assert!(
        f.host("rm/tree/a/b/c").exists(),
        "removing a link keeps its target"
    );
    f.ws.remove(&p("rm/f"), false).unwrap();
    f.ws.remove(&p("rm/empty"), false).unwrap();
    f.ws.remove(&p("rm/tree"), true).unwrap();
    assert!(f.ws.list_dir(&p("rm")).unwrap().is_empty());
    f.ws.remove(&p("rm"), false).unwrap();
    assert!(!f.host("rm").exists());
}

#[test]
fn inner_symlinks_are_followed() {
    let f = Fixture::new();
    f.ws.mkdir(&p("sl/sub")).unwrap();
    f.link("sl/inner", "sub");
    f.link("sl/sub/up", "..");
    f.ws.write(&p("sl/inner/f"), b"in").unwrap();
    assert_eq!(f.ws.read(&p("sl/sub/f"), u64::MAX).unwrap(), b"in");
    assert_eq!(f.ws.read(&p("sl/sub/up/inner/f"), u64::MAX).unwrap(), b"in");
    let st = f.ws.stat(&p("sl/inner")).unwrap();
    assert_eq!(st.kind, FileKind::Symlink, "stat does not follow");
    assert_eq!((st.size, st.symlink_target.as_deref()), (3, Some("sub")));
    assert_eq!(f.ws.stat(&p("sl/inner/f")).unwrap().kind, FileKind::File);
    let listed: Vec<_> =
        f.ws.list_dir(&p("sl/inner"))
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.kind))
            .collect();
    assert_eq!(
        listed,
        vec![
            (p("sl/inner/f"), FileKind::File),
            (p("sl/inner/up"), FileKind::Symlink)
        ]
    );
    f.ws.open_dir(&p("sl/inner")).unwrap();
    assert_eq!(f.ws.resolve_dir(&p("sl/inner")).unwrap(), f.host("sl/sub"));
    assert_eq!(f.ws.resolve_dir(&SandboxPath::root()).unwrap(), f.root);
    let (tar, _) = export(&f.ws, "sl/inner").unwrap();
    let names: Vec<_> = tar_entries(&tar).into_iter().map(|e| e.0).collect();
    assert_eq!(names, vec!["f", "up"]);

    // A dangling link that stays inside: writing through it creates the target.
    f.link("sl/dangling", "sub/created");
    f.ws.write(&p("sl/dangling"), b"new").unwrap();
    assert_eq!(std::fs::read(f.host("sl/sub/created")).unwrap(), b"new");
    assert_eq!(
        f.ws.stat(&p("sl/dangling")).unwrap().kind,
        FileKind::Symlink
    );
}

#[test]
fn resolve_dir_is_spelled_under_the_root_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("real/sub")).unwrap();
    symlink(dir.path().join("real"), dir.path().join("alias")).unwrap();
    let ws = Workspace::open(&dir.path().join("alias")).unwrap();
    assert_eq!(ws.root_path(), dir.path().join("alias"));
    assert_eq!(
        ws.resolve_dir(&p("sub")).unwrap(),
        dir.path().join("alias/sub")
    );
}

mod escapes;
