//! `SandboxHandle`: one session's sandbox, with activity recorded on every use.

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use crate::backend::SandboxBackend;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::exec::ExecRequest;
use crate::manager::Inner;
use crate::sandbox::{SandboxId, SandboxInfo};
use crate::store::SessionKey;

/// A session's sandbox, from [`SandboxManager::acquire`](crate::SandboxManager::acquire).
///
/// Every backend operation goes through [`call`](Self::call), which records activity for
/// the session (so the reaper sees it in use), runs the operation in a span, and puts
/// the operation, sandbox and session on its error. Activity is recorded when an
/// operation starts and when its call returns: a command started with `exec` that runs
/// past the idle timeout with no other use may be reaped.
///
/// The handle does not keep the sandbox alive: after the session is released or reaped
/// its operations fail with `NotFound`; acquire the session again.
pub struct SandboxHandle<B: SandboxBackend> {
    inner: Arc<Inner<B>>,
    key: SessionKey,
    info: SandboxInfo,
}

impl<B: SandboxBackend> Clone for SandboxHandle<B> {
    fn clone(&self) -> Self {
        SandboxHandle {
            inner: Arc::clone(&self.inner),
            key: self.key.clone(),
            info: self.info.clone(),
        }
    }
}

impl<B: SandboxBackend> std::fmt::Debug for SandboxHandle<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxHandle")
            .field("session", &self.key)
            .field("sandbox", &self.info.id)
            .finish_non_exhaustive()
    }
}

impl<B: SandboxBackend> SandboxHandle<B> {
    pub(crate) fn new(inner: Arc<Inner<B>>, key: SessionKey, info: SandboxInfo) -> Self {
        SandboxHandle { inner, key, info }
    }

    /// The sandbox id.
    pub fn id(&self) -> &SandboxId {
        &self.info.id
    }

    /// The session.
    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// What the backend reported when the session was acquired.
    pub fn info(&self) -> &SandboxInfo {
        &self.info
    }

    /// The backend (operations through it directly do not record activity).
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    fn span(&self, op: &'static str) -> tracing::Span {
        tracing::debug_span!(
            "sandcell.op",
            op,
            tenant = self.key.tenant(),
            session = self.key.session(),
            sandbox = self.info.id.as_str()
        )
    }

    /// Records activity for the session now.
    pub async fn touch(&self) {
        self.inner.touch(&self.key).await;
    }

    /// Calls any backend operation on this sandbox with the session's bookkeeping:
    /// activity is recorded before and after (so the reaper sees the session in use),
    /// the call runs in a `sandcell.op` span naming `op`, the tenant, session and
    /// sandbox, and an error carries them as data ([`Error::operation`],
    /// [`Error::sandbox`], [`Error::session`]). Any method of [`SandboxBackend`] or
    /// [`SandboxBackendExt`](crate::SandboxBackendExt) goes through here, so a new
    /// backend method needs no change to the handle.
    ///
    /// ```
    /// # #[cfg(feature = "testing")]
    /// # async fn demo() -> sandcell::Result<()> {
    /// use sandcell::{SandboxBackend, SandboxBackendExt, SandboxManager, SandboxSpec, SessionKey};
    /// use sandcell::store::{InMemorySnapshotStore, InMemoryStateStore};
    /// use sandcell::testing::MockBackend;
    /// use std::sync::Arc;
    ///
    /// let manager = SandboxManager::builder(MockBackend::new())
    ///     .state_store(Arc::new(InMemoryStateStore::new()))
    ///     .snapshot_store(Arc::new(InMemorySnapshotStore::new()))
    ///     .build()
    ///     .await?;
    /// let key = SessionKey::new("acme", "chat-1")?;
    /// let sandbox = manager.acquire(&key, &SandboxSpec::default()).await?;
    /// let path = "notes.md".parse()?;
    /// sandbox.call("write", |b, id| b.write_string(id, &path, "hello")).await?;
    /// let text = sandbox.call("read", |b, id| b.read_to_string(id, &path)).await?;
    /// assert_eq!(text, "hello");
    ///
    /// let missing = "missing.md".parse()?;
    /// let err = sandbox.call("read", |b, id| b.read(id, &missing)).await.unwrap_err();
    /// assert_eq!(err.operation(), Some("read"));
    /// assert_eq!(err.session(), Some(&key));
    /// # Ok(())
    /// # }
    /// # #[cfg(feature = "testing")]
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn call<'a, T, F, Fut>(&'a self, op: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(&'a B, &'a SandboxId) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        async move {
            self.touch().await;
            let result = f(&self.inner.backend, &self.info.id).await;
            self.touch().await;
            result.map_err(|e| {
                e.set_operation(op)
                    .set_sandbox(&self.info.id)
                    .set_session(&self.key)
            })
        }
        .instrument(self.span(op))
        .await
    }

    /// Starts a command in the background and returns its id: it keeps running when
    /// this handle is dropped, until it ends or the sandbox does. Reach it through
    /// [`SandboxManager::background`](crate::SandboxManager::background).
    pub async fn spawn(&self, request: ExecRequest) -> Result<crate::background::BackgroundId> {
        let background = &self.inner.background;
        self.call("spawn", |b, id| background.start(b, id, request))
            .await
    }

    /// Starts a service in this sandbox on a port from the manager's
    /// [`service_ports`](crate::ManagerSettings::service_ports) and waits until it
    /// answers; see [`Services::start`](crate::services::Services::start). An unhealthy
    /// service fails the sandbox at the reaper's next pass.
    pub async fn start_service(
        &self,
        spec: crate::services::ServiceSpec,
    ) -> Result<crate::services::ServiceInfo> {
        let backend: Arc<dyn SandboxBackend> = self.inner.backend.clone();
        let services = &self.inner.services;
        self.call("start_service", |_, id| services.start(backend, id, spec))
            .await
    }

    /// A resource reading of this sandbox; see
    /// [`SandboxBackend::metrics`](crate::SandboxBackend::metrics).
    pub async fn metrics(&self) -> Result<crate::SandboxMetrics> {
        self.call("metrics", |b, id| b.metrics(id)).await
    }

    /// Watches a directory of this sandbox; see
    /// [`SandboxBackend::watch`](crate::SandboxBackend::watch). Activity is recorded
    /// when the watch starts, not for each event.
    pub async fn watch(
        &self,
        path: &crate::SandboxPath,
        options: crate::WatchOptions,
    ) -> Result<crate::WatchStream> {
        self.call("watch", |b, id| b.watch(id, path, options)).await
    }

    /// The services of this sandbox.
    pub fn services(&self) -> Vec<crate::services::ServiceInfo> {
        self.inner.services.list(Some(&self.info.id))
    }

    /// The background processes of this sandbox.
    pub fn processes(&self) -> Vec<crate::background::BackgroundInfo> {
        self.inner.background.list(Some(&self.info.id))
    }
}
