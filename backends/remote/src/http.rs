//! One HTTP client for every call: auth, deadlines, retries where they are safe, the
//! client-side rate limiter, and API errors mapped to sandcell's kinds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use sandcell::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::protocol::{kind_for, ErrorBody};

/// How failed calls that are safe to repeat are retried: capped exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 3, as seed 002's client).
    pub retries: u32,
    /// The first pause (default 1 s); each next one doubles. In config files, seconds
    /// or a string such as `"500ms"` ([`sandcell::config::duration`]).
    #[serde(with = "sandcell::config::duration")]
    pub base: Duration,
    /// The longest pause (default 4 s).
    #[serde(with = "sandcell::config::duration")]
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 3,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(4),
        }
    }
}

impl RetryPolicy {
    /// `retries` retries, pausing `base`, `2 * base`, ... up to `cap`.
    pub fn new(retries: u32, base: Duration, cap: Duration) -> Self {
        RetryPolicy { retries, base, cap }
    }

    /// The pause before retry number `n` (0-based).
    pub fn backoff(&self, n: u32) -> Duration {
        self.base
            .saturating_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .min(self.cap)
    }
}

/// A token bucket: `per_second` calls on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RateLimit {
    /// Sustained calls per second; 0 (or a `burst` of 0) means no limit.
    pub per_second: f64,
    /// Calls allowed at once.
    pub burst: u32,
}

impl RateLimit {
    /// `per_second` sustained, `burst` at once.
    pub fn new(per_second: f64, burst: u32) -> Self {
        RateLimit { per_second, burst }
    }
}

/// The limits the client keeps to, per machine and action (Fly documents its limits
/// that way): mutations (create per app, start, stop, suspend, restart, destroy, exec)
/// and reads (get, list, wait).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RateLimits {
    /// Per action per machine (default 1/s, burst 3).
    pub mutations: RateLimit,
    /// Per action per machine (default 5/s, burst 10).
    pub reads: RateLimit,
}

impl RateLimits {
    /// No client-side limit at all.
    pub fn none() -> Self {
        RateLimits {
            mutations: RateLimit::new(0.0, 0),
            reads: RateLimit::new(0.0, 0),
        }
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            mutations: RateLimit::new(1.0, 3),
            reads: RateLimit::new(5.0, 10),
        }
    }
}

/// Whether a call is a read or a mutation, for the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Read,
    Mutation,
    /// sandcell-server's extensions: no documented limit to keep.
    Unlimited,
}

/// Token buckets by (action, machine).
#[derive(Debug, Default)]
struct Limiter {
    buckets: Mutex<HashMap<(String, String), (f64, Instant)>>,
}

impl Limiter {
    /// How long to wait before a call of `key` may go (and takes its token).
    fn reserve(&self, limit: RateLimit, key: (String, String)) -> Duration {
        if limit.per_second <= 0.0 || limit.burst == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut buckets = crate::lock(&self.buckets);
        let (tokens, at) = buckets.entry(key).or_insert((f64::from(limit.burst), now));
        let refilled = (*tokens
            + now.saturating_duration_since(*at).as_secs_f64() * limit.per_second)
            .min(f64::from(limit.burst));
        // Tokens may go negative: each waiter reserves its own future slot.
        *tokens = refilled - 1.0;
        *at = now;
        if *tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-*tokens / limit.per_second)
        }
    }
}

/// A call: its method, path (under the base URL), body, limiter class and key.
pub(crate) struct Call<'a> {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) body: Body<'a>,
    /// Safe to repeat: reads, deletes, and calls the server makes idempotent.
    pub(crate) idempotent: bool,
    pub(crate) class: Class,
    /// The limiter's (action, machine-or-app) key.
    pub(crate) action: &'static str,
    pub(crate) scope: String,
}

impl<'a> Call<'a> {
    /// A call to one of sandcell-server's extensions: no documented rate limit, and
    /// only reads repeat safely (a write may have landed before its answer was lost).
    pub(crate) fn extension(method: Method, path: String, body: Body<'a>) -> Self {
        let idempotent = method == Method::GET;
        Call {
            method,
            path,
            body,
            idempotent,
            class: Class::Unlimited,
            action: "sandcell",
            scope: String::new(),
        }
    }
}

/// A request body.
pub(crate) enum Body<'a> {
    None,
    Json(&'a serde_json::Value),
}

/// Resolves every host under one domain to one address (the others as the system does):
/// E2B's `{port}-{id}.{domain}` hosts on a deployment without wildcard DNS.
#[derive(Debug)]
pub(crate) struct DomainResolver {
    pub(crate) domain: String,
    pub(crate) ip: std::net::IpAddr,
}

