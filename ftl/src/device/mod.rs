//! Backing devices: the I/O boundary below the FTL.
//!
//! Contract of every [`BlockDevice`]:
//! - offsets and lengths are multiples of [`BLOCK_SIZE`]; a 4 KiB block write is atomic
//!   (it lands whole or not at all after a power cut);
//! - a completed `write_at` is visible to every later `read_at`, but is only *durable*
//!   after a later `sync` completes;
//! - `discard` tells the device a range holds no live data; reads of it afterwards may
//!   return zeros or the old bytes (callers never read discarded ranges). A discard that
//!   has completed is ordered before every write issued after it (a write into the range
//!   is never undone by it, before or after a power cut); the FTL relies on this when it
//!   reuses a discarded segment without a sync in between.
//!
//! Implementations: [`file::FileDevice`] (file or block device, O_DIRECT, io_uring),
//! [`mem::MemDevice`] (fast, volatile) and [`crash::CrashDevice`] (keeps the durable image
//! apart from unsynced writes and simulates a power cut); [`gate::GateDevice`] holds
//! operations on command, for tests of thread interleavings.

pub mod aligned;
pub mod crash;
pub mod file;
pub mod gate;
pub mod mem;
pub mod overlay;
pub mod sparse;

use std::io;
use std::os::fd::RawFd;

pub use aligned::{AlignedBuf, ScratchBuf};

/// Size of a logical and physical block, in bytes.
pub const BLOCK_SIZE: usize = 4096;

/// The storage the log lives on.
pub trait BlockDevice: Send + Sync {
    /// Capacity in bytes.
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset`; durable only after [`BlockDevice::sync`].
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Where a sync issued now ends: [`BlockDevice::sync_upto`] with it makes durable the
    /// writes that completed before this call, not those that complete while the sync is
    /// on its way (a real fsync promises no more). For a wrapper that delays its syncs (a
    /// test's gate): it takes the mark on entry, then the delay, then `sync_upto`. A
    /// device that does not model durability has no marks (`sync_upto` is `sync`); the
    /// crash-simulating one (`crash::CrashDevice`) does.
    fn sync_mark(&self) -> io::Result<u64> {
        Ok(0)
    }
    /// The second half of a sync begun at `mark` ([`BlockDevice::sync_mark`]).
    fn sync_upto(&self, _mark: u64) -> io::Result<()> {
        self.sync()
    }
    /// Declares `len` bytes at `offset` dead (TRIM / hole punch).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// A file descriptor a caller may use for its own io_uring submissions
    /// (O_DIRECT: 4 KiB-aligned buffers), when the device is backed by one.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    /// Human-readable description for error messages.
    fn describe(&self) -> String;
    /// Reads several ranges; implementations may issue them concurrently.
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, buf) in reqs.iter_mut() {
            self.read_at(*offset, buf)?;
        }
        Ok(())
    }
    /// [`BlockDevice::read_many`] with at most `depth` reads in flight at once, the next
    /// issued as each completes: a reader that must not crowd out others at the device
    /// (the cleaner's victim reads). Implementations without a queue read as
    /// `read_many` does.
    fn read_many_depth(&self, reqs: &mut [(u64, &mut [u8])], depth: usize) -> io::Result<()> {
        let _ = depth;
        self.read_many(reqs)
    }
    /// Writes several ranges (durable only after [`BlockDevice::sync`]); implementations
    /// may issue them concurrently, so no order among them is promised. On an error some
    /// may have been written.
    fn write_many(&self, reqs: &[(u64, &[u8])]) -> io::Result<()> {
        for (offset, buf) in reqs {
            self.write_at(*offset, buf)?;
        }
        Ok(())
    }
}

/// Checks the alignment rules shared by every implementation.
pub(crate) fn check_range(dev_size: u64, offset: u64, len: usize) -> io::Result<()> {
    let bs = BLOCK_SIZE as u64;
    if !offset.is_multiple_of(bs) || !(len as u64).is_multiple_of(bs) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned device access: offset {offset} len {len}"),
        ));
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= dev_size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("device access past the end: offset {offset} len {len} size {dev_size}"),
        )),
    }
}

/// Forwards every method (lets the checker and tests borrow a device).
macro_rules! forward_block_device {
    ($t:ty) => {
        impl<T: BlockDevice + ?Sized> BlockDevice for $t {
            fn size(&self) -> u64 {
                (**self).size()
            }
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
                (**self).read_at(offset, buf)
            }
            fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
                (**self).write_at(offset, buf)
            }
            fn sync(&self) -> io::Result<()> {
                (**self).sync()
            }
            fn sync_mark(&self) -> io::Result<u64> {
                (**self).sync_mark()
            }
            fn sync_upto(&self, mark: u64) -> io::Result<()> {
                (**self).sync_upto(mark)
            }
            fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
                (**self).discard(offset, len)
            }
            fn raw_fd(&self) -> Option<RawFd> {
                (**self).raw_fd()
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
            fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> io::Result<()> {
                (**self).read_many(reqs)
            }
            fn read_many_depth(
                &self,
                reqs: &mut [(u64, &mut [u8])],
                depth: usize,
            ) -> io::Result<()> {
                (**self).read_many_depth(reqs, depth)
            }
            fn write_many(&self, reqs: &[(u64, &[u8])]) -> io::Result<()> {
                (**self).write_many(reqs)
            }
        }
    };
}

forward_block_device!(std::sync::Arc<T>);
forward_block_device!(&T);
