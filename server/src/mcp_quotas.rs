//! MCP's sessions under their tenants' quotas: the manager MCP's tools act on creates
//! and clones through [`TenantQuotas`], which marks each sandbox as its tenant's (the
//! tenant the manager names in its own label), gives it the server's default limits,
//! and refuses one past the tenant's quota, counting the tenant's sandboxes on every
//! face, under the same per-tenant create lock as the Fly and E2B faces; and counts
//! each command among its tenant's running ones. Everything else passes through.

use std::collections::BTreeMap;
use std::sync::Arc;

use sandcell::manager::LABEL_TENANT;
use sandcell::{
    Error, ExecRequest, Process, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxSpec,
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
    commands: Arc<crate::command_slots::CommandSlots>,
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
            commands: Arc::clone(&config.commands),
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

sandcell::raw::forward_backend! {
    impl SandboxBackend for TenantQuotas {
        forward {
            [info, lifecycle, ports, read, read_limited, files, export_changes, metrics,
             set_network] => field inner;
        }

        /// Counted among the sandbox's tenant's running commands until it ends: a tool
        /// call runs on after its client has gone.
        async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
            let info = self.inner.inspect(id).await?;
            let tenant = info.labels.get(TENANT_LABEL).map_or("", String::as_str);
            self.commands
                .run(tenant, self.inner.exec(id, request))
                .await
        }

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
    }
}
