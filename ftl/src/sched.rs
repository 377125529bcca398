//! A concurrent scenario for schedule exploration (only with the `shuttle` feature).
//!
//! Several script threads run their [`Step`]s on one FTL (writes, FUA writes, FLUSHes,
//! TRIMs, read-your-writes, checkpoints, stream closing, relocation of a victim's live
//! blocks) while a crasher thread copies the device, the index, the staging area and the
//! history at whatever point the scheduler runs it: a power cut (a seeded subset of the
//! unsynced writes survives, the staging area does not) or the death of the process (every
//! completed device write and the staging area survive). Under shuttle only one thread
//! runs at a time, so that copy is one instant of the whole process. Afterwards the copy
//! is checked by the offline checker, reopened, and every LBA compared with the
//! [`History`] of the run.
//!
//! Who calls it: `tests/shuttle.rs` (random PCT schedules) and the `sched` fuzz target
//! (schedules chosen by the fuzzer). [`run`] must run inside a shuttle execution.

use crate::device::crash::CrashDevice;
use crate::error::Error;
use crate::index::mem::MemIndex;
use crate::model::{observe, Crash, History};
use crate::staging::StagingArea;
use crate::{FormatOptions, Ftl, StreamId, GC_STREAM};
use std::sync::{Arc, Mutex};

/// LBAs each script thread owns (thread `t`: `t * SPAN ..`); step LBAs are taken modulo.
pub const SPAN: u64 = 24;
/// Script threads at most.
pub const MAX_THREADS: usize = 4;

/// One step of a script thread.
#[derive(Debug, Clone, PartialEq, Eq, arbitrary::Arbitrary)]
pub enum Step {
    /// Write 1..=8 blocks in user stream `stream % 7`.
    Write {
        lba: u8,
        blocks: u8,
        fua: bool,
        stream: u8,
    },
    /// Trim 1..=16 blocks.
    Trim {
        lba: u8,
        blocks: u8,
    },
    Flush,
    /// Read one of the thread's own blocks: it must hold what the thread last wrote.
    Read {
        lba: u8,
    },
    Checkpoint,
    CloseStream {
        stream: u8,
    },
    /// Relocate up to `max` live blocks of the closed segment with the fewest live
    /// blocks (the greedy victim) into the GC stream, as the cleaner does.
    Clean {
        max: u8,
    },
}

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    pub threads: Vec<Vec<Step>>,
    pub crash: Crash,
    /// Picks which unsynced writes a power cut keeps.
    pub seed: u64,
    /// Fill the log first, so segments close, die, are freed, discarded and reused.
    pub prefill: bool,
}

type TinyFtl = Ftl<Latent, Arc<MemIndex>>;

/// The crash device, with every write, sync and discard taking time: the thread issuing
/// one yields first, so the scheduler runs others meanwhile (shuttle's PCT scheduler
/// lowers a yielding thread's priority), as a disk lets other threads run while an
/// operation is in flight. Without it, windows between two device operations of one
/// thread (a checkpoint's commit and its discards, say) would never fit another thread's
/// work. It also checks checkpoint rule 5 as it goes: nothing may be written into a range
/// whose discard is in flight.
pub struct Latent {
    dev: Arc<CrashDevice>,
    discarding: Mutex<Vec<(u64, u64)>>,
    violations: std::sync::atomic::AtomicU64,
}

/// Scheduling points a discard gives away (one for a write or a sync).
const DISCARD_YIELDS: usize = 16;

impl Latent {
    fn new(dev: Arc<CrashDevice>) -> Self {
        Latent {
            dev,
            discarding: Mutex::new(Vec::new()),
            violations: Default::default(),
        }
    }
}

impl crate::BlockDevice for Latent {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.dev.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let end = offset + buf.len() as u64;
        if lock(&self.discarding)
            .iter()
            .any(|&(o, l)| offset < o + l && o < end)
        {
            self.violations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        shuttle::thread::yield_now();
        self.dev.write_at(offset, buf)
    }
    fn sync(&self) -> std::io::Result<()> {
        // Durable: what completed before the sync was issued, not what lands during it.
        let mark = self.dev.sync_mark()?;
        shuttle::thread::yield_now();
        self.dev.sync_upto(mark)
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        lock(&self.discarding).push((offset, len));
        // A discard (a hole punch, a TRIM) takes far longer than a write.
        for _ in 0..DISCARD_YIELDS {
            shuttle::thread::yield_now();
        }
        let r = self.dev.discard(offset, len);
        lock(&self.discarding).retain(|&x| x != (offset, len));
        r
    }
    fn describe(&self) -> String {
        self.dev.describe()
    }
}

/// What the crasher copied.
struct Cut {
    history: History,
    index: MemIndex,
    image: Vec<u8>,
    staging: Option<Arc<StagingArea>>,
}

