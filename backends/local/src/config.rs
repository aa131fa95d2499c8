//! Configuration of the local backend: `LocalConfig`, `Isolation`, `WorkspaceStrategy`, and
//! the builder that validates them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sandcell::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::backend::LocalBackend;

/// How strongly sandbox processes are kept apart from the host.
///
/// Chosen explicitly: a level the kernel cannot provide fails at `build()` with an error
/// naming what is missing, never a silent downgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Isolation {
    /// The explicit opt-out: processes run as the caller, with a clean environment and
    /// their own process group. Trust-based: a process can read and write anything the
    /// caller can, `~/.ssh` included, and has the host's network. File operations
    /// through the backend are still contained to the workspace.
    None,
    /// The default. Landlock (Linux 5.13+): sandbox processes may write only beneath
    /// their workspace and temp directory (plus `/dev/null` and similar), read and
    /// execute only beneath [`LocalConfig::readable`] less [`LocalConfig::hidden`] (by
    /// default the system's directories: no home directories, no `/etc/shadow`), and
    /// cannot mount, so read-only host mounts hold. A sandbox with
    /// [`Network::None`](sandcell::Network::None) (the default policy) cannot open IPv4,
    /// IPv6 or packet sockets (a seccomp filter), so it reaches neither the network nor
    /// the host's loopback services; on Linux 6.12+ it cannot reach the host's abstract
    /// Unix sockets either. Processes still share the host's users, process table and
    /// path-named Unix sockets: use [`Isolation::Namespaces`] for those.
    #[default]
    Landlock,
    /// User, mount, pid, network, IPC and UTS namespaces (via bubblewrap, one set per
    /// sandbox, joined by every command): the sandbox sees its workspace at `/workspace`,
    /// read-only system directories, its own `/tmp`, `/proc` and `/dev`, and no network
    /// unless the spec asks for `Network::Full`. Commands run without capabilities.
    Namespaces,
}

/// How a sandbox's workspace is made from its template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkspaceStrategy {
    /// Overlay where mounting works, else copy. Which one was used is in
    /// `SandboxInfo::details["workspace"]`.
    #[default]
    Auto,
    /// overlayfs: the template is a shared read-only lower layer, each sandbox has a
    /// private upper layer. O(1) in the template's size. Fails if mounting is not permitted.
    Overlay,
    /// A full copy of the template (symlinks copied as links).
    Copy,
    /// The template directory itself is the workspace: nothing is copied and every
    /// change lands in it; destroy leaves it in place. For a process that owns one
    /// directory, such as the agent `sandcell-docker` runs inside each container. Two
    /// sandboxes of one template share it, so use one sandbox per template.
    InPlace,
}

