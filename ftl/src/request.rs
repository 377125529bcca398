//! Decoding of block requests as the ublk driver describes them (`struct ublksrv_io_desc`:
//! operation + flags, start sector, sector count) into FTL operations.
//!
//! Contract of [`decode`] (a pure function; the `request` fuzz target checks it):
//! - FLUSH decodes to [`Request::Flush`] whatever its sector fields say.
//! - READ, WRITE (FUA flag kept), DISCARD and WRITE_ZEROES (both unmap: the range reads
//!   back as zeros) must start and end on a 4 KiB block boundary
//!   ([`Error::Unaligned`]), lie inside the device ([`Error::OutOfRange`], overflow
//!   included) and, for READ and WRITE, fit the request buffer ([`Error::BadRequest`]).
//! - Zero-length READ/WRITE/DISCARD decode (as no-ops for the caller to complete).
//! - Any other operation is [`Error::Unsupported`].
//! - It never panics; [`Error::errno`] turns every error into the completion's errno
//!   (-EINVAL, -EOPNOTSUPP).
//!
//! The operation codes are the kernel's uapi (`include/uapi/linux/ublk_cmd.h`); the
//! server's tests assert they equal libublk's generated bindings.
//!
//! Owns the decoding of ublk descriptors into requests; no I/O. Called by the ublk edge of
//! the binary and fuzzing.

use crate::device::BLOCK_SIZE;
use crate::error::{Error, Result};

/// `UBLK_IO_OP_READ`.
pub const OP_READ: u32 = 0;
/// `UBLK_IO_OP_WRITE`.
pub const OP_WRITE: u32 = 1;
/// `UBLK_IO_OP_FLUSH`.
pub const OP_FLUSH: u32 = 2;
/// `UBLK_IO_OP_DISCARD`.
pub const OP_DISCARD: u32 = 3;
/// `UBLK_IO_OP_WRITE_ZEROES`.
pub const OP_WRITE_ZEROES: u32 = 5;
/// `UBLK_IO_F_FUA`: the write must be durable when it completes.
pub const F_FUA: u32 = 1 << 13;

/// The kernel counts in 512-byte sectors.
pub const SECTOR_SHIFT: u32 = 9;
/// Sectors per FTL block.
pub const SECTORS_PER_BLOCK: u64 = (BLOCK_SIZE >> SECTOR_SHIFT) as u64;

/// One decoded block request, in FTL blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Read {
        lba: u64,
        blocks: u64,
    },
    Write {
        lba: u64,
        blocks: u64,
        fua: bool,
    },
    Flush,
    /// DISCARD or WRITE_ZEROES: unmap the range; with `fua`, durable when it completes
    /// (the block layer passes FUA on any request with sectors; found by review,
    /// 2026-11-29: it was dropped).
    Trim {
        lba: u64,
        blocks: u64,
        fua: bool,
    },
}

impl Request {
    /// Bytes of the request buffer the request uses (READ/WRITE payload, else 0).
    pub fn payload_bytes(&self) -> usize {
        match *self {
            Request::Read { blocks, .. } | Request::Write { blocks, .. } => {
                blocks as usize * BLOCK_SIZE
            }
            Request::Flush | Request::Trim { .. } => 0,
        }
    }
}

