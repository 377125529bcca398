//! The staging area: chunk buffers that survive the death of the server process.
//!
//! ## Why
//! A write completes as soon as it is copied into its stream's open chunk; the chunk
//! reaches the backing later (when full, or on FLUSH/FUA). Losing such a write in a
//! *power cut* is allowed (the device advertises a volatile cache). Losing it when only
//! the *server process* dies is not: with ublk user recovery the kernel, its page cache
//! and the file system live on, the next server re-attaches, and a FLUSH re-issued to it
//! would succeed although the writes it covers vanished with the old process. So every
//! chunk buffer lives here: in memory for tests and in-process use, or in a file on
//! tmpfs (`/run`) shared-mapped by the server. A file on tmpfs survives a `kill -9` and
//! is gone after a power cut: exactly the lifetime of a disk's volatile cache.
//!
//! ## Contract
//! Every entry appended to an open chunk is recorded in its slot's metadata before the
//! append returns; every sealed chunk keeps its slot marked *sealed* until its device
//! write has completed. [`replay`] (run by recovery, before the log scan) seals what was
//! open and writes every staged chunk to its place in the log, so the ordinary roll-forward
//! finds every completed write of the dead process.
//!
//! Crash-ordering rules (process death can strike between any two steps):
//! 1. a block's data is copied into the slot BEFORE its entry is recorded, and the entry
//!    is complete BEFORE the slot's entry count covers it (release store): replay never
//!    sees an entry without its data;
//! 2. a chunk number is stored in its slot, the slot marked sealed, and only THEN the
//!    area's next-chunk mark raised past it ([`SEAL_STEPS`]), all under the tracker lock
//!    that hands the number out: no other thread can write chunk N+1 while N is known to
//!    nobody but a dying thread, and a death between any two steps leaves either an open
//!    slot with the mark at N (replay numbers it N) or a sealed slot N with the mark at N
//!    (replay takes the mark past it). Test: `staging/tests.rs`,
//!    `a_death_between_any_two_sealing_stores_loses_no_completed_write`;
//! 3. a slot is marked free only AFTER its chunk's device write completed and BEFORE the
//!    tracker learns it (so no checkpoint can free the segment while replay would still
//!    rewrite the slot there);
//! 4. replay writes every staged chunk BEFORE the log scan, so the roll-forward applies
//!    them (and recovery syncs them, with the rest it rolled forward, BEFORE the open
//!    checkpoint names them); the area is reset for the new session only AFTER that
//!    checkpoint committed (a crash in between replays the same slots again, with the
//!    same bytes);
//! 5. an area reset in another boot of the machine is ignored: it is the image of a
//!    volatile cache that a power cut (or any reboot) voided. On tmpfs the file is gone
//!    after a reboot anyway; elsewhere (`FTLBLK_RUN_DIR` on a disk, a container whose
//!    `/run` is not tmpfs) a stale copy of it survived, and replaying its slots wrote
//!    chunks older than the FLUSH-acknowledged ones at the same places over them (found
//!    by review, 2026-11-27). Test: `process_crash::an_area_from_another_boot_is_ignored`;
//! 6. (see [`StagingArea::reset`]) a reset frees every slot BEFORE it writes the header
//!    ([`RESET_STEPS`]). Test: `a_death_between_a_resets_steps_loses_nothing`;
//! 7. a slot given up while it still holds writes a replay needs (sealed, or open with
//!    entries) is kept out of use until the next reset, handed only to replay. Test:
//!    `a_slot_whose_seal_failed_is_not_handed_out_again`;
//! 8. replay refuses a next-chunk mark (outside the header's checksum) below the
//!    checkpoint's next chunk or out of range while open slots hold writes, and an area
//!    of a session newer than the checkpoint holding writes; recovery refuses an open
//!    whose roll-forward stopped short of the last chunk replayed. Tests:
//!    `a_next_chunk_mark_below_the_checkpoint_refuses_the_open`,
//!    `staged_chunks_the_roll_forward_does_not_reach_refuse_the_open`,
//!    `an_area_newer_than_the_index_refuses_the_open`;
//! 9. replay takes an area only from the session that wrote the checkpoint it starts
//!    from: its session's random number (in every checkpoint, and in the header by the
//!    reset) must be the checkpoint's. Copies of a backing (a cloned image) share its
//!    uuid, their epochs can be equal, and the staging file is named by the uuid: a
//!    copy served after another copy's server died took that server's writes for its
//!    own and wrote them into its log (found by review, 2026-11-29). An area of another
//!    session holding writes refuses the open before anything is written (those writes
//!    are the other copy's, and the reset of this open would lose them); an empty one is
//!    stale. Test: `another_copys_area_refuses_the_open_and_is_kept`. Not covered: an
//!    area of an earlier session is taken for this backing's own stale one (an open
//!    that died between its checkpoint and its reset, or a tool that opened the backing
//!    without the file, leaves one), so a copy opened more often than the one whose
//!    server died resets the dead server's area, and its unflushed writes are lost for
//!    that copy. Telling the two apart by the open slots' chunks in the log (tried)
//!    refused the open after `--rebuild-index` and after such a tool's open; a
//!    checkpoint naming the session before it would, and is not built. (Copies with
//!    one uuid are never served at once: the file's lock refuses the second.)
//!
//! ## Layout (little-endian; the file is `4096 + slots * SLOT_BYTES` bytes)
//! ```text
//! area header, 4096 bytes
//!   0  [u8; 8]  magic "FTLSTAGE"
//!   8  u16      version (2)
//!  10  u16      reserved (0)
//!  12  u32      slot count
//!  16  [u8; 16] uuid of the backing's format
//!  32  u64      epoch of the session that owns the area
//!  40  u32      SLOT_BYTES
//!  44  u32      crc32c of bytes 0..44
//!  48  u64      next-chunk mark: every chunk number handed out is below it (atomic)
//!  56  [u8; 16] boot id of the machine when the area was reset (`/proc/sys/kernel/
//!               random/boot_id`; zero: unknown, as an older build left it), outside
//!               the crc: rule 5
//!  72  u32      device error: non-zero once a device write or sync failed in the
//!               owning session (zero from an older build), outside the crc; recovery
//!               rule 3 then takes a block that fails its checksum for one the device
//!               lost, not for damage
//!  76  u32      the owning session's random number, as its checkpoints carry it (rule
//!               9; zero: unknown, as an older build left it)
//!  80  u32      crc32c of bytes 76..80 (a mismatch reads as unknown)
//!  84  ...      zero
//! slot i at 4096 + i * SLOT_BYTES:
//!   meta, 8192 bytes
//!     0  u32  state: 0 free, 1 open, 2 sealed (atomic)
//!     4  u32  entries recorded (atomic)
//!     8  u64  chunk number (valid when sealed)
//!    16  u32  segment
//!    20  u32  block offset of the chunk in the segment
//!    24  u64  physical block of the chunk (its summary)
//!    32  u8   stream, then 3 zero bytes
//!    36  u32  crc32c of bytes 16..36
//!    40  ...  zero up to 64
//!    64 + 24 * k: entry k
//!          0 u64 LBA (| TRIM_FLAG for a trim), 8 u64 entry sequence,
//!         16 u32 data crc32c (data) or block count (trim), 20 u32 crc32c of bytes 0..20
//!   chunk buffer, CHUNK_BUF_BYTES: the summary block then the data blocks, as written
//! ```

