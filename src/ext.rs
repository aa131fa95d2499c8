//! `SandboxBackendExt`: conveniences built only on the `SandboxBackend` contract.
//!
//! Implemented for every backend by a blanket impl; do not implement it yourself.
//! Because these helpers only call trait methods, they behave the same on every backend
//! and the conformance suite checks them once.

use std::path::Path;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::archive::{self, ArchiveLimits, ImportOptions};
use crate::backend::{ByteStream, SandboxBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::{ExecOutput, ExecRequest, DEFAULT_OUTPUT_LIMIT};
use crate::fs::{DirEntry, FileKind};
use crate::path::SandboxPath;
use crate::sandbox::SandboxId;

mod walk;
pub use walk::{GLOB_MAX_MATCHES, GLOB_MAX_VISITED, WALK_MAX_BYTES, WALK_MAX_ENTRIES};

/// A language [`SandboxBackendExt::execute_code`] can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Language {
    /// POSIX `sh`.
    Sh,
    /// `bash`.
    Bash,
    /// `python3`.
    Python,
    /// `node`.
    Node,
}

impl Language {
    /// The command that reads a program from stdin.
    fn argv(self) -> &'static [&'static str] {
        match self {
            Language::Sh => &["sh", "-s"],
            Language::Bash => &["bash", "-s"],
            Language::Python => &["python3", "-"],
            Language::Node => &["node", "-"],
        }
    }
}

/// One line that matched in [`SandboxBackendExt::grep`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GrepMatch {
    /// The file.
    pub path: SandboxPath,
    /// 1-based line number.
    pub line_number: usize,
    /// The line, without its line ending; its first [`GREP_MAX_LINE_BYTES`] at most.
    pub line: String,
    /// Whether `line` was cut at [`GREP_MAX_LINE_BYTES`] (at a character boundary).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub line_truncated: bool,
}

/// What [`SandboxBackendExt::grep`] found: the matches, and whether it stopped at a cap
/// ([`GREP_MAX_MATCHES`], [`GREP_MAX_BYTES`]) with files left unsearched. It derefs to
/// the matches' slice and iterates over them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GrepOutput {
    /// The matching lines, in the order [`SandboxBackendExt::walk`] visits files.
    pub matches: Vec<GrepMatch>,
    /// Whether a match was left out because a cap was reached: more lines may match
    /// than `matches` holds. Narrow the pattern or the directory to see them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl std::ops::Deref for GrepOutput {
    type Target = [GrepMatch];
    fn deref(&self) -> &[GrepMatch] {
        &self.matches
    }
}

impl IntoIterator for GrepOutput {
    type Item = GrepMatch;
    type IntoIter = std::vec::IntoIter<GrepMatch>;
    fn into_iter(self) -> Self::IntoIter {
        self.matches.into_iter()
    }
}

impl<'a> IntoIterator for &'a GrepOutput {
    type Item = &'a GrepMatch;
    type IntoIter = std::slice::Iter<'a, GrepMatch>;
    fn into_iter(self) -> Self::IntoIter {
        self.matches.iter()
    }
}

/// What [`SandboxBackendExt::edit_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EditOutcome {
    /// The file did not exist (or was empty) and now holds the new text.
    Created,
    /// The old text was replaced.
    Replaced,
}

/// Files larger than this are skipped by `grep` (agents grep source, not data dumps).
pub const GREP_MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// The most matches `grep` collects; it stops at the next one and says so
/// ([`GrepOutput::truncated`]).
pub const GREP_MAX_MATCHES: usize = 10_000;
/// The most bytes of matches `grep` collects, each counted as its path's and its
/// (possibly cut) line's length: a long path repeated in every match counts each time.
/// A match that would pass it is left out and `grep` stops ([`GrepOutput::truncated`]).
pub const GREP_MAX_BYTES: usize = 4 << 20;
/// The longest line a match keeps; longer ones are cut ([`GrepMatch::line_truncated`]).
pub const GREP_MAX_LINE_BYTES: usize = 1024;

/// Conveniences for every [`SandboxBackend`]. Do not implement: a blanket impl covers
/// every backend, including `Box<dyn SandboxBackend>`.
#[async_trait]
pub trait SandboxBackendExt: SandboxBackend {
    /// Runs a command to completion and collects its output, capped per stream at the
    /// request's `output_limit`, else the spec's `Limits::output_bytes`, else
    /// [`DEFAULT_OUTPUT_LIMIT`].
    async fn run(&self, id: &SandboxId, request: ExecRequest) -> Result<ExecOutput> {
        let requested = request.output_limit;
        let process = self.exec(id, request).await?;
        let limit = requested
            .or(process.output_limit())
            .unwrap_or(DEFAULT_OUTPUT_LIMIT);
        process.collect(limit).await
    }

    /// Runs `script` with `sh -c` and collects its output.
    async fn run_shell(&self, id: &SandboxId, script: &str) -> Result<ExecOutput> {
        self.run(id, ExecRequest::shell(script)).await
    }

