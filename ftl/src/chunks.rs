//! Reading the log back: which chunk summaries belong to the log, and the walk over one
//! segment's chunks in order.
//!
//! One definition for every reader, so they agree: recovery ([`ChunkSummary::in_place`]
//! for the chunk it looks for), relocation (`Ftl::live_blocks`) and the offline checker
//! ([`SegmentChunks`] for a whole segment).
//!
//! A segment is written front to back by one stream, so its chunks carry increasing
//! (epoch, chain number). The walk stops at the first block that is not the next chunk:
//! not a summary, torn, of another format (a backing reformatted without discard), out of
//! place, past the segment end, not newer than the chunk before it (a stale chunk a
//! crashed session left beyond the point where the next session continued), or at or
//! beyond `below` (chunks recovery did not, or does not yet, accept).
//!
//! An index rebuild walks on past a damaged summary ([`SegmentChunks::resync`]): from a
//! block that carries a summary's magic but fails its checksum, after a chunk it took,
//! it looks block by block for the next summary in place, newer than that chunk; a
//! stale chunk of an earlier use of the segment is older than every chunk of this one,
//! so it is not taken. Only the damaged chunk's own blocks are lost then (their LBAs are
//! unknown), not every chunk after it. The others stop there: relocation finds what the
//! walk hides through the map, and the checker names it.
//!
//! Owns the rules that say which summaries are part of the log; called by relocation
//! (`engine/reloc.rs`), the checker, recovery and the index rebuild.

use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::summary::ChunkSummary;

impl ChunkSummary {
    /// True when this summary was read at block `offset` of segment `seg` of the format
    /// `format_id`, and says so: it names that place and format and fits the segment
    /// (`blocks_per_segment`).
    pub fn in_place(&self, seg: u32, offset: u32, format_id: u64, blocks_per_segment: u32) -> bool {
        self.segment == seg
            && self.offset == offset
            && self.format_id == format_id
            && offset + self.total_blocks() <= blocks_per_segment
    }
}

/// The (epoch, chain number) position of a chunk in the log.
pub type LogPosition = (u64, u64);

/// The chunks of one segment in order (see the module docs). Yields each chunk's offset
/// and summary; a device read error ends the walk with that error.
pub struct SegmentChunks<'a, D: BlockDevice> {
    dev: &'a D,
    geo: Geometry,
    seg: u32,
    format_id: u64,
    below: LogPosition,
    off: u32,
    last: Option<LogPosition>,
    buf: AlignedBuf,
    /// The segment's first blocks, already read (summaries in it are not read again).
    preloaded: &'a [u8],
    /// Summary blocks read ahead at known chunk starts ([`SegmentChunks::known`]): the
    /// offsets, and the blocks in that order.
    known: Vec<u32>,
    known_buf: Option<AlignedBuf>,
    done: bool,
    /// Walk on past a damaged summary ([`SegmentChunks::resync`]).
    resync: bool,
    /// The damaged summaries walked past.
    damaged: Vec<u32>,
}

impl<'a, D: BlockDevice> SegmentChunks<'a, D> {
    /// Walks segment `seg`, accepting chunks of `format_id` positioned before `below`
    /// (the epoch and next chain number of the session that reads).
    pub fn new(dev: &'a D, geo: Geometry, seg: u32, format_id: u64, below: LogPosition) -> Self {
        SegmentChunks {
            dev,
            geo,
            seg,
            format_id,
            below,
            off: 0,
            last: None,
            buf: AlignedBuf::new(BLOCK_SIZE),
            preloaded: &[],
            known: Vec::new(),
            known_buf: None,
            done: false,
            resync: false,
            damaged: Vec::new(),
        }
    }

    /// Walks on past a damaged summary (see the module docs): for the index rebuild.
    pub fn resync(mut self) -> Self {
        self.resync = true;
        self
    }

    /// The offsets of the damaged summaries walked past so far: each one's chunk was left
    /// out, the chunks after it taken.
    pub fn damaged(&self) -> &[u32] {
        &self.damaged
    }

