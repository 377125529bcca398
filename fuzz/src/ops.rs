//! The `ops` target: a sequence of block-device operations on the tiny crash device,
//! every read checked against the reference model, every crash followed by the offline
//! checker, a reopen and a check of every LBA against what the model allows.
//!
//! Input: `arbitrary`-decoded [`Op`]s (at most [`MAX_OPS`]), each preceded by a
//! "continue" byte (see [`crate::enc`]). LBAs are taken modulo [`SPAN`] so overwrites are
//! frequent; ranges are clipped to the span.
//!
//! Acceptable: `Error::NoSpace` from an operation that appends (the log is full without a
//! cleaner); the case then stops and goes to the final crash check. Anything else
//! unexpected (an error, a wrong read, a checker problem) fails the case.

use crate::tiny::{self, check_after_crash, check_read, checker, CrashFtl};
use arbitrary::{Arbitrary, Unstructured};
use ftl::device::crash::CrashDevice;
use ftl::device::BLOCK_SIZE;
use ftl::index::mem::MemIndex;
use ftl::model::Model;
use ftl::{Error, MapEntry, StreamId, GC_STREAM};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Operations per case at most.
pub const MAX_OPS: usize = 200;
/// LBAs addressed (of the ~390 exported), so overwrites are frequent.
pub const SPAN: u64 = 96;
/// User streams the writes use.
pub const USER_STREAMS: u8 = 4;

/// One step of a case.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Write 1..=8 blocks at `lba` (mod [`SPAN`]) in stream `stream % 4`.
    Write {
        lba: u8,
        blocks: u8,
        fua: bool,
        stream: u8,
    },
    /// TRIM / DISCARD of 1..=20 blocks.
    Trim {
        lba: u8,
        blocks: u8,
    },
    /// WRITE_ZEROES (the FTL unmaps: same as a trim).
    WriteZeroes {
        lba: u8,
        blocks: u8,
    },
    Flush,
    /// A FUA write of 1..=8 blocks.
    FuaWrite {
        lba: u8,
        blocks: u8,
        stream: u8,
    },
    Checkpoint,
    /// Re-append the block's current data into the GC stream (compare-and-swap on its map
    /// entry), as the cleaner does; reads must not change.
    Relocate {
        lba: u8,
    },
    /// A cleaning slice: relocate up to `max` live blocks of closed segment `seg`
    /// (all of them when `max >= 128`); once all are moved the segment must be dead.
    Clean {
        seg: u8,
        max: u8,
    },
    /// Power cut: drop the FTL, lose a seeded subset of unsynced block writes (none
    /// when `seed % 16 == 15`: every write issued reached the media), run the offline
    /// checker, reopen, check every LBA. `seed % 16 == 14`: the process dies instead
    /// (`kill -9`): the device keeps every write, the staging area lives on, and after
    /// the reopen every completed write and trim must read back exactly.
    Crash {
        seed: u64,
    },
    /// A request the FTL must refuse (or, for zero-length ones, accept as a no-op)
    /// without changing anything; `kind` picks which.
    Invalid {
        lba: u64,
        blocks: u8,
        kind: u8,
    },
    /// Inject an I/O fault into the next operation only: `kind % 4` = 0 device writes
    /// fail, 1 device syncs fail, 2 device reads fail, 3 index commits fail. If that
    /// operation fails, reads must keep working (unflushed data included) and a device
    /// write/sync failure must turn the FTL read-only; then, unless only a read or a
    /// checkpoint's index commit failed, the case crashes with `seed` (the fault cleared)
    /// and everything acknowledged must be there after the reopen.
    Fault {
        kind: u8,
        seed: u64,
    },
    /// Clean shutdown (`close`: flush + checkpoint), then reopen: nothing to replay,
    /// every LBA exactly as written.
    Close,
    /// Read 1..=8 blocks; each must be exactly what the model says. (Last: `arbitrary`
    /// maps runs of 0xff bytes, which libFuzzer's mutations produce a lot, to the last
    /// variant, so that one should be cheap and harmless.)
    Read {
        lba: u8,
        blocks: u8,
    },
}

