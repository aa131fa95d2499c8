//! ADVERSARIAL 45 on the local backend: the sandbox root is private. A root another
//! local user created first, or a symlink in its place, is refused at `build`; a root
//! the backend creates is `0700`; the default is not in a shared temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sandcell::ErrorKind;
use sandcell_local::{Isolation, LocalBackend, LocalConfig};

fn build(root: &Path) -> sandcell::Result<LocalBackend> {
    LocalBackend::builder()
        .root(root)
        .isolation(Isolation::None)
        .build()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn the_default_root_is_not_in_a_shared_temporary_directory() {
    let root = LocalConfig::default().root;
    assert!(
        !root.starts_with(std::env::temp_dir()) || std::env::var_os("HOME").is_none(),
        "{}",
        root.display()
    );
    if rustix::process::geteuid().is_root() {
        assert_eq!(root, Path::new("/var/lib/sandcell-local"));
    }
}

#[test]
fn a_root_the_backend_creates_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("made").join("root");
    build(&root).unwrap();
    assert_eq!(mode(&root), 0o700);
}

#[test]
fn a_symlinked_root_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    let root = tmp.path().join("root");
    std::os::unix::fs::symlink(&target, &root).unwrap();
    let err = build(&root).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err:#}");
    assert!(err.to_string().contains("symbolic link"), "{err:#}");
    assert!(
        std::fs::read_dir(&target).unwrap().next().is_none(),
        "nothing was written through the link"
    );
}

#[test]
fn a_root_others_can_write_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = build(&root).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err:#}");
    assert!(err.to_string().contains("writable"), "{err:#}");
    assert!(std::fs::read_dir(&root).unwrap().next().is_none());
}

#[test]
fn a_root_another_user_created_first_is_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs root to give the root directory to another uid");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = Some(rustix::fs::Uid::from_raw(65534));
    rustix::fs::chown(&root, nobody, Some(rustix::fs::Gid::from_raw(65534))).unwrap();
    let err = build(&root).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err:#}");
    assert!(err.to_string().contains("owned by uid 65534"), "{err:#}");
    assert!(std::fs::read_dir(&root).unwrap().next().is_none());
}
