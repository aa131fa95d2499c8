//! Snapshot pack and unpack against `tar | zstd`, on one generated tree, in one run.
//!
//! Run: `cargo bench --bench snapshot_vs_tar` (needs `tar` and `zstd` on PATH).
//! Environment: `SANDCELL_BENCH_FILES` (default 20000), `SANDCELL_BENCH_ROUNDS`
//! (default 3), `SANDCELL_BENCH_DIR` (default `target/bench-snapshot`; the generated tree
//! is kept there and reused by later runs).
//!
//! Prints the median wall time of each side and the ratio sandcell / tar: below 1.0 means
//! sandcell is faster. Both unpack sides read the same blob (a sandcell snapshot is a
//! plain tar.zst), and sandcell's unpack includes its sha256 verification, entry checks
//! and the staging swap-in.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandcell::archive::ArchiveLimits;
use sandcell::snapshot::{self, PackOptions, SnapshotManifest};

fn sh(script: &str) -> Duration {
    let start = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .status()
        .expect("run sh");
    let took = start.elapsed();
    assert!(status.success(), "command failed: {script}");
    took
}

/// Flushes dirty pages so one step's writeback is not billed to the next.
fn settle() {
    let _ = Command::new("sync").status();
}

fn fresh(path: &Path) {
    let _ = fs::remove_dir_all(path);
    let _ = fs::remove_file(path);
}

fn main() {
    // `cargo bench` passes `--bench`; any other invocation (e.g. `cargo test --benches`)
    // only checks that the binary starts.
    if !std::env::args().any(|a| a == "--bench") {
        println!("snapshot_vs_tar: run with `cargo bench --bench snapshot_vs_tar`");
        return;
    }
    for tool in ["tar", "zstd"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            ok,
            "{tool} is not installed; the comparison needs it (apt-get install {tool})"
        );
    }
    let files = common::env_u64("SANDCELL_BENCH_FILES", 20_000);
    let rounds = common::env_u64("SANDCELL_BENCH_ROUNDS", 3).max(1);
    let work = PathBuf::from(
        std::env::var("SANDCELL_BENCH_DIR").unwrap_or_else(|_| "target/bench-snapshot".to_owned()),
    );
    let tree = work.join(format!("tree-{files}"));
    fs::create_dir_all(&work).expect("bench dir");
    let marker = work.join(format!("tree-{files}.complete"));
    if !marker.exists() {
        fresh(&tree);
        fs::create_dir_all(&tree).expect("tree dir");
        eprintln!("generating {files} files under {} ...", tree.display());
        common::generate(&tree, files, 0x5eed).expect("generate tree");
        fs::write(&marker, b"").expect("marker");
    }
    let stats = common::measure(&tree).expect("measure tree");
    println!(
        "tree: {} files, {:.1} MB, {} rounds, {} cores",
        stats.files,
        stats.bytes as f64 / 1e6,
        rounds,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );

    let ours = work.join("sandcell.tar.zst");
    let theirs = work.join("tar.tar.zst");
    let out_ours = work.join("out-sandcell");
    let out_theirs = work.join("out-tar");
    let opts = PackOptions::default();
    let limits = ArchiveLimits::default();
    let (tq, oq, ttq) = (
        shell_quote(&tree),
        shell_quote(&out_theirs),
        shell_quote(&theirs),
    );
    let bq = shell_quote(&ours);

    // Warm the page cache for both sides alike.
    sh(&format!("tar -cf - -C {tq} . > /dev/null"));

    let (mut pack_s, mut pack_t, mut unpack_s, mut unpack_t) = (vec![], vec![], vec![], vec![]);
    let mut manifest: Option<SnapshotManifest> = None;
    for round in 0..rounds {
        // Alternate which side goes first, so neither always inherits the other's
        // cache and writeback state.
        let ours_first = round % 2 == 0;
        let pack_ours = |pack_s: &mut Vec<Duration>| {
            fresh(&ours);
            settle();
            let start = Instant::now();
            let file = fs::File::create(&ours).expect("blob file");
            let packed = snapshot::pack_dir(
                &tree,
                std::io::BufWriter::with_capacity(1 << 20, file),
                &opts,
            )
            .expect("pack");
            pack_s.push(start.elapsed());
            SnapshotManifest::new(&packed, "bench", "bench")
        };
        let pack_theirs = |pack_t: &mut Vec<Duration>| {
            fresh(&theirs);
            settle();
            pack_t.push(sh(&format!(
                "tar -cf - -C {tq} . | zstd -1 -T0 -q -c > {ttq}"
            )));
        };
        let m = if ours_first {
            let m = pack_ours(&mut pack_s);
            pack_theirs(&mut pack_t);
            m
        } else {
            pack_theirs(&mut pack_t);
            pack_ours(&mut pack_s)
        };

        let unpack_ours = |unpack_s: &mut Vec<Duration>| {
            fresh(&out_ours);
            settle();
            let start = Instant::now();
            snapshot::unpack_to_dir(
                fs::File::open(&ours).expect("open blob"),
                &m,
                &out_ours,
                &limits,
            )
            .expect("unpack");
            unpack_s.push(start.elapsed());
        };
        let unpack_theirs = |unpack_t: &mut Vec<Duration>| {
            fresh(&out_theirs);
            fs::create_dir_all(&out_theirs).expect("out dir");
            settle();
            unpack_t.push(sh(&format!("zstd -dc {bq} | tar -xf - -C {oq}")));
        };
        if ours_first {
            unpack_ours(&mut unpack_s);
            unpack_theirs(&mut unpack_t);
        } else {
            unpack_theirs(&mut unpack_t);
            unpack_ours(&mut unpack_s);
        }

        eprintln!(
            "round {round}: pack {:?} vs {:?}, unpack {:?} vs {:?}",
            pack_s[round as usize],
            pack_t[round as usize],
            unpack_s[round as usize],
            unpack_t[round as usize]
        );
        manifest = Some(m);
    }
    let m = manifest.expect("at least one round");
    let restored = common::measure(&out_ours).expect("measure restored");
    assert_eq!(
        (restored.files, restored.bytes),
        (stats.files, stats.bytes),
        "restore is complete"
    );
    let theirs_size = fs::metadata(&theirs).map(|m| m.len()).unwrap_or(0);

    let (ps, pt, us, ut) = (
        common::median(pack_s),
        common::median(pack_t),
        common::median(unpack_s),
        common::median(unpack_t),
    );
    println!();
    println!("| operation | sandcell | tar + zstd | ratio (sandcell / tar) |");
    println!("|---|---|---|---|");
    println!(
        "| pack + compress (zstd -1) | {:.2} s | {:.2} s | {:.2} |",
        ps.as_secs_f64(),
        pt.as_secs_f64(),
        ps.as_secs_f64() / pt.as_secs_f64()
    );
    println!(
        "| decompress + unpack | {:.2} s | {:.2} s | {:.2} |",
        us.as_secs_f64(),
        ut.as_secs_f64(),
        us.as_secs_f64() / ut.as_secs_f64()
    );
    println!(
        "blob: sandcell {:.1} MB, tar|zstd {:.1} MB; {} entries; tar stream {:.1} MB",
        m.size_bytes as f64 / 1e6,
        theirs_size as f64 / 1e6,
        m.entry_count,
        m.tar_bytes as f64 / 1e6
    );
    fresh(&out_ours);
    fresh(&out_theirs);
    fresh(&ours);
    fresh(&theirs);
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}
