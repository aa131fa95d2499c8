//! The seccomp filters for what a Landlock sandbox's uid would otherwise share with
//! other processes of that uid and Landlock does not mediate: System V IPC, and
//! `clone3(CLONE_INTO_CGROUP)` into a cgroup that uid may write.
//!
//! A root backend gives each command an IPC namespace of its own (`ChildSetup::
//! ipc_namespace`); an unprivileged backend cannot, and its sandboxes are the user's
//! own uid in the host's IPC namespace, where any of them could attach, read and
//! remove the segments, queues and semaphores of the others and of the user's own
//! programs (their ids are listed in `/proc/sysvipc`). There System V IPC is refused,
//! as is unlinking a POSIX message queue (opening one is refused by Landlock already).
//!
//! `clone3` names the cgroup a child starts in by a descriptor, which an `O_PATH` open
//! (not mediated by Landlock) gives, and the kernel checks only that the uid may write
//! the cgroup: in a delegated cgroup tree an unprivileged backend's user owns, a
//! command could start its children in a neighbour's cgroup, or above its own, out of
//! its limits. `clone3` answers `ENOSYS`, and C libraries fall back to `clone`, which
//! cannot name a cgroup.

use super::{jump, stmt, x32, AUDIT_ARCH_NATIVE, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO};

/// The System V IPC calls and `mq_unlink`, native and x32 (x86_64) or native only.
const SYSV_NATIVE: [u32; 24] = {
    let calls = [
        libc::SYS_shmget,
        libc::SYS_shmat,
        libc::SYS_shmctl,
        libc::SYS_semget,
        libc::SYS_semop,
        libc::SYS_semctl,
        libc::SYS_semtimedop,
        libc::SYS_msgget,
        libc::SYS_msgsnd,
        libc::SYS_msgrcv,
        libc::SYS_msgctl,
        libc::SYS_mq_unlink,
    ];
    let mut all = [u32::MAX; 24];
    let mut i = 0;
    while i < 12 {
        all[2 * i] = calls[i] as u32;
        all[2 * i + 1] = x32(calls[i] as u32);
        i += 1;
    }
    all
};
/// The same in the 32-bit compat ABI: i386's `ipc` multiplexer and its direct calls.
#[cfg(target_arch = "x86_64")]
const SYSV_COMPAT: [u32; 13] = [
    117, 393, 394, 395, 396, 397, 399, 400, 401, 402, 420, 278, 117,
];
/// arm's direct calls.
#[cfg(target_arch = "aarch64")]
const SYSV_COMPAT: [u32; 13] = [
    298, 299, 300, 301, 302, 303, 304, 305, 307, 308, 312, 275, 420,
];

/// Refuses (`EPERM`) System V IPC and `mq_unlink` in every ABI.
pub(crate) static NO_SYSV_IPC: [libc::sock_filter; 7 + 24 + 13] =
    refuse(&SYSV_NATIVE, &SYSV_COMPAT, libc::EPERM as u32);

/// Answers `clone3` with `ENOSYS` in every ABI (it is 435 in each).
pub(crate) static NO_CLONE3: [libc::sock_filter; 7 + 2 + 1] = refuse(
    &[libc::SYS_clone3 as u32, x32(libc::SYS_clone3 as u32)],
    &[435],
    libc::ENOSYS as u32,
);

/// A filter that answers `errno` to the calls `native` (in the native ABI, x32's
/// included) and `compat` (in the 32-bit one), and allows everything else.
const fn refuse<const L: usize>(
    native: &[u32],
    compat: &[u32],
    errno: u32,
) -> [libc::sock_filter; L] {
    const LD_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    let (n, m) = (native.len(), compat.len());
    assert!(L == 7 + n + m, "the filter's length");
    let compat_at = 4 + n;
    let refuse_at = L - 1;
    let mut p = [stmt(RET, SECCOMP_RET_ALLOW); L];
    p[0] = stmt(LD_ABS, 4);
    p[1] = jump(JEQ, AUDIT_ARCH_NATIVE, 0, (compat_at - 2) as u8);
    p[2] = stmt(LD_ABS, 0);
    let mut i = 0;
    while i < n {
        let at = 3 + i;
        p[at] = jump(JEQ, native[i], (refuse_at - at - 1) as u8, 0);
        i += 1;
    }
    // `3 + n` stays an `ALLOW` return.
    p[compat_at] = stmt(LD_ABS, 0);
    let mut j = 0;
    while j < m {
        let at = compat_at + 1 + j;
        p[at] = jump(JEQ, compat[j], (refuse_at - at - 1) as u8, 0);
        j += 1;
    }
    // `compat_at + 1 + m` stays an `ALLOW` return.
    p[refuse_at] = stmt(RET, SECCOMP_RET_ERRNO | errno);
    p
}

#[cfg(test)]
mod tests {
    fn verdict(program: &[libc::sock_filter], arch: u32, nr: u32) -> u32 {
        crate::seccomp::verdict(program, arch, nr, [0, 0])
    }

    #[test]
    fn the_calls_are_refused_in_every_abi_and_nothing_else() {
        let native = super::AUDIT_ARCH_NATIVE;
        let compat = 0x4000_0003; // AUDIT_ARCH_I386 (arm's differs; any other arch is compat)
        let allow = super::SECCOMP_RET_ALLOW;
        let eperm = super::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let enosys = super::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        let ipc = &super::NO_SYSV_IPC[..];
        for nr in super::SYSV_NATIVE.iter().filter(|nr| **nr != u32::MAX) {
            assert_eq!(verdict(ipc, native, *nr), eperm, "{nr}");
        }
        for nr in super::SYSV_COMPAT {
            assert_eq!(verdict(ipc, compat, nr), eperm, "compat {nr}");
        }
        for nr in [libc::SYS_read, libc::SYS_shmdt, libc::SYS_clone3] {
            assert_eq!(verdict(ipc, native, nr as u32), allow, "{nr}");
        }
        let clone3 = &super::NO_CLONE3[..];
        assert_eq!(verdict(clone3, native, libc::SYS_clone3 as u32), enosys);
        assert_eq!(verdict(clone3, compat, 435), enosys);
        assert_eq!(verdict(clone3, native, libc::SYS_clone as u32), allow);
        assert_eq!(verdict(clone3, native, libc::SYS_shmget as u32), allow);
    }
}
