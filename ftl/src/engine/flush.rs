//! FLUSH and the device-sync group: engine rules 2, 3, 9 and 10 (see `engine/mod.rs`; and the sync of rule 11). A
//! FLUSH seals every stream's open chunk that holds a user write or TRIM, waits for every
//! chunk below its target and syncs the device once for everyone waiting. Called by the
//! engine's API (FLUSH, FUA writes) and the checkpoint (`flush_upto`).

use super::Ftl;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::index::IndexStore;
use crate::stream::StreamId;
use crate::tables::LiveCounters;
use std::sync::atomic::Ordering;

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// FLUSH: every write completed before this call is durable when it returns.
    ///
    /// Group commit: one flusher at a time leads, sealing every stream's open chunk and
    /// syncing; flushers arriving meanwhile wait, and the next leader seals everything
    /// they appended in one go, so concurrent write+flush pairs share chunks and syncs.
    pub fn flush(&self) -> Result<()> {
        self.check_poison()?;
        self.space.note_foreground();
        LiveCounters::add(&self.t.counters.flushes, 1);
        // Rule 2: every write that completed before this call has an entry sequence below
        // it.
        let ticket = self.log.next_entry_seq();
        self.flush_group
            .run_to(ticket, || self.seal_and_sync_all())
            .map(|_| ())
    }

    /// Seals and writes every open chunk, then makes the whole log durable. Returns the
    /// entry sequence below which everything is now durable.
    fn seal_and_sync_all(&self) -> Result<u64> {
        // Rule 2: loaded BEFORE sealing: every entry below it is in a chunk sealed below.
        let covers = self.log.next_entry_seq();
        for sid in 0..crate::stream::STREAMS as u8 {
            let mut st = self.log.stream(StreamId(sid))?;
            // Rule 10: a chunk of relocations only stays open (looked at under the
            // stream lock: a user write recorded before it is in the chunk, rule 1).
            if st.chunk.as_ref().is_some_and(|c| c.only_relocations()) {
                continue;
            }
            let sealed = self.log.seal_open(&self.t, sid, &mut st)?;
            drop(st);
            // Written before the next stream lock is taken: a checkpoint holding that lock
            // may be waiting for this very chunk.
            if let Some(c) = sealed {
                self.write_chunks(vec![c])?;
            }
        }
        self.flush_upto(self.log.tracker().next_seq())?;
        Ok(covers)
    }

    /// Callers (FLUSHes, checkpoints, free records) waiting behind the device sync
    /// another one leads: a test drives one into that wait before it fails the sync.
    pub fn sync_waiters(&self) -> usize {
        self.sync.waiting()
    }

    /// Makes every chunk below `target` durable.
    pub(super) fn flush_upto(&self, target: u64) -> Result<()> {
        // Waiting first saves syncs that could not cover `target` yet (and lets rule 4's
        // poison be seen before any sync).
        let tracker = self.log.tracker();
        tracker.wait_below(target);
        self.check_poison()?;
        self.sync.run_to(target, || {
            // Rule 9: a leader after a failed one fails too (see below).
            self.check_poison()?;
            // Rule 3: a sync makes durable only the chunks whose writes completed
            // BEFORE it started: the frontier is loaded before the sync, and only it
            // is credited (rule 11: the zeroings likewise).
            let covers = tracker.frontier();
            let heads = self.heads_zeroed.load(Ordering::SeqCst);
            self.synced_or_poisoned().map(|()| {
                self.heads_synced.fetch_max(heads, Ordering::SeqCst);
                covers
            })
        })?;
        Ok(())
    }

    /// Rule 11: the freed segments' first blocks zeroed so far are durable when this
    /// returns (a sync now unless one began after the last zeroing).
    pub(super) fn sync_zeroed_heads(&self) -> Result<()> {
        let zeroed = self.heads_zeroed.load(Ordering::SeqCst);
        if self.heads_synced.load(Ordering::SeqCst) < zeroed {
            self.check_poison()?;
            self.synced_or_poisoned()?;
            self.heads_synced.fetch_max(zeroed, Ordering::SeqCst);
        }
        Ok(())
    }

    /// A device sync; one that fails poisons the FTL first.
    fn synced_or_poisoned(&self) -> Result<()> {
        self.dev.sync().map_err(|e| {
            let err = Error::io("sync", 0, e);
            // Rule 9: poisoned BEFORE the group's next leader runs (the sync group's
            // closure returns before the group wakes its waiters): a FLUSH queued behind
            // this sync must not lead a second one, which can succeed (an fsync reports
            // a writeback error once) and acknowledge what this one lost.
            self.set_poison(err.to_string());
            // Recovery rule 3: the device may have lost writes that returned.
            self.log.staging().mark_device_error();
            err
        })
    }
}
