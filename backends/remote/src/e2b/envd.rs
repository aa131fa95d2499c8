//! envd, E2B's in-sandbox daemon, as both ends speak it: the messages of its `process`
//! and `filesystem` services in protobuf's JSON mapping, and the Connect protocol's
//! framing and errors that carry them.
//!
//! Unary calls are `POST /{package.Service}/{Method}` with a JSON body and answer JSON
//! (or an error status with a [`ConnectError`] body). Server streams send one framed
//! request and answer `application/connect+json` frames: 1 flag byte, a 4-byte
//! big-endian length, JSON; the last frame has flag [`END_STREAM`] and carries
//! [`EndStream`].
//!
//! Messages are written in protobuf's canonical JSON (lowerCamelCase names, bytes as
//! base64, 64-bit integers as strings, enums by name) and read in either spelling of
//! names, numbers or strings for integers, names or numbers for enums, as protobuf's
//! own JSON parsers do.

use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use sandcell::{Error, ErrorKind};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The flag of a stream's last frame.
pub const END_STREAM: u8 = 0x02;
/// The content type of Connect streams in JSON.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// The largest frame either end accepts (16 MiB): a file or output chunk is far smaller.
pub const MAX_FRAME: usize = 16 << 20;
/// The port envd listens on, which the SDKs name in `E2b-Sandbox-Port`.
pub const ENVD_PORT: u16 = 49983;

/// One Connect frame: `flags`, then `json`'s length and bytes.
pub fn frame(flags: u8, json: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + json.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(json.len()).unwrap_or(u32::MAX));
    out.put_slice(json);
    out.freeze()
}

/// A frame of `message`, serialised.
pub fn frame_of<T: Serialize>(message: &T) -> Bytes {
    frame(0, &serde_json::to_vec(message).unwrap_or_default())
}

/// Splits bytes as they arrive into Connect frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: BytesMut,
}

impl FrameDecoder {
    /// Adds bytes that arrived.
    pub fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// The next whole frame (its flags and payload), if one has arrived;
    /// `InvalidInput` for a frame over [`MAX_FRAME`].
    pub fn next_frame(&mut self) -> sandcell::Result<Option<(u8, Bytes)>> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_FRAME {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!("a Connect frame of {len} bytes is over the {MAX_FRAME}-byte limit"),
            ));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let flags = self.buffer[0];
        self.buffer.advance(5);
        Ok(Some((flags, self.buffer.split_to(len).freeze())))
    }

    /// Whether bytes of an unfinished frame are left.
    pub fn has_partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

/// A Connect error: a code by name and a message.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectError {
    /// `not_found`, `invalid_argument`, ...
    pub code: String,
    /// What went wrong.
    #[serde(default)]
    pub message: String,
}

impl ConnectError {
    /// The Connect form of a sandcell error.
    pub fn from_error(error: &Error) -> Self {
        ConnectError {
            code: code_for(error.kind()).to_owned(),
            message: error.to_string(),
        }
    }

    /// The sandcell error a Connect error means.
    pub fn into_error(self) -> Error {
        Error::new(kind_for_code(&self.code), format!("envd: {}", self.message))
    }
}

/// The last frame of a stream: no error when it ended well.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EndStream {
    /// Why the stream failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
}

/// The Connect code for an error kind.
pub fn code_for(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "not_found",
        ErrorKind::AlreadyExists => "already_exists",
        ErrorKind::Unsupported => "unimplemented",
        ErrorKind::InvalidInput => "invalid_argument",
        ErrorKind::PermissionDenied => "permission_denied",
        ErrorKind::LimitExceeded => "resource_exhausted",
        ErrorKind::Timeout => "deadline_exceeded",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::InvalidState => "failed_precondition",
        ErrorKind::Conflict => "aborted",
        ErrorKind::Corrupt => "data_loss",
        _ => "internal",
    }
}

/// The error kind a Connect code means.
pub fn kind_for_code(code: &str) -> ErrorKind {
    match code {
        "not_found" => ErrorKind::NotFound,
        "already_exists" => ErrorKind::AlreadyExists,
        "unimplemented" => ErrorKind::Unsupported,
        "invalid_argument" | "out_of_range" => ErrorKind::InvalidInput,
        "permission_denied" | "unauthenticated" => ErrorKind::PermissionDenied,
        "resource_exhausted" => ErrorKind::LimitExceeded,
        "deadline_exceeded" | "canceled" => ErrorKind::Timeout,
        "unavailable" => ErrorKind::Unavailable,
        "failed_precondition" => ErrorKind::InvalidState,
        "aborted" => ErrorKind::Conflict,
        "data_loss" => ErrorKind::Corrupt,
        _ => ErrorKind::Backend,
    }
}

