//! Free records: dead segments returned to the free list between checkpoints.
//!
//! A checkpoint writes every dirty map page and the whole segment table (about 34 ms
//! under a full device's random overwrites); freeing a dead segment needs much less. Its
//! blocks were all unmapped by entries in the log, so once those entries are durable the
//! segment's old contents are needed by nobody: recovery starts from the last checkpoint
//! (which may still map into the segment) and replays the entries that unmapped them.
//! What it must know is that the segment may now hold newer chunks, which a small record
//! tells it ("segment S is free; every chunk below N is durable", `records::FreeRecord`).
//! A free costs one log sync and one small index commit, and seals only the open chunks
//! that hold a death of one of the segments it frees.
//!
//! Owns nothing: the state it keeps between runs is the checkpointer's (what the last
//! checkpoint recorded closed, which free records it does not supersede yet, the
//! checkpoint in flight), and it runs under the checkpointer's state lock, which a
//! checkpoint holds for its snapshot and its header's batch but not while it syncs and
//! commits its map pages (checkpoint rule 8). Called by the cleaner's runner and by the
//! append loop of a writer out of space.
//!
//! Crash-ordering rules of a free record (tested in `tests/orderings.rs` and by the
//! concurrent crash harness, whose cleaner frees through them):
//! 1. only a segment the last committed checkpoint recorded `Closed`, or one young to it
//!    (rule 7: a stream's open segment at its snapshot, or opened since), and not freed
//!    since except by a committed record, is freed; the others wait for the next
//!    checkpoint: young with TRIM records, named by a record whose commit reported a
//!    failure (when not freed before it: freed before, the record retried lists what the
//!    one maybe applied lists, and more), or with more chunks to list than a record holds
//!    (`LIST_CAP`). While a checkpoint is in flight (between its snapshot
//!    and its header's batch, checkpoint rule 8) only a segment both checkpoints record
//!    closed is freed (no young one; those dead at its snapshot are its own to free,
//!    checkpoint rule 9, and no longer closed), and the checkpoint puts its record again
//!    with its own base. Test:
//!    `a_free_record_whose_commit_failed_after_applying_is_superseded`;
//! 2. the segment is seen dead (no live block) BEFORE each stream's open chunk is checked,
//!    under its lock, for an entry that killed one of its blocks, and such a chunk is
//!    sealed ([`FreeMode::Seal`]) or the segment left for a later record
//!    ([`FreeMode::Settled`]): every entry that unmapped a block of a freed segment is
//!    then in a chunk numbered below `N`, the tracker's next number read afterwards.
//!    Tests: `a_free_record_seals_the_open_chunk_that_killed_the_segment`,
//!    `a_settled_free_waits_for_the_open_chunk_that_killed_the_segment`;
//! 3. the device is synced up to `N` BEFORE the free record is committed: recovery
//!    replays every death before anything is written over the segment. Test:
//!    `a_free_record_is_committed_only_after_the_log_sync`;
//! 4. the record is committed durably BEFORE the segment is discarded or allocated (as
//!    checkpoint rule 4);
//! 5. with no discard delay, the discard completes BEFORE the segment returns to the
//!    free list (checkpoint rule 5, the same code); with one (the default), the segment
//!    is discarded later, if it stays free, under the rules of `engine/discard.rs`;
//! 6. recovery frees the recorded segments BEFORE it looks for chunk heads, and fails
//!    when the log it replays stops short of a record's `N` (checkpoint rule 6 removes
//!    the records with the table that supersedes them). Test:
//!    `recovery_fails_loudly_when_a_free_record_outruns_the_log`;
//! 7. a segment opened after the checkpoint's snapshot (young: the checkpoint recorded it
//!    free, and recovery looks for the chunks of its chain there) is freed with the chain
//!    numbers of every chunk sealed into it since (`Segments::note_chunk`, under the
//!    stream lock; the list starts at the snapshot, under every stream lock), and
//!    recovery steps over those numbers when it does not find them: the chunks are gone
//!    once the segment is reused, and every entry in them was superseded by an entry
//!    below `N` (the segment was dead, rules 2 and 3) before the record was committed.
//!    After a checkpoint whose commit failed nothing is young until the next snapshot
//!    (recovery may start from either checkpoint). A segment freed, reused and dead again
//!    before the next checkpoint is freed again, by a record that lists the chunks of
//!    every life since the checkpoint: it takes the first record's key (the segment).
//!    Under zipf:0.99 hot segments die twice between checkpoints; 62 of a run's 71
//!    checkpoints were for them before. A segment that got a chunk with TRIM records
//!    stops being young: a TRIM record has no later entry superseding it (found by
//!    review: the TRIM segment's carry drops records the log walker no longer needs,
//!    while the checkpoint's map may still name the block). Tests:
//!    `a_young_segment_freed_by_a_record_is_stepped_over_by_recovery`,
//!    `a_segment_open_at_the_checkpoint_is_freed_with_its_chunks_listed`,
//!    `a_segment_freed_twice_between_checkpoints_lists_the_chunks_of_both_lives`,
//!    `a_young_segment_with_trim_records_waits_for_a_checkpoint`.

