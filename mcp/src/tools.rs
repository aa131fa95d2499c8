//! The tools: each names a session, which the manager reuses, restores or creates, and
//! answers text a model can act on. Sandbox errors (a bad path, a timeout, a limit) are
//! tool errors, never protocol failures.

use std::sync::Arc;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use sandcell::{
    Error, ErrorKind, FileKind, ReleaseMode, SandboxBackend, SandboxBackendExt, SandboxHandle,
    SandboxPath, SessionKey,
};

use sandcell::code::{CodeInterpreterOptions, Interpreters};

use crate::args::{
    EditFile, Encoding, Glob, Grep, ListDirectory, Nothing, ReadFile, Release, ReleaseSession,
    Restore, RunCommand, SessionOnly, WriteFile,
};
use crate::settings::{Manager, ToolSettings};

/// The most a `read_file` answers in one call.
const READ_LIMIT: u64 = 256 * 1024;
/// The most entries a listing, glob or grep answers.
const MAX_ITEMS: usize = 1000;

/// sandcell's MCP server: sandbox tools over one manager, for one tenant.
///
/// Serve it with any rmcp transport: [`serve_stdio`](crate::serve_stdio) does for a
/// command line.
#[derive(Clone)]
pub struct SandboxTools {
    manager: Arc<Manager>,
    /// The tenant every call acts for; `None`: each request's [`Tenant`](crate::Tenant), set by the
    /// HTTP server in front.
    tenant: Option<String>,
    settings: Arc<ToolSettings>,
    /// Each tenant's calls in flight ([`ToolSettings::max_calls_per_tenant`]).
    calls: Arc<sandcell::raw::TenantSlots>,
    /// `run_code`'s interpreters, by sandbox (so by tenant: a sandbox is reached
    /// through its tenant's sessions only).
    interpreters: Arc<Interpreters>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for SandboxTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxTools")
            .field("tenant", &self.tenant)
            .field("backend", &self.manager.backend().name())
            .finish_non_exhaustive()
    }
}

mod calls;
mod code;
mod command;
pub(crate) use calls::call_slots;
use calls::{text, Answer};

/// `run_code`'s interpreters, started with the settings' Python.
pub(crate) fn interpreters(settings: &ToolSettings) -> Interpreters {
    Interpreters::new(CodeInterpreterOptions::new().python(&settings.code_python))
}

fn path(raw: &str) -> sandcell::Result<SandboxPath> {
    SandboxPath::new(raw.trim_start_matches("./"))
}

impl SandboxTools {
    /// Tools over `manager`, acting for `tenant`.
    pub fn new(manager: Arc<Manager>, tenant: impl Into<String>, settings: ToolSettings) -> Self {
        let settings = Self::limited(&manager, settings);
        SandboxTools {
            manager,
            tenant: Some(tenant.into()),
            calls: Arc::new(call_slots(settings.max_calls_per_tenant)),
            interpreters: Arc::new(interpreters(&settings)),
            settings,
            tool_router: Self::tool_router() + Self::code_router(),
        }
    }

    /// Tools over `manager` acting for each request's [`Tenant`](crate::Tenant), which the server in
    /// front sets once it has authenticated the caller; a request without one is
    /// refused.
    pub fn per_request_tenant(manager: Arc<Manager>, settings: ToolSettings) -> Self {
        let calls = Arc::new(call_slots(settings.max_calls_per_tenant));
        let interpreters = Arc::new(interpreters(&settings));
        Self::per_request_tenant_sharing(manager, settings, calls, interpreters)
    }

    /// As [`per_request_tenant`](Self::per_request_tenant), counting calls in `calls`,
    /// which every session of a server shares: a tenant opens as many sessions as it
    /// likes, and a cap per session bounded nothing (FINDINGS10 G2). `interpreters`
    /// are shared too, so a session's code state outlives the MCP session that made it.
    pub(crate) fn per_request_tenant_sharing(
        manager: Arc<Manager>,
        settings: ToolSettings,
        calls: Arc<sandcell::raw::TenantSlots>,
        interpreters: Arc<Interpreters>,
    ) -> Self {
        let settings = Self::limited(&manager, settings);
        SandboxTools {
            manager,
            tenant: None,
            calls,
            interpreters,
            settings,
            tool_router: Self::tool_router() + Self::code_router(),
        }
    }

