//! Stateful code execution (`sandcell::code`) against real Jupyter kernels: the helper
//! runs in a local-backend sandbox (namespaces: root and bubblewrap) on the Python named
//! by `SANDCELL_KERNEL_PYTHON`, a virtual environment under `/opt` (which sandboxes
//! see) with `jupyter-client`, `ipykernel` and `bash_kernel`, which `.ci/run` builds.
//! Without it these tests return early, unless `SANDCELL_REQUIRE_KERNELS=1` (set in CI)
//! makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandcell::code::{
    CodeEvent, CodeInterpreter, CodeInterpreterOptions, CodeLanguage, Interpreters, RunCode,
};
use sandcell::{ErrorKind, SandboxBackend, SandboxId, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

/// The Python with the kernels, if this machine has one.
fn kernel_python() -> Option<PathBuf> {
    match std::env::var_os("SANDCELL_KERNEL_PYTHON") {
        Some(python) => Some(PathBuf::from(python)),
        None if std::env::var("SANDCELL_REQUIRE_KERNELS").as_deref() == Ok("1") => {
            panic!("SANDCELL_REQUIRE_KERNELS=1 but SANDCELL_KERNEL_PYTHON is not set")
        }
        None => None,
    }
}

struct Fixture {
    _root: tempfile::TempDir,
    backend: Arc<dyn SandboxBackend>,
    id: SandboxId,
    interpreter: CodeInterpreter,
}

/// A sandbox that can read the kernels' virtual environment, and an interpreter in it.
async fn fixture() -> Option<Fixture> {
    let python = kernel_python()?;
    let root = tempfile::tempdir().unwrap();
    // Namespaces, the server's default: a sandbox of its own terminals (the Bash
    // kernel and IPython's `!` run their commands on one).
    let backend: Arc<dyn SandboxBackend> = Arc::new(
        LocalBackend::builder()
            .root(root.path())
            .isolation(Isolation::Namespaces)
            .build()
            .unwrap(),
    );
    let id = backend.create(&SandboxSpec::default()).await.unwrap().id;
    let options = CodeInterpreterOptions::new().python(python.to_str().unwrap());
    let interpreter = CodeInterpreter::start(&*backend, &id, options)
        .await
        .unwrap();
    Some(Fixture {
        _root: root,
        backend,
        id,
        interpreter,
    })
}

/// Every step must end on its own.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_keeps_its_state_and_reports_output_results_and_errors() {
    let Some(f) = fixture().await else { return };
    let run = |code: &'static str| f.interpreter.run_to_end(code, RunCode::new());
    let first = bounded("the first cell", run("x = 41\nprint('out')"))
        .await
        .unwrap();
    assert_eq!(first.stdout, ["out\n"]);
    assert!(first.main_result().is_none(), "{first:?}");
    let second = bounded(
        "the second cell",
        run("import sys\nsys.stderr.write('err')\nx + 1"),
    )
    .await
    .unwrap();
    assert_eq!(second.main_result().and_then(|r| r.text()), Some("42"));
    assert_eq!(second.stderr, ["err"]);
    assert_eq!(second.execution_count, first.execution_count.map(|n| n + 1));
    // IPython syntax, and a displayed value that is not the cell's own.
    let shown = bounded(
        "a display",
        run("from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))\n!echo shell"),
    )
    .await
    .unwrap();
    let html = shown.results.iter().find_map(|r| r.get("text/html"));
    assert_eq!(html, Some("<b>x</b>"), "{shown:?}");
    assert!(shown.results.iter().all(|r| !r.is_main_result));
    // On a terminal: its line ends are `\r\n`, as in Jupyter.
    assert_eq!(shown.stdout.concat().trim_end(), "shell", "{shown:?}");
    // The kernel works in its context's directory, the workspace by default.
    let contexts = f.interpreter.contexts().await.unwrap();
    let python = contexts
        .iter()
        .find(|c| c.language == CodeLanguage::Python)
        .unwrap();
    assert_eq!(python.cwd, "", "{python:?}");
    let files = f
        .interpreter
        .run_to_end("open('made-here', 'w').close()", RunCode::new());
    bounded("a file", files).await.unwrap();
    assert!(f
        .backend
        .stat(&f.id, &"made-here".parse().unwrap())
        .await
        .is_ok());
    let failed = bounded("an error", run("1 / 0")).await.unwrap();
    let error = failed.error.expect("the cell raised");
    assert_eq!(error.name, "ZeroDivisionError");
    assert!(!error.traceback.is_empty());
    // The context outlives its error.
    let after = bounded("after the error", run("x")).await.unwrap();
    assert_eq!(after.main_result().and_then(|r| r.text()), Some("41"));
    drop(f.interpreter);
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_are_independent_restartable_and_removable() {
    let Some(f) = fixture().await else { return };
    let i = &f.interpreter;
    let one = bounded("a context", i.create_context(CodeLanguage::Python, None))
        .await
        .unwrap();
    let two = bounded("another", i.create_context(CodeLanguage::Python, None))
        .await
        .unwrap();
    assert_ne!(one.id, two.id);
    let listed: Vec<String> = i
        .contexts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert!(
        listed.contains(&one.id) && listed.contains(&two.id),
        "{listed:?}"
    );
    i.run_to_end("y = 1", RunCode::new().context(&one.id))
        .await
        .unwrap();
    let elsewhere = i
        .run_to_end("y", RunCode::new().context(&two.id))
        .await
        .unwrap();
    assert_eq!(
        elsewhere.error.map(|e| e.name).as_deref(),
        Some("NameError")
    );
    bounded("a restart", i.restart_context(&one.id))
        .await
        .unwrap();
    let restarted = i
        .run_to_end("y", RunCode::new().context(&one.id))
        .await
        .unwrap();
    assert_eq!(
        restarted.error.map(|e| e.name).as_deref(),
        Some("NameError")
    );
    i.remove_context(&two.id).await.unwrap();
    let gone = i
        .run_to_end("1", RunCode::new().context(&two.id))
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    assert_eq!(
        i.remove_context("no-such").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // Bash has its kernel here; Java has none, and the refusal says what to install.
    let bash = bounded(
        "a bash cell",
        i.run_to_end(
            "echo from-bash",
            RunCode::new().language(CodeLanguage::Bash),
        ),
    )
    .await
    .unwrap();
    assert_eq!(bash.stdout.concat().trim(), "from-bash");
    let java = i
        .create_context(CodeLanguage::Java, None)
        .await
        .unwrap_err();
    assert_eq!(java.kind(), ErrorKind::Unsupported);
    assert!(java.to_string().contains("kernel"), "{java}");
    drop(f.interpreter);
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_s_environment_is_its_own_and_a_timeout_interrupts_only_the_run() {
    let Some(f) = fixture().await else { return };
    let i = &f.interpreter;
    for (language, code) in [
        (
            CodeLanguage::Python,
            "import os; print(os.environ.get('SC_RUN'))",
        ),
        (CodeLanguage::Bash, "echo ${SC_RUN:-None}"),
    ] {
        let with = RunCode::new().language(language).env("SC_RUN", "it's set");
        let set = bounded("a run with env", i.run_to_end(code, with))
            .await
            .unwrap();
        assert_eq!(set.stdout.concat().trim(), "it's set", "{language}");
        let after = RunCode::new().language(language);
        let unset = bounded("the next run", i.run_to_end(code, after))
            .await
            .unwrap();
        assert_eq!(unset.stdout.concat().trim(), "None", "{language}");
    }
    i.run_to_end("kept = 'yes'", RunCode::new()).await.unwrap();
    let started = Instant::now();
    let slow = RunCode::new().timeout(Duration::from_secs(1));
    let timed_out = bounded(
        "a timed-out run",
        i.run_to_end("import time; time.sleep(30)", slow),
    )
    .await
    .unwrap_err();
    assert_eq!(timed_out.kind(), ErrorKind::Timeout, "{timed_out}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let kept = bounded("after the timeout", i.run_to_end("kept", RunCode::new()))
        .await
        .unwrap();
    assert_eq!(kept.main_result().and_then(|r| r.text()), Some("'yes'"));
    drop(f.interpreter);
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_midway_is_interrupted_and_a_dropped_interpreter_leaves_no_process() {
    let Some(f) = fixture().await else { return };
    let before = f.backend.metrics(&f.id).await.unwrap().processes;
    let i = &f.interpreter;
    let mut run = i
        .run("n = 0\nwhile True:\n    n += 1", RunCode::new())
        .await
        .unwrap();
    let first = bounded("the run's start", run.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(first, CodeEvent::ExecutionCount { .. }),
        "{first:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(run);
    // The kernel is free again: the next cell runs at once, with the loop's state.
    let next = bounded(
        "the cell after an abandoned one",
        i.run_to_end("n > 0", RunCode::new()),
    )
    .await
    .unwrap();
    assert_eq!(next.main_result().and_then(|r| r.text()), Some("True"));
    drop(f.interpreter);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = f.backend.metrics(&f.id).await.unwrap().processes;
        if now <= before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes {now:?}, {before:?} before"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f.backend.destroy(&f.id).await.unwrap();
}

/// ADVERSARIAL 35, FINDINGS11 F3/F4: a helper the sandbox stopped (a kernel sends its parent SIGSTOP)
/// does not hold the host: a run with a timeout ends with `Timeout` soon after it, the
/// helper is given up and killed with its kernels, and later calls say so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_the_sandbox_stops_is_given_up_within_the_run_s_timeout() {
    let Some(f) = fixture().await else { return };
    let before = f.backend.metrics(&f.id).await.unwrap().processes;
    let i = &f.interpreter;
    i.run_to_end("1", RunCode::new()).await.unwrap();
    let started = Instant::now();
    let stop = "import os, signal; os.kill(os.getppid(), signal.SIGSTOP)";
    let run = i.run_to_end(stop, RunCode::new().timeout(Duration::from_secs(1)));
    let stopped = bounded("a run of a stopped helper", run).await.unwrap_err();
    assert_eq!(stopped.kind(), ErrorKind::Timeout, "{stopped}");
    assert!(started.elapsed() < Duration::from_secs(40));
    assert!(!i.is_running());
    let after = i.contexts().await.unwrap_err();
    assert_eq!(after.kind(), ErrorKind::Unavailable, "{after}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.backend.metrics(&f.id).await.unwrap().processes > before {
        assert!(
            Instant::now() < deadline,
            "the stopped helper was left running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(f.interpreter);
    f.backend.destroy(&f.id).await.unwrap();
}

/// ADVERSARIAL 40, FINDINGS11 F2, F6: what a run gathers is capped, and a module the workspace holds
/// does not stand in for one the helper imports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_s_gathered_output_is_capped_and_workspace_modules_are_not_imported() {
    let Some(f) = fixture().await else { return };
    let mut options =
        CodeInterpreterOptions::new().python(kernel_python().unwrap().to_str().unwrap());
    options.max_output = 1 << 20;
    let capped = CodeInterpreter::start(&*f.backend, &f.id, options)
        .await
        .unwrap();
    let big = capped.run_to_end("print('x' * (2 << 20))", RunCode::new());
    let refused = bounded("a large run", big).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LimitExceeded, "{refused}");
    // The kernel was interrupted, not lost: the next cell runs.
    let next = bounded("the next cell", capped.run_to_end("6 * 7", RunCode::new()))
        .await
        .unwrap();
    assert_eq!(next.main_result().and_then(|r| r.text()), Some("42"));
    drop(capped);
    for module in ["uuid", "json", "asyncio"] {
        f.backend
            .write(
                &f.id,
                &format!("{module}.py").parse().unwrap(),
                "raise SystemExit('the workspace took over the helper')".into(),
            )
            .await
            .unwrap();
    }
    let options = CodeInterpreterOptions::new().python(kernel_python().unwrap().to_str().unwrap());
    let fresh = CodeInterpreter::start(&*f.backend, &f.id, options)
        .await
        .unwrap();
    let made = fresh
        .create_context(CodeLanguage::Python, None)
        .await
        .unwrap();
    assert_eq!(made.cwd, "");
    drop(fresh);
    drop(f.interpreter);
    f.backend.destroy(&f.id).await.unwrap();
}

/// `Interpreters` gives one interpreter per sandbox, and a new one once it has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interpreters_keep_one_per_sandbox_and_replace_one_that_ended() {
    let Some(f) = fixture().await else { return };
    let python = kernel_python().unwrap();
    let cache = Interpreters::new(CodeInterpreterOptions::new().python(python.to_str().unwrap()));
    let first = cache.get_or_start(&*f.backend, &f.id).await.unwrap();
    first.run_to_end("kept = 1", RunCode::new()).await.unwrap();
    let again = cache.get_or_start(&*f.backend, &f.id).await.unwrap();
    let kept = again.run_to_end("kept", RunCode::new()).await.unwrap();
    assert_eq!(kept.main_result().and_then(|r| r.text()), Some("1"));
    // The helper dies (its kernel kills it): the next use starts another.
    let killed = "import os, signal; os.kill(os.getppid(), signal.SIGKILL)";
    let _ = bounded(
        "a run killing its helper",
        again.run_to_end(killed, RunCode::new()),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.is_running() {
        assert!(Instant::now() < deadline, "the helper's end went unnoticed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fresh = cache.get_or_start(&*f.backend, &f.id).await.unwrap();
    assert!(fresh.is_running());
    let gone = fresh.run_to_end("kept", RunCode::new()).await.unwrap();
    assert_eq!(gone.error.map(|e| e.name).as_deref(), Some("NameError"));
    drop((first, again, fresh, cache));
    drop(f.interpreter);
    f.backend.destroy(&f.id).await.unwrap();
}
