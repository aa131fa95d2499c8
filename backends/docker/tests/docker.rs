//! Docker-specific behaviour against a real engine: hardening, exec on both paths
//! (agent and engine), image preparation, errors, and no leftovers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sandcell::{
    ErrorKind, ExecRequest, Limits, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec,
};
use sandcell_docker::{BuildStage, DockerBackend, ImageSpec};
use tokio::io::AsyncWriteExt;

fn spec(test: &str) -> SandboxSpec {
    SandboxSpec::new("default").label(common::TEST_LABEL.0, test)
}

/// Destroys the sandbox and checks the engine no longer has it.
async fn destroy(backend: &DockerBackend, id: &SandboxId) {
    backend.destroy(id).await.unwrap();
    let gone = backend.docker().inspect_container(id.as_str(), None).await;
    assert!(gone.is_err(), "container {id} outlived destroy");
}

/// Processes inside the container whose command line contains `needle`.
async fn processes_inside(backend: &DockerBackend, id: &SandboxId, needle: &str) -> Vec<String> {
    let top = backend
        .docker()
        .top_processes(id.as_str(), None::<bollard::query_parameters::TopOptions>)
        .await
        .unwrap();
    top.processes
        .unwrap_or_default()
        .into_iter()
        .map(|row| row.join(" "))
        .filter(|row| row.contains(needle))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_are_hardened_by_default() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    let limits = Limits::new()
        .pids(64)
        .memory_bytes(256 << 20)
        .cpu_millis(500);
    let sandbox = backend
        .create(&spec("hardening").limits(limits))
        .await
        .unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    let c = backend
        .docker()
        .inspect_container(sandbox.id.as_str(), None)
        .await
        .unwrap();
    let host = c.host_config.unwrap();
    let config = c.config.unwrap();
    if common::is_podman(&backend).await {
        // Podman reports the capabilities it dropped, not `ALL`; the check from inside
        // below holds on every engine.
        let dropped = host.cap_drop.unwrap_or_default();
        for cap in [
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "KILL",
            "NET_RAW",
            "SETUID",
            "SYS_CHROOT",
        ] {
            assert!(
                dropped.iter().any(|d| d.trim_start_matches("CAP_") == cap),
                "{cap} kept: {dropped:?}"
            );
        }
    } else {
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
    }
    assert_eq!(host.cap_add.unwrap_or_default(), Vec::<String>::new());
    assert!(host
        .security_opt
        .unwrap()
        .contains(&"no-new-privileges".to_owned()));
    assert_eq!(host.pids_limit, Some(64));
    assert_eq!(host.memory, Some(256 << 20));
    assert_eq!(
        host.memory_swap,
        Some(256 << 20),
        "no swap beyond the limit"
    );
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.init, Some(true));
    assert_ne!(host.privileged, Some(true));
    assert_eq!(
        config.user.as_deref(),
        Some("sandbox"),
        "the image's user applies"
    );
    assert_eq!(config.working_dir.as_deref(), Some("/workspace"));
    let labels = config.labels.unwrap();
    assert_eq!(
        labels.get(common::TEST_LABEL.0).map(String::as_str),
        Some("hardening")
    );
    assert_eq!(c.name.as_deref(), Some(format!("/{}", sandbox.id).as_str()));

    // And from inside: an unprivileged user with no capabilities and no way to gain any.
    let out = backend
        .run_shell(&sandbox.id, "id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; ip link 2>/dev/null | grep -c '^[0-9]' ; pwd; stat -c %u /workspace")
        .await
        .unwrap();
    let text = out.stdout_str();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "1000", "{text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("CapPrm:\t0000000000000000"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(
        text.contains("/workspace\n1000"),
        "the workspace belongs to the user: {text}"
    );
    destroy(&backend, &sandbox.id).await;
}