/// What a case did (for the tests and for reading a reproducer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub steps: usize,
    pub crashes: usize,
    pub relocated: usize,
    /// Operations that failed with an injected fault.
    pub faults_hit: usize,
    /// Over every reopen: chunks recovery replayed, and data entries it skipped (their
    /// block was lost in the crash although the summary survived).
    pub chunks_replayed: u64,
    pub entries_skipped: u64,
    /// Segments checkpoints returned to the free list.
    pub segments_freed: usize,
    /// Step at which an append ran out of space, if it did.
    pub no_space_at: Option<usize>,
    /// Process deaths (staging area kept), and the entries their reopens replayed from it.
    pub kills: usize,
    pub staged_entries: u64,
}

/// Decodes `data` into at most [`MAX_OPS`] operations.
pub fn parse(data: &[u8]) -> Vec<Op> {
    let mut u = Unstructured::new(data);
    let Ok(iter) = u.arbitrary_iter::<Op>() else {
        return Vec::new();
    };
    iter.take(MAX_OPS).map_while(Result::ok).collect()
}

/// libFuzzer entry: panics on any violated property.
pub fn fuzz(data: &[u8]) {
    let ops = parse(data);
    if let Err(e) = run(&ops) {
        panic!("ops: {e}\nops: {ops:#?}");
    }
}

fn range(lba: u8, blocks: u8, max: u64) -> (u64, u64) {
    let l = lba as u64 % SPAN;
    let b = (1 + blocks as u64 % max).min(SPAN - l);
    (l, b)
}

fn is_no_space<T>(r: &ftl::Result<T>) -> bool {
    matches!(r, Err(Error::NoSpace))
}

enum Flow {
    Go,
    NoSpace,
}

/// Runs a case; `Err` names the first violated property.
pub fn run(ops: &[Op]) -> Result<Outcome, String> {
    let (dev, idx) = tiny::formatted()?;
    let mut f = Some(tiny::open(&dev, &idx).map_err(|e| format!("first open: {e}"))?);
    let mut m = Model::new();
    let mut out = Outcome::default();
    let mut armed: Option<(u8, u64)> = None;
    for (step, op) in ops.iter().enumerate() {
        out.steps = step + 1;
        let ftl = f.as_ref().expect("open");
        let crash_seed = match (op, armed.take()) {
            (Op::Crash { seed }, _) if seed % 16 == 14 => {
                let staging = ftl.staging().clone();
                drop(f.take());
                checker(&dev, &idx).map_err(|e| format!("step {step} {op:?}: {e}"))?;
                let (nf, report) = tiny::open_staged(&dev, &idx, staging)
                    .map_err(|e| format!("step {step} {op:?}: reopen after kill: {e}"))?;
                out.chunks_replayed += report.recovery.chunks_replayed;
                out.staged_entries += report.recovery.staged.entries;
                checker(&dev, &idx)
                    .map_err(|e| format!("step {step} {op:?}: after reopen: {e}"))?;
                m.process_died();
                check_after_crash(&nf, &mut m).map_err(|e| format!("step {step} {op:?}: {e}"))?;
                f = Some(nf);
                out.kills += 1;
                continue;
            }
            (Op::Crash { seed }, _) => Some(*seed),
            (Op::Fault { kind, seed }, _) => {
                armed = Some((kind % 4, *seed));
                None
            }
            (_, Some((kind, seed))) => {
                match faulted(&dev, &idx, ftl, &mut m, op, kind)
                    .map_err(|e| format!("step {step} {op:?} under fault {kind}: {e}"))?
                {
                    FaultEnd::Continue => None,
                    FaultEnd::NoSpace => {
                        out.no_space_at = Some(step);
                        break;
                    }
                    FaultEnd::Crash => {
                        out.faults_hit += 1;
                        // Always a power cut here (a failed write promised nothing).
                        Some(if seed % 16 == 14 { seed + 1 } else { seed })
                    }
                }
            }
            (_, None) => {
                let flow = step_op((&dev, &idx), ftl, &mut m, op, &mut out)
                    .map_err(|e| format!("step {step} {op:?}: {e}"))?;
                if let Flow::NoSpace = flow {
                    out.no_space_at = Some(step);
                    break;
                }
                None
            }
        };
        if let Op::Close = op {
            ftl.close().map_err(|e| format!("step {step} close: {e}"))?;
            m.flush();
            drop(f.take());
            let (nf, report) = tiny::open_report(&dev, &idx)
                .map_err(|e| format!("step {step} {op:?}: reopen: {e}"))?;
            if report.recovery.chunks_replayed != 0 {
                return Err(format!(
                    "step {step}: reopen after a clean close replayed {} chunks: {report:?}",
                    report.recovery.chunks_replayed
                ));
            }
            checker(&dev, &idx).map_err(|e| format!("step {step} {op:?}: after reopen: {e}"))?;
            check_after_crash(&nf, &mut m).map_err(|e| format!("step {step} {op:?}: {e}"))?;
            f = Some(nf);
        }
        if let Some(seed) = crash_seed {
            drop(f.take());
            if seed % 16 == 15 {
                ftl::BlockDevice::sync(&*dev).map_err(|e| format!("step {step}: sync: {e}"))?;
            }
            dev.crash(seed)
                .map_err(|e| format!("step {step}: crash: {e}"))?;
            checker(&dev, &idx).map_err(|e| format!("step {step} {op:?}: {e}"))?;
            let (nf, report) = tiny::open_report(&dev, &idx)
                .map_err(|e| format!("step {step} {op:?}: reopen: {e}"))?;
            out.chunks_replayed += report.recovery.chunks_replayed;
            out.entries_skipped += report.recovery.entries_skipped;
            // And on the image as the reopen left it (its checkpoint written).
            checker(&dev, &idx).map_err(|e| format!("step {step} {op:?}: after reopen: {e}"))?;
            check_after_crash(&nf, &mut m).map_err(|e| format!("step {step} {op:?}: {e}"))?;
            f = Some(nf);
            out.crashes += 1;
        }
    }
    // Final crash: everything flushed must be there, the rest may or may not be.
    drop(f.take());
    dev.crash(0xfeed).map_err(|e| format!("final crash: {e}"))?;
    checker(&dev, &idx).map_err(|e| format!("final: {e}"))?;
    let nf = tiny::open(&dev, &idx).map_err(|e| format!("final reopen: {e}"))?;
    check_after_crash(&nf, &mut m).map_err(|e| format!("final: {e}"))?;
    Ok(out)
}

