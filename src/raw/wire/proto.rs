//! The JSON messages inside `Call`, `Reply`, `Exit` and `Abort` frames.

use serde::{Deserialize, Serialize};

use crate::archive::ImportOptions;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::ExecRequest;
use crate::fs::DirEntry;
use crate::path::SandboxPath;

/// One operation on the served sandbox. Bulk input (stdin, file content, a tar) follows
/// as `Data` frames and an `End`; bulk output comes back the same way after the reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Call {
    /// Start a command; stdin arrives as data frames. The reply carries the output cap.
    Exec {
        request: ExecRequest,
    },
    /// Read a file; its bytes follow the reply.
    Read {
        path: SandboxPath,
    },
    /// Write a file from the data frames.
    Write {
        path: SandboxPath,
    },
    Stat {
        path: SandboxPath,
    },
    ListDir {
        path: SandboxPath,
    },
    Remove {
        path: SandboxPath,
        recursive: bool,
    },
    Mkdir {
        path: SandboxPath,
    },
    Rename {
        from: SandboxPath,
        to: SandboxPath,
    },
    /// Export a directory; the tar follows the reply.
    ExportTar {
        path: SandboxPath,
    },
    /// Import the tar of the data frames.
    ImportTar {
        path: SandboxPath,
        options: ImportOptions,
    },
    /// The changes since the template; the reply lists deletions, the tar follows it.
    ExportChanges,
    /// Watch a directory; the reply is followed by the events as JSON lines in data
    /// frames, until the client's `Kill` or the end of the watch.
    Watch {
        path: SandboxPath,
        #[serde(default)]
        options: crate::WatchOptions,
    },
    /// A resource reading of the sandbox.
    Metrics,
    /// Change the sandbox's network allowlist.
    SetNetwork {
        network: crate::Network,
    },
}

impl Call {
    /// Serves the calls answered with a value alone, written here beside their
    /// messages so that a new one is added in this file and [`WireClient`]'s only;
    /// `Err` gives back the others, which stream (`super::server`).
    ///
    /// [`WireClient`]: super::WireClient
    pub(crate) async fn serve_simple(
        self,
        backend: &dyn crate::SandboxBackend,
        sandbox: &crate::SandboxId,
    ) -> std::result::Result<Result<serde_json::Value>, Call> {
        fn value<T: Serialize>(r: Result<T>) -> Result<serde_json::Value> {
            r.and_then(|v| {
                serde_json::to_value(v)
                    .map_err(|e| Error::new(ErrorKind::Backend, format!("encoding a reply: {e}")))
            })
        }
        Ok(match self {
            Call::Stat { path } => value(backend.stat(sandbox, &path).await),
            Call::Remove { path, recursive } => {
                value(backend.remove(sandbox, &path, recursive).await)
            }
            Call::Mkdir { path } => value(backend.mkdir(sandbox, &path).await),
            Call::Rename { from, to } => value(backend.rename(sandbox, &from, &to).await),
            Call::Metrics => value(backend.metrics(sandbox).await),
            Call::SetNetwork { network } => value(backend.set_network(sandbox, &network).await),
            streamed => return Err(streamed),
        })
    }
}

/// A call's result: `{"ok": value}` or `{"err": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    Ok(serde_json::Value),
    Err(WireError),
}

/// An [`Error`] as it crosses the wire: its kind, message and retry hint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireError {
    kind: String,
    message: String,
    temporary: bool,
}

impl From<&Error> for WireError {
    fn from(e: &Error) -> Self {
        WireError {
            kind: e.kind().name().to_owned(),
            message: e.to_string(),
            temporary: e.is_temporary(),
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        // A kind this side does not know (a newer agent) is still an error.
        let kind = ErrorKind::from_name(&e.kind).unwrap_or(ErrorKind::Backend);
        Error::new(kind, e.message).set_temporary(e.temporary)
    }
}

impl Reply {
    pub(crate) fn from_result<T: Serialize>(result: Result<T>) -> Self {
        match result {
            Ok(value) => match serde_json::to_value(value) {
                Ok(v) => Reply::Ok(v),
                Err(e) => Reply::Err(WireError::from(&Error::new(
                    ErrorKind::Backend,
                    format!("encoding a reply: {e}"),
                ))),
            },
            Err(e) => Reply::Err(WireError::from(&e)),
        }
    }

    pub(crate) fn into_result<T: serde::de::DeserializeOwned>(self) -> Result<T> {
        match self {
            Reply::Ok(v) => serde_json::from_value(v)
                .map_err(|e| super::frame::protocol(format_args!("reply ({e})"))),
            Reply::Err(e) => Err(e.into()),
        }
    }
}

/// Most bytes a listing takes on the wire: twice what its names and paths may total,
/// room for JSON's quoting. Over it the server answers `LimitExceeded` and a client
/// stops reading.
pub(crate) const MAX_LISTING_WIRE_BYTES: usize = 2 * crate::MAX_LISTING_BYTES;

/// A listing as the data of a `ListDir` reply. Encoding stops at
/// [`MAX_LISTING_WIRE_BYTES`]: names of control characters take six bytes each in
/// JSON, so the encoding may be several times the names' own size.
pub(crate) fn encode_listing(path: &SandboxPath, entries: &[DirEntry]) -> Result<Vec<u8>> {
    let mut out = CappedWriter(Vec::new());
    serde_json::to_writer(&mut out, &entries).map_err(|_| {
        crate::Error::limit_exceeded(format!(
            "listing {path}: over {MAX_LISTING_WIRE_BYTES} bytes on the wire"
        ))
    })?;
    Ok(out.0)
}

/// A buffer that refuses to grow past [`MAX_LISTING_WIRE_BYTES`].
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + bytes.len() > MAX_LISTING_WIRE_BYTES {
            return Err(std::io::Error::other("over the listing's size cap"));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encodes a message for a frame payload.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // These types serialize infallibly (no maps with non-string keys, no custom errors).
    serde_json::to_vec(value).unwrap_or_default()
}

/// A `Call` as the server reads it. Well-formed JSON that names an operation this side
/// does not know is `Unsupported` (a newer peer), and a known operation with an argument
/// that fails its own checks (a path with `..`, say) is `InvalidInput`, the kind the
/// same argument gets from a backend directly; only malformed JSON is the peer breaking
/// the protocol.
pub(crate) fn decode_call(payload: &[u8]) -> Result<Call> {
    serde_json::from_slice(payload).map_err(|e| match e.classify() {
        serde_json::error::Category::Data if e.to_string().starts_with("unknown variant") => {
            Error::new(
                ErrorKind::Unsupported,
                format!("this side of the wire does not know the call: {e}"),
            )
        }
        serde_json::error::Category::Data => {
            Error::new(ErrorKind::InvalidInput, format!("invalid call: {e}"))
        }
        _ => super::frame::protocol(format_args!("call ({e})")),
    })
}

/// Decodes a frame payload.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(payload: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(payload)
        .map_err(|e| super::frame::protocol(format_args!("{what} ({e})")))
}
