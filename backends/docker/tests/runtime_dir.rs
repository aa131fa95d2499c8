//! ADVERSARIAL 45 on the Docker backend: the runtime directory (host-directory
//! workspaces' layers, which root mounts, and egress sockets) is private. One another
//! local user created first, or a symlink in its place, is refused at `build`, before
//! anything is mounted or written; one the backend creates is `0700`; the default is
//! not in a shared temporary directory. None of this needs an engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sandcell::ErrorKind;
use sandcell_docker::{DockerBackend, DockerConfig};

fn refusal(runtime: &Path) -> sandcell::Error {
    let Err(err) = DockerBackend::builder().runtime_dir(runtime).build() else {
        panic!("{} was accepted", runtime.display());
    };
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err:#}");
    err
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn the_default_runtime_dir_is_not_in_a_shared_temporary_directory() {
    let dir = DockerConfig::default().runtime_dir;
    assert!(
        !dir.starts_with(std::env::temp_dir()) || std::env::var_os("HOME").is_none(),
        "{}",
        dir.display()
    );
    if rustix::process::geteuid().is_root() {
        assert_eq!(dir, Path::new("/var/lib/sandcell-docker"));
    }
}

#[test]
fn a_runtime_dir_the_backend_creates_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("made").join("runtime");
    // Without an engine `build` fails after the directory is made; either way it is.
    let _ = DockerBackend::builder().runtime_dir(&dir).build();
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn a_symlinked_runtime_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = tmp.path().join("runtime");
    std::os::unix::fs::symlink(&target, &dir).unwrap();
    let err = refusal(&dir);
    assert!(err.to_string().contains("symbolic link"), "{err:#}");
}

#[test]
fn a_runtime_dir_others_can_write_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runtime");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = refusal(&dir);
    assert!(err.to_string().contains("writable"), "{err:#}");
}

#[test]
fn a_runtime_dir_another_user_created_first_is_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs root to give the runtime directory to another uid");
        return;
    }
    // The attack: an unprivileged user makes the directory (and a `workspaces/<id>`
    // with `merged` a symlink into /etc) before root's first sandbox.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runtime");
    std::fs::create_dir_all(dir.join("workspaces")).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = (
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    );
    rustix::fs::chown(&dir, nobody.0, nobody.1).unwrap();
    let err = refusal(&dir);
    assert!(err.to_string().contains("owned by uid 65534"), "{err:#}");
}
