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

/// Copies the host's `program` into `rootfs/bin`, and every library `ldd` names for it
/// at its own path, so a dynamically linked tool (such as `curl`) runs in an image built
/// from `rootfs`.
pub fn copy_host_program(program: &Path, rootfs: &Path) -> Result<()> {
    let io = |what: &Path, e| {
        Error::io(
            format_args!("copying {} into the root file system", what.display()),
            e,
        )
    };
    let ldd = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .map_err(|e| io(program, e))?;
    let mut libraries = Vec::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // `libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)`, or the loader's
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        if let Some(path) = line
            .split("=>")
            .last()
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|p| p.starts_with('/'))
        {
            libraries.push(PathBuf::from(path));
        }
    }
    for library in libraries {
        let target = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(&library, e))?;
        }
        // The file itself, under the name it is linked by.
        std::fs::copy(&library, &target).map_err(|e| io(&library, e))?;
    }
    let name = program.file_name().unwrap_or(program.as_os_str());
    std::fs::create_dir_all(rootfs.join("bin")).map_err(|e| io(program, e))?;
    std::fs::copy(program, rootfs.join("bin").join(name)).map_err(|e| io(program, e))?;
    Ok(())
}
