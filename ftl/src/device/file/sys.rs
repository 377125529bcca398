//! Syscalls of the file device outside the data path: the exclusive lock, a block
//! device's size and discard, with the ioctl numbers the libc crate does not export.
//! Called by `file/mod.rs` only.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

// ioctl request numbers from <linux/fs.h>, which the libc crate does not export.
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
mod ioc {
    pub const NONE: u32 = 1;
    pub const READ: u32 = 2;
    pub const DIR_SHIFT: u32 = 29;
}
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
mod ioc {
    pub const NONE: u32 = 0;
    pub const READ: u32 = 2;
    pub const DIR_SHIFT: u32 = 30;
}

const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << ioc::DIR_SHIFT) | ((size as u32) << 16) | (ty << 8) | nr
}

/// `_IOR(0x12, 114, size_t)`: device size in bytes, as a u64.
pub(super) const BLKGETSIZE64: u32 = ioc(ioc::READ, 0x12, 114, std::mem::size_of::<usize>());
/// `_IO(0x12, 119)`: discard the byte range `[u64 start, u64 len]`.
pub(super) const BLKDISCARD: u32 = ioc(ioc::NONE, 0x12, 119, 0);

pub(super) fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    lock(file, path, libc::LOCK_EX)
}

/// A shared lock: readers together, but not beside a server's exclusive one.
pub(super) fn lock_shared(file: &File, path: &Path) -> io::Result<()> {
    lock(file, path, libc::LOCK_SH)
}

fn lock(file: &File, path: &Path, how: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on an open descriptor owned by `file`; no memory is passed.
        let ret = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
        if ret == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "backing {} is already in use by another process (flock held)",
                        path.display()
                    ),
                ))
            }
            _ => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot lock backing {}: {e}", path.display()),
                ))
            }
        }
    }
}

pub(super) fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live local;
    // the descriptor is open and owned by `file`.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKGETSIZE64 as libc::Ioctl,
            &mut size as *mut u64,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Discards `len` bytes at `offset`: `BLKDISCARD` on a block device, a hole punched in a
/// file (keeping its size). Returns the syscall's result (0, or -1 with errno set).
/// Callers have checked the range against the device size.
pub(super) fn discard(fd: RawFd, block_device: bool, offset: u64, len: u64) -> libc::c_int {
    if block_device {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKDISCARD reads a `[u64; 2]` through the pointer, which points to a
        // live local array; `fd` is an open descriptor owned by the caller.
        unsafe { libc::ioctl(fd, BLKDISCARD as libc::Ioctl, range.as_ptr()) }
    } else {
        // Both values are <= self.size, which came from an i64 file length or a block
        // device size, so they fit in off_t.
        let (off, l) = (offset as libc::off_t, len as libc::off_t);
        // SAFETY: plain syscall on an open descriptor owned by the caller; no memory
        // is passed.
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                l,
            )
        }
    }
}
