//! Open-time recovery: load the last checkpoint, then roll forward over the log.
//!
//! The chain: every chunk carries `chunk_seq` (+1 per sealed chunk, over all streams),
//! the `epoch` of the session that wrote it and the format id. A checkpoint records the
//! next chain number and, per stream, where its next chunk goes. Recovery looks for
//! chunk N at every stream's cursor and at the start of every segment that was free at
//! the checkpoint (the only ones that can have been opened since), accepts it only with
//! the checkpoint's epoch and this format's id, and stops at the first N not found.
//! That is safe: a FLUSH completes only after every chunk sealed before it is durable,
//! so nothing acknowledged lies beyond a missing link. Entries of replayed chunks are
//! applied in entry-sequence order, a data entry only if its block's crc32c matches
//! (an unsynced block may have been lost even though its summary survived).
//!
//! Free records (`engine/free.rs`): a segment named by one was freed after the
//! checkpoint, once every chunk below the record's chain number was durable. It is freed
//! here before the heads are read (it may hold chunks of the chain), and the roll-forward
//! must reach that chain number: the entries that killed its blocks are below it, and the
//! map loaded from the checkpoint may still point into the segment until they are
//! replayed (free rule 6). A segment opened after the checkpoint and freed since held
//! chunks of the chain itself; its record lists their numbers, and the roll-forward
//! steps over each of them it does not find (free rule 7).
//!
//! Rule 3: a data entry whose block fails its checksum is skipped (a power cut tore an
//! unsynced chunk) unless the staging area shows that only the process died in this
//! boot and its session saw no device write or sync fail (`StagedReport::same_boot`):
//! then every chunk was written whole, and the entry stays mapped so the damaged block
//! reads as EIO.
//!
//! Rule 1: replayed chunks are synced before the open checkpoint names them: when only
//! the process died they may sit unsynced in the backing's cache. Rule 2: what lies past
//! the break (the chunk at each stream cursor, chunks heading free segments that were not
//! taken) is zeroed with them, so no later walk of the log (an index rebuild above all)
//! takes a crashed session's tail for part of the log; a chunk of a session newer than
//! the checkpoint refuses the open instead (the index is older than the log).
//!
//! Why the epoch: open writes a checkpoint with epoch+1 before any chunk of the new
//! session, so chunks left beyond the break by a crashed session (epoch E) can never be
//! mistaken for the new session's chunks with the same chain numbers (epoch E+1).
//!
//! Owns nothing after open: it builds the engine's `Parts`. Called by `lifecycle` (open)
//! and the checker.

use crate::config::Config;
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::engine::Parts;
use crate::error::{Error, Result};
use crate::index::{IndexStore, Key};
use crate::index::pages::IndexPages;
use crate::map::{L2p, MapEntry};
use crate::records::{
    CheckpointRecord, FreeRecord, MapPage, PartialCheckpoint, SegState, SegmentRecord,
};
use crate::segments::Segments;
use crate::stream::STREAMS;
use crate::summary::{ChunkSummary, Entry};
use crate::superblock::Superblock;
use std::collections::HashMap;
use std::sync::Arc;

/// What recovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    pub checkpoint_epoch: u64,
    pub chunks_replayed: u64,
    pub entries_applied: u64,
    /// Data entries whose block did not match its checksum (unsynced, lost in a crash).
    pub entries_skipped: u64,
    /// Data entries whose block did not match its checksum after only the process died
    /// (recovery rule 3): damaged on the device. They stay mapped and read as EIO.
    pub entries_corrupt: u64,
    /// Chunks past the break, or stale in free segments, whose first block was zeroed.
    pub stale_chunks_zeroed: u64,
    /// Chunks of the chain in young segments freed since the checkpoint, not found and
    /// stepped over (free rule 7).
    pub chunks_stepped_over: u64,
    pub mapped_blocks: u64,
    /// What the staging area of a dead process gave back before the roll-forward.
    pub staged: crate::staging::StagedReport,
}

