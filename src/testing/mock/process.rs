//! A scripted command as a `Process`: its reply streamed, stdin collected, kill honoured.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use crate::backend::ByteStream;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::ExitStatus;
use crate::process::ProcessControl;

pub(super) async fn collect_capped(mut stream: ByteStream, cap: u64) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if (data.len() + chunk.len()) as u64 > cap {
            return Err(Error::limit_exceeded(format!(
                "archive stream is larger than {cap} bytes (decompression bomb?)"
            )));
        }
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

pub(super) fn receiver_stream(rx: tokio::sync::mpsc::Receiver<Result<Bytes>>) -> ByteStream {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
}

pub(super) struct MockControl {
    pub(super) kill: Option<tokio::sync::oneshot::Sender<()>>,
    pub(super) status: Option<tokio::sync::oneshot::Receiver<ExitStatus>>,
    pub(super) result: Option<ExitStatus>,
}

#[async_trait]
impl ProcessControl for MockControl {
    async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.result {
            return Ok(status);
        }
        // Awaiting the receiver by reference keeps it, so a cancelled wait can be redone.
        let rx = self
            .status
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::InvalidState, "no process to wait for"))?;
        let status = rx.await.map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "mock process task ended without a status",
            )
        })?;
        self.result = Some(status);
        Ok(status)
    }

    async fn kill(&mut self) -> Result<()> {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        Ok(())
    }
}
