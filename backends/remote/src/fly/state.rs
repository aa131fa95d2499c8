//! Machines and their states as the Fly Machines API reports them, and how they map
//! onto sandcell's ([`info_of`]).

use sandcell::SandboxStatus;
use sandcell::{Error, ErrorKind, Network, Result, SandboxId, SandboxInfo, SandboxSpec};

use crate::protocol::{Machine, SPEC_METADATA};

/// A machine's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MachineState {
    /// Created, not yet started.
    Created,
    /// Starting.
    Starting,
    /// Running.
    Started,
    /// Stopping.
    Stopping,
    /// Stopped: nothing runs; `start` boots it again.
    Stopped,
    /// Suspending.
    Suspending,
    /// Suspended: memory kept; `start` resumes it.
    Suspended,
    /// Its config is being replaced.
    Replacing,
    /// Being destroyed.
    Destroying,
    /// Gone.
    Destroyed,
    /// It failed.
    Failed,
    /// Only a `wait` target: any of started, stopped, suspended, failed, destroyed.
    Settled,
}

impl MachineState {
    /// The API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Created => "created",
            MachineState::Starting => "starting",
            MachineState::Started => "started",
            MachineState::Stopping => "stopping",
            MachineState::Stopped => "stopped",
            MachineState::Suspending => "suspending",
            MachineState::Suspended => "suspended",
            MachineState::Replacing => "replacing",
            MachineState::Destroying => "destroying",
            MachineState::Destroyed => "destroyed",
            MachineState::Failed => "failed",
            MachineState::Settled => "settled",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            MachineState::Created,
            MachineState::Starting,
            MachineState::Started,
            MachineState::Stopping,
            MachineState::Stopped,
            MachineState::Suspending,
            MachineState::Suspended,
            MachineState::Replacing,
            MachineState::Destroying,
            MachineState::Destroyed,
            MachineState::Failed,
            MachineState::Settled,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// Not on its way to another state.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            MachineState::Started
                | MachineState::Stopped
                | MachineState::Suspended
                | MachineState::Failed
                | MachineState::Destroyed
        )
    }

    /// The state a sandbox in `status` shows (`stopped` tells a stop from a suspend).
    pub fn of(status: SandboxStatus, stopped: bool) -> Self {
        match status {
            SandboxStatus::Provisioning => MachineState::Starting,
            SandboxStatus::Running | SandboxStatus::Idle => MachineState::Started,
            SandboxStatus::Paused | SandboxStatus::Suspended if stopped => MachineState::Stopped,
            SandboxStatus::Paused | SandboxStatus::Suspended => MachineState::Suspended,
            SandboxStatus::Terminated => MachineState::Destroyed,
            _ => MachineState::Failed,
        }
    }

    /// The sandcell status of a machine in this state.
    pub fn status(self) -> SandboxStatus {
        match self {
            MachineState::Started => SandboxStatus::Running,
            MachineState::Created | MachineState::Starting | MachineState::Replacing => {
                SandboxStatus::Provisioning
            }
            MachineState::Stopping
            | MachineState::Stopped
            | MachineState::Suspending
            | MachineState::Suspended => SandboxStatus::Paused,
            MachineState::Destroying | MachineState::Destroyed => SandboxStatus::Terminated,
            MachineState::Failed | MachineState::Settled => SandboxStatus::Failed,
        }
    }
}

/// What sandcell knows of a machine.
pub(super) fn info_of(machine: &Machine) -> Result<SandboxInfo> {
    let id = SandboxId::new(machine.id.clone()).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            format!(
                "the API reported a machine id sandcell cannot use: {:?}",
                machine.id
            ),
        )
    })?;
    let config = machine.config.clone().unwrap_or_default();
    let status = MachineState::parse(&machine.state)
        .map(MachineState::status)
        .unwrap_or(SandboxStatus::Failed);
    // The spec sandcell stored at create says the network the machine has; a machine
    // made by something else has Fly's default, the network.
    let mut spec = SandboxSpec::new(config.image);
    spec.network = config
        .metadata
        .get(SPEC_METADATA)
        .and_then(|json| serde_json::from_str::<SandboxSpec>(json).ok())
        .map_or(Network::Full, |s| s.network);
    let mut info = SandboxInfo::new(id, "remote", &spec, status);
    info.labels = config
        .metadata
        .into_iter()
        .filter(|(k, _)| k != SPEC_METADATA)
        .collect();
    if let Ok(created) = chrono::DateTime::parse_from_rfc3339(&machine.created_at) {
        info.created_at = created.with_timezone(&chrono::Utc);
    }
    info.details = crate::details_of(&[
        ("name", &machine.name),
        ("region", &machine.region),
        ("state", &machine.state),
        ("version", &machine.instance_id),
    ]);
    Ok(info)
}
