//! The FTL engine: [`Ftl`] and its public I/O API (write, trim, flush, locate, read,
//! close). It owns the parts (appender, tables, space, checkpointer, group commits) and
//! is the only module that combines them: the append loop (room, staging slots, free
//! space, checkpoint when space runs out). Its children add the rest of the API, one
//! concern each: `flush` (FLUSH and the device-sync group), `read` (locate, read, the
//! retry path), [`reloc`] (what a cleaner calls), [`checkpoint`], `free` (dead segments
//! freed between checkpoints), `defrag` (read-driven defragmentation), [`stats`].
//! Called by users of the crate (the ublk server, the cleaner, tools, tests). See the
//! crate docs for the durability contract.
//!
//! Lock order (never acquired in the other direction):
//! checkpoint lock (checkpoints and free records) -> stream locks (ascending) -> LBA stripe locks (ascending) -> segment
//! table lock. Device I/O is never issued while a stripe or the segment-table lock is held.
//!
//! Ordering rules between threads (each a numbered comment where it is carried out:
//! rules 1, 4, 5, 6 and 8 in `append.rs`, 2, 3, 9 and 10 in `engine/flush.rs`, 11 in `engine/tombstones.rs`, 7 here; the tests
//! that break without
//! each are listed in `docs/orderings.md`):
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
//!    those waits for them. Dropped unwritten, they keep rule 5 (poison, then complete);
//! 8. a chunk stops answering reads once its device write returned, BEFORE the tracker
//!    learns it is done: a segment freed meanwhile and reused is read from the device;
//! 9. a failed device sync poisons the FTL BEFORE the sync group's next leader runs, and
//!    every leader checks the poison before it syncs: a FLUSH, checkpoint or free record
//!    queued behind the failed sync fails instead of syncing again;
//! 10. a FLUSH leaves open a chunk whose entries are all relocations (a cleaner's or the
//!     defragmenter's moves, `OpenChunk::only_relocations`): no write a FLUSH covers is in
//!     it, and the blocks it moved stay readable and durable at their old place, which is
//!     freed only after a free record or checkpoint sealed this chunk and synced it (free
//!     rule 2, which seals the chunk that killed a segment's blocks; a checkpoint seals
//!     every chunk). Sealed at every FLUSH, the cleaner's stream paid a summary block and
//!     a flash page's padding per FLUSH: at the reserve, under frequent FLUSHes, a victim
//!     could take more segments to relocate than the one it frees, and the cleaner found
//!     no free segment (the crash harness's smallest geometry, about 1 seed in 200).
//! 11. a carry of TRIM records (`engine/tombstones.rs`), which leaves out those hiding
//!     only blocks of segments free when it looked, syncs those segments' zeroed first
//!     blocks (checkpoint rule 5) BEFORE the carried segment is freeable (`set_carried`): a free record with nothing new to sync left a zeroing unsynced, and a power
//!     cut that kept the carried segment's zeroing and lost that one showed an index
//!     rebuild the freed segment's old chunks with no TRIM record left to hide them
//!     (found by review, 2026-11-29). Zeroings are counted before the segment's release,
//!     and every device sync notes how many it covers, so the carry's sync is rarely one
//!     more.

use crate::append::{Appender, PendingChunks, Room, Session, STRIPES};
use crate::config::Config;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::index::IndexStore;
use crate::log::{SealedChunk, StreamLog};
use crate::map::{L2p, MapEntry};
use crate::records::Counters;
use crate::segments::Segments;
use crate::space::SpaceWaiters;
use crate::staging::{AreaOwner, StagingArea};
use crate::stream::{StreamId, TRIM_STREAM};
use crate::superblock::Superblock;
use crate::sync::AtomicU64;
use crate::tables::{LiveCounters, Tables};
use crate::tracker::GroupCommit;
use checkpoint::Checkpointer;
use free::FreeMode;
use std::sync::Arc;

pub(crate) mod checkpoint;
mod discard;
pub(crate) mod defrag;
mod flush;
pub(crate) mod free;
pub(crate) mod read;
pub(crate) mod reloc;
mod tombstones;
pub(crate) mod stats;

/// How often a block that keeps moving under a read is located again before the read
/// fails: a buffered block that moved between its lookup and its copy (`Ftl::locate`),
/// and a device block that moved while it was read ([`Ftl::reread_block`], each of whose
/// attempts locates). Every reader: [`Ftl::read`] and the ublk edge.
pub const READ_RETRIES: usize = 16;

/// A log-structured FTL over a backing device `D` with its checkpoints in index `I`.
///
/// Its parts, each owning one concern: the appender (streams, chunks, entry and chunk
/// numbers, staging, poison: `append.rs`), the tables it changes (map, segments,
/// counters: `tables.rs`), free-space flow control (`space.rs`), the checkpointer
/// (`engine/checkpoint.rs`) and two group commits (FLUSH, device sync).
pub struct Ftl<D: BlockDevice, I: IndexStore> {
    dev: D,
    sb: Superblock,
    cfg: Config,
    epoch: u64,
    /// This session's random number: in its checkpoints and its staging area's header
    /// (staging rule 9).
    session: u32,
    t: Tables,
    log: Appender,
    space: SpaceWaiters,
    ckpt: Checkpointer<I>,
    /// Device syncs: everything below `done()` (a chunk number) is durable.
    sync: GroupCommit,
    /// FLUSHes: every entry below `done()` (an entry sequence) is durable.
    flush_group: GroupCommit,
    /// Relocations sent to GC_STREAM because their stream needed the last free segment.
    diverted: AtomicU64,
    /// A carry of TRIM records runs (`engine/tombstones.rs`).
    carrying: crate::sync::AtomicBool,
    /// TRIM segments a carry failed on since open, and the last error; each failed one
    /// with when it last failed (tried again after `tombstones::CARRY_RETRY`).
    carry_failures: AtomicU64,
    carry_failed: std::sync::Mutex<std::collections::HashMap<u32, std::time::Instant>>,
    carry_error: std::sync::Mutex<Option<String>>,
    /// What large reads cost (`frag.rs`), the windows waiting to be rewritten
    /// contiguously and what rewriting them did (`engine/defrag.rs`).
    frag: crate::frag::FragMeter,
    defrag: crate::frag::DefragQueue,
    defrag_done: defrag::DefragDone,
    /// Blocks appended per stream since open (user writes and relocations).
    stream_blocks: [AtomicU64; crate::stream::STREAMS],
    /// Rounds of freed segments' first blocks zeroed (checkpoint rule 5), and how many of
    /// them a device sync that started after them covers (`engine/flush.rs`, rule 11).
    heads_zeroed: AtomicU64,
    heads_synced: AtomicU64,
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

/// What recovery hands the engine to start a session with.
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
    /// The session's random number (staging rule 9), never 0.
    pub session: u32,
    pub counters: Counters,
    pub mapped: u64,
    pub staging: Arc<StagingArea>,
    /// Segments the index holds free records for (the first checkpoint removes them).
    pub freed: Vec<u32>,
}

/// How long a relocation out of space, with no dead segment left for it to free, waits
/// for others to free some (a free record takes 5-7 ms under load) before it fails.
const NOTHING_DEAD_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// What an append out of space does after its own free record (`append_loop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFree {
    /// Look for space again.
    Retry,
    /// Checkpoint, for the dead segments no free record may free, then look again.
    Checkpoint,
    /// Wait a moment for others' free records, then look again.
    WaitForOthers,
}

/// After a free record that freed `enough` (or found that others freed space): look
/// again. Otherwise checkpoint when dead segments are left (`dead_now`: a checkpoint frees
/// those free records may not). With none left, a checkpoint frees nothing: others freed
/// the dead segments and writers took them, and more come only from others' free records
/// (the runner's reclaim of what writers kill) or the relocation itself, so a relocation
/// waits a moment for the next one; a writer without a cleaner looks again and fails.
/// Under zipf:0.99 the first pass after a fill ran up to 24 such checkpoints of about 20
/// ms back to back on the cleaner's thread, with writers waiting for space.
fn after_free_record(enough: bool, dead_now: bool, relocation: bool) -> AfterFree {
    if enough {
        AfterFree::Retry
    } else if dead_now {
        AfterFree::Checkpoint
    } else if relocation {
        AfterFree::WaitForOthers
    } else {
        AfterFree::Retry
    }
}

/// How many times one append may find that others freed the space it was about to free
/// ([`Ftl::append_loop`]) before it stops trying and reports it has none.
const MAX_OTHERS_ROUNDS: u32 = 4;

