//! Relocation, and the rest of what the FTL offers a cleaner (the `cleaner` crate drives
//! it; nothing else in this crate calls it):
//! - [`Ftl::live_blocks`]: the live blocks of a closed segment, from its on-disk chunk
//!   summaries checked against the map, sorted by LBA (relocation order: cleaning also
//!   defragments);
//! - [`Ftl::read_live`]: a live block's data, verified against its map entry;
//! - [`Ftl::relocate`], [`Ftl::relocate_deferred`]: compare-and-swap moves (the append
//!   itself is the appender's, rule 6 there), into the block's class stream or
//!   [`GC_STREAM`], which alone may take the cleaner's reserve;
//! - the reads of a victim: its live blocks in few large reads, or its whole window;
//! - the cleaner's side of free-space flow control (`space.rs`): attach, so writers that
//!   find no free segment wait (bounded by `Config::space_wait`) instead of failing;
//! - [`Ftl::set_write_pace`]: the pace the cleaner's throttle sets for all writers
//!   together (one block per interval, admitted in arrival order);
//! - [`Ftl::close_stream`]: gives up a stream's open segment, so the free space left in it
//!   (an idle stream's, otherwise held until the stream fills it) can be cleaned back.
//!
//! Invariant: a relocation moves a block only if the map still points at the old place,
//! so a user write landing on a victim's block meanwhile is never lost.

use super::Ftl;
use crate::append::PendingChunks;
use crate::chunks::SegmentChunks;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::map::MapEntry;
use crate::records::SegState;
use crate::stream::{StreamId, GC_STREAM};
use crate::summary::Entry;
use crate::tables::LiveCounters;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Dead blocks a victim read spans rather than splitting into two reads: live blocks with
/// at most this many dead ones between them are read together.
///
/// Until 2026-11-27 [`coalesce`] read over one dead block only (live blocks at most 2
/// apart), against the "gaps of up to 2 dead blocks" its callers' docs promised: a 4 MiB
/// victim two thirds live, its dead blocks scattered by uniform overwrites, took 78 reads
/// of 43 KiB a victim (the same gap counted as intended: 27 runs of 140 KiB, 12% more
/// bytes, now cut at [`MAX_READ_BYTES`] into 45 reads). With reads of up to 1 MiB, 6 in
/// flight, uniform overwrites of a full device ran 9-48% faster (median 15%, 8 alternated
/// pairs) at a WAF 0.3% higher; with the 128 KiB cut and 8 in flight, +14%, +11% and -4%
/// in 3 pairs at the same WAF (`docs/steady.md`, "Victim reads over two dead blocks").
pub const READ_GAP_BLOCKS: u64 = 2;
/// Largest single read of a victim's live blocks (or of a window read whole), so that the
/// bytes of the cleaner's reads at the disk stay under [`VICTIM_READ_DEPTH`] x 128 KiB.
/// With reads of up to 1 MiB (and 6 in flight), a victim's long live runs were read in
/// one request each; the free records' syncs and commits waited behind them (5.2-6.3 ms
/// a record against 3.6-4.8), and the uniform write tail reached 46 ms once. 128 KiB
/// reads, 45 a victim of 81 KiB on average, 8 in flight: the same IOPS, a WAF 0.4% lower,
/// later max 8.7-10.6 ms against 9.0-46.1 (4 alternated pairs, `docs/steady.md`,
/// "Victim reads over two dead blocks").
pub const MAX_READ_BYTES: u64 = 128 << 10;
/// A victim's reads in flight at once while users are not reading. All of them at once
/// queued the users' requests and the free records' syncs behind them (`docs/steady.md`,
/// "The cleaner's reads at a steady depth").
pub const VICTIM_READ_DEPTH: usize = 8;
/// A victim's reads in flight at once when users read since the last victim read: each
/// read in flight at the disk is one more a user's 4 KiB read may wait behind. A 70/30
/// read/write mix while cleaning had read p99.9 4.52-5.08 ms with 6 reads of up to 1 MiB
/// in flight (6 runs), 4.26 and 4.69 ms with 4, against 4.03-4.59 ms on main (8 of 43
/// KiB).
pub const VICTIM_READ_DEPTH_BESIDE_READS: usize = 4;
const _: () = assert!(VICTIM_READ_DEPTH_BESIDE_READS < VICTIM_READ_DEPTH);

