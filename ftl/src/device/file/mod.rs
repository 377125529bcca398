//! [`FileDevice`]: a regular file or a block device as the FTL's backing store.
//!
//! Contract:
//! - **Exclusivity.** Opening takes `flock(LOCK_EX | LOCK_NB)` on the backing; a second
//!   opener (another process, or another `open` in this one) fails with
//!   [`io::ErrorKind::WouldBlock`] for as long as the first [`FileDevice`] lives. A block
//!   device is additionally opened with `O_EXCL`, the kernel's exclusive claim, so a mounted
//!   or otherwise claimed device fails with `EBUSY`.
//! - **O_DIRECT.** By default the backing is opened with `O_DIRECT`, so the page cache is
//!   bypassed and every transfer must use a 4 KiB-aligned memory buffer, file offset and
//!   length. Offsets and lengths are checked by [`check_range`]; a caller buffer that is not
//!   4 KiB-aligned in memory is transparently bounced through an [`AlignedBuf`] (a copy, so
//!   hot paths should pass aligned buffers). If the file system refuses `O_DIRECT` (e.g.
//!   tmpfs answers `EINVAL`), the device falls back to buffered I/O; [`FileDevice::is_direct`]
//!   tells which mode is in use. Either way [`BlockDevice::sync`] is an `fdatasync`, which is
//!   what makes completed writes durable.
//! - **Size.** A regular file's length or a block device's `BLKGETSIZE64`, rounded *down* to
//!   a multiple of 4 KiB; the tail beyond that is never touched.
//! - **Thread-local io_uring.** All data-path I/O (`read_at`, `write_at`, `read_many`,
//!   `sync`) goes through one io_uring per thread, created lazily on first use and shared
//!   by every `FileDevice` used on that thread. Each call submits its requests and waits for
//!   all of them before returning, so the ring is empty between calls and buffers are never
//!   referenced by the kernel after a call returns. Short transfers are resubmitted for the
//!   remainder; a read that hits end-of-file fills the rest of the buffer with zeros.
//!   `discard` uses a plain syscall (`BLKDISCARD` or a hole punch) and is advisory: a backing
//!   that does not support it (`EOPNOTSUPP`) gets an `Unsupported` error, which callers
//!   ignore but do not count as discarded.
//!
//! Errors from the data path keep their [`io::ErrorKind`] and name the operation, offset and
//! path in their message; the underlying OS error is available as the error's source
//! (`get_ref()`), not through `raw_os_error()`.
//!
//! Files: `mod.rs` the device and its contract, `uring.rs` the per-thread io_uring runner
//! (requests, short transfers, retries, error annotation), `sys.rs` the ioctls, the lock
//! and the discard syscall, `tests.rs` the tests.

use super::aligned::is_aligned;
use super::{check_range, AlignedBuf, BlockDevice, BLOCK_SIZE};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use sys::{block_device_size, lock_exclusive, lock_shared};
use uring::{annotate, Kind, Op, RING_ENTRIES};

mod sys;
/// [`FileDevice::host_space_short`] of an open file (a regular file: a block device's
/// length reads as 0 here).
pub fn host_space_short(file: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    if !m.is_file() {
        return None;
    }
    let mut vfs = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: fstatvfs fills the struct from an fd we own; read only on success.
    let r = unsafe { libc::fstatvfs(file.as_raw_fd(), vfs.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: fstatvfs succeeded and initialised it.
    let vfs = unsafe { vfs.assume_init() };
    let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    holes_past_free(m.len(), m.blocks().saturating_mul(512), free)
}

/// `(holes, free)` when a file of `len` bytes with `allocated` bytes on disk has more
/// holes than its file system's `free` bytes ([`FileDevice::host_space_short`]).
fn holes_past_free(len: u64, allocated: u64, free: u64) -> Option<(u64, u64)> {
    let holes = len.saturating_sub(allocated);
    (holes > free).then_some((holes, free))
}

#[cfg(test)]
mod tests;
mod uring;

/// How to open a [`FileDevice`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// If the path does not exist, create a sparse regular file of this many bytes
    /// (`set_len`). When `None`, a missing path is an error.
    pub create_size: Option<u64>,
    /// Open with `O_DIRECT` (default `true`). Silently falls back to buffered I/O when the
    /// file system refuses it.
    pub direct: bool,
    /// Open for reading only, under a shared lock (an offline check: a read-only image
    /// or snapshot, which a read-write open refused; never beside a server, whose lock is
    /// exclusive). Writes fail. Never creates.
    pub read_only: bool,
}

/// Whether `path` lies under `/dev` (its parent directory resolved through links): a
/// place for device nodes, never for a backing file.
pub(crate) fn names_a_device(path: &Path) -> bool {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let parent = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
    parent.starts_with("/dev")
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            create_size: None,
            direct: true,
            read_only: false,
        }
    }
}

