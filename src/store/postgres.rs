//! [`PostgresStateStore`]: session state in a PostgreSQL database (feature `postgres`),
//! shared by managers on several hosts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::error::{Error, ErrorKind, Result};
use crate::store::sql::session_columns;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A [`StateStore`](crate::store::StateStore) in PostgreSQL (migrations embedded, run at [`connect`](Self::connect)).
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
            .map_err(|e| Self::db_error(&format!("connecting to {}", shown(url)), e))?;
        Self::with_pool(pool).await
    }

    /// A store over `pool`, whose schema is brought up to date.
    pub async fn with_pool(pool: PgPool) -> Result<Self> {
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| Error::with_source(ErrorKind::Backend, "state store: migrating", e))?;
        let instance_id = crate::store::sql::instance_id!(&pool, Self::db_error);
        Ok(PostgresStateStore { pool, instance_id })
    }

    /// Closes every connection (waiting for queries in flight).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// PostgreSQL's side of the statements `crate::store::sql` writes once.
impl PostgresStateStore {
    /// Rows are locked as they are read (`ROW_LOCK`), the tenant by `lock_tenant`.
    async fn begin(&self) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.pool.begin().await
    }

    /// One claim per tenant at a time, across every manager: the count and the insert
    /// after it see no other claim of the tenant in between.
    async fn lock_tenant(tx: &mut sqlx::PgConnection, tenant: &str) -> Result<()> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(tenant)
            .execute(tx)
            .await
            .map_err(|e| Self::db_error("locking the tenant", e))?;
        Ok(())
    }

    /// FOR UPDATE: a lease take or fenced write of one of these rows waits for the claim.
    const CLAIM_ROWS: &'static str = concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE tenant = $1 AND (live OR session = $2) FOR UPDATE"
    );

    const ROW_LOCK: &'static str = " FOR UPDATE";

    /// SKIP LOCKED lets concurrent takers pass a row another holds, so two managers never
    /// take the same entry.
    const TAKE_READY: &'static str = "DELETE FROM pool_entries WHERE slot = (SELECT slot \
         FROM pool_entries WHERE pool = $1 AND ready ORDER BY created_at, slot LIMIT 1 \
         FOR UPDATE SKIP LOCKED) RETURNING data";

    /// A `timestamptz`.
    fn created_at(at: DateTime<Utc>) -> DateTime<Utc> {
        at
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
}

crate::store::sql::state_store!(
    PostgresStateStore,
    sqlx::PgConnection,
    sqlx::postgres::PgRow
);

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
