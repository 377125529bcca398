//! Index rebuild from the log: the map and segment table recovered from the chunk
//! summaries alone, for a backing whose index is lost, corrupt or of another format
//! (`ftlblk check --rebuild-index`).
//!
//! Every chunk summary names its blocks' LBAs, entry sequence numbers and checksums, and
//! carries the TRIM records, so the log describes the whole device. Two passes over it:
//!
//! 1. **Survey** (the summaries alone): every segment walked with the walker recovery and
//!    relocation use (`chunks.rs`: this format, in place, each chunk newer than the one
//!    before it), its chunks counted and damage named, and each epoch's break found.
//! 2. **Scan** (the blocks each walk covers, one read a segment): every data block checked
//!    against its entry's crc32c (a block whose write never completed is skipped), and
//!    every record of a chunk before its epoch's break applied, data and TRIM alike: the
//!    newest record (epoch, entry number) of each LBA wins, and a relocated copy is just a
//!    newer record of the same data. "Newest wins" needs no order: each LBA keeps the
//!    newest record seen so far ([`Winners`], 24 bytes an LBA).
//!
//! When the winners of every LBA need more than [`RebuildOptions::memory`], the map is
//! built in slices of LBAs: the scan sorts the records into one spill bucket per slice
//! (32 bytes a record, files beside the index), and each slice is then reduced from its
//! bucket alone. With a spill directory, RAM stays within the budget, the segment-sized
//! read buffer and about a hundred bytes per segment (its record), whatever the size of
//! the device; the log is read once (plus its summaries), the spill written and read
//! once.
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
//! The rebuilt index is a checkpoint of a new epoch ([`EPOCH_GAP`] above every epoch the
//! walk found, so above every session the backing may hold a chunk of)
//! with every segment that holds a chunk closed and every stream cursor empty: the next
//! open replays nothing and writes into fresh segments. Counters (user bytes, WAF) start
//! again from zero; erase counts too, unless the old index's segment and free records can
//! still be read ([`erase_counts_of`]: the largest count each names is kept).
//!
//! Crash-ordering rule of a rebuild:
//! 1. the map pages and segment records are committed BEFORE the checkpoint record, in
//!    batches, into an index cleared first: a rebuild cut short leaves an index without
//!    a checkpoint, which every open refuses (pointing at the rebuild again). Test:
//!    `tests/rebuild.rs`, `a_rebuild_cut_short_leaves_no_checkpoint`. (The spill buckets
//!    are scratch: never synced, removed when done, and by the next rebuild if a crash
//!    left them.)
//!
//! Owns nothing after it returns. Called by `ftlblk check` and tests.

use crate::chunks::SegmentChunks;
use crate::device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::index::{IndexStore, Key, Op};
use crate::map::MapEntry;
use crate::records::{CheckpointRecord, Counters, SegState, SegmentRecord, PAGE_ENTRIES};
use crate::recovery::{epoch_past_sane, past_sane};
use crate::stream::STREAMS;
use crate::summary::{ChunkSummary, Entry};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

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
    /// Of `entries_skipped`: data blocks that fail their checksum.
    pub checksum_failures: u64,
    /// LBAs whose newest record in the log failed its checksum, rebuilt to their older
    /// copy or unmapped (a warning names them).
    pub older_copies: u64,
    /// Chunks whose summary holds an epoch or chunk number out of range (damage).
    pub chunks_out_of_range: u64,
    /// Chunks whose summary fails its checksum, walked past to the chunks after them
    /// (`SegmentChunks::resync`): their blocks are left out, since nothing says which
    /// LBAs they hold (each has a warning).
    pub chunks_damaged: u64,
    /// Chunks left out because a damaged summary before them in their segment ended
    /// its walk: the segment's first, or one out of range (each segment with some has a
    /// warning).
    pub chunks_hidden: u64,
    /// Chunks of a crashed session numbered past its break (never part of the log).
    pub chunks_past_break: u64,
    pub mapped_blocks: u64,
    /// The rebuilt checkpoint's epoch, next chain number and next entry number.
    pub epoch: u64,
    pub next_chunk_seq: u64,
    pub next_entry_seq: u64,
    /// Slices of the LBA range the map was built in, one after another (1: all at once;
    /// more when its winners need more than [`RebuildOptions::memory`]).
    pub slices: u32,
    /// Bytes of records sorted into the slices' spill buckets (0 with one slice).
    pub spilled_bytes: u64,
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

/// What a rebuild may use, and where it puts what does not fit in it.
#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// Map pages per index commit.
    pub batch: usize,
    /// Bytes of RAM for the newest record of each LBA ([`WINNER_BYTES`] per exported
    /// block). A device whose LBAs need more is rebuilt one slice of LBAs at a time: the
    /// second pass sorts the log's records into a spill bucket per slice, and each
    /// bucket is then reduced in turn.
    pub memory: u64,
    /// Where the spill buckets go: files in a directory of their own made in this one
    /// (removed when done, or on an error). `None`: in RAM, 32 bytes per record of the
    /// log, however many there are (tests, small devices).
    pub spill_dir: Option<PathBuf>,
    /// Erase counts by segment ([`erase_counts_of`]); segments past its end start at
    /// zero.
    pub wear: Vec<u32>,
    /// The least number the rebuilt session may take ([`EPOCH_GAP`]): `ftlblk check
    /// --rebuild-index` gives the wall clock in microseconds ([`clock_epoch_floor`]);
    /// tests give none (0), or their own.
    pub epoch_floor: u64,
}

