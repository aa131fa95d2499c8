//! Stateful code execution in a sandbox: a [`CodeInterpreter`] keeps Jupyter kernels
//! alive per [`CodeContext`] and streams what each run produces as [`CodeEvent`]s
//! (output, rich results as MIME bundles, errors).
//!
//! # Where the kernels run, and why
//!
//! Inside the sandbox, under a helper (`helper.py`, a Python program using the
//! sandbox's own `jupyter_client`) that the interpreter starts through the ordinary
//! process contract and talks to in JSON lines over its stdin and stdout. So it works
//! on every backend with interactive exec and Python, kernels see exactly what the
//! sandbox's other programs see, and nothing new crosses the isolation boundary: the
//! host speaks to one process's pipes, never to a kernel's sockets (the kernels use
//! Unix sockets in a directory of the helper's own). A kernel's state lives as long
//! as the helper, which lives as long as the interpreter handle.
//!
//! The sandbox needs `jupyter_client` and a kernel per language (`ipykernel` for
//! Python, `bash_kernel`, `IRkernel`, ...); a language without its kernel is refused
//! with [`Unsupported`](crate::ErrorKind::Unsupported) naming what to install.
//!
//! # Protocol
//!
//! Each request is one line, `{"id": n, "op": ...}`; every line answering it carries
//! the same `id`, so runs in different contexts interleave. Operations: `create`
//! (`language`, `cwd`), `list`, `restart` and `remove` (`context`), `execute`
//! (`context` or `language`, `code`, `env`, `timeout` in seconds) and `interrupt`
//! (`run`: an execute's id). An execute answers [`CodeEvent`] lines ending with
//! `end`, or `timeout`; any request may instead answer `failed` (`kind`, `message`).
//!
//! ```no_run
//! # async fn demo(backend: std::sync::Arc<dyn sandcell::SandboxBackend>, id: sandcell::SandboxId) -> sandcell::Result<()> {
//! use sandcell::code::{CodeInterpreter, CodeInterpreterOptions, RunCode};
//!
//! let interpreter = CodeInterpreter::start(&*backend, &id, CodeInterpreterOptions::new()).await?;
//! interpreter.run_to_end("x = 41", RunCode::new()).await?;
//! let out = interpreter.run_to_end("x + 1", RunCode::new()).await?;
//! assert_eq!(out.main_result().and_then(|r| r.text()), Some("42"));
//! # Ok(()) }
//! ```

mod helper;
mod interpreters;
mod pipe;
mod types;

pub use helper::{CodeInterpreter, CodeInterpreterOptions, CodeRun};
pub use interpreters::Interpreters;
pub use types::{CodeContext, CodeError, CodeEvent, CodeLanguage, CodeOutput, CodeResult, RunCode};
