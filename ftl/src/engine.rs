//! The FTL engine: `Ftl` ties the map, the segment table, the stream logs and the
//! backing device together. See the crate docs for the durability contract.
//!
//! Lock order (never acquired in the other direction):
//! checkpoint lock -> stream locks (ascending) -> LBA stripe locks (ascending) -> segment
//! table lock. Device I/O is never issued while a stripe or the segment-table lock is held.
//!
//! Ordering rules between threads (each a numbered comment where it is carried out; the
//! tests that break without each are listed in `docs/orderings.md`):
//! 1. an entry gets its sequence number under its stream's lock, in the same step that
//!    records it in the open chunk and (under its LBA's stripe lock) changes the map: a
//!    sealer, which takes the stream lock, seals every entry numbered before it did;
//! 2. a FLUSH takes its ticket (the next entry number) when it starts, and its leader
//!    loads what it will cover BEFORE it seals: every write completed before the FLUSH is
//!    below the ticket and in a chunk sealed by this leader or an earlier one;
//! 3. every chunk below a target has completed its write BEFORE the device sync that
//!    declares it durable (recovery stops at the first missing chunk);
//! 4. a failed chunk write poisons the FTL BEFORE the tracker learns the chunk is done;
//! 5. a chunk number, once handed out, is completed whatever happens to its sealing
//!    (poisoned first), so no FLUSH or checkpoint waits for it forever;
//! 6. a relocation appends only if the map still holds the entry it read (compare and
//!    swap under the stripe lock), so a user write landing meanwhile is never undone;
//! 7. a thread holding chunks whose writes it deferred ([`PendingChunks`]) writes them
//!    BEFORE it waits for a staging slot, for free space or runs a checkpoint: each of
//!    those waits for them. Dropped unwritten, they keep rule 5 (poison, then complete).