/// The wall clock in microseconds since 1970, as a floor for a rebuilt session's number
/// ([`RebuildOptions::epoch_floor`]; 0 when the clock reads before 1970).
pub fn clock_epoch_floor() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How far past the newest walked session a rebuilt index's session is numbered. The
/// walk sees only chunks still in the log: a freed segment keeps the chunks of its last
/// use past its zeroed first block, and a staging area the session that wrote it, and
/// those may be of later sessions than any live chunk (everything a session wrote
/// overwritten or trimmed, and its segments freed). A session numbered below them would
/// take such a chunk, met where one of its streams goes on, for a newer log (the open
/// refused: "older than the log"), and a later rebuild would walk into it and hand its
/// data back (found by review, 2026-11-29). Sessions count opens: a device opened fewer
/// than 2^32 times has none this far past the newest walked. The same number keeps the
/// staging area of the lost index's last session (a killed server's) from being taken
/// for the rebuilt index's and replayed where no stream of it goes on.
///
/// After one rebuild, sessions count on from its number; a second rebuild whose walk
/// finds none of them (all freed, or only staged) would give the same number again. So
/// `ftlblk check --rebuild-index` also floors it at the wall clock in microseconds
/// ([`RebuildOptions::epoch_floor`]): a later rebuild is numbered past every session
/// opened since an earlier one (an open takes milliseconds), and within range (2^51
/// today, the bound is 2^62). Tests: `tests/rebuild.rs`,
/// `a_rebuilt_session_is_newer_than_the_chunks_freed_segments_keep`,
/// `a_rebuilt_index_does_not_replay_the_lost_sessions_staging_area`,
/// `a_second_rebuild_is_numbered_past_the_sessions_since_the_first`.
pub const EPOCH_GAP: u64 = 1 << 32;

/// Default of [`RebuildOptions::memory`]: one slice up to 22 Mi exported blocks (an 85
/// GiB device); a 15 TiB one in 180 slices.
pub const DEFAULT_REBUILD_MEMORY: u64 = 512 << 20;
/// RAM per LBA of a slice: the newest record's (epoch, entry number) and map entry.
pub const WINNER_BYTES: u64 = 24;
/// At most this many slices (one spill file each, all open at once during the scan).
pub const MAX_SLICES: u64 = 512;

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            batch: 64,
            memory: DEFAULT_REBUILD_MEMORY,
            spill_dir: None,
            wear: Vec::new(),
            epoch_floor: 0,
        }
    }
}

/// One log record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rec {
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
    pub(crate) lba: u64,
    /// Data: the physical block and its crc; trim: `u32::MAX` and the block count.
    pub(crate) pba: u32,
    pub(crate) crc_or_count: u32,
}

pub(crate) const TRIM_PBA: u32 = u32::MAX;

impl Rec {
    /// The record of summary entry `e` of a chunk of session `epoch`; a data entry's
    /// block is `pba` (a TRIM's is ignored).
    pub(crate) fn of(epoch: u64, e: &Entry, pba: u64) -> Rec {
        match *e {
            Entry::Data { lba, seq, crc } => Rec {
                epoch,
                seq,
                lba,
                pba: pba as u32,
                crc_or_count: crc,
            },
            Entry::Trim { lba, seq, count } => Rec {
                epoch,
                seq,
                lba,
                pba: TRIM_PBA,
                crc_or_count: count,
            },
        }
    }

    /// A spilled record:
    /// ```text
    /// 0        8        16       24    28           32
    /// | epoch  | seq    | lba    | pba | crc_or_count |   little-endian
    /// ```
    /// (scratch of one rebuild, never read by another build: no magic or checksum).
    pub(crate) const BYTES: usize = 32;

    fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..8].copy_from_slice(&self.epoch.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.lba.to_le_bytes());
        b[24..28].copy_from_slice(&self.pba.to_le_bytes());
        b[28..32].copy_from_slice(&self.crc_or_count.to_le_bytes());
        b
    }

    fn decode(b: &[u8; Self::BYTES]) -> Rec {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        Rec {
            epoch: u64_at(0),
            seq: u64_at(8),
            lba: u64_at(16),
            pba: u32_at(24),
            crc_or_count: u32_at(28),
        }
    }
}

/// The newest record of each LBA of one slice `[lo, lo + len)`: per LBA its epoch, its
/// entry number plus one (0: no record yet, so that every record beats it) and the map
/// entry it gives. Applying records in any order leaves what applying them in (epoch,
/// entry number) order leaves: the newest of each LBA wins, data or TRIM alike.
/// Allocated zeroed (the pages of LBAs no record names are never touched). Also the
/// offline checker's picture of what the log says (`check.rs`, check 8).
pub(crate) struct Winners {
    lo: u64,
    w: Vec<[u64; 3]>,
}

impl Winners {
    pub(crate) fn new(lo: u64, len: u64) -> Winners {
        Winners {
            lo,
            w: vec![[0u64; 3]; len as usize],
        }
    }

