//! `SandboxSpec`: the portable, serde-friendly description of a sandbox to create.
//!
//! A spec names a template and says what the sandbox may use; each backend maps the
//! template name to its own thing (a directory, an image, a remote template id).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::path::SandboxPath;

/// What to create: a template plus environment, limits, network and mounts.
///
/// Build one with [`SandboxSpec::new`] and the `with_*` methods, or deserialize it from a
/// config file; unknown fields are rejected so typos do not pass silently.
///
/// ```
/// use sandcell::{SandboxSpec, Network};
/// use std::time::Duration;
///
/// let spec = SandboxSpec::new("python")
///     .env("PYTHONUNBUFFERED", "1")
///     .label("team", "search")
///     .network(Network::None)
///     .command_timeout(Duration::from_secs(60));
/// let json = serde_json::to_string(&spec)?;
/// let back: SandboxSpec = serde_json::from_str(&json)?;
/// assert_eq!(back, spec);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SandboxSpec {
    /// The template name, resolved by the backend (`"default"` if not set).
    #[serde(default = "default_template")]
    pub template: String,
    /// Environment variables for every command (on top of a minimal, clean base).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory for commands, relative to the workspace root.
    #[serde(
        default = "SandboxPath::root",
        skip_serializing_if = "SandboxPath::is_root"
    )]
    pub workdir: SandboxPath,
    /// Labels carried by the backend resource, used for listing and reconciliation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// Network policy.
    #[serde(default)]
    pub network: Network,
    /// Host directories made visible inside the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// The user commands run as, where the backend supports choosing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The timeout applied to commands that do not set their own.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::config::duration::option"
    )]
    pub command_timeout: Option<Duration>,
}

fn default_template() -> String {
    "default".to_owned()
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec::new(default_template())
    }
}

impl SandboxSpec {
    /// A spec for `template` with no env, labels, mounts or limits, and the backend's
    /// strictest network policy ([`Network::Default`]).
    pub fn new(template: impl Into<String>) -> Self {
        SandboxSpec {
            template: template.into(),
            env: BTreeMap::new(),
            workdir: SandboxPath::root(),
            labels: BTreeMap::new(),
            limits: Limits::default(),
            network: Network::default(),
            mounts: Vec::new(),
            user: None,
            command_timeout: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets the working directory.
    pub fn workdir(mut self, workdir: SandboxPath) -> Self {
        self.workdir = workdir;
        self
    }

    /// Sets the limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the network policy.
    pub fn network(mut self, network: Network) -> Self {
        self.network = network;
        self
    }

    /// Adds a host mount.
    pub fn mount(mut self, mount: Mount) -> Self {
        self.mounts.push(mount);
        self
    }

    /// Sets the user commands run as.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Sets the default command timeout.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = Some(timeout);
        self
    }

    /// Checks what can be checked without a backend: names, env keys, labels, mounts.
    ///
    /// Backends call this at the top of `create`, so a bad spec is an
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) before anything is made.
    pub fn validate(&self) -> Result<()> {
        if self.template.is_empty() || self.template.contains(['\0', '/']) {
            return Err(Error::invalid_input(format!(
                "invalid template name {:?}: it must be non-empty without '/' or NUL",
                self.template
            )));
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(Error::invalid_input(format!(
                    "invalid environment variable name {key:?}"
                )));
            }
        }
        for (key, value) in &self.env {
            if value.contains('\0') {
                return Err(Error::invalid_input(format!(
                    "environment variable {key} contains a NUL byte"
                )));
            }
        }
        for key in self.labels.keys() {
            if key.is_empty() || key.contains('\0') {
                return Err(Error::invalid_input(format!("invalid label name {key:?}")));
            }
        }
        if let Network::Allowlist(entries) = &self.network {
            crate::egress::Allowlist::parse(entries)?;
        }
        // A zero limit would stop the sandbox from running anything at all; it is a
        // mistake (or a probe), refused before any backend makes something of it.
        for (name, zero) in [
            ("limits.cpu_millis", self.limits.cpu_millis == Some(0)),
            ("limits.memory_bytes", self.limits.memory_bytes == Some(0)),
            ("limits.pids", self.limits.pids == Some(0)),
            ("limits.disk_bytes", self.limits.disk_bytes == Some(0)),
            ("limits.output_bytes", self.limits.output_bytes == Some(0)),
        ] {
            if zero {
                return Err(Error::invalid_input(format!(
                    "{name} must be greater than zero (leave it unset for no limit)"
                )));
            }
        }
        for mount in &self.mounts {
            if !mount.host.is_absolute() {
                return Err(Error::invalid_input(format!(
                    "mount source {} must be an absolute host path",
                    mount.host.display()
                )));
            }
            if mount.target.is_root() {
                return Err(Error::invalid_input(
                    "a mount cannot replace the workspace root",
                ));
            }
        }
        Ok(())
    }

    /// Refuses a spec that asks for what a backend with `caps` cannot honour:
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) naming the field, so
    /// nothing is silently weakened. This is the one place spec fields meet
    /// capabilities; the table on [`Capabilities`] lists which field needs which.
    ///
    /// ```
    /// use sandcell::{Capabilities, ErrorKind, Limits, SandboxSpec};
    /// let caps = Capabilities::none();
    /// assert!(SandboxSpec::new("t").check_supported(&caps).is_ok());
    /// let err = SandboxSpec::new("t")
    ///     .limits(Limits::new().pids(64))
    ///     .check_supported(&caps)
    ///     .unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Unsupported);
    /// assert!(err.to_string().contains("limits.pids"));
    /// ```
    pub fn check_supported(&self, caps: &Capabilities) -> Result<()> {
        let refuse = |field: &str, capability: &str| {
            Err(Error::unsupported(format!(
                "the spec's {field} cannot be honoured: the backend lacks Capabilities::{capability}"
            )))
        };
        match &self.network {
            Network::Default => {}
            Network::None if !caps.network_isolation => {
                return refuse("network (none)", "network_isolation")
            }
            Network::Full if !caps.network_full => return refuse("network (full)", "network_full"),
            Network::Allowlist(_) if !caps.network_allowlist => {
                return refuse("network (allowlist)", "network_allowlist")
            }
            _ => {}
        }
        if !self.mounts.is_empty() && !caps.host_mounts {
            return refuse("mounts", "host_mounts");
        }
        let limits = [
            (
                "limits.cpu_millis",
                self.limits.cpu_millis.is_some(),
                caps.cpu_limit,
                "cpu_limit",
            ),
            (
                "limits.memory_bytes",
                self.limits.memory_bytes.is_some(),
                caps.memory_limit,
                "memory_limit",
            ),
            (
                "limits.pids",
                self.limits.pids.is_some(),
                caps.pids_limit,
                "pids_limit",
            ),
            (
                "limits.disk_bytes",
                self.limits.disk_bytes.is_some(),
                caps.disk_limit,
                "disk_limit",
            ),
        ];
        for (field, asked, supported, capability) in limits {
            if asked && !supported {
                return refuse(field, capability);
            }
        }
        if self.user.is_some() && !caps.choose_user {
            return refuse("user", "choose_user");
        }
        Ok(())
    }

    /// The spec a backend with `caps` creates from: [`validate`](Self::validate)d,
    /// [`check_supported`](Self::check_supported), and with [`Network::Default`]
    /// resolved to the policy the sandbox will have. Backends call this at the top of
    /// `create` and keep the result, so what they report is what they enforce.
    pub fn prepare(&self, caps: &Capabilities) -> Result<SandboxSpec> {
        self.validate()?;
        self.check_supported(caps)?;
        let mut spec = self.clone();
        if spec.network == Network::Default {
            spec.network = caps.default_network();
        }
        Ok(spec)
    }
}

