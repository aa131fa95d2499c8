//! The seccomp filters a sandbox's commands run under, in classic BPF: which sockets
//! they may open, the terminal ioctls that would type into another terminal, the
//! kernel's keyrings, and (`neighbours`) other processes' scheduling and limits.

#![allow(unsafe_code)]

mod neighbours;
mod shared_uid;
pub(crate) use neighbours::NO_NEIGHBOUR_TUNING;
pub(crate) use shared_uid::{NO_CLONE3, NO_SYSV_IPC};

// The seccomp filter of `no_network`, in classic BPF over `struct seccomp_data`
// (`nr` at offset 0, `arch` at 4, the first argument's low half at 16 on these
// little-endian targets).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_00B7;
/// On x86_64, system call numbers from here up are the x32 ABI's.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const DENY: u32 = SECCOMP_RET_ERRNO | libc::EACCES as u32;

/// The x32 number of a native call (none on aarch64, which has no x32).
const fn x32(native: u32) -> u32 {
    if cfg!(target_arch = "x86_64") {
        X32_SYSCALL_BIT | native
    } else {
        u32::MAX
    }
}

/// Runs `program` the way the kernel would on system call `nr` of `arch` with the low
/// halves of its first two arguments `args`: the verdict it returns. For the filters'
/// tests (`LD|W|ABS`, `JEQ|K` and `RET|K` only, the instructions they use).
#[cfg(test)]
fn verdict(program: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 2]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    data[16..24].copy_from_slice(&args[0].to_le_bytes());
    data[24..32].copy_from_slice(&args[1].to_le_bytes());
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let op = program[pc];
        match op.code as u32 {
            c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                let at = op.k as usize;
                acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                pc += 1;
            }
            c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                pc += 1 + usize::from(if acc == op.k { op.jt } else { op.jf });
            }
            c if c == libc::BPF_RET | libc::BPF_K => return op.k,
            other => panic!("unexpected instruction {other:#x}"),
        }
    }
}

const fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Refuses (`EACCES`) `socket(2)` for IPv4, IPv6 and raw packets, and `io_uring_setup(2)`
/// (whose socket operation would get past this filter); refuses every system call of a
/// foreign ABI (x86's 32-bit entry, x32), which has socket calls of its own. Unix
/// sockets stay, and Landlock's scoping keeps them off the host's abstract ones.
pub(crate) static NO_NETWORK: [libc::sock_filter; 13] = {
    const LD_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    [
        /* 0 */ stmt(LD_ABS, 4),
        /* 1 */ jump(JEQ, AUDIT_ARCH_NATIVE, 1, 0),
        /* 2 */ stmt(RET, DENY),
        /* 3 */ stmt(LD_ABS, 0),
        /* 4 */ jump(JGE, X32_SYSCALL_BIT, 7, 0),
        /* 5 */ jump(JEQ, libc::SYS_io_uring_setup as u32, 6, 0),
        /* 6 */ jump(JEQ, libc::SYS_socket as u32, 0, 4),
        /* 7 */ stmt(LD_ABS, 16),
        /* 8 */ jump(JEQ, libc::AF_INET as u32, 3, 0),
        /* 9 */ jump(JEQ, libc::AF_INET6 as u32, 2, 0),
        /* 10 */ jump(JEQ, libc::AF_PACKET as u32, 1, 0),
        /* 11 */ stmt(RET, SECCOMP_RET_ALLOW),
        /* 12 */ stmt(RET, DENY),
    ]
};

