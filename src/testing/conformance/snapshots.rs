//! Snapshot cases: full and incremental round trips, and hostile snapshots refused.

use bytes::Bytes;

use super::files::plant;
use super::Fingerprint;
use super::{assert_kind, fingerprint, p, spec, with_sandbox};
use crate::archive::{ArchiveLimits, ImportOptions};
use crate::snapshot::{self, PackOptions, SnapshotManifest};
use crate::testing::RawTar;
use crate::{ErrorKind, FileKind, SandboxBackend, SandboxBackendExt, SandboxPath};

/// A snapshot taken on this backend restores into a fresh sandbox exactly.
pub async fn snapshot_round_trip(b: &dyn SandboxBackend) {
    let mut taken: Option<(SnapshotManifest, Vec<u8>, Fingerprint)> = None;
    let slot = &mut taken;
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("snap/a.txt"), Bytes::from_static(b"alpha"))
            .await
            .unwrap();
        b.write(&id, &p("snap/deep/b.bin"), Bytes::from(vec![42u8; 100_000]))
            .await
            .unwrap();
        if b.capabilities().symlinks {
            plant(
                b,
                &id,
                RawTar::new().symlink("snap/link", "deep/b.bin").finish(),
            )
            .await;
        }
        let (manifest, blob) = snapshot::capture(
            b,
            &id,
            &SandboxPath::root(),
            Vec::new(),
            &PackOptions::default(),
        )
        .await
        .expect("capture");
        assert_eq!(manifest.backend, b.name());
        assert_eq!(manifest.size_bytes as usize, blob.len());
        assert!(manifest.entry_count >= 4);
        let back = SnapshotManifest::from_json(&manifest.to_json().unwrap()).unwrap();
        assert_eq!(back, manifest);
        *slot = Some((manifest, blob, fingerprint(b, &id).await));
    })
    .await;
    let (manifest, blob, expected) = taken.expect("snapshot taken");
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("stale"), Bytes::from_static(b"replaced"))
            .await
            .unwrap();
        snapshot::restore(
            b,
            &id,
            &SandboxPath::root(),
            std::io::Cursor::new(blob),
            &manifest,
            ImportOptions::replace(),
        )
        .await
        .expect("restore");
        assert_eq!(
            fingerprint(b, &id).await,
            expected,
            "restored workspace equals the snapshot"
        );
    })
    .await;
}

/// Changes captured since the template restore exactly into a fresh sandbox of the same
/// template: added, overwritten and deleted files alike (deletions need a template with
/// files; an empty template still checks additions).
pub async fn incremental_snapshot_round_trip(b: &dyn SandboxBackend) {
    if !b.capabilities().incremental_snapshot {
        return with_sandbox(b, spec(), |id| async move {
            assert_kind(
                b.export_changes(&id).await.map(|_| ()),
                ErrorKind::Unsupported,
                "export_changes without the incremental_snapshot capability",
            );
        })
        .await;
    }
    let mut taken: Option<(SnapshotManifest, Vec<u8>, Fingerprint)> = None;
    let slot = &mut taken;
    with_sandbox(b, spec(), |id| async move {
        let template_files: Vec<_> = b
            .walk(&id, &SandboxPath::root())
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == FileKind::File)
            .collect();
        if let Some(first) = template_files.first() {
            b.write(&id, &first.path, Bytes::from_static(b"overwritten"))
                .await
                .unwrap();
        }
        if let Some(second) = template_files.get(1) {
            b.remove(&id, &second.path, false).await.unwrap();
        }
        b.write(&id, &p("inc/new/deep.txt"), Bytes::from_static(b"added"))
            .await
            .unwrap();
        b.mkdir(&id, &p("inc/empty")).await.unwrap();
        let (manifest, blob) =
            snapshot::capture_changes(b, &id, Vec::new(), &PackOptions::default())
                .await
                .expect("capture changes");
        assert!(manifest.incremental);
        assert_eq!(
            manifest.deleted.len(),
            usize::from(template_files.len() > 1)
        );
        *slot = Some((manifest, blob, fingerprint(b, &id).await));
    })
    .await;
    let (manifest, blob, expected) = taken.expect("changes taken");
    with_sandbox(b, spec(), |id| async move {
        snapshot::restore(
            b,
            &id,
            &SandboxPath::root(),
            std::io::Cursor::new(blob),
            &manifest,
            ImportOptions::replace(),
        )
        .await
        .expect("restore changes");
        assert_eq!(
            fingerprint(b, &id).await,
            expected,
            "template + changes equals the original"
        );
    })
    .await;
}

/// Restoring a corrupted blob, a blob whose manifest hash does not match, or a zstd
/// bomb fails with a typed error and leaves the workspace unchanged.
pub async fn hostile_snapshots_are_rejected(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("hs/keep.txt"), Bytes::from_static(b"precious")).await.unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f.txt"), vec![b'z'; 200_000]).unwrap();
        let mut blob = Vec::new();
        let packed = snapshot::pack_dir(src.path(), &mut blob, &PackOptions::default()).unwrap();
        let manifest = SnapshotManifest::new(&packed, b.name(), "default");

        let before = fingerprint(b, &id).await;
        let id = &id;
        let restore = |blob: Vec<u8>, manifest: SnapshotManifest, options: ImportOptions| async move {
            snapshot::restore(b, id, &SandboxPath::root(), std::io::Cursor::new(blob), &manifest, options).await
        };

        let mut flipped = blob.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        assert_kind(restore(flipped, manifest.clone(), ImportOptions::replace()).await, ErrorKind::Corrupt, "flipped byte");
        assert_eq!(fingerprint(b, id).await, before, "corrupt blob changed nothing");

        let mut wrong = manifest.clone();
        wrong.sha256 = "0".repeat(64);
        assert_kind(restore(blob.clone(), wrong, ImportOptions::replace()).await, ErrorKind::Corrupt, "hash mismatch");
        assert_eq!(fingerprint(b, id).await, before, "mismatched blob changed nothing");

        let mut truncated = blob.clone();
        truncated.truncate(truncated.len() - 10);
        assert_kind(restore(truncated, manifest.clone(), ImportOptions::replace()).await, ErrorKind::Corrupt, "truncated blob");

        // A bomb: 512 MiB of zeros (a few KiB compressed) with a manifest that matches it.
        let mut bomb = Vec::new();
        {
            let mut enc = zstd::stream::write::Encoder::new(&mut bomb, 3).unwrap();
            let zeros = vec![0u8; 1 << 20];
            for _ in 0..512 {
                std::io::Write::write_all(&mut enc, &zeros).unwrap();
            }
            enc.finish().unwrap();
        }
        let mut bomb_manifest = manifest.clone();
        bomb_manifest.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bomb));
        let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
        assert_kind(
            restore(bomb, bomb_manifest, ImportOptions::replace().limits(limits)).await,
            ErrorKind::LimitExceeded,
            "zstd bomb",
        );
        assert_eq!(fingerprint(b, id).await, before, "bomb changed nothing");

        let mut future = manifest.clone();
        future.format_version = 99;
        assert_kind(restore(blob, future, ImportOptions::replace()).await, ErrorKind::Unsupported, "unknown format");
    })
    .await;
}