/// A regular file or block device driven through a thread-local io_uring.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    block_device: bool,
    created: bool,
}

impl FileDevice {
    /// Opens (or, with [`OpenOptions::create_size`], creates) the backing at `path` and
    /// claims it exclusively. See the module documentation for the contract.
    /// A file this call created is removed again when the open fails after creating it
    /// (a failed `format --size 0` left a 0-byte backing, which the next `add` called too
    /// small instead of creating it; found by review, 2026-11-27), unless another opener
    /// locked it first: then it is theirs.
    pub fn open(path: &Path, opts: &OpenOptions) -> io::Result<FileDevice> {
        let mut created = false;
        let r = Self::open_inner(path, opts, &mut created);
        if r.is_err() && created {
            let _ = std::fs::remove_file(path);
        }
        r
    }

    fn open_inner(path: &Path, opts: &OpenOptions, created: &mut bool) -> io::Result<FileDevice> {
        let with_path = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };

        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if opts.create_size.is_none() || opts.read_only {
                    return Err(with_path(e, "cannot open backing"));
                }
                if names_a_device(path) {
                    // A device node that does not exist (yet): a by-id link udev has not
                    // made, a typo. A file created there lives in devtmpfs, in RAM, and
                    // the device's data was gone at reboot (found by review, 2026-11-29).
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "backing {} does not exist; a path under /dev names a device, and \
                             a file created there would keep the data in RAM (devtmpfs): check \
                             the path, or wait for the device to appear",
                            path.display()
                        ),
                    ));
                }
                // Create without O_DIRECT (a file system refusing O_DIRECT may still create
                // the file before failing the open); the real open happens below.
                // Readable by its owner only: it holds the device's data (found by
                // review, 2026-11-27: 0644 let every local user read a 0660 device).
                // Its directory too (`--backing /var/lib/ftlblk/a.img` on a fresh machine
                // failed with "No such file or directory"; found by review, 2026-11-29).
                let parent = path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                // The directories to sync once the file is created: its own, and each one
                // created for it with the one holding it (a new file's name is durable
                // only with its directory; found by review, 2026-11-29: nothing synced
                // them, and a power cut could take the whole backing's name).
                let mut named_in = vec![parent.to_path_buf()];
                let mut d = parent;
                while !d.exists() {
                    // A relative path's top directory is named in `.`.
                    let up = d.parent().map(|p| {
                        if p.as_os_str().is_empty() {
                            Path::new(".")
                        } else {
                            p
                        }
                    });
                    match up {
                        Some(up) => {
                            named_in.push(up.to_path_buf());
                            d = up;
                        }
                        None => break,
                    }
                }
                std::fs::create_dir_all(parent)
                    .map_err(|e| with_path(e, "cannot create the directory of backing"))?;
                match std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                {
                    Ok(_) => {
                        *created = true;
                        for dir in &named_in {
                            #[cfg(test)]
                            tests::synced_dir(dir);
                            std::fs::File::open(dir)
                                .and_then(|d| d.sync_all())
                                .map_err(|e| {
                                    with_path(e, "cannot sync the directory of backing")
                                })?;
                        }
                        #[cfg(test)]
                        tests::after_create(path);
                    }
                    // Lost a race with another creator: just open what is there.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(with_path(e, "cannot create backing")),
                }
                std::fs::metadata(path).map_err(|e| with_path(e, "cannot stat backing"))?
            }
            Err(e) => return Err(with_path(e, "cannot stat backing")),
        };

        let ft = meta.file_type();
        let block_device = ft.is_block_device();
        if !block_device && !ft.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "backing {} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        }

        let open_with = |direct: bool| {
            let mut flags = libc::O_CLOEXEC;
            if direct {
                flags |= libc::O_DIRECT;
            }
            if block_device {
                flags |= libc::O_EXCL;
            }
            std::fs::OpenOptions::new()
                .read(true)
                .write(!opts.read_only)
                .custom_flags(flags)
                .open(path)
        };
        let mut direct = opts.direct;
        let file = match open_with(direct) {
            Ok(f) => f,
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                open_with(false).map_err(|e| with_path(e, "cannot open backing"))?
            }
            Err(e) if block_device && e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "block device {} is busy (mounted, or claimed by another user): {e}",
                        path.display()
                    ),
                ));
            }
            Err(e) => return Err(with_path(e, "cannot open backing")),
        };

        let locked = if opts.read_only {
            lock_shared(&file, path)
        } else {
            lock_exclusive(&file, path)
        };
        if let Err(e) = locked {
            // Another opener holds the file: it is theirs now, whoever created it. Removed,
            // a concurrent `format` that won the lock formatted a file with no name left
            // and said it succeeded (found by review, 2026-11-29). Any other lock error
            // leaves the file ours (removed as before).
            if e.kind() == io::ErrorKind::WouldBlock {
                *created = false;
            }
            return Err(e);
        }

        let raw_size = if block_device {
            block_device_size(&file).map_err(|e| with_path(e, "cannot get size of"))?
        } else {
            if *created {
                if let Some(len) = opts.create_size {
                    // Only size a file we created and nobody has written to yet.
                    let cur = file
                        .metadata()
                        .map_err(|e| with_path(e, "cannot stat backing"))?
                        .len();
                    if cur == 0 {
                        file.set_len(len)
                            .map_err(|e| with_path(e, "cannot size backing"))?;
                    }
                }
            }
            file.metadata()
                .map_err(|e| with_path(e, "cannot stat backing"))?
                .len()
        };
        let bs = BLOCK_SIZE as u64;
        let size = raw_size / bs * bs;

        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size,
            direct,
            block_device,
            created: *created,
        })
    }

    /// A second descriptor of the open backing: it holds the claim (the `flock`, a block
    /// device's exclusive open) until dropped, also once this device is gone.
    pub fn claim(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// True when this open created the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// For a sparse backing file whose file system has less free space than the file's
    /// holes: `(holes, free)` in bytes. Writes into the holes past that fail with
    /// ENOSPC, and the FTL turns read-only at the first such chunk write (freed
    /// segments are given back as holes, so a file once written whole can need the
    /// space again). `None` for a block device, a file with room for all its holes, or
    /// a file system that does not say.
    pub fn host_space_short(&self) -> Option<(u64, u64)> {
        if self.block_device {
            return None;
        }
        host_space_short(&self.file)
    }

    /// True when the backing is a block device (not a regular file).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// True when I/O bypasses the page cache (`O_DIRECT`); false after a fallback.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The path the device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads every `(offset, buffer)` pair, submitting them together on this thread's ring
    /// (in batches of the ring size) and waiting for all. Each pair obeys the same rules as
    /// [`BlockDevice::read_at`]; every range is checked before anything is submitted.
    pub fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.read_many_depth(reqs, RING_ENTRIES as usize)
    }

    /// [`FileDevice::read_many`] with at most `depth` reads in flight, the next submitted
    /// as each completes.
    pub fn read_many_depth(&self, reqs: &mut [(u64, &mut [u8])], depth: usize) -> io::Result<()> {
        for (offset, buf) in reqs.iter() {
            check_range(self.size, *offset, buf.len())?;
        }
        let fd = self.file.as_raw_fd();
        for chunk in reqs.chunks_mut(RING_ENTRIES as usize) {
            // Bounce buffers for unaligned destinations, index-matched with `chunk`.
            let mut bounces: Vec<Option<AlignedBuf>> = chunk
                .iter()
                .map(|(_, buf)| {
                    (self.direct && !buf.is_empty() && !is_aligned(buf))
                        .then(|| AlignedBuf::new(buf.len()))
                })
                .collect();
            let mut ops = Vec::with_capacity(chunk.len());
            let mut which = Vec::with_capacity(chunk.len());
            for (i, ((offset, buf), bounce)) in chunk.iter_mut().zip(bounces.iter_mut()).enumerate()
            {
                if buf.is_empty() {
                    continue;
                }
                let ptr = match bounce {
                    Some(b) => b.as_mut_ptr(),
                    None => buf.as_mut_ptr(),
                };
                ops.push(Op::new(Kind::Read, fd, ptr, buf.len(), *offset));
                which.push(i);
            }
            // The pointers in `ops` point into `chunk` or `bounces`, both alive and not
            // otherwise accessed until `run` returns.
            uring::run(&mut ops, &self.path, depth)?;
            for (op, &i) in ops.iter().zip(which.iter()) {
                if op.eof {
                    match &mut bounces[i] {
                        Some(b) => b[op.done..op.len].fill(0),
                        None => chunk[i].1[op.done..op.len].fill(0),
                    }
                }
            }
            for ((_, buf), bounce) in chunk.iter_mut().zip(bounces.iter()) {
                if let Some(b) = bounce {
                    buf.copy_from_slice(&b[..buf.len()]);
                }
            }
        }
        Ok(())
    }

    /// Writes every `(offset, buffer)` pair, submitting them together on this thread's
    /// ring (in batches of the ring size) and waiting for all; no order among them. Each
    /// pair obeys the rules of [`BlockDevice::write_at`]; every range is checked before
    /// anything is submitted.
    pub fn write_many(&self, reqs: &[(u64, &[u8])]) -> io::Result<()> {
        for (offset, buf) in reqs {
            check_range(self.size, *offset, buf.len())?;
        }
        let fd = self.file.as_raw_fd();
        for chunk in reqs.chunks(RING_ENTRIES as usize) {
            // Bounce buffers for unaligned sources.
            let bounces: Vec<Option<AlignedBuf>> = chunk
                .iter()
                .map(|(_, buf)| {
                    (self.direct && !buf.is_empty() && !is_aligned(buf)).then(|| {
                        let mut b = AlignedBuf::new(buf.len());
                        b[..buf.len()].copy_from_slice(buf);
                        b
                    })
                })
                .collect();
            // The kernel only reads through these pointers (Write opcode); `chunk` and
            // `bounces` are borrowed until `run` returns, which outlives the I/O.
            let mut ops: Vec<Op> = chunk
                .iter()
                .zip(bounces.iter())
                .filter(|((_, buf), _)| !buf.is_empty())
                .map(|((offset, buf), bounce)| {
                    let ptr = match bounce {
                        Some(b) => b.as_ptr(),
                        None => buf.as_ptr(),
                    };
                    Op::new(Kind::Write, fd, ptr as *mut u8, buf.len(), *offset)
                })
                .collect();
            self.run(&mut ops)?;
        }
        Ok(())
    }

    /// Runs `ops` on this thread's ring.
    fn run(&self, ops: &mut [Op]) -> io::Result<()> {
        uring::run(ops, &self.path, usize::MAX)
    }

    /// Reads into `dst`, which must be suitable for the open mode (aligned under O_DIRECT).
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        let mut ops = [Op::new(Kind::Read, fd, dst.as_mut_ptr(), dst.len(), offset)];
        // `dst` is exclusively borrowed for the whole call, which outlives the I/O.
        self.run(&mut ops)?;
        let [op] = &ops;
        if op.eof {
            dst[op.done..].fill(0);
        }
        Ok(())
    }

    /// Writes `src`, which must be suitable for the open mode (aligned under O_DIRECT).
    fn write_from(&self, offset: u64, src: &[u8]) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        // The kernel only reads through this pointer (Write opcode); `src` is borrowed
        // for the whole call, which outlives the I/O.
        let mut ops = [Op::new(
            Kind::Write,
            fd,
            src.as_ptr() as *mut u8,
            src.len(),
            offset,
        )];
        self.run(&mut ops)
    }
}

