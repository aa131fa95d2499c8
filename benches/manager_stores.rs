//! What the manager and its state store cost, on the MockBackend (so the backend costs
//! next to nothing): acquire → exec → release of 1,000 fresh sessions (one at a time,
//! and eight at a time), acquire of a live session (reuse), and lease takes and claims
//! per second on the store itself, over the in-memory, SQLite and PostgreSQL stores.
//!
//! Run: `cargo bench --bench manager_stores --features testing,postgres`, with
//! `SANDCELL_POSTGRES_URL` for the PostgreSQL rows (skipped without it).
//! `SANDCELL_BENCH_SESSIONS` (default 1000) sessions.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sandcell::store::{
    Claim, InMemorySnapshotStore, InMemoryStateStore, PostgresStateStore, SessionKey,
    SessionRecord, SqliteStateStore, StateStore,
};
use sandcell::testing::MockBackend;
use sandcell::{ExecRequest, ReleaseMode, SandboxBackend, SandboxManager, SandboxSpec};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn manager(state: Arc<dyn StateStore>) -> SandboxManager<MockBackend> {
    let backend = MockBackend::new().on_exec("true", |_| sandcell::testing::MockReply::stdout(""));
    SandboxManager::builder(backend)
        .manager_id(format!("bench-{}", uuid::Uuid::new_v4().simple()))
        .state_store(state)
        .snapshot_store(InMemorySnapshotStore::new())
        .build()
        .await
        .unwrap()
}

/// One session's life: acquire, one command, release (the sandbox destroyed).
async fn cycle(m: &SandboxManager<MockBackend>, key: &SessionKey) {
    let handle = m.acquire(key, &SandboxSpec::new("default")).await.unwrap();
    handle
        .call("exec", |b, id| async move {
            b.exec(id, ExecRequest::new(["true"])).await?.wait().await
        })
        .await
        .unwrap();
    m.release(key, ReleaseMode::Destroy).await.unwrap();
}

async fn measure(name: &str, state: Arc<dyn StateStore>, sessions: usize) {
    let tenant = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let key = |i: usize| SessionKey::new(&tenant, format!("s{i}")).unwrap();
    let m = manager(Arc::clone(&state)).await;

    // Sequential.
    let started = Instant::now();
    for i in 0..sessions {
        cycle(&m, &key(i)).await;
    }
    let sequential = sessions as f64 / started.elapsed().as_secs_f64();

    // Eight at a time.
    let started = Instant::now();
    let per_task = sessions / 8;
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let m = m.clone();
            let keys: Vec<_> = (0..per_task)
                .map(|i| key(sessions + t * per_task + i))
                .collect();
            tokio::spawn(async move {
                for k in &keys {
                    cycle(&m, k).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let concurrent = (per_task * 8) as f64 / started.elapsed().as_secs_f64();

    // Reuse: acquire of a live session.
    let live = key(usize::MAX / 2);
    m.acquire(&live, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let mut reuse = Vec::new();
    for _ in 0..sessions {
        let t = Instant::now();
        m.acquire(&live, &SandboxSpec::new("default"))
            .await
            .unwrap();
        reuse.push(t.elapsed());
    }

    // Where a reuse's time goes: the store's claim of the live session (what the
    // manager's acquire starts with), alone.
    let mut live_claims = Vec::new();
    for _ in 0..sessions {
        let now = Utc::now();
        let claim = Claim::new(
            SessionRecord::provisioning(live.clone(), "mock", SandboxSpec::new("default"), now),
            m.manager_id(),
            now + chrono::Duration::seconds(30),
            None,
            now - chrono::Duration::seconds(600),
        );
        let t = Instant::now();
        let outcome = state.claim(&claim).await.unwrap();
        live_claims.push(t.elapsed());
        assert!(matches!(outcome, sandcell::store::ClaimOutcome::Live(_)));
    }

    // The store alone: lease takes (the holder's own) and claims of new sessions.
    let started = Instant::now();
    for _ in 0..sessions {
        let now = Utc::now();
        state
            .take_lease(
                &live,
                m.manager_id(),
                now,
                now + chrono::Duration::seconds(30),
            )
            .await
            .unwrap();
    }
    let takes = sessions as f64 / started.elapsed().as_secs_f64();
    let claim_tenant = format!("{tenant}-claims");
    let started = Instant::now();
    for i in 0..sessions {
        let now = Utc::now();
        let record = SessionRecord::provisioning(
            SessionKey::new(&claim_tenant, format!("c{i}")).unwrap(),
            "mock",
            SandboxSpec::default(),
            now,
        );
        state
            .claim(&Claim::new(
                record,
                "bench",
                now + chrono::Duration::seconds(30),
                None,
                now - chrono::Duration::seconds(600),
            ))
            .await
            .unwrap();
    }
    let claims = sessions as f64 / started.elapsed().as_secs_f64();

    println!(
        "| {name} | {sequential:.0} | {concurrent:.0} | {:.3} | {:.3} | {takes:.0} | {claims:.0} |",
        ms(p50(reuse)),
        ms(p50(live_claims))
    );
    m.release(&live, ReleaseMode::Purge).await.unwrap();
    m.shutdown().await;
    for t in [tenant.as_str(), claim_tenant.as_str()] {
        for r in state.list(Some(t)).await.unwrap() {
            state.delete(&r.key, r.token()).await.unwrap();
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sessions: usize = std::env::var("SANDCELL_BENCH_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    println!("{sessions} sessions on the MockBackend; sessions/s, p50 ms, operations/s");
    println!("| state store | acquire→exec→release, 1 at a time | 8 at a time | reuse acquire p50 (ms) | of which the store's claim, p50 (ms) | lease takes/s | claims/s |");
    println!("|---|---|---|---|---|---|---|");
    measure("in memory", Arc::new(InMemoryStateStore::new()), sessions).await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStateStore::open(dir.path().join("state.db"))
        .await
        .unwrap();
    measure("SQLite (WAL, one file)", Arc::new(sqlite), sessions).await;
    match std::env::var("SANDCELL_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => {
            let pg = PostgresStateStore::connect(&url).await.unwrap();
            measure("PostgreSQL 15 (local)", Arc::new(pg), sessions).await;
        }
        _ => println!("(PostgreSQL skipped: SANDCELL_POSTGRES_URL is not set)"),
    }
}