/// How often a writer waiting for space looks whether the FTL turned read-only.
const POISON_LOOK: std::time::Duration = std::time::Duration::from_millis(100);

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    pub(crate) fn from_parts(p: Parts<D, I>) -> Self {
        let geo = p.sb.geometry;
        let cfg = p.cfg.resolved(geo.exported_blocks);
        p.segs.set_wear_aware(cfg.wear_levelling);
        let log = Appender::new(
            Session {
                geo,
                epoch: p.epoch,
                format_id: p.sb.format_id(),
                gc_reserve: cfg.gc_reserve_segments,
                next_chunk_seq: p.next_chunk_seq,
                next_entry_seq: p.next_entry_seq,
            },
            &p.cursors,
            p.staging,
        );
        Ftl {
            dev: p.dev,
            sb: p.sb,
            epoch: p.epoch,
            session: p.session,
            t: Tables {
                geo,
                map: p.map,
                segs: p.segs,
                counters: LiveCounters::from(&p.counters),
                mapped: AtomicU64::new(p.mapped),
            },
            log,
            space: SpaceWaiters::default(),
            ckpt: Checkpointer::new(p.index, p.freed),
            sync: GroupCommit::new(p.next_chunk_seq),
            flush_group: GroupCommit::new(p.next_entry_seq),
            diverted: AtomicU64::new(0),
            carrying: crate::sync::AtomicBool::new(false),
            carry_failures: AtomicU64::new(0),
            carry_failed: std::sync::Mutex::new(std::collections::HashMap::new()),
            carry_error: std::sync::Mutex::new(None),
            frag: crate::frag::FragMeter::default(),
            defrag: crate::frag::DefragQueue::new(if cfg.defrag {
                cfg.defrag_queue_bytes.max(1)
            } else {
                0
            }),
            defrag_done: defrag::DefragDone::new(),
            stream_blocks: std::array::from_fn(|_| AtomicU64::new(0)),
            // One round counted from the start, so this session's first carry syncs once:
            // a zeroing a killed process left unsynced is not this session's to count
            // (a review, 2026-11-29; the open syncs the device in every case built, so a
            // guard, untested).
            heads_zeroed: AtomicU64::new(1),
            heads_synced: AtomicU64::new(0),
            cfg,
        }
    }

    /// Starts the session recovery prepared: a checkpoint of the whole recovered map
    /// (with the new epoch), then the staging area is handed to this session.
    pub(crate) fn start_session(&self) -> Result<()> {
        self.checkpoint()?;
        // Staging rule 4: the area is handed to this session only after the checkpoint
        // that starts it is committed.
        self.log.staging().reset(
            AreaOwner {
                uuid: self.sb.uuid,
                epoch: self.epoch,
                session: self.session,
            },
            self.log.tracker().next_seq(),
        )
        .map_err(|e| Error::io("staging area header write-back", 0, e))
    }

    /// Device geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.t.geo
    }

    /// Superblock of the backing.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Exported capacity in blocks.
    pub fn capacity_blocks(&self) -> u64 {
        self.t.geo.exported_blocks
    }

    /// Blocks mapped now (written and not trimmed): one load, for callers on the write
    /// path ([`crate::classify::write_classified`] gives it to the classifier as its
    /// scale).
    pub fn mapped_blocks(&self) -> u64 {
        self.t.mapped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The backing device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Open count of this device (epoch of the chunks this session writes).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// First 8 bytes of the superblock uuid, stamped into every chunk summary.
    /// The configuration it was opened with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn format_id(&self) -> u64 {
        self.sb.format_id()
    }

    /// The staging area the chunk buffers live in.
    pub fn staging(&self) -> &Arc<StagingArea> {
        self.log.staging()
    }

    /// The appender, for tests that stop it between two steps.
    #[cfg(test)]
    pub(crate) fn appender(&self) -> &Appender {
        &self.log
    }

    /// The entry sequence number the next write gets (the FTL's clock for segment ages).
    pub fn current_seq(&self) -> u64 {
        self.log.next_entry_seq()
    }

    /// The lifetime counters (user, backing, relocated blocks...), without the rest of
    /// [`Ftl::stats`].
    pub fn counters(&self) -> Counters {
        self.t.counters.get()
    }

    fn check_range(&self, lba: u64, blocks: u64) -> Result<()> {
        let cap = self.t.geo.exported_blocks;
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

    fn check_poison(&self) -> Result<()> {
        self.log.check_poison()
    }

    /// Whether the FTL turned read-only (a failed write, sync or index commit): it takes
    /// no more writes, relocations, free records or checkpoints.
    pub fn is_read_only(&self) -> bool {
        self.check_poison().is_err()
    }

    /// `index::sled_store` rule 2: an index that refuses every commit since one failed
    /// frees nothing any more; the FTL turns read-only at the first refusal (writers
    /// waited out `space_wait`, 30 s each, and failed with ENOSPC; found by review,
    /// 2026-11-29). A commit that failed once is retried by the next checkpoint as
    /// before.
    fn stuck_poisons(&self, r: Result<()>) -> Result<()> {
        if let Err(Error::IndexStuck(why)) = &r {
            self.set_poison(format!("index can no longer commit: {why}"));
        }
        r
    }

    fn set_poison(&self, why: String) {
        self.log.set_poison(why);
        // Writers asleep in the throttle wake to the poison (see `set_write_pace`).
        self.space.set_pace(std::time::Duration::ZERO);
    }

    /// Writes sealed chunks, then retires them.
    fn write_chunks(&self, chunks: Vec<Arc<SealedChunk>>) -> Result<()> {
        self.log.write_chunks(&self.dev, &self.t, chunks)
    }

    // ----- the write path -----

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
        mut f: impl FnMut(&mut StreamLog, u64) -> Result<()>,
    ) -> Result<()> {
        // Sealed chunks go to the device now, or (with `defer`) to the caller, who writes
        // them with `write_pending`. Deferred chunks hold staging slots and are below any
        // later FLUSH or checkpoint target: they are written here before this thread
        // waits for a slot, for space or runs a checkpoint.
        let emit = |out: Vec<Arc<SealedChunk>>, defer: &mut Option<&mut PendingChunks>| match defer
        {
            Some(d) => {
                self.log.defer(d, out);
                Ok(())
            }
            None => self.write_chunks(out),
        };
        let sid = stream.0;
        if sid as usize >= crate::stream::STREAMS {
            return Err(Error::InvalidParameters(format!(
                "stream {sid} >= {}",
                crate::stream::STREAMS
            )));
        }
        let mut i = 0;
        let mut retried = false;
        // Times this call found space others freed while it waited (bounded: a
        // relocation into a stream that keeps the reserve, or a writer without a cleaner,
        // could otherwise go round as long as others free and someone else takes it).
        let mut others_rounds = 0u32;
        // Since when this writer has waited for free segments (its stall ends when it has
        // one; the cleaner's runner follows the longest, `Space::note_stall`).
        let mut stalled: Option<std::time::Instant> = None;
        // The space generation when this writer last found no room (under the stream
        // lock), so that a segment freed while it writes its sealed chunks is not missed.
        let mut no_room_at = 0;
        let mut last_try = false;
        while i < items {
            // Rule 5 while they wait to be emitted: a panic in `f` drops them poisoned
            // and completed, not forgotten (found by review, 2026-11-29).
            let mut out = self.log.sealed(Vec::new());
            let mut need_space = false;
            let mut need_buffer = false;
            {
                let mut st = self.log.stream(stream)?;
                while i < items {
                    match self
                        .log
                        .ensure_room(&self.t, sid, &mut st, data, relocation, out.chunks_mut())
                    {
                        Ok(Room::Ready) => {
                            if let Some(t) = stalled.take() {
                                self.space.note_stall(t.elapsed());
                            }
                        }
                        Ok(Room::NeedSpace) => {
                            need_space = true;
                            #[cfg(test)]
                            crate::append::tests::maybe_park(
                                &crate::append::tests::PARK_BEFORE_NO_ROOM_MARK,
                            );
                            no_room_at = self.space.generation();
                            break;
                        }
                        Ok(Room::NeedBuffer) => {
                            need_buffer = true;
                            break;
                        }
                        Err(e) => {
                            drop(st);
                            emit(out.take(), &mut defer)?;
                            return Err(e);
                        }
                    }
                    if let Err(e) = f(&mut st, i) {
                        drop(st);
                        emit(out.take(), &mut defer)?;
                        return Err(e);
                    }
                    retried = false;
                    i += 1;
                }
            }
            emit(out.take(), &mut defer)?;
            if need_buffer || need_space {
                // Rule 7.
                if let Some(d) = defer.as_deref_mut() {
                    self.write_chunks(d.take())?;
                }
            }
            #[cfg(test)]
            if need_space {
                crate::append::tests::maybe_park(&crate::append::tests::PARK_ON_NO_ROOM);
            }
            if need_buffer {
                // Slots come back as chunk writes complete; none is waited for under a lock.
                // After a failed chunk write they may never come back: stop then.
                self.check_poison()?;
                self.log
                    .staging()
                    .wait_for_slot(std::time::Duration::from_millis(50));
                continue;
            }
            if need_space {
                // Dead segments come back only through a durable free record or
                // checkpoint. An attached cleaner runs those (off its thread); a writer
                // waits for it rather than running one more behind it. Without a cleaner,
                // or for the cleaner itself, the caller frees them: with free records
                // (a log sync and a small commit; since free rule 7 nearly every dead
                // segment qualifies), then with a checkpoint if they freed nothing (the
                // cleaner) or left dead segments behind (a writer without a cleaner).
                // The cleaner checkpointed at once here before: 30-50 checkpoints of
                // about 35 ms a zipf:0.99 run, the cleaner stopped for each; freeing
                // first gave 101-108K against 73-96K IOPS in 3 A/B pairs, later max
                // 13-20 against 12-44 ms, WAF equal (1.771-1.781 against 1.774-1.780).
                //
                // The free record waits for the checkpointer's lock, and the runner's
                // free record or checkpoint holding it may have freed the segments this
                // one finds gone: then the free list grew meanwhile, and no checkpoint
                // is run for nothing (with the summary cache, 23-51 of a zipf:0.99 run's
                // checkpoints were the cleaner's, about 50 ms each, most after such a
                // free record) and the space is tried again first.
                if !retried
                    && (relocation || !self.space.attached())
                    && !self.t.segs.dead_closed().is_empty()
                {
                    let before = self.t.segs.free_count();
                    let grew = || self.t.segs.free_count() > before;
                    let r = self.free_dead_unless(FreeMode::Seal, grew)?;
                    let mut others_freed = r.segments_freed == 0 && grew();
                    let enough = others_freed
                        || if relocation {
                            r.segments_freed > 0
                        } else {
                            r.segments_freed > 0 && r.dead_left == 0
                        };
                    let dead_now = !self.t.segs.dead_closed().is_empty();
                    match after_free_record(enough, dead_now, relocation) {
                        AfterFree::Retry => {}
                        AfterFree::Checkpoint => {
                            // A checkpoint under way holds the segments it found dead
                            // (checkpoint rule 9: not this record's to free) and releases
                            // them when it is done, while this one waits for its lock:
                            // segments released meanwhile (the space generation moved)
                            // are tried first, with no checkpoint run behind it for
                            // nothing (found by review, 2026-11-29: a relocation ran a
                            // whole checkpoint after the one it waited for had freed the
                            // space, the cleaner stopped through both). Test:
                            // `tests::a_relocation_runs_no_checkpoint_behind_one_that_freed_its_space`.
                            let g = self.space.generation();
                            #[cfg(test)]
                            crate::append::tests::maybe_park(
                                &crate::append::tests::PARK_BEFORE_SPACE_CHECKPOINT,
                            );
                            if self.checkpoint_if(|| self.space.generation() == g)?.is_none() {
                                others_freed = true;
                            }
                        }
                        AfterFree::WaitForOthers => {
                            self.space.wait_for_free(NOTHING_DEAD_WAIT);
                        }
                    }
                    // Space someone else freed may be gone again by the next look: this
                    // thread may still free or checkpoint then, a few times.
                    others_rounds += u32::from(others_freed);
                    retried = !others_freed || others_rounds >= MAX_OTHERS_ROUNDS;
                    continue;
                }
                // The cleaner makes space; it must not wait for it. But segments a
                // checkpoint or free record released since this call found no room (the
                // dead list it looked at above emptied by them) are not missed: it
                // looks again, once. It failed with "device full" with segments free
                // (test: `a_segment_freed_while_a_relocation_finds_no_room_is_not_missed`).
                // A release between the failed allocation and the look at the
                // generation shows only in the free list (test:
                // `a_segment_released_before_the_relocation_notes_the_generation_is_not_missed`).
                if relocation {
                    let freed = self.space.generation() != no_room_at
                        || self.log.may_allocate(&self.t, sid, data, relocation);
                    if !last_try && freed {
                        last_try = true;
                        continue;
                    }
                    self.check_poison()?;
                    return Err(Error::NoSpace);
                }
                let since = *stalled.get_or_insert_with(std::time::Instant::now);
                // A release between the failed allocation and the note of the generation
                // (a checkpoint or free record of another thread) moved the generation
                // before this writer noted it: the wait below would not see it, only the
                // free list does (found by review, 2026-11-29: the writer slept until the
                // next release, up to `space_wait`, with segments free; the relocation's
                // look above). Test: `tests::a_segment_released_before_a_writer_notes_the_generation_is_not_missed`.
                if others_rounds < MAX_OTHERS_ROUNDS
                    && self.log.may_allocate(&self.t, sid, data, relocation)
                {
                    others_rounds += 1;
                    retried = false;
                    continue;
                }
                // Discard rule 6: with no cleaner attached nothing else frees space, but
                // segments out of the free list for a discard come back in a moment; a
                // writer waits for them (two streams opening segments while one
                // discard ran failed with ENOSPC, the first taking the one segment rule
                // 5 leaves; found by review, 2026-11-29).
                // In steps, the poison looked at between them: a device failure while a
                // writer waited left it waiting out `space_wait` (30 s) for space nothing
                // would free any more, then failing with ENOSPC instead of EROFS (found
                // by review, 2026-11-29).
                let deadline = std::time::Instant::now() + self.cfg.space_wait;
                let waited = loop {
                    let step = deadline
                        .saturating_duration_since(std::time::Instant::now())
                        .min(POISON_LOOK);
                    let w = if self.space.attached() {
                        self.space.wait(no_room_at, step)
                    } else {
                        self.t.segs.discarding() > 0
                            && self.space.wait_unattached(no_room_at, step)
                    };
                    self.check_poison()?;
                    if w || std::time::Instant::now() >= deadline {
                        break w;
                    }
                    #[cfg(test)]
                    crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_SPACE_STEP);
                    if !self.space.attached() && self.t.segs.discarding() == 0 {
                        break false;
                    }
                };
                // The space moved since this writer found no room: a segment freed, or
                // the cleaner it waited for detached (its writers then free dead segments
                // themselves, the branch above). A detach after a step ended, before the
                // look at `attached`, failed the write with ENOSPC while dead segments
                // waited (found by review, 2026-11-29). Test:
                // `tests::a_writer_waiting_for_a_cleaner_that_detaches_frees_space_itself`.
                if !waited && self.space.generation() != no_room_at {
                    retried = false;
                    continue;
                }
                if !waited {
                    // A segment freed between the failed allocation and the look at the
                    // generation moved it already: one more try before giving up.
                    if !last_try && self.log.may_allocate(&self.t, sid, data, relocation) {
                        last_try = true;
                        continue;
                    }
                    self.space.note_stall(since.elapsed());
                    return Err(Error::NoSpace);
                }
                self.check_poison()?;
                retried = false;
            }
        }
        Ok(())
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
        #[cfg(test)]
        crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_WRITE_CHECK);
        self.space.note_foreground();
        self.space.throttle(n);
        if let Some(w) = writers {
            w.admit();
        }
        self.relieve_map_before()?;
        // A miss reads the index: here, not under the stream lock, where it held every
        // writer of the stream (and a checkpoint taking the locks) for a sled read
        // (found by review, 2026-11-27). A hint: a page evicted meanwhile is read again.
        // A cache holding the whole map misses too, on each page's first use after an
        // open (found by review, 2026-11-29); after that this is a hit.
        self.t.map.prefetch(lba, n)?;
        let mut pending = PendingChunks::default();
        let appended = self.append_loop(
            stream,
            n,
            true,
            false,
            writers.map(|_| &mut pending),
            |st, i| {
                let block = &data[i as usize * BLOCK_SIZE..(i as usize + 1) * BLOCK_SIZE];
                let crc = crc32c::crc32c(block);
                self.log
                    .append_block(&self.t, st, lba + i, block, crc, None)
                    .map(|_| ())
            },
        );
        // Handed over even after an error: sealed chunks must be written (rule 5).
        if let Some(w) = writers {
            if let Some(back) = w.send(pending) {
                self.write_pending(back)?;
            }
        }
        appended?;
        LiveCounters::add(&self.t.counters.user_blocks_written, n);
        if let Some(c) = self.stream_blocks.get(stream.0 as usize) {
            c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        self.ckpt.note_appended(n);
        self.relieve_map()?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Map rule 3 with an index that refuses commits: a writer or TRIM that finds half
    /// the cache dirty relieves it before it changes anything, and a checkpoint that
    /// fails refuses the request. Relieved only after the append, every write took
    /// effect, returned the checkpoint's error and dirtied one more page that could not
    /// be evicted: the cache grew without bound while the index failed (found by review,
    /// 2026-11-29).
    fn relieve_map_before(&self) -> Result<()> {
        if self.t.map.at_limit() {
            self.relieve_map()?;
        }
        Ok(())
    }

    /// Map rule 3's back-pressure: a writer that finds a quarter of the cache dirty takes
    /// a checkpoint itself unless one is under way; at half the cache it waits for the
    /// one under way, and takes another if that did not bring the map back under the
    /// bound. The cache stays bounded whether or not a background thread checkpoints, and
    /// however slow a checkpoint is. Several writers that saw the bound crossed take one
    /// checkpoint, not one each.
    fn relieve_map(&self) -> Result<()> {
        let map = &self.t.map;
        if self.ckpt.busy() && !map.at_limit() {
            return Ok(());
        }
        self.checkpoint_if(|| map.over_bound()).map(|_| ())
    }

    /// Writes chunks a [`Ftl::relocate_deferred`] or [`Ftl::write_via`] sealed, then
    /// retires them.
    pub fn write_pending(&self, mut pending: PendingChunks) -> Result<()> {
        self.write_chunks(pending.take())
    }

    /// Unmaps `blocks` blocks from `lba` (TRIM, DISCARD, WRITE_ZEROES): they read as zeros.
    pub fn trim(&self, lba: u64, blocks: u64) -> Result<()> {
        self.check_range(lba, blocks)?;
        self.check_poison()?;
        #[cfg(test)]
        crate::append::tests::maybe_park(&crate::append::tests::PARK_AFTER_TRIM_CHECK);
        self.space.note_foreground();
        self.relieve_map_before()?;
        // Nothing mapped, nothing to log (`append::trim_piece`), and no segment opened
        // for it. A write that completed before this TRIM began is mapped here; one
        // racing with it may be ordered after it. Looked at under the blocks' stripe
        // locks, as `trim_piece` does: a TRIM of the same blocks still running has
        // unmapped them but may not have recorded its entry yet, and this one must not
        // complete before it did (a `kill -9` between the two would lose both; found by
        // review).
        // The pieces before the first with a mapped block are looked at once, here; the
        // append loop starts at that one (`trim_piece` looks at each again under its
        // locks, and logs nothing for one with nothing mapped).
        let pieces = blocks.div_ceil(STRIPES as u64);
        let piece = |i: u64| {
            let start = lba + i * STRIPES as u64;
            (start, (blocks - i * STRIPES as u64).min(STRIPES as u64))
        };
        let mut first = None;
        for i in 0..pieces {
            let (start, n) = piece(i);
            let _stripes = self.log.lock_stripes(start, n as u32);
            if crate::append::any_mapped(&self.t, start, n)? {
                first = Some(i);
                break;
            }
        }
        let Some(first) = first else {
            // Nothing mapped may be what a TRIM that failed part way unmapped (it poisons
            // before it releases the stripes): not a success then.
            self.check_poison()?;
            LiveCounters::add(&self.t.counters.trimmed_blocks, blocks);
            return Ok(());
        };
        self.append_loop(TRIM_STREAM, pieces - first, false, false, None, |st, i| {
            let (start, n) = piece(first + i);
            self.log.trim_piece(&self.t, st, start, n as u32)
        })?;
        LiveCounters::add(&self.t.counters.trimmed_blocks, blocks);
        self.relieve_map()
    }

    /// Flushes, checkpoints and discards the freed segments still waiting for their discard
    /// (`engine/discard.rs`), then removes the staging file (if the area has one):
    /// everything it held is in the log and checkpointed. Call before dropping for a
    /// clean shutdown; dropping without it is a crash, from which `open` recovers. On
    /// failure the staging file stays, and the next open replays it.
    pub fn close(&self) -> Result<()> {
        self.flush()?;
        self.checkpoint()?;
        self.discard_all_at_close();
        // A freed segment's head whose zeroing failed there turned the FTL read-only: not
        // a clean close (it said so, removed the staging file and the daemon reported
        // "checkpointed and closed"; found by review, 2026-11-29).
        self.check_poison()?;
        self.log.staging().remove_file()
    }
}

