//! The resource limits (`nofile`, `nproc`) every container is created with, set
//! explicitly to the engine's own.
//!
//! An engine's defaults can be above what the host lets a container set: Podman asks
//! for a million open files and four million processes, and where its own hard limits
//! are lower and raising them is not allowed, the runtime refuses to start the
//! container at all. The engine's own limits are always within what the host allows,
//! so a container asking for exactly those starts on any engine.
//!
//! `nproc` is not taken from `Limits::pids`: the kernel counts it per user across the
//! whole host, not per container, so a small value would starve a sandbox of the
//! processes its user runs elsewhere. The container's cgroup enforces `pids`.

use std::path::Path;

use bollard::models::ResourcesUlimits;

/// The `ulimit` names engines take, and the line of `/proc/PID/limits` for each.
const LIMITS: [(&str, &str); 2] = [("nofile", "Max open files"), ("nproc", "Max processes")];

/// The limits to create containers with: those of the engine serving `socket` when it
/// runs on this host (the process at the socket's other end), else this process's. A
/// limit that is unbounded, or cannot be read, is left to the engine.
pub(crate) async fn for_engine(socket: Option<&Path>) -> Option<Vec<ResourcesUlimits>> {
    let engine = match socket {
        Some(socket) => engine_pid(socket).await,
        None => None,
    };
    let table = match engine {
        Some(pid) => std::fs::read_to_string(format!("/proc/{pid}/limits")).ok(),
        None => None,
    }
    .or_else(|| std::fs::read_to_string("/proc/self/limits").ok())?;
    let limits = parse(&table);
    (!limits.is_empty()).then_some(limits)
}

/// Limits as an inspect reported them, named as a create takes them: Podman reports
/// `RLIMIT_NOFILE` where it accepts only `nofile`.
pub(crate) fn as_create_takes(ulimits: Vec<ResourcesUlimits>) -> Vec<ResourcesUlimits> {
    ulimits
        .into_iter()
        .map(|mut limit| {
            limit.name = limit.name.map(|name| {
                let name = name.strip_prefix("RLIMIT_").unwrap_or(&name);
                name.to_ascii_lowercase()
            });
            limit
        })
        .collect()
}

/// The process serving a Unix socket, by the peer credentials of a connection to it.
async fn engine_pid(socket: &Path) -> Option<i32> {
    let stream = tokio::net::UnixStream::connect(socket).await.ok()?;
    stream.peer_cred().ok()?.pid()
}

/// The `nofile` and `nproc` limits of a `/proc/PID/limits` table; unbounded ones are
/// left out.
fn parse(table: &str) -> Vec<ResourcesUlimits> {
    LIMITS
        .iter()
        .filter_map(|(name, label)| {
            let line = table.lines().find(|l| l.starts_with(label))?;
            let mut fields = line[label.len()..].split_whitespace();
            let soft: i64 = fields.next()?.parse().ok()?;
            let hard: i64 = fields.next()?.parse().ok()?;
            Some(ResourcesUlimits {
                name: Some((*name).to_owned()),
                soft: Some(soft.min(hard)),
                hard: Some(hard),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max processes             32768                32768                processes 
Max open files            1024                 20000                files     
Max locked memory         8388608              8388608              bytes     
";

    #[test]
    fn reads_nofile_and_nproc_from_a_limits_table() {
        let limits = parse(TABLE);
        let pairs: Vec<_> = limits
            .iter()
            .map(|l| (l.name.as_deref().unwrap(), l.soft.unwrap(), l.hard.unwrap()))
            .collect();
        assert_eq!(pairs, [("nofile", 1024, 20000), ("nproc", 32768, 32768)]);
    }

    #[test]
    fn unbounded_or_garbled_limits_are_left_to_the_engine() {
        let table = TABLE
            .replace(
                "32768                32768",
                "unlimited            unlimited",
            )
            .replace("1024                 20000", "many much");
        assert!(parse(&table).is_empty());
        assert!(parse("").is_empty());
    }

    #[test]
    fn inspected_limits_are_renamed_as_a_create_takes_them() {
        let limit = |name: &str| ResourcesUlimits {
            name: Some(name.to_owned()),
            soft: Some(1),
            hard: Some(2),
        };
        let renamed = as_create_takes(vec![limit("RLIMIT_NOFILE"), limit("nproc")]);
        assert_eq!(renamed, [limit("nofile"), limit("nproc")]);
    }

    #[tokio::test]
    async fn without_a_socket_this_process_limits_are_used() {
        let limits = for_engine(None)
            .await
            .expect("this process has finite limits");
        let nofile = limits.iter().find(|l| l.name.as_deref() == Some("nofile"));
        let own = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if let (Some(nofile), Some(hard)) = (nofile, own.maximum) {
            assert_eq!(nofile.hard, Some(hard as i64));
        }
    }
}
