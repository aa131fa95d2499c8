//! [`PostgresStateStore`]: session state in a PostgreSQL database (feature `postgres`),
//! shared by managers on several hosts.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use crate::error::{Error, ErrorKind, Result};
use crate::store::records::{decode, encode};
use crate::store::session::{
    decide_claim, Claim, ClaimOutcome, PoolEntry, SessionKey, SessionRecord, StateStore,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A [`StateStore`] in PostgreSQL (migrations embedded, run at [`connect`](Self::connect)).
///
/// Any number of managers, on any number of hosts, may share one database: a claim
/// takes a transaction-scoped advisory lock on its tenant before it counts the tenant's
/// sessions, so a tenant limit holds for all of them together, and `touch` locks the
/// row it updates.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use sandcell::store::{PostgresStateStore, StateStore};
///
/// let store = PostgresStateStore::connect("postgres://sandcell@db.internal/sandcell").await?;
/// assert!(store.list(None).await.is_ok());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStateStore {
    pool: PgPool,
}

fn db_error(context: &str, e: sqlx::Error) -> Error {
    let (kind, temporary) = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
            (ErrorKind::Unavailable, true)
        }
        // Serialization failures and deadlocks: worth another try.
        sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40001" | "40P01")) => {
            (ErrorKind::Unavailable, true)
        }
        sqlx::Error::Configuration(_) => (ErrorKind::InvalidInput, false),
        _ => (ErrorKind::Backend, false),
    };
    Error::with_source(kind, format!("state store: {context}"), e).set_temporary(temporary)
}

/// The URL with its password (if any) hidden, for messages.
fn shown(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl PostgresStateStore {
    /// Connects to the database at `url` (`postgres://user:password@host/db`, with
    /// `?sslmode=require` for TLS) and brings its schema up to date.
    pub async fn connect(url: &str) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|e| db_error(&format!("connecting to {}", shown(url)), e))?;
        Self::with_pool(pool).await
    }

    /// A store over `pool`, whose schema is brought up to date.
    pub async fn with_pool(pool: PgPool) -> Result<Self> {
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| Error::with_source(ErrorKind::Backend, "state store: migrating", e))?;
        Ok(PostgresStateStore { pool })
    }

    /// Closes every connection (waiting for queries in flight).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

const UPSERT_SESSION: &str = "INSERT INTO sessions (tenant, session, sandbox_id, data) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (tenant, session) DO UPDATE SET sandbox_id = excluded.sandbox_id, data = excluded.data";

