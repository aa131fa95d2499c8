//! Interpreters kept by sandbox, for an embedder that runs code in many.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{CodeInterpreter, CodeInterpreterOptions};
use crate::backend::SandboxBackend;
use crate::error::Result;
use crate::sandbox::SandboxId;

/// Interpreters by sandbox: each started on its first use and kept for the next, a new
/// one started once a sandbox's has ended (its sandbox destroyed, suspended or reset).
/// For a long-lived embedder (a server) that runs code in many sandboxes.
///
/// Two first uses of one sandbox at once start one interpreter; a start that hangs
/// holds only its own sandbox's callers.
#[derive(Debug)]
pub struct Interpreters {
    options: CodeInterpreterOptions,
    by_sandbox: Mutex<HashMap<SandboxId, Arc<tokio::sync::OnceCell<CodeInterpreter>>>>,
}

impl Interpreters {
    /// Interpreters started with `options`.
    pub fn new(options: CodeInterpreterOptions) -> Self {
        Interpreters {
            options,
            by_sandbox: Mutex::default(),
        }
    }

    /// Sandbox `id`'s interpreter, started on `backend` unless one runs already.
    ///
    /// # Errors
    /// As [`CodeInterpreter::start`].
    pub async fn get_or_start<B: SandboxBackend + ?Sized>(
        &self,
        backend: &B,
        id: &SandboxId,
    ) -> Result<CodeInterpreter> {
        let cell = {
            let mut by_sandbox = self
                .by_sandbox
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Those that ended go, and those whose start failed with no one starting
            // them now: what is kept is bounded by the sandboxes in use.
            by_sandbox.retain(|_, cell| match cell.get() {
                Some(interpreter) => interpreter.is_running(),
                None => Arc::strong_count(cell) > 1,
            });
            Arc::clone(by_sandbox.entry(id.clone()).or_default())
        };
        let interpreter = cell
            .get_or_try_init(|| CodeInterpreter::start(backend, id, self.options.clone()))
            .await?;
        Ok(interpreter.clone())
    }
}
