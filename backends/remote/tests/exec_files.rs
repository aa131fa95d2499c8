//! Files over exec: a sandcell-server serving only the Fly Machines subset stands in
//! for a plain Fly endpoint, so the client moves files through `exec` alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance;
use sandcell_remote::{FlyBackend, FlyConfig, RateLimit, RateLimits};
use sandcell_server::ServerConfig;

/// A server without extensions, and a client whose limiter does not slow the suite.
async fn plain() -> (common::TestServer, FlyBackend) {
    let mut config = ServerConfig::new(common::TOKEN);
    config.faces = [sandcell_server::Face::Fly].into();
    let server = common::serve_local_with(config).await;
    let mut limits = RateLimits::default();
    limits.mutations = RateLimit::new(1000.0, 1000);
    limits.reads = RateLimit::new(1000.0, 1000);
    let backend = FlyBackend::connect(
        FlyConfig::new(&server.url, common::TOKEN)
            .retry(common::fast_retries())
            .rate_limits(limits),
    )
    .await
    .unwrap();
    assert!(!backend.has_extensions());
    (server, backend)
}

/// The conformance suite on a plain endpoint, one test per case.
mod plain_endpoint_conformance {
    async fn setup() -> super::conformance::Fixture {
        let (server, backend) = super::plain().await;
        super::conformance::Fixture::new(backend).guard(server)
    }
    sandcell::conformance_tests!(setup);
}

use bytes::Bytes;
use futures::StreamExt;
use sandcell::archive::ImportOptions;
use sandcell::testing::RawTar;
use sandcell::{
    ErrorKind, ReleaseMode, SandboxBackend, SandboxManager, SandboxPath, SandboxSpec, SandboxStatus,
};

fn p(path: &str) -> SandboxPath {
    SandboxPath::new(path).unwrap()
}

/// Exec calls the proxy saw.
fn execs(proxy: &common::proxy::FaultProxy) -> usize {
    proxy
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/exec"))
        .count()
}

