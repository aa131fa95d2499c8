//! The tools' arguments: their JSON Schemas, which models read, are generated from
//! these types and their doc comments.

use std::collections::BTreeMap;

use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;

/// A session's name: created on first use (from the server's template), reused after,
/// restored from its snapshot after it was suspended.
pub(crate) type Session = String;

/// Run code in a stateful interpreter.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCode {
    /// The session to run it in (any name; created on first use).
    pub(crate) session: Session,
    /// The code (a cell): its last expression's value is answered.
    pub(crate) code: String,
    /// python (the default), javascript, typescript, bash, r or java.
    #[serde(default)]
    pub(crate) language: Option<String>,
    /// Seconds after which the run is interrupted, its state kept (default 120, at
    /// most 3600).
    #[serde(default)]
    pub(crate) timeout_secs: Option<u64>,
}

/// Run a shell command.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCommand {
    /// The session to run it in (any name; created on first use).
    pub(crate) session: Session,
    /// The command line, run by `sh -c` in the session's workspace.
    pub(crate) command: String,
    /// The directory to run it in, relative to the workspace root (default: the root).
    #[serde(default)]
    pub(crate) cwd: Option<String>,
    /// Environment variables to set for this command.
    #[serde(default)]
    pub(crate) env: BTreeMap<String, String>,
    /// Seconds after which the command and everything it started are killed (default
    /// 120, at most 3600).
    #[serde(default)]
    pub(crate) timeout_secs: Option<u64>,
}

/// How file content travels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Encoding {
    /// UTF-8 text.
    #[default]
    Text,
    /// Base64 of the bytes (for binary files).
    Base64,
}

/// Read a file, whole or a byte range of it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFile {
    /// The session.
    pub(crate) session: Session,
    /// The file, relative to the workspace root.
    pub(crate) path: String,
    /// The first byte to return (default 0).
    #[serde(default)]
    pub(crate) offset: Option<u64>,
    /// How many bytes to return (default and maximum: 262144).
    #[serde(default)]
    pub(crate) length: Option<u64>,
    /// `text` (default) or `base64` for binary files.
    #[serde(default)]
    pub(crate) encoding: Encoding,
}

/// Write a whole file, creating it and its parent directories as needed.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFile {
    /// The session.
    pub(crate) session: Session,
    /// The file, relative to the workspace root.
    pub(crate) path: String,
    /// The new content (replaces what the file held).
    pub(crate) content: String,
    /// `text` (default) or `base64` when `content` is base64 of binary bytes.
    #[serde(default)]
    pub(crate) encoding: Encoding,
}

/// Replace one exact occurrence of a text in a file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EditFile {
    /// The session.
    pub(crate) session: Session,
    /// The file, relative to the workspace root.
    pub(crate) path: String,
    /// The text to replace: it must occur exactly once, whitespace included. Empty
    /// creates the file (or fills an empty one) with `new_text`.
    pub(crate) old_text: String,
    /// What replaces it.
    pub(crate) new_text: String,
}

/// List a directory.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListDirectory {
    /// The session.
    pub(crate) session: Session,
    /// The directory, relative to the workspace root (default: the root).
    #[serde(default)]
    pub(crate) path: Option<String>,
}

/// Find files by name pattern.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Glob {
    /// The session.
    pub(crate) session: Session,
    /// A glob over workspace paths, e.g. `src/**/*.rs` (`*` stays within a directory).
    pub(crate) pattern: String,
}

/// Search file contents.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Grep {
    /// The session.
    pub(crate) session: Session,
    /// A regular expression (Rust syntax), matched against each line.
    pub(crate) pattern: String,
    /// A file or directory to search, relative to the workspace root (default: all).
    #[serde(default)]
    pub(crate) path: Option<String>,
}

/// Name a session only.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionOnly {
    /// The session.
    pub(crate) session: Session,
}

/// Restore a snapshot.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Restore {
    /// The session to restore into (its current workspace is replaced).
    pub(crate) session: Session,
    /// The snapshot's id, as `snapshot` answered it.
    pub(crate) snapshot_id: String,
}

/// What releasing a session does.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Release {
    /// Leave the sandbox running, for the next call.
    Keep,
    /// Snapshot it and stop it; the next call restores it.
    Suspend,
    /// Destroy the sandbox and forget the session (its snapshots are kept).
    Destroy,
}

/// Release a session.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseSession {
    /// The session.
    pub(crate) session: Session,
    /// `keep`, `suspend` or `destroy`.
    pub(crate) mode: Release,
}

/// No arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Nothing {}
