//! What the HTTP hop costs: the exec round trip of `true` through FlyBackend →
//! sandcell-server (local backend) on loopback, against the same local backend called
//! in-process (target: at most 3 ms added at p50).
//!
//! Run: `cargo bench -p sandcell-remote --bench remote`.
//! `SANDCELL_BENCH_ROUNDS` (default 300) sets the rounds.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// p50 and p90 of `rounds` runs of `true`, after a warm-up.
async fn exec_times(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    rounds: usize,
) -> (Duration, Duration) {
    for _ in 0..10 {
        backend.run(id, ExecRequest::new(["true"])).await.unwrap();
    }
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let out = backend.run(id, ExecRequest::new(["true"])).await.unwrap();
        times.push(start.elapsed());
        assert!(out.success());
    }
    times.sort();
    (times[rounds / 2], times[rounds * 9 / 10])
}

fn main() {
    let rounds: usize = std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = common::serve_local().await;
        let remote = common::client(&server.url).await;
        let sandbox = remote.create(&SandboxSpec::new("default")).await.unwrap();

        let (local_p50, local_p90) = exec_times(&server.local, &sandbox.id, rounds).await;
        let (remote_p50, remote_p90) = exec_times(&remote, &sandbox.id, rounds).await;
        remote.destroy(&sandbox.id).await.unwrap();

        println!("exec `true`, {rounds} rounds each (same sandbox, same local backend)");
        println!(
            "  in-process local backend  : p50 {:>7.3} ms   p90 {:>7.3} ms",
            ms(local_p50),
            ms(local_p90)
        );
        println!(
            "  remote, wire over loopback: p50 {:>7.3} ms   p90 {:>7.3} ms",
            ms(remote_p50),
            ms(remote_p90)
        );
        println!(
            "  added by the remote hop    : p50 {:>7.3} ms   (target: at most 3 ms)",
            ms(remote_p50.saturating_sub(local_p50))
        );
    });
}
