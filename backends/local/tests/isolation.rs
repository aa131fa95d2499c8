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

/// A backend at the explicit opt-out, `Isolation::None`.
fn unisolated_backend(root: &std::path::Path) -> Option<LocalBackend> {
    Some(
        LocalBackend::builder()
            .root(root)
            .isolation(Isolation::None)
            .build()
            .unwrap(),
    )
}

/// The conformance suite at `Isolation::None` (the default, Landlock, runs it in
/// `tests/conformance.rs`), one test per case.
mod unisolated_conformance {
    async fn setup() -> Option<super::conformance::Fixture> {
        super::fixture(super::unisolated_backend)
    }
    sandcell::conformance_tests!(setup);
}

/// What a default sandbox cannot touch (ADVERSARIAL.md 33 for the local backend): host
/// files outside the system directories (`/etc/shadow`, the caller's home, another
/// sandbox's workspace, anything in the host's `/tmp`), writes outside its workspace
/// and tmp, and, without a network, TCP or UDP to the host's loopback. Each attack is
/// checked on the host afterwards, and shown to work at `Isolation::None`, so the test
/// can tell containment from a broken command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_hides_the_host() {
    use std::io::Read;
    let root = tempfile::tempdir().unwrap();
    let default = match LocalBackend::builder().root(root.path()).build() {
        Ok(b) => b,
        Err(e) => {
            // Where the kernel lacks Landlock the default cannot be built: that error
            // must name the way out.
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("Isolation::None"), "{e}");
            sandcell::testing::require_or_skip("LANDLOCK", "Landlock", Err(e.to_string()));
            return;
        }
    };
    assert_eq!(default.config().isolation, Isolation::Landlock);
    let unisolated = LocalBackend::builder()
        .root(root.path())
        .isolation(Isolation::None)
        .build()
        .unwrap();

    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret.txt");
    std::fs::write(&secret, "host secret").unwrap();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tcp_port, udp_port) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );

    let victim = default.create(&SandboxSpec::default()).await.unwrap();
    default
        .write_string(&victim.id, &"private.txt".parse().unwrap(), "victim's")
        .await
        .unwrap();
    let victim_file = root
        .path()
        .canonicalize()
        .unwrap()
        .join("sandboxes")
        .join(victim.id.as_str())
        .join("workspace/private.txt");
    assert!(victim_file.exists(), "the test knows where workspaces live");
    let escape = host.path().join("escaped");

    let attacks = [
        ("host /tmp file", format!("cat {}", secret.display())),
        ("/etc/shadow", "cat /etc/shadow".to_owned()),
        ("home directory", format!("ls -a {home}")),
        ("another sandbox", format!("cat {}", victim_file.display())),
        ("write outside", format!("echo x > {}", escape.display())),
        (
            "host loopback (TCP)",
            format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{tcp_port}'"),
        ),
        (
            "host loopback (UDP)",
            format!("bash -c 'echo hi > /dev/udp/127.0.0.1/{udp_port}'"),
        ),
    ];
    let run_all = |backend: LocalBackend| {
        let attacks = attacks.clone();
        async move {
            let sb = backend.create(&SandboxSpec::default()).await.unwrap();
            let mut outcomes = Vec::new();
            for (what, command) in &attacks {
                let out = backend.run_shell(&sb.id, command).await.unwrap();
                outcomes.push((*what, out.success(), out.stdout_str().to_string()));
            }
            // A default sandbox still runs system programs and reads system config.
            let works = backend
                .run_shell(&sb.id, "cat /etc/hostname >/dev/null && ls /usr/bin >/dev/null && echo ok > tmp.txt && cat tmp.txt")
                .await
                .unwrap();
            assert_eq!(works.stdout_str(), "ok\n", "{}", works.stderr_str());
            backend.destroy(&sb.id).await.unwrap();
            outcomes
        }
    };

    for (what, succeeded, stdout) in run_all(default.clone()).await {
        assert!(!succeeded, "a default sandbox reached the {what}: {stdout}");
        assert!(!stdout.contains("host secret") && !stdout.contains("victim"));
    }
    assert!(!escape.exists(), "nothing was written outside");
    let mut buf = [0u8; 16];
    assert!(tcp.accept().is_err(), "no TCP connection reached the host");
    assert!(
        udp.recv(&mut buf).is_err(),
        "no UDP datagram reached the host"
    );

    // The same attacks work without isolation: the test can tell.
    let open: Vec<_> = run_all(unisolated)
        .await
        .into_iter()
        .filter(|(what, ..)| *what != "/etc/shadow" || rustix::process::geteuid().is_root())
        .collect();
    for (what, succeeded, _) in &open {
        assert!(succeeded, "at Isolation::None the {what} is reachable");
    }
    let (mut stream, _) = tcp.accept().unwrap();
    let mut got = String::new();
    stream.set_nonblocking(false).unwrap();
    stream.read_to_string(&mut got).unwrap();
    assert_eq!(got, "hi\n");
    std::fs::remove_file(&escape).unwrap();
    default.destroy(&victim.id).await.unwrap();
}