/// Loaded index contents, validated (map pages stay in the index: the map reads them
/// on demand).
pub(crate) struct LoadedIndex {
    pub checkpoint: CheckpointRecord,
    pub segments: Vec<SegmentRecord>,
    /// Free records written since the checkpoint.
    pub frees: Vec<FreeRecord>,
    /// Segments of free records that follow another checkpoint: they outlived the one
    /// that superseded them (a commit that reported a failure but was applied), whose
    /// table already says what they freed. Ignored, and removed by the next checkpoint.
    pub stale_frees: Vec<u32>,
    /// A checkpoint cut between its map page batches (checkpoint rule 7): map pages may
    /// be newer than the segment records.
    pub partial: Option<PartialCheckpoint>,
}

/// Sequence numbers, chunk numbers and epochs only ever count up from small values;
/// anything at or past this is damage (and would overflow when a session continues).
/// Recovery and the index rebuild both refuse or skip it.
pub(crate) const SANE: u64 = u64::MAX / 4;

/// Whether `n` cannot be taken as a number the log counts on from: the next one (a
/// rebuilt checkpoint counts one past the largest it takes) would be out of range.
pub(crate) fn past_sane(n: u64) -> bool {
    n.saturating_add(1) >= SANE
}

/// Whether a chunk's session number is out of range: a rebuild numbers its session
/// [`crate::rebuild::EPOCH_GAP`] past the newest it takes, which must itself be in range
/// (found by review, 2026-11-29: one past was checked, the gap was not). Recovery and the
/// rebuild both take such a chunk for damage.
pub(crate) fn epoch_past_sane(epoch: u64) -> bool {
    past_sane(epoch.saturating_add(crate::rebuild::EPOCH_GAP))
}

/// The reader of map pages over `index` for the geometry of `sb`.
pub(crate) fn page_reader<I: IndexStore>(index: &I, sb: &Superblock) -> IndexPages {
    let geo = &sb.geometry;
    IndexPages::new(
        index.reader(),
        geo.exported_blocks,
        geo.segment_start(1),
        geo.physical_blocks(),
    )
}

/// Calls `f` with every map page of the index, validated, in page order, one at a time
/// (the checker: O(map) in time, one page in memory).
pub(crate) fn for_each_map_page<I: IndexStore>(
    index: &I,
    sb: &Superblock,
    mut f: impl FnMut(MapPage),
) -> Result<()> {
    let reader = page_reader(index, sb);
    index.scan(Some(Key::MAP_PAGE), &mut |k, v| {
        let page = k
            .get(1..)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| Error::Corrupt(format!("map page key {k:02x?} malformed")))?;
        f(reader.decode(page, v)?);
        Ok(())
    })
}

