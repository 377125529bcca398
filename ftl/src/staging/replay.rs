//! Replay of a dead process's staging area into the log (see the module docs, rule 4).
//!
//! Every slot still *sealed* holds a chunk whose write may not have completed: it is
//! sealed again from its recorded entries (same number, same bytes) and written. Every
//! slot still *open* with entries holds writes that completed but were never sealed: it
//! is sealed with the next numbers after the area's next-chunk mark, at the place it was
//! opened at (its stream's cursor, or the head of a segment that was free at the last
//! checkpoint), and written. The ordinary roll-forward then finds the chain complete,
//! and recovery syncs what it rolled forward before the open checkpoint names it
//! (recovery rule 1). A write that fails here marks the area (recovery rule 3).

use super::{AreaHeader, SlotState, StagedSlot, StagingArea};
use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::log::{chunk_capacity, seal, OpenChunk, SealParams};
use crate::stream::STREAMS;
use crate::summary::Entry;
use crate::superblock::Superblock;
use std::sync::Arc;

/// What replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StagedReport {
    /// Sealed chunks rewritten (their write may not have completed).
    pub sealed_chunks: u64,
    /// Open chunks sealed and written (completed writes that were only in memory).
    pub open_chunks: u64,
    /// Entries in those chunks.
    pub entries: u64,
    /// The area belonged to another format, session or boot and was ignored.
    pub ignored_stale: bool,
    /// The area was the checkpoint's session's, reset in this boot (both boot ids known),
    /// and that session saw no device write or sync fail: only the process died, and
    /// every chunk write that had not returned was in the area and is rewritten above.
    /// Every chunk of the log then reads back as it was written, and recovery takes a
    /// block that fails its checksum for damage, not for a write a power cut tore
    /// (recovery rule 3).
    pub same_boot: bool,
    /// The highest chunk number written (`None`: none): recovery checks that its
    /// roll-forward reached it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_chunk: Option<u64>,
}

