//! A fault-injecting HTTP/1.1 proxy for tests: it sits between a client and an upstream
//! server on loopback, records every request it sees, and per request either relays it
//! (streaming the answer), delays it, answers in the server's place, or cuts the connection.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Response bodies the proxy writes: relayed streams and its own small answers.
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the proxy does with one request.
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    /// Forward it and relay the answer.
    Pass,
    /// Close the connection without forwarding or answering (the request never reached the server).
    Reset,
    /// Forward it, let the server act on it, then close the connection without relaying the answer (an ambiguous outcome).
    ResetAfterForward,
    /// Answer this status without forwarding, with body {"error": "injected <status>"} and content-type application/json (no "kind" field: it looks like a gateway's error).
    Status(u16),
    /// Answer 429 with `Retry-After: <secs>` without forwarding.
    TooMany { retry_after_secs: u64 },
    /// Wait, then forward.
    Delay(Duration),
}

/// A request the proxy saw (whatever the fault).
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// The method, e.g. "POST".
    pub(crate) method: String,
    /// Path and query as received, e.g. "/v1/apps/a/machines?x=1".
    pub(crate) path: String,
    /// The whole request body.
    pub(crate) body: Vec<u8>,
    /// The request's Content-Type, if any.
    pub(crate) content_type: Option<String>,
    /// What was applied.
    pub(crate) fault: Fault,
}

/// A proxy on `127.0.0.1:<any port>`; dropping it stops the listener and cuts every open
/// connection (streams included).
#[derive(Debug)]
pub(crate) struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:<any port>, forwarding to `upstream` (e.g. "http://127.0.0.1:4321").
    pub(crate) async fn start(upstream: &str) -> FaultProxy {
        // No Result: a proxy that cannot start is a broken test environment, and the
        // panic message says why better than an unwrap at every call site would.
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => panic!("fault proxy: cannot bind a loopback port: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(addr) => addr,
            Err(e) => panic!("fault proxy: no local address: {e}"),
        };
        // No proxy from the environment (HTTP_PROXY would reroute loopback traffic), and
        // no redirect following: the client under test must see redirects itself.
        let client = match reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
        {
            Ok(client) => client,
            Err(e) => panic!("fault proxy: cannot build the upstream client: {e}"),
        };
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client,
            state: Mutex::new(State::default()),
            relays: Mutex::new(JoinSet::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        FaultProxy {
            addr,
            shared,
            accept,
        }
    }

    /// The proxy's base URL, "http://127.0.0.1:PORT".
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues faults for the next requests whose method equals `method` (case-insensitive; "*" matches any) and whose path contains `path_contains`; each matching request consumes the first queued fault of the first matching rule (rules checked in the order they were added; a rule whose queue is empty is skipped); requests with no matching rule are Pass.
    pub(crate) fn inject(&self, method: &str, path_contains: &str, faults: Vec<Fault>) {
        self.shared.state().rules.push(Rule {
            method: method.to_owned(),
            path_contains: path_contains.to_owned(),
            faults: faults.into(),
        });
    }

    /// Cuts every upgraded connection being relayed (both sides see it close).
    pub(crate) fn cut_upgraded(&self) {
        self.shared.relays().abort_all();
    }

    /// Drops every queued fault.
    pub(crate) fn clear(&self) {
        self.shared.state().rules.clear();
    }

    /// Every request seen so far, in arrival order.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.shared.state().seen.clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.relays().abort_all();
    }
}

/// Faults queued for the requests one filter matches.
#[derive(Debug)]
struct Rule {
    method: String,
    path_contains: String,
    faults: VecDeque<Fault>,
}

impl Rule {
    fn matches(&self, method: &str, path: &str) -> bool {
        !self.faults.is_empty()
            && (self.method == "*" || self.method.eq_ignore_ascii_case(method))
            && path.contains(&self.path_contains)
    }
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    seen: Vec<Recorded>,
}

