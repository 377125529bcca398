//! Format and open.
//!
//! Crash-ordering rules of `format`:
//! 1. the index is reset to an empty checkpoint (new uuid, epoch 0) BEFORE the log area
//!    is discarded and the superblocks are written: a format cut short leaves either the
//!    old superblock (whose uuid the index no longer matches: a clear error) or none;
//! 2. superblock copy B is written and synced BEFORE copy A, so at every instant at least
//!    one copy is whole.
//!
//! Rules of `open`:
//! 1. the superblock is validated; a damaged copy is repaired from the good one only
//!    AFTER recovery found the index to be this backing's (a refused open writes nothing
//!    to a backing that may no longer be ftlblk's);
//! 2. recovery rebuilds the state from the checkpoint and the log;
//! 3. a checkpoint with the new epoch is durable BEFORE any chunk of the session is
//!    written (see `recovery.rs` for why).
//!
//! Owns the superblock writes and the open sequence (superblock, recovery, the session's
//! first checkpoint). Called by users of the crate (`Ftl::open`, `format`) and the tools
//! (`backing`, `check`).

use crate::config::Config;
use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::engine::Ftl;
use crate::error::{Error, Result};
use crate::geometry::{
    FormatOptions, Geometry, MAX_FLASH_PAGE_BYTES, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES,
};
use crate::index::{IndexStore, Key, Op};
use crate::records::{CheckpointRecord, Counters};
use crate::recovery::{recover, RecoveryReport};
use crate::segments::Segments;
use crate::staging::{StagingArea, DEFAULT_SLOTS};
use crate::stream::STREAMS;
use crate::superblock::{SbDecode, Superblock, SB_VERSION};
use std::sync::Arc;

/// What `open` found and did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OpenReport {
    pub recovery: RecoveryReport,
    /// Problems repaired on the way (e.g. a damaged superblock copy).
    pub warnings: Vec<String>,
}

fn read_block<D: BlockDevice>(dev: &D, offset: u64) -> Result<AlignedBuf> {
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    dev.read_at(offset, &mut b)
        .map_err(|e| Error::io("superblock read", offset, e))?;
    Ok(b)
}

/// Reads and validates the superblock; names a damaged copy in the warnings. Never
/// writes: [`Ftl::open`] repairs the copy, once recovery found the index to be this
/// backing's (rule 1 of open, above).
pub fn read_superblock<D: BlockDevice>(dev: &D) -> Result<(Superblock, Vec<String>)> {
    read_superblock_inner(dev, false).map(|(sb, w, _)| (sb, w))
}

/// [`read_superblock`] under the name the offline checker and the tools that only look
/// have called it by (both never write).
pub fn read_superblock_readonly<D: BlockDevice>(dev: &D) -> Result<(Superblock, Vec<String>)> {
    read_superblock(dev)
}

/// Writes the superblock `sb` at `offset`: the copy [`read_superblock_inner`] found
/// damaged.
fn repair_superblock<D: BlockDevice>(dev: &D, sb: &Superblock, offset: Option<u64>) -> Result<()> {
    match offset {
        Some(off) => write_sb(dev, sb, off),
        None => Ok(()),
    }
}

