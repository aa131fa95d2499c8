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

use std::collections::BTreeMap;

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

// --- process ---------------------------------------------------------------------

/// What to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessConfig {
    /// The program.
    pub cmd: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// A terminal.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Pty {
    /// Its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct PtySize {
    /// Columns.
    #[serde(default)]
    pub cols: u32,
    /// Rows.
    #[serde(default)]
    pub rows: u32,
}

/// `process.Process/Start`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StartRequest {
    /// What to run.
    pub process: ProcessConfig,
    /// Run it on a terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    /// A name to select it by later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Keep stdin open for `SendInput` (else it reads end of file at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// Which process: by pid or by tag.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessSelector {
    /// By pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// By tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl ProcessSelector {
    /// The process `pid`.
    pub fn pid(pid: u32) -> Self {
        ProcessSelector {
            pid: Some(pid),
            tag: None,
        }
    }
}

/// `process.Process/Connect`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectRequest {
    /// Which process.
    pub process: ProcessSelector,
}

/// `process.Process/Update`: a new terminal size.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UpdateRequest {
    /// Which process.
    pub process: ProcessSelector,
    /// The terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// Input for a process: to its stdin or typed at its terminal.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessInput {
    /// Bytes for stdin.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_base64")]
    pub stdin: Option<Bytes>,
    /// Bytes for the terminal.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_base64")]
    pub pty: Option<Bytes>,
}

/// `process.Process/SendInput`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SendInputRequest {
    /// Which process.
    pub process: ProcessSelector,
    /// What to send.
    #[serde(default)]
    pub input: ProcessInput,
}

/// `process.Process/SendSignal`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SendSignalRequest {
    /// Which process.
    pub process: ProcessSelector,
    /// The signal (`SIGNAL_SIGTERM`, `SIGNAL_SIGKILL`, or its number).
    #[serde(default, with = "signal")]
    pub signal: i32,
}

/// `process.Process/CloseStdin`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CloseStdinRequest {
    /// Which process.
    pub process: ProcessSelector,
}

/// One running process in `process.Process/List`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessInfo {
    /// What it runs.
    pub config: ProcessConfig,
    /// Its pid.
    pub pid: u32,
    /// Its tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.Process/List`'s answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListResponse {
    /// The running processes.
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
}

/// One message of `Start`'s and `Connect`'s streams.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessStreamMessage {
    /// What happened.
    #[serde(default)]
    pub event: ProcessEvent,
}

/// What happened to a process: exactly one field is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessEvent {
    /// It started, with this pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartEvent>,
    /// It wrote output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataEvent>,
    /// It ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<EndEvent>,
    /// Nothing; the stream is alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Empty>,
}

/// An empty message.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Empty {}

/// A process started.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct StartEvent {
    /// Its pid.
    #[serde(default)]
    pub pid: u32,
}

/// Output: exactly one field is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DataEvent {
    /// Stdout bytes.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_base64")]
    pub stdout: Option<Bytes>,
    /// Stderr bytes.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_base64")]
    pub stderr: Option<Bytes>,
    /// Terminal bytes.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_base64")]
    pub pty: Option<Bytes>,
}

/// A process ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EndEvent {
    /// Its exit code (`-1` when a signal ended it).
    #[serde(rename = "exitCode", alias = "exit_code", default)]
    pub exit_code: i32,
    /// Whether it exited (rather than being killed by a signal).
    #[serde(default)]
    pub exited: bool,
    /// `exit status N` or `signal: NAME`.
    #[serde(default)]
    pub status: String,
    /// Why it could not run, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ProcessStreamMessage {
    /// A `start` event.
    pub fn start(pid: u32) -> Self {
        Self::of(ProcessEvent {
            start: Some(StartEvent { pid }),
            ..ProcessEvent::default()
        })
    }

    /// A `data` event.
    pub fn data(data: DataEvent) -> Self {
        Self::of(ProcessEvent {
            data: Some(data),
            ..ProcessEvent::default()
        })
    }

    /// An `end` event.
    pub fn end(end: EndEvent) -> Self {
        Self::of(ProcessEvent {
            end: Some(end),
            ..ProcessEvent::default()
        })
    }

    /// A `keepalive` event.
    pub fn keepalive() -> Self {
        Self::of(ProcessEvent {
            keepalive: Some(Empty {}),
            ..ProcessEvent::default()
        })
    }

    fn of(event: ProcessEvent) -> Self {
        ProcessStreamMessage { event }
    }
}

