//! [`ServeOptions`]: what a wire server accepts from its client and tells it: the
//! bounds on files, archives and streams, and how its errors are told.

use std::sync::Arc;

use super::proto::{Reply, WireError};
use crate::archive::ArchiveLimits;
use crate::error::{Error, Result};
use crate::raw::budget::{ByteBudget, Reservation};

/// What a serving side accepts from its client: the bounds a server facing untrusted
/// callers sets (an agent inside its own sandbox can keep the defaults).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeOptions {
    /// The largest file a `read` or `write` may carry; more is
    /// [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded), a read's before the file is read (default 1 GiB:
    /// a file is held in memory on its way through).
    pub max_file_bytes: u64,
    /// Caps on every archive import: the client's own limits apply, each at most this
    /// (default [`ArchiveLimits::default`]).
    pub archive_limits: ArchiveLimits,
    /// What the files `read` and `write` carry may hold together, with every other
    /// connection given the same budget; past it a call is `LimitExceeded` (default:
    /// none, each call bounded by `max_file_bytes` alone).
    pub budget: Option<ByteBudget>,
    /// How many archives (`export_tar`, `import_tar`, `export_changes`) may stream at
    /// once, with every other connection given the same semaphore; past it a call is
    /// `LimitExceeded` at once (default: none). Each holds a blocking thread of the
    /// backend's for as long as its other end keeps up.
    pub archive_streams: Option<Arc<tokio::sync::Semaphore>>,
    /// The watches this connection may hold at once, shared with others given the same
    /// semaphore; `None` (the default) leaves them unbounded.
    pub watches: Option<Arc<tokio::sync::Semaphore>>,
    /// The commands this connection may have running at once, shared with others given
    /// the same semaphore, each counted until it ends (not until its call does);
    /// `None` (the default) leaves them unbounded.
    pub commands: Option<Arc<tokio::sync::Semaphore>>,
    /// What the client is told of an error (default: all of it): a server facing
    /// tenants tells them no host path ([`ServeOptions::public_errors`]).
    pub public_errors: PublicErrors,
}

/// Rewrites an error before it leaves for the client (see
/// [`ServeOptions::public_errors`]); the identity by default.
#[derive(Clone, Default)]
pub struct PublicErrors(Option<Rewrite>);

/// How [`PublicErrors`] rewrites an error.
type Rewrite = Arc<dyn Fn(&Error) -> Error + Send + Sync>;

impl std::fmt::Debug for PublicErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "PublicErrors(rewritten)",
            None => "PublicErrors(as they are)",
        })
    }
}

impl PublicErrors {
    /// Errors rewritten by `rewrite` before they leave for a client.
    pub fn new(rewrite: impl Fn(&Error) -> Error + Send + Sync + 'static) -> Self {
        PublicErrors(Some(Arc::new(rewrite)))
    }

    /// `error` as a client is told it.
    pub fn rewrite(&self, error: Error) -> Error {
        match &self.0 {
            Some(rewrite) => rewrite(&error),
            None => error,
        }
    }

    /// `error` as the client is told it.
    pub(super) fn wire(&self, error: &Error) -> WireError {
        match &self.0 {
            Some(rewrite) => WireError::from(&rewrite(error)),
            None => WireError::from(error),
        }
    }

    /// A call's reply as the client is told it.
    pub(super) fn reply<T: serde::Serialize>(&self, result: Result<T>) -> Reply {
        Reply::from_result(result.map_err(|e| match &self.0 {
            Some(rewrite) => rewrite(&e),
            None => e,
        }))
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_file_bytes: 1 << 30,
            archive_limits: ArchiveLimits::default(),
            budget: None,
            archive_streams: None,
            watches: None,
            commands: None,
            public_errors: PublicErrors::default(),
        }
    }
}

impl ServeOptions {
    /// Sets the largest file a `read` or `write` may carry.
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Sets the caps on archive imports.
    pub fn archive_limits(mut self, limits: ArchiveLimits) -> Self {
        self.archive_limits = limits;
        self
    }

    /// Sets the budget the files of `read` and `write` calls share.
    pub fn budget(mut self, budget: ByteBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Shares `streams` among the archive streams of this and every other connection
    /// given it.
    pub fn archive_streams(mut self, streams: Arc<tokio::sync::Semaphore>) -> Self {
        self.archive_streams = Some(streams);
        self
    }

    /// Shares `watches` among the file watches of this and every other connection given
    /// it: past them a `watch` is `LimitExceeded` until one ends.
    pub fn watches(mut self, watches: Arc<tokio::sync::Semaphore>) -> Self {
        self.watches = Some(watches);
        self
    }

    /// Shares `commands` among the running commands of this and every other connection
    /// given it: past them an `exec` is `LimitExceeded` until one ends.
    pub fn commands(mut self, commands: Arc<tokio::sync::Semaphore>) -> Self {
        self.commands = Some(commands);
        self
    }

    /// A place among the running commands, if they are bounded.
    pub(super) fn command_slot(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        let Some(commands) = &self.commands else {
            return Ok(None);
        };
        match Arc::clone(commands).try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(Error::limit_exceeded(
                "as many commands as this connection's owner may run are running: wait for \
                 one to end, or kill one",
            )),
        }
    }

    /// A place among the watches, if they are bounded.
    pub(super) fn watch_slot(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        let Some(watches) = &self.watches else {
            return Ok(None);
        };
        match Arc::clone(watches).try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(Error::limit_exceeded(
                "as many file watches as this connection's owner may hold are watching: \
                 end one first",
            )),
        }
    }

    /// Rewrites every error before it leaves for the client: a server facing tenants
    /// keeps its host's paths (in a backend's own failures) out of what they are told,
    /// as its HTTP faces do.
    pub fn public_errors(
        mut self,
        rewrite: impl Fn(&Error) -> Error + Send + Sync + 'static,
    ) -> Self {
        self.public_errors = PublicErrors::new(rewrite);
        self
    }

    /// A place among the archive streams, if they are bounded.
    pub(super) fn stream_slot(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        let Some(streams) = &self.archive_streams else {
            return Ok(None);
        };
        match Arc::clone(streams).try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(Error::limit_exceeded(
                "as many archives as this connection's owner may stream at once are \
                 streaming: finish one (read it to its end, or drop it) first",
            )),
        }
    }

    /// Takes `bytes` from the budget, if there is one.
    pub(super) fn reserve(&self, bytes: u64) -> Result<Option<Reservation>> {
        self.budget
            .as_ref()
            .map(|budget| budget.try_reserve(bytes))
            .transpose()
    }
}
