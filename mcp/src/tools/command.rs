//! `run_command`'s body: a shell command run to its end in a session's sandbox, its
//! progress reported while it runs and its output sized for a model.

use std::time::Duration;

use futures::StreamExt;
use rmcp::model::ProgressNotificationParam;
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use sandcell::{Error, ErrorKind, ExecRequest, ProcessEvent};

use super::{path, SandboxTools};
use crate::args::RunCommand;
use crate::output::HeadTail;

/// The longest a command may be given.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// A command's timeout when the call sets none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a running command reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

impl SandboxTools {
    /// Runs the command; answers what the model reads and whether it failed.
    pub(super) async fn run(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: RunCommand,
        progress: Option<(rmcp::model::ProgressToken, Peer<RoleServer>)>,
    ) -> sandcell::Result<(String, bool)> {
        let timeout = args
            .timeout_secs
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
            .min(MAX_TIMEOUT);
        let mut request = ExecRequest::new(["sh", "-c", args.command.as_str()]).stdin("");
        request.env = args.env;
        request.timeout = Some(timeout);
        if let Some(cwd) = args.cwd.as_deref().filter(|c| !c.is_empty() && *c != ".") {
            request.cwd = Some(path(cwd)?);
        }
        let sandbox = self.open(ctx, &args.session).await?;
        let process = sandbox.call("exec", |b, id| b.exec(id, request)).await?;
        let mut events = process.events().boxed();
        let mut stdout = HeadTail::new(self.settings.output_limit);
        let mut stderr = HeadTail::new(self.settings.output_limit);
        let started = tokio::time::Instant::now();
        let mut ticker = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
        let status = loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(ProcessEvent::Stdout(data))) => stdout.push(&data),
                    Some(Ok(ProcessEvent::Stderr(data))) => stderr.push(&data),
                    Some(Ok(ProcessEvent::Exit(status))) => break status,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e),
                    None => return Err(Error::new(ErrorKind::Backend, "the command's events ended without its exit")),
                },
                _ = ticker.tick() => {
                    if let Some((token, peer)) = &progress {
                        let seconds = started.elapsed().as_secs_f64();
                        let message = format!(
                            "running for {seconds:.0} s; {} bytes of output so far",
                            stdout.total() + stderr.total()
                        );
                        let note = ProgressNotificationParam::new(token.clone(), seconds)
                            .with_message(message);
                        let _ = peer.notify_progress(note).await;
                    }
                }
            }
        };
        sandbox.touch().await;
        let mut out = String::new();
        let failed = status.timed_out;
        if status.timed_out {
            out.push_str(&format!(
                "timed out after {} s: the command and everything it started were killed\n",
                timeout.as_secs()
            ));
        } else if let Some(code) = status.code {
            out.push_str(&format!("exit code: {code}\n"));
        } else if let Some(signal) = status.signal {
            out.push_str(&format!("killed by signal {signal}\n"));
        }
        for (name, stream) in [("stdout", &stdout), ("stderr", &stderr)] {
            if stream.total() > 0 {
                out.push_str(&format!("--- {name} ---\n{}", stream.text()));
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
        Ok((out, failed))
    }
}