    pub(crate) fn apply(&mut self, r: &Rec) {
        let hi = self.lo + self.w.len() as u64;
        let (from, to, entry) = if r.pba == TRIM_PBA {
            let to = r.lba.saturating_add(r.crc_or_count as u64).min(hi);
            (r.lba.max(self.lo), to, MapEntry::UNMAPPED)
        } else {
            (r.lba, r.lba + 1, MapEntry::new(r.pba, r.crc_or_count))
        };
        // Outside the slice (a damaged TRIM may also name LBAs past the end).
        if from >= to || from < self.lo || to > hi {
            return;
        }
        let key = (r.epoch, r.seq + 1);
        for w in &mut self.w[(from - self.lo) as usize..(to - self.lo) as usize] {
            if key > (w[0], w[1]) {
                *w = [key.0, key.1, entry.0];
            }
        }
    }

    pub(crate) fn entry(&self, i: usize) -> MapEntry {
        match self.w[i] {
            [_, 0, _] => MapEntry::UNMAPPED,
            [_, _, e] => MapEntry(e),
        }
    }

    /// Whether some record names LBA `lo + i` (a TRIM too).
    pub(crate) fn named(&self, i: usize) -> bool {
        self.w[i][1] != 0
    }
}

/// The records of the scan sorted by slice, for a device whose winners do not fit in
/// [`RebuildOptions::memory`]. A TRIM over several slices is cut at their edges. Also
/// the checker's, for its check of the map against the log (`check.rs`, check 8).
pub(crate) struct Spill {
    slice_blocks: u64,
    exported: u64,
    buckets: Buckets,
    bytes: u64,
}

enum Buckets {
    Ram(Vec<Vec<u8>>),
    Files {
        dir: PathBuf,
        out: Vec<BufWriter<File>>,
    },
}

impl Spill {
    /// `dir`: a directory of its own is made in it (removed when the spill is dropped,
    /// whatever happened; nothing else there is touched). `writer_bytes`: the buffer of
    /// each bucket's file.
    pub(crate) fn new(
        slices: u64,
        slice_blocks: u64,
        exported: u64,
        dir: Option<&Path>,
        writer_bytes: usize,
    ) -> Result<Spill> {
        let mut spill = Spill {
            slice_blocks,
            exported,
            buckets: Buckets::Ram(vec![Vec::new(); slices as usize]),
            bytes: 0,
        };
        let Some(parent) = dir else {
            return Ok(spill);
        };
        let own = parent.join(format!("ftlblk-spill-{}", std::process::id()));
        let io = |p: &Path| {
            let path = p.to_path_buf();
            move |e| Error::Open { path, source: e }
        };
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        if own.exists() {
            std::fs::remove_dir_all(&own).map_err(io(&own))?;
        }
        std::fs::create_dir(&own).map_err(io(&own))?;
        // From here on, dropping the spill removes `own`, files made so far included.
        spill.buckets = Buckets::Files {
            dir: own,
            out: Vec::with_capacity(slices as usize),
        };
        if let Buckets::Files { dir, out } = &mut spill.buckets {
            for b in 0..slices {
                let path = Self::path(dir, b);
                let f = File::create(&path).map_err(io(&path))?;
                out.push(BufWriter::with_capacity(writer_bytes, f));
            }
        }
        Ok(spill)
    }

    fn path(dir: &Path, bucket: u64) -> PathBuf {
        dir.join(format!("slice-{bucket}"))
    }

    pub(crate) fn put(&mut self, r: Rec) -> Result<()> {
        if r.pba != TRIM_PBA {
            return self.write(r.lba / self.slice_blocks, &r);
        }
        let end = r
            .lba
            .saturating_add(r.crc_or_count as u64)
            .min(self.exported);
        let mut lba = r.lba;
        while lba < end {
            let b = lba / self.slice_blocks;
            let stop = ((b + 1) * self.slice_blocks).min(end);
            let piece = Rec {
                lba,
                crc_or_count: (stop - lba) as u32,
                ..r
            };
            self.write(b, &piece)?;
            lba = stop;
        }
        Ok(())
    }

    fn write(&mut self, bucket: u64, r: &Rec) -> Result<()> {
        self.bytes += Rec::BYTES as u64;
        match &mut self.buckets {
            Buckets::Ram(b) => b[bucket as usize].extend_from_slice(&r.encode()),
            Buckets::Files { dir, out } => {
                out[bucket as usize]
                    .write_all(&r.encode())
                    .map_err(|e| Error::Open {
                        path: Self::path(dir, bucket),
                        source: e,
                    })?
            }
        }
        Ok(())
    }

