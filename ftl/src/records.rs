//! Records the checkpoint writes into the index (sled): the checkpoint header, one record
//! per segment and one per map page. Each has a magic, a version and a crc32c; decoding
//! never panics and never allocates more than its input.

use crate::codec::{check_trailing_crc, Reader, Writer};
use crate::error::{Error, Result};

/// Map entries per map page record.
pub const PAGE_ENTRIES: usize = 512;

/// Segment state as persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegState {
    /// Holds nothing live; may be allocated.
    Free,
    /// A stream's current segment, being appended to.
    Open,
    /// Written to the end (or abandoned); read-only until cleaned.
    Closed,
}

impl SegState {
    fn code(self) -> u8 {
        match self {
            SegState::Free => 0,
            SegState::Open => 1,
            SegState::Closed => 2,
        }
    }
    fn from_code(c: u8) -> Result<Self> {
        Ok(match c {
            0 => SegState::Free,
            1 => SegState::Open,
            2 => SegState::Closed,
            x => return Err(Error::Corrupt(format!("segment record: unknown state {x}"))),
        })
    }
}

/// Persisted per-segment metadata.
///
/// ```text
/// offset size field
///      0    2 magic        b"SG"
///      2    1 version      1
///      3    1 state        0 free, 1 open, 2 closed
///      4    1 stream       stream that filled it
///      5    3 zero
///      8    4 segment      its number
///     12    4 erase_count  times it was freed for reuse
///     16    8 opened_seq   entry sequence when it was opened (age)
///     24    4 valid        live blocks at the checkpoint (cross-check; recount wins)
///     28    4 crc32c       of bytes 0..28
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRecord {
    pub segment: u32,
    pub state: SegState,
    pub stream: u8,
    pub erase_count: u32,
    pub opened_seq: u64,
    pub valid: u32,
}

const SEG_MAGIC: &[u8; 2] = b"SG";
const SEG_VERSION: u8 = 1;
/// Encoded size of a [`SegmentRecord`].
pub const SEG_RECORD_BYTES: usize = 32;

impl SegmentRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(SEG_RECORD_BYTES);
        w.bytes(SEG_MAGIC)
            .u8(SEG_VERSION)
            .u8(self.state.code())
            .u8(self.stream)
            .pad_to(8)
            .u32(self.segment)
            .u32(self.erase_count)
            .u64(self.opened_seq)
            .u32(self.valid)
            .crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        if buf.len() != SEG_RECORD_BYTES || &buf[..2] != SEG_MAGIC {
            return Err(Error::Corrupt("segment record: bad size or magic".into()));
        }
        check_trailing_crc(buf, "segment record")?;
        let mut r = Reader::new(buf, "segment record");
        r.skip(2)?;
        let version = r.u8()?;
        if version != SEG_VERSION {
            return Err(Error::Corrupt(format!(
                "segment record version {version} unknown"
            )));
        }
        let state = SegState::from_code(r.u8()?)?;
        let stream = r.u8()?;
        r.skip(3)?;
        Ok(SegmentRecord {
            state,
            stream,
            segment: r.u32()?,
            erase_count: r.u32()?,
            opened_seq: r.u64()?,
            valid: r.u32()?,
        })
    }
}

/// One page of the LBA -> physical map.
///
/// ```text
/// offset size field
///      0    4 magic      b"FTLM"
///      4    2 version    1
///      6    2 count      entries (512)
///      8    8 page       page number (first LBA = page * 512)
///     16  8*n entries    u64: physical block (low 32 bits) | data crc32c (high 32);
///                        u64::MAX = unmapped
/// 16+8n    4 crc32c     of everything before it
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapPage {
    pub page: u64,
    pub entries: Vec<u64>,
}

const MAP_MAGIC: &[u8; 4] = b"FTLM";
const MAP_VERSION: u16 = 1;

impl MapPage {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(20 + 8 * self.entries.len());
        w.bytes(MAP_MAGIC)
            .u16(MAP_VERSION)
            .u16(self.entries.len() as u16)
            .u64(self.page);
        for &e in &self.entries {
            w.u64(e);
        }
        w.crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        if buf.len() < 20 || &buf[..4] != MAP_MAGIC {
            return Err(Error::Corrupt("map page: bad size or magic".into()));
        }
        check_trailing_crc(buf, "map page")?;
        let mut r = Reader::new(buf, "map page");
        r.skip(4)?;
        let version = r.u16()?;
        if version != MAP_VERSION {
            return Err(Error::Corrupt(format!(
                "map page version {version} unknown"
            )));
        }
        let count = r.u16()? as usize;
        let page = r.u64()?;
        if count > PAGE_ENTRIES || buf.len() != 20 + 8 * count {
            return Err(Error::Corrupt(format!(
                "map page {page}: {count} entries in {} bytes",
                buf.len()
            )));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push(r.u64()?);
        }
        Ok(MapPage { page, entries })
    }
}

/// Counters that survive restarts (so WAF is lifetime WAF).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub user_blocks_written: u64,
    pub backing_blocks_written: u64,
    pub padding_bytes: u64,
    pub summary_blocks: u64,
    pub trimmed_blocks: u64,
    pub flushes: u64,
    pub relocated_blocks: u64,
    pub discarded_bytes: u64,
}