/// Reads and validates the checkpoint, segment and free records of the index against
/// the superblock.
pub(crate) fn load_index<I: IndexStore>(
    index: &I,
    sb: &Superblock,
    what: &str,
) -> Result<LoadedIndex> {
    let geo = &sb.geometry;
    let mismatch = |why: String| Error::IndexMismatch {
        path: what.to_string(),
        backing: "BACKING".into(),
        why,
    };
    let mut checkpoint = None;
    let mut segments = vec![None; geo.segment_count as usize];
    let mut frees = Vec::new();
    let mut partial = None;
    let records = [Key::CHECKPOINT, Key::SEGMENT, Key::FREE, Key::PARTIAL]
        .into_iter()
        .map(|kind| index.load_kind(kind))
        .collect::<Result<Vec<_>>>()?;
    for (k, v) in records.into_iter().flatten() {
        match k.first().copied() {
            Some(Key::CHECKPOINT) if k.len() == 1 => {
                checkpoint = Some(CheckpointRecord::decode(&v)?)
            }
            Some(Key::SEGMENT) if k.len() == 5 => {
                let r = SegmentRecord::decode(&v)?;
                let slot = segments
                    .get_mut(r.segment as usize)
                    .filter(|_| k[1..] == r.segment.to_be_bytes());
                match slot {
                    Some(s) => *s = Some(r),
                    None => {
                        return Err(Error::Corrupt(format!(
                            "segment record {} out of place",
                            r.segment
                        )))
                    }
                }
            }
            Some(Key::PARTIAL) if k.len() == 1 => partial = Some(PartialCheckpoint::decode(&v)?),
            Some(Key::FREE) if k.len() == 5 => {
                let f = FreeRecord::decode(&v)?;
                if k[1..] != f.segment.to_be_bytes() {
                    return Err(Error::Corrupt(format!(
                        "free record {} out of place",
                        f.segment
                    )));
                }
                frees.push(f);
            }
            _ => return Err(Error::Corrupt(format!("unknown index key {k:02x?}"))),
        }
    }
    let checkpoint = checkpoint
        .ok_or_else(|| mismatch("it holds no checkpoint (empty, or not an ftlblk index)".into()))?;
    if checkpoint.uuid != sb.uuid {
        return Err(mismatch(format!(
            "it belongs to the format {} but the backing is {} (is --index this backing's?)",
            crate::superblock::uuid_string(&checkpoint.uuid),
            sb.uuid_string()
        )));
    }
    if checkpoint.exported_blocks != geo.exported_blocks
        || checkpoint.segment_count != geo.segment_count
    {
        return Err(mismatch(
            "its geometry differs from the superblock's".into(),
        ));
    }
    let segments = segments
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.ok_or_else(|| Error::Corrupt(format!("segment record {i} missing from the index")))
        })
        .collect::<Result<Vec<_>>>()?;
    let (frees, stale): (Vec<FreeRecord>, Vec<FreeRecord>) = frees
        .into_iter()
        .partition(|f| f.base == checkpoint.next_chunk_seq);
    for f in &frees {
        let recorded = segments.get(f.segment as usize).map(|r| r.state);
        // Closed at the checkpoint; or open there, or free there and opened since (free
        // rule 7: its chunks from the checkpoint on, numbered below the record's chain);
        // closed there, freed, opened and freed again (rule 7 as well: the chunks of its
        // lives since). A segment opened after the checkpoint may have been closed with
        // no chunk (a relocation whose block moved on left its open chunk empty).
        let in_chain = f
            .chunks
            .iter()
            .all(|&c| c >= checkpoint.next_chunk_seq && c < f.chain);
        let follows = matches!(
            recorded,
            Some(SegState::Closed) | Some(SegState::Open) | Some(SegState::Free)
        ) && in_chain;
        if f.segment == 0 || !follows || f.epoch != checkpoint.epoch {
            return Err(Error::Corrupt(format!(
                "free record of segment {} (epoch {}) does not follow the checkpoint \
                 (epoch {}, segment recorded {recorded:?})",
                f.segment, f.epoch, checkpoint.epoch
            )));
        }
    }
    Ok(LoadedIndex {
        checkpoint,
        segments,
        frees,
        stale_frees: stale.iter().map(|f| f.segment).collect(),
        partial,
    })
}

/// Fails when `s` was written by a session after the one of the checkpoint (epoch
/// `ck_epoch`): open writes its checkpoint before any chunk of its session (open rule 3),
/// so the index is older than the log, restored from a backup or copied from another
/// day. Opening it would roll back to its state and then overwrite what came after
/// (and recovery rule 2 would zero it), so nothing is changed.
/// An epoch out of range ([`SANE`]) is damage, not a later session: such a chunk is
/// left to the rules for stale chunks (the rebuild skips it too).
fn newer_than_index(s: &ChunkSummary, ck_epoch: u64, index_name: &str) -> Result<()> {
    if s.epoch > ck_epoch && !epoch_past_sane(s.epoch) {
        return Err(Error::IndexMismatch {
            path: index_name.to_string(),
            backing: "BACKING".into(),
            why: format!(
                "it is older than the log on the backing (its checkpoint is of session {ck_epoch}, \
                 the log holds chunks of session {}): an index restored from a backup?",
                s.epoch
            ),
        });
    }
    Ok(())
}

