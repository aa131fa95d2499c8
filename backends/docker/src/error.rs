//! Engine errors mapped to sandcell's `ErrorKind`, with the operation that failed.

use sandcell::{Error, ErrorKind};

/// The hint every "cannot reach the engine" error carries.
pub(crate) const START_ENGINE: &str = "is the Docker engine running? Start it (`dockerd`, \
     `systemctl start docker`) or point DOCKER_HOST at one";

/// Converts a bollard error, saying what was being done.
pub(crate) fn engine(context: impl std::fmt::Display, e: bollard::errors::Error) -> Error {
    use bollard::errors::Error as E;
    let (kind, detail) = match &e {
        E::DockerResponseServerError {
            status_code,
            message,
        } => {
            let kind = match status_code {
                404 => ErrorKind::NotFound,
                409 if message.contains("is paused") => ErrorKind::InvalidState,
                409 if message.contains("is not running") => ErrorKind::InvalidState,
                409 => ErrorKind::AlreadyExists,
                400 => ErrorKind::InvalidInput,
                403 => ErrorKind::PermissionDenied,
                s if *s >= 500 && message.contains("is paused") => ErrorKind::InvalidState,
                s if *s >= 500 && message.contains("is not running") => ErrorKind::InvalidState,
                _ => ErrorKind::Backend,
            };
            (kind, message.clone())
        }
        E::DockerStreamError { error } => (ErrorKind::Backend, error.clone()),
        E::IOError { .. }
        | E::HyperResponseError { .. }
        | E::SocketNotFoundError(_)
        | E::RequestTimeoutError => (ErrorKind::Unavailable, format!("{e}; {START_ENGINE}")),
        _ if e.to_string().contains("error trying to connect")
            || e.to_string().contains("Connection refused") =>
        {
            (ErrorKind::Unavailable, format!("{e}; {START_ENGINE}"))
        }
        _ => (ErrorKind::Backend, e.to_string()),
    };
    Error::with_source(kind, format!("{context}: {detail}"), e)
}

/// Whether an engine error is a 404.
pub(crate) fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}