mod region;
mod replay;

pub(crate) use replay::area_holds_writes;
pub use replay::{replay, StagedReport};

use crate::codec::Reader;
use crate::device::BLOCK_SIZE;
use crate::error::{Error, Result};
use crate::geometry::MAX_FLASH_PAGE_BYTES;
use crate::summary::{Entry, MAX_CHUNK_DATA, MAX_ENTRIES, TRIM_FLAG};
use crate::sync::{lock, wait_timeout, Condvar, Mutex};
use region::Region;
use std::path::{Path, PathBuf};
// The slot and header atomics live in the (possibly shared) mapping: always std's.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Blocks of a chunk buffer: summary + the largest data payload, padded to the largest
/// flash page (sealing zero-fills up to the page end inside the buffer).
pub const CHUNK_BUF_BLOCKS: usize =
    (1 + MAX_CHUNK_DATA).next_multiple_of(MAX_FLASH_PAGE_BYTES as usize / BLOCK_SIZE);
/// Bytes of a chunk buffer.
pub const CHUNK_BUF_BYTES: usize = CHUNK_BUF_BLOCKS * BLOCK_SIZE;
/// Bytes of a slot's metadata (header + entry table).
pub const SLOT_META_BYTES: usize = 8192;
/// Bytes of one slot: metadata then chunk buffer.
pub const SLOT_BYTES: usize = SLOT_META_BYTES + CHUNK_BUF_BYTES;
/// Bytes of the area header.
pub const HEADER_BYTES: usize = 4096;
/// Slots of a default area: one open chunk per stream plus chunks waiting for their write.
pub const DEFAULT_SLOTS: usize = 32;

const MAGIC: &[u8; 8] = b"FTLSTAGE";
/// 2: chunk buffers of [`CHUNK_BUF_BLOCKS`] (version 1 had 252 blocks, too few to pad
/// a full chunk to a 32 KiB page).
const VERSION: u16 = 2;
/// Byte offsets in the area header (the table above).
pub mod header_offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const SLOTS: usize = 12;
    pub const UUID: usize = 16;
    pub const EPOCH: usize = 32;
    pub const SLOT_BYTES: usize = 40;
    /// crc32c of bytes `0..CRC`.
    pub const CRC: usize = 44;
    pub const NEXT_CHUNK_MARK: usize = 48;
    /// Rule 5; 16 bytes, not covered by the crc.
    pub const BOOT_ID: usize = 56;
    /// u32, not covered by the crc: non-zero once a device write or sync failed in the
    /// owning session (recovery rule 3).
    pub const DEVICE_ERROR: usize = 72;
    /// u32: the owning session's random number (rule 9), with its own crc32c at
    /// [`SESSION_CRC`] (an older build left both zero: unknown).
    pub const SESSION: usize = 76;
    /// crc32c of bytes `SESSION..SESSION_CRC`.
    pub const SESSION_CRC: usize = 80;
}

