//! The E2B control-plane client: create (resolved by a unique metadata value when its
//! answer is lost), get, list by metadata, kill, timeout, pause, connect and metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::Method;
use sandcell::{Error, ErrorKind, Result};

use super::api::{
    ConnectSandbox, NetworkConfig, NewSandbox, Sandbox, SandboxDetail, SandboxMetric,
    SandboxTimeout,
};
use crate::http::{Body, Call, Class, Http};

/// The metadata key whose unique value identifies one create, so an attempt whose
/// answer was lost can be found instead of repeated.
pub(crate) const REQUEST_METADATA: &str = "sandcell.request";

/// Most sandboxes asked for per page of a list.
const PAGE: usize = 100;

/// E2B's control plane.
#[derive(Debug, Clone)]
pub(crate) struct ApiClient {
    http: Arc<Http>,
}

fn call<'a>(method: Method, path: String, body: Body<'a>, idempotent: bool) -> Call<'a> {
    // E2B documents no per-call limits to keep to: its own answers (429 with
    // `Retry-After`) pace the client.
    Call {
        method,
        path,
        body,
        idempotent,
        class: Class::Unlimited,
        action: "e2b",
        scope: String::new(),
    }
}

fn json<T: serde::Serialize>(value: &T, what: &str) -> Result<serde_json::Value> {
    serde_json::to_value(value)
        .map_err(|e| Error::with_source(ErrorKind::Backend, format!("encoding {what}"), e))
}

/// Whether a refused create is a quota, which waiting does not lift: E2B answers a team
/// over its concurrent sandboxes `429` "... maximum number of concurrent E2B
/// sandboxes", sandcell-server a tenant over its quota `429` naming the limit.
fn is_quota(error: &Error) -> bool {
    let message = error.message();
    error.kind() == ErrorKind::Unavailable
        && (message.contains("maximum number of concurrent")
            || message.contains("has reached its limit")
            || message.contains("would exceed its limit"))
}

/// Percent-encodes `text` for a query (RFC 3986 unreserved characters kept).
pub(crate) fn encode(text: &str) -> String {
    use std::fmt::Write as _;
    text.bytes().fold(String::new(), |mut out, b| {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        out
    })
}

/// The `metadata` query value of a list, as E2B's SDKs build it: each key and value
/// percent-encoded, joined as `k=v&...`, and the whole encoded again.
pub(crate) fn metadata_query(metadata: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = metadata
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    encode(&pairs.join("&"))
}

impl ApiClient {
    pub(crate) fn new(http: Arc<Http>) -> Self {
        ApiClient { http }
    }

