//! SandboxManager over real backends: the local backend directly and boxed from a config
//! file. Also the compile check that both `SandboxManager<LocalBackend>` and
//! `SandboxManager<Box<dyn SandboxBackend>>` build.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::{
    BackendRegistry, ErrorKind, ExecRequest, ReleaseMode, SandboxBackend, SandboxBackendExt,
    SandboxConfig, SandboxManager, SandboxSpec, SessionKey,
};
use sandcell_local::LocalBackend;

fn registry() -> BackendRegistry {
    BackendRegistry::new().register("local", LocalBackend::from_options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_session_survives_suspend_and_a_new_manager() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(dir.path().join("local"))
        .build()
        .unwrap();
    let manager: SandboxManager<LocalBackend> = SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let key = SessionKey::new("acme", "agent-1").unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    sandbox
        .call("run", |b, id| {
            b.run(
                id,
                ExecRequest::new(["sh", "-c", "mkdir -p src && echo 'print(42)' > src/main.py"]),
            )
        })
        .await
        .unwrap();
    manager.release(&key, ReleaseMode::Suspend).await.unwrap();
    let listed = manager.backend().list(&Default::default()).await.unwrap();
    assert!(
        listed.is_empty(),
        "suspend destroys the sandbox: {listed:?}"
    );
    drop(manager);

    let backend = LocalBackend::builder()
        .root(dir.path().join("local"))
        .build()
        .unwrap();
    let manager = SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let out = sandbox
        .call("run", |b, id| {
            b.run(id, ExecRequest::new(["cat", "src/main.py"]))
        })
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "print(42)\n");
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
    assert!(manager
        .backend()
        .list(&Default::default())
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_starts_from_the_snapshots_template_not_the_callers() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("proj");
    std::fs::create_dir_all(&template).unwrap();
    std::fs::write(template.join("base.txt"), "from the template\n").unwrap();
    let backend = LocalBackend::builder()
        .root(dir.path().join("local"))
        .template("proj", &template)
        .build()
        .unwrap();
    let manager = SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let key = SessionKey::new("acme", "rebase").unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("proj"))
        .await
        .unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &"mine.txt".parse().unwrap(), "edited\n".into())
                .await
        })
        .await
        .unwrap();
    manager.release(&key, ReleaseMode::Suspend).await.unwrap();
    let manifest = manager.snapshots(&key).await.unwrap().pop().unwrap();
    assert!(
        manifest.incremental,
        "overlay snapshots hold only the changes"
    );

    // Asked for another template, the restore still rebuilds the session's workspace.
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    assert_eq!(
        sandbox
            .call("read_to_string", |b, id| async move {
                b.read_to_string(id, &"base.txt".parse().unwrap()).await
            })
            .await
            .unwrap(),
        "from the template\n"
    );
    assert_eq!(
        sandbox
            .call("read_to_string", |b, id| async move {
                b.read_to_string(id, &"mine.txt".parse().unwrap()).await
            })
            .await
            .unwrap(),
        "edited\n"
    );
    assert_eq!(sandbox.info().template, "proj");
    let record = manager.session(&key).await.unwrap().unwrap();
    assert_eq!(record.spec.template, "proj");
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
    assert!(manager.session(&key).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_is_chosen_from_yaml_toml_or_json() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let data = dir.path().join("data");
    let yaml = format!(
        "type: local\nroot: {}\ndata_dir: {}\nmanager:\n  max_sandboxes_per_tenant: 1\n  idle_timeout: 900\n",
        root.display(),
        data.display()
    );
    let toml = format!(
        "type = \"local\"\nroot = \"{}\"\ndata_dir = \"{}\"\n[manager]\nmax_sandboxes_per_tenant = 1\nidle_timeout = 900\n",
        root.display(),
        data.display()
    );
    let json = serde_json::json!({
        "type": "local", "root": root, "data_dir": data,
        "manager": {"max_sandboxes_per_tenant": 1, "idle_timeout": 900},
    });
    let configs: Vec<SandboxConfig> = vec![
        serde_yaml::from_str(&yaml).unwrap(),
        toml::from_str(&toml).unwrap(),
        serde_json::from_value(json).unwrap(),
    ];
    assert_eq!(configs[0], configs[1]);
    assert_eq!(configs[1], configs[2]);

    let manager: SandboxManager<Box<dyn SandboxBackend>> =
        configs[0].build_manager(&registry()).await.unwrap();
    assert_eq!(manager.backend().name(), "local");
    assert_eq!(
        manager.settings().idle_timeout,
        Some(std::time::Duration::from_secs(900))
    );
    let key = SessionKey::new("acme", "s").unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let out = sandbox
        .call("run", |b, id| b.run(id, ExecRequest::new(["echo", "hi"])))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "hi\n");
    let err = manager
        .acquire(
            &SessionKey::new("acme", "second").unwrap(),
            &SandboxSpec::new("default"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded);
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
}

#[tokio::test]
async fn config_mistakes_are_invalid_input_naming_the_problem() {
    let unknown: SandboxConfig = serde_yaml::from_str("type: dokcer\n").unwrap();
    let err = unknown.build_backend(&registry()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        err.to_string().contains("dokcer") && err.to_string().contains("local"),
        "{err}"
    );

    let typo: SandboxConfig = serde_yaml::from_str("type: local\nisolaton: landlock\n").unwrap();
    let err = typo.build_backend(&registry()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("isolaton"), "{err}");

    let bad_setting =
        serde_yaml::from_str::<SandboxConfig>("type: local\nmanager:\n  idle_timout: 5\n");
    assert!(bad_setting.unwrap_err().to_string().contains("idle_timout"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_outlive_their_handle_and_end_with_the_session() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(dir.path().join("local"))
        .build()
        .unwrap();
    let manager = SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let key = SessionKey::new("acme", "bg").unwrap();
    let handle = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let id = handle
        .spawn(ExecRequest::shell("echo serving; exec sleep 300"))
        .await
        .unwrap();
    assert_eq!(handle.processes().len(), 1);
    drop(handle);
    // The handle is gone; the process is not.
    let mut events = manager.background().attach(&id).unwrap();
    let first = events.next().await.unwrap();
    assert_eq!(first, sandcell::ProcessEvent::Stdout("serving\n".into()));
    assert_eq!(manager.background().info(&id).unwrap().status, None);
    let ended = manager.background().wait(&id);
    manager.release(&key, ReleaseMode::Destroy).await.unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), ended)
        .await
        .expect("the process ended with its sandbox")
        .unwrap();
    assert!(!status.success(), "killed with the sandbox: {status:?}");
    assert!(
        manager.background().list(None).is_empty(),
        "records of a destroyed sandbox's processes are dropped"
    );
    manager.shutdown().await;
}