impl Counters {
    const N: usize = 8;
    fn to_array(self) -> [u64; Self::N] {
        [
            self.user_blocks_written,
            self.backing_blocks_written,
            self.padding_bytes,
            self.summary_blocks,
            self.trimmed_blocks,
            self.flushes,
            self.relocated_blocks,
            self.discarded_bytes,
        ]
    }
    fn from_array(a: [u64; Self::N]) -> Self {
        Counters {
            user_blocks_written: a[0],
            backing_blocks_written: a[1],
            padding_bytes: a[2],
            summary_blocks: a[3],
            trimmed_blocks: a[4],
            flushes: a[5],
            relocated_blocks: a[6],
            discarded_bytes: a[7],
        }
    }
}

/// Where a stream's next chunk goes: (segment, block offset), or none.
pub type Cursor = Option<(u32, u32)>;

/// The checkpoint header: ties the map and segment records to a point in the log.
///
/// ```text
/// offset size field
///      0    8 magic           b"FTLCKPT1"
///      8    4 version         1
///     12    4 streams         number of cursors that follow the counters
///     16   16 uuid            superblock uuid of the backing this index belongs to
///     32    8 epoch           open count; only chunks of this epoch are replayed
///     40    8 next_chunk_seq  first chunk not covered by this checkpoint
///     48    8 next_entry_seq  first entry sequence not covered
///     56    8 exported_blocks cross-check with the superblock
///     64    4 segment_count   cross-check with the superblock
///     68    4 zero
///     72   64 counters        8 x u64 (see Counters)
///    136  8*n cursors         segment u32 (u32::MAX = none), offset u32
///  136+8n   4 crc32c          of everything before it
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub uuid: [u8; 16],
    pub epoch: u64,
    pub next_chunk_seq: u64,
    pub next_entry_seq: u64,
    pub exported_blocks: u64,
    pub segment_count: u32,
    pub counters: Counters,
    pub cursors: Vec<Cursor>,
}

const CKPT_MAGIC: &[u8; 8] = b"FTLCKPT1";
const CKPT_VERSION: u32 = 1;
const MAX_STREAMS_RECORDED: usize = 64;

impl CheckpointRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(140 + 8 * self.cursors.len());
        w.bytes(CKPT_MAGIC)
            .u32(CKPT_VERSION)
            .u32(self.cursors.len() as u32)
            .bytes(&self.uuid)
            .u64(self.epoch)
            .u64(self.next_chunk_seq)
            .u64(self.next_entry_seq)
            .u64(self.exported_blocks)
            .u32(self.segment_count)
            .u32(0);
        for c in self.counters.to_array() {
            w.u64(c);
        }
        for c in &self.cursors {
            let (s, o) = c.unwrap_or((u32::MAX, 0));
            w.u32(s).u32(o);
        }
        w.crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        if buf.len() < 12 || &buf[..8] != CKPT_MAGIC {
            return Err(Error::Corrupt(
                "checkpoint record: bad size or magic".into(),
            ));
        }
        check_trailing_crc(buf, "checkpoint record")?;
        let mut r = Reader::new(buf, "checkpoint record");
        r.skip(8)?;
        let version = r.u32()?;
        if version != CKPT_VERSION {
            return Err(Error::Corrupt(format!(
                "checkpoint record version {version} unknown"
            )));
        }
        let n = r.u32()? as usize;
        if n > MAX_STREAMS_RECORDED || buf.len() != 140 + 8 * n {
            return Err(Error::Corrupt(format!(
                "checkpoint record: {n} streams in {} bytes",
                buf.len()
            )));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.bytes(16)?);
        let epoch = r.u64()?;
        let next_chunk_seq = r.u64()?;
        let next_entry_seq = r.u64()?;
        let exported_blocks = r.u64()?;
        let segment_count = r.u32()?;
        r.skip(4)?;
        let mut a = [0u64; Counters::N];
        for x in a.iter_mut() {
            *x = r.u64()?;
        }
        let mut cursors = Vec::with_capacity(n);
        for _ in 0..n {
            let s = r.u32()?;
            let o = r.u32()?;
            cursors.push(if s == u32::MAX { None } else { Some((s, o)) });
        }
        Ok(CheckpointRecord {
            uuid,
            epoch,
            next_chunk_seq,
            next_entry_seq,
            exported_blocks,
            segment_count,
            counters: Counters::from_array(a),
            cursors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_record_round_trip() {
        let s = SegmentRecord {
            segment: 9,
            state: SegState::Closed,
            stream: 3,
            erase_count: 4,
            opened_seq: 99,
            valid: 12,
        };
        let b = s.encode();
        assert_eq!(b.len(), SEG_RECORD_BYTES);
        assert_eq!(SegmentRecord::decode(&b).unwrap(), s);
        let mut bad = b.clone();
        bad[10] ^= 1;
        assert!(SegmentRecord::decode(&bad).is_err());
    }

    #[test]
    fn map_page_round_trip() {
        let p = MapPage {
            page: 3,
            entries: (0..PAGE_ENTRIES as u64).collect(),
        };
        let b = p.encode();
        assert_eq!(MapPage::decode(&b).unwrap(), p);
        assert!(MapPage::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn checkpoint_round_trip() {
        let c = CheckpointRecord {
            uuid: [1; 16],
            epoch: 2,
            next_chunk_seq: 3,
            next_entry_seq: 4,
            exported_blocks: 5,
            segment_count: 6,
            counters: Counters {
                flushes: 7,
                ..Default::default()
            },
            cursors: vec![None, Some((4, 128))],
        };
        let b = c.encode();
        assert_eq!(CheckpointRecord::decode(&b).unwrap(), c);
        let mut bad = b.clone();
        bad[33] ^= 1;
        assert!(CheckpointRecord::decode(&bad).is_err());
    }
}