    /// Ends the scan: every bucket written out.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if let Buckets::Files { dir, out } = &mut self.buckets {
            for (b, w) in out.iter_mut().enumerate() {
                w.flush().map_err(|e| Error::Open {
                    path: Self::path(dir, b as u64),
                    source: e,
                })?;
            }
        }
        Ok(())
    }

    /// Feeds every record of `bucket` to `f`, then drops the bucket.
    pub(crate) fn drain(&mut self, bucket: u64, f: &mut dyn FnMut(&Rec)) -> Result<()> {
        let mut rec = [0u8; Rec::BYTES];
        match &mut self.buckets {
            Buckets::Ram(b) => {
                for r in std::mem::take(&mut b[bucket as usize]).chunks_exact(Rec::BYTES) {
                    rec.copy_from_slice(r);
                    f(&Rec::decode(&rec));
                }
            }
            Buckets::Files { dir, .. } => {
                let path = Self::path(dir, bucket);
                let io = |e| Error::Open {
                    path: path.clone(),
                    source: e,
                };
                let mut r = BufReader::with_capacity(1 << 20, File::open(&path).map_err(io)?);
                loop {
                    match r.read_exact(&mut rec) {
                        Ok(()) => f(&Rec::decode(&rec)),
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                        Err(e) => return Err(io(e)),
                    }
                }
                std::fs::remove_file(&path).map_err(io)?;
            }
        }
        Ok(())
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        if let Buckets::Files { dir, out } = &mut self.buckets {
            out.clear();
            // Scratch: what an error left behind goes too. Only the spill's own
            // directory (`Spill::new`).
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Where the scan's records go: the winners of every LBA at once, or the spill.
enum Sink {
    Whole(Winners),
    Spilled(Spill),
}

impl Sink {
    fn put(&mut self, r: Rec) -> Result<()> {
        match self {
            Sink::Whole(w) => {
                w.apply(&r);
                Ok(())
            }
            Sink::Spilled(s) => s.put(r),
        }
    }
}

/// Rebuilds `index` from the log on `dev` (see the module docs) with the default
/// options and `batch` map pages per commit. `index` is cleared first. The superblock
/// must be valid (the rebuild never reformats).
pub fn rebuild<D: BlockDevice, I: IndexStore>(
    dev: &D,
    index: &I,
    batch: usize,
    progress: &mut dyn RebuildProgress,
) -> Result<RebuildReport> {
    let opts = RebuildOptions {
        batch,
        ..RebuildOptions::default()
    };
    rebuild_with(dev, index, &opts, progress)
}

/// The erase counts the segment and free records of `old` (an index being replaced)
/// still name, by segment: the largest each segment has. Only from an index of this
/// backing: not when a checkpoint record of `old` decodes and names another backing
/// (whose segment numbers name other segments). When none decodes (the checkpoint record
/// damaged, a common reason to rebuild), the records are taken if every one that decodes
/// names a segment of this geometry, and there are no more segment records than
/// segments. Records that do not decode count nothing.
/// The wear history is what wear-aware allocation and static wear levelling balance; a
/// rebuild that dropped it made every segment look unworn (found by review, 2026-11-27;
/// with a damaged checkpoint record, again, 2026-11-29).
pub fn erase_counts_of<I: IndexStore>(old: &I, segments: u32, uuid: &[u8; 16]) -> Vec<u32> {
    erase_counts_read(old, segments, uuid).unwrap_or_else(|| vec![0; segments as usize])
}

/// [`erase_counts_of`], `None` when no record could be taken (none there, none of this
/// backing, none fitting), as a rebuild tells the user.
pub fn erase_counts_read<I: IndexStore>(
    old: &I,
    segments: u32,
    uuid: &[u8; 16],
) -> Option<Vec<u32>> {
    let mut counts = vec![0u32; segments as usize];
    let checkpoints: Vec<CheckpointRecord> = old
        .load_kind(Key::CHECKPOINT)
        .unwrap_or_default()
        .iter()
        .filter(|(k, _)| k.len() == 1)
        .filter_map(|(_, v)| CheckpointRecord::decode(v).ok())
        .collect();
    if checkpoints.iter().any(|c| &c.uuid != uuid) {
        return None;
    }
    let seg_records: Vec<SegmentRecord> = old
        .load_kind(Key::SEGMENT)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, v)| SegmentRecord::decode(v).ok())
        .collect();
    let free_records: Vec<crate::records::FreeRecord> = old
        .load_kind(Key::FREE)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, v)| crate::records::FreeRecord::decode(v).ok())
        .collect();
    if checkpoints.is_empty()
        && (seg_records.len() > segments as usize
            || seg_records.iter().any(|r| r.segment >= segments)
            || free_records.iter().any(|r| r.segment >= segments))
    {
        return None;
    }
    let mut note = |seg: u32, n: u32| {
        if let Some(c) = counts.get_mut(seg as usize) {
            *c = (*c).max(n);
        }
    };
    for r in &seg_records {
        note(r.segment, r.erase_count);
    }
    for r in &free_records {
        note(r.segment, r.erase_count);
    }
    (!seg_records.is_empty() || !free_records.is_empty()).then_some(counts)
}

/// What the first pass, over the summaries alone, finds.
struct Survey {
    /// Per segment, the blocks its walk covers (0: no chunk).
    ends: Vec<u32>,
    /// Per epoch, the first chain number of the epochs after it (the smallest).
    later_min: BTreeMap<u64, u64>,
    max_epoch: u64,
    max_chain: u64,
}

