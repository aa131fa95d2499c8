//! Raw system calls without a safe wrapper (Landlock, cgroup BPF) and passing a
//! descriptor over a Unix socket. `unsafe` lives here and in the few modules whose
//! job is a system call without a wrapper ([`crate::child`], [`crate::spawn`],
//! [`crate::seccomp`], [`crate::owner`], [`crate::loopdev`]).

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;

use rustix::io::Errno;

const SYS_LANDLOCK_CREATE_RULESET: libc::c_long = 444;
const SYS_LANDLOCK_ADD_RULE: libc::c_long = 445;
pub(crate) const SYS_LANDLOCK_RESTRICT_SELF: libc::c_long = 446;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
const LANDLOCK_RULE_NET_PORT: libc::c_int = 2;

/// `struct landlock_path_beneath_attr` (packed in the kernel's ABI).
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

fn errno() -> Errno {
    Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// The Landlock ABI version the kernel supports.
pub(crate) fn landlock_abi() -> Result<u32, Errno> {
    // SAFETY: with the VERSION flag the kernel reads no attribute (NULL, size 0) and
    // returns the ABI version or -1 with errno.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u32)
    }
}

/// `struct landlock_net_port_attr`.
#[repr(C)]
struct NetPort {
    allowed_access: u64,
    port: u64,
}

/// Creates a ruleset that handles the filesystem rights in `handled_access_fs`, the
/// network rights in `handled_access_net` (ABI 4 and later, when not zero) and, when
/// `scoped` is not zero (ABI 6 and later), scopes the sandbox's IPC by it.
pub(crate) fn landlock_create_ruleset(
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
) -> Result<OwnedFd, Errno> {
    // `struct landlock_ruleset_attr`: fs rights, net rights (ABI 4), scopes (ABI 6).
    // A prefix of the struct is valid on every ABI version that knows its last field.
    let attr: [u64; 3] = [handled_access_fs, handled_access_net, scoped];
    let fields = if scoped != 0 {
        3
    } else if handled_access_net != 0 {
        2
    } else {
        1
    };
    let size = fields * std::mem::size_of::<u64>();
    // SAFETY: `attr` lives across the call and the size passed is at most its own; the
    // kernel returns a new descriptor we then own, or -1.
    let r = unsafe { libc::syscall(SYS_LANDLOCK_CREATE_RULESET, attr.as_ptr(), size, 0u32) };
    if r < 0 {
        return Err(errno());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(r as i32) })
}

