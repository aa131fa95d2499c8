//! What a local backend can do, decided once from its configuration and what the
//! host offered when it was built.

use std::path::Path;

use sandcell::Capabilities;

use super::Probed;
use crate::cgroup::CgroupRoots;
use crate::config::{Isolation, LocalConfig, WorkspaceStrategy};
use crate::process::DEFAULT_PATH;

/// The capabilities of a backend of `config` on a host that offered `probed` and
/// `cgroups`.
pub(super) fn of(config: &LocalConfig, probed: &Probed, cgroups: &CgroupRoots) -> Capabilities {
    let on_path = |program: &str| {
        DEFAULT_PATH
            .split(':')
            .any(|dir| Path::new(dir).join(program).is_file())
    };
    let mut capabilities = Capabilities::none();
    capabilities.shell = on_path("sh");
    capabilities.python = on_path("python3");
    capabilities.pause = true;
    capabilities.reset = true;
    // Processes share the host's network stack and can listen on its ports, unless
    // they have a network namespace of their own, or (at Landlock, where the seccomp
    // filter can keep them off it) the operator does not let them share it. Without
    // isolation nothing keeps them off it.
    let host_network = match config.isolation {
        Isolation::Namespaces => false,
        Isolation::Landlock => config.share_host_network,
        Isolation::None => true,
    };
    capabilities.port_exposure = host_network;
    capabilities.symlinks = true;
    capabilities.files_while_paused = true;
    capabilities.interactive_exec = true;
    capabilities.metrics = true;
    capabilities.watch = true;
    capabilities.pty = true;
    capabilities.clone = !matches!(config.workspace, WorkspaceStrategy::InPlace);
    // Bind mounts (like overlay mounts and cgroups) need root.
    capabilities.host_mounts = rustix::process::geteuid().is_root();
    // Landlocked or capability-less namespaced processes cannot mount or remount,
    // so a read-only mount stays so.
    capabilities.read_only_mounts_enforced = matches!(
        config.isolation,
        Isolation::Landlock | Isolation::Namespaces
    );
    // Namespaces give a sandbox a network of its own; Landlock's seccomp filter
    // keeps it from opening network sockets. Without isolation it has the host's.
    capabilities.network_isolation = config.isolation != Isolation::None;
    // At Namespaces a full network is a veth and host rules only root can make
    // (see `crate::network`); sharing the host's would reach its loopback and
    // every other sandbox (ADVERSARIAL 38).
    // Below it, the host's own, where it may be shared.
    capabilities.network_full = match config.isolation {
        Isolation::Namespaces => crate::network::full_available(),
        Isolation::Landlock | Isolation::None => host_network,
    };
    // An allowlist needs a network of the sandbox's own whose only way out is the
    // egress proxy's listener, or at Landlock the kernel narrowing the host's to it:
    // Landlock's TCP rules (ABI 4) and a connect filter on the sandbox's cgroup.
    capabilities.network_allowlist = match config.isolation {
        Isolation::Namespaces => true,
        Isolation::Landlock => {
            probed.landlock_abi.is_some_and(|abi| abi >= 4)
                && cgroups.available()
                && crate::sys::connect_filters_load().is_ok()
        }
        Isolation::None => false,
    };
    capabilities.network_update = capabilities.network_allowlist;
    capabilities.incremental_snapshot = !matches!(
        config.workspace,
        WorkspaceStrategy::Copy | WorkspaceStrategy::InPlace
    );
    let limits = cgroups.enforces_limits();
    capabilities.cpu_limit = limits;
    capabilities.memory_limit = limits;
    capabilities.pids_limit = limits;
    // A file system of the sandbox's own holds what it writes (`crate::quota`); an
    // in-place workspace is the template itself, which none can hold.
    capabilities.disk_limit = !matches!(config.workspace, WorkspaceStrategy::InPlace)
        && crate::quota::probe()
            .inspect_err(|why| tracing::debug!(%why, "no disk limits"))
            .is_ok();
    capabilities
}
