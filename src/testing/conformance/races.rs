//! Walk races (ADVERSARIAL 42): a sandbox process swapping its files for links to host
//! paths while the host snapshots and imports its workspace, on every backend.
//!
//! The racer is a static C program built with the host's `cc`, so it runs in any
//! sandbox (a busybox image has no python) and swaps with `renameat2(RENAME_EXCHANGE)`,
//! atomically and without a fork per swap.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use futures::StreamExt;

use super::{p, shell_is_refused, spec, stream, with_sandbox};
use crate::archive::ImportOptions;
use crate::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxId};

/// As long as the files the racer swaps with it ("ordinary"), so a packer that follows
/// a swapped-in link reads as many bytes as the entry's header declared.
const SECRET: &str = "Zq9-SeKr";

/// `racer files SECRET`: exchanges files `f0`..`f19` with links `l0`..`l19` to
/// `SECRET`, and directory `d` with link `dl` to its directory, forever.
/// `racer staging OUTSIDE`: swaps the directories an import stages in the workspace
/// (`.sandcell-*/sub0`..`sub3`) for links to `OUTSIDE`, forever. Each writes a marker
/// file once it runs.
const RACER: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
static void put(const char *path, const char *text) {
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd >= 0) { if (write(fd, text, strlen(text)) < 0) {} close(fd); }
}
static void exchange(const char *a, const char *b) {
    syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */);
}
static void files(const char *secret) {
    char a[32], b[32], dir[4096];
    for (int i = 0; i < 20; i++) {
        snprintf(a, sizeof a, "f%d", i); put(a, "ordinary");
        snprintf(b, sizeof b, "l%d", i); if (symlink(secret, b) < 0) {}
    }
    mkdir("d", 0755); put("d/inner", "ordinary");
    snprintf(dir, sizeof dir, "%s", secret);
    if (symlink(dirname(dir), "dl") < 0) {}
    put("swapping-files", "");
    /* Quiet for 20 ms after every 2,000 rounds of swaps (some 80 ms): a backend whose
       snapshot is a tar made inside the sandbox fails every one taken mid-swap, and
       the case needs some to succeed, or it checks nothing. */
    for (unsigned long n = 1;; n++) {
        if (n % 2000 == 0) usleep(20000);
        for (int i = 0; i < 20; i++) {
            snprintf(a, sizeof a, "f%d", i); snprintf(b, sizeof b, "l%d", i);
            exchange(a, b);
        }
        exchange("d", "dl");
    }
}
static void staging(const char *outside) {
    char sub[512], moved[600];
    long n = 0;
    put("swapping-staging", "");
    for (;;) {
        DIR *top = opendir(".");
        if (!top) continue;
        struct dirent *e;
        while ((e = readdir(top))) {
            if (strncmp(e->d_name, ".sandcell-", 10) != 0 || strlen(e->d_name) > 400) continue;
            for (int k = 0; k < 4; k++) {
                snprintf(sub, sizeof sub, "%s/sub%d", e->d_name, k);
                snprintf(moved, sizeof moved, "%s/moved%ld", e->d_name, n);
                if (rename(sub, moved) == 0) { n++; if (symlink(outside, sub) < 0) {} }
            }
        }
        closedir(top);
    }
}
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    if (strcmp(argv[1], "files") == 0) files(argv[2]);
    if (strcmp(argv[1], "staging") == 0) staging(argv[2]);
    return 2;
}
"#;

/// Rounds of snapshots, and of imports, against a running racer: a host that follows
/// one swapped link in a hundred still fails.
const SNAPSHOT_ROUNDS: usize = 100;
const IMPORT_ROUNDS: usize = 30;
const USAGE_ROUNDS: usize = 20;

/// The apparent size of a host file beside the secret; a workspace's disk usage never
/// comes near it.
const HOST_BYTES: u64 = 1 << 40;

/// The host side: a root-only secret the racer's links name, and a directory anyone
/// could write that only the walks' own care keeps empty; removed on drop.
struct HostFiles {
    dir: tempfile::TempDir,
}

impl HostFiles {
    fn new() -> HostFiles {
        let dir = tempfile::Builder::new()
            .prefix("sandcell-adversarial-42-")
            .tempdir()
            .unwrap();
        let mode = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        mode(dir.path(), 0o755);
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        mode(&dir.path().join("secret"), 0o600);
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        mode(&dir.path().join("outside"), 0o777);
        // Sparse: it costs no disk, but a disk-usage walk that followed the racer's
        // link to this directory would count it.
        let big = std::fs::File::create(dir.path().join("big")).unwrap();
        big.set_len(HOST_BYTES).unwrap();
        HostFiles { dir }
    }

    fn secret(&self) -> PathBuf {
        self.dir.path().join("secret")
    }

