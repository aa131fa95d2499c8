//! Tests of frozen layers: freezing, remounting and undoing.
#![allow(clippy::unwrap_used)]
use super::*;

/// A sandbox directory under a fresh root with its overlay mounted over a template
/// holding `base.txt`, and `changed.txt` written through it; `None` where this
/// process cannot mount overlays.
fn mounted() -> Option<(tempfile::TempDir, SandboxDir, PathBuf)> {
    let root = tempfile::tempdir().unwrap();
    let template = root.path().join("template");
    fs::create_dir(&template).unwrap();
    fs::write(template.join("base.txt"), "base\n").unwrap();
    let dir = SandboxDir::new(root.path(), &sandcell::SandboxId::generate("local"));
    fs::create_dir_all(dir.path()).unwrap();
    if mount(root.path(), &dir, &[], &template, None).is_err() {
        return None;
    }
    fs::write(dir.workspace().join("changed.txt"), "changed\n").unwrap();
    Some((root, dir, template))
}

fn unmount(dir: &SandboxDir) {
    rustix::mount::unmount(dir.workspace(), UnmountFlags::empty()).unwrap();
}

#[test]
fn a_freeze_moves_the_upper_layer_into_a_layer_and_remounts_over_it() {
    let Some((root, dir, template)) = mounted() else {
        return;
    };
    let _lock = lock(root.path()).unwrap();
    let Frozen::Layer(staged) = freeze(root.path(), &dir, &[], &template, None).unwrap() else {
        panic!("an idle sandbox with changes freezes");
    };
    let name = staged.stack()[0].clone();
    let layer = layer_path(root.path(), &name);
    assert_eq!(
        fs::read_to_string(layer.join("changed.txt")).unwrap(),
        "changed\n"
    );
    staged.remount().unwrap();
    let retired = staged.into_retired();
    assert_eq!(read(&dir).unwrap(), [name]);
    assert_eq!(fs::read_dir(dir.upper()).unwrap().count(), 0);
    let workspace = dir.workspace();
    assert_eq!(
        fs::read_to_string(workspace.join("changed.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        fs::read_to_string(workspace.join("base.txt")).unwrap(),
        "base\n"
    );
    fs::write(workspace.join("after.txt"), "after\n").unwrap();
    assert!(
        dir.upper().join("after.txt").exists(),
        "writes go to the new upper layer"
    );
    assert!(
        !layer.join("after.txt").exists(),
        "the layer is never written"
    );
    let old = retired.dirs.clone();
    assert!(old.iter().all(|d| d.exists()));
    drop(retired);
    assert!(
        old.iter().all(|d| !d.exists()),
        "the old directories go with the teardown"
    );
    unmount(&dir);
}

#[test]
fn a_failed_remount_puts_the_sandbox_back_as_it_was() {
    let Some((root, dir, template)) = mounted() else {
        return;
    };
    let _lock = lock(root.path()).unwrap();
    let Frozen::Layer(staged) = freeze(root.path(), &dir, &[], &template, None).unwrap() else {
        panic!("an idle sandbox with changes freezes");
    };
    let layer = layer_path(root.path(), &staged.stack()[0]);
    // The work directory gone: its retirement, the remount's first step but one,
    // fails.
    fs::remove_dir_all(dir.work()).unwrap();
    assert!(staged.remount().is_err());
    let old = staged.retired.dirs.clone();
    staged.undo();
    let workspace = dir.workspace();
    assert_eq!(
        fs::read_to_string(workspace.join("changed.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        fs::read_to_string(workspace.join("base.txt")).unwrap(),
        "base\n"
    );
    assert_eq!(
        fs::read_to_string(dir.upper().join("changed.txt")).unwrap(),
        "changed\n",
        "the entries are back in the sandbox's own upper layer"
    );
    assert!(!layer.exists(), "the layer is gone");
    assert!(old.iter().all(|d| !d.exists()), "nothing retired is left");
    assert!(read(&dir).unwrap().is_empty());
    fs::write(workspace.join("after.txt"), "after\n").unwrap();
    assert!(dir.upper().join("after.txt").exists());
    unmount(&dir);
}
