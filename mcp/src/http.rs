//! The tools over MCP's streamable HTTP transport, for a server that authenticates each
//! request and names its [`Tenant`](crate::Tenant) (sandcell-server's `/mcp`).

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

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
    let settings = Arc::new(settings);
    StreamableHttpService::new(
        move || {
            Ok(SandboxTools::per_request_tenant(
                Arc::clone(&manager),
                (*settings).clone(),
            ))
        },
        Arc::default(),
        StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_max_request_body_bytes(MAX_REQUEST_BYTES),
    )
}
