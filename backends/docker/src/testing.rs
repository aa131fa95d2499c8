//! Helpers for tests and examples on machines without a registry (feature `testing`):
//! an image built from this host's static busybox.

use std::path::{Path, PathBuf};

use sandcell::{Error, Result};

/// Where a statically linked busybox usually is (Debian's `busybox-static`).
const BUSYBOX: [&str; 2] = ["/bin/busybox", "/usr/bin/busybox"];

/// The host's busybox binary, if there is one.
pub fn host_busybox() -> Option<PathBuf> {
    BUSYBOX.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Writes a root file system into `dir`: busybox and a link per applet in `/bin`, a
/// `sandbox` user (uid and gid 1000) beside root, a world-writable `/tmp`. Import it
/// with [`ImageSpec::import`](crate::ImageSpec::import). The busybox must be statically
/// linked (`apt-get install busybox-static`), as the image has no libc.
pub fn busybox_rootfs(busybox: &Path, dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &str, e| {
        Error::io(
            format_args!("writing the busybox root file system ({what})"),
            e,
        )
    };
    for d in ["bin", "etc", "tmp", "home/sandbox"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| io(d, e))?;
    }
    std::fs::copy(busybox, dir.join("bin/busybox")).map_err(|e| io("bin/busybox", e))?;
    let applets = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|e| io("busybox --list", e))?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
            let link = dir.join("bin").join(applet);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link).map_err(|e| io(applet, e))?;
            }
        }
    }
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n",
    )
    .map_err(|e| io("etc/passwd", e))?;
    std::fs::write(dir.join("etc/group"), "root:x:0:\nsandbox:x:1000:\n")
        .map_err(|e| io("etc/group", e))?;
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| io("tmp", e))?;
    std::fs::set_permissions(
        dir.join("home/sandbox"),
        std::fs::Permissions::from_mode(0o777),
    )
    .map_err(|e| io("home/sandbox", e))?;
    Ok(())
}
