//! Configuration of the Docker backend: `DockerConfig`, the image specs templates are
//! made from, and the builder that validates them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use sandcell::{Error, Limits, Result};
use serde::{Deserialize, Serialize};

use crate::backend::DockerBackend;

/// How a template's image is obtained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ImageSpec {
    /// A registry image.
    Pull {
        /// Reference, e.g. `python:3.12-slim`.
        reference: String,
        /// When to pull.
        #[serde(default)]
        policy: PullPolicy,
    },
    /// `docker build` of a context directory.
    Build(BuildStage),
    /// Builds in order, each stage's Dockerfile `FROM` the previous stage's tag; a stage
    /// whose `cache_key` matches the existing image's is not rebuilt. The last stage's
    /// tag is the image.
    MultiStage {
        /// The stages, base first.
        stages: Vec<BuildStage>,
    },
    /// A root file system (a directory or a tarball) through the engine's import API.
    Import {
        /// The directory or `.tar` file.
        source: PathBuf,
        /// The tag to give the image.
        tag: String,
    },
}

impl ImageSpec {
    /// A registry image, pulled if missing.
    pub fn pull(reference: impl Into<String>) -> Self {
        ImageSpec::Pull {
            reference: reference.into(),
            policy: PullPolicy::IfMissing,
        }
    }

    /// A build of `context` (with its `Dockerfile`) tagged `tag`.
    pub fn build(context: impl Into<PathBuf>, tag: impl Into<String>) -> Self {
        ImageSpec::Build(BuildStage::new(context, tag))
    }

    /// An import of a root file system directory or tarball, tagged `tag`.
    pub fn import(source: impl Into<PathBuf>, tag: impl Into<String>) -> Self {
        ImageSpec::Import {
            source: source.into(),
            tag: tag.into(),
        }
    }

    /// The image reference containers are created from.
    pub fn reference(&self) -> &str {
        match self {
            ImageSpec::Pull { reference, .. } => reference,
            ImageSpec::Build(stage) => &stage.tag,
            ImageSpec::MultiStage { stages } => stages.last().map(|s| s.tag.as_str()).unwrap_or(""),
            ImageSpec::Import { tag, .. } => tag,
        }
    }

    fn validate(&self, template: &str) -> Result<()> {
        let bad = |what: &str| {
            Err(Error::invalid_input(format!(
                "template {template:?}: {what}"
            )))
        };
        match self {
            ImageSpec::Pull { reference, .. } if reference.trim().is_empty() => {
                bad("an empty image reference")
            }
            ImageSpec::Build(stage) => stage.validate(template),
            ImageSpec::MultiStage { stages } if stages.is_empty() => bad("no build stages"),
            ImageSpec::MultiStage { stages } => {
                stages.iter().try_for_each(|s| s.validate(template))
            }
            ImageSpec::Import { tag, .. } if tag.trim().is_empty() => bad("an empty tag"),
            _ => Ok(()),
        }
    }
}

/// When a [`ImageSpec::Pull`] image is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PullPolicy {
    /// Only if the engine does not have it.
    #[default]
    IfMissing,
    /// Every time the image is prepared.
    Always,
    /// Never; a missing image is `NotFound`.
    Never,
}

/// One `docker build`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BuildStage {
    /// The build context directory.
    pub context: PathBuf,
    /// The Dockerfile, relative to the context (default `Dockerfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<PathBuf>,
    /// `--build-arg` values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub build_args: BTreeMap<String, String>,
    /// The tag of the result.
    pub tag: String,
    /// Skip the build when an image with this tag was built with this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_key: Option<String>,
}

impl BuildStage {
    /// A build of `context` tagged `tag`.
    pub fn new(context: impl Into<PathBuf>, tag: impl Into<String>) -> Self {
        BuildStage {
            context: context.into(),
            dockerfile: None,
            build_args: BTreeMap::new(),
            tag: tag.into(),
            cache_key: None,
        }
    }

    /// Uses another Dockerfile (relative to the context).
    pub fn dockerfile(mut self, path: impl Into<PathBuf>) -> Self {
        self.dockerfile = Some(path.into());
        self
    }

    /// Adds a build argument.
    pub fn build_arg(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.build_args.insert(key.into(), value.into());
        self
    }

    /// Skips the build when the tagged image was built with the same key.
    pub fn cache_key(mut self, key: impl Into<String>) -> Self {
        self.cache_key = Some(key.into());
        self
    }

