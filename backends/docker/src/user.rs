//! Resolving the container's user to numeric ids, so the workspace can be given to it.

use bollard::query_parameters::DownloadFromContainerOptions;
use bollard::Docker;
use futures::StreamExt;
use sandcell::{Error, ErrorKind, Result};

/// `(uid, gid)` of `user` (`name`, `uid`, `uid:gid`, `name:group`) in the container, or
/// of the image's user when `None`; root when there is none. Names are looked up in the
/// container's `/etc/passwd` and `/etc/group`.
pub(crate) async fn resolve(
    docker: &Docker,
    container: &str,
    user: Option<&str>,
) -> Result<(u32, u32)> {
    let user = match user {
        Some(u) => u.to_owned(),
        None => docker
            .inspect_container(container, None)
            .await
            .map_err(|e| crate::error::engine("inspecting the container's user", e))?
            .config
            .and_then(|c| c.user)
            .unwrap_or_default(),
    };
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (name, group) = match user.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (user.as_str(), None),
    };
    let passwd = read_file(docker, container, "/etc/passwd")
        .await
        .unwrap_or_default();
    let (uid, primary_gid) = match name.parse::<u32>() {
        Ok(uid) => (
            uid,
            find(&passwd, 2, &uid.to_string()).and_then(|f| f.get(3)?.parse().ok()),
        ),
        Err(_) => {
            let fields = find(&passwd, 0, name).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("user {name:?} does not exist in the image"),
                )
            })?;
            let uid = fields.get(2).and_then(|v| v.parse().ok());
            let gid = fields.get(3).and_then(|v| v.parse().ok());
            (
                uid.ok_or_else(|| Error::invalid_input(format!("user {name:?} has no uid")))?,
                gid,
            )
        }
    };
    let gid = match group {
        None => primary_gid.unwrap_or(uid),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read_file(docker, container, "/etc/group")
                    .await
                    .unwrap_or_default();
                find(&groups, 0, g)
                    .and_then(|f| f.get(2)?.parse().ok())
                    .ok_or_else(|| {
                        Error::invalid_input(format!("group {g:?} does not exist in the image"))
                    })?
            }
        },
    };
    Ok((uid, gid))
}

/// The `:`-separated fields of the first line whose field `index` is `value`.
fn find(text: &str, index: usize, value: &str) -> Option<Vec<String>> {
    text.lines()
        .map(|l| l.split(':').map(str::to_owned).collect::<Vec<_>>())
        .find(|f| f.get(index).map(String::as_str) == Some(value))
}

/// A small file from the container, through the archive API.
async fn read_file(docker: &Docker, container: &str, path: &str) -> Result<String> {
    let mut stream = docker.download_from_container(
        container,
        Some(DownloadFromContainerOptions {
            path: path.to_owned(),
        }),
    );
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| crate::error::engine(format_args!("reading {path}"), e))?;
        if tar.len() + chunk.len() > 1 << 20 {
            return Err(Error::limit_exceeded(format!("{path} is over 1 MiB")));
        }
        tar.extend_from_slice(&chunk);
    }
    let mut archive = tar::Archive::new(tar.as_slice());
    let entries = archive
        .entries()
        .map_err(|e| Error::io(format_args!("reading {path}"), e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::io(format_args!("reading {path}"), e))?;
        if entry.header().entry_type().is_file() {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text)
                .map_err(|e| Error::io(format_args!("reading {path}"), e))?;
            return Ok(text);
        }
    }
    Err(Error::not_found(format!("{path} is not a file")))
}