/// The superblock, the warnings naming a damaged copy (`repair`: saying it will be
/// rewritten) and where the copy to rewrite is. Never writes.
fn read_superblock_inner<D: BlockDevice>(
    dev: &D,
    repair: bool,
) -> Result<(Superblock, Vec<String>, Option<u64>)> {
    let name = dev.describe();
    if dev.size() < 2 * BLOCK_SIZE as u64 {
        return Err(Error::NotFormatted(
            name,
            "device smaller than two blocks".into(),
        ));
    }
    let a = Superblock::decode(&read_block(dev, 0)?);
    // Copy B sits at the end of segment 0, where copy A's segment size puts it; without a
    // good copy A, or with one B does not match, every legal size is probed.
    let b = match &a {
        Ok(sa) => {
            let off = Geometry::superblock_offset(1, sa.geometry.segment_bytes);
            let at_a = (off < dev.size())
                .then(|| read_block(dev, off).map(|b| (off, Superblock::decode(&b))))
                .transpose()?;
            match &at_a {
                Some((_, Ok(sb))) if sb == sa => at_a,
                // A format cut short between its two writes with another segment size
                // wrote its copy B elsewhere and cleared this one (format clears the
                // places of other sizes): the newer copy is that format's. Looked for at
                // A's offset only, B was "repaired" from the old A and the open failed on
                // the index the format had reset (found by review, 2026-11-29). Only a
                // cleared place (no magic) sends the probe beyond segment 0 of A, into
                // A's log, where user data could look like a superblock; a copy there of
                // a newer version is refused.
                Some((_, Err(SbDecode::NoMagic))) | None => {
                    let probed = probe_copies_b(dev);
                    if let Some(e) = probed.newer {
                        return Err(refused(name, &e));
                    }
                    match probed.newest {
                        Some((o, sb)) if sb.created_secs > sa.created_secs => Some((o, Ok(sb))),
                        _ => at_a,
                    }
                }
                // A copy of a newer version at A's own place: a newer build's format cut
                // short (it writes B first), not damage to repair.
                Some((_, Err(e @ (SbDecode::Version(_) | SbDecode::Flags(_))))) => {
                    return Err(refused(name, e))
                }
                // Damaged (a magic with a bad checksum, another geometry): repaired from
                // A below.
                _ => at_a,
            }
        }
        Err(_) => {
            let probed = probe_copies_b(dev);
            // No copy found where a place did not read: that is an I/O error, not a
            // backing that never held ftlblk (its message offers `ftlblk format`, which
            // erases it; found by review, 2026-11-29).
            match (probed.newest, probed.read_error) {
                (None, Some(e)) => return Err(e),
                (found, _) => found.map(|(off, sb)| (off, Ok(sb))),
            }
        }
    };
    let mut warnings = Vec::new();
    let mut rewrite = None;
    let sb = match (a, b) {
        (Ok(sa), Some((_, Ok(sb)))) if sa == sb => sa,
        // Both whole but different: a format cut short between its two writes (format
        // rule 2 writes copy B first, after the index was reset to it). The newer one is
        // that format's, and copy A is completed from it; A won before, B was rewritten
        // back to the old format and the open failed on the index the format had reset
        // (found by review, 2026-11-29).
        (Ok(sa), Some((_, Ok(sb)))) if sb.created_secs > sa.created_secs => {
            warnings.push(format!(
                "superblock copy A was of an earlier format than copy B (a format cut short); \
                 {} from copy B",
                if repair { "rewritten" } else { "read-only: to be rewritten by the next open" }
            ));
            rewrite = Some(0);
            sb
        }
        // A copy of a newer version is not damage to repair from an older copy: an older
        // build rewrote it (it was taken for damaged before this arm).
        (Err(e @ (SbDecode::Version(_) | SbDecode::Flags(_))), _) => return Err(refused(name, &e)),
        (Ok(sa), other) => {
            let off = Geometry::superblock_offset(1, sa.geometry.segment_bytes);
            warnings.push(format!(
                "superblock copy B was damaged ({}); {} from copy A",
                describe(&other),
                if repair { "rewritten" } else { "read-only: to be rewritten by the next open" }
            ));
            rewrite = Some(off);
            sa
        }
        (Err(ea), Some((_, Ok(sb)))) => {
            warnings.push(format!(
                "superblock copy A was damaged ({}); {} from copy B",
                describe_err(&ea),
                if repair { "rewritten" } else { "read-only: to be rewritten by the next open" }
            ));
            rewrite = Some(0);
            sb
        }
        (Err(SbDecode::NoMagic), _) => {
            return Err(Error::NotFormatted(
                name,
                "no superblock: it is not an ftlblk backing (another format, or never \
                 formatted; `ftlblk format --backing ...` makes it one and erases it)"
                    .into(),
            ))
        }
        (Err(SbDecode::Corrupt(why)), _) => {
            return Err(Error::Corrupt(format!(
                "{name}: both superblock copies are damaged: {why}"
            )))
        }
    };
    if sb.geometry.flash_page_bytes > MAX_FLASH_PAGE_BYTES {
        return Err(Error::InvalidParameters(format!(
            "{name} was formatted with a flash page of {} bytes; this build supports at most \
             {MAX_FLASH_PAGE_BYTES} (its chunks do not fit the staging slots): reformat it",
            sb.geometry.flash_page_bytes
        )));
    }
    if dev.size() < sb.geometry.backing_bytes {
        return Err(Error::Shrunk {
            backing: name,
            formatted: sb.geometry.backing_bytes,
            now: dev.size(),
        });
    }
    Ok((sb, warnings, rewrite))
}

