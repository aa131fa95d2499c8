//! Files over a plain Fly Machines endpoint: shell scripts run through the buffered
//! `exec` call, data moved base64-encoded in bounded chunks.
//!
//! The Fly API's exec carries stdin and stdout as JSON strings, so every byte crosses
//! as base64 and no call carries more than [`CHUNK_BYTES`] of file data: large files,
//! exports and imports take several calls through a temporary file on the machine,
//! which the last call (or a clean-up after a failure) removes.
//!
//! The machine needs a POSIX `sh` with `base64`, `dd`, `stat -c`, `readlink -f`,
//! `xargs -0`, `find` and `tar` on its `PATH`: GNU coreutils or busybox. Paths are
//! confined like every backend's: a symlink that leads out of the workspace is refused
//! before anything is read or written through it. Archives are checked in full on this
//! side (with [`sandcell::archive`]) before any byte reaches the machine.

use std::io::{Read, Seek, Write};
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use sandcell::archive::{ImportMode, ImportOptions};
use sandcell::raw::archive::{read_entries_with, EntryChecker};
use sandcell::{
    ByteStream, DirEntry, Error, ErrorKind, FileInfo, FileKind, Result, SandboxId, SandboxPath,
};

use crate::fly::ControlPlane;
use crate::plain_exec::typed_failure;
use crate::protocol::{ExecBody, ExecResponse};

mod archives;

/// What files over exec need from a provider: a command run to its end, its output
/// answered as text (Fly's `exec`, or envd's process stream gathered up).
#[async_trait::async_trait]
pub(crate) trait BufferedExec: Send + Sync + std::fmt::Debug {
    /// Runs `request` on sandbox `id` to its end.
    async fn exec(&self, id: &str, request: &ExecBody) -> Result<ExecResponse>;
}

#[async_trait::async_trait]
impl BufferedExec for Arc<dyn ControlPlane> {
    async fn exec(&self, id: &str, request: &ExecBody) -> Result<ExecResponse> {
        ControlPlane::exec(&**self, id, request).await
    }
}

/// File data carried by one exec call (before base64), a multiple of [`BLOCK`].
pub(crate) const CHUNK_BYTES: usize = 512 * 1024;
/// The `dd` block size chunks are counted in.
const BLOCK: usize = 64 * 1024;
/// How long one file call may run on the machine.
const CALL_SECONDS: u64 = 120;

/// What every script starts with: the workspace (`$1`, empty for the directory commands
/// start in) resolved to `$R`, a typed `fail`, and path confinement.
const PRELUDE: &str = include_str!("scripts/prelude.sh");

/// `READ rel skip count`: the size (following links), then `count` blocks from `skip`.
const READ: &str = include_str!("scripts/read.sh");

/// `CHUNK abs skip count [remove]`: blocks of a temporary file; `remove` deletes it after.
const CHUNK: &str = include_str!("scripts/chunk.sh");

/// `WRITE rel tmp first|append last|more`: stdin (base64) into `tmp` beside `rel`;
/// on the last chunk `tmp` replaces `rel`.
const WRITE: &str = include_str!("scripts/write.sh");

/// `ABORT abs`: removes a temporary file (a write's, an export's or an import's).
const ABORT: &str = include_str!("scripts/abort.sh");

/// `STAT rel`: `hexmode size mtime`, then a symlink's target in base64.
const STAT: &str = include_str!("scripts/stat.sh");

/// `LIST rel max`: the names (NUL-separated, in base64), a `.` line, then `hexmode size`
/// per name in the same order; `limit_exceeded` past `max` entries, before any is sent.
const LIST: &str = include_str!("scripts/list.sh");

/// `REMOVE rel recursive|single`.
const REMOVE: &str = include_str!("scripts/remove.sh");

/// `MKDIR rel`.
const MKDIR: &str = include_str!("scripts/mkdir.sh");

/// `RENAME from to`, with rename(2)'s rules for what is at `to`.
const RENAME: &str = include_str!("scripts/rename.sh");