    fn validate(&self, template: &str) -> Result<()> {
        if self.tag.trim().is_empty() {
            return Err(Error::invalid_input(format!(
                "template {template:?}: a build stage without a tag"
            )));
        }
        if self
            .dockerfile
            .as_ref()
            .is_some_and(|d| d.is_absolute() || d.components().any(|c| c.as_os_str() == ".."))
        {
            return Err(Error::invalid_input(format!(
                "template {template:?}: the Dockerfile path must be relative to the context"
            )));
        }
        Ok(())
    }
}

/// A sidecar: a container started beside every sandbox of a template (a database, a
/// mock API), on a private network of that sandbox, reachable from it by `hostname`,
/// created with it and destroyed with it. (A command the manager keeps running inside
/// a sandbox is a [`sandcell::services::ServiceSpec`].)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SidecarSpec {
    /// The sidecar's name, unique within the template.
    pub name: String,
    /// Its image.
    pub image: ImageSpec,
    /// The name the sandbox reaches it by (default: `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Its environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its command (default: the image's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

impl SidecarSpec {
    /// A service `name` running `image`.
    pub fn new(name: impl Into<String>, image: ImageSpec) -> Self {
        SidecarSpec {
            name: name.into(),
            image,
            hostname: None,
            env: BTreeMap::new(),
            cmd: None,
        }
    }

    /// The host name the sandbox reaches the service by.
    pub fn hostname(mut self, hostname: impl Into<String>) -> Self {
        self.hostname = Some(hostname.into());
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Overrides the image's command.
    pub fn cmd<I, S>(mut self, cmd: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.cmd = Some(cmd.into_iter().map(Into::into).collect());
        self
    }

    /// The host name.
    pub fn host(&self) -> &str {
        self.hostname.as_deref().unwrap_or(&self.name)
    }

    fn validate(&self, template: &str) -> Result<()> {
        let dns = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !s.starts_with('-')
        };
        if !dns(&self.name) || !dns(self.host()) {
            return Err(Error::invalid_input(format!(
                "template {template:?}: service {:?} needs a name and host name of letters, digits and '-'",
                self.name
            )));
        }
        self.image.validate(template)
    }
}

/// Serializable configuration; build a backend with [`DockerConfig::build`] or use
/// [`DockerBackend::builder`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DockerConfig {
    /// The engine: `unix:///path`, `tcp://host:port`; unset: `DOCKER_HOST`, then the
    /// default socket.
    pub host: Option<String>,
    /// Template name → image.
    pub templates: BTreeMap<String, ImageSpec>,
    /// Template name → sidecars started beside each of its sandboxes.
    pub sidecars: BTreeMap<String, Vec<SidecarSpec>>,
    /// Template name → a directory on the engine's host that its sandboxes' workspaces
    /// are made from: an overlay of it (shared, read-only) and a private upper layer per
    /// sandbox, mounted on this host and bind-mounted at the container's workspace.
    /// The container's user must be able to read the directory's files (and own
    /// those it changes).
    pub host_workspaces: BTreeMap<String, PathBuf>,
    /// Limits applied where a spec leaves one unset.
    pub default_limits: Limits,
    /// Unset (the default): a spec asking for `Network::Full` gets a network of its
    /// own, on a bridge this host's rules keep from the host's addresses and from
    /// every other sandbox (needs root on the engine's host, and nftables).
    ///
    /// Set: such sandboxes join this existing network instead, shared with whatever
    /// else is on it, the host's addresses reachable through its gateway. An opt-out
    /// for an operator whose network guards itself, or who accepts that.
    pub network: Option<String>,
    /// Run commands as this user (`name`, `uid` or `uid:gid`); unset: the image's user,
    /// unless that is root on an engine where root is the host's (see
    /// [`DockerConfig::allow_host_root`]).
    pub user: Option<String>,
    /// Let a sandbox's processes be uid 0 on an engine that maps a container's root to
    /// the host's root (a rootful engine without `userns-remap`). Off by default: there
    /// a container whose image's user is root runs as [`UNPRIVILEGED_USER`]
    /// (`1000000000:1000000000`) instead, and a spec, configuration or exec request
    /// naming a user that is uid 0 is refused with `PermissionDenied` (ADVERSARIAL 37).
    /// On a rootless engine, or one remapping user namespaces, a container's root is an
    /// unprivileged host uid and is allowed either way.
    ///
    /// [`UNPRIVILEGED_USER`]: crate::UNPRIVILEGED_USER
    pub allow_host_root: bool,
    /// An OCI runtime other than the engine's default, e.g. `runsc`.
    pub runtime: Option<String>,
    /// The statically linked `sandcell-agent` binary to run in each container; unset:
    /// commands go through the engine's exec API (see [`DockerBackendBuilder::from_env`]).
    pub agent: Option<PathBuf>,
    /// Where the workspace is inside the container.
    pub workspace: String,
    /// Where this backend keeps its host state: a directory per allowlisted sandbox
    /// (its egress proxy's socket, mounted into the container) and the layers of
    /// host-directory workspaces, which it mounts as root. Created `0700` if missing;
    /// `build` refuses one that is a symlink, is owned by another user or is writable
    /// by its group or others
    /// ([`ensure_private_dir`](sandcell::raw::private_dir::ensure_private_dir)), so no
    /// other local user can swap a path beneath it. Default: `/var/lib/sandcell-docker`
    /// for root, else `$XDG_STATE_HOME/sandcell-docker` or
    /// `~/.local/state/sandcell-docker`
    /// ([`default_dir`](sandcell::raw::private_dir::default_dir)).
    pub runtime_dir: PathBuf,
    /// Names the egress proxy of a `Network::Allowlist` sandbox resolves to these
    /// addresses instead of asking the system's resolver (checked like resolved ones).
    pub egress_hosts: BTreeMap<String, Vec<std::net::IpAddr>>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: None,
            templates: BTreeMap::new(),
            sidecars: BTreeMap::new(),
            host_workspaces: BTreeMap::new(),
            default_limits: Limits::default(),
            network: None,
            user: None,
            allow_host_root: false,
            runtime: None,
            agent: None,
            workspace: "/workspace".to_owned(),
            runtime_dir: sandcell::raw::private_dir::default_dir("sandcell-docker"),
            egress_hosts: BTreeMap::new(),
        }
    }
}

