//! Streams and chunks: how appends become sequential writes.
//!
//! Each stream owns at most one open segment and, inside it, one open chunk: an
//! in-memory buffer of one summary block plus data blocks. Appends copy into the open
//! chunk; when it is full, or a FLUSH/FUA needs it on disk, it is *sealed*: it gets the
//! next chain sequence number, its summary is encoded, it is padded with zeros to the
//! flash-page boundary (block patching) and it moves to the stream's in-flight list until
//! its write completes. Reads of a block still in memory are served from these buffers.
//!
//! Owns the in-memory form of chunks (open and sealed) and a stream's log state; no
//! locking, no I/O. Called by the appender (`append.rs`) and staging replay.

use crate::device::BLOCK_SIZE;
use crate::staging::ChunkBuf;
use crate::summary::{ChunkSummary, Entry, MAX_CHUNK_DATA, MAX_ENTRIES};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Data blocks a chunk starting at block `offset` of its segment may hold (one block is
/// its summary; it never crosses the segment end).
pub fn chunk_capacity(blocks_per_segment: u32, offset: u32) -> u32 {
    (MAX_CHUNK_DATA as u32).min(blocks_per_segment.saturating_sub(offset + 1))
}

/// Data blocks a segment holds from block `offset` on, in full chunks (chunks sealed
/// early by a FLUSH hold fewer: each costs a summary block).
pub fn data_room_from(blocks_per_segment: u32, mut offset: u32) -> u64 {
    let mut n = 0;
    while offset as u64 + 2 <= blocks_per_segment as u64 {
        let c = chunk_capacity(blocks_per_segment, offset);
        n += c as u64;
        offset += c + 1;
    }
    n
}

/// A chunk being filled.
pub struct OpenChunk {
    pub seg: u32,
    /// Block offset of the summary block in the segment.
    pub offset: u32,
    /// First physical block of the chunk (its summary).
    pub start_pba: u64,
    /// Data blocks this chunk may hold.
    pub capacity: u16,
    pub entries: Vec<Entry>,
    pub data_blocks: u16,
    /// Segments whose blocks this chunk's entries unmapped (overwritten, trimmed or
    /// relocated away), each once per run: a dead segment is freed between checkpoints
    /// only once no open chunk names it (`engine/free.rs`, free rule 2).
    pub killed: Vec<u32>,
    /// Entries a relocation appended (rule 6's compare-and-swap moves). A chunk whose
    /// entries are all relocations holds no user write, and a FLUSH leaves it open
    /// (engine rule 10, `engine/flush.rs`).
    pub moved: usize,
    /// Summary block + `capacity` data blocks (+ room for padding), in a staging slot
    /// that records every entry (so a dead process's completed writes are replayed).
    pub buf: ChunkBuf,
}

impl OpenChunk {
    /// True when another data block (and its entry) fits.
    pub fn has_data_room(&self) -> bool {
        self.data_blocks < self.capacity && self.entries.len() < MAX_ENTRIES
    }
    /// True when every entry is a relocation (and there is one): no FLUSH needs it.
    pub fn only_relocations(&self) -> bool {
        !self.entries.is_empty() && self.moved == self.entries.len()
    }
    /// True when another entry fits.
    pub fn has_entry_room(&self) -> bool {
        self.entries.len() < MAX_ENTRIES
    }
    /// True when `seq` can still be encoded as a 32-bit delta from the first entry.
    pub fn seq_fits(&self, seq: u64) -> bool {
        self.entries
            .first()
            .is_none_or(|e| seq.saturating_sub(e.seq()) < (u32::MAX as u64) / 2)
    }
    /// Physical block the next data block lands on.
    pub fn next_data_pba(&self) -> u64 {
        self.start_pba + 1 + self.data_blocks as u64
    }
    /// Copies a data block in and records its entry (staging rule 1: data first).
    pub fn push_data(&mut self, lba: u64, seq: u64, crc: u32, data: &[u8]) {
        let at = (1 + self.data_blocks as usize) * BLOCK_SIZE;
        let e = Entry::Data { lba, seq, crc };
        self.buf.record(self.entries.len(), &e, Some((at, &data[..BLOCK_SIZE])));
        self.data_blocks += 1;
        self.entries.push(e);
    }
    /// An entry of this chunk unmapped a block of segment `seg`.
    pub fn note_killed(&mut self, seg: u32) {
        if self.killed.last() != Some(&seg) {
            self.killed.push(seg);
        }
    }
    /// True when an entry of this chunk unmapped a block of one of `segs` (sorted).
    pub fn killed_any(&self, segs: &[u32]) -> bool {
        self.killed.iter().any(|s| segs.binary_search(s).is_ok())
    }
    /// Records a trim of `count` blocks from `lba`.
    pub fn push_trim(&mut self, lba: u64, seq: u64, count: u32) {
        self.push_entry(Entry::Trim { lba, seq, count });
    }
    fn push_entry(&mut self, e: Entry) {
        self.buf.record(self.entries.len(), &e, None);
        self.entries.push(e);
    }
    /// The buffered contents of physical block `pba`, if it is one of this chunk's data blocks.
    pub fn data_block(&self, pba: u64) -> Option<&[u8]> {
        buffered_block(&self.buf, self.start_pba, self.data_blocks, pba)
    }
}

fn buffered_block(buf: &[u8], start_pba: u64, data_blocks: u16, pba: u64) -> Option<&[u8]> {
    if pba > start_pba && pba <= start_pba + data_blocks as u64 {
        let at = (pba - start_pba) as usize * BLOCK_SIZE;
        Some(&buf[at..at + BLOCK_SIZE])
    } else {
        None
    }
}

/// A sealed chunk waiting for (or in) its device write.
pub struct SealedChunk {
    pub chunk_seq: u64,
    pub stream: u8,
    pub seg: u32,
    pub start_pba: u64,
    pub data_blocks: u16,
    pub total_blocks: u32,
    pub buf: ChunkBuf,
    /// Its device write returned: the device holds its blocks, and it no longer answers
    /// reads (engine rule 8, `append.rs`).
    written: AtomicBool,
}

impl SealedChunk {
    /// Its device write returned (engine rule 8: BEFORE the tracker learns it).
    pub fn mark_written(&self) {
        self.written.store(true, Ordering::SeqCst);
    }

    /// Whether its device write returned.
    pub fn is_written(&self) -> bool {
        self.written.load(Ordering::SeqCst)
    }

    /// The bytes to write.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.total_blocks as usize * BLOCK_SIZE]
    }
    /// Buffered contents of `pba`, if it is one of this chunk's data blocks.
    pub fn data_block(&self, pba: u64) -> Option<&[u8]> {
        buffered_block(&self.buf, self.start_pba, self.data_blocks, pba)
    }
}

