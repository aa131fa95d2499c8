//! `FlyConfig`: where a remote backend's API is and how to talk to it, as code
//! builds it or a config file names it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::http::{RateLimits, RetryPolicy};

/// Where the API is and how to talk to it.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FlyConfig {
    /// The API's base URL, without `/v1` (`https://api.machines.dev`,
    /// `http://127.0.0.1:7711` for a sandcell-server).
    pub url: String,
    /// The API token (`FlyV1 ...` tokens keep their scheme; others go as a bearer).
    pub token: String,
    /// The app machines are created in.
    #[serde(default = "default_app")]
    pub app: String,
    /// The region to launch in; the API picks when unset.
    #[serde(default)]
    pub region: Option<String>,
    /// The command each machine keeps running (`config.init.cmd`).
    #[serde(default = "default_keep_alive")]
    pub keep_alive: Vec<String>,
    /// `config.auto_destroy`: the provider destroys a machine whose command exits.
    #[serde(default)]
    pub auto_destroy: bool,
    /// Retries of calls that are safe to repeat.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The client-side rate limits. Unset (the default): Fly's documented limits
    /// ([`RateLimits::default`]) against a plain Fly Machines endpoint, and none against
    /// sandcell-server, which has no such limits (it enforces its tenants' quotas, and
    /// a `429` with `Retry-After` is still waited out).
    #[serde(default)]
    pub rate_limits: Option<RateLimits>,
    /// The deadline of one call, retries included (default 60 s).
    #[serde(default = "default_call_timeout", with = "sandcell::config::duration")]
    pub call_timeout: Duration,
    /// How long a new machine may take to start (default 5 min).
    #[serde(default = "default_start_timeout", with = "sandcell::config::duration")]
    pub start_timeout: Duration,
    /// On a plain Fly Machines endpoint, the directory on the machine that file paths
    /// are relative to; unset, the directory commands start in.
    #[serde(default)]
    pub workspace: Option<String>,
    /// On a plain Fly Machines endpoint, whether the workspace lives on storage that
    /// outlives a restart (a Fly volume mounted there). Fly's restart recreates a
    /// machine's root file system, so `reset` (which keeps the workspace) is offered
    /// only when this is set (default false). A sandcell server says for itself.
    #[serde(default)]
    pub workspace_survives_restart: bool,
    /// A PEM file of certificates to trust beside the system's roots: the CA (or the
    /// self-signed certificate) of a sandcell-server served over TLS with its own.
    #[serde(default)]
    pub ca_certificate: Option<std::path::PathBuf>,
}

fn default_app() -> String {
    "sandcell".to_owned()
}

fn default_keep_alive() -> Vec<String> {
    vec!["sleep".to_owned(), "infinity".to_owned()]
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_start_timeout() -> Duration {
    Duration::from_secs(300)
}

impl std::fmt::Debug for FlyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlyConfig")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .field("app", &self.app)
            .field("region", &self.region)
            .field("retry", &self.retry)
            .field("rate_limits", &self.rate_limits)
            .field("ca_certificate", &self.ca_certificate)
            .finish_non_exhaustive()
    }
}

impl FlyConfig {
    /// The API at `url` with `token`; every other setting at its default.
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Self {
        FlyConfig {
            url: url.into(),
            token: token.into(),
            app: default_app(),
            region: None,
            keep_alive: default_keep_alive(),
            auto_destroy: false,
            retry: RetryPolicy::default(),
            rate_limits: None,
            call_timeout: default_call_timeout(),
            start_timeout: default_start_timeout(),
            workspace: None,
            workspace_survives_restart: false,
            ca_certificate: None,
        }
    }

    /// Trusts the certificates in the PEM file at `path` beside the system's roots.
    pub fn ca_certificate(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.ca_certificate = Some(path.into());
        self
    }

    /// Sets the app.
    pub fn app(mut self, app: impl Into<String>) -> Self {
        self.app = app.into();
        self
    }

    /// Sets the region.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sets the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the rate limits, whatever the endpoint.
    pub fn rate_limits(mut self, limits: RateLimits) -> Self {
        self.rate_limits = Some(limits);
        self
    }

    /// Sets the deadline of one call.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets the workspace directory files over exec are relative to (plain endpoints).
    pub fn workspace(mut self, dir: impl Into<String>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// Says the workspace outlives a machine restart (a Fly volume is mounted there), so
    /// `reset` may restart the machine on a plain endpoint.
    pub fn workspace_survives_restart(mut self, survives: bool) -> Self {
        self.workspace_survives_restart = survives;
        self
    }
}
