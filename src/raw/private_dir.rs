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

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

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
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    // Nothing is made beneath a directory that is refused.
    check_ancestors(dir, &|problem| {
        Error::permission_denied(format!(
            "refusing to use {}: {problem}; choose another directory",
            dir.display()
        ))
    })?;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        // A symlink to a directory makes `create` succeed too; the check below refuses it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(format_args!("creating {}", dir.display()), e)),
    }
    check_private_dir(dir)
}

/// The check of [`ensure_private_dir`], without creating anything.
pub fn check_private_dir(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| Error::io(format_args!("inspecting {}", dir.display()), e))?;
    let refuse = |problem: String| {
        Err(Error::permission_denied(format!(
            "refusing to use {}: {problem}; remove it or choose another directory",
            dir.display()
        )))
    };
    if meta.file_type().is_symlink() {
        return refuse("it is a symbolic link".to_owned());
    }
    if !meta.is_dir() {
        return refuse("it is not a directory".to_owned());
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return refuse(format!(
            "it is owned by uid {}, not by this process's uid {me}",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(format!(
            "it is writable by its group or by other users (mode {mode:04o})"
        ));
    }
    check_ancestors(dir, &|problem| {
        Error::permission_denied(format!(
            "refusing to use {}: {problem}; remove it or choose another directory",
            dir.display()
        ))
    })
}

/// Above `dir`, a directory another user owns or may rename things in (unless it is
/// sticky, as `/tmp` is), or a symbolic link another user owns, lets them move it away
/// and put theirs in its place. Each component is judged as it is (a link by its own
/// owner) and then wherever it leads. Those that do not exist yet are skipped.
fn check_ancestors(dir: &Path, refuse: &dyn Fn(String) -> Error) -> Result<()> {
    let absolute = match dir.is_absolute() {
        true => dir.to_path_buf(),
        false => std::env::current_dir()
            .map_err(|e| Error::io("finding the current directory", e))?
            .join(dir),
    };
    for ancestor in absolute.ancestors().skip(1) {
        let meta = match std::fs::symlink_metadata(ancestor) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(Error::io(
                    format_args!("inspecting {}", ancestor.display()),
                    e,
                ))
            }
        };
        judge(ancestor, &meta, refuse)?;
        if meta.file_type().is_symlink() {
            // Where it leads, and everything above that, by the same rules.
            let target = std::fs::canonicalize(ancestor)
                .map_err(|e| Error::io(format_args!("following {}", ancestor.display()), e))?;
            for real in target.ancestors() {
                let meta = std::fs::symlink_metadata(real)
                    .map_err(|e| Error::io(format_args!("inspecting {}", real.display()), e))?;
                judge(real, &meta, refuse)?;
            }
        }
    }
    Ok(())
}

/// Refuses `path` above a private directory unless root or this user owns it and,
/// for a directory, nobody else may write it (or it is sticky).
fn judge(path: &Path, meta: &std::fs::Metadata, refuse: &dyn Fn(String) -> Error) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(refuse(format!(
            "{} above it is owned by uid {}, who could replace it",
            path.display(),
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if meta.is_dir() && mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(refuse(format!(
            "{} above it is writable by its group or by other users and not sticky \
             (mode {mode:04o}), so they could replace it",
            path.display()
        )));
    }
    Ok(())
}

/// Creates `dir` and its missing parents `0700` (existing ones are left as they are).
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