    /// The summary at block `off`, as [`ChunkSummary::decode`] reads it (`Err`: the magic,
    /// but a checksum that fails), taken from the preloaded window or the blocks read
    /// ahead when there, read otherwise. The outer error is the device's.
    fn summary_at(&mut self, off: u32) -> Result<Result<Option<ChunkSummary>>> {
        let at = (self.geo.segment_start(self.seg) + off as u64) * BLOCK_SIZE as u64;
        let within = off as usize * BLOCK_SIZE;
        let known = match (&self.known_buf, self.known.binary_search(&off)) {
            (Some(b), Ok(i)) => b.get(i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE),
            _ => None,
        };
        let block = match self.preloaded.get(within..within + BLOCK_SIZE).or(known) {
            Some(b) => b,
            None => {
                self.dev
                    .read_at(at, &mut self.buf)
                    .map_err(|e| Error::io("summary read", at, e))?;
                &self.buf[..]
            }
        };
        Ok(ChunkSummary::decode(block))
    }

    /// Whether `s`, read at block `off`, is the walk's next chunk.
    fn takes(&self, s: &ChunkSummary, off: u32) -> bool {
        let pos = (s.epoch, s.chunk_seq);
        s.in_place(self.seg, off, self.format_id, self.geo.blocks_per_segment())
            && self.last.is_none_or(|l| pos > l)
            && pos < self.below
    }

    /// Reads the blocks at `starts` (where the segment's chunks are believed to start,
    /// in order: `Segments::chunk_starts`) in one batch, [`crate::VICTIM_READ_DEPTH`] in
    /// flight (it runs beside a victim's reads; 4 KiB each, a few a segment, so it does
    /// not follow `victim_read_depth`), so that the walk does not wait for one
    /// read per chunk. A hint: the walk takes a block from here only at the offset it
    /// reached by the summaries before it, and checks it as it checks one it reads;
    /// blocks inside the preloaded window are not read again. If the batch fails, the
    /// walk reads one block at a time (and reports the error then).
    pub fn known(mut self, starts: &[u32]) -> Self {
        let window = (self.preloaded.len() / BLOCK_SIZE) as u32;
        let bps = self.geo.blocks_per_segment();
        let starts: Vec<u32> = starts
            .iter()
            .copied()
            .filter(|&o| o >= window && o < bps)
            .collect();
        if starts.is_empty() {
            return self;
        }
        let mut buf = AlignedBuf::new(starts.len() * BLOCK_SIZE);
        let base = self.geo.segment_start(self.seg);
        let mut reqs: Vec<(u64, &mut [u8])> = buf
            .chunks_mut(BLOCK_SIZE)
            .zip(&starts)
            .map(|(b, &o)| ((base + o as u64) * BLOCK_SIZE as u64, b))
            .collect();
        if self
            .dev
            .read_many_depth(&mut reqs, crate::VICTIM_READ_DEPTH)
            .is_ok()
        {
            self.known = starts;
            self.known_buf = Some(buf);
        }
        self
    }

    /// Takes the summaries within `window` (the segment's first `window.len()` bytes, as
    /// on the device) from it instead of reading them.
    pub fn preloaded(mut self, window: &'a [u8]) -> Self {
        self.preloaded = window;
        self
    }
}

impl<D: BlockDevice> Iterator for SegmentChunks<'_, D> {
    type Item = Result<(u32, ChunkSummary)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || !self.geo.chunk_fits_at(self.off) {
            return None;
        }
        let read = match self.summary_at(self.off) {
            Ok(r) => r,
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        let next = match read {
            Ok(Some(s)) if self.takes(&s, self.off) => s,
            // The magic, but a failing checksum, after a chunk taken: damage, or a
            // crash's torn write. Walking on, the next chunk is the first summary in
            // place past it that is newer than the last one taken.
            Err(_) if self.resync && self.last.is_some() => {
                self.damaged.push(self.off);
                let mut found = None;
                for off in self.off + 1..self.geo.blocks_per_segment() {
                    if !self.geo.chunk_fits_at(off) {
                        break;
                    }
                    match self.summary_at(off) {
                        Ok(Ok(Some(s))) if self.takes(&s, off) => {
                            found = Some((off, s));
                            break;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            self.done = true;
                            return Some(Err(e));
                        }
                    }
                }
                match found {
                    Some((off, s)) => {
                        self.off = off;
                        s
                    }
                    None => {
                        self.done = true;
                        return None;
                    }
                }
            }
            _ => {
                self.done = true;
                return None;
            }
        };
        let pos = Some((next.epoch, next.chunk_seq));
        let off = self.off;
        self.off += next.total_blocks();
        self.last = pos;
        Some(Ok((off, next)))
    }
}
