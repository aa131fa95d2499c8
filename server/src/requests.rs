//! Each request a connection serves, as the accept loop ([`super::listen`]) sees it:
//! the reading of its body bounded by
//! [`ServerConfig::body_read_timeout`](super::ServerConfig::body_read_timeout), and its
//! time in flight, from its head to the end of its response, counted so that the loop
//! can close a connection idle between requests
//! ([`ServerConfig::idle_timeout`](super::ServerConfig::idle_timeout)).
//!
//! Only the request body's reading is bounded, never a response: a command's output,
//! a watch or an archive streams for as long as it has something to send, and keeps
//! its connection busy (not idle) meanwhile.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Request, Response, StatusCode, Version};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::service::TowerToHyperService;
use sandcell::{Error, ErrorKind};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use crate::connection_shares::ConnectionOwner;

/// How much of a body must arrive for its bound to start over. A client that trickles
/// a byte now and then makes no progress by this measure, so it cannot hold a
/// connection by sending just under the bound, while a slow link (at 100 bytes a
/// second, a KiB takes 10 s of a default 30) still gets its body through.
pub(crate) const MIN_PROGRESS: usize = 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The requests in flight on one connection, and whether it has had any.
#[derive(Debug, Clone)]
pub(crate) struct InFlight(Arc<watch::Sender<Load>>);

/// What a connection is doing.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    in_flight: usize,
    /// Whether a request has begun on it yet.
    used: bool,
    /// Whether it closes once nothing is in flight (a request on it failed to
    /// authenticate).
    closing: bool,
}

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight(Arc::new(watch::channel(Load::default()).0))
    }

    /// Counts a request in flight until the guard is dropped.
    fn start(&self) -> Busy {
        self.0.send_modify(|load| {
            load.in_flight += 1;
            load.used = true;
        });
        Busy(Arc::clone(&self.0))
    }

    /// Closes the connection once nothing is in flight on it.
    fn close_when_done(&self) {
        self.0.send_modify(|load| load.closing = true);
    }

    /// Resolves once the connection is to close ([`close_when_done`](Self::close_when_done)).
    pub(crate) async fn closing(&self) {
        let mut load = self.0.subscribe();
        let _ = load.wait_for(|load| load.closing).await;
    }

    /// Resolves once no request has been in flight for `idle` on end, or, before the
    /// connection's first request, for `unused`; at once when nothing is in flight on
    /// a connection that is to close.
    pub(crate) async fn idle_for(&self, idle: Duration, unused: Duration) {
        let mut load = self.0.subscribe();
        loop {
            let now = *load.borrow_and_update();
            if now.closing && now.in_flight == 0 {
                return;
            }
            if now.in_flight > 0 {
                // The sender lives as long as `self`: this returns on a change.
                let _ = load.changed().await;
                continue;
            }
            let bound = if now.used { idle } else { unused };
            // A request began (or ended) meanwhile: look again, from then.
            if tokio::time::timeout(bound, load.changed()).await.is_err() {
                return;
            }
        }
    }
}

/// One request in flight; dropped with its response's body (or its response, where the
/// connection ends first).
#[derive(Debug)]
pub(crate) struct Busy(Arc<watch::Sender<Load>>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .send_modify(|load| load.in_flight = load.in_flight.saturating_sub(1));
    }
}

/// The router as one connection's service: each request's body bounded, each request
/// counted in flight until its response's body is done, and the connection closed
/// after a request that did not authenticate on it.
#[derive(Clone)]
pub(crate) struct Service {
    router: TowerToHyperService<Router>,
    body_read_timeout: Duration,
    in_flight: InFlight,
    /// Whose share of the connections this one counts against, once known; held here
    /// (and by the accept loop) so that it ends with the connection, whatever its
    /// requests' handlers hold.
    owner: Arc<ConnectionOwner>,
}

impl Service {
    pub(crate) fn new(
        router: Router,
        body_read_timeout: Duration,
        in_flight: InFlight,
        owner: Arc<ConnectionOwner>,
    ) -> Self {
        Service {
            router: TowerToHyperService::new(router),
            body_read_timeout,
            in_flight,
            owner,
        }
    }
}

/// `response`, telling an HTTP/1 client that the connection closes after it: a
/// connection refused its tenant's share is not kept open, idle, in the server's.
pub(crate) fn closing(mut response: axum::response::Response) -> axum::response::Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Counted>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Counted>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = self.in_flight.start();
        let stalled = Arc::new(AtomicBool::new(false));
        let http1 = request.version() <= Version::HTTP_11;
        let limit = self.body_read_timeout;
        let mut request = request.map(|body| {
            Body::new(TimedBody {
                inner: body,
                limit,
                waited: Duration::ZERO,
                waiting_since: None,
                progress: 0,
                sleep: None,
                stalled: Arc::clone(&stalled),
            })
        });
        let claim = self.owner.claim_handle();
        request.extensions_mut().insert(claim.clone());
        let in_flight = self.in_flight.clone();
        let answer = self.router.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            if !claim.keep().is_some_and(|owner| owner.is_claimed()) {
                // Nobody authenticated on this connection: it does not stay open,
                // holding one of the server's places, for a client that shows no
                // tenant (HTTP/1 is told so; HTTP/2 gets a GOAWAY once it is idle).
                in_flight.close_when_done();
                if http1 {
                    response = closing(response);
                }
            }
            // The handler saw an error where the rest of the body should have been;
            // the client is told why, and (HTTP/1) that the connection closes, since
            // the rest of its body will not be read.
            if stalled.load(Ordering::Relaxed) {
                response = stalled_response(limit, http1);
            }
            Ok(response.map(|body| Counted { body, _busy: busy }))
        })
    }
}

/// The answer to a request whose body stalled: `408`, in the API's error shape.
fn stalled_response(limit: Duration, http1: bool) -> Response<Body> {
    let error = Error::new(
        ErrorKind::Timeout,
        format!(
            "the request's body stalled: less than {MIN_PROGRESS} bytes of it came in {} s \
             of waiting",
            limit.as_secs_f64()
        ),
    );
    let mut response = super::ApiError(error).into_response();
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    if http1 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body whose reading is bounded: the time the server spends waiting on it
/// (not the time its handler spends elsewhere) may reach `limit` only until
/// [`MIN_PROGRESS`] bytes have come in, which starts the count over. Past it, the body
/// ends with an error and `stalled` is set.
struct TimedBody {
    inner: Incoming,
    limit: Duration,
    /// Time spent waiting since the count last started over, before `waiting_since`.
    waited: Duration,
    /// When the current wait for the client began.
    waiting_since: Option<Instant>,
    /// Bytes that came in since the count last started over.
    progress: usize,
    /// Made on the first wait (most bodies never wait).
    sleep: Option<Pin<Box<Sleep>>>,
    stalled: Arc<AtomicBool>,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.stalled.load(Ordering::Relaxed) {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(since) = this.waiting_since.take() {
                    this.waited += since.elapsed();
                }
                if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
                    this.progress += data.len();
                    if this.progress >= MIN_PROGRESS {
                        this.progress = 0;
                        this.waited = Duration::ZERO;
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let since = *this.waiting_since.get_or_insert_with(Instant::now);
                let deadline = since + this.limit.saturating_sub(this.waited);
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.deadline() != deadline {
                    sleep.as_mut().reset(deadline);
                }
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.stalled.store(true, Ordering::Relaxed);
                let stalled =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's body stalled");
                Poll::Ready(Some(Err(stalled.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stalled.load(Ordering::Relaxed) || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that counts its request in flight until it is done (dropped).
pub(crate) struct Counted {
    body: Body,
    _busy: Busy,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