/// This machine's boot id (`/proc/sys/kernel/random/boot_id`, a UUID), or zeros when it
/// cannot be read (then no area is taken for another boot's).
pub fn boot_id() -> [u8; 16] {
    static ID: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .and_then(|t| parse_uuid(t.trim()))
            .unwrap_or([0; 16])
    })
}

/// The 16 bytes of a UUID in its text form (dashes anywhere are skipped).
fn parse_uuid(t: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = t.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}
use header_offsets as h_at;

/// Byte offsets in a slot's metadata (the table above); `PLACE_*` are relative to
/// `PLACE`, `ENTRY_*` to an entry's start (`ENTRIES + k * ENTRY_BYTES`).
pub mod slot_offsets {
    pub const STATE: usize = 0;
    pub const COUNT: usize = 4;
    pub const CHUNK_SEQ: usize = 8;
    pub const PLACE: usize = 16;
    pub const PLACE_BYTES: usize = 24;
    pub const PLACE_SEGMENT: usize = 0;
    pub const PLACE_OFFSET: usize = 4;
    pub const PLACE_START_PBA: usize = 8;
    pub const PLACE_STREAM: usize = 16;
    /// crc32c of the place's bytes `0..PLACE_CRC`.
    pub const PLACE_CRC: usize = 20;
    pub const ENTRIES: usize = 64;
    pub const ENTRY_BYTES: usize = 24;
    pub const ENTRY_KEY: usize = 0;
    pub const ENTRY_SEQ: usize = 8;
    pub const ENTRY_VALUE: usize = 16;
    /// crc32c of the entry's bytes `0..ENTRY_CRC`.
    pub const ENTRY_CRC: usize = 20;
}
use slot_offsets as s_at;
const META_HEADER: usize = s_at::ENTRIES;
const META_ENTRY: usize = s_at::ENTRY_BYTES;

/// Copies `v` into `buf` at a field's named offset.
fn put(buf: &mut [u8], offset: usize, v: &[u8]) {
    buf[offset..offset + v.len()].copy_from_slice(v);
}

const STATE_FREE: u32 = 0;
const STATE_OPEN: u32 = 1;
const STATE_SEALED: u32 = 2;

/// The stores of staging rule 2, in the order [`ChunkBuf::mark_sealed`] makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SealStep {
    /// The chunk number goes into the slot (read only once the slot is sealed).
    Number,
    /// The slot is marked sealed: replay now rewrites it under that number.
    State,
    /// The area's next-chunk mark is raised past the number.
    Mark,
}

/// The stores of staging rule 1, in the order [`ChunkBuf::record`] makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordStep {
    /// A data entry's block copied into the chunk buffer.
    Data,
    /// The entry's fields and its checksum.
    Entry,
    /// The slot's entry count raised past it (release).
    Count,
}

/// The data and the entry whole BEFORE the count covers them: a death in between leaves
/// an entry the count does not cover (its write had not completed); the other order left
/// a count over an entry not written, and replay refused the area (staging rule 6) or
/// took a stale one, or over a block not copied, which replay wrote to the log: after the
/// death of only the process such a block is damage (recovery rule 3), and the LBA's
/// older data read as EIO.
pub(crate) const RECORD_STEPS: [RecordStep; 3] =
    [RecordStep::Data, RecordStep::Entry, RecordStep::Count];

#[cfg(test)]
thread_local! {
    /// Test hook: the next `record` on this thread makes only this many of
    /// [`RECORD_STEPS`] (a process dying in between; taken once).
    pub(crate) static RECORD_UPTO: std::cell::Cell<Option<usize>> =
        const { std::cell::Cell::new(None) };
}

/// The steps of a reset (staging rule 6), in the order [`StagingArea::reset`] takes
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetStep {
    /// Every slot marked free.
    Slots,
    /// The new session's header written (and written back, for a file).
    Header,
}

/// The slots freed BEFORE the header is written: a death in between leaves the old
/// session's header over free slots (an area of a session older than the checkpoint,
/// holding nothing); the other order left the new session's header over the slots the
/// open had just replayed, and the next open replayed them again under new numbers, at
/// places behind the checkpoint, and was refused.
pub(crate) const RESET_STEPS: [ResetStep; 2] = [ResetStep::Slots, ResetStep::Header];

#[cfg(test)]
thread_local! {
    /// Test hook: the next `reset` on this thread makes only this many of
    /// [`RESET_STEPS`] (a process dying in between; taken once).
    pub(crate) static RESET_UPTO: std::cell::Cell<Option<usize>> =
        const { std::cell::Cell::new(None) };
}

/// Sealed BEFORE the mark is raised: a death in between leaves a sealed slot whose
/// number equals the mark (replay raises the mark past it); the other order left a mark
/// past a number no slot carried, and replay numbered the open slots after a gap that
/// recovery stops at.
pub(crate) const SEAL_STEPS: [SealStep; 3] = [SealStep::Number, SealStep::State, SealStep::Mark];

