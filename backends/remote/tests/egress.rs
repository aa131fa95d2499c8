//! Network policies through sandcell-server: a remote client's allowlist is enforced by
//! the served local backend, `set_network` crosses the wire, and `inspect` reports the
//! list in force.
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::egress::{self, EgressWorld};
use sandcell::{SandboxBackend, SandboxSpec};
use sandcell_local::LocalBackend;
use sandcell_remote::server::ServerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_allowlist_is_enforced_and_changes_over_the_wire() {
    let root = tempfile::tempdir().unwrap();
    let mut builder = LocalBackend::builder().root(root.path());
    for (name, addrs) in EgressWorld::hosts() {
        builder = builder.egress_host(name, addrs);
    }
    let local = builder.build().unwrap();
    if !local.capabilities().network_allowlist {
        sandcell::testing::require_or_skip(
            "LANDLOCK_NETWORK",
            "an allowlist at the local backend's default isolation",
            Err("no Landlock ABI 4, or no writable cgroup v2".to_owned()),
        );
        return;
    }
    let server = common::serve_built(local, root, ServerConfig::new(common::TOKEN)).await;
    let remote = common::client(&server.url).await;
    let caps = remote.capabilities();
    assert!(caps.network_allowlist && caps.network_update, "{caps:?}");
    let world = EgressWorld::start().await;
    egress::allowlist_is_enforced(&remote, SandboxSpec::default(), &world).await;
    egress::none_and_full_hold(&remote, SandboxSpec::default(), &world).await;
}
