//! Index rebuild from the log: the map and segment table recovered from the chunk
//! summaries alone, for a backing whose index is lost, corrupt or of another format
//! (`ftlblk check --rebuild-index`).
//!
//! Every chunk summary names its blocks' LBAs, entry sequence numbers and checksums, and
//! carries the TRIM records, so the log describes the whole device: the rebuild walks
//! every segment with the walker recovery and relocation use (`chunks.rs`: this format,
//! in place, each chunk newer than the one before it), keeps the data entries whose
//! block matches its crc32c (a block whose write never completed does not), and applies
//! all entries in (epoch, entry sequence) order, data and TRIM alike: the newest record
//! of each LBA wins, and a relocated copy is just a newer record of the same data.
//!
//! What makes that the state the device had (docs/scale.md, "Index rebuild"):
//! - **freed segments are invisible**: a segment's first block is zeroed when it is
//!   freed (checkpoint rule 5), so the walker finds nothing of its old use;
//! - **tombstones outlive the data they hide**: a TRIM segment is freed only after the
//!   records of it that may still hide an older block are carried into a newer chunk
//!   (`engine/tombstones.rs`);
//! - **no chunk of a crashed session's tail**: recovery zeroes the chunks it found past
//!   the break (recovery rule), and the rebuild also drops, per epoch, the chunks
//!   numbered at or past the first chain number of any later epoch (the next session
//!   continued the chain from the break).
//!
//! The rebuilt index is a checkpoint of a new epoch (above every epoch on the backing)
//! with every segment that holds a chunk closed and every stream cursor empty: the next
//! open replays nothing and writes into fresh segments. Counters (user bytes, WAF) start
//! again from zero; erase counts too, unless the old index's segment and free records can
//! still be read ([`erase_counts_of`]: the largest count each names is kept).
//!
//! Crash-ordering rule of a rebuild:
//! 1. the map pages and segment records are committed BEFORE the checkpoint record, in
//!    batches, into an index cleared first: a rebuild cut short leaves an index without
//!    a checkpoint, which every open refuses (pointing at the rebuild again). Test:
//!    `tests/rebuild.rs`, `a_rebuild_cut_short_leaves_no_checkpoint`.
//!
//! RAM: the map (8 bytes per exported block) and one record per log entry (32 bytes)
//! while it runs. Owns nothing after it returns. Called by `ftlblk check` and tests.

use crate::chunks::SegmentChunks;
use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::index::{IndexStore, Key, Op};
use crate::map::MapEntry;
use crate::records::{CheckpointRecord, Counters, SegState, SegmentRecord, PAGE_ENTRIES};
use crate::recovery::past_sane;
use crate::stream::STREAMS;
use crate::summary::{ChunkSummary, Entry};
use std::collections::BTreeMap;

/// What a rebuild found and wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RebuildReport {
    pub segments: u32,
    /// Segments that hold at least one chunk of the log.
    pub segments_with_chunks: u32,
    pub chunks: u64,
    pub data_entries: u64,
    pub trim_entries: u64,
    /// Data entries whose block does not match its checksum (a write that never
    /// completed), or that name an LBA past the end; entries with a sequence number out
    /// of range (damage).
    pub entries_skipped: u64,
    /// Chunks whose summary holds an epoch or chunk number out of range (damage).
    pub chunks_out_of_range: u64,
    /// Chunks left out because a damaged summary before them in their segment ended
    /// its walk (each segment with some has a warning).
    pub chunks_hidden: u64,
    /// Chunks of a crashed session numbered past its break (never part of the log).
    pub chunks_past_break: u64,
    pub mapped_blocks: u64,
    /// The rebuilt checkpoint's epoch, next chain number and next entry number.
    pub epoch: u64,
    pub next_chunk_seq: u64,
    pub next_entry_seq: u64,
    /// Problems found on the way that did not stop it (a damaged superblock copy).
    pub warnings: Vec<String>,
}

/// Progress of a rebuild, for a progress bar: segments scanned of the total.
pub trait RebuildProgress {
    fn scanned(&mut self, done: u32, total: u32);
}

impl<F: FnMut(u32, u32)> RebuildProgress for F {
    fn scanned(&mut self, done: u32, total: u32) {
        self(done, total)
    }
}

/// One log record, as the rebuild orders it.
#[derive(Debug, Clone, Copy)]
struct Rec {
    epoch: u64,
    seq: u64,
    lba: u64,
    /// Data: the physical block and its crc; trim: `u32::MAX` and the block count.
    pba: u32,
    crc_or_count: u32,
}

