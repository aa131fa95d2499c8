//! Records as the SQL state stores keep them: JSON text, an unreadable one `Corrupt`.

use crate::error::{Error, ErrorKind, Result};

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