/// Replays `area` into `dev` when it belongs to the session that wrote the checkpoint
/// recovery starts from (`ck_epoch`, chunks from `ck_next_chunk`, the session's number
/// `ck_session`, 0 when unknown).
pub fn replay<D: BlockDevice>(
    dev: &D,
    area: &Arc<StagingArea>,
    sb: &Superblock,
    ck_epoch: u64,
    ck_next_chunk: u64,
    ck_session: u32,
) -> Result<StagedReport> {
    let mut report = StagedReport::default();
    let slots: Vec<StagedSlot> = (0..area.slot_count() as u32)
        .map(|slot| area.read_slot(slot))
        .collect();
    match area.header() {
        // Rule 9: the area of another session with this uuid and epoch, a copy of this
        // backing's (0 on either side: an older build's, unknown). Its writes are that
        // copy's: refused before anything is written, and the area kept for that copy.
        AreaHeader::Owned(o)
            if o.uuid == sb.uuid
                && o.epoch == ck_epoch
                && o.session != 0
                && ck_session != 0
                && o.session != ck_session
                // Rule 5 first: another boot's area is a voided cache, whoever's.
                && !area.from_another_boot() =>
        {
            if holds_writes(&slots) {
                return Err(bad_area(
                    area,
                    format!(
                        "it holds completed writes of another copy of this backing (the same \
                         format uuid, session {:08x}; this index's is {ck_session:08x}): a \
                         server of that copy (a cloned image?) died with them. Serve that \
                         copy first (`ftlblk recover`, or `add` of its backing) so they reach \
                         it",
                        o.session
                    ),
                ));
            }
            report.ignored_stale = true;
            return Ok(report);
        }
        // Rule 5: not an area another boot left.
        AreaHeader::Owned(o)
            if o.uuid == sb.uuid && o.epoch == ck_epoch && !area.from_another_boot() => {}
        // Rule 8: a session newer than the checkpoint's: no open takes an area before its
        // session's checkpoint is durable (rule 4), so the index was rolled back (restored
        // from a copy). Ignoring the area dropped its completed writes without a word
        // (found by review, 2026-11-29), where log chunks of a newer session refuse the
        // open (`newer_than_index`).
        AreaHeader::Owned(o) if o.uuid == sb.uuid && o.epoch > ck_epoch && holds_writes(&slots) => {
            return Err(bad_area(
                area,
                format!(
                    "it holds writes of session {}, newer than the index's checkpoint \
                     (session {ck_epoch}): the index is older than the backing (restored \
                     from a copy?)",
                    o.epoch
                ),
            ));
        }
        AreaHeader::Owned(_) => {
            report.ignored_stale = true;
            return Ok(report);
        }
        // A fresh file, or a reset cut short (it frees every slot BEFORE it writes the
        // header): nothing to replay. A header that does not read over slots that hold
        // chunks is damage, and ignoring it would drop their completed writes.
        AreaHeader::Blank => {
            return match slots.iter().position(|s| s.state != SlotState::Free) {
                None => Ok(report),
                Some(slot) => Err(bad_area(
                    area,
                    format!(
                        "its header does not read (magic or checksum), but slot {slot} \
                         holds a chunk"
                    ),
                )),
            };
        }
        // It may hold writes of this backing that this build cannot replay: refuse
        // rather than start a session that makes them stale.
        AreaHeader::Foreign(why) => return Err(bad_area(area, why)),
    }
    // Rule 3 of recovery needs both: no reboot, and no device error that may have lost
    // writes that returned.
    report.same_boot = area.same_boot() && !area.device_error();
    let recorded_mark = area.next_chunk_mark();
    // Rule 8: the mark numbers the open slots. Below the checkpoint's next chunk, or out of any
    // sane range, it would number them where the roll-forward never looks, and their
    // completed writes would be lost with no error (the mark lies outside the header's
    // checksum; found by review, 2026-11-29). No session writes such a mark.
    let open_writes = slots.iter().any(open_with_writes);
    if open_writes && (recorded_mark < ck_next_chunk || crate::recovery::past_sane(recorded_mark)) {
        return Err(bad_area(
            area,
            format!(
                "its next-chunk mark {recorded_mark} is not a chunk number of the session \
                 (the checkpoint's next chunk is {ck_next_chunk})"
            ),
        ));
    }
    // Rule 2: a slot is sealed BEFORE the mark is raised past its number, so a process
    // that died in between left one sealed slot numbered exactly at the mark. Every
    // number handed out is below the mark so corrected.
    let mark = if slots
        .iter()
        .any(|s| s.state == SlotState::Sealed(recorded_mark))
    {
        recorded_mark.saturating_add(1)
    } else {
        recorded_mark
    };
    let mut chunks: Vec<(u64, u32, StagedSlot)> = Vec::new();
    let mut next_open = mark;
    for (slot, s) in slots.into_iter().enumerate() {
        let slot = slot as u32;
        match s.state {
            SlotState::Unknown(v) => {
                return Err(bad(
                    area,
                    slot,
                    format!("its state word {v} is none a slot takes"),
                ))
            }
            SlotState::Free => {}
            SlotState::Open if s.entries.is_empty() && s.damage.is_none() => {}
            SlotState::Open => {
                chunks.push((next_open, slot, s));
                next_open += 1;
            }
            // Below the checkpoint: its write completed before that checkpoint (rule 3),
            // and its segment may have been reused since. Never rewrite it.
            SlotState::Sealed(seq) if seq < ck_next_chunk => {}
            SlotState::Sealed(seq) if seq >= mark => {
                return Err(bad(
                    area,
                    slot,
                    format!("chunk {seq} beyond the mark {recorded_mark}"),
                ))
            }
            SlotState::Sealed(seq) => chunks.push((seq, slot, s)),
        }
    }
    chunks.sort_by_key(|c| c.0);
    let geo = &sb.geometry;
    let bps = geo.blocks_per_segment();
    // Every slot is validated before anything is written: a damaged area changes nothing.
    let mut valid = Vec::with_capacity(chunks.len());
    for (chunk_seq, slot, s) in chunks {
        if let Some(why) = &s.damage {
            return Err(bad(area, slot, why.clone()));
        }
        let p = s
            .place
            .ok_or_else(|| bad(area, slot, "its place record is damaged".into()))?;
        let data_blocks = s
            .entries
            .iter()
            .filter(|e| matches!(e, Entry::Data { .. }))
            .count();
        // Entries carry their own checksums, but a summary the roll-forward would refuse
        // ends the chain there and loses every acknowledged write behind it; and `seal`
        // failing below, after earlier chunks were written, would change the log (found
        // by review, 2026-11-27).
        if let Some(why) = crate::summary::entries_invalid(&s.entries) {
            return Err(bad(
                area,
                slot,
                format!("its entries cannot be logged: {why}"),
            ));
        }
        let capacity = chunk_capacity(bps, p.offset);
        if p.seg == 0
            || p.seg >= geo.segment_count
            || !geo.chunk_fits_at(p.offset)
            || p.start_pba != geo.segment_start(p.seg) + p.offset as u64
            || p.stream as usize >= STREAMS
            || data_blocks > capacity as usize
        {
            return Err(bad(
                area,
                slot,
                format!("its place {p:?} is outside the log"),
            ));
        }
        let buf = area
            .take(slot)
            .ok_or_else(|| bad(area, slot, "the slot is in use".into()))?;
        let open = OpenChunk {
            seg: p.seg,
            offset: p.offset,
            start_pba: p.start_pba,
            capacity: capacity as u16,
            data_blocks: data_blocks as u16,
            entries: s.entries,
            killed: Vec::new(),
            // Replayed entries are sealed by recovery, never left open for a FLUSH.
            moved: 0,
            buf,
        };
        valid.push((chunk_seq, p.stream, open));
    }
    let mut sealed_all = Vec::with_capacity(valid.len());
    for (chunk_seq, stream, open) in valid {
        report.entries += open.entries.len() as u64;
        let at = open.start_pba * BLOCK_SIZE as u64;
        let (seg, offset) = (open.seg, open.offset);
        let params = SealParams {
            chunk_seq,
            epoch: ck_epoch,
            format_id: sb.format_id(),
            stream,
            blocks_per_page: geo.blocks_per_page(),
            blocks_per_segment: bps,
        };
        let (sealed, _) = seal(open, &params)?;
        sealed_all.push((chunk_seq, at, seg, offset, sealed));
    }
    // Where a staged chunk goes, a chunk of a later session than the checkpoint's means
    // the index was restored from a copy: refused BEFORE anything is written, or the
    // replay wrote the dead session's chunk over the later one's flushed data (found by
    // review, 2026-11-29; recovery looks at the cursors and free heads too).
    for (_, at, seg, offset, sealed) in &sealed_all {
        let mut b = crate::device::AlignedBuf::new(sealed.bytes().len());
        dev.read_at(*at, &mut b)
            .map_err(|e| Error::io("staged chunk place read", *at, e))?;
        for (i, blk) in b.chunks(BLOCK_SIZE).enumerate() {
            if let Ok(Some(found)) = crate::summary::ChunkSummary::decode(blk) {
                if found.in_place(*seg, offset + i as u32, sb.format_id(), bps)
                    && found.epoch > ck_epoch
                    // Within the rebuild's gap of the bound: damage, as recovery
                    // takes it (`recovery::epoch_past_sane`).
                    && !crate::recovery::epoch_past_sane(found.epoch)
                {
                    return Err(bad_area(
                        area,
                        format!(
                            "its chunks go where the log holds a chunk of session {} \
                             (the index's checkpoint is of session {ck_epoch}): the index is \
                             older than the backing (restored from a copy?)",
                            found.epoch
                        ),
                    ));
                }
            }
        }
    }
    for (chunk_seq, at, _, _, sealed) in sealed_all {
        dev.write_at(at, sealed.bytes()).map_err(|e| {
            // Recovery rule 3: a failed device write marks the area.
            area.mark_device_error();
            Error::io("staged chunk write", at, e)
        })?;
        report.last_chunk = report.last_chunk.max(Some(chunk_seq));
        if chunk_seq >= mark {
            report.open_chunks += 1;
        } else {
            report.sealed_chunks += 1;
        }
    }
    // Rule 4: these chunks continue the chain the roll-forward follows next; recovery
    // syncs everything it rolled forward before the open checkpoint names it.
    Ok(report)
}

/// Whether `area` holds writes a replay would apply.
pub(crate) fn area_holds_writes(area: &Arc<StagingArea>) -> bool {
    let slots: Vec<StagedSlot> = (0..area.slot_count() as u32)
        .map(|slot| area.read_slot(slot))
        .collect();
    holds_writes(&slots)
}

/// Whether any slot holds writes a replay would apply (sealed, or open with entries).
fn holds_writes(slots: &[StagedSlot]) -> bool {
    slots
        .iter()
        .any(|s| matches!(s.state, SlotState::Sealed(_)) || open_with_writes(s))
}

/// Whether slot `s` is open with entries recorded (completed writes never sealed).
fn open_with_writes(s: &StagedSlot) -> bool {
    s.state == SlotState::Open && !s.entries.is_empty()
}

fn bad(area: &StagingArea, slot: u32, why: String) -> Error {
    bad_area(area, format!("slot {slot}: {why}"))
}

fn bad_area(area: &StagingArea, why: String) -> Error {
    let file = area
        .path()
        .map_or("in memory".to_string(), |p| p.display().to_string());
    Error::Corrupt(format!(
        "staging area ({file}): {why}; remove the file to open without the writes it holds"
    ))
}
