//! `MockBackend`: an in-memory backend with real path and archive semantics and
//! scripted processes.
//!
//! Files, directories and symlinks live in a map per sandbox; symlinks are resolved the
//! way a kernel would (relative to their directory, escapes refused), and archives go
//! through the same [`crate::archive`] checks as every other backend. Processes do not
//! run: `exec` answers with a handler the test registered for `argv[0]`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use crate::backend::SandboxBackend;
use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::path::SandboxPath;
use crate::sandbox::{SandboxId, SandboxInfo, SandboxStatus};
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
    pub fn stderr(mut self, data: impl Into<Bytes>) -> Self {
        self.stderr = data.into();
        self
    }
    /// Sets the exit code.
    pub fn exit_code(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }
    /// Sets the delay before answering.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Handler = Arc<dyn Fn(&MockCall) -> MockReply + Send + Sync>;

#[derive(Debug)]
struct MockSandbox {
    info: SandboxInfo,
    spec: SandboxSpec,
    files: Tree,
    watches: Vec<watch::MockWatch>,
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<SandboxId, MockSandbox>,
    /// Creates in flight now, and the most there ever were at once.
    creating: usize,
    most_creating: usize,
}

/// An in-memory [`SandboxBackend`] for tests and examples.
///
/// It has the template `"default"` (empty) plus any added with
/// [`MockBackend::template`]. `exec` runs handlers registered with
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
    create_delay: Duration,
    pause_delay: Duration,
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
            create_delay: Duration::ZERO,
            pause_delay: Duration::ZERO,
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
                watch: true,
                metrics: true,
                clone: true,
                ..Capabilities::none()
            },
        }
    }

    /// Reports `capabilities` instead of the mock's own, to test code that checks them
    /// (the mock's behaviour does not change).
    pub fn set_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Adds a template whose workspace holds `files` (path, contents).
    pub fn template<'a>(
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
            backend =
                backend.template(name, files.iter().map(|(p, c)| (p.as_str(), c.as_bytes())))?;
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

    /// Makes every create take `delay`, as a real backend's does (to test what
    /// overlaps creates).
    pub fn create_delay(mut self, delay: Duration) -> Self {
        self.create_delay = delay;
        self
    }

    /// Makes every pause take `delay` before the sandbox is paused, as a real
    /// backend's does (to test what a pause on its way races with).
    pub fn pause_delay(mut self, delay: Duration) -> Self {
        self.pause_delay = delay;
        self
    }

    /// The most creates that were ever in flight at once.
    pub fn most_concurrent_creates(&self) -> usize {
        self.lock().most_creating
    }

    /// The spec a live sandbox was created with, as the backend received it (to check
    /// what a caller asked for: its limits, labels, env).
    pub fn spec_of(&self, id: &SandboxId) -> Option<SandboxSpec> {
        self.lock().sandboxes.get(id).map(|sb| sb.spec.clone())
    }

    /// How many sandboxes are alive (for leak checks in tests).
    pub fn live_count(&self) -> usize {
        self.lock().sandboxes.len()
    }

    /// Waits `delay` as one create in flight, counted while it waits (and uncounted
    /// even if the create is dropped).
    async fn creating(&self, delay: Duration) {
        struct InFlight<'a>(&'a MockBackend);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.lock().creating -= 1;
            }
        }
        {
            let mut state = self.lock();
            state.creating += 1;
            state.most_creating = state.most_creating.max(state.creating);
        }
        let _in_flight = InFlight(self);
        tokio::time::sleep(delay).await;
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

mod backend;
mod import;
mod process;
mod tree;
mod watch;

use self::tree::{add_parents, Node, Tree};

#[cfg(test)]
mod tests;
