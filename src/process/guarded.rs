//! A process holding something (a place among its owner's running commands) until it
//! ends, not until its handle is dropped: a dropped handle does not end the command.

use async_trait::async_trait;

use super::ProcessControl;
use crate::error::Result;
use crate::exec::{ExitStatus, TerminalSize};

/// What a guarded process holds.
type Guard = Box<dyn Send + Sync>;

/// A process's control, holding `guard` until the process is seen to end: by a `wait`
/// that answers, or, once the handle is dropped, by a task waiting on it meanwhile.
pub(super) struct Guarded {
    inner: Option<Box<dyn ProcessControl>>,
    guard: Option<Guard>,
}

impl Guarded {
    pub(super) fn new(inner: Box<dyn ProcessControl>, guard: Guard) -> Self {
        Guarded {
            inner: Some(inner),
            guard: Some(guard),
        }
    }

    fn inner(&mut self) -> &mut Box<dyn ProcessControl> {
        // Taken only in `drop`.
        self.inner.as_mut().unwrap_or_else(|| unreachable!())
    }
}

#[async_trait]
impl ProcessControl for Guarded {
    async fn wait(&mut self) -> Result<ExitStatus> {
        let status = self.inner().wait().await;
        if status.is_ok() {
            self.guard = None;
        }
        status
    }

    async fn kill(&mut self) -> Result<()> {
        self.inner().kill().await
    }

    async fn signal(&mut self, signal: i32) -> Result<()> {
        self.inner().signal(signal).await
    }

    async fn resize(&mut self, size: TerminalSize) -> Result<()> {
        self.inner().resize(size).await
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let (Some(mut inner), Some(guard)) = (self.inner.take(), self.guard.take()) else {
            return;
        };
        // Outside a runtime nothing can wait: the guard goes now.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = inner.wait().await;
                drop(guard);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use futures::StreamExt;

    use super::*;

    /// A process that ends when `end` is sent.
    struct Until(tokio::sync::watch::Receiver<bool>);

    #[async_trait]
    impl ProcessControl for Until {
        async fn wait(&mut self) -> Result<ExitStatus> {
            let _ = self.0.wait_for(|ended| *ended).await;
            Ok(ExitStatus::exited(0))
        }

        async fn kill(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_dropped_handle_holds_its_guard_until_the_process_ends() {
        let (end, ended) = tokio::sync::watch::channel(false);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let slot = Arc::clone(&slots).try_acquire_owned().unwrap();
        let process = crate::raw::process(
            Box::new(Until(ended)),
            None,
            futures::stream::empty().boxed(),
            futures::stream::empty().boxed(),
        );
        let process = crate::raw::hold_until_exit(process, slot);
        drop(process);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(slots.available_permits(), 0, "held while the command runs");
        end.send(true).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while slots.available_permits() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("given back once the command ended");
    }
}