impl<D, I> crate::writers::ChunkSink for Ftl<D, I>
where
    D: BlockDevice + 'static,
    I: IndexStore + 'static,
{
    fn write_pending(&self, p: PendingChunks) -> Result<()> {
        Ftl::write_pending(self, p)
    }
}

#[cfg(test)]
mod tests {
    use super::{after_free_record, AfterFree};
    use crate::append::tests::PANIC_IN_SEAL;
    use crate::device::mem::MemDevice;
    use crate::index::mem::MemIndex;
    use crate::model::block_for;
    use crate::{Error, FormatOptions, StreamId};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    /// 32 segments of 64 KiB in memory, default `Config`.
    fn small_ftl() -> (Arc<MemDevice>, Arc<MemIndex>, crate::model::MemFtl) {
        let opts = FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        crate::model::mem_ftl(32 * (64 << 10), &opts)
    }

    /// The cleaner out of space skips its free record when the free list grew while it
    /// waited for the checkpointer's lock (`append_loop`): nothing is committed or freed.
    /// Without that, the same call frees the dead segments.
    #[test]
    fn a_checkpoint_runs_for_space_only_when_dead_segments_are_left() {
        use AfterFree::*;
        for relocation in [false, true] {
            assert_eq!(after_free_record(true, true, relocation), Retry);
            assert_eq!(after_free_record(true, false, relocation), Retry);
            assert_eq!(after_free_record(false, true, relocation), Checkpoint);
        }
        assert_eq!(after_free_record(false, false, true), WaitForOthers);
        assert_eq!(after_free_record(false, false, false), Retry);
    }

