#!/usr/bin/env python3
"""orderings-mutants.py - breaks each crash-ordering rule on purpose and runs the tests
that should catch it: every rule must have at least one test that fails without it.

Usage: scripts/orderings-mutants.py [MUTANT_ID ...]      (default: all)
       scripts/orderings-mutants.py --list
       scripts/orderings-mutants.py --check     (only: is every mutant's text in place?)
       scripts/orderings-mutants.py --no-baseline MUTANT_ID ...

Before any mutant, each test command the chosen mutants name runs once on the unmutated
tree (the baseline): it must pass and run at least one test, or a failure under a mutant
would prove nothing (`--no-baseline` skips it).

Works in a scratch git worktree of HEAD (/tmp/ftlblk-mutants, its own target dir), so the
checkout you work in is never touched. For each mutant it applies one textual change (it
stops with an error if the text is no longer in the file: update the mutant with the
code), builds each of the mutant's tests (a mutant that does not build is an error, not a
catch), runs them, and prints which of them failed ("caught"). It
exits non-zero if any mutant is caught by none of its tests. docs/orderings.md lists the
results. Takes about an hour for all of them (release builds plus the crash harnesses).
"""
import os
import signal
import subprocess
import sys
import time

WT = "/tmp/ftlblk-mutants"

# Test commands (run from the worktree root).
ORDERINGS = "cargo test --release -p ftl --test orderings"
SHUTTLE_FAILED_WRITE = "cargo test --release -p ftl --features shuttle --test shuttle a_failed_chunk"
SHUTTLE = "FTL_SHUTTLE_ITERATIONS=300 cargo test --release -p ftl --features shuttle --test shuttle -- power_cuts process_deaths"
POWER = "FTL_CRASH_SEEDS=40 cargo test --release -p ftl --test concurrent_crash power_cuts"
KILL = "FTL_CRASH_SEEDS=20 cargo test --release -p ftl --test concurrent_crash process_deaths"
PANIC = "cargo test --release -p ftl --lib a_panic_while_sealing"
PREFIX = "cargo test --release -p ftl --lib a_death_between"
PROCESS = "cargo test --release -p ftl --test process_crash"
MODEL = "cargo test --release -p ftl --test crash_model"
MAPLIB = "cargo test --release -p ftl --lib map::tests"
REBUILD = "cargo test --release -p ftl --test rebuild"
WRITTEN = "cargo test --release -p ftl --lib a_written_chunk_never_answers"
MOVED = "cargo test --release -p ftl --lib a_buffered_block_that_moved"
NOROOM = "cargo test --release -p ftl --lib a_segment_freed_while_a_writer_finds_no_room"
NOROOM_RELOC = "cargo test --release -p ftl --lib a_segment_freed_while_a_relocation_finds_no_room"
SPACE_CKPT = "cargo test --release -p ftl --lib a_relocation_runs_no_checkpoint_behind_one"
STAGING_RESET = "cargo test --release -p ftl --lib a_reset_writes_a_file_backed_header_back"
TRIMFAST = "cargo test --release -p ftl --lib a_trim_of_blocks_another_trim_is_unmapping"
MAPLIMIT = "cargo test --release -p ftl --test api writers_wait_at_the_map_cache_limit"
TRIMFAILED = "cargo test --release -p ftl --lib a_trim_waiting_behind_a_failed_trim"
RULE7 = "cargo test --release -p ftl --test orderings a_write_sealing_more_chunks_than"
OPEN_ORDER = "cargo test --release -p ftl --test orderings the_open_checkpoint_is_committed_after"

