//! The seccomp filter that keeps a Landlock sandbox's commands off the scheduling and
//! resource limits of processes that are not their own.
//!
//! Outside namespaces a command shares its uid with other sandboxes' processes (every
//! sandbox of a root backend is the one owner; an unprivileged backend's are all its
//! user, and so are that user's other processes on the host). Landlock scopes signals
//! and ptrace, but not the calls whose permission check is the uid alone: with them a
//! sandbox could renice a neighbour's processes, pin them to one CPU, or set their CPU
//! time limit to 0, which kills a busy process whatever the signal scoping says. So a
//! command may make them on itself (`0`) only, never for a whole user.

use super::{jump, stmt, x32, AUDIT_ARCH_NATIVE, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO};

/// How a call names the process it changes.
#[derive(Clone, Copy)]
enum Names {
    /// Its first argument is a pid; 0 is the caller.
    Pid,
    /// `sched_setscheduler`: a pid as its first argument, as `Pid`, unless its second
    /// sets the normal policy (`SCHED_OTHER`, priority 0), which any process may set:
    /// threads set it on themselves by their thread id (glibc's
    /// `pthread_setschedparam`, which ZeroMQ calls on each thread it starts, and
    /// aborts when refused), and on another process it can only undo a special policy.
    PidOrNormalPolicy,
    /// Its first argument says what the second names (`which`, `who`); `who` 0 is the
    /// caller, and this `which` is every process of a user.
    Which(u32),
}

/// The normal scheduling policy (sched(7)).
const SCHED_OTHER: u32 = 0;
/// `PRIO_USER` (setpriority(2)).
const PRIO_USER: u32 = 2;
/// `IOPRIO_WHO_USER` (ioprio_set(2)).
const IOPRIO_WHO_USER: u32 = 3;

/// The calls: native number, 32-bit compat number (i386 on x86_64, arm on aarch64),
/// how they name their target.
#[cfg(target_arch = "x86_64")]
const CALLS: [(u32, u32, Names); 7] = [
    (libc::SYS_prlimit64 as u32, 340, Names::Pid),
    (libc::SYS_sched_setaffinity as u32, 241, Names::Pid),
    (
        libc::SYS_sched_setscheduler as u32,
        156,
        Names::PidOrNormalPolicy,
    ),
    (libc::SYS_sched_setparam as u32, 154, Names::Pid),
    (libc::SYS_sched_setattr as u32, 351, Names::Pid),
    (libc::SYS_setpriority as u32, 97, Names::Which(PRIO_USER)),
    (
        libc::SYS_ioprio_set as u32,
        289,
        Names::Which(IOPRIO_WHO_USER),
    ),
];
#[cfg(target_arch = "aarch64")]
const CALLS: [(u32, u32, Names); 7] = [
    (libc::SYS_prlimit64 as u32, 369, Names::Pid),
    (libc::SYS_sched_setaffinity as u32, 241, Names::Pid),
    (
        libc::SYS_sched_setscheduler as u32,
        156,
        Names::PidOrNormalPolicy,
    ),
    (libc::SYS_sched_setparam as u32, 154, Names::Pid),
    (libc::SYS_sched_setattr as u32, 380, Names::Pid),
    (libc::SYS_setpriority as u32, 97, Names::Which(PRIO_USER)),
    (
        libc::SYS_ioprio_set as u32,
        314,
        Names::Which(IOPRIO_WHO_USER),
    ),
];

const N: usize = CALLS.len();
/// Where the parts of the program start.
const NATIVE: usize = 2;
const COMPAT: usize = NATIVE + 1 + 2 * N + 1;
/// Jumps only go forward: the policy check falls through to the pid check.
const CHECK_POLICY: usize = COMPAT + 1 + N + 1;
const CHECK_PID: usize = CHECK_POLICY + 2;
/// Two checks of `which`/`who` calls, one per user `which`.
const CHECK_PRIO: usize = CHECK_PID + 2;
const CHECK_IOPRIO: usize = CHECK_PRIO + 4;
const ALLOW: usize = CHECK_IOPRIO + 4;
const REFUSE: usize = ALLOW + 1;
const LEN: usize = REFUSE + 1;

/// Refuses (`EPERM`) `prlimit64`, `sched_setaffinity`, `sched_setscheduler`,
/// `sched_setparam` and `sched_setattr` for any pid but 0 (`sched_setscheduler` to the
/// normal policy excepted), and `setpriority` and `ioprio_set` for any `who` but 0 or
/// for a whole user, in every ABI. The kernel reads these arguments as 32-bit `int`s,
/// as this compares them.
pub(crate) static NO_NEIGHBOUR_TUNING: [libc::sock_filter; LEN] = build();

