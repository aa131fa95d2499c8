//! The one error type of sandcell and its matchable [`ErrorKind`].
//!
//! Backends keep private error types and convert them at their crate boundary into
//! [`Error`], adding the operation that failed as context ("failed to pull image 'x'").
//! Callers match on [`Error::kind`] rather than on variants, so variants can be added
//! without breaking anyone.

use std::fmt;

/// A `Result` whose error is sandcell's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as a `Copy` value callers can match on.
///
/// New kinds may be added in minor releases; match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The sandbox, file, snapshot or session does not exist.
    NotFound,
    /// Something with that name or id already exists.
    AlreadyExists,
    /// The backend cannot do this at all (see [`Capabilities`](crate::Capabilities)).
    Unsupported,
    /// The caller passed something malformed: a bad path, a hostile archive entry,
    /// an empty command, an edit whose old text does not match exactly once.
    InvalidInput,
    /// The operation would leave the workspace or touch something it may not.
    PermissionDenied,
    /// A configured limit was hit: tenant quota, archive caps, output caps.
    LimitExceeded,
    /// A deadline passed before the operation finished.
    Timeout,
    /// The backend or a service it needs is not reachable right now.
    Unavailable,
    /// Stored data failed verification (hash mismatch, truncated or undecodable blob).
    Corrupt,
    /// The sandbox is in a state that does not allow the operation (e.g. exec on a paused sandbox).
    InvalidState,
    /// Any other failure inside a backend.
    Backend,
}

impl ErrorKind {
    /// A short lower-case name, stable across releases, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::LimitExceeded => "limit exceeded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::Backend => "backend error",
        }
    }
}

impl ErrorKind {
    /// Every kind, for protocols that carry kinds by name.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::NotFound,
        ErrorKind::AlreadyExists,
        ErrorKind::Unsupported,
        ErrorKind::InvalidInput,
        ErrorKind::PermissionDenied,
        ErrorKind::LimitExceeded,
        ErrorKind::Timeout,
        ErrorKind::Unavailable,
        ErrorKind::Corrupt,
        ErrorKind::InvalidState,
        ErrorKind::Backend,
    ];

    /// The kind whose [`as_str`](Self::as_str) is `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error every sandcell API returns.
///
/// Use [`Error::kind`] to decide what to do, and `Display` to tell a person.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A failure with a kind and a message that says what was being done.
    #[error("{message}")]
    Message {
        /// What went wrong, as a kind.
        kind: ErrorKind,
        /// What was being done and why it failed.
        message: String,
        /// Whether retrying the same call may succeed.
        temporary: bool,
    },
    /// A failure with an underlying cause, kept as the error's `source()`.
    #[error("{message}")]
    Source {
        /// What went wrong, as a kind.
        kind: ErrorKind,
        /// What was being done.
        message: String,
        /// Whether retrying the same call may succeed.
        temporary: bool,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// A new error of `kind` with a message that says what was being done.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error::Message {
            kind,
            message: message.into(),
            temporary: matches!(kind, ErrorKind::Timeout | ErrorKind::Unavailable),
        }
    }

    /// A new error of `kind` caused by `source`.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::Source {
            kind,
            message: message.into(),
            temporary: matches!(kind, ErrorKind::Timeout | ErrorKind::Unavailable),
            source: source.into(),
        }
    }

    /// Shorthand for `Error::new(ErrorKind::NotFound, ..)`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// Shorthand for `Error::new(ErrorKind::InvalidInput, ..)`.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// Shorthand for `Error::new(ErrorKind::Unsupported, ..)`.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// Shorthand for `Error::new(ErrorKind::PermissionDenied, ..)`.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// Shorthand for `Error::new(ErrorKind::LimitExceeded, ..)`.
    pub fn limit_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::LimitExceeded, message)
    }

    /// Shorthand for `Error::new(ErrorKind::Corrupt, ..)`.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    /// An I/O error with what was being done, its kind derived from the `io::ErrorKind`.
    pub fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
        // An io::Error that wraps one of ours (e.g. raised inside a Read adapter) keeps its kind.
        if err.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            if let Some(inner) = err.into_inner() {
                if let Ok(ours) = inner.downcast::<Error>() {
                    return ours.context(context);
                }
            }
            return Error::new(ErrorKind::Backend, format!("{context}: lost error"));
        }
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            std::io::ErrorKind::InvalidInput
            | std::io::ErrorKind::InvalidData
            | std::io::ErrorKind::NotADirectory
            | std::io::ErrorKind::IsADirectory
            | std::io::ErrorKind::DirectoryNotEmpty => ErrorKind::InvalidInput,
            std::io::ErrorKind::TimedOut => ErrorKind::Timeout,
            std::io::ErrorKind::UnexpectedEof => ErrorKind::Corrupt,
            _ => ErrorKind::Backend,
        };
        Self::with_source(kind, format!("{context}: {err}"), err)
    }

    /// What went wrong, as a matchable kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Message { kind, .. } | Error::Source { kind, .. } => *kind,
        }
    }

    /// Whether retrying the same call may succeed (timeouts, unreachable services).
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Message { temporary, .. } | Error::Source { temporary, .. } => *temporary,
        }
    }

    /// Marks whether a retry may succeed, overriding the default derived from the kind.
    pub fn set_temporary(mut self, value: bool) -> Self {
        match &mut self {
            Error::Message { temporary, .. } | Error::Source { temporary, .. } => {
                *temporary = value
            }
        }
        self
    }

    /// Prefixes the message with what was being done, keeping kind and source.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        match &mut self {
            Error::Message { message, .. } | Error::Source { message, .. } => {
                *message = format!("{context}: {message}");
            }
        }
        self
    }

    /// Wraps this error into an `io::Error` so it can cross `Read`/`Write` adapters and
    /// come back out of [`Error::io`] with its kind intact.
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_survive_a_trip_through_io_error() {
        let original = Error::limit_exceeded("archive has more than 10 entries");
        let back = Error::io("unpacking", original.into_io());
        assert_eq!(back.kind(), ErrorKind::LimitExceeded);
        assert_eq!(
            back.to_string(),
            "unpacking: archive has more than 10 entries"
        );
    }

    #[test]
    fn io_errors_map_to_kinds() {
        let e = Error::io(
            "reading a.txt",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().starts_with("reading a.txt: "));
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn only_timeouts_and_unavailable_are_temporary_by_default() {
        assert!(Error::new(ErrorKind::Timeout, "t").is_temporary());
        assert!(Error::new(ErrorKind::Unavailable, "u").is_temporary());
        assert!(!Error::new(ErrorKind::NotFound, "n").is_temporary());
        assert!(Error::new(ErrorKind::Backend, "b")
            .set_temporary(true)
            .is_temporary());
    }
}
