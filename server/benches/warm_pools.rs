//! Warm pools on the backends one sandcell-server serves: a fresh session acquired from
//! a manager's warm pool (target: at most 2 ms p50), the pool's fill and its refill,
//! on the local backend in-process, the remote backend (wire protocol) and the E2B
//! provider (E2B's API), all three over the same local backend. Each manager keeps its
//! state in SQLite (`data_dir`), as a deployment does.
//!
//! Run: `cargo bench -p sandcell-server --bench warm_pools`.
//! `SANDCELL_BENCH_ROUNDS` (default 20) sets the pool's size, which is the number of
//! acquires.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use sandcell::testing::measure::{warm_pool, WarmPoolFigures};
use sandcell::{SandboxBackend, SandboxManager, SandboxSpec};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn measure<B: SandboxBackend>(backend: B, size: usize) -> WarmPoolFigures {
    let data = tempfile::tempdir().unwrap();
    let spec = SandboxSpec::new("default");
    let manager = SandboxManager::builder(backend)
        .data_dir(data.path())
        .warm_pool("bench", spec.clone(), size)
        .build()
        .await
        .unwrap();
    let figures = warm_pool(&manager, &spec, "bench", size).await.unwrap();
    manager.shutdown().await;
    figures
}

fn row(name: &str, size: usize, f: WarmPoolFigures) {
    println!(
        "| {name} | {:.3} ms | {:.0} ms ({:.1} ms each) | {:.0} ms |",
        ms(p50(f.acquires)),
        ms(f.fill),
        ms(f.fill) / size as f64,
        ms(f.refill)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let size: usize = std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20)
        .max(3);
    let server = common::serve_local_with(sandcell_server::ServerConfig::new(common::TOKEN)).await;
    println!("warm pool of {size}: acquire of a fresh session p50, fill of the empty pool, refill after {size} acquires");
    println!("| backend | acquire p50 (target ≤ 2 ms) | fill | refill |");
    println!("|---|---|---|---|");
    row(
        "local, in-process",
        size,
        measure(server.local.clone(), size).await,
    );
    row(
        "remote (wire protocol over loopback)",
        size,
        measure(common::client(&server.url).await, size).await,
    );
    row(
        "E2B provider (E2B's API over loopback)",
        size,
        measure(common::e2b_client(&server.url).await, size).await,
    );
    let left = server.local.list(&Default::default()).await.unwrap();
    assert!(left.is_empty(), "sandboxes left behind: {left:?}");
}
