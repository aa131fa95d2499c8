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

/// The uid and gid a sandbox runs as where its image's user would be the host's root
/// (see [`DockerConfig::allow_host_root`](crate::DockerConfig::allow_host_root)): as the
/// local backend's sandbox owner, past the subordinate ranges a distribution hands out,
/// so no host account shares it.
pub const UNPRIVILEGED_USER: &str = "1000000000:1000000000";

/// Whether uid 0 in a container may be the host's root, read from the engine once.
#[derive(Debug, Default)]
pub(crate) struct RootGuard {
    /// The operator's opt-out ([`crate::DockerConfig::allow_host_root`]).
    allowed: bool,
    /// Whether the engine maps a container's root to the host's root: neither
    /// rootless nor remapping user namespaces (`userns-remap`).
    host_root: tokio::sync::OnceCell<bool>,
    /// Per image, the user its containers run as unless told otherwise (the image's
    /// configuration does not change under its name's prepared tag): read once, not at
    /// every create.
    defaults: std::sync::Mutex<std::collections::HashMap<String, Option<String>>>,
}

impl RootGuard {
    pub(crate) fn new(allowed: bool) -> RootGuard {
        RootGuard {
            allowed,
            host_root: tokio::sync::OnceCell::new(),
            defaults: Default::default(),
        }
    }

    /// Whether a container's uid 0 must be refused here.
    pub(crate) async fn forbids_root(&self, docker: &Docker) -> Result<bool> {
        if self.allowed {
            return Ok(false);
        }
        let host_root =
            self.host_root
                .get_or_try_init(|| async {
                    let info = docker.info().await.map_err(|e| {
                        crate::error::engine("asking the engine how it maps users", e)
                    })?;
                    let options = info.security_options.unwrap_or_default();
                    let remapped = options.iter().any(|option| {
                        option
                            .split(',')
                            .any(|part| part == "name=rootless" || part == "name=userns")
                    });
                    Ok::<bool, Error>(!remapped)
                })
                .await?;
        Ok(*host_root)
    }

    /// The user a container of `image` runs as unless a spec names one: the
    /// `configured` one, else the image's own, unless that is root where root is the
    /// host's: then [`UNPRIVILEGED_USER`] (`None`: the image's user, as it is).
    pub(crate) async fn default_user(
        &self,
        docker: &Docker,
        image: &str,
        configured: Option<&str>,
    ) -> Result<Option<String>> {
        if let Some(user) = configured {
            return Ok(Some(user.to_owned()));
        }
        if !self.forbids_root(docker).await? {
            return Ok(None);
        }
        if let Some(known) = crate::lock(&self.defaults).get(image) {
            return Ok(known.clone());
        }
        let user = docker
            .inspect_image(image)
            .await
            .map_err(|e| crate::error::engine(format_args!("inspecting image {image}"), e))?
            .config
            .and_then(|c| c.user)
            .unwrap_or_default();
        let user = names_root(&user).then(|| UNPRIVILEGED_USER.to_owned());
        crate::lock(&self.defaults).insert(image.to_owned(), user.clone());
        Ok(user)
    }

    /// Refuses to run `user` (a spec's, the configuration's or an exec request's; `None`:
    /// the image's) in `container` where it is uid 0 or gid 0 and those are the host's
    /// root; answers it as numbers (`uid:gid`), which an exec passes to the engine so
    /// that no name is looked up again in a file the sandbox may have changed.
    pub(crate) async fn check(
        &self,
        docker: &Docker,
        container: &str,
        user: Option<&str>,
    ) -> Result<Option<String>> {
        if let Some(user) = user {
            check_syntax(user)?;
        }
        if user == Some(UNPRIVILEGED_USER) || !self.forbids_root(docker).await? {
            return Ok(user.map(str::to_owned));
        }
        let (uid, gid) = resolve(docker, container, user).await?;
        if uid == 0 || gid == 0 {
            let user = user.unwrap_or("the image's user");
            return Err(Error::permission_denied(format!(
                "user {user:?} is uid {uid} and gid {gid} in the container, and this engine \
                 maps id 0 to the host's root (it is neither rootless nor remapping user \
                 namespaces); run sandboxes as another user and group, or set \
                 DockerConfig::allow_host_root"
            )));
        }
        Ok(Some(format!("{uid}:{gid}")))
    }
}

/// Refuses a user the engine might read otherwise than [`resolve`] does: only
/// `user` or `user:group`, each letters, digits, `_`, `.` and `-`, not starting with
/// `-` (the engine reads `-0` as the number 0).
fn check_syntax(user: &str) -> Result<()> {
    let part_ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with('-')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    };
    let ok = match user.split_once(':') {
        Some((name, group)) => part_ok(name) && part_ok(group),
        None => part_ok(user),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "user {user:?}: expected NAME, UID, NAME:GROUP or UID:GID (letters, digits, `_`, \
             `.` and `-`, not starting with `-`)"
        )))
    }
}

/// Whether an image's `User` is root without looking it up: unset, `root` or `0`,
/// with or without a group.
fn names_root(user: &str) -> bool {
    let name = user.split_once(':').map_or(user, |(name, _)| name);
    matches!(name.trim(), "" | "root" | "0")
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_named_with_or_without_a_group() {
        for user in ["", "root", "0", "root:root", "0:1000", " root "] {
            assert!(super::names_root(user), "{user:?}");
        }
        for user in ["sandbox", "1000", "1000:0", "rooty", "00x"] {
            assert!(!super::names_root(user), "{user:?}");
        }
    }

    #[test]
    fn users_the_engine_could_read_otherwise_are_refused() {
        for user in [
            "-0", "+0", " 0", "0 ", "a:b:c", ":0", "0:", "a b", "-x:1", "1:-0", "",
        ] {
            assert!(super::check_syntax(user).is_err(), "{user:?}");
        }
        for user in ["0", "root", "1000:1000", "sandbox:users", "a.b-c_d"] {
            assert!(super::check_syntax(user).is_ok(), "{user:?}");
        }
    }
}
