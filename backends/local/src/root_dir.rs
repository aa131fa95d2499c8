//! Who may pass through a root backend's directory at `Isolation::Landlock`: the
//! sandbox owner (`crate::owner`), on its way to its workspace and temp directory, and
//! no other user.
//!
//! At `Landlock` a command reaches its workspace and temp directory by host path
//! (`<root>/sandboxes/<id>/workspace`, `HOME` and `TMPDIR` name them), as the owner's
//! uid. So the root and `sandboxes/` are `0710` with the owner's group: the owner may
//! pass through them but not list them, so no sandbox finds another's id there; other
//! local users pass nowhere, as with a root of `0700`. What the owner never needs, the
//! frozen layers and the default template (which only root reads, through views and
//! copies), stays `0700`. All sandboxes share the owner, so this keeps other users
//! out, not other sandboxes: each sandbox's directory is `0710` with a group of that
//! sandbox's own (`crate::sandbox_group`), and its Landlock ruleset grants it its own
//! directories only.
//!
//! The directories above the root are the operator's: checked, never changed. At
//! `Namespaces` commands need none of this (the workspace is mounted into the
//! sandbox's namespaces, and the host's paths are not there to pass), but the
//! backend's own file work runs as the owner too (imports, exports, copies), by host
//! path: the root is opened the same way, or every restore of a snapshot into a
//! `0700` root failed.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use sandcell::{Error, Result};

use crate::owner::SandboxOwner;

/// The mode of the directories the owner passes through: search for the owner's
/// group, nothing for other users.
pub(crate) const PASSAGE: u32 = 0o710;

/// Opens the canonical `root` (already checked private) to `owner` as the module says,
/// then checks, as the owner, that it can reach `<root>/sandboxes`; fails with
/// `PermissionDenied` naming the directory in the way where it cannot.
pub(crate) fn open_to_owner(root: &Path, owner: &SandboxOwner) -> Result<()> {
    let sandboxes = root.join("sandboxes");
    for dir in [root, sandboxes.as_path()] {
        pass_through(dir, owner.gid)?;
    }
    for private in ["layers", "templates"] {
        let dir = root.join(private);
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() && meta.mode() & 0o077 != 0 => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| Error::io(format_args!("making {} private", dir.display()), e))?
            }
            _ => {}
        }
    }
    check_reachable(&sandboxes, owner)
}

/// Gives `dir`'s group to `gid` and makes it [`PASSAGE`].
fn pass_through(dir: &Path, gid: u32) -> Result<()> {
    let failed = |e| {
        Error::io(
            format_args!("opening {} to the sandbox owner", dir.display()),
            e,
        )
    };
    std::os::unix::fs::lchown(dir, None, Some(gid)).map_err(failed)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PASSAGE)).map_err(failed)
}

/// Checks that a process of the owner's (its uid and gid, no supplementary groups, as
/// a command runs) can enter `dir`: a short-lived `true` started there as the owner,
/// so the kernel answers, ACLs and all.
fn check_reachable(dir: &Path, owner: &SandboxOwner) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let program = crate::namespace::find("true").ok_or_else(|| {
        Error::unsupported("running sandboxes as an unprivileged owner needs `true`")
    })?;
    // The standard library changes the ids (dropping supplementary groups, as root)
    // before it changes directory, so the directory is entered as the owner.
    let entered = std::process::Command::new(&program)
        .env_clear()
        .current_dir(dir)
        .uid(owner.uid)
        .gid(owner.gid)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match entered {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let blocking = first_closed(dir, owner).unwrap_or(dir);
            Err(Error::permission_denied(format!(
                "a root backend at Isolation::Landlock runs its sandboxes' commands as uid \
                 {uid}, which cannot reach the backend's root {root}: it may not pass \
                 through {blocking}; let it (chmod o+x, or an ACL granting uid {uid} \
                 search), choose a root it can reach (the default is \
                 /var/lib/sandcell-local), or use Isolation::Namespaces",
                uid = owner.uid,
                root = dir.parent().unwrap_or(dir).display(),
                blocking = blocking.display(),
            )))
        }
        Err(e) => Err(Error::io(
            format_args!(
                "checking that uid {} can reach {}",
                owner.uid,
                dir.display()
            ),
            e,
        )),
    }
}

/// The outermost directory on the way to `dir` (itself included) whose mode bits deny
/// the owner search permission, for the error message; none where only an ACL does.
fn first_closed<'a>(dir: &'a Path, owner: &SandboxOwner) -> Option<&'a Path> {
    let mut ancestors: Vec<&Path> = dir.ancestors().collect();
    ancestors.reverse();
    ancestors.into_iter().find(|path| {
        std::fs::metadata(path).is_ok_and(|meta| {
            let bit = if meta.uid() == owner.uid {
                0o100
            } else if meta.gid() == owner.gid {
                0o010
            } else {
                0o001
            };
            meta.mode() & bit == 0
        })
    })
}
