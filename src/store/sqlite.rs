//! [`SqliteStateStore`]: session state in one SQLite file (feature `sqlite`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::{Error, ErrorKind, Result};
use crate::store::sql::session_columns;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A [`StateStore`](crate::store::StateStore) in a SQLite database file (bundled SQLite; migrations embedded).
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
            .map_err(|e| Self::db_error("building options", e))?
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
            .map_err(|e| Self::db_error(&format!("opening {}", path.display()), e))?;
        MIGRATOR.run(&pool).await.map_err(|e| {
            Error::with_source(
                ErrorKind::Backend,
                format!("state store: migrating {}", path.display()),
                e,
            )
        })?;
        let instance_id = crate::store::sql::instance_id!(&pool, Self::db_error);
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

/// SQLite's side of the statements `crate::store::sql` writes once.
impl SqliteStateStore {
    /// IMMEDIATE takes the write lock before the first read, so no other process slips a
    /// write in between a read and the write it decides.
    async fn begin(&self) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// The write lock `begin` took serializes claims already.
    async fn lock_tenant(_: &mut sqlx::SqliteConnection, _: &str) -> Result<()> {
        Ok(())
    }

    /// Two lookups, one per index: without statistics (no ANALYZE) SQLite answers
    /// `live = 1 OR session = ?` by scanning every session of the tenant, which grows
    /// with its history.
    const CLAIM_ROWS: &'static str = concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE tenant = $1 AND live = 1 UNION ALL SELECT ",
        session_columns!(),
        " FROM sessions WHERE tenant = $1 AND session = $2 AND live = 0"
    );

    /// The transaction holds the database's write lock: rows need none of their own.
    const ROW_LOCK: &'static str = "";

    const TAKE_READY: &'static str = "DELETE FROM pool_entries WHERE slot = (SELECT slot \
         FROM pool_entries WHERE pool = $1 AND ready = 1 ORDER BY created_at, slot LIMIT 1) \
         RETURNING data";

    /// Text of fixed width, so it sorts in time order.
    fn created_at(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(SecondsFormat::Micros, true)
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
}

crate::store::sql::state_store!(
    SqliteStateStore,
    sqlx::SqliteConnection,
    sqlx::sqlite::SqliteRow
);

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
