//! Host mounts through sandcell-server: refused unless the operator allowed a host
//! directory, then only beneath it (links and `..` resolved first), and read-write only
//! where allowed. Nothing is created for a refused spec.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::{ErrorKind, LabelSelector, Mount, SandboxBackend, SandboxPath, SandboxSpec};
use sandcell_server::{HostPath, ServerConfig};

fn mount(host: &std::path::Path, read_only: bool) -> SandboxSpec {
    let target = SandboxPath::new("mnt").unwrap();
    let mount = if read_only {
        Mount::read_only(host, target)
    } else {
        Mount::read_write(host, target)
    };
    SandboxSpec::new("default").mount(mount)
}

async fn refused(server: &common::TestServer, spec: &SandboxSpec, why: &str) {
    let client = common::client(&server.url).await;
    let err = client.create(spec).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::PermissionDenied | ErrorKind::Unsupported
        ),
        "{why}: {err}"
    );
    assert!(
        server
            .local
            .list(&LabelSelector::new())
            .await
            .unwrap()
            .is_empty(),
        "{why}: nothing created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_mounts_need_a_directory_the_operator_allowed() {
    let host = tempfile::tempdir().unwrap();
    let shared = host.path().join("shared");
    let secret = host.path().join("secret");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(shared.join("facts.md"), "fact").unwrap();
    std::os::unix::fs::symlink(&secret, shared.join("out")).unwrap();

    // The default: no host mount at all, and the capability says so.
    let server = common::serve_local_with(ServerConfig::new(common::TOKEN)).await;
    let client = common::client(&server.url).await;
    assert!(!client.capabilities().host_mounts);
    refused(&server, &mount(&shared, true), "no allowed directory").await;
    // ADVERSARIAL.md 32: the host's root and /etc.
    refused(&server, &mount(std::path::Path::new("/"), true), "/").await;
    refused(&server, &mount(std::path::Path::new("/etc"), false), "/etc").await;
    // The capability check stops it in the client; a raw request stops at the server.
    let raw = reqwest::Client::new()
        .post(format!("{}/v1/apps/sandcell/machines", server.url))
        .bearer_auth(common::TOKEN)
        .json(&serde_json::json!({
            "config": {
                "image": "default",
                "metadata": {"sandcell.spec": serde_json::to_string(&mount(&secret, false)).unwrap()}
            }
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 403);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("--allow-host-path"),
        "{body}"
    );
    assert!(server
        .local
        .list(&LabelSelector::new())
        .await
        .unwrap()
        .is_empty());

    // Allowed read-only: a read-only mount beneath it works; a writable one, a path
    // outside, `..` out of it and a link out of it do not.
    let server = common::serve_local_with(
        ServerConfig::new(common::TOKEN).allow_host_path(HostPath::read_only(&shared)),
    )
    .await;
    let client = common::client(&server.url).await;
    assert!(client.capabilities().host_mounts);
    let ok = client.create(&mount(&shared, true)).await.unwrap();
    let facts = SandboxPath::new("mnt/facts.md").unwrap();
    assert_eq!(&client.read(&ok.id, &facts).await.unwrap()[..], b"fact");
    client.destroy(&ok.id).await.unwrap();
    refused(
        &server,
        &mount(&shared, false),
        "read-write beneath a read-only rule",
    )
    .await;
    refused(&server, &mount(&secret, true), "outside").await;
    refused(&server, &mount(&shared.join("../secret"), true), "`..` out").await;
    refused(&server, &mount(&shared.join("out"), true), "a link out").await;
    refused(&server, &mount(std::path::Path::new("/etc"), true), "/etc").await;

    // Allowed writable: a read-write mount works. Run as root, the local backend
    // refuses a writable mount of a directory root owns (what the sandbox made there
    // would be root's on the host), so the directory is given to another user.
    // (`/proc/self` belongs to this process's effective uid.)
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if root {
        std::os::unix::fs::chown(&shared, Some(4242), Some(4242)).unwrap();
    }
    let server = common::serve_local_with(
        ServerConfig::new(common::TOKEN).allow_host_path(HostPath::writable(&shared)),
    )
    .await;
    let client = common::client(&server.url).await;
    let rw = client.create(&mount(&shared, false)).await.unwrap();
    client.destroy(&rw.id).await.unwrap();
}