/// A sandbox given the network keeps it at the default level: Landlock's filter
/// applies only to `Network::None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_sandbox_with_the_network_reaches_the_host_loopback() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = landlock_backend(root.path()) else {
        return;
    };
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let spec = SandboxSpec::default().network(sandcell::Network::Full);
    let sb = backend.create(&spec).await.unwrap();
    let out = backend
        .run_shell(
            &sb.id,
            &format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
        )
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr_str());
    assert!(tcp.accept().is_ok());
    let offline = backend.create(&SandboxSpec::default()).await.unwrap();
    assert_eq!(
        offline.network,
        sandcell::Network::None,
        "the default policy"
    );
    let publish = backend.publish_port(&offline.id, 8080).await.unwrap_err();
    assert_eq!(publish.kind(), ErrorKind::Unsupported);
    backend.publish_port(&sb.id, 8080).await.unwrap();
    backend.destroy(&sb.id).await.unwrap();
    backend.destroy(&offline.id).await.unwrap();
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
            // The host's secrets beneath its system directories are covered.
            let secrets = backend
                .run_shell(&id, "cat /etc/shadow; ls /etc/ssh 2>/dev/null | wc -l")
                .await
                .unwrap();
            assert!(
                !secrets.stdout_str().contains("root:"),
                "/etc/shadow is empty in a sandbox: {}",
                secrets.stdout_str()
            );
            assert_eq!(secrets.stdout_str().trim(), "0", "/etc/ssh is empty");
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

/// Every command enters all of its sandbox's namespaces, none of the host's; once the
/// namespaces' init has ended (a sandbox can end it from inside, and its pid may then
/// be any process's), a command is refused with `InvalidState` before anything starts,
/// with or without a terminal, and destroy still cleans up (ADVERSARIAL 47).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_enter_only_their_own_sandbox_s_namespaces() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = namespaces_backend(root.path()) else {
        return;
    };
    let backend = &backend;
    conformance::with_sandbox(backend, SandboxSpec::default(), |id| async move {
        let kinds = ["mnt", "pid", "net", "ipc", "uts", "user"];
        let script = kinds
            .map(|ns| format!("readlink /proc/self/ns/{ns}"))
            .join("; ");
        let out = backend.run_shell(&id, &script).await.unwrap();
        assert!(out.success(), "{out:?}");
        let inside: Vec<String> = out.stdout_str().lines().map(str::to_owned).collect();
        assert_eq!(inside.len(), kinds.len(), "{out:?}");
        for (ns, inside) in kinds.iter().zip(&inside) {
            let host = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
            assert_ne!(
                host.to_string_lossy(),
                inside.as_str(),
                "a command is in the host's {ns} namespace"
            );
        }

        // The init: the idle process in the sandbox's cgroup.
        let info = backend.inspect(&id).await.unwrap();
        let cgroup = std::path::Path::new(&info.details["cgroup"]).join("cgroup.procs");
        let init: i32 = std::fs::read_to_string(cgroup)
            .unwrap()
            .lines()
            .filter_map(|pid| pid.parse().ok())
            .find(|pid: &i32| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c == b"sleep\x00infinity\x00")
            })
            .expect("the namespaces' idle process is in the sandbox's cgroup");
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(init).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        assert!(
            common::eventually(|| common::state(init).is_none_or(|s| s == 'Z')).await,
            "the init ended"
        );
        for request in [
            sandcell::ExecRequest::new(["true"]),
            sandcell::ExecRequest::new(["sh"]).pty(sandcell::TerminalSize::new(24, 80)),
        ] {
            let refused = backend.exec(&id, request).await.map(|_| ()).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::InvalidState, "{refused}");
        }
    })
    .await;
}

