//! Tombstones: the TRIM records a segment of the TRIM stream holds are carried into a
//! newer chunk before that segment is freed, as long as they may still hide an older
//! block somewhere in the log.
//!
//! The map and the checkpoint do not need a TRIM record once it is checkpointed, but
//! the log alone must still describe the device for `ftlblk check --rebuild-index`
//! (`rebuild.rs`): a TRIM (and a WRITE_ZEROES, which unmaps) reads zeroes afterwards,
//! and a rebuild that had lost the record would hand back the older block it hid. A
//! record of entry number `t` can hide a block only in a segment opened before `t`
//! (every entry of a segment is numbered at or after its `opened_seq`), and freed
//! segments are invisible to the walker (their first block is zeroed when freed), so a
//! record is carried while some other allocated segment was opened before it; the rest
//! go with their segment. (The TRIM stream is a stream like any other: a caller may
//! write data into it too, and its segments are counted like the others.)
//!
//! Carrying re-logs, for each such record, the blocks of its range that are still
//! unmapped, as new TRIM records numbered now (under the blocks' stripe locks, like any
//! TRIM, so a write racing with it is numbered either before the record, and then was
//! not unmapped, or after it, and wins). A block written since is left out.
//!
//! Rules (each tested in `tests/rebuild.rs`):
//! 1. a segment that may hold TRIM records is freeable only once it is carried
//!    (`Segments::dead_closed` leaves the others out): its records are in the log until
//!    their successors are. Which segments may: one this session gave a chunk with TRIM
//!    records (`Segments::note_chunk`), and any segment of the TRIM stream it did not
//!    open itself (from an earlier session, or taken over by recovery); the TRIM
//!    stream's data-only segments of this session need no carry;
//! 2. the open chunk that holds carried records notes the carried segment as one it
//!    "killed", so a free record seals it (free rule 2) and a checkpoint seals every
//!    chunk (checkpoint rule 1): the carried records are durable BEFORE the segment they
//!    came from is freed;
//! 3. freed segments are invisible: checkpoint rule 5 zeroes a freed segment's first
//!    block, so records older than every allocated segment may be dropped;
//! 4. a segment whose carry left out a block written since its TRIM is freed only by a
//!    checkpoint, never by a free record (`Segments::carry_skipped`): the write that
//!    left it out may sit in a chunk still open in another stream, which a free record
//!    of the segment neither seals nor syncs, and if the power is then cut the write is
//!    lost (it was never acknowledged) while the TRIM that hid the block's older data is
//!    gone with its segment: a rebuild handed that data back. A checkpoint seals every
//!    stream's chunk under the locks and syncs before it frees anything.
//!
//! After a restart no segment counts as carried: the closed TRIM segments are carried
//! again (records of blocks still unmapped are logged twice; nothing else changes).
//!
//! Owns nothing (the carried flag lives in the segment table). Called by
//! [`Ftl::checkpoint`] and [`Ftl::free_dead`] before they look for dead segments.

use super::Ftl;
use crate::chunks::SegmentChunks;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::stream::TRIM_STREAM;
use crate::summary::Entry;
use std::sync::atomic::Ordering;