impl reqwest::dns::Resolve for DomainResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let under = host == self.domain || host.ends_with(&format!(".{}", self.domain));
        let ip = self.ip;
        Box::pin(async move {
            if under {
                let addrs: reqwest::dns::Addrs =
                    Box::new(std::iter::once(std::net::SocketAddr::new(ip, 0)));
                return Ok(addrs);
            }
            let found: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let addrs: reqwest::dns::Addrs = Box::new(found.into_iter());
            Ok(addrs)
        })
    }
}

/// What a client keeps to besides its URL and credentials.
pub(crate) struct Settings<'a> {
    pub(crate) retry: RetryPolicy,
    pub(crate) limits: RateLimits,
    /// Every call's overall deadline, retries included.
    pub(crate) deadline: Duration,
    /// A PEM file of certificates to trust beside the system's roots.
    pub(crate) ca_certificate: Option<&'a std::path::Path>,
    /// How host names are resolved, when not by the system.
    pub(crate) resolver: Option<std::sync::Arc<DomainResolver>>,
}

/// An HTTP client trusting the system's roots and the certificates in `ca_certificate`,
/// resolving host names through `resolver` when given.
pub(crate) fn client(
    ca_certificate: Option<&std::path::Path>,
    resolver: Option<std::sync::Arc<DomainResolver>>,
) -> Result<reqwest::Client> {
    let mut client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60));
    if let Some(resolver) = resolver {
        client = client.dns_resolver(resolver);
    }
    if let Some(path) = ca_certificate {
        let unusable =
            |why: String| Error::invalid_input(format!("ca_certificate {}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| unusable(format!("cannot be read ({e})")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| unusable(format!("not PEM certificates ({e})")))?;
        if certs.is_empty() {
            return Err(unusable("holds no certificate".to_owned()));
        }
        for cert in certs {
            client = client.add_root_certificate(cert);
        }
    }
    client
        .build()
        .map_err(|e| Error::with_source(ErrorKind::Backend, "building the HTTP client", e))
}

/// The shared client.
#[derive(Debug)]
pub(crate) struct Http {
    client: reqwest::Client,
    base: String,
    auth: (HeaderName, HeaderValue),
    pub(crate) retry: RetryPolicy,
    limits: RateLimits,
    limiter: Limiter,
    /// Every call's overall deadline, retries included.
    pub(crate) deadline: Duration,
}

impl Http {
    /// The client `config` describes: its URL, token, retries, rate limits, deadline
    /// and extra trusted certificates.
    pub(crate) fn new(config: &crate::FlyConfig) -> Result<Self> {
        let token = config.token.as_str();
        // Fly's macaroon tokens travel under their own scheme; everything else is a bearer.
        let scheme = if token.starts_with("FlyV1 ") {
            token.to_owned()
        } else {
            format!("Bearer {token}")
        };
        Http::with_auth(
            &config.url,
            (AUTHORIZATION, &scheme),
            Settings {
                retry: config.retry,
                limits: config.rate_limits.unwrap_or_default(),
                deadline: config.call_timeout,
                ca_certificate: config.ca_certificate.as_deref(),
                resolver: None,
            },
        )
    }

    /// A client of `url` that authenticates with the header `auth`.
    pub(crate) fn with_auth(
        url: &str,
        auth: (HeaderName, &str),
        settings: Settings<'_>,
    ) -> Result<Self> {
        let mut value = HeaderValue::from_str(auth.1)
            .map_err(|_| Error::invalid_input("the API token is not a valid header value"))?;
        value.set_sensitive(true);
        Ok(Http {
            client: client(settings.ca_certificate, settings.resolver)?,
            base: url.trim_end_matches('/').to_owned(),
            auth: (auth.0, value),
            retry: settings.retry,
            limits: settings.limits,
            limiter: Limiter::default(),
            deadline: settings.deadline,
        })
    }

    /// Replaces the rate limits (before the client is shared).
    pub(crate) fn set_limits(&mut self, limits: RateLimits) {
        self.limits = limits;
    }

    /// The underlying client (its connection pool and trusted roots), for calls to
    /// other hosts of the same provider.
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A raw request with auth, for streaming calls that manage their own lifetime.
    pub(crate) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, self.url(path))
            .header(self.auth.0.clone(), self.auth.1.clone())
    }

    /// Sends `call`, retrying what is safe to retry until the deadline; a success status
    /// answers the response, an error status its mapped error.
    pub(crate) async fn send(&self, call: Call<'_>) -> Result<Response> {
        let deadline = Instant::now() + self.deadline;
        let limit = match call.class {
            Class::Read => Some(self.limits.reads),
            Class::Mutation => Some(self.limits.mutations),
            Class::Unlimited => None,
        };
        let what = format!("{} {}", call.method, call.path);
        let mut attempt = 0u32;
        loop {
            if let Some(limit) = limit {
                let wait = self
                    .limiter
                    .reserve(limit, (call.action.to_owned(), call.scope.clone()));
                // Not even a zero sleep: tokio's timer completes it at its next tick,
                // up to a millisecond later, which was most of a call on loopback.
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut request = self.request(call.method.clone(), &call.path);
            request = match &call.body {
                Body::None => request,
                Body::Json(value) => request.json(value),
            };
            // The deadline bounds the wait for the answer's head only: a streamed body
            // (a command's events, an archive) may take as long as it takes.
            let outcome = match tokio::time::timeout(remaining, request.send()).await {
                Ok(outcome) => outcome.map_err(|e| transport_error(&what, &e)),
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    format!("{what}: no answer within {:?}", self.deadline),
                )
                .set_temporary(true)),
            };
            let (error, retry_after) = match outcome {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    let status = response.status();
                    let retry_after = retry_after(&response);
                    let error = api_error(&what, response).await;
                    if !retryable_status(status, &error) {
                        return Err(error);
                    }
                    (error, retry_after)
                }
                Err(error) => (error, None),
            };
            if !call.idempotent || attempt >= self.retry.retries {
                return Err(error);
            }
            let pause = retry_after.unwrap_or_else(|| self.retry.backoff(attempt));
            if Instant::now() + pause >= deadline {
                return Err(error.context("no time left to retry"));
            }
            tracing::debug!(call = %what, attempt, ?pause, error = %error, "retrying");
            tokio::time::sleep(pause).await;
            attempt += 1;
        }
    }

    /// [`send`](Self::send), then the body as JSON.
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(&self, call: Call<'_>) -> Result<T> {
        let what = format!("{} {}", call.method, call.path);
        let response = self.send(call).await?;
        response.json::<T>().await.map_err(|e| {
            Error::with_source(ErrorKind::Backend, format!("{what}: a malformed answer"), e)
        })
    }
}

