//! Stateful code execution: a Python context that keeps its variables between cells,
//! its output streamed, and a rich result (an HTML table) read as a MIME bundle.
//!
//! The sandbox needs a Python with `jupyter-client` and `ipykernel`; make one and
//! point the example at it:
//!
//! ```text
//! /usr/bin/python3 -m venv /tmp/kernels && /tmp/kernels/bin/pip install jupyter-client ipykernel
//! SANDCELL_KERNEL_PYTHON=/tmp/kernels/bin/python cargo run --example code_interpreter
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use sandcell::code::{CodeEvent, CodeInterpreter, CodeInterpreterOptions, RunCode};
use sandcell::{SandboxBackend, SandboxSpec};
use sandcell_local::LocalBackend;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let python = PathBuf::from(
        std::env::var_os("SANDCELL_KERNEL_PYTHON").ok_or("set SANDCELL_KERNEL_PYTHON")?,
    );
    // The sandbox reads the kernels' virtual environment, and nothing else of the home.
    let venv = python
        .parent()
        .and_then(|bin| bin.parent())
        .ok_or("SANDCELL_KERNEL_PYTHON is not in a virtual environment")?;
    let scratch = tempfile::tempdir()?;
    let backend: Arc<dyn SandboxBackend> = Arc::new(
        LocalBackend::builder()
            .root(scratch.path())
            .readable(
                sandcell_local::SYSTEM_READABLE
                    .iter()
                    .map(PathBuf::from)
                    .chain([venv.to_path_buf()]),
            )
            .build()?,
    );
    let sandbox = backend.create(&SandboxSpec::default()).await?;
    let options = CodeInterpreterOptions::new().python(python.to_string_lossy());
    let interpreter = CodeInterpreter::start(&*backend, &sandbox.id, options).await?;

    interpreter
        .run_to_end("rows = [(n, n * n) for n in range(1, 6)]", RunCode::new())
        .await?;
    // Streamed as it happens: output first, then the cell's value.
    let mut run = interpreter
        .run(
            "for n, square in rows:\n    print(n, square)\nsum(s for _, s in rows)",
            RunCode::new(),
        )
        .await?;
    while let Some(event) = run.next().await {
        match event? {
            CodeEvent::Stdout { text } => print!("stdout: {text}"),
            CodeEvent::Result(result) => println!("value: {}", result.text().unwrap_or("?")),
            CodeEvent::Error(error) => println!("error: {}: {}", error.name, error.value),
            _ => {}
        }
    }
    let table = interpreter
        .run_to_end(
            "from IPython.display import HTML, display\n\
             display(HTML('<table>' + ''.join(f'<tr><td>{n}</td><td>{s}</td></tr>' for n, s in rows) + '</table>'))",
            RunCode::new(),
        )
        .await?;
    for result in &table.results {
        println!("displayed as: {:?}", result.data.keys().collect::<Vec<_>>());
    }
    drop(interpreter);
    backend.destroy(&sandbox.id).await?;
    Ok(())
}
