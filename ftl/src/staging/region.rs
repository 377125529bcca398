//! The memory behind a staging area: anonymous memory, or a file mapped MAP_SHARED (its
//! pages stay in the page cache, tmpfs in practice, when the process dies). Both are
//! mmaps: pages are zero-filled by the kernel when first touched, so an area costs only
//! what its slots have used (an FTL opened thousands of times by a fuzzer stays cheap).

use crate::error::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

pub(super) enum Region {
    Anonymous {
        ptr: NonNull<u8>,
        len: usize,
    },
    Mapped {
        ptr: NonNull<u8>,
        len: usize,
        path: PathBuf,
        /// Held open for its exclusive lock: one server per staging file, even for two
        /// copies of a backing that share a uuid.
        _lock: std::fs::File,
    },
    /// A file mapped privately: a view that never changes the file.
    Snapshot {
        ptr: NonNull<u8>,
        len: usize,
        path: PathBuf,
        /// Shared lock: no server holds the file meanwhile.
        _lock: std::fs::File,
    },
}

// SAFETY: the region is plain memory; StagingArea coordinates access to its bytes.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

fn open_err(path: &Path, source: std::io::Error) -> Error {
    Error::Open {
        path: path.to_path_buf(),
        source,
    }
}

impl Region {
    /// `len` bytes of private anonymous memory.
    pub fn anonymous(len: usize) -> Result<Self> {
        let len = len.div_ceil(4096) * 4096;
        let ptr = map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
            .map_err(|e| Error::io("staging memory map", 0, e))?;
        Ok(Region::Anonymous { ptr, len })
    }

    /// Maps `path` shared, growing it to at least `min_len` bytes (existing bytes kept).
    pub fn map_file(path: &Path, min_len: usize) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| open_err(dir, e))?;
        }
        // Its owner's only, even when an older build made it 0644: it holds written data.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // Not through a symlink, and only a regular file of this user's (below): in a
            // run directory others may write to (`FTLBLK_RUN_DIR` under /tmp), a file or
            // link planted there was taken, and its owner could change staged writes
            // before they were replayed (found by review, 2026-11-29).
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| open_err(path, e))?;
        {
            use std::os::unix::fs::MetadataExt;
            let m = file.metadata().map_err(|e| open_err(path, e))?;
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if !m.file_type().is_file() || m.uid() != me {
                return Err(open_err(
                    path,
                    std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "not a regular file of user {me} (owner {}): remove it, or use a \
                             run directory only this user can write",
                            m.uid()
                        ),
                    ),
                ));
            }
        }
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::Busy(format!(
                    "{} (the staging file; a copy of this backing with the same uuid?)",
                    path.display()
                ))
            } else {
                open_err(path, e)
            });
        }
        // Best effort: a file system without modes (vfat, some FUSE) still holds the area.
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
        let have = file.metadata().map_err(|e| open_err(path, e))?.len() as usize;
        let len = have.max(min_len).div_ceil(4096) * 4096;
        if len != have {
            file.set_len(len as u64).map_err(|e| open_err(path, e))?;
        }
        // Allocated whole before it is mapped: a sparse file on a full tmpfs took the
        // server down with SIGBUS at its first write to a page not yet there, and again
        // at every restart (found by review, 2026-11-29). Now a full file system fails
        // the open with ENOSPC.
        // SAFETY: fallocate on an fd we own, within its length.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if r != 0 {
            return Err(open_err(path, std::io::Error::from_raw_os_error(r)));
        }
        let ptr = map(len, libc::MAP_SHARED, file.as_raw_fd()).map_err(|e| open_err(path, e))?;
        Ok(Region::Mapped {
            ptr,
            len,
            path: path.to_path_buf(),
            _lock: file,
        })
    }

    /// Maps `path` privately (copy on write): what the file holds, for reading, where
    /// writes change only this process's copy. Fails with `Busy` while a server holds the
    /// file (its exclusive lock).
    pub fn map_file_private(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| open_err(path, e))?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            return Err(Error::Busy(format!(
                "{} (the staging file)",
                path.display()
            )));
        }
        let len = file.metadata().map_err(|e| open_err(path, e))?.len() as usize;
        if len == 0 {
            return Err(Error::Corrupt(format!(
                "staging file {} is empty",
                path.display()
            )));
        }
        let ptr = map(len, libc::MAP_PRIVATE, file.as_raw_fd()).map_err(|e| open_err(path, e))?;
        Ok(Region::Snapshot {
            ptr,
            len,
            path: path.to_path_buf(),
            _lock: file,
        })
    }

    /// True for a private view of a file ([`Region::map_file_private`]).
    pub fn is_snapshot(&self) -> bool {
        matches!(self, Region::Snapshot { .. })
    }

    pub fn ptr(&self) -> *mut u8 {
        match self {
            Region::Anonymous { ptr, .. }
            | Region::Mapped { ptr, .. }
            | Region::Snapshot { ptr, .. } => ptr.as_ptr(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Region::Anonymous { len, .. }
            | Region::Mapped { len, .. }
            | Region::Snapshot { len, .. } => *len,
        }
    }

    /// Writes `len` bytes from `offset` of a file mapped shared back to the file and
    /// waits for them (msync); nothing to do for memory or a private view.
    pub fn sync_range(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let Region::Mapped {
            ptr, len: total, ..
        } = self
        else {
            return Ok(());
        };
        // msync takes a start on a page of the system's size (not always 4 KiB).
        // SAFETY: sysconf reads a constant of the system.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        let start = offset / page * page;
        let end = (offset + len).min(*total);
        #[cfg(test)]
        super::tests::FILE_SYNCS.with(|n| n.set(n.get() + 1));
        // SAFETY: `start..end` lies within the mapping (page-aligned start, `end` at most
        // its length); msync only writes the pages back.
        let r = unsafe {
            libc::msync(
                ptr.as_ptr().add(start) as *mut libc::c_void,
                end.saturating_sub(start),
                libc::MS_SYNC,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn path(&self) -> Option<&Path> {
        match self {
            Region::Anonymous { .. } => None,
            Region::Mapped { path, .. } | Region::Snapshot { path, .. } => Some(path),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let (ptr, len) = match self {
            Region::Anonymous { ptr, len }
            | Region::Mapped { ptr, len, .. }
            | Region::Snapshot { ptr, len, .. } => (*ptr, *len),
        };
        // SAFETY: mapped by `map` with this length; nothing refers to it any more (every
        // ChunkBuf holds the area alive).
        unsafe {
            libc::munmap(ptr.as_ptr() as *mut libc::c_void, len);
        }
    }
}

/// mmap of `len` bytes, read-write, with `flags` over `fd` (-1 for anonymous).
fn map(len: usize, flags: libc::c_int, fd: libc::c_int) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh mapping chosen by the kernel; for a file, `fd` is open and the
    // mapping stays valid after it closes.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(raw as *mut u8).ok_or_else(|| std::io::Error::other("mmap returned null"))
}
