//! Isolation levels of the local backend: what a sandbox process can and cannot touch.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::conformance;
use sandcell::{ErrorKind, Mount, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

mod common;

/// A Landlock backend, or `None` (loudly) where the kernel has no Landlock, unless
/// `SANDCELL_REQUIRE_LANDLOCK=1` (set by CI), where that is a failure.
fn landlock_backend(root: &std::path::Path) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .isolation(Isolation::Landlock)
        .build()
    {
        Ok(b) => Some(b),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            sandcell::testing::require_or_skip("LANDLOCK", "Landlock", Err(e.to_string()));
            None
        }
    }
}

/// A fixture over a backend from `make`, in a temporary root it outlives.
fn fixture(make: fn(&std::path::Path) -> Option<LocalBackend>) -> Option<conformance::Fixture> {
    let root = tempfile::tempdir().unwrap();
    let backend = make(root.path())?;
    Some(conformance::Fixture::new(backend).guard(root))
}

/// The conformance suite at `Isolation::Landlock`, one test per case.
mod landlock_conformance {
    async fn setup() -> Option<super::conformance::Fixture> {
        super::fixture(super::landlock_backend)
    }
    sandcell::conformance_tests!(setup);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_confines_writes_to_the_workspace() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = landlock_backend(root.path()) else {
        return;
    };
    assert!(backend.capabilities().read_only_mounts_enforced);
    let outside = tempfile::tempdir().unwrap();
    let knowledge = tempfile::tempdir().unwrap();
    std::fs::write(knowledge.path().join("facts.md"), "fact").unwrap();
    let spec =
        SandboxSpec::default().mount(Mount::read_only(knowledge.path(), "files".parse().unwrap()));
    let sb = backend.create(&spec).await.unwrap();

    let escape = format!("echo x > {}/escaped", outside.path().display());
    assert!(
        !backend.run_shell(&sb.id, &escape).await.unwrap().success(),
        "writing outside is refused"
    );
    assert!(!outside.path().join("escaped").exists());

    let ok = backend
        .run_shell(&sb.id, "echo in > inside.txt && cat /etc/hostname >/dev/null && echo hi > /dev/null && cat files/facts.md")
        .await
        .unwrap();
    assert!(
        ok.success(),
        "workspace writes, reads elsewhere and /dev/null work: {}",
        ok.stderr_str()
    );
    assert_eq!(ok.stdout_str(), "fact");

    let remount = backend
        .run_shell(
            &sb.id,
            "mount -o remount,rw,bind files 2>&1; echo x > files/new.md",
        )
        .await
        .unwrap();
    assert!(
        !remount.success(),
        "a read-only mount cannot be made writable"
    );
    assert!(!knowledge.path().join("new.md").exists());

    backend.destroy(&sb.id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(knowledge.path().join("facts.md")).unwrap(),
        "fact"
    );
}

/// A Namespaces backend, or `None` (loudly) where bubblewrap or user namespaces are
/// missing, unless `SANDCELL_REQUIRE_NAMESPACES=1` (set by CI).
fn namespaces_backend(root: &std::path::Path) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .isolation(Isolation::Namespaces)
        .build()
    {
        Ok(b) => Some(b),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            sandcell::testing::require_or_skip(
                "NAMESPACES",
                "namespace isolation",
                Err(e.to_string()),
            );
            None
        }
    }
}

/// How many `sleep 1000` processes are in the sandbox's cgroup.
fn sleepers(info: &sandcell::SandboxInfo) -> usize {
    // The sandbox's cgroup and its commands' cgroups beneath it.
    fn procs(dir: &std::path::Path) -> Vec<String> {
        let mut pids: Vec<String> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if child.path().is_dir() {
                pids.extend(procs(&child.path()));
            }
        }
        pids
    }
    procs(std::path::Path::new(&info.details["cgroup"]))
        .iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x001000\x00")
        })
        .count()
}

/// The conformance suite at `Isolation::Namespaces`, one test per case.
mod namespaces_conformance {
    async fn setup() -> Option<super::conformance::Fixture> {
        let fixture = super::fixture(super::namespaces_backend)?;
        assert!(fixture.backend().capabilities().network_isolation);
        Some(fixture)
    }
    sandcell::conformance_tests!(setup);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_hide_the_host_and_the_network() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = namespaces_backend(root.path()) else {
        return;
    };
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "host").unwrap();
    let knowledge = tempfile::tempdir().unwrap();
    std::fs::write(knowledge.path().join("facts.md"), "fact").unwrap();
    let spec =
        SandboxSpec::default().mount(Mount::read_only(knowledge.path(), "files".parse().unwrap()));
    let (outside_path, knowledge_path) =
        (outside.path().to_path_buf(), knowledge.path().to_path_buf());
    conformance::with_sandbox(&backend, spec, |id| {
        let backend = &backend;
        async move {
            let out = backend
                .run_shell(
                    &id,
                    "pwd; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
                )
                .await
                .unwrap();
            assert_eq!(
                out.stdout_str(),
                "/workspace\nlo\n",
                "only loopback; stderr: {}",
                out.stderr_str()
            );
            let probe = format!(
                "test -e {} && echo visible || echo hidden",
                outside_path.display()
            );
            assert_eq!(
                backend.run_shell(&id, &probe).await.unwrap().stdout_str(),
                "hidden\n"
            );
            assert!(!backend
                .run_shell(&id, "echo x > /etc/sandcell-x")
                .await
                .unwrap()
                .success());
            assert!(!std::path::Path::new("/etc/sandcell-x").exists());
            let caps = backend
                .run_shell(&id, "grep CapEff /proc/self/status")
                .await
                .unwrap();
            assert_eq!(
                caps.stdout_str().trim(),
                "CapEff:\t0000000000000000",
                "no capabilities inside"
            );
            let remount = backend
                .run_shell(
                    &id,
                    "mount -o remount,rw,bind /workspace/files 2>/dev/null; echo x > files/new.md",
                )
                .await
                .unwrap();
            assert!(!remount.success());
            assert!(!knowledge_path.join("new.md").exists());
            assert_eq!(
                backend
                    .read_to_string(&id, &"files/facts.md".parse().unwrap())
                    .await
                    .unwrap(),
                "fact"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_background_processes_live_until_destroy() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = namespaces_backend(root.path()) else {
        return;
    };
    let mut seen = None;
    let slot = &mut seen;
    conformance::with_sandbox(&backend, SandboxSpec::default(), |id| {
        let backend = &backend;
        async move {
            let info = backend.inspect(&id).await.unwrap();
            let started = backend
                .run_shell(
                    &id,
                    "sleep 1000 >/dev/null 2>&1 & setsid sleep 1000 >/dev/null 2>&1 < /dev/null &",
                )
                .await
                .unwrap();
            assert!(started.success());
            assert!(
                common::eventually(|| sleepers(&info) == 2).await,
                "both background processes outlive their command"
            );
            *slot = Some(info);
        }
    })
    .await;
    let info = seen.unwrap();
    assert_eq!(sleepers(&info), 0, "destroy ends everything, setsid or not");
    assert!(!std::path::Path::new(&info.details["cgroup"]).exists());
}
