//! The appender: turns writes, TRIMs and relocations into chunks of the log.
//!
//! Owns each stream's open segment and open chunk ([`StreamLog`], one mutex per stream),
//! the LBA stripe locks, the entry sequence, the chunk tracker (chain numbers handed out
//! and completed), the staging slots the chunks are buffered in, and the poison (why the
//! FTL turned read-only). It changes the [`Tables`] it is handed (map, segment counts,
//! counters) and nothing else. Called by the engine (writes, TRIMs, FLUSH, relocation,
//! reads of buffered blocks) and by the checkpoint (every stream sealed under its lock).
//! It neither waits for space nor syncs the device: [`Room`] tells the caller what is
//! missing, and the caller (the engine's append loop) waits.
//!
//! Rules carried out here (numbers as in the engine's list; staging rules as in
//! `staging/mod.rs`):
//! - rule 1: an entry's sequence number, its record in the open chunk and its map change
//!   are one step under the stream lock and the LBA's stripe lock ([`Appender::append_block`],
//!   [`Appender::trim_piece`]); staging rule 1 (data before entry) is in the slot's
//!   `record`, called from here;
//! - staging rule 2: a chunk's number reaches its slot under the tracker lock
//!   ([`Appender::seal_open`]); staging rule 3: the slot is freed after the device write
//!   and before the tracker learns it ([`Appender::write_chunk_io`]);
//! - rule 4: a failed chunk write poisons BEFORE the tracker completes the chunk;
//! - rule 5: a chunk number once handed out is completed whatever happens ([`SealGuard`],
//!   [`PendingChunks`]'s drop);
//! - rule 6: a relocation appends only if the map still holds what the cleaner read.
//!
//! Lock order: stream locks (ascending) -> stripe locks (ascending) -> segment table lock.
//! No device I/O under a stripe or the segment-table lock; chunk writes happen with no
//! stream lock held ([`Appender::write_chunks`]).

use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::log::{chunk_capacity, seal, OpenChunk, SealParams, SealedChunk, StreamLog};
use crate::map::MapEntry;
use crate::staging::{SlotPlace, StagingArea};
use crate::stream::{StreamId, GC_STREAM, STREAMS};
use crate::summary::Entry;
use crate::sync::{lock, AtomicU64, Mutex, MutexGuard};
use crate::tables::{LiveCounters, Tables};
use crate::tracker::ChunkTracker;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Number of LBA stripe locks (also the largest TRIM record, in blocks).
pub(crate) const STRIPES: usize = 4096;
// A TRIM piece fits one summary entry (`summary::MAX_TRIM_BLOCKS`).
const _: () = assert!(STRIPES as u32 <= crate::summary::MAX_TRIM_BLOCKS);

/// Why the FTL turned read-only, once it did (shared with [`PendingChunks`]).
type Poison = Arc<Mutex<Option<String>>>;

/// Records the first reason the FTL turned read-only.
fn poison_with(p: &Mutex<Option<String>>, why: String) {
    let mut p = lock(p);
    if p.is_none() {
        *p = Some(why);
    }
}

/// Chunks sealed by `Ftl::relocate_deferred` (or a write handed to chunk writers) whose
/// device writes are the caller's to issue, with `Ftl::write_pending`. Dropped unwritten
/// (a panic on the way), it keeps rule 5: the FTL is poisoned, then the chunk numbers are
/// completed, so no FLUSH or checkpoint waits for them forever.
#[derive(Default)]
pub struct PendingChunks {
    chunks: Vec<Arc<SealedChunk>>,
    owner: Option<(Arc<ChunkTracker>, Poison)>,
}

impl PendingChunks {
    /// No chunk to write.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub(crate) fn take(&mut self) -> Vec<Arc<SealedChunk>> {
        std::mem::take(&mut self.chunks)
    }
}

impl Drop for PendingChunks {
    fn drop(&mut self) {
        if let Some((tracker, poison)) = &self.owner {
            abandon(tracker, poison, &self.chunks);
        }
    }
}

/// Rule 5 for sealed chunks dropped unwritten (a panic on the way): poisons the FTL,
/// then completes their numbers, so no FLUSH or checkpoint waits for them forever.
fn abandon(tracker: &ChunkTracker, poison: &Mutex<Option<String>>, chunks: &[Arc<SealedChunk>]) {
    if chunks.is_empty() {
        return;
    }
    poison_with(
        poison,
        format!("{} sealed chunks were dropped unwritten", chunks.len()),
    );
    for c in chunks {
        tracker.complete(c.chunk_seq);
    }
}