use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::index::IndexStore;
use crate::log::{chunk_capacity, seal, OpenChunk, SealParams, SealedChunk, StreamLog, STREAMS};
use crate::map::{L2p, MapEntry};
use crate::records::Counters;
use crate::segments::Segments;
use crate::staging::{SlotPlace, StagingArea};
use crate::superblock::Superblock;
use crate::sync::{lock, AtomicU64, Mutex};
use crate::tracker::{ChunkTracker, GroupCommit};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Identifies a write stream (0 .. [`STREAMS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StreamId(pub u8);

/// Stream that TRIM records are logged in.
pub const TRIM_STREAM: StreamId = StreamId(0);
/// Stream the cleaner relocates into by default (GC output is cold); relocations into
/// other streams fall back to it when only one free segment is left.
pub const GC_STREAM: StreamId = StreamId(7);

/// Why the FTL turned read-only, once it did (shared with [`PendingChunks`]).
type Poison = Arc<Mutex<Option<String>>>;

/// Chunks sealed by [`Ftl::relocate_deferred`] whose device writes are the caller's to
/// issue, with [`Ftl::write_pending`]. Dropped unwritten (a panic on the way), it keeps
/// engine rule 5: the FTL is poisoned, then the chunk numbers are completed, so no FLUSH
/// or checkpoint waits for them forever.
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

    fn extend(
        &mut self,
        out: Vec<Arc<SealedChunk>>,
        tracker: &Arc<ChunkTracker>,
        poison: &Arc<Mutex<Option<String>>>,
    ) {
        if !out.is_empty() && self.owner.is_none() {
            self.owner = Some((tracker.clone(), poison.clone()));
        }
        self.chunks.extend(out);
    }

    fn take(&mut self) -> Vec<Arc<SealedChunk>> {
        std::mem::take(&mut self.chunks)
    }
}

impl Drop for PendingChunks {
    fn drop(&mut self) {
        if self.chunks.is_empty() {
            return;
        }
        if let Some((tracker, poison)) = &self.owner {
            poison_with(
                poison,
                format!("{} sealed chunks were dropped unwritten", self.chunks.len()),
            );
            for c in &self.chunks {
                tracker.complete(c.chunk_seq);
            }
        }
    }
}

/// Number of LBA stripe locks.
const STRIPES: usize = 4096;

/// Tunables of an open FTL.
#[derive(Debug, Clone)]
pub struct Config {
    /// Discard (TRIM / punch hole) segments on the backing when they are freed.
    pub discard_freed: bool,
    /// Blocks appended since the last checkpoint after which one is due.
    pub checkpoint_blocks: u64,
    /// Free segments that only relocations into [`GC_STREAM`] ([`Ftl::relocate`]) may
    /// take; user writes, TRIM records and relocations into other streams never do: the
    /// cleaner's room to finish its victim.
    pub gc_reserve_segments: usize,
    /// With a cleaner attached, how long a write waits for a free segment before it
    /// fails with ENOSPC.
    pub space_wait: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            discard_freed: true,
            checkpoint_blocks: 0,
            gc_reserve_segments: 2,
            space_wait: std::time::Duration::from_secs(30),
        }
    }
}

/// Live counters (atomics), persisted at each checkpoint.
#[derive(Default)]
pub(crate) struct LiveCounters {
    pub user_blocks_written: AtomicU64,
    pub backing_blocks_written: AtomicU64,
    pub padding_bytes: AtomicU64,
    pub summary_blocks: AtomicU64,
    pub trimmed_blocks: AtomicU64,
    pub flushes: AtomicU64,
    pub relocated_blocks: AtomicU64,
    pub discarded_bytes: AtomicU64,
}

impl LiveCounters {
    pub fn from(c: &Counters) -> Self {
        let l = LiveCounters::default();
        l.user_blocks_written
            .store(c.user_blocks_written, Ordering::Relaxed);
        l.backing_blocks_written
            .store(c.backing_blocks_written, Ordering::Relaxed);
        l.padding_bytes.store(c.padding_bytes, Ordering::Relaxed);
        l.summary_blocks.store(c.summary_blocks, Ordering::Relaxed);
        l.trimmed_blocks.store(c.trimmed_blocks, Ordering::Relaxed);
        l.flushes.store(c.flushes, Ordering::Relaxed);
        l.relocated_blocks
            .store(c.relocated_blocks, Ordering::Relaxed);
        l.discarded_bytes
            .store(c.discarded_bytes, Ordering::Relaxed);
        l
    }
    pub fn get(&self) -> Counters {
        Counters {
            user_blocks_written: self.user_blocks_written.load(Ordering::Relaxed),
            backing_blocks_written: self.backing_blocks_written.load(Ordering::Relaxed),
            padding_bytes: self.padding_bytes.load(Ordering::Relaxed),
            summary_blocks: self.summary_blocks.load(Ordering::Relaxed),
            trimmed_blocks: self.trimmed_blocks.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            relocated_blocks: self.relocated_blocks.load(Ordering::Relaxed),
            discarded_bytes: self.discarded_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Outcome of the internal room check.
enum Room {
    Ready,
    NeedSpace,
    /// Every staging slot is taken: wait for a chunk write to complete (no lock held).
    NeedBuffer,
}

/// A log-structured FTL over a backing device `D` with its checkpoints in index `I`.
pub struct Ftl<D: BlockDevice, I: IndexStore> {
    pub(crate) dev: D,
    pub(crate) index: I,
    pub(crate) sb: Superblock,
    pub(crate) geo: Geometry,
    pub(crate) cfg: Config,
    pub(crate) map: L2p,
    pub(crate) segs: Segments,
    pub(crate) streams: Box<[Mutex<StreamLog>]>,
    stripes: Box<[Mutex<()>]>,
    pub(crate) entry_seq: AtomicU64,
    pub(crate) tracker: Arc<ChunkTracker>,
    /// Device syncs: everything below `done()` (a chunk number) is durable.
    pub(crate) sync: GroupCommit,
    pub(crate) epoch: u64,
    pub(crate) counters: LiveCounters,
    pub(crate) mapped: AtomicU64,
    pub(crate) appended_since_checkpoint: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
    /// Where checkpoints spent their time (see [`crate::checkpoint::CheckpointTimes`]).
    pub(crate) checkpoint_times: crate::checkpoint::CheckpointTimes,
    /// Relocations sent to [`GC_STREAM`] because their stream needed the last free segment.
    diverted: AtomicU64,
    pub(crate) checkpoint_lock: Mutex<()>,
    pub(crate) staging: Arc<StagingArea>,
    poison: Poison,
    /// FLUSHes: every entry below `done()` (an entry sequence) is durable.
    flush_group: GroupCommit,
    pub(crate) space: crate::clean::SpaceWaiters,
}

/// Records the first reason the FTL turned read-only.
fn poison_with(p: &Mutex<Option<String>>, why: String) {
    let mut p = lock(p);
    if p.is_none() {
        *p = Some(why);
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

/// Where a block a caller wants to read lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLocation {
    /// Never written or trimmed: reads as zeros.
    Zero,
    /// Already copied out of the write buffer into the caller's block.
    Copied,
    /// On the device at this byte offset; verify with [`Ftl::verify_block`].
    Device { offset: u64, entry: MapEntry },
}

pub(crate) struct Parts<D, I> {
    pub dev: D,
    pub index: I,
    pub sb: Superblock,
    pub cfg: Config,
    pub map: L2p,
    pub segs: Segments,
    pub cursors: Vec<Option<(u32, u32)>>,
    pub next_chunk_seq: u64,
    pub next_entry_seq: u64,
    pub epoch: u64,
    pub counters: Counters,
    pub mapped: u64,
    pub staging: Arc<StagingArea>,
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    pub(crate) fn from_parts(p: Parts<D, I>) -> Self {
        let geo = p.sb.geometry;
        let streams: Box<[Mutex<StreamLog>]> = (0..STREAMS)
            .map(|i| {
                Mutex::new(StreamLog {
                    cursor: p.cursors.get(i).copied().flatten(),
                    ..Default::default()
                })
            })
            .collect();
        let cfg = Config {
            checkpoint_blocks: if p.cfg.checkpoint_blocks == 0 {
                (geo.exported_blocks / 16).max(1024)
            } else {
                p.cfg.checkpoint_blocks
            },
            ..p.cfg
        };
        Ftl {
            dev: p.dev,
            index: p.index,
            geo,
            sb: p.sb,
            cfg,
            map: p.map,
            segs: p.segs,
            streams,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            entry_seq: AtomicU64::new(p.next_entry_seq),
            tracker: Arc::new(ChunkTracker::new(p.next_chunk_seq)),
            sync: GroupCommit::new(p.next_chunk_seq),
            epoch: p.epoch,
            counters: LiveCounters::from(&p.counters),
            mapped: AtomicU64::new(p.mapped),
            appended_since_checkpoint: AtomicU64::new(0),
            diverted: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            checkpoint_times: Default::default(),
            checkpoint_lock: Mutex::new(()),
            staging: p.staging,
            poison: Arc::new(Mutex::new(None)),
            space: crate::clean::SpaceWaiters::default(),
            flush_group: GroupCommit::new(p.next_entry_seq),
        }
    }

    /// Device geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// Superblock of the backing.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Exported capacity in blocks.
    pub fn capacity_blocks(&self) -> u64 {
        self.geo.exported_blocks
    }

    /// The backing device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Open count of this device (epoch of the chunks this session writes).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn check_range(&self, lba: u64, blocks: u64) -> Result<()> {
        let cap = self.geo.exported_blocks;
        match lba.checked_add(blocks) {
            Some(end) if end <= cap => Ok(()),
            _ => Err(Error::OutOfRange {
                lba,
                end: lba.saturating_add(blocks),
                capacity: cap,
            }),
        }
    }

    fn check_len(len: usize) -> Result<u64> {
        if !len.is_multiple_of(BLOCK_SIZE) {
            return Err(Error::Unaligned(format!(
                "{len} bytes is not a multiple of {BLOCK_SIZE}"
            )));
        }
        Ok((len / BLOCK_SIZE) as u64)
    }

    pub(crate) fn check_poison(&self) -> Result<()> {
        match &*lock(&self.poison) {
            Some(why) => Err(Error::ReadOnly(why.clone())),
            None => Ok(()),
        }
    }

    pub(crate) fn set_poison(&self, why: String) {
        poison_with(&self.poison, why);
    }

    fn seal_params(&self, stream: u8, chunk_seq: u64) -> SealParams {
        SealParams {
            chunk_seq,
            epoch: self.epoch,
            format_id: self.format_id(),
            stream,
            blocks_per_page: self.geo.blocks_per_page(),
            blocks_per_segment: self.geo.blocks_per_segment(),
        }
    }

    /// First 8 bytes of the superblock uuid, stamped into every chunk summary.
    pub fn format_id(&self) -> u64 {
        self.sb.format_id()
    }

    /// The staging area the chunk buffers live in.
    pub fn staging(&self) -> &Arc<StagingArea> {
        &self.staging
    }

    // ----- the log -----

    /// Seals the stream's open chunk, if it holds anything.
    pub(crate) fn seal_open(
        &self,
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
        let c = &self.counters;
        c.padding_bytes
            .fetch_add(pad as u64 * BLOCK_SIZE as u64, Ordering::Relaxed);
        c.summary_blocks.fetch_add(1, Ordering::Relaxed);
        c.backing_blocks_written
            .fetch_add(sealed.total_blocks as u64, Ordering::Relaxed);
        let next = offset + sealed.total_blocks;
        if next + 2 > self.geo.blocks_per_segment() {
            self.segs.close(seg);
            st.cursor = None;
        } else {
            st.cursor = Some((seg, next));
        }
        let sealed = Arc::new(sealed);
        st.inflight.push(sealed.clone());
        Ok(Some(sealed))
    }

    /// Makes sure the stream has an open chunk with room for one entry (and a data block
    /// when `data`), sealing the full one into `out`. Only a `relocation` into
    /// [`GC_STREAM`] may open a segment out of the cleaner's reserve.
    fn ensure_room(
        &self,
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
                if room && c.seq_fits(self.entry_seq.load(Ordering::SeqCst)) {
                    return Ok(Room::Ready);
                }
                if let Some(s) = self.seal_open(stream, st)? {
                    out.push(s);
                }
                continue;
            }
            let Some(mut buf) = self.staging.try_take() else {
                return Ok(Room::NeedBuffer);
            };
            let bps = self.geo.blocks_per_segment();
            let (seg, offset) = match st.cursor {
                Some((seg, off)) if off + 2 <= bps => (seg, off),
                other => {
                    if let Some((seg, _)) = other {
                        self.segs.close(seg);
                        st.cursor = None;
                    }
                    // The reserve is the GC stream's alone: user writes, TRIM records
                    // and relocations into any other stream keep it (a relocation that
                    // would need it is diverted to GC_STREAM by `relocate`), so one
                    // stream spends it, one victim at a time: a victim's live blocks
                    // fit in the GC stream's open segment and the reserve, and the
                    // victim's segment is dead afterwards.
                    let keep = if relocation && stream == GC_STREAM.0 {
                        0
                    } else {
                        self.cfg.gc_reserve_segments
                    };
                    match self
                        .segs
                        .allocate(stream, self.entry_seq.load(Ordering::SeqCst), keep)
                    {
                        Some(seg) => (seg, 0),
                        None => return Ok(Room::NeedSpace),
                    }
                }
            };
            st.cursor = Some((seg, offset));
            let capacity = chunk_capacity(bps, offset) as u16;
            let start_pba = self.geo.segment_start(seg) + offset as u64;
            buf.open(SlotPlace {
                stream,
                seg,
                offset,
                start_pba,
            });
            self.segs.owner[seg as usize].store(stream, Ordering::SeqCst);
            self.segs.unwritten[seg as usize].fetch_add(1, Ordering::SeqCst);
            st.chunk = Some(OpenChunk {
                seg,
                offset,
                start_pba,
                capacity,
                entries: Vec::new(),
                data_blocks: 0,
                buf,
            });
        }
    }

    /// Writes one sealed chunk and marks it complete. On failure the chunk stays in
    /// memory (reads keep working), the device turns read-only and every later FLUSH
    /// reports the failure.
    ///
    /// Rule 4: a failed write poisons the FTL BEFORE the tracker learns the chunk is done. A FLUSH or checkpoint waiting for this chunk checks the
    /// poison right after the wait, so it never syncs and acknowledges (or commits a map
    /// naming) blocks that were not written. Test: `tests/shuttle.rs`,
    /// `a_failed_chunk_write_is_never_covered_by_a_flush`.
    pub(crate) fn write_chunk_io(&self, c: &SealedChunk) -> Result<()> {
        let offset = c.start_pba * BLOCK_SIZE as u64;
        let r = match self.dev.write_at(offset, c.bytes()) {
            Ok(()) => {
                // Staging rule 3: free in the staging area before the tracker knows.
                c.buf.mark_written();
                Ok(())
            }
            Err(e) => {
                let err = Error::io("chunk write", offset, e);
                self.set_poison(err.to_string());
                Err(err)
            }
        };
        self.tracker.complete(c.chunk_seq);
        r
    }

    /// Drops a written chunk's buffer (reads now go to the device).
    pub(crate) fn retire(&self, st: &mut StreamLog, c: Arc<SealedChunk>) {
        st.inflight.retain(|x| !Arc::ptr_eq(x, &c));
        self.segs.unwritten[c.seg as usize].fetch_sub(1, Ordering::SeqCst);
        // The staging slot returns to the free list with the last reference.
        drop(c);
    }

    /// Writes sealed chunks to the device, then retires them. All writes complete before
    /// any stream lock is taken: a checkpoint holding every stream lock may be waiting for
    /// exactly these writes.
    pub(crate) fn write_chunks(&self, chunks: Vec<Arc<SealedChunk>>) -> Result<()> {
        let mut first_err = None;
        let mut written = Vec::with_capacity(chunks.len());
        for c in chunks {
            match self.write_chunk_io(&c) {
                Ok(()) => written.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for c in written {
            let mut st = lock(&self.streams[c.stream as usize]);
            self.retire(&mut st, c);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Appends one block under the stream lock. With `expect`, only if the map still
    /// holds `expect` (relocation); returns whether it was appended.
    fn append_block(
        &self,
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
        let old = self.map.get(lba);
        // Rule 6: a relocation only if the map still holds what the cleaner read.
        if expect.is_some_and(|e| e != old) {
            return Ok(false);
        }
        // Rule 1: numbered, recorded and mapped under the stream and stripe locks.
        let seq = self.entry_seq.fetch_add(1, Ordering::SeqCst);
        chunk.push_data(lba, seq, crc, data);
        self.segs.valid[self.geo.segment_of(pba) as usize].fetch_add(1, Ordering::SeqCst);
        self.map.swap(lba, new);
        match old.pba() {
            Some(o) => {
                self.segs.valid[self.geo.segment_of(o as u64) as usize]
                    .fetch_sub(1, Ordering::SeqCst);
            }
            None => {
                self.mapped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(true)
    }

    /// Runs `f` for each block with the stream lock held and room ensured; handles
    /// sealing, device writes and running out of free segments (`relocation`: may take
    /// the reserve).
    fn append_loop(
        &self,
        stream: StreamId,
        items: u64,
        data: bool,
        relocation: bool,
        mut defer: Option<&mut PendingChunks>,
        mut f: impl FnMut(&Self, &mut StreamLog, u64) -> Result<()>,
    ) -> Result<()> {
        // Sealed chunks go to the device now, or (with `defer`) to the caller, who writes
        // them with `write_pending`. Deferred chunks hold staging slots and are below any
        // later FLUSH or checkpoint target: they are written here before this thread
        // waits for a slot, for space or runs a checkpoint.
        let emit = |out: Vec<Arc<SealedChunk>>, defer: &mut Option<&mut PendingChunks>| match defer
        {
            Some(d) => {
                d.extend(out, &self.tracker, &self.poison);
                Ok(())
            }
            None => self.write_chunks(out),
        };
        let sid = stream.0;
        if sid as usize >= STREAMS {
            return Err(Error::InvalidParameters(format!(
                "stream {sid} >= {STREAMS}"
            )));
        }
        let mut i = 0;
        let mut retried = false;
        while i < items {
            let mut out = Vec::new();
            let mut need_space = false;
            let mut need_buffer = false;
            {
                let mut st = lock(&self.streams[sid as usize]);
                while i < items {
                    match self.ensure_room(sid, &mut st, data, relocation, &mut out) {
                        Ok(Room::Ready) => {}
                        Ok(Room::NeedSpace) => {
                            need_space = true;
                            break;
                        }
                        Ok(Room::NeedBuffer) => {
                            need_buffer = true;
                            break;
                        }
                        Err(e) => {
                            drop(st);
                            emit(out, &mut defer)?;
                            return Err(e);
                        }
                    }
                    if let Err(e) = f(self, &mut st, i) {
                        drop(st);
                        emit(out, &mut defer)?;
                        return Err(e);
                    }
                    retried = false;
                    i += 1;
                }
            }
            emit(out, &mut defer)?;
            if need_buffer || need_space {
                // Rule 7.
                if let Some(d) = defer.as_deref_mut() {
                    self.write_chunks(d.take())?;
                }
            }
            if need_buffer {
                // Slots come back as chunk writes complete; none is waited for under a lock.
                // After a failed chunk write they may never come back: stop then.
                self.check_poison()?;
                self.staging
                    .wait_for_slot(std::time::Duration::from_millis(50));
                continue;
            }
            if need_space {
                // Dead segments come back only through a durable checkpoint. An attached
                // cleaner runs those (off its thread, in batches); a writer waits for
                // it rather than running one more behind it. Without a cleaner, or for
                // the cleaner itself, the caller checkpoints.
                if !retried
                    && (relocation || !self.cleaner_attached())
                    && !self.segs.dead_closed().is_empty()
                {
                    self.checkpoint()?;
                    retried = true;
                    continue;
                }
                // The cleaner makes space; it must not wait for it.
                if relocation || !self.wait_for_space()? {
                    return Err(Error::NoSpace);
                }
                retried = false;
            }
        }
        Ok(())
    }

    /// Relocations diverted to [`GC_STREAM`] since open (see [`Ftl::relocate`]).
    pub fn relocations_diverted(&self) -> u64 {
        self.diverted.load(Ordering::Relaxed)
    }

    /// Writes whole blocks at `lba`. With `fua`, returns only once they are durable.
    pub fn write(&self, lba: u64, data: &[u8], fua: bool, stream: StreamId) -> Result<()> {
        self.write_to(lba, data, fua, stream, None)
    }

    /// [`Ftl::write`], handing the chunk writes it would issue (when a write fills a
    /// chunk, the writer that sealed it writes it) to `writers`: the write completes once
    /// its blocks are in the staging area, like every write that does not fill a chunk,
    /// instead of after a 1 MiB device write. A FUA write still returns only once durable.
    pub fn write_via(
        &self,
        lba: u64,
        data: &[u8],
        fua: bool,
        stream: StreamId,
        writers: &crate::writers::ChunkWriters,
    ) -> Result<()> {
        self.write_to(lba, data, fua, stream, Some(writers))
    }

    fn write_to(
        &self,
        lba: u64,
        data: &[u8],
        fua: bool,
        stream: StreamId,
        writers: Option<&crate::writers::ChunkWriters>,
    ) -> Result<()> {
        let n = Self::check_len(data.len())?;
        self.check_range(lba, n)?;
        self.check_poison()?;
        self.note_foreground();
        self.throttle(n);
        let mut pending = PendingChunks::default();
        let appended = self.append_loop(
            stream,
            n,
            true,
            false,
            writers.map(|_| &mut pending),
            |ftl, st, i| {
                let block = &data[i as usize * BLOCK_SIZE..(i as usize + 1) * BLOCK_SIZE];
                let crc = crc32c::crc32c(block);
                ftl.append_block(st, lba + i, block, crc, None).map(|_| ())
            },
        );
        // Handed over even after an error: sealed chunks must be written (rule 5).
        if let Some(w) = writers {
            if let Some(back) = w.send(pending) {
                self.write_pending(back)?;
            }
        }
        appended?;
        let c = &self.counters;
        c.user_blocks_written.fetch_add(n, Ordering::Relaxed);
        self.appended_since_checkpoint
            .fetch_add(n, Ordering::Relaxed);
        if fua {
            self.flush()?;
        }
        Ok(())
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
            self.append_loop(s, 1, true, true, Some(pending), |ftl, st, _| {
                moved = ftl.append_block(st, lba, data, crc, Some(expected))?;
                Ok(())
            })
        };
        match append(stream, pending) {
            Err(Error::NoSpace) if stream != GC_STREAM => {
                self.diverted.fetch_add(1, Ordering::Relaxed);
                append(GC_STREAM, pending)?;
            }
            r => r?,
        }
        if moved {
            self.counters
                .relocated_blocks
                .fetch_add(1, Ordering::Relaxed);
            self.appended_since_checkpoint
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(moved)
    }

    /// Writes chunks a [`Ftl::relocate_deferred`] sealed, then retires them.
    pub fn write_pending(&self, mut pending: PendingChunks) -> Result<()> {
        self.write_chunks(pending.take())
    }

    /// Unmaps `blocks` blocks from `lba` (TRIM, DISCARD, WRITE_ZEROES): they read as zeros.
    pub fn trim(&self, lba: u64, blocks: u64) -> Result<()> {
        self.check_range(lba, blocks)?;
        self.check_poison()?;
        self.note_foreground();
        let pieces = blocks.div_ceil(STRIPES as u64);
        self.append_loop(TRIM_STREAM, pieces, false, false, None, |ftl, st, i| {
            let start = lba + i * STRIPES as u64;
            let count = (blocks - i * STRIPES as u64).min(STRIPES as u64);
            ftl.trim_piece(st, start, count as u32)
        })?;
        self.counters
            .trimmed_blocks
            .fetch_add(blocks, Ordering::Relaxed);
        Ok(())
    }

    /// Unmaps at most [`STRIPES`] blocks under their stripe locks and logs one record.
    fn trim_piece(&self, st: &mut StreamLog, lba: u64, count: u32) -> Result<()> {
        let Some(chunk) = st.chunk.as_mut() else {
            return Err(Error::Corrupt("trim without an open chunk".into()));
        };
        let mut idx: Vec<usize> = (lba..lba + count as u64)
            .map(|l| l as usize % STRIPES)
            .collect();
        idx.sort_unstable();
        let _guards: Vec<_> = idx.iter().map(|&i| lock(&self.stripes[i])).collect();
        // Rule 1, as for data.
        let seq = self.entry_seq.fetch_add(1, Ordering::SeqCst);
        for l in lba..lba + count as u64 {
            let old = self.map.get(l);
            if let Some(o) = old.pba() {
                self.map.swap(l, MapEntry::UNMAPPED);
                self.segs.valid[self.geo.segment_of(o as u64) as usize]
                    .fetch_sub(1, Ordering::SeqCst);
                self.mapped.fetch_sub(1, Ordering::Relaxed);
            }
        }
        chunk.push_trim(lba, seq, count);
        Ok(())
    }

    // ----- durability -----

    /// FLUSH: every write completed before this call is durable when it returns.
    ///
    /// Group commit: one flusher at a time leads, sealing every stream's open chunk and
    /// syncing; flushers arriving meanwhile wait, and the next leader seals everything
    /// they appended in one go, so concurrent write+flush pairs share chunks and syncs.
    pub fn flush(&self) -> Result<()> {
        self.check_poison()?;
        self.note_foreground();
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        // Rule 2: every write that completed before this call has an entry sequence below
        // it.
        let ticket = self.entry_seq.load(Ordering::SeqCst);
        self.flush_group
            .run_to(ticket, || self.seal_and_sync_all())
            .map(|_| ())
    }

    /// Seals and writes every open chunk, then makes the whole log durable. Returns the
    /// entry sequence below which everything is now durable.
    fn seal_and_sync_all(&self) -> Result<u64> {
        // Rule 2: loaded BEFORE sealing: every entry below it is in a chunk sealed below.
        let covers = self.entry_seq.load(Ordering::SeqCst);
        for (sid, s) in self.streams.iter().enumerate() {
            let sealed = self.seal_open(sid as u8, &mut lock(s))?;
            // Written before the next stream lock is taken: a checkpoint holding that lock
            // may be waiting for this very chunk.
            if let Some(c) = sealed {
                self.write_chunks(vec![c])?;
            }
        }
        self.flush_upto(self.tracker.next_seq())?;
        Ok(covers)
    }

    /// Makes every chunk below `target` durable.
    pub(crate) fn flush_upto(&self, target: u64) -> Result<()> {
        // Waiting first saves syncs that could not cover `target` yet (and lets rule 4's
        // poison be seen before any sync).
        self.tracker.wait_below(target);
        self.check_poison()?;
        self.sync
            .run_to(target, || {
                // Rule 3: a sync makes durable only the chunks whose writes completed
                // BEFORE it started: the frontier is loaded before the sync, and only it
                // is credited.
                let covers = self.tracker.frontier();
                self.dev.sync().map(|()| covers)
            })
            .map_err(|e| {
                let err = Error::io("sync", 0, e);
                self.set_poison(err.to_string());
                err
            })?;
        Ok(())
    }

    // ----- reads -----

    /// Finds where `lba` lives; copies it into `out` when it is still buffered.
    pub fn locate(&self, lba: u64, out: &mut [u8]) -> Result<BlockLocation> {
        self.check_range(lba, 1)?;
        self.note_foreground();
        let e = self.map.get(lba);
        let Some(pba) = e.pba() else {
            return Ok(BlockLocation::Zero);
        };
        let pba = pba as u64;
        let seg = self.geo.segment_of(pba) as usize;
        if self.segs.unwritten[seg].load(Ordering::SeqCst) > 0 {
            let owner = self.segs.owner[seg].load(Ordering::SeqCst) as usize;
            let st = lock(&self.streams[owner]);
            if let Some(b) = st.buffered(pba) {
                out[..BLOCK_SIZE].copy_from_slice(b);
                return Ok(BlockLocation::Copied);
            }
        }
        Ok(BlockLocation::Device {
            offset: pba * BLOCK_SIZE as u64,
            entry: e,
        })
    }

    /// Verifies a block read from the device against its map entry. A mismatch is an
    /// error unless the map moved on meanwhile (then the caller locates again).
    pub fn verify_block(&self, lba: u64, entry: MapEntry, data: &[u8]) -> Result<bool> {
        if crc32c::crc32c(&data[..BLOCK_SIZE]) == entry.crc() {
            return Ok(true);
        }
        if self.map.get(lba) != entry {
            return Ok(false);
        }
        Err(Error::DataChecksum {
            lba,
            pba: entry.pba().unwrap_or(u32::MAX) as u64,
        })
    }

    /// Reads whole blocks at `lba` into `buf`. Never-written and trimmed blocks read zeros.
    pub fn read(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        let n = Self::check_len(buf.len())?;
        self.check_range(lba, n)?;
        let mut i = 0u64;
        while i < n {
            let blk = &mut buf[i as usize * BLOCK_SIZE..(i as usize + 1) * BLOCK_SIZE];
            match self.locate(lba + i, blk)? {
                BlockLocation::Zero => {
                    blk.fill(0);
                    i += 1;
                }
                BlockLocation::Copied => i += 1,
                BlockLocation::Device { offset, entry } => {
                    // Extend the run while the following blocks are physically contiguous.
                    let mut run = vec![entry];
                    while i + (run.len() as u64) < n {
                        let next = self.map.get(lba + i + run.len() as u64);
                        let contiguous = next.pba().is_some_and(|p| {
                            p as u64 * BLOCK_SIZE as u64
                                == offset + run.len() as u64 * BLOCK_SIZE as u64
                                && self.segs.unwritten[self.geo.segment_of(p as u64) as usize]
                                    .load(Ordering::SeqCst)
                                    == 0
                        });
                        if !contiguous {
                            break;
                        }
                        run.push(next);
                    }
                    let bytes =
                        &mut buf[i as usize * BLOCK_SIZE..(i as usize + run.len()) * BLOCK_SIZE];
                    self.dev
                        .read_at(offset, bytes)
                        .map_err(|e| Error::io("read", offset, e))?;
                    for (k, e) in run.iter().enumerate() {
                        let blk = &mut buf
                            [(i as usize + k) * BLOCK_SIZE..(i as usize + k + 1) * BLOCK_SIZE];
                        if !self.verify_block(lba + i + k as u64, *e, blk)? {
                            self.read_one_retrying(lba + i + k as u64, blk)?;
                        }
                    }
                    i += run.len() as u64;
                }
            }
        }
        Ok(())
    }

    /// Reads one block, locating again while the map keeps moving under it.
    fn read_one_retrying(&self, lba: u64, blk: &mut [u8]) -> Result<()> {
        for _ in 0..16 {
            match self.locate(lba, blk)? {
                BlockLocation::Zero => {
                    blk.fill(0);
                    return Ok(());
                }
                BlockLocation::Copied => return Ok(()),
                BlockLocation::Device { offset, entry } => {
                    self.dev
                        .read_at(offset, blk)
                        .map_err(|e| Error::io("read", offset, e))?;
                    if self.verify_block(lba, entry, blk)? {
                        return Ok(());
                    }
                }
            }
        }
        Err(Error::DataChecksum { lba, pba: u64::MAX })
    }

    /// Current map entry of `lba` (for the cleaner and checks).
    pub fn map_entry(&self, lba: u64) -> Result<MapEntry> {
        self.check_range(lba, 1)?;
        Ok(self.map.get(lba))
    }

    /// Flushes and checkpoints, then removes the staging file (if the area has one):
    /// everything it held is in the log and checkpointed. Call before dropping for a
    /// clean shutdown; dropping without it is a crash, from which `open` recovers. On
    /// failure the staging file stays, and the next open replays it.
    pub fn close(&self) -> Result<()> {
        self.flush()?;
        self.checkpoint()?;
        self.staging.remove_file()
    }
}

#[cfg(test)]
mod tests {
    use crate::device::mem::MemDevice;
    use crate::index::mem::MemIndex;
    use crate::model::block_for;
    use crate::{Config, Error, FormatOptions, Ftl, StreamId};
    use std::cell::Cell;
    use std::sync::Arc;
    use std::time::Duration;

    thread_local! {
        static PANIC_IN_SEAL: Cell<bool> = const { Cell::new(false) };
    }

    /// Test hook: panics inside `seal_open` on threads that asked for it.
    pub(super) fn maybe_panic_in_seal() {
        if PANIC_IN_SEAL.with(|p| p.get()) {
            panic!("injected panic while sealing");
        }
    }

    /// Rule 5: a panic between taking a chunk number and putting the chunk in
    /// flight poisons the FTL and completes the number; every later FLUSH fails at once
    /// instead of waiting forever (for the number, or for the dead FLUSH leader).
    #[test]
    fn a_panic_while_sealing_does_not_wedge_flush() {
        let dev = Arc::new(MemDevice::new(32 * (64 << 10)));
        let idx = Arc::new(MemIndex::new());
        let opts = FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        crate::format(&dev, &idx, &opts, false).unwrap();
        let (f, _) = Ftl::open(dev, idx, Config::default()).unwrap();
        let f = Arc::new(f);
        let f2 = f.clone();
        let dying = std::thread::spawn(move || {
            PANIC_IN_SEAL.with(|p| p.set(true));
            f2.write(1, &block_for(1, 1), false, StreamId(1)).unwrap();
            let _ = f2.flush();
        });
        assert!(dying.join().is_err(), "the injected panic happened");
        let (tx, rx) = std::sync::mpsc::channel();
        let f3 = f.clone();
        std::thread::spawn(move || {
            let _ = tx.send((f3.flush(), f3.checkpoint().map(|_| ())));
        });
        let (flush, checkpoint) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("FLUSH and checkpoint return after a panic while sealing");
        assert!(matches!(flush, Err(Error::ReadOnly(_))), "{flush:?}");
        assert!(
            matches!(checkpoint, Err(Error::ReadOnly(_))),
            "{checkpoint:?}"
        );
    }
}
