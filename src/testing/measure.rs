//! Measurements the backends' benches share, so each backend is timed the same way.

use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::{ExecRequest, Result, SandboxBackend, SandboxId, TerminalSize};

/// Times `rounds` one-byte round trips through a terminal: a byte typed at a `cat`
/// running on a raw, non-echoing terminal in sandbox `id`, until that byte comes back
/// as its output. What a user feels as keystroke latency in `sandcell shell`.
pub async fn pty_echo_round_trips(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    rounds: usize,
) -> Result<Vec<Duration>> {
    let request =
        ExecRequest::shell("stty raw -echo && echo ready && exec cat").pty(TerminalSize::default());
    let mut process = backend.exec(id, request).await?;
    let mut input = process
        .take_stdin()
        .ok_or_else(|| crate::Error::invalid_input("the terminal took no input"))?;
    let mut output = process
        .take_stdout()
        .ok_or_else(|| crate::Error::invalid_input("the terminal gave no output"))?;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("ready") {
        match output.next().await {
            Some(chunk) => seen.extend_from_slice(&chunk?),
            None => return Err(crate::Error::invalid_input("the terminal closed early")),
        }
    }
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // Letters only: on a raw terminal nothing is special, but stay printable.
        let byte = b'a' + (round % 26) as u8;
        let start = Instant::now();
        input
            .write_all(&[byte])
            .await
            .map_err(|e| crate::Error::io("typing at the terminal", e))?;
        input
            .flush()
            .await
            .map_err(|e| crate::Error::io("typing at the terminal", e))?;
        loop {
            match output.next().await {
                Some(chunk) => {
                    if chunk?.contains(&byte) {
                        break;
                    }
                }
                None => return Err(crate::Error::invalid_input("the terminal closed early")),
            }
        }
        times.push(start.elapsed());
    }
    process.kill().await?;
    let _ = process.wait().await;
    Ok(times)
}

/// What [`warm_pool`] measured.
#[derive(Debug, Clone)]
pub struct WarmPoolFigures {
    /// Filling the empty pool, from the first create until it is full.
    pub fill: Duration,
    /// Each acquire of a fresh session, served from the pool.
    pub acquires: Vec<Duration>,
    /// Refilling the pool after those acquires took every sandbox: from the last
    /// acquire until it is full again.
    pub refill: Duration,
}

/// Times a warm pool on `manager`, which was built with one pool of `size` sandboxes
/// of `spec`: the fill, `size` acquires of fresh sessions of tenant `tenant` (each
/// served from the pool, while the background filler refills it), and the refill.
/// Every session is purged afterwards; the pool is left full.
pub async fn warm_pool<B: crate::SandboxBackend>(
    manager: &crate::SandboxManager<B>,
    spec: &crate::SandboxSpec,
    tenant: &str,
    size: usize,
) -> Result<WarmPoolFigures> {
    let start = Instant::now();
    while manager.fill_pools().await? > 0 {}
    let fill = start.elapsed();
    let keys = (0..size)
        .map(|i| crate::store::SessionKey::new(tenant, format!("warm-{i}")))
        .collect::<Result<Vec<_>>>()?;
    let mut acquires = Vec::with_capacity(size);
    for key in &keys {
        let start = Instant::now();
        let handle = manager.acquire(key, spec).await?;
        acquires.push(start.elapsed());
        drop(handle);
    }
    let start = Instant::now();
    while manager.fill_pools().await? > 0 {}
    let refill = start.elapsed();
    for key in &keys {
        manager.release(key, crate::ReleaseMode::Purge).await?;
    }
    Ok(WarmPoolFigures {
        fill,
        acquires,
        refill,
    })
}
