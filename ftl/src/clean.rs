//! What the FTL offers a cleaner (the `cleaner` crate drives it):
//! - [`Ftl::live_blocks`]: the live blocks of a closed segment, from its on-disk chunk
//!   summaries checked against the map, sorted by LBA (relocation order: cleaning also
//!   defragments);
//! - [`Ftl::read_live`]: a live block's data, verified against its map entry;
//! - [`Ftl::relocate`] (in `engine.rs`): compare-and-swap move into [`GC_STREAM`];
//! - free-space signalling: writers that find no free segment wait (bounded by
//!   `Config::space_wait`) while a cleaner is attached, instead of failing at once;
//! - [`Ftl::set_write_pace`]: the pace the cleaner's throttle sets for all writers
//!   together (one block per interval, admitted in arrival order);
//! - [`Ftl::close_stream`]: gives up a stream's open segment, so the free space left in it
//!   (an idle stream's, otherwise held until the stream fills it) can be cleaned back.
//!
//! Invariant: a relocation moves a block only if the map still points at the old place,
//! so a user write landing on a victim's block meanwhile is never lost.

use crate::chunks::SegmentChunks;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::engine::Ftl;
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::map::MapEntry;
use crate::records::SegState;
use crate::summary::Entry;
use crate::sync::{lock, wait_timeout, AtomicBool, AtomicU64, Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub use crate::engine::GC_STREAM;

/// Dead blocks a victim read spans rather than splitting into two reads.
pub const READ_GAP_BLOCKS: u64 = 2;
/// Largest single read of a victim's live blocks.
pub const MAX_READ_BYTES: u64 = 1 << 20;

/// Ranges `(first, count)` that read every block of `pbas` (sorted, distinct), joining
/// blocks at most [`READ_GAP_BLOCKS`] apart into ranges of at most [`MAX_READ_BYTES`].
pub(crate) fn coalesce(pbas: &[u64]) -> Vec<(u64, u64)> {
    let max = MAX_READ_BYTES / BLOCK_SIZE as u64;
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pbas {
        match out.last_mut() {
            Some((first, count)) if p < *first + *count + READ_GAP_BLOCKS && p - *first < max => {
                *count = p - *first + 1;
            }
            _ => out.push((p, 1)),
        }
    }
    out
}

/// A block the cleaner must move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    pub lba: u64,
    pub entry: MapEntry,
}

/// Unused pacing time a writer may draw on: a pause of the writers does not buy a
/// burst longer than this.
const PACE_SLACK_NS: u64 = 1_000_000;

/// Writers waiting for free segments, and the cleaner's signals to them.
pub struct SpaceWaiters {
    generation: Mutex<u64>,
    cv: Condvar,
    cleaner_attached: AtomicBool,
    /// The throttle: nanoseconds between two blocks admitted, over all writers (0: none).
    pace_ns: AtomicU64,
    /// When (nanoseconds after `clock`) the next block may go.
    next_slot_ns: AtomicU64,
    clock: Instant,
    /// Foreground requests started (the cleaner compares it across a slice).
    pub(crate) foreground_ops: AtomicU64,
    /// Nanoseconds writers spent in the throttle, and waiting for free segments.
    pub(crate) throttled_ns: AtomicU64,
    pub(crate) space_wait_ns: AtomicU64,
}

impl Default for SpaceWaiters {
    fn default() -> Self {
        SpaceWaiters {
            generation: Mutex::new(0),
            cv: Condvar::new(),
            cleaner_attached: AtomicBool::new(false),
            pace_ns: AtomicU64::new(0),
            next_slot_ns: AtomicU64::new(0),
            clock: Instant::now(),
            foreground_ops: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
            space_wait_ns: AtomicU64::new(0),
        }
    }
}