/// Pass 1: walks every segment's summaries (no data read), counting the chunks and
/// naming damage, and finds each epoch's break: the session after a crash continued the
/// chain from the break, so every chunk of epoch E numbered at or past the first number
/// of a later epoch lies past E's break.
fn survey<D: BlockDevice>(
    dev: &D,
    geo: Geometry,
    format_id: u64,
    report: &mut RebuildReport,
    progress: &mut dyn RebuildProgress,
) -> Result<Survey> {
    let n = geo.segment_count;
    let bps = geo.blocks_per_segment();
    let mut ends = vec![0u32; n as usize];
    let mut first_of: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut max_epoch, mut max_chain) = (0u64, 0u64);
    let mut one = AlignedBuf::new(BLOCK_SIZE);
    for seg in 1..n {
        progress.scanned(seg - 1, 2 * (n - 1));
        let mut any = false;
        // Where the walk ends, the last chunk in range it took, and whether the last
        // one it took was out of range (the walker then refuses every chunk after it).
        let (mut end, mut last, mut ended_out_of_range) = (0u32, None, false);
        let mut walk = SegmentChunks::new(dev, geo, seg, format_id, (u64::MAX, u64::MAX)).resync();
        for c in walk.by_ref() {
            let (off, s) = c?;
            any = true;
            end = off + s.total_blocks();
            // A checksummed summary with an impossible epoch or chunk number (recovery
            // refuses such counters): taken, it would win every LBA it names, and the
            // rebuilt checkpoint's counters would overflow or make every open refuse it
            // (found by review, 2026-11-27). The new checkpoint counts one past the
            // largest taken, which must itself be in range.
            ended_out_of_range = epoch_past_sane(s.epoch) || past_sane(s.chunk_seq);
            if ended_out_of_range {
                report.chunks_out_of_range += 1;
                continue;
            }
            last = Some((s.epoch, s.chunk_seq));
            report.chunks += 1;
            let first = first_of.entry(s.epoch).or_insert(s.chunk_seq);
            *first = (*first).min(s.chunk_seq);
            max_epoch = max_epoch.max(s.epoch);
            max_chain = max_chain.max(s.chunk_seq);
        }
        report.segments_with_chunks += any as u32;
        ends[seg as usize] = end;
        // Damaged summaries the walk went past: their chunks' blocks are lost (nothing
        // says which LBAs they hold), the chunks after them rebuilt.
        for &off in walk.damaged().iter().filter(|&&off| off < end) {
            report.chunks_damaged += 1;
            report.warnings.push(format!(
                "segment {seg}: the summary at block {off} fails its checksum: the blocks of \
                 its chunk were left out (their LBAs read older data or zeros); the chunks \
                 after it were rebuilt"
            ));
        }
        if end >= bps {
            continue;
        }
        // A damaged summary the walk could not go past ends it: one that carries the
        // magic but fails its checksum as the segment's first (nothing says which later
        // chunks are this use's), or one out of range (the walker refuses the chunks
        // after it). The chunks after it in this segment are not rebuilt (their LBAs
        // read older data, or none). Say so (found by review, 2026-11-27): later
        // summaries in place, in range and newer than the last taken. A walk that ended
        // at a block without the magic (a freed segment's zeroed head, a chunk past a
        // crash's break that recovery zeroed, the end of what was written) hid nothing.
        let at = (geo.segment_start(seg) + end as u64) * BLOCK_SIZE as u64;
        dev.read_at(at, &mut one)
            .map_err(|e| Error::io("rebuild read", at, e))?;
        let damaged_at_end = ChunkSummary::decode(&one).is_err();
        if !(damaged_at_end || ended_out_of_range) {
            continue;
        }
        let from = if ended_out_of_range { end } else { end + 1 };
        if from >= bps {
            continue;
        }
        let mut rest = AlignedBuf::new((bps - from) as usize * BLOCK_SIZE);
        let at = (geo.segment_start(seg) + from as u64) * BLOCK_SIZE as u64;
        dev.read_at(at, &mut rest)
            .map_err(|e| Error::io("rebuild read", at, e))?;
        let hidden = rest
            .chunks(BLOCK_SIZE)
            .zip(from..bps)
            .filter(|(block, k)| {
                ChunkSummary::decode(block).ok().flatten().is_some_and(|h| {
                    h.in_place(seg, *k, format_id, bps)
                        && !epoch_past_sane(h.epoch)
                        && !past_sane(h.chunk_seq)
                        && last.is_none_or(|l| (h.epoch, h.chunk_seq) > l)
                })
            })
            .count() as u64;
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
    let mut later_min: BTreeMap<u64, u64> = BTreeMap::new();
    let mut running = u64::MAX;
    for (&epoch, &first) in first_of.iter().rev() {
        later_min.insert(epoch, running);
        running = running.min(first);
    }
    Ok(Survey {
        ends,
        later_min,
        max_epoch,
        max_chain,
    })
}

/// What the second pass learns of each segment.
struct Facts {
    /// The stream of the segment's chunks (`None`: no chunk).
    stream: Vec<Option<u8>>,
    /// The smallest entry number of the segment's records (`u64::MAX`: none).
    opened: Vec<u64>,
    max_seq: u64,
    /// Data entries whose block fails its checksum, as `[lba, epoch, seq + 1]` (the
    /// winners' key), at most [`BAD_TRACKED`]: [`older_copies`] finds those that were
    /// their LBA's newest record.
    bad: Vec<[u64; 3]>,
}

/// Checksum failures [`Facts::bad`] keeps; past it they are counted, not named.
const BAD_TRACKED: usize = 1 << 16;