impl BlockDevice for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct && !is_aligned(buf) {
            let mut bounce = AlignedBuf::new(buf.len());
            self.read_into(offset, &mut bounce[..buf.len()])?;
            buf.copy_from_slice(&bounce[..buf.len()]);
            Ok(())
        } else {
            self.read_into(offset, buf)
        }
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct && !is_aligned(buf) {
            let mut bounce = AlignedBuf::new(buf.len());
            bounce[..buf.len()].copy_from_slice(buf);
            self.write_from(offset, &bounce[..buf.len()])
        } else {
            self.write_from(offset, buf)
        }
    }

    fn sync(&self) -> io::Result<()> {
        let mut ops = [Op::new(
            Kind::Fsync,
            self.file.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            0,
        )];
        self.run(&mut ops)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let len_usize = usize::try_from(len).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("discard length {len} too large"),
            )
        })?;
        check_range(self.size, offset, len_usize)?;
        if len == 0 {
            return Ok(());
        }
        let ret = sys::discard(self.file.as_raw_fd(), self.block_device, offset, len);
        if ret == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            // Discard is advisory, but not done: say so (callers count only discards
            // that happened), e.g. a file on 9p, which cannot punch holes.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} cannot discard (punch holes)", self.path.display()),
            ));
        }
        Err(annotate("discard", offset, len_usize, &self.path, e))
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn describe(&self) -> String {
        let kind = if self.block_device {
            "block device"
        } else {
            "file"
        };
        format!("{kind} {} ({} bytes)", self.path.display(), self.size)
    }

    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        FileDevice::read_many(self, reqs)
    }

    fn read_many_depth(&self, reqs: &mut [(u64, &mut [u8])], depth: usize) -> io::Result<()> {
        FileDevice::read_many_depth(self, reqs, depth)
    }

    fn write_many(&self, reqs: &[(u64, &[u8])]) -> io::Result<()> {
        FileDevice::write_many(self, reqs)
    }
}
