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
//!
//! Owns this encoding only. Called by `lifecycle` (format, open) and the tools (`info`,
//! `check`).

use crate::codec::{check_trailing_crc, Reader, Writer};
use crate::device::BLOCK_SIZE;
use crate::error::Error;
use crate::geometry::Geometry;

/// Byte offsets of the superblock's fields (the table above).
pub mod offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const FLAGS: usize = 12;
    pub const UUID: usize = 16;
    pub const BLOCK_SIZE: usize = 32;
    pub const FLASH_PAGE_BYTES: usize = 36;
    pub const SEGMENT_BYTES: usize = 40;
    pub const SEGMENT_COUNT: usize = 48;
    pub const OP_PERMILLE: usize = 52;
    pub const BACKING_BYTES: usize = 56;
    pub const EXPORTED_BLOCKS: usize = 64;
    pub const CREATED_SECS: usize = 72;
    pub const CRC: usize = 4092;
}
use offsets as o;

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
    /// Valid structure with reserved flags set: a newer build's feature.
    Flags(u32),
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
        w.at(o::MAGIC)
            .bytes(SB_MAGIC)
            .at(o::VERSION)
            .u32(SB_VERSION)
            .at(o::FLAGS)
            .u32(0)
            .at(o::UUID)
            .bytes(&self.uuid)
            .at(o::BLOCK_SIZE)
            .u32(BLOCK_SIZE as u32)
            .at(o::FLASH_PAGE_BYTES)
            .u32(g.flash_page_bytes)
            .at(o::SEGMENT_BYTES)
            .u64(g.segment_bytes)
            .at(o::SEGMENT_COUNT)
            .u32(g.segment_count)
            .at(o::OP_PERMILLE)
            .u32(g.op_permille)
            .at(o::BACKING_BYTES)
            .u64(g.backing_bytes)
            .at(o::EXPORTED_BLOCKS)
            .u64(g.exported_blocks)
            .at(o::CREATED_SECS)
            .u64(self.created_secs)
            .at(o::CRC)
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
        // The checksum before the version: a version read from a block failing it could
        // be damage, and a damaged copy is repaired from the other one. (Reading it first,
        // for a later format that checksums another range, was tried on 2026-11-29 and
        // undone: one flipped bit in one copy's version refused an open the other copy
        // served.)
        check_trailing_crc(buf, "superblock").map_err(|e| SbDecode::Corrupt(e.to_string()))?;
        let c = |e: Error| SbDecode::Corrupt(e.to_string());
        let mut r = Reader::new(buf, "superblock");
        let version = r.seek(o::VERSION).and_then(|r| r.u32()).map_err(c)?;
        if version != SB_VERSION {
            return Err(SbDecode::Version(version));
        }
        // Reserved, written 0: a bit set is a feature of a newer build this one would
        // rewrite without knowing (found by review, 2026-11-29).
        let flags = r.seek(o::FLAGS).and_then(|r| r.u32()).map_err(c)?;
        if flags != 0 {
            return Err(SbDecode::Flags(flags));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.seek(o::UUID).and_then(|r| r.bytes(16)).map_err(c)?);
        let mut u32_at = |at| r.seek(at).and_then(|r| r.u32()).map_err(c);
        let block_size = u32_at(o::BLOCK_SIZE)?;
        let flash_page_bytes = u32_at(o::FLASH_PAGE_BYTES)?;
        let segment_count = u32_at(o::SEGMENT_COUNT)?;
        let op_permille = u32_at(o::OP_PERMILLE)?;
        let mut u64_at = |at| r.seek(at).and_then(|r| r.u64()).map_err(c);
        let segment_bytes = u64_at(o::SEGMENT_BYTES)?;
        let backing_bytes = u64_at(o::BACKING_BYTES)?;
        let exported_blocks = u64_at(o::EXPORTED_BLOCKS)?;
        let created_secs = u64_at(o::CREATED_SECS)?;
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
            && exported_blocks < backing_bytes / BLOCK_SIZE as u64
            // What format allows: past it a block number does not fit a map entry, and a
            // damaged count of 2^32 segments had the open allocate per segment (160 GiB)
            // before anything else could notice (found by review, 2026-11-27).
            && backing_bytes / BLOCK_SIZE as u64 <= crate::geometry::MAX_PHYSICAL_BLOCKS;
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

    /// The on-disk format is frozen: these are the offsets of the drawn table, and
    /// moving one is a format change (a new version), not a refactor.
    #[test]
    fn the_named_offsets_are_the_drawn_table() {
        let named = [o::MAGIC, o::VERSION, o::FLAGS, o::UUID, o::BLOCK_SIZE];
        assert_eq!(named, [0, 8, 12, 16, 32]);
        let named = [
            o::FLASH_PAGE_BYTES,
            o::SEGMENT_BYTES,
            o::SEGMENT_COUNT,
            o::OP_PERMILLE,
        ];
        assert_eq!(named, [36, 40, 48, 52]);
        let named = [
            o::BACKING_BYTES,
            o::EXPORTED_BLOCKS,
            o::CREATED_SECS,
            o::CRC,
        ];
        assert_eq!(named, [56, 64, 72, 4092]);
    }

    /// Every named offset holds its field in what the encoder wrote.
    #[test]
    fn fields_sit_at_their_named_offsets() {
        let sb = sample();
        let g = sb.geometry;
        let b = sb.encode();
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, SB_MAGIC);
        at(o::VERSION, &SB_VERSION.to_le_bytes());
        at(o::FLAGS, &0u32.to_le_bytes());
        at(o::UUID, &sb.uuid);
        at(o::BLOCK_SIZE, &(BLOCK_SIZE as u32).to_le_bytes());
        at(o::FLASH_PAGE_BYTES, &g.flash_page_bytes.to_le_bytes());
        at(o::SEGMENT_BYTES, &g.segment_bytes.to_le_bytes());
        at(o::SEGMENT_COUNT, &g.segment_count.to_le_bytes());
        at(o::OP_PERMILLE, &g.op_permille.to_le_bytes());
        at(o::BACKING_BYTES, &g.backing_bytes.to_le_bytes());
        at(o::EXPORTED_BLOCKS, &g.exported_blocks.to_le_bytes());
        at(o::CREATED_SECS, &sb.created_secs.to_le_bytes());
        at(o::CRC, &crc32c::crc32c(&b[..o::CRC]).to_le_bytes());
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
        // A version field damaged (the checksum failing) is damage, repaired from the
        // other copy, not a newer version that refuses the open.
        let mut v3 = b.clone();
        v3[8] = 3;
        assert!(matches!(Superblock::decode(&v3), Err(SbDecode::Corrupt(_))));
        // A reserved flag set (and the checksum made right): refused, not taken.
        let mut flagged = b.clone();
        flagged[o::FLAGS] = 1;
        let crc = crc32c::crc32c(&flagged[..BLOCK_SIZE - 4]);
        flagged[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(
            matches!(Superblock::decode(&flagged), Err(SbDecode::Flags(1))),
            "{:?}",
            Superblock::decode(&flagged)
        );
        assert!(matches!(
            Superblock::decode(&b[..100]),
            Err(SbDecode::Corrupt(_))
        ));
    }

    /// A superblock with a valid checksum claiming more blocks than a map entry
    /// addresses (2^32 segments) is damage, as format would never write it.
    #[test]
    fn a_geometry_past_what_format_allows_is_corrupt() {
        let mut sb = sample();
        let g = &mut sb.geometry;
        g.segment_count = u32::MAX;
        g.backing_bytes = u32::MAX as u64 * g.segment_bytes;
        assert!(matches!(
            Superblock::decode(&sb.encode()),
            Err(SbDecode::Corrupt(_))
        ));
    }
}
