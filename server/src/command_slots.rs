//! Each tenant's running commands, counted on every face from the start of a command
//! to its end ([`ServerConfig::max_commands_per_tenant`](super::ServerConfig::max_commands_per_tenant)).
//!
//! A command outlives the request that started it: an E2B process runs on after its
//! stream closes, an MCP tool call after its client left, a Fly or wire exec after its
//! connection dropped (to its timeout). Each holds a few of the server's descriptors
//! while it runs; counted by connection, one tenant's detached commands ran the server
//! out of them and every tenant's creates failed (FINDINGS8 T6, T7).

use sandcell::raw::TenantSlots;
use sandcell::Process;

/// The places for running commands, by tenant.
#[derive(Debug)]
pub(crate) struct CommandSlots(TenantSlots);

impl std::ops::Deref for CommandSlots {
    type Target = TenantSlots;

    fn deref(&self) -> &TenantSlots {
        &self.0
    }
}

impl CommandSlots {
    pub(crate) fn new(cap: usize) -> Self {
        CommandSlots(TenantSlots::new(
            cap,
            "commands running",
            "wait for one to end, or kill one",
        ))
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