const _: () = assert!(META_HEADER + MAX_ENTRIES * META_ENTRY <= SLOT_META_BYTES);
const _: () = assert!(SLOT_BYTES.is_multiple_of(BLOCK_SIZE));

/// Who owns the area: written by [`StagingArea::reset`], checked by [`replay`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AreaOwner {
    pub uuid: [u8; 16],
    pub epoch: u64,
    /// The session's random number (rule 9; 0: unknown, an area an older build reset).
    pub session: u32,
}

/// The header's fields as stored (layout in the module docs).
struct RawHeader {
    magic: [u8; 8],
    version: u16,
    slots: u32,
    uuid: [u8; 16],
    epoch: u64,
    slot_bytes: u32,
    crc: u32,
}

impl RawHeader {
    fn read(h: &[u8]) -> Option<Self> {
        let mut r = Reader::new(h, "staging header");
        Some(RawHeader {
            magic: r.seek(h_at::MAGIC).ok()?.bytes(8).ok()?.try_into().ok()?,
            version: r.seek(h_at::VERSION).ok()?.u16().ok()?,
            slots: r.seek(h_at::SLOTS).ok()?.u32().ok()?,
            uuid: r.seek(h_at::UUID).ok()?.bytes(16).ok()?.try_into().ok()?,
            epoch: r.seek(h_at::EPOCH).ok()?.u64().ok()?,
            slot_bytes: r.seek(h_at::SLOT_BYTES).ok()?.u32().ok()?,
            crc: r.seek(h_at::CRC).ok()?.u32().ok()?,
        })
    }
}

/// What a staging area's header says (see [`StagingArea::header`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AreaHeader {
    /// Never handed to a session, or torn while being reset (nothing was staged then).
    Blank,
    Owned(AreaOwner),
    /// Intact, but a layout this build cannot read: why.
    Foreign(String),
}

/// Where a staged chunk goes in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPlace {
    pub stream: u8,
    pub seg: u32,
    pub offset: u32,
    pub start_pba: u64,
}

/// A fixed set of chunk-buffer slots, in memory or in a shared-mapped file.
pub struct StagingArea {
    region: Region,
    slots: usize,
    free: Mutex<Vec<u32>>,
    /// Rule 7: slots given up while they still held writes a replay needs (sealed, or open with
    /// entries: a seal that failed or panicked, chunks dropped unwritten by a failing or
    /// dying FTL): never handed out again in this session, only to replay ([`Self::take`]),
    /// and freed by the next [`Self::reset`]. Given back to `free`, a sealed slot whose
    /// seal failed was the next writer's, its state and entries overwritten: a kill then
    /// lost its chunk and the roll-forward stopped there (found by review, 2026-11-29).
    /// Locked after `free` when both are.
    kept: Mutex<Vec<u32>>,
    freed: Condvar,
}

impl std::fmt::Debug for StagingArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StagingArea({} slots, {:?})",
            self.slots,
            self.region.path()
        )
    }
}

impl StagingArea {
    /// An area in process memory: survives nothing but is shared by `Arc`, so tests can
    /// hand it to the next open to model a process crash. Fails only when the address
    /// space is exhausted.
    pub fn in_memory(slots: usize) -> Result<Arc<Self>> {
        Ok(Self::over(Region::anonymous(
            HEADER_BYTES + slots.max(1) * SLOT_BYTES,
        )?))
    }

    /// Maps (creating it if missing) the area file at `path` with room for `slots` slots;
    /// a larger existing file keeps its size. Put it on tmpfs.
    pub fn open_file(path: &Path, slots: usize) -> Result<Arc<Self>> {
        let region = Region::map_file(path, HEADER_BYTES + slots.max(1) * SLOT_BYTES)?;
        Ok(Self::over(region))
    }

    /// A private copy-on-write view of the area file at `path`, for inspecting what a
    /// dead server left (the offline checker replays it into an overlay): the file is
    /// never changed, and [`StagingArea::remove_file`] must not be called on it.
    pub fn open_file_snapshot(path: &Path) -> Result<Arc<Self>> {
        let region = Region::map_file_private(path)?;
        if region.len() < HEADER_BYTES {
            return Err(Error::Corrupt(format!(
                "staging file {} is shorter than its header",
                path.display()
            )));
        }
        Ok(Self::over(region))
    }