/// LBAs that LBA-range slice `w` maps to an older copy (or leaves unmapped) because their
/// newest record in the log is one of `bad`. A rebuild cannot tell a write that never
/// completed (its older copy is right: recovery does the same) from a damaged block of
/// data that was durable (the lost index would have read it as EIO): such LBAs are
/// named in the report's warnings instead of going by silently (found by review,
/// 2026-11-29).
fn older_copies(w: &Winners, bad: &[[u64; 3]], out: &mut Vec<u64>) {
    let hi = w.lo + w.w.len() as u64;
    for &[lba, epoch, key_seq] in bad {
        if lba < w.lo || lba >= hi {
            continue;
        }
        let won = w.w[(lba - w.lo) as usize];
        if (epoch, key_seq) > (won[0], won[1]) {
            out.push(lba);
        }
    }
}

/// Pass 2: reads each segment with chunks (the blocks its walk covers), checks every
/// data block against its entry's crc32c (a block whose write never completed is
/// skipped), and hands every record of a chunk before its epoch's break to `sink`.
fn scan<D: BlockDevice>(
    dev: &D,
    geo: Geometry,
    format_id: u64,
    survey: &Survey,
    report: &mut RebuildReport,
    progress: &mut dyn RebuildProgress,
    sink: &mut dyn FnMut(Rec) -> Result<()>,
) -> Result<Facts> {
    let n = geo.segment_count;
    let bps = geo.blocks_per_segment();
    let mut facts = Facts {
        stream: vec![None; n as usize],
        opened: vec![u64::MAX; n as usize],
        max_seq: 0,
        bad: Vec::new(),
    };
    let mut window = AlignedBuf::new(bps as usize * BLOCK_SIZE);
    let mut chunks = 0u64;
    for seg in 1..n {
        progress.scanned(n - 1 + seg - 1, 2 * (n - 1));
        let end = survey.ends[seg as usize];
        if end == 0 {
            continue;
        }
        // The block after the walk's end too: the walker looks at it to stop.
        let len = (end + 1).min(bps) as usize * BLOCK_SIZE;
        let at = geo.segment_start(seg) * BLOCK_SIZE as u64;
        dev.read_at(at, &mut window[..len])
            .map_err(|e| Error::io("rebuild read", at, e))?;
        let walk = SegmentChunks::new(dev, geo, seg, format_id, (u64::MAX, u64::MAX))
            .resync()
            .preloaded(&window[..len]);
        for c in walk {
            let (off, s) = c?;
            if epoch_past_sane(s.epoch) || past_sane(s.chunk_seq) {
                continue;
            }
            chunks += 1;
            let past_break = survey
                .later_min
                .get(&s.epoch)
                .is_some_and(|&m| s.chunk_seq >= m);
            report.chunks_past_break += past_break as u64;
            // A stream this build does not know (a newer format?): its segment could not
            // be recorded as holding live blocks. Refused here, before anything is
            // written to the index (the old rebuild found it only after building the
            // map, when a block of it won).
            if s.stream as usize >= STREAMS && !past_break {
                return Err(Error::Corrupt(format!(
                    "segment {seg} holds a chunk of stream {}, which this build does not know \
                     (written by a newer ftlblk?)",
                    s.stream
                )));
            }
            facts.stream[seg as usize] = Some(s.stream);
            let mut k = 0usize;
            for e in &s.entries {
                let r = match *e {
                    Entry::Data { lba, seq, crc } => {
                        let blk = off as usize + 1 + k;
                        k += 1;
                        let data = &window[blk * BLOCK_SIZE..(blk + 1) * BLOCK_SIZE];
                        if lba >= geo.exported_blocks || past_sane(seq) {
                            report.entries_skipped += !past_break as u64;
                            continue;
                        }
                        if crc32c::crc32c(data) != crc {
                            if !past_break {
                                report.entries_skipped += 1;
                                report.checksum_failures += 1;
                                if facts.bad.len() < BAD_TRACKED {
                                    facts.bad.push([lba, s.epoch, seq + 1]);
                                }
                            }
                            continue;
                        }
                        // Counted only when applied: a chunk past its epoch's break is
                        // not part of the log.
                        report.data_entries += !past_break as u64;
                        Rec::of(s.epoch, e, geo.segment_start(seg) + blk as u64)
                    }
                    Entry::Trim { seq, .. } if past_sane(seq) => {
                        report.entries_skipped += !past_break as u64;
                        continue;
                    }
                    Entry::Trim { .. } => {
                        report.trim_entries += !past_break as u64;
                        Rec::of(s.epoch, e, 0)
                    }
                };
                facts.max_seq = facts.max_seq.max(r.seq);
                let opened = &mut facts.opened[seg as usize];
                *opened = (*opened).min(r.seq);
                if !past_break {
                    sink(r)?;
                }
            }
        }
    }
    progress.scanned(2 * (n - 1), 2 * (n - 1));
    if chunks != report.chunks {
        return Err(Error::Corrupt(format!(
            "the log changed while the index was rebuilt: {} chunks on the first pass, {chunks} \
             on the second (is the backing in use?)",
            report.chunks
        )));
    }
    Ok(facts)
}

/// Map pages out of the winners, LBA after LBA: each page that maps a block is
/// committed (`batch` at a time), and the live blocks of each segment are counted.
struct PageOut<'a, I: IndexStore> {
    index: &'a I,
    geo: Geometry,
    batch: usize,
    ops: Vec<Op>,
    page_no: u64,
    page: Vec<u64>,
    mapped: bool,
    valid: Vec<u32>,
}

