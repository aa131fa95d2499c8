//! Loop devices: a file attached as a block device, for the file system a sandbox with a
//! disk limit writes to (`crate::quota`). The kernel's `LOOP_*` ioctls have no safe
//! wrapper, so this module is one of the few with `unsafe` (see `crate::sys`).
//!
//! Every device is attached with `LO_FLAGS_AUTOCLEAR`: the kernel detaches it once
//! nothing holds it any more, neither a descriptor nor a mount. So a sandbox's device
//! goes with the unmount of its file system, whoever unmounts it (a destroy in another
//! process, or a host restart), and a create that fails before mounting leaves none:
//! there is no detach step to forget.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// The control device that hands out free loop devices.
pub(crate) const CONTROL: &str = "/dev/loop-control";

// From <linux/loop.h>.
const LOOP_SET_FD: libc::Ioctl = 0x4C00;
const LOOP_CLR_FD: libc::Ioctl = 0x4C01;
const LOOP_SET_STATUS64: libc::Ioctl = 0x4C04;
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// How often a free device is asked for again when another process took the one
/// offered before this one could attach it.
const ATTEMPTS: usize = 16;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device attached to a file, open. Once this is dropped the kernel detaches
/// the device as soon as nothing has it mounted.
#[derive(Debug)]
pub(crate) struct Attached {
    /// The device, held open so that it stays attached until it is mounted.
    _device: File,
    /// `/dev/loop<n>`.
    pub(crate) path: PathBuf,
}

/// Whether this process may attach loop devices (it can open the control device).
pub(crate) fn available() -> io::Result<()> {
    open_rw(CONTROL.into()).map(drop)
}

/// Attaches `backing` (open read-write) to a free loop device, to be detached by the
/// kernel once it is neither open nor mounted.
pub(crate) fn attach(backing: &File) -> io::Result<Attached> {
    let control = open_rw(CONTROL.into())?;
    for _ in 0..ATTEMPTS {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument; it returns a device number (the
        // device made where missing) or -1 with errno.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = open_rw(path.clone())?;
        match configure(&device, backing) {
            Ok(()) => {
                return Ok(Attached {
                    _device: device,
                    path,
                })
            }
            // Another process attached this device since it was offered: ask again.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "no free loop device after {ATTEMPTS} attempts (others took each one offered)"
    )))
}

fn open_rw(path: PathBuf) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Attaches `backing` to `device` with autoclear: at once with `LOOP_CONFIGURE`, or
/// in two steps on a kernel before 5.8.
fn configure(device: &File, backing: &File) -> io::Result<()> {
    let info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_AUTOCLEAR,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    let config = LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: 0,
        info,
        reserved: [0; 8],
    };
    let fd = device.as_raw_fd();
    // SAFETY: `config` has the kernel's layout and outlives the call, which only reads
    // it; `backing` stays open across it.
    if unsafe { libc::ioctl(fd, LOOP_CONFIGURE, &config as *const LoopConfig) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOTTY)) {
        return Err(err);
    }
    // SAFETY: LOOP_SET_FD takes the backing descriptor by value; it stays open.
    if unsafe { libc::ioctl(fd, LOOP_SET_FD, backing.as_raw_fd() as libc::c_ulong) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `info` has the kernel's layout and outlives the call, which only reads it.
    if unsafe { libc::ioctl(fd, LOOP_SET_STATUS64, &info as *const LoopInfo64) } < 0 {
        let err = io::Error::last_os_error();
        // Without autoclear nothing would ever detach it.
        // SAFETY: LOOP_CLR_FD takes no argument.
        unsafe { libc::ioctl(fd, LOOP_CLR_FD, 0 as libc::c_ulong) };
        return Err(err);
    }
    Ok(())
}
