//! Records the checkpoint writes into the index (sled): the checkpoint header, one record
//! per segment and one per map page; and the free records written between checkpoints.
//! Each has a magic, a version and a crc32c; decoding never panics and never allocates
//! more than its input.
//!
//! Owns these encodings only. Called by the checkpoint (encode), recovery and the checker
//! (decode), fuzz seeds (with the `internals` feature).

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

/// Byte offsets of a [`SegmentRecord`]'s fields (the table above).
pub mod seg_offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 2;
    pub const STATE: usize = 3;
    pub const STREAM: usize = 4;
    pub const SEGMENT: usize = 8;
    pub const ERASE_COUNT: usize = 12;
    pub const OPENED_SEQ: usize = 16;
    pub const VALID: usize = 24;
    pub const CRC: usize = 28;
}

const SEG_MAGIC: &[u8; 2] = b"SG";
const SEG_VERSION: u8 = 1;
/// Encoded size of a [`SegmentRecord`].
pub const SEG_RECORD_BYTES: usize = 32;

impl SegmentRecord {
    pub fn encode(&self) -> Vec<u8> {
        use seg_offsets as o;
        let mut w = Writer::with_capacity(SEG_RECORD_BYTES);
        w.at(o::MAGIC)
            .bytes(SEG_MAGIC)
            .at(o::VERSION)
            .u8(SEG_VERSION)
            .at(o::STATE)
            .u8(self.state.code())
            .at(o::STREAM)
            .u8(self.stream)
            .at(o::SEGMENT)
            .u32(self.segment)
            .at(o::ERASE_COUNT)
            .u32(self.erase_count)
            .at(o::OPENED_SEQ)
            .u64(self.opened_seq)
            .at(o::VALID)
            .u32(self.valid)
            .at(o::CRC)
            .crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        if buf.len() != SEG_RECORD_BYTES || &buf[..2] != SEG_MAGIC {
            return Err(Error::Corrupt("segment record: bad size or magic".into()));
        }
        check_trailing_crc(buf, "segment record")?;
        use seg_offsets as o;
        let mut r = Reader::new(buf, "segment record");
        let version = r.seek(o::VERSION)?.u8()?;
        if version != SEG_VERSION {
            return Err(Error::Corrupt(format!(
                "segment record version {version} unknown"
            )));
        }
        Ok(SegmentRecord {
            state: SegState::from_code(r.seek(o::STATE)?.u8()?)?,
            stream: r.seek(o::STREAM)?.u8()?,
            segment: r.seek(o::SEGMENT)?.u32()?,
            erase_count: r.seek(o::ERASE_COUNT)?.u32()?,
            opened_seq: r.seek(o::OPENED_SEQ)?.u64()?,
            valid: r.seek(o::VALID)?.u32()?,
        })
    }
}

/// A dead segment freed between checkpoints (`engine/free.rs`): "segment S is free; every
/// chunk below chain number N is durable". Recovery frees S before it looks for chunk
/// heads (S may hold chunks from N on) and fails if the log it replays stops short of N.
/// The next checkpoint removes the record in the batch whose segment table supersedes it;
/// a record that outlived that (its commit reported a failure but was applied) names
/// another checkpoint (`base`) and is ignored.
///
/// A segment opened after the checkpoint (recorded free there) held chunks of the chain
/// recovery replays; the record lists their numbers (`chunks`), and recovery steps over
/// them when they are not found: every entry in them was superseded by durable ones
/// before the segment died (free rule 7). A segment freed again before the next
/// checkpoint (reused and dead again) gets a new record under the same key, listing the
/// chunks of every life since the checkpoint.
///
/// ```text
/// offset size field
///      0    2 magic        b"FR"
///      2    1 version      2 (1: no chunk list, 40 bytes, read as an empty list)
///      3    1 zero
///      4    4 segment      the freed segment
///      8    8 epoch        the session's epoch (the checkpoint it follows has it too)
///     16    8 base         next_chunk_seq of the checkpoint it follows
///     24    8 chain        next chunk number at the commit: every chunk below is durable
///     32    4 erase_count  the segment's erase count after this free
///     36    4 chunk_count  n: chunk numbers that follow (0: closed at the checkpoint,
///                          freed once)
///     40   8n chunks       chain numbers of the segment's chunks since the checkpoint
///  40+8n    4 crc32c       of bytes 0..40+8n
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeRecord {
    pub segment: u32,
    pub epoch: u64,
    pub base: u64,
    pub chain: u64,
    pub erase_count: u32,
    /// Chain numbers of the segment's chunks written since the checkpoint (empty when
    /// the checkpoint recorded it closed and it was freed once).
    pub chunks: Vec<u64>,
}