/// Like [`NO_NETWORK`], but IPv4 and IPv6 sockets are allowed as TCP: type
/// `SOCK_STREAM` (flags aside) with protocol 0 or `IPPROTO_TCP`, so neither UDP, ICMP,
/// raw sockets, SCTP nor MPTCP, which Landlock's TCP rules do not govern.
pub(crate) static TCP_ONLY: [libc::sock_filter; 19] = {
    const LD_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    const AND: u32 = libc::BPF_ALU | libc::BPF_AND | libc::BPF_K;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    /// `SOCK_TYPE_MASK`: the type without `SOCK_NONBLOCK` and `SOCK_CLOEXEC`.
    const TYPE_MASK: u32 = 0xf;
    [
        /* 0 */ stmt(LD_ABS, 4),
        /* 1 */ jump(JEQ, AUDIT_ARCH_NATIVE, 1, 0),
        /* 2 */ stmt(RET, DENY),
        /* 3 */ stmt(LD_ABS, 0),
        /* 4 */ jump(JGE, X32_SYSCALL_BIT, 13, 0),
        /* 5 */ jump(JEQ, libc::SYS_io_uring_setup as u32, 12, 0),
        /* 6 */ jump(JEQ, libc::SYS_socket as u32, 0, 10),
        /* 7 */ stmt(LD_ABS, 16),
        /* 8 */ jump(JEQ, libc::AF_PACKET as u32, 9, 0),
        /* 9 */ jump(JEQ, libc::AF_INET as u32, 1, 0),
        /* 10 */ jump(JEQ, libc::AF_INET6 as u32, 0, 6),
        /* 11 */ stmt(LD_ABS, 24),
        /* 12 */ stmt(AND, TYPE_MASK),
        /* 13 */ jump(JEQ, libc::SOCK_STREAM as u32, 0, 4),
        /* 14 */ stmt(LD_ABS, 32),
        /* 15 */ jump(JEQ, 0, 1, 0),
        /* 16 */ jump(JEQ, libc::IPPROTO_TCP as u32, 0, 1),
        /* 17 */ stmt(RET, SECCOMP_RET_ALLOW),
        /* 18 */ stmt(RET, DENY),
    ]
};

/// `TIOCSTI` (type a byte into a terminal's input) and `TIOCLINUX` (whose subcommands
/// include pasting the console's selection): how a program with a descriptor of a
/// terminal makes the shell reading it run commands of its choosing.
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
/// `ioctl(2)` in the ABIs the native one runs beside: x32 on x86_64, and the 32-bit
/// compat ABI (i386 on x86_64, arm on aarch64), where it is 54 in both.
#[cfg(target_arch = "x86_64")]
const X32_IOCTL: u32 = X32_SYSCALL_BIT | 514;
#[cfg(target_arch = "aarch64")]
const X32_IOCTL: u32 = u32::MAX;
const COMPAT_IOCTL: u32 = 54;

/// Refuses (`EPERM`) `ioctl(2)` with [`TIOCSTI`] or [`TIOCLINUX`] in every ABI: a
/// sandbox's command cannot type into a terminal it holds, whichever one it got
/// (ADVERSARIAL 43). The kernel compares the request as 32 bits, as this does.
pub(crate) static NO_TERMINAL_INJECTION: [libc::sock_filter; 13] = {
    const LD_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    const REFUSE: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    [
        /* 0 */ stmt(LD_ABS, 4),
        /* 1 */ jump(JEQ, AUDIT_ARCH_NATIVE, 0, 4),
        /* 2 */ stmt(LD_ABS, 0),
        /* 3 */ jump(JEQ, libc::SYS_ioctl as u32, 4, 0),
        /* 4 */ jump(JEQ, X32_IOCTL, 3, 0),
        /* 5 */ stmt(RET, SECCOMP_RET_ALLOW),
        /* 6 */ stmt(LD_ABS, 0),
        /* 7 */ jump(JEQ, COMPAT_IOCTL, 0, 3),
        /* 8 */ stmt(LD_ABS, 24),
        /* 9 */ jump(JEQ, TIOCSTI, 2, 0),
        /* 10 */ jump(JEQ, TIOCLINUX, 1, 0),
        /* 11 */ stmt(RET, SECCOMP_RET_ALLOW),
        /* 12 */ stmt(RET, REFUSE),
    ]
};