fn step_op(
    (dev, idx): (&Arc<CrashDevice>, &Arc<MemIndex>),
    ftl: &CrashFtl,
    m: &mut Model,
    op: &Op,
    out: &mut Outcome,
) -> Result<Flow, String> {
    match *op {
        Op::Write {
            lba,
            blocks,
            fua,
            stream,
        } => write(ftl, m, lba, blocks, fua, stream),
        Op::FuaWrite {
            lba,
            blocks,
            stream,
        } => write(ftl, m, lba, blocks, true, stream),
        Op::Read { lba, blocks } => {
            let (l, b) = range(lba, blocks, 8);
            check_read(ftl, m, l, b)?;
            Ok(Flow::Go)
        }
        Op::Trim { lba, blocks } | Op::WriteZeroes { lba, blocks } => {
            let (l, b) = range(lba, blocks, 20);
            let r = ftl.trim(l, b);
            if is_no_space(&r) {
                return Ok(Flow::NoSpace);
            }
            r.map_err(|e| format!("trim: {e}"))?;
            m.trim(l, b);
            check_read(ftl, m, l, b)?;
            Ok(Flow::Go)
        }
        Op::Flush => {
            ftl.flush().map_err(|e| format!("flush: {e}"))?;
            m.flush();
            Ok(Flow::Go)
        }
        Op::Checkpoint => {
            let r = ftl.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
            out.segments_freed += r.segments_freed;
            // Idle right after a checkpoint: the live image must check clean too.
            checker(dev, idx).map_err(|e| format!("after checkpoint: {e}"))?;
            Ok(Flow::Go)
        }
        Op::Relocate { lba } => {
            let l = lba as u64 % SPAN;
            let e = ftl.map_entry(l).map_err(|e| format!("map_entry: {e}"))?;
            if !e.is_mapped() {
                return Ok(Flow::Go);
            }
            let mut data = vec![0u8; BLOCK_SIZE];
            ftl.read(l, &mut data).map_err(|e| format!("read: {e}"))?;
            let r = ftl.relocate(l, e, &data, GC_STREAM);
            if is_no_space(&r) {
                return Ok(Flow::NoSpace);
            }
            match r {
                Ok(true) => out.relocated += 1,
                Ok(false) => {
                    return Err(format!("relocate of an unchanged entry {e:?} did not move"))
                }
                Err(err) => return Err(format!("relocate: {err}")),
            }
            check_read(ftl, m, l, 1)?;
            Ok(Flow::Go)
        }
        Op::Clean { seg, max } => clean(ftl, m, seg, max, out),
        Op::Invalid { lba, blocks, kind } => invalid(ftl, m, lba, blocks, kind),
        Op::Crash { .. } | Op::Fault { .. } | Op::Close => Ok(Flow::Go),
    }
}

