//! The backend chosen in a YAML file: read a `SandboxConfig`, build a
//! `SandboxManager<Box<dyn SandboxBackend>>` through a `BackendRegistry`, run a session.
//!
//! `cargo run --example config [-- path/to/config.yaml]` (default: `examples/config.yaml`).
//! Change `type:` to another registered backend and nothing else in the program changes.

use std::path::PathBuf;

use sandcell::{
    BackendRegistry, ReleaseMode, SandboxBackendExt, SandboxConfig, SandboxSpec, SessionKey,
};
use sandcell_local::LocalBackend;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/config.yaml"));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut config: SandboxConfig = serde_yaml::from_str(&text)?;

    // Keep this demo's state and sandboxes in a scratch directory unless the file says
    // where (`data_dir:`, and `root:` for the local backend).
    let scratch = tempfile::tempdir()?;
    config
        .data_dir
        .get_or_insert_with(|| scratch.path().join("data"));
    if config.backend == "local" && !config.options.contains_key("root") {
        config.options.insert(
            "root".into(),
            scratch.path().join("local").to_string_lossy().into(),
        );
    }

    // Register every backend this program links; the file picks one by `type`.
    // `remote` connects to its server when it is built, so its factory is async; so is
    // `e2b`'s (seed 003's `type: e2b`, see examples/e2b.yaml).
    let registry = BackendRegistry::new()
        .register("local", LocalBackend::from_options)
        .register("docker", sandcell_docker::DockerBackend::from_options)
        .register_async("remote", sandcell_remote::FlyBackend::from_options)
        .register_async("e2b", sandcell_remote::e2b::E2bBackend::from_options);
    let manager = config.build_manager(&registry).await?;
    println!(
        "{}: backend {}, at most {:?} sandboxes per tenant, idle timeout {:?}",
        path.display(),
        manager.backend().name(),
        manager.settings().max_sandboxes_per_tenant,
        manager.settings().idle_timeout,
    );

    let key = SessionKey::new("demo", "from-config")?;
    let sandbox = manager.acquire(&key, &SandboxSpec::new("default")).await?;
    let out = sandbox
        .call("run_shell", |b, id| {
            b.run_shell(id, "echo hello from $(uname -s)")
        })
        .await?;
    println!("{}", out.stdout_str().trim_end());
    manager.release(&key, ReleaseMode::Purge).await?;
    manager.shutdown().await;
    Ok(())
}
