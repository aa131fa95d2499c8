//! The envd client of one sandbox: Connect unary calls, server streams read frame by
//! frame, and `/files` downloads and uploads, each carrying the sandbox's access token
//! and routing headers.

use std::time::Duration;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Response};
use sandcell::{Error, ErrorKind, Result, SandboxId};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::envd::{self, EndStream, FrameDecoder, END_STREAM, ENVD_PORT};
use crate::http::transport_error;

/// Most bytes a unary envd answer may hold; sandcell-server answers at most 64 MiB for
/// a listing, the largest unary answer.
const MAX_UNARY_ANSWER: usize = 80 << 20;

/// Where one sandbox's envd is and how to reach it.
#[derive(Debug, Clone)]
pub(crate) struct EnvdClient {
    client: reqwest::Client,
    /// envd's base URL.
    base: String,
    /// The access token, routing headers and the call's user.
    headers: HeaderMap,
    /// The sandbox, for messages.
    id: SandboxId,
    /// The user calls act as.
    user: String,
    /// The deadline of a unary call or a download.
    deadline: Duration,
}

/// A server stream's messages as they arrive (each the JSON of one frame); it ends
/// after the end frame, with that frame's error if it carried one.
pub(crate) type Frames = BoxStream<'static, Result<Bytes>>;

fn header(value: &str, what: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(value)
        .map_err(|_| Error::invalid_input(format!("{what} is not a valid header value")))
}

impl EnvdClient {
    /// envd of sandbox `id` at `base`, opened by `token` (when the sandbox is secured),
    /// acting as `user`.
    pub(crate) fn new(
        client: reqwest::Client,
        base: String,
        id: SandboxId,
        token: Option<&str>,
        user: &str,
        deadline: Duration,
    ) -> Result<Self> {
        use base64::Engine as _;
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            let mut value = header(token, "the envd access token")?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-access-token"), value);
        }
        headers.insert(
            HeaderName::from_static("e2b-sandbox-id"),
            header(id.as_str(), "the sandbox id")?,
        );
        headers.insert(
            HeaderName::from_static("e2b-sandbox-port"),
            HeaderValue::from(ENVD_PORT),
        );
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        headers.insert(
            AUTHORIZATION,
            header(&format!("Basic {basic}"), "the user")?,
        );
        headers.insert(
            HeaderName::from_static("connect-protocol-version"),
            HeaderValue::from_static("1"),
        );
        Ok(EnvdClient {
            client,
            base: base.trim_end_matches('/').to_owned(),
            headers,
            id,
            user: user.to_owned(),
            deadline,
        })
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .headers(self.headers.clone())
    }

    /// Sends a request, answering a success response or the error an error one means.
    async fn send(
        &self,
        request: RequestBuilder,
        what: &str,
        deadline: Option<Duration>,
    ) -> Result<Response> {
        let sent = request.send();
        let outcome = match deadline {
            Some(d) => tokio::time::timeout(d, sent).await.map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("{what}: envd did not answer within {d:?}"),
                )
            })?,
            None => sent.await,
        };
        let response = outcome.map_err(|e| transport_error(what, &e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(self.error_of(what, response).await)
    }

    /// The error an envd error answer means: its Connect code (or the status's), and a
    /// gone or paused sandbox told apart from an unreachable one.
    async fn error_of(&self, what: &str, response: Response) -> Error {
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(200).collect());
        let code = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("code")?.as_str().map(str::to_owned));
        // E2B's proxy answers 502 for a sandbox that is not running.
        let kind = if status == 502 && message.contains("paused") {
            ErrorKind::InvalidState
        } else if status == 502 && message.contains("not found") {
            ErrorKind::NotFound
        } else {
            match code {
                Some(code) => envd::kind_for_code(&code),
                None => envd::kind_for_code(envd::code_for_status(status)),
            }
        };
        Error::new(kind, format!("{what} in sandbox {}: {message}", self.id))
            .set_temporary(matches!(status, 429 | 503))
    }

    /// A unary call: `POST /{service}/{method}` with `request`, answering the reply
    /// (`LimitExceeded` past [`MAX_UNARY_ANSWER`] bytes: a `ListDir` of a huge tree).
    pub(crate) async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: &str,
        request: &Req,
    ) -> Result<Resp> {
        let body = serde_json::to_vec(request)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding an envd call", e))?;
        let what = format!("envd {method}");
        let request = self
            .request(Method::POST, &format!("/{method}"))
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        let response = self.send(request, &what, Some(self.deadline)).await?;
        let read = async {
            let mut body = response.bytes_stream();
            let mut text = bytes::BytesMut::new();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| transport_error(&what, &e))?;
                if text.len() + chunk.len() > MAX_UNARY_ANSWER {
                    return Err(Error::limit_exceeded(format!(
                        "{what}: the answer is over {MAX_UNARY_ANSWER} bytes"
                    )));
                }
                text.extend_from_slice(&chunk);
            }
            Ok(text)
        };
        let text = tokio::time::timeout(self.deadline, read)
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, format!("{what}: the answer stalled")))??;
        let text: &[u8] = if text.is_empty() { b"{}" } else { &text };
        serde_json::from_slice(text).map_err(|e| {
            Error::with_source(ErrorKind::Backend, format!("{what}: a malformed answer"), e)
        })
    }

    /// A server stream: `request` framed, answering the messages. `timeout` is the
    /// call's deadline (`Connect-Timeout-Ms`), which envd applies to what it runs.
    pub(crate) async fn stream<Req: Serialize>(
        &self,
        method: &str,
        request: &Req,
        timeout: Option<Duration>,
    ) -> Result<Frames> {
        let what = format!("envd {method}");
        let body = envd::frame_of(request);
        let mut builder = self
            .request(Method::POST, &format!("/{method}"))
            .header(CONTENT_TYPE, envd::STREAM_CONTENT_TYPE)
            .header("keepalive-ping-interval", "50")
            .body(body);
        if let Some(t) = timeout {
            builder = builder.header("connect-timeout-ms", t.as_millis().max(1).to_string());
        }
        let response = self.send(builder, &what, Some(self.deadline)).await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !content_type.starts_with(envd::STREAM_CONTENT_TYPE) {
            return Err(Error::new(
                ErrorKind::Backend,
                format!("{what}: envd answered {content_type:?}, not a Connect stream"),
            ));
        }
        Ok(frames(response.bytes_stream().boxed(), what))
    }

    /// `GET /files?path=`: a whole file, read until it holds more than `max_bytes`
    /// (`LimitExceeded`), whatever the machine sends.
    pub(crate) async fn download(
        &self,
        workspace_path: &sandcell::SandboxPath,
        path: &str,
        max_bytes: u64,
    ) -> Result<Bytes> {
        let what = format!("reading {path}");
        let request = self
            .request(Method::GET, "/files")
            .query(&[("path", path), ("username", self.user())]);
        let response = self.send(request, &what, Some(self.deadline)).await?;
        let mut body = response.bytes_stream();
        let mut data = bytes::BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| transport_error(&what, &e))?;
            sandcell::raw::check_read_limit(
                workspace_path,
                (data.len() + chunk.len()) as u64,
                max_bytes,
            )?;
            data.extend_from_slice(&chunk);
        }
        Ok(data.freeze())
    }

    /// `POST /files?path=`: writes a whole file (parents made as needed).
    pub(crate) async fn upload(&self, path: &str, data: Bytes) -> Result<()> {
        let what = format!("writing {path}");
        let part = reqwest::multipart::Part::stream(data).file_name(path.to_owned());
        let form = reqwest::multipart::Form::new().part("file", part);
        let request = self
            .request(Method::POST, "/files")
            .query(&[("path", path), ("username", self.user())])
            .multipart(form);
        // An upload may take as long as its size needs: no deadline on the answer.
        self.send(request, &what, None).await.map(drop)
    }

    fn user(&self) -> &str {
        &self.user
    }

    /// The sandbox this client reaches.
    pub(crate) fn id(&self) -> &SandboxId {
        &self.id
    }
}