# (id, rule, file, [(old text, new text), ...], tests)
MUTANTS = [
    ("engine-2", "engine rule 2: the FLUSH leader loads what it covers BEFORE sealing",
     "ftl/src/engine/flush.rs",
     [("""        let covers = self.log.next_entry_seq();
        for sid in 0..crate::stream::STREAMS as u8 {""",
       """        for sid in 0..crate::stream::STREAMS as u8 {"""),
      ("""        self.flush_upto(self.log.tracker().next_seq())?;
        Ok(covers)""",
       """        let covers = self.log.next_entry_seq();
        self.flush_upto(self.log.tracker().next_seq())?;
        Ok(covers)""")],
     [SHUTTLE, POWER]),
    ("engine-3", "engine rule 3: a sync covers only chunk writes completed before it",
     "ftl/src/engine/flush.rs",
     [("""        tracker.wait_below(target);
        self.check_poison()?;
        self.sync.run_to(target, || {""",
       """        self.check_poison()?;
        self.sync.run_to(target, || {
            return self.dev.sync().map(|()| target).map_err(|e| Error::io("sync", 0, e));""")],
     [ORDERINGS, SHUTTLE, POWER]),
    ("engine-4", "engine rule 4: a failed chunk write poisons BEFORE the tracker learns it",
     "ftl/src/append.rs",
     [("""        let r = match dev.write_at(offset, c.bytes()) {""",
       """        let r = dev.write_at(offset, c.bytes());
        self.tracker.complete(c.chunk_seq);
        let r = match r {""")],
     [SHUTTLE_FAILED_WRITE]),
    ("engine-5", "engine rule 5: a chunk number is completed whatever happens to its sealing",
     "ftl/src/append.rs",
     [("""        #[cfg(test)]
        tests::maybe_panic_in_seal();""",
       """        std::mem::forget(guard);
        #[cfg(test)]
        tests::maybe_panic_in_seal();
        let guard = SealGuard {
            tracker: &self.tracker,
            poison: &self.poison,
            seq,
        };""")],
     [PANIC]),
    ("engine-5-sealed", "engine rule 5'': chunks a call sealed and holds are completed when dropped unwritten",
     "ftl/src/append.rs",
     [("""        abandon(self.tracker, self.poison, &self.chunks);""",
       """        let _ = (self.tracker, self.poison);""")],
     ["cargo test --release -p ftl --lib a_panic_in_a_chunk_write_does_not_wedge_flush"]),
    ("engine-5-deferred", "engine rule 5: deferred relocation chunks dropped unwritten are completed",
     "ftl/src/append.rs",
     [("""            abandon(tracker, poison, &self.chunks);""",
       """            let _ = (tracker, poison);""")],
     [ORDERINGS]),
    ("engine-6", "engine rule 6: relocation is a compare-and-swap",
     "ftl/src/append.rs",
     [("""        if expect.is_some_and(|e| e != old) {""",
       """        if expect.is_some_and(|e| e != old) && false {""")],
     [POWER, SHUTTLE]),
    ("engine-8", "engine rule 8: a chunk stops answering reads BEFORE the tracker learns it is written",
     "ftl/src/append.rs",
     [("""                c.mark_written();
                Ok(())""",
       """                Ok(())""")],
     [WRITTEN]),
    ("engine-7", "engine rule 7: a writer holding deferred chunks writes them BEFORE it waits for a staging slot",
     "ftl/src/engine/mod.rs",
     [("""                if let Some(d) = defer.as_deref_mut() {
                    self.write_chunks(d.take())?;
                }""",
       """                if let Some(_d) = defer.as_deref_mut() {
                }""")],
     [RULE7]),
    ("engine-9", "engine rule 9: a failed sync poisons BEFORE the sync group's next leader, which checks it",
     "ftl/src/engine/flush.rs",
     [("""            // Rule 9: a leader after a failed one fails too (see below).
            self.check_poison()?;
""", "")],
     [ORDERINGS]),
    ("engine-10", "engine rule 10: a FLUSH leaves a chunk of relocations only open",
     "ftl/src/engine/flush.rs",
     [("""            if st.chunk.as_ref().is_some_and(|c| c.only_relocations()) {
                continue;
            }
""", "")],
     [ORDERINGS + " a_flush_leaves_a_chunk_of_relocations_open"]),
    ("engine-10-mixed", "engine rule 10 leaves open only a chunk whose entries are all relocations",
     "ftl/src/log.rs",
     [("""        !self.entries.is_empty() && self.moved == self.entries.len()""",
       """        !self.entries.is_empty() && self.moved > 0""")],
     [ORDERINGS + " a_flush_seals_a_chunk_where_a_user_write"]),
    ("engine-11", "engine rule 11: a carry of TRIM records syncs the zeroed first blocks of the segments it found free BEFORE the carried segment is freeable",
     "ftl/src/engine/tombstones.rs",
     [("""        self.sync_zeroed_heads()?;
        // Rule 4: a block left out""",
       """        // Rule 4: a block left out""")],
     [REBUILD + " a_freed_segments_zeroing_is_durable"]),
    ("trim-failed", "a TRIM finding nothing mapped checks the poison a failed TRIM set before it released the stripes",
     "ftl/src/engine/mod.rs",
     [("""            // before it releases the stripes): not a success then.
            self.check_poison()?;""",
       """            // before it releases the stripes): not a success then.""")],
     [TRIMFAILED]),
    ("recovery-3", "recovery rule 3: after the death of only the process a block failing its checksum stays mapped (EIO)",
     "ftl/src/recovery.rs",
     [("""                    } else if report.staged.same_boot {""",
       """                    } else if false {""")],
     [PROCESS]),
    ("map-3-limit", "map rule 3: at half the cache dirty a writer waits for the checkpoint under way",
     "ftl/src/engine/mod.rs",
     [("""        if self.ckpt.busy() && !map.at_limit() {""",
       """        if self.ckpt.busy() {""")],
     [MAPLIMIT]),
    ("read-check", "reads check a buffered block against the entry they looked up",
     "ftl/src/engine/read.rs",
     [("""            if self.verify_block(lba, e, out)? {""",
       """            if true {""")],
     [MOVED]),
    ("checkpoint-1", "checkpoint rule 1: open chunks sealed BEFORE the snapshot",
     "ftl/src/engine/checkpoint.rs",
     [("""        for (sid, guard) in guards.iter_mut().enumerate() {""",
       """        for (sid, guard) in guards.iter_mut().enumerate().take(0) {""")],
     [MODEL, POWER, SHUTTLE]),
    ("checkpoint-3", "checkpoint rule 3: the log is synced BEFORE the index commit",
     "ftl/src/engine/checkpoint.rs",
     [("""            .and_then(|()| self.flush_upto(next_chunk_seq))
""", ""),
      ("""            // Rule 4.
            self.stuck_poisons(ck.index.commit(ops))
        });""",
       """            // Rule 4.
            self.stuck_poisons(ck.index.commit(ops))?;
            self.flush_upto(next_chunk_seq)
        });""")],
     [MODEL, POWER, SHUTTLE]),
    ("checkpoint-4", "checkpoint rule 4: the commit is durable BEFORE dead segments are freed",
     "ftl/src/engine/checkpoint.rs",
     [("""        // Rule 8: the header's batch, with no free record running.""",
       """        segs.release(&dead, None);
        self.space.notify();""")],
     [SHUTTLE, POWER]),
    ("checkpoint-5", "checkpoint rule 5 (free rule 5): a dead segment's discard completes BEFORE it is free",
     "ftl/src/engine/checkpoint.rs",
     [("""        if self.cfg.discard_freed && at_once {
            for &s in dead {""",
       """        self.t.segs.release(dead, queued);
        self.space.notify();
        if self.cfg.discard_freed && at_once {
            for &s in dead {""")],
     [ORDERINGS, POWER]),
    ("discard-1", "discard rule 1: a segment is out of the free list while it is discarded",
     "ftl/src/segments.rs",
     [("""                if t.free.remove(&(key, s)) {""",
       """                if t.free.contains(&(key, s)) {""")],
     [ORDERINGS, POWER]),
    ("discard-2", "discard rule 2: a segment allocated before its discard is not taken for it",
     "ftl/src/segments.rs",
     [("""            if let Some((_, key)) = t.pending.remove(&s) {
                if t.free.remove(&(key, s)) {
                    out.push((s, key));
                }
            }""",
       """            if let Some((_, key)) = t.pending.remove(&s) {
                t.free.remove(&(key, s));
                out.push((s, key));
            }"""),
      ("""        if let Some((at, _)) = t.pending.remove(&seg) {
            t.undiscarded.remove(&(at, seg));
        }""", "")],
     [ORDERINGS, POWER]),
    ("discard-3", "discard rule 3: a segment's first block is zeroed again after its deferred discard",
     "ftl/src/engine/discard.rs",
     [("""            let (zeroed, _) = self.zero_heads(&segs);""", """            let zeroed = vec![true; segs.len()];""")],
     [ORDERINGS]),
    ("discard-3-failed", "discard rule 3: a segment whose head could not be zeroed stays out of the free list",
     "ftl/src/engine/discard.rs",
     [("""                .filter_map(|(&t, ok)| ok.then_some(t))""", """                .map(|(&t, _)| t)""")],
     [ORDERINGS]),
    ("discard-5", "discard rule 5: the discarder leaves the reserve and one more in the free list",
     "ftl/src/engine/discard.rs",
     [("""        self.discard_queue(cutoff, self.cfg.gc_reserve_segments + 1)""", """        self.discard_queue(cutoff, 0)""")],
     [ORDERINGS]),
    ("space-wait", "a writer waits for space from the generation it saw when it found no room",
     "ftl/src/engine/mod.rs",
     [("""                        self.space.wait(no_room_at, step)""",
       """                        self.space.wait(self.space.generation(), step)""")],
     [NOROOM]),
    ("discard-6", "discard rule 6: a writer with no cleaner waits for segments out for a discard",
     "ftl/src/engine/mod.rs",
     [("""                        self.t.segs.discarding() > 0""", """                        false"""),
      ("""                    if !self.space.attached() && self.t.segs.discarding() == 0 {""",
       """                    if !self.space.attached() {""")],
     [ORDERINGS + " writers_of_two_streams_wait_for_a_discard"]),
    ("space-ckpt", "a relocation runs no checkpoint behind one that freed its space meanwhile",
     "ftl/src/engine/mod.rs",
     [("""                            if self.checkpoint_if(|| self.space.generation() == g)?.is_none() {""",
       """                            if self.checkpoint_if(|| true)?.is_none() {""")],
     [SPACE_CKPT]),
    ("space-reloc", "a relocation that found no room looks again when segments were freed since",
     "ftl/src/engine/mod.rs",
     [("""                    if !last_try && freed {""",
       """                    if last_try && freed {""")],
     [NOROOM_RELOC]),
    ("trim-fast", "a TRIM with nothing mapped looks at the map under the stripe locks",
     "ftl/src/engine/mod.rs",
     [("""            let _stripes = self.log.lock_stripes(start, n as u32);""",
       """            let _stripes: Vec<()> = Vec::new();""")],
     [TRIMFAST]),
    ("checkpoint-6", "checkpoint rule 6: free records are removed in the batch that supersedes them",
     "ftl/src/engine/checkpoint.rs",
     [("""            for &s in &superseded {
                ops.push(Op::Remove(Key::free(s)));
            }""", "")],
     [ORDERINGS]),
    ("checkpoint-7", "checkpoint rule 7: after a cut between page batches the live counts are recounted",
     "ftl/src/recovery.rs",
     [("""    let recount = loaded.partial.is_some();""",
       """    let recount = false && loaded.partial.is_some();""")],
     [ORDERINGS]),
    ("checkpoint-8", "checkpoint rule 8: the header's batch puts the records committed while it was in flight again with its base",
     "ftl/src/engine/checkpoint.rs",
     [("""                ops.push(Op::Put(Key::free(r.segment), r.encode()));""",
       """                let _ = r;""")],
     [ORDERINGS, POWER]),
    ("checkpoint-8-closed", "checkpoint rule 8: a record while a checkpoint is in flight frees only segments both record closed (those dead at its snapshot marked freed before the state lock is let go)",
     "ftl/src/engine/checkpoint.rs",
     [("""        ck.note_freed(&own.iter().map(|r| r.segment).collect::<Vec<_>>());""",
       """        lock(&ck.freed).extend(own.iter().map(|r| r.segment));""")],
     [ORDERINGS, POWER]),
    ("checkpoint-9-sync", "checkpoint rule 9: the checkpoint's own free records are committed after its log sync",
     "ftl/src/engine/checkpoint.rs",
     [("""            .and_then(|()| self.flush_upto(next_chunk_seq))
            .and_then(|()| {
                times.add(&times.sync, &mut t);
                released = self.free_own(&own, &mut zero_failed);""",
       """            .and_then(|()| {
                released = self.free_own(&own, &mut zero_failed);
                self.flush_upto(next_chunk_seq)
            })
            .and_then(|()| {
                times.add(&times.sync, &mut t);""")],
     [ORDERINGS, POWER]),
    ("checkpoint-9-release", "checkpoint rule 9: segments freed by the checkpoint's own records are not released again at its end",
     "ftl/src/engine/checkpoint.rs",
     [("""        let rest: Vec<u32> = dead.iter().copied().filter(|s| !released.contains(s)).collect();""",
       """        let rest: Vec<u32> = { let _ = &released; dead.clone() };""")],
     [ORDERINGS, POWER]),
    ("map-2", "map cache rule 2: pages a checkpoint took are not evicted before its commit",
     "ftl/src/map.rs",
     [("""            if s.dirty || s.writing {
                continue;
            }""", """            if s.dirty {
                continue;
            }""")],
     [MAPLIB]),
    ("map-1", "map cache rule 1: a dirty page is never evicted",
     "ftl/src/map.rs",
     [("""            if s.dirty || s.writing {
                continue;
            }""", """            if s.writing {
                continue;
            }""")],
     [MAPLIB]),
    ("map-4", "map cache rule 4: a miss reads the index under its shard's lock",
     "ftl/src/map.rs",
     [("""        self.read_into(page, &mut entries)?;
        let slot = Slot {""", """        drop(sh);
        self.read_into(page, &mut entries)?;
        let mut sh = lock(self.shard(page));
        let slot = Slot {""")],
     [MAPLIB]),
    ("free-1", "free rule 1: only segments the last checkpoint recorded closed (or young ones)",
     "ftl/src/engine/free.rs",
     [("""                } else if !in_flight
                    && (!freed.contains(&s) || recorded.contains_key(&s))
                    && self.t.segs.is_young(s)""",
       """                } else if !freed.is_empty() || !recorded.is_empty() || true""")],
     [ORDERINGS, POWER, MODEL]),
    ("free-7", "free rule 7: recovery steps over the chunks of a young segment freed since",
     "ftl/src/recovery.rs",
     [("""            if skip.remove(&expected) {""", """            if false && skip.remove(&expected) {""")],
     [ORDERINGS, POWER]),
    ("free-7-cursor", "free rule 7: a stream whose open segment at the checkpoint was freed has no cursor there",
     "ftl/src/recovery.rs",
     [("""        if c.is_some_and(|(seg, _)| frees.iter().any(|f| f.segment == seg)) {""",
       """        if false && c.is_some_and(|(seg, _)| frees.iter().any(|f| f.segment == seg)) {""")],
     [ORDERINGS, POWER]),
    ("free-7-trim", "free rule 7: a segment with TRIM records stops being young",
     "ftl/src/segments.rs",
     [("""            if trims {
                y.remove(&seg);""", """            if false && trims {
                y.remove(&seg);""")],
     [ORDERINGS, POWER]),
    ("free-7-off", "free rule 7: after a failed checkpoint commit nothing is young",
     "ftl/src/engine/checkpoint.rs",
     [("""            segs.young_off();
            return Err(e);""", """            let _ = segs;
            return Err(e);""")],
     [ORDERINGS]),
    ("free-7-list", "free rule 7: a young segment's record lists its chunks",
     "ftl/src/engine/free.rs",
     [("""                    c.extend(self.t.segs.young_chunks(s).unwrap_or_default());""",
       """                    let _ = &c;""")],
     [ORDERINGS, POWER]),
    ("free-7-twice", "free rule 7: a segment freed again since the checkpoint lists the chunks of every life",
     "ftl/src/engine/free.rs",
     [("""                    c.extend(recorded.get(&s).into_iter().flatten());""",
       """                    let _ = &recorded;""")],
     [ORDERINGS, POWER]),
    ("free-2", "free rule 2: open chunks holding a death of a freed segment are sealed first",
     "ftl/src/engine/free.rs",
     [("""                let r = self.log.seal_killers(&self.t, &segs_of(&freeable), &mut sealed);""",
       """        let r: crate::error::Result<()> = Ok(());""")],
     [ORDERINGS, POWER]),
    ("free-2s", "free rule 2, settled mode: segments an open chunk killed a block of are left",
     "ftl/src/engine/free.rs",
     [("""                freeable.retain(|(s, _)| open.binary_search(s).is_err());""",
       """                let _ = &open;""")],
     [ORDERINGS, POWER]),
    ("free-3", "free rule 3: the log is synced BEFORE the free record is committed",
     "ftl/src/engine/free.rs",
     [("""        // Rule 3.
        self.flush_upto(chain)?;""", "")],
     [ORDERINGS, POWER]),
    ("free-4", "free rule 4: the record is durable BEFORE the segment is released",
     "ftl/src/engine/free.rs",
     [("""        // Rule 4.
        self.stuck_poisons(ck.index.commit(put_ops(&records)))?;""", """        self.discard_and_release(&segs);
        self.stuck_poisons(ck.index.commit(put_ops(&records)))?;""")],
     [POWER, MODEL, SHUTTLE]),
    ("free-6", "free rule 6: recovery frees recorded segments BEFORE it looks for chunk heads",
     "ftl/src/recovery.rs",
     [("""    for f in frees {
        if let Some(r) = seg_records.get_mut(f.segment as usize) {""",
       """    for f in frees.iter().take(0) {
        if let Some(r) = seg_records.get_mut(f.segment as usize) {""")],
     [ORDERINGS, POWER]),
    ("free-freed-first", "a free record's segments are listed for removal BEFORE its commit",
     "ftl/src/engine/free.rs",
     [("""        ck.note_freed(&segs);
        // Rule 4.
        self.stuck_poisons(ck.index.commit(put_ops(&records)))?;""", """        // Rule 4.
        self.stuck_poisons(ck.index.commit(put_ops(&records)))?;
        ck.note_freed(&segs);""")],
     [ORDERINGS]),
    ("free-6-open", "free rule 6: the session's first checkpoint removes the records recovery used",
     "ftl/src/recovery.rs",
     [("""            freed: frees
                .iter()
                .map(|f| f.segment)
                .chain(loaded.stale_frees.iter().copied())
                .collect(),""",
       """            freed: Vec::new(),""")],
     [ORDERINGS]),
    ("reserve-1", "the reserve is the GC stream's alone (other relocations keep it; a TRIM carry may take one)",
     "ftl/src/append.rs",
     [("""        if relocation && stream == GC_STREAM.0 {
            0
        } else if relocation && !data && stream == crate::stream::TRIM_STREAM.0 {""",
       """        if relocation && stream == GC_STREAM.0 {
            0
        } else if relocation && stream != crate::stream::TRIM_STREAM.0 {
            1
        } else if relocation && !data && stream == crate::stream::TRIM_STREAM.0 {""")],
     [ORDERINGS]),
    ("reserve-1-trim", "a relocation of data into the TRIM stream keeps the reserve (only a carry of records may take one)",
     "ftl/src/append.rs",
     [("""        } else if relocation && !data && stream == crate::stream::TRIM_STREAM.0 {""",
       """        } else if relocation && stream == crate::stream::TRIM_STREAM.0 {""")],
     [ORDERINGS]),
    ("reserve-2", "closing a stream gives nothing up while free space is at the reserve",
     "ftl/src/engine/reloc.rs",
     [("""        if self.t.segs.free_count() <= self.cfg.gc_reserve_segments {
            return Ok(());
        }""",
       "")],
     [ORDERINGS]),
    ("staging-5", "staging rule 5: an area another boot left is not replayed",
     "ftl/src/staging/replay.rs",
     [("""            if o.uuid == sb.uuid && o.epoch == ck_epoch && !area.from_another_boot() => {}""",
       """            if o.uuid == sb.uuid && o.epoch == ck_epoch => {}""")],
     [PROCESS]),
    ("staging-6", "staging rule 6: a reset writes a file-backed header back BEFORE any slot is handed out",
     "ftl/src/staging/mod.rs",
     [("""        self.region.sync_range(0, HEADER_BYTES)
    }""",
       """        Ok(())
    }""")],
     [STAGING_RESET]),
    ("staging-2", "staging rule 2: the slot is marked sealed BEFORE the mark passes it",
     "ftl/src/staging/mod.rs",
     [("""[SealStep::Number, SealStep::State, SealStep::Mark]""",
       """[SealStep::Number, SealStep::Mark, SealStep::State]""")],
     [PREFIX, SHUTTLE]),
    ("staging-3", "staging rule 3: a slot is freed only AFTER its chunk's write completed",
     "ftl/src/append.rs",
     [("""        let r = match dev.write_at(offset, c.bytes()) {
            Ok(()) => {
                // Staging rule 3: free in the staging area before the tracker knows.
                c.buf.mark_written();""",
       """        c.buf.mark_written();
        let r = match dev.write_at(offset, c.bytes()) {
            Ok(()) => {""")],
     [SHUTTLE, KILL]),
    ("staging-4", "staging rule 4: staged chunks are written BEFORE the log scan",
     "ftl/src/recovery.rs",
     [("""    let staged = crate::staging::replay(&dev, &staging, &sb, ck.epoch, ck.next_chunk_seq, ck.session)?;""",
       """    let staged = crate::staging::StagedReport::default();
    let _ = (&staging, crate::staging::replay::<D>);""")],
     [PROCESS, KILL]),
    ("recovery-1", "recovery: rolled-forward chunks are synced BEFORE the open checkpoint",
     "ftl/src/recovery.rs",
     [("""    if report.chunks_replayed > 0 || !stale.is_empty() {
        dev.sync().map_err(|e| failed("recovery sync", 0, e))?;
    }""",
       "")],
     [PROCESS, MODEL]),
    ("recovery-1-order", "recovery: the open checkpoint is committed AFTER the recovery sync",
     "ftl/src/recovery.rs",
     [("""    if report.chunks_replayed > 0 || !stale.is_empty() {
        dev.sync().map_err(|e| failed("recovery sync", 0, e))?;
    }""",
       ""),
      ("""    pub(crate) fn start_session(&self) -> Result<()> {
        self.checkpoint()?;""",
       """    pub(crate) fn start_session(&self) -> Result<()> {
        self.checkpoint()?;
        self.dev.sync().map_err(|e| Error::io("recovery sync", 0, e))?;""",
       "ftl/src/engine/mod.rs")],
     [OPEN_ORDER]),
    ("index-1", "index rule 1: a commit ends with an fdatasync of sled's data file after sled's flush",
     "ftl/src/index/sled_store.rs",
     [("""        self.flush_sled()?;
        self.sync_blobs()?;
        self.sync_data_file()""",
       """        self.sync_data_file()?;
        self.sync_blobs()?;
        self.flush_sled()""")],
     ["cargo test --release -p ftl --lib a_commit_syncs_the_data_file"]),
    ("index-2", "index rule 2: a failed commit fails every later one until the index is reopened",
     "ftl/src/index/sled_store.rs",
     [("""        if let Some(first) = failed.as_ref() {""",
       """        if let Some(first) = failed.as_ref().filter(|_| false) {""")],
     ["cargo test --release -p ftl --lib a_failed_sync_fails_every_later_commit"]),
    ("index-3", "index rule 3: new blob files and blobs/ are synced by the commit",
     "ftl/src/index/sled_store.rs",
     [("""        self.flush_sled()?;
        self.sync_blobs()?;""",
       """        self.flush_sled()?;""")],
     ["cargo test --release -p ftl --lib a_blob_value_is_synced_with_its_commit"]),
    ("staging-1", "staging rule 1: an entry is whole BEFORE the count covers it",
     "ftl/src/staging/mod.rs",
     [("""    [RecordStep::Data, RecordStep::Entry, RecordStep::Count];""",
       """    [RecordStep::Data, RecordStep::Count, RecordStep::Entry];""")],
     ["cargo test --release -p ftl --lib a_death_between_an_entrys_stores"]),
    ("staging-9", "staging rule 9: replay takes an area only from the session of the checkpoint it starts from",
     "ftl/src/staging/replay.rs",
     [("""                && o.session != ck_session
                // Rule 5 first""",
       """                && o.session != ck_session && false
                // Rule 5 first""")],
     ["cargo test --release -p ftl --lib another_copys_area"]),
    ("staging-1-data", "staging rule 1: a block's data is copied BEFORE the count covers its entry",
     "ftl/src/staging/mod.rs",
     [("""    [RecordStep::Data, RecordStep::Entry, RecordStep::Count];""",
       """    [RecordStep::Entry, RecordStep::Count, RecordStep::Data];""")],
     ["cargo test --release -p ftl --lib a_death_between_an_entrys_stores"]),
    ("staging-6-order", "staging rule 6: a reset frees every slot BEFORE it writes the header",
     "ftl/src/staging/mod.rs",
     [("""pub(crate) const RESET_STEPS: [ResetStep; 2] = [ResetStep::Slots, ResetStep::Header];""",
       """pub(crate) const RESET_STEPS: [ResetStep; 2] = [ResetStep::Header, ResetStep::Slots];""")],
     ["cargo test --release -p ftl --lib a_death_between_a_resets_steps"]),
    ("state-1", "state rule 1: the classifier state's bytes are synced BEFORE the rename",
     "ftl/src/classify/state.rs",
     [("""        f.sync_all().map_err(io)?;
        step("sync file");
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)?;
        step("rename");""",
       """        std::fs::rename(&tmp, path).map_err(io)?;
        step("rename");
        f.sync_all().map_err(io)?;
        step("sync file");
        drop(f);""")],
     ["cargo test --release -p ftl --lib a_save_syncs_the_file_then_renames"]),
    ("state-2", "state rule 2: the directory is synced BEFORE the save returns",
     "ftl/src/classify/state.rs",
     [("""        std::fs::File::open(dir.unwrap_or(Path::new(".")))
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        step("sync directory");""",
       """        let _ = dir;""")],
     ["cargo test --release -p ftl --lib a_save_syncs_the_file_then_renames"]),
    ("checkpoint-2", "checkpoint rule 2: the snapshot is taken with every stream lock held",
     "ftl/src/engine/checkpoint.rs",
     [("""        let next_chunk_seq = self.log.tracker().next_seq();
        // Rule 2.""",
       """        let next_chunk_seq = self.log.tracker().next_seq();
        let early: Vec<_> = guards.iter().map(|g| g.cursor).collect();
        drop(guards);
        // Rule 2."""),
      ("""            cursors: guards.iter().map(|g| g.cursor).collect(),""",
       """            cursors: early,"""),
      ("""        segs.young_reset(header.cursors.iter().flatten().map(|&(s, _)| s));
        drop(guards);""",
       """        segs.young_reset(header.cursors.iter().flatten().map(|&(s, _)| s));""")],
     ["cargo test --release -p ftl --lib a_write_waits_for_the_checkpoints_snapshot", MODEL]),
    ("tombstone-2", "tombstone rule 2: the chunk with carried records notes the carried segment as killed",
     "ftl/src/append.rs",
     [("""        chunk.push_trim(start, seq, n as u32);
        chunk.note_killed(from);""",
       """        chunk.push_trim(start, seq, n as u32);""")],
     [REBUILD]),
    ("staging-8-first", "staging rule 8: an index older than the log is refused BEFORE the staged chunks are written",
     "ftl/src/recovery.rs",
     [("""    if crate::staging::area_holds_writes(&staging) {""", """    if false {""")],
     ["cargo test --release -p ftl --lib an_older_index_with_its_staging_area"]),
    ("open-1", "open rule 1: a damaged superblock copy is rewritten only AFTER recovery accepted the index",
     "ftl/src/lifecycle.rs",
     [("""        let (parts, recovery) = recover(dev, index, sb.clone(), cfg, "index", staging)?;""",
       """        repair_superblock(&dev, &sb, rewrite)?;
        let (parts, recovery) = recover(dev, index, sb.clone(), cfg, "index", staging)?;""")],
     ["cargo test --release -p ftl --test api a_refused_open_leaves_block_0"]),
    ("open-3", "open rule 3: a checkpoint of the new epoch is durable BEFORE its chunks",
     "ftl/src/engine/mod.rs",
     [("""    pub(crate) fn start_session(&self) -> Result<()> {
        self.checkpoint()?;""",
       """    pub(crate) fn start_session(&self) -> Result<()> {""")],
     [MODEL, POWER, PROCESS]),
    ("tombstone-1", "tombstone rule 1: a TRIM segment is freeable only once its records are carried",
     "ftl/src/segments.rs",
     [("""                    && (!t.may_hold_trims(*i) || t.carried[*i])""", "")],
     [REBUILD]),
    ("tombstone-1-seen", "tombstone rule 1: a segment given a chunk with TRIM records is carried (not only those of an earlier session)",
     "ftl/src/segments.rs",
     [("""        if trims {
            if let Some(x) = t.trims.get_mut(seg as usize) {""",
       """        if false {
            if let Some(x) = t.trims.get_mut(seg as usize) {""")],
     [REBUILD, MODEL]),
    ("tombstone-1-recovery", "tombstone rule 1: a segment recovery took over goes by its stream (its chunks were not seen sealed)",
     "ftl/src/segments.rs",
     [("""        t.trims[seg as usize] = None;
        self.owner[seg as usize].store(stream, Ordering::SeqCst);""",
       """        t.trims[seg as usize] = Some(false);
        self.owner[seg as usize].store(stream, Ordering::SeqCst);""")],
     [REBUILD]),
    ("tombstone-1-damage", "tombstone rule 1: a carry whose walk met a damaged summary fails (the segment is kept)",
     "ftl/src/engine/tombstones.rs",
     [("""            .or(walk.ended_on_damage().then_some(0))
        {""",
       """            .or(walk.ended_on_damage().then_some(0))
            .filter(|_| false)
        {""")],
     [REBUILD]),
    ("tombstone-3", "tombstone rule 3: only records older than every other allocated segment are dropped",
     "ftl/src/engine/tombstones.rs",
     [("""                    if oldest.is_some_and(|o| seq > o) {""",
       """                    if oldest.is_some_and(|o| seq > o + 1_000_000) {""")],
     [REBUILD]),
    ("tombstone-4", "tombstone rule 4: a carry that left blocks out waits for a checkpoint (no free record frees it)",
     "ftl/src/engine/free.rs",
     [("""                if self.t.segs.carry_skipped(s) {""",
       """                if self.t.segs.carry_skipped(s) && false {""")],
     [REBUILD]),
    ("checkpoint-5z", "checkpoint rule 5: a freed segment's first block is zeroed",
     "ftl/src/engine/checkpoint.rs",
     [("""        if self.dev.write_many(&heads).is_ok() {""",
       """        if true || self.dev.write_many(&heads).is_ok() {""")],
     [REBUILD]),
    ("recovery-2", "recovery rule 2: chunks past the break are zeroed",
     "ftl/src/recovery.rs",
     [("""    for &(seg, off) in &stale {
        let at""", """    for &(seg, off) in stale.iter().take(0) {
        let at""")],
     [REBUILD]),
    ("recovery-2-torn", "recovery rule 2: a summary torn at a stream's cursor is zeroed too",
     "ftl/src/recovery.rs",
     [("""        } else if torn {""",
       """        } else if false && torn {""")],
     [REBUILD]),
    ("rebuild-1", "rebuild rule 1: the checkpoint record is committed last",
     "ftl/src/rebuild.rs",
     [("""    index.commit(ops)?;
    // Rule 1: the checkpoint record last.
    index.commit(vec![Op::Put(Key::checkpoint(), header.encode())])?;""",
       """    index.commit(vec![Op::Put(Key::checkpoint(), header.encode())])?;
    index.commit(ops)?;""")],
     [REBUILD]),
]