    /// Whether `self` and `other` count calls in the same places.
    #[cfg(test)]
    pub(crate) fn shares_calls_with(&self, other: &SandboxTools) -> bool {
        Arc::ptr_eq(&self.calls, &other.calls)
    }

    /// `settings` with the default limits the backend enforces put in its spec, once,
    /// so every session's sandbox is created with them.
    fn limited(manager: &Manager, mut settings: ToolSettings) -> Arc<ToolSettings> {
        let caps = manager.backend().capabilities();
        settings.spec.limits = std::mem::take(&mut settings.spec.limits)
            .with_enforced_defaults(&settings.default_limits, &caps);
        Arc::new(settings)
    }

    /// The tenant a call acts for.
    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> sandcell::Result<String> {
        if let Some(tenant) = &self.tenant {
            return Ok(tenant.clone());
        }
        let _ = ctx;
        #[cfg(feature = "http")]
        if let Some(tenant) = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<crate::Tenant>())
        {
            return Ok(tenant.0.clone());
        }
        Err(Error::new(
            ErrorKind::PermissionDenied,
            "this request carries no authenticated tenant",
        ))
    }

    /// The session's key under the call's tenant.
    fn key(&self, ctx: &RequestContext<RoleServer>, session: &str) -> sandcell::Result<SessionKey> {
        SessionKey::new(self.tenant(ctx)?, session)
    }

    /// The session's sandbox: reused, restored or created.
    async fn open(
        &self,
        ctx: &RequestContext<RoleServer>,
        session: &str,
    ) -> sandcell::Result<SandboxHandle<Box<dyn SandboxBackend>>> {
        let key = self.key(ctx, session)?;
        self.manager.acquire(&key, &self.settings.spec).await
    }
    async fn read(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: ReadFile,
    ) -> sandcell::Result<String> {
        let file = path(&args.path)?;
        let sandbox = self.open(ctx, &args.session).await?;
        let max = self.settings.max_read_bytes;
        let target = &file;
        let data = sandbox
            .call("read", |b, id| async move {
                sandcell::raw::read_at_most(b.as_ref(), id, target, max).await
            })
            .await?;
        let size = data.len() as u64;
        let offset = args.offset.unwrap_or(0).min(size);
        let length = args.length.unwrap_or(READ_LIMIT).min(READ_LIMIT);
        let end = offset.saturating_add(length).min(size);
        let slice = data.slice(offset as usize..end as usize);
        let body = match args.encoding {
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(&slice),
            Encoding::Text => String::from_utf8(slice.to_vec()).map_err(|_| {
                Error::invalid_input(format!(
                    "{file} (bytes {offset}..{end}) is not UTF-8 text: read it with encoding \
                     base64, or a range that does not split a character"
                ))
            })?,
        };
        if offset == 0 && end == size {
            return Ok(body);
        }
        Ok(format!(
            "[bytes {offset}..{end} of {size}; read more with offset {end}]\n{body}"
        ))
    }

    async fn write(
        &self,
        ctx: &RequestContext<RoleServer>,
        args: WriteFile,
    ) -> sandcell::Result<String> {
        let file = path(&args.path)?;
        let data = match args.encoding {
            Encoding::Text => bytes::Bytes::from(args.content.into_bytes()),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(args.content.as_bytes())
                .map_err(|e| Error::invalid_input(format!("content is not base64: {e}")))?
                .into(),
        };
        if data.len() > self.settings.max_write_bytes {
            return Err(Error::limit_exceeded(format!(
                "{} bytes is over this server's {}-byte limit for one write",
                data.len(),
                self.settings.max_write_bytes
            )));
        }
        let size = data.len();
        let sandbox = self.open(ctx, &args.session).await?;
        if let Some(parent) = file.parent().filter(|p| !p.is_root()) {
            sandbox.call("mkdir", |b, id| b.mkdir(id, &parent)).await?;
        }
        sandbox
            .call("write", |b, id| b.write(id, &file, data))
            .await?;
        Ok(format!("wrote {size} bytes to {file}"))
    }
}