impl SpaceWaiters {
    /// Reserves `blocks` slots of the pace; returns how long the caller must wait for
    /// them (zero when unpaced or the schedule is behind). The slots are handed out in
    /// arrival order with a compare-and-swap on the next free slot, so writers are
    /// spread evenly at the pace instead of each sleeping a fixed delay.
    fn reserve_slots(&self, blocks: u64) -> Duration {
        let pace = self.pace_ns.load(Ordering::Relaxed);
        if pace == 0 {
            return Duration::ZERO;
        }
        let cost = pace.saturating_mul(blocks);
        let now = self.clock.elapsed().as_nanos() as u64;
        let mut cur = self.next_slot_ns.load(Ordering::Relaxed);
        loop {
            let start = cur.max(now.saturating_sub(PACE_SLACK_NS));
            match self.next_slot_ns.compare_exchange_weak(
                cur,
                start.saturating_add(cost),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Duration::from_nanos(start.saturating_sub(now)),
                Err(c) => cur = c,
            }
        }
    }

    /// Wakes writers: segments were freed.
    pub fn notify(&self) {
        let mut g = lock(&self.generation);
        *g += 1;
        drop(g);
        self.cv.notify_all();
    }
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Declares that a cleaner runs: writers short of space wait for it.
    pub fn attach_cleaner(&self, attached: bool) {
        self.space
            .cleaner_attached
            .store(attached, Ordering::SeqCst);
        self.space.notify();
    }

    pub(crate) fn cleaner_attached(&self) -> bool {
        self.space.cleaner_attached.load(Ordering::SeqCst)
    }

