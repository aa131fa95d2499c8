//! Proof under load: three manager processes (this test binary started again as
//! workers) on one PostgreSQL database and one snapshot store, each with its own local
//! backend root (so a sandbox is out of the other "hosts'" reach), acquiring, writing a
//! marker, snapshotting and releasing sessions of three tenants with limits while their
//! reapers run; one worker is killed with SIGKILL mid-run and restarted, twice.
//!
//! Asserted at the end: no tenant limit was ever exceeded (sampled every 20 ms from the
//! database), no session was ever held by two live workers at once (from the workers'
//! logs, a killed worker's holds ending at its kill), every session's latest
//! acknowledged marker (or a newer one) comes back from its snapshot, nothing is left
//! on any worker's backend after a final reconcile, and each worker's open file
//! descriptors and zombie children are flat. The counts are printed.
//!
//! CI runs the short form (60 sessions); `SANDCELL_LOAD_SESSIONS=300` runs the full one.
//! Needs `SANDCELL_POSTGRES_URL` (skips without it; fails under
//! `SANDCELL_REQUIRE_POSTGRES=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandcell::store::{PostgresStateStore, SessionKey, StateStore};
use sandcell::{
    ErrorKind, LabelSelector, ReleaseMode, SandboxBackend, SandboxBackendExt, SandboxManager,
    SandboxSpec,
};
use sandcell_local::LocalBackend;
use serde_json::{json, Value};

const WORKERS: usize = 3;
const TENANTS: usize = 3;
const LIMIT: u32 = 4;
const LEASE: Duration = Duration::from_secs(3);
/// The workers' provision timeout, which the sampler needs to tell an abandoned claim.
const PROVISION_TIMEOUT: Duration = Duration::from_secs(30);

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

fn url() -> Option<String> {
    sandcell::testing::require_env("POSTGRES", "SANDCELL_POSTGRES_URL", "a PostgreSQL server")
}

/// The run's settings, passed to workers through the environment.
struct Run {
    base: PathBuf,
    url: String,
    prefix: String,
    sessions: usize,
}

impl Run {
    fn tenant(&self, t: usize) -> String {
        format!("{}-t{t}", self.prefix)
    }

    fn keys(&self) -> Vec<SessionKey> {
        (0..self.sessions)
            .map(|i| SessionKey::new(self.tenant(i % TENANTS), format!("s{i}")).unwrap())
            .collect()
    }

    fn manager_id(worker: usize) -> String {
        format!("worker-{worker}")
    }

    fn root(&self, worker: usize) -> PathBuf {
        self.base.join(format!("worker-{worker}"))
    }

    async fn manager(&self, manager_id: &str, root: &Path) -> SandboxManager<LocalBackend> {
        let backend = LocalBackend::builder().root(root).build().unwrap();
        SandboxManager::builder(backend)
            .manager_id(manager_id)
            .lease_ttl(LEASE)
            .provision_timeout(PROVISION_TIMEOUT)
            .idle_timeout(Duration::from_secs(1))
            .reaper_interval(Duration::from_millis(500))
            .max_sandboxes_per_tenant(LIMIT)
            .state_store(PostgresStateStore::connect(&self.url).await.unwrap())
            .snapshot_store(sandcell::store::FsSnapshotStore::new(
                self.base.join("snapshots"),
            ))
            .build()
            .await
            .unwrap()
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Children of this process that have exited and not been reaped.
fn zombie_children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            // "pid (comm) state ppid ...": comm may hold spaces; split after its ')'.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
            let fields: Vec<_> = rest.split_whitespace().collect();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&me.as_str())
        })
        .count()
}