/// Everything a seal needs to know besides the chunk.
pub struct SealParams {
    pub chunk_seq: u64,
    pub epoch: u64,
    pub format_id: u64,
    pub stream: u8,
    pub blocks_per_page: u32,
    pub blocks_per_segment: u32,
}

/// Turns an open chunk into a sealed one: encodes the summary, zero-pads to the flash page.
/// Returns the chunk and its padding in blocks.
pub fn seal(mut c: OpenChunk, p: &SealParams) -> crate::error::Result<(SealedChunk, u32)> {
    let used = 1 + c.data_blocks as u32;
    let room = p.blocks_per_segment - c.offset;
    let total = used.div_ceil(p.blocks_per_page) * p.blocks_per_page;
    let total = total.min(room);
    let pad = total - used;
    if total as usize > crate::staging::CHUNK_BUF_BLOCKS {
        return Err(crate::error::Error::InvalidParameters(format!(
            "a chunk of {used} blocks padded to {total} does not fit a staging slot of {} \
             blocks (flash page of {} blocks)",
            crate::staging::CHUNK_BUF_BLOCKS,
            p.blocks_per_page
        )));
    }
    let summary = ChunkSummary {
        stream: p.stream,
        chunk_seq: p.chunk_seq,
        epoch: p.epoch,
        format_id: p.format_id,
        segment: c.seg,
        offset: c.offset,
        data_blocks: c.data_blocks,
        pad_blocks: pad as u16,
        entries: std::mem::take(&mut c.entries),
    };
    summary.encode_into(&mut c.buf[..BLOCK_SIZE])?;
    c.buf[used as usize * BLOCK_SIZE..total as usize * BLOCK_SIZE].fill(0);
    Ok((
        SealedChunk {
            chunk_seq: p.chunk_seq,
            stream: p.stream,
            seg: c.seg,
            start_pba: c.start_pba,
            data_blocks: c.data_blocks,
            total_blocks: total,
            buf: c.buf,
            written: AtomicBool::new(false),
        },
        pad,
    ))
}

