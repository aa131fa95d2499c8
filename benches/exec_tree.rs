//! What a command costs on the local backend at each isolation level, against a raw
//! spawn: each command runs in a cgroup of its own (so a timeout or kill reaches what
//! left its process group), made before it starts and removed after it ends; at the
//! default level, `Landlock`, it also enforces its ruleset and, without a network, a
//! seccomp filter before it execs.
//!
//! Run: `cargo bench --bench exec_tree` (as root, where sandboxes get cgroups).
//! `SANDCELL_BENCH_ROUNDS` (default 200) rounds, the backend and a raw tokio
//! spawn-and-wait of the same command alternating. Prints p50s and the time the
//! backend adds, for `true` and for a shell that forks 100 children and waits for them,
//! at `Landlock` (the default; where the kernel has it) and at `None`.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

const FORK_100: &str = "i=0; while [ $i -lt 100 ]; do true & i=$((i+1)); done; wait";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("exec_tree: run with `cargo bench --bench exec_tree`");
        return;
    }
    let rounds = common::env_u64("SANDCELL_BENCH_ROUNDS", 200).max(3);
    for isolation in [Isolation::Landlock, Isolation::None] {
        let root = tempfile::tempdir().unwrap();
        let Ok(backend) = LocalBackend::builder()
            .root(root.path())
            .isolation(isolation)
            .build()
        else {
            println!("isolation {isolation:?}: not available here");
            continue;
        };
        measure(&backend, rounds, &format!("{isolation:?}")).await;
    }
}

async fn measure(backend: &LocalBackend, rounds: u64, level: &str) {
    let sb = backend.create(&SandboxSpec::default()).await.unwrap();
    let tracked = sb.details.contains_key("cgroup");
    println!("isolation {level}, {rounds} rounds; per-command cgroups: {tracked}");
    for (name, argv) in [
        ("true", vec!["true"]),
        ("sh forking 100 children", vec!["sh", "-c", FORK_100]),
    ] {
        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let start = Instant::now();
            let out = backend
                .run(&sb.id, ExecRequest::new(argv.clone()))
                .await
                .unwrap();
            ours.push(start.elapsed());
            assert!(out.success());
            let start = Instant::now();
            let status = tokio::process::Command::new(argv[0])
                .args(&argv[1..])
                .status()
                .await
                .unwrap();
            raw.push(start.elapsed());
            assert!(status.success());
        }
        let (ours, raw) = (common::median(ours), common::median(raw));
        println!(
            "| {name} | {:.2} ms | raw spawn {:.2} ms | {:.2}x | +{:.2} ms |",
            ms(ours),
            ms(raw),
            ours.as_secs_f64() / raw.as_secs_f64(),
            ms(ours.saturating_sub(raw))
        );
    }
    backend.destroy(&sb.id).await.unwrap();
}