    /// An in-memory copy of the whole area as it is now (what survives a process death
    /// at this instant, when nothing writes it meanwhile: schedule-exploration tests take
    /// it while every other thread is stopped).
    pub fn copy(&self) -> Result<Arc<Self>> {
        let region = Region::anonymous(self.region.len())?;
        // SAFETY: both regions are at least this long and do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.region.ptr(), region.ptr(), self.region.len());
        }
        Ok(Self::over(region))
    }

    fn over(region: Region) -> Arc<Self> {
        let slots = (region.len() - HEADER_BYTES) / SLOT_BYTES;
        Arc::new(StagingArea {
            region,
            slots,
            free: Mutex::new((0..slots as u32).rev().collect()),
            kept: Mutex::new(Vec::new()),
            freed: Condvar::new(),
        })
    }

    /// Number of slots.
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    /// The file behind the area, if any.
    pub fn path(&self) -> Option<&Path> {
        self.region.path()
    }

    /// Removes the area file (after a clean shutdown left nothing staged); a file
    /// already gone is fine.
    pub fn remove_file(&self) -> Result<()> {
        if self.region.is_snapshot() {
            return Ok(());
        }
        match self.region.path() {
            Some(p) => match std::fs::remove_file(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Open {
                    path: PathBuf::from(p),
                    source: e,
                }),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }

    fn bytes(&self, at: usize, len: usize) -> &[u8] {
        // SAFETY: callers stay within the region; shared reads of bytes that another
        // thread may be writing only happen during replay, when no other user exists.
        unsafe { std::slice::from_raw_parts(self.region.ptr().add(at), len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self, at: usize, len: usize) -> &mut [u8] {
        // SAFETY: within the region; each slot's bytes are written only by the owner of
        // its `ChunkBuf` (or by the single-threaded reset/replay), the header only by
        // reset.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr().add(at), len) }
    }

    fn atomic32(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at.is_multiple_of(4) && at + 4 <= self.region.len());
        // SAFETY: in bounds, 4-aligned (the region is page-aligned), and only ever
        // accessed through atomics.
        unsafe { &*(self.region.ptr().add(at) as *const AtomicU32) }
    }

    fn atomic64(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at.is_multiple_of(8) && at + 8 <= self.region.len());
        // SAFETY: as for `atomic32`, 8-aligned.
        unsafe { &*(self.region.ptr().add(at) as *const AtomicU64) }
    }

    fn slot_at(slot: u32) -> usize {
        HEADER_BYTES + slot as usize * SLOT_BYTES
    }

    /// What the header says: nobody's (never reset, or torn while being reset, when no
    /// slot held anything), a session's, or a layout this build cannot read.
    pub fn header(&self) -> AreaHeader {
        let h = self.bytes(0, h_at::NEXT_CHUNK_MARK);
        let Some(RawHeader {
            magic,
            version,
            slots,
            uuid,
            epoch,
            slot_bytes,
            crc,
        }) = RawHeader::read(h)
        else {
            return AreaHeader::Blank;
        };
        if &magic != MAGIC || crc != crc32c::crc32c(&h[..h_at::CRC]) {
            return AreaHeader::Blank;
        }
        if version != VERSION || slot_bytes as usize != SLOT_BYTES {
            return AreaHeader::Foreign(format!(
                "it has layout version {version} with {slot_bytes}-byte slots; this build \
                 reads version {VERSION} with {SLOT_BYTES}-byte slots (recover it with the \
                 ftlblk that wrote it)"
            ));
        }
        if slots as usize > self.slots {
            return AreaHeader::Foreign(format!(
                "its header records {slots} slots but the file holds {}",
                self.slots
            ));
        }
        AreaHeader::Owned(AreaOwner {
            uuid,
            epoch,
            session: self.session(),
        })
    }

    /// Rule 5: whether the area was reset in another boot of the machine (both boot ids
    /// known and different).
    pub fn from_another_boot(&self) -> bool {
        let recorded = self.bytes(h_at::BOOT_ID, 16);
        let now = boot_id();
        recorded.iter().any(|&b| b != 0) && now.iter().any(|&b| b != 0) && recorded != now
    }

    /// Whether the area was reset in this boot of the machine (both boot ids known and
    /// equal): the machine did not stop since.
    pub fn same_boot(&self) -> bool {
        let recorded = self.bytes(h_at::BOOT_ID, 16);
        recorded.iter().any(|&b| b != 0) && recorded == boot_id()
    }

    /// Records `id` as the boot the area was reset in: for tests, an area left by
    /// another boot (rule 5).
    #[doc(hidden)]
    pub fn set_boot_id(&self, id: [u8; 16]) {
        self.bytes_mut(h_at::BOOT_ID, 16).copy_from_slice(&id);
    }

    /// The owner recorded in the header, if the header is intact and of this layout.
    /// The owning session's random number (rule 9), 0 when unknown (an older build's
    /// area, or a damaged field).
    fn session(&self) -> u32 {
        let s = self.bytes(h_at::SESSION, h_at::SESSION_CRC + 4 - h_at::SESSION);
        let v = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let crc = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
        if crc == crc32c::crc32c(&s[..4]) {
            v
        } else {
            0
        }
    }

    pub fn owner(&self) -> Option<AreaOwner> {
        match self.header() {
            AreaHeader::Owned(o) => Some(o),
            _ => None,
        }
    }

    /// Every chunk number handed out by the owner is below this.
    pub fn next_chunk_mark(&self) -> u64 {
        self.atomic64(h_at::NEXT_CHUNK_MARK).load(Ordering::Acquire)
    }

    /// Rule 2: raises the next-chunk mark past `chunk_seq`.
    pub(crate) fn note_chunk(&self, chunk_seq: u64) {
        self.atomic64(h_at::NEXT_CHUNK_MARK)
            .fetch_max(chunk_seq.saturating_add(1), Ordering::AcqRel);
    }

    /// Hands the area to a new session: every slot free, the owner and mark set. Only
    /// while no slot is taken (at open, rule 4).
    ///
    /// Every slot is freed BEFORE the header is written (a fence between): a reset cut
    /// short by the death of the process leaves a header that does not read only over
    /// free slots, which replay takes for a blank area. A file on a disk (not tmpfs,
    /// rule 5) also has its header written back BEFORE any slot is handed out: after a
    /// power cut its slot pages could otherwise be on the disk without the header page
    /// (the kernel writes a mapping's pages back in any order), and the next open would
    /// refuse the area as damaged instead of ignoring it as another boot's (found by
    /// review, 2026-11-27). Fails only if that write-back fails.
    pub fn reset(&self, owner: AreaOwner, next_chunk_seq: u64) -> std::io::Result<()> {
        {
            // No slot is taken: the kept ones hold nothing a replay still needs.
            let mut free = lock(&self.free);
            free.append(&mut lock(&self.kept));
        }
        #[cfg(test)]
        let upto = RESET_UPTO.with(|u| u.take()).unwrap_or(RESET_STEPS.len());
        #[cfg(not(test))]
        let upto = RESET_STEPS.len();
        for step in &RESET_STEPS[..upto.min(RESET_STEPS.len())] {
            match step {
                ResetStep::Slots => self.free_every_slot(),
                ResetStep::Header => self.write_header(owner, next_chunk_seq)?,
            }
        }
        Ok(())
    }

    /// Rule 6's first step: every slot marked free with no entries.
    fn free_every_slot(&self) {
        for s in 0..self.slots as u32 {
            let at = Self::slot_at(s);
            self.atomic32(at + s_at::STATE)
                .store(STATE_FREE, Ordering::Release);
            self.atomic32(at + s_at::COUNT).store(0, Ordering::Release);
        }
    }

    /// Rule 6's second step: the header of a new session, written back when in a file.
    fn write_header(&self, owner: AreaOwner, next_chunk_seq: u64) -> std::io::Result<()> {
        // The header's plain stores stay after the slots' (see `reset`).
        std::sync::atomic::fence(Ordering::SeqCst);
        let h = self.bytes_mut(0, h_at::NEXT_CHUNK_MARK);
        h.fill(0);
        put(h, h_at::MAGIC, MAGIC);
        put(h, h_at::VERSION, &VERSION.to_le_bytes());
        put(h, h_at::SLOTS, &(self.slots as u32).to_le_bytes());
        put(h, h_at::UUID, &owner.uuid);
        put(h, h_at::EPOCH, &owner.epoch.to_le_bytes());
        put(h, h_at::SLOT_BYTES, &(SLOT_BYTES as u32).to_le_bytes());
        let crc = crc32c::crc32c(&h[..h_at::CRC]);
        put(h, h_at::CRC, &crc.to_le_bytes());
        let s = self.bytes_mut(h_at::SESSION, h_at::SESSION_CRC + 4 - h_at::SESSION);
        put(s, 0, &owner.session.to_le_bytes());
        let crc = crc32c::crc32c(&s[..4]);
        put(s, 4, &crc.to_le_bytes());
        self.atomic64(h_at::NEXT_CHUNK_MARK)
            .store(next_chunk_seq, Ordering::Release);
        self.set_boot_id(boot_id());
        self.atomic32(h_at::DEVICE_ERROR)
            .store(0, Ordering::Release);
        self.region.sync_range(0, HEADER_BYTES)
    }

    /// Records that a device write or sync failed in this session: the device may have
    /// lost writes that returned (a cache lost with no reboot: an enclosure that lost
    /// power, a network target that restarted), so recovery rule 3 must not take a block
    /// failing its checksum for damage (found by review, 2026-11-27).
    pub fn mark_device_error(&self) {
        self.atomic32(h_at::DEVICE_ERROR)
            .store(1, Ordering::Release);
    }

    /// Whether [`Self::mark_device_error`] was called in the owning session.
    pub fn device_error(&self) -> bool {
        self.atomic32(h_at::DEVICE_ERROR).load(Ordering::Acquire) != 0
    }

    /// A free slot, if one is left.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<ChunkBuf> {
        let slot = lock(&self.free).pop()?;
        Some(ChunkBuf {
            area: self.clone(),
            slot,
        })
    }

    /// Slot `slot`, if it is free or kept (replay takes the slots it rewrites).
    pub(crate) fn take(self: &Arc<Self>, slot: u32) -> Option<ChunkBuf> {
        let mut free = lock(&self.free);
        let mut kept = lock(&self.kept);
        if let Some(pos) = free.iter().position(|&s| s == slot) {
            free.swap_remove(pos);
        } else {
            let pos = kept.iter().position(|&s| s == slot)?;
            kept.swap_remove(pos);
        }
        Some(ChunkBuf {
            area: self.clone(),
            slot,
        })
    }

    /// Waits (at most `limit`) until a slot is free. Called with no lock held.
    pub(crate) fn wait_for_slot(&self, limit: Duration) {
        let free = lock(&self.free);
        if free.is_empty() {
            drop(wait_timeout(&self.freed, free, limit));
        }
    }

    fn give_back(&self, slot: u32) {
        let at = Self::slot_at(slot);
        let state = self.atomic32(at + s_at::STATE).load(Ordering::Acquire);
        let count = self.atomic32(at + s_at::COUNT).load(Ordering::Acquire);
        if state == STATE_SEALED || (state == STATE_OPEN && count > 0) {
            lock(&self.kept).push(slot);
            return;
        }
        lock(&self.free).push(slot);
        self.freed.notify_one();
    }

    /// Slots currently free (for tests and stats).
    pub fn free_slots(&self) -> usize {
        lock(&self.free).len()
    }

    /// Slots kept out of use because they hold writes a replay needs (the `kept` field).
    pub fn kept_slots(&self) -> usize {
        lock(&self.kept).len()
    }

    /// What slot `slot` holds, as replay sees it: state, place, chunk number and the
    /// entries up to the first that fails its checksum, which is damage (see `damage`).
    pub(crate) fn read_slot(&self, slot: u32) -> StagedSlot {
        let at = Self::slot_at(slot);
        let state = self.atomic32(at + s_at::STATE).load(Ordering::Acquire);
        let recorded = self.atomic32(at + s_at::COUNT).load(Ordering::Acquire) as usize;
        let count = recorded.min(MAX_ENTRIES);
        let m = self.bytes(at, META_HEADER + count * META_ENTRY);
        // Rule 1: every entry below the count was complete before the count covered it,
        // so one that fails its checksum there is damage, not a write cut short.
        let mut damage = (recorded > MAX_ENTRIES)
            .then(|| format!("its entry count {recorded} is past the {MAX_ENTRIES} a slot holds"));
        let mut entries = Vec::with_capacity(count);
        for (k, b) in m[META_HEADER..].chunks_exact(META_ENTRY).enumerate() {
            match decode_entry(b) {
                Some(e) => entries.push(e),
                None => {
                    damage.get_or_insert(format!(
                        "entry {k} of the {count} it recorded fails its checksum"
                    ));
                    break;
                }
            }
        }
        StagedSlot {
            state: match state {
                STATE_FREE => SlotState::Free,
                STATE_OPEN => SlotState::Open,
                STATE_SEALED => {
                    SlotState::Sealed(self.atomic64(at + s_at::CHUNK_SEQ).load(Ordering::Acquire))
                }
                other => SlotState::Unknown(other),
            },
            place: decode_place(&m[s_at::PLACE..s_at::PLACE + s_at::PLACE_BYTES]),
            entries,
            damage,
        }
    }
}

