//! File cases: reads and writes, directories, hostile paths, symlink escapes, mounts.

use bytes::Bytes;

use super::{assert_kind, fingerprint, host_dir_is_empty, p, spec, stream, with_sandbox};
use crate::archive::ImportOptions;
use crate::testing::RawTar;
use crate::{ErrorKind, FileKind, SandboxBackend, SandboxBackendExt, SandboxId, SandboxPath};

/// `write`/`read`/`stat`/`list_dir`: parents created, bytes exact, listing sorted.
pub async fn files_round_trip(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        b.write(&id, &p("rt/deep/er/bin.dat"), Bytes::from(data.clone()))
            .await
            .expect("write creates parents");
        assert_eq!(
            b.read(&id, &p("rt/deep/er/bin.dat"))
                .await
                .unwrap()
                .to_vec(),
            data
        );
        b.write(&id, &p("rt/deep/er/bin.dat"), Bytes::from_static(b"short"))
            .await
            .expect("overwrite");
        assert_eq!(
            &b.read(&id, &p("rt/deep/er/bin.dat")).await.unwrap()[..],
            b"short"
        );
        b.write(&id, &p("rt/empty"), Bytes::new()).await.unwrap();
        assert_eq!(b.read(&id, &p("rt/empty")).await.unwrap().len(), 0);
        // A limited read answers a file up to the limit, and refuses one past it.
        let ten_k = Bytes::from(vec![b'x'; 10_000]);
        b.write(&id, &p("rt/10k"), ten_k.clone()).await.unwrap();
        assert_eq!(
            b.read_limited(&id, &p("rt/10k"), 10_000).await.unwrap(),
            ten_k
        );
        assert_kind(
            b.read_limited(&id, &p("rt/10k"), 9_999).await,
            ErrorKind::LimitExceeded,
            "a read limited below the file's size",
        );
        assert_kind(
            b.read_limited(&id, &p("rt/missing"), 10).await,
            ErrorKind::NotFound,
            "a limited read of a missing file",
        );
        b.remove(&id, &p("rt/10k"), false).await.unwrap();
        b.write(&id, &p("rt/b.txt"), Bytes::from_static(b"bb"))
            .await
            .unwrap();

        let st = b.stat(&id, &p("rt/b.txt")).await.unwrap();
        assert_eq!((st.kind, st.size), (FileKind::File, 2));
        assert_eq!(
            b.stat(&id, &p("rt/deep")).await.unwrap().kind,
            FileKind::Dir
        );
        assert_kind(
            b.stat(&id, &p("rt/missing")).await,
            ErrorKind::NotFound,
            "stat missing",
        );

        let names: Vec<_> = b
            .list_dir(&id, &p("rt"))
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.path, e.kind))
            .collect();
        assert_eq!(
            names,
            vec![
                ("b.txt".to_owned(), p("rt/b.txt"), FileKind::File),
                ("deep".to_owned(), p("rt/deep"), FileKind::Dir),
                ("empty".to_owned(), p("rt/empty"), FileKind::File),
            ]
        );
        assert_kind(
            b.read(&id, &p("rt/missing")).await,
            ErrorKind::NotFound,
            "read missing",
        );
        assert_kind(
            b.read(&id, &p("rt/deep")).await,
            ErrorKind::InvalidInput,
            "read a directory",
        );
        assert_kind(
            b.write(&id, &p("rt/deep"), Bytes::new()).await,
            ErrorKind::InvalidInput,
            "write over a directory",
        );
        assert_kind(
            b.write(&id, &SandboxPath::root(), Bytes::new()).await,
            ErrorKind::InvalidInput,
            "write the root",
        );
        assert_kind(
            b.list_dir(&id, &p("rt/b.txt")).await,
            ErrorKind::InvalidInput,
            "list a file",
        );
        assert_kind(
            b.list_dir(&id, &p("rt/nope")).await,
            ErrorKind::NotFound,
            "list missing",
        );
    })
    .await;
}

