//! The SQL state stores' statements, written once: [`state_store!`] implements
//! [`StateStore`](super::StateStore) for a store type over one sqlx database, and each
//! dialect's file says only where the two databases differ.
//!
//! Both SQLite and PostgreSQL read `$1`, `$2`, ... as positional parameters, so one
//! text serves both. What a dialect gives, as items of its store type:
//!
//! | item | what |
//! |---|---|
//! | `async fn begin(&self)` | a transaction that writers cannot interleave with (`BEGIN IMMEDIATE` in SQLite, a plain one in PostgreSQL, whose rows are locked as read) |
//! | `async fn lock_tenant(tx, tenant)` | one claim per tenant at a time across processes (an advisory lock in PostgreSQL; SQLite's write lock already is) |
//! | `const CLAIM_ROWS` | the rows a claim decides from: the key's and the tenant's live sessions (`$1` tenant, `$2` session), locked |
//! | `const ROW_LOCK` | what a read adds to lock the rows it returns until commit |
//! | `const TAKE_READY` | the delete that takes the oldest ready entry of pool `$1`, returning its data |
//! | `fn created_at(at)` | a pool entry's creation time as the column stores it |
//! | `fn db_error(context, e)` | an sqlx error as a typed one (which codes are worth a retry) |

/// The columns a session row is read from, in `session_row`'s order (a macro, so
/// `concat!` takes it).
macro_rules! session_columns {
    () => {
        "data, fence, lease_owner, lease_expires"
    };
}

pub(super) use session_columns;

/// [`session_columns!`] as a constant, for `format!`.
pub(super) const SESSION_COLUMNS: &str = session_columns!();

