//! [`PostgresStateStore`]: session state in a PostgreSQL database (feature `postgres`),
//! shared by managers on several hosts.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use crate::error::{Error, ErrorKind, Result};
use crate::store::records::{decode, encode, micros, refused, session_from_row, LeaseColumns};
use crate::store::{
    check_fence, decide_claim, decide_lease, Claim, ClaimOutcome, PoolEntry, SessionKey,
    SessionRecord, StateStore,
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
    instance_id: String,
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
        let instance_id = instance_id(&pool).await?;
        Ok(PostgresStateStore { pool, instance_id })
    }

    /// Closes every connection (waiting for queries in flight).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The store's instance id: written by the first process to open the store (a racing
/// second one keeps the first's), read by every other.
async fn instance_id(pool: &PgPool) -> Result<String> {
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    sqlx::query(
        "INSERT INTO store_meta (name, value) VALUES ('instance_id', $1) \
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(fresh)
    .execute(pool)
    .await
    .map_err(|e| db_error("recording the store's instance id", e))?;
    let row = sqlx::query("SELECT value FROM store_meta WHERE name = 'instance_id'")
        .fetch_one(pool)
        .await
        .map_err(|e| db_error("reading the store's instance id", e))?;
    Ok(row.get(0))
}

const SESSION_COLUMNS: &str = "data, fence, lease_owner, lease_expires";

fn session_row(row: &sqlx::postgres::PgRow) -> Result<SessionRecord> {
    session_from_row(row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Writes a whole record, lease columns included (claims and lease takes only).
async fn write_session(
    conn: &mut sqlx::PgConnection,
    record: &SessionRecord,
    context: &str,
) -> Result<()> {
    let lease = LeaseColumns::of(record)?;
    sqlx::query(
        "INSERT INTO sessions (tenant, session, sandbox_id, data, fence, lease_owner, \
         lease_expires, live) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (tenant, session) DO UPDATE SET sandbox_id = excluded.sandbox_id, \
         data = excluded.data, fence = excluded.fence, lease_owner = excluded.lease_owner, \
         lease_expires = excluded.lease_expires, live = excluded.live",
    )
    .bind(record.key.tenant())
    .bind(record.key.session())
    .bind(record.sandbox_id.as_ref().map(|id| id.as_str().to_owned()))
    .bind(encode(record)?)
    .bind(lease.fence)
    .bind(lease.owner)
    .bind(lease.expires)
    .bind(record.holds_sandbox())
    .execute(conn)
    .await
    .map_err(|e| db_error(context, e))?;
    Ok(())
}

#[async_trait]
impl StateStore for PostgresStateStore {
    async fn instance_id(&self) -> Result<String> {
        Ok(self.instance_id.clone())
    }

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
        // FOR UPDATE: a lease take or fenced write of one of these rows waits for us.
        // Only what the rule looks at: the key's record and the tenant's sessions that
        // hold a sandbox, not every session the tenant ever had.
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 AND (live OR session = $2) \
             FOR UPDATE"
        ))
        .bind(key.tenant())
        .bind(key.session())
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| db_error("reading the tenant's sessions", e))?;
        let records = rows.iter().map(session_row).collect::<Result<Vec<_>>>()?;
        let existing = records.iter().find(|r| &r.key == key);
        let outcome = decide_claim(claim, existing, &records)?;
        if let ClaimOutcome::Claimed { record, .. } | ClaimOutcome::Live(record) = &outcome {
            write_session(&mut tx, record, "writing the claim").await?;
        }
        tx.commit()
            .await
            .map_err(|e| db_error("committing the claim", e))?;
        Ok(outcome)
    }

    async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 AND session = $2"
        ))
        .bind(key.tenant())
        .bind(key.session())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| db_error("reading a session", e))?;
        row.as_ref().map(session_row).transpose()
    }

    async fn put(&self, record: &SessionRecord) -> Result<()> {
        let key = &record.key;
        let token = record.token();
        let fence = LeaseColumns::of(record)?.fence;
        // One statement: the fencing check and the write cannot be split by another
        // writer. The lease columns stay as they are.
        let query = if token == 0 {
            sqlx::query(
                "INSERT INTO sessions (tenant, session, sandbox_id, data, live) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, session) DO UPDATE SET \
                 sandbox_id = excluded.sandbox_id, data = excluded.data, live = excluded.live \
                 WHERE sessions.fence = 0",
            )
            .bind(key.tenant())
            .bind(key.session())
            .bind(record.sandbox_id.as_ref().map(|id| id.as_str().to_owned()))
            .bind(encode(record)?)
            .bind(record.holds_sandbox())
        } else {
            sqlx::query(
                "UPDATE sessions SET sandbox_id = $1, data = $2, live = $3 \
                 WHERE tenant = $4 AND session = $5 AND fence = $6",
            )
            .bind(record.sandbox_id.as_ref().map(|id| id.as_str().to_owned()))
            .bind(encode(record)?)
            .bind(record.holds_sandbox())
            .bind(key.tenant())
            .bind(key.session())
            .bind(fence)
        };
        let done = query
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("writing a session", e))?;
        if done.rows_affected() == 0 {
            return Err(refused(key, token, self.get(key).await));
        }
        Ok(())
    }

    async fn take_lease(
        &self,
        key: &SessionKey,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<SessionRecord> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| db_error("taking a lease", e))?;
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 AND session = $2 FOR UPDATE"
        ))
        .bind(key.tenant())
        .bind(key.session())
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| db_error("taking a lease", e))?;
        let existing = row.as_ref().map(session_row).transpose()?;
        let record = decide_lease(key, existing.as_ref(), owner, now, until)?;
        write_session(&mut tx, &record, "taking a lease").await?;
        tx.commit()
            .await
            .map_err(|e| db_error("taking a lease", e))?;
        Ok(record)
    }

    async fn renew_leases(&self, owner: &str, until: DateTime<Utc>) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE sessions SET lease_expires = $1 \
             WHERE lease_owner = $2 AND live AND sandbox_id IS NOT NULL",
        )
        .bind(micros(until))
        .bind(owner)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("renewing leases", e))?;
        Ok(done.rows_affected())
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

    async fn delete(&self, key: &SessionKey, token: u64) -> Result<()> {
        let fence = i64::try_from(token).unwrap_or(i64::MAX);
        let done =
            sqlx::query("DELETE FROM sessions WHERE tenant = $1 AND session = $2 AND fence = $3")
                .bind(key.tenant())
                .bind(key.session())
                .bind(fence)
                .execute(&self.pool)
                .await
                .map_err(|e| db_error("deleting a session", e))?;
        if done.rows_affected() == 0 {
            // Gone already is done; there under another token is refused.
            if let Some(stored) = self.get(key).await? {
                check_fence(key, Some(&stored), token)?;
            }
        }
        Ok(())
    }

    async fn list(&self, tenant: Option<&str>) -> Result<Vec<SessionRecord>> {
        let rows = match tenant {
            Some(t) => {
                sqlx::query(&format!(
                "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 ORDER BY tenant, session"
            ))
                .bind(t)
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions ORDER BY tenant, session"
                ))
                .fetch_all(&self.pool)
                .await
            }
        }
        .map_err(|e| db_error("listing sessions", e))?;
        rows.iter().map(session_row).collect()
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