    /// A checkpoint asked for only if due runs when one is, and not right after another
    /// (the daemon's control plane and the cleaner's runner both take due checkpoints).
    #[test]
    fn a_checkpoint_if_due_does_not_follow_another() {
        let (_, _, f) = small_ftl();
        assert!(f.checkpoint_if_due().unwrap().is_none(), "nothing written: not due");
        let mut l = 0;
        let mut write_until_due = || {
            let limit = l + 100_000;
            while !f.checkpoint_due() {
                f.write(l % 256, &block_for(l, 1), false, StreamId(1)).unwrap();
                l += 1;
                assert!(l < limit, "never due");
            }
        };
        write_until_due();
        let before = f.stats().checkpoints;
        // Another caller's checkpoint first: this one is no longer due.
        f.checkpoint().unwrap();
        assert!(f.checkpoint_if_due().unwrap().is_none());
        assert_eq!(f.stats().checkpoints, before + 1);
        write_until_due();
        assert!(f.checkpoint_if_due().unwrap().is_some());
        assert_eq!(f.stats().checkpoints, before + 2);
        assert!(!f.checkpoint_due());
        // The race it is for: due when asked, but another checkpoint holds the lock and
        // takes its snapshot meanwhile. Checked again under the lock, none follows.
        write_until_due();
        let held = f.ckpt.one();
        std::thread::scope(|sc| {
            let late = sc.spawn(|| f.checkpoint_if_due());
            // Long enough for it to pass its first look and wait for the lock.
            std::thread::sleep(Duration::from_millis(50));
            f.checkpoint_held(held, std::time::Instant::now()).unwrap();
            assert!(late.join().unwrap().unwrap().is_none(), "a second checkpoint ran");
        });
        assert_eq!(f.stats().checkpoints, before + 3);
    }

    /// Counts the reads a walk issues (one at a time, and batches) and the depth the
    /// last depth-bounded batch asked for.
    struct CountingReads {
        inner: Arc<MemDevice>,
        single: std::sync::atomic::AtomicUsize,
        batches: std::sync::atomic::AtomicUsize,
        depth: std::sync::atomic::AtomicUsize,
    }

    impl CountingReads {
        fn new(inner: &Arc<MemDevice>) -> Self {
            CountingReads {
                inner: inner.clone(),
                single: 0.into(),
                batches: 0.into(),
                depth: 0.into(),
            }
        }
    }