impl<'a, I: IndexStore> PageOut<'a, I> {
    fn new(index: &'a I, geo: Geometry, batch: usize) -> Self {
        PageOut {
            index,
            geo,
            batch,
            ops: Vec::new(),
            page_no: 0,
            page: vec![MapEntry::UNMAPPED.0; PAGE_ENTRIES],
            mapped: false,
            valid: vec![0; geo.segment_count as usize],
        }
    }

    fn slice(&mut self, w: &Winners) -> Result<()> {
        for i in 0..w.w.len() {
            let lba = w.lo + i as u64;
            let page = lba / PAGE_ENTRIES as u64;
            if page != self.page_no {
                self.end_page()?;
                self.page_no = page;
            }
            let e = w.entry(i);
            self.page[(lba % PAGE_ENTRIES as u64) as usize] = e.0;
            if let Some(pba) = e.pba() {
                self.mapped = true;
                if let Some(v) = self.valid.get_mut(self.geo.segment_of(pba as u64) as usize) {
                    *v += 1;
                }
            }
        }
        Ok(())
    }

    fn end_page(&mut self) -> Result<()> {
        if self.mapped {
            let page = std::mem::replace(&mut self.page, vec![MapEntry::UNMAPPED.0; PAGE_ENTRIES]);
            self.ops
                .push(crate::engine::checkpoint::page_op((self.page_no, page)));
            if self.ops.len() >= self.batch {
                self.index.commit(std::mem::take(&mut self.ops))?;
            }
        } else {
            self.page.fill(MapEntry::UNMAPPED.0);
        }
        self.mapped = false;
        Ok(())
    }
}