    /// Runs `code` in `language`, feeding the program on stdin. Needs
    /// [`Capabilities::shell`](crate::Capabilities::shell) (and `python` for Python).
    async fn execute_code(
        &self,
        id: &SandboxId,
        language: Language,
        code: &str,
    ) -> Result<ExecOutput> {
        let caps = self.capabilities();
        let supported = match language {
            Language::Python => caps.python,
            _ => caps.shell,
        };
        if !supported {
            return Err(Error::unsupported(format!(
                "backend {} cannot run {language:?} code",
                self.name()
            )));
        }
        let request = ExecRequest::new(language.argv().iter().copied()).stdin(code.to_owned());
        self.run(id, request).await
    }

    /// Reads a file as UTF-8 text; invalid UTF-8 is `InvalidInput`.
    async fn read_to_string(&self, id: &SandboxId, path: &SandboxPath) -> Result<String> {
        let data = self.read(id, path).await?;
        String::from_utf8(data.to_vec())
            .map_err(|_| Error::invalid_input(format!("{path} is not valid UTF-8 text")))
    }

    /// Writes text to a file, creating parent directories.
    async fn write_string(&self, id: &SandboxId, path: &SandboxPath, text: &str) -> Result<()> {
        self.write(id, path, Bytes::copy_from_slice(text.as_bytes()))
            .await
    }

