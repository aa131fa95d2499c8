//! What the user sees when something fails: one line, a hint, an exit status.

use std::fmt::Display;

use sandcell::{Error, ErrorKind};

/// Exit status for bad input: a bad path, an unknown session or template, a bad flag.
pub(crate) const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for every other failure.
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit status of `exec` when the command's timeout fired (as coreutils' `timeout`).
pub(crate) const EXIT_TIMEOUT: u8 = 124;

/// A failure to report: one line of what went wrong and what to do, and the exit status.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) status: u8,
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
}

impl CliError {
    pub(crate) fn bad_input(message: impl Display, hint: impl Display) -> Self {
        CliError {
            status: EXIT_BAD_INPUT,
            message: message.to_string(),
            hint: Some(hint.to_string()),
        }
    }

    pub(crate) fn failure(message: impl Display, hint: impl Display) -> Self {
        CliError {
            status: EXIT_FAILURE,
            message: message.to_string(),
            hint: Some(hint.to_string()),
        }
    }
}

impl From<Error> for CliError {
    fn from(err: Error) -> Self {
        let status = match err.kind() {
            ErrorKind::InvalidInput | ErrorKind::NotFound => EXIT_BAD_INPUT,
            _ => EXIT_FAILURE,
        };
        let hint = match err.kind() {
            ErrorKind::InvalidInput => "check the arguments (`sandcell --help`)",
            ErrorKind::NotFound => {
                "check the name or path (`sandcell list`, `sandcell ls SESSION`)"
            }
            ErrorKind::AlreadyExists => "pick another name or remove the existing one",
            ErrorKind::PermissionDenied => "the sandbox does not allow this path or operation",
            ErrorKind::LimitExceeded => "release a session or raise the limit",
            ErrorKind::Timeout => "retry, or allow more time",
            ErrorKind::Unavailable => "check that the backend is running, then retry",
            ErrorKind::Corrupt => {
                "the snapshot is damaged; `sandcell release SESSION --purge` starts over"
            }
            ErrorKind::InvalidState => "check the session with `sandcell list`",
            ErrorKind::Conflict => {
                "another manager holds the session; use it there, or wait for its lease to expire"
            }
            ErrorKind::Unsupported => "this backend cannot do that; try another backend",
            _ => "rerun with SANDCELL_LOG=debug for details",
        };
        CliError {
            status,
            message: error_chain(&err),
            hint: Some(hint.to_owned()),
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        CliError::failure(err, "check the terminal's input and output")
    }
}

/// The error and its sources on one line.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !normalized(&line).contains(&normalized(&text)) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    one_line(&line)
}

/// Lower case, without the `(os error N)` suffix: how a source that only repeats the
/// message is recognised.
fn normalized(text: &str) -> String {
    let text = text.to_lowercase();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