/// `remove`/`mkdir`/`rename` semantics.
pub async fn remove_mkdir_rename(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        b.mkdir(&id, &p("mk/a/b"))
            .await
            .expect("mkdir with parents");
        b.mkdir(&id, &p("mk/a/b"))
            .await
            .expect("mkdir is idempotent");
        b.write(&id, &p("mk/a/b/f"), Bytes::from_static(b"1"))
            .await
            .unwrap();
        assert_kind(
            b.mkdir(&id, &p("mk/a/b/f")).await,
            ErrorKind::AlreadyExists,
            "mkdir over a file",
        );

        assert_kind(
            b.remove(&id, &p("mk/a"), false).await,
            ErrorKind::InvalidInput,
            "remove non-empty dir",
        );
        assert!(
            b.exists(&id, &p("mk/a/b/f")).await.unwrap(),
            "failed remove removes nothing"
        );
        assert_kind(
            b.remove(&id, &p("mk/nope"), false).await,
            ErrorKind::NotFound,
            "remove missing",
        );
        assert_kind(
            b.remove(&id, &SandboxPath::root(), true).await,
            ErrorKind::InvalidInput,
            "remove root",
        );

        b.rename(&id, &p("mk/a/b/f"), &p("mk/g"))
            .await
            .expect("rename a file");
        assert_eq!(&b.read(&id, &p("mk/g")).await.unwrap()[..], b"1");
        assert!(!b.exists(&id, &p("mk/a/b/f")).await.unwrap());
        b.rename(&id, &p("mk/a"), &p("mk/moved"))
            .await
            .expect("rename a dir");
        assert_eq!(
            b.stat(&id, &p("mk/moved/b")).await.unwrap().kind,
            FileKind::Dir
        );
        assert_kind(
            b.rename(&id, &p("mk/moved"), &p("mk/moved/b/inside")).await,
            ErrorKind::InvalidInput,
            "dir into itself",
        );
        assert_kind(
            b.rename(&id, &p("mk/nope"), &p("mk/x")).await,
            ErrorKind::NotFound,
            "rename missing",
        );
        assert_kind(
            b.rename(&id, &SandboxPath::root(), &p("mk/x")).await,
            ErrorKind::InvalidInput,
            "rename root",
        );

        b.remove(&id, &p("mk/g"), false)
            .await
            .expect("remove a file");
        b.remove(&id, &p("mk"), true)
            .await
            .expect("recursive remove");
        assert!(!b.exists(&id, &p("mk")).await.unwrap());
    })
    .await;
}

/// Paths that are absolute, contain `..` or NUL, or are over-long never parse, so they
/// never reach a backend.
pub async fn hostile_paths_are_rejected(b: &dyn SandboxBackend) {
    let _ = b;
    for bad in [
        "/etc/passwd",
        "../outside",
        "a/../../b",
        "a/\0/b",
        "..",
        "/",
    ] {
        assert_kind(SandboxPath::new(bad), ErrorKind::InvalidInput, bad);
    }
    assert_kind(
        SandboxPath::new(&"n".repeat(256)),
        ErrorKind::InvalidInput,
        "256-byte name",
    );
    assert!(
        serde_json::from_str::<SandboxPath>("\"../x\"").is_err(),
        "deserializing validates too"
    );
}

pub(super) async fn plant(b: &dyn SandboxBackend, id: &SandboxId, tar: Bytes) {
    b.import_tar(
        id,
        &SandboxPath::root(),
        stream(tar),
        ImportOptions::merge(),
    )
    .await
    .expect("plant entries with import_tar");
}

