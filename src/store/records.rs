//! Records as the SQL state stores keep them: JSON text beside the lease columns that
//! are the lease's truth (an unreadable record is `Corrupt`).

use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};
use crate::store::{check_fence, Lease, SessionKey, SessionRecord};

/// A stored record read back.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| {
        Error::with_source(
            ErrorKind::Corrupt,
            "state store holds an unreadable record",
            e,
        )
    })
}

/// A record as it is stored.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding a state record", e))
}

/// The lease columns of a record: fencing token, owner, expiry in microseconds.
pub(crate) struct LeaseColumns {
    pub(crate) fence: i64,
    pub(crate) owner: Option<String>,
    pub(crate) expires: Option<i64>,
}

impl LeaseColumns {
    pub(crate) fn of(record: &SessionRecord) -> Result<Self> {
        let fence = i64::try_from(record.token())
            .map_err(|_| Error::invalid_input("a fencing token past i64::MAX"))?;
        Ok(LeaseColumns {
            fence,
            owner: record.lease.as_ref().map(|l| l.owner.clone()),
            expires: record.lease.as_ref().map(|l| micros(l.expires_at)),
        })
    }
}

/// A session row read back: the JSON record with the lease its columns hold (the JSON
/// copy of the lease is not kept current by renewals).
pub(crate) fn session_from_row(
    data: &str,
    fence: i64,
    owner: Option<String>,
    expires: Option<i64>,
) -> Result<SessionRecord> {
    let mut record: SessionRecord = decode(data)?;
    record.lease = match (owner, expires) {
        (Some(owner), Some(expires)) => Some(Lease::new(
            owner,
            u64::try_from(fence).unwrap_or_default(),
            from_micros(expires),
        )),
        _ => None,
    };
    Ok(record)
}

/// A timestamp as microseconds since the epoch (sortable, exact in an INTEGER column).
pub(crate) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

/// The error for a fenced write that changed no row, from the record stored now: it
/// says who holds the session (or, if it has since come to match, the write raced
/// another and is refused all the same).
pub(crate) fn refused(
    key: &SessionKey,
    token: u64,
    stored: Result<Option<SessionRecord>>,
) -> Error {
    match stored {
        Ok(stored) => check_fence(key, stored.as_ref(), token)
            .err()
            .unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Conflict,
                    format!("session {key} changed while it was written; the write was refused"),
                )
            }),
        Err(e) => e,
    }
}