/// Byte offsets of a [`FreeRecord`]'s fields (the table above).
pub mod free_offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 2;
    pub const SEGMENT: usize = 4;
    pub const EPOCH: usize = 8;
    pub const BASE: usize = 16;
    pub const CHAIN: usize = 24;
    pub const ERASE_COUNT: usize = 32;
    pub const CHUNK_COUNT: usize = 36;
    pub const CHUNKS: usize = 40;
    /// The crc32c of version 1, which had no chunk list.
    pub const CRC_V1: usize = 36;
}

const FREE_MAGIC: &[u8; 2] = b"FR";
const FREE_VERSION: u8 = 2;
/// Encoded size of a version-1 [`FreeRecord`] (and of a version-2 one with no chunks,
/// plus 4).
pub const FREE_RECORD_BYTES_V1: usize = 40;
/// Most chunk numbers a record lists; anything beyond is damage. A segment's chunks can
/// be as small as one block (a FLUSH after every write), and a segment freed again before
/// the next checkpoint lists the chunks of every life since, so the free record of a
/// segment whose list would be longer is not written: it waits for the checkpoint
/// (`engine/free.rs`).
pub const FREE_MAX_CHUNKS: usize = 1 << 16;

impl FreeRecord {
    pub fn encode(&self) -> Vec<u8> {
        use free_offsets as o;
        let mut w = Writer::with_capacity(o::CHUNKS + 8 * self.chunks.len() + 4);
        w.at(o::MAGIC)
            .bytes(FREE_MAGIC)
            .at(o::VERSION)
            .u8(FREE_VERSION)
            .at(o::SEGMENT)
            .u32(self.segment)
            .at(o::EPOCH)
            .u64(self.epoch)
            .at(o::BASE)
            .u64(self.base)
            .at(o::CHAIN)
            .u64(self.chain)
            .at(o::ERASE_COUNT)
            .u32(self.erase_count)
            .at(o::CHUNK_COUNT)
            .u32(self.chunks.len() as u32)
            .at(o::CHUNKS);
        for &c in &self.chunks {
            w.u64(c);
        }
        w.crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        use free_offsets as o;
        if buf.len() < FREE_RECORD_BYTES_V1 || &buf[..2] != FREE_MAGIC {
            return Err(Error::Corrupt("free record: bad size or magic".into()));
        }
        check_trailing_crc(buf, "free record")?;
        let mut r = Reader::new(buf, "free record");
        let version = r.seek(o::VERSION)?.u8()?;
        let chunks = match version {
            1 if buf.len() == o::CRC_V1 + 4 => Vec::new(),
            FREE_VERSION => {
                let n = r.seek(o::CHUNK_COUNT)?.u32()? as usize;
                if n > FREE_MAX_CHUNKS || buf.len() != o::CHUNKS + 8 * n + 4 {
                    return Err(Error::Corrupt(format!(
                        "free record: {n} chunks in {} bytes",
                        buf.len()
                    )));
                }
                r.seek(o::CHUNKS)?;
                (0..n).map(|_| r.u64()).collect::<Result<Vec<u64>>>()?
            }
            _ => {
                return Err(Error::Corrupt(format!(
                    "free record version {version} ({} bytes) unknown",
                    buf.len()
                )))
            }
        };
        Ok(FreeRecord {
            segment: r.seek(o::SEGMENT)?.u32()?,
            epoch: r.seek(o::EPOCH)?.u64()?,
            base: r.seek(o::BASE)?.u64()?,
            chain: r.seek(o::CHAIN)?.u64()?,
            erase_count: r.seek(o::ERASE_COUNT)?.u32()?,
            chunks,
        })
    }
}

