//! Offline checker: verifies every invariant of a backing and its index without
//! changing either (no checkpoint, no repair).
//!
//! Checks, each reported as a [`Problem`]:
//! 1. both superblock copies are valid and identical;
//! 2. every index record decodes (magic, version, crc) and matches the superblock;
//! 3. at the checkpoint, each segment record's live count equals the map entries
//!    pointing into it (they are written in one snapshot);
//! 4. after replaying the log: every map entry points into a log segment that is not
//!    free, and the chunk summary covering that block names the same LBA (map <->
//!    summaries);
//! 5. every mapped block's data matches the crc32c in its map entry (unless skipped);
//! 6. free segments hold no live block; open segments belong to a stream cursor;
//! 7. a free record counts more reuses of its segment than the segment table (one more
//!    for each time it was freed since the checkpoint);
//! 8. the map is what the log says: each LBA's newest record (epoch, entry number) in
//!    the summaries of the segments in use is the write its map entry points at, or a
//!    TRIM (or nothing) when it is unmapped. That is the map `--rebuild-index` would make
//!    of the log; checks 4-6 compare the map only with the summaries of the blocks it
//!    names, so a map entry pointing at an older copy of its block, a mapped block whose
//!    TRIM record is the newest (the rebuild hands trimmed data back) and an unmapped
//!    block whose newest record is a write (a lost write) passed them. A newest write
//!    whose block fails its checksum (torn by a power cut, skipped by recovery rule 3
//!    and by the rebuild) leaves its LBA unchecked.
//!
//! It checks what the next open would see: recovery, including the replay of what a dead
//! server left in its staging area when one is given ([`check_staged`]), runs through an
//! in-memory overlay of the backing, and the chunk summaries are read with the same rules
//! recovery and relocation use (`chunks.rs`: this format, in place, in log order, not
//! beyond the point recovery stopped at).
//!
//! Owns no state of a live FTL: it reads a backing and its index (recovering on an
//! overlay). Called by `ftlblk check` and tests.

use crate::chunks::SegmentChunks;
use crate::config::Config;
use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::Result;
use crate::index::IndexStore;
use crate::map::MapEntry;
use crate::rebuild::{Rec, Winners, TRIM_PBA};
use crate::records::{SegState, PAGE_ENTRIES};
use crate::recovery::{for_each_map_page, load_index, recover};
use crate::summary::Entry;
use std::collections::HashMap;

/// Summary entries the detail pass of check 4 holds at once (about 40 MiB of hash
/// map): the segments whose summaries contradict the map are read in groups of at most
/// this many blocks, one pass over the map per group.
const DETAIL_BLOCKS: usize = 1 << 20;
/// Passes over the map the detail pass makes at most; the segments past them are
/// reported one problem each.
const DETAIL_PASSES: usize = 8;
/// LBAs whose newest log record check 8 holds at once (24 bytes each: 384 MiB, a 64 GiB
/// device); a larger device is checked in slices of LBAs, its log's records sorted by
/// slice into spill files in one walk ([`check_staged_spilling`]), or without a place
/// for them one pass over the chunk summaries per slice (one read per chunk: a 1 TiB
/// device makes 16 passes of about a million summary reads). `CheckReport::log_passes`
/// says how many walks were made.
const NEWEST_SLICE_BLOCKS: u64 = 1 << 24;
/// Problems check 8 names one by one; past them, one more says how many there were.
const NEWEST_NAMED: usize = 1000;

/// One violated invariant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub check: &'static str,
    pub detail: String,
}

/// What the checker found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckReport {
    pub uuid: String,
    pub mapped_blocks: u64,
    pub blocks_verified: u64,
    pub chunks_replayed: u64,
    /// What a dead server's staging area holds that the next open writes to the log
    /// (included in everything checked).
    pub staged: crate::staging::StagedReport,
    pub segments: u32,
    pub free_segments: u32,
    /// Passes check 8 made over the chunk summaries (one per slice of LBAs, or one with
    /// its records spilled to files).
    pub log_passes: u32,
    /// Why check 8 walked the log once per slice though it was given a place to spill
    /// its records (it could not make them there, or their file system lacks the room).
    pub spill_declined: Option<String>,
    /// Segment reuse counts as the checkpoint recorded them.
    pub wear: crate::segments::WearFigures,
    pub problems: Vec<Problem>,
}