    /// Sets the throttle: writers together are admitted one block per `interval`
    /// (zero: no throttle). The cleaner sets it from its measured cleaning rate.
    pub fn set_write_pace(&self, interval: Duration) {
        self.space.pace_ns.store(
            interval.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Nanoseconds writers have spent in the throttle and waiting for free segments
    /// since open.
    pub fn flow_wait_ns(&self) -> (u64, u64) {
        (
            self.space.throttled_ns.load(Ordering::Relaxed),
            self.space.space_wait_ns.load(Ordering::Relaxed),
        )
    }

    /// Current throttle: the interval between two blocks admitted (zero: none).
    pub fn write_pace(&self) -> Duration {
        Duration::from_nanos(self.space.pace_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn throttle(&self, blocks: u64) {
        let d = self.space.reserve_slots(blocks);
        if !d.is_zero() {
            crate::sync::sleep(d);
            self.space
                .throttled_ns
                .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// Waits for a segment to be freed while a cleaner is attached. False when none is,
    /// or nothing was freed within `Config::space_wait`.
    pub(crate) fn wait_for_space(&self) -> Result<bool> {
        if !self.space.cleaner_attached.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let began = Instant::now();
        let deadline = began + self.cfg.space_wait;
        let mut g = lock(&self.space.generation);
        let start = *g;
        let waited = || {
            self.space
                .space_wait_ns
                .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed)
        };
        while *g == start {
            let now = Instant::now();
            if now >= deadline {
                waited();
                return Ok(false);
            }
            g = wait_timeout(&self.space.cv, g, deadline - now);
        }
        drop(g);
        waited();
        self.check_poison()?;
        Ok(true)
    }

    /// Foreground requests started so far; a change across a cleaning slice means
    /// foreground I/O is waiting or running, and the cleaner should yield.
    pub fn foreground_ops(&self) -> u64 {
        self.space.foreground_ops.load(Ordering::Relaxed)
    }

    pub(crate) fn note_foreground(&self) {
        self.space.foreground_ops.fetch_add(1, Ordering::Relaxed);
    }

    /// The entry sequence number the next write gets (the FTL's clock for segment ages).
    pub fn current_seq(&self) -> u64 {
        self.entry_seq.load(Ordering::SeqCst)
    }

    /// Free segments now (including the cleaner's reserve).
    pub fn free_segments(&self) -> usize {
        self.segs.free_count()
    }

    /// Closes `stream`'s open segment: seals and writes its open chunk if it holds
    /// anything, then closes the segment (its unwritten tail counts as dead space for
    /// victim selection). The stream's next write opens a new segment. Recovery is not
    /// affected: chunks written later are found at the start of segments that were free
    /// at the checkpoint, like after a segment fills.
    ///
    /// Does nothing while free segments are at or below the cleaner's reserve: the room
    /// left in an open segment is then what cleaning needs to finish its victim, and the
    /// stream's next write would need a free segment there is none of.
    pub fn close_stream(&self, stream: crate::StreamId) -> Result<()> {
        let Some(m) = self.streams.get(stream.0 as usize) else {
            return Err(Error::InvalidParameters(format!("no stream {}", stream.0)));
        };
        if self.segs.free_count() <= self.cfg.gc_reserve_segments {
            return Ok(());
        }
        let mut out = Vec::new();
        {
            let mut st = lock(m);
            if let Some(sealed) = self.seal_open(stream.0, &mut st)? {
                out.push(sealed);
            }
            // Left: an open chunk with nothing in it, which nobody reads.
            if let Some(empty) = st.chunk.take() {
                self.segs.unwritten[empty.seg as usize].fetch_sub(1, Ordering::SeqCst);
                drop(empty);
            }
            if let Some((seg, _)) = st.cursor.take() {
                self.segs.close(seg);
            }
        }
        self.write_chunks(out)
    }

    /// The cleaner's reserve, in segments.
    pub fn gc_reserve_segments(&self) -> usize {
        self.cfg.gc_reserve_segments
    }

    /// Live blocks of closed segment `seg`, sorted by LBA.
    pub fn live_blocks(&self, seg: u32) -> Result<Vec<LiveBlock>> {
        self.live_blocks_in(seg, &[])
    }

    /// [`Ftl::live_blocks`], taking the chunk summaries within `preloaded` (the segment's
    /// first bytes, read with [`Ftl::read_window`]) from it.
    pub fn live_blocks_in(&self, seg: u32, preloaded: &[u8]) -> Result<Vec<LiveBlock>> {
        if seg == 0
            || seg >= self.geo.segment_count
            || self.segs.state(seg) != Some(SegState::Closed)
        {
            return Err(Error::InvalidParameters(format!(
                "segment {seg} is not a closed log segment"
            )));
        }
        let start = self.geo.segment_start(seg);
        let below = (self.epoch, self.tracker.next_seq());
        let mut out = Vec::new();
        let walk = SegmentChunks::new(&self.dev, self.geo, seg, self.format_id(), below);
        for chunk in walk.preloaded(preloaded) {
            let (off, s) = chunk?;
            let mut k = 0u64;
            for e in &s.entries {
                if let Entry::Data { lba, .. } = *e {
                    let pba = start + off as u64 + 1 + k;
                    k += 1;
                    if lba < self.geo.exported_blocks {
                        let cur = self.map.get(lba);
                        if cur.pba() == Some(pba as u32) {
                            out.push(LiveBlock { lba, entry: cur });
                        }
                    }
                }
            }
        }
        out.sort_by_key(|b| b.lba);
        out.dedup_by_key(|b| b.lba);
        Ok(out)
    }

    /// Reads a live block's data into `buf` (one block), verified against its entry.
    /// `Ok(false)`: the map moved on (nothing to relocate).
    pub fn read_live(&self, b: &LiveBlock, buf: &mut [u8]) -> Result<bool> {
        let Some(pba) = b.entry.pba() else {
            return Ok(false);
        };
        let at = pba as u64 * BLOCK_SIZE as u64;
        self.dev
            .read_at(at, &mut buf[..BLOCK_SIZE])
            .map_err(|e| Error::io("cleaner read", at, e))?;
        self.verify_block(b.lba, b.entry, buf)
    }

    /// Reads `buf.len()` bytes of the log from block `start` (a victim's window, whole:
    /// summaries and data), in reads of [`MAX_READ_BYTES`] all in flight at once.
    pub fn read_window(&self, start: u64, buf: &mut [u8]) -> Result<()> {
        let at = start * BLOCK_SIZE as u64;
        let mut reqs: Vec<(u64, &mut [u8])> = buf
            .chunks_mut(MAX_READ_BYTES as usize)
            .enumerate()
            .map(|(i, b)| (at + i as u64 * MAX_READ_BYTES, b))
            .collect();
        self.dev
            .read_many(&mut reqs)
            .map_err(|e| Error::io("cleaner read", at, e))
    }

    /// Reads the live `blocks` of one window of a victim into `buf`, which holds the
    /// window: block `pba` lands at `(pba - window_start) * BLOCK_SIZE`. Neighbouring
    /// live blocks are read together, across gaps of up to [`READ_GAP_BLOCKS`] dead ones
    /// and up to [`MAX_READ_BYTES`] a read, all reads in flight at once: a victim's live
    /// blocks are mostly runs, and one large read costs the device about what one small
    /// one does. Nothing is verified here: [`Ftl::relocate`] checks each block's crc32c
    /// against the entry it moves.
    pub fn read_live_window(
        &self,
        window_start: u64,
        blocks: &[LiveBlock],
        buf: &mut [u8],
    ) -> Result<()> {
        let window_blocks = (buf.len() / BLOCK_SIZE) as u64;
        let mut pbas: Vec<u64> = blocks
            .iter()
            .filter_map(|b| b.entry.pba())
            .map(u64::from)
            .collect();
        if let Some(&p) = pbas
            .iter()
            .find(|&&p| p < window_start || p >= window_start + window_blocks)
        {
            return Err(Error::InvalidParameters(format!(
                "block {p} is outside the window of {window_blocks} blocks at {window_start}"
            )));
        }
        pbas.sort_unstable();
        pbas.dedup();
        let ranges = coalesce(&pbas);
        // Disjoint, increasing ranges: cut `buf` into one slice per range.
        let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(ranges.len());
        let mut rest = buf;
        let mut at = window_start;
        for (first, count) in ranges {
            let skip = (first - at) as usize * BLOCK_SIZE;
            let (_, tail) = rest.split_at_mut(skip);
            let (piece, tail) = tail.split_at_mut(count as usize * BLOCK_SIZE);
            reqs.push((first * BLOCK_SIZE as u64, piece));
            rest = tail;
            at = first + count;
        }
        let first = reqs.first().map_or(0, |r| r.0);
        self.dev
            .read_many(&mut reqs)
            .map_err(|e| Error::io("cleaner read", first, e))
    }

    /// Closed segments without live blocks, waiting for a checkpoint to become free.
    pub fn dead_segments(&self) -> usize {
        self.segs.dead_closed().len()
    }

    /// Live-block count of a segment (from the in-memory table).
    pub fn segment_valid(&self, seg: u32) -> u32 {
        self.segs
            .valid
            .get(seg as usize)
            .map_or(0, |v| v.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_blocks_are_read_in_few_large_ranges() {
        assert_eq!(coalesce(&[]), vec![]);
        assert_eq!(coalesce(&[5]), vec![(5, 1)]);
        // A gap of up to READ_GAP_BLOCKS dead blocks is read over; a longer one splits.
        let g = READ_GAP_BLOCKS;
        assert_eq!(coalesce(&[1, 2, 3, 3 + g]), vec![(1, 3 + g)]);
        assert_eq!(coalesce(&[1, 2, 3, 4 + g]), vec![(1, 3), (4 + g, 1)]);
        // No range is longer than MAX_READ_BYTES.
        let max = MAX_READ_BYTES / BLOCK_SIZE as u64;
        let all: Vec<u64> = (0..3 * max).collect();
        let r = coalesce(&all);
        assert_eq!(r, vec![(0, max), (max, max), (2 * max, max)]);
        // Every block is covered.
        let sparse: Vec<u64> = (0..1000).filter(|x| x % 7 < 3 || x % 100 == 50).collect();
        let r = coalesce(&sparse);
        for p in sparse {
            assert!(r.iter().any(|&(f, c)| f <= p && p < f + c), "{p}");
        }
    }
}