use super::Ftl;
use crate::error::Result;
use crate::index::{IndexStore, Key, Op};
use crate::records::{FreeRecord, FREE_MAX_CHUNKS};
use crate::sync::lock;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Most chunk numbers a free record lists: as many as keep it within 4 KiB, a map page's
/// size (506; the format takes up to [`FREE_MAX_CHUNKS`]). sled writes a value past 128
/// KiB, or a leaf of up to 16 values it rewrites whole, to a file of its own
/// (`index::sled_store` rule 3): 65,536 chunks made a record of 512 KiB, reachable with
/// large segments and a FLUSH after every write (found by review, 2026-11-29). A segment
/// with more to list waits for a checkpoint. A handful in unit tests, so that they reach it.
#[cfg(not(test))]
const LIST_CAP: usize = (crate::device::BLOCK_SIZE - crate::records::free_offsets::CHUNKS - 4) / 8;
const _: () = assert!(LIST_CAP <= FREE_MAX_CHUNKS);
#[cfg(test)]
pub(super) const LIST_CAP: usize = if FREE_MAX_CHUNKS > 8 { 8 } else { FREE_MAX_CHUNKS };

/// Which dead segments a free record frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeMode {
    /// Every freeable one; the open chunks that killed a block of one are sealed first
    /// (rule 2), each a partly filled chunk written at once.
    Seal,
    /// Only those whose blocks were all killed by entries in chunks already sealed: no
    /// chunk is sealed early (no partial chunk, no write on the caller's thread). The
    /// others wait until their killers' chunks fill, which under load takes a few
    /// milliseconds.
    Settled,
}

/// What one [`Ftl::free_dead`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FreeReport {
    /// Segments freed.
    pub segments_freed: usize,
    /// Open chunks sealed because they held a death of a freed segment (rule 2).
    pub chunks_sealed: usize,
    /// Dead segments left for a checkpoint (those rule 1 leaves to it).
    pub dead_left: usize,
    /// With [`FreeMode::Settled`], freeable segments left because an open chunk killed
    /// one of their blocks.
    pub unsettled: usize,
}

