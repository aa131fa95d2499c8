//! Kernel-interface cases: what a command can ask of the kernel that would reach beyond
//! its sandbox, terminal injection (ADVERSARIAL 43) and the kernel's keyrings
//! (ADVERSARIAL 37), tried by one probe program every backend can run.

use std::sync::OnceLock;

use super::{p, shell_is_refused, spec, with_sandbox};
use crate::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxId};

/// The probe: `probe terminal` tries `TIOCSTI` and `TIOCLINUX` on stdin, stdout,
/// stderr and `/dev/tty`; `probe keyrings` tries to add keys to, join and look up the
/// session and user keyrings. One line per attempt: `<what> <on> refused <errno>` or
/// `<what> <on> SUCCEEDED`, then `done`. Raw system calls only, so it needs no library
/// at run time (the Docker tests' busybox images have neither a compiler nor Python).
const PROBE: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static void report(const char *what, const char *on, long r) {
    if (r < 0) printf("%s %s refused %d\n", what, on, errno);
    else printf("%s %s SUCCEEDED\n", what, on);
}

static void inject(int fd, const char *on) {
    char typed = '#';
    report("TIOCSTI", on, ioctl(fd, TIOCSTI, &typed));
    char paste = 3; /* TIOCL_PASTESEL: type the console's selection */
    report("TIOCLINUX", on, ioctl(fd, TIOCLINUX, &paste));
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "terminal") == 0) {
        inject(0, "stdin");
        inject(1, "stdout");
        inject(2, "stderr");
        int tty = open("/dev/tty", O_RDWR | O_NOCTTY);
        if (tty < 0) {
            report("TIOCSTI", "/dev/tty", -1);
            report("TIOCLINUX", "/dev/tty", -1);
        } else {
            inject(tty, "/dev/tty");
        }
    } else if (argc == 2 && strcmp(argv[1], "keyrings") == 0) {
        const long session = -3, user = -4; /* KEY_SPEC_SESSION_KEYRING, _USER_ */
        report("add_key", "session", syscall(SYS_add_key, "user", "sandcell-adversarial",
                                             "secret", 6, session));
        report("add_key", "user", syscall(SYS_add_key, "user", "sandcell-adversarial",
                                          "secret", 6, user));
        report("request_key", "user", syscall(SYS_request_key, "user",
                                              "sandcell-adversarial", NULL, 0));
        report("KEYCTL_GET_KEYRING_ID", "session", syscall(SYS_keyctl, 0, session, 0));
        report("KEYCTL_GET_KEYRING_ID", "user", syscall(SYS_keyctl, 0, user, 0));
        report("KEYCTL_JOIN_SESSION_KEYRING", "new", syscall(SYS_keyctl, 1, NULL));
    } else {
        return 2;
    }
    printf("done\n");
    return 0;
}
"#;

/// The probe, built once per test process with the host's C compiler, statically.
fn probe() -> &'static [u8] {
    static BUILT: OnceLock<Vec<u8>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "sandcell-kernel-probe-{}",
            crate::SandboxId::generate("b")
        ));
        std::fs::create_dir(&dir).unwrap();
        let (source, out) = (dir.join("probe.c"), dir.join("probe"));
        std::fs::write(&source, PROBE).unwrap();
        let status = std::process::Command::new("cc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(&out)
            .arg(&source)
            .status();
        let built = std::fs::read(&out);
        let _ = std::fs::remove_dir_all(&dir);
        let status = status
            .expect("ADVERSARIAL 37 and 43 build their probe with the host's C compiler (cc)");
        assert!(
            status.success(),
            "cc could not link the probe statically (libc6-dev has the static C library)"
        );
        built.unwrap()
    })
}

/// Runs the probe in sandbox `id` with `mode`, answering the attempts it reported.
async fn run_probe(b: &dyn SandboxBackend, id: &SandboxId, mode: &str) -> Vec<String> {
    b.write(id, &p(".sandcell-probe"), probe().to_vec().into())
        .await
        .unwrap();
    let chmod = b
        .run(id, ExecRequest::new(["chmod", "755", ".sandcell-probe"]))
        .await
        .unwrap();
    assert!(chmod.success(), "{chmod:?}");
    let out = b
        .run(id, ExecRequest::new(["./.sandcell-probe", mode]))
        .await
        .unwrap();
    assert!(
        out.success() && out.stdout_str().ends_with("done\n"),
        "the probe did not finish: {out:?}"
    );
    out.stdout_str()
        .lines()
        .filter(|line| *line != "done")
        .map(str::to_owned)
        .collect()
}

/// ADVERSARIAL 43: a command has no terminal to type into. `TIOCSTI` and `TIOCLINUX`
/// fail on its stdin, stdout and stderr and on `/dev/tty` (which a command without a
/// controlling terminal cannot open); one that succeeded would have typed into
/// whatever terminal the command was given, the caller's included.
///
/// The local backend's own tests hold a real terminal as the caller and check that
/// nothing arrives in it; this case checks what every backend's command is refused.
pub async fn terminal_injection_is_refused(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "terminal_injection_is_refused").await;
    }
    with_sandbox(b, spec(), |id| async move {
        let attempts = run_probe(b, &id, "terminal").await;
        assert_eq!(attempts.len(), 8, "{attempts:?}");
        for attempt in &attempts {
            assert!(
                attempt.contains(" refused "),
                "ADVERSARIAL 43: a command could inject terminal input: {attempt} ({attempts:?})"
            );
        }
    })
    .await;
}

/// ADVERSARIAL 37: a command cannot use the kernel's keyrings, which the kernel keeps
/// per uid and shares with every process of that uid (the host's, other sandboxes'):
/// adding a key to its session or user keyring, looking one up, even naming those
/// keyrings or joining a new session keyring is refused.
///
/// Backends whose commands are not isolated from the host (no network isolation
/// claimed, the local backend's `Isolation::None`) have no boundary to check.
pub async fn kernel_keyrings_are_refused(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "kernel_keyrings_are_refused").await;
    }
    if !b.capabilities().network_isolation {
        return;
    }
    with_sandbox(b, spec(), |id| async move {
        let attempts = run_probe(b, &id, "keyrings").await;
        assert_eq!(attempts.len(), 6, "{attempts:?}");
        for attempt in &attempts {
            assert!(
                attempt.contains(" refused "),
                "ADVERSARIAL 37: a command used a kernel keyring: {attempt} ({attempts:?})"
            );
        }
    })
    .await;
}
