//! Drives the built `sandcell` binary as a user would: every call a
//! new process over one data directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sandcell::{LabelSelector, SandboxBackend, SandboxSpec};

use sandcell_docker::testing as docker_testing;
use serde_json::Value;

/// The built `sandcell` binary: cargo builds it before it runs this test.
fn cli_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandcell"))
}

/// One CLI invocation against a data directory.
struct Cli {
    data_dir: PathBuf,
    /// `--backend X`, or nothing for the default (local).
    backend: Vec<String>,
}

impl Cli {
    fn new(dir: &Path) -> Self {
        Cli {
            data_dir: dir.join("data"),
            backend: Vec::new(),
        }
    }

    fn docker(dir: &Path) -> Self {
        Cli {
            data_dir: dir.join("data"),
            backend: vec!["--backend".into(), "docker".into()],
        }
    }

    fn remote(dir: &Path, url: &str, token: &str) -> Self {
        Cli {
            data_dir: dir.join("data"),
            backend: vec![
                "--backend".into(),
                "remote".into(),
                "--remote-url".into(),
                url.into(),
                "--remote-token".into(),
                token.into(),
            ],
        }
    }

    /// `--backend e2b` against an endpoint serving both of E2B's APIs at `url`.
    fn e2b(dir: &Path, url: &str, key: &str) -> Self {
        Cli {
            data_dir: dir.join("data"),
            backend: vec![
                "--backend".into(),
                "e2b".into(),
                "--e2b-api-url".into(),
                url.into(),
                "--e2b-sandbox-url".into(),
                url.into(),
                "--e2b-api-key".into(),
                key.into(),
            ],
        }
    }

    fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut child = Command::new(cli_binary())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.backend)
            .args(args)
            .env_remove("SANDCELL_LOG")
            .env_remove("E2B_API_KEY")
            .env_remove("E2B_API_URL")
            .env_remove("E2B_SANDBOX_URL")
            .env_remove("E2B_DOMAIN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        if let Some(data) = stdin {
            pipe.write_all(data).unwrap();
        }
        drop(pipe);
        child.wait_with_output().unwrap()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, None)
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "sandcell {args:?} failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // Progress is for terminals only; a pipe gets nothing.
        assert!(out.stderr.is_empty(), "stderr: {:?}", out.stderr);
        out.stdout
    }

    /// Runs a command that must succeed and print exactly one JSON object.
    fn json(&self, args: &[&str]) -> Value {
        let lines = json_lines(&self.ok(args));
        assert_eq!(lines.len(), 1, "sandcell {args:?} printed {lines:?}");
        lines.into_iter().next().unwrap()
    }

    /// The local backend's sandbox directories under this data dir.
    fn sandbox_dirs(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(self.data_dir.join("local").join("sandboxes")) {
            Ok(dir) => dir.map(|e| e.unwrap().path()).collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    std::str::from_utf8(stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

/// A failure is exactly one line on stderr, never a panic, with the expected status.
fn assert_one_line_error(out: &Output, status: i32, mentions: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr:?}");
    assert!(stderr.starts_with("sandcell: "), "{stderr:?}");
    assert!(stderr.contains(mentions), "{stderr:?} lacks {mentions:?}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"));
    assert!(out.stdout.is_empty(), "stdout on error: {:?}", out.stdout);
}

#[test]
fn a_session_survives_process_restarts_through_suspend_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(dir.path());
    let template = dir.path().join("template");
    std::fs::create_dir_all(template.join("src")).unwrap();
    std::fs::write(template.join("src/lib.txt"), "from the template\n").unwrap();

    let added = cli.json(&["template", "add", "proj", template.to_str().unwrap()]);
    assert_eq!(added["template"], "proj");

    let acquired = cli.json(&[
        "acquire",
        "s1",
        "--template",
        "proj",
        "--env",
        "GREETING=hi",
    ]);
    assert_eq!(acquired["tenant"], "default");
    assert_eq!(acquired["session"], "s1");
    assert_eq!(acquired["backend"], "local");
    assert_eq!(acquired["status"], "running");
    assert_eq!(acquired["outcome"], "created");
    let first_id = acquired["sandbox_id"].as_str().unwrap().to_owned();

    // Bytes that are not UTF-8 must survive the round trip untouched.
    let payload: Vec<u8> = b"line one\n\xff\xfe binary\n".to_vec();
    let out = cli.run_with_stdin(&["write", "s1", "notes/data.bin"], Some(&payload));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = cli.run(&[
        "exec",
        "s1",
        "--",
        "sh",
        "-c",
        "cat src/lib.txt; echo \"$GREETING\"; echo to-stderr >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"from the template\nhi\n");
    assert_eq!(out.stderr, b"to-stderr\n");

    let out = cli.run(&[
        "exec",
        "s1",
        "--cwd",
        "notes",
        "--env",
        "X=1",
        "--",
        "sh",
        "-c",
        "pwd; echo $X",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.ends_with("/notes\n1\n"), "{text:?}");

    let suspended = cli.json(&["suspend", "s1"]);
    assert_eq!(suspended["status"], "suspended");
    assert!(suspended["sandbox_id"].is_null());
    assert!(suspended["snapshot"].is_string());
    assert!(
        cli.sandbox_dirs().is_empty(),
        "suspend left {:?}",
        cli.sandbox_dirs()
    );

    let listed = json_lines(&cli.ok(&["list"]));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["session"], "s1");
    assert_eq!(listed[0]["status"], "suspended");

    // A new process restores the session from its snapshot.
    let again = cli.json(&["acquire", "s1"]);
    assert_eq!(again["outcome"], "restored");
    assert_eq!(again["status"], "running");
    assert_ne!(again["sandbox_id"].as_str().unwrap(), first_id);
    assert_eq!(cli.ok(&["read", "s1", "notes/data.bin"]), payload);
    let out = cli.run(&["exec", "s1", "--", "sh", "-c", "echo $GREETING"]);
    assert_eq!(
        out.stdout, b"hi\n",
        "the session's env survives the restore"
    );

    // A third process reuses the live sandbox.
    assert_eq!(cli.json(&["acquire", "s1"])["outcome"], "reused");

    let purged = cli.json(&["release", "s1", "--purge"]);
    assert_eq!(purged["status"], "purged");
    assert!(json_lines(&cli.ok(&["list"])).is_empty());
    assert!(cli.sandbox_dirs().is_empty());
    assert!(
        !cli.data_dir.join("snapshots/default/s1").exists()
            || std::fs::read_dir(cli.data_dir.join("snapshots/default/s1"))
                .unwrap()
                .next()
                .is_none(),
        "purge left snapshots"
    );
}

#[test]
fn exec_reports_timeouts_signals_and_forwards_stdin_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(dir.path());
    cli.json(&["acquire", "s"]);

    // The timeout kills the whole tree inside the sandbox, not just the client.
    let marker = format!("31{}.5", std::process::id() % 1000);
    let script = format!("sleep {marker} & sleep {marker}");
    let started = Instant::now();
    let out = cli.run(&["exec", "s", "--timeout", "0.5", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(124));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        processes_mentioning(&marker).is_empty(),
        "left behind: {:?}",
        processes_mentioning(&marker)
    );

    let out = cli.run(&["exec", "s", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));

    let out = cli.run_with_stdin(&["exec", "s", "-i", "--", "cat"], Some(b"typed input"));
    assert_eq!(out.stdout, b"typed input");
    let out = cli.run_with_stdin(&["exec", "s", "--", "cat"], Some(b"typed input"));
    assert!(out.status.success());
    assert_eq!(out.stdout, b"", "stdin is not forwarded without -i");

    cli.ok(&["release", "s", "--destroy"]);
    assert!(cli.sandbox_dirs().is_empty());
}

/// Processes on this host whose command line contains `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

/// ADVERSARIAL 45: a data directory that is a symlink, or beneath a directory others
/// may change, or another user's, is refused before anything is read or written there.
#[test]
fn a_data_directory_someone_else_could_have_placed_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("data")).unwrap();
    let cli = Cli::new(dir.path());
    assert_one_line_error(&cli.run(&["list"]), 1, "symbolic link");
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
    // A trailing `/` (as a shell's completion adds) or `/.` must not follow the link,
    // in the check or in anything done with the directory after it.
    for form in ["data/", "data/."] {
        let cli = Cli {
            data_dir: dir.path().join(form),
            backend: Vec::new(),
        };
        assert_one_line_error(&cli.run(&["list"]), 1, "symbolic link");
        let source = dir.path().join("template");
        std::fs::create_dir_all(&source).unwrap();
        let out = cli.run(&["template", "add", "t", source.to_str().unwrap()]);
        assert_one_line_error(&out, 1, "symbolic link");
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
        let meta = std::fs::metadata(&real).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o700, "{form}");
    }

    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cli = Cli::new(&shared);
    assert_one_line_error(&cli.run(&["list"]), 1, "not sticky");
    assert!(!shared.join("data").exists());

    if rustix::process::geteuid().is_root() {
        let theirs = dir.path().join("theirs");
        std::fs::create_dir_all(theirs.join("data")).unwrap();
        let nobody = Some(rustix::fs::Uid::from_raw(65534));
        rustix::fs::chown(theirs.join("data"), nobody, None).unwrap();
        let cli = Cli::new(&theirs);
        assert_one_line_error(&cli.run(&["list"]), 1, "owned by uid 65534");
        assert_eq!(std::fs::read_dir(theirs.join("data")).unwrap().count(), 0);
    }
}

