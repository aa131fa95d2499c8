//! The local backend's costs, measured against what they are compared with in its issue.
//!
//! Run: `cargo bench --features testing --bench local_backend` (as root, for overlay mounts). Environment:
//! `SANDCELL_BENCH_DIR` (default `target/bench-snapshot`; the 20,000-file template tree is
//! shared with `snapshot_vs_tar` and reused), `SANDCELL_BENCH_ROUNDS` (default 50).
//!
//! Prints p50s and ratios:
//! - create with a 20,000-file template: overlay vs copy;
//! - exec round trip of `true`: `SandboxBackendExt::run` vs a raw tokio spawn-and-wait;
//! - clone of a sandbox with 100 changed files (idle: its upper layer frozen and shared;
//!   busy: copied) vs a fresh create in the same round;
//! - watch latency, from a write's start to its event;
//! - terminal round trip: one byte typed at `cat` on a raw pty until it comes back.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{LocalBackend, WorkspaceStrategy};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn create_p50(backend: &LocalBackend, rounds: u64) -> (Duration, String) {
    let mut times = Vec::new();
    let mut used = String::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let info = backend
            .create(&SandboxSpec::new("big"))
            .await
            .expect("create");
        times.push(start.elapsed());
        used = info.details["workspace"].clone();
        backend.destroy(&info.id).await.expect("destroy");
    }
    (common::median(times), used)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("local_backend: run with `cargo bench --features testing --bench local_backend`");
        return;
    }
    let rounds = common::env_u64("SANDCELL_BENCH_ROUNDS", 50).max(3);
    let work = PathBuf::from(
        std::env::var("SANDCELL_BENCH_DIR").unwrap_or_else(|_| "target/bench-snapshot".to_owned()),
    );
    let tree = work.join("tree-20000");
    let marker = work.join("tree-20000.complete");
    if !marker.exists() {
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree).unwrap();
        eprintln!(
            "generating the 20,000-file template under {} ...",
            tree.display()
        );
        common::generate(&tree, 20_000, 0x5eed).unwrap();
        std::fs::write(&marker, b"").unwrap();
    }
    let stats = common::measure(&tree).unwrap();
    println!(
        "template: {} files, {:.1} MB; {rounds} rounds",
        stats.files,
        stats.bytes as f64 / 1e6
    );

    let root = tempfile::tempdir_in(&work).unwrap();
    let build = |strategy| {
        LocalBackend::builder()
            .root(root.path().join(format!("{strategy:?}")))
            .template("big", &tree)
            .workspace(strategy)
            .build()
            .unwrap()
    };
    let overlay = build(WorkspaceStrategy::Overlay);
    let copy = build(WorkspaceStrategy::Copy);
    let (overlay_p50, used) = create_p50(&overlay, rounds).await;
    assert_eq!(used, "overlay", "overlay mounts need root");
    let (copy_p50, _) = create_p50(&copy, (rounds / 10).max(3)).await;

    // Exec round trip: the backend against the same binary spawned directly.
    let sb = overlay.create(&SandboxSpec::new("big")).await.unwrap();
    let exec_rounds = rounds * 4;
    let mut ours = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..exec_rounds {
        let start = Instant::now();
        let out = overlay
            .run(&sb.id, ExecRequest::new(["true"]))
            .await
            .unwrap();
        ours.push(start.elapsed());
        assert!(out.success());
        let start = Instant::now();
        let status = tokio::process::Command::new("true").status().await.unwrap();
        raw.push(start.elapsed());
        assert!(status.success());
    }

    // Incremental snapshot after changing one small file, against a full snapshot.
    let small: sandcell::SandboxPath = "pkg00/mod00/file00000.rs".parse().unwrap();
    let full_start = Instant::now();
    let (full, _) = sandcell::snapshot::capture(
        &overlay,
        &sb.id,
        &sandcell::SandboxPath::root(),
        std::io::sink(),
        &sandcell::snapshot::PackOptions::default(),
    )
    .await
    .unwrap();
    let full_time = full_start.elapsed();
    let mut inc_times = Vec::new();
    let mut inc_bytes = 0;
    for round in 0..rounds {
        overlay
            .write_string(&sb.id, &small, &format!("// edit {round}\n"))
            .await
            .unwrap();
        let start = Instant::now();
        let (inc, _) = sandcell::snapshot::capture_changes(
            &overlay,
            &sb.id,
            std::io::sink(),
            &sandcell::snapshot::PackOptions::default(),
        )
        .await
        .unwrap();
        inc_times.push(start.elapsed());
        inc_bytes = inc.size_bytes;
    }
    // Clone of a sandbox whose upper layer holds 100 changed files, against a fresh
    // create from the same template timed in the same round (the source's own). An
    // idle source has its upper layer frozen and shared; a busy one (a command running
    // in its workspace) has it copied.
    let mut clone_times = Vec::new();
    let mut busy_clone_times = Vec::new();
    let mut fresh_times = Vec::new();
    for round in 0..rounds {
        let start = Instant::now();
        let source = overlay.create(&SandboxSpec::new("big")).await.unwrap();
        fresh_times.push(start.elapsed());
        for n in 0..100 {
            let path: sandcell::SandboxPath = format!("changed/file{n:03}.txt").parse().unwrap();
            overlay
                .write_string(&source.id, &path, &"changed\n".repeat(50))
                .await
                .unwrap();
        }
        let busy = round % 2 == 1;
        let mut sleeper = if busy {
            Some(
                overlay
                    .exec(&source.id, ExecRequest::new(["sleep", "60"]))
                    .await
                    .unwrap(),
            )
        } else {
            None
        };
        let start = Instant::now();
        let clone = overlay
            .clone_sandbox(&source.id, Default::default())
            .await
            .unwrap();
        let took = start.elapsed();
        if busy {
            busy_clone_times.push(took);
        } else {
            clone_times.push(took);
        }
        if let Some(sleeper) = sleeper.as_mut() {
            sleeper.kill().await.unwrap();
        }
        overlay.destroy(&clone.id).await.unwrap();
        overlay.destroy(&source.id).await.unwrap();
    }
    let clone_p50 = common::median(clone_times);
    let busy_clone_p50 = common::median(busy_clone_times);
    let fresh_p50 = common::median(fresh_times);

    // Watch latency: from the start of a write to its event arriving.
    let mut events = overlay
        .watch(
            &sb.id,
            &sandcell::SandboxPath::root(),
            sandcell::WatchOptions::new(),
        )
        .await
        .unwrap();
    let mut watch_times = Vec::new();
    for round in 0..rounds * 4 {
        let name = format!("watched{round}.txt");
        let path: sandcell::SandboxPath = name.parse().unwrap();
        let start = Instant::now();
        overlay.write_string(&sb.id, &path, "x").await.unwrap();
        loop {
            let event = futures::StreamExt::next(&mut events)
                .await
                .unwrap()
                .unwrap();
            if event.path.as_str() == name {
                break;
            }
        }
        watch_times.push(start.elapsed());
    }
    drop(events);
    let watch_p50 = common::median(watch_times);

    // Terminal round trip: one byte typed at `cat` on a raw terminal, until it is back.
    let pty_times =
        sandcell::testing::measure::pty_echo_round_trips(&overlay, &sb.id, rounds as usize * 4)
            .await
            .unwrap();
    let pty_p50 = common::median(pty_times);

    overlay.destroy(&sb.id).await.unwrap();
    let (ours, raw) = (common::median(ours), common::median(raw));
    let inc_p50 = common::median(inc_times);

    println!();
    println!("| measurement | sandcell-local | baseline | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| create, 20,000-file template (p50) | overlay {:.2} ms | copy {:.0} ms | copy / overlay = {:.0}x |",
        ms(overlay_p50),
        ms(copy_p50),
        copy_p50.as_secs_f64() / overlay_p50.as_secs_f64()
    );
    println!(
        "| exec round trip of `true` (p50) | {:.2} ms | tokio spawn+wait {:.2} ms | {:.2} |",
        ms(ours),
        ms(raw),
        ours.as_secs_f64() / raw.as_secs_f64()
    );
    println!(
        "| incremental snapshot after a one-file edit (p50) | {:.2} ms, {} bytes | full snapshot {:.0} ms, {} bytes | {:.4}% of the bytes |",
        ms(inc_p50),
        inc_bytes,
        ms(full_time),
        full.size_bytes,
        100.0 * inc_bytes as f64 / full.size_bytes as f64
    );
    println!(
        "| clone, 20,000-file template + 100 changed files, idle source (p50) | {:.2} ms | fresh create {:.2} ms | {:.2} |",
        ms(clone_p50),
        ms(fresh_p50),
        clone_p50.as_secs_f64() / fresh_p50.as_secs_f64()
    );
    println!(
        "| the same, a command running in the source (copies the 100 files) (p50) | {:.2} ms | fresh create {:.2} ms | {:.2} |",
        ms(busy_clone_p50),
        ms(fresh_p50),
        busy_clone_p50.as_secs_f64() / fresh_p50.as_secs_f64()
    );
    println!(
        "| watch: write to event (p50) | {:.3} ms | | |",
        ms(watch_p50)
    );
    println!(
        "| terminal: one byte echoed by `cat` on a raw pty (p50) | {:.3} ms | | |",
        ms(pty_p50)
    );
}