/// Serializable configuration; build a backend with [`LocalConfig::build`] or use
/// [`LocalBackend::builder`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LocalConfig {
    /// Where sandboxes live (`<root>/sandboxes/<id>`); created `0700` if missing.
    /// `build` refuses a root that is a symlink, is owned by another user or is
    /// writable by its group or others
    /// ([`ensure_private_dir`](sandcell::raw::private_dir::ensure_private_dir)).
    /// Default: `/var/lib/sandcell-local` for root, else
    /// `$XDG_STATE_HOME/sandcell-local` or `~/.local/state/sandcell-local`
    /// ([`default_dir`](sandcell::raw::private_dir::default_dir)).
    pub root: PathBuf,
    /// Template name → host directory. `"default"` maps to an empty template if unset.
    pub templates: BTreeMap<String, PathBuf>,
    /// Isolation level.
    pub isolation: Isolation,
    /// Workspace strategy.
    pub workspace: WorkspaceStrategy,
    /// Time between SIGTERM and SIGKILL when a process tree is killed (default 2 s; in
    /// config files seconds or a string such as `"500ms"`).
    #[serde(with = "sandcell::config::duration")]
    pub kill_grace: Duration,
    /// At `Isolation::Landlock`, where sandbox processes may read and execute (default:
    /// [`SYSTEM_READABLE`](crate::SYSTEM_READABLE); paths this host lacks are skipped).
    /// Add a directory here to let sandboxes run programs installed in it.
    pub readable: Vec<PathBuf>,
    /// What stays unreadable beneath `readable` at `Isolation::Landlock`, and beneath
    /// the system directories a sandbox sees at `Isolation::Namespaces` (default:
    /// [`SYSTEM_HIDDEN`](crate::SYSTEM_HIDDEN)).
    pub hidden: Vec<PathBuf>,
    /// Limits applied where a spec leaves one unset.
    pub default_limits: sandcell::Limits,
    /// Names the egress proxy of a `Network::Allowlist` sandbox resolves to these
    /// addresses instead of asking the system's resolver, as an `/etc/hosts` of its own
    /// (an internal package mirror, a test server). The addresses are checked like
    /// resolved ones: a private one needs an address rule.
    pub egress_hosts: BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Whether an allowlist may name private ranges (the host's networks: RFC 1918,
    /// unique-local, shared, multicast and reserved addresses). Off by default: such a
    /// rule is refused when a sandbox is created or its network set, and the egress
    /// proxy refuses private addresses whatever the rules (ADVERSARIAL 38). Loopback,
    /// link-local and the host's own addresses are refused either way.
    pub egress_private_ranges: bool,
    /// At `Isolation::Landlock`, whether `Network::Full` may be the host's own network
    /// (on by default): such a sandbox reaches every service of the host's, its
    /// loopback included, and every other such sandbox's listeners, and may listen on
    /// the host's ports (`publish_port`, services). Off: `network_full` and
    /// `port_exposure` are off and `Network::Full` is refused, as a server for clients
    /// it does not trust needs (ADVERSARIAL 38). At `Namespaces` a full network is the
    /// sandbox's own; at `None` nothing keeps a sandbox off the host's; unused there.
    pub share_host_network: bool,
    /// At `Isolation::Landlock` and `Isolation::Namespaces` when the backend runs as
    /// root: the unprivileged host uid (and gid) that owns every sandbox's files and
    /// runs its processes (which, at `Namespaces`, see it as their root). At
    /// `Landlock` it must be able to reach the backend's root (see
    /// [`LocalBackendBuilder::build`]), and the 65536 group ids after it are its
    /// sandboxes' (each sandbox holds one of its own, the only group that may pass
    /// through its directory, so no sandbox reaches another's files): none of them may
    /// be a group `/etc/group` names.
    /// Default 1000000000, past the subordinate id ranges a distribution hands out;
    /// must not be 0. Unused otherwise: an unprivileged backend's sandboxes are its
    /// own user, and at `Isolation::None` a root backend's commands are root.
    pub sandbox_uid: u32,
    /// A label whose value groups sandboxes for file watching: sandboxes with one value
    /// share one budget of kernel watches (16,384 distinct directories), as a server's
    /// tenants should, where by default each sandbox has its own. Without it a tenant
    /// with several sandboxes of large trees could spend the whole process's budget,
    /// and other tenants' new watches failed (FINDINGS8 T1). Sandboxes without the
    /// label keep one each. `sandcell-server` sets its tenant label.
    pub watch_budget_label: Option<String>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            root: sandcell::raw::private_dir::default_dir("sandcell-local"),
            templates: BTreeMap::new(),
            isolation: Isolation::Landlock,
            workspace: WorkspaceStrategy::Auto,
            kill_grace: Duration::from_secs(2),
            readable: crate::SYSTEM_READABLE.iter().map(PathBuf::from).collect(),
            hidden: crate::SYSTEM_HIDDEN.iter().map(PathBuf::from).collect(),
            default_limits: sandcell::Limits::default(),
            egress_hosts: BTreeMap::new(),
            egress_private_ranges: false,
            share_host_network: true,
            sandbox_uid: crate::owner::DEFAULT_ID,
            watch_budget_label: None,
        }
    }
}

impl LocalConfig {
    /// Validates the configuration and builds the backend.
    pub fn build(self) -> Result<LocalBackend> {
        LocalBackendBuilder { config: self }.build()
    }
}

/// Builds a [`LocalBackend`]; invalid settings fail at [`build`](LocalBackendBuilder::build).
#[derive(Debug, Clone, Default)]
pub struct LocalBackendBuilder {
    config: LocalConfig,
}

