//! `exec`'s output passed through, Ctrl-C forwarded, the exit status in the shell's convention.

use std::process::ExitCode;

use futures::StreamExt;
use sandcell::ExitStatus;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{CliError, EXIT_FAILURE, EXIT_TIMEOUT};

/// Ctrl-C: `exec` kills the command and reports it as ended by this signal (status 130).
pub(crate) const SIGINT: i32 = 2;

/// Copies the process's output to ours as it arrives, then returns its exit status. Ctrl-C
/// kills the command and everything it started before we exit.
pub(crate) async fn stream_process(mut process: sandcell::Process) -> Result<ExitStatus, CliError> {
    let stdin_pump = process.take_stdin().map(|mut writer| {
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let _ = tokio::io::copy(&mut stdin, &mut writer).await;
            let _ = writer.shutdown().await;
        })
    });
    let mut stdout = process.take_stdout();
    let mut stderr = process.take_stderr();
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    // A reader that went away (`| head`) stops the copying, not the command.
    let (mut out_open, mut err_open) = (true, true);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            chunk = next_chunk(&mut stdout) => match chunk {
                Some(chunk) => pass_through(&mut out, &chunk?, &mut out_open).await,
                None => stdout = None,
            },
            chunk = next_chunk(&mut stderr) => match chunk {
                Some(chunk) => pass_through(&mut err, &chunk?, &mut err_open).await,
                None => stderr = None,
            },
            _ = &mut interrupted => {
                process.kill().await?;
                return Ok(ExitStatus::signaled(SIGINT));
            }
        }
    }
    let status = process.wait().await?;
    if let Some(pump) = stdin_pump {
        pump.abort();
    }
    Ok(status)
}

/// Writes `chunk` to `out` while it is `open`; a reader that went away (`| head`)
/// closes it for good instead of failing the command.
pub(crate) async fn pass_through<W: AsyncWrite + Unpin>(
    out: &mut W,
    chunk: &[u8],
    open: &mut bool,
) {
    if *open && (out.write_all(chunk).await.is_err() || out.flush().await.is_err()) {
        *open = false;
    }
}

pub(crate) async fn next_chunk(
    stream: &mut Option<sandcell::ByteStream>,
) -> Option<sandcell::Result<bytes::Bytes>> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// The shell's convention: the exit code, 124 on timeout, 128 + N for signal N.
pub(crate) fn exit_code_of(status: &ExitStatus) -> ExitCode {
    if status.timed_out {
        return ExitCode::from(EXIT_TIMEOUT);
    }
    match (status.code, status.signal) {
        (Some(code), _) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(EXIT_FAILURE)),
        (None, Some(signal)) => {
            ExitCode::from(u8::try_from(128 + (signal & 0x7f)).unwrap_or(EXIT_FAILURE))
        }
        (None, None) => ExitCode::from(EXIT_FAILURE),
    }
}
