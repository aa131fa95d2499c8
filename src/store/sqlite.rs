//! [`SqliteStateStore`]: session state in one SQLite file (feature `sqlite`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

use crate::error::{Error, ErrorKind, Result};
use crate::store::records::{decode, encode};
use crate::store::session::{
    decide_claim, Claim, ClaimOutcome, PoolEntry, SessionKey, SessionRecord, StateStore,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A [`StateStore`] in a SQLite database file (bundled SQLite; migrations embedded).
///
/// Several processes may open the same file: claims run in `BEGIN IMMEDIATE`
/// transactions, which SQLite serializes across processes, so a tenant limit holds for
/// all of them together. The database runs in WAL mode and waits up to 30 s for a lock.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use sandcell::store::{SqliteStateStore, StateStore};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStateStore::open(dir.path().join("state.db")).await?;
/// assert!(store.list(None).await?.is_empty());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStateStore {
    pool: SqlitePool,
    path: PathBuf,
}

fn db_error(context: &str, e: sqlx::Error) -> Error {
    let (kind, temporary) = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => (ErrorKind::Unavailable, true),
        // SQLITE_BUSY / SQLITE_LOCKED: another process held the lock past the timeout.
        sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("5" | "6")) => {
            (ErrorKind::Unavailable, true)
        }
        _ => (ErrorKind::Backend, false),
    };
    Error::with_source(kind, format!("state store: {context}"), e).set_temporary(temporary)
}

fn timestamp(at: DateTime<Utc>) -> String {
    // Fixed width, so the text sorts in time order.
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

impl SqliteStateStore {
    /// Opens (creating if needed, with parent directories) the database at `path` and
    /// brings its schema up to date.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| Error::io(format_args!("creating {}", parent.display()), e))?;
        }
        let options = SqliteConnectOptions::from_str("sqlite:")
            .map_err(|e| db_error("building options", e))?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .map_err(|e| db_error(&format!("opening {}", path.display()), e))?;
        MIGRATOR.run(&pool).await.map_err(|e| {
            Error::with_source(
                ErrorKind::Backend,
                format!("state store: migrating {}", path.display()),
                e,
            )
        })?;
        Ok(SqliteStateStore { pool, path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes every connection (waiting for queries in flight).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

const UPSERT_SESSION: &str = "INSERT INTO sessions (tenant, session, sandbox_id, data) VALUES (?, ?, ?, ?) \
     ON CONFLICT (tenant, session) DO UPDATE SET sandbox_id = excluded.sandbox_id, data = excluded.data";

#[async_trait]
impl StateStore for SqliteStateStore {
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
        let key = &claim.record.key;
        // IMMEDIATE takes the write lock before the read, so no other process can slip a
        // claim in between our count and our insert.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db_error("starting a claim", e))?;
        let rows = sqlx::query("SELECT data FROM sessions WHERE tenant = ?")
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
        let row = sqlx::query("SELECT data FROM sessions WHERE tenant = ? AND session = ?")
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
        // Read-modify-write in one IMMEDIATE transaction so a concurrent `put` is not undone.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db_error("recording activity", e))?;
        let row = sqlx::query("SELECT data FROM sessions WHERE tenant = ? AND session = ?")
            .bind(key.tenant())
            .bind(key.session())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db_error("recording activity", e))?;
        if let Some(row) = row {
            let mut record: SessionRecord = decode(row.get::<&str, _>(0))?;
            if at > record.last_active {
                record.last_active = at;
                sqlx::query("UPDATE sessions SET data = ? WHERE tenant = ? AND session = ?")
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
        sqlx::query("DELETE FROM sessions WHERE tenant = ? AND session = ?")
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
                sqlx::query("SELECT data FROM sessions WHERE tenant = ? ORDER BY tenant, session")
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
            "INSERT INTO pool_entries (slot, pool, ready, created_at, data) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (slot) DO UPDATE SET pool = excluded.pool, ready = excluded.ready, \
             created_at = excluded.created_at, data = excluded.data",
        )
        .bind(&entry.slot)
        .bind(&entry.pool)
        .bind(entry.sandbox_id.is_some())
        .bind(timestamp(entry.created_at))
        .bind(encode(entry)?)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("writing a pool entry", e))?;
        Ok(())
    }

    async fn pool_take(&self, pool: &str) -> Result<Option<PoolEntry>> {
        // One statement: the row is chosen and deleted atomically.
        let row = sqlx::query(
            "DELETE FROM pool_entries WHERE slot = (SELECT slot FROM pool_entries \
             WHERE pool = ? AND ready = 1 ORDER BY created_at, slot LIMIT 1) RETURNING data",
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
        sqlx::query("DELETE FROM pool_entries WHERE slot = ?")
            .bind(slot)
            .execute(&self.pool)
            .await
            .map_err(|e| db_error("removing a pool entry", e))?;
        Ok(())
    }
}
