//! Each tenant's share of the connections served at once
//! ([`ServerConfig::max_connections_per_tenant`](super::ServerConfig::max_connections_per_tenant)):
//! a connection counts against the tenant of its first authenticated request until it
//! closes, and a tenant at its share is refused on a new connection, which closes.
//!
//! `max_connections` bounds the server as a whole, but one tenant could take all of it
//! (many connections, each kept busy with a long command or an MCP call left
//! unanswered) and every other tenant would wait for a free place (ADVERSARIAL 35).
//! Connections are counted when accepted, before anyone is known; a share can only be
//! taken once a request has shown whose connection it is. Until then a connection
//! counts against its client's address ([`Unauthenticated`]), and one whose request
//! did not authenticate is closed after its answer (`super::requests`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use sandcell::{Error, ErrorKind};

/// How many connections each tenant holds.
#[derive(Debug, Default)]
pub(crate) struct ConnectionShares(Mutex<HashMap<String, usize>>);

/// How many connections each client address holds before any of its requests has
/// authenticated
/// ([`ServerConfig::max_unauthenticated_per_address`](super::ServerConfig::max_unauthenticated_per_address)).
///
/// Every connection is unclaimed until a request authenticates on it, and one that
/// never does counts against no tenant: without this bound, one client opening
/// connections and sending nothing, or only requests that fail to authenticate, held
/// every one of `max_connections` (FINDINGS7 S3).
#[derive(Debug)]
pub(crate) struct Unauthenticated {
    per_address: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place among its address's unauthenticated ones, given back when a
/// request authenticates on it or it closes.
#[derive(Debug)]
pub(crate) struct Unclaimed {
    pool: Arc<Unauthenticated>,
    address: IpAddr,
}

impl Unauthenticated {
    pub(crate) fn new(per_address: usize) -> Arc<Self> {
        Arc::new(Unauthenticated {
            per_address,
            held: Mutex::default(),
        })
    }

    /// A place for a new connection from `address`; `None` when the address holds
    /// its bound already (the connection is closed unserved).
    pub(crate) fn admit(self: &Arc<Self>, address: IpAddr) -> Option<Unclaimed> {
        let address = canonical(address);
        let mut held = crate::lock(&self.held);
        let count = held.entry(address).or_default();
        if *count >= self.per_address {
            return None;
        }
        *count += 1;
        Some(Unclaimed {
            pool: Arc::clone(self),
            address,
        })
    }
}

/// An IPv4 client seen through an IPv6 socket counts as itself.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let mut held = crate::lock(&self.pool.held);
        if let Some(count) = held.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.address);
            }
        }
    }
}

/// One connection's claim, held by the connection itself (its service) and so
/// dropped exactly when it closes: unclaimed (counted against its address) until a
/// request authenticates on it, then the tenant's share it holds.
#[derive(Debug)]
pub(crate) struct ConnectionOwner(Arc<Mutex<Owner>>);

/// What a request carries of its connection's claim: it can claim the connection for
/// its tenant, but does not keep the claim alive. A handler that outlives its
/// connection (an MCP tool call whose client went away) held the tenant's share until
/// it returned, up to an hour later (FINDINGS7 S6).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionClaim(Weak<Mutex<Owner>>);

#[derive(Debug, Default)]
struct Owner {
    held: Option<Held>,
    unclaimed: Option<Unclaimed>,
}

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
    /// A new connection's, counted against its address (`unclaimed`) until claimed.
    pub(crate) fn new(unclaimed: Option<Unclaimed>) -> Self {
        ConnectionOwner(Arc::new(Mutex::new(Owner {
            held: None,
            unclaimed,
        })))
    }

    /// What the connection's requests carry.
    pub(crate) fn claim_handle(&self) -> ConnectionClaim {
        ConnectionClaim(Arc::downgrade(&self.0))
    }

    /// Whether a request has authenticated on the connection.
    pub(crate) fn is_claimed(&self) -> bool {
        crate::lock(&self.0).held.is_some()
    }
}

impl ConnectionClaim {
    /// Counts this connection against `tenant`, unless it already counts against a
    /// tenant (the first one to authenticate on a connection keeps it). Fails with
    /// `LimitExceeded` when `tenant` holds `share` connections already. A connection
    /// already closed has nothing to claim.
    pub(crate) fn claim(
        &self,
        shares: &Arc<ConnectionShares>,
        tenant: &str,
        share: usize,
    ) -> sandcell::Result<()> {
        let Some(owner) = self.0.upgrade() else {
            return Ok(());
        };
        let mut owner = crate::lock(&owner);
        if owner.held.is_some() {
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
        owner.held = Some(Held {
            shares: Arc::clone(shares),
            tenant: tenant.to_owned(),
        });
        owner.unclaimed = None;
        Ok(())
    }

    /// The claim itself, kept alive by whoever holds it: a connection upgraded to the
    /// wire protocol leaves its service, and keeps its tenant's share this way until
    /// it closes. `None` once the connection is gone.
    pub(crate) fn keep(&self) -> Option<ConnectionOwner> {
        self.0.upgrade().map(ConnectionOwner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_share_and_gets_it_back() {
        let shares = Arc::new(ConnectionShares::default());
        let first = ConnectionOwner::new(None);
        let second = ConnectionOwner::new(None);
        first.claim_handle().claim(&shares, "alice", 1).unwrap();
        // The same connection again is no second share.
        first.claim_handle().claim(&shares, "alice", 1).unwrap();
        let refused = second
            .claim_handle()
            .claim(&shares, "alice", 1)
            .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::LimitExceeded);
        second.claim_handle().claim(&shares, "bob", 1).unwrap();
        drop(first);
        let third = ConnectionOwner::new(None);
        third.claim_handle().claim(&shares, "alice", 1).unwrap();
        drop((second, third));
        assert!(crate::lock(&shares.0).is_empty());
    }

    #[test]
    fn a_claim_a_request_carries_ends_with_its_connection() {
        let shares = Arc::new(ConnectionShares::default());
        let connection = ConnectionOwner::new(None);
        let carried = connection.claim_handle();
        carried.claim(&shares, "alice", 1).unwrap();
        drop(connection);
        assert!(
            crate::lock(&shares.0).is_empty(),
            "the share went with the connection"
        );
        assert!(carried.keep().is_none());
        // A request outliving its connection claims nothing.
        carried.claim(&shares, "alice", 1).unwrap();
        assert!(crate::lock(&shares.0).is_empty());
    }

    #[test]
    fn an_address_holds_a_bounded_number_of_unauthenticated_connections() {
        let pool = Unauthenticated::new(2);
        let shares = Arc::new(ConnectionShares::default());
        let here: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let one = ConnectionOwner::new(pool.admit(here));
        let two = ConnectionOwner::new(pool.admit(mapped));
        assert!(pool.admit(here).is_none(), "a third from one address");
        assert!(pool.admit("192.0.2.2".parse().unwrap()).is_some());
        // Authenticated, a connection leaves its address's count.
        one.claim_handle().claim(&shares, "alice", 5).unwrap();
        let three = pool.admit(here).expect("room once one authenticated");
        drop((two, three));
        assert!(crate::lock(&pool.held).is_empty());
    }
}
