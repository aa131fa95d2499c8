//! Connecting to the agent inside a container: one engine exec of `sandcell-agent
//! connect`, whose stdin and stdout become a wire-protocol connection.

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::AttachContainerOptions;
use bollard::Docker;
use futures::StreamExt;
use sandcell::raw::wire::WireClient;
use sandcell::{Error, ErrorKind, Result, SandboxId};

use crate::error::engine;
use crate::image::AGENT_PATH;

/// The agent's socket inside the container.
pub(crate) const SOCKET: &str = "/.sandcell/run/agent.sock";

/// Opens a connection to the agent of container `id`.
pub(crate) async fn connect(docker: &Docker, id: &SandboxId) -> Result<WireClient> {
    let exec = docker
        .create_exec(
            id.as_str(),
            CreateExecOptions {
                cmd: Some(vec![AGENT_PATH, "connect", "--socket", SOCKET]),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| engine(format_args!("connecting to the agent of sandbox {id}"), e))?;
    let started = docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| engine(format_args!("connecting to the agent of sandbox {id}"), e))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(Error::new(
            ErrorKind::Backend,
            "the engine started the agent relay detached",
        ));
    };
    Ok(client(id, output, input))
}

/// Attaches to the agent's own stdin and stdout, which it serves as its first connection:
/// no exec needed, so a sandbox answers as soon as its container has started. Call
/// before `start`; the engine closes the agent's stdin when this connection ends.
pub(crate) async fn attach(docker: &Docker, id: &SandboxId) -> Result<WireClient> {
    let attached = docker
        .attach_container(
            id.as_str(),
            Some(AttachContainerOptions {
                stream: true,
                stdin: true,
                stdout: true,
                stderr: true,
                logs: false,
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| engine(format_args!("attaching to the agent of sandbox {id}"), e))?;
    Ok(client(id, attached.output, attached.input))
}

type Output = std::pin::Pin<
    Box<dyn futures::Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>,
>;

/// A wire client over a demultiplexed engine stream: stdout carries the protocol,
/// stderr is the agent's diagnostics.
fn client(
    id: &SandboxId,
    output: Output,
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
) -> WireClient {
    let sandbox = id.clone();
    let stdout = output.filter_map(move |item| {
        let sandbox = sandbox.clone();
        async move {
            match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    Some(Ok(message))
                }
                Ok(LogOutput::StdErr { message }) => {
                    tracing::warn!(sandbox = %sandbox, message = %String::from_utf8_lossy(&message).trim_end(), "sandcell-agent");
                    None
                }
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(std::io::Error::other(e))),
            }
        }
    });
    let reader = tokio_util::io::StreamReader::new(Box::pin(stdout));
    WireClient::new(reader, input)
}

/// sha256 of the agent binary at `path`, hex: what an image's agent layer is keyed by.
pub(crate) fn file_sha256(path: &std::path::Path) -> sandcell::Result<String> {
    use sha2::{Digest, Sha256};
    let data = std::fs::read(path).map_err(|e| {
        sandcell::Error::io(format_args!("reading the agent {}", path.display()), e)
    })?;
    Ok(hex::encode(Sha256::digest(&data)))
}
