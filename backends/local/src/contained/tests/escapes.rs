//! Containment against a hostile tree: escapes through links and `..`, removals that
//! must not follow links, exports that store links and never their targets, and a
//! process swapping directories for links while the workspace is used.

use super::*;

#[test]
fn escapes_are_refused_and_touch_nothing_outside() {
    let f = Fixture::new();
    let outside = f.outside.path().to_path_buf();
    std::fs::write(outside.join("x"), b"outside x").unwrap();
    f.ws.mkdir(&p("sl/sub")).unwrap();
    f.ws.write(&p("sl/keep"), b"keep").unwrap();
    f.link("sl/abs", &outside);
    f.link("sl/rel", "../../../../../../../../../../../../../../../..");
    f.link("sl/sub/up", "../..");
    f.link("sl/abs_file", outside.join("secret"));
    let before = f.outside_snapshot();
    let ws_before = snapshot(&f.root);

    // `sl/sub/up` is the workspace root, so `sl/sub/up/sl/rel` chains two links.
    for base in ["sl/abs", "sl/rel", "sl/sub/up/sl/abs", "sl/sub/up/sl/rel"] {
        let base = p(base);
        let below = |name: &str| base.join(name).unwrap();
        let denied = |what: &str, got: ErrorKind| {
            assert_eq!(got, ErrorKind::PermissionDenied, "{what} under {base}");
        };
        denied("read", kind(f.ws.read(&below("secret"), u64::MAX)));
        denied("read", kind(f.ws.read(&below("x"), u64::MAX)));
        denied("write", kind(f.ws.write(&below("owned"), b"x")));
        denied("write", kind(f.ws.write(&below("x"), b"x")));
        denied("write deep", kind(f.ws.write(&below("a/b/owned"), b"x")));
        denied("mkdir", kind(f.ws.mkdir(&below("owned"))));
        denied("mkdir deep", kind(f.ws.mkdir(&below("a/b"))));
        denied("list_dir", kind(f.ws.list_dir(&base)));
        denied("stat", kind(f.ws.stat(&below("x"))));
        denied("remove", kind(f.ws.remove(&below("x"), true)));
        denied(
            "rename into",
            kind(f.ws.rename(&p("sl/keep"), &below("owned"))),
        );
        denied(
            "rename into deep",
            kind(f.ws.rename(&p("sl/keep"), &below("a/owned"))),
        );
        denied(
            "rename out of",
            kind(f.ws.rename(&below("x"), &p("stolen"))),
        );
        denied("open_dir", kind(f.ws.open_dir(&base)));
        denied("resolve_dir", kind(f.ws.resolve_dir(&base)));
        denied("export", kind(export(&f.ws, base.as_str())));
    }
    assert_eq!(
        kind(f.ws.read(&p("sl/abs_file"), u64::MAX)),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(f.ws.write(&p("sl/abs_file"), b"x")),
        ErrorKind::PermissionDenied
    );
    assert_eq!(f.outside_snapshot(), before, "nothing outside changed");
    assert_eq!(
        snapshot(&f.root),
        ws_before,
        "nothing inside changed either"
    );

    f.ws.remove(&p("sl/abs"), false)
        .expect("removing a link removes the link");
    assert_eq!(f.outside_snapshot(), before);
}

#[test]
fn recursive_remove_never_follows_links() {
    let f = Fixture::new();
    let outside = f.outside.path().to_path_buf();
    std::fs::create_dir(outside.join("dir")).unwrap();
    std::fs::write(outside.join("dir/keep"), b"keep").unwrap();
    f.ws.write(&p("tree/a/b/file"), b"1").unwrap();
    f.link("tree/out", &outside);
    f.link("tree/a/b/deep_out", outside.join("dir"));
    f.link("tree/a/file_out", outside.join("secret"));
    f.link("top_out", &outside);
    let before = f.outside_snapshot();
    f.ws.remove(&p("tree"), true).unwrap();
    f.ws.remove(&p("top_out"), true).unwrap();
    assert!(f.ws.list_dir(&SandboxPath::root()).unwrap().is_empty());
    assert_eq!(f.outside_snapshot(), before, "outside files survive");
}

