//! Network allowlists and the egress proxy that enforces them: what a sandbox with
//! [`Network::Allowlist`](crate::Network::Allowlist) may connect to, decided outside
//! the sandbox.
//!
//! A backend that enforces an allowlist gives the sandbox no route out except to an
//! [`EgressProxy`] it runs outside the sandbox's reach, and sets the usual proxy
//! variables ([`proxy_env`]) for the tools that honour them. A tool that ignores them
//! has no other way out, so it fails closed.

mod allowlist;
mod host_networks;
mod proxy;
mod relay;
mod served;
mod sni;

pub use allowlist::{is_private, reaches_host, Allowlist, Rule};
pub use host_networks::{host_networks, on_host_network};
pub use proxy::{EgressCount, EgressProxy, DENIED_HEADER, OTHER_HOSTS};
pub use relay::{relay, Socket};
pub use served::ServedProxies;

/// The environment that points a sandbox's tools at a proxy listening on `addr` inside
/// the sandbox: `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` (with lowercase twins, as
/// curl, pip, git and npm read different ones), and `NO_PROXY` for loopback.
///
/// ```
/// let env = sandcell::egress::proxy_env("127.0.0.1:3128");
/// assert!(env.contains(&("https_proxy".to_owned(), "http://127.0.0.1:3128".to_owned())));
/// ```
pub fn proxy_env(addr: &str) -> Vec<(String, String)> {
    let url = format!("http://{addr}");
    let mut env = Vec::new();
    for name in ["http_proxy", "https_proxy", "all_proxy"] {
        env.push((name.to_owned(), url.clone()));
        env.push((name.to_ascii_uppercase(), url.clone()));
    }
    let local = "localhost,127.0.0.1,::1".to_owned();
    env.push(("no_proxy".to_owned(), local.clone()));
    env.push(("NO_PROXY".to_owned(), local));
    env
}
