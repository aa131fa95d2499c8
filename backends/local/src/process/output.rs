//! A command's output pipes read into streams: everything written before it exited
//! arrives, nothing a background process keeps open holds the caller, and a wrapped
//! command's stderr holds back what may be `nsenter`'s own word until its exit says
//! whose it was.

use bytes::Bytes;
use futures::StreamExt;
use sandcell::{ByteStream, Error, Result};
use std::os::fd::AsFd;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot, watch};

/// How long output may keep arriving after the command exited. A background process that
/// inherited stdout keeps the pipe open forever; it must not hold the caller hostage.
pub(super) const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

/// How `nsenter`'s own messages begin when the namespaces it enters are gone (a
/// command's own line beginning otherwise is never held: FINDINGS8 T4).
const DIAGNOSTICS: [&[u8]; 2] = [
    b"nsenter: cannot open ",
    b"nsenter: reassociate to namespace",
];

/// The most stderr held back while it may be `nsenter`'s message.
const MAX_HELD: usize = 4096;

/// Whether a wrapped command's exit was its sandbox's (`nsenter` found no namespaces
/// to enter: `supervise`), sent before its output is drained.
pub(super) type Verdict = watch::Receiver<Option<bool>>;

/// Reads a pipe into a stream until end-of-file or until told to close. With a
/// `verdict` (a wrapped command's stderr), output that begins as `nsenter`'s messages
/// do is held until the verdict comes, and dropped if the exit was the sandbox's: an
/// exec racing its sandbox's destroy streamed `nsenter: cannot open /proc/<server
/// pid>/fd/<n>/ns/user` as the command's stderr (FINDINGS7 S5).
pub(super) fn pump<R>(
    pipe: Option<R>,
    mut close: watch::Receiver<bool>,
    mut verdict: Option<Verdict>,
) -> (ByteStream, oneshot::Receiver<()>)
where
    R: AsyncRead + AsFd + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes>>(8);
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(async move {
        if let Some(mut pipe) = pipe {
            let mut buf = vec![0u8; 64 * 1024];
            // What is held back, while it may still be `nsenter`'s message.
            let mut held: Option<Vec<u8>> = verdict.is_some().then(Vec::new);
            loop {
                tokio::select! {
                    read = pipe.read(&mut buf) => match read {
                        Ok(0) => break,
                        Ok(n) => {
                            let chunk = match held.as_mut() {
                                Some(held_back) => {
                                    held_back.extend_from_slice(&buf[..n]);
                                    if may_be_diagnostic(held_back) {
                                        continue;
                                    }
                                    Bytes::from(std::mem::take(held_back))
                                }
                                None => Bytes::copy_from_slice(&buf[..n]),
                            };
                            held = None;
                            if tx.send(Ok(chunk)).await.is_err() {
                                // Nobody listens; keep draining so the writer never blocks.
                                continue;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(Error::io("reading process output", e))).await;
                            break;
                        }
                    },
                    // The guard wait_for returns is not Send; drop it inside.
                    _ = async { let _ = close.wait_for(|closed| *closed).await; } => {
                        release(held.take(), verdict.as_mut(), &tx).await;
                        drain_written(&mut pipe, &mut buf, &tx).await;
                        break;
                    }
                }
            }
            release(held, verdict.as_mut(), &tx).await;
        }
        let _ = done_tx.send(());
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed();
    (stream, done_rx)
}

/// Whether output beginning `held` may be `nsenter`'s own message (held back).
fn may_be_diagnostic(held: &[u8]) -> bool {
    held.len() <= MAX_HELD
        && DIAGNOSTICS
            .iter()
            .any(|diagnostic| diagnostic.starts_with(held) || held.starts_with(diagnostic))
}

/// Sends what was held back once the verdict says the command ran; drops it if its
/// exit was the sandbox's.
async fn release(
    held: Option<Vec<u8>>,
    verdict: Option<&mut Verdict>,
    tx: &mpsc::Sender<Result<Bytes>>,
) {
    let (Some(held), Some(verdict)) = (held, verdict) else {
        return;
    };
    if held.is_empty() {
        return;
    }
    // The supervisor always sends one; a dropped sender counts as the command's own.
    let sandbox_gone = match verdict.wait_for(Option::is_some).await {
        Ok(said) => (*said).unwrap_or(false),
        Err(_) => false,
    };
    if !sandbox_gone {
        let _ = tx.send(Ok(Bytes::from(held))).await;
    }
}

/// At most this much output is read after the command exited and the drain window
/// closed: a background process that keeps writing cannot keep the reader going.
const FINAL_DRAIN_BYTES: usize = 1 << 20;

/// Reads what is already written to `pipe` (non-blocking, up to [`FINAL_DRAIN_BYTES`])
/// once the drain window closed. Under load the reader task may not have run within
/// the window: output written before the command exited is still the command's, and a
/// terminal may still hold it (Linux hands it over, then answers `EIO`).
async fn drain_written(pipe: &mut impl AsFd, buf: &mut [u8], tx: &mpsc::Sender<Result<Bytes>>) {
    let mut left = FINAL_DRAIN_BYTES;
    while left > 0 {
        let want = buf.len().min(left);
        // Both ends are non-blocking: an empty pipe answers EAGAIN, never waits.
        match rustix::io::read(pipe.as_fd(), &mut buf[..want]) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                left -= n;
                // A reader that stopped reading does not hold this task either.
                let chunk = Ok(Bytes::copy_from_slice(&buf[..n]));
                match tokio::time::timeout(DRAIN_AFTER_EXIT, tx.send(chunk)).await {
                    Ok(Ok(())) => {}
                    _ => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::AsyncWriteExt;

    /// What a wrapped command's stderr stream carries of `written`, its exit having
    /// been the sandbox's (`gone`) or its own.
    async fn carried(written: &'static [u8], gone: bool) -> Vec<u8> {
        let (mut write, read) = tokio::net::unix::pipe::pipe().unwrap();
        let (_close_tx, close_rx) = watch::channel(false);
        let (verdict_tx, verdict_rx) = watch::channel(None);
        let (mut stream, _done) = pump(Some(read), close_rx, Some(verdict_rx));
        write.write_all(written).await.unwrap();
        drop(write);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = verdict_tx.send(Some(gone));
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn nsenter_s_word_is_dropped_when_the_exit_was_the_sandbox_s() {
        let diagnostic = b"nsenter: cannot open /proc/4242/fd/35/ns/user: No such process\n";
        assert!(carried(diagnostic, true).await.is_empty());
        // A command of the same words that ran keeps them.
        assert_eq!(carried(diagnostic, false).await, diagnostic);
        // Anything else is the command's, whatever the exit: its own `nsenter:` line too.
        assert_eq!(carried(b"compiling...\n", true).await, b"compiling...\n");
        let own = b"nsenter: my own progress line\n";
        assert_eq!(carried(own, true).await, own);
    }

    #[tokio::test]
    async fn other_output_is_not_held_for_the_exit() {
        let (mut write, read) = tokio::net::unix::pipe::pipe().unwrap();
        let (_close_tx, close_rx) = watch::channel(false);
        let (_verdict_tx, verdict_rx) = watch::channel(None);
        let (mut stream, _done) = pump(Some(read), close_rx, Some(verdict_rx));
        write.write_all(b"warning: x\n").await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("held until the exit")
            .unwrap()
            .unwrap();
        assert_eq!(&first[..], b"warning: x\n");
    }
}