/// What the test's handle and every connection task share.
#[derive(Debug)]
struct Shared {
    /// Base URL without a trailing slash; request paths are appended as received.
    upstream: String,
    client: reqwest::Client,
    state: Mutex<State>,
    /// Upgraded connections being relayed; aborted with the proxy.
    relays: Mutex<JoinSet<()>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; a poison error here
        // would only bury that failure under a second one.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn relays(&self) -> MutexGuard<'_, JoinSet<()>> {
        let mut relays = self.relays.lock().unwrap_or_else(PoisonError::into_inner);
        while relays.try_join_next().is_some() {}
        relays
    }

    /// Records a request and picks its fault, in one critical section so that the
    /// recorded order and the order faults are consumed in agree.
    fn admit(&self, method: &str, path: &str, body: &[u8], content_type: Option<String>) -> Fault {
        let mut state = self.state();
        let fault = state
            .rules
            .iter_mut()
            .find(|rule| rule.matches(method, path))
            .and_then(|rule| rule.faults.pop_front())
            .unwrap_or(Fault::Pass);
        state.seen.push(Recorded {
            method: method.to_owned(),
            path: path.to_owned(),
            body: body.to_vec(),
            content_type,
            fault: fault.clone(),
        });
        fault
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // The connections belong to this task's set, so aborting the task (on drop) aborts
    // them too: a long relayed stream must not outlive the proxy.
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Transient (e.g. out of descriptors): back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Reap finished connections so the set does not grow with every request.
        while connections.try_join_next().is_some() {}
        connections.spawn(serve(stream, Arc::clone(&shared)));
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let service = service_fn(move |req| handle(Arc::clone(&shared), req));
    // When the service returns Err, hyper drops the connection without writing any
    // response bytes: that is how Reset and ResetAfterForward reach the client as a
    // connection error. The error itself (ours, or a client hanging up) is of no interest.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

async fn handle(
    shared: Arc<Shared>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, BoxError> {
    // An upgrade (sandcell's wire protocol) is relayed byte for byte once both sides
    // have switched; faults apply to the request that asks for it.
    let upgrade = req
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    // Buffered whole: test bodies are small, and the recording needs the bytes anyway.
    let body = body.collect().await?.to_bytes();
    let method = parts.method.as_str().to_owned();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);

    match shared.admit(&method, &path, &body, content_type) {
        Fault::Pass => match upgrade {
            Some(client_side) => Ok(forward_upgrade(&shared, &parts, &path, client_side).await),
            None => Ok(forward(&shared, &parts, &path, body).await),
        },
        Fault::Delay(wait) => {
            tokio::time::sleep(wait).await;
            Ok(forward(&shared, &parts, &path, body).await)
        }
        Fault::Reset => Err("fault proxy: injected reset".into()),
        Fault::ResetAfterForward => {
            // Read the answer to its end so the server has finished acting on the request
            // before the client sees the connection drop (a forever-streaming endpoint
            // therefore never resets; don't aim this fault at one).
            if let Ok(answer) = send_upstream(&shared, &parts, &path, body).await {
                let _ = answer.bytes().await;
            }
            Err("fault proxy: injected reset after forwarding".into())
        }
        Fault::Status(code) => match StatusCode::from_u16(code) {
            Ok(status) => Ok(injected(status, None)),
            // A test bug; the panic message in the test output says which.
            Err(_) => panic!("fault proxy: Fault::Status({code}) is not an HTTP status"),
        },
        Fault::TooMany { retry_after_secs } => Ok(injected(
            StatusCode::TOO_MANY_REQUESTS,
            Some(retry_after_secs),
        )),
    }
}

/// Forwards and relays the answer; an unreachable upstream gets a 502, as from a real gateway.
async fn forward(shared: &Shared, parts: &Parts, path: &str, body: Bytes) -> Response<ProxyBody> {
    match send_upstream(shared, parts, path, body).await {
        Ok(answer) => relay(answer),
        Err(e) => {
            let message = format!("fault proxy: upstream unreachable: {e}");
            json_response(StatusCode::BAD_GATEWAY, &message)
        }
    }
}

/// Forwards an upgrade request; once the upstream has switched protocols, answers the
/// client the same and copies bytes both ways until either side closes.
async fn forward_upgrade(
    shared: &Arc<Shared>,
    parts: &Parts,
    path: &str,
    client_side: hyper::upgrade::OnUpgrade,
) -> Response<ProxyBody> {
    let mut headers = end_to_end(&parts.headers);
    headers.remove(header::HOST);
    for name in [header::CONNECTION, header::UPGRADE] {
        if let Some(value) = parts.headers.get(&name) {
            headers.insert(name, value.clone());
        }
    }
    let answer = shared
        .client
        .request(parts.method.clone(), format!("{}{path}", shared.upstream))
        .headers(headers)
        .send()
        .await;
    let answer = match answer {
        Ok(answer) if answer.status() == StatusCode::SWITCHING_PROTOCOLS => answer,
        Ok(answer) => return relay(answer),
        Err(e) => {
            let message = format!("fault proxy: upstream unreachable: {e}");
            return json_response(StatusCode::BAD_GATEWAY, &message);
        }
    };
    let mut response = Response::new(
        Full::new(Bytes::new())
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for name in [header::CONNECTION, header::UPGRADE] {
        if let Some(value) = answer.headers().get(&name) {
            response.headers_mut().insert(name, value.clone());
        }
    }
    shared.relays().spawn(async move {
        let (Ok(mut upstream), Ok(client)) = (answer.upgrade().await, client_side.await) else {
            return;
        };
        let mut client = TokioIo::new(client);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    });
    response
}

async fn send_upstream(
    shared: &Shared,
    parts: &Parts,
    path: &str,
    body: Bytes,
) -> reqwest::Result<reqwest::Response> {
    let mut headers = end_to_end(&parts.headers);
    // Host names the proxy, and the length is the client's framing: reqwest sets both
    // for the upstream request from its URL and the buffered body.
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    shared
        .client
        .request(parts.method.clone(), format!("{}{path}", shared.upstream))
        .headers(headers)
        .body(body)
        .send()
        .await
}

/// The upstream's answer, its body passed on frame by frame as it arrives: streaming
/// endpoints must reach the client while the server is still writing.
fn relay(answer: reqwest::Response) -> Response<ProxyBody> {
    let status = answer.status();
    let headers = end_to_end(answer.headers());
    let frames = answer
        .bytes_stream()
        .map_ok(Frame::data)
        .map_err(BoxError::from);
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The proxy's own answer, shaped like a gateway's error rather than the server's.
fn injected(status: StatusCode, retry_after_secs: Option<u64>) -> Response<ProxyBody> {
    let mut response = json_response(status, &format!("injected {}", status.as_u16()));
    if let Some(secs) = retry_after_secs {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

fn json_response(status: StatusCode, error: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({ "error": error }).to_string();
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `headers` without the hop-by-hop ones, which describe one connection and must not be
/// passed on to the next.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    // Any header named in Connection is hop-by-hop too (RFC 9110, section 7.6.1).
    let listed: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        // Header names are stored lowercase, so plain comparisons suffice.
        let name_str = name.as_str();
        let hop_by_hop = matches!(
            name_str,
            "connection" | "keep-alive" | "transfer-encoding" | "te" | "trailer" | "upgrade"
        ) || name_str.starts_with("proxy-")
            || listed.iter().any(|listed| listed == name_str);
        if !hop_by_hop {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}