/// Sealed chunks held by one call on their way to the device (`append_loop`,
/// `write_chunks`): dropped unwritten, they keep rule 5 like [`PendingChunks`] (found by
/// review, 2026-11-29: a panic there left their numbers incomplete, and every later
/// FLUSH and checkpoint waited for them forever). Borrows the log: no reference counts
/// touched per write.
pub(crate) struct Sealed<'a> {
    tracker: &'a ChunkTracker,
    poison: &'a Mutex<Option<String>>,
    chunks: Vec<Arc<SealedChunk>>,
}

impl Sealed<'_> {
    /// The chunks, for a caller that seals into them (`ensure_room`).
    pub(crate) fn chunks_mut(&mut self) -> &mut Vec<Arc<SealedChunk>> {
        &mut self.chunks
    }

    /// Takes the chunks out, for whoever writes them next.
    pub(crate) fn take(&mut self) -> Vec<Arc<SealedChunk>> {
        std::mem::take(&mut self.chunks)
    }
}

impl Drop for Sealed<'_> {
    fn drop(&mut self) {
        abandon(self.tracker, self.poison, &self.chunks);
    }
}

/// Completes a chunk number whose sealing did not finish (rule 5), poisoning first
/// (rule 4). Forgotten once the chunk is sealed and in flight.
struct SealGuard<'a> {
    tracker: &'a ChunkTracker,
    poison: &'a Mutex<Option<String>>,
    seq: u64,
}

impl Drop for SealGuard<'_> {
    fn drop(&mut self) {
        poison_with(
            self.poison,
            format!("sealing chunk {} did not finish", self.seq),
        );
        self.tracker.complete(self.seq);
    }
}

/// Outcome of [`Appender::ensure_room`].
pub(crate) enum Room {
    Ready,
    /// No free segment the caller may take: wait for the cleaner, or checkpoint.
    NeedSpace,
    /// Every staging slot is taken: wait for a chunk write to complete (no lock held).
    NeedBuffer,
}

/// What the appender needs to know of the session, fixed at open.
pub(crate) struct Session {
    pub geo: Geometry,
    pub epoch: u64,
    pub format_id: u64,
    /// Free segments only relocations into [`GC_STREAM`] may take.
    pub gc_reserve: usize,
    pub next_chunk_seq: u64,
    pub next_entry_seq: u64,
}

/// The streams, their open chunks and everything that numbers and buffers them.
pub(crate) struct Appender {
    s: Session,
    streams: Box<[Mutex<StreamLog>]>,
    stripes: Box<[Mutex<()>]>,
    entry_seq: AtomicU64,
    tracker: Arc<ChunkTracker>,
    staging: Arc<StagingArea>,
    poison: Poison,
}

impl Appender {
    /// An appender whose streams continue at `cursors` (where each one's next chunk goes).
    pub fn new(s: Session, cursors: &[Option<(u32, u32)>], staging: Arc<StagingArea>) -> Self {
        let streams = (0..STREAMS)
            .map(|i| {
                Mutex::new(StreamLog {
                    cursor: cursors.get(i).copied().flatten(),
                    ..Default::default()
                })
            })
            .collect();
        Appender {
            streams,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            entry_seq: AtomicU64::new(s.next_entry_seq),
            tracker: Arc::new(ChunkTracker::new(s.next_chunk_seq)),
            staging,
            poison: Arc::new(Mutex::new(None)),
            s,
        }
    }

