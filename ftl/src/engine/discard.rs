//! Deferred discard: freed segments are discarded on the backing once they have stayed
//! free for [`Config::discard_delay`](crate::Config::discard_delay), not when they are
//! freed.
//!
//! Why: on a full device under overwrites the cleaner frees segments that writers take
//! again within a second, and write whole before anything reads them. Discarding each one
//! first cost the backing as much as the writes: on a file it is a hole punched and filled
//! again (the file system frees and re-allocates the extents), on an SSD a TRIM of pages
//! about to be overwritten anyway. `ftlblk bench --tests steady` (2 GiB file, 100% full,
//! 32 writers, 3 passes), 3 alternating A/B pairs: 55-66K IOPS without the discards
//! against 43-48K with them (`docs/steady.md`). Segments that stay free, as after an
//! `fstrim` or on an idle device, are still discarded: their space goes back to the
//! backing's file system within the delay plus a turn of the cleaner's runner.
//!
//! Rules (the segment table carries them out, `segments.rs`; tests
//! `segments_waiting_for_a_discard_are_out_of_reach_while_discarded` and, in
//! `tests/orderings.rs`, `a_segment_being_discarded_later_is_not_allocatable_meanwhile`
//! (rule 1) and `a_segment_reused_before_its_discard_keeps_its_data` (rule 2); mutants
//! `discard-1` and `discard-2` in `scripts/orderings-mutants.py`):
//! 1. a segment is discarded only while it is out of the free list (taken by
//!    `take_for_discard`, put back by `discarded`): no writer is handed it during the
//!    discard, which would wipe what it wrote;
//! 2. a segment allocated before its discard is never discarded afterwards;
//! 3. a discarded segment's first block is zeroed again AFTER its discard, before it
//!    returns to the free list, as checkpoint rule 5 does for a discard at free time: a
//!    discard need not read back as zeros (a block device's TRIM may leave the old
//!    data, or anything), and the log walker must see nothing of the segment's old use
//!    (`engine/tombstones.rs`, rule 3). A failed zeroing poisons the FTL. Test:
//!    `a_deferred_discard_leaves_the_segment_head_zeroed`;
//! 4. (the engine's rule 5, unchanged) a segment reaches the free list, and so the
//!    discard queue, only through a durable checkpoint or free record that records it
//!    dead;
//! 5. the discarder leaves the cleaner's reserve and one segment more in the free list:
//!    while a discard runs, the segments it took are out of reach, and with the reserve
//!    among them a relocation found no segment (and a writer with no cleaner failed with
//!    ENOSPC) while free segments existed (found by review, 2026-11-27). Tests:
//!    `segments::tests::the_discarder_leaves_the_reserve_in_the_free_list`,
//!    `orderings::a_discard_never_takes_the_reserve_from_a_writer`.
//! 6. a writer that finds no free segment while segments are out for a discard waits for
//!    them, with or without a cleaner attached: rule 5 leaves one segment for writers,
//!    and two streams opening segments during one discard found none and failed with
//!    ENOSPC when no cleaner was attached (`--no-cleaner`, or after the cleaner's thread
//!    ended; found by review, 2026-11-29). Test:
//!    `orderings::writers_of_two_streams_wait_for_a_discard_without_a_cleaner`.
//!
//! A crash loses the queue: segments freed and not yet discarded stay allocated on the
//! backing until they are reused. `Ftl::close` discards everything waiting, the reserve
//! included (no writer is left then).
//!
//! Called by the cleaner's runner (every turn), by each checkpoint, by `close`, and by
//! the daemon's control plane on an idle tick (`src/control.rs`).

use super::Ftl;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::index::IndexStore;
use crate::tables::LiveCounters;
use std::time::Instant;

/// Segments discarded between two looks at the queue.
const DISCARD_BATCH: usize = 16;

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Discards the free segments that have waited [`crate::Config::discard_delay`] (every
    /// waiting one with `all`). Returns how many were discarded. A failed discard is
    /// counted as not done and loses nothing (discard is advisory).
    pub fn discard_waiting(&self, all: bool) -> usize {
        let cutoff = if all {
            None
        } else {
            match Instant::now().checked_sub(self.cfg.discard_delay) {
                Some(c) => Some(c),
                None => return 0,
            }
        };
        // Rule 5: never the reserve.
        self.discard_queue(cutoff, self.cfg.gc_reserve_segments + 1)
    }

    /// At a clean stop, with no writer or cleaner left: every waiting segment, the
    /// reserve's too (the queue is lost with the process, and `discard_waiting` left up
    /// to the reserve and one more allocated on the backing after a clean stop; found by
    /// review, 2026-11-29). Test: `orderings::close_discards_every_segment_waiting_for_its_discard`.
    pub(super) fn discard_all_at_close(&self) -> usize {
        self.discard_queue(None, 0)
    }

    /// Discards the waiting segments freed before `cutoff` (all: `None`), leaving `keep`
    /// segments in the free list.
    fn discard_queue(&self, cutoff: Option<Instant>, keep: usize) -> usize {
        let mut done = 0;
        loop {
            // Rule 1: out of the free list while discarded.
            let taken = self.t.segs.take_for_discard(cutoff, DISCARD_BATCH, keep);
            if taken.is_empty() {
                return done;
            }
            let segs: Vec<u32> = taken.iter().map(|&(s, _)| s).collect();
            done += segs.iter().filter(|&&s| self.discard_segment(s)).count();
            // Rule 3, for every segment taken: a discard that failed may have done part
            // of its work. A failure poisons the FTL (the next write or FLUSH reports
            // it); the discard itself is advisory and reports nothing. A segment whose
            // first block could not be zeroed stays out of the free list, as in
            // `discard_and_release`: its head may still show its old use.
            let (zeroed, _) = self.zero_heads(&segs);
            let back: Vec<(u32, u64)> = taken
                .iter()
                .zip(zeroed)
                .filter_map(|(&t, ok)| ok.then_some(t))
                .collect();
            self.t.segs.discarded(&back, taken.len());
            self.space.notify();
        }
    }

    /// Discards segment `s` on the backing and counts the bytes; says whether it was.
    /// Discard is advisory: a failure loses nothing, so it is not an error.
    pub(super) fn discard_segment(&self, s: u32) -> bool {
        let geo = &self.t.geo;
        let off = geo.segment_start(s) * BLOCK_SIZE as u64;
        let ok = self.dev.discard(off, geo.segment_bytes).is_ok();
        if ok {
            LiveCounters::add(&self.t.counters.discarded_bytes, geo.segment_bytes);
        }
        ok
    }

    /// Free segments waiting for their discard.
    pub fn undiscarded_segments(&self) -> usize {
        self.t.segs.undiscarded_count()
    }
}
