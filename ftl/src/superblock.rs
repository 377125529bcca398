//! The superblock: identity and geometry of a formatted backing. Two copies live in
//! segment 0 (first and last block); they are written only by `format`.
//!
//! Byte layout (4096 bytes, little-endian):
//!
//! ```text
//! offset size field
//!      0    8 magic            b"FTLBLKSB"
//!      8    4 version          1
//!     12    4 flags            0 (reserved)
//!     16   16 uuid             random, identifies this format; the index records it too
//!     32    4 block_size       4096
//!     36    4 flash_page_bytes block-patching unit
//!     40    8 segment_bytes    power of two
//!     48    4 segment_count    including metadata segment 0
//!     52    4 op_permille      over-provisioning, per mille of backing_bytes
//!     56    8 backing_bytes    bytes of backing in use (segment_count * segment_bytes)
//!     64    8 exported_blocks  capacity shown to the user, in blocks
//!     72    8 created_secs     unix time of format
//!     80 4012 zero             reserved
//!   4092    4 crc32c           of bytes 0..4092
//! ```

use crate::codec::{check_trailing_crc, Reader, Writer};
use crate::device::BLOCK_SIZE;
use crate::error::Error;
use crate::geometry::Geometry;

/// Superblock magic.
pub const SB_MAGIC: &[u8; 8] = b"FTLBLKSB";
/// Superblock format version this build writes and reads.
pub const SB_VERSION: u32 = 1;

/// Decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub geometry: Geometry,
    pub created_secs: u64,
}

/// Why a superblock copy failed to decode.
#[derive(Debug)]
pub enum SbDecode {
    /// No magic: never formatted (or overwritten).
    NoMagic,
    /// Structurally bad: checksum or field check failed.
    Corrupt(String),
    /// Valid structure of a version this build does not know.
    Version(u32),
}

impl Superblock {
    /// First 8 bytes of the uuid: stamped into every chunk summary, so chunks of an
    /// earlier format of the same backing are never taken for this one's.
    pub fn format_id(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.uuid[..8]);
        u64::from_le_bytes(b)
    }

    /// Encodes into one block.
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut w = Writer::with_capacity(BLOCK_SIZE);
        w.bytes(SB_MAGIC)
            .u32(SB_VERSION)
            .u32(0)
            .bytes(&self.uuid)
            .u32(BLOCK_SIZE as u32)
            .u32(g.flash_page_bytes)
            .u64(g.segment_bytes)
            .u32(g.segment_count)
            .u32(g.op_permille)
            .u64(g.backing_bytes)
            .u64(g.exported_blocks)
            .u64(self.created_secs)
            .pad_to(BLOCK_SIZE - 4)
            .crc();
        w.buf
    }

    /// Decodes one block; never panics.
    pub fn decode(buf: &[u8]) -> std::result::Result<Superblock, SbDecode> {
        if buf.len() != BLOCK_SIZE {
            return Err(SbDecode::Corrupt(format!(
                "superblock is {} bytes, not {BLOCK_SIZE}",
                buf.len()
            )));
        }
        if &buf[..8] != SB_MAGIC {
            return Err(SbDecode::NoMagic);
        }
        check_trailing_crc(buf, "superblock").map_err(|e| SbDecode::Corrupt(e.to_string()))?;
        let c = |e: Error| SbDecode::Corrupt(e.to_string());
        let mut r = Reader::new(buf, "superblock");
        r.skip(8).map_err(c)?;
        let version = r.u32().map_err(c)?;
        if version != SB_VERSION {
            return Err(SbDecode::Version(version));
        }
        let _flags = r.u32().map_err(c)?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.bytes(16).map_err(c)?);
        let block_size = r.u32().map_err(c)?;
        let flash_page_bytes = r.u32().map_err(c)?;
        let segment_bytes = r.u64().map_err(c)?;
        let segment_count = r.u32().map_err(c)?;
        let op_permille = r.u32().map_err(c)?;
        let backing_bytes = r.u64().map_err(c)?;
        let exported_blocks = r.u64().map_err(c)?;
        let created_secs = r.u64().map_err(c)?;
        let geometry = Geometry {
            backing_bytes,
            segment_bytes,
            segment_count,
            flash_page_bytes,
            op_permille,
            exported_blocks,
        };
        let sane = block_size as usize == BLOCK_SIZE
            && segment_bytes.is_power_of_two()
            && (crate::geometry::MIN_SEGMENT_BYTES..=crate::geometry::MAX_SEGMENT_BYTES)
                .contains(&segment_bytes)
            && flash_page_bytes.is_power_of_two()
            && flash_page_bytes as usize >= BLOCK_SIZE
            && (flash_page_bytes as u64) * 4 <= segment_bytes
            && segment_count as u64 >= crate::geometry::MIN_SEGMENTS
            && Some(backing_bytes) == (segment_count as u64).checked_mul(segment_bytes)
            && exported_blocks > 0
            && exported_blocks < backing_bytes / BLOCK_SIZE as u64;
        if !sane {
            return Err(SbDecode::Corrupt(format!(
                "superblock geometry is inconsistent: {geometry:?}"
            )));
        }
        Ok(Superblock {
            uuid,
            geometry,
            created_secs,
        })
    }

    /// Uuid as the usual hex string.
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.uuid)
    }
}

/// Formats 16 bytes as 8-4-4-4-12 hex.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::FormatOptions;

    fn sample() -> Superblock {
        let geometry = Geometry::resolve(1 << 30, &FormatOptions::default()).unwrap();
        Superblock {
            uuid: [7; 16],
            geometry,
            created_secs: 42,
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(b.len(), BLOCK_SIZE);
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
    }

    #[test]
    fn each_failure_is_named() {
        let b = sample().encode();
        assert!(matches!(
            Superblock::decode(&vec![0; BLOCK_SIZE]),
            Err(SbDecode::NoMagic)
        ));
        let mut flip = b.clone();
        flip[100] ^= 0xff;
        assert!(matches!(
            Superblock::decode(&flip),
            Err(SbDecode::Corrupt(_))
        ));
        let mut v2 = b.clone();
        v2[8] = 2;
        let crc = crc32c::crc32c(&v2[..BLOCK_SIZE - 4]);
        v2[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(Superblock::decode(&v2), Err(SbDecode::Version(2))));
        assert!(matches!(
            Superblock::decode(&b[..100]),
            Err(SbDecode::Corrupt(_))
        ));
    }
}
