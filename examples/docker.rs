//! Sandboxes in Docker containers: a template image with a service beside it, commands
//! and files through the in-container agent, a clone that goes its own way.
//!
//! `cargo run --example docker` — runs when a Docker engine answers, and says so and
//! exits otherwise. The image is `$SANDCELL_DOCKER_IMAGE` (any image with a shell) or,
//! when unset, a busybox image imported from this host's static busybox (no registry
//! needed). Commands go through `sandcell-agent` when `$SANDCELL_DOCKER_AGENT` names
//! the static binary (see the README), else through the engine's exec API.

use std::collections::BTreeMap;

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_docker::{DockerBackend, ImageSpec, SidecarSpec};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(e) = DockerBackend::builder().build()?.ping().await {
        println!("docker example: no Docker engine here ({e}); nothing to show");
        return Ok(());
    }
    let scratch = tempfile::tempdir()?;
    let image = match std::env::var("SANDCELL_DOCKER_IMAGE") {
        Ok(reference) => ImageSpec::pull(reference),
        Err(_) => {
            let Some(busybox) = sandcell_docker::testing::host_busybox() else {
                println!("docker example: set SANDCELL_DOCKER_IMAGE or install busybox-static");
                return Ok(());
            };
            let rootfs = scratch.path().join("rootfs");
            sandcell_docker::testing::busybox_rootfs(&busybox, &rootfs)?;
            ImageSpec::import(&rootfs, "sandcell-example/busybox:latest")
        }
    };
    // A web server beside every sandbox of the template, reachable as `web`.
    let web = SidecarSpec::new("web", image.clone()).cmd([
        "sh",
        "-c",
        "mkdir -p /tmp/www && echo 'hello from the service' > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www",
    ]);
    let backend = DockerBackend::builder()
        .from_env()
        .template("demo", image)
        .sidecar("demo", web)
        .user("sandbox")
        .build()?;
    let agent = std::env::var_os("SANDCELL_DOCKER_AGENT").is_some();
    println!("1. preparing images (import, sandcell's layer) ...");
    backend.prepare_images().await?;

    let spec = SandboxSpec::new("demo").label("app", "docker-example");
    let sandbox = backend.create(&spec).await?;
    println!(
        "2. created {} (commands via {})",
        sandbox.id,
        if agent {
            "the agent"
        } else {
            "the engine's exec"
        }
    );

    let out = backend
        .run_shell(
            &sandbox.id,
            "id -un; echo 'echo computed $((6 * 7))' > job.sh && sh job.sh",
        )
        .await?;
    println!("3. ran as {}", out.stdout_str().replace('\n', "; "));

    let fetch =
        "for i in $(seq 1 50); do wget -qO- http://web:8080/ && exit 0; sleep 0.1; done; exit 1";
    let out = backend.run(&sandbox.id, ExecRequest::shell(fetch)).await?;
    println!("4. the service answered: {}", out.stdout_str().trim_end());

    if agent {
        backend
            .write_string(&sandbox.id, &"notes.txt".parse()?, "original")
            .await?;
        let copy = backend
            .clone_sandbox(
                &sandbox.id,
                BTreeMap::from([("app".into(), "docker-example".into())]),
            )
            .await?;
        backend
            .write_string(&copy.id, &"notes.txt".parse()?, "changed in the clone")
            .await?;
        println!(
            "5. cloned to {}: source says {:?}, clone says {:?}",
            copy.id,
            backend
                .read_to_string(&sandbox.id, &"notes.txt".parse()?)
                .await?,
            backend
                .read_to_string(&copy.id, &"notes.txt".parse()?)
                .await?,
        );
        backend.destroy(&copy.id).await?;
    }
    backend.destroy(&sandbox.id).await?;
    println!("6. destroyed: containers, service and network are gone");
    Ok(())
}