/// The messages of a stream's body: frames split as they arrive; the end frame's error
/// ends the stream as that error, a body cut off before the end frame as `Unavailable`.
fn frames(body: BoxStream<'static, reqwest::Result<Bytes>>, what: String) -> Frames {
    futures::stream::unfold(
        (Some(body), FrameDecoder::default(), what),
        |(body, mut decoder, what)| async move {
            let mut body = body?;
            loop {
                match decoder.next_frame() {
                    Err(e) => return Some((Err(e), (None, decoder, what))),
                    Ok(Some((flags, json))) if flags & END_STREAM != 0 => {
                        let end: EndStream = serde_json::from_slice(&json).unwrap_or_default();
                        return end
                            .error
                            .map(|error| (Err(error.into_error()), (None, decoder, what)));
                    }
                    Ok(Some((0, json))) => return Some((Ok(json), (Some(body), decoder, what))),
                    Ok(Some((flags, _))) => {
                        let e = Error::new(
                            ErrorKind::Backend,
                            format!("{what}: a frame with flags {flags:#x} (compressed?)"),
                        );
                        return Some((Err(e), (None, decoder, what)));
                    }
                    Ok(None) => {}
                }
                match body.next().await {
                    Some(Ok(chunk)) => decoder.push(&chunk),
                    Some(Err(e)) => {
                        return Some((Err(transport_error(&what, &e)), (None, decoder, what)))
                    }
                    None => {
                        let e = Error::new(
                            ErrorKind::Unavailable,
                            format!("{what}: the stream ended without its end frame"),
                        );
                        return Some((Err(e), (None, decoder, what)));
                    }
                }
            }
        },
    )
    .boxed()
}