// --- filesystem ------------------------------------------------------------------

/// A path, for `Stat`, `MakeDir` and `Remove`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PathRequest {
    /// The path.
    pub path: String,
}

/// `filesystem.Filesystem/ListDir`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListDirRequest {
    /// The directory.
    pub path: String,
    /// How many levels to list (0 or 1: the directory's own entries).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
}

/// `filesystem.Filesystem/Move`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MoveRequest {
    /// From.
    pub source: String,
    /// To.
    pub destination: String,
}

/// `WatchDir` and `CreateWatcher`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WatchDirRequest {
    /// The directory.
    pub path: String,
    /// Watch every directory beneath it too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recursive: bool,
    /// Carry each entry's info in its events.
    #[serde(
        rename = "includeEntry",
        alias = "include_entry",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub include_entry: bool,
}

/// A watcher's id, for `GetWatcherEvents` and `RemoveWatcher`, and `CreateWatcher`'s
/// answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WatcherId {
    /// The id.
    #[serde(rename = "watcherId", alias = "watcher_id")]
    pub watcher_id: String,
}

/// An answer carrying one entry (`Stat`, `MakeDir`, `Move`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EntryResponse {
    /// The entry.
    pub entry: EntryInfo,
}

/// `ListDir`'s answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListDirResponse {
    /// The entries.
    #[serde(default)]
    pub entries: Vec<EntryInfo>,
}

/// A file, directory or link.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EntryInfo {
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// `FILE_TYPE_FILE`, `FILE_TYPE_DIRECTORY` or `FILE_TYPE_SYMLINK`.
    #[serde(rename = "type", default)]
    pub file_type: String,
    /// Its absolute path.
    #[serde(default)]
    pub path: String,
    /// Its size in bytes.
    #[serde(default, with = "int64")]
    pub size: i64,
    /// Its mode bits.
    #[serde(default)]
    pub mode: u32,
    /// Its mode as `ls -l` shows it.
    #[serde(default)]
    pub permissions: String,
    /// Its owner.
    #[serde(default)]
    pub owner: String,
    /// Its group.
    #[serde(default)]
    pub group: String,
    /// When it was last modified (RFC 3339).
    #[serde(
        rename = "modifiedTime",
        alias = "modified_time",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_time: Option<String>,
    /// Where it points, for a link.
    #[serde(
        rename = "symlinkTarget",
        alias = "symlink_target",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub symlink_target: Option<String>,
}

/// The file types.
pub mod file_type {
    /// A regular file.
    pub const FILE: &str = "FILE_TYPE_FILE";
    /// A directory.
    pub const DIRECTORY: &str = "FILE_TYPE_DIRECTORY";
    /// A symbolic link.
    pub const SYMLINK: &str = "FILE_TYPE_SYMLINK";
}

/// The event types of a watch.
pub mod event_type {
    /// Created.
    pub const CREATE: &str = "EVENT_TYPE_CREATE";
    /// Written.
    pub const WRITE: &str = "EVENT_TYPE_WRITE";
    /// Removed.
    pub const REMOVE: &str = "EVENT_TYPE_REMOVE";
    /// Renamed (the name is the old one; a create of the new follows).
    pub const RENAME: &str = "EVENT_TYPE_RENAME";
    /// Its mode changed.
    pub const CHMOD: &str = "EVENT_TYPE_CHMOD";
}

/// A change in a watched directory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FilesystemEvent {
    /// The path, relative to the watched directory.
    pub name: String,
    /// What happened ([`event_type`]).
    #[serde(rename = "type", default)]
    pub event_type: String,
    /// The entry, when the watch asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// One message of `WatchDir`'s stream: exactly one field is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WatchDirMessage {
    /// The watch is live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Empty>,
    /// A change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemEvent>,
    /// Nothing; the stream is alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Empty>,
}

/// `GetWatcherEvents`' answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WatcherEvents {
    /// The changes since the last call.
    #[serde(default)]
    pub events: Vec<FilesystemEvent>,
}

/// An item of `GET /files`' and `POST /files`' answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WrittenEntry {
    /// Its name.
    pub name: String,
    /// `file` or `dir`.
    #[serde(rename = "type")]
    pub entry_type: String,
    /// Its absolute path.
    pub path: String,
}

/// The error body of envd's `/files` routes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FilesError {
    /// What went wrong.
    pub message: String,
    /// The HTTP status, again.
    pub code: u16,
}

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