fn write(
    ftl: &CrashFtl,
    m: &mut Model,
    lba: u8,
    blocks: u8,
    fua: bool,
    stream: u8,
) -> Result<Flow, String> {
    let (l, b) = range(lba, blocks, 8);
    // Durable in the model only once a FUA write has completed (below).
    let data = m.write(l, b);
    let r = ftl.write(l, &data, fua, StreamId(stream % USER_STREAMS));
    if is_no_space(&r) {
        // Part of the write may have been appended: the model allows the new tags after
        // a crash (and the old ones), and the case stops here.
        return Ok(Flow::NoSpace);
    }
    r.map_err(|e| format!("write: {e}"))?;
    if fua {
        m.fua_completed(l, b);
    }
    check_read(ftl, m, l, b)?;
    Ok(Flow::Go)
}

fn clean(ftl: &CrashFtl, m: &Model, seg: u8, max: u8, out: &mut Outcome) -> Result<Flow, String> {
    let segments = ftl.geometry().segment_count;
    let seg = 1 + seg as u32 % (segments - 1);
    let live = match ftl.live_blocks(seg) {
        Ok(l) => l,
        // Not a closed segment.
        Err(Error::InvalidParameters(_)) => return Ok(Flow::Go),
        Err(e) => return Err(format!("live_blocks({seg}): {e}")),
    };
    let limit = if max >= 128 {
        usize::MAX
    } else {
        max as usize % 32 + 1
    };
    let mut buf = vec![0u8; BLOCK_SIZE];
    let mut moved_all = true;
    for (i, b) in live.iter().enumerate() {
        if i >= limit {
            moved_all = false;
            break;
        }
        if b.lba >= SPAN {
            return Err(format!(
                "live_blocks({seg}) names lba {}, which no write touched",
                b.lba
            ));
        }
        match ftl.read_live(b, &mut buf) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "read_live({b:?}) of segment {seg}: map moved without a writer"
                ))
            }
            Err(e) => return Err(format!("read_live({b:?}) of segment {seg}: {e}")),
        }
        let r = ftl.relocate(b.lba, b.entry, &buf, GC_STREAM);
        if is_no_space(&r) {
            return Ok(Flow::NoSpace);
        }
        match r {
            Ok(true) => out.relocated += 1,
            Ok(false) => {
                return Err(format!(
                    "cleaning segment {seg}: relocate of {b:?} did not move"
                ))
            }
            Err(e) => return Err(format!("cleaning segment {seg}: relocate of {b:?}: {e}")),
        }
        check_read(ftl, m, b.lba, 1)?;
    }
    if moved_all && ftl.segment_valid(seg) != 0 {
        return Err(format!(
            "cleaned every block live_blocks({seg}) listed ({}), but the segment still has {} live blocks",
            live.len(),
            ftl.segment_valid(seg)
        ));
    }
    check_read(ftl, m, 0, SPAN)?;
    Ok(Flow::Go)
}