/// A slot's place record (`slot_offsets::PLACE..`), if its checksum holds.
fn decode_place(b: &[u8]) -> Option<SlotPlace> {
    let mut r = Reader::new(b, "staging slot place");
    let seg = r.seek(s_at::PLACE_SEGMENT).ok()?.u32().ok()?;
    let offset = r.seek(s_at::PLACE_OFFSET).ok()?.u32().ok()?;
    let start_pba = r.seek(s_at::PLACE_START_PBA).ok()?.u64().ok()?;
    let stream = r.seek(s_at::PLACE_STREAM).ok()?.u8().ok()?;
    let crc = r.seek(s_at::PLACE_CRC).ok()?.u32().ok()?;
    (crc == crc32c::crc32c(&b[..s_at::PLACE_CRC])).then_some(SlotPlace {
        stream,
        seg,
        offset,
        start_pba,
    })
}

/// One recorded entry, if its checksum holds (one that fails ends the list: damage, see
/// [`StagingArea::read_slot`]).
fn decode_entry(b: &[u8]) -> Option<Entry> {
    let mut r = Reader::new(b, "staging entry");
    let key = r.seek(s_at::ENTRY_KEY).ok()?.u64().ok()?;
    let seq = r.seek(s_at::ENTRY_SEQ).ok()?.u64().ok()?;
    let v = r.seek(s_at::ENTRY_VALUE).ok()?.u32().ok()?;
    let crc = r.seek(s_at::ENTRY_CRC).ok()?.u32().ok()?;
    if crc != crc32c::crc32c(&b[..s_at::ENTRY_CRC]) {
        return None;
    }
    Some(if key & TRIM_FLAG != 0 {
        Entry::Trim {
            lba: key & !TRIM_FLAG,
            seq,
            count: v,
        }
    } else {
        Entry::Data {
            lba: key,
            seq,
            crc: v,
        }
    })
}