impl<D: crate::device::BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Frees the dead segments the last checkpoint recorded closed, without a
    /// checkpoint: seals the open chunks that killed their blocks, syncs the log, commits
    /// a free record per segment, releases them (rules 1 to 5; discarded then or later,
    /// `Config::discard_delay`).
    pub fn free_dead(&self) -> Result<FreeReport> {
        self.free_dead_with(FreeMode::Seal)
    }

    /// [`Ftl::free_dead`], but with [`FreeMode::Settled`] only the segments no open chunk
    /// killed a block of are freed, and nothing is sealed.
    pub fn free_dead_with(&self, mode: FreeMode) -> Result<FreeReport> {
        self.free_dead_unless(mode, || false)
    }

    /// [`Ftl::free_dead_with`], unless `done` says, once the checkpointer's lock is held
    /// (a free record or checkpoint that held it may have freed what the caller needed),
    /// that nothing is needed any more: then nothing is done.
    pub(super) fn free_dead_unless(
        &self,
        mode: FreeMode,
        done: impl Fn() -> bool,
    ) -> Result<FreeReport> {
        let mut t = Instant::now();
        // Tombstone rule 1, as for a checkpoint.
        self.carry_tombstones_retrying(false)?;
        let ck = &self.ckpt;
        let _one = ck.lock();
        self.check_poison()?;
        if done() {
            return Ok(FreeReport::default());
        }
        let times = &ck.free_times;
        times.add(&times.lock, &mut t);
        let dead = self.t.segs.dead_closed();
        // Rule 1 (`dead_closed` is in ascending order, as `killed_any` wants).
        let mut freeable = self.freeable_of(&dead);
        let mut report = FreeReport {
            dead_left: dead.len() - freeable.len(),
            ..Default::default()
        };
        // Rule 2: seen dead above; now the open chunks, each under its lock.
        match mode {
            FreeMode::Seal if !freeable.is_empty() => {
                let mut sealed = Vec::new();
                let r = self.log.seal_killers(&self.t, &segs_of(&freeable), &mut sealed);
                report.chunks_sealed = sealed.len();
                // Written even when a seal failed (engine rule 5: their numbers complete).
                self.write_chunks(sealed)?;
                r?;
            }
            FreeMode::Seal => {}
            FreeMode::Settled => {
                let open = self.log.open_killers(&segs_of(&freeable));
                freeable.retain(|(s, _)| open.binary_search(s).is_err());
                report.unsettled = open.len();
            }
        }
        // Rule 7: the chunks a young segment's record lists.
        let lists = self.record_lists(&freeable);
        // Those left for the checkpoint are dead segments it must still free.
        report.dead_left += freeable.len() - lists.len();
        if lists.is_empty() {
            return Ok(report);
        }
        let segs: Vec<u32> = lists.iter().map(|&(s, _)| s).collect();
        times.add(&times.snapshot, &mut t);
        let chain = self.log.tracker().next_seq();
        // Rule 3.
        self.flush_upto(chain)?;
        times.add(&times.sync, &mut t);
        let records = self.free_records(lists, chain);
        // Before the commit, so that one reporting a failure but applied all the same is
        // superseded by the next checkpoint (checkpoint rule 6) and its segments are not
        // freed by a second record.
        ck.note_freed(&segs);
        // Rule 4.
        self.stuck_poisons(ck.index.commit(put_ops(&records)))?;
        times.add(&times.commit, &mut t);
        {
            let mut recorded = lock(&ck.recorded);
            let mut in_flight = lock(&ck.in_flight);
            for r in records {
                self.t.segs.young_forget(r.segment);
                recorded.insert(r.segment, r.chunks.clone());
                // Rule 8: the checkpoint in flight puts it again with its base.
                if let Some(f) = in_flight.as_mut() {
                    f.freed.push(r);
                }
            }
            if in_flight.is_some() {
                ck.frees_beside.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Rule 5.
        let released = self.discard_and_release(&segs);
        times.add(&times.release, &mut t);
        ck.frees.fetch_add(1, Ordering::Relaxed);
        ck.freed_segments
            .fetch_add(segs.len() as u64, Ordering::Relaxed);
        released?;
        report.segments_freed = segs.len();
        Ok(report)
    }

    /// The chunk numbers each free record of `freeable` ([`Ftl::freeable_of`]) lists
    /// (rule 7): none for a segment the checkpoint recorded closed; a young segment's
    /// since the snapshot, with those its record listed if it was freed before since
    /// then (the new record takes that one's key). It is dead and closed: no chunk is
    /// sealed into it any more. A segment with a longer list than a record may hold is
    /// left out (it waits for a checkpoint).
    pub(super) fn record_lists(&self, freeable: &[(u32, bool)]) -> Vec<(u32, Vec<u64>)> {
        let recorded = lock(&self.ckpt.recorded);
        freeable
            .iter()
            .map(|&(s, closed)| {
                let mut c = Vec::new();
                if !closed {
                    c.extend(recorded.get(&s).into_iter().flatten());
                    c.extend(self.t.segs.young_chunks(s).unwrap_or_default());
                }
                (s, c)
            })
            .filter(|(_, c)| c.len() <= LIST_CAP)
            .collect()
    }

    /// The free records of `lists` ([`Ftl::record_lists`]), following the last
    /// checkpoint, their deaths all in chunks below `chain`.
    pub(super) fn free_records(&self, lists: Vec<(u32, Vec<u64>)>, chain: u64) -> Vec<FreeRecord> {
        let base = self.ckpt.base.load(Ordering::Relaxed);
        lists
            .into_iter()
            .map(|(s, chunks)| FreeRecord {
                segment: s,
                epoch: self.epoch,
                base,
                chain,
                erase_count: self.t.segs.erase_count(s) + 1,
                chunks,
            })
            .collect()
    }

    /// Dead segments a free record may free now (rule 1); the others wait for a
    /// checkpoint.
    pub fn freeable_segments(&self) -> usize {
        self.freeable_of(&self.t.segs.dead_closed()).len()
    }

    /// Dead segments a free record may free now (rule 1), and of them those no open
    /// chunk killed a block of (settled: [`FreeMode::Settled`] frees them without sealing
    /// anything). Looks at every stream's open chunk under its lock.
    pub fn freeable_and_settled(&self) -> (usize, usize) {
        let segs = segs_of(&self.freeable_of(&self.t.segs.dead_closed()));
        if segs.is_empty() {
            return (0, 0);
        }
        let open = self.log.open_killers(&segs);
        (segs.len(), segs.len() - open.len())
    }

    /// Of the dead segments `dead`, those rules 1 and 7 let a free record free: recorded
    /// closed by the last committed checkpoint, or opened since its snapshot (young), and
    /// not freed since unless by a committed record (order kept). Each comes with whether
    /// the checkpoint recorded it closed (its record lists no chunks) or it is young (rule
    /// 7: its record lists them).
    pub(super) fn freeable_of(&self, dead: &[u32]) -> Vec<(u32, bool)> {
        let closed = lock(&self.ckpt.closed);
        let freed = lock(&self.ckpt.freed);
        let recorded = lock(&self.ckpt.recorded);
        // Rule 8: while a checkpoint is in flight, no young segment (their lists start at
        // its snapshot, not at the last one's). Those it found dead are not closed any
        // more: its own records free them (checkpoint rule 9).
        let in_flight = lock(&self.ckpt.in_flight).is_some();
        dead.iter()
            .filter_map(|&s| {
                // Tombstone rule 4: a carry that left blocks out waits for a checkpoint.
                if self.t.segs.carry_skipped(s) {
                    None
                } else if closed.get(s as usize).copied().unwrap_or(false) {
                    Some((s, true))
                } else if !in_flight
                    && (!freed.contains(&s) || recorded.contains_key(&s))
                    && self.t.segs.is_young(s)
                {
                    Some((s, false))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// The index operations that put `records`.
pub(super) fn put_ops(records: &[FreeRecord]) -> Vec<Op> {
    records
        .iter()
        .map(|r| Op::Put(Key::free(r.segment), r.encode()))
        .collect()
}

/// The segments of [`Ftl::freeable_of`]'s list.
fn segs_of(freeable: &[(u32, bool)]) -> Vec<u32> {
    freeable.iter().map(|&(s, _)| s).collect()
}
