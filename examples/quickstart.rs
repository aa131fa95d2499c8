//! Quickstart: a sandbox on this machine from a small template — write a file, run a
//! command, snapshot, destroy, restore into a new sandbox, read the file back.
//!
//! `cargo run --example quickstart`

use sandcell::archive::ImportOptions;
use sandcell::snapshot::{self, PackOptions};
use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};
use sandcell_local::LocalBackend;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A tiny template: every sandbox starts with a copy-on-write view of this directory.
    let scratch = tempfile::tempdir()?;
    let template = scratch.path().join("template");
    std::fs::create_dir_all(template.join("src"))?;
    std::fs::write(template.join("README.md"), "# demo project\n")?;

    let backend = LocalBackend::builder()
        .root(scratch.path().join("sandboxes"))
        .template("demo", &template)
        .build()?;

    let spec = SandboxSpec::new("demo").label("app", "quickstart");
    let sandbox = backend.create(&spec).await?;
    println!(
        "1. created sandbox {} (workspace: {})",
        sandbox.id,
        sandbox
            .details
            .get("workspace")
            .map(String::as_str)
            .unwrap_or("?")
    );

    let main_py: SandboxPath = "src/main.py".parse()?;
    backend
        .write_string(&sandbox.id, &main_py, "print('hello from the sandbox')\n")
        .await?;
    println!("2. wrote {main_py}");

    let out = backend
        .run(
            &sandbox.id,
            ExecRequest::shell("ls -R . && wc -l src/main.py"),
        )
        .await?;
    println!(
        "3. ran a command (exit {:?}):\n{}",
        out.exit_code(),
        out.stdout_str().trim_end()
    );

    let (manifest, blob) = snapshot::capture(
        &backend,
        &sandbox.id,
        &SandboxPath::root(),
        Vec::new(),
        &PackOptions::default(),
    )
    .await?;
    println!(
        "4. snapshot {}: {} entries, {} bytes, sha256 {}…",
        manifest.id,
        manifest.entry_count,
        manifest.size_bytes,
        &manifest.sha256[..16]
    );

    backend.destroy(&sandbox.id).await?;
    println!("5. destroyed {}", sandbox.id);

    let restored = backend.create(&spec).await?;
    snapshot::restore(
        &backend,
        &restored.id,
        &SandboxPath::root(),
        std::io::Cursor::new(blob),
        &manifest,
        ImportOptions::replace(),
    )
    .await?;
    println!("6. restored the snapshot into {}", restored.id);

    let text = backend.read_to_string(&restored.id, &main_py).await?;
    println!("7. read {main_py} back: {}", text.trim_end());
    backend.destroy(&restored.id).await?;
    Ok(())
}
