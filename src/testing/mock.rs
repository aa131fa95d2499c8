//! `MockBackend`: an in-memory backend with real path and archive semantics and
//! scripted processes.
//!
//! Files, directories and symlinks live in a map per sandbox; symlinks are resolved the
//! way a kernel would (relative to their directory, escapes refused), and archives go
//! through the same [`crate::archive`] checks as every other backend. Processes do not
//! run: `exec` answers with a handler the test registered for `argv[0]`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncReadExt;

use crate::archive::{self, entry_header, EntryChecker, EntryKind, ImportMode, ImportOptions};
use crate::backend::{ByteStream, Changes, SandboxBackend};
use crate::capabilities::Capabilities;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::{ExecRequest, ExitStatus};
use crate::fs::{DirEntry, FileInfo, FileKind};
use crate::path::SandboxPath;
use crate::process::{OutputStream, Process, ProcessControl};
use crate::sandbox::{LabelSelector, SandboxId, SandboxInfo, SandboxStatus};
use crate::spec::SandboxSpec;

/// What a scripted command receives.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MockCall {
    /// The sandbox it runs in.
    pub sandbox: SandboxId,
    /// The full argv.
    pub argv: Vec<String>,
    /// The working directory.
    pub cwd: SandboxPath,
    /// The environment: the spec's env overlaid with the request's.
    pub env: BTreeMap<String, String>,
    /// Everything written to stdin.
    pub stdin: Bytes,
}

/// What a scripted command answers.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct MockReply {
    /// Bytes on stdout.
    pub stdout: Bytes,
    /// Bytes on stderr.
    pub stderr: Bytes,
    /// The exit code.
    pub exit_code: i32,
    /// How long the command "runs" before answering (for timeout and kill tests).
    pub delay: Duration,
}

impl MockReply {
    /// Exit 0 with `stdout`.
    pub fn stdout(data: impl Into<Bytes>) -> Self {
        MockReply {
            stdout: data.into(),
            ..Self::default()
        }
    }
    /// Sets stderr.
    pub fn with_stderr(mut self, data: impl Into<Bytes>) -> Self {
        self.stderr = data.into();
        self
    }
    /// Sets the exit code.
    pub fn with_exit_code(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }
    /// Sets the delay before answering.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Handler = Arc<dyn Fn(&MockCall) -> MockReply + Send + Sync>;

#[derive(Debug, Clone)]
enum Node {
    File { data: Bytes, mode: u32 },
    Dir { mode: u32 },
    Symlink(String),
}

type Tree = BTreeMap<SandboxPath, Node>;

#[derive(Debug)]
struct MockSandbox {
    info: SandboxInfo,
    spec: SandboxSpec,
    files: Tree,
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<SandboxId, MockSandbox>,
}

/// An in-memory [`SandboxBackend`] for tests and examples.
///
/// It has the template `"default"` (empty) plus any added with
/// [`MockBackend::with_template`]. `exec` runs handlers registered with
/// [`MockBackend::on_exec`]; a program without a handler is `NotFound`, as a program
/// missing from `PATH` is on real backends.
///
/// ```
/// # async fn demo() -> sandcell::Result<()> {
/// use sandcell::testing::{MockBackend, MockReply};
/// use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
///
/// let backend = MockBackend::new().on_exec("greet", |call| {
///     MockReply::stdout(format!("hello {}", call.argv[1]))
/// });
/// let sb = backend.create(&SandboxSpec::default()).await?;
/// let out = backend.run(&sb.id, ExecRequest::new(["greet", "agent"])).await?;
/// assert_eq!(out.stdout_str(), "hello agent");
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone)]
pub struct MockBackend {
    state: Arc<Mutex<State>>,
    templates: Arc<BTreeMap<String, Tree>>,
    handlers: Arc<HashMap<String, Handler>>,
    capabilities: Capabilities,
}

