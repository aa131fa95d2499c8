//! Where the manager keeps what must outlive its process: session records
//! ([`StateStore`]) and snapshots ([`SnapshotStore`]).
//!
//! | store | implementations |
//! |---|---|
//! | [`StateStore`] | [`SqliteStateStore`] (feature `sqlite`, default; one file), `PostgresStateStore` (feature `postgres`; managers on many hosts), [`InMemoryStateStore`] |
//! | [`SnapshotStore`] | [`FsSnapshotStore`] (durable files), [`InMemorySnapshotStore`], [`ObjectSnapshotStore`] (feature `object-store`) |
//!
//! Both traits are small on purpose: the manager holds the policy (limits, reaping,
//! retention) and a store only has to be atomic where its `# Behavior` list says so.
//! [`testing::store_conformance`](crate::testing) (feature `testing`) checks any
//! implementation against those lists.

mod fs;
mod memory;
#[cfg(feature = "object-store")]
mod object;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod records;
mod rules;
pub(crate) mod session;
mod snapshots;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod url;

pub use fs::FsSnapshotStore;
pub use memory::{InMemorySnapshotStore, InMemoryStateStore};
#[cfg(feature = "object-store")]
pub use object::ObjectSnapshotStore;
#[cfg(feature = "postgres")]
pub use postgres::PostgresStateStore;
pub use rules::{
    check_fence, decide_claim, decide_lease, held_elsewhere, Claim, ClaimOutcome, Lease,
};
pub use session::{PoolEntry, SessionKey, SessionRecord, StateStore};
pub use snapshots::{SnapshotKey, SnapshotStore};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStateStore;
pub use url::{open_snapshot_store, open_state_store};