/// The exec contract, run against both paths so they cannot drift apart.
async fn exec_contract(backend: &DockerBackend, label: &str) {
    let spec = spec(label)
        .env("FROM_SPEC", "spec")
        .limits(Limits::new().output_bytes(4096));
    let sandbox = backend.create(&spec).await.unwrap();
    let _guard = common::Guard::new(backend, &sandbox.id);
    let id = &sandbox.id;

    let out = backend
        .run_shell(id, "echo out; echo err >&2; exit 3")
        .await
        .unwrap();
    assert_eq!(
        (
            out.stdout_str().as_ref(),
            out.stderr_str().as_ref(),
            out.exit_code()
        ),
        ("out\n", "err\n", Some(3)),
        "{label}"
    );
    // The exit status comes after every byte of output.
    let out = backend
        .run(
            id,
            ExecRequest::shell("head -c 3000 /dev/zero; exit 7").output_limit(1 << 20),
        )
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.len(), out.exit_code()),
        (3000, Some(7)),
        "{label}"
    );

    let out = backend
        .run(id, ExecRequest::new(["cat"]).stdin("fed via stdin"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "fed via stdin", "{label}");
    let mut process = backend.exec(id, ExecRequest::new(["cat"])).await.unwrap();
    let mut stdin = process.take_stdin().expect("a stdin writer");
    stdin.write_all(b"streamed ").await.unwrap();
    stdin.write_all(b"stdin").await.unwrap();
    stdin.shutdown().await.unwrap();
    drop(stdin);
    let out = process.collect(1 << 20).await.unwrap();
    assert_eq!(out.stdout_str(), "streamed stdin", "{label}");

    let out = backend
        .run(
            id,
            ExecRequest::shell("echo \"$FROM_SPEC $FROM_REQ\"").env("FROM_REQ", "req"),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "spec req\n", "{label}");

    backend.run_shell(id, "mkdir -p ex/sub").await.unwrap();
    let out = backend
        .run(id, ExecRequest::new(["pwd"]).cwd("ex/sub".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "/workspace/ex/sub\n", "{label}");
    let err = backend
        .run(
            id,
            ExecRequest::new(["true"]).cwd("ex/none".parse().unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{label}: {err}");
    let err = backend
        .run(id, ExecRequest::new(["no-such-program"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{label}: {err}");

    let out = backend
        .run_shell(id, "head -c 100000 /dev/zero")
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.len(), out.stdout_truncated),
        (4096, true),
        "{label}: spec cap"
    );

    // A timeout kills the whole tree inside the container, not just the client stream.
    let marker = "3131";
    let out = backend
        .run(
            id,
            ExecRequest::shell(format!("sleep {marker} & sleep {marker}"))
                .timeout(Duration::from_millis(800)),
        )
        .await
        .unwrap();
    assert!(
        out.status.timed_out && !out.success(),
        "{label}: {:?}",
        out.status
    );
    let left = processes_inside(backend, id, &format!("sleep {marker}")).await;
    assert!(
        left.is_empty(),
        "{label}: left inside after the timeout: {left:?}"
    );

    // A signal reaches the command (its trap runs), not just the client stream.
    let mut process = backend
        .exec(
            id,
            ExecRequest::shell(
                "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
            ),
        )
        .await
        .unwrap();
    let mut stdout = process.take_stdout().unwrap();
    let first = stdout.next().await.unwrap().unwrap();
    assert_eq!(first, "ready\n", "{label}");
    process.signal(15).await.unwrap();
    let rest: Vec<_> = stdout.collect().await;
    assert_eq!(
        rest.into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
            .concat(),
        b"term\n",
        "{label}"
    );
    assert_eq!(process.wait().await.unwrap().code, Some(7), "{label}");

    let mut process = backend
        .exec(id, ExecRequest::shell("sleep 4141 & sleep 4141"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    process.kill().await.unwrap();
    let status = process.wait().await.unwrap();
    assert!(
        !status.success() && !status.timed_out,
        "{label}: {status:?}"
    );
    let left = processes_inside(backend, id, "sleep 4141").await;
    assert!(left.is_empty(), "{label}: left inside after kill: {left:?}");

    destroy(backend, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_through_the_agent_keeps_the_contract() {
    if !common::engine_available().await {
        return;
    }
    exec_contract(&common::backend(true).await, "exec-agent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_through_the_engine_keeps_the_same_contract() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(false).await;
    exec_contract(&backend, "exec-engine").await;
    // A timeout ends what left the group too, a double fork's orphan (re-parented to
    // the container's init) included.
    sandcell::testing::conformance::timeouts_end_every_descendant(&backend).await;
    // A terminal from the engine's TTY exec, resized through its resize call.
    sandcell::testing::conformance::pty_terminal(&backend).await;
    // Without the agent, files other than reads say why they are missing.
    let sandbox = backend.create(&spec("exec-engine-files")).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    backend.run_shell(&sandbox.id, "echo hi > f").await.unwrap();
    assert_eq!(
        backend
            .read(&sandbox.id, &"f".parse().unwrap())
            .await
            .unwrap(),
        "hi\n"
    );
    let err = backend
        .write(&sandbox.id, &"g".parse().unwrap(), "x".into())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("agent"), "{err}");
    destroy(&backend, &sandbox.id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_prepared_once_however_many_ask() {
    if !common::engine_available().await {
        return;
    }
    common::images().await;
    let context = tempfile::tempdir().unwrap();
    let tag = format!("sandcell-test/once:{}", std::process::id());
    std::fs::write(
        context.path().join("Dockerfile"),
        format!(
            "FROM {}\nRUN echo built > /built-{}\n",
            common::BASE_IMAGE,
            std::process::id()
        ),
    )
    .unwrap();
    let builds = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&builds);
    let backend = DockerBackend::builder()
        .template("once", ImageSpec::build(context.path(), &tag))
        .on_progress(move |p| {
            if p.message.starts_with("Successfully built") {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        })
        .build()
        .unwrap();
    let label = spec("images-once").labels;
    let creates = (0..4).map(|_| {
        let mut spec = SandboxSpec::new("once");
        spec.labels = label.clone();
        let backend = backend.clone();
        async move { backend.create(&spec).await }
    });
    let created = futures::future::join_all(creates).await;
    let _guards: Vec<_> = created
        .iter()
        .flatten()
        .map(|s| common::Guard::new(&backend, &s.id))
        .collect();
    assert_eq!(
        builds.load(Ordering::SeqCst),
        1,
        "one build for four creates"
    );
    for sandbox in created {
        destroy(&backend, &sandbox.unwrap().id).await;
    }
    let _ = backend
        .docker()
        .remove_image(
            &tag,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stage_builds_chain_and_skip_stages_whose_cache_key_matches() {
    if !common::engine_available().await {
        return;
    }
    common::images().await;
    let dir = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    let (base_tag, app_tag) = (
        format!("sandcell-test/stage-base:{pid}"),
        format!("sandcell-test/stage-app:{pid}"),
    );
    for (name, from, file) in [
        ("base", common::BASE_IMAGE.to_owned(), "base"),
        ("app", base_tag.clone(), "app"),
    ] {
        let ctx = dir.path().join(name);
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::write(
            ctx.join("Dockerfile"),
            format!("FROM {from}\nRUN mkdir -p /stages && echo {file} > /stages/{file}\n"),
        )
        .unwrap();
    }
    let stages = vec![
        BuildStage::new(dir.path().join("base"), &base_tag).cache_key("base-v1"),
        BuildStage::new(dir.path().join("app"), &app_tag).cache_key("app-v1"),
    ];
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let make = |events: Arc<std::sync::Mutex<Vec<String>>>| {
        DockerBackend::builder()
            .template(
                "staged",
                ImageSpec::MultiStage {
                    stages: stages.clone(),
                },
            )
            .on_progress(move |p| {
                events
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", p.image, p.message))
            })
            .build()
            .unwrap()
    };
    make(Arc::clone(&events)).prepare_images().await.unwrap();
    // A second backend (a new process, say) finds both stages cached.
    let again = Arc::new(std::sync::Mutex::new(Vec::new()));
    let backend = make(Arc::clone(&again));
    backend.prepare_images().await.unwrap();
    let again = again.lock().unwrap().clone();
    assert_eq!(
        again,
        vec![format!("{base_tag} cached"), format!("{app_tag} cached")]
    );

    let mut staged = SandboxSpec::new("staged");
    staged.labels = spec("multi-stage").labels;
    let sandbox = backend.create(&staged).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    let out = backend
        .run_shell(&sandbox.id, "cat /stages/base /stages/app")
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "base\napp\n");
    destroy(&backend, &sandbox.id).await;
    for tag in [&app_tag, &base_tag] {
        let _ = backend
            .docker()
            .remove_image(
                tag,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
}

#[tokio::test]
async fn engine_errors_are_typed() {
    // A missing socket fails at build; an engine that stops answering, at the call.
    let err = match DockerBackend::builder()
        .host("unix:///nonexistent/docker.sock")
        .template("default", ImageSpec::pull("busybox"))
        .build()
    {
        Err(e) => e,
        Ok(backend) => backend
            .create(&SandboxSpec::new("default"))
            .await
            .unwrap_err(),
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string().contains("dockerd"),
        "says how to start one: {err}"
    );

    let err = DockerBackend::builder()
        .host("ftp://nowhere")
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = DockerBackend::builder()
        .template("bad/name", ImageSpec::pull("x"))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = DockerBackend::builder()
        .agent("/nonexistent/sandcell-agent")
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);

    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    let err = backend
        .create(&SandboxSpec::new("unregistered"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let ghost = SandboxId::new("docker-ghost").unwrap();
    assert_eq!(
        backend.inspect(&ghost).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    backend
        .destroy(&ghost)
        .await
        .expect("destroying an unknown sandbox succeeds");
    let missing = DockerBackend::builder()
        .template(
            "default",
            ImageSpec::Pull {
                reference: "sandcell-test/never-there:1".into(),
                policy: sandcell_docker::PullPolicy::Never,
            },
        )
        .build()
        .unwrap();
    let err = missing
        .create(&SandboxSpec::new("default"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_streams_while_the_command_runs() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    let sandbox = backend.create(&spec("streaming")).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    let mut process = backend
        .exec(
            &sandbox.id,
            ExecRequest::shell("echo first; sleep 30; echo never"),
        )
        .await
        .unwrap();
    let mut stdout = process.take_stdout().unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), stdout.next())
        .await
        .expect("the first line arrives before the command ends")
        .unwrap()
        .unwrap();
    assert_eq!(first, "first\n");
    process.kill().await.unwrap();
    destroy(&backend, &sandbox.id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_reaches_the_agent_through_the_relay() {
    if !common::engine_available().await {
        return;
    }
    let creator = common::backend(true).await;
    let sandbox = creator.create(&spec("relay")).await.unwrap();
    let _guard = common::Guard::new(&creator, &sandbox.id);
    creator
        .write_string(&sandbox.id, &"from-creator.txt".parse().unwrap(), "one")
        .await
        .unwrap();
    // A second backend instance has no attached connection: it opens one with an exec
    // of `sandcell-agent connect`. Both connections work at the same time.
    let other = common::backend(true).await;
    let (a, b) = tokio::join!(
        creator.run_shell(&sandbox.id, "sleep 0.3; echo creator"),
        other.run_shell(&sandbox.id, "cat from-creator.txt"),
    );
    assert_eq!(a.unwrap().stdout_str(), "creator\n");
    assert_eq!(b.unwrap().stdout_str(), "one");
    other
        .write_string(&sandbox.id, &"from-other.txt".parse().unwrap(), "two")
        .await
        .unwrap();
    assert_eq!(
        creator
            .read_to_string(&sandbox.id, &"from-other.txt".parse().unwrap())
            .await
            .unwrap(),
        "two"
    );
    // A reset restarts the agent: both reconnect by themselves. Podman ends the other
    // process's connection only some time after the restart, so its first call may
    // still go out on it and fail as temporary; the next reconnects.
    creator.reset(&sandbox.id).await.unwrap();
    let mut after_reset = other.run_shell(&sandbox.id, "cat from-other.txt").await;
    if common::is_podman(&other).await {
        if let Err(e) = &after_reset {
            assert!(e.is_temporary(), "{e}");
            after_reset = other.run_shell(&sandbox.id, "cat from-other.txt").await;
        }
    }
    assert_eq!(after_reset.unwrap().stdout_str(), "two");
    assert_eq!(
        creator
            .run_shell(&sandbox.id, "echo back")
            .await
            .unwrap()
            .stdout_str(),
        "back\n"
    );
    destroy(&creator, &sandbox.id).await;
}

/// `python` is claimed only for images with `python3` on their `PATH`, found by looking
/// (through a symbolic link here), and then `execute_code` runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_is_claimed_for_an_image_that_has_it_and_only_then() {
    if !common::engine_available().await {
        return;
    }
    let plain = common::backend(true).await;
    plain.prepare_images().await.unwrap();
    assert!(!plain.capabilities().python, "busybox has no python3");

    // A stand-in python3 (a shell reading the program from stdin) behind a link, in a
    // PATH directory that is not the first.
    let context = tempfile::tempdir().unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        format!(
            "FROM {}\nUSER root\nRUN mkdir -p /opt/py /usr/local/bin && \
             printf '#!/bin/sh\\nexec sh -s\\n' > /opt/py/python3.11 && \
             chmod 755 /opt/py/python3.11 && ln -s /opt/py/python3.11 /usr/local/bin/python3\n\
             USER sandbox\nENV PATH=/bin:/usr/local/bin\n",
            common::USER_IMAGE
        ),
    )
    .unwrap();
    let with_python = DockerBackend::builder()
        .template(
            "default",
            ImageSpec::Build(BuildStage::new(
                context.path(),
                "sandcell-test/busybox-python:latest",
            )),
        )
        .agent(common::agent_binary())
        .build()
        .unwrap();
    assert!(
        !with_python.capabilities().python,
        "not known before the image is"
    );
    with_python.prepare_images().await.unwrap();
    assert!(with_python.capabilities().python);
    let sandbox = with_python.create(&spec("python")).await.unwrap();
    let out = with_python
        .execute_code(&sandbox.id, sandcell::Language::Python, "echo from-python3")
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "from-python3\n");
    with_python.destroy(&sandbox.id).await.unwrap();
}

/// A paused Docker session (the agent frozen, `files_while_paused` not claimed) is
/// thawed for its snapshot and paused again, and a lifetime reap snapshots it before it
/// goes: nothing fails pass after pass, and the session comes back with its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_session_snapshots_and_expires_through_the_manager() {
    use sandcell::manager::SuspendStrategy;
    use sandcell::store::{InMemorySnapshotStore, InMemoryStateStore, SessionKey};
    use sandcell::{ReleaseMode, SandboxManager, SandboxStatus};
    if !common::engine_available().await {
        return;
    }
    let docker = common::backend(true).await;
    let backend: Arc<dyn SandboxBackend> = Arc::new(docker.clone());
    assert!(!backend.capabilities().files_while_paused);
    let manager = SandboxManager::builder(Arc::clone(&backend))
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .suspend_strategy(SuspendStrategy::Pause)
        .max_lifetime(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let key = SessionKey::new("t", "paused-docker").unwrap();
    let notes = || sandcell::SandboxPath::new("notes.txt").unwrap();
    let handle = manager
        .acquire(&key, &spec("paused-session"))
        .await
        .unwrap();
    let id = handle.id().clone();
    handle
        .call("write", |b, id| async move {
            b.write(id, &notes(), bytes::Bytes::from_static(b"kept"))
                .await
        })
        .await
        .unwrap();
    manager.release(&key, ReleaseMode::Suspend).await.unwrap();
    assert_eq!(
        backend.inspect(&id).await.unwrap().status,
        SandboxStatus::Paused
    );
    let err = backend.read(&id, &notes()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");

    manager.snapshot(&key).await.unwrap();
    assert_eq!(
        backend.inspect(&id).await.unwrap().status,
        SandboxStatus::Paused,
        "paused again after the snapshot"
    );

    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = manager.reap_once().await.unwrap();
    assert!(
        report.snapshot_failures.is_empty(),
        "{:?}",
        report.snapshot_failures
    );
    assert_eq!(report.expired, vec![key.clone()]);
    let gone = docker.docker().inspect_container(id.as_str(), None).await;
    assert!(gone.is_err(), "the expired container is destroyed");

    let back = manager
        .acquire(&key, &spec("paused-session"))
        .await
        .unwrap();
    let data = back
        .call("read", |b, id| async move { b.read(id, &notes()).await })
        .await
        .unwrap();
    assert_eq!(&data[..], b"kept");
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
}

/// A spec's labels cannot pose as the backend's own settings, which it reads back from
/// its containers' labels (the output cap, the host workspace, the task): a label under
/// `sandcell.docker.` is refused at create and at clone, and nothing is made.
#[tokio::test]
async fn labels_under_the_backends_prefix_are_refused() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    for key in [
        "sandcell.docker.workspace",
        "sandcell.docker.output_bytes",
        "sandcell.docker.task",
    ] {
        let err = backend
            .create(&spec("reserved-labels").label(key, "/etc"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{key}: {err}");
        assert!(err.to_string().contains(key), "{err}");
    }
    let sandbox = backend.create(&spec("reserved-labels")).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    let labels = [("sandcell.docker.workspace".to_owned(), "/etc".to_owned())]
        .into_iter()
        .collect();
    let err = backend
        .clone_sandbox(&sandbox.id, labels)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let left = backend
        .list(&sandcell::LabelSelector::new().label(common::TEST_LABEL.0, "reserved-labels"))
        .await
        .unwrap();
    assert_eq!(left.len(), 1, "only the one sandbox made: {left:?}");
}
