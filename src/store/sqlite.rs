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
use crate::store::records::{decode, encode, micros, refused, session_from_row, LeaseColumns};
use crate::store::{
    check_fence, decide_claim, decide_lease, Claim, ClaimOutcome, PoolEntry, SessionKey,
    SessionRecord, StateStore,
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
    instance_id: String,
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
        let private = path.clone();
        tokio::task::spawn_blocking(move || private_files(&private))
            .await
            .map_err(|e| Error::with_source(ErrorKind::Backend, "state store task failed", e))??;
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
        let instance_id = instance_id(&pool).await?;
        Ok(SqliteStateStore {
            pool,
            path,
            instance_id,
        })
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

/// Creates the database's missing parent directories `0700` and the database `0600`,
/// and takes group and other permissions off an existing database and its `-wal` and
/// `-shm` files (SQLite gives those the database's mode): the records hold every
/// spec's environment. A symlink in their place, a file another user owns, or a
/// directory that is not this user's alone (with everything above it) is refused
/// (`PermissionDenied`): there another user could have made them first and had the
/// records, or root's permission changes, sent where they chose.
fn private_files(path: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // SQLite makes its `-wal` and `-shm` files beside the database later, by name: in
    // a directory someone else may write (a shared /tmp), they could make them first.
    // Judged before anything is made, and made without following a link.
    crate::raw::private_dir::ensure_private_dir(parent)?;
    let me = rustix::process::geteuid().as_raw();
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = PathBuf::from(file);
        // Never through a link, and never a file someone else made for the records to
        // land in (a database in a directory another user could write first).
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create(suffix.is_empty())
            .truncate(false)
            .mode(0o600)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32,
            )
            .open(&file);
        let opened = match opened {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !suffix.is_empty() => continue,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                return Err(Error::permission_denied(format!(
                    "refusing to use {}: it is a symbolic link",
                    file.display()
                )))
            }
            Err(e) => return Err(Error::io(format_args!("opening {}", file.display()), e)),
        };
        let meta = opened
            .metadata()
            .map_err(|e| Error::io(format_args!("inspecting {}", file.display()), e))?;
        if meta.uid() != me {
            return Err(Error::permission_denied(format!(
                "refusing to use {}: it is owned by uid {}, not by this process's uid {me}",
                file.display(),
                meta.uid()
            )));
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            opened
                .set_permissions(std::fs::Permissions::from_mode(mode & 0o7700))
                .map_err(|e| Error::io(format_args!("making {} private", file.display()), e))?;
        }
    }
    Ok(())
}

/// The store's instance id: written by the first process to open the store (a racing
/// second one keeps the first's), read by every other.
async fn instance_id(pool: &SqlitePool) -> Result<String> {
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    sqlx::query(
        "INSERT INTO store_meta (name, value) VALUES ('instance_id', ?) \
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

fn session_row(row: &sqlx::sqlite::SqliteRow) -> Result<SessionRecord> {
    session_from_row(row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Writes a whole record, lease columns included (claims and lease takes only).
async fn write_session(
    conn: &mut sqlx::SqliteConnection,
    record: &SessionRecord,
    context: &str,
) -> Result<()> {
    let lease = LeaseColumns::of(record)?;
    sqlx::query(
        "INSERT INTO sessions (tenant, session, sandbox_id, data, fence, lease_owner, \
         lease_expires, live) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
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
impl StateStore for SqliteStateStore {
    async fn instance_id(&self) -> Result<String> {
        Ok(self.instance_id.clone())
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
        let key = &claim.record.key;
        // IMMEDIATE takes the write lock before the read, so no other process can slip a
        // claim in between our count and our insert.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db_error("starting a claim", e))?;
        // Only what the rule looks at: the key's record and the tenant's sessions that
        // hold a sandbox, not every session the tenant ever had. Two lookups, one per
        // index: without statistics (no ANALYZE) SQLite answers `live = 1 OR session = ?`
        // by scanning every session of the tenant, which grows with its history.
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND live = 1 \
             UNION ALL \
             SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND session = ? AND live = 0"
        ))
        .bind(key.tenant())
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
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND session = ?"
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
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, session) DO UPDATE SET \
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
                "UPDATE sessions SET sandbox_id = ?, data = ?, live = ? \
                 WHERE tenant = ? AND session = ? AND fence = ?",
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
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db_error("taking a lease", e))?;
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND session = ?"
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
            "UPDATE sessions SET lease_expires = ? \
             WHERE lease_owner = ? AND live = 1 AND sandbox_id IS NOT NULL",
        )
        .bind(micros(until))
        .bind(owner)
        .execute(&self.pool)
        .await
        .map_err(|e| db_error("renewing leases", e))?;
        Ok(done.rows_affected())
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

    async fn delete(&self, key: &SessionKey, token: u64) -> Result<()> {
        let fence = i64::try_from(token).unwrap_or(i64::MAX);
        let done =
            sqlx::query("DELETE FROM sessions WHERE tenant = ? AND session = ? AND fence = ?")
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
                "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? ORDER BY tenant, session"
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