#[tool_router]
impl SandboxTools {
    /// Runs a shell command in a session's sandbox.
    #[tool(
        description = "Run a shell command (sh -c) in a session's sandbox, in its workspace. \
        Answers the exit code and the output (long output keeps its start and end, with a \
        marker between). The command gets no stdin; it is killed with everything it \
        started after timeout_secs (default 120). Sessions are named by you: the first \
        call creates one, later calls reuse it."
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommand>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        // Among the tenant's calls in flight, as every other tool is (`answer`).
        let _slot = match self.tenant(&ctx).and_then(|t| self.calls.slot(&t)) {
            Ok(slot) => slot,
            Err(e) => return self.failed(e),
        };
        let progress = ctx
            .meta
            .get_progress_token()
            .map(|token| (token, ctx.peer.clone()));
        match self.run(&ctx, args, progress).await {
            Ok((out, false)) => text(out),
            Ok((out, true)) => Ok(CallToolResult::error(vec![ContentBlock::text(out)])),
            Err(e) => self.failed(e),
        }
    }

    /// Reads a file.
    #[tool(
        description = "Read a file of a session's workspace as UTF-8 text (or base64 with \
        encoding base64). Answers at most 256 KiB, saying so when it cuts; give offset and \
        length (bytes) to read a large file in ranges. Files over the server's read limit \
        (64 MiB unless set) are refused: read those with run_command."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, self.read(&ctx, args)).await
    }

    /// Writes a file.
    #[tool(
        description = "Write a whole file in a session's workspace (UTF-8 text, or base64 \
        with encoding base64), replacing what it held; parent directories are created."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, self.write(&ctx, args)).await
    }

    /// Edits a file.
    #[tool(
        description = "Edit a file by replacing old_text with new_text. old_text must occur \
        exactly once in the file, whitespace and indentation included; include enough \
        surrounding lines to make it unique. An empty old_text creates a new file."
    )]
    async fn edit_file(
        &self,
        Parameters(args): Parameters<EditFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let file = path(&args.path)?;
            let sandbox = self.open(&ctx, &args.session).await?;
            let outcome = sandbox
                .call("edit", |b, id| {
                    b.edit_file(id, &file, &args.old_text, &args.new_text)
                })
                .await?;
            Ok(match outcome {
                sandcell::EditOutcome::Created => format!("created {file}"),
                _ => format!("edited {file}"),
            })
        })
        .await
    }

    /// Lists a directory.
    #[tool(
        description = "List a directory of a session's workspace: one entry per line, \
        directories ending in '/', files with their size in bytes."
    )]
    async fn list_directory(
        &self,
        Parameters(args): Parameters<ListDirectory>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let dir = match args.path.as_deref() {
                None | Some("") | Some(".") => SandboxPath::root(),
                Some(raw) => path(raw)?,
            };
            let sandbox = self.open(&ctx, &args.session).await?;
            let entries = sandbox
                .call("list_dir", |b, id| b.list_dir(id, &dir))
                .await?;
            let mut out = String::new();
            for entry in entries.iter().take(MAX_ITEMS) {
                let name = entry.path.file_name().unwrap_or_default();
                match entry.kind {
                    FileKind::Dir => out.push_str(&format!("{name}/\n")),
                    FileKind::Symlink => out.push_str(&format!("{name}@\n")),
                    _ => out.push_str(&format!("{name}\t{} bytes\n", entry.size)),
                }
            }
            if entries.len() > MAX_ITEMS {
                out.push_str(&format!(
                    "[... {} more entries]\n",
                    entries.len() - MAX_ITEMS
                ));
            }
            if out.is_empty() {
                out.push_str("(empty directory)\n");
            }
            Ok(out)
        })
        .await
    }

    /// Finds files by pattern.
    #[tool(
        description = "Find files and directories of a session's workspace whose path \
        matches a glob such as 'src/**/*.rs' ('*' stays within one directory, '**' crosses \
        them). One path per line."
    )]
    async fn glob(
        &self,
        Parameters(args): Parameters<Glob>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let sandbox = self.open(&ctx, &args.session).await?;
            let found = sandbox
                .call("glob", |b, id| b.glob(id, &args.pattern))
                .await?;
            let mut out: String = found
                .iter()
                .take(MAX_ITEMS)
                .map(|p| format!("{p}\n"))
                .collect();
            if found.len() > MAX_ITEMS {
                out.push_str(&format!("[... {} more paths]\n", found.len() - MAX_ITEMS));
            }
            if out.is_empty() {
                out.push_str("(no match)\n");
            }
            Ok(out)
        })
        .await
    }

    /// Searches file contents.
    #[tool(
        description = "Search the text files of a session's workspace (or of one file or \
        directory) for lines matching a regular expression. One 'path:line: text' per match; \
        long lines are cut, and a search with too many matches stops and says so."
    )]
    async fn grep(
        &self,
        Parameters(args): Parameters<Grep>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let root = match args.path.as_deref() {
                None | Some("") | Some(".") => SandboxPath::root(),
                Some(raw) => path(raw)?,
            };
            let sandbox = self.open(&ctx, &args.session).await?;
            let found = sandbox
                .call("grep", |b, id| b.grep(id, &root, &args.pattern))
                .await?;
            Ok(crate::output::grep_answer(&found, MAX_ITEMS))
        })
        .await
    }

    /// Snapshots a session.
    #[tool(
        description = "Snapshot a session's workspace; answers the snapshot's id, which \
        restore_snapshot takes. The session keeps running."
    )]
    async fn snapshot(
        &self,
        Parameters(args): Parameters<SessionOnly>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let key = self.key(&ctx, &args.session)?;
            let manifest = self.manager.snapshot(&key).await?;
            Ok(format!(
                "snapshot {} of session {} ({} bytes)",
                manifest.id, args.session, manifest.size_bytes
            ))
        })
        .await
    }

    /// Restores a snapshot.
    #[tool(
        description = "Replace a session's workspace with a snapshot taken earlier (by \
        snapshot, of this or another of your sessions)."
    )]
    async fn restore_snapshot(
        &self,
        Parameters(args): Parameters<Restore>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let key = self.key(&ctx, &args.session)?;
            self.manager.restore(&key, &args.snapshot_id).await?;
            Ok(format!(
                "session {} now holds snapshot {}",
                args.session, args.snapshot_id
            ))
        })
        .await
    }

    /// Lists sessions.
    #[tool(description = "List your sessions: one JSON object per line with its name and status.")]
    async fn list_sessions(
        &self,
        Parameters(_): Parameters<Nothing>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let tenant = self.tenant(&ctx)?;
            let sessions = self.manager.list(Some(&tenant)).await?;
            let mut out = String::new();
            for record in sessions {
                let line = serde_json::json!({
                    "session": record.key.session(),
                    "status": record.status,
                    "backend": record.backend,
                    "template": record.spec.template,
                    "last_active": record.last_active,
                });
                out.push_str(&line.to_string());
                out.push('\n');
            }
            if out.is_empty() {
                out.push_str("(no sessions)\n");
            }
            Ok(out)
        })
        .await
    }

    /// Releases a session.
    #[tool(
        description = "Release a session: keep (leave it running), suspend (snapshot and \
        stop it; the next call restores it) or destroy (its sandbox is gone; its snapshots \
        stay)."
    )]
    async fn release(
        &self,
        Parameters(args): Parameters<ReleaseSession>,
        ctx: RequestContext<RoleServer>,
    ) -> Answer {
        self.answer(&ctx, async {
            let key = self.key(&ctx, &args.session)?;
            let mode = match args.mode {
                Release::Keep => ReleaseMode::Keep,
                Release::Suspend => ReleaseMode::Suspend,
                Release::Destroy => ReleaseMode::Destroy,
            };
            self.manager.release(&key, mode).await?;
            Ok(format!("session {} released ({:?})", args.session, args.mode).to_lowercase())
        })
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandcell", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Sandboxes for running commands and editing files. Every tool names a \
                 session: pick a name, and the first call creates its sandbox; later \
                 calls reuse it, with its files and installed tools. Paths are relative \
                 to the session's workspace.",
            )
    }
}