/// Every legal place of copy B (the end of segment 0 for each segment size) probed: the
/// newest whole copy whose segment size puts it where it was found, any copy a newer build
/// wrote, and the first place that did not read ([`ProbedB`]). Every legal size is probed and the
/// newest format's copy taken: an earlier format with smaller segments left its copy B
/// where no later format writes (format does not clear segment 0), and the first one
/// found "repaired" copy A with the old format (found by review, 2026-11-27).
fn probe_copies_b<D: BlockDevice>(dev: &D) -> ProbedB {
    let mut p = ProbedB::default();
    let mut seg = MIN_SEGMENT_BYTES;
    while seg <= MAX_SEGMENT_BYTES && seg <= dev.size() {
        let off = Geometry::superblock_offset(1, seg);
        // A block that does not read is no copy (the log may hold anything); the first
        // such error is kept.
        if off < dev.size() {
            match read_block(dev, off).map(|b| Superblock::decode(&b)) {
                Ok(Ok(sb)) => {
                    let newer = p
                        .newest
                        .as_ref()
                        .is_none_or(|(_, f)| sb.created_secs > f.created_secs);
                    if sb.geometry.segment_bytes == seg && newer {
                        p.newest = Some((off, sb));
                    }
                }
                Ok(Err(e @ (SbDecode::Version(_) | SbDecode::Flags(_)))) => p.newer = Some(e),
                Ok(Err(_)) => {}
                Err(e) => {
                    p.read_error.get_or_insert(e);
                }
            }
        }
        seg *= 2;
    }
    p
}

/// What [`probe_copies_b`] found.
#[derive(Default)]
struct ProbedB {
    /// The newest whole copy, where it was found.
    newest: Option<(u64, Superblock)>,
    /// A copy a newer build wrote (a version or flags this one does not know).
    newer: Option<SbDecode>,
    /// The first place that did not read.
    read_error: Option<Error>,
}

/// The refusal of a copy a newer build wrote (a version or flags this one does not know):
/// not damage to repair from an older copy.
fn refused(backing: String, e: &SbDecode) -> Error {
    match *e {
        SbDecode::Flags(flags) => Error::UnsupportedFeatures { backing, flags },
        SbDecode::Version(found) => Error::UnsupportedVersion {
            backing,
            found,
            supported: SB_VERSION,
        },
        _ => Error::Corrupt(format!("{backing}: superblock refused")),
    }
}

fn describe(b: &Option<(u64, std::result::Result<Superblock, SbDecode>)>) -> String {
    match b {
        None => "missing".into(),
        Some((_, Ok(_))) => "differs from copy A".into(),
        Some((_, Err(e))) => describe_err(e),
    }
}

fn describe_err(e: &SbDecode) -> String {
    match e {
        SbDecode::NoMagic => "no magic".into(),
        SbDecode::Corrupt(w) => w.clone(),
        SbDecode::Version(v) => format!("version {v}"),
        SbDecode::Flags(f) => format!("flags {f:#x}"),
    }
}