impl DockerConfig {
    /// Validates the configuration and connects.
    pub fn build(self) -> Result<DockerBackend> {
        DockerBackendBuilder {
            config: self,
            progress: None,
        }
        .build()
    }
}

/// One step of preparing an image, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageProgress {
    /// The image being prepared.
    pub image: String,
    /// What the engine reported (a build step, a pull status).
    pub message: String,
}

/// A callback receiving [`ImageProgress`].
pub type ProgressFn = Arc<dyn Fn(&ImageProgress) + Send + Sync>;

/// Builds a [`DockerBackend`]; invalid settings fail at [`build`](DockerBackendBuilder::build).
#[derive(Clone, Default)]
pub struct DockerBackendBuilder {
    pub(crate) config: DockerConfig,
    pub(crate) progress: Option<ProgressFn>,
}

impl std::fmt::Debug for DockerBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackendBuilder")
            .field("config", &self.config)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl DockerBackendBuilder {
    /// A builder with the default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects to this engine instead of `DOCKER_HOST` or the default socket.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.config.host = Some(host.into());
        self
    }

    /// Registers a template.
    pub fn template(mut self, name: impl Into<String>, image: ImageSpec) -> Self {
        self.config.templates.insert(name.into(), image);
        self
    }

    /// Makes the workspaces of `template`'s sandboxes from `dir` on this host instead
    /// of the image's workspace: see [`DockerConfig::host_workspaces`].
    pub fn host_workspace(mut self, template: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        self.config
            .host_workspaces
            .insert(template.into(), dir.into());
        self
    }

    /// Adds a sidecar container to every sandbox of `template`: the sandbox and its
    /// sidecars share a private network (internal unless the spec asks for
    /// `Network::Full`), are created in parallel and destroyed together.
    pub fn sidecar(mut self, template: impl Into<String>, sidecar: SidecarSpec) -> Self {
        self.config
            .sidecars
            .entry(template.into())
            .or_default()
            .push(sidecar);
        self
    }

    /// Limits for specs that leave them unset.
    pub fn default_limits(mut self, limits: Limits) -> Self {
        self.config.default_limits = limits;
        self
    }

    /// Lets `Network::Full` sandboxes share `network`, an existing network, instead of
    /// each getting a guarded one of its own: see [`DockerConfig::network`].
    pub fn network(mut self, network: impl Into<String>) -> Self {
        self.config.network = Some(network.into());
        self
    }

    /// Runs commands as this user instead of the image's.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.config.user = Some(user.into());
        self
    }

    /// Lets a sandbox's processes be the host's root where the engine makes a
    /// container's root the host's ([`DockerConfig::allow_host_root`]): the explicit
    /// opt-out of running root images as [`UNPRIVILEGED_USER`](crate::UNPRIVILEGED_USER).
    pub fn allow_host_root(mut self, allow: bool) -> Self {
        self.config.allow_host_root = allow;
        self
    }

    /// Uses another OCI runtime, e.g. `runsc` (gVisor) where installed.
    pub fn runtime(mut self, runtime: impl Into<String>) -> Self {
        self.config.runtime = Some(runtime.into());
        self
    }

    /// Makes the egress proxy of allowlisted sandboxes resolve `name` to `addrs`
    /// ([`DockerConfig::egress_hosts`]).
    pub fn egress_host(mut self, name: impl Into<String>, addrs: Vec<std::net::IpAddr>) -> Self {
        self.config.egress_hosts.insert(name.into(), addrs);
        self
    }

    /// Sets where allowlisted sandboxes' host directories live
    /// ([`DockerConfig::runtime_dir`]).
    pub fn runtime_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.runtime_dir = dir.into();
        self
    }

    /// Takes settings from the environment: the agent binary from
    /// `SANDCELL_DOCKER_AGENT` (when set and not configured already). The engine address
    /// comes from `DOCKER_HOST` whenever [`host`](Self::host) is not set.
    pub fn from_env(mut self) -> Self {
        if self.config.agent.is_none() {
            self.config.agent = std::env::var_os("SANDCELL_DOCKER_AGENT")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
        }
        self
    }

    /// The `sandcell-agent` binary to run in each container.
    pub fn agent(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.agent = Some(path.into());
        self
    }

    /// Receives image pull and build progress (also logged as tracing events).
    pub fn on_progress(
        mut self,
        progress: impl Fn(&ImageProgress) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Some(Arc::new(progress));
        self
    }

    /// Validates the configuration and sets up the engine connection. A socket that
    /// does not exist is `Unavailable` here; an engine that does not answer is
    /// `Unavailable` at the first call.
    pub fn build(mut self) -> Result<DockerBackend> {
        for (name, image) in &self.config.templates {
            sandcell::SandboxSpec::new(name.clone())
                .validate()
                .map_err(|e| e.context("template name"))?;
            image.validate(name)?;
        }
        for (template, sidecars) in &self.config.sidecars {
            if !self.config.templates.contains_key(template) {
                return Err(Error::invalid_input(format!(
                    "sidecars for template {template:?}, which is not registered"
                )));
            }
            if sidecars.len() > crate::task_network::MAX_SERVICES {
                return Err(Error::invalid_input(format!(
                    "template {template:?} has {} sidecars; a sandbox has at most {}",
                    sidecars.len(),
                    crate::task_network::MAX_SERVICES
                )));
            }
            let mut names = std::collections::BTreeSet::new();
            for sidecar in sidecars {
                sidecar.validate(template)?;
                if !names.insert(sidecar.name.as_str()) {
                    return Err(Error::invalid_input(format!(
                        "template {template:?} has two sidecars named {:?}",
                        sidecar.name
                    )));
                }
            }
        }
        for (template, dir) in &mut self.config.host_workspaces {
            if !self.config.templates.contains_key(template) {
                return Err(Error::invalid_input(format!(
                    "a host workspace for template {template:?}, which is not registered"
                )));
            }
            let canonical = sandcell::raw::overlay::lower_dir(dir)
                .map_err(|e| e.context(format_args!("host workspace of template {template:?}")))?;
            *dir = canonical;
        }
        if !self.config.workspace.starts_with('/') || self.config.workspace.contains("..") {
            return Err(Error::invalid_input(format!(
                "workspace {:?} must be an absolute path without `..`",
                self.config.workspace
            )));
        }
        sandcell::raw::private_dir::ensure_private_dir(&self.config.runtime_dir)
            .map_err(|e| e.context("the Docker backend's runtime directory"))?;
        if let Some(agent) = &self.config.agent {
            if !agent.is_file() {
                return Err(Error::invalid_input(format!(
                    "agent binary {} does not exist; build it with `cargo build --release -p sandcell-agent` (statically linked)",
                    agent.display()
                )));
            }
        }
        DockerBackend::connect(self)
    }
}