/// State of a slot as replay reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    Free,
    Open,
    Sealed(u64),
    /// A state word no build writes: damage.
    Unknown(u32),
}

/// A slot's contents as replay reads them.
pub(crate) struct StagedSlot {
    pub state: SlotState,
    pub place: Option<SlotPlace>,
    /// The entries up to the first that fails its checksum.
    pub entries: Vec<Entry>,
    /// Why the entries are not all there, if they are not: one below the count fails its
    /// checksum (rule 1 says none can), or the count is past what a slot holds.
    pub damage: Option<String>,
}

/// Exclusive use of one slot: its chunk buffer (as bytes) and its metadata. Dropping it
/// returns the slot to the area's free list (the metadata is left as it is), or, while
/// the slot still holds writes a replay needs, to the kept ones (rule 7).
pub struct ChunkBuf {
    area: Arc<StagingArea>,
    slot: u32,
}

impl std::fmt::Debug for ChunkBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkBuf(slot {})", self.slot)
    }
}

impl ChunkBuf {
    fn meta_at(&self) -> usize {
        StagingArea::slot_at(self.slot)
    }

    /// The slot number.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Starts a new open chunk at `place` with no entries.
    pub(crate) fn open(&mut self, place: SlotPlace) {
        let at = self.meta_at();
        let a = &self.area;
        a.atomic32(at + s_at::STATE)
            .store(STATE_FREE, Ordering::Release);
        a.atomic32(at + s_at::COUNT).store(0, Ordering::Release);
        let m = a.bytes_mut(at + s_at::PLACE, s_at::PLACE_BYTES);
        m.fill(0);
        put(m, s_at::PLACE_SEGMENT, &place.seg.to_le_bytes());
        put(m, s_at::PLACE_OFFSET, &place.offset.to_le_bytes());
        put(m, s_at::PLACE_START_PBA, &place.start_pba.to_le_bytes());
        put(m, s_at::PLACE_STREAM, &[place.stream]);
        let crc = crc32c::crc32c(&m[..s_at::PLACE_CRC]);
        put(m, s_at::PLACE_CRC, &crc.to_le_bytes());
        a.atomic32(at + s_at::STATE)
            .store(STATE_OPEN, Ordering::Release);
    }