/// `EXPORT rel tmpname skip count`: tars `rel` into a temporary file and prints its path,
/// its size, then its first chunk; a tar that fits in that chunk is removed at once.
const EXPORT: &str = include_str!("scripts/export.sh");

/// `SYMLINKS rel`: the symlinks under `rel` (NUL-separated relative paths, in base64).
const SYMLINKS: &str = include_str!("scripts/symlinks.sh");

/// `UPLOAD name first` creates a temporary file named `name` and prints its path;
/// `UPLOAD path append` appends. Either way stdin (base64) is what is written.
const UPLOAD: &str = include_str!("scripts/upload.sh");

/// `EXTRACT rel tar merge|replace stagename`: unpacks the uploaded (checked) tar and
/// removes it. Replace unpacks beside `rel` first and swaps, so a failed unpack leaves
/// `rel` as it was.
const EXTRACT: &str = include_str!("scripts/extract.sh");

/// Runs file operations on one endpoint's machines through `exec`.
#[derive(Debug, Clone)]
pub(crate) struct ExecFiles {
    control: Arc<dyn BufferedExec>,
    /// The workspace directory on the machine; empty for where commands start.
    root: String,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Decodes base64 that `base64` printed (wrapped in lines).
fn decode(text: &str, what: &str) -> Result<Vec<u8>> {
    let packed: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    b64().decode(packed).map_err(|e| {
        Error::with_source(
            ErrorKind::Backend,
            format!("{what}: the machine answered data that is not base64"),
            e,
        )
    })
}

fn malformed(what: &str, stdout: &str) -> Error {
    let shown: String = stdout.chars().take(200).collect();
    Error::new(
        ErrorKind::Backend,
        format!("{what}: the machine answered something unexpected: {shown:?}"),
    )
}

/// A unique name for a temporary file on the machine.
fn temp_name(what: &str) -> String {
    format!(".sandcell-{what}-{}", uuid::Uuid::new_v4().simple())
}

fn blocks(bytes: usize) -> usize {
    bytes / BLOCK
}

/// `hexmode` from `stat -c %f` as a kind and permission bits.
fn kind_of(hex_mode: &str) -> Option<(FileKind, u32)> {
    let mode = u32::from_str_radix(hex_mode, 16).ok()?;
    let kind = match mode & 0o170000 {
        0o100000 => FileKind::File,
        0o040000 => FileKind::Dir,
        0o120000 => FileKind::Symlink,
        _ => FileKind::Other,
    };
    Some((kind, mode & 0o777))
}

impl ExecFiles {
    pub(crate) fn new(control: Arc<dyn BufferedExec>, root: String) -> Self {
        ExecFiles { control, root }
    }