/// A checkpoint whose map pages did not fit one index batch is under way: its pages are
/// committed in batches before the batch with its header, which removes this record.
/// While it is present the index may hold map pages newer than the checkpoint header
/// and its segment records (map pages are only ever newer by durable entries, which the
/// roll-forward replays again), so recovery recounts the live counts from the map
/// instead of trusting the segment records (`engine/checkpoint.rs`, rule 7).
///
/// ```text
/// offset size field
///      0    2 magic        b"PC"
///      2    1 version      1
///      3    5 zero
///      8    8 epoch        the session writing the checkpoint
///     16    8 next_chunk   next_chunk_seq of the checkpoint under way
///     24    4 crc32c       of bytes 0..24
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialCheckpoint {
    pub epoch: u64,
    pub next_chunk_seq: u64,
}

/// Byte offsets of a [`PartialCheckpoint`]'s fields (the table above).
pub mod partial_offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 2;
    pub const EPOCH: usize = 8;
    pub const NEXT_CHUNK: usize = 16;
    pub const CRC: usize = 24;
}

const PARTIAL_MAGIC: &[u8; 2] = b"PC";
const PARTIAL_VERSION: u8 = 1;
/// Encoded size of a [`PartialCheckpoint`].
pub const PARTIAL_RECORD_BYTES: usize = 28;

