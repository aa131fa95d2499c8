//! The Fly client: sandboxes as machines behind the Fly Machines API ([`FlyBackend`]),
//! the API's control plane ([`FlyMachines`]) and the machine states it reports. Against
//! sandcell-server, commands, files and archives go over sandcell's wire protocol on one
//! upgraded connection per machine; against a plain Fly endpoint, over `exec`.

mod backend;
mod config;
mod machines;
mod state;
mod wires;

pub use backend::FlyBackend;
pub use config::FlyConfig;
pub use machines::{ControlPlane, FlyMachines};
pub use state::MachineState;
