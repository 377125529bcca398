//! Checkpoints: the map and segment table written to the index, so recovery replays only
//! the log written since. A dead segment returns to the free list through a checkpoint
//! or, between them, through a free record (`free.rs`, which shares the lock and the
//! state kept here: what the last checkpoint recorded closed, and which free records it
//! does not supersede yet).
//!
//! Owns the index store and what checkpoints keep between runs ([`Checkpointer`]: the
//! one-at-a-time lock, the state lock it shares with free records, the checkpoint in
//! flight, blocks appended since the last one, the count and the step times). A
//! checkpoint is a step over every part of the engine (it seals each stream under its
//! lock, snapshots the tables, syncs through the device-sync group, frees segments and
//! wakes writers), so it lives beside the engine as its child. Called by the
//! engine (open, close, a writer out of space without a cleaner), by the cleaner's
//! runner, and by tools.
//!
//! Crash-ordering rules of a checkpoint:
//! 1. every stream's open chunk is sealed BEFORE the snapshot is taken, so the snapshot
//!    only names blocks of chunks below `next_chunk_seq`; they are written after the
//!    stream locks are released, like any sealed chunk, and rule 3 waits for them;
//! 2. the snapshot (dirty map pages, every segment record, the checkpoint header with the
//!    next chain number) is taken with every stream lock held, so it is exactly the state
//!    after chain number `next_chunk_seq - 1` and no append is half done;
//! 3. the device is synced up to `next_chunk_seq` AFTER the stream locks are released
//!    (writers go on meanwhile; a sync under the locks stalled every writer for its whole
//!    duration) and BEFORE the index commit: the checkpoint never names a block that is
//!    not durable;
//! 4. the index batch is committed atomically and durably BEFORE any segment it records
//!    as dead is put on the free list or discarded (the checkpoint's own free records
//!    release theirs before the header's batch, after their own commit: rule 9): a
//!    dead segment's blocks may be
//!    overwritten only when the map changes that killed them are durable, and recovery
//!    never needs a chunk older than the checkpoint it starts from;
//! 5. a dead segment's discard has completed (or failed) BEFORE the segment returns to
//!    the free list and waiting writers are woken: a discard still in flight would zero
//!    the chunks a writer puts there (acknowledged data, and the chain recovery follows).
//!    Test: `tests/orderings.rs`, `a_freed_segment_is_not_allocatable_until_...`.
//!    Its first block is zeroed too, after the discard (which may not zero, or fail):
//!    the log walker then sees nothing of the segment's old use, which an index
//!    rebuild (`rebuild.rs`) relies on once the TRIM records that hid its blocks are
//!    gone (`engine/tombstones.rs`, rule 3). A failed zeroing leaves the segment dead
//!    and poisons the FTL (the backing fails writes). Test: `tests/rebuild.rs`,
//!    `a_freed_segment_shows_nothing_to_the_walker`;
//! 6. the free records committed since the last checkpoint are removed in the SAME batch
//!    as the segment table that supersedes them (never before: recovery from the older
//!    checkpoint needs them; never after: a stale record would free a segment the newer
//!    table says holds data). Test: `tests/orderings.rs`,
//!    `a_checkpoint_removes_the_free_records_it_supersedes`;
//! 7. the map pages are committed in batches of `Config::checkpoint_page_batch` (one
//!    sled batch of all of them held several times their size in RAM) AFTER rule 3's
//!    sync (they name only durable blocks) and BEFORE the batch with the header, which
//!    holds no page (rule 8 wants it short); the first of them puts a
//!    [`PartialCheckpoint`] record, the header's batch removes it. A crash in between
//!    leaves pages newer than the header and its segment records: the roll-forward from
//!    the old header replays every entry they hold, so the map comes out right, and
//!    recovery recounts the live counts from the map because the record is there. Test:
//!    `tests/orderings.rs`, `a_checkpoint_cut_between_its_page_batches_recovers`;
//! 8. the state lock free records hold is let go from the snapshot until the header's
//!    batch, so free records run while the pages are synced and committed (under
//!    uniform overwrites of a full 2 GiB device 90% of the writers' waits for free space
//!    fell inside checkpoints, which took 44 ms; on a large device, seconds). A record
//!    committed then follows the last checkpoint (its `base`) and frees only a segment
//!    both checkpoints record closed (alive at this one's snapshot: the dead ones are
//!    this checkpoint's to free, rule 9, marked freed before the state lock is let go;
//!    and no young one: its chunk list starts at this snapshot, not the last one's).
//!    The header's batch, built and committed with the state lock held again, puts each
//!    such record again with the new base, in the SAME batch as the segment table that
//!    records the segment closed: recovery from either checkpoint finds the segment
//!    free. Without the second put, the newer table
//!    alone would say closed a segment writers have overwritten since. Tests:
//!    `tests/orderings.rs`, `a_free_record_during_a_checkpoint_follows_both_checkpoints`,
//!    `a_free_record_during_a_checkpoint_leaves_its_dead_segments_to_it`;
//! 9. the segments dead at the snapshot that a free record could free then (free rule 1:
//!    recorded closed by the last checkpoint or young to it, not freed since) are freed
//!    by the checkpoint's own free records, which follow the last checkpoint and name
//!    `next_chunk_seq` as their chain: every death of theirs is in a chunk below it (the
//!    snapshot seals every open chunk, rule 1, which free rule 2 asks). Their chunk
//!    lists are taken BEFORE the young lists restart at the snapshot; the records are
//!    committed AFTER rule 3's sync (free rule 3) and BEFORE the segments are released
//!    (free rule 4), which is then, before the map pages: they no longer wait for the
//!    header's batch (under uniform overwrites of a full device the writers' long waits
//!    for space were the checkpoint's page commit). The header's batch removes the
//!    records (rule 6: its table records the segments free), and the segments are not
//!    released again at its end. A record whose commit failed leaves its segment to the
//!    end of the checkpoint. Tests: `tests/orderings.rs`,
//!    `a_checkpoint_frees_its_dead_segments_before_its_map_pages` and
//!    `a_free_record_during_a_checkpoint_leaves_its_dead_segments_to_it` (a power cut
//!    while the sync is held).