/// How long a segment whose carry failed waits before it is tried again.
pub(crate) const CARRY_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Carries the records of every closed, not yet carried segment of the TRIM stream
    /// (see the module docs). Returns the segments carried. A carry already running on
    /// another thread (or below this one: a carry out of space runs a checkpoint) is left
    /// to finish; a device with no segment left for the TRIM stream carries later. A
    /// segment whose carry failed is tried again at once (the checkpoints' carry).
    pub fn carry_tombstones(&self) -> Result<usize> {
        self.carry_tombstones_retrying(true)
    }

    /// [`Ftl::carry_tombstones`]; unless `retry`, a segment whose carry failed within
    /// [`CARRY_RETRY`] is left for later (the free records' carry: they run many times
    /// a second, and each try waits for every chunk in flight and reads the segment
    /// again, a bad sector maybe for seconds).
    pub(crate) fn carry_tombstones_retrying(&self, retry: bool) -> Result<usize> {
        // Not before the session's first checkpoint (open rule 3: no chunk of the
        // session before it).
        if self.ckpt.count() == 0 {
            return Ok(0);
        }
        let todo = self.t.segs.uncarried_trim_segments();
        if todo.is_empty()
            || self
                .carrying
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return Ok(0);
        }
        // Cleared however `carry` ends: a panic in it left the flag set before, and no
        // TRIM segment was carried (nor freed) again until a restart.
        struct Carrying<'a>(&'a crate::sync::AtomicBool);
        impl Drop for Carrying<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let _carrying = Carrying(&self.carrying);
        #[cfg(test)]
        crate::append::tests::maybe_panic_in_carry();
        match self.carry(&todo, retry) {
            Ok(n) => Ok(n),
            // Carried later, when a segment is free again.
            Err(Error::NoSpace) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Carries each of `todo`. One that fails (its summaries do not read, an index read
    /// fails) stays uncarried, so never freed (rule 1), and the others go on: the
    /// failure is counted once per segment ([`Ftl::stats`]) and the carry tried again
    /// at the next checkpoint (by free records only after [`CARRY_RETRY`], unless
    /// `retry`). It failed them all before, and with them every
    /// checkpoint and free record, and every write past the map's bound (found by
    /// review, 2026-11-27). Out of space, or with the FTL read-only, it stops there.
    fn carry(&self, todo: &[u32], retry: bool) -> Result<usize> {
        // A chunk a panic left sealed but unwritten never completes: read-only first.
        self.check_poison()?;
        let todo: Vec<u32> = {
            let failed = self.carry_failed.lock().unwrap_or_else(|p| p.into_inner());
            todo.iter()
                .copied()
                .filter(|s| {
                    retry || failed.get(s).is_none_or(|at| at.elapsed() >= CARRY_RETRY)
                })
                .collect()
        };
        if todo.is_empty() {
            return Ok(0);
        }
        // Every chunk of a closed segment was sealed; wait until they are on the device
        // (the walker reads the device).
        let below = (self.epoch, self.log.tracker().next_seq());
        self.log.tracker().wait_below(below.1);
        self.check_poison()?;
        let mut carried = 0;
        for &seg in &todo {
            let r = self.carry_one(seg, below);
            let mut failed = self.carry_failed.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(()) => {
                    failed.remove(&seg);
                    carried += 1;
                }
                Err(Error::NoSpace) => return Err(Error::NoSpace),
                Err(e) => {
                    self.check_poison()?;
                    // Counted once per segment, however often it is tried again.
                    if failed.insert(seg, std::time::Instant::now()).is_none() {
                        self.carry_failures.fetch_add(1, Ordering::Relaxed);
                    }
                    *self.carry_error.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("segment {seg}: {e}"));
                }
            }
        }
        Ok(carried)
    }

    fn carry_one(&self, seg: u32, below: (u64, u64)) -> Result<()> {
        // Rule 3, per segment: only its own blocks go with it when it is freed. The
        // other segments being carried may hold data too (the TRIM stream is a stream
        // like any other) and stay allocated while it does; leaving them all out
        // dropped the records that hid their blocks (found by the property test,
        // `crash_model::rebuild_agrees_after_an_unflushed_trim_in_the_trim_stream`).
        let oldest = self.t.segs.oldest_opened(&[seg]);
        let mut ranges = Vec::new();
        // Every chunk's records, or no carry: a walk that stopped at a damaged summary
        // ended there silently, the segment counted as carried and was freed with the
        // records of the chunks after it, which a rebuild then missed (the trimmed data
        // came back; found by review, 2026-11-30). It walks on past damage, and any
        // damage met fails the carry: the segment stays allocated (a failed carry, as
        // when its summaries do not read) and the rebuild keeps what it can read.
        let mut walk =
            SegmentChunks::new(&self.dev, self.t.geo, seg, self.format_id(), below).resync();
        for chunk in walk.by_ref() {
            let (_, s) = chunk?;
            for e in &s.entries {
                if let Entry::Trim { lba, seq, count } = *e {
                    // Rule 3: no allocated segment can hold a block older than it.
                    if oldest.is_some_and(|o| seq > o) {
                        ranges.push((lba, count as u64));
                    }
                }
            }
        }
        if let Some(at) = walk
            .damaged()
            .first()
            .copied()
            .or(walk.ended_on_damage().then_some(0))
        {
            return Err(Error::Corrupt(format!(
                "segment {seg}: a chunk summary at or after block {at} fails its checksum; \
                 its TRIM records cannot be carried, so the segment is kept"
            )));
        }
        let skipped = self.relog_unmapped(seg, ranges)?;
        // Engine rule 11: the records left out hid only blocks of segments free when
        // `oldest_opened` looked (all zeroed by then, each counted before its release):
        // those zeroings are durable BEFORE `seg` is freeable (`set_carried`: a free record
        // or checkpoint beside this carry, or one it runs out of space, may free it at
        // once), or a power cut keeping `seg`'s zeroing and losing theirs showed an index
        // rebuild their old chunks with nothing left to hide them (found by review,
        // 2026-11-29; a sync at the end of the whole carry came after that).
        self.sync_zeroed_heads()?;
        // Rule 4: a block left out was written since its TRIM, maybe in a chunk still
        // open in another stream, which no free record of `seg` seals or syncs; only a
        // checkpoint (it seals every chunk, then syncs) frees `seg`.
        self.t.segs.set_carried(seg, skipped);
        #[cfg(test)]
        crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_SET_CARRIED);
        Ok(())
    }

    /// Logs a TRIM record for each run of still unmapped blocks of `ranges` (rule 2:
    /// the chunk notes `from`). Says whether blocks written since were left out.
    fn relog_unmapped(&self, from: u32, ranges: Vec<(u64, u64)>) -> Result<bool> {
        let stripes = crate::append::STRIPES as u64;
        let end_of = |lba: u64, n: u64| lba.saturating_add(n).min(self.t.geo.exported_blocks);
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for (lba, count) in ranges {
            let end = end_of(lba, count);
            let mut l = lba;
            while l < end {
                let n = (end - l).min(stripes);
                pieces.push((l, n));
                l += n;
            }
        }
        let mut skipped = false;
        while !pieces.is_empty() {
            let mut rest = Vec::new();
            let todo = std::mem::take(&mut pieces);
            self.append_loop(TRIM_STREAM, todo.len() as u64, false, true, None, |st, i| {
                let (lba, n) = todo[i as usize];
                let (left, left_out) = self.log.relog_trim(&self.t, st, lba, n as u32, from)?;
                skipped |= left_out;
                rest.extend(left);
                Ok(())
            })?;
            pieces = rest;
        }
        Ok(skipped)
    }
}