    impl crate::BlockDevice for CountingReads {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.single.fetch_add(1, Ordering::SeqCst);
            self.inner.read_at(offset, buf)
        }
        fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> std::io::Result<()> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            for (offset, buf) in reqs.iter_mut() {
                self.inner.read_at(*offset, buf)?;
            }
            Ok(())
        }
        fn read_many_depth(
            &self,
            reqs: &mut [(u64, &mut [u8])],
            depth: usize,
        ) -> std::io::Result<()> {
            self.depth.store(depth, Ordering::SeqCst);
            self.read_many(reqs)
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.inner.write_at(offset, buf)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.inner.sync()
        }
        fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.inner.discard(offset, len)
        }
        fn describe(&self) -> String {
            "counting reads".into()
        }
    }

    /// A victim's live blocks are read at most [`super::reloc::VICTIM_READ_DEPTH`] at a
    /// time (fewer after a user's read), and land where the window puts them.
    #[test]
    fn a_victims_reads_keep_a_bounded_depth() {
        let (dev, idx, f) = small_ftl();
        f.close().unwrap();
        let counting = Arc::new(CountingReads::new(&dev));
        let (f, _) = super::Ftl::open(counting.clone(), idx, crate::model::test_config()).unwrap();
        let n = 200;
        for l in 0..n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        for l in (0..n).step_by(3) {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        let victim = f
            .segment_snapshot()
            .into_iter()
            .find(|s| s.segment != 0 && s.state == "closed" && s.valid > 4)
            .expect("a closed segment with live blocks")
            .segment;
        let geo = *f.geometry();
        let start = geo.segment_start(victim);
        let live = f.live_blocks(victim).unwrap();
        let mut window = crate::device::AlignedBuf::new(geo.segment_bytes as usize);
        let read = f.read_live_window(start, &live, &mut window).unwrap();
        assert_eq!(
            counting.depth.load(Ordering::SeqCst),
            super::reloc::VICTIM_READ_DEPTH
        );
        assert!(read.reads >= 1 && read.bytes >= live.len() as u64 * 4096, "{read:?}");
        // A user's read since the last victim read: the next one keeps fewer in flight,
        // and the one after that, with no user reads between, as many as before.
        let mut one = vec![0u8; 4096];
        f.read(0, &mut one).unwrap();
        f.read_live_window(start, &live, &mut window).unwrap();
        assert_eq!(
            counting.depth.load(Ordering::SeqCst),
            super::reloc::VICTIM_READ_DEPTH_BESIDE_READS
        );
        f.read_live_window(start, &live, &mut window).unwrap();
        assert_eq!(
            counting.depth.load(Ordering::SeqCst),
            super::reloc::VICTIM_READ_DEPTH
        );
        for b in &live {
            let at = (b.entry.pba().unwrap() as u64 - start) as usize * 4096;
            assert!(f.verify_block(b.lba, b.entry, &window[at..at + 4096]).unwrap());
        }
    }

    /// The segment table notes where each chunk of a segment opened this session starts,
    /// and a walk given those starts reads every summary in one batch: the same chunks
    /// as the walk that reads one summary after another. A wrong or partial hint changes
    /// only the reads, never the chunks found.
    #[test]
    fn a_segments_known_chunk_starts_walk_it_as_its_summaries_do() {
        use crate::chunks::SegmentChunks;
        let (dev, _, f) = small_ftl();
        // Chunks of several lengths: a FLUSH after 1, 2, 3, ... blocks, until a segment
        // of stream 1 is closed.
        let closed = |f: &crate::model::MemFtl| {
            f.segment_snapshot()
                .into_iter()
                .find(|s| s.segment != 0 && s.state == "closed" && s.stream == 1)
                .map(|s| s.segment)
        };
        let mut l = 0;
        let seg = loop {
            if let Some(s) = closed(&f) {
                break s;
            }
            for _ in 0..=(l % 4) {
                f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
                l += 1;
            }
            f.flush().unwrap();
            assert!(l < 1000, "no segment of stream 1 closed");
        };
        let starts = f.t.segs.chunk_starts(seg).expect("opened in this session");
        let counting = CountingReads::new(&dev);
        let reads = || {
            (
                counting.single.swap(0, Ordering::SeqCst),
                counting.batches.swap(0, Ordering::SeqCst),
            )
        };
        let walk = |hint: Option<&[u32]>| {
            let w = SegmentChunks::new(&counting, *f.geometry(), seg, f.format_id(), (u64::MAX, 0));
            let w = match hint {
                Some(h) => w.known(h),
                None => w,
            };
            w.map(|c| c.map(|(off, _)| off)).collect::<crate::Result<Vec<u32>>>()
        };
        let plain = walk(None).unwrap();
        let (single, _) = reads();
        assert!(plain.len() >= 3, "chunks: {plain:?}");
        assert!(single >= plain.len(), "one read per summary");
        assert_eq!(plain, starts, "the table's starts are the summaries' chunks");
        assert_eq!(walk(Some(&starts)).unwrap(), plain);
        let (single, batches) = reads();
        assert_eq!(batches, 1, "the summaries are read in one batch");
        assert!(single <= 1, "{single} reads besides the batch");
        let shifted: Vec<u32> = starts.iter().map(|o| o + 1).collect();
        assert_eq!(walk(Some(&shifted)).unwrap(), plain);
        assert_eq!(walk(Some(&starts[..1])).unwrap(), plain);
        assert_eq!(walk(Some(&[])).unwrap(), plain);
    }

    #[test]
    fn a_free_record_nobody_needs_any_more_does_nothing() {
        use super::free::{FreeMode, FreeReport};
        let (_, _, f) = small_ftl();
        for l in 0..64 {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        f.checkpoint().unwrap();
        for l in 0..64 {
            f.write(l, &block_for(l, 2), false, StreamId(2)).unwrap();
        }
        let freeable = f.freeable_segments();
        assert!(freeable >= 1, "stream 1's closed segments died");
        let (frees, free) = (f.ckpt.frees.load(Ordering::SeqCst), f.free_segments());
        let r = f.free_dead_unless(FreeMode::Seal, || true).unwrap();
        assert_eq!(r, FreeReport::default());
        assert_eq!(f.freeable_segments(), freeable);
        assert_eq!(f.ckpt.frees.load(Ordering::SeqCst), frees, "no record");
        assert_eq!(f.free_segments(), free);
        let r = f.free_dead_unless(FreeMode::Seal, || false).unwrap();
        assert_eq!(r.segments_freed, freeable, "{r:?}");
    }

    /// Free rules 1 and 7: a young segment with more chunks than a free record may list
    /// (`free::LIST_CAP`, a handful in unit tests) is not freed by a record (its list
    /// would not decode) but by the next checkpoint.
    #[test]
    fn a_segment_with_more_chunks_than_a_record_lists_waits_for_a_checkpoint() {
        let opts = FormatOptions {
            segment_bytes: Some(256 << 10),
            ..Default::default()
        };
        let (_, _, f) = crate::model::mem_ftl(32 * (256 << 10), &opts);
        f.write(300, &block_for(300, 1), false, StreamId(3)).unwrap();
        f.checkpoint().unwrap();
        // Stream 1's first segment, opened after the checkpoint: one chunk per FUA write.
        let n = super::free::LIST_CAP as u64 + 2;
        for l in 0..n {
            f.write(l, &block_for(l, 1), true, StreamId(1)).unwrap();
        }
        f.close_stream(StreamId(1)).unwrap();
        let geo = *f.geometry();
        let seg_of = |l: u64| geo.segment_of(f.map_entry(l).unwrap().pba().unwrap() as u64);
        let seg = seg_of(0);
        assert!((0..n).all(|l| seg_of(l) == seg), "one segment holds them");
        assert!(f.t.segs.young_chunks(seg).unwrap().len() as u64 >= n);
        for l in 0..n {
            f.write(l, &block_for(l, 2), false, StreamId(2)).unwrap();
        }
        assert_eq!(f.segment_valid(seg), 0);
        assert_eq!(f.freeable_segments(), 1, "young and dead");
        let r = f.free_dead().unwrap();
        assert_eq!(r.segments_freed, 0, "{r:?}");
        assert_eq!(r.dead_left, 1, "left for the checkpoint: {r:?}");
        assert_eq!(f.segment_snapshot()[seg as usize].state, "closed");
        f.checkpoint().unwrap();
        assert_eq!(f.segment_snapshot()[seg as usize].state, "free");
    }

    /// A stream out of range is an error whatever the write's length (an empty write
    /// once slipped past the check, which sat inside the per-block loop).
    #[test]
    fn a_stream_out_of_range_is_refused_even_for_an_empty_write() {
        let (_, _, f) = small_ftl();
        let bad = StreamId(crate::stream::STREAMS as u8);
        for data in [vec![], block_for(1, 1)] {
            let r = f.write(1, &data, true, bad);
            assert!(matches!(r, Err(Error::InvalidParameters(_))), "{r:?}");
        }
    }

    /// Rule 5: a panic between taking a chunk number and putting the chunk in
    /// flight poisons the FTL and completes the number; every later FLUSH fails at once
    /// instead of waiting forever (for the number, or for the dead FLUSH leader).
    #[test]
    fn a_panic_while_sealing_does_not_wedge_flush() {
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        let f2 = f.clone();
        let dying = std::thread::spawn(move || {
            PANIC_IN_SEAL.with(|p| p.set(true));
            f2.write(1, &block_for(1, 1), false, StreamId(1)).unwrap();
            let _ = f2.flush();
        });
        assert!(dying.join().is_err(), "the injected panic happened");
        flush_and_checkpoint_fail_at_once(&f, "a panic while sealing");
    }

    /// Rule 5 past sealing: a panic in a sealed chunk's device write (after the chunk
    /// left its seal guard, before its number completed) poisons the FTL and completes
    /// the number; every later FLUSH and checkpoint fails at once instead of waiting for
    /// it forever (found by review, 2026-11-29).
    #[test]
    fn a_panic_in_a_chunk_write_does_not_wedge_flush() {
        use crate::append::tests::PANIC_IN_CHUNK_WRITE;
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        let per_segment = f.geometry().blocks_per_segment() as u64;
        let f2 = f.clone();
        let dying = std::thread::spawn(move || {
            PANIC_IN_CHUNK_WRITE.with(|p| p.set(true));
            // A segment's worth and more: a chunk is sealed and written on this thread.
            for l in 0..2 * per_segment {
                f2.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
            }
        });
        assert!(dying.join().is_err(), "the injected panic happened");
        flush_and_checkpoint_fail_at_once(&f, "a panic in a chunk write");
    }

    /// A FLUSH and a checkpoint on a poisoned FTL return read-only within 10 s (rather
    /// than wait forever for a chunk number), after `what`.
    fn flush_and_checkpoint_fail_at_once(f: &Arc<crate::model::MemFtl>, what: &str) {
        let (tx, rx) = std::sync::mpsc::channel();
        let f3 = f.clone();
        std::thread::spawn(move || {
            let _ = tx.send((f3.flush(), f3.checkpoint().map(|_| ())));
        });
        let (flush, checkpoint) = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("FLUSH and checkpoint return after {what}"));
        assert!(matches!(flush, Err(Error::ReadOnly(_))), "{flush:?}");
        assert!(
            matches!(checkpoint, Err(Error::ReadOnly(_))),
            "{checkpoint:?}"
        );
    }

    /// An index stuck after a failed commit (`index::sled_store` rule 2) turns the FTL
    /// read-only at the first refusal, by a checkpoint or a free record: writes fail at
    /// once with EROFS instead of waiting out `space_wait` for space nothing frees
    /// (found by review, 2026-11-29). A commit that merely failed is retried, as before.
    #[test]
    fn an_index_that_can_no_longer_commit_turns_the_ftl_read_only() {
        for by_free_record in [false, true] {
            let (_, idx, f) = small_ftl();
            let cap = f.capacity_blocks();
            idx.fail_commits.store(true, Ordering::SeqCst);
            f.write(1, &block_for(1, 1), false, StreamId(1)).unwrap();
            assert!(f.checkpoint().is_err(), "a failed commit");
            f.write(2, &block_for(2, 1), false, StreamId(1)).unwrap();
            idx.fail_commits.store(false, Ordering::SeqCst);
            if by_free_record {
                // Segments a checkpoint recorded closed, dead since: a free record's.
                for l in 0..cap {
                    f.write(l, &block_for(l, 3), false, StreamId(1)).unwrap();
                }
                f.checkpoint().unwrap();
                let mut l = 0u64;
                while f.dead_segments() == 0 {
                    f.write(l % cap, &block_for(l % cap, 4), false, StreamId(1))
                        .unwrap();
                    l += 1;
                }
                idx.stuck.store(true, Ordering::SeqCst);
                let r = f.free_dead();
                assert!(r.is_err(), "the free record: {r:?}");
            } else {
                idx.stuck.store(true, Ordering::SeqCst);
                assert!(f.checkpoint().is_err(), "the checkpoint");
            }
            let w = f.write(3, &block_for(3, 1), false, StreamId(1));
            assert!(matches!(w, Err(Error::ReadOnly(_))), "by free record {by_free_record}: {w:?}");
        }
    }

    /// A read-only FTL keeps no throttle: writers asleep in it wake to the poison
    /// instead of sleeping out their slots, and the runner's next pace leaves it off
    /// (found by review, 2026-11-29).
    #[test]
    fn a_read_only_ftl_keeps_no_write_pace() {
        let (_, _, f) = small_ftl();
        let ms = Duration::from_millis(1);
        f.set_write_pace(ms);
        assert_eq!(f.space.pace(), ms);
        f.set_poison("a test".into());
        assert_eq!(f.space.pace(), Duration::ZERO, "the poison ends the throttle");
        f.set_write_pace(ms);
        assert_eq!(f.space.pace(), Duration::ZERO, "the runner's next pace");
    }

    /// Engine rule 11: a segment a carry made freeable may be freed at once by a
    /// checkpoint beside the carry (the carry still going on with other segments): the
    /// zeroings the carry relied on are durable by then (a sync at the end of the whole
    /// carry came too late; found by review, 2026-11-29).
    #[test]
    fn a_carried_segment_freed_beside_its_carry_finds_the_zeroings_durable() {
        use crate::append::tests::PARK_AFTER_SET_CARRIED;
        use crate::device::BLOCK_SIZE;
        let cfg = crate::Config {
            discard_freed: false,
            ..crate::model::test_config()
        };
        let (dev, idx) = crate::model::tiny::formatted().unwrap();
        let (f, _) = crate::Ftl::open(dev.clone(), idx, cfg).unwrap();
        let f = Arc::new(f);
        let geo = *f.geometry();
        f.write(5, &block_for(5, 1), false, StreamId(1)).unwrap();
        let a = geo.segment_of(f.map_entry(5).unwrap().pba().unwrap() as u64);
        f.close_stream(StreamId(1)).unwrap();
        f.flush().unwrap();
        f.checkpoint().unwrap();
        f.trim(5, 1).unwrap();
        f.flush().unwrap();
        assert!(f.free_dead().unwrap().segments_freed >= 1);
        f.close_stream(crate::TRIM_STREAM).unwrap();
        let f2 = f.clone();
        let (go, carry) = run_parked(&PARK_AFTER_SET_CARRIED, move || f2.carry_tombstones());
        // A checkpoint beside the carry (its own carry waits for this one) frees the
        // carried TRIM segment (young with TRIM records: not a free record's to free).
        let r = f.checkpoint().unwrap();
        assert!(r.segments_freed >= 1, "the carried segment was not freed: {r:?}");
        let mut head = vec![0u8; BLOCK_SIZE];
        dev.read_durable(geo.segment_start(a) * BLOCK_SIZE as u64, &mut head)
            .unwrap();
        let durable = head.iter().all(|&b| b == 0);
        go.send(()).expect("the carry waits for its go");
        carry.join().unwrap().unwrap();
        assert!(durable, "segment {a}'s zeroing was not durable when its TRIM segment was freed");
    }

    /// A seal that panics leaves its slot in the staging area at the stream's place; a
    /// writer that passed its poison check before the panic must not open the next chunk
    /// there (a replay after a kill wrote one chunk over the other, and the completed
    /// write in it was lost): it fails, the FTL being read-only.
    #[test]
    fn a_writer_past_its_check_opens_no_chunk_where_a_seal_failed() {
        use crate::append::tests::PARK_AFTER_WRITE_CHECK;
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        f.write(1, &block_for(1, 1), false, StreamId(1)).unwrap();
        let f2 = f.clone();
        let (go, late) = run_parked(&PARK_AFTER_WRITE_CHECK, move || {
            f2.write(100, &block_for(100, 1), false, StreamId(1))
        });
        let f3 = f.clone();
        let dying = std::thread::spawn(move || {
            PANIC_IN_SEAL.with(|p| p.set(true));
            let _ = f3.flush();
        });
        assert!(dying.join().is_err(), "the injected panic happened");
        go.send(()).expect("the late writer waits for its go");
        let r = late.join().unwrap();
        assert!(matches!(r, Err(Error::ReadOnly(_))), "{r:?}");
    }

    /// A panic in a carry of TRIM records (reached from a writer's checkpoint through
    /// the map's bound; the ublk edge catches it and the FTL goes on) leaves later carries
    /// working: the TRIM segment is carried and freed by the next checkpoints. The flag
    /// saying a carry runs stayed set, and no TRIM segment was freed again.
    #[test]
    fn a_panic_while_carrying_does_not_stop_later_carries() {
        use crate::append::tests::PANIC_IN_CARRY;
        let (_, _, f) = small_ftl();
        for l in 0..40 {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        f.checkpoint().unwrap();
        f.trim(0, 40).unwrap();
        f.close_stream(crate::TRIM_STREAM).unwrap();
        let trim_segs: Vec<u32> = f
            .segment_snapshot()
            .into_iter()
            .filter(|s| s.stream == crate::TRIM_STREAM.0 && s.state == "closed" && s.segment != 0)
            .map(|s| s.segment)
            .collect();
        assert!(!trim_segs.is_empty(), "the TRIM segment is closed");
        PANIC_IN_CARRY.with(|p| p.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.checkpoint()));
        assert!(r.is_err(), "the injected panic happened");
        f.checkpoint().unwrap();
        f.checkpoint().unwrap();
        let snap = f.segment_snapshot();
        assert!(
            trim_segs.iter().all(|&s| snap[s as usize].state == "free"),
            "the TRIM segments {trim_segs:?} are carried and freed after the panic"
        );
    }

    /// A panic in a checkpoint after it took the dirty map pages (the I/O edge catches
    /// it, and the device goes on) does not lose their changes: the pages were left
    /// clean and uncommitted, the next checkpoint skipped them and moved recovery's
    /// start past their changes, and after a restart the block read its older data. Now
    /// the FTL turns read-only, and a restart rolls the changes forward. Also: a lock the
    /// panic poisoned does not make the checkpointer look busy forever.
    #[test]
    fn a_panic_in_a_checkpoint_loses_no_map_change() {
        use crate::append::tests::PANIC_IN_CHECKPOINT;
        let (dev, idx, f) = small_ftl();
        f.write(5, &block_for(5, 1), false, StreamId(1)).unwrap();
        f.checkpoint().unwrap();
        f.write(5, &block_for(5, 2), false, StreamId(1)).unwrap();
        PANIC_IN_CHECKPOINT.with(|p| p.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.checkpoint()));
        assert!(r.is_err(), "the injected panic happened");
        assert!(!f.ckpt.busy(), "a poisoned lock is not a checkpoint under way");
        // The device goes on as far as it can (a later checkpoint, a close), then restarts.
        let _ = f.checkpoint();
        let _ = f.close();
        drop(f);
        let (g, _) = super::Ftl::open(dev, idx, crate::model::test_config()).unwrap();
        let mut b = vec![0u8; crate::device::BLOCK_SIZE];
        g.read(5, &mut b).unwrap();
        assert_eq!(
            crate::model::observe(5, &b),
            crate::model::Observed::Tag(2),
            "the write before the panic reads back after a restart"
        );
    }

    /// A memory FTL of 96 segments of 64 KiB: 256 blocks written in order, 96 of them
    /// overwritten in a scattered order (generation 2, `i * 97 % 256`), then read in
    /// 32-block windows: windows queued for defragmentation. Returns it and the region.
    fn scattered_and_read() -> (Arc<crate::model::MemFtl>, u64) {
        let opts = FormatOptions {
            segment_bytes: Some(64 << 10),
            ..Default::default()
        };
        let (_, _, f) = crate::model::mem_ftl(96 * (64 << 10), &opts);
        let region = 256u64;
        for l in 0..region {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        for i in 0..96 {
            let l = i * 97 % region;
            f.write(l, &block_for(l, 2), false, StreamId(2)).unwrap();
        }
        f.flush().unwrap();
        let mut b = vec![0u8; 32 * crate::device::BLOCK_SIZE];
        for w in (0..region).step_by(32) {
            f.read(w, &mut b).unwrap();
        }
        (Arc::new(f), region)
    }

    /// Read-driven defragmentation never takes the cleaner's reserve: a window passed
    /// its check of free space, writers then took the free segments down to the
    /// reserve, and its relocations into the GC stream (which may open a reserve
    /// segment, for the cleaner) took one. Now each block moves only while the spare
    /// holds or the GC stream's open segment has room.
    #[test]
    fn defragmentation_never_takes_the_reserve() {
        use crate::append::tests::PARK_AFTER_DEFRAG_CHECK;
        let (f, region) = scattered_and_read();
        assert!(f.defrag_waiting() > 0, "windows queued");
        let reserve = f.gc_reserve_segments();
        // Free segments taken by new blocks, then by every other one of them written
        // again: no segment dies whole, so none can be freed to make up for the reserve.
        let cap = f.capacity_blocks();
        let mut lbas = (region..cap).chain((region..cap).step_by(2));
        let mut fill_to = |n: usize| {
            while f.free_segments() > n {
                let l = lbas.next().expect("free segments down to the reserve");
                f.write(l, &block_for(l, 3), false, StreamId(3)).unwrap();
            }
        };
        fill_to(reserve + super::defrag::DEFRAG_SPARE_SEGMENTS + 1);
        let f2 = f.clone();
        let (go, defrag) = run_parked(&PARK_AFTER_DEFRAG_CHECK, move || f2.defrag_step(64));
        fill_to(reserve);
        assert_eq!(f.free_segments(), reserve);
        go.send(()).unwrap();
        defrag.join().unwrap().unwrap();
        assert!(
            f.free_segments() >= reserve,
            "defragmentation took the reserve: {} free of {reserve}",
            f.free_segments()
        );
    }

    /// A FLUSH does not wait for the rest of a defragmentation batch: the chunks a
    /// window's relocations sealed are written before the next window (they were held to
    /// the end of the batch, and a FLUSH waits for every chunk numbered below its own).
    #[test]
    fn a_flush_does_not_wait_for_the_rest_of_a_defragmentation_batch() {
        use crate::append::tests::PARK_AFTER_DEFRAG_WINDOW;
        let (f, region) = scattered_and_read();
        let mut b = vec![0u8; 32 * crate::device::BLOCK_SIZE];
        assert!(f.defrag_waiting() > 1, "windows queued");
        let f2 = f.clone();
        let (go, defrag) = run_parked(&PARK_AFTER_DEFRAG_WINDOW, move || f2.defrag_step(64));
        // One window rewritten (a chunk sealed at a 16-block segment's end at least).
        let (tx, rx) = std::sync::mpsc::channel();
        let f3 = f.clone();
        let flusher = std::thread::spawn(move || {
            let _ = tx.send(f3.flush());
        });
        let flushed = rx.recv_timeout(Duration::from_secs(10));
        go.send(()).unwrap();
        let r = defrag.join().unwrap().unwrap();
        flusher.join().unwrap();
        flushed
            .expect("the FLUSH waited for the defragmentation batch")
            .unwrap();
        assert!(r.windows > 1 && r.moved > 0, "{r:?}");
        for l in 0..region {
            f.read(l, &mut b[..crate::device::BLOCK_SIZE]).unwrap();
            let g = if (0..96).any(|i| i * 97 % region == l) { 2 } else { 1 };
            assert!(b[..crate::device::BLOCK_SIZE] == block_for(l, g)[..], "lba {l}");
        }
    }

    /// Checkpoint rule 2: the snapshot is taken with every stream lock held, so a write
    /// either precedes it whole (sealed, synced and in the map it commits) or follows it.
    /// With the locks let go before the map's dirty pages were taken, a write appended
    /// into an open chunk got into the committed map: after a power cut its entry named
    /// a block never written, and the block's flushed data read as an error.
    #[test]
    fn a_write_waits_for_the_checkpoints_snapshot() {
        use crate::append::tests::PARK_AT_SNAPSHOT;
        let (dev, idx, f) = crate::model::tiny::crash_ftl();
        let f = Arc::new(f);
        f.write(5, &block_for(5, 1), false, StreamId(1)).unwrap();
        f.flush().unwrap();
        let f2 = f.clone();
        let (go, ck) = run_parked(&PARK_AT_SNAPSHOT, move || f2.checkpoint().map(|_| ()));
        let (tx, rx) = std::sync::mpsc::channel();
        let f3 = f.clone();
        let writer = std::thread::spawn(move || {
            let r = f3.write(5, &block_for(5, 2), false, StreamId(1));
            let _ = tx.send(());
            r
        });
        let appended = rx.recv_timeout(Duration::from_millis(300)).is_ok();
        go.send(()).unwrap();
        ck.join().unwrap().unwrap();
        writer.join().unwrap().unwrap();
        assert!(!appended, "a write appended while the checkpoint held every stream lock");
        drop(f);
        dev.crash_losing_all().unwrap();
        let g = crate::model::tiny::open(&dev, &idx).unwrap();
        let mut b = vec![0u8; crate::device::BLOCK_SIZE];
        g.read(5, &mut b).unwrap();
        assert!(b == block_for(5, 1), "lba 5 lost its flushed data");
    }

    /// Runs `job` on a thread of its own that parks at `park` (a hook of
    /// `append::tests`); returns once it is parked, with the sender whose message lets it go on.
    fn run_parked<T: Send + 'static>(
        park: &'static std::thread::LocalKey<crate::append::tests::Park>,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<T>) {
        let (here_tx, here) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            park.with(|p| *p.borrow_mut() = Some((here_tx, go_rx)));
            job()
        });
        // A hook moved or no longer reached fails the test here instead of hanging it.
        here.recv_timeout(Duration::from_secs(30))
            .expect("the thread reaches its hook and parks");
        (go, t)
    }

    /// A TRIM of blocks none of which is mapped logs nothing: repeated, such TRIMs filled
    /// TRIM segments that nothing freed (no data died, no checkpoint fell due) until
    /// writes failed with ENOSPC (found by review). A TRIM of a mapped block still logs
    /// its record, and the block reads zeros.
    #[test]
    fn trims_of_unmapped_blocks_take_no_space() {
        let (_, _, f) = small_ftl();
        let cap = f.capacity_blocks();
        for l in 0..cap / 2 {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        let free = f.free_segments();
        for _ in 0..10_000 {
            f.trim(cap - 1, 1).unwrap();
        }
        f.flush().unwrap();
        assert_eq!(f.free_segments(), free, "the TRIMs took segments");
        f.trim(3, 1).unwrap();
        let mut b = vec![0u8; 4096];
        f.read(3, &mut b).unwrap();
        assert_eq!(crate::model::observe(3, &b), crate::model::Observed::Tag(0));
    }

    /// A TRIM of blocks another TRIM has unmapped but not yet recorded waits for that
    /// record before it completes: it looks at the map under the blocks' stripe locks.
    /// Without them it saw nothing mapped and completed at once, and a `kill -9` before
    /// the first TRIM's record lost both (found by review).
    #[test]
    fn a_trim_of_blocks_another_trim_is_unmapping_waits_for_its_record() {
        use crate::append::tests::PARK_IN_TRIM;
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        f.write(5, &block_for(5, 1), false, StreamId(1)).unwrap();
        f.flush().unwrap();
        let f1 = f.clone();
        let (go, first) = run_parked(&PARK_IN_TRIM, move || f1.trim(5, 1));
        // The first TRIM unmapped lba 5 and is parked before it records its entry.
        let f2 = f.clone();
        let second = std::thread::spawn(move || f2.trim(5, 1));
        std::thread::sleep(Duration::from_millis(200));
        let done_early = second.is_finished();
        go.send(()).expect("the parked thread waits for its go");
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert!(!done_early, "the second TRIM completed before the first recorded its entry");
        let mut b = vec![0u8; 4096];
        f.read(5, &mut b).unwrap();
        assert_eq!(crate::model::observe(5, &b), crate::model::Observed::Tag(0));
    }

    /// A TRIM that fails part way (a map page that cannot be read back) logs what it
    /// unmapped and poisons the FTL before it lets go of the stripes. A TRIM of the same
    /// blocks that passed its poison check earlier and waited for the stripes found them
    /// unmapped and reported success, for a record nothing had logged: a kill -9 lost it
    /// (found by review).
    #[test]
    fn a_trim_waiting_behind_a_failed_trim_does_not_report_success() {
        use crate::append::tests::{FAIL_TRIM_AT, PARK_AFTER_TRIM_CHECK, PARK_IN_TRIM};
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        for l in 5..9 {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        let f1 = f.clone();
        let (go, first) = run_parked(&PARK_IN_TRIM, move || {
            FAIL_TRIM_AT.with(|x| x.set(Some(7)));
            f1.trim(5, 4)
        });
        // The first TRIM unmapped lbas 5 and 6, failed at 7 and is parked before it
        // poisons, holding the stripes. The second is past its first poison check (parked
        // there, so it cannot meet the poison early), then goes for the stripes.
        let f2 = f.clone();
        let (go2, second) = run_parked(&PARK_AFTER_TRIM_CHECK, move || f2.trim(5, 2));
        go2.send(()).expect("the second TRIM waits for its go");
        go.send(()).expect("the parked thread waits for its go");
        assert!(first.join().unwrap().is_err());
        assert!(
            second.join().unwrap().is_err(),
            "a TRIM behind a failed one reported success for blocks nothing logged"
        );
    }

    /// A writer that found no room notes the space generation under its stream lock: a
    /// segment freed while it then writes the chunks it sealed (here: while it is parked
    /// there) is not missed. Waiting from the generation at the wait, it waited for the
    /// next segment freed, and with none within `space_wait` failed with ENOSPC while a
    /// segment was free (found by review).
    #[test]
    fn a_segment_freed_while_a_writer_finds_no_room_is_not_missed() {
        use crate::append::tests::PARK_ON_NO_ROOM;
        let (dev, idx, f) = small_ftl();
        f.close().unwrap();
        drop(f);
        let cfg = crate::Config {
            space_wait: Duration::from_secs(1),
            ..crate::model::test_config()
        };
        let (f, _) = super::Ftl::open(dev, idx, cfg).unwrap();
        f.attach_cleaner(true);
        let f = Arc::new(f);
        let cap = f.capacity_blocks();
        // Written in order, again and again: whole segments die.
        let mut x = 0u64;
        let mut next_lba = move || {
            x += 1;
            x % cap
        };
        while f.free_segments() > f.gc_reserve_segments() {
            let l = next_lba();
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        let f2 = f.clone();
        let (go, writer) = run_parked(&PARK_ON_NO_ROOM, move || {
            // Writes until the write that parked (the hook is taken when used) returns.
            let started = std::time::Instant::now();
            loop {
                let l = next_lba();
                let r = f2.write(l, &block_for(l, 2), false, StreamId(1));
                let parked = PARK_ON_NO_ROOM.with(|p| p.borrow().is_none());
                if r.is_err() || parked {
                    return (r, started.elapsed());
                }
            }
        });
        // Parked after it found no room: the test frees dead segments meanwhile.
        let freed = f.free_dead().unwrap().segments_freed;
        assert!(freed > 0, "dead segments were freed");
        go.send(()).expect("the parked thread waits for its go");
        let (r, took) = writer.join().unwrap();
        assert!(r.is_ok(), "the write after the free failed: {r:?}");
        assert!(took < Duration::from_millis(900), "the writer waited {took:?}");
    }

    /// A small FTL whose free segments users took down to the cleaner's reserve (dead
    /// ones freed on the way), then the cleaner moved whole segments, oldest first, into
    /// the GC stream until the reserve was spent and its open segment full: the
    /// segments it emptied are dead. With the relocation of the next live block.
    #[allow(clippy::type_complexity)]
    fn gc_reserve_spent() -> (
        Arc<crate::model::MemFtl>,
        Box<dyn FnMut(&crate::model::MemFtl) -> crate::error::Result<bool> + Send>,
    ) {
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        let cap = f.capacity_blocks();
        let reserve = f.gc_reserve_segments();
        let mut l = 0u64;
        loop {
            while f.free_segments() > reserve {
                f.write(l % cap, &block_for(l % cap, 1), false, StreamId(1)).unwrap();
                l += 1;
            }
            if f.free_dead().unwrap().segments_freed == 0 {
                break;
            }
        }
        let mut victims: Vec<_> = f
            .t
            .segs
            .snapshot()
            .into_iter()
            .filter(|s| s.state == "closed" && s.valid > 0)
            .collect();
        victims.sort_by_key(|s| s.opened_seq);
        let mut blocks = victims
            .iter()
            .flat_map(|s| f.live_blocks(s.segment).unwrap())
            .collect::<Vec<_>>()
            .into_iter();
        let mut buf = vec![0u8; crate::device::BLOCK_SIZE];
        let mut relocate_next: Box<
            dyn FnMut(&crate::model::MemFtl) -> crate::error::Result<bool> + Send,
        > = Box::new(move |f: &crate::model::MemFtl| {
            let b = blocks.next().expect("live blocks left to move");
            assert!(f.read_live(&b, &mut buf).unwrap());
            f.relocate(b.lba, b.entry, &buf, crate::stream::GC_STREAM)
        });
        while f.free_segments() > 0 || f.gc_open_room().unwrap() > 0 {
            assert!(relocate_next(&f).unwrap(), "the block moved");
        }
        assert!(!f.t.segs.dead_closed().is_empty(), "the moves emptied segments");
        (f, relocate_next)
    }

    /// The cleaner's side of the test above: a relocation into the GC stream that finds
    /// no free segment while a checkpoint releases dead ones (here: while it is parked
    /// after its failed allocation) looks again instead of failing. It looked only at the
    /// dead list, which the checkpoint had emptied meanwhile, and failed with "device
    /// full" while segments were free: the crash harness's rare cleaner "device full"
    /// (an instrumented run caught it with three segments free at the error, released by
    /// the harness's checkpoint between the failed allocation and that look).
    #[test]
    fn a_segment_freed_while_a_relocation_finds_no_room_is_not_missed() {
        use crate::append::tests::PARK_ON_NO_ROOM;
        let (f, mut relocate_next) = gc_reserve_spent();
        let f2 = f.clone();
        let (go, cleaner) = run_parked(&PARK_ON_NO_ROOM, move || relocate_next(&f2));
        // Parked after its allocation failed: a checkpoint releases the dead segments.
        assert!(f.checkpoint().unwrap().segments_freed > 0, "dead segments were freed");
        go.send(()).expect("the parked thread waits for its go");
        let r = cleaner.join().unwrap();
        assert!(
            matches!(r, Ok(true)),
            "the relocation after the checkpoint: {r:?} with {} segments free",
            f.free_segments()
        );
    }

    /// The free-list half of the relocation's second look: a segment released between
    /// the failed allocation and the note of the space generation (here: while the
    /// relocation is parked there, inside its stream lock) leaves the generation as the
    /// relocation then notes it, and the dead list empty. Only the free list shows it;
    /// without that look the relocation failed with "device full" with segments free.
    /// (The segments are released as a checkpoint's rule 5 does, without the rest of the
    /// checkpoint, which would wait for the parked thread's stream lock.)
    #[test]
    fn a_segment_released_before_the_relocation_notes_the_generation_is_not_missed() {
        use crate::append::tests::PARK_BEFORE_NO_ROOM_MARK;
        let (f, mut relocate_next) = gc_reserve_spent();
        let dead = f.t.segs.dead_closed();
        let f2 = f.clone();
        let (go, cleaner) = run_parked(&PARK_BEFORE_NO_ROOM_MARK, move || relocate_next(&f2));
        let generation = f.space.generation();
        f.t.segs.release(&dead, None);
        f.space.notify();
        assert!(f.space.generation() != generation && f.t.segs.dead_closed().is_empty());
        go.send(()).expect("the parked thread waits for its go");
        let r = cleaner.join().unwrap();
        assert!(
            matches!(r, Ok(true)),
            "the relocation after the release: {r:?} with {} segments free",
            f.free_segments()
        );
    }

    /// A small FTL overwritten until its free list is down to the reserve with dead
    /// segments waiting, a cleaner declared attached; and its capacity.
    fn down_to_the_reserve_with_a_cleaner() -> (Arc<crate::model::MemFtl>, u64) {
        let (_, _, f) = small_ftl();
        let f = Arc::new(f);
        let cap = f.capacity_blocks();
        let reserve = f.gc_reserve_segments();
        let mut l = 0u64;
        while f.free_segments() > reserve || f.dead_segments() == 0 {
            f.write(l % cap, &block_for(l % cap, 1), false, StreamId(1))
                .unwrap();
            l += 1;
        }
        f.attach_cleaner(true);
        (f, cap)
    }

    /// The writer's half of the test above: a user write that finds no room while a
    /// cleaner is attached, and a release before it notes the space generation, takes
    /// the released segment instead of waiting for the next release (it slept out
    /// `space_wait`, 30 s here, with segments free; found by review, 2026-11-29).
    #[test]
    fn a_segment_released_before_a_writer_notes_the_generation_is_not_missed() {
        use crate::append::tests::PARK_BEFORE_NO_ROOM_MARK;
        let (f, cap) = down_to_the_reserve_with_a_cleaner();
        let dead = f.t.segs.dead_closed();
        assert!(!dead.is_empty());
        let (f2, released) = (f.clone(), Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let released2 = released.clone();
        // Writes until the one that found no room (parked) is done.
        let (go, writer) = run_parked(&PARK_BEFORE_NO_ROOM_MARK, move || {
            let t = std::time::Instant::now();
            for k in 0..cap {
                f2.write(k, &block_for(k, 2), false, StreamId(1))?;
                if released2.load(Ordering::SeqCst) {
                    break;
                }
            }
            Ok::<_, Error>(t.elapsed())
        });
        // Released as a checkpoint's rule 5 does (the rest of a checkpoint would wait for
        // the parked writer's stream lock).
        f.t.segs.release(&dead, None);
        f.space.notify();
        released.store(true, Ordering::SeqCst);
        go.send(()).expect("the writer waits for its go");
        let took = writer.join().unwrap().expect("the writes");
        assert!(
            took < std::time::Duration::from_secs(10),
            "the writer waited {took:?} with segments free"
        );
    }

    /// The cleaner out of space while a checkpoint is under way: its free record frees
    /// nothing (the dead segments are the checkpoint's, checkpoint rule 9), so it would
    /// checkpoint for them, and waits for the checkpoint under way first. That one
    /// releases them; the relocation then takes one and runs no checkpoint of its own. It
    /// ran a whole second checkpoint before (found by review, 2026-11-29), with the
    /// cleaner stopped through both.
    #[test]
    fn a_relocation_runs_no_checkpoint_behind_one_that_freed_its_space() {
        use crate::append::tests::{PARK_BEFORE_SPACE_CHECKPOINT, PARK_IN_CHECKPOINT};
        let (f, mut relocate_next) = gc_reserve_spent();
        let before = f.stats().checkpoints;
        // A checkpoint in flight, past its snapshot: the dead segments are its own.
        let f1 = f.clone();
        let (go_ckpt, ckpt) = run_parked(&PARK_IN_CHECKPOINT, move || f1.checkpoint());
        // The relocation finds no room, frees nothing and is about to checkpoint.
        let f2 = f.clone();
        let (go_reloc, reloc) =
            run_parked(&PARK_BEFORE_SPACE_CHECKPOINT, move || relocate_next(&f2));
        assert!(!f.t.segs.dead_closed().is_empty(), "dead segments wait");
        go_ckpt.send(()).expect("the checkpoint waits for its go");
        let r = ckpt.join().unwrap().unwrap();
        assert!(r.segments_freed > 0, "the checkpoint freed its dead segments");
        go_reloc.send(()).expect("the relocation waits for its go");
        let moved = reloc.join().unwrap();
        assert!(matches!(moved, Ok(true)), "the relocation: {moved:?}");
        assert_eq!(
            f.stats().checkpoints,
            before + 1,
            "a checkpoint ran behind the one that freed the space"
        );
    }

    /// A writer that found no room while a cleaner was attached waits for it; when the
    /// cleaner detaches (its thread ended), the writer frees the dead segments itself
    /// rather than failing with ENOSPC, also when the detach falls between the end of
    /// a step of its wait and its look at whether a cleaner is attached.
    #[test]
    fn a_writer_waiting_for_a_cleaner_that_detaches_frees_space_itself() {
        use crate::append::tests::PARK_AFTER_SPACE_STEP;
        let (f, cap) = down_to_the_reserve_with_a_cleaner();
        let f2 = f.clone();
        let (go, writer) = run_parked(&PARK_AFTER_SPACE_STEP, move || {
            let mut r = Ok(());
            for k in 0..64u64 {
                r = f2.write(k % cap, &block_for(k % cap, 2), false, StreamId(1));
                if r.is_err() {
                    break;
                }
            }
            r
        });
        // The cleaner's thread ends while the writer is between a step and its look.
        f.attach_cleaner(false);
        go.send(()).expect("the writer waits for its go");
        let r = writer.join().unwrap();
        assert!(r.is_ok(), "the writer failed: {r:?}");
    }

    /// A small FTL where users wrote (tag 1, stream 1) and flushed LBAs `0..n`: a
    /// segment's worth and one more.
    fn one_segment_and_a_block() -> (Arc<crate::model::MemFtl>, crate::geometry::Geometry, u64) {
        let (_, _, f) = small_ftl();
        let geo = *f.geometry();
        let n = geo.blocks_per_segment() as u64 + 1;
        for l in 0..n {
            f.write(l, &block_for(l, 1), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        (Arc::new(f), geo, n)
    }

    /// Engine rule 8 (`append.rs`): a chunk written but not yet retired (its writer still
    /// writing the rest of its batch) is complete for the tracker, so a free record may
    /// free its segment and the GC stream reuse it. Reads of the new life's blocks must
    /// not be answered from the old chunk's buffer. Without the rule the read of `b`
    /// copies the block of whichever LBA sat at its offset in the segment's last life:
    /// the check of copied blocks (`locate_as`) turns that into a checksum error (EIO),
    /// and without that check too it is silently another LBA's data.
    #[test]
    fn a_written_chunk_never_answers_for_its_segments_next_life() {
        use crate::append::tests::PARK_BEFORE_RETIRE;
        use crate::append::PendingChunks;
        use crate::stream::GC_STREAM;
        let (f, geo, n) = one_segment_and_a_block();
        let seg_of = |l: u64| geo.segment_of(f.map_entry(l).unwrap().pba().unwrap() as u64);
        // The cleaner relocates them into the GC stream and leaves the chunks it seals
        // (the first fills segment `s`) to this test.
        let mut pending = PendingChunks::default();
        for l in 0..n {
            let e = f.map_entry(l).unwrap();
            assert!(f
                .relocate_deferred(l, e, &block_for(l, 1), GC_STREAM, &mut pending)
                .unwrap());
        }
        assert!(!pending.is_empty(), "a GC chunk was sealed");
        let s = seg_of(0);
        let in_s: Vec<u64> = (0..n).filter(|&l| seg_of(l) == s).collect();
        // Another thread writes them and stops before retiring them.
        let f2 = f.clone();
        let (go, writer) = run_parked(&PARK_BEFORE_RETIRE, move || f2.write_pending(pending));
        // The GC stream gives up its open segment; users overwrite every block of `s`,
        // and a free record frees it.
        f.close_stream(GC_STREAM).unwrap();
        for &l in &in_s {
            f.write(l, &block_for(l, 2), false, StreamId(1)).unwrap();
        }
        f.flush().unwrap();
        f.free_dead().unwrap();
        assert!(
            f.segment_snapshot()
                .iter()
                .any(|x| x.segment == s && x.state == "free"),
            "segment {s} was freed"
        );
        // The next relocation takes the most worn free segment (no stream's segment life
        // known yet, `StreamLives`): `s`, at the offset of the first block of its last
        // life; a FLUSH writes and retires its chunk.
        let b = n - 1;
        assert!(!in_s.contains(&b), "lba {b} lives outside {s}");
        let e = f.map_entry(b).unwrap();
        assert!(f.relocate(b, e, &block_for(b, 1), GC_STREAM).unwrap());
        assert_eq!(seg_of(b), s, "the relocation reused segment {s}");
        f.flush().unwrap();
        let mut got = vec![0u8; 4096];
        let read = f.read(b, &mut got);
        go.send(()).expect("the parked thread waits for its go");
        writer.join().unwrap().unwrap();
        read.unwrap();
        assert!(
            got == block_for(b, 1),
            "lba {b} read {:?}, not its own block",
            crate::model::observe(b, &got)
        );
        for l in 0..n {
            f.read(l, &mut got).unwrap();
            let tag = if in_s.contains(&l) { 2 } else { 1 };
            assert!(got == block_for(l, tag), "lba {l} after the batch retired");
        }
    }

    /// A read that looked `l` up, then found another LBA's block buffered at that place
    /// (between the lookup and the copy, `l` was relocated, its segment freed and reused
    /// by the GC stream) checks the copy against the entry it looked up and locates
    /// again (`locate_as`). Without the check it returns the other LBA's block.
    #[test]
    fn a_buffered_block_that_moved_after_the_lookup_is_located_again() {
        use crate::append::tests::PARK_AFTER_LOOKUP;
        use crate::stream::GC_STREAM;
        let (f, geo, n) = one_segment_and_a_block();
        let pba_of = |l: u64| f.map_entry(l).unwrap().pba().unwrap() as u64;
        // Users filled segment `s`; `l` is its first data block.
        let s = geo.segment_of(pba_of(0));
        let in_s: Vec<u64> = (0..n).filter(|&x| geo.segment_of(pba_of(x)) == s).collect();
        let l = in_s[0];
        let at = pba_of(l);
        // A reader looks `l` up and stops there.
        let f2 = f.clone();
        let (go, reader) = run_parked(&PARK_AFTER_LOOKUP, move || {
            let mut got = vec![0u8; 4096];
            f2.read(l, &mut got).map(|()| got)
        });
        // The cleaner moves every block of `s`; a free record frees it; the GC stream,
        // its segment closed, reuses `s` (the most worn free segment: no stream's segment
        // life is known yet) for another LBA, which now sits at `l`'s old place in the GC
        // stream's open chunk.
        for &x in &in_s {
            let e = f.map_entry(x).unwrap();
            assert!(f.relocate(x, e, &block_for(x, 1), GC_STREAM).unwrap());
        }
        f.close_stream(GC_STREAM).unwrap();
        f.flush().unwrap();
        f.free_dead().unwrap();
        let other = n - 1;
        assert!(!in_s.contains(&other), "lba {other} lives outside {s}");
        let e = f.map_entry(other).unwrap();
        assert!(f.relocate(other, e, &block_for(other, 1), GC_STREAM).unwrap());
        assert_eq!(pba_of(other), at, "lba {other} took {l}'s old place");
        go.send(()).expect("the parked thread waits for its go");
        let got = reader.join().unwrap().unwrap();
        assert!(
            got == block_for(l, 1),
            "lba {l} read {:?}, not its own block",
            crate::model::observe(l, &got)
        );
    }
}
