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
//! it looks for the next summary in place, newer than that chunk, within the longest
//! chunk's reach of the damaged one. A stale chunk of an earlier use of the segment is
//! older than every chunk of this one, so it is not taken; nor is a chunk past a gap the
//! damaged chunk cannot span (a crash's tail past the break, beyond a block recovery
//! zeroed: recovery rule 2). Left open: a crash's tail within that reach of a damaged
//! summary before the break, in a segment its stream never wrote again, once the later
//! sessions' chunks that mark the break for the rebuild (`rebuild.rs`, `later_min`) are
//! all cleaned away. Only the damaged chunk's own blocks are lost (their LBAs are
//! unknown), not every chunk after it. The other readers stop there: relocation finds
//! what the walk hides through the map, and the checker names it. The TRIM carry
//! (`engine/tombstones.rs`) has no such fallback: it walks on and fails on any damage it
//! met ([`SegmentChunks::ended_on_damage`]), so its segment is not freed.
//!
//! Owns the rules that say which summaries are part of the log; called by relocation
//! (`engine/reloc.rs`), the checker, recovery and the index rebuild.

use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::summary::{ChunkSummary, MAX_CHUNK_DATA};

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

/// Blocks a walk past a damaged summary reads at once ([`SegmentChunks::resync`]).
const RESYNC_READ_BLOCKS: u32 = 256;

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
    /// The walk ended on a summary that fails its checksum (not walked past: the first
    /// chunk's, or any without [`SegmentChunks::resync`]).
    ended_on_damage: bool,
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
            ended_on_damage: false,
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

    /// Whether the walk ended on a block with a summary's magic whose checksum fails,
    /// rather than past the chunks of this use of the segment: damage, unless a crash
    /// tore it (recovery zeroes a torn summary at a stream's cursor, rule 2, so in a
    /// segment closed since, damage). A reader that must see every chunk (the TRIM
    /// carry) asks this and [`SegmentChunks::damaged`].
    pub fn ended_on_damage(&self) -> bool {
        self.ended_on_damage
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

    /// The walk's next chunk past the damaged summary at block `damaged`, and its
    /// summary: the first in place and newer than the last chunk taken, no further than
    /// the longest chunk could reach from `damaged` (a summary, [`MAX_CHUNK_DATA`] blocks
    /// and a flash page of padding). The next chunk of this use of the segment starts
    /// where the damaged one ends; one further on lies past a gap the damaged chunk
    /// cannot span (a crash's break: its chunks are not the log). Blocks outside the
    /// preloaded window are read [`RESYNC_READ_BLOCKS`] at a time.
    fn find_next(&mut self, damaged: u32) -> Result<Option<(u32, ChunkSummary)>> {
        let bps = self.geo.blocks_per_segment();
        let reach = 1 + MAX_CHUNK_DATA as u32 + self.geo.blocks_per_page();
        let end = bps.min(damaged.saturating_add(reach + 1));
        let base = self.geo.segment_start(self.seg);
        let mut ahead = AlignedBuf::new(0);
        let mut ahead_at = 0u32;
        for off in damaged + 1..end {
            if !self.geo.chunk_fits_at(off) {
                break;
            }
            let within = off as usize * BLOCK_SIZE;
            let block = match self.preloaded.get(within..within + BLOCK_SIZE) {
                Some(b) => b,
                None => {
                    // `ahead_at <= off`: the offsets only grow.
                    if (off - ahead_at + 1) as usize * BLOCK_SIZE > ahead.len() {
                        let n = RESYNC_READ_BLOCKS.min(end - off) as usize;
                        ahead = AlignedBuf::new(n * BLOCK_SIZE);
                        let at = (base + off as u64) * BLOCK_SIZE as u64;
                        self.dev
                            .read_at(at, &mut ahead)
                            .map_err(|e| Error::io("summary read", at, e))?;
                        ahead_at = off;
                    }
                    let k = (off - ahead_at) as usize;
                    &ahead[k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE]
                }
            };
            if let Ok(Some(s)) = ChunkSummary::decode(block) {
                if self.takes(&s, off) {
                    return Ok(Some((off, s)));
                }
            }
        }
        Ok(None)
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
        let damage = read.is_err();
        let next = match read {
            Ok(Some(s)) if self.takes(&s, self.off) => s,
            // The magic, but a failing checksum, after a chunk taken: damage, or a
            // crash's torn write. Walking on, the next chunk is the first summary in
            // place past it that is newer than the last one taken.
            Err(_) if self.resync && self.last.is_some() => {
                self.damaged.push(self.off);
                let found = match self.find_next(self.off) {
                    Ok(f) => f,
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                };
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
                self.ended_on_damage = damage;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem::MemDevice;
    use crate::summary::Entry;

    const FORMAT: u64 = 0xf0;

    /// A summary of one data block of LBA `lba`, chunk `seq` of epoch 1, at block `off`
    /// of segment 1, written to `dev`; `damaged`: one byte flipped (its checksum fails).
    fn put(dev: &MemDevice, geo: Geometry, off: u32, seq: u64, lba: u64, damaged: bool) {
        let s = ChunkSummary {
            stream: 1,
            chunk_seq: seq,
            epoch: 1,
            format_id: FORMAT,
            segment: 1,
            offset: off,
            data_blocks: 1,
            pad_blocks: 0,
            entries: vec![Entry::Data { lba, seq, crc: 0 }],
        };
        let mut b = AlignedBuf::new(BLOCK_SIZE);
        s.encode_into(&mut b).unwrap();
        if damaged {
            b[100] ^= 0xff;
        }
        let at = (geo.segment_start(1) + off as u64) * BLOCK_SIZE as u64;
        dev.write_at(at, &b).unwrap();
    }

    fn walk(dev: &MemDevice, geo: Geometry, resync: bool) -> (Vec<u32>, Vec<u32>) {
        let mut w = SegmentChunks::new(dev, geo, 1, FORMAT, (u64::MAX, u64::MAX));
        if resync {
            w = w.resync();
        }
        let offs = w.by_ref().map(|c| c.unwrap().0).collect();
        (offs, w.damaged().to_vec())
    }

    /// Past a damaged summary, a resyncing walk takes the next chunk in place and newer
    /// than the last taken, within the longest chunk's reach of the damaged one; not a
    /// stale (older) chunk, and not one past a gap no chunk spans. A plain walk stops.
    #[test]
    fn a_resyncing_walk_goes_past_a_damaged_summary_within_a_chunks_reach() {
        let opts = crate::FormatOptions {
            segment_bytes: Some(2 << 20),
            ..Default::default()
        };
        let geo = Geometry::resolve(32 * (2 << 20), &opts).unwrap();
        let reach = 1 + MAX_CHUNK_DATA as u32 + geo.blocks_per_page();
        assert!(8 + reach + 2 < geo.blocks_per_segment());
        let dev = MemDevice::new(32 * (2 << 20));
        put(&dev, geo, 0, 10, 1, false);
        put(&dev, geo, 2, 11, 2, true);
        // A stale chunk of an earlier use (older), then this use's next one.
        put(&dev, geo, 4, 3, 3, false);
        put(&dev, geo, 6, 12, 4, false);
        assert_eq!(walk(&dev, geo, false), (vec![0], vec![]));
        assert_eq!(walk(&dev, geo, true), (vec![0, 6], vec![2]));
        // Damaged again at 8; the next summary lies one block past the reach.
        put(&dev, geo, 8, 13, 5, true);
        put(&dev, geo, 8 + reach + 1, 14, 6, false);
        assert_eq!(walk(&dev, geo, true), (vec![0, 6], vec![2, 8]));
        // At the reach's edge it is taken.
        put(&dev, geo, 8 + reach, 14, 6, false);
        assert_eq!(walk(&dev, geo, true), (vec![0, 6, 8 + reach], vec![2, 8]));
    }
}
