//! A namespaced sandbox can trace the init its commands enter through (the same uid,
//! no capabilities on either side) and make it change its root. Whatever the host
//! opens beneath that root on a command's behalf (the terminal multiplexer of a PTY
//! command) must be looked up inside it: an absolute symlink the sandbox planted there
//! must never lead the host, as root, to one of its own files (ADVERSARIAL 37, 42).

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec, TerminalSize};
use sandcell_local::{Isolation, LocalBackend};

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_never_opens_a_host_file_through_the_inits_root() {
    let gdb = std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !gdb {
        // CI installs gdb and sets SANDCELL_REQUIRE_GDB=1, where this fails instead.
        sandcell::testing::require_or_skip(
            "GDB",
            "tracing a sandbox's init",
            Err("no gdb".to_owned()),
        );
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = common::build_at(
        LocalBackend::builder().root(root.path()),
        Isolation::Namespaces,
    ) else {
        return;
    };
    // A host directory with a `pts/ptmx` of its own, watched for opens.
    let host = tempfile::tempdir().unwrap();
    let pts = host.path().join("pts");
    std::fs::create_dir(&pts).unwrap();
    std::fs::write(pts.join("ptmx"), "").unwrap();
    for dir in [host.path(), pts.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let watch = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).unwrap();
    inotify::add_watch(&watch, &pts, WatchFlags::OPEN).unwrap();

    let sb = backend.create(&SandboxSpec::default()).await.unwrap();
    // The init becomes root of a user namespace of its own (no capability needed),
    // where it may chroot: into a directory whose `dev` is the host directory above.
    // `sh` is copied in so the command is still found in the init's root.
    let hijack = format!(
        "mkdir -p fake/usr/bin && cp /usr/bin/sh fake/usr/bin/sh && ln -s {} fake/dev && \
         init=$(for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep infinity ' ] \
         && echo ${{p#/proc/}}; done; true) && \
         gdb -batch -p $init -ex 'call (int)unshare(0x10000000)' \
         -ex 'call (int)chroot(\"/workspace/fake\")' 2>&1",
        host.path().display()
    );
    let traced = backend.run_shell(&sb.id, &hijack).await.unwrap();
    let chrooted = traced.stdout_str().contains("$2 = 0");
    // A command on a terminal: the host opens the multiplexer beneath the init's root.
    let _ = backend
        .run(
            &sb.id,
            ExecRequest::new(["sh", "-c", "true"]).pty(TerminalSize::new(24, 80)),
        )
        .await;
    let mut buf = [std::mem::MaybeUninit::uninit(); 1024];
    let mut reader = inotify::Reader::new(&watch, &mut buf);
    let opened = reader.next().is_ok();
    backend.destroy(&sb.id).await.unwrap();
    assert!(chrooted, "the init could not be made to chroot: {traced:?}");
    assert!(
        !opened,
        "the host opened {} through a link the sandbox planted in its init's root",
        pts.join("ptmx").display()
    );
}