#[test]
fn bad_input_is_one_line_on_stderr_and_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(dir.path());
    cli.json(&["acquire", "s"]);

    let cases: &[(&[&str], &str)] = &[
        (&["read", "nobody", "x"], "unknown session \"nobody\""),
        (&["exec", "nobody", "--", "true"], "sandcell acquire nobody"),
        (&["read", "s", "../etc/passwd"], "'..'"),
        (&["read", "s", "/etc/passwd"], "/etc/passwd"),
        (&["read", "s", "missing.txt"], "missing.txt"),
        (&["exec", "s", "--bogus", "--", "true"], "--bogus"),
        (&["exec", "s", "--timeout", "0", "--", "true"], "positive"),
        (&["exec", "s", "--env", "NOEQUALS", "--", "true"], "K=V"),
        (&["acquire", "t", "--template", "nope"], "template add nope"),
        (&["release", "s"], "--destroy|--purge"),
        (&["list", "--tenant", "bad tenant"], "tenant"),
        (&["acquire", "bad/name"], "session id"),
        (
            &["template", "add", "x", "/definitely/not/here"],
            "not a directory",
        ),
        (&["--backend", "nosuch", "list"], "nosuch"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, mentions) in cases {
        let out = cli.run(args);
        assert_one_line_error(&out, 2, mentions);
    }
    // The failed calls changed nothing.
    let listed = json_lines(&cli.ok(&["list"]));
    assert_eq!(listed.len(), 1);
    cli.ok(&["release", "s", "--purge"]);
}

