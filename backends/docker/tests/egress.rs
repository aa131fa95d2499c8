//! Network policies on Docker: an allowlist through the agent and the host's egress
//! proxy, `None` and `Full`, against servers on this machine. The image carries this
//! host's `curl` (with the libraries it links) over the busybox base.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use sandcell::testing::egress::{self, EgressWorld};
use sandcell::{ErrorKind, SandboxBackend, SandboxSpec};
use sandcell_docker::{DockerBackend, ImageSpec};

mod common;

const CURL_IMAGE: &str = "sandcell-test/busybox-curl:latest";

async fn curl_image() {
    static READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    READY
        .get_or_init(|| async {
            let work = tempfile::tempdir().unwrap();
            let rootfs = work.path().join("rootfs");
            let busybox = sandcell_docker::testing::host_busybox()
                .expect("busybox is installed (apt-get install busybox-static)");
            sandcell_docker::testing::busybox_rootfs(&busybox, &rootfs).unwrap();
            let curl = Path::new("/usr/bin/curl");
            assert!(
                curl.is_file(),
                "the egress tests need curl on this host (apt-get install curl)"
            );
            sandcell_docker::testing::copy_host_program(curl, &rootfs).unwrap();
            // Always afresh: the host's curl may have changed.
            DockerBackend::builder()
                .template("curl", ImageSpec::import(&rootfs, CURL_IMAGE))
                .build()
                .unwrap()
                .prepare_images()
                .await
                .expect("importing the curl image");
        })
        .await;
}

async fn backend() -> Option<DockerBackend> {
    if !common::engine_available().await {
        return None;
    }
    curl_image().await;
    let mut builder = DockerBackend::builder()
        .template("default", ImageSpec::pull(CURL_IMAGE))
        .agent(common::agent_binary());
    for (name, addrs) in EgressWorld::hosts() {
        builder = builder.egress_host(name, addrs);
    }
    Some(builder.build().unwrap())
}

fn spec() -> SandboxSpec {
    SandboxSpec::default().label(common::TEST_LABEL.0, common::TEST_LABEL.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_enforces_an_allowlist() {
    let Some(b) = backend().await else {
        return;
    };
    assert!(b.capabilities().network_allowlist && b.capabilities().network_update);
    let world = EgressWorld::start().await;
    egress::allowlist_is_enforced(&b, spec(), &world).await;
    // A full network here reaches nothing of the host's, this world's addresses on
    // the host included (ADVERSARIAL 38): tests/network.rs checks its way out.
    egress::none_holds(&b, spec(), &world).await;
}

/// The host directory holding the proxy's socket goes with the sandbox, and a backend
/// in a new process serves the way out of a sandbox made before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_backend_adopts_the_way_out_and_destroy_leaves_nothing() {
    let Some(first) = backend().await else {
        return;
    };
    let runtime = tempfile::tempdir().unwrap();
    let make = || {
        let mut builder = DockerBackend::builder()
            .template("default", ImageSpec::pull(CURL_IMAGE))
            .agent(common::agent_binary())
            .runtime_dir(runtime.path());
        for (name, addrs) in EgressWorld::hosts() {
            builder = builder.egress_host(name, addrs);
        }
        builder.build().unwrap()
    };
    drop(first);
    let world = EgressWorld::start().await;
    let a = format!("http://a.test:{}/", world.a_http);
    let one = make();
    let info = one
        .create(&spec().network(egress::allowlist()))
        .await
        .unwrap();
    assert_eq!(info.network, egress::allowlist());
    assert_eq!(
        egress::fetch(&one, &info.id, "", &a).await.body,
        egress::BODY_A
    );
    drop(one);
    let two = make();
    assert_eq!(
        two.inspect(&info.id).await.unwrap().network,
        egress::allowlist()
    );
    let seen = egress::fetch(&two, &info.id, "", &a).await;
    assert_eq!(
        seen.body,
        egress::BODY_A,
        "a new backend serves it: {seen:?}"
    );
    two.destroy(&info.id).await.unwrap();
    assert_eq!(
        std::fs::read_dir(runtime.path()).unwrap().count(),
        0,
        "nothing left"
    );
}

/// Without the agent there is nothing inside to relay to the proxy: an allowlist is
/// refused, never silently widened.
#[tokio::test]
async fn without_the_agent_an_allowlist_is_refused() {
    if !common::engine_available().await {
        return;
    }
    let b = DockerBackend::builder()
        .template("default", ImageSpec::pull(common::USER_IMAGE))
        .build()
        .unwrap();
    assert!(!b.capabilities().network_allowlist);
    let err = b
        .create(&spec().network(egress::allowlist()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}