    /// Whether a path exists (a dangling symlink exists).
    async fn exists(&self, id: &SandboxId, path: &SandboxPath) -> Result<bool> {
        match self.stat(id, path).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Replaces the one occurrence of `old` with `new` in a text file.
    ///
    /// An empty `old` creates the file with `new` (an existing non-empty file is
    /// `AlreadyExists`). Otherwise `old` must occur exactly once: zero or several
    /// occurrences are `InvalidInput` with the count, and the file is left unchanged.
    async fn edit_file(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        old: &str,
        new: &str,
    ) -> Result<EditOutcome> {
        if old.is_empty() {
            match self.read(id, path).await {
                Ok(existing) if !existing.is_empty() => {
                    return Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!("{path} already exists and is not empty; pass the text to replace to edit it"),
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.write_string(id, path, new).await?;
            return Ok(EditOutcome::Created);
        }
        let text = self.read_to_string(id, path).await?;
        let count = text.matches(old).count();
        match count {
            1 => {
                let updated = text.replacen(old, new, 1);
                self.write_string(id, path, &updated).await?;
                Ok(EditOutcome::Replaced)
            }
            0 => Err(Error::invalid_input(format!(
                "the text to replace was not found in {path}; it must match exactly, including whitespace"
            ))),
            n => Err(Error::invalid_input(format!(
                "the text to replace occurs {n} times in {path}; include more surrounding text so it matches exactly once"
            ))),
        }
    }

    /// Every entry beneath `root`, depth first in name order. Symlinks are listed, not
    /// followed.
    ///
    /// At most [`WALK_MAX_ENTRIES`] entries and [`WALK_MAX_BYTES`] of paths: past
    /// either, `LimitExceeded` (walk a directory beneath).
    async fn walk(&self, id: &SandboxId, root: &SandboxPath) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        let mut held = 0usize;
        walk::each_entry(self, id, root, WALK_MAX_ENTRIES, |entry| {
            held += walk::entry_bytes(&entry);
            if held > WALK_MAX_BYTES {
                return Err(Error::limit_exceeded(format!(
                    "walking {root}: more than {WALK_MAX_BYTES} bytes of paths; walk a \
                     directory beneath it"
                )));
            }
            out.push(entry);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// Paths matching a glob pattern relative to the workspace root (`*.py`,
    /// `src/**/*.rs`); `*` does not cross `/`, `**` does. Sorted.
    ///
    /// Matched as the tree is walked, keeping only the matches: at most
    /// [`GLOB_MAX_MATCHES`] of them ([`WALK_MAX_BYTES`] of paths), among at most
    /// [`GLOB_MAX_VISITED`] entries; past any, `LimitExceeded` (narrow the pattern).
    async fn glob(&self, id: &SandboxId, pattern: &str) -> Result<Vec<SandboxPath>> {
        let matcher = globset::GlobBuilder::new(pattern.trim_start_matches("./"))
            .literal_separator(true)
            .build()
            .map_err(|e| Error::invalid_input(format!("invalid glob pattern {pattern:?}: {e}")))?
            .compile_matcher();
        let mut found: Vec<SandboxPath> = Vec::new();
        let mut held = 0usize;
        let root = SandboxPath::root();
        walk::each_entry(self, id, &root, GLOB_MAX_VISITED, |entry| {
            if !matcher.is_match(entry.path.as_str()) {
                return Ok(());
            }
            held += entry.path.as_str().len();
            if found.len() >= GLOB_MAX_MATCHES || held > WALK_MAX_BYTES {
                return Err(Error::limit_exceeded(format!(
                    "more than {GLOB_MAX_MATCHES} paths match {pattern:?}: narrow the pattern"
                )));
            }
            found.push(entry.path);
            Ok(())
        })
        .await?;
        found.sort();
        Ok(found)
    }

    /// Lines matching a regular expression in the files beneath `root`, in the order
    /// [`walk`](Self::walk) visits them. Binary files (containing NUL) and files over
    /// [`GREP_MAX_FILE_BYTES`] are skipped.
    ///
    /// Bounded while it collects: each line is kept up to [`GREP_MAX_LINE_BYTES`], and
    /// at [`GREP_MAX_MATCHES`] matches or [`GREP_MAX_BYTES`] of them it stops reading,
    /// with [`GrepOutput::truncated`] set.
    async fn grep(&self, id: &SandboxId, root: &SandboxPath, pattern: &str) -> Result<GrepOutput> {
        let re = regex::Regex::new(pattern).map_err(|e| {
            Error::invalid_input(format!("invalid regular expression {pattern:?}: {e}"))
        })?;
        let mut found = GrepFound::default();
        if self.stat(id, root).await?.kind == FileKind::File {
            grep_file(self, id, root, &re, &mut found).await?;
            return Ok(found.output);
        }
        // Walked as `walk` does, but a directory at a time, so a cap stops the walk too.
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = self.list_dir(id, &dir).await?;
            for entry in entries.iter().filter(|e| e.kind == FileKind::File) {
                if entry.size > GREP_MAX_FILE_BYTES {
                    continue;
                }
                if !grep_file(self, id, &entry.path, &re, &mut found).await? {
                    return Ok(found.output);
                }
            }
            stack.extend(
                entries
                    .into_iter()
                    .rev()
                    .filter(|e| e.kind == FileKind::Dir)
                    .map(|e| e.path),
            );
        }
        Ok(found.output)
    }

    /// Copies a host directory's contents into `dest` in the sandbox (merging), through
    /// `import_tar`. Symlinks on the host are copied as symlinks, never followed.
    async fn upload_dir(&self, id: &SandboxId, host_dir: &Path, dest: &SandboxPath) -> Result<()> {
        let meta = tokio::fs::metadata(host_dir)
            .await
            .map_err(|e| Error::io(format_args!("reading {}", host_dir.display()), e))?;
        if !meta.is_dir() {
            return Err(Error::invalid_input(format!(
                "{} is not a directory",
                host_dir.display()
            )));
        }
        let stream = pack_to_stream(host_dir.to_path_buf());
        self.import_tar(id, dest, stream, ImportOptions::merge())
            .await
    }

    /// Copies the sandbox directory `src` to the host directory `host_dest`, which is
    /// replaced only once everything arrived and passed the archive checks.
    async fn download_dir(
        &self,
        id: &SandboxId,
        src: &SandboxPath,
        host_dest: &Path,
    ) -> Result<()> {
        let stream = self.export_tar(id, src).await?;
        let reader = crate::raw::stream::stream_to_reader(stream);
        let dest = host_dest.to_path_buf();
        tokio::task::spawn_blocking(move || {
            archive::unpack_to_dir(reader, &dest, &ArchiveLimits::default())
        })
        .await
        .map_err(|e| Error::with_source(ErrorKind::Backend, "download task failed", e))??;
        Ok(())
    }
}

impl<T: SandboxBackend + ?Sized> SandboxBackendExt for T {}

/// What `grep` has collected so far, and the bytes it counts against [`GREP_MAX_BYTES`].
#[derive(Default)]
struct GrepFound {
    output: GrepOutput,
    bytes: usize,
}

/// Adds the matching lines of file `path` to `found`; `false` once a cap left one out
/// (`found` is then marked truncated, and the search is over).
async fn grep_file<B: SandboxBackend + ?Sized>(
    backend: &B,
    id: &SandboxId,
    path: &SandboxPath,
    re: &regex::Regex,
    found: &mut GrepFound,
) -> Result<bool> {
    let data = backend.read(id, path).await?;
    if data.contains(&0) {
        return Ok(true);
    }
    let text = String::from_utf8_lossy(&data);
    for (i, line) in text.lines().enumerate() {
        if !re.is_match(line) {
            continue;
        }
        let mut kept = line.len().min(GREP_MAX_LINE_BYTES);
        while !line.is_char_boundary(kept) {
            kept -= 1;
        }
        let bytes = found.bytes + path.as_str().len() + kept;
        if found.output.matches.len() == GREP_MAX_MATCHES || bytes > GREP_MAX_BYTES {
            found.output.truncated = true;
            return Ok(false);
        }
        found.bytes = bytes;
        found.output.matches.push(GrepMatch {
            path: path.clone(),
            line_number: i + 1,
            line: line[..kept].to_owned(),
            line_truncated: kept < line.len(),
        });
    }
    Ok(true)
}

/// Packs a host directory into a tar stream on a blocking thread.
fn pack_to_stream(dir: std::path::PathBuf) -> ByteStream {
    crate::raw::stream::writer_to_stream(move |out| archive::pack_dir_tar(&dir, out).map(|_| ()))
}
