//! `type: remote` chosen in a config: the async factory connects to a sandcell-server and
//! a manager runs a session over it; the token may come from an environment variable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::SandboxBackend;
use sandcell::{
    BackendRegistry, ErrorKind, ReleaseMode, SandboxBackendExt, SandboxConfig, SandboxSpec,
    SessionKey,
};
use sandcell_remote::e2b::E2bBackend;
use sandcell_remote::FlyBackend;

fn registry() -> BackendRegistry {
    BackendRegistry::new().register_async("remote", FlyBackend::from_options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_chooses_the_remote_backend() {
    let server = common::serve_local().await;
    let data = tempfile::tempdir().unwrap();
    // The token from the environment: this test's own variable, set once.
    std::env::set_var("SANDCELL_TEST_REMOTE_TOKEN", common::TOKEN);
    let config: SandboxConfig = serde_json::from_value(serde_json::json!({
        "type": "remote",
        "url": server.url,
        "token_env": "SANDCELL_TEST_REMOTE_TOKEN",
        "data_dir": data.path(),
        "manager": {"max_sandboxes_per_tenant": 2},
    }))
    .unwrap();
    let manager = config.build_manager(&registry()).await.unwrap();
    assert_eq!(manager.backend().name(), "remote");
    let key = SessionKey::new("acme", "configured").unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let out = sandbox
        .call("run", |b, id| b.run_shell(id, "echo configured"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "configured\n");
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
    manager.shutdown().await;

    // The synchronous build says what to call instead.
    let err = config.build_backend(&registry()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("build_async"), "{err}");

    // Bad options are typed errors naming what is wrong.
    let bad = |options: serde_json::Value| async move {
        let mut all = serde_json::json!({"type": "remote"});
        all.as_object_mut()
            .unwrap()
            .extend(options.as_object().unwrap().clone());
        let config: SandboxConfig = serde_json::from_value(all).unwrap();
        config.build_backend_async(&registry()).await.unwrap_err()
    };
    let both = bad(serde_json::json!({"url": server.url, "token": "x",
        "token_env": "SANDCELL_TEST_REMOTE_TOKEN"}))
    .await;
    assert_eq!(both.kind(), ErrorKind::InvalidInput, "{both}");
    let typo = bad(serde_json::json!({"url": server.url, "tokn": "x"})).await;
    assert_eq!(typo.kind(), ErrorKind::InvalidInput, "{typo}");
    assert!(typo.to_string().contains("tokn"), "{typo}");
    let wrong = bad(serde_json::json!({"url": server.url, "token": "wrong"})).await;
    assert_eq!(wrong.kind(), ErrorKind::PermissionDenied, "{wrong}");
}

/// `examples/e2b.yaml`, the seed-003-shaped file, pointed at a test server.
fn e2b_example(url: &str) -> SandboxConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/e2b.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut config: SandboxConfig = serde_yaml::from_str(&text).unwrap();
    config.options.insert("api_url".into(), url.into());
    config.options.insert("sandbox_url".into(), url.into());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_chooses_the_e2b_backend() {
    let server = common::serve_local().await;
    let data = tempfile::tempdir().unwrap();
    // examples/e2b.yaml names E2B_API_KEY; this test sets nothing else in the env.
    std::env::set_var("E2B_API_KEY", common::TOKEN);
    let mut config = e2b_example(&server.url);
    config.data_dir = Some(data.path().to_path_buf());
    let registry = BackendRegistry::new().register_async("e2b", E2bBackend::from_options);
    let manager = config.build_manager(&registry).await.unwrap();
    assert_eq!(manager.backend().name(), "e2b");
    assert_eq!(manager.settings().max_sandboxes_per_tenant, Some(4));
    let key = SessionKey::new("acme", "configured").unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    // The file's envs reach commands; its metadata is on the sandbox.
    let out = sandbox
        .call("run", |b, id| b.run_shell(id, "echo $APP_ENV"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "demo\n");
    let info = sandbox
        .call("inspect", |b, id| b.inspect(id))
        .await
        .unwrap();
    assert_eq!(
        info.labels.get("project").map(String::as_str),
        Some("my_project")
    );
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
    manager.shutdown().await;

    let registry = &registry;
    let bad = |options: serde_json::Value| async move {
        let mut all = serde_json::json!({"type": "e2b"});
        all.as_object_mut()
            .unwrap()
            .extend(options.as_object().unwrap().clone());
        let config: SandboxConfig = serde_json::from_value(all).unwrap();
        config.build_backend_async(registry).await.unwrap_err()
    };
    let typo = bad(serde_json::json!({"api_key": "x", "templat": "base"})).await;
    assert_eq!(typo.kind(), ErrorKind::InvalidInput, "{typo}");
    assert!(typo.to_string().contains("templat"), "{typo}");
    let both = bad(serde_json::json!({"api_key": "x", "api_key_env": "E2B_API_KEY"})).await;
    assert_eq!(both.kind(), ErrorKind::InvalidInput, "{both}");
    let not_http = bad(serde_json::json!({"api_key": "x", "api_url": "ftp://x"})).await;
    assert_eq!(not_http.kind(), ErrorKind::InvalidInput, "{not_http}");
    // A wrong key is refused by the server at the first call, as PermissionDenied.
    let backend = E2bBackend::connect(sandcell_remote::e2b::E2bConfig::self_hosted(
        &server.url,
        "wrong",
    ))
    .await
    .unwrap();
    let wrong = backend
        .create(&SandboxSpec::new("default"))
        .await
        .unwrap_err();
    assert_eq!(wrong.kind(), ErrorKind::PermissionDenied, "{wrong}");
}
