//! [`PostgresStateStore`] against a real PostgreSQL server: the store conformance cases,
//! and claims from several stores at once (managers on several hosts) holding a tenant
//! limit together.
//!
//! The server is `SANDCELL_POSTGRES_URL` (`.ci/run` installs PostgreSQL and starts one);
//! without it the tests skip, and fail instead under `SANDCELL_REQUIRE_POSTGRES=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{Duration, Utc};
use sandcell::store::{
    Claim, ClaimOutcome, PostgresStateStore, SessionKey, SessionRecord, StateStore,
};
use sandcell::testing::stores;
use sandcell::{ErrorKind, SandboxSpec};

fn url() -> Option<String> {
    sandcell::testing::require_env("POSTGRES", "SANDCELL_POSTGRES_URL", "a PostgreSQL server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_state_store() {
    let Some(url) = url() else { return };
    let store = PostgresStateStore::connect(&url).await.unwrap();
    stores::state_store_all(&store).await;
    // A second connection finds the schema in place (migrations are idempotent).
    let again = PostgresStateStore::connect(&url).await.unwrap();
    assert!(again.list(Some("no-such-tenant")).await.unwrap().is_empty());
    // ... and the same store: the instance id written by the first is kept.
    assert_eq!(
        again.instance_id().await.unwrap(),
        store.instance_id().await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_from_many_stores_hold_the_tenant_limit_together() {
    let Some(url) = url() else { return };
    // Four stores, as four managers on four hosts would hold.
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(PostgresStateStore::connect(&url).await.unwrap());
    }
    let tenant = format!("race-{}", uuid::Uuid::new_v4().simple());
    let mut claims = Vec::new();
    for i in 0..24 {
        let store = handles[i % handles.len()].clone();
        let key = SessionKey::new(&tenant, format!("s{i}")).unwrap();
        claims.push(tokio::spawn(async move {
            let record =
                SessionRecord::provisioning(key, "mock", SandboxSpec::default(), Utc::now());
            let now = Utc::now();
            let claim = Claim::new(
                record,
                format!("host-{}", i % 4),
                now + Duration::seconds(30),
                Some(3),
                now - Duration::seconds(300),
            );
            store.claim(&claim).await
        }));
    }
    let mut claimed = 0;
    let mut refused = 0;
    for claim in claims {
        match claim.await.unwrap() {
            Ok(ClaimOutcome::Claimed { .. }) => claimed += 1,
            Err(e) if e.kind() == ErrorKind::LimitExceeded => refused += 1,
            other => panic!("unexpected claim outcome: {other:?}"),
        }
    }
    assert_eq!((claimed, refused), (3, 21));
    assert_eq!(handles[0].list(Some(&tenant)).await.unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_manager_of_many_takes_over_an_expired_lease() {
    let Some(url) = url() else { return };
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(PostgresStateStore::connect(&url).await.unwrap());
    }
    let key = SessionKey::new(format!("lease-{}", uuid::Uuid::new_v4().simple()), "s").unwrap();
    let now = Utc::now();
    // The first owner's lease ran out a second ago, with its sandbox live.
    let claim = Claim::new(
        SessionRecord::provisioning(key.clone(), "mock", SandboxSpec::default(), now),
        "old-host",
        now - Duration::seconds(1),
        None,
        now - Duration::seconds(300),
    );
    let ClaimOutcome::Claimed { mut record, .. } = handles[0].claim(&claim).await.unwrap() else {
        panic!("first claim")
    };
    record.status = sandcell::SandboxStatus::Running;
    record.sandbox_id = Some(sandcell::SandboxId::new("sb-old").unwrap());
    handles[0].put(&record).await.unwrap();

    let mut takers = Vec::new();
    for i in 0..16 {
        let store = handles[i % handles.len()].clone();
        let key = key.clone();
        takers.push(tokio::spawn(async move {
            let now = Utc::now();
            store
                .take_lease(&key, &format!("host-{i}"), now, now + Duration::seconds(30))
                .await
        }));
    }
    let mut won = Vec::new();
    for taker in takers {
        match taker.await.unwrap() {
            Ok(record) => won.push(record),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Conflict, "{e}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one manager takes the session over");
    assert_eq!(won[0].token(), record.token() + 1);
    // The old owner's late write is refused.
    record.status = sandcell::SandboxStatus::Suspended;
    let err = handles[1].put(&record).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    handles[0].delete(&key, won[0].token()).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error() {
    let err = PostgresStateStore::connect("postgres://nobody:secret@127.0.0.1:1/none")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_puts_the_managers_state_in_postgres() {
    let Some(url) = url() else { return };
    let data = tempfile::tempdir().unwrap();
    let registry = sandcell::BackendRegistry::new()
        .register("mock", sandcell::testing::MockBackend::from_options);
    let config: sandcell::SandboxConfig = serde_json::from_value(serde_json::json!({
        "type": "mock",
        "data_dir": data.path(),
        "state_url": url,
    }))
    .unwrap();
    let manager = config.build_manager(&registry).await.unwrap();
    let key = SessionKey::new(format!("cfg-{}", uuid::Uuid::new_v4().simple()), "s").unwrap();
    manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    // Another store on the same database (another host's manager) sees the session.
    let elsewhere = PostgresStateStore::connect(&url).await.unwrap();
    assert!(elsewhere.get(&key).await.unwrap().is_some());
    assert!(
        !data.path().join("state.db").exists(),
        "no SQLite file beside the Postgres state"
    );
    manager
        .release(&key, sandcell::ReleaseMode::Purge)
        .await
        .unwrap();
    manager.shutdown().await;
    assert!(elsewhere.get(&key).await.unwrap().is_none());

    let mut bad = config.clone();
    bad.state_url = Some("mysql://x/y".to_owned());
    let err = bad.build_manager(&registry).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}