/// Network policy for a sandbox.
///
/// The default, [`Network::Default`], is the strictest policy the backend enforces
/// ([`Capabilities::default_network`](crate::Capabilities::default_network)), so the
/// default spec works on every backend and promises nothing it does not get: the
/// created sandbox's [`SandboxInfo::network`](crate::SandboxInfo::network) says which
/// policy it has. Asking for a policy by name is a demand: a backend that cannot
/// enforce it refuses the spec with `Unsupported`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "hosts")]
#[non_exhaustive]
pub enum Network {
    /// The strictest policy the backend enforces: `None` where it can cut a sandbox
    /// off the network, `Full` where it cannot.
    #[default]
    Default,
    /// No network at all (loopback only). Needs
    /// [`Capabilities::network_isolation`](crate::Capabilities::network_isolation).
    None,
    /// Unrestricted network. Needs
    /// [`Capabilities::network_full`](crate::Capabilities::network_full).
    Full,
    /// Only these hosts: names (`pypi.org`), wildcards (`*.pythonhosted.org`),
    /// addresses and ranges (`10.0.0.0/8`), each optionally with `:PORT`; the grammar
    /// and what each allows is [`egress::Allowlist`](crate::egress::Allowlist). Names
    /// are resolved by the enforcing side, never the sandbox. Needs
    /// [`Capabilities::network_allowlist`](crate::Capabilities::network_allowlist).
    Allowlist(Vec<String>),
}

impl Network {
    /// The policy's name as it appears in config files (`"default"`, `"none"`, ...).
    pub fn mode(&self) -> &'static str {
        match self {
            Network::Default => "default",
            Network::None => "none",
            Network::Full => "full",
            Network::Allowlist(_) => "allowlist",
        }
    }
}

/// A host directory made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Mount {
    /// The absolute host path.
    pub host: PathBuf,
    /// Where it appears, relative to the workspace root.
    pub target: SandboxPath,
    /// Whether the sandbox may only read it (the default).
    #[serde(default = "yes")]
    pub read_only: bool,
}

