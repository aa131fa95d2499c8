//! The tools over MCP's streamable HTTP transport, for a server that authenticates each
//! request and names its [`Tenant`](crate::Tenant) (sandcell-server's `/mcp`).

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::tools::{call_slots, interpreters};
use crate::{Manager, SandboxTools, ToolSettings};

/// The largest request body the service reads: a `write_file` of the default 10 MiB,
/// base64-encoded, in its JSON-RPC envelope.
const MAX_REQUEST_BYTES: usize = 16 << 20;

/// A tower service answering MCP's streamable HTTP transport (mount it at a path with
/// axum's `nest_service`). Every request must carry a [`Tenant`](crate::Tenant) in its
/// extensions, set by an authenticating layer in front: a request without one gets a
/// tool error, never another tenant's sessions.
///
/// Host-header checks are off: the layer in front authenticates every request with a
/// secret, which a page rebinding a name to this host cannot send.
pub fn http_service(
    manager: Arc<Manager>,
    settings: ToolSettings,
) -> StreamableHttpService<SandboxTools, LocalSessionManager> {
    StreamableHttpService::new(
        sessions(manager, settings),
        Arc::default(),
        StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_max_request_body_bytes(MAX_REQUEST_BYTES),
    )
}

/// Makes each MCP session's tools: every session counts its tenant's calls in flight in
/// the same places ([`ToolSettings::max_calls_per_tenant`]).
fn sessions(
    manager: Arc<Manager>,
    settings: ToolSettings,
) -> impl Fn() -> Result<SandboxTools, std::io::Error> + Send + Sync + 'static {
    let calls = Arc::new(call_slots(settings.max_calls_per_tenant));
    let interpreters = Arc::new(interpreters(&settings));
    let settings = Arc::new(settings);
    move || {
        Ok(SandboxTools::per_request_tenant_sharing(
            Arc::clone(&manager),
            (*settings).clone(),
            Arc::clone(&calls),
            Arc::clone(&interpreters),
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// ADVERSARIAL 40, FINDINGS10 G2: the cap was per session, and a tenant opens as many as it likes.
    #[tokio::test]
    async fn every_session_counts_calls_in_the_same_places() {
        let dir = tempfile::tempdir().unwrap();
        let backend: Box<dyn sandcell::SandboxBackend> =
            Box::new(sandcell::testing::MockBackend::new());
        let manager = sandcell::SandboxManager::builder(backend)
            .data_dir(dir.path())
            .build()
            .await
            .unwrap();
        let make = sessions(Arc::new(manager), ToolSettings::default());
        let (one, two) = (make().unwrap(), make().unwrap());
        assert!(one.shares_calls_with(&two));
    }
}
