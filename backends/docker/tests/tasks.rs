//! Multi-container sandboxes and clones against a real engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use sandcell::{SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};
use sandcell_docker::{DockerBackend, ImageSpec, SidecarSpec};

/// A busybox web server answering `hello-from-<name>` on port 8080.
fn web(name: &str) -> SidecarSpec {
    SidecarSpec::new(name, ImageSpec::pull(common::BASE_IMAGE))
        .hostname(format!("{name}-host"))
        .env("GREETING", format!("hello-from-{name}"))
        .cmd([
            "sh",
            "-c",
            "mkdir -p /tmp/www && echo \"$GREETING\" > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www",
        ])
}

async fn backend() -> DockerBackend {
    common::images().await;
    DockerBackend::builder()
        .template("default", ImageSpec::pull(common::USER_IMAGE))
        .sidecar("default", web("web"))
        .sidecar("default", web("api"))
        .agent(common::agent_binary())
        .build()
        .unwrap()
}

fn spec(test: &str) -> SandboxSpec {
    SandboxSpec::new("default").label(common::TEST_LABEL.0, test)
}

/// Fetches a URL from inside the sandbox, retrying while the service starts.
async fn fetch(backend: &DockerBackend, id: &SandboxId, url: &str) -> String {
    let script = format!(
        "for i in $(seq 1 100); do wget -qO- {url} 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    );
    let out = backend.run_shell(id, &script).await.unwrap();
    assert!(out.success(), "{url} never answered: {}", out.stderr_str());
    out.stdout_str().into_owned()
}

/// Containers and networks still on the engine for sandbox `id`.
async fn remains(backend: &DockerBackend, id: &SandboxId) -> (usize, usize) {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![format!("sandcell.docker.task={id}")],
    )]);
    let containers = backend
        .docker()
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(filters.clone()),
            ..Default::default()
        }))
        .await
        .unwrap()
        .len();
    let networks = backend
        .docker()
        .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
            filters: Some(filters),
        }))
        .await
        .unwrap()
        .len();
    (containers, networks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_are_reachable_by_hostname_and_go_with_their_sandbox() {
    if !common::engine_available().await {
        return;
    }
    let backend = backend().await;
    let sandbox = backend.create(&spec("services")).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    assert_eq!(
        remains(&backend, &sandbox.id).await,
        (2, 1),
        "two services, one network"
    );
    assert_eq!(
        fetch(&backend, &sandbox.id, "http://web-host:8080/").await,
        "hello-from-web\n"
    );
    assert_eq!(
        fetch(&backend, &sandbox.id, "http://api:8080/").await,
        "hello-from-api\n",
        "the service name works too"
    );
    // The spec asked for no network, so the task network is internal: no way out.
    let network = backend
        .docker()
        .inspect_network(
            &format!("{}-net", sandbox.id),
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .unwrap();
    assert_eq!(network.internal, Some(true));
    // Docker's resolver in each container forwards upstream (before 26.0.0 from the
    // host's namespace, CVE-2024-29018): every container names one nothing answers.
    for name in [sandbox.id.to_string(), format!("{}-web", sandbox.id)] {
        let inspected = backend.docker().inspect_container(&name, None).await;
        let dns = inspected.unwrap().host_config.unwrap().dns;
        assert_eq!(dns, Some(vec!["192.0.2.1".to_owned()]), "{name}");
    }
    // The names come from the hosts file: no resolver on the bridge answers a sandbox
    // without a network (Podman's would forward any other name upstream, carrying
    // whatever the sandbox put in it).
    let gateway = network.ipam.unwrap().config.unwrap()[0]
        .gateway
        .clone()
        .unwrap();
    let asked = backend
        .run_shell(
            &sandbox.id,
            &format!("timeout 5 nslookup web-host {gateway}; echo exit=$?"),
        )
        .await
        .unwrap();
    let answer = asked.stdout_str();
    assert!(
        !answer.contains("exit=0") && !answer.contains("Address: 1"),
        "a resolver on the bridge answered: {answer}"
    );

    backend.destroy(&sandbox.id).await.unwrap();
    assert_eq!(
        remains(&backend, &sandbox.id).await,
        (0, 0),
        "services and network removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_is_independent_of_its_source() {
    if !common::engine_available().await {
        return;
    }
    let backend = backend().await;
    let source = backend.create(&spec("clone")).await.unwrap();
    let _source_guard = common::Guard::new(&backend, &source.id);
    backend
        .write_string(
            &source.id,
            &"state.txt".parse().unwrap(),
            "before the clone",
        )
        .await
        .unwrap();
    let clone = backend
        .clone_sandbox(
            &source.id,
            BTreeMap::from([(common::TEST_LABEL.0.to_owned(), "clone-copy".to_owned())]),
        )
        .await
        .unwrap();
    let _clone_guard = common::Guard::new(&backend, &clone.id);
    assert_ne!(clone.id, source.id);
    assert_eq!(clone.labels[common::TEST_LABEL.0], "clone-copy");
    assert_eq!(
        backend
            .read_to_string(&clone.id, &"state.txt".parse().unwrap())
            .await
            .unwrap(),
        "before the clone"
    );
    backend
        .write_string(
            &clone.id,
            &"state.txt".parse().unwrap(),
            "changed in the clone",
        )
        .await
        .unwrap();
    backend
        .write_string(&clone.id, &"only-in-clone.txt".parse().unwrap(), "x")
        .await
        .unwrap();
    assert_eq!(
        backend
            .read_to_string(&source.id, &"state.txt".parse().unwrap())
            .await
            .unwrap(),
        "before the clone",
        "writes to the clone do not reach the source"
    );
    assert!(backend
        .stat(&source.id, &"only-in-clone.txt".parse().unwrap())
        .await
        .is_err());
    // The clone has services of its own, on a network of its own.
    assert_eq!(remains(&backend, &clone.id).await, (2, 1));
    assert_eq!(
        fetch(&backend, &clone.id, "http://web-host:8080/").await,
        "hello-from-web\n"
    );

    for id in [&clone.id, &source.id] {
        backend.destroy(id).await.unwrap();
        assert_eq!(remains(&backend, id).await, (0, 0));
    }
    let images = backend
        .docker()
        .list_images(Some(bollard::query_parameters::ListImagesOptions {
            filters: Some(HashMap::from([(
                "reference".to_owned(),
                vec![format!("sandcell-clone:{}*", clone.id)],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(images.is_empty(), "clone images removed: {images:?}");
}
