//! `SandboxHandle`: one session's sandbox, with activity recorded on every use.

use std::sync::Arc;

use bytes::Bytes;
use tracing::Instrument;

use crate::archive::ImportOptions;
use crate::backend::{ByteStream, SandboxBackend};
use crate::error::Result;
use crate::exec::{ExecOutput, ExecRequest};
use crate::ext::SandboxBackendExt;
use crate::fs::{DirEntry, FileInfo};
use crate::manager::Inner;
use crate::path::SandboxPath;
use crate::process::Process;
use crate::sandbox::{SandboxId, SandboxInfo};
use crate::store::SessionKey;

/// A session's sandbox, from [`SandboxManager::acquire`](crate::SandboxManager::acquire).
///
/// Each operation records activity for the session (so the reaper sees it in use) and
/// then calls the backend. For the helpers of [`SandboxBackendExt`] not mirrored here,
/// call [`touch`](Self::touch) and use [`backend`](Self::backend) with [`id`](Self::id).
/// Activity is recorded when an operation starts (and, for `run`, when it ends): a
/// command started with [`exec`](Self::exec) that runs past the idle timeout with no
/// other use may be reaped.
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

    /// Starts a command; see [`SandboxBackend::exec`].
    pub async fn exec(&self, request: ExecRequest) -> Result<Process> {
        async move {
            self.touch().await;
            self.inner.backend.exec(&self.info.id, request).await
        }
        .instrument(self.span("exec"))
        .await
    }

    /// Starts a command in the background and returns its id: it keeps running when
    /// this handle is dropped, until it ends or the sandbox does. Reach it through
    /// [`SandboxManager::background`](crate::SandboxManager::background).
    pub async fn spawn(&self, request: ExecRequest) -> Result<crate::background::ProcessId> {
        async move {
            self.touch().await;
            self.inner
                .background
                .start(&self.inner.backend, &self.info.id, request)
                .await
        }
        .instrument(self.span("spawn"))
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
        async move {
            self.touch().await;
            let backend: Arc<dyn SandboxBackend> = self.inner.backend.clone();
            self.inner
                .services
                .start(backend, &self.info.id, spec)
                .await
        }
        .instrument(self.span("start_service"))
        .await
    }

    /// The services of this sandbox.
    pub fn services(&self) -> Vec<crate::services::ServiceInfo> {
        self.inner.services.list(Some(&self.info.id))
    }

    /// The background processes of this sandbox.
    pub fn processes(&self) -> Vec<crate::background::ProcessInfo> {
        self.inner.background.list(Some(&self.info.id))
    }

    /// Runs a command to completion and collects its output; see [`SandboxBackendExt::run`].
    pub async fn run(&self, request: ExecRequest) -> Result<ExecOutput> {
        async move {
            self.touch().await;
            let out = self.inner.backend.run(&self.info.id, request).await;
            self.touch().await;
            out
        }
        .instrument(self.span("run"))
        .await
    }

    /// Runs a shell script; see [`SandboxBackendExt::run_shell`].
    pub async fn run_shell(&self, script: &str) -> Result<ExecOutput> {
        async move {
            self.touch().await;
            let out = self.inner.backend.run_shell(&self.info.id, script).await;
            self.touch().await;
            out
        }
        .instrument(self.span("run_shell"))
        .await
    }

    /// Reads a whole file; see [`SandboxBackend::read`].
    pub async fn read(&self, path: &SandboxPath) -> Result<Bytes> {
        async move {
            self.touch().await;
            self.inner.backend.read(&self.info.id, path).await
        }
        .instrument(self.span("read"))
        .await
    }

    /// Reads a UTF-8 file; see [`SandboxBackendExt::read_to_string`].
    pub async fn read_to_string(&self, path: &SandboxPath) -> Result<String> {
        async move {
            self.touch().await;
            self.inner.backend.read_to_string(&self.info.id, path).await
        }
        .instrument(self.span("read_to_string"))
        .await
    }

    /// Writes a whole file; see [`SandboxBackend::write`].
    pub async fn write(&self, path: &SandboxPath, data: Bytes) -> Result<()> {
        async move {
            self.touch().await;
            self.inner.backend.write(&self.info.id, path, data).await
        }
        .instrument(self.span("write"))
        .await
    }

    /// Metadata of a path; see [`SandboxBackend::stat`].
    pub async fn stat(&self, path: &SandboxPath) -> Result<FileInfo> {
        async move {
            self.touch().await;
            self.inner.backend.stat(&self.info.id, path).await
        }
        .instrument(self.span("stat"))
        .await
    }

    /// Lists a directory; see [`SandboxBackend::list_dir`].
    pub async fn list_dir(&self, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        async move {
            self.touch().await;
            self.inner.backend.list_dir(&self.info.id, path).await
        }
        .instrument(self.span("list_dir"))
        .await
    }

    /// Removes a path; see [`SandboxBackend::remove`].
    pub async fn remove(&self, path: &SandboxPath, recursive: bool) -> Result<()> {
        async move {
            self.touch().await;
            self.inner
                .backend
                .remove(&self.info.id, path, recursive)
                .await
        }
        .instrument(self.span("remove"))
        .await
    }

    /// Creates a directory; see [`SandboxBackend::mkdir`].
    pub async fn mkdir(&self, path: &SandboxPath) -> Result<()> {
        async move {
            self.touch().await;
            self.inner.backend.mkdir(&self.info.id, path).await
        }
        .instrument(self.span("mkdir"))
        .await
    }

    /// Renames a path; see [`SandboxBackend::rename`].
    pub async fn rename(&self, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        async move {
            self.touch().await;
            self.inner.backend.rename(&self.info.id, from, to).await
        }
        .instrument(self.span("rename"))
        .await
    }

    /// Exports a directory as tar; see [`SandboxBackend::export_tar`].
    pub async fn export_tar(&self, path: &SandboxPath) -> Result<ByteStream> {
        async move {
            self.touch().await;
            self.inner.backend.export_tar(&self.info.id, path).await
        }
        .instrument(self.span("export_tar"))
        .await
    }

    /// Imports a tar stream; see [`SandboxBackend::import_tar`].
    pub async fn import_tar(
        &self,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        async move {
            self.touch().await;
            self.inner
                .backend
                .import_tar(&self.info.id, path, tar, options)
                .await
        }
        .instrument(self.span("import_tar"))
        .await
    }
}