/// The HTTP status a unary call answers with a Connect code (the protocol's table).
pub fn status_for_code(code: &str) -> u16 {
    match code {
        "canceled" => 499,
        "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
        "deadline_exceeded" => 504,
        "not_found" => 404,
        "already_exists" | "aborted" => 409,
        "permission_denied" => 403,
        "resource_exhausted" => 429,
        "unimplemented" => 501,
        "unavailable" => 503,
        "unauthenticated" => 401,
        _ => 500,
    }
}

/// The Connect code a unary call's bare HTTP status means (no error body).
pub fn code_for_status(status: u16) -> &'static str {
    match status {
        400 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "already_exists",
        429 | 502 | 503 | 504 => "unavailable",
        501 => "unimplemented",
        _ => "unknown",
    }
}

mod filesystem;
mod process;

pub use filesystem::*;
pub use process::*;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

mod opt_base64 {
    use super::*;

    pub(super) fn serialize<S: Serializer>(value: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| {
            decode(&t)
                .map(Bytes::from)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// Decodes base64 as protobuf's JSON parsers do: standard or URL-safe, padded or not.
pub fn decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let trimmed = text.trim_end_matches('=');
    STANDARD_NO_PAD
        .decode(trimmed)
        .or_else(|_| URL_SAFE_NO_PAD.decode(trimmed))
}

mod int64 {
    use super::*;

    pub(super) fn serialize<S: Serializer>(value: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => n
                .as_i64()
                .ok_or_else(|| serde::de::Error::custom("not a 64-bit integer")),
            serde_json::Value::String(s) => s.parse().map_err(serde::de::Error::custom),
            serde_json::Value::Null => Ok(0),
            other => Err(serde::de::Error::custom(format!("not an integer: {other}"))),
        }
    }
}

mod signal {
    use super::*;

    pub(super) fn serialize<S: Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
        match *value {
            9 => s.serialize_str("SIGNAL_SIGKILL"),
            15 => s.serialize_str("SIGNAL_SIGTERM"),
            0 => s.serialize_str("SIGNAL_UNSPECIFIED"),
            n => s.serialize_i32(n),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| serde::de::Error::custom("not a signal number")),
            serde_json::Value::String(s) => match s.as_str() {
                "SIGNAL_SIGKILL" => Ok(9),
                "SIGNAL_SIGTERM" => Ok(15),
                "SIGNAL_UNSPECIFIED" => Ok(0),
                other => other
                    .parse()
                    .map_err(|_| serde::de::Error::custom(format!("unknown signal {other:?}"))),
            },
            serde_json::Value::Null => Ok(0),
            other => Err(serde::de::Error::custom(format!("not a signal: {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut decoder = FrameDecoder::default();
        let one = frame(0, b"{\"a\":1}");
        let end = frame(END_STREAM, b"{}");
        let mut all = one.to_vec();
        all.extend_from_slice(&end);
        decoder.push(&all[..3]);
        assert_eq!(decoder.next_frame().unwrap(), None);
        decoder.push(&all[3..]);
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some((0, Bytes::from_static(b"{\"a\":1}")))
        );
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some((END_STREAM, Bytes::from_static(b"{}")))
        );
        assert!(!decoder.has_partial());
        decoder.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            decoder.next_frame().unwrap_err().kind(),
            ErrorKind::LimitExceeded
        );
    }

    #[test]
    fn messages_read_either_spelling() {
        let end: EndEvent = serde_json::from_str(r#"{"exit_code":3,"exited":true}"#).unwrap();
        assert_eq!(end.exit_code, 3);
        let entry: EntryInfo = serde_json::from_str(r#"{"size":12,"modified_time":"x"}"#).unwrap();
        assert_eq!(entry.size, 12);
        let entry: EntryInfo = serde_json::from_str(r#"{"size":"12"}"#).unwrap();
        assert_eq!(entry.size, 12);
        let signal: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":4},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(signal.signal, 9);
        let input: ProcessInput = serde_json::from_str(r#"{"stdin":"aGk"}"#).unwrap();
        assert_eq!(input.stdin.unwrap(), Bytes::from_static(b"hi"));
        let written = serde_json::to_value(EntryInfo {
            size: 5,
            ..EntryInfo::default()
        })
        .unwrap();
        assert_eq!(written["size"], "5");
    }

    #[test]
    fn every_kind_survives_a_round_trip_through_its_code() {
        for kind in ErrorKind::ALL {
            assert_eq!(kind_for_code(code_for(kind)), kind);
        }
    }
}