fn yes() -> bool {
    true
}

impl Mount {
    /// A read-only mount of `host` at `target` (seed 000's knowledge directory).
    pub fn read_only(host: impl Into<PathBuf>, target: SandboxPath) -> Self {
        Mount {
            host: host.into(),
            target,
            read_only: true,
        }
    }
    /// A read-write mount of `host` at `target`.
    pub fn read_write(host: impl Into<PathBuf>, target: SandboxPath) -> Self {
        Mount {
            host: host.into(),
            target,
            read_only: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn zero_limits_are_refused_naming_the_limit() {
        for (limits, name) in [
            (Limits::new().cpu_millis(0), "limits.cpu_millis"),
            (Limits::new().memory_bytes(0), "limits.memory_bytes"),
            (Limits::new().pids(0), "limits.pids"),
        ] {
            let err = SandboxSpec::new("t").limits(limits).validate().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn each_unsupported_field_is_named() {
        let caps = Capabilities::none();
        let cases = [
            (
                SandboxSpec::new("t").network(Network::None),
                "network (none)",
            ),
            (
                SandboxSpec::new("t").network(Network::Full),
                "network (full)",
            ),
            (
                SandboxSpec::new("t").network(Network::Allowlist(vec!["a".into()])),
                "network (allowlist)",
            ),
            (
                SandboxSpec::new("t")
                    .mount(Mount::read_only("/data", SandboxPath::new("d").unwrap())),
                "mounts",
            ),
            (
                SandboxSpec::new("t").limits(Limits::new().cpu_millis(500)),
                "limits.cpu_millis",
            ),
            (
                SandboxSpec::new("t").limits(Limits::new().memory_bytes(1 << 20)),
                "limits.memory_bytes",
            ),
            (
                SandboxSpec::new("t").limits(Limits::new().pids(8)),
                "limits.pids",
            ),
            (
                SandboxSpec::new("t").limits(Limits::new().disk_bytes(1 << 20)),
                "limits.disk_bytes",
            ),
            (SandboxSpec::new("t").user("nobody"), "user"),
        ];
        for (spec, field) in cases {
            let err = spec.check_supported(&caps).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unsupported, "{field}");
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
        // Output caps, env, workdir and timeouts need nothing.
        SandboxSpec::new("t")
            .limits(Limits::new().output_bytes(10))
            .env("A", "b")
            .command_timeout(Duration::from_secs(1))
            .check_supported(&caps)
            .unwrap();
    }

    #[test]
    fn prepare_resolves_the_default_network() {
        let mut caps = Capabilities::none();
        let spec = SandboxSpec::new("t");
        assert_eq!(spec.prepare(&caps).unwrap().network, Network::Full);
        caps.network_isolation = true;
        assert_eq!(spec.prepare(&caps).unwrap().network, Network::None);
        // A named policy is kept as asked.
        caps.network_full = true;
        let full = SandboxSpec::new("t").network(Network::Full);
        assert_eq!(full.prepare(&caps).unwrap().network, Network::Full);
        // Invalid specs are still InvalidInput, before any capability is looked at.
        let bad = SandboxSpec::new("").user("x");
        assert_eq!(
            bad.prepare(&caps).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn defaults_from_empty_json() {
        let spec: SandboxSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec, SandboxSpec::default());
        assert_eq!(spec.network, Network::Default);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<SandboxSpec>(r#"{"tempalte":"x"}"#).is_err());
    }

    #[test]
    fn network_and_timeout_round_trip() {
        let spec = SandboxSpec::new("t")
            .network(Network::Allowlist(vec!["pypi.org:443".into()]))
            .command_timeout(Duration::from_millis(1500));
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["network"]["mode"], "allowlist");
        assert_eq!(json["command_timeout"], 1.5);
        let back: SandboxSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn validate_rejects_bad_specs() {
        let bad = [
            SandboxSpec::new(""),
            SandboxSpec::new("a/b"),
            SandboxSpec::new("t").env("A=B", "x"),
            SandboxSpec::new("t").env("A", "x\0y"),
            SandboxSpec::new("t").network(Network::Allowlist(vec!["a.test:0".into()])),
            SandboxSpec::new("t")
                .mount(Mount::read_only("relative", SandboxPath::new("k").unwrap())),
            SandboxSpec::new("t").mount(Mount::read_only("/data", SandboxPath::root())),
        ];
        for spec in bad {
            assert_eq!(
                spec.validate().unwrap_err().kind(),
                ErrorKind::InvalidInput,
                "{spec:?}"
            );
        }
        SandboxSpec::new("t")
            .mount(Mount::read_only(
                "/data",
                SandboxPath::new("files").unwrap(),
            ))
            .validate()
            .unwrap();
    }
}