impl LocalBackendBuilder {
    /// Starts from [`LocalConfig::default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the directory sandboxes live in.
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.config.root = root.into();
        self
    }

    /// Registers a template directory under `name`.
    pub fn template(mut self, name: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        self.config.templates.insert(name.into(), dir.into());
        self
    }

    /// Sets the isolation level.
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.config.isolation = isolation;
        self
    }

    /// Sets the workspace strategy.
    pub fn workspace(mut self, strategy: WorkspaceStrategy) -> Self {
        self.config.workspace = strategy;
        self
    }

    /// Sets the unprivileged uid (and gid) that owns and runs sandboxes when the
    /// backend runs as root ([`LocalConfig::sandbox_uid`]).
    pub fn sandbox_uid(mut self, uid: u32) -> Self {
        self.config.sandbox_uid = uid;
        self
    }

    /// Sets the time between SIGTERM and SIGKILL when a process tree is killed.
    pub fn kill_grace(mut self, grace: Duration) -> Self {
        self.config.kill_grace = grace;
        self
    }

    /// Sets the limits applied where a spec leaves one unset.
    pub fn default_limits(mut self, limits: sandcell::Limits) -> Self {
        self.config.default_limits = limits;
        self
    }

    /// Makes the egress proxy of allowlisted sandboxes resolve `name` to `addrs`
    /// ([`LocalConfig::egress_hosts`]).
    pub fn egress_host(mut self, name: impl Into<String>, addrs: Vec<std::net::IpAddr>) -> Self {
        self.config.egress_hosts.insert(name.into(), addrs);
        self
    }

    /// Whether `Network::Full` below `Isolation::Namespaces` may be the host's own
    /// network ([`LocalConfig::share_host_network`]; on by default).
    pub fn share_host_network(mut self, shared: bool) -> Self {
        self.config.share_host_network = shared;
        self
    }

    /// Lets allowlists name private ranges ([`LocalConfig::egress_private_ranges`]).
    pub fn egress_private_ranges(mut self, allowed: bool) -> Self {
        self.config.egress_private_ranges = allowed;
        self
    }

    /// Groups sandboxes by `label` for the kernel-watch budget
    /// ([`LocalConfig::watch_budget_label`]).
    pub fn watch_budget_label(mut self, label: impl Into<String>) -> Self {
        self.config.watch_budget_label = Some(label.into());
        self
    }

    /// Sets where sandbox processes may read and execute at `Isolation::Landlock`
    /// (replacing the default).
    pub fn readable<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.config.readable = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Sets what stays unreadable beneath `readable` at `Isolation::Landlock`
    /// (replacing the default).
    pub fn hidden<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.config.hidden = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Validates everything and creates the root directory (`0700`), refusing one that
    /// another user could change ([`LocalConfig::root`]).
    ///
    /// A root backend runs commands at `Isolation::Landlock`, and its own file work at
    /// every isolation, as [`LocalConfig::sandbox_uid`], which reaches workspaces by host
    /// path: the root and its `sandboxes/` are then `0710` with that uid's group (no
    /// other user may pass), and a root it cannot reach, beneath a directory it may not
    /// search (such as `/root`, or a `0700` temporary directory), fails with
    /// `ErrorKind::PermissionDenied` naming that directory.
    pub fn build(self) -> Result<LocalBackend> {
        let mut config = self.config;
        let mut probed = crate::backend::Probed {
            owner: crate::owner::SandboxOwner::for_backend(config.isolation, config.sandbox_uid)?,
            ..Default::default()
        };
        if let (Some(owner), Isolation::Landlock) = (&probed.owner, config.isolation) {
            probed.sandbox_groups = Some(std::sync::Arc::new(
                crate::sandbox_group::SandboxGroups::after(owner.gid)?,
            ));
        }
        match config.isolation {
            Isolation::None => {}
            Isolation::Landlock => probed.landlock_abi = Some(crate::landlock::abi()?),
            Isolation::Namespaces => {
                probed.namespace_tools = Some(crate::namespace::probe(
                    &config.hidden,
                    probed.owner.clone(),
                )?)
            }
        }
        sandcell::raw::private_dir::ensure_private_dir(&config.root)
            .map_err(|e| e.context("the local backend's root"))?;
        std::fs::create_dir_all(config.root.join("sandboxes")).map_err(|e| {
            Error::io(
                format_args!("creating sandbox root {}", config.root.display()),
                e,
            )
        })?;
        let root = std::fs::canonicalize(&config.root)
            .map_err(|e| Error::io(format_args!("resolving {}", config.root.display()), e))?;
        config.root = root;

        if !config.templates.contains_key("default") {
            let empty = config.root.join("templates").join("default");
            std::fs::create_dir_all(&empty)
                .map_err(|e| Error::io(format_args!("creating {}", empty.display()), e))?;
            config.templates.insert("default".to_owned(), empty);
        }
        for (name, dir) in config.templates.iter_mut() {
            validate_template(name, dir)?;
        }
        // The backend's own file work (reads, writes, imports, exports) runs as the
        // owner where there is one, and reaches workspaces by host path, as Landlock's
        // commands do (`crate::root_dir`).
        if let Some(owner) = &probed.owner {
            crate::root_dir::open_to_owner(&config.root, owner)?;
        }
        if config.isolation == Isolation::Landlock {
            // No read rule reaches into the root, where other sandboxes live, even
            // one beneath a readable directory: its own workspace and tmp are granted
            // by their own rules. (What other users may not read beneath the readable
            // directories, the kernel keeps from a root backend's commands, which run
            // as the owner: no list of such files is needed.)
            let mut hidden = config.hidden.clone();
            hidden.push(config.root.clone());
            probed.read_rules = crate::landlock::ReadRules::new(&config.readable, &hidden);
        }
        Ok(LocalBackend::from_config(config, probed))
    }
}

fn validate_template(name: &str, dir: &mut PathBuf) -> Result<()> {
    if name.is_empty() || name.contains(['/', '\0']) {
        return Err(Error::invalid_input(format!(
            "invalid template name {name:?}"
        )));
    }
    let canonical = sandcell::raw::overlay::lower_dir(dir)
        .map_err(|e| e.context(format_args!("template {name:?}")))?;
    *dir = canonical;
    Ok(())
}
