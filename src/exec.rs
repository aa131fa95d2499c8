//! Commands and their results: `ExecRequest`, `ExitStatus`, `ExecOutput`.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::path::SandboxPath;

/// The per-stream output cap used when neither the request nor the spec sets one: 16 MiB.
pub const DEFAULT_OUTPUT_LIMIT: usize = 16 * 1024 * 1024;

/// A command to run inside a sandbox.
///
/// ```
/// use sandcell::ExecRequest;
/// use std::time::Duration;
///
/// let req = ExecRequest::shell("ls -la | head -5")
///     .cwd("src".parse()?)
///     .env("LC_ALL", "C")
///     .timeout(Duration::from_secs(30))
///     .output_limit(64 * 1024);
/// assert_eq!(req.argv, ["sh", "-c", "ls -la | head -5"]);
/// # Ok::<(), sandcell::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExecRequest {
    /// The program and its arguments; `argv[0]` is looked up on the sandbox's `PATH`.
    pub argv: Vec<String>,
    /// Working directory; the spec's `workdir` when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<SandboxPath>,
    /// Extra environment variables, on top of the spec's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Bytes written to stdin, which is then closed. When `None`, stdin stays open
    /// through [`Process::take_stdin`](crate::Process::take_stdin) until the writer is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<Bytes>,
    /// Kill the process (and its children) after this long; the spec's default when `None`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::config::duration::option"
    )]
    pub timeout: Option<Duration>,
    /// Run as this user, where the backend supports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Cap on collected output per stream; see [`DEFAULT_OUTPUT_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_limit: Option<usize>,
    /// Run the command on a terminal of this size (needs
    /// [`Capabilities::pty`](crate::Capabilities::pty)): its stdin, stdout and stderr
    /// are the terminal, so all output arrives on the stdout stream, and stdin bytes are
    /// typed at it (`0x03` interrupts the foreground job).
    /// [`Process::resize`](crate::Process::resize) changes the size while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<TerminalSize>,
}

/// The size of a terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TerminalSize {
    /// Lines.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl TerminalSize {
    /// A size of `rows` lines by `cols` columns.
    pub const fn new(rows: u16, cols: u16) -> Self {
        TerminalSize { rows, cols }
    }

    /// Checks the size: both sides at least 1.
    pub fn validate(&self) -> Result<()> {
        if self.rows == 0 || self.cols == 0 {
            return Err(Error::invalid_input(format!(
                "a terminal needs at least one row and one column, not {}x{}",
                self.rows, self.cols
            )));
        }
        Ok(())
    }
}

impl Default for TerminalSize {
    /// 24 rows by 80 columns.
    fn default() -> Self {
        TerminalSize::new(24, 80)
    }
}

