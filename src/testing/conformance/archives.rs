//! Archive cases: export and import round trips, and hostile archives refused.

use bytes::Bytes;
use futures::StreamExt;

use super::files::plant;
use super::{assert_kind, fingerprint, host_dir_is_empty, p, spec, stream, with_sandbox};
use crate::archive::{ArchiveLimits, ImportOptions};
use crate::testing::RawTar;
use crate::{ByteStream, ErrorKind, FileKind, SandboxBackend, SandboxBackendExt, SandboxId};

/// Export then import elsewhere reproduces the tree; symlinks stay symlinks; merge keeps
/// what the archive does not replace; replace leaves exactly the archive.
pub async fn archive_round_trip(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("ar/src/a.txt"), Bytes::from_static(b"alpha"))
            .await
            .unwrap();
        b.write(&id, &p("ar/src/nested/b.bin"), Bytes::from(vec![7u8; 3000]))
            .await
            .unwrap();
        b.mkdir(&id, &p("ar/src/emptydir")).await.unwrap();
        if b.capabilities().symlinks {
            plant(
                b,
                &id,
                RawTar::new().symlink("ar/src/link", "a.txt").finish(),
            )
            .await;
        }
        let tar = b.export_tar(&id, &p("ar/src")).await.expect("export");
        b.import_tar(&id, &p("ar/dst"), tar, ImportOptions::merge())
            .await
            .expect("import");
        let src = b.walk(&id, &p("ar/src")).await.unwrap();
        let dst = b.walk(&id, &p("ar/dst")).await.unwrap();
        let names = |v: &[crate::DirEntry], base: &str| -> Vec<(String, FileKind)> {
            v.iter()
                .map(|e| {
                    (
                        e.path.strip_prefix(&p(base)).unwrap().as_str().to_owned(),
                        e.kind,
                    )
                })
                .collect()
        };
        assert_eq!(names(&src, "ar/src"), names(&dst, "ar/dst"));
        assert_eq!(
            b.read(&id, &p("ar/dst/nested/b.bin")).await.unwrap().len(),
            3000
        );
        if b.capabilities().symlinks {
            let link = b.stat(&id, &p("ar/dst/link")).await.unwrap();
            assert_eq!(
                link.kind,
                FileKind::Symlink,
                "symlinks are exported as symlinks"
            );
            assert_eq!(link.symlink_target.as_deref(), Some("a.txt"));
        }

        b.write(&id, &p("ar/dst/extra"), Bytes::from_static(b"x"))
            .await
            .unwrap();
        let tar = RawTar::new().file("a.txt", b"merged").finish();
        b.import_tar(&id, &p("ar/dst"), stream(tar), ImportOptions::merge())
            .await
            .unwrap();
        assert_eq!(
            &b.read(&id, &p("ar/dst/a.txt")).await.unwrap()[..],
            b"merged"
        );
        assert!(
            b.exists(&id, &p("ar/dst/extra")).await.unwrap(),
            "merge keeps other files"
        );

        let tar = RawTar::new().file("only", b"1").finish();
        b.import_tar(&id, &p("ar/dst"), stream(tar), ImportOptions::replace())
            .await
            .unwrap();
        let left: Vec<_> = b
            .list_dir(&id, &p("ar/dst"))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            left,
            vec!["only".to_owned()],
            "replace leaves exactly the archive"
        );
        assert_kind(
            b.export_tar(&id, &p("ar/missing")).await.map(|_| ()),
            ErrorKind::NotFound,
            "export missing",
        );
    })
    .await;
}

/// One hostile archive: the import fails with `kind`, and the workspace is unchanged.
async fn rejects(
    b: &dyn SandboxBackend,
    id: &SandboxId,
    what: &str,
    tar: ByteStream,
    options: ImportOptions,
    kind: ErrorKind,
) {
    let before = fingerprint(b, id).await;
    assert_kind(b.import_tar(id, &p("imp"), tar, options).await, kind, what);
    assert_eq!(
        fingerprint(b, id).await,
        before,
        "{what}: workspace unchanged after the failed import"
    );
}

/// Every hostile archive entry ends in its typed error with nothing changed: `..`
/// entries, absolute entries, symlink-then-file, link-to-`..`-then-nested-dir, hard
/// links out, devices and FIFOs, setuid bits, entry-count and size caps, a stream
/// error, and entries beneath a symlink already in the workspace.
pub async fn hostile_archives_are_rejected(b: &dyn SandboxBackend) {
    let outside = tempfile::tempdir().expect("host temp dir");
    let outside_path = outside.path().to_str().expect("utf-8").to_owned();
    with_sandbox(b, spec(), |id| {
        let outside_path = outside_path.clone();
        async move {
            // Something already there that a failed import must not disturb.
            b.write(&id, &p("imp/existing.txt"), Bytes::from_static(b"precious"))
                .await
                .unwrap();
            for case in crate::testing::hostile_archives(&outside_path) {
                rejects(
                    b,
                    &id,
                    case.name,
                    stream(case.tar),
                    case.options,
                    case.expected,
                )
                .await;
            }
            // An error raised by the stream itself (e.g. a failed hash check at its end).
            let r = ImportOptions::replace;
            let m = ImportOptions::merge;
            let good_then_error: ByteStream = futures::stream::iter(vec![
                Ok(RawTar::new().file("partial", b"x").finish()),
                Err(crate::Error::corrupt("injected stream failure")),
            ])
            .boxed();
            rejects(
                b,
                &id,
                "stream error after valid entries",
                good_then_error,
                r(),
                ErrorKind::Corrupt,
            )
            .await;

            // Garbage after the end marker cannot run on forever.
            let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
            let trailing: ByteStream = futures::stream::iter(
                std::iter::once(Ok(RawTar::new().file("f", b"x").finish()))
                    .chain((0..64).map(|_| Ok(Bytes::from(vec![0u8; 1 << 20])))),
            )
            .boxed();
            rejects(
                b,
                &id,
                "endless trailing zeros",
                trailing,
                m().limits(limits),
                ErrorKind::LimitExceeded,
            )
            .await;

            if b.capabilities().symlinks {
                plant(
                    b,
                    &id,
                    RawTar::new().symlink("imp/exit", &outside_path).finish(),
                )
                .await;
                rejects(
                    b,
                    &id,
                    "entry beneath a symlink already in the workspace",
                    stream(RawTar::new().file("exit/owned", b"x").finish()),
                    m(),
                    ErrorKind::PermissionDenied,
                )
                .await;
            }
            assert_eq!(
                &b.read(&id, &p("imp/existing.txt")).await.unwrap()[..],
                b"precious"
            );
        }
    })
    .await;
    assert!(
        host_dir_is_empty(outside.path()),
        "nothing was written outside the workspace"
    );
}