#[async_trait]
impl StateStore for PostgresStateStore {
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
        let key = &claim.record.key;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| db_error("starting a claim", e))?;
        // One claim per tenant at a time, across every manager: the count below and the
        // insert after it see no other claim of the tenant in between.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(key.tenant())
            .execute(&mut *tx)
            .await
            .map_err(|e| db_error("locking the tenant", e))?;
        let rows = sqlx::query("SELECT data FROM sessions WHERE tenant = $1")
            .bind(key.tenant())
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db_error("reading the tenant's sessions", e))?;
        let records = rows
            .iter()
            .map(|row| decode::<SessionRecord>(row.get::<&str, _>(0)))
            .collect::<Result<Vec<_>>>()?;
        let existing = records.iter().find(|r| &r.key == key);
        let outcome = decide_claim(claim, existing, &records)?;
        if let ClaimOutcome::Claimed(previous) = &outcome {
            let mut record = claim.record.clone();
            if let Some(previous) = previous {
                record.created_at = previous.created_at;
            }
            sqlx::query(UPSERT_SESSION)
                .bind(key.tenant())
                .bind(key.session())
                .bind(record.sandbox_id.as_ref().map(|id| id.as_str().to_owned()))
                .bind(encode(&record)?)
                .execute(&mut *tx)
                .await
                .map_err(|e| db_error("writing the claim", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| db_error("committing the claim", e))?;
        Ok(outcome)
    }

    async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>> {
        let row = sqlx::query("SELECT data FROM sessions WHERE tenant = $1 AND session = $2")
            .bind(key.tenant())
            .bind(key.session())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| db_error("reading a session", e))?;
        row.map(|row| decode(row.get::<&str, _>(0))).transpose()
    }

    async fn put(&self, record: &SessionRecord) -> Result<()> {
        sqlx::query(UPSERT_SESSION)
            .bind(record.key.tenant())
            .bind(record.key.session())
            .bind(record.sandbox_id.as_ref().map(|id| id.as_str().to_owned()))
            .bind(encode(record)?)
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("writing a session", e))?;
        Ok(())
    }

    async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()> {
        // Read-modify-write under the row's lock, so a concurrent `put` is not undone.
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| db_error("recording activity", e))?;
        let row =
            sqlx::query("SELECT data FROM sessions WHERE tenant = $1 AND session = $2 FOR UPDATE")
                .bind(key.tenant())
                .bind(key.session())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| db_error("recording activity", e))?;
        if let Some(row) = row {
            let mut record: SessionRecord = decode(row.get::<&str, _>(0))?;
            if at > record.last_active {
                record.last_active = at;
                sqlx::query("UPDATE sessions SET data = $1 WHERE tenant = $2 AND session = $3")
                    .bind(encode(&record)?)
                    .bind(key.tenant())
                    .bind(key.session())
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_error("recording activity", e))?;
            }
        }
        tx.commit()
            .await
            .map_err(|e| db_error("recording activity", e))
    }

    async fn delete(&self, key: &SessionKey) -> Result<()> {
        sqlx::query("DELETE FROM sessions WHERE tenant = $1 AND session = $2")
            .bind(key.tenant())
            .bind(key.session())
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("deleting a session", e))?;
        Ok(())
    }

    async fn list(&self, tenant: Option<&str>) -> Result<Vec<SessionRecord>> {
        let rows = match tenant {
            Some(t) => {
                sqlx::query("SELECT data FROM sessions WHERE tenant = $1 ORDER BY tenant, session")
                    .bind(t)
                    .fetch_all(&self.pool)
                    .await
            }
            None => {
                sqlx::query("SELECT data FROM sessions ORDER BY tenant, session")
                    .fetch_all(&self.pool)
                    .await
            }
        }
        .map_err(|e| db_error("listing sessions", e))?;
        rows.iter()
            .map(|row| decode(row.get::<&str, _>(0)))
            .collect()
    }

    async fn pool_put(&self, entry: &PoolEntry) -> Result<()> {
        sqlx::query(
            "INSERT INTO pool_entries (slot, pool, ready, created_at, data) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (slot) DO UPDATE SET pool = excluded.pool, ready = excluded.ready, \
             created_at = excluded.created_at, data = excluded.data",
        )
        .bind(&entry.slot)
        .bind(&entry.pool)
        .bind(entry.sandbox_id.is_some())
        .bind(entry.created_at)
        .bind(encode(entry)?)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("writing a pool entry", e))?;
        Ok(())
    }

    async fn pool_take(&self, pool: &str) -> Result<Option<PoolEntry>> {
        // One statement; SKIP LOCKED lets concurrent takers pass a row another holds,
        // so two managers never take the same entry.
        let row = sqlx::query(
            "DELETE FROM pool_entries WHERE slot = (SELECT slot FROM pool_entries \
             WHERE pool = $1 AND ready ORDER BY created_at, slot LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING data",
        )
        .bind(pool)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| db_error("taking a pool entry", e))?;
        row.map(|row| decode(row.get::<&str, _>(0))).transpose()
    }

    async fn pool_list(&self) -> Result<Vec<PoolEntry>> {
        let rows = sqlx::query("SELECT data FROM pool_entries ORDER BY pool, created_at, slot")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_error("listing pool entries", e))?;
        rows.iter()
            .map(|row| decode(row.get::<&str, _>(0)))
            .collect()
    }

    async fn pool_remove(&self, slot: &str) -> Result<()> {
        sqlx::query("DELETE FROM pool_entries WHERE slot = $1")
            .bind(slot)
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("removing a pool entry", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            shown("postgres://app:s3cret@db:5432/x"),
            "postgres://app@db:5432/x"
        );
        assert_eq!(shown("postgres://db/x"), "postgres://db/x");
    }
}
