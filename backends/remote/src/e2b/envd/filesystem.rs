//! The messages of envd's `filesystem` service: entries, listings, moves, watches,
//! and the `/files` route's answers.

use serde::{Deserialize, Serialize};

use super::Empty;

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
    #[serde(default, skip_serializing_if = "super::is_zero")]
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
    #[serde(default, with = "super::int64")]
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
