//! The per-thread io_uring runner of the file device: every data-path request of a call
//! is submitted and waited for before the call returns (short transfers resubmitted,
//! `EINTR`/`EAGAIN` retried), and failures are annotated with the operation, offset and
//! path. Called by `file/mod.rs` only.

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::path::Path;

/// Entries of each thread's ring; also the batch size of [`FileDevice::read_many`].
pub(super) const RING_ENTRIES: u32 = 64;

/// Largest transfer put in one SQE (the kernel caps a single read/write near 2 GiB anyway;
/// anything left over is resubmitted like a short transfer).
const MAX_CHUNK: usize = 1 << 30;

/// How many times one request is resubmitted after `EINTR`/`EAGAIN` before giving up.
const MAX_RETRIES: u32 = 1000;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// The most ops this thread's ring had in flight at once (tests of the depth cap).
    pub(super) static MOST_IN_FLIGHT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `ops` on this thread's ring (created on first use), at most `depth` in flight
/// at once.
pub(super) fn run(ops: &mut [Op], path: &Path, depth: usize) -> io::Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let result = RING.try_with(|cell| {
        let mut slot = cell.try_borrow_mut().map_err(|_| {
            io::Error::other("thread-local io_uring is already in use (re-entrant call)")
        })?;
        if slot.is_none() {
            let ring = IoUring::new(RING_ENTRIES)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot create io_uring: {e}")))?;
            *slot = Some(ring);
        }
        let ring = match slot.as_mut() {
            Some(r) => r,
            None => return Err(io::Error::other("thread-local io_uring missing")),
        };
        match run_ops(ring, ops, path, depth) {
            Ok(()) => Ok(()),
            Err(RunError::Io(e)) => Err(e),
            Err(RunError::RingBroken(e)) => {
                // Nothing of ours is in the kernel, but unsubmitted SQEs may remain in
                // the queue: throw the ring away so they are never submitted.
                *slot = None;
                Err(e)
            }
        }
    });
    match result {
        Ok(r) => r,
        Err(_) => Err(io::Error::other(
            "thread-local io_uring unavailable (thread is exiting)",
        )),
    }
}

/// An I/O error annotated with the operation, offset and path; the OS error is its source.
#[derive(Debug)]
struct OpError {
    what: String,
    source: io::Error,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for OpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

pub(super) fn annotate(
    op: &str,
    offset: u64,
    len: usize,
    path: &Path,
    source: io::Error,
) -> io::Error {
    io::Error::new(
        source.kind(),
        OpError {
            what: format!(
                "{op} of {len} bytes at offset {offset} on {}",
                path.display()
            ),
            source,
        },
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Read,
    Write,
    Fsync,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Fsync => "fdatasync",
        }
    }
}

/// One request: `len` bytes between memory at `ptr` and the file at `offset`.
pub(super) struct Op {
    kind: Kind,
    fd: RawFd,
    ptr: *mut u8,
    pub(super) len: usize,
    offset: u64,
    /// Bytes transferred so far.
    pub(super) done: usize,
    retries: u32,
    /// A read hit end-of-file at `done`; the caller zero-fills `done..len`.
    pub(super) eof: bool,
}

impl Op {
    pub(super) fn new(kind: Kind, fd: RawFd, ptr: *mut u8, len: usize, offset: u64) -> Op {
        Op {
            kind,
            fd,
            ptr,
            len,
            offset,
            done: 0,
            retries: 0,
            eof: false,
        }
    }

    /// The SQE for the part not yet transferred.
    fn entry(&self, user_data: u64) -> io_uring::squeue::Entry {
        let fd = types::Fd(self.fd);
        let rest = (self.len - self.done).min(MAX_CHUNK) as u32;
        let off = self.offset + self.done as u64;
        // wrapping_add: pointer arithmetic without `unsafe`; `done <= len` keeps it in bounds.
        let ptr = self.ptr.wrapping_add(self.done);
        match self.kind {
            Kind::Read => opcode::Read::new(fd, ptr, rest).offset(off).build(),
            Kind::Write => opcode::Write::new(fd, ptr as *const u8, rest)
                .offset(off)
                .build(),
            Kind::Fsync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        }
        .user_data(user_data)
    }