/// Rebuilds the in-memory state from the index and the log.
pub(crate) fn recover<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    sb: Superblock,
    cfg: Config,
    index_name: &str,
    staging: std::sync::Arc<crate::staging::StagingArea>,
) -> Result<(Parts<D, I>, RecoveryReport)> {
    let geo = sb.geometry;
    let loaded = load_index(&index, &sb, index_name)?;
    let ck = loaded.checkpoint;
    if ck.epoch >= SANE || ck.next_chunk_seq >= SANE || ck.next_entry_seq >= SANE {
        return Err(Error::Corrupt(format!(
            "checkpoint counters out of range: epoch {}, next chunk {}, next entry {}",
            ck.epoch, ck.next_chunk_seq, ck.next_entry_seq
        )));
    }
    // The map starts empty in RAM: pages are read from the index when first used.
    let map = L2p::new(
        geo.exported_blocks,
        cfg.map_cache_bytes,
        Arc::new(page_reader(&index, &sb)),
    );
    // Free rule 6: recorded segments are free before the heads are read.
    let frees = &loaded.frees;
    // Free rule 7: chunks of young segments freed since, which recovery steps over.
    let mut skip: std::collections::HashSet<u64> = frees
        .iter()
        .flat_map(|f| f.chunks.iter().copied())
        .collect();
    let mut seg_records = loaded.segments.clone();
    for f in frees {
        if let Some(r) = seg_records.get_mut(f.segment as usize) {
            r.state = SegState::Free;
            r.erase_count = f.erase_count;
        }
    }
    // Refused before anything is written (stale heads are zeroed below): a refused open
    // changes nothing on the backing, and `check --rebuild-index` still sees every chunk
    // (found by review, 2026-11-27).
    let bps = geo.blocks_per_segment();
    if let Some(r) = loaded
        .segments
        .iter()
        .find(|r| r.valid > bps || (r.state == SegState::Free && r.valid > 0))
    {
        return Err(Error::Corrupt(format!(
            "segment record {} ({:?}) counts {} live blocks in a segment of {bps}",
            r.segment, r.state, r.valid
        )));
    }
    let segs = Segments::from_records(&seg_records);
    let mut cursors: Vec<Option<(u32, u32)>> = ck.cursors.clone();
    // A cursor of a stream past this build's was dropped by the resize: its chunks ended
    // the log without a word (found by review, 2026-11-27).
    if let Some(sid) = cursors.iter().skip(STREAMS).position(|c| c.is_some()) {
        return Err(Error::Corrupt(format!(
            "the checkpoint has an open segment for stream {}, past the {STREAMS} streams \
             this build knows",
            sid + STREAMS
        )));
    }
    cursors.resize(STREAMS, None);
    for c in cursors.iter().flatten() {
        if c.0 == 0 || c.0 >= geo.segment_count || c.1 >= geo.blocks_per_segment() {
            return Err(Error::Corrupt(format!(
                "checkpoint cursor {c:?} outside the log"
            )));
        }
    }
    // Free rule 7: a stream whose open segment at the checkpoint was freed since has no
    // place to continue from there (its chunks in it are stepped over, the segment may
    // hold another stream's chunks now); its next chunk heads a segment free at the
    // checkpoint, or this one.
    for c in cursors.iter_mut() {
        if c.is_some_and(|(seg, _)| frees.iter().any(|f| f.segment == seg)) {
            *c = None;
        }
    }
    let format_id = sb.format_id();
    // The summary at a block as `ChunkSummary::decode` reads it (`Err`: the magic, a
    // failing checksum: a torn summary); the outer error is the device's.
    let block = |seg: u32, off: u32| -> Result<crate::device::AlignedBuf> {
        let mut b = crate::device::AlignedBuf::new(BLOCK_SIZE);
        let at = (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
        dev.read_at(at, &mut b)
            .map_err(|e| Error::io("recovery read", at, e))?;
        Ok(b)
    };
    let decoded = |seg: u32, off: u32| -> Result<Result<Option<ChunkSummary>>> {
        Ok(ChunkSummary::decode(&block(seg, off)?))
    };
    // A torn or stale block is simply not the chunk we look for.
    let read_summary =
        |seg: u32, off: u32| -> Result<Option<ChunkSummary>> { Ok(decoded(seg, off)?.ok().flatten()) };
    // Where the log may go on (a stream's cursor, the head of a free segment): a summary
    // whole (magic, checksum) and in place, of this session, that this build cannot
    // decode (another build's version, a TRIM count past this build's bound) is not a
    // torn write: the open is refused and nothing zeroed. It ended the log there without
    // a word, was zeroed as torn, and every chunk after it dropped (found by review,
    // 2026-11-29).
    let read_summary_where_the_log_goes_on = |seg: u32, off: u32| -> Result<Option<ChunkSummary>> {
        let b = block(seg, off)?;
        match ChunkSummary::decode(&b) {
            Ok(s) => Ok(s),
            Err(e) => match crate::summary::whole_header(&b) {
                Some(h)
                    if h.segment == seg
                        && h.offset == off
                        && h.format_id == format_id
                        && h.epoch == ck.epoch =>
                {
                    Err(Error::Corrupt(format!(
                        "the summary of chunk {} at block {off} of segment {seg} is whole but \
                         this build cannot read it ({e}): written by another build?",
                        h.chunk_seq
                    )))
                }
                _ => Ok(None),
            },
        }
    };
    // An index older than the log is refused BEFORE the staged chunks are written: where
    // the log goes on (each stream's cursor, the heads of free segments) a chunk of a
    // later session means the index was restored from a backup, and the replay wrote the
    // dead session's staged chunks over that session's flushed ones first (found by
    // review, 2026-11-29). The scans below look again once the replay wrote.
    if crate::staging::area_holds_writes(&staging) {
        let places = cursors
            .iter()
            .flatten()
            .copied()
            .chain((1..geo.segment_count).filter(|&s| segs.state(s) == Some(SegState::Free)).map(|s| (s, 0)));
        for (seg, off) in places {
            if let Some(s) = read_summary(seg, off)? {
                if s.in_place(seg, off, format_id, bps) {
                    newer_than_index(&s, ck.epoch, index_name)?;
                }
            }
        }
    }
    // Staging rule 4: a dead process's staged chunks are in the log before it is scanned.
    // The one write a refused open may have made: a refusal of the roll-forward below
    // (damage in the log, a free record or a cut checkpoint the log does not reach) comes
    // after the staged chunks went to their places. Those are the places the dead
    // session gave them, and the area keeps its slots (staging rule 3), so the next open
    // or a rebuild sees the log that session would have left had its writes returned
    // (a review, 2026-11-29, found it undocumented; refusing first would need the whole
    // roll-forward run over the staged chunks in memory).
    let staged = crate::staging::replay(&dev, &staging, &sb, ck.epoch, ck.next_chunk_seq, ck.session)?;
    let accept = |s: &ChunkSummary, seq: u64| s.chunk_seq == seq && s.epoch == ck.epoch;

    // Heads of segments free at the checkpoint, by chain number.
    let mut heads: HashMap<u64, (u32, ChunkSummary)> = HashMap::new();
    // Free segments whose first block is a chunk of this format: any of them the
    // roll-forward does not take is stale (rule below).
    let mut stale_heads = Vec::new();
    for seg in 1..geo.segment_count {
        if segs.state(seg) == Some(SegState::Free) {
            if let Some(s) = read_summary_where_the_log_goes_on(seg, 0)? {
                if s.in_place(seg, 0, format_id, bps) {
                    newer_than_index(&s, ck.epoch, index_name)?;
                    stale_heads.push(seg);
                    if s.epoch == ck.epoch {
                        heads.insert(s.chunk_seq, (seg, s));
                    }
                }
            }
        }
    }

    let mut report = RecoveryReport {
        checkpoint_epoch: ck.epoch,
        staged,
        ..Default::default()
    };
    let mut expected = ck.next_chunk_seq;
    let mut collected: Vec<(Entry, u64)> = Vec::new();
    loop {
        let mut found = None;
        for (sid, cur) in cursors.iter().enumerate() {
            if let Some((seg, off)) = *cur {
                if geo.chunk_fits_at(off) {
                    if let Some(s) = read_summary_where_the_log_goes_on(seg, off)? {
                        if accept(&s, expected)
                            && s.stream as usize == sid
                            && s.in_place(seg, off, format_id, bps)
                        {
                            found = Some((seg, off, s));
                            break;
                        }
                    }
                }
            }
        }
        if found.is_none() {
            if let Some((seg, s)) = heads.remove(&expected) {
                let sid = s.stream as usize;
                if sid >= STREAMS {
                    // The next chunk of the chain (its number, this epoch, a good
                    // checksum) in a stream this build does not know: ending the log
                    // here dropped every chunk after it, and zeroed it as stale.
                    return Err(Error::Corrupt(format!(
                        "chunk {expected} at the head of segment {seg} is in stream {sid}, \
                         past the {STREAMS} streams this build knows"
                    )));
                }
                if segs.take_for_recovery(seg, s.stream, ck.next_entry_seq) {
                    if let Some((old, _)) = cursors[sid] {
                        segs.close(old);
                    }
                    found = Some((seg, 0, s));
                }
            }
        }
        let Some((seg, off, s)) = found else {
            // Free rule 7: a chunk of a young segment freed since, gone with its reuse.
            if skip.remove(&expected) {
                expected += 1;
                report.chunks_stepped_over += 1;
                continue;
            }
            break;
        };
        if off + s.total_blocks() > bps {
            break;
        }
        let start = geo.segment_start(seg) + off as u64;
        let mut data = crate::device::AlignedBuf::new(s.data_blocks as usize * BLOCK_SIZE);
        if s.data_blocks > 0 {
            let at = (start + 1) * BLOCK_SIZE as u64;
            dev.read_at(at, &mut data[..s.data_blocks as usize * BLOCK_SIZE])
                .map_err(|e| Error::io("recovery read", at, e))?;
        }
        let mut k = 0usize;
        for e in &s.entries {
            match *e {
                Entry::Data { crc, .. } => {
                    let blk = &data[k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE];
                    if crc32c::crc32c(blk) == crc {
                        collected.push((*e, start + 1 + k as u64));
                    } else if report.staged.same_boot {
                        // Rule 3: after the death of only the process, every chunk the
                        // log holds was written whole (the area held and rewrote each
                        // chunk whose write had not returned). A block that fails its
                        // checksum is damage: it stays mapped and reads as EIO, instead
                        // of handing back the block's older data or zeros as if the
                        // write had never completed (found by review, 2026-11-27).
                        collected.push((*e, start + 1 + k as u64));
                        report.entries_corrupt += 1;
                    } else {
                        report.entries_skipped += 1;
                    }
                    k += 1;
                }
                Entry::Trim { .. } => collected.push((*e, 0)),
            }
        }
        let next = off + s.total_blocks();
        let sid = s.stream as usize;
        if !geo.chunk_fits_at(next) {
            segs.close(seg);
            cursors[sid] = None;
        } else {
            cursors[sid] = Some((seg, next));
        }
        expected += 1;
        report.chunks_replayed += 1;
    }

    // Staging rule 4: every chunk the staging area replayed continues the chain, so the
    // roll-forward reached it. One it did not reach holds completed writes this open
    // would lose without a word (a slot numbered out of the chain by a damaged area).
    if let Some(last) = report.staged.last_chunk {
        if expected <= last {
            return Err(Error::Corrupt(format!(
                "the staging area replayed chunks up to {last}, but the log ends at chunk \
                 {expected}: completed writes would be lost; keep the staging file for \
                 analysis, or remove it to open without them"
            )));
        }
    }
    // Free rule 6: every death the free records relied on was replayed.
    if let Some(f) = frees.iter().max_by_key(|f| f.chain) {
        if expected < f.chain {
            return Err(Error::Corrupt(format!(
                "segment {} was freed once chunks below {} were durable, but the log \
                 ends at chunk {expected}: chunks are missing",
                f.segment, f.chain
            )));
        }
    }
    // Checkpoint rule 7: map pages of a checkpoint cut between its page batches are in
    // the index, taken at its snapshot, when every chunk below its number was synced: an
    // honest log reaches that number. One that ends below it (a summary damaged or lost)
    // left those pages naming blocks the open would count in nothing and hand to the
    // next writes (found by review, 2026-11-29). Refused before anything is zeroed.
    if let Some(p) = loaded.partial.as_ref().filter(|p| p.epoch == ck.epoch) {
        if expected < p.next_chunk_seq {
            return Err(Error::Corrupt(format!(
                "the log ends at chunk {expected}, below chunk {} of the checkpoint cut \
                 between its page batches whose map pages are in the index: chunks are \
                 missing (damaged or lost summaries)",
                p.next_chunk_seq
            )));
        }
    }
    collected.sort_by_key(|(e, _)| e.seq());
    // Live counts: the checkpoint's (taken in one snapshot with its map pages), moved by
    // each replayed change as the appender moves them.
    let mut mapped: u64 = seg_records.iter().map(|r| r.valid as u64).sum();
    // Checkpoint rule 7: after a cut between page batches the pages may be newer than
    // the segment records; the counts are recounted from the map after the replay.
    let recount = loaded.partial.is_some();
    let unmap = |old: MapEntry, mapped: &mut u64| -> Result<()> {
        if recount {
            return Ok(());
        }
        if let Some(o) = old.pba() {
            let seg = geo.segment_of(o as u64);
            if segs.valid(seg) == 0 {
                return Err(Error::Corrupt(format!(
                    "the log unmaps a block of segment {seg}, which the checkpoint \
                     counts empty (run `ftlblk check`)"
                )));
            }
            segs.note_unmap(seg);
            *mapped -= 1;
        }
        Ok(())
    };
    let mut max_seq = ck.next_entry_seq;
    for (e, pba) in &collected {
        if e.seq() >= SANE {
            // A checksummed summary with an impossible sequence number: skip it.
            report.entries_skipped += 1;
            continue;
        }
        max_seq = max_seq.max(e.seq() + 1);
        match *e {
            Entry::Data { lba, crc, .. } if lba < geo.exported_blocks => {
                let old = map.swap(lba, MapEntry::new(*pba as u32, crc))?;
                unmap(old, &mut mapped)?;
                if !recount {
                    segs.count_live(geo.segment_of(*pba));
                    mapped += 1;
                }
                report.entries_applied += 1;
            }
            Entry::Trim { lba, count, .. } => {
                let end = lba.saturating_add(count as u64).min(geo.exported_blocks);
                for l in lba..end {
                    let old = map.update(l, |old| old.is_mapped().then_some(MapEntry::UNMAPPED))?;
                    unmap(old, &mut mapped)?;
                }
                report.entries_applied += 1;
            }
            // A checksummed summary naming an LBA past the end: skip it, loudly countable.
            Entry::Data { .. } => report.entries_skipped += 1,
        }
    }
    if recount {
        segs.clear_counts();
        mapped = 0;
        let mut bad = None;
        map.for_each_page(|_, entries| {
            for e in entries.iter().filter_map(|&e| MapEntry(e).pba()) {
                let seg = geo.segment_of(e as u64);
                if segs.state(seg).is_none() {
                    bad.get_or_insert(e);
                    continue;
                }
                segs.count_live(seg);
                mapped += 1;
            }
        })?;
        if let Some(b) = bad {
            return Err(Error::Corrupt(format!("the map points past the log: block {b}")));
        }
    }
    // Free rule 6: a freed segment holds nothing once the log that killed it is replayed
    // (unless the roll-forward reopened it for new chunks).
    for f in frees {
        let seg = f.segment;
        if segs.state(seg) == Some(SegState::Free) && segs.valid(seg) != 0 {
            return Err(Error::Corrupt(format!(
                "segment {seg} was freed by a free record but {} of its blocks are still \
                 mapped after the roll-forward",
                segs.valid(seg)
            )));
        }
    }
    // Recovery rule 2: chunks past the break (at a stream's cursor, or at the head of a
    // segment still free; a summary torn at a cursor too) are not part of the log, and neither are chunks of an earlier
    // use of a free segment whose zeroing a crash lost (checkpoint rule 5): their first
    // blocks are zeroed, so no later walk of the log (relocation, the checker, an index
    // rebuild) takes them for part of it. The next session's chunks may carry the same
    // chain and entry numbers. Test: `tests/rebuild.rs`,
    // `chunks_past_a_crash_break_are_zeroed_by_recovery`.
    // Zeroed only AFTER every refusal of the roll-forward's entries above: a refused open
    // writes nothing but the staged chunks (above), and when the break was damage, the chunks past it are still there
    // for `check --rebuild-index` (found by review, 2026-11-27; they were zeroed before
    // the entries were applied). Test: `tests/rebuild.rs`,
    // `an_open_refused_by_the_roll_forward_zeroes_nothing`.
    let zero = crate::device::AlignedBuf::new(BLOCK_SIZE);
    let mut stale: Vec<(u32, u32)> = stale_heads
        .into_iter()
        .filter(|&seg| segs.state(seg) == Some(SegState::Free))
        .map(|seg| (seg, 0))
        .collect();
    for &(seg, off) in cursors.iter().flatten() {
        if !geo.chunk_fits_at(off) {
            continue;
        }
        let at_cursor = decoded(seg, off)?;
        let torn = at_cursor.is_err();
        if let Some(s) = at_cursor
            .ok()
            .flatten()
            .filter(|s| s.in_place(seg, off, format_id, bps))
        {
            newer_than_index(&s, ck.epoch, index_name)?;
            stale.push((seg, off));
        } else if torn {
            // A summary torn by the cut (the magic, a failing checksum): an index
            // rebuild walks on past a damaged summary to the next chunk in place and newer
            // (`SegmentChunks::resync`), which here is the crashed session's tail past
            // the break. Zeroed, the walk stops at it as before.
            stale.push((seg, off));
        }
    }
    // Recovery rule 3: a device write or sync of the recovery that fails marks the area,
    // so that the next open (in this boot) takes the device for one that may have lost
    // writes (found by review, 2026-11-27: only the session's own failures marked it).
    let failed = |what: &'static str, at: u64, e: std::io::Error| {
        staging.mark_device_error();
        Error::io(what, at, e)
    };
    for &(seg, off) in &stale {
        let at = (geo.segment_start(seg) + off as u64) * BLOCK_SIZE as u64;
        dev.write_at(at, &zero)
            .map_err(|e| failed("recovery write", at, e))?;
    }
    report.stale_chunks_zeroed = stale.len() as u64;
    // Recovery rule 1: the replayed chunks are made durable BEFORE the open checkpoint
    // names their blocks. After the death of a process (not a power cut) they can be
    // written but unsynced, readable from the backing's cache yet lost by a later cut.
    if report.chunks_replayed > 0 || !stale.is_empty() {
        dev.sync().map_err(|e| failed("recovery sync", 0, e))?;
    }
    report.mapped_blocks = mapped;
    Ok((
        Parts {
            dev,
            index,
            sb,
            cfg,
            map,
            segs,
            cursors,
            next_chunk_seq: expected,
            next_entry_seq: max_seq,
            epoch: ck.epoch + 1,
            // Staging rule 9: a number of its own for each session, so that the area of
            // another copy of this backing (same uuid, same epoch) is not taken for its.
            session: rand::random::<u32>().max(1),
            counters: ck.counters,
            mapped,
            staging,
            freed: frees
                .iter()
                .map(|f| f.segment)
                .chain(loaded.stale_frees.iter().copied())
                .collect(),
        },
        report,
    ))
}