#[test]
fn export_stores_links_and_never_their_targets() {
    let f = Fixture::new();
    f.ws.write(&p("src/a.txt"), b"alpha").unwrap();
    f.ws.write(&p("src/nested/b.bin"), &[7u8; 3000]).unwrap();
    f.ws.write(&p("src/a.dir/z"), b"z").unwrap();
    f.ws.mkdir(&p("src/emptydir")).unwrap();
    f.link("src/link", "a.txt");
    let secret = f.outside.path().join("secret");
    f.link("src/secret_link", &secret);
    f.link("src/outdir_link", f.outside.path());
    f.link("src/shadow", "/etc/shadow");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.host("src/fifo").as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    std::fs::set_permissions(f.host("src/a.txt"), std::fs::Permissions::from_mode(0o4755)).unwrap();

    let (tar, stats) = export(&f.ws, "src").unwrap();
    assert!(!contains(&tar, SECRET), "no bytes of a link's target");
    let entries = tar_entries(&tar);
    let summary: Vec<_> = entries
        .iter()
        .map(|(path, ty, link, _)| (path.as_str(), *ty, link.as_deref()))
        .collect();
    use tar::EntryType as T;
    let secret_str = secret.to_str().unwrap();
    let outdir_str = f.outside.path().to_str().unwrap();
    assert_eq!(
        summary,
        vec![
            ("a.dir", T::Directory, None),
            ("a.txt", T::Regular, None),
            ("emptydir", T::Directory, None),
            ("link", T::Symlink, Some("a.txt")),
            ("nested", T::Directory, None),
            ("outdir_link", T::Symlink, Some(outdir_str)),
            ("secret_link", T::Symlink, Some(secret_str)),
            ("shadow", T::Symlink, Some("/etc/shadow")),
            ("a.dir/z", T::Regular, None),
            ("nested/b.bin", T::Regular, None),
        ]
    );
    assert_eq!(entries[1].3, b"alpha");
    assert_eq!(entries[9].3, vec![7u8; 3000]);
    assert_eq!(
        (stats.entries, stats.skipped, stats.content_bytes),
        (10, 1, 5 + 1 + 3000)
    );

    let mut archive = tar::Archive::new(&tar[..]);
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let h = entry.header();
        assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
        assert_eq!(h.mode().unwrap() & !0o777, 0, "mode masked");
        assert!(h.mtime().unwrap() > 0);
    }

    // The same stream the host packer writes for the same tree.
    let mut host = Vec::new();
    sandcell::raw::archive::pack_dir_tar(&f.host("src"), &mut host).unwrap();
    assert!(host == tar, "export matches pack_dir_tar byte for byte");

    // Through an in-workspace link to the directory, and from the root.
    f.link("src_link", "src");
    assert_eq!(export(&f.ws, "src_link").unwrap().0, tar);
    let (all, _) = export(&f.ws, "").unwrap();
    assert!(!contains(&all, SECRET));
    assert_eq!(tar_entries(&all)[0].0, "src");
}

#[test]
fn export_entries_match_their_headers() {
    assert_eq!(read_all(exactly(&b"abc"[..], 5)), b"abc\0\0");
    assert_eq!(read_all(exactly(&b"abcdef"[..], 4)), b"abcd");
    assert_eq!(read_all(exactly(&b""[..], 0)), b"");
}

fn read_all(mut r: impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    out
}

#[test]
fn symlink_ancestor_finds_the_link_closest_to_the_root() {
    let f = Fixture::new();
    f.ws.write(&p("a/b/file"), b"1").unwrap();
    f.link("a/l1", "b");
    f.link("l0", "a");
    f.link("a/b/out", f.outside.path());
    assert_eq!(
        f.ws.symlink_ancestor(&p("a/l1/x/y")).unwrap(),
        Some(p("a/l1"))
    );
    assert_eq!(f.ws.symlink_ancestor(&p("l0/l1/z")).unwrap(), Some(p("l0")));
    assert_eq!(
        f.ws.symlink_ancestor(&p("a/b/out/x")).unwrap(),
        Some(p("a/b/out"))
    );
    assert_eq!(
        f.ws.symlink_ancestor(&p("a/l1")).unwrap(),
        None,
        "not the path itself"
    );
    assert_eq!(f.ws.symlink_ancestor(&p("a/b/c/d")).unwrap(), None);
    assert_eq!(f.ws.symlink_ancestor(&p("missing/l/x")).unwrap(), None);
    assert_eq!(f.ws.symlink_ancestor(&p("a/b/file/x")).unwrap(), None);
    assert_eq!(f.ws.symlink_ancestor(&SandboxPath::root()).unwrap(), None);
}

/// A thread keeps exchanging directory `d` with a symlink to an outside directory
/// while the workspace is written, read, listed and exported through `d`.
#[test]
fn swapping_a_directory_for_an_outside_link_never_escapes() {
    let f = Fixture::new();
    std::fs::write(f.outside.path().join("f"), SECRET).unwrap();
    f.ws.write(&p("d/f"), b"inside").unwrap();
    f.link("swap", f.outside.path());
    let before = f.outside_snapshot();

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
        let (d, swap) = (f.host("d"), f.host("swap"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    d.as_path(),
                    rustix::fs::CWD,
                    swap.as_path(),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let start = Instant::now();
    let mut rounds = 0u64;
    let mut exported_while_dir = 0u64;
    let mut writes_denied = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        rounds += 1;
        match f.ws.write(&p("d/f"), b"inside") {
            Err(e) if e.kind() == ErrorKind::PermissionDenied => writes_denied += 1,
            _ => {}
        }
        let _ = f.ws.write(&p("d/new"), b"inside");
        let _ = f.ws.mkdir(&p("d/sub/deeper"));
        if let Ok(data) = f.ws.read(&p("d/f"), u64::MAX) {
            assert_ne!(data, SECRET, "read through the swapped link");
        }
        if let Ok(entries) = f.ws.list_dir(&p("d")) {
            assert!(entries.iter().all(|e| e.name != "secret"), "listed outside");
        }
        let mut out = Vec::new();
        let result = f.ws.export_tar(&SandboxPath::root(), &mut out);
        assert!(!contains(&out, SECRET), "exported outside bytes");
        if result.is_ok() && tar_entries(&out).iter().any(|e| e.0 == "d/f") {
            exported_while_dir += 1;
        }
        let _ = f.ws.remove(&p("d/sub"), true);
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();

    assert_eq!(
        f.outside_snapshot(),
        before,
        "nothing appeared or changed outside"
    );
    assert!(swaps.load(Ordering::Relaxed) > 100, "the race ran");
    assert!(
        rounds > 10 && exported_while_dir > 0 && writes_denied > 0,
        "{rounds} rounds, {exported_while_dir} exports saw d, {writes_denied} writes refused"
    );
}