/// Installs `filter` on the calling thread, which has set no-new-privileges.
///
/// # Safety
///
/// Async-signal-safe: one seccomp(2) call on a static filter the kernel copies, so a
/// child between its creation and its exec may make it.
pub(crate) unsafe fn install(filter: &'static [libc::sock_filter]) -> std::io::Result<()> {
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    let set_filter = 1u32; // SECCOMP_SET_MODE_FILTER
    let program: *const libc::sock_fprog = &program;
    // SAFETY: the program points at a static filter the kernel copies.
    if unsafe { libc::syscall(libc::SYS_seccomp, set_filter, 0u32, program) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's key management calls, native, x32 and compat.
#[cfg(target_arch = "x86_64")]
const KEYRING_CALLS: [u32; 9] = [
    libc::SYS_add_key as u32,
    libc::SYS_request_key as u32,
    libc::SYS_keyctl as u32,
    X32_SYSCALL_BIT | libc::SYS_add_key as u32,
    X32_SYSCALL_BIT | libc::SYS_request_key as u32,
    X32_SYSCALL_BIT | libc::SYS_keyctl as u32,
    // i386
    286,
    287,
    288,
];
#[cfg(target_arch = "aarch64")]
const KEYRING_CALLS: [u32; 9] = [
    libc::SYS_add_key as u32,
    libc::SYS_request_key as u32,
    libc::SYS_keyctl as u32,
    u32::MAX,
    u32::MAX,
    u32::MAX,
    // arm
    309,
    310,
    311,
];

/// Refuses (`EPERM`) `add_key(2)`, `request_key(2)` and `keyctl(2)` in every ABI: a
/// user's keyrings are shared by every process of that uid in a user namespace, so
/// without this a command could read and fill the keys of the host's processes and of
/// other sandboxes of the same uid (as Docker's default profile refuses them).
pub(crate) static NO_KEYRING: [libc::sock_filter; 16] = {
    const LD_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    const REFUSE: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let k = KEYRING_CALLS;
    [
        /* 0 */ stmt(LD_ABS, 4),
        /* 1 */ jump(JEQ, AUDIT_ARCH_NATIVE, 0, 8),
        /* 2 */ stmt(LD_ABS, 0),
        /* 3 */ jump(JEQ, k[0], 11, 0),
        /* 4 */ jump(JEQ, k[1], 10, 0),
        /* 5 */ jump(JEQ, k[2], 9, 0),
        /* 6 */ jump(JEQ, k[3], 8, 0),
        /* 7 */ jump(JEQ, k[4], 7, 0),
        /* 8 */ jump(JEQ, k[5], 6, 0),
        /* 9 */ stmt(RET, SECCOMP_RET_ALLOW),
        /* 10 */ stmt(LD_ABS, 0),
        /* 11 */ jump(JEQ, k[6], 3, 0),
        /* 12 */ jump(JEQ, k[7], 2, 0),
        /* 13 */ jump(JEQ, k[8], 1, 0),
        /* 14 */ stmt(RET, SECCOMP_RET_ALLOW),
        /* 15 */ stmt(RET, REFUSE),
    ]
};

/// Refuses the calling process, and everything it starts from then on, the kernel's
/// keyrings and the ioctls that type into a terminal (`TIOCSTI`, `TIOCLINUX`), as a
/// confined sandbox's commands are refused them (ADVERSARIAL 37, 43). For a program
/// that serves a sandbox it is itself inside, at `Isolation::None`: the Docker
/// backend's in-container agent, whose engine's own seccomp profile may allow them
/// (Podman's allows `keyctl`, and with it the user keyring the container's uid shares
/// with the host's processes of that uid).
///
/// Sets no-new-privileges. Call it before starting any thread: a filter binds the
/// calling thread and what it starts afterwards.
pub fn confine_this_process() -> sandcell::Result<()> {
    rustix::thread::set_no_new_privs(true)
        .map_err(|e| sandcell::Error::io("setting no-new-privileges", e.into()))?;
    for filter in [&NO_TERMINAL_INJECTION[..], &NO_KEYRING[..]] {
        // SAFETY: a static filter, no-new-privileges set above.
        unsafe { install(filter) }
            .map_err(|e| sandcell::Error::io("installing a seccomp filter", e))?;
    }
    Ok(())
}
