//! Cases for the extension methods every backend inherits: editing, search, uploads.

use bytes::Bytes;

use super::{assert_kind, p, spec, with_sandbox};
use crate::{EditOutcome, ErrorKind, SandboxBackend, SandboxBackendExt};

/// `edit_file` (seed semantics), text helpers, `glob` and `grep`.
pub async fn ext_editing_and_search(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        let f = p("ed/main.py");
        assert_eq!(
            b.edit_file(&id, &f, "", "x = 1\ny = 1\n").await.unwrap(),
            EditOutcome::Created
        );
        assert_kind(
            b.edit_file(&id, &f, "", "again").await,
            ErrorKind::AlreadyExists,
            "create over non-empty",
        );
        assert_kind(
            b.edit_file(&id, &f, " = 1", "= 2").await,
            ErrorKind::InvalidInput,
            "two matches",
        );
        assert_kind(
            b.edit_file(&id, &f, "z = 1", "z = 2").await,
            ErrorKind::InvalidInput,
            "no match",
        );
        assert_eq!(
            b.read_to_string(&id, &f).await.unwrap(),
            "x = 1\ny = 1\n",
            "failed edits change nothing"
        );
        assert_eq!(
            b.edit_file(&id, &f, "y = 1", "y = 2").await.unwrap(),
            EditOutcome::Replaced
        );
        assert_eq!(
            b.edit_file(&id, &f, "x = 1\n", "").await.unwrap(),
            EditOutcome::Replaced
        );
        assert_eq!(b.read_to_string(&id, &f).await.unwrap(), "y = 2\n");

        b.write_string(
            &id,
            &p("ed/pkg/util.py"),
            "def helper():\n    return 'needle'\n",
        )
        .await
        .unwrap();
        b.write_string(&id, &p("ed/pkg/notes.txt"), "no needle here? needle!\n")
            .await
            .unwrap();
        b.write(
            &id,
            &p("ed/pkg/blob.bin"),
            Bytes::from_static(b"needle\0binary"),
        )
        .await
        .unwrap();
        assert_eq!(
            b.glob(&id, "ed/**/*.py").await.unwrap(),
            vec![p("ed/main.py"), p("ed/pkg/util.py")]
        );
        assert_eq!(
            b.glob(&id, "ed/*.py").await.unwrap(),
            vec![p("ed/main.py")],
            "* does not cross /"
        );
        assert_kind(
            b.glob(&id, "ed/[").await,
            ErrorKind::InvalidInput,
            "bad glob",
        );

        let hits = b.grep(&id, &p("ed"), r"needle").await.unwrap();
        assert!(!hits.truncated, "a few matches are all there");
        let found: Vec<_> = hits
            .iter()
            .map(|m| (m.path.as_str(), m.line_number))
            .collect();
        assert_eq!(
            found,
            vec![("ed/pkg/notes.txt", 1), ("ed/pkg/util.py", 2)],
            "binary files skipped"
        );
        assert_kind(
            b.grep(&id, &p("ed"), "(").await,
            ErrorKind::InvalidInput,
            "bad regex",
        );
        b.write(&id, &p("ed/bad.txt"), Bytes::from_static(&[0xff, 0xfe]))
            .await
            .unwrap();
        assert_kind(
            b.read_to_string(&id, &p("ed/bad.txt")).await,
            ErrorKind::InvalidInput,
            "non-UTF-8 text",
        );
    })
    .await;
}

/// `upload_dir` then `download_dir` reproduce a host tree; a failed download leaves the
/// host destination untouched and no staging directory behind.
pub async fn ext_upload_download(b: &dyn SandboxBackend) {
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::create_dir_all(src.join("nested/deeper")).unwrap();
    std::fs::write(src.join("top.txt"), "top").unwrap();
    std::fs::write(src.join("nested/deeper/data.bin"), vec![9u8; 50_000]).unwrap();
    if b.capabilities().symlinks {
        std::os::unix::fs::symlink("top.txt", src.join("alias")).unwrap();
    }
    let dest = host.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("old"), "old").unwrap();
    let (src2, dest2) = (src.clone(), dest.clone());
    with_sandbox(b, spec(), |id| async move {
        b.upload_dir(&id, &src2, &p("up")).await.expect("upload");
        assert_eq!(
            b.read_to_string(&id, &p("up/top.txt")).await.unwrap(),
            "top"
        );
        assert_kind(
            b.upload_dir(&id, &src2.join("top.txt"), &p("up")).await,
            ErrorKind::InvalidInput,
            "upload a file",
        );
        assert_kind(
            b.download_dir(&id, &p("missing"), &dest2).await,
            ErrorKind::NotFound,
            "download missing",
        );
        assert_eq!(
            std::fs::read_to_string(dest2.join("old")).unwrap(),
            "old",
            "failed download changed nothing"
        );
        b.download_dir(&id, &p("up"), &dest2)
            .await
            .expect("download");
    })
    .await;
    assert!(
        !dest.join("old").exists(),
        "download replaces the destination"
    );
    assert_eq!(
        std::fs::read(dest.join("nested/deeper/data.bin")).unwrap(),
        vec![9u8; 50_000]
    );
    if b.capabilities().symlinks {
        assert_eq!(
            std::fs::read_link(dest.join("alias")).unwrap(),
            std::path::Path::new("top.txt")
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".sandcell-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "no staging left behind: {leftovers:?}"
    );
}