/// Allows `access` beneath the file or directory open as `target`.
pub(crate) fn landlock_add_path_rule(
    ruleset: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    access: u64,
) -> Result<(), Errno> {
    let attr = PathBeneath {
        allowed_access: access,
        parent_fd: target.as_raw_fd(),
    };
    // SAFETY: both descriptors are borrowed and open for the call; `attr` outlives it
    // and has the kernel's packed layout.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_ADD_RULE,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneath,
            0u32,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Allows `access` (TCP rights) on `port`.
pub(crate) fn landlock_add_port_rule(
    ruleset: BorrowedFd<'_>,
    port: u16,
    access: u64,
) -> Result<(), Errno> {
    let attr = NetPort {
        allowed_access: access,
        port: u64::from(port),
    };
    // SAFETY: the descriptor is borrowed and open for the call; `attr` outlives it and
    // has the kernel's layout.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_ADD_RULE,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_NET_PORT,
            &attr as *const NetPort,
            0u32,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Which sockets a sandbox process may open, enforced by seccomp.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketFilter {
    /// Any (the network is the sandbox's own, or it has the host's on purpose).
    #[default]
    Any,
    /// No IPv4, IPv6 or packet sockets: [`crate::seccomp::NO_NETWORK`].
    NoNetwork,
    /// IPv4 and IPv6 only as TCP, which Landlock's port rules and the cgroup's connect
    /// filter govern: [`crate::seccomp::TCP_ONLY`].
    TcpOnly,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_CGROUP_INET4_CONNECT: u32 = 10;
const BPF_CGROUP_INET6_CONNECT: u32 = 11;

/// `struct bpf_insn`: opcode, destination and source registers (4 bits each), offset,
/// immediate.
#[repr(C)]
#[derive(Clone, Copy)]
struct BpfInsn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    BpfInsn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// The head of `union bpf_attr` as `BPF_PROG_LOAD` reads it, up to
/// `expected_attach_type`; the kernel takes a shorter attribute as zero-filled.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` as `BPF_PROG_ATTACH` reads it.
#[repr(C)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// A `connect(2)` filter for IPv4 (`struct bpf_sock_addr`'s `user_ip4` at offset 4 and
/// `user_port` at 24, both in network byte order): allow `127.0.0.1:port` only.
fn connect4_only_to(port: u16) -> [BpfInsn; 8] {
    const LDX_W: u8 = 0x61; // BPF_LDX | BPF_W | BPF_MEM
    const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
    const MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
    let ip = u32::from_ne_bytes(std::net::Ipv4Addr::LOCALHOST.octets()) as i32;
    let [hi, lo] = port.to_be_bytes();
    let port = u32::from_ne_bytes([hi, lo, 0, 0]) as i32;
    [
        insn(LDX_W, 2, 1, 4, 0),
        insn(JNE_K, 2, 0, 4, ip),
        insn(LDX_W, 2, 1, 24, 0),
        insn(JNE_K, 2, 0, 2, port),
        insn(MOV_K, 0, 0, 0, 1),
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV_K, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// A `connect(2)` filter that refuses every connection.
const REFUSE_ALL: [BpfInsn; 2] = [insn(0xb7, 0, 0, 0, 0), insn(0x95, 0, 0, 0, 0)];

fn bpf<T>(command: libc::c_long, attr: &T) -> Result<libc::c_long, Errno> {
    // SAFETY: `attr` is a live, initialized `union bpf_attr` prefix of the size passed,
    // and every pointer in it points at memory that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *const T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn load_connect_filter(program: &[BpfInsn], attach_type: u32) -> Result<OwnedFd, Errno> {
    let license = b"GPL\0";
    let mut name = [0u8; 16];
    name[..13].copy_from_slice(b"sandcell_conn");
    let attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        insn_cnt: program.len() as u32,
        insns: program.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type: attach_type,
    };
    let fd = bpf(BPF_PROG_LOAD, &attr)?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether this kernel (and this process's privileges) can load the connect filters of
/// [`restrict_connect`].
pub(crate) fn connect_filters_load() -> Result<(), Errno> {
    load_connect_filter(&connect4_only_to(1), BPF_CGROUP_INET4_CONNECT)?;
    load_connect_filter(&REFUSE_ALL, BPF_CGROUP_INET6_CONNECT)?;
    Ok(())
}

/// Attaches filters to the cgroup v2 directory open as `cgroup`, so that every process
/// in it and beneath it may `connect(2)` (TCP fast open included) to
/// `127.0.0.1:port` and nowhere else, over IPv4 or IPv6. The filters stay until the
/// cgroup is removed.
pub(crate) fn restrict_connect(cgroup: BorrowedFd<'_>, port: u16) -> Result<(), Errno> {
    for (program, attach_type) in [
        (&connect4_only_to(port)[..], BPF_CGROUP_INET4_CONNECT),
        (&REFUSE_ALL[..], BPF_CGROUP_INET6_CONNECT),
    ] {
        let prog = load_connect_filter(program, attach_type)?;
        let attr = ProgAttach {
            target_fd: cgroup.as_raw_fd() as u32,
            attach_bpf_fd: prog.as_raw_fd() as u32,
            attach_type,
            // No BPF_F_ALLOW_OVERRIDE or BPF_F_ALLOW_MULTI: nothing beneath can attach
            // a filter of its own in place of this one.
            attach_flags: 0,
        };
        bpf(BPF_PROG_ATTACH, &attr)?;
    }
    Ok(())
}

/// Registers `fd` (non-blocking) with the tokio reactor of the current runtime.
pub(crate) fn async_fd(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` owns an open descriptor, and the `AsyncFd` owns the
    // `OwnedFd` until it deregisters it: nothing can close or replace the descriptor
    // while it is registered.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(std::io::Error::from)
}

/// A TCP listener on `127.0.0.1:port` in the network namespace `net_ns` (entered
/// through `user_ns` where that is the namespace's owner and not ours).
///
/// A child joins the namespaces (a user namespace can be joined only by a
/// single-threaded process, which this one is not), opens the listener, sends it back
/// with `SCM_RIGHTS`, and execs `noop`. Everything it does between fork and exec is a
/// plain system call on memory prepared before the fork.
pub(crate) fn listen_in_namespace(
    user_ns: Option<&OwnedFd>,
    net_ns: &OwnedFd,
    port: u16,
    noop: &Path,
) -> std::io::Result<std::net::TcpListener> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let user_fd: RawFd = user_ns.map_or(-1, |fd| fd.as_raw_fd());
    let net_fd = net_ns.as_raw_fd();
    let chan = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(noop);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure makes only async-signal-safe system calls on values prepared
    // before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || listen_and_send(user_fd, net_fd, port, chan));
    }
    let status = cmd.status()?;
    drop(theirs);
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "the helper that opens it exited with {status}"
        )));
    }
    let fd = receive_fd(ours.as_raw_fd())?;
    Ok(std::net::TcpListener::from(fd))
}

/// The child's part: join the namespaces, listen, send the socket.
fn listen_and_send(user_fd: RawFd, net_fd: RawFd, port: u16, chan: RawFd) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // SAFETY: plain system calls on descriptors this process holds and on stack memory.
    unsafe {
        if user_fd >= 0 {
            check(libc::setns(user_fd, libc::CLONE_NEWUSER))?;
        }
        check(libc::setns(net_fd, libc::CLONE_NEWNET))?;
        let sock = check(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        // Connections of an earlier listener in TIME_WAIT must not keep the port;
        // a listener still open does (EADDRINUSE: another process serves it).
        let one: libc::c_int = 1;
        check(libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            std::ptr::addr_of!(one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ))?;
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        check(libc::bind(
            sock,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ))?;
        check(libc::listen(sock, 128))?;
        send_fd(chan, sock)
    }
}

/// Room for one descriptor's control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct FdMessage([u8; 32]);

/// Sends `fd` over the Unix socket `chan` with one byte of data.
///
/// # Safety
/// `chan` must be a connected Unix socket and `fd` an open descriptor.
unsafe fn send_fd(chan: RawFd, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = FdMessage([0; 32]);
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
    let header = libc::CMSG_FIRSTHDR(&msg);
    (*header).cmsg_level = libc::SOL_SOCKET;
    (*header).cmsg_type = libc::SCM_RIGHTS;
    (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
    if libc::sendmsg(chan, &msg, 0) < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Receives the descriptor [`send_fd`] sent.
fn receive_fd(chan: RawFd) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = FdMessage([0; 32]);
    // SAFETY: the message points at live stack buffers of the lengths given, and the
    // descriptor is taken only from a well-formed SCM_RIGHTS message.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = control.0.len() as _;
        if libc::recvmsg(chan, &mut msg, libc::MSG_CMSG_CLOEXEC) < 1 {
            return Err(std::io::Error::other("the helper sent no listener"));
        }
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(std::io::Error::other("the helper sent no listener"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