    /// Creates a sandbox at most once, whatever fails on the way: `body.metadata` must
    /// hold a unique [`REQUEST_METADATA`], by which an attempt whose answer was lost is
    /// looked up before another is made.
    pub(crate) async fn create(&self, body: &NewSandbox) -> Result<Sandbox> {
        let key = body
            .metadata
            .as_ref()
            .and_then(|m| m.get(REQUEST_METADATA))
            .filter(|k| !k.is_empty())
            .ok_or_else(|| Error::invalid_input("an E2B create needs a unique request key"))?
            .clone();
        let value = json(body, "a create")?;
        let mut attempt = 0u32;
        loop {
            let sent = call(
                Method::POST,
                "/sandboxes".to_owned(),
                Body::Json(&value),
                false,
            );
            let error = match self.http.json::<Sandbox>(sent).await {
                Ok(sandbox) => return Ok(sandbox),
                Err(e) if is_quota(&e) => {
                    return Err(Error::new(ErrorKind::LimitExceeded, e.message()))
                }
                Err(e) if !e.is_temporary() => return Err(e),
                Err(e) => e,
            };
            // The create may or may not have happened: look before trying again, so
            // at most one sandbox carries this key.
            tracing::debug!(%key, error = %error, "resolving an ambiguous E2B create");
            let wanted = BTreeMap::from([(REQUEST_METADATA.to_owned(), key.clone())]);
            if let Some(found) = self.list(&wanted).await?.into_iter().next() {
                return self
                    .connect(&found.sandbox_id, body.timeout.unwrap_or(300))
                    .await;
            }
            if attempt >= self.http.retry.retries {
                return Err(error.context("creating an E2B sandbox"));
            }
            tokio::time::sleep(self.http.retry.backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// One sandbox; `NotFound` once it is gone.
    pub(crate) async fn get(&self, id: &str) -> Result<SandboxDetail> {
        let path = format!("/sandboxes/{}", encode(id));
        self.http
            .json(call(Method::GET, path, Body::None, true))
            .await
    }

    /// Every running or paused sandbox whose metadata holds all of `metadata`.
    pub(crate) async fn list(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxDetail>> {
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let mut path = format!("/v2/sandboxes?state=running,paused&limit={PAGE}");
            if !metadata.is_empty() {
                path.push_str(&format!("&metadata={}", metadata_query(metadata)));
            }
            if let Some(token) = &next {
                path.push_str(&format!("&nextToken={}", encode(token)));
            }
            let response = self
                .http
                .send(call(Method::GET, path.clone(), Body::None, true))
                .await?;
            next = response
                .headers()
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            let page: Vec<SandboxDetail> = response.json().await.map_err(|e| {
                Error::with_source(
                    ErrorKind::Backend,
                    format!("GET {path}: a malformed answer"),
                    e,
                )
            })?;
            let empty = page.is_empty();
            out.extend(page);
            if next.is_none() || empty {
                return Ok(out);
            }
        }
    }

    /// Kills a sandbox; one already gone succeeds.
    pub(crate) async fn kill(&self, id: &str) -> Result<()> {
        let path = format!("/sandboxes/{}", encode(id));
        match self
            .http
            .send(call(Method::DELETE, path, Body::None, true))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The sandbox ends `seconds` from now.
    pub(crate) async fn set_timeout(&self, id: &str, seconds: u32) -> Result<()> {
        let body = json(&SandboxTimeout { timeout: seconds }, "a timeout")?;
        let path = format!("/sandboxes/{}/timeout", encode(id));
        self.http
            .send(call(Method::POST, path, Body::Json(&body), true))
            .await
            .map(drop)
    }

    /// Replaces a running sandbox's egress rules.
    pub(crate) async fn set_network(&self, id: &str, config: &NetworkConfig) -> Result<()> {
        let body = json(config, "network rules")?;
        let path = format!("/sandboxes/{}/network", encode(id));
        self.http
            .send(call(Method::PUT, path, Body::Json(&body), true))
            .await
            .map(drop)
    }

    /// Pauses a sandbox; one already paused succeeds.
    ///
    /// Never repeated after an answer that did not come: the first try may still be
    /// at work on the server, and land after the resume that follows this pause (a
    /// sandbox found paused just after it was resumed). Likewise [`connect`](Self::connect).
    pub(crate) async fn pause(&self, id: &str) -> Result<()> {
        let path = format!("/sandboxes/{}/pause", encode(id));
        match self
            .http
            .send(call(Method::POST, path, Body::None, false))
            .await
        {
            Ok(_) => Ok(()),
            // 409: paused already.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Resumes a paused sandbox (a running one is left running) and makes it live at
    /// least `seconds` from now.
    pub(crate) async fn connect(&self, id: &str, seconds: u32) -> Result<Sandbox> {
        let body = json(&ConnectSandbox { timeout: seconds }, "a connect")?;
        let path = format!("/sandboxes/{}/connect", encode(id));
        self.http
            .json(call(Method::POST, path, Body::Json(&body), false))
            .await
    }

    /// The sandbox's latest resource readings.
    pub(crate) async fn metrics(&self, id: &str) -> Result<Vec<SandboxMetric>> {
        let path = format!("/sandboxes/{}/metrics", encode(id));
        self.http
            .json(call(Method::GET, path, Body::None, true))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_encoded_as_the_sdks_do() {
        let metadata = BTreeMap::from([
            ("a b".to_owned(), "x&y=z".to_owned()),
            ("k".to_owned(), "v".to_owned()),
        ]);
        // Inner: a%20b=x%26y%3Dz&k=v; then the whole encoded once more.
        assert_eq!(metadata_query(&metadata), "a%2520b%3Dx%2526y%253Dz%26k%3Dv");
        assert_eq!(encode("run-1_x.~"), "run-1_x.~");
    }
}
