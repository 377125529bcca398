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
//!    for each time it was freed since the checkpoint).
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
use crate::records::{SegState, PAGE_ENTRIES};
use crate::recovery::{load_index, load_map_pages, recover};
use crate::summary::Entry;
use std::collections::HashMap;

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
    // 2 + 3. Index records and the checkpoint snapshot.
    let loaded = load_index(&index, &sb, "index")?;
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
    for (k, _) in index.load()? {
        if !k
            .first()
            .is_some_and(|c| crate::index::Key::KINDS.contains(c))
        {
            problems.push(Problem::new(
                "index records",
                format!("unknown index key {k:02x?}"),
            ));
        }
    }
    let mut counts = vec![0u32; geo.segment_count as usize];
    for p in &load_map_pages(&index, &sb)? {
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
        Err(e) => return Err(e),
    };
    report.chunks_replayed = rec.chunks_replayed;
    report.staged = rec.staged;
    // Chunks recovery accepted: every earlier epoch's, and this one's below the break.
    let below = (parts.epoch - 1, parts.next_chunk_seq);
    let format_id = sb.format_id();
    let map = &parts.map;
    let segs = &parts.segs;
    // Block -> the LBA and checksum its summary entry names.
    let mut summary_lba: HashMap<u64, (u64, u32)> = HashMap::new();
    for seg in 1..geo.segment_count {
        let state = segs.state(seg);
        if state == Some(SegState::Free) {
            report.free_segments += 1;
            continue;
        }
        let start = geo.segment_start(seg);
        for chunk in SegmentChunks::new(&dev, geo, seg, format_id, below) {
            let (off, s) = chunk?;
            let mut k = 0u64;
            for e in &s.entries {
                if let Entry::Data { lba, crc, .. } = *e {
                    summary_lba.insert(start + off as u64 + 1 + k, (lba, crc));
                    k += 1;
                }
            }
        }
    }
    let mut live = vec![0u32; geo.segment_count as usize];
    let mut data = AlignedBuf::new(BLOCK_SIZE);
    for (lba, e) in map.mapped()? {
        report.mapped_blocks += 1;
        let Some(pba) = e.pba() else { continue };
        let pba = pba as u64;
        let seg = geo.segment_of(pba);
        live[seg as usize] += 1;
        match segs.state(seg) {
            Some(SegState::Free) => problems.push(Problem::new(
                "map",
                format!("lba {lba} maps into free segment {seg}"),
            )),
            None => problems.push(Problem::new(
                "map",
                format!("lba {lba} maps past the backing"),
            )),
            _ => {}
        }
        match summary_lba.get(&pba) {
            // The checksum too: a map entry whose crc is not its block's reads as EIO
            // (without data verification nothing else would notice; found by review,
            // 2026-11-27).
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
        if verify_data {
            dev.read_at(pba * BLOCK_SIZE as u64, &mut data)
                .map_err(|er| crate::error::Error::io("check read", pba * BLOCK_SIZE as u64, er))?;
            report.blocks_verified += 1;
            if crc32c::crc32c(&data) != e.crc() {
                problems.push(Problem::new(
                    "data checksums",
                    format!("lba {lba} (block {pba}) does not match its crc32c"),
                ));
            }
        }
    }
    // 6. Live counts after replay, and open segments.
    for seg in 1..geo.segment_count {
        let recorded = segs.valid(seg);
        if recorded != live[seg as usize] {
            problems.push(Problem::new(
                "segment live counts",
                format!(
                    "segment {seg}: {recorded} counted, {} mapped",
                    live[seg as usize]
                ),
            ));
        }
        if segs.state(seg) == Some(SegState::Open)
            && !parts.cursors.iter().flatten().any(|c| c.0 == seg)
        {
            // Open without a cursor: the stream filled it (it closes on the next open).
            if live[seg as usize] == 0 {
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

impl Problem {
    fn new(check: &'static str, detail: String) -> Self {
        Problem { check, detail }
    }
}

fn read_block<D: BlockDevice>(dev: &D, offset: u64) -> Result<AlignedBuf> {
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(offset, &mut b)
        .map_err(|e| crate::error::Error::io("check read", offset, e))?;
    Ok(b)
}
