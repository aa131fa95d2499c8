//! The Connect protocol's server side for envd's services: unary calls in and out,
//! server streams with keepalives and deadlines, and errors in Connect's shape.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream::{BoxStream, StreamExt};
use sandcell::{Error, ErrorKind};
use serde::de::DeserializeOwned;
use serde::Serialize;

use sandcell_remote::e2b::envd::{self, ConnectError, EndStream, FrameDecoder, END_STREAM};

/// Largest request body of a call: every envd request is a small message.
const MAX_REQUEST: usize = 1 << 20;

/// A failed call, answered in Connect's shape.
pub(crate) struct RpcError(pub(crate) Error);

impl From<Error> for RpcError {
    fn from(e: Error) -> Self {
        RpcError(e)
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        let mut body = ConnectError::from_error(&self.0);
        body.message = crate::public_message(&self.0);
        let status = StatusCode::from_u16(envd::status_for_code(&body.code))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(body)).into_response()
    }
}

pub(crate) type RpcResult<T> = Result<T, RpcError>;

/// An error of the proxy in front of envd (no such sandbox, a bad token) as a Connect
/// error with `status`.
pub(crate) fn error_response(status: StatusCode, message: &str) -> Response {
    let body = ConnectError {
        code: envd::code_for_status(status.as_u16()).to_owned(),
        message: message.to_owned(),
    };
    (status, axum::Json(body)).into_response()
}

/// A unary call's answer.
pub(crate) fn reply<T: Serialize>(message: &T) -> Response {
    axum::Json(message).into_response()
}

/// An unimplemented method.
pub(crate) fn unknown_method(service: &str, method: &str) -> RpcError {
    RpcError(Error::unsupported(format!(
        "sandcell's envd does not implement {service}/{method}"
    )))
}

/// Reads a call's request: a JSON body for unary calls, one enveloped message for
/// streams (whose body may arrive in chunks).
pub(crate) async fn message<T: DeserializeOwned>(request: Request) -> RpcResult<T> {
    let streaming = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(envd::STREAM_CONTENT_TYPE));
    let body = axum::body::to_bytes(request.into_body(), MAX_REQUEST)
        .await
        .map_err(|e| {
            Error::new(
                ErrorKind::LimitExceeded,
                format!("the request body is unreadable or over {MAX_REQUEST} bytes: {e}"),
            )
        })?;
    let json = if streaming {
        let mut decoder = FrameDecoder::default();
        decoder.push(&body);
        match decoder.next_frame()? {
            Some((0, json)) => json,
            Some((flags, _)) => {
                return Err(RpcError(Error::invalid_input(format!(
                    "the request's message has flags {flags:#x}: compression is not supported"
                ))))
            }
            None => {
                return Err(RpcError(Error::invalid_input(
                    "the request holds no whole Connect message",
                )))
            }
        }
    } else {
        body
    };
    let text: &[u8] = if json.is_empty() { b"{}" } else { &json };
    serde_json::from_slice(text)
        .map_err(|e| RpcError(Error::invalid_input(format!("a malformed request: {e}"))))
}

/// How a server stream behaves: when it sends keepalives, when its deadline passes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamTiming {
    /// Send a keepalive after this long without a message.
    pub(crate) keepalive: Duration,
    /// End the stream with `deadline_exceeded` after this long.
    pub(crate) deadline: Option<Duration>,
}

impl StreamTiming {
    /// From the call's `Keepalive-Ping-Interval` (seconds; 50 when absent) and
    /// `Connect-Timeout-Ms` headers.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let number = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        StreamTiming {
            keepalive: Duration::from_secs(number("keepalive-ping-interval").unwrap_or(50).max(1)),
            deadline: number("connect-timeout-ms")
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
        }
    }
}

/// A server stream's answer: `messages` framed, `keepalive` whenever none came for a
/// while, and the end frame: `{}` once `messages` ends, the error of its first `Err`,
/// or `deadline_exceeded` once the deadline passes.
pub(crate) fn stream<M: Serialize + Send + 'static>(
    messages: BoxStream<'static, sandcell::Result<M>>,
    keepalive: M,
    timing: StreamTiming,
) -> Response {
    let keepalive = envd::frame_of(&keepalive);
    let deadline = timing.deadline.map(|d| tokio::time::Instant::now() + d);
    let frames = futures::stream::unfold(
        (Some(messages), keepalive, timing.keepalive, deadline),
        |(messages, keepalive, every, deadline)| async move {
            let mut messages = messages?;
            let expired = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let (frame, more) = tokio::select! {
                next = messages.next() => match next {
                    Some(Ok(message)) => (envd::frame_of(&message), true),
                    Some(Err(e)) => (end_frame(Some(&e)), false),
                    None => (end_frame(None), false),
                },
                () = tokio::time::sleep(every) => (keepalive.clone(), true),
                () = expired => {
                    let e = Error::new(ErrorKind::Timeout, "the call's deadline passed");
                    (end_frame(Some(&e)), false)
                }
            };
            let rest = more.then_some(messages);
            Some((
                Ok::<Bytes, std::convert::Infallible>(frame),
                (rest, keepalive, every, deadline),
            ))
        },
    );
    let mut response = Response::new(Body::from_stream(frames));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(envd::STREAM_CONTENT_TYPE),
    );
    response
}

/// A server stream that failed before its first message: still `200`, as Connect's
/// streams always are, with the error in the end frame.
pub(crate) fn stream_error(error: &Error) -> Response {
    let mut response = Response::new(Body::from(end_frame(Some(error))));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(envd::STREAM_CONTENT_TYPE),
    );
    response
}

fn end_frame(error: Option<&Error>) -> Bytes {
    let end = EndStream {
        error: error.map(|e| ConnectError {
            message: crate::public_message(e),
            ..ConnectError::from_error(e)
        }),
    };
    envd::frame(END_STREAM, &serde_json::to_vec(&end).unwrap_or_default())
}
