//! `ManagerBuilder`: stores, settings and warm pools; invalid settings fail at `build`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::backend::SandboxBackend;
use crate::error::{Error, Result};
use crate::manager::{
    Clock, Inner, ManagerSettings, SandboxManager, ShutdownPolicy, SnapshotRetention,
    SuspendStrategy,
};
use crate::spec::SandboxSpec;
use crate::store::{FsSnapshotStore, SnapshotStore, StateStore};

/// Pre-created sandboxes of one spec, handed to new sessions whose spec equals `spec`.
///
/// Pooled sandboxes carry the manager and pool labels but not a tenant or session label
/// (backends cannot relabel); the state store records which session took which sandbox.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WarmPool {
    /// The pool's name (same rules as a session id).
    pub name: String,
    /// The spec its sandboxes are created from.
    pub spec: SandboxSpec,
    /// How many ready sandboxes to keep.
    pub size: usize,
}

/// Builds a [`SandboxManager`]; see [`SandboxManager::builder`].
pub struct ManagerBuilder<B: SandboxBackend> {
    backend: B,
    state: Option<Arc<dyn StateStore>>,
    snapshots: Option<Arc<dyn SnapshotStore>>,
    data_dir: Option<PathBuf>,
    settings: ManagerSettings,
    pools: Vec<WarmPool>,
    reconcile_on_start: bool,
}

impl<B: SandboxBackend> std::fmt::Debug for ManagerBuilder<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerBuilder")
            .field("backend", &self.backend.name())
            .field("data_dir", &self.data_dir)
            .field("settings", &self.settings)
            .field("pools", &self.pools)
            .finish_non_exhaustive()
    }
}

impl<B: SandboxBackend> ManagerBuilder<B> {
    pub(crate) fn new(backend: B) -> Self {
        ManagerBuilder {
            backend,
            state: None,
            snapshots: None,
            data_dir: None,
            settings: ManagerSettings::default(),
            pools: Vec::new(),
            reconcile_on_start: true,
        }
    }

    /// Keeps state in `dir/state.db` (SQLite, feature `sqlite`) and snapshots in
    /// `dir/snapshots`, unless a store is set explicitly. `build` creates it `0700` if
    /// missing and refuses one that is not private
    /// ([`ensure_private_dir`](crate::raw::private_dir::ensure_private_dir)).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// The state store.
    pub fn state_store(mut self, store: impl StateStore) -> Self {
        self.state = Some(Arc::new(store));
        self
    }

    /// The snapshot store.
    pub fn snapshot_store(mut self, store: impl SnapshotStore) -> Self {
        self.snapshots = Some(Arc::new(store));
        self
    }

    /// Replaces every setting at once (e.g. from a config file).
    pub fn settings(mut self, settings: ManagerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// See [`ManagerSettings::manager_id`].
    pub fn manager_id(mut self, id: impl Into<String>) -> Self {
        self.settings.manager_id = Some(id.into());
        self
    }

    /// See [`ManagerSettings::lease_ttl`].
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl;
        self
    }

    /// See [`ManagerSettings::orphan_grace`].
    pub fn orphan_grace(mut self, grace: Duration) -> Self {
        self.settings.orphan_grace = grace;
        self
    }

    /// See [`ManagerSettings::max_sandboxes_per_tenant`].
    pub fn max_sandboxes_per_tenant(mut self, n: u32) -> Self {
        self.settings.max_sandboxes_per_tenant = Some(n);
        self
    }

