//! Directories only this user can change: the default places backends keep their host
//! state (sandbox roots, runtime directories), created `0700` and checked before use.
//!
//! A directory that root mounts or writes through must not be one another local user
//! could have created first, or can rename things in: a shared `/tmp` default lets that
//! user swap a component for a symlink and send root's mount or write elsewhere
//! (ADVERSARIAL case 45). So the defaults live in the user's own state directory, and
//! every directory a backend is given, default or not, is checked by
//! [`ensure_private_dir`]: a real directory (not a symlink), owned by the effective
//! user, writable by nobody else.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

mod walk;

pub use walk::normalize;

/// Where a backend keeps its host state by default, `name` being its directory's
/// name (`sandcell-local`, `sandcell-docker`):
///
/// | running as | directory |
/// |---|---|
/// | root | `/var/lib/<name>` |
/// | another user | `$XDG_STATE_HOME/<name>`, else `$HOME/.local/state/<name>`, else `$XDG_RUNTIME_DIR/<name>` |
/// | a user without any of those variables | `<temp dir>/<name>-<uid>` |
///
/// Only the last is in a directory other users share; [`ensure_private_dir`] refuses
/// it if another user made it first.
pub fn default_dir(name: &str) -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return Path::new("/var/lib").join(name);
    }
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(state) = absolute("XDG_STATE_HOME") {
        return state.join(name);
    }
    if let Some(home) = absolute("HOME") {
        return home.join(".local").join("state").join(name);
    }
    if let Some(runtime) = absolute("XDG_RUNTIME_DIR") {
        return runtime.join(name);
    }
    std::env::temp_dir().join(format!("{name}-{}", rustix::process::geteuid().as_raw()))
}

/// Creates `dir` (and missing parents) `0700` if it does not exist, then checks it is
/// private: a directory, not a symlink, owned by the effective user and writable by no
/// group or other user, and every directory above it owned by root or that user and
/// writable by no one else unless sticky. Anything else is refused with
/// [`ErrorKind::PermissionDenied`](crate::ErrorKind::PermissionDenied) naming the
/// directory and what is wrong with it; nothing is changed then.
///
/// The path is resolved by hand, one component at a time: trailing slashes and `.`
/// are dropped first (see [`normalize`]), so a final symbolic link is refused as one
/// rather than followed, and every link met on the way (its target's links too) must
/// be root's or this user's. What is missing is made beneath the descriptor of the
/// deepest directory already judged, and each new directory is opened without
/// following a link and judged before anything is made in it: nothing put in its
/// place meanwhile is followed, and nothing is made beneath a refused directory.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    let refuse = |problem: String| {
        Error::permission_denied(format!(
            "refusing to use {}: {problem}; remove it or choose another directory",
            dir.display()
        ))
    };
    let walk = walk::walk(dir, &refuse)?;
    match &walk.end {
        walk::End::Found(stat) => walk::judge_private(stat, &refuse),
        walk::End::Missing(_) => {
            #[cfg(test)]
            walk::race::run();
            walk.make_missing(&refuse)
        }
    }
}

/// The check of [`ensure_private_dir`], without creating anything: a missing
/// directory is an error of kind [`ErrorKind::NotFound`](crate::ErrorKind::NotFound).
pub fn check_private_dir(dir: &Path) -> Result<()> {
    let refuse = |problem: String| {
        Error::permission_denied(format!(
            "refusing to use {}: {problem}; remove it or choose another directory",
            dir.display()
        ))
    };
    match walk::walk(dir, &refuse)?.end {
        walk::End::Found(stat) => walk::judge_private(&stat, &refuse),
        walk::End::Missing(names) => {
            let missing = names.first().map(PathBuf::from).unwrap_or_default();
            Err(Error::io(
                format_args!(
                    "inspecting {} ({} is missing)",
                    dir.display(),
                    missing.display()
                ),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ))
        }
    }
}

