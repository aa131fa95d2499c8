//! Files that hold a server's secrets (its tenants' tokens, its TLS private key), read
//! only when no other user may read them.
//!
//! A sandbox sees the host's system directories read-only (`/etc` among them) as an
//! unprivileged user of its own, so a secret kept there (where operators keep
//! configuration) with the usual `0644` is readable by every sandbox, and a tenant
//! that reads the tenants file has every tenant's token (ADVERSARIAL 33, 37). So such a
//! file is refused unless its mode denies other users; the file is checked through
//! the descriptor it is read from, so what is read is what was checked.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{Error, Result};

/// Reads the secret file `path` (`what` names it in errors, such as `--tenants`):
/// `PermissionDenied` when other users may read it, naming the `chmod` that fixes it;
/// `InvalidInput` when it cannot be read.
///
/// ```
/// use std::os::unix::fs::PermissionsExt;
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("tenants.yaml");
/// std::fs::write(&path, "secret")?;
/// std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
/// let err = sandcell::raw::secret_file::read(&path, "--tenants").unwrap_err();
/// assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied);
/// std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
/// assert_eq!(sandcell::raw::secret_file::read(&path, "--tenants")?, b"secret");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    let unreadable = |e: std::io::Error| {
        Error::invalid_input(format!("{what} {}: cannot be read ({e})", path.display()))
    };
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let mode = file.metadata().map_err(unreadable)?.mode() & 0o7777;
    if mode & 0o004 != 0 {
        return Err(Error::permission_denied(format!(
            "{what} {}: refusing a secret file every user may read (mode {mode:04o}): a \
             sandbox sees the host's system directories as another user; run `chmod o-r` \
             on it (0600 or 0640)",
            path.display()
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(unreadable)?;
    Ok(bytes)
}
