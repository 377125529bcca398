//! Chunk summaries: what makes the log self-describing.
//!
//! The log is written in *chunks*. A chunk is one summary block followed by up to
//! [`MAX_CHUNK_DATA`] data blocks and then zero padding up to the next flash-page boundary
//! (block patching). The summary names every data block's LBA, write sequence number and
//! crc32c, and also carries TRIM records (which own no data block). Chunks are chained by
//! `chunk_seq` (+1 per chunk across all streams) within one `epoch` (one open of the
//! device): recovery follows the chain from the last checkpoint and stops at the first
//! missing link.
//!
//! Byte layout of a summary block (4096 bytes, little-endian):
//!
//! ```text
//! offset size field
//!      0    8 magic        b"FTLCHUNK"
//!      8    2 version      1
//!     10    1 stream       stream id the chunk belongs to
//!     11    1 flags        0 (reserved)
//!     12    2 n_entries    entries that follow at offset 64
//!     14    2 data_blocks  data blocks following this summary block
//!     16    8 chunk_seq    position in the chain
//!     24    8 epoch        open count of the device that wrote it
//!     32    8 base_seq     entry sequence numbers are base_seq + delta
//!     40    4 segment      segment holding this chunk
//!     44    4 offset       block offset of this summary within the segment
//!     48    2 pad_blocks   zero blocks after the data (block patching)
//!     50    6 zero         reserved
//!     56    8 format_id    first 8 bytes of the superblock uuid (stale logs of an
//!                          earlier format never match)
//!     64 16*n entries:
//!             +0  8 lba | TRIM_FLAG (bit 63) for a trim record
//!             +8  4 seq delta from base_seq
//!             +12 4 crc32c of the data block, or for a trim: block count
//!   4092    4 crc32c       of bytes 0..4092
//! ```
//!
//! Owns this encoding only. Called by sealing (`log.rs`), the chunk walker (`chunks.rs`),
//! recovery, the checker and staging replay.

use crate::codec::{check_trailing_crc, Reader, Writer};
use crate::device::BLOCK_SIZE;
use crate::error::{Error, Result};

/// Byte offsets of a summary block's fields (the table above); `ENTRY_*` are relative
/// to an entry's start (`ENTRIES + i * ENTRY_BYTES`).
pub mod offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const STREAM: usize = 10;
    pub const FLAGS: usize = 11;
    pub const N_ENTRIES: usize = 12;
    pub const DATA_BLOCKS: usize = 14;
    pub const CHUNK_SEQ: usize = 16;
    pub const EPOCH: usize = 24;
    pub const BASE_SEQ: usize = 32;
    pub const SEGMENT: usize = 40;
    pub const OFFSET: usize = 44;
    pub const PAD_BLOCKS: usize = 48;
    pub const FORMAT_ID: usize = 56;
    pub const ENTRIES: usize = 64;
    pub const ENTRY_LBA: usize = 0;
    pub const ENTRY_SEQ_DELTA: usize = 8;
    pub const ENTRY_CRC_OR_COUNT: usize = 12;
    pub const CRC: usize = 4092;
}
use offsets as o;

/// Summary block magic.
pub const CHUNK_MAGIC: &[u8; 8] = b"FTLCHUNK";
/// Summary format version.
pub const CHUNK_VERSION: u16 = 1;
/// Bytes before the entries.
pub const HEADER_BYTES: usize = offsets::ENTRIES;
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 16;
/// Entries a summary block can hold.
pub const MAX_ENTRIES: usize = (BLOCK_SIZE - 4 - HEADER_BYTES) / ENTRY_BYTES;
/// Data blocks a chunk can hold (one entry each).
pub const MAX_CHUNK_DATA: usize = MAX_ENTRIES;
/// Bit set in an entry's LBA field for a TRIM record.
pub const TRIM_FLAG: u64 = 1 << 63;
/// The most blocks one TRIM entry covers (a TRIM is logged in pieces of at most the
/// engine's stripe count). A summary claiming more is corrupt: recovery would unmap, and
/// dirty the map pages of, whatever range it names (a valid checksum over a count of
/// 2^32 - 1 dirtied the whole map; found by review, 2026-11-27).
pub const MAX_TRIM_BLOCKS: u32 = 4096;

/// One record of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// The chunk's next data block holds `lba`, written with sequence `seq`.
    Data { lba: u64, seq: u64, crc: u32 },
    /// `count` blocks from `lba` were unmapped at sequence `seq`.
    Trim { lba: u64, seq: u64, count: u32 },
}

impl Entry {
    /// Sequence number of the record.
    pub fn seq(&self) -> u64 {
        match *self {
            Entry::Data { seq, .. } | Entry::Trim { seq, .. } => seq,
        }
    }
}