use super::Ftl;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::index::{IndexStore, Key, Op};
use crate::records::{CheckpointRecord, FreeRecord, MapPage, PartialCheckpoint};
use crate::sync::{lock, AtomicU64, Mutex};
use std::sync::atomic::Ordering;
use std::collections::HashMap;
use std::time::Instant;

/// The index and what checkpoints keep between runs.
pub(crate) struct Checkpointer<I> {
    pub(crate) index: I,
    /// One checkpoint at a time (held for the whole of one).
    one: Mutex<()>,
    /// The state lock: a free record holds it throughout, a checkpoint for its snapshot
    /// and for its header's batch, not while it syncs and commits its map pages (rule 8:
    /// free records run meanwhile).
    lock: Mutex<()>,
    /// The checkpoint between its snapshot and its header's batch, if one is.
    pub(super) in_flight: Mutex<Option<InFlight>>,
    /// Blocks appended since the last checkpoint's snapshot.
    appended: AtomicU64,
    /// Checkpoints completed since open.
    count: AtomicU64,
    times: CheckpointTimes,
    /// The same steps of free records (`snapshot` is sealing the killers' chunks).
    pub(super) free_times: CheckpointTimes,
    /// Per segment: recorded `Closed` by the last committed checkpoint and not freed since
    /// (free rule 1: only these may be freed by a free record).
    pub(super) closed: Mutex<Vec<bool>>,
    /// Segments whose free records may be in the index and are not yet superseded (rule
    /// 6): added before a free record's commit, so a commit that reports a failure but
    /// was applied is removed too.
    pub(super) freed: Mutex<Vec<u32>>,
    /// Segments freed by a committed free record since the last checkpoint, each with the
    /// chunk numbers its record listed (free rule 7: freed again, it lists them with those
    /// of its new life, since the new record takes the old one's key).
    pub(super) recorded: Mutex<HashMap<u32, Vec<u64>>>,
    /// `next_chunk_seq` of the last committed checkpoint (free records carry it).
    pub(super) base: AtomicU64,
    /// Free records committed since open (each one commit, for any number of segments).
    pub(super) frees: AtomicU64,
    /// Segments freed by free records since open.
    pub(super) freed_segments: AtomicU64,
    /// Free records committed while a checkpoint was in flight (rule 8).
    pub(super) frees_beside: AtomicU64,
    /// Segments checkpoints freed by their own free records (rule 9).
    pub(super) own_freed: AtomicU64,
}

