//! MCP's sessions under their tenants' quotas: the manager MCP's tools act on creates
//! and clones through [`TenantQuotas`], which marks each sandbox as its tenant's (the
//! tenant the manager names in its own label), gives it the server's default limits,
//! and refuses one past the tenant's quota, counting the tenant's sandboxes on every
//! face, under the same per-tenant create lock as the Fly and E2B faces. Everything
//! else passes through.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use sandcell::archive::ImportOptions;
use sandcell::manager::LABEL_TENANT;
use sandcell::watch::{WatchOptions, WatchStream};
use sandcell::{
    ByteStream, Capabilities, Changes, DirEntry, Error, ExecRequest, FileInfo, LabelSelector,
    Process, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxMetrics, SandboxPath,
    SandboxSpec,
};

use crate::tenants::{self, CreateLocks, Tenant, TENANT_LABEL};
use crate::ServerConfig;

/// The backend under MCP's manager: the served one, with creates and clones counted
/// against the tenant that asks.
pub(crate) struct TenantQuotas {
    inner: Arc<dyn SandboxBackend>,
    tenants: Vec<Tenant>,
    default_limits: sandcell::Limits,
    locks: Arc<CreateLocks>,
}

impl std::fmt::Debug for TenantQuotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantQuotas")
            .field("inner", &self.inner.name())
            .finish_non_exhaustive()
    }
}

impl TenantQuotas {
    pub(crate) fn new(inner: Arc<dyn SandboxBackend>, config: &ServerConfig) -> TenantQuotas {
        TenantQuotas {
            inner,
            tenants: config.tenants.clone(),
            default_limits: config.default_limits.clone(),
            locks: Arc::clone(&config.create_locks),
        }
    }

    /// The tenant the manager's label on `labels` names: every MCP session belongs to
    /// the tenant whose token opened it, so a sandbox without one (a warm pool's) is
    /// not MCP's to make.
    fn tenant_of(&self, labels: &BTreeMap<String, String>) -> Result<&Tenant> {
        let name = labels.get(LABEL_TENANT).ok_or_else(|| {
            Error::invalid_input(
                "a sandbox made for MCP's tools must belong to a tenant (warm pools are \
                 not served over MCP)",
            )
        })?;
        self.tenants
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| Error::permission_denied(format!("no tenant {name:?} on this server")))
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl SandboxBackend for TenantQuotas {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        let tenant = self.tenant_of(&spec.labels)?;
        let mut spec = spec.clone();
        tenants::mark(
            &mut spec,
            tenant,
            &self.inner.capabilities(),
            &self.default_limits,
        );
        let _creating = self.locks.hold(&tenant.name).await;
        tenants::check_quota(self.inner.as_ref(), tenant, &spec).await?;
        self.inner.create(&spec).await
    }

    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        let tenant = self.tenant_of(&labels)?;
        let source = self.inner.inspect(id).await?;
        if source.labels.get(TENANT_LABEL) != Some(&tenant.name) {
            return Err(Error::not_found(format!("sandbox {id} not found")));
        }
        let mut labels = labels;
        tenants::count_as_source(&mut labels, tenant, &source);
        let mut counted = SandboxSpec::new(source.template.clone());
        counted.labels = labels.clone();
        let _creating = self.locks.hold(&tenant.name).await;
        tenants::check_quota(self.inner.as_ref(), tenant, &counted).await?;
        self.inner.clone_sandbox(id, labels).await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        self.inner.inspect(id).await
    }
    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        self.inner.list(selector).await
    }
    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.inner.destroy(id).await
    }
    async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.inner.pause(id).await
    }
    async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.inner.resume(id).await
    }
    async fn reset(&self, id: &SandboxId) -> Result<()> {
        self.inner.reset(id).await
    }
    async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.inner.publish_port(id, port).await
    }
    async fn unpublish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.inner.unpublish_port(id, port).await
    }
    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        self.inner.exec(id, request).await
    }
    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes> {
        self.inner.read(id, path).await
    }
    async fn read_limited(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<Bytes> {
        self.inner.read_limited(id, path, max_bytes).await
    }
    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        self.inner.write(id, path, data).await
    }
    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        self.inner.stat(id, path).await
    }
    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        self.inner.list_dir(id, path).await
    }
    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        self.inner.remove(id, path, recursive).await
    }
    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        self.inner.mkdir(id, path).await
    }
    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        self.inner.rename(id, from, to).await
    }
    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        self.inner.export_tar(id, path).await
    }
    async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
        self.inner.export_changes(id).await
    }
    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        self.inner.import_tar(id, path, tar, options).await
    }
    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        self.inner.watch(id, path, options).await
    }
    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics> {
        self.inner.metrics(id).await
    }
    async fn set_network(&self, id: &SandboxId, network: &sandcell::Network) -> Result<()> {
        self.inner.set_network(id, network).await
    }
}
