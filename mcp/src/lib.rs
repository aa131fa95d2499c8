//! `sandcell-mcp`: sandcell sandboxes as Model Context Protocol tools, so any agent that
//! speaks MCP (Claude Code, Codex, Goose, Cursor, Cline) runs its commands and edits its
//! files in a sandcell session, without a line of Rust.
//!
//! [`SandboxTools`] is an [rmcp](https://docs.rs/rmcp) server handler over a
//! [`SandboxManager`](sandcell::SandboxManager): every tool names a session, which the
//! manager reuses, restores or creates. Serve it on stdio with [`serve_stdio`] (what
//! `sandcell mcp` does), over streamable HTTP with `http_service` (feature `http`, what
//! sandcell-server's `/mcp` does), or over any rmcp transport.
//!
//! | tool | does |
//! |---|---|
//! | `run_command` | `sh -c` in the workspace: exit code, capped output, progress while it runs |
//! | `read_file`, `write_file`, `edit_file` | text or base64, byte ranges, exact-match edits |
//! | `list_directory`, `glob`, `grep` | find your way around the workspace |
//! | `snapshot`, `restore_snapshot` | keep and bring back a workspace |
//! | `list_sessions`, `release` | what you have; keep, suspend or destroy it |
//!
//! Sandbox errors (a bad path, a timeout, a limit, an unknown snapshot) come back as
//! tool errors whose text says what to do; a malformed call is the protocol's
//! invalid-params error.

mod args;
#[cfg(feature = "http")]
mod http;
mod output;
mod settings;
mod tools;

#[cfg(feature = "http")]
pub use http::http_service;
pub use settings::{Manager, Tenant, ToolSettings};
pub use tools::SandboxTools;

use rmcp::ServiceExt;

/// Serves `tools` over this process's stdin and stdout until the client closes them.
/// Nothing else may write to stdout meanwhile (log to stderr).
pub async fn serve_stdio(tools: SandboxTools) -> sandcell::Result<()> {
    let running = tools.serve(rmcp::transport::stdio()).await.map_err(|e| {
        sandcell::Error::new(
            sandcell::ErrorKind::Backend,
            format!("starting MCP on stdio: {e}"),
        )
    })?;
    running.waiting().await.map_err(|e| {
        sandcell::Error::new(
            sandcell::ErrorKind::Backend,
            format!("serving MCP on stdio: {e}"),
        )
    })?;
    Ok(())
}