impl<I> Checkpointer<I> {
    /// A checkpointer over `index`, which holds free records for `freed` (recovery found
    /// them; the session's first checkpoint removes them).
    pub(crate) fn new(index: I, freed: Vec<u32>) -> Self {
        Checkpointer {
            index,
            one: Mutex::new(()),
            lock: Mutex::new(()),
            in_flight: Mutex::new(None),
            appended: AtomicU64::new(0),
            count: AtomicU64::new(0),
            times: CheckpointTimes::default(),
            free_times: CheckpointTimes::default(),
            closed: Mutex::new(Vec::new()),
            freed: Mutex::new(freed),
            recorded: Mutex::new(HashMap::new()),
            base: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            freed_segments: AtomicU64::new(0),
            frees_beside: AtomicU64::new(0),
            own_freed: AtomicU64::new(0),
        }
    }

    /// Free records for `segs` are about to be committed: the next checkpoint removes
    /// them (free rule 6; each segment listed once), and the segments are no longer
    /// closed at the last checkpoint (freed since: free rule 1).
    pub(super) fn note_freed(&self, segs: &[u32]) {
        // In `freeable_of`'s order.
        let mut closed = lock(&self.closed);
        let mut freed = lock(&self.freed);
        for &s in segs {
            if !freed.contains(&s) {
                freed.push(s);
            }
            if let Some(c) = closed.get_mut(s as usize) {
                *c = false;
            }
        }
    }

    /// The state lock shared by checkpoints and free records.
    pub(super) fn lock(&self) -> crate::sync::MutexGuard<'_, ()> {
        lock(&self.lock)
    }

    /// The one-checkpoint-at-a-time lock.
    pub(super) fn one(&self) -> crate::sync::MutexGuard<'_, ()> {
        lock(&self.one)
    }

    /// True while a checkpoint runs or a free record holds the state lock. A lock a
    /// panic poisoned is free (`lock` takes it over): as busy, writers past a quarter of
    /// the map cache dirty never checkpointed again and waited at half (found by review,
    /// 2026-11-27).
    pub(crate) fn busy(&self) -> bool {
        fn held(m: &Mutex<()>) -> bool {
            matches!(m.try_lock(), Err(std::sync::TryLockError::WouldBlock))
        }
        held(&self.one) || held(&self.lock)
    }

    /// `n` blocks were appended (writes and relocations).
    pub(crate) fn note_appended(&self, n: u64) {
        self.appended.fetch_add(n, Ordering::Relaxed);
    }

    /// Checkpoints completed since open.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Where checkpoints spent their time since open.
    pub(crate) fn times(&self) -> CheckpointTimesNs {
        self.times.get()
    }

    /// Where free records spent their time since open (`snapshot_ns`: sealing and
    /// writing the chunks that killed the segments).
    pub(crate) fn free_times(&self) -> CheckpointTimesNs {
        self.free_times.get()
    }
}

/// A checkpoint between its snapshot and its header's batch (rule 8).
pub(super) struct InFlight {
    /// Free records committed meanwhile (with the last checkpoint's base): its header's
    /// batch puts them again with its own.
    pub(super) freed: Vec<FreeRecord>,
}

