//! The memory behind a staging area: a heap buffer, or a file mapped MAP_SHARED (its
//! pages stay in the page cache, tmpfs in practice, when the process dies).

use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

pub(super) enum Region {
    Heap(AlignedBuf),
    Mapped {
        ptr: NonNull<u8>,
        len: usize,
        path: PathBuf,
        /// Held open for its exclusive lock: one server per staging file, even for two
        /// copies of a backing that share a uuid.
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
    pub fn heap(len: usize) -> Self {
        Region::Heap(AlignedBuf::new(len))
    }

    /// Maps `path` shared, growing it to at least `min_len` bytes (existing bytes kept).
    pub fn map_file(path: &Path, min_len: usize) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| open_err(dir, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| open_err(path, e))?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.kind() == std::io::ErrorKind::WouldBlock {
                Error::Busy(format!(
                    "staging file {} (another server uses it: a copy of this backing with \
                     the same uuid?)",
                    path.display()
                ))
            } else {
                open_err(path, e)
            });
        }
        let have = file.metadata().map_err(|e| open_err(path, e))?.len() as usize;
        let len = have.max(min_len).div_ceil(4096) * 4096;
        if len != have {
            file.set_len(len as u64).map_err(|e| open_err(path, e))?;
        }
        // SAFETY: a fresh shared mapping of a file we hold open, `len` bytes long; the
        // mapping stays valid after the fd closes.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(open_err(path, std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(raw as *mut u8)
            .ok_or_else(|| open_err(path, std::io::Error::other("mmap returned null")))?;
        Ok(Region::Mapped {
            ptr,
            len,
            path: path.to_path_buf(),
            _lock: file,
        })
    }

    pub fn ptr(&self) -> *mut u8 {
        match self {
            Region::Heap(b) => b.raw_ptr(),
            Region::Mapped { ptr, .. } => ptr.as_ptr(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Region::Heap(b) => b.len(),
            Region::Mapped { len, .. } => *len,
        }
    }

    pub fn path(&self) -> Option<&Path> {
        match self {
            Region::Heap(_) => None,
            Region::Mapped { path, .. } => Some(path),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Region::Mapped { ptr, len, .. } = self {
            // SAFETY: mapped in `map_file` with this length; nothing refers to it any more
            // (every ChunkBuf holds the area alive).
            unsafe {
                libc::munmap(ptr.as_ptr() as *mut libc::c_void, *len);
            }
        }
    }
}
