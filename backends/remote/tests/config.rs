//! `type: remote` chosen in a config: the async factory connects to a sandcell-server and
//! a manager runs a session over it; the token may come from an environment variable.
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::{
    BackendRegistry, ErrorKind, ReleaseMode, SandboxBackendExt, SandboxConfig, SandboxSpec,
    SessionKey,
};
use sandcell_remote::RemoteBackend;

fn registry() -> BackendRegistry {
    BackendRegistry::new().register_async("remote", RemoteBackend::from_options)
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