/// How many of a victim's reads to keep in flight, given the users' reads started since
/// the cleaner's last victim read (the FTL counts them as it serves them).
pub fn victim_read_depth(user_reads_since_last: u64) -> usize {
    if user_reads_since_last > 0 {
        VICTIM_READ_DEPTH_BESIDE_READS
    } else {
        VICTIM_READ_DEPTH
    }
}

/// What reading a victim took: backing reads and bytes read (dead blocks read over
/// included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCount {
    pub reads: u64,
    pub bytes: u64,
}

impl ReadCount {
    fn of(reqs: &[(u64, &mut [u8])]) -> Self {
        ReadCount {
            reads: reqs.len() as u64,
            bytes: reqs.iter().map(|r| r.1.len() as u64).sum(),
        }
    }
}

/// Ranges `(first, count)` that read every block of `pbas` (sorted, distinct), joining
/// blocks with at most [`READ_GAP_BLOCKS`] dead ones between them into ranges of at most
/// [`MAX_READ_BYTES`].
pub(crate) fn coalesce(pbas: &[u64]) -> Vec<(u64, u64)> {
    let max = MAX_READ_BYTES / BLOCK_SIZE as u64;
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pbas {
        match out.last_mut() {
            // The range ends at block `first + count - 1`: `p` follows it after
            // `p - (first + count)` dead blocks.
            Some((first, count)) if p <= *first + *count + READ_GAP_BLOCKS && p - *first < max => {
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

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Relocations diverted to [`GC_STREAM`] since open (see [`Ftl::relocate`]).
    pub fn relocations_diverted(&self) -> u64 {
        self.diverted.load(Ordering::Relaxed)
    }

    /// Moves a block for the cleaner: appends `data` for `lba` in `stream` only if the map
    /// still holds `expected` (compare-and-swap). Returns whether it moved. Only
    /// relocations into [`GC_STREAM`] may open segments out of the cleaner's reserve; a
    /// relocation whose own stream would need it goes to [`GC_STREAM`] instead. Data that
    /// does not match `expected`'s crc32c is not moved: skipped if the map moved on
    /// meanwhile, an error if it still holds `expected`.
    pub fn relocate(
        &self,
        lba: u64,
        expected: MapEntry,
        data: &[u8],
        stream: StreamId,
    ) -> Result<bool> {
        let mut pending = PendingChunks::default();
        let r = self.relocate_deferred(lba, expected, data, stream, &mut pending);
        let w = self.write_pending(pending);
        let moved = r?;
        w?;
        Ok(moved)
    }

    /// [`Ftl::relocate`], leaving the device writes of the chunks it seals to the caller
    /// (in `pending`, for [`Ftl::write_pending`], e.g. on another thread while the
    /// cleaner goes on). Until they are written they hold staging slots and every FLUSH
    /// and checkpoint after them waits for them.
    pub fn relocate_deferred(
        &self,
        lba: u64,
        expected: MapEntry,
        data: &[u8],
        stream: StreamId,
        pending: &mut PendingChunks,
    ) -> Result<bool> {
        if data.len() != BLOCK_SIZE {
            return Err(Error::Unaligned(format!(
                "relocate takes one block, got {} bytes",
                data.len()
            )));
        }
        self.check_range(lba, 1)?;
        self.check_poison()?;
        // Only a mapped block moves: against an unmapped entry the compare-and-swap would
        // map a trimmed LBA to `data` (whose checksum could even equal the unmapped
        // entry's, skipping the check below). No caller passes one (found by review,
        // 2026-11-29: the API allowed it).
        if !expected.is_mapped() {
            return Ok(false);
        }
        let crc = crc32c::crc32c(data);
        if crc != expected.crc() {
            // Data that does not match an entry the map no longer holds: the block moved
            // on (nothing to relocate); one the map still holds is corrupt.
            if !self.verify_block(lba, expected, data)? {
                return Ok(false);
            }
        }
        let mut moved = false;
        let mut append = |s: StreamId, pending: &mut PendingChunks| {
            self.append_loop(s, 1, true, true, Some(pending), |st, _| {
                moved = self
                    .log
                    .append_block(&self.t, st, lba, data, crc, Some(expected))?;
                Ok(())
            })
        };
        let used = match append(stream, pending) {
            Err(Error::NoSpace) if stream != GC_STREAM => {
                self.diverted.fetch_add(1, Ordering::Relaxed);
                append(GC_STREAM, pending)?;
                GC_STREAM
            }
            r => {
                r?;
                stream
            }
        };
        if moved {
            if let Some(c) = self.stream_blocks.get(used.0 as usize) {
                c.fetch_add(1, Ordering::Relaxed);
            }
            LiveCounters::add(&self.t.counters.relocated_blocks, 1);
            self.ckpt.note_appended(1);
        }
        Ok(moved)
    }

    /// Waits up to `limit` for a segment to be freed (by a checkpoint, a free record or a
    /// release); false when none was. For the cleaner after it found no free segment.
    pub fn wait_for_free_space(&self, limit: Duration) -> bool {
        self.space.wait_for_free(limit)
    }

    /// Declares that a cleaner runs: writers short of space wait for it.
    pub fn attach_cleaner(&self, attached: bool) {
        self.space.attach(attached);
    }

    /// Sets the throttle: writers together are admitted one block per `interval`
    /// (zero: no throttle). The cleaner sets it from its measured cleaning rate. A
    /// read-only FTL has none: writers asleep in it slept out their slots (up to seconds
    /// with 32 writers of 1 MiB) before they met the poison, and the runner went on
    /// setting it (found by review, 2026-11-29; a chunk write's failure poisons the FTL
    /// from the appender, which has no throttle, so the runner's next call ends them).
    pub fn set_write_pace(&self, interval: Duration) {
        let interval = if self.check_poison().is_err() {
            Duration::ZERO
        } else {
            interval
        };
        self.space.set_pace(interval);
        // A poison between the look and the store set the pace to zero first: again.
        if !interval.is_zero() && self.check_poison().is_err() {
            self.space.set_pace(Duration::ZERO);
        }
    }

    /// Nanoseconds writers have spent in the throttle and waiting for free segments
    /// since open.
    pub fn flow_wait_ns(&self) -> (u64, u64) {
        self.space.wait_ns()
    }

    /// The longest a writer stalled for a free segment (from its first wait until it had
    /// one) since the last call (one caller: the cleaner's runner).
    pub fn take_longest_space_stall(&self) -> Duration {
        self.space.take_longest_stall()
    }

    /// Current throttle: the interval between two blocks admitted (zero: none).
    pub fn write_pace(&self) -> Duration {
        self.space.pace()
    }

    /// Foreground requests started so far; a change across a cleaning slice means
    /// foreground I/O is waiting or running, and the cleaner should yield.
    pub fn foreground_ops(&self) -> u64 {
        self.space.foreground_ops()
    }

    /// Free segments now (including the cleaner's reserve).
    pub fn free_segments(&self) -> usize {
        self.t.segs.free_count()
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
    pub fn close_stream(&self, stream: StreamId) -> Result<()> {
        if stream.0 as usize >= crate::stream::STREAMS {
            return Err(Error::InvalidParameters(format!("no stream {}", stream.0)));
        }
        if self.t.segs.free_count() <= self.cfg.gc_reserve_segments {
            return Ok(());
        }
        let sealed = self.log.close_segment(&self.t, stream)?;
        self.write_chunks(sealed.into_iter().collect())
    }

    /// Data blocks [`GC_STREAM`]'s open segment still takes, in full chunks (0 with none
    /// open): what it appends without a new segment.
    pub(crate) fn gc_open_room(&self) -> Result<u64> {
        let bps = self.t.geo.blocks_per_segment();
        let st = self.log.stream(GC_STREAM)?;
        Ok(match st.cursor {
            Some((_, off)) => crate::log::data_room_from(bps, off)
                .saturating_sub(st.chunk.as_ref().map_or(0, |c| c.data_blocks as u64)),
            None => 0,
        })
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
        self.closed_log_segment(seg)?;
        let start = self.t.geo.segment_start(seg);
        let below = (self.epoch, self.log.tracker().next_seq());
        let mut out = Vec::new();
        let starts = self.t.segs.chunk_starts(seg).unwrap_or_default();
        let walk = SegmentChunks::new(&self.dev, self.t.geo, seg, self.format_id(), below)
            .preloaded(preloaded)
            .known(&starts);
        for chunk in walk {
            let (off, s) = chunk?;
            let mut k = 0u64;
            for e in &s.entries {
                if let Entry::Data { lba, .. } = *e {
                    let pba = start + off as u64 + 1 + k;
                    k += 1;
                    if lba < self.t.geo.exported_blocks {
                        let cur = self.t.map.get(lba)?;
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

    /// The blocks the map places in closed segment `seg` among the LBAs of map pages
    /// `pages` (of [`Ftl::map_pages`]), in LBA order: each page the cached copy or the
    /// index's, read without caching it. Over all pages, a scan of the whole map, so the
    /// caller goes a range at a time. For the cleaner, when a victim still counts live
    /// blocks that [`Ftl::live_blocks`] does not name: a damaged chunk summary ends the
    /// walk of its segment, hiding the chunks after it, but the map still knows where
    /// their live blocks are, and each entry's checksum verifies its block when it is
    /// moved ([`Ftl::verify_block`]). Entries that change meanwhile are what the
    /// compare-and-swap of [`Ftl::relocate`] is for; no entry newly points into a closed
    /// segment.
    pub fn mapped_blocks_in(&self, seg: u32, pages: std::ops::Range<u64>) -> Result<Vec<LiveBlock>> {
        self.closed_log_segment(seg)?;
        let start = self.t.geo.segment_start(seg);
        let within = start..start + self.t.geo.blocks_per_segment() as u64;
        let mut out = Vec::new();
        self.t.map.try_for_pages(pages, |page, entries| {
            let first = page * crate::records::PAGE_ENTRIES as u64;
            for (i, &e) in entries.iter().enumerate() {
                let entry = MapEntry(e);
                if entry.pba().is_some_and(|p| within.contains(&(p as u64))) {
                    out.push(LiveBlock {
                        lba: first + i as u64,
                        entry,
                    });
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Pages of the map ([`crate::records::PAGE_ENTRIES`] LBAs each).
    pub fn map_pages(&self) -> u64 {
        self.t.map.pages()
    }

    /// Refuses anything but a closed log segment (the ones the cleaner may list).
    fn closed_log_segment(&self, seg: u32) -> Result<()> {
        if seg == 0
            || seg >= self.t.geo.segment_count
            || self.t.segs.state(seg) != Some(SegState::Closed)
        {
            return Err(Error::InvalidParameters(format!(
                "segment {seg} is not a closed log segment"
            )));
        }
        Ok(())
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
    /// summaries and data), in reads of [`MAX_READ_BYTES`], as many in flight as
    /// [`victim_read_depth`] says, like the victim reads of [`Ftl::read_live_window`].
    pub fn read_window(&self, start: u64, buf: &mut [u8]) -> Result<ReadCount> {
        let at = start * BLOCK_SIZE as u64;
        let mut reqs: Vec<(u64, &mut [u8])> = buf
            .chunks_mut(MAX_READ_BYTES as usize)
            .enumerate()
            .map(|(i, b)| (at + i as u64 * MAX_READ_BYTES, b))
            .collect();
        self.read_victim(&mut reqs, at)
    }

    /// Issues a victim's reads, as many in flight as [`victim_read_depth`] says beside the
    /// users' reads since the last look; `at` names the read in an error.
    fn read_victim(&self, reqs: &mut [(u64, &mut [u8])], at: u64) -> Result<ReadCount> {
        let depth = victim_read_depth(self.space.reads_since_last_look());
        self.dev
            .read_many_depth(reqs, depth)
            .map_err(|e| Error::io("cleaner read", at, e))?;
        Ok(ReadCount::of(reqs))
    }

    /// Reads the live `blocks` of one window of a victim into `buf`, which holds the
    /// window: block `pba` lands at `(pba - window_start) * BLOCK_SIZE`. Neighbouring live
    /// blocks are read together, across gaps of up to [`READ_GAP_BLOCKS`] dead ones and up
    /// to [`MAX_READ_BYTES`] a read, [`VICTIM_READ_DEPTH`] of them in flight
    /// ([`VICTIM_READ_DEPTH_BESIDE_READS`] when users read since the last victim read): a
    /// victim's live blocks are mostly runs, and a read of a few dead blocks more costs
    /// the device less than a request more. Nothing is verified here: [`Ftl::relocate`]
    /// checks each block's crc32c against the entry it moves.
    pub fn read_live_window(
        &self,
        window_start: u64,
        blocks: &[LiveBlock],
        buf: &mut [u8],
    ) -> Result<ReadCount> {
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
        self.read_victim(&mut reqs, first)
    }

    /// Closed segments without live blocks, waiting for a checkpoint to become free.
    pub fn dead_segments(&self) -> usize {
        self.t.segs.dead_closed().len()
    }

    /// Live-block count of a segment (from the in-memory table).
    pub fn segment_valid(&self, seg: u32) -> u32 {
        self.t.segs.valid(seg)
    }

    /// Counts one live block more in segment `seg` than the map places there: a count
    /// gone wrong, for tests of what the cleaner does with a victim that keeps counting
    /// blocks nothing names.
    #[cfg(feature = "internals")]
    pub fn miscount_live(&self, seg: u32) {
        self.t.segs.count_live(seg);
    }

    /// How many times segment `seg` was freed for reuse (its erase count): the same
    /// count before and after a look at the segment means it was in one life meanwhile.
    pub fn segment_reuses(&self, seg: u32) -> u32 {
        self.t.segs.erase_count(seg)
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
        assert_eq!(coalesce(&[1, 2, 3, 4 + g]), vec![(1, 4 + g)]);
        assert_eq!(coalesce(&[1, 2, 3, 5 + g]), vec![(1, 3), (5 + g, 1)]);
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

    /// A 4 MiB victim two thirds live, its dead blocks scattered at random as uniform
    /// overwrites leave them: about 28 runs read (one per run of 3 or more dead blocks,
    /// before the cut at MAX_READ_BYTES), not the 78 of the rule that read over one dead
    /// block only.
    #[test]
    fn a_victim_two_thirds_live_is_read_in_about_28_runs() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut live = Vec::new();
        for p in 0..1019u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 1000 < 647 {
                live.push(p);
            }
        }
        let r = coalesce(&live);
        let max = MAX_READ_BYTES / BLOCK_SIZE as u64;
        // A read ends where the next live block would take it past MAX_READ_BYTES, or
        // else at a run of more than READ_GAP_BLOCKS dead blocks.
        let mut at_gaps = 1;
        for w in r.windows(2) {
            if w[1].0 - w[0].0 < max {
                let dead = w[1].0 - (w[0].0 + w[0].1);
                assert!(dead > READ_GAP_BLOCKS, "{w:?} should be one read");
                at_gaps += 1;
            }
        }
        assert!((18..=40).contains(&at_gaps), "{at_gaps} runs read");
        let read: u64 = r.iter().map(|&(_, c)| c).sum();
        let n = live.len() as u64;
        assert!(read < n * 3 / 2, "{read} blocks read for {n} live");
    }

    #[test]
    fn the_cleaner_reads_less_deep_beside_users_reads() {
        assert_eq!(victim_read_depth(0), VICTIM_READ_DEPTH);
        assert_eq!(victim_read_depth(1), VICTIM_READ_DEPTH_BESIDE_READS);
    }
}
