//! Each tenant's running commands, counted on every face from the start of a command
//! to its end ([`ServerConfig::max_commands_per_tenant`](super::ServerConfig::max_commands_per_tenant)).
//!
//! A command outlives the request that started it: an E2B process runs on after its
//! stream closes, an MCP tool call after its client left, a Fly or wire exec after its
//! connection dropped (to its timeout). Each holds a few of the server's descriptors
//! while it runs; counted by connection, one tenant's detached commands ran the server
//! out of them and every tenant's creates failed (FINDINGS8 T6, T7).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sandcell::{Error, Process};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The places for running commands, by tenant, made on first use.
#[derive(Debug)]
pub(crate) struct CommandSlots {
    cap: AtomicUsize,
    per_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl CommandSlots {
    pub(crate) fn new(cap: usize) -> Self {
        CommandSlots {
            cap: AtomicUsize::new(cap),
            per_tenant: Mutex::default(),
        }
    }

    /// The cap the server serves with (set when its router is made, before any place
    /// is taken).
    pub(crate) fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// A place for one more of `tenant`'s commands; `LimitExceeded` when it runs as
    /// many as it may.
    pub(crate) fn slot(&self, tenant: &str) -> sandcell::Result<OwnedSemaphorePermit> {
        let cap = self.cap.load(Ordering::Relaxed);
        self.semaphore(tenant).try_acquire_owned().map_err(|_| {
            Error::limit_exceeded(format!(
                "tenant {tenant} runs {cap} commands at once, as many as it may: wait for \
                 one to end, or kill one"
            ))
        })
    }

    /// `tenant`'s places, for the wire connections of its, which take them themselves.
    pub(crate) fn semaphore(&self, tenant: &str) -> Arc<Semaphore> {
        let cap = self.cap.load(Ordering::Relaxed);
        Arc::clone(
            crate::lock(&self.per_tenant)
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(cap))),
        )
    }

    /// Starts a command of `tenant`'s with `start`, holding its place until the command
    /// ends (whether or not its handle is kept).
    pub(crate) async fn run<F>(&self, tenant: &str, start: F) -> sandcell::Result<Process>
    where
        F: std::future::Future<Output = sandcell::Result<Process>>,
    {
        let slot = self.slot(tenant)?;
        Ok(sandcell::raw::hold_until_exit(start.await?, slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_runs_at_most_its_cap_and_others_are_apart() {
        let slots = CommandSlots::new(0);
        slots.set_cap(2);
        let held = [slots.slot("alice").unwrap(), slots.slot("alice").unwrap()];
        let refused = slots.slot("alice").unwrap_err();
        assert_eq!(refused.kind(), sandcell::ErrorKind::LimitExceeded);
        assert!(slots.slot("bob").is_ok());
        drop(held);
        assert!(slots.slot("alice").is_ok());
    }
}
