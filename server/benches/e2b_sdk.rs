//! What E2B's Python SDK and sandcell's own E2B provider cost against sandcell-server:
//! `commands.run("true")` p50 through the SDK (Connect over HTTP/2 on loopback) and the
//! provider's exec round trip (`E2bBackend`, Connect over HTTP/1.1), each against the
//! same command executed in-process on the same local backend; and
//! create-to-first-command through the SDK.
//!
//! Run: `SANDCELL_E2B_PYTHON=target/e2b-venv/bin/python cargo bench -p sandcell-server
//! --bench e2b_sdk` (the interpreter needs `e2b`; `.ci/run` makes that
//! virtual environment). `SANDCELL_BENCH_ROUNDS` (default 300) sets the rounds, a tenth
//! of them (at least 5) for creates.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_server::ServerConfig;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let rounds: usize = std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(300);
    let python = std::env::var("SANDCELL_E2B_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = common::serve_local_with(ServerConfig::new(common::TOKEN)).await;
        // In-process: the command the SDK runs, on the same backend.
        let sandbox = server.local.create(&SandboxSpec::new("default")).await.unwrap();
        let command = || ExecRequest::new(["/bin/bash", "-l", "-c", "true"]).stdin("");
        for _ in 0..10 {
            server.local.run(&sandbox.id, command()).await.unwrap();
        }
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            let out = server.local.run(&sandbox.id, command()).await.unwrap();
            times.push(start.elapsed());
            assert!(out.success());
        }
        times.sort();
        let (local_p50, local_p90) = (ms(times[rounds / 2]), ms(times[rounds * 9 / 10]));

        // The provider and in-process, alternating per round: `true` alone (what the
        // provider adds) and the SDK's command.
        let provider = common::e2b_client(&server.url).await;
        let remote = provider.create(&SandboxSpec::new("default")).await.unwrap();
        let plain = || ExecRequest::new(["true"]).stdin("");
        for _ in 0..10 {
            provider.run(&remote.id, plain()).await.unwrap();
        }
        let mut provider_true = Vec::with_capacity(rounds);
        let mut local_true = Vec::with_capacity(rounds);
        let mut provider_bash = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            assert!(provider.run(&remote.id, plain()).await.unwrap().success());
            provider_true.push(start.elapsed());
            let start = Instant::now();
            assert!(server.local.run(&sandbox.id, plain()).await.unwrap().success());
            local_true.push(start.elapsed());
            let start = Instant::now();
            assert!(provider.run(&remote.id, command()).await.unwrap().success());
            provider_bash.push(start.elapsed());
        }
        provider.destroy(&remote.id).await.unwrap();
        server.local.destroy(&sandbox.id).await.unwrap();
        let p50 = |times: &mut Vec<Duration>| {
            times.sort();
            (ms(times[times.len() / 2]), ms(times[times.len() * 9 / 10]))
        };
        let (provider_true_p50, provider_true_p90) = p50(&mut provider_true);
        let (local_true_p50, local_true_p90) = p50(&mut local_true);
        let (provider_bash_p50, provider_bash_p90) = p50(&mut provider_bash);

        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/e2b_sdk.py");
        let creates = (rounds / 10).max(5);
        let url = server.url.clone();
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new(python)
                .arg(script)
                .arg(rounds.to_string())
                .arg(creates.to_string())
                .env("E2B_API_KEY", common::TOKEN)
                .env("E2B_API_URL", &url)
                .env("E2B_SANDBOX_URL", &url)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            output.status.success(),
            "the SDK script failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let sdk: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let number = |key: &str| sdk[key].as_f64().unwrap();

        println!("`/bin/bash -l -c true`, {rounds} rounds each (same local backend)");
        println!("  in-process local backend     : p50 {local_p50:>7.3} ms   p90 {local_p90:>7.3} ms");
        println!(
            "  E2B SDK commands.run(\"true\") : p50 {:>7.3} ms   p90 {:>7.3} ms",
            number("run_p50"),
            number("run_p90")
        );
        println!(
            "  ratio at p50                 : {:.2}   (added {:.3} ms)",
            number("run_p50") / local_p50,
            number("run_p50") - local_p50
        );
        println!(
            "  E2B provider (E2bBackend)    : p50 {provider_bash_p50:>7.3} ms   p90 {provider_bash_p90:>7.3} ms   ratio {:.2}",
            provider_bash_p50 / local_p50
        );
        println!("`true`, {rounds} rounds each, alternating (same local backend)");
        println!("  in-process local backend     : p50 {local_true_p50:>7.3} ms   p90 {local_true_p90:>7.3} ms");
        println!(
            "  E2B provider (E2bBackend)    : p50 {provider_true_p50:>7.3} ms   p90 {provider_true_p90:>7.3} ms   ratio {:.2} (added {:.3} ms)",
            provider_true_p50 / local_true_p50,
            provider_true_p50 - local_true_p50
        );
        println!(
            "create to first command through the SDK, {creates} rounds: p50 {:>7.3} ms   p90 {:>7.3} ms",
            number("ready_p50"),
            number("ready_p90")
        );
    });
}