impl fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockBackend")
            .field("templates", &self.templates.keys().collect::<Vec<_>>())
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for MockBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MockBackend {
    /// A backend with the empty `"default"` template and no exec handlers.
    pub fn new() -> Self {
        let mut templates = BTreeMap::new();
        templates.insert("default".to_owned(), Tree::new());
        MockBackend {
            state: Arc::new(Mutex::new(State::default())),
            templates: Arc::new(templates),
            handlers: Arc::new(HashMap::new()),
            capabilities: Capabilities {
                // Mock commands are handlers: they have no network to cut or grant.
                network_isolation: true,
                network_full: true,
                pause: true,
                reset: true,
                symlinks: true,
                files_while_paused: true,
                interactive_exec: true,
                incremental_snapshot: true,
                ..Capabilities::none()
            },
        }
    }

    /// Reports `capabilities` instead of the mock's own, to test code that checks them
    /// (the mock's behaviour does not change).
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Adds a template whose workspace holds `files` (path, contents).
    pub fn with_template<'a>(
        mut self,
        name: &str,
        files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Self> {
        let mut tree = Tree::new();
        for (path, data) in files {
            let path = SandboxPath::new(path)?;
            add_parents(&mut tree, &path)?;
            tree.insert(
                path,
                Node::File {
                    data: Bytes::copy_from_slice(data),
                    mode: 0o644,
                },
            );
        }
        Arc::make_mut(&mut self.templates).insert(name.to_owned(), tree);
        Ok(self)
    }

    /// Answers `exec` of `program` (matched against `argv[0]`) with `handler`.
    pub fn on_exec(
        mut self,
        program: &str,
        handler: impl Fn(&MockCall) -> MockReply + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.handlers).insert(program.to_owned(), Arc::new(handler));
        self
    }

    /// A factory for [`BackendRegistry`](crate::BackendRegistry): options are
    /// `{"templates": {"name": {"path": "text contents"}}}` (all optional); each call
    /// makes an independent backend.
    pub fn from_options(options: serde_json::Value) -> Result<Box<dyn SandboxBackend>> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Options {
            #[serde(default)]
            templates: BTreeMap<String, BTreeMap<String, String>>,
        }
        let options: Options = crate::config::backend_options("mock", options)?;
        let mut backend = MockBackend::new();
        for (name, files) in &options.templates {
            backend = backend
                .with_template(name, files.iter().map(|(p, c)| (p.as_str(), c.as_bytes())))?;
        }
        Ok(Box::new(backend))
    }

    /// Marks a sandbox `Failed`, as a backend reports a crashed VM or a dead container
    /// (for testing health handling).
    pub fn mark_failed(&self, id: &SandboxId) -> Result<()> {
        self.with_sandbox(id, |sb| {
            sb.info.status = SandboxStatus::Failed;
            Ok(())
        })
    }

    /// How many sandboxes are alive (for leak checks in tests).
    pub fn live_count(&self) -> usize {
        self.lock().sandboxes.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock_unpoisoned(&self.state)
    }

    fn with_sandbox<T>(
        &self,
        id: &SandboxId,
        f: impl FnOnce(&mut MockSandbox) -> Result<T>,
    ) -> Result<T> {
        let mut state = self.lock();
        let sb = state
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| Error::not_found(format!("sandbox {id} does not exist")))?;
        f(sb)
    }
}

fn add_parents(tree: &mut Tree, path: &SandboxPath) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = path.parent();
    while let Some(dir) = p {
        if dir.is_root() {
            break;
        }
        match tree.get(&dir) {
            Some(Node::Dir { .. }) => break,
            Some(_) => {
                return Err(Error::invalid_input(format!(
                    "{dir} is not a directory (needed for {path})"
                )))
            }
            None => missing.push(dir.clone()),
        }
        p = dir.parent();
    }
    for dir in missing {
        tree.insert(dir, Node::Dir { mode: 0o755 });
    }
    Ok(())
}

fn escape(path: &SandboxPath) -> Error {
    Error::permission_denied(format!("{path} resolves outside the workspace"))
}