fn invalid(ftl: &CrashFtl, m: &Model, raw: u64, blocks: u8, kind: u8) -> Result<Flow, String> {
    let cap = ftl.capacity_blocks();
    // A range that ends past the capacity: either starts past it, or straddles the end.
    let (oor_lba, oor_blocks) = if raw >= cap {
        (raw, 1 + blocks as u64 % 8)
    } else {
        let back = raw % 4;
        (cap - 1 - back, back + 2 + blocks as u64 % 4)
    };
    let in_lba = raw % SPAN;
    let out_of_range = |what: &str, r: ftl::Result<()>| match r {
        Err(Error::OutOfRange { .. }) => Ok(()),
        other => Err(format!(
            "{what} {oor_lba}+{oor_blocks} (capacity {cap}): {other:?}, expected OutOfRange"
        )),
    };
    match kind % 9 {
        0 => out_of_range(
            "write",
            ftl.write(
                oor_lba,
                &vec![0xa5; oor_blocks as usize * BLOCK_SIZE],
                false,
                StreamId(1),
            ),
        )?,
        1 => {
            let mut b = vec![0u8; oor_blocks as usize * BLOCK_SIZE];
            out_of_range("read", ftl.read(oor_lba, &mut b))?
        }
        2 => out_of_range("trim", ftl.trim(oor_lba, oor_blocks))?,
        3 => {
            let len = (blocks as usize % 3) * BLOCK_SIZE + 1 + (raw as usize % (BLOCK_SIZE - 1));
            match ftl.write(in_lba, &vec![0x5a; len], false, StreamId(1)) {
                Err(Error::Unaligned(_)) => {}
                other => {
                    return Err(format!(
                        "write of {len} bytes: {other:?}, expected Unaligned"
                    ))
                }
            }
        }
        4 => {
            let len = (blocks as usize % 3) * BLOCK_SIZE + 1 + (raw as usize % (BLOCK_SIZE - 1));
            match ftl.read(in_lba, &mut vec![0; len]) {
                Err(Error::Unaligned(_)) => {}
                other => {
                    return Err(format!(
                        "read of {len} bytes: {other:?}, expected Unaligned"
                    ))
                }
            }
        }
        5 => {
            let stream = 8 + blocks % 248;
            match ftl.write(in_lba, &vec![0x77; BLOCK_SIZE], false, StreamId(stream)) {
                Err(Error::InvalidParameters(_)) => {}
                other => {
                    return Err(format!(
                        "write to stream {stream}: {other:?}, expected InvalidParameters"
                    ))
                }
            }
        }
        6 => {
            ftl.write(in_lba, &[], blocks & 1 == 1, StreamId(1))
                .map_err(|e| format!("empty write: {e}"))?;
            ftl.trim(in_lba, 0)
                .map_err(|e| format!("empty trim: {e}"))?;
            ftl.read(in_lba, &mut [])
                .map_err(|e| format!("empty read: {e}"))?;
        }
        7 => {
            // The cleaner's race: the map moved on since it listed the block.
            let e = ftl
                .map_entry(in_lba)
                .map_err(|e| format!("map_entry: {e}"))?;
            if let Some(pba) = e.pba() {
                let mut data = vec![0u8; BLOCK_SIZE];
                ftl.read(in_lba, &mut data)
                    .map_err(|e| format!("read: {e}"))?;
                let stale = MapEntry::new(pba ^ (1 + blocks as u32), e.crc());
                let r = ftl.relocate(in_lba, stale, &data, GC_STREAM);
                if is_no_space(&r) {
                    return Ok(Flow::NoSpace);
                }
                match r {
                    Ok(false) => {}
                    other => return Err(format!("relocate with stale entry {stale:?} (current {e:?}): {other:?}, expected Ok(false)")),
                }
            }
        }
        _ => {
            // Relocate with data that does not match the expected entry's checksum.
            let e = ftl
                .map_entry(in_lba)
                .map_err(|e| format!("map_entry: {e}"))?;
            if e.is_mapped() {
                let mut data = vec![0u8; BLOCK_SIZE];
                ftl.read(in_lba, &mut data)
                    .map_err(|e| format!("read: {e}"))?;
                data[blocks as usize * 16 % BLOCK_SIZE] ^= 0x40;
                match ftl.relocate(in_lba, e, &data, GC_STREAM) {
                    Err(Error::DataChecksum { .. }) => {}
                    other => {
                        return Err(format!(
                            "relocate with wrong data: {other:?}, expected DataChecksum"
                        ))
                    }
                }
            }
        }
    }
    // Nothing observable changed.
    check_read(ftl, m, in_lba, 1)?;
    Ok(Flow::Go)
}

enum FaultEnd {
    Continue,
    Crash,
    NoSpace,
}

fn set_fault(dev: &CrashDevice, idx: &MemIndex, kind: u8, on: bool) {
    let sw = match kind {
        0 => &dev.faults.writes,
        1 => &dev.faults.syncs,
        2 => &dev.faults.reads,
        _ => &idx.fail_commits,
    };
    sw.store(on, Ordering::SeqCst);
}

/// LBAs an operation may have changed (`None`: none).
fn touched(op: &Op) -> Option<(u64, u64)> {
    match *op {
        Op::Write { lba, blocks, .. } | Op::FuaWrite { lba, blocks, .. } => {
            Some(range(lba, blocks, 8))
        }
        Op::Trim { lba, blocks } | Op::WriteZeroes { lba, blocks } => Some(range(lba, blocks, 20)),
        _ => None,
    }
}

/// The blocks a FUA write of `op` makes durable once it completes.
fn fua_range(op: &Op) -> Option<(u64, u64)> {
    match *op {
        Op::Write {
            lba,
            blocks,
            fua: true,
            ..
        }
        | Op::FuaWrite { lba, blocks, .. } => Some(range(lba, blocks, 8)),
        _ => None,
    }
}

