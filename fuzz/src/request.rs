//! The `request` target: the ublk edge's request decoding ([`ftl::request::decode`]).
//!
//! Input: 28 little-endian bytes (shorter inputs are zero-padded): `op_flags` u32,
//! `start_sector` u64, `nr_sectors` u32, `capacity_blocks` u64, `buf_bytes` u32.
//!
//! Properties, checked against an independent oracle computed in u128:
//! - decoding never panics;
//! - FLUSH (low byte 2) always decodes to `Flush`;
//! - a READ/WRITE/DISCARD/WRITE_ZEROES decodes exactly when it is block aligned, inside
//!   the device and (READ/WRITE) fits the buffer; the decoded range is the request's
//!   range in blocks and a WRITE keeps its FUA flag;
//! - every error completes with -EINVAL or -EOPNOTSUPP (-EOPNOTSUPP exactly for an
//!   unknown operation).

use ftl::request::{
    decode, Request, F_FUA, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE, OP_WRITE_ZEROES,
};

/// The decoded fields of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    pub op_flags: u32,
    pub start_sector: u64,
    pub nr_sectors: u32,
    pub capacity_blocks: u64,
    pub buf_bytes: u32,
}

/// Input bytes of a request (the inverse of [`parse`]).
pub fn encode(i: &Input) -> Vec<u8> {
    let mut v = Vec::with_capacity(28);
    v.extend_from_slice(&i.op_flags.to_le_bytes());
    v.extend_from_slice(&i.start_sector.to_le_bytes());
    v.extend_from_slice(&i.nr_sectors.to_le_bytes());
    v.extend_from_slice(&i.capacity_blocks.to_le_bytes());
    v.extend_from_slice(&i.buf_bytes.to_le_bytes());
    v
}

/// Reads an input from fuzzer bytes.
pub fn parse(data: &[u8]) -> Input {
    let mut b = [0u8; 28];
    let n = data.len().min(28);
    b[..n].copy_from_slice(&data[..n]);
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_at = |at: usize| u64::from(u32_at(at)) | u64::from(u32_at(at + 4)) << 32;
    Input {
        op_flags: u32_at(0),
        start_sector: u64_at(4),
        nr_sectors: u32_at(12),
        capacity_blocks: u64_at(16),
        buf_bytes: u32_at(24),
    }
}

/// Checks one input; the violated property on failure.
pub fn run(i: &Input) -> Result<(), String> {
    let got = decode(
        i.op_flags,
        i.start_sector,
        i.nr_sectors,
        i.capacity_blocks,
        i.buf_bytes as usize,
    );
    let op = i.op_flags & 0xff;
    let known = matches!(
        op,
        OP_READ | OP_WRITE | OP_FLUSH | OP_DISCARD | OP_WRITE_ZEROES
    );
    let (start, nr) = (i.start_sector as u128, i.nr_sectors as u128);
    let aligned = start % 8 == 0 && nr % 8 == 0;
    let in_range = (start + nr) / 8 <= i.capacity_blocks as u128;
    let fits = nr * 512 <= i.buf_bytes as u128;
    let payload = matches!(op, OP_READ | OP_WRITE);
    let expect_ok = op == OP_FLUSH || (known && aligned && in_range && (fits || !payload));
    match got {
        Ok(req) => {
            if !expect_ok {
                return Err(format!("{i:?} decoded to {req:?} but must be rejected"));
            }
            let (lba, blocks) = ((start / 8) as u64, (nr / 8) as u64);
            let want = match op {
                OP_FLUSH => Request::Flush,
                OP_READ => Request::Read { lba, blocks },
                OP_WRITE => Request::Write {
                    lba,
                    blocks,
                    fua: i.op_flags & F_FUA != 0,
                },
                _ => Request::Trim {
                    lba,
                    blocks,
                    fua: i.op_flags & F_FUA != 0,
                },
            };
            if req != want {
                return Err(format!("{i:?} decoded to {req:?}, expected {want:?}"));
            }
            if req.payload_bytes() > i.buf_bytes as usize {
                return Err(format!("{req:?} overruns the {}-byte buffer", i.buf_bytes));
            }
        }
        Err(e) => {
            if expect_ok {
                return Err(format!("{i:?} rejected ({e}) but is valid"));
            }
            let want = if known {
                -libc::EINVAL
            } else {
                -libc::EOPNOTSUPP
            };
            if e.errno() != want {
                return Err(format!(
                    "{i:?}: errno {} for {e}, expected {want}",
                    e.errno()
                ));
            }
        }
    }
    Ok(())
}

/// The fuzz entry point: panics on a violated property.
pub fn fuzz(data: &[u8]) {
    if let Err(e) = run(&parse(data)) {
        panic!("request decoding: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_oracle_agree_on_edges() {
        let i = Input {
            op_flags: OP_WRITE | F_FUA,
            start_sector: 8,
            nr_sectors: 16,
            capacity_blocks: 3,
            buf_bytes: 8192,
        };
        assert_eq!(parse(&encode(&i)), i);
        run(&i).unwrap();
        // One block past the end, one byte short of the buffer, overflowing sectors.
        run(&Input {
            capacity_blocks: 2,
            ..i
        })
        .unwrap();
        run(&Input {
            buf_bytes: 8191,
            ..i
        })
        .unwrap();
        run(&Input {
            start_sector: u64::MAX - 7,
            ..i
        })
        .unwrap();
        run(&Input { op_flags: 9, ..i }).unwrap();
        assert_eq!(parse(&[]).op_flags, 0);
    }
}