    /// The stream's log, locked; an error for a stream number out of range.
    pub fn stream(&self, stream: StreamId) -> Result<MutexGuard<'_, StreamLog>> {
        match self.streams.get(stream.0 as usize) {
            Some(m) => Ok(lock(m)),
            None => Err(Error::InvalidParameters(format!(
                "stream {} >= {STREAMS}",
                stream.0
            ))),
        }
    }

    /// Every stream's log, locked in ascending order (the checkpoint's snapshot).
    pub fn lock_all(&self) -> Vec<MutexGuard<'_, StreamLog>> {
        self.streams.iter().map(|s| lock(s)).collect()
    }

    /// The entry sequence number the next entry gets.
    pub fn next_entry_seq(&self) -> u64 {
        self.entry_seq.load(Ordering::SeqCst)
    }

    /// The chunk tracker (FLUSH and checkpoints wait on it).
    pub fn tracker(&self) -> &ChunkTracker {
        &self.tracker
    }

    /// The staging area the chunk buffers live in.
    pub fn staging(&self) -> &Arc<StagingArea> {
        &self.staging
    }

    /// Fails with the reason once the FTL turned read-only.
    pub fn check_poison(&self) -> Result<()> {
        match &*lock(&self.poison) {
            Some(why) => Err(Error::ReadOnly(why.clone())),
            None => Ok(()),
        }
    }

    /// Turns the FTL read-only (the first reason is kept).
    pub fn set_poison(&self, why: String) {
        poison_with(&self.poison, why);
    }

    /// Holds `chunks` (sealed, not yet written) for one call ([`Sealed`]).
    pub(crate) fn sealed(&self, chunks: Vec<Arc<SealedChunk>>) -> Sealed<'_> {
        Sealed {
            tracker: &self.tracker,
            poison: &self.poison,
            chunks,
        }
    }

    /// Hands sealed chunks to `pending`, whose owner must write them.
    pub fn defer(&self, pending: &mut PendingChunks, out: Vec<Arc<SealedChunk>>) {
        if !out.is_empty() && pending.owner.is_none() {
            pending.owner = Some((self.tracker.clone(), self.poison.clone()));
        }
        pending.chunks.extend(out);
    }

    fn seal_params(&self, stream: u8, chunk_seq: u64) -> SealParams {
        SealParams {
            chunk_seq,
            epoch: self.s.epoch,
            format_id: self.s.format_id,
            stream,
            blocks_per_page: self.s.geo.blocks_per_page(),
            blocks_per_segment: self.s.geo.blocks_per_segment(),
        }
    }

    /// Seals the stream's open chunk, if it holds anything.
    pub fn seal_open(
        &self,
        t: &Tables,
        stream: u8,
        st: &mut StreamLog,
    ) -> Result<Option<Arc<SealedChunk>>> {
        let Some(chunk) = st.chunk.take() else {
            return Ok(None);
        };
        if chunk.entries.is_empty() {
            // Nothing recorded yet: keep the slot for the next append.
            st.chunk = Some(chunk);
            return Ok(None);
        }
        // Free rule 7: a segment with TRIM records is never freed as young (see below).
        let trims = chunk
            .entries
            .iter()
            .any(|e| matches!(e, Entry::Trim { .. }));
        // Staging rule 2: the slot learns its number under the tracker lock.
        let seq = self.tracker.begin_with(|n| chunk.buf.mark_sealed(n));
        // Rule 5: from here the number is registered as incomplete, and every
        // later FLUSH and checkpoint waits for it. If sealing fails or panics, the guard
        // poisons the FTL and then completes the number, so they fail instead of
        // waiting forever. Test: `engine::tests::a_panic_while_sealing_does_not_wedge_flush`.
        let guard = SealGuard {
            tracker: &self.tracker,
            poison: &self.poison,
            seq,
        };
        // The place is the chunk's until it is sealed: a failure below leaves the stream
        // no place to open another chunk at (the success path sets it again).
        st.cursor = None;
        #[cfg(test)]
        tests::maybe_panic_in_seal();
        let offset = chunk.offset;
        let seg = chunk.seg;
        let (sealed, pad) = match seal(chunk, &self.seal_params(stream, seq)) {
            Ok(x) => x,
            Err(e) => {
                poison_with(&self.poison, format!("sealing a chunk failed: {e}"));
                drop(guard);
                return Err(e);
            }
        };
        std::mem::forget(guard);
        // Free rule 7: a young segment's chunks are listed for its free record.
        t.segs.note_chunk(seg, seq, trims, offset);
        let c = &t.counters;
        LiveCounters::add(&c.padding_bytes, pad as u64 * BLOCK_SIZE as u64);
        LiveCounters::add(&c.summary_blocks, 1);
        LiveCounters::add(&c.backing_blocks_written, sealed.total_blocks as u64);
        let next = offset + sealed.total_blocks;
        if self.s.geo.chunk_fits_at(next) {
            st.cursor = Some((seg, next));
        } else {
            t.segs.close(seg);
            st.cursor = None;
        }
        let sealed = Arc::new(sealed);
        st.inflight.push(sealed.clone());
        Ok(Some(sealed))
    }

    /// Seals every open chunk with an entry that unmapped a block of one of `segs`
    /// (sorted), each under its stream's lock, one stream at a time (free rule 2:
    /// afterwards every entry that killed a block of a dead segment in `segs` is in a
    /// chunk numbered below the tracker's next number). Sealed chunks go to `out`, which
    /// the caller writes, also when this fails part way (engine rule 5).
    pub fn seal_killers(
        &self,
        t: &Tables,
        segs: &[u32],
        out: &mut Vec<Arc<SealedChunk>>,
    ) -> Result<()> {
        self.each_killer_stream(segs, |sid, st| {
            if let Some(c) = self.seal_open(t, sid, st)? {
                out.push(c);
            }
            Ok(())
        })
    }

    /// Of `segs` (sorted), those an open chunk holds an entry that unmapped one of their
    /// blocks, each stream looked at under its lock (free rule 2: for the others every
    /// such entry is already in a sealed chunk, numbered below the tracker's next number
    /// read afterwards). Sorted.
    pub fn open_killers(&self, segs: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        // Infallible: the closure never fails.
        let _ = self.each_killer_stream(segs, |_, st| {
            if let Some(c) = &st.chunk {
                out.extend(c.killed.iter().filter(|s| segs.binary_search(s).is_ok()));
            }
            Ok(())
        });
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Calls `f` with each stream whose open chunk holds an entry that unmapped a block of
    /// one of `segs` (sorted), under that stream's lock, one stream at a time (free rule
    /// 2's look at the open chunks).
    fn each_killer_stream(
        &self,
        segs: &[u32],
        mut f: impl FnMut(u8, &mut StreamLog) -> Result<()>,
    ) -> Result<()> {
        for (sid, m) in self.streams.iter().enumerate() {
            let mut st = lock(m);
            if st.chunk.as_ref().is_some_and(|c| c.killed_any(segs)) {
                f(sid as u8, &mut st)?;
            }
        }
        Ok(())
    }

    /// Free segments an allocation for `stream` must leave (it fails at or below them).
    ///
    /// The reserve is the GC stream's alone: user writes, TRIM records and relocations
    /// into any other stream keep it (a relocation that would need it is diverted to
    /// GC_STREAM by `relocate`), so one stream spends it, one victim at a time: a
    /// victim's live blocks fit in the GC stream's open segment and the reserve, and the
    /// victim's segment is dead afterwards.
    /// A carry of TRIM records (`engine/tombstones.rs`: a "relocation" of records, no
    /// data) may take one segment of it: the TRIM segments it carries are dead, freed by
    /// the checkpoint that follows, and on a full device nothing else frees them. A
    /// relocation of data into the TRIM stream (the classifier's hottest class) keeps the
    /// reserve like any other stream's.
    pub fn keep_free(&self, stream: u8, data: bool, relocation: bool) -> usize {
        if relocation && stream == GC_STREAM.0 {
            0
        } else if relocation && !data && stream == crate::stream::TRIM_STREAM.0 {
            self.s.gc_reserve.saturating_sub(1)
        } else {
            self.s.gc_reserve
        }
    }

    /// Whether an allocation for `stream` finds a free segment now ([`Appender::keep_free`]).
    pub fn may_allocate(&self, t: &Tables, stream: u8, data: bool, relocation: bool) -> bool {
        t.segs.free_count() > self.keep_free(stream, data, relocation)
    }

    /// Makes sure the stream has an open chunk with room for one entry (and a data block
    /// when `data`), sealing the full one into `out`. Only a `relocation` into
    /// [`GC_STREAM`] may open a segment out of the cleaner's reserve.
    pub fn ensure_room(
        &self,
        t: &Tables,
        stream: u8,
        st: &mut StreamLog,
        data: bool,
        relocation: bool,
        out: &mut Vec<Arc<SealedChunk>>,
    ) -> Result<Room> {
        loop {
            if let Some(c) = &st.chunk {
                let room = if data {
                    c.has_data_room()
                } else {
                    c.has_entry_room()
                };
                if room && c.seq_fits(self.next_entry_seq()) {
                    return Ok(Room::Ready);
                }
                if let Some(s) = self.seal_open(t, stream, st)? {
                    out.push(s);
                }
                continue;
            }
            // Staging rule 7's place: a seal that failed (or panicked) poisoned the FTL
            // and left its slot in the area at the stream's place; a writer that had
            // passed its poison check before opened the next chunk at that same place,
            // and a replay wrote one over the other (found by review, 2026-11-29). Once
            // a chunk, not per block.
            self.check_poison()?;
            let Some(mut buf) = self.staging.try_take() else {
                return Ok(Room::NeedBuffer);
            };
            let geo = &self.s.geo;
            let (seg, offset) = match st.cursor {
                Some((seg, off)) if geo.chunk_fits_at(off) => (seg, off),
                other => {
                    if let Some((seg, _)) = other {
                        t.segs.close(seg);
                        st.cursor = None;
                    }
                    let keep = self.keep_free(stream, data, relocation);
                    match t
                        .segs
                        .allocate(stream, self.next_entry_seq(), keep, relocation)
                    {
                        Some(seg) => (seg, 0),
                        None => return Ok(Room::NeedSpace),
                    }
                }
            };
            st.cursor = Some((seg, offset));
            let capacity = chunk_capacity(geo.blocks_per_segment(), offset) as u16;
            let start_pba = geo.segment_start(seg) + offset as u64;
            buf.open(SlotPlace {
                stream,
                seg,
                offset,
                start_pba,
            });
            t.segs.chunk_begin(seg, stream);
            st.chunk = Some(OpenChunk {
                seg,
                offset,
                start_pba,
                capacity,
                entries: Vec::new(),
                data_blocks: 0,
                killed: Vec::new(),
                moved: 0,
                buf,
            });
        }
    }

    /// Writes one sealed chunk and marks it complete. On failure the chunk stays in
    /// memory (reads keep working), the device turns read-only and every later FLUSH
    /// reports the failure.
    ///
    /// Rule 4: a failed write poisons the FTL BEFORE the tracker learns the chunk is
    /// done. A FLUSH or checkpoint waiting for this chunk checks the poison right after
    /// the wait, so it never syncs and acknowledges (or commits a map naming) blocks that
    /// were not written. Test: `tests/shuttle.rs`,
    /// `a_failed_chunk_write_is_never_covered_by_a_flush`.
    fn write_chunk_io<D: BlockDevice>(&self, dev: &D, c: &SealedChunk) -> Result<()> {
        let offset = c.start_pba * BLOCK_SIZE as u64;
        #[cfg(test)]
        tests::maybe_panic_in_chunk_write();
        let r = match dev.write_at(offset, c.bytes()) {
            Ok(()) => {
                // Staging rule 3: free in the staging area before the tracker knows.
                c.buf.mark_written();
                // Rule 8: the chunk stops answering reads BEFORE the tracker learns it
                // is done. From then on a free record may free its segment and a stream
                // reuse it, while this chunk waits in the in-flight list to be retired
                // (`write_chunks` retires a batch only after all of its writes); its
                // buffer would answer reads of the new life's blocks with the old
                // life's. Test: `engine::tests::a_written_chunk_never_answers_for_its_segments_next_life`.
                c.mark_written();
                Ok(())
            }
            Err(e) => {
                let err = Error::io("chunk write", offset, e);
                self.set_poison(err.to_string());
                // Recovery rule 3: the device may have lost what it had taken.
                self.staging.mark_device_error();
                Err(err)
            }
        };
        self.tracker.complete(c.chunk_seq);
        r
    }

    /// Drops a written chunk's buffer (reads now go to the device).
    fn retire(&self, t: &Tables, st: &mut StreamLog, c: Arc<SealedChunk>) {
        st.inflight.retain(|x| !Arc::ptr_eq(x, &c));
        t.segs.chunk_end(c.seg);
        // The staging slot returns to the free list with the last reference.
        drop(c);
    }

    /// Writes sealed chunks to the device, then retires them. All writes complete before
    /// any stream lock is taken: a checkpoint holding every stream lock may be waiting for
    /// exactly these writes.
    pub fn write_chunks<D: BlockDevice>(
        &self,
        dev: &D,
        t: &Tables,
        chunks: Vec<Arc<SealedChunk>>,
    ) -> Result<()> {
        let mut first_err = None;
        let mut written = Vec::with_capacity(chunks.len());
        // Rule 5 to the end: a chunk leaves the guard only once its write completed its
        // number; a panic before that (in the device's write) poisons the FTL and
        // completes what is left. Without it every later FLUSH and checkpoint waited
        // for the number forever (found by review, 2026-11-29). Test:
        // `engine::tests::a_panic_in_a_chunk_write_does_not_wedge_flush`.
        let mut left = self.sealed(chunks);
        left.chunks.reverse();
        while let Some(c) = left.chunks.last().cloned() {
            let r = self.write_chunk_io(dev, &c);
            left.chunks.pop();
            match r {
                Ok(()) => written.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        #[cfg(test)]
        tests::maybe_park(&tests::PARK_BEFORE_RETIRE);
        for c in written {
            let mut st = lock(&self.streams[c.stream as usize]);
            self.retire(t, &mut st, c);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Appends one block under the stream lock. With `expect`, only if the map still
    /// holds `expect` (relocation); returns whether it was appended.
    pub fn append_block(
        &self,
        t: &Tables,
        st: &mut StreamLog,
        lba: u64,
        data: &[u8],
        crc: u32,
        expect: Option<MapEntry>,
    ) -> Result<bool> {
        let Some(chunk) = st.chunk.as_mut() else {
            return Err(Error::Corrupt("append without an open chunk".into()));
        };
        let pba = chunk.next_data_pba();
        let new = MapEntry::new(pba as u32, crc);
        let _stripe = lock(&self.stripes[lba as usize % STRIPES]);
        let mut appended = false;
        // One step under the map page's lock: a miss can fail, and does so before
        // anything changed.
        let old = t.map.update(lba, |old| {
            // Rule 6: a relocation only if the map still holds what the cleaner read.
            if expect.is_some_and(|e| e != old) {
                return None;
            }
            // Rule 1: numbered, recorded and mapped under the stream and stripe locks
            // (recorded in the chunk before the map points at it: a reader finds it).
            let seq = self.entry_seq.fetch_add(1, Ordering::SeqCst);
            chunk.push_data(lba, seq, crc, data);
            appended = true;
            Some(new)
        })?;
        if !appended {
            return Ok(false);
        }
        if expect.is_some() {
            chunk.moved += 1;
        }
        let geo = &self.s.geo;
        let old_seg = old.pba().map(|o| geo.segment_of(o as u64));
        if let Some(o) = old_seg {
            chunk.note_killed(o);
        }
        t.segs.note_append(geo.segment_of(pba), old_seg);
        if old_seg.is_none() {
            LiveCounters::add(&t.mapped, 1);
        }
        Ok(true)
    }

    /// Locks the stripes of `count` blocks from `lba` (at most [`STRIPES`]), in stripe
    /// order (the one order every multi-stripe holder takes them in).
    pub(crate) fn lock_stripes(
        &self,
        lba: u64,
        count: u32,
    ) -> Vec<crate::sync::MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = (lba..lba + count as u64)
            .map(|l| l as usize % STRIPES)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.iter().map(|&i| lock(&self.stripes[i])).collect()
    }

    /// Unmaps at most [`STRIPES`] blocks under their stripe locks and logs one record,
    /// unless none of them is mapped: then there is nothing a record could hide (an
    /// older TRIM record that unmapped them is in the log, and is carried as long as it
    /// hides something), and nothing is logged. TRIMs of unmapped ranges (a guest's
    /// repeated discards) filled TRIM segments that nothing freed, since no data died
    /// and no checkpoint fell due, until writers ran into ENOSPC (found by review).
    pub fn trim_piece(&self, t: &Tables, st: &mut StreamLog, lba: u64, count: u32) -> Result<()> {
        let Some(chunk) = st.chunk.as_mut() else {
            return Err(Error::Corrupt("trim without an open chunk".into()));
        };
        let _guards = self.lock_stripes(lba, count);
        // The pages are read in before anything changes (a miss can fail).
        t.map.prefetch(lba, count as u64)?;
        if !any_mapped(t, lba, count as u64)? {
            // Nothing mapped may be a failed TRIM's unmaps (below): not a success then.
            return self.check_poison();
        }
        // Rule 1, as for data.
        let seq = self.entry_seq.fetch_add(1, Ordering::SeqCst);
        for l in lba..lba + count as u64 {
            #[cfg(test)]
            let injected = tests::FAIL_TRIM_AT.with(|f| f.get() == Some(l));
            #[cfg(not(test))]
            let injected = false;
            let updated = if injected {
                Err(Error::Index("injected map page read error".into()))
            } else {
                t.map
                    .update(l, |old| old.is_mapped().then_some(MapEntry::UNMAPPED))
            };
            let old = match updated {
                Ok(old) => old,
                Err(e) => {
                    // A page evicted since the prefetch failed to read back. The blocks
                    // unmapped so far are logged, so the log agrees with the map, and the
                    // FTL is poisoned before the stripes are released: a TRIM of the same
                    // blocks waiting for them finds them unmapped and must not report
                    // success for a FLUSH or a kill -9 to lose (found by review,
                    // 2026-11-27).
                    if l > lba {
                        chunk.push_trim(lba, seq, (l - lba) as u32);
                    }
                    #[cfg(test)]
                    tests::maybe_park(&tests::PARK_IN_TRIM);
                    self.set_poison(format!("trim of lba {l} could not read its map page: {e}"));
                    return Err(e);
                }
            };
            if let Some(o) = old.pba() {
                let seg = self.s.geo.segment_of(o as u64);
                chunk.note_killed(seg);
                t.segs.note_unmap(seg);
                t.mapped.fetch_sub(1, Ordering::Relaxed);
            }
        }
        #[cfg(test)]
        tests::maybe_park(&tests::PARK_IN_TRIM);
        chunk.push_trim(lba, seq, count);
        Ok(())
    }

    /// Logs one TRIM record for the first run of still unmapped blocks in `count`
    /// blocks from `lba` (at most [`STRIPES`]), under their stripe locks, changing no map
    /// entry; the chunk notes `from` as a segment it killed (tombstone rule 2). Returns
    /// the later runs, which a write since split from the first (each needs an entry of
    /// its own), and whether blocks written since were left out (tombstone rule 4).
    pub fn relog_trim(
        &self,
        t: &Tables,
        st: &mut StreamLog,
        lba: u64,
        count: u32,
        from: u32,
    ) -> Result<(Vec<(u64, u64)>, bool)> {
        let Some(chunk) = st.chunk.as_mut() else {
            return Err(Error::Corrupt("trim without an open chunk".into()));
        };
        let _guards = self.lock_stripes(lba, count);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut skipped = false;
        for l in lba..lba + count as u64 {
            if t.map.get(l)?.is_mapped() {
                skipped = true;
                continue;
            }
            match runs.last_mut() {
                Some((start, n)) if *start + *n == l => *n += 1,
                _ => runs.push((l, 1)),
            }
        }
        if runs.is_empty() {
            return Ok((runs, skipped));
        }
        let (start, n) = runs.remove(0);
        // Rule 1, as for any TRIM: numbered and recorded under the stripe locks.
        let seq = self.entry_seq.fetch_add(1, Ordering::SeqCst);
        chunk.push_trim(start, seq, n as u32);
        chunk.note_killed(from);
        Ok((runs, skipped))
    }

    /// Copies `pba` into `out` when a stream still buffers it (its chunk is not yet on
    /// the device); false when the device has it.
    pub fn copy_buffered(&self, t: &Tables, pba: u64, out: &mut [u8]) -> bool {
        let Some(owner) = t.segs.buffered_owner(self.s.geo.segment_of(pba)) else {
            return false;
        };
        let st = lock(&self.streams[owner as usize]);
        match st.buffered(pba) {
            Some(b) => {
                out[..BLOCK_SIZE].copy_from_slice(b);
                true
            }
            None => false,
        }
    }

    /// Gives up the stream's open segment: seals its open chunk (returned, to be written
    /// by the caller), drops an empty one and closes the segment.
    pub fn close_segment(&self, t: &Tables, stream: StreamId) -> Result<Option<Arc<SealedChunk>>> {
        let mut st = self.stream(stream)?;
        let sealed = self.seal_open(t, stream.0, &mut st)?;
        // Left: an open chunk with nothing in it, which nobody reads.
        if let Some(empty) = st.chunk.take() {
            t.segs.chunk_end(empty.seg);
            drop(empty);
        }
        if let Some((seg, _)) = st.cursor.take() {
            t.segs.close(seg);
        }
        Ok(sealed)
    }
}

/// Whether any of `count` blocks from `lba` is mapped (the caller holds their stripe
/// locks when the answer must stand: a TRIM with nothing mapped logs nothing).
pub(crate) fn any_mapped(t: &Tables, lba: u64, count: u64) -> Result<bool> {
    for l in lba..lba + count {
        if t.map.get(l)?.is_mapped() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::{Cell, RefCell};
    use std::sync::mpsc::{Receiver, Sender};

    thread_local! {
        pub(crate) static PANIC_IN_SEAL: Cell<bool> = const { Cell::new(false) };
        /// Test hook: the next chunk write on this thread panics (taken once).
        pub(crate) static PANIC_IN_CHUNK_WRITE: Cell<bool> = const { Cell::new(false) };
        /// Test hook: `defrag_step` on this thread says it arrived once past its check of
        /// free space for a window, and waits for "go".
        pub(crate) static PARK_AFTER_DEFRAG_CHECK: Park = const { RefCell::new(None) };
        /// Test hook: `defrag_step` on this thread says it arrived once a window is
        /// rewritten, and waits for "go" before the next.
        pub(crate) static PARK_AFTER_DEFRAG_WINDOW: Park = const { RefCell::new(None) };
        /// Test hook: the next checkpoint's page commit on this thread panics (taken once).
        pub(crate) static PANIC_IN_CHECKPOINT: Cell<bool> = const { Cell::new(false) };
        /// Test hook: the next carry of TRIM records on this thread panics (taken once).
        pub(crate) static PANIC_IN_CARRY: Cell<bool> = const { Cell::new(false) };
        /// Test hook: `write_chunks` on this thread says it arrived once its chunks are
        /// written and marked complete, and waits for "go" before it retires them (taken
        /// after one use).
        pub(crate) static PARK_BEFORE_RETIRE: Park = const { RefCell::new(None) };
        /// Test hook: a read's `locate` on this thread says it arrived right after its
        /// map lookup, and waits for "go" before it looks in the buffers.
        pub(crate) static PARK_AFTER_LOOKUP: Park = const { RefCell::new(None) };
        /// Test hook: `trim_piece` on this thread says it arrived once it unmapped its
        /// blocks, and waits for "go" before it records its entry (or, when it failed,
        /// before it poisons the FTL).
        pub(crate) static PARK_IN_TRIM: Park = const { RefCell::new(None) };
        /// Test hook: `trim_piece` on this thread fails to unmap this lba as if its map
        /// page could not be read back.
        pub(crate) static FAIL_TRIM_AT: Cell<Option<u64>> = const { Cell::new(None) };
        /// Test hook: `Ftl::trim` on this thread says it arrived once past its first
        /// poison check, and waits for "go".
        pub(crate) static PARK_AFTER_TRIM_CHECK: Park = const { RefCell::new(None) };
        /// Test hook: `append_loop` on this thread says it arrived once it found no
        /// room and wrote what it sealed (deferred chunks too, engine rule 7), and waits
        /// for "go" before it frees, waits for space or gives up.
        pub(crate) static PARK_ON_NO_ROOM: Park = const { RefCell::new(None) };
        /// Test hook: `append_loop` on this thread says it arrived once its allocation
        /// failed, still holding the stream lock, and waits for "go" before it notes
        /// the space generation.
        pub(crate) static PARK_BEFORE_NO_ROOM_MARK: Park = const { RefCell::new(None) };
        /// Test hook: a carry of TRIM records on this thread says it arrived once it
        /// made a segment freeable (`set_carried`), and waits for "go".
        pub(crate) static PARK_AFTER_SET_CARRIED: Park = const { RefCell::new(None) };
        /// Test hook: a write on this thread says it arrived once past its poison check
        /// (`Ftl::write_to`), and waits for "go".
        pub(crate) static PARK_AFTER_WRITE_CHECK: Park = const { RefCell::new(None) };
        /// Test hook: `append_loop` on this thread says it arrived once a step of its
        /// wait for space ended with nothing freed, and waits for "go" before it looks
        /// whether a cleaner is still attached.
        pub(crate) static PARK_AFTER_SPACE_STEP: Park = const { RefCell::new(None) };
        /// Test hook: `append_loop` on this thread says it arrived once its free record
        /// left dead segments and it is about to checkpoint for them, and waits for "go".
        pub(crate) static PARK_BEFORE_SPACE_CHECKPOINT: Park = const { RefCell::new(None) };
        /// Test hook: a checkpoint on this thread says it arrived once it let the state
        /// lock go after its snapshot (in flight, checkpoint rule 8), and waits for "go"
        /// before it writes its sealed chunks and syncs.
        pub(crate) static PARK_IN_CHECKPOINT: Park = const { RefCell::new(None) };
        /// Test hook: a checkpoint on this thread says it arrived with every stream lock
        /// held, its chunks sealed, before its snapshot of the map (checkpoint rule 2).
        pub(crate) static PARK_AT_SNAPSHOT: Park = const { RefCell::new(None) };
    }

    /// A parking place: a channel to say "here", one to wait for "go". A test that
    /// gives up (its sender dropped while it unwinds) lets the parked thread go on.
    pub(crate) type Park = RefCell<Option<(Sender<()>, Receiver<()>)>>;

    /// Test hook: parks at `park` (once) on threads that asked for it.
    pub(crate) fn maybe_park(park: &'static std::thread::LocalKey<Park>) {
        if let Some((here, go)) = park.with(|p| p.borrow_mut().take()) {
            let _ = here.send(());
            let _ = go.recv();
        }
    }

    /// Test hook: panics in a checkpoint's page commit on a thread that asked for it
    /// (once).
    pub(crate) fn maybe_panic_in_checkpoint() {
        if PANIC_IN_CHECKPOINT.with(|p| p.replace(false)) {
            panic!("injected panic in a checkpoint");
        }
    }

    /// Test hook: panics inside `carry_tombstones` on a thread that asked for it (once).
    pub(crate) fn maybe_panic_in_carry() {
        if PANIC_IN_CARRY.with(|p| p.replace(false)) {
            panic!("injected panic while carrying TRIM records");
        }
    }

    /// Test hook: panics inside `write_chunk_io` once on a thread that asked for it.
    pub(super) fn maybe_panic_in_chunk_write() {
        if PANIC_IN_CHUNK_WRITE.with(|p| p.replace(false)) {
            panic!("injected panic in a chunk write");
        }
    }

    /// Test hook: panics inside `seal_open` on threads that asked for it.
    pub(super) fn maybe_panic_in_seal() {
        if PANIC_IN_SEAL.with(|p| p.get()) {
            panic!("injected panic while sealing");
        }
    }
}