const TRIM_PBA: u32 = u32::MAX;

/// A chunk found by the scan: its position and where its records start in the list.
struct Found {
    epoch: u64,
    chain: u64,
    seg: u32,
    stream: u8,
    records: std::ops::Range<usize>,
}

/// Rebuilds `index` from the log on `dev` (see the module docs). `index` is cleared
/// first. The superblock must be valid (the rebuild never reformats).
pub fn rebuild<D: BlockDevice, I: IndexStore>(
    dev: &D,
    index: &I,
    batch: usize,
    progress: &mut dyn RebuildProgress,
) -> Result<RebuildReport> {
    rebuild_keeping_wear(dev, index, batch, progress, &[])
}

/// The erase counts the segment and free records of `old` (an index being replaced)
/// still name, by segment: the largest each segment has. Only from an index of this
/// backing (its checkpoint record decodes and names `uuid`; another backing's segment
/// numbers name other segments): otherwise, and for records that do not decode, none.
/// The wear history is what wear-aware allocation and static wear levelling balance; a
/// rebuild that dropped it made every segment look unworn (found by review, 2026-11-27).
pub fn erase_counts_of<I: IndexStore>(old: &I, segments: u32, uuid: &[u8; 16]) -> Vec<u32> {
    let mut counts = vec![0u32; segments as usize];
    let ours = old
        .load_kind(Key::CHECKPOINT)
        .unwrap_or_default()
        .iter()
        .filter(|(k, _)| k.len() == 1)
        .any(|(_, v)| CheckpointRecord::decode(v).is_ok_and(|c| &c.uuid == uuid));
    if !ours {
        return counts;
    }
    let mut note = |seg: u32, n: u32| {
        if let Some(c) = counts.get_mut(seg as usize) {
            *c = (*c).max(n);
        }
    };
    for (_, v) in old.load_kind(Key::SEGMENT).unwrap_or_default() {
        if let Ok(r) = SegmentRecord::decode(&v) {
            note(r.segment, r.erase_count);
        }
    }
    for (_, v) in old.load_kind(Key::FREE).unwrap_or_default() {
        if let Ok(r) = crate::records::FreeRecord::decode(&v) {
            note(r.segment, r.erase_count);
        }
    }
    counts
}

