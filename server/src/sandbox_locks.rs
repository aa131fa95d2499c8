//! One lock per sandbox for the faces' lifecycle changes (pause, resume, restart,
//! destroy, and the E2B face's reaping): each looks at the sandbox's state and then
//! acts on it, and two of them interleaved act on a state that is gone. A resume that
//! read "running" while a pause was on its way answered 200 and left the sandbox
//! paused; the reaper could pause one a `connect` had just given more time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use sandcell::SandboxId;
use tokio::sync::OwnedMutexGuard;

/// The locks of the sandboxes being changed now; a lock lives while someone holds or
/// waits for it.
#[derive(Debug, Default)]
pub(crate) struct SandboxLocks {
    locks: Mutex<HashMap<SandboxId, Weak<tokio::sync::Mutex<()>>>>,
}

impl SandboxLocks {
    /// Waits for `id`'s lock and holds it until the guard is dropped.
    pub(crate) async fn hold(&self, id: &SandboxId) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = crate::lock(&self.locks);
            match locks.get(id).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    // Locks no one holds any longer go as new ones come, so the map is
                    // as large as the changes under way.
                    locks.retain(|_, lock| lock.strong_count() > 0);
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(id.clone(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_sandbox_waits_another_does_not_and_nothing_is_kept() {
        let locks = Arc::new(SandboxLocks::default());
        let (a, b) = (SandboxId::new("a").unwrap(), SandboxId::new("b").unwrap());
        let held = locks.hold(&a).await;
        let waiting = tokio::spawn({
            let (locks, a) = (locks.clone(), a.clone());
            async move { drop(locks.hold(&a).await) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a second change of `a` waits");
        drop(locks.hold(&b).await);
        drop(held);
        waiting.await.unwrap();
        drop(locks.hold(&SandboxId::new("c").unwrap()).await);
        assert_eq!(
            crate::lock(&locks.locks).len(),
            1,
            "only the latest is left"
        );
    }
}
