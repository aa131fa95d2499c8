//! The proxy variables a sandbox's tools read.

/// The environment that points a sandbox's tools at a proxy listening on `addr` inside
/// the sandbox: `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` (with lowercase twins, as
/// curl, pip, git and npm read different ones), and `NO_PROXY` for loopback.
///
/// ```
/// let env = sandcell::raw::egress::proxy_env("127.0.0.1:3128");
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