impl ExecRequest {
    /// Runs `argv` directly, without a shell.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: BTreeMap::new(),
            stdin: None,
            timeout: None,
            user: None,
            output_limit: None,
            pty: None,
        }
    }

    /// Runs `script` with `sh -c`.
    pub fn shell(script: impl Into<String>) -> Self {
        ExecRequest::new(["sh".to_owned(), "-c".to_owned(), script.into()])
    }

    /// Sets the working directory.
    pub fn cwd(mut self, cwd: SandboxPath) -> Self {
        self.cwd = Some(cwd);
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets the bytes fed to stdin.
    pub fn stdin(mut self, data: impl Into<Bytes>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the user.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Sets the per-stream output cap.
    pub fn output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = Some(bytes);
        self
    }

    /// Runs the command on a terminal of `size`; see [`ExecRequest::pty`](Self#structfield.pty).
    pub fn pty(mut self, size: TerminalSize) -> Self {
        self.pty = Some(size);
        self
    }

    /// [`validate`](Self::validate), then refuses what the backend cannot do: a
    /// terminal without [`Capabilities::pty`](crate::Capabilities::pty) is
    /// `Unsupported`. Backends call this at the top of `exec`.
    ///
    /// ```
    /// use sandcell::{Capabilities, ErrorKind, ExecRequest, TerminalSize};
    /// let request = ExecRequest::shell("stty size").pty(TerminalSize::new(40, 120));
    /// let mut caps = Capabilities::none();
    /// assert_eq!(request.check_supported(&caps).unwrap_err().kind(), ErrorKind::Unsupported);
    /// caps.pty = true;
    /// assert!(request.check_supported(&caps).is_ok());
    /// ```
    pub fn check_supported(&self, caps: &crate::Capabilities) -> Result<()> {
        self.validate()?;
        if self.pty.is_some() && !caps.pty {
            return Err(Error::unsupported(
                "this backend cannot run a command on a terminal (pty)",
            ));
        }
        Ok(())
    }

    /// Checks the request: a non-empty program, no NUL bytes, valid env names, a
    /// terminal size of at least 1x1. [`check_supported`](Self::check_supported) calls
    /// it.
    pub fn validate(&self) -> Result<()> {
        if let Some(size) = &self.pty {
            size.validate()?;
        }
        match self.argv.first() {
            None => return Err(Error::invalid_input("exec needs a program: argv is empty")),
            Some(p) if p.is_empty() => {
                return Err(Error::invalid_input(
                    "exec needs a program: argv[0] is empty",
                ))
            }
            Some(_) => {}
        }
        if let Some(arg) = self.argv.iter().find(|a| a.contains('\0')) {
            return Err(Error::invalid_input(format!(
                "argument {arg:?} contains a NUL byte"
            )));
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(Error::invalid_input(format!(
                    "invalid environment variable {k:?}"
                )));
            }
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(Error::invalid_input(
                "exec timeout must be greater than zero",
            ));
        }
        Ok(())
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExitStatus {
    /// The exit code, if it exited normally.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether the backend killed it because its timeout passed.
    pub timed_out: bool,
}

impl ExitStatus {
    /// A normal exit with `code`.
    pub fn exited(code: i32) -> Self {
        ExitStatus {
            code: Some(code),
            signal: None,
            timed_out: false,
        }
    }

    /// Ended by `signal`.
    pub fn signaled(signal: i32) -> Self {
        ExitStatus {
            code: None,
            signal: Some(signal),
            timed_out: false,
        }
    }

    /// Marks that the timeout caused the end.
    pub fn timed_out(mut self, timed_out: bool) -> Self {
        self.timed_out = timed_out;
        self
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }
}

/// The collected result of a finished command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExecOutput {
    /// How it ended.
    pub status: ExitStatus,
    /// Standard output, at most the output limit.
    pub stdout: Bytes,
    /// Standard error, at most the output limit.
    pub stderr: Bytes,
    /// Whether stdout was longer than the limit (the rest was read and dropped).
    pub stdout_truncated: bool,
    /// Whether stderr was longer than the limit (the rest was read and dropped).
    pub stderr_truncated: bool,
    /// Wall time from start to exit.
    #[serde(with = "crate::config::duration")]
    pub duration: Duration,
}

impl ExecOutput {
    /// The exit code, if it exited normally.
    pub fn exit_code(&self) -> Option<i32> {
        self.status.code
    }

    /// The signal that ended it, if any.
    pub fn signal(&self) -> Option<i32> {
        self.status.signal
    }

    /// Exited with code 0 and did not time out.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Stdout as text (invalid UTF-8 replaced).
    pub fn stdout_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.stdout)
    }

    /// Stderr as text (invalid UTF-8 replaced).
    pub fn stderr_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.stderr)
    }

    /// `Ok(self)` if it succeeded, else an error carrying the code and the end of stderr.
    pub fn check(self) -> Result<Self> {
        if self.success() {
            return Ok(self);
        }
        let stderr = self.stderr_str();
        let tail: String = {
            let chars: Vec<char> = stderr.trim_end().chars().collect();
            chars[chars.len().saturating_sub(500)..].iter().collect()
        };
        let how = if self.status.timed_out {
            "timed out".to_owned()
        } else if let Some(sig) = self.status.signal {
            format!("was killed by signal {sig}")
        } else {
            format!("exited with code {}", self.status.code.unwrap_or(-1))
        };
        let kind = if self.status.timed_out {
            crate::ErrorKind::Timeout
        } else {
            crate::ErrorKind::Backend
        };
        Err(Error::new(kind, format!("command {how}: {tail}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn validate_rejects_bad_requests() {
        let empty: Vec<String> = vec![];
        assert_eq!(
            ExecRequest::new(empty).validate().unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert!(ExecRequest::new([""]).validate().is_err());
        assert!(ExecRequest::new(["echo", "a\0b"]).validate().is_err());
        assert!(ExecRequest::new(["echo"])
            .env("A=B", "1")
            .validate()
            .is_err());
        assert!(ExecRequest::new(["echo"])
            .timeout(Duration::ZERO)
            .validate()
            .is_err());
        assert!(ExecRequest::shell("true").validate().is_ok());
    }

    #[test]
    fn check_reports_code_and_stderr() {
        let out = ExecOutput {
            status: ExitStatus::exited(3),
            stdout: Bytes::new(),
            stderr: Bytes::from_static(b"boom\n"),
            stdout_truncated: false,
            stderr_truncated: false,
            duration: Duration::from_millis(5),
        };
        let err = out.check().unwrap_err();
        assert_eq!(err.to_string(), "command exited with code 3: boom");
    }
}