/// Resolves symlinks in `path` the way the kernel would, refusing to leave the root.
fn resolve(tree: &Tree, path: &SandboxPath, follow_last: bool) -> Result<SandboxPath> {
    let mut resolved: Vec<String> = Vec::new();
    let mut pending: VecDeque<String> = path.components().map(str::to_owned).collect();
    let mut hops = 0;
    while let Some(component) = pending.pop_front() {
        match component.as_str() {
            "" | "." => continue,
            ".." => {
                if resolved.pop().is_none() {
                    return Err(escape(path));
                }
                continue;
            }
            _ => resolved.push(component),
        }
        let current = SandboxPath::new(&resolved.join("/"))?;
        if let Some(Node::Symlink(target)) = tree.get(&current) {
            if pending.is_empty() && !follow_last {
                break;
            }
            hops += 1;
            if hops > 40 {
                return Err(Error::invalid_input(format!(
                    "{path}: too many levels of symbolic links"
                )));
            }
            if target.starts_with('/') {
                return Err(escape(path));
            }
            resolved.pop();
            let mut next: VecDeque<String> = target.split('/').map(str::to_owned).collect();
            next.extend(pending);
            pending = next;
        }
    }
    SandboxPath::new(&resolved.join("/"))
}

fn is_dir(tree: &Tree, path: &SandboxPath) -> bool {
    path.is_root() || matches!(tree.get(path), Some(Node::Dir { .. }))
}

fn children<'a>(
    tree: &'a Tree,
    dir: &'a SandboxPath,
) -> impl Iterator<Item = (&'a SandboxPath, &'a Node)> + 'a {
    tree.range(dir.clone()..)
        .skip_while(move |(p, _)| *p == dir)
        .take_while(move |(p, _)| p.starts_with(dir))
}

fn info_of(path: SandboxPath, node: &Node) -> FileInfo {
    match node {
        Node::File { data, mode } => FileInfo::new(path, FileKind::File, data.len() as u64, *mode),
        Node::Dir { mode } => FileInfo::new(path, FileKind::Dir, 0, *mode),
        Node::Symlink(target) => FileInfo::new(path, FileKind::Symlink, target.len() as u64, 0o777)
            .with_symlink_target(Some(target.clone())),
    }
}

fn not_found(path: &SandboxPath) -> Error {
    Error::not_found(format!("{path} does not exist"))
}