fn tiny() -> FormatOptions {
    FormatOptions {
        segment_bytes: Some(64 << 10),
        flash_page_bytes: Some(16 << 10),
        ..Default::default()
    }
}

/// Runs `s` and checks the crash it ends in. Call inside a shuttle execution.
pub fn run(s: &Scenario) -> Result<(), String> {
    let threads = s.threads.len().min(MAX_THREADS);
    let dev = Arc::new(CrashDevice::new(32 * (64 << 10)));
    let idx = Arc::new(MemIndex::new());
    crate::format(&dev, &idx, &tiny(), false).map_err(|e| e.to_string())?;
    let (f, _) = Ftl::open(
        Latent::new(dev.clone()),
        idx.clone(),
        crate::model::test_config(),
    )
    .map_err(|e| e.to_string())?;
    let f = Arc::new(f);
    let history = Arc::new(Mutex::new(History::new()));
    if s.prefill {
        prefill(&f, &history, threads)?;
    }
    let cut: Arc<Mutex<Option<Cut>>> = Arc::new(Mutex::new(None));
    let mut hs = Vec::new();
    for (t, script) in s.threads.iter().take(threads).enumerate() {
        let (f, h, script) = (f.clone(), history.clone(), script.clone());
        hs.push(shuttle::thread::spawn(move || {
            script_thread(&f, &h, t, &script)
        }));
    }
    {
        let (dev, idx, f, h, cut, crash, seed) = (
            dev.clone(),
            idx.clone(),
            f.clone(),
            history.clone(),
            cut.clone(),
            s.crash,
            s.seed,
        );
        hs.push(shuttle::thread::spawn(move || {
            let c = take_cut(&dev, &idx, &f, &h, crash, seed)?;
            *lock(&cut) = Some(c);
            Ok(())
        }));
    }
    let mut first = Ok(());
    for h in hs {
        let r = h.join().unwrap_or_else(|_| Err("a thread panicked".into()));
        first = first.and(r);
    }
    first?;
    let c = lock(&cut).take().ok_or("the crasher did not run")?;
    let v = f
        .device()
        .violations
        .load(std::sync::atomic::Ordering::Relaxed);
    if v > 0 {
        return Err(format!(
            "{v} writes went into a segment whose discard was in flight"
        ));
    }
    drop(f);
    check_cut(c, s.crash)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Free segments the prefill leaves.
const PREFILL_FREE: usize = 3;

/// Overwrites the LBAs the threads own, round after round, until only
/// [`PREFILL_FREE`] segments are free, without a checkpoint: the log is full of closed,
/// partly dead and dead segments, and the scenario's first checkpoints free (and discard)
/// segments while other threads are short of space.
fn prefill(f: &TinyFtl, h: &Mutex<History>, threads: usize) -> Result<(), String> {
    let n = threads as u64 * SPAN;
    let mut lba = 0;
    while f.free_segments() > PREFILL_FREE {
        let blocks = 8.min(n - lba);
        let (op, data) = lock(h).write(lba, blocks, false);
        f.write(lba, &data, false, StreamId(1 + (lba % 3) as u8))
            .map_err(|e| format!("prefill: {e}"))?;
        lock(h).complete(op);
        lba = (lba + blocks) % n;
    }
    Ok(())
}

fn script_thread(f: &TinyFtl, h: &Mutex<History>, t: usize, script: &[Step]) -> Result<(), String> {
    let base = t as u64 * SPAN;
    let range = |lba: u8, blocks: u8, max: u64| {
        let l = lba as u64 % SPAN;
        (base + l, (blocks as u64 % max + 1).min(SPAN - l))
    };
    for (i, step) in script.iter().enumerate() {
        let fail = |e: Error| format!("thread {t} step {i} {step:?}: {e}");
        match *step {
            Step::Write {
                lba,
                blocks,
                fua,
                stream,
            } => {
                let (lba, blocks) = range(lba, blocks, 8);
                let (op, data) = lock(h).write(lba, blocks, fua);
                match f.write(lba, &data, fua, StreamId(stream % 7)) {
                    Ok(()) => lock(h).complete(op),
                    // The tiny log has no cleaner: running out of space is allowed, and
                    // leaves the write undecided.
                    Err(Error::NoSpace) => lock(h).fail(op),
                    Err(e) => return Err(fail(e)),
                }
            }
            Step::Trim { lba, blocks } => {
                let (lba, blocks) = range(lba, blocks, 16);
                let op = lock(h).trim(lba, blocks);
                match f.trim(lba, blocks) {
                    Ok(()) => lock(h).complete(op),
                    Err(Error::NoSpace) => lock(h).fail(op),
                    Err(e) => return Err(fail(e)),
                }
            }
            Step::Flush => {
                let token = lock(h).flush_started();
                f.flush().map_err(fail)?;
                lock(h).flush_completed(token);
            }
            Step::Read { lba } => {
                let lba = base + lba as u64 % SPAN;
                let (want, versions) = {
                    let h = lock(h);
                    (
                        h.current(lba),
                        h.allowed(lba, crate::model::Crash::ProcessDeath),
                    )
                };
                let mut b = vec![0u8; 4096];
                f.read(lba, &mut b).map_err(fail)?;
                let got = observe(lba, &b);
                match want {
                    Some(w) if got != crate::model::Observed::Tag(w) => {
                        return Err(format!(
                            "thread {t} step {i}: read of lba {lba} returned {got:?}, the \
                             last completed write there was tag {w}"
                        ));
                    }
                    // The last write or TRIM failed (out of space): a version of this LBA
                    // the history allows, not anything (it was not checked at all; found
                    // by review, 2026-11-29).
                    None if !matches!(got, crate::model::Observed::Tag(v) if versions.contains(&v)) =>
                    {
                        return Err(format!(
                            "thread {t} step {i}: read of lba {lba} returned {got:?} after a \
                             failed write, allowed {versions:?}"
                        ));
                    }
                    _ => {}
                }
            }
            Step::Checkpoint => {
                f.checkpoint().map_err(fail)?;
            }
            Step::CloseStream { stream } => {
                f.close_stream(StreamId(stream % 8)).map_err(fail)?;
            }
            Step::Clean { max } => clean(f, max as usize).map_err(fail)?,
        }
    }
    Ok(())
}

/// Relocates up to `max` live blocks of the greedy victim (compare-and-swap per block).
fn clean(f: &TinyFtl, max: usize) -> crate::Result<()> {
    let victim = f
        .segment_snapshot()
        .into_iter()
        .filter(|s| s.segment != 0 && s.state == "closed" && s.valid > 0)
        .min_by_key(|s| s.valid);
    let Some(v) = victim else { return Ok(()) };
    let blocks = match f.live_blocks(v.segment) {
        Ok(b) => b,
        // Freed or reused since the snapshot: nothing to do.
        Err(Error::InvalidParameters(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut buf = crate::device::AlignedBuf::new(4096);
    for b in blocks.iter().take(max.max(1)) {
        if f.read_live(b, &mut buf)? {
            match f.relocate(b.lba, b.entry, &buf, GC_STREAM) {
                Ok(_) | Err(Error::NoSpace) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The crash: everything copied at this instant (no other thread runs meanwhile).
fn take_cut(
    dev: &CrashDevice,
    idx: &MemIndex,
    f: &TinyFtl,
    h: &Mutex<History>,
    crash: Crash,
    seed: u64,
) -> Result<Cut, String> {
    let history = lock(h).clone();
    let (index, image) = idx
        .snapshot_while(|| match crash {
            Crash::PowerCut => dev.power_cut_image(seed),
            Crash::ProcessDeath => dev.current_image(),
        })
        .map_err(|e| e.to_string())?;
    let image = image.map_err(|e| e.to_string())?;
    let staging = match crash {
        Crash::PowerCut => None,
        Crash::ProcessDeath => Some(f.staging().copy().map_err(|e| e.to_string())?),
    };
    Ok(Cut {
        history,
        index,
        image,
        staging,
    })
}

/// The checker must be clean on the copy (with the staging area, after a process death)
/// and every LBA must read what the history allows.
fn check_cut(c: Cut, crash: Crash) -> Result<(), String> {
    let dev = Arc::new(CrashDevice::from_image(c.image));
    let idx = Arc::new(c.index);
    let report = crate::check::check_staged(&dev, &idx, true, c.staging.clone())
        .map_err(|e| format!("check after the {crash:?}: {e}"))?;
    if !report.clean() {
        return Err(format!(
            "checker after the {crash:?}: {:?}",
            report.problems
        ));
    }
    let staging = match c.staging {
        Some(s) => s,
        None => StagingArea::in_memory(crate::staging::DEFAULT_SLOTS).map_err(|e| e.to_string())?,
    };
    let (f, _) = Ftl::open_staged(dev, idx, crate::model::test_config(), staging)
        .map_err(|e| format!("reopen after the {crash:?}: {e}"))?;
    let mut h = c.history;
    let mut b = vec![0u8; 4096];
    // Every LBA, not only the threads' spans: a relocation or recovery that maps data
    // onto an LBA outside them went unseen (found by review, 2026-11-29).
    for lba in 0..f.capacity_blocks() {
        f.read(lba, &mut b)
            .map_err(|e| format!("read {lba} after the {crash:?}: {e}"))?;
        h.settle(lba, observe(lba, &b), crash)?;
    }
    Ok(())
}