impl CheckReport {
    /// True when no invariant is violated.
    pub fn clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks `dev` + `index`. `verify_data` reads every mapped block (slow on big devices).
/// Errors only when the checker cannot run at all (e.g. no superblock, unreadable index).
pub fn check<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    verify_data: bool,
) -> Result<CheckReport> {
    check_staged(dev, index, verify_data, None)
}

/// [`check`], reading the summaries of damaged segments `detail_blocks` blocks at a time
/// (at least one segment), in at most `passes` passes over the map: for tests of the
/// detail pass's grouping.
#[cfg(feature = "internals")]
pub fn check_in_groups<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    verify_data: bool,
    detail_blocks: usize,
    passes: usize,
) -> Result<CheckReport> {
    check_with(
        dev,
        index,
        verify_data,
        None,
        Limits {
            detail_blocks,
            detail_passes: passes,
            ..Limits::new()
        },
    )
}

/// [`check`], holding the newest records of check 8 for `slice` LBAs at a time (rounded
/// up to a map page), its records spilled into `spill_dir` when given: for tests of the
/// slicing.
#[cfg(feature = "internals")]
pub fn check_in_slices<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    slice: u64,
    spill_dir: Option<&std::path::Path>,
) -> Result<CheckReport> {
    check_with(
        dev,
        index,
        false,
        None,
        Limits {
            newest_slice: slice,
            spill_dir: spill_dir.map(|d| d.to_path_buf()),
            ..Limits::new()
        },
    )
}

/// How much of the map and the log the checker holds in memory at once.
#[derive(Debug, Clone)]
struct Limits {
    /// Check 4's detail pass: summary entries held at once.
    detail_blocks: usize,
    /// Check 4's detail pass: passes over the map at most.
    detail_passes: usize,
    /// Check 8: LBAs whose newest record is held at once.
    newest_slice: u64,
    /// Check 8 on a device of more than one slice: a directory in which the one walk of
    /// the log sorts its records into a file per slice (`rebuild::Spill`: 32 bytes a
    /// record, removed when done). Without one (or where it cannot be made), one walk of
    /// every summary per slice: time that grows with the square of the device (a review,
    /// 2026-11-30: about 3.5 G summary reads for 15 TiB).
    spill_dir: Option<std::path::PathBuf>,
}

impl Limits {
    fn new() -> Self {
        Limits {
            detail_blocks: DETAIL_BLOCKS,
            detail_passes: DETAIL_PASSES,
            newest_slice: NEWEST_SLICE_BLOCKS,
            spill_dir: None,
        }
    }
}

/// [`check`], with the staging area a dead server of this backing left (opened with
/// [`StagingArea::open_file_snapshot`](crate::staging::StagingArea::open_file_snapshot)):
/// its writes are replayed into the overlay, as the next open would, and checked with
/// the rest. Neither the backing nor the file is changed.
pub fn check_staged<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    verify_data: bool,
    staging: Option<std::sync::Arc<crate::staging::StagingArea>>,
) -> Result<CheckReport> {
    check_with(dev, index, verify_data, staging, Limits::new())
}

/// [`check_staged`], walking the log once for check 8 on a device of more than one slice
/// (past 64 GiB) by sorting its records into files in a directory made in `spill_dir`
/// (32 bytes per block of the log; removed when done). Where that directory cannot be
/// made, the log is walked once per slice instead.
pub fn check_staged_spilling<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    verify_data: bool,
    staging: Option<std::sync::Arc<crate::staging::StagingArea>>,
    spill_dir: &std::path::Path,
) -> Result<CheckReport> {
    let limits = Limits {
        spill_dir: Some(spill_dir.to_path_buf()),
        ..Limits::new()
    };
    check_with(dev, index, verify_data, staging, limits)
}