    /// Rule 1: records entry number `k`, a data entry's block `data` copied to byte `at`
    /// of the buffer first.
    pub(crate) fn record(&mut self, k: usize, e: &Entry, data: Option<(usize, &[u8])>) {
        if k >= MAX_ENTRIES {
            if let Some((at, d)) = data {
                self[at..at + d.len()].copy_from_slice(d);
            }
            return;
        }
        let at = self.meta_at();
        let (key, seq, v) = match *e {
            Entry::Data { lba, seq, crc } => (lba, seq, crc),
            Entry::Trim { lba, seq, count } => (lba | TRIM_FLAG, seq, count),
        };
        #[cfg(test)]
        let upto = RECORD_UPTO.with(|u| u.take()).unwrap_or(RECORD_STEPS.len());
        #[cfg(not(test))]
        let upto = RECORD_STEPS.len();
        for step in &RECORD_STEPS[..upto.min(RECORD_STEPS.len())] {
            match step {
                RecordStep::Data => {
                    if let Some((at, d)) = data {
                        self[at..at + d.len()].copy_from_slice(d);
                    }
                }
                RecordStep::Entry => {
                    let m = self
                        .area
                        .bytes_mut(at + META_HEADER + k * META_ENTRY, META_ENTRY);
                    put(m, s_at::ENTRY_KEY, &key.to_le_bytes());
                    put(m, s_at::ENTRY_SEQ, &seq.to_le_bytes());
                    put(m, s_at::ENTRY_VALUE, &v.to_le_bytes());
                    let crc = crc32c::crc32c(&m[..s_at::ENTRY_CRC]);
                    put(m, s_at::ENTRY_CRC, &crc.to_le_bytes());
                }
                RecordStep::Count => self
                    .area
                    .atomic32(at + s_at::COUNT)
                    .store(k as u32 + 1, Ordering::Release),
            }
        }
    }

    /// Rule 2: the chunk got number `chunk_seq` (call under the tracker lock).
    pub(crate) fn mark_sealed(&self, chunk_seq: u64) {
        self.seal_steps(chunk_seq, SEAL_STEPS.len());
    }

    /// The first `upto` of rule 2's stores, in order ([`SEAL_STEPS`]); a process may die
    /// between any two, and replay must be right after each prefix (tests run every
    /// prefix, then replay).
    pub(crate) fn seal_steps(&self, chunk_seq: u64, upto: usize) {
        let at = self.meta_at();
        for step in &SEAL_STEPS[..upto.min(SEAL_STEPS.len())] {
            match step {
                SealStep::Number => self
                    .area
                    .atomic64(at + s_at::CHUNK_SEQ)
                    .store(chunk_seq, Ordering::Release),
                SealStep::State => self
                    .area
                    .atomic32(at + s_at::STATE)
                    .store(STATE_SEALED, Ordering::Release),
                SealStep::Mark => self.area.note_chunk(chunk_seq),
            }
            crate::sync::preemption_point();
        }
    }

    /// Rule 3: the chunk's device write completed.
    pub(crate) fn mark_written(&self) {
        self.area
            .atomic32(self.meta_at() + s_at::STATE)
            .store(STATE_FREE, Ordering::Release);
    }
}

impl std::ops::Deref for ChunkBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.area
            .bytes(self.meta_at() + SLOT_META_BYTES, CHUNK_BUF_BYTES)
    }
}

impl std::ops::DerefMut for ChunkBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.area
            .bytes_mut(self.meta_at() + SLOT_META_BYTES, CHUNK_BUF_BYTES)
    }
}

impl Drop for ChunkBuf {
    fn drop(&mut self) {
        self.area.give_back(self.slot);
    }
}

#[cfg(test)]
mod tests;