/// ADVERSARIAL 41: whether a program exists is looked up in the sandbox's own view of
/// the file system, never the host's, so an exec of a host file the sandbox cannot see
/// answers exactly as one of a file that exists nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_answers_alike_whether_a_host_file_exists_or_not() {
    use sandcell::ExecRequest;
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = namespaces_backend(root.path()) else {
        return;
    };
    // A file on the host, beside the backend's root, which no sandbox mounts.
    let host = root
        .path()
        .join(format!("host-program-{}", std::process::id()));
    std::fs::write(&host, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755)).unwrap();
    let missing = root.path().join("no-such-program");
    let sandbox = backend.create(&SandboxSpec::default()).await.unwrap();
    let mut answers = Vec::new();
    for program in [&host, &missing] {
        let err = backend
            .run(&sandbox.id, ExecRequest::new([program.to_str().unwrap()]))
            .await
            .unwrap_err();
        let path = program.to_str().unwrap();
        answers.push((err.kind(), err.to_string().replace(path, "PROGRAM")));
    }
    backend.destroy(&sandbox.id).await.unwrap();
    assert_eq!(answers[0].0, sandcell::ErrorKind::NotFound, "{answers:?}");
    assert_eq!(
        answers[0], answers[1],
        "the answer shows whether a host file exists"
    );
}

/// A command started as its sandbox is destroyed runs, is refused, is killed (a signal),
/// or answers `NotFound`: `nsenter` failing to find the namespaces is not an exit of
/// the command's, and its diagnostic (which named the server's pid and descriptors,
/// `/proc/<pid>/fd/<n>/ns/user`, as the command's stderr with exit code 1) is no
/// answer's (ADVERSARIAL 36).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_racing_destroy_answers_not_found_and_names_no_host_path() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = namespaces_backend(root.path()) else {
        return;
    };
    let backend = std::sync::Arc::new(backend);
    // A command that is running when destroy ends the sandbox is killed.
    let id = backend.create(&SandboxSpec::default()).await.unwrap().id;
    let mut running = backend
        .exec(&id, sandcell::ExecRequest::new(["sleep", "30"]))
        .await
        .unwrap();
    backend.destroy(&id).await.unwrap();
    let status = running.wait().await.unwrap();
    assert!(status.signal.is_some(), "{status:?}");

    for _ in 0..20 {
        let id = backend.create(&SandboxSpec::default()).await.unwrap().id;
        let racer = {
            let (backend, id) = (backend.clone(), id.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for _ in 0..5 {
                    answers.push(backend.run(&id, sandcell::ExecRequest::new(["true"])).await);
                }
                answers
            })
        };
        tokio::task::yield_now().await;
        backend.destroy(&id).await.unwrap();
        for answer in racer.await.unwrap() {
            match answer {
                Ok(output) => {
                    assert!(
                        output.success() || output.status.signal.is_some(),
                        "{output:?}"
                    );
                    assert!(!output.stderr_str().contains("/proc/"), "{output:?}");
                }
                Err(e) => {
                    assert!(
                        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidState),
                        "{e}"
                    );
                    assert!(!e.to_string().contains("/proc/"), "{e}");
                }
            }
        }
    }
}