/// Runs `op` with fault `kind` injected; decides how the case goes on.
fn faulted(
    dev: &CrashDevice,
    idx: &MemIndex,
    ftl: &CrashFtl,
    m: &mut Model,
    op: &Op,
    kind: u8,
) -> Result<FaultEnd, String> {
    set_fault(dev, idx, kind, true);
    let r: ftl::Result<()> = match *op {
        Op::Write {
            lba,
            blocks,
            fua,
            stream,
        } => {
            let (l, b) = range(lba, blocks, 8);
            // Durable in the model, with FUA, only once it completed (`fua_range`).
            let data = m.write(l, b);
            ftl.write(l, &data, fua, StreamId(stream % USER_STREAMS))
        }
        Op::FuaWrite {
            lba,
            blocks,
            stream,
        } => {
            let (l, b) = range(lba, blocks, 8);
            let data = m.write(l, b);
            ftl.write(l, &data, true, StreamId(stream % USER_STREAMS))
        }
        Op::Trim { lba, blocks } | Op::WriteZeroes { lba, blocks } => {
            let (l, b) = range(lba, blocks, 20);
            m.trim(l, b);
            ftl.trim(l, b)
        }
        Op::Flush => ftl.flush(),
        Op::Checkpoint => ftl.checkpoint().map(|_| ()),
        Op::Read { lba, blocks } => {
            let (l, b) = range(lba, blocks, 8);
            let r = check_read(ftl, m, l, b);
            set_fault(dev, idx, kind, false);
            return match r {
                Ok(()) => Ok(FaultEnd::Continue),
                Err(e) if e.contains("I/O error") => {
                    // Not fatal: the same read works once the fault clears.
                    check_read(ftl, m, l, b)?;
                    Ok(FaultEnd::Continue)
                }
                Err(e) => Err(e),
            };
        }
        Op::Relocate { lba } => {
            let l = lba as u64 % SPAN;
            let e = ftl.map_entry(l).map_err(|e| format!("map_entry: {e}"))?;
            let mut data = vec![0u8; BLOCK_SIZE];
            match ftl.read(l, &mut data) {
                Ok(()) if e.is_mapped() => ftl.relocate(l, e, &data, GC_STREAM).map(|_| ()),
                Ok(()) => Ok(()),
                Err(err) => Err(err),
            }
        }
        // Not run under a fault.
        Op::Clean { .. } | Op::Invalid { .. } | Op::Crash { .. } | Op::Fault { .. } | Op::Close => {
            Ok(())
        }
    };
    set_fault(dev, idx, kind, false);
    let err = match r {
        Ok(()) => {
            if let Some((l, b)) = touched(op) {
                check_read(ftl, m, l, b)?;
            }
            if let Some((l, b)) = fua_range(op) {
                m.fua_completed(l, b);
            }
            return Ok(FaultEnd::Continue);
        }
        Err(Error::NoSpace) => return Ok(FaultEnd::NoSpace),
        Err(e) => e,
    };
    if !matches!(err, Error::Io { .. } | Error::Index(_)) {
        return Err(format!(
            "failed with {err:?}, not the injected I/O or index error"
        ));
    }
    // Reads keep working, buffered unflushed data included (except what the failed
    // operation itself may or may not have changed).
    let skip = touched(op).unwrap_or((0, 0));
    for l in (0..SPAN).filter(|&l| l < skip.0 || l >= skip.0 + skip.1) {
        check_read(ftl, m, l, 1).map_err(|e| format!("after {err}: {e}"))?;
    }
    if matches!(err, Error::Io { .. }) && kind <= 1 {
        // A failed log write or sync turns the device read-only.
        match ftl.write(0, &[], false, StreamId(1)) {
            Err(Error::ReadOnly(_)) => {}
            other => {
                return Err(format!(
                    "after {err}: an (empty) write gave {other:?}, expected ReadOnly"
                ))
            }
        }
        match ftl.flush() {
            Err(_) => {}
            Ok(()) => return Err(format!("after {err}: a flush succeeded")),
        }
    }
    if matches!((op, &err), (Op::Checkpoint, Error::Index(_))) {
        // A failed index commit is an error, retried by the next checkpoint.
        return Ok(FaultEnd::Continue);
    }
    Ok(FaultEnd::Crash)
}