/// Nanoseconds checkpoints spent in each step since open, summed.
#[derive(Default)]
pub(crate) struct CheckpointTimes {
    /// Carrying tombstones and waiting for the one-at-a-time lock (a free record or
    /// checkpoint of another thread).
    pub(crate) lock: AtomicU64,
    /// Waiting for the stream locks, sealing and taking the snapshot (writers wait).
    pub(crate) snapshot: AtomicU64,
    /// Writing the sealed chunks and syncing the log (rules 1 and 3).
    pub(crate) sync: AtomicU64,
    /// The index commit (rule 4).
    pub(crate) commit: AtomicU64,
    /// Discarding and releasing dead segments (rule 5).
    pub(crate) release: AtomicU64,
}

/// A plain copy of [`CheckpointTimes`], for `stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointTimesNs {
    pub lock_ns: u64,
    pub snapshot_ns: u64,
    pub sync_ns: u64,
    pub commit_ns: u64,
    pub release_ns: u64,
}

impl CheckpointTimes {
    pub(super) fn add(&self, at: &AtomicU64, since: &mut Instant) {
        at.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        *since = Instant::now();
    }

    pub(crate) fn get(&self) -> CheckpointTimesNs {
        CheckpointTimesNs {
            lock_ns: self.lock.load(Ordering::Relaxed),
            snapshot_ns: self.snapshot.load(Ordering::Relaxed),
            sync_ns: self.sync.load(Ordering::Relaxed),
            commit_ns: self.commit.load(Ordering::Relaxed),
            release_ns: self.release.load(Ordering::Relaxed),
        }
    }
}