/// A stream's log state, guarded by the stream's mutex.
#[derive(Default)]
pub struct StreamLog {
    /// Open segment and the block offset where its next chunk starts.
    pub cursor: Option<(u32, u32)>,
    pub chunk: Option<OpenChunk>,
    pub inflight: Vec<Arc<SealedChunk>>,
}

impl StreamLog {
    /// Buffered contents of `pba`, from the open chunk or an in-flight one not yet
    /// written. A written chunk waiting to be retired never answers (engine rule 8): its
    /// segment may already have been freed and reused, and its buffer hold the blocks of
    /// the segment's previous life at the offsets of the new one.
    pub fn buffered(&self, pba: u64) -> Option<&[u8]> {
        if let Some(b) = self.chunk.as_ref().and_then(|c| c.data_block(pba)) {
            return Some(b);
        }
        self.inflight
            .iter()
            .filter(|c| !c.is_written())
            .find_map(|c| c.data_block(pba))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_holds_its_blocks_less_one_summary_per_full_chunk() {
        let per = MAX_CHUNK_DATA as u32 + 1;
        assert_eq!(data_room_from(16, 0), 15);
        assert_eq!(data_room_from(16, 14), 1);
        assert_eq!(data_room_from(16, 15), 0, "no room for a summary and a block");
        assert_eq!(data_room_from(2 * per, 0), 2 * MAX_CHUNK_DATA as u64);
        assert_eq!(data_room_from(2 * per + 1, 0), 2 * MAX_CHUNK_DATA as u64);
        assert_eq!(data_room_from(2 * per + 2, 0), 2 * MAX_CHUNK_DATA as u64 + 1);
    }

    fn open(capacity: u16, offset: u32) -> OpenChunk {
        let area = crate::staging::StagingArea::in_memory(1).unwrap();
        OpenChunk {
            seg: 1,
            offset,
            start_pba: 64 + offset as u64,
            capacity,
            entries: vec![],
            data_blocks: 0,
            killed: vec![],
            moved: 0,
            buf: area.try_take().unwrap(),
        }
    }

    fn params() -> SealParams {
        SealParams {
            chunk_seq: 9,
            epoch: 1,
            format_id: 5,
            stream: 0,
            blocks_per_page: 4,
            blocks_per_segment: 64,
        }
    }

    #[test]
    fn seal_pads_to_flash_page_and_serves_reads() {
        let mut c = open(10, 0);
        c.push_data(3, 1, 0x11, &[7u8; BLOCK_SIZE]);
        assert_eq!(c.data_block(65).unwrap()[0], 7);
        assert!(c.data_block(64).is_none() && c.data_block(66).is_none());
        let (s, pad) = seal(c, &params()).unwrap();
        assert_eq!((s.total_blocks, pad), (4, 2));
        assert!(s.bytes()[2 * BLOCK_SIZE..].iter().all(|&b| b == 0));
        let sum = ChunkSummary::decode(&s.bytes()[..BLOCK_SIZE])
            .unwrap()
            .unwrap();
        assert_eq!(
            sum.entries,
            vec![Entry::Data {
                lba: 3,
                seq: 1,
                crc: 0x11
            }]
        );
        assert_eq!(sum.pad_blocks, 2);
    }

    #[test]
    fn padding_never_crosses_segment_end() {
        let mut c = open(1, 62);
        c.push_data(0, 1, 0, &[1u8; BLOCK_SIZE]);
        let (s, pad) = seal(c, &params()).unwrap();
        assert_eq!((s.total_blocks, pad), (2, 0));
    }
}
