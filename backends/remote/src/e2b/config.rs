//! [`E2bConfig`]: where E2B's control plane and envd are, how to authenticate, and what
//! every sandbox the provider creates starts with.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::RetryPolicy;

/// The E2B provider's settings, in seed 003's shape (`template`, `timeout`, `api_key`,
/// `api_url`, `metadata`, `envs`) plus how to reach envd.
///
/// Endpoints, as E2B's SDKs find them:
/// - the control plane at `api_url`, else `https://api.{domain}`;
/// - envd at `sandbox_url` for every sandbox when it is set (calls are routed by their
///   `E2b-Sandbox-Id` header: a self-hosted sandcell-server, or a local E2B), else at
///   `https://49983-{id}.{domain}`, the sandbox's own host (the domain a create
///   answers wins over this one).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct E2bConfig {
    /// The API key, sent as `X-API-KEY`.
    pub api_key: String,
    /// The control plane's URL; unset, `https://api.{domain}`.
    #[serde(default)]
    pub api_url: Option<String>,
    /// E2B's domain (default `e2b.app`).
    #[serde(default = "default_domain")]
    pub domain: String,
    /// Where envd is for every sandbox, routed by headers; unset, each sandbox's own
    /// host under the domain.
    #[serde(default)]
    pub sandbox_url: Option<String>,
    /// The address every host under `domain` resolves to, for a self-hosted endpoint
    /// without wildcard DNS (the domain then carries the port, e.g.
    /// `sandboxes.internal:7711`); unset, the system resolves them.
    #[serde(default)]
    pub domain_ip: Option<std::net::IpAddr>,
    /// The E2B template a spec asking for sandcell's `default` template gets (default
    /// `base`, E2B's own default); any other template name is passed as it is.
    #[serde(default = "default_template")]
    pub template: String,
    /// How long a sandbox lives without being extended (default 300 s, E2B's own):
    /// set at create and by every resume. The manager's idle and lifetime reaping act
    /// well within it; raise it for sessions that outlive it.
    #[serde(default = "default_timeout", with = "sandcell::config::duration")]
    pub timeout: Duration,
    /// Pause a sandbox rather than kill it when its time is up (default false).
    #[serde(default)]
    pub auto_pause: bool,
    /// Metadata every sandbox carries besides its spec's labels (which win).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Environment variables of every sandbox besides its spec's (which win).
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// The directory in the sandbox that is its workspace (default `/home/user`, E2B's
    /// home and where its commands start).
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// The user commands and file calls run as (default `user`).
    #[serde(default = "default_user")]
    pub user: String,
    /// Retries of control-plane calls that are safe to repeat.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The deadline of one call, retries included (default 60 s).
    #[serde(default = "default_call_timeout", with = "sandcell::config::duration")]
    pub call_timeout: Duration,
    /// A PEM file of certificates to trust beside the system's roots.
    #[serde(default)]
    pub ca_certificate: Option<std::path::PathBuf>,
}

fn default_domain() -> String {
    "e2b.app".to_owned()
}

fn default_template() -> String {
    "base".to_owned()
}

fn default_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_workspace() -> String {
    "/home/user".to_owned()
}

fn default_user() -> String {
    "user".to_owned()
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(60)
}

impl std::fmt::Debug for E2bConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bConfig")
            .field("api_key", &"<redacted>")
            .field("api_url", &self.api_url)
            .field("domain", &self.domain)
            .field("sandbox_url", &self.sandbox_url)
            .field("template", &self.template)
            .field("timeout", &self.timeout)
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

impl E2bConfig {
    /// E2B's cloud with `api_key`; every other setting at its default.
    pub fn new(api_key: impl Into<String>) -> Self {
        E2bConfig {
            api_key: api_key.into(),
            api_url: None,
            domain: default_domain(),
            sandbox_url: None,
            domain_ip: None,
            template: default_template(),
            timeout: default_timeout(),
            auto_pause: false,
            metadata: BTreeMap::new(),
            envs: BTreeMap::new(),
            workspace: default_workspace(),
            user: default_user(),
            retry: RetryPolicy::default(),
            call_timeout: default_call_timeout(),
            ca_certificate: None,
        }
    }

    /// A self-hosted endpoint serving both APIs at `url`, as sandcell-server does
    /// (the SDKs' `E2B_API_URL` and `E2B_SANDBOX_URL` both set to it).
    pub fn self_hosted(url: impl Into<String>, api_key: impl Into<String>) -> Self {
        let url = url.into();
        let mut config = E2bConfig::new(api_key);
        config.api_url = Some(url.clone());
        config.sandbox_url = Some(url);
        config
    }

    /// Sets the template a spec's `default` template stands for.
    pub fn template(mut self, template: impl Into<String>) -> Self {
        self.template = template.into();
        self
    }

    /// Sets how long a sandbox lives without being extended.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the retry policy of control-plane calls.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Adds metadata every sandbox carries.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Adds an environment variable every sandbox has.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(key.into(), value.into());
        self
    }

    /// The domain's host name, without a port.
    pub(crate) fn domain_host(&self) -> &str {
        self.domain.split(':').next().unwrap_or_default()
    }

    /// The control plane's base URL.
    pub(crate) fn api_base(&self) -> String {
        match &self.api_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("https://api.{}", self.domain),
        }
    }

    /// Checks what can be checked before connecting.
    pub(crate) fn check(&self) -> sandcell::Result<()> {
        let bad = |what: &str| Err(sandcell::Error::invalid_input(what.to_owned()));
        if self.api_key.trim().is_empty() {
            return bad("the E2B provider needs an API key");
        }
        for url in [self.api_url.as_deref(), self.sandbox_url.as_deref()]
            .into_iter()
            .flatten()
        {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(sandcell::Error::invalid_input(format!(
                    "the E2B URL {url:?} is not http(s)"
                )));
            }
        }
        let domain_ok = !self.domain.is_empty()
            && self
                .domain
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':');
        if !domain_ok {
            return bad("the E2B domain must be a host name");
        }
        if !self.workspace.starts_with('/') || self.workspace.contains("/../") {
            return bad("the E2B workspace must be an absolute directory");
        }
        if self.timeout.as_secs() == 0 || self.timeout.as_secs() > u64::from(u32::MAX) {
            return bad("the E2B sandbox timeout must be at least 1 s");
        }
        if self.user.is_empty() || self.user.contains(':') {
            return bad("the E2B user must be a user name");
        }
        Ok(())
    }
}