/// Implements `StateStore` for `$store` (which holds `pool` and `instance_id` and has
/// the dialect's items, above), whose connections are `$conn` and rows `$row`.
macro_rules! state_store {
    ($store:ty, $conn:ty, $row:ty) => {
        const _: () = {
            use async_trait::async_trait;
            use chrono::{DateTime, Utc};
            use sqlx::Row;

            use $crate::error::Result;
            use $crate::store::records::{
                decode, encode, micros, refused, session_from_row, LeaseColumns,
            };
            use $crate::store::sql::SESSION_COLUMNS;
            use $crate::store::{
                check_fence, decide_claim, decide_lease, Claim, ClaimOutcome, PoolEntry,
                SessionKey, SessionRecord, StateStore,
            };

            fn session_row(row: &$row) -> Result<SessionRecord> {
                session_from_row(row.get(0), row.get(1), row.get(2), row.get(3))
            }

            /// Writes a whole record, lease columns included (claims and lease takes
            /// only).
            async fn write_session(
                conn: &mut $conn,
                record: &SessionRecord,
                context: &str,
            ) -> Result<()> {
                let lease = LeaseColumns::of(record)?;
                sqlx::query(
                    "INSERT INTO sessions (tenant, session, sandbox_id, data, fence, \
                     lease_owner, lease_expires, live) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                     ON CONFLICT (tenant, session) DO UPDATE SET sandbox_id = excluded.sandbox_id, \
                     data = excluded.data, fence = excluded.fence, \
                     lease_owner = excluded.lease_owner, \
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
                .map_err(|e| <$store>::db_error(context, e))?;
                Ok(())
            }

            #[async_trait]
            impl StateStore for $store {
                async fn instance_id(&self) -> Result<String> {
                    Ok(self.instance_id.clone())
                }

                async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
                    let key = &claim.record.key;
                    let mut tx = self
                        .begin()
                        .await
                        .map_err(|e| Self::db_error("starting a claim", e))?;
                    Self::lock_tenant(&mut tx, key.tenant()).await?;
                    // Only what the rule looks at: the key's record and the tenant's
                    // sessions that hold a sandbox, not every session it ever had.
                    let rows = sqlx::query(Self::CLAIM_ROWS)
                        .bind(key.tenant())
                        .bind(key.session())
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(|e| Self::db_error("reading the tenant's sessions", e))?;
                    let records = rows.iter().map(session_row).collect::<Result<Vec<_>>>()?;
                    let existing = records.iter().find(|r| &r.key == key);
                    let outcome = decide_claim(claim, existing, &records)?;
                    if let ClaimOutcome::Claimed { record, .. } | ClaimOutcome::Live(record) =
                        &outcome
                    {
                        write_session(&mut tx, record, "writing the claim").await?;
                    }
                    tx.commit()
                        .await
                        .map_err(|e| Self::db_error("committing the claim", e))?;
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
                    .map_err(|e| Self::db_error("reading a session", e))?;
                    row.as_ref().map(session_row).transpose()
                }

                async fn put(&self, record: &SessionRecord) -> Result<()> {
                    let key = &record.key;
                    let token = record.token();
                    let fence = LeaseColumns::of(record)?.fence;
                    // One statement: the fencing check and the write cannot be split by
                    // another writer. The lease columns stay as they are.
                    let query = if token == 0 {
                        sqlx::query(
                            "INSERT INTO sessions (tenant, session, sandbox_id, data, live) \
                             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, session) DO UPDATE \
                             SET sandbox_id = excluded.sandbox_id, data = excluded.data, \
                             live = excluded.live WHERE sessions.fence = 0",
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
                        .map_err(|e| Self::db_error("writing a session", e))?;
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
                        .begin()
                        .await
                        .map_err(|e| Self::db_error("taking a lease", e))?;
                    let row = sqlx::query(&format!(
                        "SELECT {SESSION_COLUMNS} FROM sessions \
                         WHERE tenant = $1 AND session = $2{}",
                        Self::ROW_LOCK
                    ))
                    .bind(key.tenant())
                    .bind(key.session())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(|e| Self::db_error("taking a lease", e))?;
                    let existing = row.as_ref().map(session_row).transpose()?;
                    let record = decide_lease(key, existing.as_ref(), owner, now, until)?;
                    write_session(&mut tx, &record, "taking a lease").await?;
                    tx.commit()
                        .await
                        .map_err(|e| Self::db_error("taking a lease", e))?;
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
                    .map_err(|e| Self::db_error("renewing leases", e))?;
                    Ok(done.rows_affected())
                }

                async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()> {
                    // Read-modify-write in one transaction holding the row, so a
                    // concurrent `put` is not undone.
                    let mut tx = self
                        .begin()
                        .await
                        .map_err(|e| Self::db_error("recording activity", e))?;
                    let row = sqlx::query(&format!(
                        "SELECT data FROM sessions WHERE tenant = $1 AND session = $2{}",
                        Self::ROW_LOCK
                    ))
                    .bind(key.tenant())
                    .bind(key.session())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(|e| Self::db_error("recording activity", e))?;
                    if let Some(row) = row {
                        let mut record: SessionRecord = decode(row.get::<&str, _>(0))?;
                        if at > record.last_active {
                            record.last_active = at;
                            sqlx::query(
                                "UPDATE sessions SET data = $1 WHERE tenant = $2 AND session = $3",
                            )
                            .bind(encode(&record)?)
                            .bind(key.tenant())
                            .bind(key.session())
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| Self::db_error("recording activity", e))?;
                        }
                    }
                    tx.commit()
                        .await
                        .map_err(|e| Self::db_error("recording activity", e))
                }

                async fn delete(&self, key: &SessionKey, token: u64) -> Result<()> {
                    let fence = i64::try_from(token).unwrap_or(i64::MAX);
                    let done = sqlx::query(
                        "DELETE FROM sessions WHERE tenant = $1 AND session = $2 AND fence = $3",
                    )
                    .bind(key.tenant())
                    .bind(key.session())
                    .bind(fence)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| Self::db_error("deleting a session", e))?;
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
                                "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 \
                                 ORDER BY tenant, session"
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
                    .map_err(|e| Self::db_error("listing sessions", e))?;
                    rows.iter().map(session_row).collect()
                }

                async fn pool_put(&self, entry: &PoolEntry) -> Result<()> {
                    sqlx::query(
                        "INSERT INTO pool_entries (slot, pool, ready, created_at, data) \
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (slot) DO UPDATE SET \
                         pool = excluded.pool, ready = excluded.ready, \
                         created_at = excluded.created_at, data = excluded.data",
                    )
                    .bind(&entry.slot)
                    .bind(&entry.pool)
                    .bind(entry.sandbox_id.is_some())
                    .bind(Self::created_at(entry.created_at))
                    .bind(encode(entry)?)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| Self::db_error("writing a pool entry", e))?;
                    Ok(())
                }

                async fn pool_take(&self, pool: &str) -> Result<Option<PoolEntry>> {
                    // One statement: the row is chosen and deleted atomically.
                    let row = sqlx::query(Self::TAKE_READY)
                        .bind(pool)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| Self::db_error("taking a pool entry", e))?;
                    row.map(|row| decode(row.get::<&str, _>(0))).transpose()
                }

                async fn pool_list(&self) -> Result<Vec<PoolEntry>> {
                    let rows = sqlx::query(
                        "SELECT data FROM pool_entries ORDER BY pool, created_at, slot",
                    )
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| Self::db_error("listing pool entries", e))?;
                    rows.iter()
                        .map(|row| decode(row.get::<&str, _>(0)))
                        .collect()
                }

                async fn pool_remove(&self, slot: &str) -> Result<()> {
                    sqlx::query("DELETE FROM pool_entries WHERE slot = $1")
                        .bind(slot)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| Self::db_error("removing a pool entry", e))?;
                    Ok(())
                }
            }
        };
    };
}

pub(super) use state_store;

/// The store's instance id: written by the first process to open the store (a racing
/// second one keeps the first's), read by every other. The same statements in both
/// dialects; `db_error` is the dialect's.
macro_rules! instance_id {
    ($pool:expr, $db_error:path) => {{
        use sqlx::Row;
        let fresh = uuid::Uuid::new_v4().simple().to_string();
        sqlx::query(
            "INSERT INTO store_meta (name, value) VALUES ('instance_id', $1) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(fresh)
        .execute($pool)
        .await
        .map_err(|e| $db_error("recording the store's instance id", e))?;
        let row = sqlx::query("SELECT value FROM store_meta WHERE name = 'instance_id'")
            .fetch_one($pool)
            .await
            .map_err(|e| $db_error("reading the store's instance id", e))?;
        let id: String = row.get(0);
        id
    }};
}

pub(super) use instance_id;