/// Reads and writes through symlinks: followed inside the workspace, refused (with
/// nothing written outside) when they lead out, whether absolute or relative.
pub async fn symlink_escapes_are_refused(b: &dyn SandboxBackend) {
    if !b.capabilities().symlinks {
        // Without the capability, an archive carrying a symlink is refused outright.
        return with_sandbox(b, spec(), |id| async move {
            let tar = RawTar::new().symlink("link", "/etc").finish();
            assert_kind(
                b.import_tar(&id, &p("in"), stream(tar), ImportOptions::default())
                    .await,
                ErrorKind::Unsupported,
                "a symlink without the symlinks capability",
            );
            assert_kind(
                b.stat(&id, &p("in/link")).await,
                ErrorKind::NotFound,
                "nothing imported",
            );
        })
        .await;
    }
    let outside = tempfile::tempdir().expect("host temp dir");
    let outside_path = outside.path().to_str().expect("utf-8 temp path").to_owned();
    with_sandbox(b, spec(), |id| {
        let outside_path = outside_path.clone();
        async move {
            b.mkdir(&id, &p("sl/sub")).await.unwrap();
            plant(
                b,
                &id,
                RawTar::new()
                    .symlink("sl/inner", "sub")
                    .symlink("sl/abs", &outside_path)
                    .symlink("sl/rel", "../../../../../../../../../../../../../../../..")
                    .symlink("sl/up", "..")
                    .finish(),
            )
            .await;
            b.write(&id, &p("sl/inner/f"), Bytes::from_static(b"in"))
                .await
                .expect("write through an inner link");
            assert_eq!(&b.read(&id, &p("sl/sub/f")).await.unwrap()[..], b"in");
            assert_eq!(
                b.stat(&id, &p("sl/inner")).await.unwrap().kind,
                FileKind::Symlink,
                "stat does not follow"
            );

            let before = fingerprint(b, &id).await;
            // `sl/up` is the workspace root, so `sl/up/sl/rel` chains two links to escape.
            for path in [
                "sl/abs/owned",
                "sl/rel/tmp/owned",
                "sl/up/sl/rel/owned",
                "sl/up/sl/abs/owned",
            ] {
                let path = p(path);
                assert_kind(
                    b.write(&id, &path, Bytes::from_static(b"x")).await,
                    ErrorKind::PermissionDenied,
                    path.as_str(),
                );
                assert_kind(
                    b.mkdir(&id, &path).await,
                    ErrorKind::PermissionDenied,
                    path.as_str(),
                );
            }
            assert_kind(
                b.read(&id, &p("sl/abs/owned")).await,
                ErrorKind::PermissionDenied,
                "read through abs link",
            );
            assert_kind(
                b.list_dir(&id, &p("sl/abs")).await,
                ErrorKind::PermissionDenied,
                "list through abs link",
            );
            assert_eq!(fingerprint(b, &id).await, before, "workspace unchanged");
            b.remove(&id, &p("sl/abs"), false)
                .await
                .expect("removing a link removes the link");
        }
    })
    .await;
    assert!(
        host_dir_is_empty(outside.path()),
        "nothing was written outside the workspace"
    );
}

/// Prefix confusion: operations on `data` never touch `data2` or `data.bak`.
pub async fn prefix_confusion(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        for path in ["pc/data/a", "pc/data2/a", "pc/data.bak/a", "pc/dat/a"] {
            b.write(&id, &p(path), Bytes::from_static(b"keep"))
                .await
                .unwrap();
        }
        b.import_tar(
            &id,
            &p("pc/data"),
            stream(RawTar::new().file("new", b"n").finish()),
            ImportOptions::replace(),
        )
        .await
        .expect("replace import");
        assert!(
            !b.exists(&id, &p("pc/data/a")).await.unwrap(),
            "replace removed the old content"
        );
        b.remove(&id, &p("pc/data"), true).await.unwrap();
        for path in ["pc/data2/a", "pc/data.bak/a", "pc/dat/a"] {
            assert_eq!(
                &b.read(&id, &p(path)).await.unwrap()[..],
                b"keep",
                "{path} untouched"
            );
        }
    })
    .await;
}

/// A read-only host mount can be read but not written, and the host directory is left
/// as it was (backends with host mounts).
pub async fn read_only_mounts_refuse_writes(b: &dyn SandboxBackend) {
    let host = tempfile::tempdir().expect("host temp dir");
    std::fs::write(host.path().join("facts.md"), "fact").unwrap();
    let spec = spec().mount(crate::Mount::read_only(host.path(), p("files")));
    if !b.capabilities().host_mounts {
        assert_kind(
            b.create(&spec).await,
            ErrorKind::Unsupported,
            "a host mount without the host_mounts capability",
        );
        return;
    }
    with_sandbox(b, spec, |id| async move {
        assert_eq!(
            &b.read(&id, &p("files/facts.md")).await.unwrap()[..],
            b"fact"
        );
        assert_kind(
            b.write(&id, &p("files/new.md"), Bytes::from_static(b"x"))
                .await,
            ErrorKind::PermissionDenied,
            "write into a read-only mount",
        );
        if b.capabilities().shell {
            let out = b.run_shell(&id, "echo x > files/new.md").await.unwrap();
            assert!(
                !out.success(),
                "a sandbox process cannot write there either"
            );
        }
    })
    .await;
    let names: Vec<_> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["facts.md"], "the host directory is unchanged");
    assert_eq!(
        std::fs::read_to_string(host.path().join("facts.md")).unwrap(),
        "fact"
    );
}