/// A worker: every session once, in an order of its own, logging what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_entry() {
    let Ok(worker) = std::env::var("SANDCELL_LOAD_WORKER") else {
        return; // Only as a worker process.
    };
    let worker: usize = worker.parse().unwrap();
    let run = Run {
        base: std::env::var("SANDCELL_LOAD_BASE").unwrap().into(),
        url: std::env::var("SANDCELL_POSTGRES_URL").unwrap(),
        prefix: std::env::var("SANDCELL_LOAD_PREFIX").unwrap(),
        sessions: std::env::var("SANDCELL_LOAD_SESSIONS")
            .unwrap()
            .parse()
            .unwrap(),
    };
    let incarnation = std::env::var("SANDCELL_LOAD_INCARNATION").unwrap();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(run.base.join(format!("worker-{worker}.log")))
        .unwrap();
    let mut note = |value: Value| {
        // One write per line, O_APPEND: a line is whole even if the process dies.
        log.write_all(format!("{value}\n").as_bytes()).unwrap();
    };
    let manager = run
        .manager(&Run::manager_id(worker), &run.root(worker))
        .await;
    let fds_start = open_fds();
    let mut keys = run.keys();
    // A different order per worker and incarnation, so they contend.
    let seed: usize = worker * 7919 + incarnation.parse::<usize>().unwrap() * 104_729;
    keys.sort_by_key(|k| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&(k, seed), &mut h);
        std::hash::Hasher::finish(&h)
    });
    let spec = SandboxSpec::new("default");
    for (n, key) in keys.iter().enumerate() {
        let mut attempts = 0;
        let handle = loop {
            match manager.acquire(key, &spec).await {
                Ok(h) => break Some(h),
                Err(e) if e.kind() == ErrorKind::LimitExceeded && attempts < 20 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) if matches!(e.kind(), ErrorKind::LimitExceeded | ErrorKind::Conflict) => {
                    note(
                        json!({"event": "skipped", "session": key.to_string(), "kind": e.kind().name()}),
                    );
                    break None;
                }
                Err(e) => panic!("acquire {key}: {e:#}"),
            }
        };
        let Some(handle) = handle else { continue };
        note(
            json!({"event": "held", "session": key.to_string(), "at": now_us(), "incarnation": incarnation}),
        );
        let marker = format!("{worker}-{incarnation}-{n}-{}", now_us());
        let script = format!("printf %s {marker} > marker");
        let step = async {
            handle
                .call("run_shell", |b, id| {
                    let script = script.clone();
                    async move { b.run_shell(id, &script).await }
                })
                .await?
                .check()?;
            manager.snapshot(key).await
        };
        let outcome = step.await;
        let released_at = now_us();
        note(
            json!({"event": "released", "session": key.to_string(), "at": released_at, "incarnation": incarnation}),
        );
        match outcome {
            Ok(manifest) => {
                note(
                    json!({"event": "snapshot", "session": key.to_string(), "marker": marker, "snapshot": manifest.id}),
                );
            }
            // The reaper of this or another manager may have moved the session on.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Conflict | ErrorKind::InvalidState | ErrorKind::NotFound
                ) =>
            {
                note(json!({"event": "lost", "session": key.to_string(), "kind": e.kind().name()}));
                continue;
            }
            Err(e) => panic!("using {key}: {e:#}"),
        }
        // Half are suspended at once, half left idle for the reapers.
        let mode = if n % 2 == 0 {
            ReleaseMode::Suspend
        } else {
            ReleaseMode::Keep
        };
        if let Err(e) = manager.release(key, mode).await {
            assert!(
                matches!(e.kind(), ErrorKind::Conflict | ErrorKind::NotFound),
                "release {key}: {e:#}"
            );
        }
    }
    // Let the reaper suspend what was left idle, then stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fds_end = open_fds();
    let zombies = zombie_children();
    let report = manager.shutdown().await;
    assert!(report.errors.is_empty(), "{report:?}");
    note(json!({"event": "done", "fds_start": fds_start, "fds_end": fds_end, "zombies": zombies}));
}

