//! The way out of a container with `Network::Allowlist`: the container has no network
//! (`none`), its agent listens on `127.0.0.1:3128` inside and relays each connection to
//! a Unix socket this process serves with the sandbox's [`EgressProxy`], in a host
//! directory mounted read-only into the container.
//!
//! The socket is the container's only way out, and it leads to the proxy alone. The
//! allowlist in force is kept beside it (`allowlist.json`), so a backend in a new
//! process serves the same list.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use sandcell::egress::Allowlist;
use sandcell::raw::egress::{EgressProxy, ServedProxies};
use sandcell::{Error, Result, SandboxId};

/// Where the host directory appears inside the container.
pub(crate) const CONTAINER_DIR: &str = "/.sandcell/egress";
/// The proxy's socket in that directory.
const SOCKET: &str = "proxy.sock";
/// The allowlist in force, as JSON entries.
const LIST: &str = "allowlist.json";
/// Where the agent listens for the sandbox's tools.
pub(crate) const LISTEN: &str = "127.0.0.1:3128";

/// The agent's `--egress` argument: where to listen, and where to relay.
pub(crate) fn agent_argument() -> String {
    format!("{LISTEN}={CONTAINER_DIR}/{SOCKET}")
}

/// The host directory of sandbox `id` beneath `root`.
pub(crate) fn host_dir(root: &Path, id: &SandboxId) -> PathBuf {
    root.join(id.as_str())
}

/// Makes the host directory of `id` with its allowlist and serves its socket. Call
/// before the container is created: the engine mounts the directory.
pub(crate) fn serve(
    proxies: &ServedProxies,
    root: &Path,
    id: &SandboxId,
    entries: &[String],
    hosts: &BTreeMap<String, Vec<IpAddr>>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let allowlist = Allowlist::parse(entries)?;
    // The proxy here never reaches them: refused now rather than at each connection.
    allowlist.refuse_private(false, "not on this backend")?;
    let dir = host_dir(root, id);
    let io = |what: &str, e| Error::io(format_args!("{what} {}", dir.display()), e);
    std::fs::create_dir_all(&dir).map_err(|e| io("creating", e))?;
    write_list(&dir, entries)?;
    let socket = dir.join(SOCKET);
    // A socket left by a process that served this sandbox before.
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| io("listening in", e))?;
    // The container's user, whoever it is, connects; only this sandbox sees the socket.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| io("opening the socket in", e))?;
    let proxy = EgressProxy::with_hosts(allowlist, hosts.clone());
    let task = proxy.spawn_unix_listener(listener);
    proxies.insert(id.clone(), proxy, task);
    Ok(())
}

/// Serves `id` from this process if it has an allowlist and nobody here serves it yet
/// (the backend was restarted since the container was made).
pub(crate) fn adopt(
    proxies: &ServedProxies,
    root: &Path,
    id: &SandboxId,
    hosts: &BTreeMap<String, Vec<IpAddr>>,
) -> Result<()> {
    if proxies.serves(id) {
        return Ok(());
    }
    match entries(root, id) {
        Some(entries) => serve(proxies, root, id, &entries, hosts),
        None => Ok(()),
    }
}

/// The allowlist in force for `id`, if it has one.
pub(crate) fn entries(root: &Path, id: &SandboxId) -> Option<Vec<String>> {
    let text = std::fs::read(host_dir(root, id).join(LIST)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Replaces the allowlist of `id`, served here.
pub(crate) fn update(
    proxies: &ServedProxies,
    root: &Path,
    id: &SandboxId,
    entries: &[String],
) -> Result<()> {
    let allowlist = Allowlist::parse(entries)?;
    // The proxy here never reaches them: refused now rather than at each connection.
    allowlist.refuse_private(false, "not on this backend")?;
    write_list(&host_dir(root, id), entries)?;
    proxies.set_allowlist(id, allowlist);
    Ok(())
}

/// Stops serving `id` and removes its host directory.
pub(crate) fn remove(proxies: &ServedProxies, root: &Path, id: &SandboxId) {
    proxies.forget(id);
    let _ = std::fs::remove_dir_all(host_dir(root, id));
}

fn write_list(dir: &Path, entries: &[String]) -> Result<()> {
    let json = serde_json::to_vec(entries).map_err(|e| {
        Error::with_source(sandcell::ErrorKind::Backend, "encoding the allowlist", e)
    })?;
    let tmp = dir.join(format!(".{LIST}.tmp"));
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, dir.join(LIST)))
        .map_err(|e| {
            Error::io(
                format_args!("writing the allowlist in {}", dir.display()),
                e,
            )
        })
}
