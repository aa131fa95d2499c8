//! What goes to stdout (JSON lines, raw bytes) and the progress spinner on stderr.

use std::fmt::Display;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sandcell::store::SessionRecord;
use serde_json::{json, Value};

use crate::error::{one_line, CliError};

/// A session as the CLI prints it.
pub(crate) fn session_json(record: &SessionRecord) -> Value {
    json!({
        "tenant": record.key.tenant(),
        "session": record.key.session(),
        "sandbox_id": record.sandbox_id,
        "status": record.status,
        "backend": record.backend,
        "template": record.spec.template,
        "created_at": record.created_at,
        "last_active": record.last_active,
    })
}

pub(crate) fn print_json(value: &Value) -> Result<(), CliError> {
    let mut line = value.to_string();
    line.push('\n');
    write_stdout(line.as_bytes())
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly.
pub(crate) fn write_stdout(data: &[u8]) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(data).and_then(|()| stdout.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
        _ => Ok(()),
    }
}

/// A spinner with the elapsed time on a terminal; nothing when stderr is not one.
/// Image pulls and builds report into it, under the operation's own message.
pub(crate) struct Progress(ProgressBar);

/// The spinner on screen, if any, with its message.
static CURRENT: std::sync::Mutex<Option<(ProgressBar, String)>> = std::sync::Mutex::new(None);

impl Progress {
    pub(crate) fn start(message: impl Display) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if std::io::stderr().is_terminal() {
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                bar.set_style(style);
            }
            bar.set_message(message.to_string());
            bar.enable_steady_tick(Duration::from_millis(100));
            if let Ok(mut current) = CURRENT.lock() {
                *current = Some((bar.clone(), message.to_string()));
            }
        }
        Progress(bar)
    }

    /// Shows a step of a long operation (an image build line) on the current spinner.
    pub(crate) fn note(step: &str) {
        if let Ok(current) = CURRENT.lock() {
            if let Some((bar, message)) = current.as_ref() {
                bar.set_message(format!("{message}: {}", one_line(step)));
            }
        }
    }

    pub(crate) fn finish(self) {
        if let Ok(mut current) = CURRENT.lock() {
            *current = None;
        }
        self.0.finish_and_clear();
    }
}
