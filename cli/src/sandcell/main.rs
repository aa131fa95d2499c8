//! `sandcell`: poke at sandboxes by hand — acquire a session, run commands in it, move files
//! in and out, snapshot, suspend, clean up after a crash.
//!
//! Every invocation is a new process over one [`SandboxManager`](sandcell::SandboxManager) whose state (SQLite) and
//! snapshots live in a data directory, so each command reconnects to, or restores, what
//! earlier ones left. Commands that touch a session's sandbox (`exec`, `write`, `read`,
//! `ls`, `snapshot`) resume a suspended session first.
//!
//! ```text
//! sandcell acquire demo
//! echo 'print(6 * 7)' | sandcell write demo main.py
//! sandcell exec demo -- python3 main.py
//! sandcell shell demo                 # an interactive terminal in the sandbox
//! sandcell suspend demo
//! sandcell read demo main.py        # restored from the snapshot
//! ```
//!
//! Output is JSON (one object per line) wherever it is data; errors are one line on stderr.
//! Exit status: 0 on success, 2 for bad input (bad path, unknown session or template, bad
//! flag), 1 for other failures; `exec` and `shell` exit with the command's status (124 when its
//! timeout fired, 128 + N when signal N ended it).

mod args;
mod commands;
mod error;
mod exec;
mod output;
mod session;
mod shell;
mod templates;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::args::Cli;
use crate::error::{one_line, CliError, EXIT_FAILURE};

fn main() -> ExitCode {
    // A bug must still end with one line and status 1, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "sandcell: internal error: {}; please report this",
            one_line(&info.to_string())
        );
        std::process::exit(i32::from(EXIT_FAILURE));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return report(&CliError::failure(
                format_args!("cannot start the async runtime: {err}"),
                "check the process limits",
            ))
        }
    };
    let status = match runtime.block_on(commands::run(cli)) {
        Ok(status) => status,
        Err(err) => report(&err),
    };
    // A command still reading our stdin (`exec -i`) must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_millis(100));
    status
}

fn usage_error(err: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind as Kind;
    if matches!(err.kind(), Kind::DisplayHelp | Kind::DisplayVersion) {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    // clap's message runs until the first blank line; usage and tips follow it.
    let text = err.to_string();
    let message = text
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let message = one_line(message.trim_start_matches("error: ")).replace(": ,", ":");
    report(&CliError::bad_input(
        message,
        "run `sandcell --help` (or `sandcell COMMAND --help`) for usage",
    ))
}

fn report(err: &CliError) -> ExitCode {
    match &err.hint {
        Some(hint) => eprintln!("sandcell: {}; {hint}", err.message),
        None => eprintln!("sandcell: {}", err.message),
    }
    ExitCode::from(err.status)
}

/// `SANDCELL_LOG=debug` (or `info`, `trace`, ...) prints the library's tracing to stderr.
fn init_logging() {
    let Some(level) = std::env::var("SANDCELL_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing::Level>().ok())
    else {
        return;
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
}
