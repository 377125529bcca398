//! The reference model: what each LBA may read, now and after a crash.
//!
//! One model for every harness: the sequential property tests and fuzz targets use
//! [`Model`]; the concurrent crash harness (`tests/concurrent_crash.rs`), the shuttle
//! tests and the `sched` fuzz target use the [`History`] underneath it. Block contents
//! are generated from a (lba, tag) pair, tag 0 meaning zeros, so the model stores one
//! u64 per version and can tell "another LBA's data" or garbage from a legitimately older
//! version.
//!
//! ## What a crash may leave
//! Per LBA, the history keeps its versions in issue order (each LBA is written by one
//! thread at a time) and each operation's outcome: pending, completed at a logical time,
//! or failed. A FLUSH that completes makes durable every operation that completed
//! *before the FLUSH started*; a FUA write is durable once it completes. After a crash
//! an LBA may read the last version that is certain to have survived, or any version
//! issued after it:
//! - after a **power cut**, the last version whose operation is durable;
//! - after the **death of the process** (the staging area survives), the last version
//!   whose operation completed (every completed write survives, flushed or not).
//!
//! Failed operations stay uncertain forever (they may or may not have landed).
//!
//! ## Shared harness
//! What the tests of several crates (`ftl/tests`, `cleaner/tests`, the fuzz targets) do
//! alike is here once: [`check_read`], [`check_after_crash`] and [`checker`] judge an FTL
//! against the model; [`tiny`] formats and opens the tiny crash device the crash tests
//! run on ([`mem_ftl`] an in-memory one).

use crate::device::mem::MemDevice;
use crate::device::BLOCK_SIZE;
use crate::index::mem::MemIndex;
use crate::{BlockDevice, Config, FormatOptions, Ftl, IndexStore};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A version of a block: 0 = zeros.
pub type Tag = u64;

/// Identifies one operation of a run.
pub type OpId = u64;

/// Which kind of crash a check follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The machine lost power: unsynced writes and the staging area are gone.
    PowerCut,
    /// Only the server process died (`kill -9`): the backing keeps every completed
    /// device write and the staging area lives on.
    ProcessDeath,
}

/// Contents of block `lba` at version `tag`.
pub fn block_for(lba: u64, tag: Tag) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    if tag == 0 {
        return b;
    }
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&tag.to_le_bytes());
    let mut x = lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ tag;
    for chunk in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    b
}

/// What a block read back is, judged against `lba`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    Tag(Tag),
    /// Data of another LBA, or bytes no write produced.
    Foreign,
}

static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

