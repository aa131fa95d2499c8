//! File reads through the engine's archive API, for when the agent cannot answer: the
//! sandbox is paused (its agent frozen), or it runs without an agent.
//!
//! The path is resolved one component at a time with the archive API's stat, following
//! symlinks only while they stay inside the workspace; the engine reports a link's target
//! fully resolved within the container. While the sandbox is paused nothing inside can
//! change a component between the check and the read.

use bollard::query_parameters::{ContainerArchiveInfoOptions, DownloadFromContainerOptions};
use bollard::Docker;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use sandcell::{Error, ErrorKind, Result, SandboxPath};

use crate::error::{engine, is_not_found};

/// Go's `os.ModeDir` and `os.ModeSymlink`, as the engine reports modes.
const GO_MODE_DIR: u32 = 1 << 31;
const GO_MODE_SYMLINK: u32 = 1 << 27;

struct Stat {
    mode: u32,
    link_target: String,
}

async fn stat(docker: &Docker, container: &str, path: &str, shown: &SandboxPath) -> Result<Stat> {
    match docker
        .get_container_archive_info(
            container,
            Some(ContainerArchiveInfoOptions {
                path: path.to_owned(),
            }),
        )
        .await
    {
        Ok(s) => Ok(Stat {
            mode: s.file_mode,
            link_target: s.link_target,
        }),
        Err(e) if is_not_found(&e) => Err(Error::not_found(format!(
            "{shown}: no such file or directory"
        ))),
        Err(e) => Err(engine(format_args!("inspecting {shown}"), e)),
    }
}

/// The container path `path` resolves to, never leaving `workspace`.
async fn resolve(
    docker: &Docker,
    container: &str,
    workspace: &str,
    path: &SandboxPath,
) -> Result<String> {
    let inside = |p: &str| p == workspace || p.starts_with(&format!("{workspace}/"));
    let mut current = workspace.to_owned();
    for component in path.as_str().split('/').filter(|c| !c.is_empty()) {
        let candidate = format!("{current}/{component}");
        let s = stat(docker, container, &candidate, path).await?;
        current = if s.mode & GO_MODE_SYMLINK != 0 {
            if !inside(&s.link_target) {
                return Err(Error::permission_denied(format!(
                    "{path} resolves outside the workspace"
                )));
            }
            s.link_target
        } else {
            candidate
        };
    }
    Ok(current)
}

/// Reads a whole file of the workspace.
pub(crate) async fn read_file(
    docker: &Docker,
    container: &str,
    workspace: &str,
    path: &SandboxPath,
    max_bytes: u64,
) -> Result<Bytes> {
    let real = resolve(docker, container, workspace, path).await?;
    if stat(docker, container, &real, path).await?.mode & GO_MODE_DIR != 0 {
        return Err(Error::invalid_input(format!("{path} is a directory")));
    }
    let mut stream = docker
        .download_from_container(container, Some(DownloadFromContainerOptions { path: real }));
    let mut tar = BytesMut::new();
    // The file's bytes, its headers (a long name's too) and the padding: past this
    // the file holds more than `max_bytes`, and is not read further.
    let tar_limit = max_bytes.saturating_add(64 * 1024);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| engine(format_args!("reading {path}"), e))?;
        if (tar.len() + chunk.len()) as u64 > tar_limit {
            sandcell::raw::check_read_limit(path, u64::MAX, max_bytes)?;
        }
        tar.extend_from_slice(&chunk);
    }
    let mut archive = tar::Archive::new(&tar[..]);
    let entries = archive
        .entries()
        .map_err(|e| Error::io(format_args!("reading {path}"), e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::io(format_args!("reading {path}"), e))?;
        if entry.header().entry_type().is_file() {
            sandcell::raw::check_read_limit(path, entry.size(), max_bytes)?;
            let mut data = Vec::with_capacity(entry.size() as usize);
            std::io::Read::read_to_end(&mut entry, &mut data)
                .map_err(|e| Error::io(format_args!("reading {path}"), e))?;
            return Ok(data.into());
        }
    }
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!("{path} is not a regular file"),
    ))
}