#[async_trait]
impl SandboxBackend for MockBackend {
    fn name(&self) -> &str {
        "mock"
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        let spec = &spec.prepare(&self.capabilities)?;
        let template = self.templates.get(&spec.template).ok_or_else(|| {
            Error::not_found(format!(
                "template {:?} is not registered with the mock backend",
                spec.template
            ))
        })?;
        let id = SandboxId::generate("mock");
        let info = SandboxInfo::new(id.clone(), "mock", spec, SandboxStatus::Running);
        self.lock().sandboxes.insert(
            id,
            MockSandbox {
                info: info.clone(),
                spec: spec.clone(),
                files: template.clone(),
            },
        );
        Ok(info)
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        self.with_sandbox(id, |sb| Ok(sb.info.clone()))
    }

    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        let mut out: Vec<_> = self
            .lock()
            .sandboxes
            .values()
            .filter(|sb| selector.matches(&sb.info.labels))
            .map(|sb| sb.info.clone())
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.lock().sandboxes.remove(id);
        Ok(())
    }

    async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.with_sandbox(id, |sb| {
            sb.info.status = SandboxStatus::Paused;
            Ok(())
        })
    }

    async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.with_sandbox(id, |sb| {
            sb.info.status = SandboxStatus::Running;
            Ok(())
        })
    }

    async fn reset(&self, id: &SandboxId) -> Result<()> {
        self.with_sandbox(id, |sb| {
            sb.info.status = SandboxStatus::Running;
            Ok(())
        })
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        request.validate()?;
        let (spec, cwd) = self.with_sandbox(id, |sb| {
            if sb.info.status == SandboxStatus::Paused {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    format!("sandbox {id} is paused; resume it first"),
                ));
            }
            let cwd = request
                .cwd
                .clone()
                .unwrap_or_else(|| sb.spec.workdir.clone());
            let real = resolve(&sb.files, &cwd, true)?;
            if !is_dir(&sb.files, &real) {
                return Err(Error::not_found(format!(
                    "working directory {cwd} does not exist"
                )));
            }
            Ok((sb.spec.clone(), cwd))
        })?;
        let mut env = spec.env.clone();
        env.extend(request.env.clone());
        let handler = self
            .handlers
            .get(&request.argv[0])
            .cloned()
            .ok_or_else(|| {
                Error::not_found(format!(
                    "program {:?} was not found on the sandbox's PATH (no mock handler registered)",
                    request.argv[0]
                ))
            })?;
        let timeout = request.timeout.or(spec.command_timeout);

        let (stdin_writer, mut stdin_reader) = tokio::io::duplex(64 * 1024);
        let stdin_writer: Option<crate::process::ProcessStdin> = match &request.stdin {
            Some(_) => None,
            None => Some(Box::pin(stdin_writer)),
        };
        let (out_tx, out_rx) = tokio::sync::mpsc::channel::<Result<Bytes>>(4);
        let (err_tx, err_rx) = tokio::sync::mpsc::channel::<Result<Bytes>>(4);
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let (status_tx, status_rx) = tokio::sync::oneshot::channel::<ExitStatus>();
        let call_base = MockCall {
            sandbox: id.clone(),
            argv: request.argv.clone(),
            cwd,
            env,
            stdin: Bytes::new(),
        };
        let given_stdin = request.stdin.clone();
        tokio::spawn(async move {
            let run = async {
                let stdin = match given_stdin {
                    Some(data) => data,
                    None => {
                        let mut buf = Vec::new();
                        let _ = stdin_reader.read_to_end(&mut buf).await;
                        Bytes::from(buf)
                    }
                };
                let call = MockCall { stdin, ..call_base };
                let reply = handler(&call);
                tokio::time::sleep(reply.delay).await;
                reply
            };
            let deadline = async {
                match timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => futures::future::pending().await,
                }
            };
            let status = tokio::select! {
                reply = run => {
                    if !reply.stdout.is_empty() {
                        let _ = out_tx.send(Ok(reply.stdout)).await;
                    }
                    if !reply.stderr.is_empty() {
                        let _ = err_tx.send(Ok(reply.stderr)).await;
                    }
                    ExitStatus::exited(reply.exit_code)
                }
                _ = deadline => ExitStatus::signaled(9).with_timed_out(true),
                _ = kill_rx => ExitStatus::signaled(9),
            };
            drop(out_tx);
            drop(err_tx);
            let _ = status_tx.send(status);
        });
        Ok(Process::new(
            Box::new(MockControl {
                kill: Some(kill_tx),
                status: Some(status_rx),
                result: None,
            }),
            stdin_writer,
            receiver_stream(out_rx),
            receiver_stream(err_rx),
        )
        .with_output_limit(spec.limits.output_bytes))
    }

    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, true)?;
            match sb.files.get(&real) {
                Some(Node::File { data, .. }) => Ok(data.clone()),
                Some(_) => Err(Error::invalid_input(format!("{path} is a directory"))),
                None if real.is_root() => {
                    Err(Error::invalid_input(format!("{path} is a directory")))
                }
                None => Err(not_found(path)),
            }
        })
    }

    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, true)?;
            if is_dir(&sb.files, &real) {
                return Err(Error::invalid_input(format!("{path} is a directory")));
            }
            let mut files = sb.files.clone();
            add_parents(&mut files, &real)?;
            let mode = match files.get(&real) {
                Some(Node::File { mode, .. }) => *mode,
                _ => 0o644,
            };
            files.insert(real, Node::File { data, mode });
            sb.files = files;
            Ok(())
        })
    }

    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, false)?;
            if real.is_root() {
                return Ok(FileInfo::new(path.clone(), FileKind::Dir, 0, 0o755));
            }
            let node = sb.files.get(&real).ok_or_else(|| not_found(path))?;
            Ok(info_of(path.clone(), node))
        })
    }

    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, true)?;
            if !is_dir(&sb.files, &real) {
                return match sb.files.get(&real) {
                    Some(_) => Err(Error::invalid_input(format!("{path} is not a directory"))),
                    None => Err(not_found(path)),
                };
            }
            let depth = real.depth() + 1;
            let mut out = Vec::new();
            for (child, node) in children(&sb.files, &real).filter(|(p, _)| p.depth() == depth) {
                let name = child.file_name().unwrap_or_default();
                let info = info_of(child.clone(), node);
                out.push(DirEntry::new(path.join(name)?, info.kind, info.size));
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(out)
        })
    }

    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, false)?;
            if real.is_root() {
                return Err(Error::invalid_input("the workspace root cannot be removed"));
            }
            match sb.files.get(&real) {
                None => return Err(not_found(path)),
                Some(Node::Dir { .. }) => {
                    let has_children = children(&sb.files, &real).next().is_some();
                    if has_children && !recursive {
                        return Err(Error::invalid_input(format!(
                            "{path} is a non-empty directory; remove it recursively"
                        )));
                    }
                    sb.files.retain(|p, _| !p.starts_with(&real));
                }
                Some(_) => {
                    sb.files.remove(&real);
                }
            }
            Ok(())
        })
    }

    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, true)?;
            if is_dir(&sb.files, &real) {
                return Ok(());
            }
            if sb.files.contains_key(&real) {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{path} exists and is not a directory"),
                ));
            }
            let mut files = sb.files.clone();
            add_parents(&mut files, &real)
                .map_err(|e| Error::new(ErrorKind::AlreadyExists, e.to_string()))?;
            files.insert(real, Node::Dir { mode: 0o755 });
            sb.files = files;
            Ok(())
        })
    }

    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        self.with_sandbox(id, |sb| {
            let src = resolve(&sb.files, from, false)?;
            let dst = resolve(&sb.files, to, false)?;
            if src.is_root() || dst.is_root() {
                return Err(Error::invalid_input("the workspace root cannot be renamed"));
            }
            if !sb.files.contains_key(&src) {
                return Err(not_found(from));
            }
            if dst.starts_with(&src) && dst != src {
                return Err(Error::invalid_input(format!(
                    "cannot move {from} into itself"
                )));
            }
            if src == dst {
                return Ok(());
            }
            if is_dir(&sb.files, &dst) {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{to} is a directory"),
                ));
            }
            let mut files = sb.files.clone();
            add_parents(&mut files, &dst)?;
            files.remove(&dst);
            let moved: Vec<(SandboxPath, Node)> = files
                .range(src.clone()..)
                .take_while(|(p, _)| p.starts_with(&src))
                .filter(|(p, _)| p.starts_with(&src))
                .map(|(p, n)| (p.clone(), n.clone()))
                .collect();
            for (p, node) in moved {
                files.remove(&p);
                let rest = p.strip_prefix(&src).unwrap_or_else(SandboxPath::root);
                let new_path = if rest.is_root() {
                    dst.clone()
                } else {
                    dst.join(rest.as_str())?
                };
                files.insert(new_path, node);
            }
            sb.files = files;
            Ok(())
        })
    }

    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        let data = self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, true)?;
            if !is_dir(&sb.files, &real) {
                return Err(match sb.files.get(&real) {
                    Some(_) => Error::invalid_input(format!("{path} is not a directory")),
                    None => not_found(path),
                });
            }
            write_tar(children(&sb.files, &real).map(|(p, node)| {
                (
                    p.strip_prefix(&real).unwrap_or_else(SandboxPath::root),
                    node,
                )
            }))
        })?;
        Ok(futures::stream::once(async move { Ok(Bytes::from(data)) }).boxed())
    }

    async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
        let (data, deleted) = self.with_sandbox(id, |sb| {
            let empty = Tree::new();
            let template = self.templates.get(&sb.spec.template).unwrap_or(&empty);
            let changed = sb.files.iter().filter(|(p, node)| match template.get(*p) {
                None => true,
                Some(old) => !same_node(old, node),
            });
            let data = write_tar(changed.map(|(p, n)| (p.clone(), n)))?;
            // A template path is deleted if it is gone or changed kind; list only the
            // top-most one of a deleted subtree.
            let mut deleted: Vec<SandboxPath> = Vec::new();
            for (p, old) in template {
                let gone = match sb.files.get(p) {
                    None => true,
                    Some(now) => kind_of(now) != kind_of(old),
                };
                if gone && !deleted.iter().any(|d| p.starts_with(d)) {
                    deleted.push(p.clone());
                }
            }
            Ok((data, deleted))
        })?;
        Ok(Changes::new(
            futures::stream::once(async move { Ok(Bytes::from(data)) }).boxed(),
            deleted,
        ))
    }

    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        // Fail fast on an unknown sandbox before reading the stream.
        self.with_sandbox(id, |_| Ok(()))?;
        let data = collect_capped(tar, options.limits.max_stream_bytes()).await?;
        self.with_sandbox(id, |sb| {
            let dest = resolve(&sb.files, path, true)?;
            let mut files = sb.files.clone();
            if !is_dir(&files, &dest) {
                if files.contains_key(&dest) {
                    return Err(Error::invalid_input(format!("{path} is not a directory")));
                }
                add_parents(&mut files, &dest)?;
                files.insert(dest.clone(), Node::Dir { mode: 0o755 });
            }
            let mut checker = EntryChecker::new(options.limits);
            match options.mode {
                ImportMode::Replace => files.retain(|p, _| !p.starts_with(&dest) || *p == dest),
                _ => {
                    for (p, node) in children(&files, &dest) {
                        if matches!(node, Node::Symlink(_)) {
                            checker.assume_existing_symlink(
                                p.strip_prefix(&dest).unwrap_or_else(SandboxPath::root),
                            );
                        }
                    }
                }
            }
            let mut apply =
                |entry: &archive::CheckedEntry, content: &mut dyn std::io::Read| -> Result<()> {
                    let target = if dest.is_root() {
                        entry.path.clone()
                    } else {
                        dest.join(entry.path.as_str())?
                    };
                    add_parents(&mut files, &target)?;
                    let node = match &entry.kind {
                        EntryKind::File => {
                            let mut buf = Vec::with_capacity(entry.size as usize);
                            content.read_to_end(&mut buf).map_err(|e| {
                                Error::io(format_args!("reading {}", entry.path), e)
                            })?;
                            Node::File {
                                data: Bytes::from(buf),
                                mode: entry.mode,
                            }
                        }
                        EntryKind::Dir => {
                            if let Some(Node::Dir { .. }) = files.get(&target) {
                                return Ok(());
                            }
                            Node::Dir { mode: entry.mode }
                        }
                        EntryKind::Symlink(t) => Node::Symlink(t.clone()),
                        EntryKind::HardLink(src) => {
                            let src = if dest.is_root() {
                                src.clone()
                            } else {
                                dest.join(src.as_str())?
                            };
                            match files.get(&src) {
                                Some(n @ Node::File { .. }) => n.clone(),
                                _ => {
                                    return Err(Error::permission_denied(format!(
                                        "hard link {} has no file to point to",
                                        entry.path
                                    )))
                                }
                            }
                        }
                    };
                    if let Some(Node::Dir { .. }) = files.get(&target) {
                        files.retain(|p, _| !p.starts_with(&target));
                    }
                    files.insert(target, node);
                    Ok(())
                };
            archive::read_entries_with(
                checker,
                std::io::Cursor::new(data),
                &options.limits,
                &mut apply,
            )?;
            sb.files = files;
            Ok(())
        })
    }
}