impl PartialCheckpoint {
    pub fn encode(&self) -> Vec<u8> {
        use partial_offsets as o;
        let mut w = Writer::with_capacity(PARTIAL_RECORD_BYTES);
        w.at(o::MAGIC)
            .bytes(PARTIAL_MAGIC)
            .at(o::VERSION)
            .u8(PARTIAL_VERSION)
            .at(o::EPOCH)
            .u64(self.epoch)
            .at(o::NEXT_CHUNK)
            .u64(self.next_chunk_seq)
            .at(o::CRC)
            .crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        if buf.len() != PARTIAL_RECORD_BYTES || &buf[..2] != PARTIAL_MAGIC {
            return Err(Error::Corrupt(
                "partial checkpoint record: bad size or magic".into(),
            ));
        }
        check_trailing_crc(buf, "partial checkpoint record")?;
        use partial_offsets as o;
        let mut r = Reader::new(buf, "partial checkpoint record");
        let version = r.seek(o::VERSION)?.u8()?;
        if version != PARTIAL_VERSION {
            return Err(Error::Corrupt(format!(
                "partial checkpoint record version {version} unknown"
            )));
        }
        Ok(PartialCheckpoint {
            epoch: r.seek(o::EPOCH)?.u64()?,
            next_chunk_seq: r.seek(o::NEXT_CHUNK)?.u64()?,
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

/// Byte offsets of a [`MapPage`]'s fields (the table above).
pub mod map_offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const COUNT: usize = 6;
    pub const PAGE: usize = 8;
    pub const ENTRIES: usize = 16;
    /// The crc32c follows the entries: at `ENTRIES + 8 * count`.
    pub const fn crc(count: usize) -> usize {
        ENTRIES + 8 * count
    }
}

const MAP_MAGIC: &[u8; 4] = b"FTLM";
const MAP_VERSION: u16 = 1;

impl MapPage {
    pub fn encode(&self) -> Vec<u8> {
        use map_offsets as o;
        let n = self.entries.len();
        let mut w = Writer::with_capacity(o::crc(n) + 4);
        w.at(o::MAGIC)
            .bytes(MAP_MAGIC)
            .at(o::VERSION)
            .u16(MAP_VERSION)
            .at(o::COUNT)
            .u16(n as u16)
            .at(o::PAGE)
            .u64(self.page)
            .at(o::ENTRIES);
        for &e in &self.entries {
            w.u64(e);
        }
        w.at(o::crc(n)).crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        use map_offsets as o;
        if buf.len() < o::crc(0) + 4 || &buf[..4] != MAP_MAGIC {
            return Err(Error::Corrupt("map page: bad size or magic".into()));
        }
        check_trailing_crc(buf, "map page")?;
        let mut r = Reader::new(buf, "map page");
        let version = r.seek(o::VERSION)?.u16()?;
        if version != MAP_VERSION {
            return Err(Error::Corrupt(format!(
                "map page version {version} unknown"
            )));
        }
        let count = r.seek(o::COUNT)?.u16()? as usize;
        let page = r.seek(o::PAGE)?.u64()?;
        r.seek(o::ENTRIES)?;
        if count > PAGE_ENTRIES || buf.len() != o::crc(count) + 4 {
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
///     68    4 session         random number of the session that wrote it (0: written
///                             by an older build, or by a format or a rebuild): the
///                             staging area it owns carries the same (staging rule 9)
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
    /// The session's random number (0: unknown); see the table above.
    pub session: u32,
    pub counters: Counters,
    pub cursors: Vec<Cursor>,
}

/// Byte offsets of a [`CheckpointRecord`]'s fields (the table above).
pub mod ckpt_offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const STREAMS: usize = 12;
    pub const UUID: usize = 16;
    pub const EPOCH: usize = 32;
    pub const NEXT_CHUNK_SEQ: usize = 40;
    pub const NEXT_ENTRY_SEQ: usize = 48;
    pub const EXPORTED_BLOCKS: usize = 56;
    pub const SEGMENT_COUNT: usize = 64;
    pub const SESSION: usize = 68;
    pub const COUNTERS: usize = 72;
    pub const CURSORS: usize = 136;
    /// Stream `i`'s cursor: segment at `cursor(i)`, block offset 4 bytes on.
    pub const fn cursor(i: usize) -> usize {
        CURSORS + 8 * i
    }
    /// The crc32c follows the `n` cursors.
    pub const fn crc(n: usize) -> usize {
        cursor(n)
    }
}

const CKPT_MAGIC: &[u8; 8] = b"FTLCKPT1";
const CKPT_VERSION: u32 = 1;
const MAX_STREAMS_RECORDED: usize = 64;

impl CheckpointRecord {
    pub fn encode(&self) -> Vec<u8> {
        use ckpt_offsets as o;
        let n = self.cursors.len();
        let mut w = Writer::with_capacity(o::crc(n) + 4);
        w.at(o::MAGIC)
            .bytes(CKPT_MAGIC)
            .at(o::VERSION)
            .u32(CKPT_VERSION)
            .at(o::STREAMS)
            .u32(n as u32)
            .at(o::UUID)
            .bytes(&self.uuid)
            .at(o::EPOCH)
            .u64(self.epoch)
            .at(o::NEXT_CHUNK_SEQ)
            .u64(self.next_chunk_seq)
            .at(o::NEXT_ENTRY_SEQ)
            .u64(self.next_entry_seq)
            .at(o::EXPORTED_BLOCKS)
            .u64(self.exported_blocks)
            .at(o::SEGMENT_COUNT)
            .u32(self.segment_count)
            .at(o::SESSION)
            .u32(self.session)
            .at(o::COUNTERS);
        for c in self.counters.to_array() {
            w.u64(c);
        }
        for (i, c) in self.cursors.iter().enumerate() {
            let (seg, off) = c.unwrap_or((u32::MAX, 0));
            w.at(o::cursor(i)).u32(seg).u32(off);
        }
        w.at(o::crc(n)).crc();
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        use ckpt_offsets as o;
        if buf.len() < o::STREAMS || &buf[..8] != CKPT_MAGIC {
            return Err(Error::Corrupt(
                "checkpoint record: bad size or magic".into(),
            ));
        }
        check_trailing_crc(buf, "checkpoint record")?;
        let mut r = Reader::new(buf, "checkpoint record");
        let version = r.seek(o::VERSION)?.u32()?;
        if version != CKPT_VERSION {
            return Err(Error::Corrupt(format!(
                "checkpoint record version {version} unknown"
            )));
        }
        let n = r.seek(o::STREAMS)?.u32()? as usize;
        if n > MAX_STREAMS_RECORDED || buf.len() != o::crc(n) + 4 {
            return Err(Error::Corrupt(format!(
                "checkpoint record: {n} streams in {} bytes",
                buf.len()
            )));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.seek(o::UUID)?.bytes(16)?);
        let epoch = r.seek(o::EPOCH)?.u64()?;
        let next_chunk_seq = r.seek(o::NEXT_CHUNK_SEQ)?.u64()?;
        let next_entry_seq = r.seek(o::NEXT_ENTRY_SEQ)?.u64()?;
        let exported_blocks = r.seek(o::EXPORTED_BLOCKS)?.u64()?;
        let segment_count = r.seek(o::SEGMENT_COUNT)?.u32()?;
        let session = r.seek(o::SESSION)?.u32()?;
        let mut a = [0u64; Counters::N];
        r.seek(o::COUNTERS)?;
        for x in a.iter_mut() {
            *x = r.u64()?;
        }
        let mut cursors = Vec::with_capacity(n);
        for i in 0..n {
            let seg = r.seek(o::cursor(i))?.u32()?;
            let off = r.u32()?;
            cursors.push(if seg == u32::MAX {
                None
            } else {
                Some((seg, off))
            });
        }
        Ok(CheckpointRecord {
            uuid,
            epoch,
            next_chunk_seq,
            next_entry_seq,
            exported_blocks,
            segment_count,
            session,
            counters: Counters::from_array(a),
            cursors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The on-disk formats are frozen: these are the offsets of the drawn tables.
    #[test]
    fn the_named_offsets_are_the_drawn_tables() {
        use seg_offsets as s;
        let named = [s::MAGIC, s::VERSION, s::STATE, s::STREAM, s::SEGMENT];
        assert_eq!(named, [0, 2, 3, 4, 8]);
        let named = [
            s::ERASE_COUNT,
            s::OPENED_SEQ,
            s::VALID,
            s::CRC,
            SEG_RECORD_BYTES,
        ];
        assert_eq!(named, [12, 16, 24, 28, 32]);
        use map_offsets as m;
        let named = [
            m::MAGIC,
            m::VERSION,
            m::COUNT,
            m::PAGE,
            m::ENTRIES,
            m::crc(2),
        ];
        assert_eq!(named, [0, 4, 6, 8, 16, 32]);
        use ckpt_offsets as c;
        let named = [c::MAGIC, c::VERSION, c::STREAMS, c::UUID, c::EPOCH];
        assert_eq!(named, [0, 8, 12, 16, 32]);
        let named = [c::NEXT_CHUNK_SEQ, c::NEXT_ENTRY_SEQ, c::EXPORTED_BLOCKS];
        assert_eq!(named, [40, 48, 56]);
        let named = [
            c::SEGMENT_COUNT,
            c::COUNTERS,
            c::CURSORS,
            c::cursor(1),
            c::crc(8),
        ];
        assert_eq!(named, [64, 72, 136, 144, 200]);
        use free_offsets as f;
        let named = [f::MAGIC, f::VERSION, f::SEGMENT, f::EPOCH, f::BASE];
        assert_eq!(named, [0, 2, 4, 8, 16]);
        let named = [f::CHAIN, f::ERASE_COUNT, f::CHUNK_COUNT, f::CHUNKS, f::CRC_V1];
        assert_eq!(named, [24, 32, 36, 40, 36]);
        assert_eq!(FREE_RECORD_BYTES_V1, 40);
    }

    #[test]
    fn free_record_round_trip() {
        let f = FreeRecord {
            segment: 7,
            epoch: 3,
            base: 1000,
            chain: 1234,
            erase_count: 5,
            chunks: vec![1001, 1007, 1200],
        };
        let b = f.encode();
        assert_eq!(b.len(), 40 + 3 * 8 + 4);
        assert_eq!(FreeRecord::decode(&b).unwrap(), f);
        use free_offsets as o;
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, FREE_MAGIC);
        at(o::VERSION, &[FREE_VERSION, 0]);
        at(o::SEGMENT, &7u32.to_le_bytes());
        at(o::EPOCH, &3u64.to_le_bytes());
        at(o::BASE, &1000u64.to_le_bytes());
        at(o::CHAIN, &1234u64.to_le_bytes());
        at(o::ERASE_COUNT, &5u32.to_le_bytes());
        at(o::CHUNK_COUNT, &3u32.to_le_bytes());
        at(o::CHUNKS, &1001u64.to_le_bytes());
        at(o::CHUNKS + 16, &1200u64.to_le_bytes());
        at(64, &crc32c::crc32c(&b[..64]).to_le_bytes());
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(FreeRecord::decode(&bad).is_err(), "a flip at byte {i} decoded");
        }
        assert!(FreeRecord::decode(&b[..b.len() - 8]).is_err());
        // No chunks: 44 bytes.
        let closed = FreeRecord {
            chunks: vec![],
            ..f.clone()
        };
        let c = closed.encode();
        assert_eq!(c.len(), 44);
        assert_eq!(FreeRecord::decode(&c).unwrap(), closed);
        // Version 1 (40 bytes, crc at 36) still reads, as a record without chunks.
        let mut v1 = c[..o::CRC_V1].to_vec();
        v1[o::VERSION] = 1;
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(FreeRecord::decode(&v1).unwrap(), closed);
        // A segment record is not a free record.
        let seg = SegmentRecord {
            segment: 7,
            state: SegState::Free,
            stream: 0,
            erase_count: 5,
            opened_seq: 0,
            valid: 0,
        };
        assert!(FreeRecord::decode(&seg.encode()).is_err());
    }

    #[test]
    fn partial_checkpoint_round_trip_and_layout() {
        let p = PartialCheckpoint {
            epoch: 4,
            next_chunk_seq: 777,
        };
        let b = p.encode();
        assert_eq!(b.len(), PARTIAL_RECORD_BYTES);
        assert_eq!(PartialCheckpoint::decode(&b).unwrap(), p);
        use partial_offsets as o;
        assert_eq!(
            [o::MAGIC, o::VERSION, o::EPOCH, o::NEXT_CHUNK, o::CRC, PARTIAL_RECORD_BYTES],
            [0, 2, 8, 16, 24, 28],
            "the drawn table"
        );
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, PARTIAL_MAGIC);
        at(o::VERSION, &[PARTIAL_VERSION, 0, 0, 0, 0, 0]);
        at(o::EPOCH, &4u64.to_le_bytes());
        at(o::NEXT_CHUNK, &777u64.to_le_bytes());
        at(o::CRC, &crc32c::crc32c(&b[..o::CRC]).to_le_bytes());
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(PartialCheckpoint::decode(&bad).is_err(), "a flip at byte {i} decoded");
        }
    }

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
        // Every named offset holds its field.
        use seg_offsets as o;
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, SEG_MAGIC);
        at(o::VERSION, &[SEG_VERSION, 2, 3]);
        at(o::SEGMENT, &9u32.to_le_bytes());
        at(o::ERASE_COUNT, &4u32.to_le_bytes());
        at(o::OPENED_SEQ, &99u64.to_le_bytes());
        at(o::VALID, &12u32.to_le_bytes());
        at(o::CRC, &crc32c::crc32c(&b[..o::CRC]).to_le_bytes());
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
        use map_offsets as o;
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, MAP_MAGIC);
        at(o::VERSION, &MAP_VERSION.to_le_bytes());
        at(o::COUNT, &(PAGE_ENTRIES as u16).to_le_bytes());
        at(o::PAGE, &3u64.to_le_bytes());
        at(o::ENTRIES + 8 * 5, &5u64.to_le_bytes());
        let crc = o::crc(PAGE_ENTRIES);
        at(crc, &crc32c::crc32c(&b[..crc]).to_le_bytes());
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
            session: 0x5e55_1011,
            counters: Counters {
                flushes: 7,
                ..Default::default()
            },
            cursors: vec![None, Some((4, 128))],
        };
        let b = c.encode();
        assert_eq!(CheckpointRecord::decode(&b).unwrap(), c);
        use ckpt_offsets as o;
        let at = |off: usize, v: &[u8]| assert_eq!(&b[off..off + v.len()], v, "offset {off}");
        at(o::MAGIC, CKPT_MAGIC);
        at(o::VERSION, &CKPT_VERSION.to_le_bytes());
        at(o::STREAMS, &2u32.to_le_bytes());
        at(o::UUID, &[1; 16]);
        at(o::EPOCH, &2u64.to_le_bytes());
        at(o::NEXT_CHUNK_SEQ, &3u64.to_le_bytes());
        at(o::NEXT_ENTRY_SEQ, &4u64.to_le_bytes());
        at(o::EXPORTED_BLOCKS, &5u64.to_le_bytes());
        at(o::SEGMENT_COUNT, &6u32.to_le_bytes());
        at(o::SESSION, &0x5e55_1011u32.to_le_bytes());
        at(o::COUNTERS + 8 * 5, &7u64.to_le_bytes());
        at(o::cursor(0), &u32::MAX.to_le_bytes());
        at(o::cursor(1), &[4, 0, 0, 0, 128, 0, 0, 0]);
        at(o::crc(2), &crc32c::crc32c(&b[..o::crc(2)]).to_le_bytes());
        let mut bad = b.clone();
        bad[33] ^= 1;
        assert!(CheckpointRecord::decode(&bad).is_err());
    }
}
