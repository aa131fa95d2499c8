//! The one error type of sandcell and its matchable [`ErrorKind`].
//!
//! Backends keep private error types and convert them at their crate boundary into
//! [`Error`], adding the operation that failed as context ("failed to pull image 'x'").
//! Callers match on [`Error::kind`] rather than on variants, so variants can be added
//! without breaking anyone.

use std::fmt;

use crate::sandbox::SandboxId;
use crate::store::SessionKey;

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
    /// Another manager holds the session (its lease has not expired), or this manager's
    /// lease was taken over and its change refused; the message names the owner.
    Conflict,
    /// Any other failure inside a backend.
    Backend,
}

impl ErrorKind {
    /// A short readable name for messages (`"not found"`); protocols and metrics use
    /// [`name`](Self::name).
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
            ErrorKind::Conflict => "conflict",
            ErrorKind::Backend => "backend error",
        }
    }
}

impl ErrorKind {
    /// The kind's name on the wire and in scripts: snake_case, stable across releases
    /// (`"not_found"`, `"invalid_input"` ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::InvalidState => "invalid_state",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Backend => "backend",
        }
    }

    /// Every kind, for protocols that carry kinds by name.
    pub const ALL: [ErrorKind; 12] = [
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
        ErrorKind::Conflict,
        ErrorKind::Backend,
    ];

    /// The kind whose [`name`](Self::name) is `name`. The readable form of
    /// [`as_str`](Self::as_str) is accepted too, from peers that predate snake_case.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name || k.as_str() == name)
    }
}

/// Serialized by [`name`](ErrorKind::name) (`"not_found"`), as on the wire.
impl serde::Serialize for ErrorKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Read by [`from_name`](ErrorKind::from_name); a kind this version does not know (a
/// newer writer's) reads as [`ErrorKind::Backend`], so it is still an error.
impl<'de> serde::Deserialize<'de> for ErrorKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(d)?;
        Ok(ErrorKind::from_name(&name).unwrap_or(ErrorKind::Backend))
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an error happened, as data: filled in by the layers that know it (the
/// manager's [`SandboxHandle`](crate::SandboxHandle) sets all three), so callers and
/// logs need not parse messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ErrorContext {
    operation: Option<String>,
    sandbox: Option<SandboxId>,
    session: Option<SessionKey>,
}

/// The error every sandcell API returns.
///
/// Opaque on purpose: use [`Error::kind`] to decide what to do, `Display` to tell a
/// person (the alternate form, `{:#}`, adds the context), and the accessors for the
/// structured context (operation, sandbox, session) that the manager fills in.
///
/// ```
/// use sandcell::{Error, ErrorKind};
/// let e = Error::not_found("a.txt does not exist").set_operation("read");
/// assert_eq!(e.kind(), ErrorKind::NotFound);
/// assert_eq!(e.operation(), Some("read"));
/// assert_eq!(e.to_string(), "a.txt does not exist");
/// assert_eq!(format!("{e:#}"), "a.txt does not exist (operation read)");
/// ```
pub struct Error {
    kind: ErrorKind,
    message: String,
    temporary: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    context: Option<Box<ErrorContext>>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("message", &self.message)
            .field("temporary", &self.temporary);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        if let Some(context) = &self.context {
            d.field("operation", &context.operation)
                .field("sandbox", &context.sandbox)
                .field("session", &context.session);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        let Some(context) = self.context.as_deref().filter(|_| f.alternate()) else {
            return Ok(());
        };
        let parts: Vec<String> = [
            context.operation.as_ref().map(|o| format!("operation {o}")),
            context.sandbox.as_ref().map(|s| format!("sandbox {s}")),
            context.session.as_ref().map(|s| format!("session {s}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !parts.is_empty() {
            write!(f, " ({})", parts.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl Error {
    /// A new error of `kind` with a message that says what was being done.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            temporary: matches!(kind, ErrorKind::Timeout | ErrorKind::Unavailable),
            source: None,
            context: None,
        }
    }

    /// A new error of `kind` caused by `source`.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error {
            source: Some(source.into()),
            ..Error::new(kind, message)
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
            // A file past a size limit, or a directory past a walk's (`raw::tree`),
            // or the names all walks hold at once past theirs.
            std::io::ErrorKind::FileTooLarge | std::io::ErrorKind::OutOfMemory => {
                ErrorKind::LimitExceeded
            }
            std::io::ErrorKind::UnexpectedEof => ErrorKind::Corrupt,
            _ => ErrorKind::Backend,
        };
        Self::with_source(kind, format!("{context}: {err}"), err)
    }

    /// What went wrong, as a matchable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What was being done and why it failed, without the structured context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether retrying the same call may succeed (timeouts, unreachable services).
    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// Marks whether a retry may succeed, overriding the default derived from the kind.
    pub fn set_temporary(mut self, value: bool) -> Self {
        self.temporary = value;
        self
    }

    /// Prefixes the message with what was being done, keeping kind, source and context.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// The operation that failed (`"read"`, `"exec"`, `"acquire"` ...), where a layer
    /// that knows it said so.
    pub fn operation(&self) -> Option<&str> {
        self.context.as_ref()?.operation.as_deref()
    }

    /// The sandbox the failed operation was on, where known.
    pub fn sandbox(&self) -> Option<&SandboxId> {
        self.context.as_ref()?.sandbox.as_ref()
    }

    /// The session the failed operation was for, where known.
    pub fn session(&self) -> Option<&SessionKey> {
        self.context.as_ref()?.session.as_ref()
    }

    fn context_mut(&mut self) -> &mut ErrorContext {
        self.context.get_or_insert_with(Default::default)
    }

    /// Records the operation, unless an inner layer already did (the innermost is the
    /// most precise).
    pub fn set_operation(mut self, operation: impl Into<String>) -> Self {
        let context = self.context_mut();
        if context.operation.is_none() {
            context.operation = Some(operation.into());
        }
        self
    }

    /// Records the sandbox, unless an inner layer already did.
    pub fn set_sandbox(mut self, sandbox: &SandboxId) -> Self {
        let context = self.context_mut();
        if context.sandbox.is_none() {
            context.sandbox = Some(sandbox.clone());
        }
        self
    }

    /// Records the session, unless an inner layer already did.
    pub fn set_session(mut self, session: &SessionKey) -> Self {
        let context = self.context_mut();
        if context.session.is_none() {
            context.session = Some(session.clone());
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
    fn kinds_have_snake_case_names_both_forms_parse() {
        for kind in ErrorKind::ALL {
            assert!(kind
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
            assert_eq!(ErrorKind::from_name(kind.name()), Some(kind));
            assert_eq!(ErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("nope"), None);
    }

    #[test]
    fn context_is_data_and_the_innermost_wins() {
        let id = SandboxId::new("sb-1").unwrap();
        let key = SessionKey::new("acme", "s1").unwrap();
        let e = Error::not_found("gone")
            .set_operation("stat")
            .set_operation("read")
            .set_sandbox(&id)
            .set_session(&key)
            .context("reading a.txt");
        assert_eq!(e.operation(), Some("stat"));
        assert_eq!(e.sandbox(), Some(&id));
        assert_eq!(e.session(), Some(&key));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.to_string(), "reading a.txt: gone");
        assert_eq!(
            format!("{e:#}"),
            "reading a.txt: gone (operation stat, sandbox sb-1, session acme/s1)"
        );
        // The context crosses an io::Error and back.
        let back = Error::io("copying", e.into_io());
        assert_eq!(back.session(), Some(&key));
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