def by_file(path, edits):
    """A mutant's edits grouped by file: an edit is (old, new) in the mutant's file, or
    (old, new, other file) for a rule whose two halves live in two files."""
    files = {}
    for e in edits:
        files.setdefault(e[2] if len(e) > 2 else path, []).append((e[0], e[1]))
    return files


def check_texts(root):
    """Every mutant's texts stand exactly once in their files (run by scripts/test.sh, so
    a refactor that moves a rule's code updates its mutant in the same change)."""
    stale = []
    for mid, _rule, path, edits, _tests in MUTANTS:
        for p, pairs in by_file(path, edits).items():
            src = open(os.path.join(root, p)).read()
            for old, _new in pairs:
                if src.count(old) != 1:
                    stale.append(f"{mid}: {p} holds its text {src.count(old)} times, not once")
    return stale


def sh(cmd, cwd, timeout=3600):
    """Runs `cmd`: its exit status (124 when it ran past `timeout`), output and seconds."""
    t = time.time()
    p = subprocess.Popen(cmd, shell=True, cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out.decode(errors="replace"), time.time() - t
    except subprocess.TimeoutExpired:
        # The whole group: cargo and the test binary it runs, not only the shell, or
        # they go on with the mutated code and hold the build lock for the next one.
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return 124, out.decode(errors="replace") + "\n(timed out)", time.time() - t


def tests_run(out):
    """How many tests the output of one `cargo test` command says it ran."""
    n = 0
    for ln in out.splitlines():
        ln = ln.strip()
        if ln.startswith("running ") and ln.endswith((" tests", " test")):
            n += int(ln.split()[1])
    return n


def baseline(cmds, cwd):
    """Runs each test command on the unmutated tree: a command that fails there, or runs
    no test, would count as a catch (or miss) for reasons other than the mutant."""
    bad = []
    for cmd in cmds:
        rc, out, secs = sh(cmd, cwd)
        n = tests_run(out)
        short = cmd.split("cargo test")[-1].strip()
        print(f"  baseline: {short}: {'FAILED' if rc else 'passed'}, {n} tests ({secs:.0f} s)",
              flush=True)
        if rc or n == 0:
            bad.append(short)
    return bad


def main():
    # The tree this script is in (git was asked before: a tarball without .git, or a
    # clone another user owns, "dubious ownership", stopped the suite here).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--list" in sys.argv:
        for m in MUTANTS:
            print(f"{m[0]:14} {m[1]}")
        return 0
    if "--check" in sys.argv:
        stale = check_texts(root)
        for line in stale:
            print(line)
        print("mutant texts:", "stale" if stale else f"all {len(MUTANTS)} in place")
        return 1 if stale else 0
    want = [a for a in sys.argv[1:] if not a.startswith("-")]
    mutants = [m for m in MUTANTS if not want or m[0] in want]
    if os.path.exists(WT):
        subprocess.run(["git", "worktree", "remove", "--force", WT], cwd=root)
    subprocess.check_call(["git", "worktree", "add", "--detach", WT, "HEAD"], cwd=root)
    missed = []
    try:
        cmds = list(dict.fromkeys(c for m in mutants for c in m[4]))
        if "--no-baseline" not in sys.argv:
            bad = baseline(cmds, WT)
            if bad:
                print("these commands fail or run no test without any mutant:", "; ".join(bad))
                return 2
        for mid, rule, path, edits, tests in mutants:
            files = by_file(path, edits)
            srcs = {p: open(os.path.join(WT, p)).read() for p in files}
            gone = [p for p, pairs in files.items() if any(old not in srcs[p] for old, _ in pairs)]
            if gone:
                print(f"{mid}: its text is no longer in {gone[0]}: update the mutant", flush=True)
                missed.append(mid)
                continue
            for p, pairs in files.items():
                mutated = srcs[p]
                for old, new in pairs:
                    mutated = mutated.replace(old, new, 1)
                open(os.path.join(WT, p), "w").write(mutated)

            def restore():
                for p, src in srcs.items():
                    open(os.path.join(WT, p), "w").write(src)
            caught = []
            # A mutant that does not build fails every test: that is no catch.
            broken = [c for c in tests if sh(c.replace("cargo test", "cargo test --no-run", 1), WT)[0]]
            if broken:
                print(f"{mid}: does not build ({broken[0]}): update the mutant", flush=True)
                restore()
                missed.append(mid)
                continue
            for cmd in tests:
                rc, out, secs = sh(cmd, WT)
                short = cmd.split("cargo test")[-1].strip()
                if rc != 0:
                    caught.append(short)
                why = next((ln.strip() for ln in out.splitlines() if "panicked" in ln), "")
                print(f"  {mid}: {'CAUGHT' if rc else 'passed'} ({secs:.0f} s) by {short}"
                      + (f": {why[:160]}" if rc else ""), flush=True)
            restore()
            print(f"{mid}: {rule}: caught by {len(caught)} of {len(tests)}", flush=True)
            if not caught:
                missed.append(mid)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", WT], cwd=root)
    if missed:
        print("mutants no test caught:", " ".join(missed))
        return 1
    print("every mutant was caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