/// [`rebuild`] with `opts`: the map in slices of at most `opts.memory` (spilling the
/// records to `opts.spill_dir` when there is more than one), each segment's erase count
/// from `opts.wear`.
pub fn rebuild_with<D: BlockDevice, I: IndexStore>(
    dev: &D,
    index: &I,
    opts: &RebuildOptions,
    progress: &mut dyn RebuildProgress,
) -> Result<RebuildReport> {
    let (sb, warnings) = crate::lifecycle::read_superblock_readonly(dev)?;
    let geo = sb.geometry;
    let format_id = sb.format_id();
    let mut report = RebuildReport {
        segments: geo.segment_count,
        warnings,
        ..Default::default()
    };
    let blocks = geo.exported_blocks;
    let slice_blocks = (opts.memory / WINNER_BYTES).clamp(1, blocks.max(1));
    let slices = blocks.div_ceil(slice_blocks).max(1);
    if slices > MAX_SLICES {
        return Err(Error::InvalidParameters(format!(
            "{} bytes of rebuild memory would take {slices} slices of the {blocks} blocks \
             (at most {MAX_SLICES}): give at least {}",
            opts.memory,
            blocks.div_ceil(MAX_SLICES) * WINNER_BYTES
        )));
    }
    report.slices = slices as u32;

    let survey = survey(dev, geo, format_id, &mut report, progress)?;
    let mut sink = if slices == 1 {
        Sink::Whole(Winners::new(0, blocks))
    } else {
        // The files' buffers within the budget too (64 KiB each at most, 4 KiB at least).
        let writer_bytes = (opts.memory / (2 * slices)).clamp(4 << 10, 64 << 10) as usize;
        Sink::Spilled(Spill::new(
            slices,
            slice_blocks,
            blocks,
            opts.spill_dir.as_deref(),
            writer_bytes,
        )?)
    };
    let facts = scan(
        dev,
        geo,
        format_id,
        &survey,
        &mut report,
        progress,
        &mut |r| sink.put(r),
    )?;
    if let Sink::Spilled(s) = &mut sink {
        s.finish()?;
        report.spilled_bytes = s.bytes;
    }

    // Rule 1: the index cleared, then the map pages and segment records, the checkpoint
    // last.
    index.clear()?;
    let mut out = PageOut::new(index, geo, opts.batch.max(1));
    let mut older = Vec::new();
    match &mut sink {
        Sink::Whole(w) => {
            older_copies(w, &facts.bad, &mut older);
            out.slice(w)?
        }
        Sink::Spilled(s) => {
            for b in 0..slices {
                let lo = b * slice_blocks;
                let mut w = Winners::new(lo, slice_blocks.min(blocks - lo));
                s.drain(b, &mut |r| w.apply(r))?;
                older_copies(&w, &facts.bad, &mut older);
                out.slice(&w)?;
            }
        }
    }
    drop(sink);
    older.sort_unstable();
    older.dedup();
    report.older_copies = older.len() as u64;
    if !older.is_empty() {
        const NAMED: usize = 16;
        let names: Vec<String> = older.iter().take(NAMED).map(u64::to_string).collect();
        report.warnings.push(format!(
            "{} LBA(s) read as an older copy, or unmapped, because their newest copy in the \
             log fails its checksum: a write that never completed (then this is right), or \
             a damaged block (then its data is lost and the older copy is stale): LBA {}{}{}",
            older.len(),
            names.join(", "),
            if older.len() > NAMED { " ..." } else { "" },
            if report.checksum_failures > BAD_TRACKED as u64 {
                " (only the first 65536 checksum failures were looked at)"
            } else {
                ""
            }
        ));
    }
    out.end_page()?;
    let valid = std::mem::take(&mut out.valid);
    let mut ops = std::mem::take(&mut out.ops);

    report.mapped_blocks = valid.iter().map(|&v| v as u64).sum();
    // Above every session the device may have run, not only those the walk met: see
    // [`EPOCH_GAP`].
    report.epoch = (survey.max_epoch + EPOCH_GAP).max(opts.epoch_floor);
    if past_sane(report.epoch) {
        return Err(Error::InvalidParameters(format!(
            "the rebuilt session's number {} is out of range (epoch floor {})",
            report.epoch, opts.epoch_floor
        )));
    }
    report.next_chunk_seq = survey.max_chain + 1;
    report.next_entry_seq = facts.max_seq + 1;

    let records: Vec<SegmentRecord> = (0..geo.segment_count)
        .map(|s| {
            let i = s as usize;
            let (state, stream) = match (s, facts.stream[i]) {
                (0, _) => (SegState::Closed, 0),
                (_, Some(stream)) if (stream as usize) < STREAMS => (SegState::Closed, stream),
                _ => (SegState::Free, 0),
            };
            SegmentRecord {
                segment: s,
                state,
                stream,
                erase_count: opts.wear.get(i).copied().unwrap_or(0),
                opened_seq: if facts.opened[i] == u64::MAX {
                    0
                } else {
                    facts.opened[i]
                },
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
        // No session owns a staging area from here: the next open starts one.
        session: 0,
        counters: Counters::default(),
        cursors: vec![None; STREAMS],
    };
    ops.extend(
        records
            .iter()
            .map(|r| Op::Put(Key::segment(r.segment), r.encode())),
    );
    index.commit(ops)?;
    // Rule 1: the checkpoint record last.
    index.commit(vec![Op::Put(Key::checkpoint(), header.encode())])?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(epoch: u64, seq: u64, lba: u64, pba: u32) -> Rec {
        Rec {
            epoch,
            seq,
            lba,
            pba,
            crc_or_count: pba ^ 0xabcd,
        }
    }

    fn trim(epoch: u64, seq: u64, lba: u64, count: u32) -> Rec {
        Rec {
            epoch,
            seq,
            lba,
            pba: TRIM_PBA,
            crc_or_count: count,
        }
    }

    fn entries(w: &Winners) -> Vec<Option<u32>> {
        (0..w.w.len()).map(|i| w.entry(i).pba()).collect()
    }

    #[test]
    fn the_newest_record_of_each_lba_wins_in_any_order() {
        let recs = [
            data(1, 0, 2, 100),
            data(1, 5, 2, 101),
            trim(1, 6, 1, 3),
            data(1, 7, 3, 102),
            data(2, 0, 1, 103),
            data(1, 9, 0, 104),
            trim(2, 1, 0, 1),
            data(3, 0, 4, 105),
        ];
        let want = vec![None, Some(103), None, Some(102), Some(105), None];
        let mut orders = vec![recs.to_vec()];
        orders.push(recs.iter().rev().copied().collect());
        let mut shuffled = recs.to_vec();
        shuffled.swap(0, 5);
        shuffled.swap(2, 7);
        orders.push(shuffled);
        for order in orders {
            let mut w = Winners::new(0, 6);
            order.iter().for_each(|r| w.apply(r));
            assert_eq!(entries(&w), want, "{order:?}");
        }
        // Sequence number 0 of epoch 0 still beats "no record".
        let mut w = Winners::new(0, 1);
        w.apply(&data(0, 0, 0, 7));
        assert_eq!(entries(&w), vec![Some(7)]);
    }

    #[test]
    fn a_slice_takes_only_its_own_lbas() {
        let mut w = Winners::new(10, 5);
        w.apply(&data(1, 1, 9, 1));
        w.apply(&data(1, 2, 15, 2));
        w.apply(&data(1, 3, 12, 3));
        w.apply(&data(1, 4, 14, 4));
        // A TRIM over the slice's start, and ones past it or past the device's end.
        w.apply(&trim(1, 5, 8, 3));
        w.apply(&trim(1, 6, 15, 4));
        w.apply(&trim(1, 7, u64::MAX - 2, u32::MAX));
        assert_eq!(entries(&w), vec![None, None, Some(3), None, Some(4)]);
        w.apply(&trim(1, 8, 13, 9));
        assert_eq!(entries(&w), vec![None, None, Some(3), None, None]);
    }

    #[test]
    fn spilled_records_read_back_as_written_and_trims_are_cut_at_slice_edges() {
        let mut s = Spill::new(3, 4, 11, None, 4096).unwrap();
        let d = data(7, u64::MAX / 8, 5, 0xdead_beef);
        s.put(d).unwrap();
        s.put(trim(2, 3, 2, 100)).unwrap();
        let mut got: Vec<Vec<(u64, u64, u32, u32)>> = vec![Vec::new(); 3];
        for (b, out) in got.iter_mut().enumerate() {
            s.drain(b as u64, &mut |r| {
                out.push((r.lba, r.seq, r.pba, r.crc_or_count))
            })
            .unwrap();
        }
        assert_eq!(
            got,
            vec![
                vec![(2, 3, TRIM_PBA, 2)],
                vec![
                    (5, u64::MAX / 8, 0xdead_beef, 0xdead_beef ^ 0xabcd),
                    (4, 3, TRIM_PBA, 4)
                ],
                vec![(8, 3, TRIM_PBA, 3)],
            ]
        );
        assert_eq!(s.bytes, 4 * Rec::BYTES as u64);
    }
}