    fn fail(&self, path: &Path, e: io::Error) -> io::Error {
        annotate(
            self.kind.name(),
            self.offset + self.done as u64,
            self.len - self.done,
            path,
            e,
        )
    }
}

enum RunError {
    /// An operation failed; the ring is intact and empty.
    Io(io::Error),
    /// io_uring_enter failed for good; no request is in the kernel but the ring must not be
    /// reused.
    RingBroken(io::Error),
}

/// Submits every op (keeping at most a ring's worth, and at most `depth`, in flight: the
/// next as each completes), resubmits short transfers
/// and waits until nothing is in flight. On the first failure no new op is started, the
/// ones in flight are drained, and that failure is returned.
///
/// The memory behind each `Op::ptr` must stay valid (and, for reads, unaliased) until this
/// returns; this function never returns while the kernel may still access it (if the ring
/// breaks with requests in flight it aborts the process rather than release them).
fn run_ops(ring: &mut IoUring, ops: &mut [Op], path: &Path, depth: usize) -> Result<(), RunError> {
    let cap = (ring.params().sq_entries() as usize).min(depth.max(1));
    let mut next = 0usize;
    let mut resubmit: Vec<usize> = Vec::new();
    let mut in_flight = 0usize;
    let mut first_err: Option<io::Error> = None;

    loop {
        // Fill the submission queue.
        while in_flight < cap {
            let idx = if let Some(i) = resubmit.pop() {
                i
            } else if first_err.is_none() && next < ops.len() {
                next += 1;
                next - 1
            } else {
                break;
            };
            let entry = ops[idx].entry(idx as u64);
            // SAFETY: the entry's buffer pointer and length describe memory the caller
            // keeps valid until `run_ops` returns, and we do not return before every
            // pushed entry has completed (or abort).
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_err() {
                resubmit.push(idx);
                break;
            }
            in_flight += 1;
            #[cfg(test)]
            MOST_IN_FLIGHT.with(|m| m.set(m.get().max(in_flight)));
        }
        if in_flight == 0 {
            break;
        }

        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) =>
            {
                if e.raw_os_error() != Some(libc::EINTR) {
                    std::thread::yield_now();
                }
            }
            Err(e) => {
                let unsubmitted = ring.submission().len();
                if in_flight > unsubmitted {
                    // The kernel may still read or write caller memory; returning would let
                    // it be freed underneath. There is no safe way to continue.
                    eprintln!(
                        "ftl FileDevice: io_uring_enter failed ({e}) with {} requests in \
                         flight on {}; aborting",
                        in_flight - unsubmitted,
                        path.display()
                    );
                    std::process::abort();
                }
                return Err(RunError::RingBroken(io::Error::new(
                    e.kind(),
                    format!("io_uring_enter failed on {}: {e}", path.display()),
                )));
            }
        }

        for cqe in ring.completion() {
            let Ok(idx) = usize::try_from(cqe.user_data()) else {
                continue;
            };
            let Some(op) = ops.get_mut(idx) else {
                continue;
            };
            in_flight -= 1;
            let res = cqe.result();
            if res < 0 {
                let errno = -res;
                if (errno == libc::EINTR || errno == libc::EAGAIN) && op.retries < MAX_RETRIES {
                    op.retries += 1;
                    if first_err.is_none() {
                        resubmit.push(idx);
                    }
                } else if first_err.is_none() {
                    first_err = Some(op.fail(path, io::Error::from_raw_os_error(errno)));
                }
                continue;
            }
            if op.kind == Kind::Fsync {
                continue;
            }
            let n = res as usize;
            if n == 0 {
                match op.kind {
                    Kind::Read => {
                        // End of file: the owner of the buffer zero-fills the rest.
                        op.eof = true;
                    }
                    _ => {
                        if first_err.is_none() {
                            first_err = Some(op.fail(
                                path,
                                io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes"),
                            ));
                        }
                    }
                }
                continue;
            }
            op.done = (op.done + n).min(op.len);
            if op.done < op.len && first_err.is_none() {
                resubmit.push(idx);
            }
        }
    }

    match first_err {
        Some(e) => Err(RunError::Io(e)),
        None => Ok(()),
    }
}
