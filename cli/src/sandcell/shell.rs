//! `shell`: an interactive terminal in a session's sandbox. Our terminal goes into raw
//! mode (every key, Ctrl-C included, is typed at the sandbox's terminal) and comes back
//! as it was however the shell ends; size changes are forwarded; the shell's exit status
//! is ours.

use std::os::fd::AsFd;

use rustix::termios::{OptionalActions, Termios};
use sandcell::{ExitStatus, Process, TerminalSize};
use tokio::signal::unix::{signal, SignalKind};

use crate::error::CliError;
use crate::exec::{next_chunk, pass_through};

/// What runs when `shell` is given no command: bash where the sandbox has it.
pub(crate) const DEFAULT_SHELL: &str =
    "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi";

/// The terminal we were started on, and how it was set before raw mode.
pub(crate) struct UserTerminal {
    saved: Termios,
}

impl UserTerminal {
    /// Our stdin, if it is a terminal; `shell` needs one.
    pub(crate) fn open() -> Result<Self, CliError> {
        let stdin = std::io::stdin();
        if !rustix::termios::isatty(stdin.as_fd()) {
            return Err(CliError::bad_input(
                "`shell` needs a terminal on stdin",
                "run it from a terminal, or use `sandcell exec -i SESSION -- CMD` to pipe input",
            ));
        }
        let saved = rustix::termios::tcgetattr(stdin.as_fd()).map_err(|e| {
            CliError::failure(
                format_args!("cannot read the terminal's settings: {e}"),
                "run it from a terminal",
            )
        })?;
        Ok(UserTerminal { saved })
    }

    /// Its size now; 24 by 80 where it does not say.
    pub(crate) fn size(&self) -> TerminalSize {
        match rustix::termios::tcgetwinsize(std::io::stdin().as_fd()) {
            Ok(size) if size.ws_row > 0 && size.ws_col > 0 => {
                TerminalSize::new(size.ws_row, size.ws_col)
            }
            _ => TerminalSize::default(),
        }
    }

    /// Raw mode until the guard goes.
    fn raw(&self) -> Result<RawMode<'_>, CliError> {
        let mut raw = self.saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &raw).map_err(
            |e| {
                CliError::failure(
                    format_args!("cannot put the terminal in raw mode: {e}"),
                    "run it from a terminal",
                )
            },
        )?;
        Ok(RawMode { terminal: self })
    }
}

/// Puts the terminal back as it was, on every way out (errors and unwinding included).
struct RawMode<'a> {
    terminal: &'a UserTerminal,
}

impl Drop for RawMode<'_> {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            OptionalActions::Now,
            &self.terminal.saved,
        );
    }
}

/// Connects `process` (started on a terminal) to ours until it ends: keys in, output
/// out, size changes forwarded.
pub(crate) async fn attach(
    terminal: &UserTerminal,
    mut process: Process,
) -> Result<ExitStatus, CliError> {
    let mut resized = signal(SignalKind::window_change()).map_err(|e| {
        CliError::failure(
            format_args!("cannot watch the terminal's size: {e}"),
            "check the process limits",
        )
    })?;
    let raw = terminal.raw()?;
    let keys = process.take_stdin().map(|mut writer| {
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let _ = tokio::io::copy(&mut stdin, &mut writer).await;
        })
    });
    let mut output = process.take_stdout();
    let mut out = tokio::io::stdout();
    let mut shown = true;
    while output.is_some() {
        tokio::select! {
            chunk = next_chunk(&mut output) => match chunk {
                Some(chunk) => pass_through(&mut out, &chunk?, &mut shown).await,
                None => output = None,
            },
            Some(()) = resized.recv() => {
                // A process that ended meanwhile is no error; a failed resize is not
                // worth ending the session over.
                let _ = process.resize(terminal.size()).await;
            }
        }
    }
    let status = process.wait().await;
    drop(raw);
    if let Some(keys) = keys {
        keys.abort();
    }
    Ok(status?)
}
