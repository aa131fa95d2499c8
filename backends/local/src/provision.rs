//! Making a sandbox: its cgroups, directory, workspace, mounts, metadata and (at
//! `Isolation::Namespaces`) namespaces, all or nothing; a clone's the same way; and
//! the egress proxy an allowlisted sandbox's network leads to.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use sandcell::{Error, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxSpec, SandboxStatus};

use super::{blocking, LocalBackend};
use crate::config::Isolation;
use crate::egress::Listener;
use crate::layout::{SandboxDir, SandboxMeta};
use crate::materialize;

impl LocalBackend {
    /// Makes a sandbox of `spec` (limits already resolved): its cgroups, its directory,
    /// a workspace from `fill` (which answers the strategy it used), the spec's host
    /// mounts, its metadata, and at `Isolation::Namespaces` its namespaces. On any
    /// failure nothing is left: no cgroup, no mount, no directory.
    pub(super) async fn provision<F>(&self, spec: SandboxSpec, fill: F) -> Result<SandboxMeta>
    where
        F: FnOnce(&SandboxDir) -> Result<&'static str> + Send + 'static,
    {
        let id = SandboxId::generate("local");
        // With a disk limit, what the sandbox writes goes on a disk of its own.
        let disk_bytes = (spec.limits.disk_bytes).filter(|_| self.inner.capabilities.disk_limit);
        let dir = self.dir(&id).with_disk(disk_bytes.is_some());
        let roots = self.inner.cgroups.clone();
        let owner = self.inner.owner();
        let groups = self.inner.probed.sandbox_groups.clone();
        let (dir, mut meta) = blocking(move || {
            let mut cgroups = None;
            let result = (|| {
                cgroups = roots.create(&id, &spec.limits)?;
                if let Some(bytes) = disk_bytes {
                    crate::quota::make(&dir, bytes)?;
                }
                std::fs::create_dir_all(dir.tmp())
                    .map_err(|e| Error::io("creating the sandbox directory", e))?;
                // No other local user reads a sandbox's files through its directory. At
                // Landlock only the sandbox's own group may pass through it (no other
                // sandbox, though all share the owner); at Namespaces the owner's group
                // may (its namespaces mount the workspace; nothing else reaches it).
                let mut group = None;
                let private = match (&owner, &groups) {
                    (Some(owner), Some(groups)) => {
                        let sandboxes = dir.path().parent().unwrap_or(dir.path());
                        group = Some(groups.assign(&id, sandboxes, dir.path())?);
                        owner.chown(&dir.tmp())?;
                        0o710
                    }
                    (Some(owner), None) => {
                        std::os::unix::fs::chown(dir.path(), None, Some(owner.gid))
                            .map_err(|e| Error::io("making the sandbox directory private", e))?;
                        owner.chown(&dir.tmp())?;
                        0o710
                    }
                    (None, _) => 0o700,
                };
                std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(private))
                    .map_err(|e| Error::io("making the sandbox directory private", e))?;
                let used = fill(&dir).map_err(|e| {
                    let what = "the workspace does not fit on the sandbox's disk";
                    crate::quota::full_disk(e, disk_bytes, Some(what))
                })?;
                materialize::attach_mounts(&dir, &spec.mounts, owner.as_deref(), group)?;
                let meta = SandboxMeta {
                    id: id.clone(),
                    spec,
                    status: SandboxStatus::Running,
                    created_at: chrono::Utc::now(),
                    workspace: used.to_owned(),
                    cgroups: cgroups.clone(),
                    ns_init: None,
                    ns_init_start: None,
                    ns_user: false,
                    egress_port: None,
                    net_link: None,
                    disk_bytes,
                    group,
                };
                dir.write_meta(&meta)?;
                Ok((dir.clone(), meta))
            })();
            if result.is_err() {
                if let Some(cg) = &cgroups {
                    cg.remove();
                }
                if materialize::unmount_all(&dir).is_ok() {
                    let _ = sandcell::raw::tree::remove_dir_all(dir.path());
                }
            }
            result
        })
        .await?;
        let started = match self.inner.config.isolation {
            Isolation::Namespaces => {
                let tools = self.namespace_tools()?;
                match crate::namespace::start(tools, &dir, &mut meta).await {
                    Ok(()) => self.serve_egress(&meta),
                    Err(e) => Err(e),
                }
            }
            Isolation::Landlock if matches!(meta.spec.network, sandcell::Network::Allowlist(_)) => {
                self.start_host_egress(&dir, &mut meta)
            }
            _ => Ok(()),
        };
        if let Err(e) = started {
            let _ = self.destroy(&meta.id).await;
            return Err(e);
        }
        Ok(meta)
    }

    /// At `Isolation::Landlock`: the egress listener on the host's loopback, the
    /// sandbox's cgroup narrowed to it, its port recorded.
    pub(super) fn start_host_egress(&self, dir: &SandboxDir, meta: &mut SandboxMeta) -> Result<()> {
        let cgroups = meta.cgroups.as_ref().ok_or_else(|| {
            Error::unsupported("an allowlist at Isolation::Landlock needs a cgroup v2 of its own")
        })?;
        let port = crate::egress::start_on_host(
            &self.inner.egress,
            &meta.id,
            &meta.spec.network,
            &cgroups.unified,
            &self.inner.config,
        )?;
        meta.egress_port = Some(port);
        dir.write_meta(meta)
    }

    /// Where the egress listener of an allowlisted sandbox is, if it has one.
    pub(super) fn egress_listener<'a>(
        &'a self,
        meta: &SandboxMeta,
    ) -> Result<Option<Listener<'a>>> {
        if !matches!(meta.spec.network, sandcell::Network::Allowlist(_)) {
            return Ok(None);
        }
        Ok(match (meta.ns_init, meta.egress_port) {
            (Some(init), _) => Some(Listener::Namespace {
                init: crate::pinned::PinnedInit::pin(&meta.id, init, meta.ns_init_start)?,
                join_user_ns: meta.ns_user,
                noop: &self.namespace_tools()?.noop,
            }),
            (None, Some(port)) => Some(Listener::HostPort(port)),
            (None, None) => None,
        })
    }

    /// Serves the egress proxy of an allowlisted sandbox from this process, unless it
    /// already does (or another process does).
    pub(super) fn serve_egress(&self, meta: &SandboxMeta) -> Result<()> {
        let Some(listener) = self.egress_listener(meta)? else {
            return Ok(());
        };
        crate::egress::ensure(
            &self.inner.egress,
            &meta.id,
            &meta.spec.network,
            listener,
            &self.inner.config,
        )
    }

    /// A new sandbox with sandbox `id`'s workspace and spec, and `labels`: see
    /// [`SandboxBackend::clone_sandbox`] on [`LocalBackend`].
    pub(super) async fn clone_of(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        let (source_dir, source) = self.meta(id)?;
        let template = self
            .inner
            .config
            .templates
            .get(&source.spec.template)
            .cloned()
            .ok_or_else(|| {
                Error::not_found(format!(
                    "template {:?} of sandbox {id} is no longer registered",
                    source.spec.template
                ))
            })?;
        let strategy = source.workspace.clone();
        if strategy == "in_place" {
            return Err(Error::unsupported(format!(
                "sandbox {id} works in its template's directory; there is no copy of it to clone"
            )));
        }
        let mut spec = source.spec.clone();
        spec.labels = labels;
        // A paused source stays frozen as it is; a running one is frozen while read.
        let running = source.status == SandboxStatus::Running;
        let source_cgroups = source.cgroups.clone().filter(|_| running);
        let root = self.inner.config.root.clone();
        let owner = self.inner.owner();
        if strategy != "overlay" {
            let meta = self
                .provision(spec, move |dir| {
                    let _frozen = source_cgroups
                        .as_ref()
                        .and_then(|cg| cg.frozen_while_held());
                    crate::contained::copy_tree(&source_dir.workspace(), &dir.workspace())?;
                    // No process of the clone's can reach its copy yet.
                    match &owner {
                        Some(owner) => owner.chown_tree(&dir.workspace()),
                        None => Ok(()),
                    }
                    .map(|()| "copy")
                })
                .await?;
            return Ok(meta.info(&self.dir(&meta.id)));
        }
        // The source's upper layer is frozen (or found busy) on one thread while the
        // clone's cgroups and directory are made on another (`crate::clone`).
        let source = Arc::new(crate::clone::Source {
            id: id.clone(),
            dir: source_dir,
            template,
            cgroups: source_cgroups,
            // A layer frozen out of a sandbox's own disk would leave its limit.
            may_freeze: source.ns_init.is_none() && source.disk_bytes.is_none(),
            owner: owner.clone(),
        });
        let (plan, planned) = std::sync::mpsc::sync_channel(1);
        let (populated, is_populated) = std::sync::mpsc::sync_channel(1);
        {
            let (inner, source) = (self.inner.clone(), source.clone());
            tokio::task::spawn_blocking(move || {
                crate::clone::freeze_source(
                    &inner.config.root,
                    &inner.workspace_gate,
                    &source,
                    &is_populated,
                    || inner.forget_ruleset(&source.id),
                    plan,
                );
            });
        }
        // One small read of the cgroup file system, made before the clone's cgroups
        // are (see `freeze_source`).
        if let Some(cg) = &source.cgroups {
            let _ = populated.send(cg.is_populated());
        }
        let meta = self
            .provision(spec, move |dir| {
                crate::clone::fill(&root, &planned, &source, dir, owner.as_deref())
            })
            .await?;
        Ok(meta.info(&self.dir(&meta.id)))
    }
}