/// Whether an error answer may be transient: 408, 429, and 5xx that is not a
/// sandcell server's definite answer nor a capacity error.
fn retryable_status(status: StatusCode, error: &Error) -> bool {
    match status.as_u16() {
        408 | 429 => true,
        500..=599 => {
            let message = error.to_string().to_ascii_lowercase();
            error.kind() == ErrorKind::Unavailable
                || (error.kind() != ErrorKind::Unsupported
                    && !message.contains("capacity")
                    && !message.contains("insufficient")
                    && error.is_temporary())
        }
        _ => false,
    }
}

/// `Retry-After` in seconds, if the server sent one.
fn retry_after(response: &Response) -> Option<Duration> {
    response
        .headers()
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// The error an error answer carries: the sandcell kind when the server named one,
/// else the status's; the API's message.
pub(crate) async fn api_error(what: &str, response: Response) -> Error {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let mut body: ErrorBody = serde_json::from_str(&text).unwrap_or_default();
    if body.error.is_empty() {
        // E2B's APIs answer `{"code": ..., "message": ...}`.
        body.error = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_owned))
            .unwrap_or_default();
    }
    let named = body.kind.as_deref().and_then(ErrorKind::from_name);
    let kind = named.unwrap_or_else(|| kind_for(status.as_u16()));
    let message = if body.error.is_empty() {
        let snippet: String = text.chars().take(200).collect();
        format!("{status} {snippet}").trim().to_owned()
    } else {
        body.error
    };
    // A 5xx without a sandcell kind came from something in between (a proxy, a
    // gateway): worth another try when the call allows one.
    let transient = named.is_none() && status.is_server_error() || status.as_u16() == 429;
    Error::new(kind, format!("{what}: {message}")).set_temporary(transient)
}

/// A request that got no answer: unreachable, reset, or out of time.
pub(crate) fn transport_error(what: &str, e: &reqwest::Error) -> Error {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Unavailable
    };
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        source = s.source();
    }
    Error::new(kind, format!("{what}: {detail}")).set_temporary(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy::default();
        let pauses: Vec<u64> = (0..5).map(|n| policy.backoff(n).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 4, 4]);
        assert_eq!(policy.backoff(200), Duration::from_secs(4));
    }

    #[test]
    fn the_limiter_lets_a_burst_through_then_spaces_calls() {
        let limiter = Limiter::default();
        let limit = RateLimit::new(10.0, 2);
        let key = || ("start".to_owned(), "m1".to_owned());
        assert_eq!(limiter.reserve(limit, key()), Duration::ZERO);
        assert_eq!(limiter.reserve(limit, key()), Duration::ZERO);
        let third = limiter.reserve(limit, key());
        let fourth = limiter.reserve(limit, key());
        assert!(third > Duration::from_millis(80) && third <= Duration::from_millis(100));
        assert!(fourth > Duration::from_millis(180) && fourth <= Duration::from_millis(200));
        // Another machine has its own bucket.
        assert_eq!(
            limiter.reserve(limit, ("start".to_owned(), "m2".to_owned())),
            Duration::ZERO
        );
    }
}
