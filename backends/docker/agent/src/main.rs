//! `sandcell-agent`: the process `sandcell-docker` runs inside each container, so every
//! command and file operation is one round trip on a persistent connection instead of
//! an engine API call.
//!
//! ```text
//! sandcell-agent serve [--workspace DIR] [--state DIR] [--socket PATH] [--stdio] [--egress LISTEN=SOCKET]
//! sandcell-agent connect [--socket PATH]
//! ```
//!
//! `serve` is the container's keep-alive process: it serves the workspace directory as
//! one sandbox of the local backend (in place, as the container's user) over the wire
//! protocol on a Unix socket, and with `--stdio` also on its own stdin and stdout (the
//! connection of whoever attached to the container before it started). With `--egress` it also
//! relays each TCP connection to `LISTEN` to the Unix socket `SOCKET` (the host's egress
//! proxy, for a container whose only way out that is). `connect` relays its stdin and stdout to that socket; the
//! host starts it with the engine's exec API once per connection. Build it statically
//! (`RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p sandcell-agent
//! --target x86_64-unknown-linux-gnu`) so it runs in any image, even one without libc.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandcell::{SandboxBackend, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend, WorkspaceStrategy};

const DEFAULT_WORKSPACE: &str = "/workspace";
const DEFAULT_STATE: &str = "/.sandcell/state";
const DEFAULT_SOCKET: &str = "/.sandcell/agent.sock";
/// How long `connect` waits for `serve` to open its socket (the container just started).
const CONNECT_PATIENCE: Duration = Duration::from_secs(15);

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let mut workspace = PathBuf::from(DEFAULT_WORKSPACE);
    let mut state = PathBuf::from(DEFAULT_STATE);
    let mut socket = PathBuf::from(DEFAULT_SOCKET);
    let mut stdio = false;
    let mut egress: Option<String> = None;
    while let Some(flag) = args.next() {
        let target = match flag.as_str() {
            "--stdio" => {
                stdio = true;
                continue;
            }
            "--egress" => match args.next() {
                Some(value) => {
                    egress = Some(value);
                    continue;
                }
                None => return usage("--egress needs LISTEN=SOCKET"),
            },
            "--workspace" => &mut workspace,
            "--state" => &mut state,
            "--socket" => &mut socket,
            other => return usage(&format!("unknown option {other:?}")),
        };
        match args.next() {
            Some(value) => *target = PathBuf::from(value),
            None => return usage(&format!("{flag} needs a value")),
        }
    }
    let result = match command.as_deref() {
        Some("serve") => serve(&workspace, &state, &socket, stdio, egress.as_deref()),
        Some("connect") => connect(&socket),
        Some("--version") => {
            println!("sandcell-agent {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => return usage("expected `serve` or `connect`"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandcell-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "sandcell-agent: {problem}; usage: sandcell-agent serve [--workspace DIR] [--state DIR] [--socket PATH] [--stdio] | connect [--socket PATH]"
    );
    ExitCode::from(2)
}

fn serve(
    workspace: &Path,
    state: &Path,
    socket: &Path,
    stdio: bool,
    egress: Option<&str>,
) -> Result<(), String> {
    // Before the runtime's threads exist, so they and every command inherit it: the
    // engine's seccomp profile may let a container use the kernel's keyrings or type
    // into a terminal (Podman's allows `keyctl`); a sandbox's commands may do neither.
    sandcell_local::confine_this_process().map_err(|e| format!("confining the agent: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    runtime.block_on(async {
        // The container is the sandbox: its engine isolates it, and the spec the
        // engine applied (network included) is the one commands must see, so the
        // agent adds no isolation of its own.
        let backend = LocalBackend::builder()
            .root(state)
            .template("workspace", workspace)
            .isolation(Isolation::None)
            .workspace(WorkspaceStrategy::InPlace)
            .kill_grace(Duration::from_millis(500))
            .build()
            .map_err(|e| format!("opening {}: {e}", workspace.display()))?;
        // Commands see the container's environment (the image's ENV and the spec's).
        let mut spec = SandboxSpec::new("workspace");
        spec.env = std::env::vars().collect();
        let sandbox = backend
            .create(&spec)
            .await
            .map_err(|e| format!("serving {}: {e}", workspace.display()))?;
        if let Some(egress) = egress {
            let (listen, relay_to) = egress
                .split_once('=')
                .ok_or_else(|| format!("--egress {egress:?}: expected LISTEN=SOCKET"))?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| format!("listening for egress on {listen}: {e}"))?;
            tokio::spawn(relay_egress(listener, PathBuf::from(relay_to)));
        }
        let backend: Arc<dyn SandboxBackend> = Arc::new(backend);
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)
            .map_err(|e| format!("listening on {}: {e}", socket.display()))?;
        if stdio {
            // The first connection: whoever attached to the container before it started.
            tokio::spawn(sandcell::raw::wire::serve(
                Arc::clone(&backend),
                sandbox.id.clone(),
                tokio::io::stdin(),
                tokio::io::stdout(),
            ));
        }
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| format!("handling SIGTERM: {e}"))?;
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let (read, write) = stream.into_split();
                        tokio::spawn(sandcell::raw::wire::serve(
                            Arc::clone(&backend),
                            sandbox.id.clone(),
                            read,
                            write,
                        ));
                    }
                    Err(e) => eprintln!("sandcell-agent: accepting a connection: {e}"),
                },
                _ = terminate.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        // Kill every command still running; the workspace itself stays.
        let _ = backend.destroy(&sandbox.id).await;
        let _ = std::fs::remove_file(socket);
        Ok(())
    })
}

/// Relays each connection to `listener` (the container's only way out) to the host's
/// egress proxy at the Unix socket `to`, which decides where it may go.
async fn relay_egress(listener: tokio::net::TcpListener, to: PathBuf) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let to = to.clone();
        tokio::spawn(async move {
            match tokio::net::UnixStream::connect(&to).await {
                // Spliced: the bytes pass through the kernel, not this process.
                Ok(proxy) => {
                    let _ = sandcell::raw::egress::relay(&client, &proxy).await;
                }
                Err(e) => eprintln!("sandcell-agent: egress proxy {}: {e}", to.display()),
            }
        });
    }
}

/// Relays stdin to the socket and the socket to stdout, unbuffered, until either ends.
fn connect(socket: &Path) -> Result<(), String> {
    let started = Instant::now();
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(stream) => break stream,
            Err(e) if started.elapsed() < CONNECT_PATIENCE => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("connecting to {}: {e}", socket.display())),
        }
    };
    let mut to_agent = stream
        .try_clone()
        .map_err(|e| format!("cloning the socket: {e}"))?;
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_agent.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_agent.shutdown(std::net::Shutdown::Write);
    });
    let mut from_agent = stream;
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from_agent.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                // Flush every chunk: frames must not wait in a buffer.
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return Ok(());
                }
            }
            Err(e) => return Err(format!("reading from the agent: {e}")),
        }
    }
}
