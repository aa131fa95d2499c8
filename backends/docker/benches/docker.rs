//! The Docker backend's costs against the engine's own tools, as its issue asks:
//!
//! - exec round trip of `true`: through the agent (and the engine-exec fallback) vs the
//!   `docker exec` CLI (target: at most 0.5x);
//! - create-to-ready (create, then the first command answers) vs `docker run -d`
//!   (target: at most 1.0x);
//! - acquire of a fresh session through the manager's warm pool (target: p50 ≤ 2 ms),
//!   and the pool's fill and refill.
//!
//! Run: `cargo bench -p sandcell-docker --bench docker` with an engine running and
//! `SANDCELL_DOCKER_AGENT` pointing at the static agent (or let it build one).
//! `SANDCELL_BENCH_ROUNDS` (default 50) sets the rounds; all figures are medians.
//! `SANDCELL_BENCH_ONLY=warm_pool` runs the warm-pool rows alone.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxManager, SandboxSpec};
use sandcell_docker::DockerBackend;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn spec() -> SandboxSpec {
    SandboxSpec::new("default").label(common::TEST_LABEL.0, "bench")
}

fn docker_cli(args: &[&str]) -> Duration {
    let start = Instant::now();
    let status = Command::new("docker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the docker CLI runs");
    let took = start.elapsed();
    assert!(status.success(), "docker {args:?} failed");
    took
}

async fn exec_p50(backend: &DockerBackend, id: &sandcell::SandboxId, rounds: usize) -> Duration {
    for _ in 0..5 {
        backend.run(id, ExecRequest::new(["true"])).await.unwrap();
    }
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let out = backend.run(id, ExecRequest::new(["true"])).await.unwrap();
        times.push(start.elapsed());
        assert!(out.success());
    }
    median(times)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("docker: run with `cargo bench -p sandcell-docker --bench docker`");
        return;
    }
    if !common::engine_available().await {
        return;
    }
    let rounds = std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50usize)
        .max(3);
    let agent = common::backend(true).await;
    // Only the warm-pool rows, as the README's command for them asks.
    if std::env::var("SANDCELL_BENCH_ONLY").as_deref() == Ok("warm_pool") {
        let warm = warm_pools(&agent, rounds).await;
        println!("\nsandcell-docker warm pools, {rounds} rounds");
        print_warm(&warm);
        return;
    }
    let engine = common::backend(false).await;

    // Exec round trip.
    let a = agent.create(&spec()).await.unwrap();
    let e = engine.create(&spec()).await.unwrap();
    let via_agent = exec_p50(&agent, &a.id, rounds).await;
    let via_engine = exec_p50(&engine, &e.id, rounds).await;
    // Terminal round trip: one byte typed at `cat` on a raw pty, until it is back.
    let pty_rounds = rounds * 4;
    let measure = sandcell::testing::measure::pty_echo_round_trips;
    let pty_agent = median(measure(&agent, &a.id, pty_rounds).await.unwrap());
    let pty_engine = median(measure(&engine, &e.id, pty_rounds).await.unwrap());
    for _ in 0..3 {
        docker_cli(&["exec", a.id.as_str(), "true"]);
    }
    let cli = median(
        (0..rounds)
            .map(|_| docker_cli(&["exec", a.id.as_str(), "true"]))
            .collect(),
    );
    agent.destroy(&a.id).await.unwrap();
    engine.destroy(&e.id).await.unwrap();

    // Create-to-ready.
    let mut create = Vec::new();
    let mut ready = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let info = agent.create(&spec()).await.unwrap();
        create.push(start.elapsed());
        agent
            .run(&info.id, ExecRequest::new(["true"]))
            .await
            .unwrap();
        ready.push(start.elapsed());
        agent.destroy(&info.id).await.unwrap();
    }
    let mut run_d = Vec::new();
    for i in 0..rounds {
        let name = format!("sandcell-bench-run-{}-{i}", std::process::id());
        run_d.push(docker_cli(&[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            "none",
            "--init",
            "--label",
            "sandcell.test=bench",
            common::USER_IMAGE,
            "sleep",
            "1000",
        ]));
        docker_cli(&["rm", "-f", &name]);
    }
    let (create, ready, run_d) = (median(create), median(ready), median(run_d));

    let warm = warm_pools(&agent, rounds).await;
    let left = common::leftovers(&agent).await;
    for id in &left {
        let _ = agent
            .destroy(&sandcell::SandboxId::new(id.clone()).unwrap())
            .await;
    }

    println!("\nsandcell-docker, medians of {rounds} rounds");
    println!("| measurement | sandcell | baseline | ratio | target |");
    println!("|---|---|---|---|---|");
    println!(
        "| exec `true`, through the agent | {:.2} ms | `docker exec` CLI {:.1} ms | {:.3} | ≤ 0.5 |",
        ms(via_agent), ms(cli), ms(via_agent) / ms(cli)
    );
    println!(
        "| exec `true`, engine fallback | {:.1} ms | `docker exec` CLI {:.1} ms | {:.2} | (fallback) |",
        ms(via_engine), ms(cli), ms(via_engine) / ms(cli)
    );
    println!(
        "| terminal: one byte echoed by `cat` on a raw pty, through the agent | {:.3} ms | engine TTY exec {:.3} ms | {:.2} | |",
        ms(pty_agent), ms(pty_engine), ms(pty_agent) / ms(pty_engine)
    );
    println!(
        "| create to ready (create, first command answers) | {:.0} ms (create alone {:.0} ms) | `docker run -d` {:.0} ms | {:.2} | ≤ 1.0 |",
        ms(ready), ms(create), ms(run_d), ms(ready) / ms(run_d)
    );
    print_warm(&warm);
}

/// Warm-pool acquire through the manager, with the pool refilled one create at a time
/// and four at a time (the default) while the acquires go on.
async fn warm_pools(
    agent: &DockerBackend,
    rounds: usize,
) -> Vec<(usize, usize, sandcell::testing::measure::WarmPoolFigures)> {
    let pool = rounds.min(20);
    let mut warm = Vec::new();
    for parallel in [1, 4] {
        let data = tempfile::tempdir().unwrap();
        let manager = SandboxManager::builder(agent.clone())
            .data_dir(data.path())
            .warm_pool("bench", spec(), pool)
            .pool_fill_parallelism(parallel)
            .build()
            .await
            .unwrap();
        let figures = sandcell::testing::measure::warm_pool(&manager, &spec(), "bench", pool)
            .await
            .unwrap();
        manager.shutdown().await;
        warm.push((pool, parallel, figures));
    }
    warm
}

fn print_warm(warm: &[(usize, usize, sandcell::testing::measure::WarmPoolFigures)]) {
    for (pool, parallel, figures) in warm {
        println!(
            "| acquire of a fresh session from a warm pool of {pool} (refilling {parallel} at a time) | {:.2} ms | | | ≤ 2 ms |",
            ms(median(figures.acquires.clone()))
        );
        println!(
            "| warm pool of {pool}, {parallel} creates at a time: fill of the empty pool; refill after {pool} acquires | {:.0} ms ({:.0} ms each); {:.0} ms | | | |",
            ms(figures.fill),
            ms(figures.fill) / *pool as f64,
            ms(figures.refill)
        );
    }
}
