//! Criterion benches of the snapshot format: pack and unpack of a small generated tree.
//!
//! Run: `cargo bench --bench snapshot`. The head-to-head comparison with `tar | zstd` on
//! the full 20,000-file tree is `cargo bench --bench snapshot_vs_tar`.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use criterion::{criterion_main, Criterion, Throughput};
use sandcell::archive::ArchiveLimits;
use sandcell::raw::archive::EntryChecker;
use sandcell::snapshot::{self, PackOptions, SnapshotManifest};

fn bench_snapshot(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).expect("tree dir");
    let stats = common::generate(&tree, 1_000, 7).expect("generate");
    let opts = PackOptions::default();

    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(stats.bytes));
    group.bench_function("pack_dir 1000 files", |b| {
        b.iter(|| snapshot::pack_dir(&tree, std::io::sink(), &opts).expect("pack"))
    });
    let mut blob = Vec::new();
    let packed = snapshot::pack_dir(&tree, &mut blob, &opts).expect("pack");
    let manifest = SnapshotManifest::new(&packed, "bench", "bench");
    let mut n = 0u32;
    group.bench_function("unpack_to_dir 1000 files", |b| {
        b.iter(|| {
            n += 1;
            let dest = dir.path().join(format!("out{n}"));
            snapshot::unpack_to_dir(
                std::io::Cursor::new(blob.clone()),
                &manifest,
                &dest,
                &ArchiveLimits::default(),
            )
            .expect("unpack");
            std::fs::remove_dir_all(&dest).expect("cleanup");
        })
    });
    group.finish();

    c.bench_function("entry_checker 10k nested entries", |b| {
        let names: Vec<String> = (0..10_000)
            .map(|i| format!("pkg{}/mod{}/file{i}.rs", i % 50, i % 8))
            .collect();
        b.iter(|| {
            let mut checker = EntryChecker::new(ArchiveLimits::default());
            for name in &names {
                checker
                    .check(
                        tar::EntryType::Regular,
                        name.as_bytes(),
                        None,
                        0o644,
                        100,
                        0,
                    )
                    .expect("valid entry");
            }
        })
    });
}

// criterion's macros generate undocumented items.
mod group {
    #![allow(missing_docs)]
    criterion::criterion_group!(benches, super::bench_snapshot);
}

criterion_main!(group::benches);