/// Classifies bytes read from `lba`.
pub fn observe(lba: u64, data: &[u8]) -> Observed {
    // A block's all-zeros test as one `memcmp`: under the fuzzer's per-comparison
    // instrumentation the byte-by-byte test dominated every case (every LBA is read
    // after every crash, and most are zeros). Same result.
    let zeros = if data.len() == BLOCK_SIZE {
        data == &ZEROS[..]
    } else {
        data.iter().all(|&b| b == 0)
    };
    if zeros {
        return Observed::Tag(0);
    }
    let mut l = [0u8; 8];
    l.copy_from_slice(&data[..8]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&data[8..16]);
    let tag = u64::from_le_bytes(t);
    if u64::from_le_bytes(l) == lba && tag != 0 && data == block_for(lba, tag).as_slice() {
        Observed::Tag(tag)
    } else {
        Observed::Foreign
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pending,
    /// Completed at this logical time.
    Done(u64),
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct OpRec {
    outcome: Outcome,
    fua: bool,
}

/// One version of an LBA: the value an operation wrote, or the settled base (`op: None`).
#[derive(Debug, Clone, Copy)]
struct Version {
    tag: Tag,
    op: Option<OpId>,
}

/// The history of a (possibly concurrent) run: every operation's outcome and every LBA's
/// versions, with logical times of completions and FLUSH starts. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Per LBA: the settled base version first, then versions in issue order.
    lbas: BTreeMap<u64, Vec<Version>>,
    ops: HashMap<OpId, OpRec>,
    clock: u64,
    /// Operations completed at a time below this are durable.
    durable_below: u64,
    next_tag: Tag,
    next_op: OpId,
}

impl History {
    pub fn new() -> Self {
        History {
            next_tag: 1,
            next_op: 1,
            ..Default::default()
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn new_op(&mut self, fua: bool) -> OpId {
        let op = self.next_op;
        self.next_op += 1;
        self.ops.insert(
            op,
            OpRec {
                outcome: Outcome::Pending,
                fua,
            },
        );
        op
    }

    fn push(&mut self, lba: u64, tag: Tag, op: OpId) {
        self.lbas
            .entry(lba)
            .or_insert_with(|| vec![Version { tag: 0, op: None }])
            .push(Version { tag, op: Some(op) });
    }

    /// Records a write of `blocks` blocks at `lba`, about to be issued; returns its
    /// operation and the bytes to write (fresh tags).
    pub fn write(&mut self, lba: u64, blocks: u64, fua: bool) -> (OpId, Vec<u8>) {
        let first = self.next_tag;
        self.next_tag += blocks;
        let op = self.new_op(fua);
        let mut out = Vec::with_capacity(blocks as usize * BLOCK_SIZE);
        for (i, l) in (lba..lba + blocks).enumerate() {
            out.extend_from_slice(&block_for(l, first + i as u64));
            self.push(l, first + i as u64, op);
        }
        (op, out)
    }

    /// Records a write whose tags the writer chose (`first_tag ..`), e.g. a child
    /// process reporting what it issues; returns its operation.
    pub fn write_tagged(&mut self, lba: u64, blocks: u64, fua: bool, first_tag: Tag) -> OpId {
        let op = self.new_op(fua);
        for (i, l) in (lba..lba + blocks).enumerate() {
            self.push(l, first_tag + i as u64, op);
        }
        self.next_tag = self.next_tag.max(first_tag + blocks);
        op
    }

    /// Records a trim (or write-zeroes) of `blocks` blocks at `lba`, about to be issued.
    pub fn trim(&mut self, lba: u64, blocks: u64) -> OpId {
        let op = self.new_op(false);
        for l in lba..lba + blocks {
            // A never-written LBA reads zeros whatever happens.
            if self.lbas.contains_key(&l) {
                self.push(l, 0, op);
            }
        }
        op
    }

    /// The operation returned `Ok`.
    pub fn complete(&mut self, op: OpId) {
        let t = self.tick();
        if let Some(r) = self.ops.get_mut(&op) {
            r.outcome = Outcome::Done(t);
        }
    }

    /// The operation returned an error: it may or may not have landed, forever.
    pub fn fail(&mut self, op: OpId) {
        if let Some(r) = self.ops.get_mut(&op) {
            r.outcome = Outcome::Failed;
        }
    }

    /// A FLUSH is about to be issued; pass the token to [`History::flush_completed`].
    pub fn flush_started(&mut self) -> u64 {
        self.tick()
    }

    /// The FLUSH started with `token` returned `Ok`: everything completed before it
    /// started is durable.
    pub fn flush_completed(&mut self, token: u64) {
        self.durable_below = self.durable_below.max(token);
    }

    fn settled(&self, v: &Version, crash: Crash) -> bool {
        let Some(op) = v.op else { return true };
        match self.ops.get(&op).map(|r| (r.outcome, r.fua)) {
            Some((Outcome::Done(t), fua)) => {
                crash == Crash::ProcessDeath || fua || t < self.durable_below
            }
            _ => false,
        }
    }

    /// The value a read of `lba` must return now, if it is decided (its last operation
    /// completed); `None` while that operation is pending or after it failed.
    pub fn current(&self, lba: u64) -> Option<Tag> {
        let Some(v) = self.lbas.get(&lba).and_then(|vs| vs.last()) else {
            return Some(0);
        };
        match v.op.and_then(|op| self.ops.get(&op)) {
            None => Some(v.tag),
            Some(r) if matches!(r.outcome, Outcome::Done(_)) => Some(v.tag),
            Some(_) => None,
        }
    }

    /// The values `lba` may hold after `crash`: the last version certain to survive, then
    /// every version issued after it.
    pub fn allowed(&self, lba: u64, crash: Crash) -> Vec<Tag> {
        let Some(vs) = self.lbas.get(&lba) else {
            return vec![0];
        };
        let from = vs.iter().rposition(|v| self.settled(v, crash)).unwrap_or(0);
        let mut out: Vec<Tag> = vs[from..].iter().map(|v| v.tag).collect();
        out.dedup();
        out
    }

    /// After a crash: accepts what was read at `lba` if allowed, and makes it the settled
    /// base of the LBA. Returns the reason when it is not allowed.
    pub fn settle(&mut self, lba: u64, got: Observed, crash: Crash) -> Result<(), String> {
        let allowed = self.allowed(lba, crash);
        match got {
            Observed::Tag(t) if allowed.contains(&t) => {
                if let Some(vs) = self.lbas.get_mut(&lba) {
                    vs.clear();
                    vs.push(Version { tag: t, op: None });
                }
                Ok(())
            }
            other => Err(format!(
                "lba {lba}: read {other:?} after a {crash:?}, allowed {allowed:?}"
            )),
        }
    }

    /// Makes the last version of `lba` its settled base (a FUA write of it completed in
    /// a sequential run).
    fn make_durable(&mut self, lba: u64) {
        if let Some(vs) = self.lbas.get_mut(&lba) {
            if let Some(&last) = vs.last() {
                vs.clear();
                vs.push(Version {
                    tag: last.tag,
                    op: None,
                });
            }
        }
    }

    /// Every LBA written or trimmed so far.
    pub fn touched(&self) -> Vec<u64> {
        self.lbas.keys().copied().collect()
    }

    /// Operations recorded so far.
    pub fn operations(&self) -> usize {
        self.ops.len()
    }
}

/// The sequential form of [`History`]: each operation completes before the next starts.
/// Used by the property tests and the `ops` fuzz target.
#[derive(Debug, Clone, Default)]
pub struct Model {
    h: History,
}

impl Model {
    pub fn new() -> Self {
        Model { h: History::new() }
    }

    /// Records a write of `blocks` blocks at `lba` (completed: call it when the FTL is
    /// asked to write); returns the bytes to write. A FUA write becomes durable only
    /// through [`Model::fua_completed`] once the FTL has returned `Ok` (one that fails
    /// promised nothing).
    pub fn write(&mut self, lba: u64, blocks: u64) -> Vec<u8> {
        let (op, data) = self.h.write(lba, blocks, false);
        self.h.complete(op);
        data
    }

    /// Records a trim / write-zeroes.
    pub fn trim(&mut self, lba: u64, blocks: u64) {
        let op = self.h.trim(lba, blocks);
        self.h.complete(op);
    }

    /// Records that the FUA write of `blocks` blocks at `lba` (recorded with
    /// [`Model::write`] before it was issued) completed: those blocks are durable now. A
    /// FUA write that fails, or runs out of space part-way, promised nothing, so callers
    /// call this only on success.
    pub fn fua_completed(&mut self, lba: u64, blocks: u64) {
        for l in lba..lba + blocks {
            self.h.make_durable(l);
        }
    }

    /// Records a completed FLUSH.
    pub fn flush(&mut self) {
        let t = self.h.flush_started();
        self.h.flush_completed(t);
    }

    /// Records the death of the server process with its staging area intact (`kill -9`,
    /// not a power cut): every completed write and trim survives, as after a FLUSH.
    pub fn process_died(&mut self) {
        self.flush();
    }

    /// The tag a read of `lba` must return now.
    pub fn expected(&self, lba: u64) -> Tag {
        self.h.current(lba).unwrap_or(0)
    }

    /// Tags `lba` may hold after a power cut.
    pub fn allowed_after_crash(&self, lba: u64) -> Vec<Tag> {
        self.h.allowed(lba, Crash::PowerCut)
    }

    /// After a crash: accepts what was observed at `lba` if allowed, and makes it the
    /// new current and durable value. Returns an error message if not allowed.
    pub fn settle_after_crash(&mut self, lba: u64, got: Observed) -> Result<(), String> {
        self.h.settle(lba, got, Crash::PowerCut)
    }

    /// Every LBA the model has seen written or trimmed.
    pub fn touched(&self) -> Vec<u64> {
        self.h.touched()
    }
}

// -------------------------------------------------------------------------------------
// The harness pieces the tests of several crates share: `ftl/tests`, the cleaner's tests
// (`cleaner/tests`) and the fuzz targets (`fuzz/src`) all check an FTL against a
// [`Model`] the same way.

/// An FTL on the in-memory device and index.
pub type MemFtl = Ftl<Arc<MemDevice>, Arc<MemIndex>>;

/// Formats an in-memory device of `size` bytes and an in-memory index with `opts`, and
/// opens the FTL on them. Panics on failure (a test's prologue).
pub fn mem_ftl(size: u64, opts: &FormatOptions) -> (Arc<MemDevice>, Arc<MemIndex>, MemFtl) {
    let dev = Arc::new(MemDevice::new(size));
    let idx = Arc::new(MemIndex::new());
    crate::format(&dev, &idx, opts, false).expect("format the memory device");
    let (f, _) =
        Ftl::open(dev.clone(), idx.clone(), Config::default()).expect("open the memory device");
    (dev, idx, f)
}

/// Reads `blocks` blocks at `lba` (one read) and checks each against what the model says
/// must be there now.
pub fn check_read<D: BlockDevice, I: IndexStore>(
    f: &Ftl<D, I>,
    m: &Model,
    lba: u64,
    blocks: u64,
) -> Result<(), String> {
    let mut b = vec![0u8; blocks as usize * BLOCK_SIZE];
    f.read(lba, &mut b)
        .map_err(|e| format!("read {lba}+{blocks}: {e}"))?;
    for (i, blk) in b.chunks(BLOCK_SIZE).enumerate() {
        let l = lba + i as u64;
        let got = observe(l, blk);
        let want = Observed::Tag(m.expected(l));
        if got != want {
            return Err(format!(
                "lba {l} (read {lba}+{blocks}): read {got:?}, expected {want:?}"
            ));
        }
    }
    Ok(())
}

/// After a reopen: every LBA must hold a value the model allows after a crash; the model
/// settles on it.
pub fn check_after_crash<D: BlockDevice, I: IndexStore>(
    f: &Ftl<D, I>,
    m: &mut Model,
) -> Result<(), String> {
    let mut b = vec![0u8; BLOCK_SIZE];
    for lba in 0..f.capacity_blocks() {
        f.read(lba, &mut b)
            .map_err(|e| format!("read {lba} after crash: {e}"))?;
        m.settle_after_crash(lba, observe(lba, &b))?;
    }
    Ok(())
}

/// Runs the offline checker (data checksums verified) on an image no FTL has open, or
/// one idle right after a checkpoint; any problem is an error.
pub fn checker<D: BlockDevice, I: IndexStore>(dev: D, idx: I) -> Result<(), String> {
    let report = crate::check::check(dev, idx, true).map_err(|e| format!("check: {e}"))?;
    if report.clean() {
        Ok(())
    } else {
        Err(format!("checker: {:?}", report.problems))
    }
}

/// The tiny geometry of the property tests and fuzz targets: 32 segments of 64 KiB, 16 KiB
/// flash pages, on the crash-simulating device with the in-memory index. Chunks, segment
/// changes and padding all happen within a few hundred writes.
pub mod tiny {
    use crate::device::crash::CrashDevice;
    use crate::device::BLOCK_SIZE;
    use crate::index::mem::MemIndex;
    use crate::staging::StagingArea;
    use crate::{Config, FormatOptions, Ftl, OpenReport};
    use std::sync::Arc;

    /// The FTL on the crash-simulating device and the in-memory index.
    pub type CrashFtl = Ftl<Arc<CrashDevice>, Arc<MemIndex>>;

    /// Segments of the tiny device.
    pub const SEGMENTS: u64 = 32;
    /// Bytes per segment.
    pub const SEGMENT_BYTES: u64 = 64 << 10;
    /// Bytes per flash page.
    pub const FLASH_PAGE_BYTES: u32 = 16 << 10;
    /// Bytes of the tiny device.
    pub const DEVICE_BYTES: u64 = SEGMENTS * SEGMENT_BYTES;
    /// Blocks of the tiny device.
    pub const DEVICE_BLOCKS: u64 = DEVICE_BYTES / BLOCK_SIZE as u64;

    /// The format options of the tiny geometry.
    pub fn options() -> FormatOptions {
        FormatOptions {
            segment_bytes: Some(SEGMENT_BYTES),
            flash_page_bytes: Some(FLASH_PAGE_BYTES),
            ..Default::default()
        }
    }

    /// A freshly formatted tiny crash device and in-memory index (not opened).
    pub fn formatted() -> Result<(Arc<CrashDevice>, Arc<MemIndex>), String> {
        let dev = Arc::new(CrashDevice::new(DEVICE_BYTES));
        let idx = Arc::new(MemIndex::new());
        crate::format(&dev, &idx, &options(), false).map_err(|e| format!("format: {e}"))?;
        Ok((dev, idx))
    }

    /// Opens the FTL on `dev` + `idx` (the default configuration).
    pub fn open(dev: &Arc<CrashDevice>, idx: &Arc<MemIndex>) -> crate::Result<CrashFtl> {
        open_report(dev, idx).map(|(f, _)| f)
    }

    /// Opens the FTL on `dev` + `idx`, with what recovery found.
    pub fn open_report(
        dev: &Arc<CrashDevice>,
        idx: &Arc<MemIndex>,
    ) -> crate::Result<(CrashFtl, OpenReport)> {
        Ftl::open(dev.clone(), idx.clone(), Config::default())
    }

    /// Reopens after the death of the process, with the staging area it left.
    pub fn open_staged(
        dev: &Arc<CrashDevice>,
        idx: &Arc<MemIndex>,
        staging: Arc<StagingArea>,
    ) -> crate::Result<(CrashFtl, OpenReport)> {
        Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging)
    }

    /// The crash tests' prologue: a formatted tiny device and index and the FTL open on
    /// them. Panics on failure.
    pub fn crash_ftl() -> (Arc<CrashDevice>, Arc<MemIndex>, CrashFtl) {
        let (dev, idx) = formatted().expect("format the tiny crash device");
        let f = open(&dev, &idx).expect("open the tiny crash device");
        (dev, idx, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_distinguishable() {
        assert_eq!(observe(5, &block_for(5, 9)), Observed::Tag(9));
        assert_eq!(observe(6, &block_for(5, 9)), Observed::Foreign);
        assert_eq!(observe(5, &block_for(5, 0)), Observed::Tag(0));
        let mut b = block_for(5, 9);
        b[100] ^= 1;
        assert_eq!(observe(5, &b), Observed::Foreign);
    }

    #[test]
    fn crash_semantics() {
        let mut m = Model::new();
        m.write(1, 1);
        m.flush();
        let t1 = m.expected(1);
        m.write(1, 1);
        let t2 = m.expected(1);
        assert_eq!(m.allowed_after_crash(1), vec![t1, t2]);
        m.write(2, 1);
        m.fua_completed(2, 1);
        assert_eq!(m.allowed_after_crash(2), vec![m.expected(2)]);
        assert!(m.settle_after_crash(1, Observed::Tag(0)).is_err());
        m.settle_after_crash(1, Observed::Tag(t2)).unwrap();
        assert_eq!(m.allowed_after_crash(1), vec![t2]);
        m.trim(1, 1);
        assert_eq!(m.allowed_after_crash(1), vec![t2, 0]);
        assert_eq!(m.allowed_after_crash(99), vec![0]);
    }

    #[test]
    fn a_fua_write_is_durable_only_once_completed() {
        let mut m = Model::new();
        m.write(3, 2);
        m.flush();
        let old = m.expected(3);
        // Issued as FUA, not (yet) completed: old and new both allowed.
        m.write(3, 2);
        let new = m.expected(3);
        assert_eq!(m.allowed_after_crash(3), vec![old, new]);
        m.fua_completed(3, 2);
        assert_eq!(m.allowed_after_crash(3), vec![new]);
        assert_eq!(m.allowed_after_crash(4), vec![m.expected(4)]);
        // Other LBAs' unflushed writes stay undecided.
        m.write(7, 1);
        m.fua_completed(3, 1);
        assert_eq!(m.allowed_after_crash(7).len(), 2);
    }

    #[test]
    fn a_flush_covers_only_what_completed_before_it_started() {
        let mut h = History::new();
        let (a, _) = h.write(1, 1, false);
        let (b, _) = h.write(2, 1, false);
        h.complete(a);
        let token = h.flush_started();
        // b completes while the FLUSH runs: not covered by it.
        h.complete(b);
        h.flush_completed(token);
        let ta = h.current(1).unwrap();
        let tb = h.current(2).unwrap();
        assert_eq!(h.allowed(1, Crash::PowerCut), vec![ta]);
        assert_eq!(h.allowed(2, Crash::PowerCut), vec![0, tb]);
        // After the death of the process every completed write survives.
        assert_eq!(h.allowed(2, Crash::ProcessDeath), vec![tb]);
    }

    #[test]
    fn pending_and_failed_operations_stay_uncertain() {
        let mut h = History::new();
        let (a, _) = h.write(5, 1, true);
        h.complete(a);
        let ta = h.current(5).unwrap();
        assert_eq!(
            h.allowed(5, Crash::PowerCut),
            vec![ta],
            "a completed FUA write"
        );
        let (b, _) = h.write(5, 1, true);
        assert_eq!(h.current(5), None, "pending");
        let tb = h.allowed(5, Crash::ProcessDeath)[1];
        assert_eq!(h.allowed(5, Crash::ProcessDeath), vec![ta, tb]);
        h.fail(b);
        assert_eq!(h.current(5), None, "failed");
        assert_eq!(h.allowed(5, Crash::PowerCut), vec![ta, tb]);
        // A later completed write decides the LBA again.
        let (c, _) = h.write(5, 1, false);
        h.complete(c);
        let tc = h.current(5).unwrap();
        assert_eq!(h.allowed(5, Crash::ProcessDeath), vec![tc]);
        assert_eq!(h.allowed(5, Crash::PowerCut), vec![ta, tb, tc]);
        let t = h.trim(5, 1);
        h.complete(t);
        assert_eq!(h.current(5), Some(0));
        assert!(h.settle(5, Observed::Tag(tb), Crash::PowerCut).is_ok());
        assert_eq!(h.allowed(5, Crash::PowerCut), vec![tb]);
        assert!(h.settle(6, Observed::Foreign, Crash::PowerCut).is_err());
    }

    #[test]
    fn tags_chosen_by_the_writer_are_kept() {
        let mut h = History::new();
        let op = h.write_tagged(9, 2, false, 1 << 40);
        assert_eq!(h.current(9), None);
        h.complete(op);
        assert_eq!(h.current(10), Some((1 << 40) + 1));
        let (_, d) = h.write(0, 1, false);
        assert_eq!(
            observe(0, &d),
            Observed::Tag((1 << 40) + 2),
            "no tag is reused"
        );
    }
}