/// Names in `dir` (recursively) that a file call's temporary files would have.
fn leftovers(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".sandcell-") {
            found.push(name);
        } else if entry.file_type().unwrap().is_dir() {
            found.extend(leftovers(&entry.path()));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_files_and_archives_cross_in_bounded_chunks_and_leave_nothing() {
    let (server, _) = plain().await;
    let proxy = common::proxy::FaultProxy::start(&server.url).await;
    let mut limits = RateLimits::default();
    limits.mutations = RateLimit::new(1000.0, 1000);
    let backend =
        FlyBackend::connect(FlyConfig::new(proxy.url(), common::TOKEN).rate_limits(limits))
            .await
            .unwrap();
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let local = server.local.inspect(&sandbox.id).await.unwrap();
    let workspace = std::path::PathBuf::from(&local.details["host_path"]);
    // The machine's temporary files go to its TMPDIR, the sandbox's own tmp beside its
    // workspace (the only other place a default local sandbox may write).
    let machine_tmp = workspace.parent().unwrap().join("tmp");
    assert!(machine_tmp.is_dir());

    // 1.5 MiB that is not text: three or more chunks each way.
    let data: Vec<u8> = (0..1_572_864u32).map(|i| (i * 7 % 251) as u8).collect();
    let before = execs(&proxy);
    backend
        .write(&sandbox.id, &p("big/blob.bin"), Bytes::from(data.clone()))
        .await
        .unwrap();
    assert!(execs(&proxy) - before >= 3, "written in chunks");
    let largest = proxy
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/exec"))
        .map(|r| r.body.len())
        .max()
        .unwrap();
    assert!(
        largest < 1 << 20,
        "every exec body stays under the server's 1 MiB JSON limit: {largest}"
    );
    let before = execs(&proxy);
    let back = backend.read(&sandbox.id, &p("big/blob.bin")).await.unwrap();
    assert!(execs(&proxy) - before >= 3, "read in chunks");
    assert!(back[..] == data[..], "read gives back what was written");
    assert_eq!(std::fs::read(workspace.join("big/blob.bin")).unwrap(), data);

    // Export (over several chunks), then import into another directory.
    let tar: Vec<u8> = backend
        .export_tar(&sandbox.id, &p("big"))
        .await
        .unwrap()
        .map(|c| c.unwrap().to_vec())
        .concat()
        .await;
    assert!(tar.len() > 1_572_864);
    backend
        .import_tar(
            &sandbox.id,
            &p("copy"),
            futures::stream::iter([Ok(Bytes::from(tar))]).boxed(),
            ImportOptions::replace(),
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(workspace.join("copy/blob.bin")).unwrap(),
        data
    );

    assert_eq!(leftovers(&workspace), Vec::<String>::new(), "workspace");
    assert_eq!(leftovers(&machine_tmp), Vec::<String>::new(), "TMPDIR");
    assert_eq!(std::fs::read_dir(&machine_tmp).unwrap().count(), 0);
    backend.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_archive_is_refused_before_the_machine_sees_it() {
    let (server, _) = plain().await;
    let proxy = common::proxy::FaultProxy::start(&server.url).await;
    let backend = common::client(&proxy.url()).await;
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    backend
        .write(&sandbox.id, &p("keep/a"), Bytes::from_static(b"a"))
        .await
        .unwrap();
    let hostile = RawTar::new()
        .file("fine", b"ok")
        .symlink("out", "/etc")
        .file("out/passwd", b"owned")
        .finish();
    let before = execs(&proxy);
    let err = backend
        .import_tar(
            &sandbox.id,
            &p("keep"),
            futures::stream::iter([Ok(hostile)]).boxed(),
            ImportOptions::replace(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert_eq!(execs(&proxy), before, "nothing was sent to the machine");
    let names: Vec<String> = backend
        .list_dir(&sandbox.id, &p("keep"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a"], "the directory is as it was");
    backend.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_session_is_thawed_for_its_snapshot_and_paused_again() {
    let (_server, backend) = plain().await;
    assert!(!backend.capabilities().files_while_paused);
    let backend: std::sync::Arc<dyn SandboxBackend> = std::sync::Arc::new(backend);
    let manager = SandboxManager::builder(std::sync::Arc::clone(&backend))
        .state_store(sandcell::store::InMemoryStateStore::new())
        .snapshot_store(sandcell::store::InMemorySnapshotStore::new())
        .suspend_strategy(sandcell::manager::SuspendStrategy::Pause)
        .build()
        .await
        .unwrap();
    let key = sandcell::store::SessionKey::new("t", "s").unwrap();
    let handle = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let id = handle.id().clone();
    handle
        .call("write", |b, id| async move {
            b.write(id, &p("notes.txt"), Bytes::from_static(b"kept"))
                .await
        })
        .await
        .unwrap();
    manager.release(&key, ReleaseMode::Suspend).await.unwrap();
    assert_eq!(
        backend.inspect(&id).await.unwrap().status,
        SandboxStatus::Paused
    );
    let err = backend.read(&id, &p("notes.txt")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");

    let manifest = manager.snapshot(&key).await.unwrap();
    assert_eq!(
        backend.inspect(&id).await.unwrap().status,
        SandboxStatus::Paused,
        "paused again after the snapshot"
    );
    let restored = manager.restore(&key, &manifest.id).await.unwrap();
    assert_eq!(
        &restored
            .call(
                "read",
                |b, id| async move { b.read(id, &p("notes.txt")).await }
            )
            .await
            .unwrap()[..],
        b"kept",
        "the snapshot holds the workspace"
    );
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_stdin_arrives_whole_and_binary_output_is_refused_not_corrupted() {
    use sandcell::{ExecRequest, SandboxBackendExt};
    let (_server, backend) = plain().await;
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let every_byte: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    let out = backend
        .run(
            &sandbox.id,
            ExecRequest::new(["sh", "-c", "cat > bin.dat; echo stored"]).stdin(every_byte.clone()),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "stored\n");
    assert_eq!(
        &backend.read(&sandbox.id, &p("bin.dat")).await.unwrap()[..],
        &every_byte[..]
    );
    // Text stdin still goes as it is.
    let out = backend
        .run(&sandbox.id, ExecRequest::new(["cat"]).stdin("héllo\n"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "héllo\n");

    let err = backend
        .run(&sandbox.id, ExecRequest::new(["cat", "bin.dat"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("stdout"), "{err}");
    backend.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_is_offered_only_when_the_workspace_outlives_a_restart() {
    let (server, backend) = plain().await;
    assert!(
        !backend.capabilities().reset,
        "Fly's restart wipes the root file system"
    );
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let err = backend.reset(&sandbox.id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    backend.destroy(&sandbox.id).await.unwrap();

    let on_volume = FlyBackend::connect(
        FlyConfig::new(&server.url, common::TOKEN).workspace_survives_restart(true),
    )
    .await
    .unwrap();
    assert!(on_volume.capabilities().reset);
    let sandbox = on_volume
        .create(&SandboxSpec::new("default"))
        .await
        .unwrap();
    on_volume
        .write(&sandbox.id, &p("kept.txt"), Bytes::from_static(b"kept"))
        .await
        .unwrap();
    on_volume.reset(&sandbox.id).await.unwrap();
    assert_eq!(
        &on_volume.read(&sandbox.id, &p("kept.txt")).await.unwrap()[..],
        b"kept"
    );
    on_volume.destroy(&sandbox.id).await.unwrap();
}

/// The crate docs' capability table says what each client reports.
#[tokio::test]
async fn the_capability_table_matches_the_clients() {
    let source = include_str!("../src/lib.rs");
    let (_server, fly) = plain().await;
    sandcell::testing::check_capability_table(source, "Fly endpoint", &fly.capabilities()).unwrap();
    let e2b = common::e2b_client("http://127.0.0.1:9").await;
    sandcell::testing::check_capability_table(source, "E2B", &e2b.capabilities()).unwrap();
}
