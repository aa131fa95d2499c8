//! The messages of envd's `process` service: starting, connecting to and driving a
//! process, and the events of its stream.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_base64"
    )]
    pub stdin: Option<Bytes>,
    /// Bytes for the terminal.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_base64"
    )]
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
    #[serde(default, with = "super::signal")]
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_base64"
    )]
    pub stdout: Option<Bytes>,
    /// Stderr bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_base64"
    )]
    pub stderr: Option<Bytes>,
    /// Terminal bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_base64"
    )]
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