/// [`rebuild`], with each segment's erase count taken from `wear` (by segment; those
/// past its end start at zero), as [`erase_counts_of`] read it from the old index.
pub fn rebuild_keeping_wear<D: BlockDevice, I: IndexStore>(
    dev: &D,
    index: &I,
    batch: usize,
    progress: &mut dyn RebuildProgress,
    wear: &[u32],
) -> Result<RebuildReport> {
    let (sb, warnings) = crate::lifecycle::read_superblock_readonly(dev)?;
    let geo = sb.geometry;
    let format_id = sb.format_id();
    let mut report = RebuildReport {
        segments: geo.segment_count,
        warnings,
        ..Default::default()
    };
    let bps = geo.blocks_per_segment() as usize;
    let mut window = AlignedBuf::new(bps * BLOCK_SIZE);
    let mut found: Vec<Found> = Vec::new();
    let mut recs: Vec<Rec> = Vec::new();
    for seg in 1..geo.segment_count {
        progress.scanned(seg - 1, geo.segment_count - 1);
        let at = geo.segment_start(seg) * BLOCK_SIZE as u64;
        dev.read_at(at, &mut window)
            .map_err(|e| Error::io("rebuild read", at, e))?;
        // Every chunk the walker accepts, whatever its epoch.
        let walk =
            SegmentChunks::new(dev, geo, seg, format_id, (u64::MAX, u64::MAX)).preloaded(&window);
        let mut any = false;
        // Where the walk ends, the last chunk in range it took, and whether the last
        // one it took was out of range (the walker then refuses every chunk after it).
        let (mut end, mut last, mut ended_out_of_range) = (0u32, None, false);
        for c in walk {
            let (off, s) = c?;
            any = true;
            end = off + s.total_blocks();
            // A checksummed summary with an impossible epoch or chunk number (recovery
            // refuses such counters): taken, it would win every LBA it names, and the
            // rebuilt checkpoint's counters would overflow or make every open refuse it
            // (found by review, 2026-11-27). The new checkpoint counts one past the
            // largest taken, which must itself be in range.
            ended_out_of_range = past_sane(s.epoch) || past_sane(s.chunk_seq);
            if ended_out_of_range {
                report.chunks_out_of_range += 1;
                continue;
            }
            last = Some((s.epoch, s.chunk_seq));
            let first = recs.len();
            let mut k = 0usize;
            for e in &s.entries {
                match *e {
                    Entry::Data { lba, seq, crc } => {
                        let blk = off as usize + 1 + k;
                        k += 1;
                        let data = &window[blk * BLOCK_SIZE..(blk + 1) * BLOCK_SIZE];
                        if lba >= geo.exported_blocks
                            || past_sane(seq)
                            || crc32c::crc32c(data) != crc
                        {
                            report.entries_skipped += 1;
                            continue;
                        }
                        report.data_entries += 1;
                        recs.push(Rec {
                            epoch: s.epoch,
                            seq,
                            lba,
                            pba: (geo.segment_start(seg) + blk as u64) as u32,
                            crc_or_count: crc,
                        });
                    }
                    Entry::Trim { seq, .. } if past_sane(seq) => report.entries_skipped += 1,
                    Entry::Trim { lba, seq, count } => {
                        report.trim_entries += 1;
                        recs.push(Rec {
                            epoch: s.epoch,
                            seq,
                            lba,
                            pba: TRIM_PBA,
                            crc_or_count: count,
                        });
                    }
                }
            }
            report.chunks += 1;
            found.push(Found {
                epoch: s.epoch,
                chain: s.chunk_seq,
                seg,
                stream: s.stream,
                records: first..recs.len(),
            });
        }
        report.segments_with_chunks += any as u32;
        // A damaged summary ends the walk: one that carries the magic but fails its
        // checksum, or one out of range (the walker refuses the chunks after it). The
        // chunks after it in this segment are not rebuilt (their LBAs read older data,
        // or none). Say so (found by review, 2026-11-27): later summaries in place, in
        // range and newer than the last taken. A walk that ended at a block without the
        // magic (a freed segment's zeroed head, a chunk past a crash's break that
        // recovery zeroed, the end of what was written) hid nothing.
        let block = |k: u32| &window[k as usize * BLOCK_SIZE..(k as usize + 1) * BLOCK_SIZE];
        let damaged_at_end = (end as usize) < bps && ChunkSummary::decode(block(end)).is_err();
        let hidden = if damaged_at_end || ended_out_of_range {
            let from = if ended_out_of_range { end } else { end + 1 };
            (from..bps as u32)
                .filter(|&k| {
                    ChunkSummary::decode(block(k))
                        .ok()
                        .flatten()
                        .is_some_and(|h| {
                            h.in_place(seg, k, format_id, bps as u32)
                                && !past_sane(h.epoch)
                                && !past_sane(h.chunk_seq)
                                && last.is_none_or(|l| (h.epoch, h.chunk_seq) > l)
                        })
                })
                .count() as u64
        } else {
            0
        };
        if hidden > 0 {
            report.chunks_hidden += hidden;
            let what = if ended_out_of_range {
                format!("a chunk before block {end} holds an epoch or chunk number out of range")
            } else {
                format!("the summary at block {end} fails its checksum")
            };
            report.warnings.push(format!(
                "segment {seg}: {what}, and {hidden} later chunks of the segment were left \
                 out with it: their blocks read older data or zeros"
            ));
        }
    }
    progress.scanned(geo.segment_count - 1, geo.segment_count - 1);

    // Breaks: the session after a crash continued the chain from the break, so every
    // chunk of epoch E numbered at or past the first number of a later epoch lies past
    // E's break.
    let mut first_of: BTreeMap<u64, u64> = BTreeMap::new();
    for f in &found {
        let e = first_of.entry(f.epoch).or_insert(f.chain);
        *e = (*e).min(f.chain);
    }
    let mut later_min: BTreeMap<u64, u64> = BTreeMap::new();
    let mut running = u64::MAX;
    for (&epoch, &first) in first_of.iter().rev() {
        later_min.insert(epoch, running);
        running = running.min(first);
    }
    let mut keep = vec![true; recs.len()];
    let mut seg_state: Vec<Option<u8>> = vec![None; geo.segment_count as usize];
    let mut opened: Vec<u64> = vec![u64::MAX; geo.segment_count as usize];
    let (mut max_epoch, mut max_chain, mut max_seq) = (0u64, 0u64, 0u64);
    for f in &found {
        max_epoch = max_epoch.max(f.epoch);
        max_chain = max_chain.max(f.chain);
        if later_min.get(&f.epoch).is_some_and(|&m| f.chain >= m) {
            report.chunks_past_break += 1;
            keep[f.records.clone()].iter_mut().for_each(|k| *k = false);
        }
        seg_state[f.seg as usize] = Some(f.stream);
        for r in &recs[f.records.clone()] {
            max_seq = max_seq.max(r.seq);
            opened[f.seg as usize] = opened[f.seg as usize].min(r.seq);
        }
    }
    let mut recs: Vec<Rec> = recs
        .into_iter()
        .zip(keep)
        .filter_map(|(r, k)| k.then_some(r))
        .collect();
    // (epoch, seq) is unique: the unstable sort gives the same order without the stable
    // sort's scratch copy of half the records (29 GiB at 8 TB).
    recs.sort_unstable_by_key(|r| (r.epoch, r.seq));

    // The map: every record in order; the newest of each LBA wins.
    let mut map = vec![MapEntry::UNMAPPED; geo.exported_blocks as usize];
    for r in &recs {
        if r.pba == TRIM_PBA {
            let end = r
                .lba
                .saturating_add(r.crc_or_count as u64)
                .min(geo.exported_blocks);
            for e in map.iter_mut().take(end as usize).skip(r.lba as usize) {
                *e = MapEntry::UNMAPPED;
            }
        } else {
            map[r.lba as usize] = MapEntry::new(r.pba, r.crc_or_count);
        }
    }
    drop(recs);
    let mut valid = vec![0u32; geo.segment_count as usize];
    for pba in map.iter().filter_map(|e| e.pba()) {
        let seg = geo.segment_of(pba as u64) as usize;
        if let Some(v) = valid.get_mut(seg) {
            *v += 1;
        }
    }
    report.mapped_blocks = valid.iter().map(|&v| v as u64).sum();
    report.epoch = max_epoch + 1;
    report.next_chunk_seq = max_chain + 1;
    report.next_entry_seq = max_seq + 1;

    let records: Vec<SegmentRecord> = (0..geo.segment_count)
        .map(|s| {
            let i = s as usize;
            let (state, stream) = match (s, seg_state[i]) {
                (0, _) => (SegState::Closed, 0),
                (_, Some(stream)) if (stream as usize) < STREAMS => (SegState::Closed, stream),
                _ => (SegState::Free, 0),
            };
            SegmentRecord {
                segment: s,
                state,
                stream,
                erase_count: wear.get(i).copied().unwrap_or(0),
                opened_seq: if opened[i] == u64::MAX { 0 } else { opened[i] },
                valid: if state == SegState::Closed {
                    valid[i]
                } else {
                    0
                },
            }
        })
        .collect();
    if let Some(s) = (1..geo.segment_count as usize)
        .find(|&s| records[s].state == SegState::Free && valid[s] > 0)
    {
        return Err(Error::Corrupt(format!(
            "segment {s} holds live blocks but no chunk of the log"
        )));
    }
    let header = CheckpointRecord {
        uuid: sb.uuid,
        epoch: report.epoch,
        next_chunk_seq: report.next_chunk_seq,
        next_entry_seq: report.next_entry_seq,
        exported_blocks: geo.exported_blocks,
        segment_count: geo.segment_count,
        counters: Counters::default(),
        cursors: vec![None; STREAMS],
    };
    write_index(index, &map, &records, &header, batch.max(1))?;
    Ok(report)
}

/// Rule 1: cleared, then pages and segment records in batches, the checkpoint last.
fn write_index<I: IndexStore>(
    index: &I,
    map: &[MapEntry],
    records: &[SegmentRecord],
    header: &CheckpointRecord,
    batch: usize,
) -> Result<()> {
    index.clear()?;
    let mut ops: Vec<Op> = Vec::with_capacity(batch);
    for (page, entries) in map.chunks(PAGE_ENTRIES).enumerate() {
        if entries.iter().all(|e| !e.is_mapped()) {
            continue;
        }
        let mut entries: Vec<u64> = entries.iter().map(|e| e.0).collect();
        entries.resize(PAGE_ENTRIES, MapEntry::UNMAPPED.0);
        ops.push(crate::engine::checkpoint::page_op((page as u64, entries)));
        if ops.len() >= batch {
            index.commit(std::mem::take(&mut ops))?;
        }
    }
    ops.extend(
        records
            .iter()
            .map(|r| Op::Put(Key::segment(r.segment), r.encode())),
    );
    index.commit(ops)?;
    // Rule 1: the checkpoint record last.
    index.commit(vec![Op::Put(Key::checkpoint(), header.encode())])
}