/// Decodes one request for a device of `capacity_blocks` with a `buf_bytes` request buffer.
pub fn decode(
    op_flags: u32,
    start_sector: u64,
    nr_sectors: u32,
    capacity_blocks: u64,
    buf_bytes: usize,
) -> Result<Request> {
    let op = op_flags & 0xff;
    if op == OP_FLUSH {
        return Ok(Request::Flush);
    }
    if !matches!(op, OP_READ | OP_WRITE | OP_DISCARD | OP_WRITE_ZEROES) {
        return Err(Error::Unsupported(format!("operation {op}")));
    }
    let nr = nr_sectors as u64;
    if !start_sector.is_multiple_of(SECTORS_PER_BLOCK) || !nr.is_multiple_of(SECTORS_PER_BLOCK) {
        return Err(Error::Unaligned(format!(
            "sectors {start_sector} + {nr} are not whole {BLOCK_SIZE}-byte blocks"
        )));
    }
    let lba = start_sector / SECTORS_PER_BLOCK;
    let blocks = nr / SECTORS_PER_BLOCK;
    match lba.checked_add(blocks) {
        Some(end) if end <= capacity_blocks => {}
        end => {
            return Err(Error::OutOfRange {
                lba,
                end: end.unwrap_or(u64::MAX),
                capacity: capacity_blocks,
            })
        }
    }
    let fits = blocks
        .checked_mul(BLOCK_SIZE as u64)
        .is_some_and(|b| b <= buf_bytes as u64);
    Ok(match op {
        OP_READ | OP_WRITE if !fits => {
            return Err(Error::BadRequest(format!(
                "{blocks} blocks do not fit the {buf_bytes}-byte request buffer"
            )))
        }
        OP_READ => Request::Read { lba, blocks },
        OP_WRITE => Request::Write {
            lba,
            blocks,
            fua: op_flags & F_FUA != 0,
        },
        _ => Request::Trim {
            lba,
            blocks,
            fua: op_flags & F_FUA != 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 1000;
    const BUF: usize = 512 << 10;

    #[test]
    fn decodes_reads_writes_flush_and_unmaps() {
        assert_eq!(
            decode(OP_READ, 8, 16, CAP, BUF).ok(),
            Some(Request::Read { lba: 1, blocks: 2 })
        );
        assert_eq!(
            decode(OP_WRITE | F_FUA, 0, 8, CAP, BUF).ok(),
            Some(Request::Write {
                lba: 0,
                blocks: 1,
                fua: true
            })
        );
        assert_eq!(
            decode(OP_WRITE, 0, 8, CAP, BUF).ok(),
            Some(Request::Write {
                lba: 0,
                blocks: 1,
                fua: false
            })
        );
        assert_eq!(decode(OP_FLUSH, 3, 1, CAP, BUF).ok(), Some(Request::Flush));
        assert_eq!(
            decode(OP_DISCARD, 80, 800, CAP, BUF).ok(),
            Some(Request::Trim {
                lba: 10,
                blocks: 100,
                fua: false
            })
        );
        assert_eq!(
            decode(OP_WRITE_ZEROES | F_FUA, 0, 8, CAP, BUF).ok(),
            Some(Request::Trim {
                lba: 0,
                blocks: 1,
                fua: true
            })
        );
        // An unmap is not limited by the buffer.
        assert_eq!(
            decode(OP_WRITE_ZEROES, 0, 8 * 1000, CAP, BUF).ok(),
            Some(Request::Trim {
                lba: 0,
                blocks: 1000,
                fua: false
            })
        );
    }

    #[test]
    fn rejects_bad_requests_with_the_right_errno() {
        let errno = |r: Result<Request>| r.map_err(|e| e.errno()).err();
        let einval = Some(-libc::EINVAL);
        assert_eq!(errno(decode(OP_READ, 8 * 999, 16, CAP, BUF)), einval);
        assert_eq!(errno(decode(OP_DISCARD, u64::MAX - 7, 8, CAP, BUF)), einval);
        assert_eq!(errno(decode(OP_WRITE, 1, 8, CAP, BUF)), einval);
        assert_eq!(errno(decode(OP_WRITE, 0, 9, CAP, BUF)), einval);
        assert_eq!(
            errno(decode(OP_READ, 0, 8 * 200, CAP, BUF)),
            einval,
            "200 blocks do not fit a 512 KiB buffer"
        );
        assert_eq!(errno(decode(10, 0, 8, CAP, BUF)), Some(-libc::EOPNOTSUPP));
        assert_eq!(errno(decode(4, 0, 8, CAP, BUF)), Some(-libc::EOPNOTSUPP));
    }
}
