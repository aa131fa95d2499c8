//! Quickstart: create a sandbox, write and edit files, search them, snapshot the
//! workspace and restore it into a fresh sandbox.
//!
//! Runs on the in-memory mock backend until the local backend lands:
//! `cargo run --example quickstart --features testing`

use sandcell::archive::ImportOptions;
use sandcell::snapshot::{self, PackOptions};
use sandcell::testing::{MockBackend, MockReply};
use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The mock answers commands with handlers; real backends run real processes.
    let backend = MockBackend::new().on_exec("wc", |call| {
        MockReply::stdout(format!(
            "{}\n",
            call.stdin.split(|b| *b == b'\n').count() - 1
        ))
    });

    let spec = SandboxSpec::new("default").with_label("app", "quickstart");
    let sandbox = backend.create(&spec).await?;
    println!(
        "created sandbox {} on backend {}",
        sandbox.id, sandbox.backend
    );

    let main_py: SandboxPath = "src/main.py".parse()?;
    backend
        .write_string(&sandbox.id, &main_py, "def greet():\n    return 'hi'\n")
        .await?;
    backend
        .edit_file(&sandbox.id, &main_py, "'hi'", "'hello, agent'")
        .await?;
    println!(
        "src/main.py now reads:\n{}",
        backend.read_to_string(&sandbox.id, &main_py).await?
    );

    for hit in backend
        .grep(&sandbox.id, &SandboxPath::root(), "hello")
        .await?
    {
        println!("grep: {}:{}: {}", hit.path, hit.line_number, hit.line);
    }
    println!(
        "glob **/*.py: {:?}",
        backend.glob(&sandbox.id, "**/*.py").await?
    );

    let text = backend.read(&sandbox.id, &main_py).await?;
    let out = backend
        .run(&sandbox.id, ExecRequest::new(["wc", "-l"]).stdin(text))
        .await?;
    println!("wc -l says {}", out.stdout_str().trim());

    // Snapshot the workspace, throw the sandbox away, restore into a new one.
    let (manifest, blob) = snapshot::capture(
        &backend,
        &sandbox.id,
        &SandboxPath::root(),
        Vec::new(),
        &PackOptions::default(),
    )
    .await?;
    println!(
        "snapshot {}: {} entries, {} bytes compressed, sha256 {}",
        manifest.id, manifest.entry_count, manifest.size_bytes, manifest.sha256
    );
    backend.destroy(&sandbox.id).await?;

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
    println!(
        "restored into {}: {}",
        restored.id,
        backend
            .read_to_string(&restored.id, &main_py)
            .await?
            .lines()
            .nth(1)
            .unwrap_or_default()
            .trim()
    );
    backend.destroy(&restored.id).await?;
    Ok(())
}
