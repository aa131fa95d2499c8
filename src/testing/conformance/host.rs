//! Host-boundary cases: what a command can reach of the process that runs it
//! (ADVERSARIAL 36 and 44).

use std::path::{Path, PathBuf};

use super::{shell_is_refused, spec, with_sandbox};
use crate::{ExecRequest, SandboxBackend, SandboxBackendExt};

/// A shared object whose constructor, wherever it is loaded, creates a file in
/// `marker_dir` named after the program that loaded it; `la_version` makes it an
/// `LD_AUDIT` library too.
const PAYLOAD: &str = r#"
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void sandcell_adversarial_36(void) {
    char comm[64] = {0};
    int c = open("/proc/self/comm", O_RDONLY);
    if (c >= 0) { if (read(c, comm, sizeof comm - 1) < 0) comm[0] = 0; close(c); }
    for (char *p = comm; *p; p++) if (*p == '\n' || *p == '/') *p = 0;
    char path[1024];
    strcpy(path, MARKER_DIR "/");
    strcat(path, comm[0] ? comm : "unknown");
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
}
unsigned int la_version(unsigned int version) { return version; }
"#;

/// A host directory anyone may write, removed on drop.
#[derive(Debug)]
struct MarkerDir(PathBuf);

impl MarkerDir {
    fn new() -> MarkerDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "sandcell-adversarial-36-{}",
            crate::SandboxId::generate("m")
        ));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        MarkerDir(dir)
    }
}

impl Drop for MarkerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// ADVERSARIAL 36's payload, built on the host with its C compiler (`cc`): a shared
/// object whose constructor, wherever it is loaded, creates a file named after the
/// program that loaded it in a host directory anyone may write. A face's own test
/// (an SDK's, say) hands [`path`](Self::path) to the sandbox and to its requests'
/// loader variables, then checks [`markers`](Self::markers) is empty. Both
/// directories are removed on drop.
#[derive(Debug)]
pub struct LoaderPayload {
    markers: MarkerDir,
    _build: MarkerDir,
    path: PathBuf,
}

impl LoaderPayload {
    /// Compiles the payload; panics without a C compiler.
    pub fn build() -> LoaderPayload {
        let markers = MarkerDir::new();
        let build = MarkerDir::new();
        let path = build.0.join("payload.so");
        let source = build.0.join("payload.c");
        std::fs::write(&source, PAYLOAD).unwrap();
        let status = std::process::Command::new("cc")
            .arg(format!("-DMARKER_DIR=\"{}\"", markers.0.display()))
            .args(["-shared", "-fPIC", "-o"])
            .arg(&path)
            .arg(&source)
            .status()
            .expect("ADVERSARIAL 36 builds its payload with the host's C compiler (cc)");
        assert!(status.success(), "cc could not build the payload");
        LoaderPayload {
            markers,
            _build: build,
            path,
        }
    }

    /// The shared object on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The host directory its constructor writes to.
    pub fn marker_dir(&self) -> &Path {
        &self.markers.0
    }

    /// The programs that loaded it on the host so far, sorted (empty while the
    /// boundary holds).
    pub fn markers(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.marker_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// ADVERSARIAL 36: a command run with `LD_PRELOAD`, `LD_AUDIT`, `LD_LIBRARY_PATH`,
/// `GCONV_PATH` and `BASH_ENV` pointing at files the sandbox wrote (and, as strongly,
/// at a copy on the host, where a sandbox that learnt its host path would point them)
/// runs nothing outside the sandbox: every helper a backend starts on the host gets an
/// environment the backend builds. The variables still reach the command itself.
///
/// Backends whose commands are not isolated from the host (no network isolation
/// claimed, the local backend's `Isolation::None`) have no boundary to check.
pub async fn host_helpers_ignore_loader_variables(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "host_helpers_ignore_loader_variables").await;
    }
    if !b.capabilities().network_isolation {
        return;
    }
    let built = &LoaderPayload::build();
    let host_payload = built.path().to_owned();
    let payload = std::fs::read(&host_payload).unwrap();
    with_sandbox(b, spec(), |id| async move {
        let root = b.run(&id, ExecRequest::new(["pwd"])).await.unwrap();
        assert!(root.success(), "{root:?}");
        let root = root.stdout_str().trim().to_owned();
        b.mkdir(&id, &super::p("adv36/gconv")).await.unwrap();
        b.write(&id, &super::p("adv36/payload.so"), payload.into())
            .await
            .unwrap();
        let touch = format!("touch {}/bash_env\n", built.marker_dir().display());
        b.write(&id, &super::p("adv36/env.sh"), touch.into())
            .await
            .unwrap();
        // Writing the host's files directly is what the sandbox must not do either.
        let probe = b
            .run_shell(
                &id,
                &format!("touch {}/direct", built.marker_dir().display()),
            )
            .await
            .unwrap();
        assert!(
            !probe.success(),
            "a command wrote a host directory: {probe:?}"
        );
        let inside = |file: &str| format!("{root}/adv36/{file}");
        for preload in [inside("payload.so"), host_payload.display().to_string()] {
            let request = ExecRequest::new(["sh", "-c", "echo \"$LD_PRELOAD\""])
                .env("LD_PRELOAD", &preload)
                .env("LD_AUDIT", &preload)
                .env("LD_LIBRARY_PATH", inside("gconv"))
                .env("GCONV_PATH", inside("gconv"))
                .env("BASH_ENV", inside("env.sh"));
            let out = b.run(&id, request).await.unwrap();
            assert_eq!(
                out.stdout_str().lines().last(),
                Some(preload.as_str()),
                "the command's own environment was lost: {out:?}"
            );
            assert_eq!(
                built.markers(),
                Vec::<String>::new(),
                "ADVERSARIAL 36: code the sandbox chose ran outside it (named by the \
                 program that loaded it) with LD_PRELOAD={preload}"
            );
        }
    })
    .await;
}

/// ADVERSARIAL 44: a command holds no descriptor but its stdio, even while another
/// sandbox of the same backend holds a terminal (backends with a shell; the terminal
/// part on those with `pty`).
pub async fn commands_inherit_no_descriptors(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "commands_inherit_no_descriptors").await;
    }
    with_sandbox(b, spec(), |holder| async move {
        let terminal = if b.capabilities().pty {
            let request = ExecRequest::new(["sh"]).pty(crate::TerminalSize::new(24, 80));
            Some(b.exec(&holder, request).await.unwrap())
        } else {
            None
        };
        with_sandbox(b, spec(), |id| async move {
            // The shell's own descriptors, listed by a child (`; true` keeps a shell
            // from exec'ing its last command, which would list the child's own).
            let out = b.run_shell(&id, "ls -l /proc/$$/fd; true").await.unwrap();
            assert!(out.success(), "{out:?}");
            let listing = out.stdout_str();
            let mut fds: Vec<u32> = listing
                .lines()
                // Each descriptor is a link; the name before ` -> ` is its number.
                .filter(|line| line.starts_with('l'))
                .filter_map(|line| {
                    let name = line.split(" -> ").next()?.split_whitespace().last()?;
                    name.parse().ok()
                })
                .collect();
            fds.sort_unstable();
            assert_eq!(
                fds,
                vec![0, 1, 2],
                "ADVERSARIAL 44: a command inherited descriptors it was not given: {listing}"
            );
        })
        .await;
        if let Some(mut terminal) = terminal {
            terminal.kill().await.unwrap();
        }
    })
    .await;
}