fn check_with<D: BlockDevice, I: IndexStore>(
    dev: D,
    index: I,
    verify_data: bool,
    staging: Option<std::sync::Arc<crate::staging::StagingArea>>,
    limits: Limits,
) -> Result<CheckReport> {
    let Limits {
        detail_blocks,
        detail_passes,
        newest_slice,
        spill_dir,
    } = limits;
    let dev = crate::device::overlay::OverlayDevice::new(dev);
    let mut report = CheckReport::default();
    let mut problems = Vec::new();
    // 1. Superblocks (read_superblock would repair: decode both copies here instead).
    let a = read_block(&dev, 0)?;
    let sa = crate::superblock::Superblock::decode(&a);
    let sb = match sa {
        Ok(sb) => sb,
        Err(_) => {
            // Let the usual reader find copy B and explain.
            let (sb, warnings) = crate::lifecycle::read_superblock_readonly(&dev)?;
            for w in warnings {
                problems.push(Problem::new("superblock", w));
            }
            sb
        }
    };
    let geo = sb.geometry;
    let b_off = crate::geometry::Geometry::superblock_offset(1, geo.segment_bytes);
    match crate::superblock::Superblock::decode(&read_block(&dev, b_off)?) {
        Ok(b) if b == sb => {}
        Ok(_) => problems.push(Problem::new(
            "superblock",
            "copy B differs from copy A".into(),
        )),
        Err(_) => problems.push(Problem::new("superblock", "copy B is damaged".into())),
    }
    report.uuid = sb.uuid_string();
    report.segments = geo.segment_count;
    // 2 + 3. Index records and the checkpoint snapshot. A record that does not decode
    // stops the check there, as a problem found (exit 1), not as a check that could not
    // run (exit 2; found by review, 2026-11-29).
    let loaded = match load_index(&index, &sb, "index") {
        Ok(l) => l,
        Err(e) => {
            problems.push(index_damage(e)?);
            report.problems = problems;
            return Ok(report);
        }
    };
    // Reuse counts: a free record counts one more reuse than the table it follows for
    // each time the segment was freed since (more than once when it was reused and
    // freed again before the next checkpoint, free rule 7).
    for f in &loaded.frees {
        let recorded = loaded
            .segments
            .get(f.segment as usize)
            .map(|r| r.erase_count);
        if recorded.is_none_or(|e| f.erase_count <= e) {
            problems.push(Problem::new(
                "wear",
                format!(
                    "free record of segment {} counts {} reuses, the table {recorded:?} (+1 or more expected)",
                    f.segment, f.erase_count
                ),
            ));
        }
    }
    report.wear =
        crate::segments::WearFigures::of(loaded.segments.iter().skip(1).map(|r| r.erase_count));
    // The index and the map are read a record and a page at a time: a map of 2^31
    // blocks (8 TiB) is 16 GiB.
    index.scan(None, &mut |k, _| {
        if !k
            .first()
            .is_some_and(|c| crate::index::Key::KINDS.contains(c))
        {
            problems.push(Problem::new(
                "index records",
                format!("unknown index key {k:02x?}"),
            ));
        }
        Ok(())
    })?;
    let mut counts = vec![0u32; geo.segment_count as usize];
    let pages = for_each_map_page(&index, &sb, |p| {
        for (i, &e) in p.entries.iter().enumerate() {
            if let Some(pba) = MapEntry(e).pba() {
                let s = geo.segment_of(pba as u64) as usize;
                match counts.get_mut(s) {
                    Some(c) => *c += 1,
                    None => problems.push(Problem::new(
                        "checkpoint map",
                        format!(
                            "lba {} points past the backing",
                            p.page * PAGE_ENTRIES as u64 + i as u64
                        ),
                    )),
                }
            }
        }
    });
    if let Err(e) = pages {
        problems.push(index_damage(e)?);
        report.problems = problems;
        return Ok(report);
    }
    // After a checkpoint cut between its page batches (checkpoint rule 7) the pages may be
    // newer than the segment records: recovery recounts, and so does check 6 below.
    for r in loaded.segments.iter().filter(|_| loaded.partial.is_none()) {
        let have = counts[r.segment as usize];
        if r.valid != have {
            problems.push(Problem::new(
                "segment live counts",
                format!(
                    "segment {} records {} live blocks, the checkpoint map has {have}",
                    r.segment, r.valid
                ),
            ));
        }
    }
    // 4. Recovery into the overlay (with a dead server's staged writes, if given), then
    // compare the map with the summaries.
    let staging = match staging {
        Some(s) => s,
        None => crate::staging::StagingArea::in_memory(1)?,
    };
    let recovered = recover(
        &dev,
        &index,
        sb.clone(),
        Config::default(),
        "index",
        staging,
    );
    let (parts, rec) = match recovered {
        Ok(r) => r,
        // Damage recovery refuses (live counts the log contradicts, a log that stops
        // short of a free record): what the next open would report.
        Err(e @ crate::error::Error::Corrupt(_)) => {
            problems.push(Problem::new(
                "recovery",
                format!("the next open fails: {e}"),
            ));
            report.problems = problems;
            return Ok(report);
        }
        // The index older than the log (a backup restored), or another backing's.
        Err(crate::error::Error::IndexMismatch { why, .. }) => {
            problems.push(Problem::new(
                "recovery",
                format!("the next open fails: the index cannot serve this backing: {why}{REBUILD}"),
            ));
            report.problems = problems;
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    report.chunks_replayed = rec.chunks_replayed;
    report.staged = rec.staged;
    // Chunks recovery accepted: every earlier epoch's, and this one's below the break.
    let below = (parts.epoch - 1, parts.next_chunk_seq);
    let format_id = sb.format_id();
    let map = &parts.map;
    let segs = &parts.segs;
    // 4 + 5 in bounded memory (the map and every summary of an 8 TiB backing do not fit:
    // a hash map of block -> summary entry took about 40 bytes per block written). One
    // pass over the map marks each mapped block in a bitmap (one bit per block of the
    // backing) and adds a hash of its (block, lba, crc32c) to its segment's tally; one
    // pass over the summaries adds the same hash of each entry whose block is marked.
    // A segment whose summaries agree with every map entry into it ends with equal sums
    // and counts (a contradiction goes unseen only if two 64-bit sums of mixed hashes
    // collide). Only segments that differ are read again, in groups, to name each
    // contradicted map entry as before.
    let segments = geo.segment_count as usize;
    let mut tally = vec![Tally::default(); segments];
    let mut mapped_bits = vec![0u64; (geo.physical_blocks() as usize).div_ceil(64)];
    // Data verification a map page at a time: its blocks sorted by place, runs of
    // adjacent blocks read as one, VERIFY_DEPTH reads in flight (one 4 KiB read at a
    // time in LBA order took 148 s for 13 GB).
    let mut verify = Verifier::new();
    map.try_for_each_page(|page, entries| {
        let base = page * PAGE_ENTRIES as u64;
        for (i, &raw) in entries.iter().enumerate() {
            if raw == MapEntry::UNMAPPED.0 {
                continue;
            }
            report.mapped_blocks += 1;
            let (lba, e) = (base + i as u64, MapEntry(raw));
            let Some(pba) = e.pba() else { continue };
            let pba = pba as u64;
            let seg = geo.segment_of(pba);
            let t = match (segs.state(seg), tally.get_mut(seg as usize)) {
                (Some(state), Some(t)) if pba < geo.physical_blocks() => {
                    if state == SegState::Free {
                        problems.push(Problem::new(
                            "map",
                            format!("lba {lba} maps into free segment {seg}"),
                        ));
                    }
                    t
                }
                _ => {
                    problems.push(Problem::new(
                        "map",
                        format!("lba {lba} maps past the backing"),
                    ));
                    problems.push(Problem::new(
                        "map vs summaries",
                        format!("lba {lba} -> block {pba}, which no chunk summary covers"),
                    ));
                    continue;
                }
            };
            t.live += 1;
            t.map_sum = t.map_sum.wrapping_add(entry_hash(pba, lba, e.crc()));
            mapped_bits[(pba / 64) as usize] |= 1 << (pba % 64);
            if verify_data {
                verify.todo.push((pba, lba, e.crc()));
            }
        }
        report.blocks_verified += verify.run(&dev, &mut problems)?;
        Ok(())
    })?;
    let marked = |pba: u64| mapped_bits[(pba / 64) as usize] & (1 << (pba % 64)) != 0;
    // The summary entries of segment `seg` (none for a free segment), by block.
    let summaries_of = |seg: u32, f: &mut dyn FnMut(u64, u64, u32)| -> Result<()> {
        records_of(&dev, geo, segs, seg, format_id, below, &mut |r| {
            if r.pba != TRIM_PBA {
                f(r.pba as u64, r.lba, r.crc_or_count);
            }
        })
    };
    for seg in 1..geo.segment_count {
        if segs.state(seg) == Some(SegState::Free) {
            report.free_segments += 1;
        }
        let t = &mut tally[seg as usize];
        summaries_of(seg, &mut |pba, lba, crc| {
            if marked(pba) {
                t.covered += 1;
                t.summary_sum = t.summary_sum.wrapping_add(entry_hash(pba, lba, crc));
            }
        })?;
    }
    // The detail pass: block -> the LBA and checksum its summary entry names, for a
    // group of the segments that differ at a time.
    let differ: Vec<u32> = (0..geo.segment_count)
        .filter(|&s| {
            let t = &tally[s as usize];
            t.live != t.covered || t.map_sum != t.summary_sum
        })
        .collect();
    let per_group = (detail_blocks / geo.blocks_per_segment() as usize).max(1);
    let named = differ.len().min(per_group * detail_passes);
    // Past that, one problem per segment: naming every entry of a backing whose map is
    // another's would take a pass over the map for every group of segments.
    for &seg in &differ[named..] {
        let t = &tally[seg as usize];
        problems.push(Problem::new(
            "map vs summaries",
            format!(
                "segment {seg}: its summaries disagree with the {} map entries pointing into \
                 it, and name {} of their blocks (entries not named one by one: more than \
                 {named} segments disagree)",
                t.live, t.covered
            ),
        ));
    }
    for group in differ[..named].chunks(per_group) {
        let mut summary_lba: HashMap<u64, (u64, u32)> = HashMap::new();
        for &seg in group {
            summaries_of(seg, &mut |pba, lba, crc| {
                summary_lba.insert(pba, (lba, crc));
            })?;
        }
        map.for_each_page(|page, entries| {
            let base = page * PAGE_ENTRIES as u64;
            for (i, &raw) in entries.iter().enumerate() {
                let (lba, e) = (base + i as u64, MapEntry(raw));
                let Some(pba) = e.pba().map(u64::from) else { continue };
                if pba >= geo.physical_blocks() || group.binary_search(&geo.segment_of(pba)).is_err() {
                    continue;
                }
                match summary_lba.get(&pba) {
                    // The checksum too: a map entry whose crc is not its block's reads as
                    // EIO (without data verification nothing else would notice; found by
                    // review, 2026-11-27).
                    Some(&(l, crc)) if l == lba && crc == e.crc() => {}
                    Some(&(l, crc)) if l == lba => problems.push(Problem::new(
                        "map vs summaries",
                        format!(
                            "lba {lba} -> block {pba} with crc32c {:08x}, whose summary says {crc:08x}",
                            e.crc()
                        ),
                    )),
                    Some(&(l, _)) => problems.push(Problem::new(
                        "map vs summaries",
                        format!("lba {lba} -> block {pba}, whose summary names lba {l}"),
                    )),
                    None => problems.push(Problem::new(
                        "map vs summaries",
                        format!("lba {lba} -> block {pba}, which no chunk summary covers"),
                    )),
                }
            }
        })?;
    }
    // 8. The map against the newest record of each LBA in the log, a slice of LBAs at a
    // time (whole map pages).
    let page = PAGE_ENTRIES as u64;
    let slice = newest_slice.max(1).div_ceil(page) * page;
    let mut named = 0usize;
    let mut lo = 0u64;
    // Entry numbers past sanity and data past the end skipped, as the rebuild skips them
    // (`apply` would also overflow at an LBA of u64::MAX).
    let counted = |r: &Rec| {
        let past_end = r.pba != TRIM_PBA && r.lba >= geo.exported_blocks;
        !past_end && !crate::recovery::past_sane(r.seq)
    };
    let slices = geo.exported_blocks.div_ceil(slice);
    // More than one slice: the one walk sorts the records by slice into files, when it
    // can make them (see `Limits::spill_dir`).
    let mut spill = None;
    if let Some(dir) = spill_dir.as_deref().filter(|_| slices > 1) {
        // Room for twice the most it may write (a record per block of the log), or none
        // of it: the same file system often holds served devices' indexes, whose commits
        // a full one fails (their FTLs turn read-only).
        let most = geo.physical_blocks() * crate::rebuild::Rec::BYTES as u64;
        match free_bytes(dir) {
            Ok(free) if free >= 2 * most => {
                let made = crate::rebuild::Spill::new(
                    slices,
                    slice,
                    geo.exported_blocks,
                    Some(dir),
                    64 << 10,
                );
                match made {
                    Ok(s) => spill = Some(s),
                    Err(e) => report.spill_declined = Some(e.to_string()),
                }
            }
            Ok(free) => {
                report.spill_declined = Some(format!(
                    "{} has {} MiB free, under twice the {} MiB the records may take",
                    dir.display(),
                    free >> 20,
                    most >> 20
                ))
            }
            Err(e) => report.spill_declined = Some(format!("{}: {e}", dir.display())),
        }
    }
    if let Some(sp) = spill.as_mut() {
        let mut failed = None;
        for seg in 1..geo.segment_count {
            records_of(&dev, geo, segs, seg, format_id, below, &mut |r| {
                if failed.is_none() && counted(&r) {
                    failed = sp.put(r).err();
                }
            })?;
            if failed.is_some() {
                break;
            }
        }
        match failed.map_or_else(|| sp.finish(), Err) {
            Ok(()) => report.log_passes += 1,
            // Spilling failed part way (a full disk): its files go, and the walks per
            // slice check instead.
            Err(e) => {
                report.spill_declined = Some(e.to_string());
                spill = None;
            }
        }
    }
    while lo < geo.exported_blocks {
        let len = slice.min(geo.exported_blocks - lo);
        let mut newest = Winners::new(lo, len);
        match spill.as_mut() {
            Some(sp) => sp.drain(lo / slice, &mut |r| newest.apply(r))?,
            None => {
                report.log_passes += 1;
                for seg in 1..geo.segment_count {
                    records_of(&dev, geo, segs, seg, format_id, below, &mut |r| {
                        if counted(&r) {
                            newest.apply(&r);
                        }
                    })?;
                }
            }
        }
        map.try_for_pages(lo / page..(lo + len).div_ceil(page), |p, entries| {
            let base = p * page;
            for (i, &raw) in entries.iter().enumerate() {
                let lba = base + i as u64;
                if lba < lo || lba >= lo + len {
                    continue;
                }
                let k = (lba - lo) as usize;
                let (have, want) = (MapEntry(raw), newest.entry(k));
                // The checksum is check 4's: a write's own entry differs from the map's
                // only there.
                if have.pba() == want.pba() {
                    continue;
                }
                if named >= NEWEST_NAMED {
                    // Counted, not read: a map that is wholly another's would read a
                    // block for every LBA.
                    named += 1;
                    continue;
                }
                // A write whose block fails its checksum was torn by a power cut:
                // the recovery after it skipped it (recovery rule 3), and so does the
                // rebuild. The record stays in the log, in a chunk of that session or
                // of any earlier one, so it cannot be told from a block damaged since;
                // the copy before it is not held here, and the map's entry stands
                // unchecked for this LBA (not limited to the chunks this recovery rolled
                // forward, as a review suggested: an earlier crash's torn write is as
                // old as any other record).
                if let Some(q) = want.pba() {
                    let b = read_block(&dev, q as u64 * BLOCK_SIZE as u64)?;
                    if crc32c::crc32c(&b) != want.crc() {
                        continue;
                    }
                }
                named += 1;
                let detail = match (have.pba(), want.pba()) {
                    (Some(p), Some(q)) => format!(
                        "lba {lba} -> block {p}, but the log's newest record of it is the write at block {q} (the map points at an older copy, or at no record)"
                    ),
                    (Some(p), None) if newest.named(k) => format!(
                        "lba {lba} -> block {p}, but the log's newest record of it is a TRIM (a rebuild from the log would unmap it)"
                    ),
                    (Some(p), None) => format!(
                        "lba {lba} -> block {p}, but no record in the log names it"
                    ),
                    (None, Some(q)) => format!(
                        "lba {lba} is unmapped, but the log's newest record of it is the write at block {q} (a lost write, or a lost TRIM record)"
                    ),
                    (None, None) => {
                        named -= 1;
                        continue;
                    }
                };
                problems.push(Problem::new("map vs log", detail));
            }
            Ok(())
        })?;
        lo += len;
    }
    if named > NEWEST_NAMED {
        problems.push(Problem::new(
            "map vs log",
            format!(
                "{} more LBAs whose map entry is not the log's newest record (the first {NEWEST_NAMED} named)",
                named - NEWEST_NAMED
            ),
        ));
    }
    // 6. Live counts after replay, and open segments.
    for seg in 1..geo.segment_count {
        let recorded = segs.valid(seg);
        let live = tally[seg as usize].live;
        if recorded != live {
            problems.push(Problem::new(
                "segment live counts",
                format!("segment {seg}: {recorded} counted, {live} mapped"),
            ));
        }
        if segs.state(seg) == Some(SegState::Open)
            && !parts.cursors.iter().flatten().any(|c| c.0 == seg)
        {
            // Open without a cursor: the stream filled it (it closes on the next open).
            if tally[seg as usize].live == 0 {
                problems.push(Problem::new(
                    "segment states",
                    format!("segment {seg} is open, empty and owned by no stream"),
                ));
            }
        }
    }
    report.problems = problems;
    Ok(report)
}

/// Bytes free to an unprivileged writer on the file system holding `dir` (the
/// directory, or the nearest of its parents that exists).
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let at = dir.ancestors().find(|p| p.exists()).unwrap_or(dir);
    let c = std::ffi::CString::new(at.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statvfs is plain old data; the call fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill, both live across the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Every record (data and TRIM) of segment `seg`'s chunks that recovery accepted (none
/// for segment 0 or a free segment, whose first block is zeroed when it is freed): the
/// one walk of the summaries checks 4 and 8 make.
#[allow(clippy::too_many_arguments)]
fn records_of<D: BlockDevice>(
    dev: &D,
    geo: crate::geometry::Geometry,
    segs: &crate::segments::Segments,
    seg: u32,
    format_id: u64,
    below: (u64, u64),
    f: &mut dyn FnMut(Rec),
) -> Result<()> {
    if seg == 0 || segs.state(seg) == Some(SegState::Free) {
        return Ok(());
    }
    let start = geo.segment_start(seg);
    for chunk in SegmentChunks::new(dev, geo, seg, format_id, below) {
        let (off, s) = chunk?;
        let mut k = 0u64;
        for e in &s.entries {
            f(Rec::of(s.epoch, e, start + off as u64 + 1 + k));
            k += u64::from(matches!(e, Entry::Data { .. }));
        }
    }
    Ok(())
}

/// Reads of mapped blocks in flight at once when verifying their data.
const VERIFY_DEPTH: usize = 32;
/// The longest run of adjacent blocks read as one (1 MiB).
const VERIFY_RUN_BLOCKS: usize = 256;

/// Blocks that may fail to read before the check stops: past that, the backing is
/// failing or gone (a device unplugged mid-check would otherwise name every block left,
/// one retry and one problem each), and the check could not check it.
const MAX_UNREADABLE: u64 = 1024;

/// Data verification of a batch of mapped blocks (at most a map page of them).
struct Verifier {
    /// (block, lba, crc32c the map gives) of each block to read.
    todo: Vec<(u64, u64, u32)>,
    buf: AlignedBuf,
    /// Blocks named so far as not reading.
    unreadable: u64,
}

impl Verifier {
    fn new() -> Self {
        Verifier {
            todo: Vec::with_capacity(PAGE_ENTRIES),
            buf: AlignedBuf::new(PAGE_ENTRIES * BLOCK_SIZE),
            unreadable: 0,
        }
    }

    /// Reads every block of `todo` (sorted by place; runs of adjacent blocks, at most
    /// [`VERIFY_RUN_BLOCKS`], as one read; [`VERIFY_DEPTH`] in flight), names in LBA
    /// order each that does not match its crc32c or does not read, and empties `todo`.
    /// Returns the blocks verified (read and checked). Past [`MAX_UNREADABLE`] blocks
    /// that do not read, the check ends with the error.
    fn run<D: BlockDevice>(&mut self, dev: &D, problems: &mut Vec<Problem>) -> Result<u64> {
        let todo = &mut self.todo;
        if todo.is_empty() {
            return Ok(0);
        }
        todo.sort_unstable();
        if todo.len() * BLOCK_SIZE > self.buf.len() {
            self.buf = AlignedBuf::new(todo.len() * BLOCK_SIZE);
        }
        // Runs: (first block, blocks). Two LBAs never map one block (check 4 names
        // that); a repeated block is read twice rather than joined.
        let mut runs: Vec<(u64, usize)> = Vec::new();
        for &(pba, _, _) in todo.iter() {
            match runs.last_mut() {
                Some((first, n)) if *first + *n as u64 == pba && *n < VERIFY_RUN_BLOCKS => *n += 1,
                _ => runs.push((pba, 1)),
            }
        }
        let mut rest: &mut [u8] = &mut self.buf;
        let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(runs.len());
        for &(first, n) in &runs {
            let (this, after) = rest.split_at_mut(n * BLOCK_SIZE);
            reqs.push((first * BLOCK_SIZE as u64, this));
            rest = after;
        }
        // Blocks that do not read (media errors), by block number, with the error.
        let mut unreadable: Vec<(u64, String)> = Vec::new();
        if dev.read_many_depth(&mut reqs, VERIFY_DEPTH).is_err() {
            // Which blocks fail: each run again on its own, a run that fails block by
            // block (the batch's error cannot say which). Each block that does not read
            // is named, and the others are still verified.
            for (at, buf) in reqs.iter_mut() {
                if dev.read_at(*at, buf).is_ok() {
                    continue;
                }
                for (k, blk) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
                    let b_at = *at + (k * BLOCK_SIZE) as u64;
                    if let Err(e) = dev.read_at(b_at, blk) {
                        self.unreadable += 1;
                        if self.unreadable > MAX_UNREADABLE {
                            return Err(crate::error::Error::io(
                                "check read (more than 1024 blocks do not read)",
                                b_at,
                                e,
                            ));
                        }
                        unreadable.push((b_at / BLOCK_SIZE as u64, e.to_string()));
                    }
                }
            }
        }
        let mut bad: Vec<(u64, Problem)> = todo
            .iter()
            .zip(self.buf.chunks(BLOCK_SIZE))
            .filter_map(|(&(pba, lba, crc), data)| {
                let detail = match unreadable.iter().find(|(b, _)| *b == pba) {
                    Some((_, e)) => Problem::new(
                        "data reads",
                        format!("lba {lba} (block {pba}) does not read: {e}"),
                    ),
                    None if crc32c::crc32c(data) != crc => Problem::new(
                        "data checksums",
                        format!("lba {lba} (block {pba}) does not match its crc32c"),
                    ),
                    None => return None,
                };
                Some((lba, detail))
            })
            .collect();
        bad.sort_by_key(|(lba, _)| *lba);
        problems.extend(bad.into_iter().map(|(_, p)| p));
        // The blocks read and checked (those that did not read are not).
        let n = todo
            .iter()
            .filter(|(pba, _, _)| !unreadable.iter().any(|(b, _)| b == pba))
            .count() as u64;
        todo.clear();
        Ok(n)
    }
}

/// Check 4's figures for one segment: from the map, the entries pointing into it and
/// the sum of their hashes; from its summaries, the entries whose block the map points at
/// and the sum of theirs.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    live: u32,
    map_sum: u64,
    covered: u32,
    summary_sum: u64,
}

/// A 64-bit hash of a (block, lba, crc32c) triple: splitmix64's finalizer, applied in
/// turn over the three.
fn entry_hash(pba: u64, lba: u64, crc: u32) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    mix(mix(mix(pba.wrapping_add(0x9e37_79b9_7f4a_7c15)) ^ lba) ^ u64::from(crc))
}

impl Problem {
    fn new(check: &'static str, detail: String) -> Self {
        Problem { check, detail }
    }
}

/// What the problems that stop the check advise.
const REBUILD: &str = " (if the index is lost or damaged, rebuild it from the log with \
                       `ftlblk check --rebuild-index`)";

/// Damage in the index itself, which stops the check where it is found: a problem, not
/// a failure to check. Other errors (I/O, a busy index) stay errors.
fn index_damage(e: crate::error::Error) -> Result<Problem> {
    use crate::error::Error;
    match e {
        Error::Corrupt(m) => Ok(Problem::new(
            "index records",
            format!("corrupt metadata: {m}{REBUILD}"),
        )),
        Error::IndexMismatch { why, .. } => Ok(Problem::new(
            "index records",
            format!("the index cannot serve this backing: {why}{REBUILD}"),
        )),
        e => Err(e),
    }
}

fn read_block<D: BlockDevice>(dev: &D, offset: u64) -> Result<AlignedBuf> {
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(offset, &mut b)
        .map_err(|e| crate::error::Error::io("check read", offset, e))?;
    Ok(b)
}
