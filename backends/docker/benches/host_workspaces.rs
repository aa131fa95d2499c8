//! Host-directory workspaces on Docker, against image workspaces, as issue 20 asks:
//!
//! - create to ready (create, then the first command answers) of a sandbox whose
//!   workspace is a host directory of 20,000 files, against one whose image holds the
//!   same 20,000 files at its workspace;
//! - snapshot after a one-file change: incremental (the upper layer) against full.
//!
//! Run: `cargo bench -p sandcell-docker --bench host_workspaces` as root, with an engine
//! on this host and `SANDCELL_DOCKER_AGENT` set. `SANDCELL_BENCH_ROUNDS` (default 15)
//! sets the rounds; the two creates alternate; all figures are medians.

// A bench is a test-like program: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use sandcell::snapshot::{capture, capture_changes, PackOptions};
use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};
use sandcell_docker::{DockerBackend, ImageSpec};

const DIRS: usize = 200;
const FILES_PER_DIR: usize = 100;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// 20,000 small files in 200 directories, owned by the image's user.
fn project(dir: &Path) {
    for d in 0..DIRS {
        let sub = dir.join(format!("pkg{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..FILES_PER_DIR {
            std::fs::write(sub.join(format!("f{f:03}.txt")), format!("{d}/{f}\n")).unwrap();
        }
    }
    let status = std::process::Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
}

async fn create_to_ready(
    backend: &DockerBackend,
    spec: &SandboxSpec,
) -> (Duration, sandcell::SandboxId) {
    let start = Instant::now();
    let info = backend.create(spec).await.unwrap();
    let out = backend
        .run(&info.id, ExecRequest::new(["true"]))
        .await
        .unwrap();
    assert!(out.success());
    (start.elapsed(), info.id)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "host_workspaces: run with `cargo bench -p sandcell-docker --bench host_workspaces`"
        );
        return;
    }
    if !common::engine_available().await {
        return;
    }
    common::images().await;
    let rounds = std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15usize)
        .max(3);
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("project");
    project(&template);
    // The same files in an image, at the workspace.
    let context = dir.path().join("context");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::write(
        context.join("Dockerfile"),
        format!(
            "FROM {}\nCOPY --chown=1000:1000 project/ /workspace/\n",
            common::USER_IMAGE
        ),
    )
    .unwrap();
    let status = std::process::Command::new("cp")
        .args(["-a"])
        .arg(&template)
        .arg(context.join("project"))
        .status()
        .unwrap();
    assert!(status.success());
    let spec = SandboxSpec::new("default").label(common::TEST_LABEL.0, "bench-host-workspaces");
    let host = DockerBackend::builder()
        .template("default", ImageSpec::pull(common::USER_IMAGE))
        .host_workspace("default", &template)
        .runtime_dir(dir.path().join("runtime"))
        .agent(common::agent_binary())
        .build()
        .unwrap();
    let image = DockerBackend::builder()
        .template(
            "default",
            ImageSpec::build(&context, "sandcell-bench/project-20k:latest"),
        )
        .agent(common::agent_binary())
        .build()
        .unwrap();
    image.prepare_images().await.unwrap();
    host.prepare_images().await.unwrap();

    // Create to ready, alternating which goes first.
    let (mut on_host, mut in_image) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order: [(&DockerBackend, &mut Vec<Duration>); 2] = if round % 2 == 0 {
            [(&host, &mut on_host), (&image, &mut in_image)]
        } else {
            [(&image, &mut in_image), (&host, &mut on_host)]
        };
        for (backend, times) in order {
            let (took, id) = create_to_ready(backend, &spec).await;
            times.push(took);
            backend.destroy(&id).await.unwrap();
        }
    }

    // Snapshots after a one-file change.
    let (_, id) = create_to_ready(&host, &spec).await;
    let file: SandboxPath = "pkg000/f000.txt".parse().unwrap();
    let (mut full, mut incremental) = (Vec::new(), Vec::new());
    let (mut full_bytes, mut incremental_bytes) = (0, 0);
    for round in 0..rounds {
        host.write_string(&id, &file, &format!("changed {round}\n"))
            .await
            .unwrap();
        let start = Instant::now();
        let (manifest, _) = capture(
            &host,
            &id,
            &SandboxPath::root(),
            std::io::sink(),
            &PackOptions::default(),
        )
        .await
        .unwrap();
        full.push(start.elapsed());
        full_bytes = manifest.size_bytes;
        let start = Instant::now();
        let (manifest, _) = capture_changes(&host, &id, std::io::sink(), &PackOptions::default())
            .await
            .unwrap();
        incremental.push(start.elapsed());
        incremental_bytes = manifest.size_bytes;
    }
    host.destroy(&id).await.unwrap();

    let (on_host, in_image) = (median(on_host), median(in_image));
    let (full, incremental) = (median(full), median(incremental));
    println!("\nsandcell-docker host-directory workspaces, medians of {rounds} rounds");
    println!("| measurement | host directory | baseline | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| create to ready, 20,000-file workspace | {:.0} ms | image holding the files {:.0} ms | {:.2} |",
        ms(on_host), ms(in_image), ms(on_host) / ms(in_image)
    );
    println!(
        "| snapshot after a one-file change | incremental {:.1} ms, {incremental_bytes} bytes | full {:.0} ms, {full_bytes} bytes | {:.3} |",
        ms(incremental), ms(full), ms(incremental) / ms(full)
    );
}