const fn build() -> [libc::sock_filter; LEN] {
    const LD_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    /// The low halves of the first two arguments in `struct seccomp_data`.
    const ARG0: u32 = 16;
    const ARG1: u32 = 24;
    // A jump's offsets count from the next instruction.
    const fn to(from: usize, target: usize) -> u8 {
        (target - from - 1) as u8
    }
    const fn check(names: Names) -> usize {
        match names {
            Names::Pid => CHECK_PID,
            Names::PidOrNormalPolicy => CHECK_POLICY,
            Names::Which(PRIO_USER) => CHECK_PRIO,
            Names::Which(_) => CHECK_IOPRIO,
        }
    }
    let mut p = [stmt(RET, SECCOMP_RET_ALLOW); LEN];
    p[0] = stmt(LD_ABS, 4);
    p[1] = jump(JEQ, AUDIT_ARCH_NATIVE, 0, to(1, COMPAT));
    p[NATIVE] = stmt(LD_ABS, 0);
    p[COMPAT] = stmt(LD_ABS, 0);
    let mut i = 0;
    while i < N {
        let (native, compat, names) = CALLS[i];
        let at = NATIVE + 1 + 2 * i;
        p[at] = jump(JEQ, native, to(at, check(names)), 0);
        p[at + 1] = jump(JEQ, x32(native), to(at + 1, check(names)), 0);
        let at = COMPAT + 1 + i;
        p[at] = jump(JEQ, compat, to(at, check(names)), 0);
        i += 1;
    }
    // (`NATIVE + 1 + 2N` and `COMPAT + 1 + N` stay `ALLOW` returns: no call of these.)
    p[CHECK_POLICY] = stmt(LD_ABS, ARG1);
    p[CHECK_POLICY + 1] = jump(JEQ, SCHED_OTHER, to(CHECK_POLICY + 1, ALLOW), 0);
    p[CHECK_PID] = stmt(LD_ABS, ARG0);
    p[CHECK_PID + 1] = jump(JEQ, 0, to(CHECK_PID + 1, ALLOW), to(CHECK_PID + 1, REFUSE));
    let mut k = 0;
    while k < 2 {
        let (at, user) = match k {
            0 => (CHECK_PRIO, PRIO_USER),
            _ => (CHECK_IOPRIO, IOPRIO_WHO_USER),
        };
        p[at] = stmt(LD_ABS, ARG0);
        p[at + 1] = jump(JEQ, user, to(at + 1, REFUSE), 0);
        p[at + 2] = stmt(LD_ABS, ARG1);
        p[at + 3] = jump(JEQ, 0, to(at + 3, ALLOW), to(at + 3, REFUSE));
        k += 1;
    }
    p[ALLOW] = stmt(RET, SECCOMP_RET_ALLOW);
    p[REFUSE] = stmt(RET, SECCOMP_RET_ERRNO | libc::EPERM as u32);
    p
}

#[cfg(test)]
mod tests {
    /// The filter's verdict on `nr` with `args` in the native ABI.
    fn verdict(nr: u32, args: [u64; 2]) -> u32 {
        let native = super::AUDIT_ARCH_NATIVE;
        crate::seccomp::verdict(&super::NO_NEIGHBOUR_TUNING, native, nr, args)
    }

    #[test]
    fn only_the_caller_itself_may_be_changed() {
        let allow = super::SECCOMP_RET_ALLOW;
        let refuse = super::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let pid = 4242;
        for nr in [
            libc::SYS_prlimit64,
            libc::SYS_sched_setaffinity,
            libc::SYS_sched_setscheduler,
            libc::SYS_sched_setparam,
            libc::SYS_sched_setattr,
        ] {
            let nr = nr as u32;
            // The second argument: a policy other than the normal one, where it is one.
            let idle = 5;
            assert_eq!(verdict(nr, [0, idle]), allow, "{nr} on itself");
            assert_eq!(verdict(nr, [pid, idle]), refuse, "{nr} on another");
            // The kernel reads an int: high bits do not make another pid 0.
            assert_eq!(verdict(nr, [pid | 1 << 32, idle]), refuse, "{nr}");
        }
        // The normal policy, on a thread of its own or any process: allowed.
        let setscheduler = libc::SYS_sched_setscheduler as u32;
        assert_eq!(verdict(setscheduler, [pid, 0]), allow);
        // SCHED_IDLE or SCHED_BATCH on a neighbour would starve it: refused.
        for policy in [3, 5, 1 << 32 | 5] {
            assert_eq!(verdict(setscheduler, [pid, policy]), refuse, "{policy}");
        }
        for (nr, process, user) in [
            (libc::SYS_setpriority as u32, 0, super::PRIO_USER),
            (libc::SYS_ioprio_set as u32, 1, super::IOPRIO_WHO_USER),
        ] {
            assert_eq!(verdict(nr, [process, 0]), allow, "{nr} on itself");
            assert_eq!(verdict(nr, [process, pid]), refuse, "{nr} on another");
            assert_eq!(verdict(nr, [u64::from(user), 0]), refuse, "{nr} on a user");
        }
        assert_eq!(verdict(libc::SYS_getpid as u32, [pid, pid]), allow);
    }
}
