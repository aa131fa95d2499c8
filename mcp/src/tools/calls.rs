//! A tool call's answer (text, or the error a model reads), and each tenant's calls in
//! flight, bounded ([`ToolSettings::max_calls_per_tenant`]).
//!
//! A call runs to its end after its client has gone (rmcp runs each as a task of its
//! own), and one may hold tens of MiB (a file read whole, a glob's matches): counted by
//! nothing, one tenant's calls posted and left ran a server out of memory.
//!
//! [`ToolSettings::max_calls_per_tenant`]: crate::ToolSettings::max_calls_per_tenant

use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use sandcell::{Error, ErrorKind};

use super::SandboxTools;

/// A tool's answer: text, or the error a model reads.
pub(super) type Answer = Result<CallToolResult, rmcp::ErrorData>;

pub(super) fn text(body: impl Into<String>) -> Answer {
    Ok(CallToolResult::success(vec![ContentBlock::text(body)]))
}

impl SandboxTools {
    /// A sandbox error as a tool error: its kind and message (as the settings let a
    /// client see it), for the model to act on.
    pub(super) fn failed(&self, e: Error) -> Answer {
        let e = self.settings.public_errors.rewrite(e);
        let hint = match e.kind() {
            ErrorKind::LimitExceeded => " (a limit of this server: ask for less)",
            ErrorKind::Timeout => " (give a longer timeout_secs, or run it in the background)",
            _ => "",
        };
        Ok(CallToolResult::error(vec![ContentBlock::text(format!(
            "{}: {e}{hint}",
            e.kind()
        ))]))
    }

    /// Runs `body` among the calling tenant's calls in flight, turning a sandbox error
    /// into a tool error.
    pub(super) async fn answer<F>(&self, ctx: &RequestContext<RoleServer>, body: F) -> Answer
    where
        F: std::future::Future<Output = sandcell::Result<String>>,
    {
        let _slot = match self.tenant(ctx).and_then(|t| self.calls.slot(&t)) {
            Ok(slot) => slot,
            Err(e) => return self.failed(e),
        };
        match body.await {
            Ok(out) => text(out),
            Err(e) => self.failed(e),
        }
    }
}

/// The places for each tenant's calls in flight.
pub(crate) fn call_slots(cap: usize) -> sandcell::raw::TenantSlots {
    sandcell::raw::TenantSlots::new(cap, "tool calls running", "wait for one to end")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_has_at_most_its_cap_of_calls_in_flight() {
        let slots = call_slots(1);
        let held = slots.slot("alice").unwrap();
        assert_eq!(
            slots.slot("alice").unwrap_err().kind(),
            ErrorKind::LimitExceeded
        );
        let _bob = slots.slot("bob").unwrap();
        drop(held);
        let _again = slots.slot("alice").unwrap();
    }
}