/// What a checkpoint did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointReport {
    pub pages_written: usize,
    pub segments_freed: usize,
    pub next_chunk_seq: u64,
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Writes a checkpoint now.
    pub fn checkpoint(&self) -> Result<CheckpointReport> {
        let r = self.checkpoint_locked()?;
        // Outside the checkpoint lock: free segments that waited long enough.
        self.discard_waiting(false);
        Ok(r)
    }

    /// [`Ftl::checkpoint`] if one is due ([`Ftl::checkpoint_due`]) once the checkpoint
    /// lock is held; `None` when not. A caller that saw one due while another thread's
    /// checkpoint was about to start (the daemon's control plane polls every second, the
    /// cleaner's runner every turn) does not run a second one right behind it.
    pub fn checkpoint_if_due(&self) -> Result<Option<CheckpointReport>> {
        self.checkpoint_if(|| self.checkpoint_due())
    }

    /// A checkpoint if `needed` holds before and, once the checkpoint lock is held (a
    /// checkpoint under way is waited for), still holds after; `None` when not.
    pub(super) fn checkpoint_if(&self, needed: impl Fn() -> bool) -> Result<Option<CheckpointReport>> {
        if !needed() {
            return Ok(None);
        }
        let t = Instant::now();
        self.carry_tombstones()?;
        let one = self.ckpt.one();
        if !needed() {
            return Ok(None);
        }
        let r = self.checkpoint_held(one, t)?;
        // Outside the checkpoint lock, as after any checkpoint.
        self.discard_waiting(false);
        Ok(Some(r))
    }

    fn checkpoint_locked(&self) -> Result<CheckpointReport> {
        let t = Instant::now();
        // Tombstone rule 1: carried segments of the TRIM stream are freeable.
        self.carry_tombstones()?;
        let one = self.ckpt.one();
        self.checkpoint_held(one, t)
    }

    /// The checkpoint, its one-at-a-time lock held (`_one`, taken after carrying
    /// tombstones at `t`).
    pub(super) fn checkpoint_held(
        &self,
        _one: crate::sync::MutexGuard<'_, ()>,
        mut t: Instant,
    ) -> Result<CheckpointReport> {
        let ck = &self.ckpt;
        let state = ck.lock();
        self.check_poison()?;
        let times = &ck.times;
        times.add(&times.lock, &mut t);
        let (tables, map, segs) = (&self.t, &self.t.map, &self.t.segs);
        let mut guards = self.log.lock_all();
        // Rule 1: sealed under the locks; written once they are released (below).
        let mut sealed = Vec::new();
        for (sid, guard) in guards.iter_mut().enumerate() {
            match self.log.seal_open(tables, sid as u8, guard) {
                Ok(Some(c)) => sealed.push(c),
                Ok(None) => {}
                Err(e) => {
                    // Engine rule 5: the chunks sealed so far are written (their
                    // numbers completed) before the error returns.
                    drop(guards);
                    let _ = self.write_chunks(sealed);
                    return Err(e);
                }
            }
        }
        let next_chunk_seq = self.log.tracker().next_seq();
        // Rule 2.
        #[cfg(test)]
        crate::append::tests::maybe_park(&crate::append::tests::PARK_AT_SNAPSHOT);
        // Map rule 2: the taken pages stay cached until the commit returned.
        let pages = map.take_dirty();
        let dirty: Vec<u64> = pages.iter().map(|p| p.0).collect();
        // A panic from here until the commit's outcome is known (the I/O edge catches it,
        // and the device went on) left the taken pages clean and never committed: the
        // next checkpoint skipped them while its header moved recovery's start past
        // their changes, and a restart lost them (found by review, 2026-11-27). They are
        // dirty again then, and the FTL read-only: a restart recovers from the last
        // checkpoint that was whole.
        let appended_back = std::cell::Cell::new(0u64);
        let unwinding = OnUnwind(Some(|| {
            ck.appended.fetch_add(appended_back.get(), Ordering::Relaxed);
            map.uncommitted(&dirty);
            lock(&ck.closed).clear();
            segs.young_off();
            lock(&ck.in_flight).take();
            self.set_poison("a checkpoint panicked before its commit".into());
        }));
        let dead = segs.dead_closed();
        // Rule 9: those a free record could free now (before the young lists restart).
        let own = self.record_lists(&self.freeable_of(&dead));
        let seg_records = segs.records(&dead);
        let closed: Vec<bool> = seg_records
            .iter()
            .map(|r| r.segment != 0 && r.state == crate::records::SegState::Closed)
            .collect();
        let header = CheckpointRecord {
            uuid: self.sb.uuid,
            epoch: self.epoch,
            next_chunk_seq,
            next_entry_seq: self.log.next_entry_seq(),
            exported_blocks: tables.geo.exported_blocks,
            segment_count: tables.geo.segment_count,
            session: self.session,
            counters: tables.counters.get(),
            cursors: guards.iter().map(|g| g.cursor).collect(),
        };
        // Given back if the checkpoint fails or panics: a failed checkpoint reset the
        // count, so the next one was due only `checkpoint_blocks` later (recovery's replay
        // bound doubled, dead segments waited; found by review, 2026-11-29).
        let appended = ck.appended.swap(0, Ordering::Relaxed);
        appended_back.set(appended);
        // Free rule 7: the streams' open segments and those opened from here on are
        // young to this checkpoint (their chunks from here on are listed).
        segs.young_reset(header.cursors.iter().flatten().map(|&(s, _)| s));
        drop(guards);
        // Rule 9: the checkpoint's own free records, for the next checkpoint to remove
        // if this one fails (as free rule 6); their segments no longer closed BEFORE the
        // state lock is let go (rule 8: a record beside the checkpoint would free them
        // too).
        let own = self.free_records(own, next_chunk_seq);
        ck.note_freed(&own.iter().map(|r| r.segment).collect::<Vec<_>>());
        // Rule 6: the records committed before the snapshot are those this table
        // supersedes (and its own records).
        let superseded = lock(&ck.freed).clone();
        // Rule 8: free records run while the pages are synced and committed.
        *lock(&ck.in_flight) = Some(InFlight { freed: Vec::new() });
        drop(state);
        #[cfg(test)]
        crate::append::tests::maybe_park(&crate::append::tests::PARK_IN_CHECKPOINT);
        times.add(&times.snapshot, &mut t);
        // The sealed chunks are written now: under the stream locks they held every
        // writer for up to one chunk write per stream. Rule 3's sync waits for them (and
        // any other chunk below the snapshot); then rule 7. On failure the pages stay
        // dirty for the next checkpoint.
        let pages_written = pages.len();
        let mut released = Vec::new();
        // A freed segment whose first block could not be zeroed: the FTL is poisoned, the
        // segment stays out of the free list, and the checkpoint, complete, reports it.
        let mut zero_failed = None;
        let paged = self
            .write_chunks(sealed)
            .and_then(|()| self.flush_upto(next_chunk_seq))
            .and_then(|()| {
                times.add(&times.sync, &mut t);
                released = self.free_own(&own, &mut zero_failed);
                times.add(&times.release, &mut t);
                self.commit_pages(pages, next_chunk_seq)
            });
        // Rule 8: the header's batch, with no free record running.
        let state = ck.lock();
        let rebased = lock(&ck.in_flight).take().map(|f| f.freed).unwrap_or_default();
        let committed = paged.and_then(|()| {
            let mut ops = Vec::with_capacity(seg_records.len() + superseded.len() + rebased.len() + 2);
            // Rule 7: also the record an earlier checkpoint that failed between its
            // batches left.
            ops.push(Op::Remove(Key::partial()));
            for r in &seg_records {
                ops.push(Op::Put(Key::segment(r.segment), r.encode()));
            }
            // Rule 6: the free records go in the batch whose segment table supersedes
            // them.
            for &s in &superseded {
                ops.push(Op::Remove(Key::free(s)));
            }
            // Rule 8: those committed since the snapshot follow this checkpoint too.
            for r in &rebased {
                let r = FreeRecord {
                    base: next_chunk_seq,
                    ..r.clone()
                };
                ops.push(Op::Put(Key::free(r.segment), r.encode()));
            }
            ops.push(Op::Put(Key::checkpoint(), header.encode()));
            // Rule 4.
            self.stuck_poisons(ck.index.commit(ops))
        });
        unwinding.disarm();
        if let Err(e) = committed {
            ck.appended.fetch_add(appended, Ordering::Relaxed);
            map.uncommitted(&dirty);
            // The commit may have been applied all the same (an index that fails after
            // writing): its table may record as free segments the old bitmap says are
            // closed. Nothing is freeable by free records until a checkpoint succeeds
            // (`freed` keeps every record: the next checkpoint removes them all).
            lock(&ck.closed).clear();
            segs.young_off();
            return Err(e);
        }
        times.add(&times.commit, &mut t);
        map.committed(&dirty);
        // The state lock is held: no free record was added since `rebased` was taken.
        // The records this table supersedes are gone; those it rebased stay until the
        // next one (their segments freed: not closed, listed with no chunk).
        lock(&ck.freed).retain(|s| !superseded.contains(s));
        let mut closed = closed;
        {
            let mut recorded = lock(&ck.recorded);
            recorded.clear();
            for r in &rebased {
                if let Some(c) = closed.get_mut(r.segment as usize) {
                    *c = false;
                }
                recorded.insert(r.segment, Vec::new());
            }
        }
        *lock(&ck.closed) = closed;
        ck.base.store(next_chunk_seq, Ordering::Relaxed);
        let rest: Vec<u32> = dead.iter().copied().filter(|s| !released.contains(s)).collect();
        let rest_released = self.discard_and_release(&rest);
        times.add(&times.release, &mut t);
        ck.count.fetch_add(1, Ordering::Relaxed);
        drop(state);
        if let Some(e) = zero_failed {
            return Err(e);
        }
        rest_released?;
        Ok(CheckpointReport {
            pages_written,
            segments_freed: dead.len(),
            next_chunk_seq,
        })
    }

    /// Rule 9: commits the checkpoint's own free records (its log synced up to their
    /// chain) and releases their segments; returns those released. A commit that fails
    /// leaves them to the end of the checkpoint (a record maybe applied all the same
    /// follows the last checkpoint; the header's batch removes it).
    /// A segment whose first block could not be zeroed stays out of the free list, and
    /// the failure goes to `zero_failed`.
    fn free_own(&self, own: &[FreeRecord], zero_failed: &mut Option<Error>) -> Vec<u32> {
        if own.is_empty()
            || self
                .stuck_poisons(self.ckpt.index.commit(super::free::put_ops(own)))
                .is_err()
        {
            return Vec::new();
        }
        let segs: Vec<u32> = own.iter().map(|r| r.segment).collect();
        if let Err(e) = self.discard_and_release(&segs) {
            zero_failed.get_or_insert(e);
        }
        self.ckpt.own_freed.fetch_add(segs.len() as u64, Ordering::Relaxed);
        segs
    }

    /// Rule 7: the map pages of a checkpoint (snapshot at `next_chunk_seq`), committed in
    /// batches of `Config::checkpoint_page_batch` BEFORE its header's batch; the first
    /// also puts the [`PartialCheckpoint`] record, which the header's batch removes.
    fn commit_pages(&self, pages: Vec<(u64, Vec<u64>)>, next_chunk_seq: u64) -> Result<()> {
        #[cfg(test)]
        crate::append::tests::maybe_panic_in_checkpoint();
        let batch = self.cfg.checkpoint_page_batch.max(1);
        let mut marker = Some(PartialCheckpoint {
            epoch: self.epoch,
            next_chunk_seq,
        });
        let mut pages = pages.into_iter().peekable();
        while pages.peek().is_some() {
            let mut b: Vec<Op> = pages.by_ref().take(batch).map(page_op).collect();
            if let Some(m) = marker.take() {
                b.push(Op::Put(Key::partial(), m.encode()));
            }
            self.stuck_poisons(self.ckpt.index.commit(b))?;
        }
        Ok(())
    }

    /// Rule 5 (and free rule 5): each dead segment is discarded (with no discard delay;
    /// else queued for `engine/discard.rs`) BEFORE it goes back on the free list and
    /// writers are woken. What keeps another checkpoint or free record from recording
    /// the segment meanwhile is not a lock held here (the checkpoint's own records
    /// release theirs holding only the one-at-a-time lock, with free records running
    /// beside it; a free record holds only the state lock): each caller marked it freed
    /// (not closed) before it let the state lock go, and a segment a checkpoint in flight
    /// names is not freeable by free records (`freeable_of`). A segment whose first block
    /// could not be zeroed is not released; the first such failure is returned (the FTL
    /// is poisoned by then: the backing fails writes).
    pub(super) fn discard_and_release(&self, dead: &[u32]) -> Result<()> {
        let at_once = self.cfg.discard_delay.is_zero();
        let queued = (self.cfg.discard_freed && !at_once).then(std::time::Instant::now);
        if self.cfg.discard_freed && at_once {
            for &s in dead {
                self.discard_segment(s);
            }
        }
        let (zeroed, failed) = self.zero_heads(dead);
        for (&s, ok) in dead.iter().zip(zeroed) {
            if ok {
                self.t.segs.release(&[s], queued);
                self.space.notify();
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Zeroes the first block of each segment of `segs` (the log walker then sees
    /// nothing of its old use); says for each whether it was. All are written together
    /// (one at a time they took about a millisecond each under load, on the thread that
    /// frees); after a failure, one at a time to find which, and each failure poisons
    /// the FTL (the backing fails writes). Also returns the first failure.
    pub(super) fn zero_heads(&self, segs: &[u32]) -> (Vec<bool>, Option<Error>) {
        let geo = &self.t.geo;
        let zero = crate::device::AlignedBuf::new(BLOCK_SIZE);
        let head = |s: u32| geo.segment_start(s) * BLOCK_SIZE as u64;
        let heads: Vec<(u64, &[u8])> = segs.iter().map(|&s| (head(s), &zero[..])).collect();
        // Engine rule 11: counted once written (before the release), for a carry's sync.
        let counted = || {
            self.heads_zeroed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        };
        if self.dev.write_many(&heads).is_ok() {
            counted();
            return (vec![true; segs.len()], None);
        }
        let mut first = None;
        let zeroed = segs
            .iter()
            .map(|&s| match self.dev.write_at(head(s), &zero) {
                Ok(()) => true,
                Err(e) => {
                    self.set_poison(format!(
                        "zeroing the first block of freed segment {s} failed: {e}"
                    ));
                    // Recovery rule 3: a device write failed in this session.
                    self.log.staging().mark_device_error();
                    first.get_or_insert(Error::io(
                        "zeroing a freed segment's first block",
                        head(s),
                        e,
                    ));
                    false
                }
            })
            .collect();
        counted();
        (zeroed, first)
    }

    /// True when enough has been appended since the last checkpoint, the map cache wants
    /// one (`L2p::wants_checkpoint`; map rule 3: only a checkpoint makes dirty pages
    /// evictable), or free segments run low while a batch of dead ones waits for a
    /// checkpoint to be reusable ([`dead_batch_due`]).
    pub fn checkpoint_due(&self) -> bool {
        let appended = self.ckpt.appended.load(Ordering::Relaxed);
        if appended >= self.cfg.checkpoint_blocks {
            return true;
        }
        if self.t.map.wants_checkpoint() {
            return true;
        }
        let segs = &self.t.segs;
        appended > 0
            && dead_batch_due(
                segs.free_count(),
                segs.dead_closed().len(),
                self.t.geo.segment_count as usize,
            )
    }
}

/// The index operation that stores a map page (or removes an all-unmapped one).
pub(crate) fn page_op((page, entries): (u64, Vec<u64>)) -> Op {
    if entries.iter().all(|&e| e == u64::MAX) {
        Op::Remove(Key::map_page(page))
    } else {
        Op::Put(Key::map_page(page), MapPage { page, entries }.encode())
    }
}

/// Whether `dead` cleaned segments are worth a checkpoint to free them, with `free`
/// segments free out of `segment_count`: when free space is below an eighth of the
/// device and the dead ones make up a sixty-fourth of it (at least one). Every
/// checkpoint seals each stream's open chunk (a summary and flash-page padding each) and
/// commits the index, so freeing one small segment at a time would spend more on
/// checkpoints than cleaning it gained; the batch keeps checkpoints per byte cleaned the
/// same whatever the segment size. (Below the throttle point the cleaner's runner frees
/// whatever is dead at once.)
pub fn dead_batch_due(free: usize, dead: usize, segment_count: usize) -> bool {
    let low = (segment_count / 8).max(4);
    free < low && dead >= (segment_count / 64).max(1)
}

/// Runs its closure if dropped while armed, that is while a panic unwinds past it
/// ([`OnUnwind::disarm`] on every normal path).
struct OnUnwind<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnUnwind<F> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnUnwind<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dead_batch_due;

    #[test]
    fn dead_segments_are_freed_in_batches_when_space_runs_low() {
        // 64 segments: low is 8, one dead segment is a batch.
        assert!(dead_batch_due(7, 1, 64));
        assert!(!dead_batch_due(8, 5, 64), "enough free: no hurry");
        assert!(!dead_batch_due(0, 0, 64), "nothing to free");
        // 640 segments: low is 80, a batch is 10.
        assert!(!dead_batch_due(79, 9, 640));
        assert!(dead_batch_due(79, 10, 640));
        assert!(!dead_batch_due(80, 50, 640));
        // Tiny geometries: low is at least 4.
        assert!(dead_batch_due(3, 1, 16));
    }
}