    /// Runs `script` with `args`, answering its stdout; a typed failure becomes that error.
    async fn run(
        &self,
        id: &SandboxId,
        what: &str,
        script: &str,
        args: &[&str],
        stdin: Option<String>,
    ) -> Result<String> {
        let mut command = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("{PRELUDE}{script}"),
            "sandcell".to_owned(),
            self.root.clone(),
        ];
        command.extend(args.iter().map(|a| (*a).to_owned()));
        let body = ExecBody {
            command,
            stdin,
            timeout: Some(CALL_SECONDS),
        };
        let answer = self
            .control
            .exec(id.as_str(), &body)
            .await
            .map_err(|e| e.context(what))?;
        if let Some(e) = typed_failure(answer.exit_code, &answer.stderr, "sandcell", what) {
            return Err(e);
        }
        match (answer.exit_code, answer.exit_signal.filter(|s| *s > 0)) {
            (Some(0), None) => Ok(answer.stdout),
            (code, signal) => Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "{what} failed on the machine (exit {code:?}, signal {signal:?}); files over exec need sh, base64, dd, stat, readlink, xargs, find and tar: {}",
                    answer.stderr.trim()
                ),
            )),
        }
    }

    /// Best-effort removal of a temporary file, after a failure.
    async fn discard(&self, id: &SandboxId, path: &str) {
        if let Err(e) = self
            .run(id, "removing a temporary file", ABORT, &[path], None)
            .await
        {
            tracing::warn!(sandbox = %id, path, error = %e, "a temporary file may be left on the machine");
        }
    }

    /// Reads a whole file in chunks, stopping (`LimitExceeded`) once it holds more than
    /// `max_bytes`, however large the machine said the file was.
    pub(crate) async fn read(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<Bytes> {
        let what = format!("reading {path}");
        let count = blocks(CHUNK_BYTES).to_string();
        let mut data = Vec::new();
        let mut size = None;
        loop {
            let skip = blocks(data.len()).to_string();
            let out = self
                .run(id, &what, READ, &[path.as_str(), &skip, &count], None)
                .await?;
            let (head, body) = out.split_once('\n').ok_or_else(|| malformed(&what, &out))?;
            let total: usize = head.trim().parse().map_err(|_| malformed(&what, &out))?;
            let chunk = decode(body, &what)?;
            let expected = *size.get_or_insert(total);
            let done = chunk.len() < CHUNK_BYTES;
            sandcell::raw::check_read_limit(path, (data.len() + chunk.len()) as u64, max_bytes)?;
            data.extend_from_slice(&chunk);
            if done || data.len() >= expected {
                return Ok(Bytes::from(data));
            }
        }
    }

    pub(crate) async fn write(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        data: Bytes,
    ) -> Result<()> {
        if path.is_root() {
            return Err(Error::invalid_input("cannot write the workspace root"));
        }
        let what = format!("writing {path}");
        let temp = temp_name("write");
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(CHUNK_BYTES).collect()
        };
        let last_index = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let first = if i == 0 { "first" } else { "append" };
            let last = if i == last_index { "last" } else { "more" };
            let sent = self
                .run(
                    id,
                    &what,
                    WRITE,
                    &[path.as_str(), &temp, first, last],
                    Some(b64().encode(chunk)),
                )
                .await;
            if let Err(e) = sent {
                // The script removes its file on the failures it reports; a lost call
                // or a later chunk's may leave it.
                let lost = matches!(
                    e.kind(),
                    ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Backend
                );
                if i > 0 || lost {
                    let dir = path.parent().unwrap_or_else(SandboxPath::root);
                    let leftover = format!("{}/{}", self.absolute(&dir), temp);
                    self.discard(id, &leftover).await;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Where `path` is on the machine, for removing temporary files beside it.
    fn absolute(&self, path: &SandboxPath) -> String {
        let root = if self.root.is_empty() {
            "."
        } else {
            &self.root
        };
        if path.is_root() {
            root.to_owned()
        } else {
            format!("{root}/{}", path.as_str())
        }
    }

    pub(crate) async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        let what = format!("stat {path}");
        let out = self.run(id, &what, STAT, &[path.as_str()], None).await?;
        let (head, rest) = out.split_once('\n').unwrap_or((&out, ""));
        let fields: Vec<&str> = head.split_whitespace().collect();
        let [mode, size, mtime] = fields[..] else {
            return Err(malformed(&what, &out));
        };
        let (kind, mode) = kind_of(mode).ok_or_else(|| malformed(&what, &out))?;
        let size: u64 = size.parse().map_err(|_| malformed(&what, &out))?;
        let mut info = FileInfo::new(
            path.clone(),
            kind,
            if kind == FileKind::Dir { 0 } else { size },
            mode,
        );
        info.modified = mtime
            .parse::<i64>()
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0));
        if kind == FileKind::Symlink {
            let target = decode(rest, &what)?;
            let target = String::from_utf8_lossy(&target);
            info.symlink_target = Some(target.trim_end_matches('\n').to_owned());
        }
        Ok(info)
    }

    pub(crate) async fn list_dir(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>> {
        let what = format!("listing {path}");
        let max = sandcell::MAX_DIR_ENTRIES.to_string();
        let out = self
            .run(id, &what, LIST, &[path.as_str(), &max], None)
            .await?;
        if out.trim().is_empty() {
            return Ok(Vec::new());
        }
        let (names, stats) = out
            .split_once("\n.\n")
            .ok_or_else(|| malformed(&what, &out))?;
        let names = decode(names, &what)?;
        let names: Vec<&[u8]> = names.split(|b| *b == 0).filter(|n| !n.is_empty()).collect();
        let stats: Vec<&str> = stats.lines().filter(|l| !l.trim().is_empty()).collect();
        if names.len() != stats.len() {
            return Err(Error::new(
                ErrorKind::Backend,
                format!("{what}: the directory changed while it was listed; try again"),
            ));
        }
        let mut limit = sandcell::raw::ListingLimit::new(what.clone());
        let mut entries = Vec::with_capacity(names.len());
        for (name, stat) in names.into_iter().zip(stats) {
            // A name that is not UTF-8 cannot be a sandbox path; the local backend
            // skips such names too.
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            let Some((mode, size)) = stat.split_once(' ') else {
                return Err(malformed(&what, &out));
            };
            let (kind, _) = kind_of(mode).ok_or_else(|| malformed(&what, &out))?;
            let size: u64 = size.trim().parse().map_err(|_| malformed(&what, &out))?;
            let entry_path = path.join(name)?;
            limit.admit(entry_path.as_str(), name)?;
            entries.push(DirEntry::new(
                entry_path,
                kind,
                if kind == FileKind::Dir { 0 } else { size },
            ));
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    pub(crate) async fn remove(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        recursive: bool,
    ) -> Result<()> {
        if path.is_root() {
            return Err(Error::invalid_input("cannot remove the workspace root"));
        }
        let mode = if recursive { "recursive" } else { "single" };
        self.run(
            id,
            &format!("removing {path}"),
            REMOVE,
            &[path.as_str(), mode],
            None,
        )
        .await
        .map(drop)
    }

    pub(crate) async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        self.run(
            id,
            &format!("creating {path}"),
            MKDIR,
            &[path.as_str()],
            None,
        )
        .await
        .map(drop)
    }

    pub(crate) async fn rename(
        &self,
        id: &SandboxId,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<()> {
        if from.is_root() || to.is_root() {
            return Err(Error::invalid_input("cannot rename the workspace root"));
        }
        if to.starts_with(from) {
            return Err(Error::invalid_input(format!(
                "cannot move {from} into itself ({to})"
            )));
        }
        let what = format!("renaming {from} to {to}");
        self.run(id, &what, RENAME, &[from.as_str(), to.as_str()], None)
            .await
            .map(drop)
    }

    /// A plain endpoint's exec answers once a command is done: nothing can stream a
    /// machine's file events.
    pub(crate) async fn watch(
        &self,
        _id: &SandboxId,
        _path: &SandboxPath,
        _options: sandcell::WatchOptions,
    ) -> Result<sandcell::WatchStream> {
        Err(Error::unsupported(
            "a plain Fly endpoint cannot watch a machine's files",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_modes_map_to_kinds() {
        assert_eq!(kind_of("81a4"), Some((FileKind::File, 0o644)));
        assert_eq!(kind_of("41ed"), Some((FileKind::Dir, 0o755)));
        assert_eq!(kind_of("a1ff"), Some((FileKind::Symlink, 0o777)));
        assert_eq!(kind_of("11a4").map(|k| k.0), Some(FileKind::Other));
        assert_eq!(kind_of("zz"), None);
    }

    #[test]
    fn wrapped_base64_decodes() {
        let text = b64().encode(vec![7u8; 200]);
        let wrapped: String = text
            .as_bytes()
            .chunks(76)
            .map(|c| format!("{}\n", std::str::from_utf8(c).unwrap()))
            .collect();
        assert_eq!(decode(&wrapped, "t").unwrap(), vec![7u8; 200]);
        assert_eq!(decode("!!", "t").unwrap_err().kind(), ErrorKind::Backend);
    }

    #[test]
    fn chunks_are_whole_blocks() {
        assert_eq!(CHUNK_BYTES % BLOCK, 0);
    }
}