/// One worker process.
fn spawn_worker(run: &Run, worker: usize, incarnation: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "worker_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("SANDCELL_LOAD_WORKER", worker.to_string())
        .env("SANDCELL_LOAD_INCARNATION", incarnation.to_string())
        .env("SANDCELL_LOAD_BASE", &run.base)
        .env("SANDCELL_LOAD_PREFIX", &run.prefix)
        .env("SANDCELL_LOAD_SESSIONS", run.sessions.to_string())
        .env("SANDCELL_POSTGRES_URL", &run.url)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn read_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// ADVERSARIAL 22 across hosts: a manager process SIGKILLed mid-run, twice, leaves
/// nothing behind once restarted and reconciled, and its sessions are taken over only
/// once its leases lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_database_through_kills_and_restarts() {
    if std::env::var("SANDCELL_LOAD_WORKER").is_ok() {
        return;
    }
    let Some(url) = url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let run = Run {
        base: dir.path().to_path_buf(),
        url: url.clone(),
        prefix: format!("load-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        sessions: std::env::var("SANDCELL_LOAD_SESSIONS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    };
    let store = PostgresStateStore::connect(&url).await.unwrap();

    let started = Instant::now();
    let mut children: Vec<Child> = (0..WORKERS).map(|w| spawn_worker(&run, w, 0)).collect();
    let mut kills: Vec<u128> = Vec::new();
    let mut peak: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples = 0;
    let mut incarnation = 0;
    loop {
        // Sample the tenant limits.
        // Read after `now`: a claim the sample counts as abandoned was abandoned when
        // read (a dead worker's lease only lapses further), so the sample never
        // overlooks a claim the store still counted.
        let now = chrono::Utc::now();
        let stale_before = now - chrono::Duration::from_std(PROVISION_TIMEOUT).unwrap();
        let records = store.list(None).await.unwrap();
        let mut held: HashMap<&str, usize> = HashMap::new();
        for r in records
            .iter()
            .filter(|r| r.key.tenant().starts_with(&run.prefix))
        {
            // Counted as claims are decided: a killed worker's claim in flight stops
            // counting once its lease lapses, though its record stays until reaped.
            if r.counts_against_limit(now, stale_before) {
                *held.entry(r.key.tenant()).or_default() += 1;
            }
        }
        for (tenant, n) in held {
            assert!(n <= LIMIT as usize, "tenant {tenant} held {n} > {LIMIT}");
            let p = peak.entry(tenant.to_owned()).or_default();
            *p = (*p).max(n);
        }
        samples += 1;
        // Kill worker 0 twice, a little into the run, and restart it.
        let elapsed = started.elapsed();
        if kills.len() < 2 && elapsed > Duration::from_millis(1500 * (kills.len() as u64 + 1)) {
            children[0].kill().unwrap(); // SIGKILL
            children[0].wait().unwrap();
            kills.push(now_us());
            incarnation += 1;
            children[0] = spawn_worker(&run, 0, incarnation);
        }
        let mut running = 0;
        for child in &mut children {
            match child.try_wait().unwrap() {
                None => running += 1,
                Some(status) => assert!(status.success(), "a worker failed: {status}"),
            }
        }
        if running == 0 {
            break;
        }
        if elapsed >= Duration::from_secs(600) {
            // Say where each worker stopped, and leave none running.
            let mut tails = String::new();
            for (worker, child) in children.iter_mut().enumerate() {
                let running = child.try_wait().ok().flatten().is_none();
                let _ = child.kill();
                let _ = child.wait();
                let events = read_log(&run.base.join(format!("worker-{worker}.log")));
                let last: Vec<String> = events.iter().rev().take(3).map(Value::to_string).collect();
                tails.push_str(&format!("\nworker {worker} (running: {running}): {last:?}"));
            }
            panic!("the run took too long; the workers' last events:{tails}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(kills.len(), 2, "the run ended before both kills");

    // The workers' logs.
    let mut holds: BTreeMap<String, Vec<(u128, u128, String)>> = BTreeMap::new();
    let mut acked: BTreeMap<String, (u128, String)> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for worker in 0..WORKERS {
        let events = read_log(&run.base.join(format!("worker-{worker}.log")));
        let mut open: HashMap<String, (u128, String)> = HashMap::new();
        for e in &events {
            let event = e["event"].as_str().unwrap();
            *counts
                .entry(match event {
                    "held" => "held",
                    "snapshot" => "snapshots",
                    "skipped" => "skipped",
                    "lost" => "lost",
                    "done" => "done",
                    _ => "other",
                })
                .or_default() += 1;
            let session = e["session"].as_str().unwrap_or_default().to_owned();
            let who = format!("{worker}/{}", e["incarnation"].as_str().unwrap_or_default());
            match event {
                "held" => {
                    open.insert(session, (e["at"].as_u64().unwrap() as u128, who));
                }
                "released" => {
                    let (from, who) = open.remove(&session).unwrap();
                    holds.entry(session).or_default().push((
                        from,
                        e["at"].as_u64().unwrap() as u128,
                        who,
                    ));
                }
                "snapshot" => {
                    let marker = e["marker"].as_str().unwrap().to_owned();
                    let at: u128 = marker.rsplit('-').next().unwrap().parse().unwrap();
                    let entry = acked.entry(session).or_insert((0, String::new()));
                    if at > entry.0 {
                        *entry = (at, marker);
                    }
                }
                "done" => {
                    let (start, end) = (
                        e["fds_start"].as_u64().unwrap(),
                        e["fds_end"].as_u64().unwrap(),
                    );
                    assert!(end <= start + 8, "worker {worker}: fds {start} -> {end}");
                    assert_eq!(e["zombies"].as_u64(), Some(0), "worker {worker}");
                }
                _ => {}
            }
        }
        // Holds a killed incarnation never released end at its kill.
        for (session, (from, who)) in open {
            let end = kills
                .iter()
                .copied()
                .find(|k| *k > from)
                .expect("an open hold ends at a kill");
            holds.entry(session).or_default().push((from, end, who));
        }
    }
    assert_eq!(counts.get("done"), Some(&WORKERS), "{counts:?}");
    // No session was held by two workers at once.
    let mut overlaps = 0;
    for (session, spans) in &mut holds {
        spans.sort();
        for pair in spans.windows(2) {
            if pair[1].0 < pair[0].1 {
                overlaps += 1;
                eprintln!("{session}: {:?} overlaps {:?}", pair[0], pair[1]);
            }
        }
    }
    assert_eq!(overlaps, 0);

    // Every session's latest acknowledged marker (or a newer one) is restorable.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    let checker_root = run.base.join("checker");
    let checker = run.manager("checker", &checker_root).await;
    for key in run.keys() {
        let Some((acked_at, acked_marker)) = acked.get(&key.to_string()).cloned() else {
            match checker.release(&key, ReleaseMode::Purge).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => panic!("purging {key}: {e:#}"),
            }
            continue;
        };
        let handle = checker
            .acquire(&key, &SandboxSpec::new("default"))
            .await
            .unwrap_or_else(|e| panic!("restoring {key}: {e:#}"));
        let marker = handle
            .call("read", |b, id| async move {
                let path: sandcell::SandboxPath = "marker".parse()?;
                b.read(id, &path).await
            })
            .await
            .unwrap();
        let marker = String::from_utf8(marker.to_vec()).unwrap();
        let at: u128 = marker.rsplit('-').next().unwrap().parse().unwrap();
        assert!(
            at >= acked_at,
            "{key}: restored {marker}, acknowledged {acked_marker}"
        );
        checker.release(&key, ReleaseMode::Purge).await.unwrap();
    }
    checker.shutdown().await;

    // Nothing left on any worker's backend after a final reconcile.
    let mut orphans_destroyed = 0;
    for worker in 0..WORKERS {
        // Every sandbox still there is an orphan now: each session is purged.
        let backend = LocalBackend::builder()
            .root(run.root(worker))
            .build()
            .unwrap();
        orphans_destroyed += backend.list(&LabelSelector::new()).await.unwrap().len();
        drop(backend);
        // Its build reconciles.
        let manager = run
            .manager(&Run::manager_id(worker), &run.root(worker))
            .await;
        let left = manager.backend().list(&LabelSelector::new()).await.unwrap();
        assert!(left.is_empty(), "worker {worker} left {left:?}");
        manager.shutdown().await;
    }
    let left: Vec<_> = store
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.key.tenant().starts_with(&run.prefix))
        .collect();
    assert!(left.is_empty(), "records left: {left:?}");
    eprintln!(
        "many_processes: {} sessions, {WORKERS} workers, 2 kills, {:?}; peak held per tenant \
         {peak:?} (limit {LIMIT}) over {samples} samples; {} sessions checked; {} orphans \
         found by the final reconcile; {:.1} s",
        run.sessions,
        counts,
        acked.len(),
        orphans_destroyed,
        started.elapsed().as_secs_f64()
    );
}