/// Decoded summary block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSummary {
    pub stream: u8,
    pub chunk_seq: u64,
    pub epoch: u64,
    pub format_id: u64,
    pub segment: u32,
    pub offset: u32,
    pub data_blocks: u16,
    pub pad_blocks: u16,
    pub entries: Vec<Entry>,
}

/// Whether a TRIM entry of `count` blocks is one the engine writes (1..=MAX_TRIM_BLOCKS).
pub fn trim_count_valid(count: u32) -> bool {
    (1..=MAX_TRIM_BLOCKS).contains(&count)
}

/// Why `entries` cannot make a summary that decodes, if they cannot: more than
/// [`MAX_ENTRIES`], sequence numbers below the first or 2^32 past it, a TRIM count
/// outside `1..=MAX_TRIM_BLOCKS`. For entries from outside the engine (the staging area),
/// checked before anything is written from them.
pub fn entries_invalid(entries: &[Entry]) -> Option<String> {
    if entries.len() > MAX_ENTRIES {
        return Some(format!("{} entries (at most {MAX_ENTRIES})", entries.len()));
    }
    let base = entries.first().map_or(0, Entry::seq);
    for (i, e) in entries.iter().enumerate() {
        if e.seq().checked_sub(base).is_none_or(|d| d > u32::MAX as u64) {
            return Some(format!("entry {i}: seq {} not within 2^32 above {base}", e.seq()));
        }
        if let Entry::Trim { count, .. } = *e {
            if !trim_count_valid(count) {
                return Some(format!("entry {i}: a TRIM of {count} blocks"));
            }
        }
    }
    None
}

/// Where a summary block that this build cannot decode says it belongs, when it is
/// whole (its magic and checksum good: not a torn write, but another build's format or
/// damage behind a good checksum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeHeader {
    pub epoch: u64,
    pub chunk_seq: u64,
    pub segment: u32,
    pub offset: u32,
    pub format_id: u64,
}

/// [`WholeHeader`] of `buf` when it has the magic and a good checksum (whether or not
/// the rest decodes); `None` otherwise. The fields read are at offsets every version
/// keeps.
pub fn whole_header(buf: &[u8]) -> Option<WholeHeader> {
    if buf.len() != BLOCK_SIZE || &buf[..8] != CHUNK_MAGIC {
        return None;
    }
    check_trailing_crc(buf, "chunk summary").ok()?;
    let mut r = Reader::new(buf, "chunk summary");
    Some(WholeHeader {
        epoch: r.seek(o::EPOCH).ok()?.u64().ok()?,
        chunk_seq: r.seek(o::CHUNK_SEQ).ok()?.u64().ok()?,
        segment: r.seek(o::SEGMENT).ok()?.u32().ok()?,
        offset: r.seek(o::OFFSET).ok()?.u32().ok()?,
        format_id: r.seek(o::FORMAT_ID).ok()?.u64().ok()?,
    })
}

impl ChunkSummary {
    /// Blocks the chunk occupies: summary + data + padding.
    pub fn total_blocks(&self) -> u32 {
        1 + self.data_blocks as u32 + self.pad_blocks as u32
    }