    fn big(&self) -> PathBuf {
        self.dir.path().join("big")
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    fn written_outside(&self) -> usize {
        std::fs::read_dir(self.outside()).unwrap().count()
    }
}

/// Builds [`RACER`] statically with the host's C compiler.
fn compile_racer() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("racer.c");
    let out = dir.path().join("racer");
    std::fs::write(&source, RACER).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .expect("ADVERSARIAL 42 builds its racer with the host's C compiler (cc)");
    assert!(status.success(), "cc could not build the racer statically");
    std::fs::read(&out).unwrap()
}

/// Starts the racer in `mode` and waits for its marker; the process is the caller's to
/// kill (destroying the sandbox ends it too).
async fn start_racer(
    b: &dyn SandboxBackend,
    id: &SandboxId,
    mode: &str,
    target: &Path,
) -> crate::Process {
    let script = format!(
        "chmod 755 adv42/racer && exec adv42/racer {mode} '{}'",
        target.display()
    );
    let racer = b
        .exec(id, ExecRequest::new(["sh", "-c", &script]))
        .await
        .unwrap();
    let marker = p(&format!("swapping-{mode}"));
    for _ in 0..1000 {
        if b.stat(id, &marker).await.is_ok() {
            return racer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("ADVERSARIAL 42: the racer ({mode}) did not start");
}

async fn collect(tar: crate::ByteStream) -> Vec<u8> {
    let mut tar = tar;
    let mut out = Vec::new();
    while let Some(Ok(chunk)) = tar.next().await {
        out.extend_from_slice(&chunk);
    }
    out
}

/// An archive of four directories of 25 files, which the staging racer targets.
fn archive() -> bytes::Bytes {
    let mut builder = tar::Builder::new(Vec::new());
    for d in 0..4 {
        for f in 0..25 {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(4);
            builder
                .append_data(&mut h, format!("sub{d}/f{f}"), &b"data"[..])
                .unwrap();
        }
    }
    builder.into_inner().unwrap().into()
}

/// ADVERSARIAL 42: while a sandbox process swaps its files and directories for links
/// to a root-only host file and its directory, no snapshot of the workspace (full, and
/// incremental where claimed) holds that file's content, and no disk-usage reading
/// (where metrics are claimed) counts the host directory's files; while it swaps the directories
/// an import stages for links to a host directory, no import writes there. Hundreds of
/// rounds; a snapshot or import may fail, but must not reach the host.
///
/// Backends whose commands are not isolated from the host (no network isolation
/// claimed) have no boundary to check.
pub async fn walks_never_follow_a_racing_sandbox_out(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "walks_never_follow_a_racing_sandbox_out").await;
    }
    if !b.capabilities().network_isolation {
        return;
    }
    let host = HostFiles::new();
    let racer = compile_racer();
    let incremental = b.capabilities().incremental_snapshot;
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("adv42/racer"), racer.into()).await.unwrap();
        let mut files = start_racer(b, &id, "files", &host.secret()).await;
        let mut snapshots = 0;
        for round in 0..SNAPSHOT_ROUNDS {
            let taken = if incremental && round % 2 == 0 {
                b.export_changes(&id).await.map(|changes| changes.tar)
            } else {
                b.export_tar(&id, &crate::SandboxPath::root()).await
            };
            let Ok(tar) = taken else { continue };
            snapshots += 1;
            let tar = collect(tar).await;
            assert!(
                !String::from_utf8_lossy(&tar).contains(SECRET),
                "ADVERSARIAL 42: round {round}: a snapshot read the host's root-only file"
            );
        }
        assert!(snapshots > 0, "ADVERSARIAL 42: no snapshot succeeded");
        let _ = files.kill().await;

        if b.capabilities().metrics {
            // The same swaps, with links to the big host file this time.
            let cleared = b.run_shell(&id, "rm -rf d dl l* swapping-files").await;
            assert!(cleared.is_ok_and(|out| out.success()));
            let mut files = start_racer(b, &id, "files", &host.big()).await;
            for round in 0..USAGE_ROUNDS {
                let used = b.metrics(&id).await.ok().and_then(|m| m.disk_bytes);
                assert!(
                    used.unwrap_or(0) < HOST_BYTES,
                    "ADVERSARIAL 42: round {round}: the disk-usage walk followed a link out \
                     ({used:?} bytes)"
                );
            }
            let _ = files.kill().await;
        }

        let mut staging = start_racer(b, &id, "staging", &host.outside()).await;
        let archive = archive();
        for round in 0..IMPORT_ROUNDS {
            let options = if round % 2 == 0 {
                ImportOptions::merge()
            } else {
                ImportOptions::replace()
            };
            let _ = b
                .import_tar(&id, &p("imported"), stream(archive.clone()), options)
                .await;
            assert_eq!(
                host.written_outside(),
                0,
                "ADVERSARIAL 42: round {round}: an import wrote into a host directory"
            );
        }
        let _ = staging.kill().await;
    })
    .await;
}