/// Writes nodes (paths relative to the archive root) as a tar archive.
fn write_tar<'a>(nodes: impl Iterator<Item = (SandboxPath, &'a Node)>) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (rel, node) in nodes {
        let res = match node {
            Node::File { data, mode } => {
                let mut h = entry_header(tar::EntryType::Regular, *mode, data.len() as u64, 0);
                builder.append_data(&mut h, rel.as_str(), &data[..])
            }
            Node::Dir { mode } => {
                let mut h = entry_header(tar::EntryType::Directory, *mode, 0, 0);
                builder.append_data(&mut h, rel.as_str(), std::io::empty())
            }
            Node::Symlink(target) => {
                let mut h = entry_header(tar::EntryType::Symlink, 0o777, 0, 0);
                builder.append_link(&mut h, rel.as_str(), target)
            }
        };
        res.map_err(|e| Error::io(format_args!("archiving {rel}"), e))?;
    }
    builder
        .into_inner()
        .map_err(|e| Error::io("finishing archive", e))
}

fn kind_of(node: &Node) -> FileKind {
    match node {
        Node::File { .. } => FileKind::File,
        Node::Dir { .. } => FileKind::Dir,
        Node::Symlink(_) => FileKind::Symlink,
    }
}

fn same_node(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (Node::File { data: x, mode: m }, Node::File { data: y, mode: n }) => x == y && m == n,
        (Node::Dir { mode: m }, Node::Dir { mode: n }) => m == n,
        (Node::Symlink(x), Node::Symlink(y)) => x == y,
        _ => false,
    }
}