fn write_sb<D: BlockDevice>(dev: &D, sb: &Superblock, offset: u64) -> Result<()> {
    let mut b = AlignedBuf::new(BLOCK_SIZE);
    b.copy_from_slice(&sb.encode());
    dev.write_at(offset, &b)
        .map_err(|e| Error::io("superblock write", offset, e))?;
    dev.sync()
        .map_err(|e| Error::io("superblock sync", offset, e))
}

/// The checkpoint of a freshly formatted device.
fn initial_ops(sb: &Superblock) -> Vec<Op> {
    let geo = &sb.geometry;
    let mut ops: Vec<Op> = Segments::fresh_records(geo.segment_count)
        .iter()
        .map(|r| Op::Put(Key::segment(r.segment), r.encode()))
        .collect();
    let ck = CheckpointRecord {
        uuid: sb.uuid,
        epoch: 0,
        next_chunk_seq: 1,
        next_entry_seq: 1,
        exported_blocks: geo.exported_blocks,
        segment_count: geo.segment_count,
        session: 0,
        counters: Counters::default(),
        cursors: vec![None; STREAMS],
    };
    ops.push(Op::Put(Key::checkpoint(), ck.encode()));
    ops
}

fn new_uuid() -> [u8; 16] {
    let mut u: [u8; 16] = rand::random();
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// How much of each end of a backing [`foreign_data`] looks at.
const BLANK_PROBE_BYTES: u64 = 1 << 20;

/// Where `dev` holds data in its first or last MiB (where file systems, partition tables,
/// volume managers and disk images keep their signatures, and the ftlblk log its first
/// and last segments), or `None` when both read as zeros.
fn foreign_data<D: BlockDevice>(dev: &D) -> Result<Option<String>> {
    let size = dev.size() / BLOCK_SIZE as u64 * BLOCK_SIZE as u64;
    let probe = BLANK_PROBE_BYTES.min(size);
    let mut buf = AlignedBuf::new(probe as usize);
    for start in [0, size - probe] {
        dev.read_at(start, &mut buf)
            .map_err(|e| Error::io("blank probe", start, e))?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            return Ok(Some(format!("non-zero bytes at offset {}", start + i as u64)));
        }
    }
    Ok(None)
}

/// What [`format`] checks of `dev` before it changes anything, the index aside: the
/// geometry fits, and (unless `force`) `dev` holds neither an ftlblk format nor other
/// data ([`foreign_data`]). Returns the geometry.
pub fn formattable<D: BlockDevice>(dev: &D, opts: &FormatOptions, force: bool) -> Result<Geometry> {
    let geometry = Geometry::resolve(dev.size(), opts)?;
    if !force {
        match read_superblock_readonly(dev) {
            Err(Error::NotFormatted(..)) => {}
            // A place that does not read is said as such, not as "already formatted".
            Err(e @ Error::Io { .. }) => return Err(e),
            _ => return Err(Error::AlreadyFormatted(dev.describe())),
        }
        // Only a blank backing is formatted without `force` (found by review,
        // 2026-11-27: `add` of a mistyped path to a disk image formatted over it).
        if let Some(what) = foreign_data(dev)? {
            return Err(Error::ForeignData(dev.describe(), what));
        }
    }
    Ok(geometry)
}