#[test]
fn snapshot_ls_and_gc_report_json() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(dir.path());
    cli.json(&["acquire", "s", "--tenant", "acme"]);
    let out = cli.run_with_stdin(&["write", "s", "--tenant", "acme", "a.txt"], Some(b"aaa"));
    assert!(out.status.success());
    cli.ok(&["exec", "s", "--tenant", "acme", "--", "mkdir", "sub"]);

    let entries = json_lines(&cli.ok(&["ls", "s", "--tenant", "acme"]));
    let mut names: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    names.sort();
    assert_eq!(names, [("a.txt", "file"), ("sub", "dir")]);

    // `list --metrics` adds the live sandbox's reading; a session without one gets null.
    cli.json(&["acquire", "idle", "--tenant", "acme"]);
    cli.ok(&["suspend", "idle", "--tenant", "acme"]);
    let listed = json_lines(&cli.ok(&["list", "--tenant", "acme", "--metrics"]));
    let live = listed.iter().find(|s| s["session"] == "s").unwrap();
    assert!(
        live["metrics"]["disk_bytes"].as_u64().unwrap() >= 3,
        "the file written counts: {live}"
    );
    assert!(live["metrics"]["at"].is_string(), "{live}");
    let suspended = listed.iter().find(|s| s["session"] == "idle").unwrap();
    assert!(suspended["metrics"].is_null(), "{suspended}");
    let plain = json_lines(&cli.ok(&["list", "--tenant", "acme"]));
    assert!(plain.iter().all(|s| s.get("metrics").is_none()));
    cli.ok(&["release", "idle", "--tenant", "acme", "--purge"]);

    let manifest = cli.json(&["snapshot", "s", "--tenant", "acme"]);
    assert!(manifest["id"].is_string());
    assert!(manifest["size_bytes"].as_u64().unwrap() > 0);
    assert_eq!(manifest["sha256"].as_str().unwrap().len(), 64);
    assert!(manifest["created_at"].is_string());

    // After a crash: a sandbox with this manager's label that no session knows, and a
    // session whose sandbox vanished. `gc` cleans up both.
    let (orphan, session_sandbox, neighbour) =
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let backend = sandcell_local::LocalBackend::builder()
                .root(cli.data_dir.join("local"))
                .build()
                .unwrap();
            let selector = LabelSelector::new().label("sandcell.session", "s");
            let session_sandbox = backend.list(&selector).await.unwrap().remove(0);
            // The orphan carries what the CLI's manager labels its sandboxes with: its
            // (default, store-derived) manager id and its store's instance id.
            let mut spec = SandboxSpec::new("default");
            for label in ["sandcell.manager", "sandcell.store"] {
                spec = spec.label(label, &session_sandbox.labels[label]);
            }
            let orphan = backend.create(&spec).await.unwrap();
            // A neighbour's sandbox (another data directory) is left alone.
            let neighbour = backend
                .create(
                    &SandboxSpec::new("default")
                        .label(
                            "sandcell.manager",
                            &session_sandbox.labels["sandcell.manager"],
                        )
                        .label("sandcell.store", "another-store"),
                )
                .await
                .unwrap();
            backend.destroy(&session_sandbox.id).await.unwrap();
            (orphan.id, session_sandbox.id, neighbour.id)
        });
    let report = cli.json(&["gc"]);
    assert_eq!(
        report["reconcile"]["destroyed"],
        serde_json::json!([orphan])
    );
    assert_eq!(
        cli.sandbox_dirs().len(),
        1,
        "the neighbour's sandbox is kept"
    );
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let backend = sandcell_local::LocalBackend::builder()
            .root(cli.data_dir.join("local"))
            .build()
            .unwrap();
        backend.destroy(&neighbour).await.unwrap();
    });
    assert_eq!(
        report["reconcile"]["lost"],
        serde_json::json!([{"tenant": "acme", "session": "s"}])
    );
    assert!(cli.sandbox_dirs().is_empty(), "{:?}", session_sandbox);

    // The lost session comes back from its snapshot on the next access.
    assert_eq!(cli.ok(&["read", "s", "--tenant", "acme", "a.txt"]), b"aaa");
    cli.ok(&["release", "s", "--tenant", "acme", "--purge"]);
    assert!(cli.sandbox_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_session_survives_process_restarts_too() {
    if !docker_testing::engine_available().await {
        return;
    }
    docker_testing::test_images().await.unwrap();
    // The CLI finds the agent through the environment, as a user's shell would.
    std::env::set_var(
        "SANDCELL_DOCKER_AGENT",
        docker_testing::agent_binary().unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::docker(dir.path());
    cli.json(&["template", "add", "default", docker_testing::USER_IMAGE]);
    let acquired = cli.json(&["acquire", "d1"]);
    assert_eq!(
        (acquired["backend"].as_str(), acquired["outcome"].as_str()),
        (Some("docker"), Some("created"))
    );
    let sandbox = acquired["sandbox_id"].as_str().unwrap().to_owned();
    let out = cli.run_with_stdin(&["write", "d1", "app/main.sh"], Some(b"echo from docker\n"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli.run(&["exec", "d1", "--", "sh", "app/main.sh"]);
    assert_eq!(out.stdout, b"from docker\n");
    assert_eq!(cli.json(&["suspend", "d1"])["status"], "suspended");
    let again = cli.json(&["acquire", "d1"]);
    assert_eq!(again["outcome"], "restored");
    assert_ne!(again["sandbox_id"].as_str().unwrap(), sandbox);
    assert_eq!(
        cli.ok(&["read", "d1", "app/main.sh"]),
        b"echo from docker\n"
    );
    // The session belongs to Docker; the local backend says so instead of guessing...
    let local = Cli::new(dir.path());
    let out = local.run(&["read", "d1", "app/main.sh"]);
    assert_one_line_error(&out, 2, "--backend docker");
    // ...until it is acquired there: the live container is suspended through Docker and
    // its snapshot restored on the local backend.
    let docker = sandcell_docker::DockerBackend::builder().build().unwrap();
    let moved = local.json(&["acquire", "d1"]);
    assert_eq!(
        (moved["backend"].as_str(), moved["outcome"].as_str()),
        (Some("local"), Some("restored"))
    );
    let container = sandcell::SandboxId::new(again["sandbox_id"].as_str().unwrap()).unwrap();
    assert!(
        docker.inspect(&container).await.is_err(),
        "the move suspended the container"
    );
    assert_eq!(
        local.ok(&["exec", "d1", "--", "sh", "app/main.sh"]),
        b"from docker\n"
    );
    local.ok(&[
        "exec",
        "d1",
        "--",
        "sh",
        "-c",
        "echo 'echo from local' >> app/main.sh",
    ]);
    let out = cli.run(&["read", "d1", "app/main.sh"]);
    assert_one_line_error(&out, 2, "--backend local");
    // And back, with the local change.
    let back = cli.json(&["acquire", "d1"]);
    assert_eq!(
        (back["backend"].as_str(), back["outcome"].as_str()),
        (Some("docker"), Some("restored"))
    );
    assert!(
        local.sandbox_dirs().is_empty(),
        "the move suspended the local sandbox"
    );
    assert_eq!(
        cli.ok(&["exec", "d1", "--", "sh", "app/main.sh"]),
        b"from docker\nfrom local\n"
    );
    assert_eq!(cli.json(&["release", "d1", "--purge"])["status"], "purged");
    let gone = docker
        .inspect(&sandcell::SandboxId::new(back["sandbox_id"].as_str().unwrap()).unwrap())
        .await;
    assert!(gone.is_err(), "purge removed the container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_session_lives_on_a_sandcell_server() {
    let dir = tempfile::tempdir().unwrap();
    let served = sandcell_local::LocalBackend::builder()
        .root(dir.path().join("server"))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(sandcell_server::serve(
        listener,
        std::sync::Arc::new(served.clone()),
        sandcell_server::ServerConfig::new("cli-token"),
        std::future::pending(),
    ));
    let cli = Cli::remote(dir.path(), &url, "cli-token");
    // The CLI is a blocking child process: keep this runtime free to serve it.
    let run = |cli: Cli| {
        tokio::task::spawn_blocking(move || {
            let acquired = cli.json(&["acquire", "r1"]);
            assert_eq!(
                (acquired["backend"].as_str(), acquired["outcome"].as_str()),
                (Some("remote"), Some("created"))
            );
            let out =
                cli.run_with_stdin(&["write", "r1", "app/hi.sh"], Some(b"echo from remote\n"));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let out = cli.run(&["exec", "r1", "--", "sh", "app/hi.sh"]);
            assert_eq!(out.stdout, b"from remote\n");
            assert_eq!(cli.json(&["suspend", "r1"])["status"], "suspended");
            assert_eq!(cli.json(&["acquire", "r1"])["outcome"], "restored");
            assert_eq!(cli.ok(&["read", "r1", "app/hi.sh"]), b"echo from remote\n");
            // A session live on a hosted backend moves only once suspended there: this
            // invocation has no flags to reach the server.
            let local = Cli {
                data_dir: cli.data_dir.clone(),
                backend: Vec::new(),
            };
            let out = local.run(&["acquire", "r1"]);
            assert_one_line_error(&out, 2, "suspend it there first");
            assert_eq!(cli.json(&["suspend", "r1"])["status"], "suspended");
            let moved = local.json(&["acquire", "r1"]);
            assert_eq!(
                (moved["backend"].as_str(), moved["outcome"].as_str()),
                (Some("local"), Some("restored"))
            );
            assert_eq!(
                local.ok(&["read", "r1", "app/hi.sh"]),
                b"echo from remote\n"
            );
            assert_eq!(
                local.json(&["release", "r1", "--purge"])["status"],
                "purged"
            );
            // Templates live on the server; a wrong token is refused with the reason.
            let out = cli.run(&["template", "add", "t", "."]);
            assert_one_line_error(&out, 2, "server");
        })
    };
    run(cli).await.unwrap();
    assert!(
        served.list(&LabelSelector::new()).await.unwrap().is_empty(),
        "the purge left a sandbox on the server"
    );
    let bad = Cli::remote(dir.path(), &url, "wrong");
    let out = tokio::task::spawn_blocking(move || bad.run(&["acquire", "r2"]))
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Authorization"), "{stderr}");
    let missing = Cli {
        data_dir: dir.path().join("data"),
        backend: vec!["--backend".into(), "remote".into()],
    };
    let out = tokio::task::spawn_blocking(move || missing.run(&["acquire", "r3"]))
        .await
        .unwrap();
    assert_one_line_error(&out, 2, "--remote-url");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_e2b_session_lives_on_a_sandcell_servers_e2b_face() {
    let dir = tempfile::tempdir().unwrap();
    let served = sandcell_local::LocalBackend::builder()
        .root(dir.path().join("server"))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(sandcell_server::serve(
        listener,
        std::sync::Arc::new(served.clone()),
        sandcell_server::ServerConfig::new("e2b_cli"),
        std::future::pending(),
    ));
    let cli = Cli::e2b(dir.path(), &url, "e2b_cli");
    let run = |cli: Cli| {
        tokio::task::spawn_blocking(move || {
            let acquired = cli.json(&["acquire", "e1"]);
            assert_eq!(
                (acquired["backend"].as_str(), acquired["outcome"].as_str()),
                (Some("e2b"), Some("created"))
            );
            let out = cli.run_with_stdin(&["write", "e1", "app/hi.sh"], Some(b"echo from e2b\n"));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let out = cli.run(&["exec", "e1", "--", "sh", "app/hi.sh"]);
            assert_eq!(out.stdout, b"from e2b\n");
            let out = cli.run(&["exec", "e1", "--", "sh", "-c", "exit 7"]);
            assert_eq!(out.status.code(), Some(7), "the exit status passes through");
            assert_eq!(cli.json(&["suspend", "e1"])["status"], "suspended");
            assert_eq!(cli.json(&["acquire", "e1"])["outcome"], "restored");
            assert_eq!(cli.ok(&["read", "e1", "app/hi.sh"]), b"echo from e2b\n");
            assert_eq!(cli.json(&["release", "e1", "--purge"])["status"], "purged");
        })
    };
    run(cli).await.unwrap();
    assert!(
        served.list(&LabelSelector::new()).await.unwrap().is_empty(),
        "the purge left a sandbox on the server"
    );
    let bad = Cli::e2b(dir.path(), &url, "wrong");
    let out = tokio::task::spawn_blocking(move || bad.run(&["acquire", "e2"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("API key"), "{stderr}");
    let missing = Cli {
        data_dir: dir.path().join("data"),
        backend: vec!["--backend".into(), "e2b".into()],
    };
    let out = tokio::task::spawn_blocking(move || missing.run(&["acquire", "e3"]))
        .await
        .unwrap();
    assert_one_line_error(&out, 2, "E2B_API_KEY");
    server.abort();
}

/// Creates a bucket on the S3-protocol server at `endpoint` (moto takes unsigned
/// bucket requests); returns its name.
fn make_bucket(endpoint: &str) -> String {
    use std::io::Read;
    let bucket = format!("sandcell-{}", uuid::Uuid::new_v4().simple());
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    bucket
}

#[test]
fn two_hosts_share_one_postgres_and_one_bucket() {
    let postgres = std::env::var("SANDCELL_POSTGRES_URL").unwrap_or_default();
    let s3 = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
    let probe = match (postgres.is_empty(), s3.is_empty()) {
        (false, false) => Ok(()),
        _ => Err("SANDCELL_POSTGRES_URL and AWS_ENDPOINT_URL must both be set".to_owned()),
    };
    if !sandcell::testing::require_or_skip("POSTGRES", "PostgreSQL and an S3 server", probe) {
        return;
    }
    let bucket = make_bucket(&s3);
    let dir = tempfile::tempdir().unwrap();
    // Two "hosts": each its own data directory (its own local sandboxes) and manager
    // id, sharing the state in PostgreSQL and the snapshots in one bucket.
    let host = |name: &str| Cli {
        data_dir: dir.path().join(name),
        backend: vec![
            "--state".into(),
            postgres.clone(),
            "--snapshots".into(),
            format!("s3://{bucket}/snapshots"),
            "--manager-id".into(),
            name.into(),
        ],
    };
    let (a, b) = (host("host-a"), host("host-b"));
    let tenant = format!("hosts-{}", uuid::Uuid::new_v4().simple());
    let t = ["--tenant", tenant.as_str()];

    let acquired = a.json(&[&["acquire", "chat"][..], &t].concat());
    assert_eq!(acquired["outcome"], "created");
    let out = a.run(
        &[
            &["exec", "chat"][..],
            &t,
            &["--", "sh", "-c", "echo from-a > f.txt"],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Live on host A (its lease has not expired): host B is told so, and makes nothing.
    let out = b.run(&[&["acquire", "chat"][..], &t].concat());
    assert_one_line_error(&out, 1, "'host-a'");
    assert!(b.sandbox_dirs().is_empty());

    // Suspended on A, the session moves to B from the bucket.
    let suspended = a.json(&[&["suspend", "chat"][..], &t].concat());
    assert_eq!(suspended["status"], "suspended");
    let restored = b.json(&[&["acquire", "chat"][..], &t].concat());
    assert_eq!(restored["outcome"], "restored");
    assert_eq!(
        b.ok(&[&["read", "chat", "f.txt"][..], &t].concat()),
        b"from-a\n"
    );
    assert!(a.sandbox_dirs().is_empty());
    assert_eq!(b.sandbox_dirs().len(), 1);

    // And now A is the one refused.
    let out = a.run(&[&["acquire", "chat"][..], &t].concat());
    assert_one_line_error(&out, 1, "'host-b'");
    let purged = b.json(&[&["release", "chat", "--purge"][..], &t].concat());
    assert_eq!(purged["status"], "purged");
}

/// A new session gets the recommended limits where the backend enforces them (512 MiB
/// of memory among them), and the flags set others.
#[test]
fn acquire_applies_recommended_limits_and_the_flags() {
    if !rustix::process::geteuid().is_root() || !std::path::Path::new("/usr/bin/python3").exists() {
        // Memory limits need cgroups, which this backend has as root.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(dir.path());
    let allocate = |session: &str, mib: u32| {
        cli.run(&[
            "exec",
            session,
            "--",
            "python3",
            "-c",
            &format!("x = b'a' * ({mib} << 20); print(len(x) >> 20)"),
        ])
    };
    cli.json(&["acquire", "recommended"]);
    let out = allocate("recommended", 100);
    assert_eq!(out.stdout, b"100\n", "{out:?}");
    let out = allocate("recommended", 700);
    assert!(!out.status.success(), "700 MiB fit in the default: {out:?}");

    cli.json(&["acquire", "small", "--memory-mb", "64", "--pids", "32"]);
    let out = allocate("small", 100);
    assert!(!out.status.success(), "100 MiB fit in 64: {out:?}");
    let out = cli.run(&[
        "exec",
        "small",
        "--",
        "sh",
        "-c",
        "for i in $(seq 40); do sleep 5 & done; wait",
    ]);
    assert!(!out.status.success(), "40 processes fit in 32: {out:?}");
    for session in ["recommended", "small"] {
        cli.ok(&["release", session, "--destroy"]);
    }
}