async fn collect_capped(mut stream: ByteStream, cap: u64) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if (data.len() + chunk.len()) as u64 > cap {
            return Err(Error::limit_exceeded(format!(
                "archive stream is larger than {cap} bytes (decompression bomb?)"
            )));
        }
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

fn receiver_stream(rx: tokio::sync::mpsc::Receiver<Result<Bytes>>) -> OutputStream {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
}

struct MockControl {
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    status: Option<tokio::sync::oneshot::Receiver<ExitStatus>>,
    result: Option<ExitStatus>,
}

#[async_trait]
impl ProcessControl for MockControl {
    async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.result {
            return Ok(status);
        }
        // Awaiting the receiver by reference keeps it, so a cancelled wait can be redone.
        let rx = self
            .status
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::InvalidState, "no process to wait for"))?;
        let status = rx.await.map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "mock process task ended without a status",
            )
        })?;
        self.result = Some(status);
        Ok(status)
    }

    async fn kill(&mut self) -> Result<()> {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExecRequest, SandboxBackendExt};

    fn p(s: &str) -> SandboxPath {
        SandboxPath::new(s).unwrap()
    }

    #[test]
    fn resolve_follows_inner_links_and_refuses_escapes() {
        let mut tree = Tree::new();
        tree.insert(p("sub"), Node::Dir { mode: 0o755 });
        tree.insert(p("in"), Node::Symlink("sub".into()));
        tree.insert(p("sub/up"), Node::Symlink("..".into()));
        tree.insert(p("out"), Node::Symlink("../x".into()));
        tree.insert(p("abs"), Node::Symlink("/etc".into()));
        tree.insert(p("loop"), Node::Symlink("loop".into()));
        assert_eq!(resolve(&tree, &p("in/f"), true).unwrap(), p("sub/f"));
        assert_eq!(resolve(&tree, &p("in/up/in"), true).unwrap(), p("sub"));
        assert_eq!(resolve(&tree, &p("in"), false).unwrap(), p("in"));
        for bad in ["out/f", "abs/passwd", "in/up/out"] {
            assert_eq!(
                resolve(&tree, &p(bad), true).unwrap_err().kind(),
                ErrorKind::PermissionDenied,
                "{bad}"
            );
        }
        assert_eq!(
            resolve(&tree, &p("loop"), true).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[tokio::test]
    async fn exec_handlers_see_env_stdin_and_cwd() {
        let b = MockBackend::new().on_exec("probe", |call| {
            MockReply::stdout(format!(
                "{}|{}|{}",
                call.env.get("A").cloned().unwrap_or_default(),
                String::from_utf8_lossy(&call.stdin),
                call.cwd
            ))
            .with_stderr("warn")
            .with_exit_code(4)
        });
        let sb = b
            .create(&SandboxSpec::default().with_env("A", "spec"))
            .await
            .unwrap();
        b.mkdir(&sb.id, &p("w")).await.unwrap();
        let out = b
            .run(&sb.id, ExecRequest::new(["probe"]).stdin("in").cwd(p("w")))
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "spec|in|w");
        assert_eq!(out.stderr_str(), "warn");
        assert_eq!(out.exit_code(), Some(4));
        let missing = b.run(&sb.id, ExecRequest::new(["nope"])).await.unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn exec_stdin_writer_timeout_and_kill() {
        use tokio::io::AsyncWriteExt;
        let b = MockBackend::new()
            .on_exec("cat", |call| MockReply::stdout(call.stdin.clone()))
            .on_exec("sleep", |_| {
                MockReply::default().with_delay(Duration::from_secs(3600))
            });
        let sb = b.create(&SandboxSpec::default()).await.unwrap();

        let mut proc = b.exec(&sb.id, ExecRequest::new(["cat"])).await.unwrap();
        let mut stdin = proc.take_stdin().unwrap();
        stdin.write_all(b"streamed").await.unwrap();
        drop(stdin);
        let out = proc.collect(1024).await.unwrap();
        assert_eq!(&out.stdout[..], b"streamed");

        let timed = b
            .run(
                &sb.id,
                ExecRequest::new(["sleep"]).timeout(Duration::from_millis(20)),
            )
            .await
            .unwrap();
        assert!(timed.status.timed_out);
        assert!(!timed.success());

        let mut proc = b.exec(&sb.id, ExecRequest::new(["sleep"])).await.unwrap();
        proc.kill().await.unwrap();
        let status = proc.wait().await.unwrap();
        assert_eq!(status.signal, Some(9));
        assert!(!status.timed_out);
    }

    #[tokio::test]
    async fn changes_cover_edits_deletions_and_kind_changes() {
        let b = MockBackend::new()
            .with_template(
                "t",
                [
                    ("keep.txt", &b"same"[..]),
                    ("edit.txt", b"old"),
                    ("gone/a.txt", b"a"),
                    ("gone/b.txt", b"b"),
                    ("was_file", b"f"),
                ],
            )
            .unwrap();
        let sb = b.create(&SandboxSpec::new("t")).await.unwrap();
        b.write(&sb.id, &p("edit.txt"), Bytes::from_static(b"new"))
            .await
            .unwrap();
        b.remove(&sb.id, &p("gone"), true).await.unwrap();
        b.remove(&sb.id, &p("was_file"), false).await.unwrap();
        b.mkdir(&sb.id, &p("was_file")).await.unwrap();
        let changes = b.export_changes(&sb.id).await.unwrap();
        assert_eq!(changes.deleted, vec![p("gone"), p("was_file")]);
        let tar: Vec<u8> = changes.tar.map(|c| c.unwrap().to_vec()).concat().await;
        let mut names = Vec::new();
        for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
            names.push(entry.unwrap().path().unwrap().display().to_string());
        }
        assert_eq!(
            names,
            ["edit.txt", "was_file"],
            "unchanged files are not exported"
        );
    }

    #[tokio::test]
    async fn paused_sandboxes_refuse_exec() {
        let b = MockBackend::new();
        let sb = b.create(&SandboxSpec::default()).await.unwrap();
        b.pause(&sb.id).await.unwrap();
        let err = b.exec(&sb.id, ExecRequest::new(["x"])).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidState);
    }
}