    /// See [`ManagerSettings::idle_timeout`].
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.settings.idle_timeout = Some(timeout);
        self
    }

    /// See [`ManagerSettings::max_lifetime`].
    pub fn max_lifetime(mut self, lifetime: Duration) -> Self {
        self.settings.max_lifetime = Some(lifetime);
        self
    }

    /// See [`ManagerSettings::snapshot_on_expiry`].
    pub fn snapshot_on_expiry(mut self, yes: bool) -> Self {
        self.settings.snapshot_on_expiry = yes;
        self
    }

    /// See [`ManagerSettings::retention`].
    pub fn retention(mut self, retention: SnapshotRetention) -> Self {
        self.settings.retention = retention;
        self
    }

    /// Runs the reaper in the background every `interval`.
    pub fn reaper_interval(mut self, interval: Duration) -> Self {
        self.settings.reaper_interval = Some(interval);
        self
    }

    /// See [`ManagerSettings::suspend`].
    pub fn suspend_strategy(mut self, strategy: SuspendStrategy) -> Self {
        self.settings.suspend = strategy;
        self
    }

    /// See [`ManagerSettings::shutdown`].
    pub fn shutdown_policy(mut self, policy: ShutdownPolicy) -> Self {
        self.settings.shutdown = policy;
        self
    }

    /// See [`ManagerSettings::provision_timeout`].
    pub fn provision_timeout(mut self, timeout: Duration) -> Self {
        self.settings.provision_timeout = timeout;
        self
    }

    /// See [`ManagerSettings::pool_fill_parallelism`].
    pub fn pool_fill_parallelism(mut self, creates: usize) -> Self {
        self.settings.pool_fill_parallelism = creates;
        self
    }

    /// Keeps `size` sandboxes of `spec` ready for new sessions; see [`WarmPool`].
    pub fn warm_pool(mut self, name: impl Into<String>, spec: SandboxSpec, size: usize) -> Self {
        self.pools.push(WarmPool {
            name: name.into(),
            spec,
            size,
        });
        self
    }

    /// Whether `build` runs [`reconcile`](SandboxManager::reconcile) (default: yes).
    pub fn reconcile_on_start(mut self, yes: bool) -> Self {
        self.reconcile_on_start = yes;
        self
    }

    /// Validates the settings, opens the stores, reconciles, and starts the background
    /// reaper and pool filler where configured.
    pub async fn build(mut self) -> Result<SandboxManager<B>> {
        self.settings.validate()?;
        if self.settings.suspend == SuspendStrategy::Pause && !self.backend.capabilities().pause {
            return Err(Error::unsupported(format!(
                "suspend strategy 'pause' needs pause, which backend {} does not support; use 'snapshot'",
                self.backend.name()
            )));
        }
        let mut names = HashSet::new();
        for pool in &self.pools {
            crate::sandbox::validate_name("warm pool name", &pool.name)?;
            pool.spec.validate()?;
            pool.spec
                .check_supported(&self.backend.capabilities())
                .map_err(|e| e.context(format_args!("warm pool {:?}", pool.name)))?;
            if !names.insert(pool.name.clone()) {
                return Err(Error::invalid_input(format!(
                    "warm pool {:?} is configured twice",
                    pool.name
                )));
            }
        }
        // It holds every session's environment and its snapshots: never a directory
        // another user made first or can replace (ADVERSARIAL 45).
        if let Some(dir) = &self.data_dir {
            crate::raw::private_dir::ensure_private_dir(dir)?;
        }
        let state = match (self.state, &self.data_dir) {
            (Some(state), _) => state,
            #[cfg(feature = "sqlite")]
            (None, Some(dir)) => Arc::new(crate::store::SqliteStateStore::open(dir.join("state.db")).await?),
            #[cfg(not(feature = "sqlite"))]
            (None, Some(_)) => {
                return Err(Error::invalid_input(
                    "data_dir needs feature `sqlite` for its state store; enable it or pass state_store(..)",
                ))
            }
            (None, None) => {
                return Err(Error::invalid_input(
                    "no state store: call data_dir(..) or state_store(..)",
                ))
            }
        };
        let snapshots = match (self.snapshots, &self.data_dir) {
            (Some(s), _) => s,
            (None, Some(dir)) => Arc::new(FsSnapshotStore::new(dir.join("snapshots"))),
            (None, None) => {
                return Err(Error::invalid_input(
                    "no snapshot store: call data_dir(..) or snapshot_store(..)",
                ))
            }
        };
        let store_id = state
            .instance_id()
            .await
            .map_err(|e| e.context("reading the state store's instance id"))?;
        crate::sandbox::validate_name("state store instance id", &store_id)?;
        let manager_id = self
            .settings
            .manager_id
            .get_or_insert_with(|| default_manager_id(&store_id))
            .clone();
        let (events, _) = broadcast::channel(1024);
        let background = crate::background::Background::new();
        let services =
            crate::services::Services::new(self.settings.service_ports, background.clone());
        let inner = Arc::new(Inner {
            backend: Arc::new(self.backend),
            state,
            snapshots,
            settings: self.settings,
            manager_id,
            store_id,
            pools: self.pools,
            clock: Clock::new(),
            key_locks: Mutex::new(HashMap::new()),
            egress_seen: Default::default(),
            events,
            heartbeats: Mutex::new(HashMap::new()),
            last_sweep: Mutex::new(None),
            owned: Mutex::new(HashSet::new()),
            own_slots: Mutex::new(HashSet::new()),
            cancel: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
            pool_wakeup: Arc::new(tokio::sync::Notify::new()),
            fill_lock: tokio::sync::Mutex::new(()),
            background,
            services,
        });
        let manager = SandboxManager { inner };
        if self.reconcile_on_start {
            manager.reconcile().await?;
        }
        manager.start_background_tasks();
        Ok(manager)
    }
}

/// The manager id of a manager whose settings leave it unset: `sandcell-` and the
/// store's instance id, cut to the 128 characters an id may have.
fn default_manager_id(store_id: &str) -> String {
    let mut id = format!("sandcell-{store_id}");
    id.truncate(128);
    id
}