/// Creates `dir` and its missing parents `0700` (existing ones are left as they are).
/// It follows links and judges nothing: use it only beneath a directory
/// [`ensure_private_dir`] has accepted, or use that instead.
pub fn create_private_dir_all(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ErrorKind;
    use std::os::unix::fs::PermissionsExt;

    const NOBODY: u32 = 65534;

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// A directory `0700` holding nothing, as root's private ones are.
    fn private(path: &Path) -> PathBuf {
        std::fs::create_dir(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
        path.to_path_buf()
    }

    /// A directory others may add to but not rename in (`/tmp`, a shared directory).
    fn sticky(path: &Path) -> PathBuf {
        std::fs::create_dir(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777)).unwrap();
        path.to_path_buf()
    }

    /// `link -> target`, owned by `uid`.
    fn link(target: &Path, link: &Path, uid: u32) {
        std::os::unix::fs::symlink(target, link).unwrap();
        std::os::unix::fs::lchown(link, Some(uid), None).unwrap();
    }

    fn assert_refused(result: Result<()>, what: &str) {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }

    fn empty(dir: &Path) -> bool {
        std::fs::read_dir(dir).unwrap().next().is_none()
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn creates_missing_directories_0700() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a").join("b");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        // Again: an existing private directory is fine.
        ensure_private_dir(&dir).unwrap();
    }

    #[test]
    fn refuses_symlinks_and_shared_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = ensure_private_dir(&link).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("symbolic link"), "{err}");

        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_private_dir(&real).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("writable"), "{err}");
        assert_eq!(mode(&real), 0o777, "a refused directory is left as it is");

        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = ensure_private_dir(&file).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn refuses_a_directory_another_user_owns() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipping: needs root to give a directory to another uid");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        rustix::fs::chown(
            &theirs,
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .unwrap();
        let err = ensure_private_dir(&theirs).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
    }

    #[test]
    fn refuses_a_directory_beneath_one_others_may_change() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        let dir = shared.join("mine");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_private_dir(&dir).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("not sticky"), "{err}");
        // Sticky, as /tmp is: others cannot rename what is not theirs.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_private_dir(&dir).unwrap();
        if rustix::process::geteuid().is_root() {
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
            let nobody = Some(rustix::fs::Uid::from_raw(65534));
            rustix::fs::chown(&shared, nobody, None).unwrap();
            let err = check_private_dir(&dir).unwrap_err();
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
            rustix::fs::chown(&shared, Some(rustix::process::geteuid()), None).unwrap();
            check_private_dir(&dir).unwrap();
            // Through a link another user owns (in a sticky directory they could
            // point it elsewhere): refused, though everything it leads to is fine.
            let link = tmp.path().join("link");
            std::os::unix::fs::symlink(&shared, &link).unwrap();
            std::os::unix::fs::lchown(&link, Some(65534), None).unwrap();
            let err = check_private_dir(&link.join("mine")).unwrap_err();
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
            // And a link of one's own to a directory others may change is judged by
            // where it leads.
            std::os::unix::fs::lchown(&link, Some(rustix::process::geteuid().as_raw()), None)
                .unwrap();
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
            let err = check_private_dir(&link.join("mine")).unwrap_err();
            assert!(err.to_string().contains("not sticky"), "{err}");
        }
    }

    /// Attack 1A: `data/` and `data/.` made the check follow a final link (the kernel
    /// does) while the ancestors were taken from `Path::parent`, which drops them.
    #[test]
    fn a_trailing_slash_or_dot_does_not_follow_a_final_link() {
        let tmp = tempfile::tempdir().unwrap();
        let real = private(&tmp.path().join("real"));
        let me = rustix::process::geteuid().as_raw();
        link(&real, &tmp.path().join("data"), me);
        for form in ["data/", "data/.", "data//", "data/./"] {
            let dir = tmp.path().join(form);
            assert_refused(ensure_private_dir(&dir), "symbolic link");
            assert_refused(check_private_dir(&dir), "symbolic link");
        }
        // The directory itself, however written, is fine.
        for form in ["real/", "real/.", "./real/./"] {
            ensure_private_dir(&tmp.path().join(form)).unwrap();
            check_private_dir(&tmp.path().join(form)).unwrap();
        }
        assert_eq!(
            normalize(&tmp.path().join("data/./")).unwrap(),
            tmp.path().join("data")
        );
        if is_root() {
            // Another user's link in a shared directory, to a directory of root's.
            let share = sticky(&tmp.path().join("share"));
            link(&real, &share.join("data"), NOBODY);
            assert_refused(ensure_private_dir(&share.join("data/")), "symbolic link");
            assert_refused(ensure_private_dir(&share.join("data/./x")), "uid 65534");
            assert!(empty(&real));
            assert_eq!(mode(&real), 0o700);
        }
    }

    /// Attack 1B: in `mine -> theirs -> dir`, only the first link and the ancestors of
    /// where the chain ends were judged.
    #[test]
    fn every_link_in_a_chain_is_judged() {
        let tmp = tempfile::tempdir().unwrap();
        let me = rustix::process::geteuid().as_raw();
        let real = private(&tmp.path().join("real"));
        private(&real.join("data"));
        // The middle link lies in a directory anyone may rename things in.
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        link(&real, &open.join("middle"), me);
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        link(&open.join("middle"), &tmp.path().join("mine"), me);
        assert_refused(
            check_private_dir(&tmp.path().join("mine/data")),
            "not sticky",
        );
        assert_refused(
            ensure_private_dir(&tmp.path().join("mine/new")),
            "not sticky",
        );
        assert!(!real.join("new").exists());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_private_dir(&tmp.path().join("mine/data")).unwrap();
        // Relative links, and `..` after a link, resolve as the kernel resolves them.
        link(Path::new("../real"), &open.join("up"), me);
        check_private_dir(&open.join("up/data")).unwrap();
        check_private_dir(&open.join("up/data/../data")).unwrap();
        // A loop is an error, not a hang.
        link(&open.join("b"), &open.join("a"), me);
        link(&open.join("a"), &open.join("b"), me);
        let err = check_private_dir(&open.join("a/x")).unwrap_err();
        assert!(err.to_string().contains("symbolic links"), "{err}");

        if is_root() {
            // Root's link to another user's link (in a shared directory) to a
            // directory of root's: that user could point theirs elsewhere.
            let share = sticky(&tmp.path().join("share"));
            link(&real, &share.join("theirs"), NOBODY);
            link(&share.join("theirs"), &tmp.path().join("roots"), 0);
            assert_refused(
                check_private_dir(&tmp.path().join("roots/data")),
                "uid 65534",
            );
            assert_refused(
                ensure_private_dir(&tmp.path().join("roots/new")),
                "uid 65534",
            );
            assert!(!real.join("new").exists());
        }
    }

    /// Attack 1C: a link planted where a missing component is to be made, after the
    /// check and before the making, was followed by `create_dir_all`.
    #[test]
    fn nothing_is_made_through_what_appears_during_the_call() {
        let tmp = tempfile::tempdir().unwrap();
        let real = private(&tmp.path().join("real"));
        let share = sticky(&tmp.path().join("share"));
        let owner = if is_root() {
            NOBODY
        } else {
            rustix::process::geteuid().as_raw()
        };
        let (target, planted) = (real.clone(), share.join("race"));
        walk::race::set(move || link(&target, &planted, owner));
        let err = ensure_private_dir(&share.join("race/a/b")).unwrap_err();
        assert!(empty(&real), "made through the link: {:?}", real.join("a"));
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");

        if is_root() {
            // A directory of theirs appearing there instead: nothing is made in it.
            let planted = share.join("race2");
            walk::race::set(move || {
                std::fs::create_dir(&planted).unwrap();
                rustix::fs::chown(&planted, Some(rustix::fs::Uid::from_raw(NOBODY)), None).unwrap();
            });
            assert_refused(ensure_private_dir(&share.join("race2/a")), "uid 65534");
            assert!(empty(&share.join("race2")));
        }
        // Undisturbed, the missing directories are made and judged.
        ensure_private_dir(&share.join("calm/a/b")).unwrap();
        assert_eq!(mode(&share.join("calm/a/b")), 0o700);
    }

    #[test]
    fn defaults_are_outside_shared_temp_directories() {
        let dir = default_dir("sandcell-test");
        assert!(dir.is_absolute());
        assert!(dir.ends_with("sandcell-test") || std::env::var_os("HOME").is_none());
        if rustix::process::geteuid().is_root() {
            assert_eq!(dir, Path::new("/var/lib/sandcell-test"));
        }
    }
}
