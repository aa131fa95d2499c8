//! A tool call's answer (text, or the error a model reads), and each tenant's calls in
//! flight, bounded ([`ToolSettings::max_calls_per_tenant`]).
//!
//! A call runs to its end after its client has gone (rmcp runs each as a task of its
//! own), and one may hold tens of MiB (a file read whole, a glob's matches): counted by
//! nothing, one tenant's calls posted and left ran a server out of memory.
//!
//! [`ToolSettings::max_calls_per_tenant`]: crate::ToolSettings::max_calls_per_tenant

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use sandcell::{Error, ErrorKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// The places for each tenant's calls in flight, made on first use.
#[derive(Debug)]
pub(crate) struct CallSlots {
    cap: usize,
    per_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl CallSlots {
    pub(crate) fn new(cap: usize) -> Self {
        CallSlots {
            cap,
            per_tenant: Mutex::default(),
        }
    }

    /// A place for one more of `tenant`'s calls; `LimitExceeded` when it has as many in
    /// flight as it may.
    pub(super) fn slot(&self, tenant: &str) -> sandcell::Result<OwnedSemaphorePermit> {
        let semaphore = {
            let mut per_tenant = self
                .per_tenant
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(
                per_tenant
                    .entry(tenant.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.cap))),
            )
        };
        semaphore.try_acquire_owned().map_err(|_| {
            Error::limit_exceeded(format!(
                "{} tool calls of this tenant are running, as many as it may: wait for one \
                 to end",
                self.cap
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_has_at_most_its_cap_of_calls_in_flight() {
        let slots = CallSlots::new(1);
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
