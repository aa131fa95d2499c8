//! The manager's policy knobs as serializable data: limits, timeouts, retention, strategies.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How [`ReleaseMode::Suspend`](crate::ReleaseMode::Suspend) (and idle reaping) parks a
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SuspendStrategy {
    /// Snapshot the workspace, then destroy the sandbox; `acquire` restores it.
    #[default]
    Snapshot,
    /// Freeze the sandbox with the backend's `pause` (needs
    /// [`Capabilities::pause`](crate::Capabilities::pause)); `acquire` resumes it.
    /// Idle reaping still snapshots and destroys.
    Pause,
}

/// What [`SandboxManager::shutdown`](crate::SandboxManager::shutdown) does with the live
/// sessions this manager acquired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ShutdownPolicy {
    /// Leave them running; a later manager on the same stores reconnects to them.
    Keep,
    /// Suspend each (snapshot, then destroy).
    #[default]
    Suspend,
    /// Destroy each, keeping their snapshots.
    Destroy,
}

/// Which snapshots the reaper deletes. A snapshot is deleted when it is not among the
/// newest `keep_last` of its session, or when it is older than `max_age`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SnapshotRetention {
    /// Keep at most this many snapshots per session (newest first).
    pub keep_last: Option<usize>,
    /// Delete snapshots older than this (seconds in config files).
    #[serde(with = "crate::config::duration::option")]
    pub max_age: Option<Duration>,
}

impl SnapshotRetention {
    /// Keeps everything.
    pub fn keep_all() -> Self {
        Self::default()
    }

    /// Keeps at most `n` snapshots per session.
    pub fn keep_last(mut self, n: usize) -> Self {
        self.keep_last = Some(n);
        self
    }

    /// Deletes snapshots older than `age`.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }
}

/// The manager's settings; every field has a default, and config files give durations in
/// seconds.
///
/// ```
/// let settings: sandcell::ManagerSettings = serde_json::from_str(
///     r#"{"max_sandboxes_per_tenant": 5, "idle_timeout": 900, "retention": {"keep_last": 3}}"#,
/// ).unwrap();
/// assert_eq!(settings.idle_timeout, Some(std::time::Duration::from_secs(900)));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ManagerSettings {
    /// Labels every resource this manager creates (`sandcell.manager`) and owns the
    /// session leases it takes ([`Lease`](crate::store::Lease)). Managers sharing an id
    /// are one owner: give each host (each manager that may run at once with another
    /// over the same stores) its own. Reconcile only ever touches resources carrying it
    /// (and the state store's instance id, `sandcell.store`).
    ///
    /// Unset (the default), the manager takes `sandcell-<the state store's instance
    /// id>`: the same for every process on one store (a restarted process keeps its
    /// leases), different for every other store, so programs with their own stores on
    /// one backend never share an owner. Managers on several hosts sharing one store
    /// (PostgreSQL) still need an id each. After `build`, the manager's
    /// [`settings`](crate::SandboxManager::settings) carry the id in force.
    pub manager_id: Option<String>,
    /// At most this many sessions of one tenant hold a sandbox at once.
    pub max_sandboxes_per_tenant: Option<u32>,
    /// A session unused this long is suspended by the reaper.
    #[serde(with = "crate::config::duration::option")]
    pub idle_timeout: Option<Duration>,
    /// A sandbox older than this is destroyed by the reaper.
    #[serde(with = "crate::config::duration::option")]
    pub max_lifetime: Option<Duration>,
    /// Snapshot a sandbox before destroying it for its lifetime (default true).
    pub snapshot_on_expiry: bool,
    /// Which snapshots the reaper deletes.
    pub retention: SnapshotRetention,
    /// Run the reaper in the background at this interval (`None`: call
    /// [`reap_once`](crate::SandboxManager::reap_once) yourself).
    #[serde(with = "crate::config::duration::option")]
    pub reaper_interval: Option<Duration>,
    /// How a session is suspended.
    pub suspend: SuspendStrategy,
    /// What shutdown does with live sessions.
    pub shutdown: ShutdownPolicy,
    /// An acquire that has not finished provisioning after this long is presumed dead:
    /// its claim no longer blocks the session and its sandbox counts as an orphan.
    #[serde(with = "crate::config::duration")]
    pub provision_timeout: Duration,
    /// How long a session lease lasts unless renewed: this manager renews its leases
    /// every third of it, and another manager may take a session over (restoring it from
    /// its latest snapshot if its sandbox is out of reach) once it has passed.
    #[serde(with = "crate::config::duration")]
    pub lease_ttl: Duration,
    /// A snapshot blob without a manifest (left by a crash between the two writes) is
    /// deleted by reconcile and the reaper once it is this old; younger ones may be
    /// uploads still in flight.
    #[serde(with = "crate::config::duration")]
    pub orphan_grace: Duration,
    /// zstd level for snapshots.
    pub snapshot_level: i32,
    /// The host ports services started through this manager are given.
    pub service_ports: crate::services::PortRange,
    /// How many warm-pool sandboxes a fill creates at once (default 4). Pool
    /// sandboxes belong to no tenant until a session takes one, and the take is a
    /// claim under the tenant's limit like any acquire.
    pub pool_fill_parallelism: usize,
}

impl Default for ManagerSettings {
    fn default() -> Self {
        ManagerSettings {
            manager_id: None,
            max_sandboxes_per_tenant: None,
            idle_timeout: None,
            max_lifetime: None,
            snapshot_on_expiry: true,
            retention: SnapshotRetention::default(),
            reaper_interval: None,
            suspend: SuspendStrategy::Snapshot,
            shutdown: ShutdownPolicy::Suspend,
            provision_timeout: Duration::from_secs(600),
            lease_ttl: Duration::from_secs(30),
            orphan_grace: Duration::from_secs(3600),
            snapshot_level: 1,
            service_ports: crate::services::PortRange::default(),
            pool_fill_parallelism: 4,
        }
    }
}

impl ManagerSettings {
    /// Checks the settings; the builder calls this.
    pub fn validate(&self) -> Result<()> {
        if let Some(id) = &self.manager_id {
            crate::sandbox::validate_name("manager id", id)?;
        }
        self.service_ports.validate()?;
        if self.pool_fill_parallelism == 0 {
            return Err(Error::invalid_input(
                "pool_fill_parallelism must be at least 1",
            ));
        }
        if self.max_sandboxes_per_tenant == Some(0) {
            return Err(Error::invalid_input(
                "max_sandboxes_per_tenant must be at least 1 (leave it unset for no limit)",
            ));
        }
        for (name, value) in [
            ("idle_timeout", self.idle_timeout),
            ("max_lifetime", self.max_lifetime),
            ("reaper_interval", self.reaper_interval),
            ("provision_timeout", Some(self.provision_timeout)),
            ("lease_ttl", Some(self.lease_ttl)),
            ("orphan_grace", Some(self.orphan_grace)),
        ] {
            if value == Some(Duration::ZERO) {
                return Err(Error::invalid_input(format!(
                    "{name} must be greater than zero"
                )));
            }
        }
        if !(-7..=22).contains(&self.snapshot_level) {
            return Err(Error::invalid_input(format!(
                "snapshot_level {} is outside zstd's range -7..=22",
                self.snapshot_level
            )));
        }
        Ok(())
    }
}