    /// Encodes into `out` (one block). Entries must be in ascending `seq` order and span
    /// less than 2^32 sequence numbers; data entries must equal `data_blocks`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != BLOCK_SIZE || self.entries.len() > MAX_ENTRIES {
            return Err(Error::InvalidParameters(format!(
                "summary with {} entries into {} bytes",
                self.entries.len(),
                out.len()
            )));
        }
        let base = self.entries.first().map_or(0, Entry::seq);
        let mut w = Writer::with_capacity(BLOCK_SIZE);
        w.at(o::MAGIC)
            .bytes(CHUNK_MAGIC)
            .at(o::VERSION)
            .u16(CHUNK_VERSION)
            .at(o::STREAM)
            .u8(self.stream)
            .at(o::FLAGS)
            .u8(0)
            .at(o::N_ENTRIES)
            .u16(self.entries.len() as u16)
            .at(o::DATA_BLOCKS)
            .u16(self.data_blocks)
            .at(o::CHUNK_SEQ)
            .u64(self.chunk_seq)
            .at(o::EPOCH)
            .u64(self.epoch)
            .at(o::BASE_SEQ)
            .u64(base)
            .at(o::SEGMENT)
            .u32(self.segment)
            .at(o::OFFSET)
            .u32(self.offset)
            .at(o::PAD_BLOCKS)
            .u16(self.pad_blocks)
            .at(o::FORMAT_ID)
            .u64(self.format_id)
            .at(o::ENTRIES);
        for (i, e) in self.entries.iter().enumerate() {
            let delta = e
                .seq()
                .checked_sub(base)
                .filter(|d| *d <= u32::MAX as u64)
                .ok_or_else(|| {
                    Error::InvalidParameters(format!(
                        "entry seq {} not within 2^32 of base {base}",
                        e.seq()
                    ))
                })? as u32;
            let (key, last) = match *e {
                Entry::Data { lba, crc, .. } => (lba, crc),
                Entry::Trim { lba, count, .. } => (lba | TRIM_FLAG, count),
            };
            let at = o::ENTRIES + i * ENTRY_BYTES;
            w.at(at + o::ENTRY_LBA)
                .u64(key)
                .at(at + o::ENTRY_SEQ_DELTA)
                .u32(delta)
                .at(at + o::ENTRY_CRC_OR_COUNT)
                .u32(last);
        }
        w.at(o::CRC).crc();
        out.copy_from_slice(&w.buf);
        Ok(())
    }

    /// Decodes a summary block. `Ok(None)` when the block is not a summary at all (no
    /// magic); `Err` when it claims to be one but fails a check. Never panics.
    pub fn decode(buf: &[u8]) -> Result<Option<ChunkSummary>> {
        if buf.len() != BLOCK_SIZE {
            return Err(Error::Corrupt(format!(
                "summary block of {} bytes",
                buf.len()
            )));
        }
        if &buf[..8] != CHUNK_MAGIC {
            return Ok(None);
        }
        check_trailing_crc(buf, "chunk summary")?;
        let mut r = Reader::new(buf, "chunk summary");
        let version = r.seek(o::VERSION)?.u16()?;
        if version != CHUNK_VERSION {
            return Err(Error::Corrupt(format!(
                "chunk summary version {version} unknown"
            )));
        }
        let stream = r.seek(o::STREAM)?.u8()?;
        let n = r.seek(o::N_ENTRIES)?.u16()? as usize;
        let data_blocks = r.seek(o::DATA_BLOCKS)?.u16()?;
        let chunk_seq = r.seek(o::CHUNK_SEQ)?.u64()?;
        let epoch = r.seek(o::EPOCH)?.u64()?;
        let base = r.seek(o::BASE_SEQ)?.u64()?;
        let segment = r.seek(o::SEGMENT)?.u32()?;
        let offset = r.seek(o::OFFSET)?.u32()?;
        let pad_blocks = r.seek(o::PAD_BLOCKS)?.u16()?;
        let format_id = r.seek(o::FORMAT_ID)?.u64()?;
        if n > MAX_ENTRIES || data_blocks as usize > n {
            return Err(Error::Corrupt(format!(
                "chunk summary claims {n} entries, {data_blocks} data blocks"
            )));
        }
        let mut entries = Vec::with_capacity(n);
        let mut data = 0u16;
        for i in 0..n {
            let at = o::ENTRIES + i * ENTRY_BYTES;
            let raw = r.seek(at + o::ENTRY_LBA)?.u64()?;
            let seq = base
                .checked_add(r.seek(at + o::ENTRY_SEQ_DELTA)?.u32()? as u64)
                .ok_or_else(|| Error::Corrupt("entry seq overflows".into()))?;
            let last = r.seek(at + o::ENTRY_CRC_OR_COUNT)?.u32()?;
            if raw & TRIM_FLAG != 0 {
                if !trim_count_valid(last) {
                    return Err(Error::Corrupt(format!(
                        "chunk summary entry {i}: a TRIM of {last} blocks (1..={MAX_TRIM_BLOCKS})"
                    )));
                }
                entries.push(Entry::Trim {
                    lba: raw & !TRIM_FLAG,
                    seq,
                    count: last,
                });
            } else {
                data += 1;
                entries.push(Entry::Data {
                    lba: raw,
                    seq,
                    crc: last,
                });
            }
        }
        if data != data_blocks {
            return Err(Error::Corrupt(format!(
                "chunk summary has {data} data entries but claims {data_blocks}"
            )));
        }
        Ok(Some(ChunkSummary {
            stream,
            chunk_seq,
            epoch,
            format_id,
            segment,
            offset,
            data_blocks,
            pad_blocks,
            entries,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ChunkSummary {
        ChunkSummary {
            stream: 2,
            chunk_seq: 77,
            epoch: 3,
            format_id: 0x1234,
            segment: 5,
            offset: 256,
            data_blocks: 2,
            pad_blocks: 1,
            entries: vec![
                Entry::Data {
                    lba: 10,
                    seq: 1000,
                    crc: 0xdead,
                },
                Entry::Trim {
                    lba: 50,
                    seq: 1001,
                    count: 9,
                },
                Entry::Data {
                    lba: 11,
                    seq: 1005,
                    crc: 0xbeef,
                },
            ],
        }
    }

    /// The on-disk format is frozen: these are the offsets of the drawn table.
    #[test]
    fn the_named_offsets_are_the_drawn_table() {
        let named = [o::MAGIC, o::VERSION, o::STREAM, o::FLAGS, o::N_ENTRIES];
        assert_eq!(named, [0, 8, 10, 11, 12]);
        let named = [
            o::DATA_BLOCKS,
            o::CHUNK_SEQ,
            o::EPOCH,
            o::BASE_SEQ,
            o::SEGMENT,
        ];
        assert_eq!(named, [14, 16, 24, 32, 40]);
        let named = [o::OFFSET, o::PAD_BLOCKS, o::FORMAT_ID, o::ENTRIES, o::CRC];
        assert_eq!(named, [44, 48, 56, 64, 4092]);
        let entry = [
            o::ENTRY_LBA,
            o::ENTRY_SEQ_DELTA,
            o::ENTRY_CRC_OR_COUNT,
            ENTRY_BYTES,
        ];
        assert_eq!(entry, [0, 8, 12, 16]);
    }

    /// Every named offset holds its field in what the encoder wrote.
    #[test]
    fn fields_sit_at_their_named_offsets() {
        let s = sample();
        let mut b = vec![0u8; BLOCK_SIZE];
        s.encode_into(&mut b).unwrap();
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, CHUNK_MAGIC);
        at(o::VERSION, &CHUNK_VERSION.to_le_bytes());
        at(o::STREAM, &[2, 0]);
        at(o::N_ENTRIES, &3u16.to_le_bytes());
        at(o::DATA_BLOCKS, &2u16.to_le_bytes());
        at(o::CHUNK_SEQ, &77u64.to_le_bytes());
        at(o::EPOCH, &3u64.to_le_bytes());
        at(o::BASE_SEQ, &1000u64.to_le_bytes());
        at(o::SEGMENT, &5u32.to_le_bytes());
        at(o::OFFSET, &256u32.to_le_bytes());
        at(o::PAD_BLOCKS, &1u16.to_le_bytes());
        at(o::FORMAT_ID, &0x1234u64.to_le_bytes());
        let second = o::ENTRIES + ENTRY_BYTES;
        at(second + o::ENTRY_LBA, &(50 | TRIM_FLAG).to_le_bytes());
        at(second + o::ENTRY_SEQ_DELTA, &1u32.to_le_bytes());
        at(second + o::ENTRY_CRC_OR_COUNT, &9u32.to_le_bytes());
        at(o::CRC, &crc32c::crc32c(&b[..o::CRC]).to_le_bytes());
    }

    /// A TRIM entry of more blocks than one TRIM piece (or of none) is corrupt.
    #[test]
    fn a_trim_entry_past_the_piece_size_is_corrupt() {
        for (count, ok) in [(1, true), (MAX_TRIM_BLOCKS, true), (MAX_TRIM_BLOCKS + 1, false), (0, false), (u32::MAX, false)] {
            let mut s = sample();
            s.entries = vec![Entry::Trim { lba: 9, seq: 1000, count }];
            s.data_blocks = 0;
            let mut b = vec![0u8; BLOCK_SIZE];
            s.encode_into(&mut b).unwrap();
            assert_eq!(ChunkSummary::decode(&b).is_ok(), ok, "count {count}");
        }
    }

    #[test]
    fn round_trip() {
        let s = sample();
        let mut b = vec![0u8; BLOCK_SIZE];
        s.encode_into(&mut b).unwrap();
        assert_eq!(ChunkSummary::decode(&b).unwrap(), Some(s.clone()));
        assert_eq!(s.total_blocks(), 4);
    }

    #[test]
    fn max_entries_fit() {
        assert_eq!(MAX_ENTRIES, 251);
        let mut s = sample();
        s.entries = (0..MAX_ENTRIES as u64)
            .map(|i| Entry::Data {
                lba: i,
                seq: i,
                crc: 0,
            })
            .collect();
        s.data_blocks = MAX_ENTRIES as u16;
        let mut b = vec![0u8; BLOCK_SIZE];
        s.encode_into(&mut b).unwrap();
        assert_eq!(
            ChunkSummary::decode(&b).unwrap().unwrap().entries.len(),
            MAX_ENTRIES
        );
    }

    #[test]
    fn garbage_is_not_a_summary_and_corruption_is_an_error() {
        assert_eq!(ChunkSummary::decode(&vec![0u8; BLOCK_SIZE]).unwrap(), None);
        let mut b = vec![0u8; BLOCK_SIZE];
        sample().encode_into(&mut b).unwrap();
        b[70] ^= 1;
        assert!(ChunkSummary::decode(&b).is_err());
        assert!(ChunkSummary::decode(&b[..10]).is_err());
    }

    #[test]
    fn seq_span_too_wide_is_refused() {
        let mut s = sample();
        s.entries[2] = Entry::Data {
            lba: 11,
            seq: 1000 + (1 << 33),
            crc: 0,
        };
        assert!(s.encode_into(&mut vec![0u8; BLOCK_SIZE]).is_err());
    }
}
