//! The contract implemented over the in-memory trees and scripted handlers.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncReadExt;

use crate::archive::ImportOptions;
use crate::backend::{ByteStream, Changes, SandboxBackend};
use crate::capabilities::Capabilities;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::{ExecRequest, ExitStatus};
use crate::fs::{DirEntry, FileInfo, FileKind};
use crate::path::SandboxPath;
use crate::process::Process;
use crate::sandbox::{LabelSelector, SandboxId, SandboxInfo, SandboxStatus};
use crate::spec::SandboxSpec;
use crate::watch::{WatchOptions, WatchStream};
use crate::SandboxMetrics;
use std::collections::BTreeMap;

use super::process::*;
use super::tree::*;
use super::*;

// Every method written out: a method added to the trait cannot answer with its
// default (`Unsupported`) here unnoticed.
#[deny(clippy::missing_trait_methods)]
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
        if !self.create_delay.is_zero() {
            self.creating(self.create_delay).await;
        }
        let id = SandboxId::generate("mock");
        let info = SandboxInfo::new(id.clone(), "mock", spec, SandboxStatus::Running);
        self.lock().sandboxes.insert(
            id,
            MockSandbox {
                info: info.clone(),
                spec: spec.clone(),
                files: template.clone(),
                watches: Vec::new(),
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
        tokio::time::sleep(self.pause_delay).await;
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
        request.check_supported(&self.capabilities)?;
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
                _ = deadline => ExitStatus::signaled(9).timed_out(true),
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
            sb.commit(files);
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
            let mut limit = crate::raw::ListingLimit::new(format!("listing {path}"));
            let mut out = Vec::new();
            for (child, node) in children(&sb.files, &real).filter(|(p, _)| p.depth() == depth) {
                let name = child.file_name().unwrap_or_default();
                let info = info_of(child.clone(), node);
                let entry = path.join(name)?;
                limit.admit(entry.as_str(), name)?;
                out.push(DirEntry::new(entry, info.kind, info.size));
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
                    let mut files = sb.files.clone();
                    files.retain(|p, _| !p.starts_with(&real));
                    sb.commit(files);
                }
                Some(_) => {
                    let mut files = sb.files.clone();
                    files.remove(&real);
                    sb.commit(files);
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
            sb.commit(files);
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
            sb.commit_rename(files, &src, &dst);
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

    /// No ports: nothing listens in the mock.
    async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.with_sandbox(id, |_| {
            Err(Error::unsupported(format!(
                "backend mock cannot expose port {port} to this host"
            )))
        })
    }

    async fn unpublish_port(&self, _id: &SandboxId, _port: u16) -> Result<()> {
        Ok(())
    }

    /// Every file is in memory already: read whole, then checked.
    async fn read_limited(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<Bytes> {
        let data = self.read(id, path).await?;
        crate::backend::check_read_limit(path, data.len() as u64, max_bytes)?;
        Ok(data)
    }

    async fn set_network(&self, id: &SandboxId, _network: &crate::Network) -> Result<()> {
        self.with_sandbox(id, |_| {
            Err(Error::unsupported(
                "backend mock cannot change a running sandbox's network",
            ))
        })
    }

    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        self.with_sandbox(id, |sb| {
            let real = resolve(&sb.files, path, true)?;
            if !is_dir(&sb.files, &real) {
                return Err(match sb.files.get(&real) {
                    Some(_) => Error::invalid_input(format!("{path} is not a directory")),
                    None => not_found(path),
                });
            }
            let (sender, stream) = crate::raw::watch_channel(real.clone());
            sb.watches.push(super::watch::MockWatch {
                dir: real,
                recursive: options.recursive,
                sender,
            });
            Ok(stream)
        })
    }

    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics> {
        self.with_sandbox(id, |sb| {
            let mut metrics = SandboxMetrics::now();
            metrics.disk_bytes = Some(
                sb.files
                    .values()
                    .map(|node| match node {
                        Node::File { data, .. } => data.len() as u64,
                        _ => 0,
                    })
                    .sum(),
            );
            metrics.memory_limit_bytes = sb.spec.limits.memory_bytes;
            Ok(metrics)
        })
    }

    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        let mut state = self.lock();
        let source = state
            .sandboxes
            .get(id)
            .ok_or_else(|| Error::not_found(format!("sandbox {id} does not exist")))?;
        let mut spec = source.spec.clone();
        spec.labels = labels;
        let files = source.files.clone();
        let new_id = SandboxId::generate("mock");
        let info = SandboxInfo::new(new_id.clone(), "mock", &spec, SandboxStatus::Running);
        state.sandboxes.insert(
            new_id,
            MockSandbox {
                info: info.clone(),
                spec,
                files,
                watches: Vec::new(),
            },
        );
        Ok(info)
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
            let files = super::import::imported(&sb.files, path, data, options)?;
            sb.commit(files);
            Ok(())
        })
    }
}