/// Formats `dev` (and resets `index`). Refuses, unless `force`: an ftlblk-formatted
/// backing, one holding other data in its first or last MiB ([`foreign_data`]), and an
/// index holding a checkpoint (another backing's map, or this one's with its superblocks
/// lost).
pub fn format<D: BlockDevice, I: IndexStore>(
    dev: &D,
    index: &I,
    opts: &FormatOptions,
    force: bool,
) -> Result<Superblock> {
    let geometry = formattable(dev, opts, force)?;
    if !force {
        // A checkpoint of epoch 0 is a format's own, never opened: nothing was written
        // through it (a format that failed after its index commit, or was interrupted,
        // left one, and the next format refused the index for a backing that exists
        // nowhere; found by review, 2026-11-27).
        if let Some(ck) = index.reader().get(&Key::checkpoint())? {
            let ck = CheckpointRecord::decode(&ck);
            if ck.as_ref().map_or(true, |c| c.epoch > 0) {
                let uuid = ck
                    .map(|c| crate::superblock::uuid_string(&c.uuid))
                    .unwrap_or_else(|_| "of unknown uuid".into());
                return Err(Error::IndexInUse {
                    index: "the index".into(),
                    uuid,
                });
            }
        }
    }
    let created_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let sb = Superblock {
        uuid: new_uuid(),
        geometry,
        created_secs,
    };
    // Rule 1.
    index.clear()?;
    index.commit(initial_ops(&sb))?;
    if opts.discard_log {
        let log_start = geometry.segment_bytes;
        // Advisory: a device that cannot discard loses nothing by it.
        let _ = dev.discard(log_start, geometry.backing_bytes - log_start);
    }
    // An earlier format with other segments left its copy B where this one's is not:
    // inside this segment 0 (smaller segments), where nothing else writes, or in the log
    // (larger ones), empty at format. Cleared, so that a probe for copy B (copy A lost)
    // finds only this format's.
    let zero = AlignedBuf::new(BLOCK_SIZE);
    let mut seg = MIN_SEGMENT_BYTES;
    // Within the area this format takes (`--size` may leave the rest of the device to
    // something else: it zeroed blocks there; found by review, 2026-11-29).
    let area = geometry.backing_bytes;
    while seg <= MAX_SEGMENT_BYTES && seg <= area {
        let off = Geometry::superblock_offset(1, seg);
        if seg != geometry.segment_bytes && off + BLOCK_SIZE as u64 <= area {
            dev.write_at(off, &zero)
                .map_err(|e| Error::io("clearing an old superblock copy", off, e))?;
        }
        seg *= 2;
    }
    // Rule 2.
    write_sb(
        dev,
        &sb,
        Geometry::superblock_offset(1, geometry.segment_bytes),
    )?;
    write_sb(dev, &sb, 0)?;
    Ok(sb)
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Opens a formatted backing: validates, recovers, and starts a new epoch. The chunk
    /// buffers live in process memory (see [`Ftl::open_staged`]).
    pub fn open(dev: D, index: I, cfg: Config) -> Result<(Self, OpenReport)> {
        Self::open_staged(dev, index, cfg, StagingArea::in_memory(DEFAULT_SLOTS)?)
    }

    /// Opens with the chunk buffers in `staging`. When the area holds what a dead
    /// process of the last session had staged, recovery writes it to the log first, so
    /// every write that process completed survives.
    pub fn open_staged(
        dev: D,
        index: I,
        cfg: Config,
        staging: Arc<StagingArea>,
    ) -> Result<(Self, OpenReport)> {
        let (sb, mut warnings, rewrite) = read_superblock_inner(&dev, true)?;
        let (parts, recovery) = recover(dev, index, sb.clone(), cfg, "index", staging)?;
        // Rule 1 of open: a damaged superblock copy is rewritten only AFTER recovery found
        // the index to be this backing's (its checkpoint's uuid and geometry). Copy A
        // without a magic and a copy B found in segment 0 was "repaired" at once: a disk
        // given to another file system or volume manager since it held ftlblk (block 0
        // theirs, an old copy B left) lost its block 0 to an `add` that then failed on
        // the index (found by review, 2026-11-29).
        repair_superblock(&parts.dev, &sb, rewrite)?;
        if recovery.entries_corrupt > 0 {
            warnings.push(format!(
                "{} blocks written before the server died fail their checksum: damaged on \
                 the backing, they read as I/O errors (recovery rule 3)",
                recovery.entries_corrupt
            ));
        }
        let ftl = Ftl::from_parts(parts);
        ftl.start_session()?;
        Ok((ftl, OpenReport { recovery, warnings }))
    }
}
