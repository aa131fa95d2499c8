//! Each tenant's share of the connections served at once
//! ([`ServerConfig::max_connections_per_tenant`](super::ServerConfig::max_connections_per_tenant)):
//! a connection counts against the tenant of its first authenticated request until it
//! closes, and a tenant at its share is refused on a new connection, which closes.
//!
//! `max_connections` bounds the server as a whole, but one tenant could take all of it
//! (many connections, each kept busy with a long command or an MCP call left
//! unanswered) and every other tenant would wait for a free place (ADVERSARIAL 35).
//! Connections are counted when accepted, before anyone is known; a share can only be
//! taken once a request has shown whose connection it is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sandcell::{Error, ErrorKind};

/// How many connections each tenant holds.
#[derive(Debug, Default)]
pub(crate) struct ConnectionShares(Mutex<HashMap<String, usize>>);

/// One connection's claim: empty until a request authenticates on it, then the share
/// it holds, given back when the connection (and every request of it) is gone.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionOwner(Arc<Mutex<Option<Held>>>);

#[derive(Debug)]
struct Held {
    shares: Arc<ConnectionShares>,
    tenant: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = crate::lock(&self.shares.0);
        if let Some(count) = held.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

impl ConnectionOwner {
    /// Counts this connection against `tenant`, unless it already counts against a
    /// tenant (the first one to authenticate on a connection keeps it). Fails with
    /// `LimitExceeded` when `tenant` holds `share` connections already.
    pub(crate) fn claim(
        &self,
        shares: &Arc<ConnectionShares>,
        tenant: &str,
        share: usize,
    ) -> sandcell::Result<()> {
        let mut owner = crate::lock(&self.0);
        if owner.is_some() {
            return Ok(());
        }
        let mut held = crate::lock(&shares.0);
        let count = held.entry(tenant.to_owned()).or_default();
        if *count >= share {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!(
                    "tenant {tenant} has {share} connections open, its share of the \
                     server's: close one, or send more requests over those"
                ),
            ));
        }
        *count += 1;
        drop(held);
        *owner = Some(Held {
            shares: Arc::clone(shares),
            tenant: tenant.to_owned(),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_share_and_gets_it_back() {
        let shares = Arc::new(ConnectionShares::default());
        let first = ConnectionOwner::default();
        let second = ConnectionOwner::default();
        first.claim(&shares, "alice", 1).unwrap();
        // The same connection again is no second share.
        first.claim(&shares, "alice", 1).unwrap();
        let refused = second.claim(&shares, "alice", 1).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::LimitExceeded);
        second.claim(&shares, "bob", 1).unwrap();
        drop(first);
        let third = ConnectionOwner::default();
        third.claim(&shares, "alice", 1).unwrap();
        drop((second, third));
        assert!(crate::lock(&shares.0).is_empty());
    }
}
