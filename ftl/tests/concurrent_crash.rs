//! The concurrent crash harness: the real engine under many threads at once, crashed at
//! a random instant, every LBA checked against the per-LBA history of the run
//! ([`ftl::model::History`]).
//!
//! Each run, default [`Config`] (discard of freed segments on):
//! - writer threads, each owning a range of LBAs: writes of 1..8 blocks in random user
//!   streams, FUA writes, FLUSHes, TRIMs, and read-your-writes checks of what they wrote
//!   (exact, while the cleaner moves blocks under them);
//! - a background thread taking checkpoints and closing streams;
//! - the real cleaner runner (foreground and background cleaning, relocations into one
//!   GC stream or several, its own checkpoints, the write throttle), on a device kept
//!   nearly full so it runs all the time.
//!
//! Two kinds of crash:
//! - **power cut** (in process, on the crash-simulating device): at a seeded number of
//!   completed operations, the history, the index and the device are copied at one
//!   instant (the history lock, then the index lock, then the device's: no completion,
//!   commit or device write can fall between the copies); the device copy keeps a seeded
//!   subset of its unsynced block writes. The run is stopped, the copies are opened, the
//!   offline checker must find nothing, and every LBA must read a value the history
//!   allows after a power cut (what a completed FLUSH or FUA made durable, or later).
//! - **process death** (a real `kill -9`): this test binary runs itself as a child
//!   (`child_run`) on a file backing with a sled index and a file staging area, and
//!   reports every operation it issues and completes on stdout; the parent kills it at
//!   a seeded number of reports, reopens with the staging area, runs the checker and
//!   checks every LBA against the history under process-death rules (exactly the last
//!   completed write, or an operation in flight at the kill).
//!
//! CI runs a subset. `FTL_CRASH_SEEDS=N` runs N seeds of each kind (the soak:
//! `FTL_CRASH_SEEDS=2000 cargo test --release -p ftl --test concurrent_crash`);
//! `FTL_CRASH_SEED=S` runs seed S alone; `FTL_CRASH_FIRST_SEED=F` starts the N seeds at F
//! (soaks in parallel processes: the runs mostly wait on the simulated latencies). A
//! failure names its seed and what it found.

mod common;

use common::Watchdog;
use ftl::backing::{format_backing, open_backing_staged, StagingPlace};
use ftl::device::crash::CrashDevice;
use ftl::index::mem::MemIndex;
use ftl::model::{observe, Crash, History, Observed, Tag};
use ftl::{BlockDevice, Config, FormatOptions, FreeMode, Ftl, IndexStore, StreamId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Power cuts per CI run (about 1 s each, with the device latencies).
const CI_POWER_CUTS: u64 = 80;
/// Process deaths per CI run (a child process each, about 1 s).
const CI_KILLS: u64 = 30;
/// A run still going after this long is a hang (runs take about a second): the watchdog
/// fails the test with its seed rather than letting it wait for CI's limit.
const RUN_LIMIT: Duration = Duration::from_secs(240);

fn seeds(ci: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("FTL_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("FTL_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ci);
    let first = std::env::var("FTL_CRASH_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0u64);
    (first..first + n).collect()
}

/// What a run reports as it goes: operations issued, completed or failed.
trait Recorder: Send + Sync + 'static {
    /// A write about to be issued by `thread`: its id and the bytes to write.
    fn write(&self, thread: usize, lba: u64, blocks: u64, fua: bool) -> (u64, Vec<u8>);
    /// A trim about to be issued.
    fn trim(&self, thread: usize, lba: u64, blocks: u64) -> u64;
    /// A FLUSH about to be issued.
    fn flush(&self, thread: usize) -> u64;
    /// Operation `op` returned (`ok`: with `Ok`).
    fn done(&self, op: u64, ok: bool);
}

/// The shape of one run, drawn from its seed.
#[derive(Debug, Clone)]
struct Plan {
    seed: u64,
    writers: usize,
    /// LBAs each writer owns (writer `t` owns `t * per_writer ..`).
    per_writer: u64,
    /// Completed operations (or, for a kill, reports) before the crash.
    crash_after: u64,
    /// The cleaner relocates into several streams (by LBA) instead of one.
    gc_streams: bool,
}

impl Plan {
    fn new(seed: u64, capacity: u64, max_ops: u64) -> Self {
        let mut r = SmallRng::seed_from_u64(seed ^ 0x5eed);
        let writers = r.gen_range(2..=4);
        // Nearly full: the log wraps and the cleaner works all the time.
        let span = capacity * r.gen_range(80..=95) / 100;
        Plan {
            seed,
            writers,
            per_writer: span / writers as u64,
            crash_after: r.gen_range(1..=max_ops),
            gc_streams: r.gen_bool(0.5),
        }
    }
}

/// A geometry drawn from the seed: small segments, so segments fill, die, are cleaned,
/// freed, discarded and reused within a few thousand operations; flash pages from 4 KiB
/// to 32 KiB.
/// The engine's configuration for `seed`: every other pair of seeds keeps the map cache
/// at its least (two pages of a map of 4-6), so writers, relocations, checkpoints and
/// recovery miss and evict map pages all the time. Odd seeds discard freed segments as
/// they are freed (checkpoint rule 5); even seeds a nanosecond later, from the runner and
/// after each checkpoint, while writers may be taking them (discard rules 1 and 2).
fn config(seed: u64) -> Config {
    Config {
        map_cache_bytes: if (seed / 3) % 2 == 1 {
            0
        } else {
            Config::default().map_cache_bytes
        },
        discard_delay: if seed % 2 == 1 {
            Duration::ZERO
        } else {
            Duration::from_nanos(1)
        },
        ..Config::default()
    }
}

fn geometry(seed: u64) -> (u64, FormatOptions) {
    let (size, seg, page) = match seed % 3 {
        0 => (8u64 << 20, 64u64 << 10, 16u32 << 10),
        1 => (16 << 20, 128 << 10, 4 << 10),
        _ => (16 << 20, 256 << 10, 32 << 10),
    };
    (
        size,
        FormatOptions {
            segment_bytes: Some(seg),
            flash_page_bytes: Some(page),
            ..Default::default()
        },
    )
}

/// One writer thread: random operations on its own LBAs until `stop`; every read of
/// its own LBAs must return exactly what it last wrote there. With `pool`, the chunks
/// its writes fill are written by that pool, as the daemon's are (`Ftl::write_via`).
fn writer<D: BlockDevice, I: IndexStore>(
    f: &Ftl<D, I>,
    rec: &dyn Recorder,
    plan: &Plan,
    t: usize,
    stop: &AtomicBool,
    pool: Option<&ftl::ChunkWriters>,
) -> Result<(), String> {
    let mut r = SmallRng::seed_from_u64(plan.seed.wrapping_mul(31).wrapping_add(t as u64));
    let base = t as u64 * plan.per_writer;
    let span = plan.per_writer;
    let mut mine: HashMap<u64, Tag> = HashMap::new();
    let mut written: Vec<u64> = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        if written.len() > 4096 {
            written.drain(..2048);
        }
        let lba = base + r.gen_range(0..span);
        let blocks = r.gen_range(1..=8u64).min(base + span - lba);
        let what = r.gen_range(0..100);
        let err = |op: &str, e: ftl::Error| format!("writer {t}, op {n}: {op}: {e}");
        match what {
            0..=59 => {
                let fua = what < 10;
                let stream = StreamId(r.gen_range(0..7));
                let (op, data) = rec.write(t, lba, blocks, fua);
                let res = match pool {
                    Some(p) => f.write_via(lba, &data, fua, stream, p),
                    None => f.write(lba, &data, fua, stream),
                };
                rec.done(op, res.is_ok());
                res.map_err(|e| err("write", e))?;
                for (i, l) in (lba..lba + blocks).enumerate() {
                    if let Observed::Tag(tag) = observe(l, &data[i * 4096..(i + 1) * 4096]) {
                        mine.insert(l, tag);
                        written.push(l);
                    }
                }
            }
            60..=69 => {
                let op = rec.flush(t);
                let res = f.flush();
                rec.done(op, res.is_ok());
                res.map_err(|e| err("flush", e))?;
            }
            70..=77 => {
                let blocks = r.gen_range(1..=32u64).min(base + span - lba);
                let op = rec.trim(t, lba, blocks);
                let res = f.trim(lba, blocks);
                rec.done(op, res.is_ok());
                res.map_err(|e| err("trim", e))?;
                for l in lba..lba + blocks {
                    mine.insert(l, 0);
                }
            }
            78..=81 => {
                // A large read of its own range (read your writes, every block): goes
                // through the gap-spanning batched reads and may queue the window for
                // read-driven defragmentation, which the cleaner's runner and the
                // background thread rewrite by relocations while writers go on.
                let n = r.gen_range(16..=32u64).min(base + span - lba);
                let mut big = vec![0u8; n as usize * 4096];
                f.read(lba, &mut big).map_err(|e| err("large read", e))?;
                for (i, l) in (lba..lba + n).enumerate() {
                    let want = mine.get(&l).copied().unwrap_or(0);
                    match observe(l, &big[i * 4096..(i + 1) * 4096]) {
                        Observed::Tag(got) if got == want => {}
                        got => {
                            return Err(format!(
                                "writer {t}, op {n}: large read at {lba}: lba {l} returned \
                                 {got:?}, the last completed write there was tag {want}"
                            ))
                        }
                    }
                }
            }
            _ => {
                // Read your writes: mostly a block this thread wrote, else any of its own.
                let l = if !written.is_empty() && r.gen_bool(0.8) {
                    written[r.gen_range(0..written.len())]
                } else {
                    lba
                };
                f.read(l, &mut buf).map_err(|e| err("read", e))?;
                let want = mine.get(&l).copied().unwrap_or(0);
                match observe(l, &buf) {
                    Observed::Tag(got) if got == want => {}
                    got => {
                        return Err(format!(
                            "writer {t}, op {n}: read of lba {l} returned {got:?}, the last \
                             completed write there was tag {want}"
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

/// The background thread: checkpoints, frees dead segments by free records (sealing their
/// killers' chunks, or only the settled ones), rewrites
/// windows queued for defragmentation and closes streams at random moments.
fn background<D: BlockDevice, I: IndexStore>(
    f: &Ftl<D, I>,
    seed: u64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut r = SmallRng::seed_from_u64(seed ^ 0xbac6);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_micros(r.gen_range(100..3000)));
        let x = r.gen_range(0..10);
        if x < 3 {
            f.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
        } else if x < 4 {
            f.free_dead().map_err(|e| format!("free_dead: {e}"))?;
        } else if x < 5 {
            f.free_dead_with(FreeMode::Settled)
                .map_err(|e| format!("free_dead settled: {e}"))?;
        } else if x < 7 {
            f.defrag_step(4).map_err(|e| format!("defrag_step: {e}"))?;
        } else {
            let s = StreamId(r.gen_range(0..8));
            f.close_stream(s)
                .map_err(|e| format!("close_stream({}): {e}", s.0))?;
        }
    }
    Ok(())
}

/// The state of free space and cleaning, for a failure message (a writer that ran out of
/// space although the cleaner runs).
fn space_report<D: BlockDevice, I: IndexStore>(
    f: &Ftl<D, I>,
    cleaner: &cleaner::CleanerHandle,
) -> String {
    let snap = f.segment_snapshot();
    let bps = f.geometry().blocks_per_segment();
    let mut closed: Vec<u32> = snap
        .iter()
        .filter(|s| s.segment != 0 && s.state == "closed")
        .map(|s| s.valid)
        .collect();
    closed.sort_unstable();
    let open: Vec<String> = snap
        .iter()
        .filter(|s| s.state == "open")
        .map(|s| format!("{}:s{}:{}", s.segment, s.stream, s.valid))
        .collect();
    let pct = |q: usize| closed.get(closed.len() * q / 100).copied().unwrap_or(0);
    format!(
        "free {}, dead {}, closed {} (valid of {bps}: min {} p50 {} max {}), open [{}], \
         write delay {:?}, cleaner {:?}, last error {:?}",
        f.free_segments(),
        f.dead_segments(),
        closed.len(),
        pct(0),
        pct(50),
        closed.last().copied().unwrap_or(0),
        open.join(" "),
        f.write_pace(),
        cleaner.stats(),
        cleaner.last_error()
    )
}

/// Starts the cleaner runner the way the daemon does (default configuration).
fn start_cleaner<D, I>(f: &Arc<Ftl<D, I>>, plan: &Plan) -> cleaner::CleanerHandle
where
    D: BlockDevice + 'static,
    I: IndexStore + 'static,
{
    let cfg = cleaner::CleanerConfig::default();
    let r = if plan.gc_streams {
        cleaner::spawn_with_gc_stream(f.clone(), cfg, |lba| StreamId(4 + (lba % 4) as u8))
    } else {
        cleaner::spawn(f.clone(), cfg)
    };
    r.expect("cleaner thread")
}

/// Runs the writers and the background thread on `f` until `stop`; returns the first
/// failure any of them reported.
fn run_threads<D, I>(
    f: &Arc<Ftl<D, I>>,
    rec: &Arc<dyn Recorder>,
    plan: &Plan,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Result<(), String>>>
where
    D: BlockDevice + 'static,
    I: IndexStore + 'static,
{
    let mut hs = Vec::new();
    // Odd writers hand their full chunks to a pool of chunk writers, as the daemon does;
    // even ones write them themselves.
    let pool = Arc::new(ftl::ChunkWriters::spawn(f, 2, "crash-chunk-writer").expect("pool"));
    for t in 0..plan.writers {
        let (f, rec, plan, stop) = (f.clone(), rec.clone(), plan.clone(), stop.clone());
        let pool = (t % 2 == 1).then(|| pool.clone());
        hs.push(std::thread::spawn(move || {
            let r = writer(&*f, &*rec, &plan, t, &stop, pool.as_deref());
            if let Err(e) = &r {
                // Said at once: a child killed before every thread is joined still
                // tells its parent.
                println!("FAIL {e}");
                stop.store(true, Ordering::SeqCst);
            }
            r
        }));
    }
    let (f, seed, stop) = (f.clone(), plan.seed, stop.clone());
    hs.push(std::thread::spawn(move || {
        let r = background(&*f, seed, &stop);
        if let Err(e) = &r {
            println!("FAIL {e}");
            stop.store(true, Ordering::SeqCst);
        }
        r
    }));
    hs
}

fn join_all(hs: Vec<std::thread::JoinHandle<Result<(), String>>>) -> Result<(), String> {
    let mut first = Ok(());
    for h in hs {
        let r = h.join().unwrap_or_else(|_| Err("a thread panicked".into()));
        if first.is_ok() {
            first = r;
        }
    }
    first
}

// ----- power cut -----

/// Real-device latencies, drawn from the seed and a call count: each call pauses, with
/// `chance` percent, for up to `max_us` microseconds.
struct Jitter {
    seed: u64,
    calls: AtomicU64,
}

impl Jitter {
    fn new(seed: u64) -> Self {
        Jitter {
            seed,
            calls: AtomicU64::new(0),
        }
    }

    fn pause(&self, max_us: u64, chance: u64) {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let x = (n ^ self.seed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
        if x % 100 < chance {
            std::thread::sleep(Duration::from_micros(x % max_us.max(1)));
        }
    }
}

/// The crash device with real-device latencies: a discard takes up to a few
/// milliseconds (a hole punch or a TRIM), a sync up to half a millisecond, some writes
/// and reads a little. Without them the in-memory device completes each operation at
/// once, and the windows between two threads' steps never open as they do on a disk.
struct Jittery {
    dev: Arc<CrashDevice>,
    jitter: Jitter,
}

impl BlockDevice for Jittery {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.jitter.pause(100, 10);
        self.dev.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.jitter.pause(100, 20);
        self.dev.write_at(offset, buf)
    }
    fn sync(&self) -> std::io::Result<()> {
        // Durable: what completed before the sync was issued, not what lands during it.
        let mark = self.dev.sync_mark()?;
        self.jitter.pause(500, 50);
        self.dev.sync_upto(mark)
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.jitter.pause(3000, 80);
        self.dev.discard(offset, len)
    }
    fn describe(&self) -> String {
        self.dev.describe()
    }
}

/// The in-memory index with the latency of sled's commits (about a millisecond on the
/// disk, `docs/steady.md`): a commit waits a little before its batch applies (durable
/// only once applied) and a little after (durable, its caller not yet told), so the
/// engine's threads interleave around commits as they do on a disk.
struct JitteryIndex {
    idx: Arc<MemIndex>,
    jitter: Jitter,
}

impl IndexStore for JitteryIndex {
    fn load(&self) -> ftl::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.idx.load()
    }
    fn load_kind(&self, kind: u8) -> ftl::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.idx.load_kind(kind)
    }
    fn reader(&self) -> Arc<dyn ftl::index::IndexReader> {
        self.idx.reader()
    }
    fn commit(&self, ops: Vec<ftl::index::Op>) -> ftl::Result<()> {
        self.jitter.pause(800, 50);
        self.idx.commit(ops)?;
        self.jitter.pause(300, 30);
        Ok(())
    }
    fn clear(&self) -> ftl::Result<()> {
        self.idx.clear()
    }
}

/// The in-process recorder: the history itself, behind one lock.
struct Recorded {
    h: Mutex<History>,
    flush_tokens: Mutex<HashMap<u64, u64>>,
    next_flush: AtomicU64,
    completed: AtomicU64,
}

const FLUSH_ID: u64 = 1 << 62;

impl Recorded {
    fn new() -> Self {
        Recorded {
            h: Mutex::new(History::new()),
            flush_tokens: Mutex::new(HashMap::new()),
            next_flush: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }
    }
}

impl Recorder for Recorded {
    fn write(&self, _t: usize, lba: u64, blocks: u64, fua: bool) -> (u64, Vec<u8>) {
        self.h.lock().unwrap().write(lba, blocks, fua)
    }
    fn trim(&self, _t: usize, lba: u64, blocks: u64) -> u64 {
        self.h.lock().unwrap().trim(lba, blocks)
    }
    fn flush(&self, _t: usize) -> u64 {
        let id = FLUSH_ID | self.next_flush.fetch_add(1, Ordering::Relaxed);
        let token = self.h.lock().unwrap().flush_started();
        self.flush_tokens.lock().unwrap().insert(id, token);
        id
    }
    fn done(&self, op: u64, ok: bool) {
        let mut h = self.h.lock().unwrap();
        if op & FLUSH_ID != 0 {
            let token = self.flush_tokens.lock().unwrap().remove(&op);
            if let (true, Some(token)) = (ok, token) {
                h.flush_completed(token);
            }
        } else if ok {
            h.complete(op);
        } else {
            h.fail(op);
        }
        self.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Watches progress: fails when no operation completes for this long.
const STUCK: Duration = Duration::from_secs(30);

/// What one power-cut run exercised, for the test to show that the runs, together,
/// exercised what they claim to.
struct Exercised {
    summary: String,
    /// Free records committed while a checkpoint ran (checkpoint rule 8).
    beside: u64,
    /// Segments a checkpoint freed by its own records (checkpoint rule 9).
    early: u64,
    defragged: u64,
    /// Blocks the cleaner had relocated when the power went.
    copied_at_cut: u64,
    /// Unsynced block writes the cut lost.
    lost_at_cut: usize,
}

/// One power-cut run and what it exercised.
fn power_cut_run(seed: u64) -> Result<Exercised, String> {
    let (size, opts) = geometry(seed);
    let dev = Arc::new(CrashDevice::new(size));
    let idx = Arc::new(MemIndex::new());
    ftl::format(&dev, &idx, &opts, false).map_err(|e| e.to_string())?;
    let jittery = Jittery {
        dev: dev.clone(),
        jitter: Jitter::new(seed),
    };
    let index = JitteryIndex {
        idx: idx.clone(),
        jitter: Jitter::new(seed.rotate_left(17)),
    };
    let (f, _) = Ftl::open(jittery, index, config(seed)).map_err(|e| format!("open: {e}"))?;
    let cap = f.capacity_blocks();
    let plan = Plan::new(seed, cap, 4000);
    let f = Arc::new(f);
    let rec = Arc::new(Recorded::new());
    let dynrec: Arc<dyn Recorder> = rec.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let cleaner = start_cleaner(&f, &plan);
    let threads = run_threads(&f, &dynrec, &plan, &stop);
    // Wait for the crash instant.
    let mut last = (0, Instant::now());
    while rec.completed.load(Ordering::Relaxed) < plan.crash_after && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_micros(200));
        let c = rec.completed.load(Ordering::Relaxed);
        if c != last.0 {
            last = (c, Instant::now());
        } else if last.1.elapsed() > STUCK {
            stop.store(true, Ordering::SeqCst);
            return Err(format!(
                "no operation completed for {STUCK:?} ({c} done): {plan:?}"
            ));
        }
    }
    // The cut: history, index and device at one instant.
    let (history, (index, image), copied_at_cut) = {
        let h = rec.h.lock().unwrap();
        let (index, image) = idx
            .snapshot_while(|| dev.power_cut_image_counted(seed))
            .map_err(|e| e.to_string())?;
        let copied = cleaner.stats().cleaner.blocks_copied;
        (
            h.clone(),
            (index, image.map_err(|e| e.to_string())?),
            copied,
        )
    };
    let (image, _, lost_at_cut) = image;
    let ops = rec.completed.load(Ordering::Relaxed);
    stop.store(true, Ordering::SeqCst);
    let ran = join_all(threads);
    let stats = cleaner.stats();
    let space = space_report(&f, &cleaner);
    let last_error = cleaner.last_error();
    let joined = cleaner.join();
    ran.map_err(|e| format!("{e} ({plan:?})\n  space: {space}"))?;
    // The cleaner's own failures are failures: a victim shunned for a checksum error
    // (engine rule 8's symptom), a failed turn or checkpoint, a panic (writers free space
    // themselves then, and every check below would still pass).
    joined?;
    // A cleaner that failed fails the seed, after the checks below say whether the data
    // came through it.
    let cleaner_failed = cleaner_clean(&stats, last_error).err();
    let fs = f.stats();
    let (map, frag) = (fs.map_cache, fs.fragmentation);
    drop(f);
    let dev = Arc::new(CrashDevice::from_image(image));
    let idx = Arc::new(index);
    check_after(&dev, &idx, history, Crash::PowerCut, cap, config(seed)).map_err(|e| {
        let also = cleaner_failed.as_deref().unwrap_or("");
        format!("{e}\n  {plan:?}, {ops} ops, cleaner {stats:?}\n  {also}")
    })?;
    if let Some(e) = cleaner_failed {
        return Err(format!(
            "{e} (every LBA read what the history allows after the cut)\n  space: {space}"
        ));
    }
    let summary = format!(
        "{ops} ops, {} relocated, {} cleaned, {} checkpoints, {} free records, \
         {} map pages missed, {} evicted, {} windows queued, {} defragmented ({} blocks moved)",
        stats.cleaner.blocks_copied,
        stats.cleaner.segments_cleaned,
        stats.checkpoints,
        stats.frees,
        map.misses,
        map.evictions,
        frag.defrag_queued,
        frag.defrag_windows,
        frag.defrag_moved_blocks
    );
    Ok(Exercised {
        summary,
        beside: fs.free_records_beside_checkpoints,
        early: fs.segments_freed_early_by_checkpoints,
        defragged: frag.defrag_moved_blocks,
        copied_at_cut,
        lost_at_cut,
    })
}

/// The cleaner ran without an error, and set aside no victim. Its "device full" was
/// counted here instead of failing the seed from 97dc2ce to the fix of its cause: a
/// relocation that found no free segment missed the segments a checkpoint released
/// before it looked at the dead list (`a_segment_freed_while_a_relocation_finds_no_room_is_not_missed`
/// in the engine's tests).
///
/// Nor did it find live blocks through the map that a victim's chunk summaries did not
/// name (`unnamed_live_found`): that is its answer to a damaged summary, and these runs
/// damage none, so a block found so would be one the walk of the log missed, repaired
/// out of sight.
fn cleaner_clean(stats: &cleaner::RunnerStats, last_error: Option<String>) -> Result<(), String> {
    if stats.errors > 0 || stats.cleaner.victims_abandoned > 0 {
        return Err(format!(
            "the cleaner failed: {} errors, {} victims set aside, last error {last_error:?}",
            stats.errors, stats.cleaner.victims_abandoned
        ));
    }
    if stats.cleaner.unnamed_live_found > 0 {
        return Err(format!(
            "the cleaner found {} live blocks through the map that its victims' summaries \
             did not name, with no summary damaged",
            stats.cleaner.unnamed_live_found
        ));
    }
    Ok(())
}

/// Reopens after a crash: the checker must be clean and every LBA must hold a value the
/// history allows.
fn check_after<D: BlockDevice, I: IndexStore>(
    dev: D,
    idx: I,
    mut h: History,
    crash: Crash,
    cap: u64,
    cfg: Config,
) -> Result<(), String> {
    let report = ftl::check::check(&dev, &idx, true).map_err(|e| format!("check: {e}"))?;
    if !report.clean() {
        return Err(format!(
            "checker after the {crash:?}: {:#?}",
            report.problems
        ));
    }
    let (f, open) = Ftl::open(dev, idx, cfg).map_err(|e| format!("reopen: {e}"))?;
    let mut b = vec![0u8; 4096];
    let mut bad = Vec::new();
    for lba in 0..cap {
        f.read(lba, &mut b)
            .map_err(|e| format!("read {lba} after the {crash:?}: {e}"))?;
        if let Err(e) = h.settle(lba, observe(lba, &b), crash) {
            bad.push(e);
        }
    }
    if !bad.is_empty() {
        return Err(format!(
            "{} LBAs wrong after the {crash:?} (recovery {:?}):\n  {}",
            bad.len(),
            open.recovery,
            bad.iter().take(8).cloned().collect::<Vec<_>>().join("\n  ")
        ));
    }
    Ok(())
}

#[test]
fn power_cuts_at_random_instants_lose_nothing_acknowledged() {
    let mut failures = Vec::new();
    let seeds = seeds(CI_POWER_CUTS);
    let mut summary = None;
    let (mut beside, mut early, mut defragged, mut cleaning, mut losing) = (0, 0, 0, 0, 0);
    for &seed in &seeds {
        let _watchdog = Watchdog::arm(format!("power-cut run of seed {seed}"), RUN_LIMIT);
        match power_cut_run(seed) {
            Ok(x) => {
                summary = Some(x.summary);
                beside += u64::from(x.beside > 0);
                early += u64::from(x.early > 0);
                defragged += u64::from(x.defragged > 0);
                cleaning += u64::from(x.copied_at_cut > 0);
                losing += u64::from(x.lost_at_cut > 0);
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!(
        "power cuts: {} seeds, {} failed, {beside} with free records beside a checkpoint, \
         {early} with segments freed by a checkpoint's own records, {defragged} with blocks \
         defragmented, {cleaning} cut after the cleaner relocated blocks, {losing} whose cut \
         lost unsynced writes (last run: {})",
        seeds.len(),
        failures.len(),
        summary.unwrap_or_default()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The runs cut a device being cleaned, and the cuts lose writes: a harness whose
    // cleaner never ran before the cut, or whose cut kept every unsynced write, would
    // pass every check above (found by review, 2026-11-29).
    let n = seeds.len() as u64;
    assert!(
        n < 10 || cleaning * 4 >= n,
        "{cleaning} of {n} runs were cut after the cleaner relocated a block"
    );
    assert!(
        n < 10 || losing * 4 >= n,
        "{losing} of {n} runs lost an unsynced write at the cut"
    );
    assert!(
        seeds.len() < 10 || beside > 0,
        "no free record ran beside a checkpoint: checkpoint rule 8 was not exercised"
    );
    assert!(
        seeds.len() < 10 || early > 0,
        "no checkpoint freed a segment by its own record: checkpoint rule 9 was not exercised"
    );
    // Defragmentation beside the writers and the power cut: every seed could pass with
    // nothing moved (found by review, 2026-11-29).
    assert!(
        seeds.len() < 10 || defragged > 0,
        "no run defragmented a block: defragmentation under power cuts was not exercised"
    );
}

// ----- process death -----

const CHILD_DIR: &str = "FTL_CONCURRENT_CHILD_DIR";
const CHILD_SEED: &str = "FTL_CONCURRENT_CHILD_SEED";

/// The child's recorder: every event is one line on stdout, written before the
/// operation starts (issue) or after it returned (done), so the parent knows at least
/// everything that can have happened.
struct Printed {
    next: Vec<AtomicU64>,
}

impl Printed {
    fn id(&self, t: usize, n: u64) -> u64 {
        ((t as u64 + 1) << 40) | self.next[t].fetch_add(n, Ordering::Relaxed)
    }
    fn line(&self, s: std::fmt::Arguments<'_>) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    }
}

impl Recorder for Printed {
    fn write(&self, t: usize, lba: u64, blocks: u64, fua: bool) -> (u64, Vec<u8>) {
        let op = self.id(t, 1);
        let first = self.id(t, blocks);
        self.line(format_args!("W {op} {lba} {blocks} {} {first}", fua as u8));
        let mut data = Vec::with_capacity(blocks as usize * 4096);
        for i in 0..blocks {
            data.extend_from_slice(&ftl::model::block_for(lba + i, first + i));
        }
        (op, data)
    }
    fn trim(&self, t: usize, lba: u64, blocks: u64) -> u64 {
        let op = self.id(t, 1);
        self.line(format_args!("T {op} {lba} {blocks}"));
        op
    }
    fn flush(&self, t: usize) -> u64 {
        let op = self.id(t, 1);
        self.line(format_args!("F {op}"));
        op
    }
    fn done(&self, op: u64, ok: bool) {
        self.line(format_args!("{} {op}", if ok { "D" } else { "E" }));
    }
}

fn child_paths(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    (dir.join("b.img"), dir.join("b.idx"), dir.join("stage"))
}

#[test]
#[ignore = "the child process of process_deaths_at_random_instants_lose_no_completed_write"]
fn child_run() {
    let dir = std::env::var(CHILD_DIR).expect("run by the kill test");
    let seed: u64 = std::env::var(CHILD_SEED).unwrap().parse().unwrap();
    let (img, idx, stage) = child_paths(Path::new(&dir));
    // Dies with the parent (a test process aborted by its watchdog must not leave a
    // child writing on, holding cargo's output pipe open).
    // SAFETY: prctl(2) with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // The parent formatted the index a moment ago; sled lets go of its lock a moment
    // after the last handle is dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (f, _) = loop {
        match open_backing_staged(&img, &idx, config(seed), &StagingPlace::Dir(stage.clone())) {
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => break r.expect("child open"),
        }
    };
    let plan = Plan::new(seed, f.capacity_blocks(), 1);
    let f = Arc::new(f);
    let rec: Arc<dyn Recorder> = Arc::new(Printed {
        next: (0..plan.writers).map(|_| AtomicU64::new(0)).collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    // libtest has printed "test child_run ... " without a newline: end that line, or the
    // first report would be glued to it.
    println!();
    let cleaner = Arc::new(start_cleaner(&f, &plan));
    // The cleaner's own failures end the child too (its report is a FAIL line).
    {
        let cleaner = cleaner.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(20));
            if let Err(e) = cleaner_clean(&cleaner.stats(), cleaner.last_error()) {
                println!("FAIL {e}");
                std::process::exit(3);
            }
        });
    }
    let threads = run_threads(&f, &rec, &plan, &stop);
    // Runs until killed; a failure ends the child early with its reason.
    if let Err(e) = join_all(threads) {
        println!("FAIL {e}; space: {}", space_report(&f, &cleaner));
        std::process::exit(3);
    }
}

/// Opens the sled index at `dir`, waiting out the lock its last user lets go of a moment
/// after its last handle was dropped.
fn open_index_waiting(dir: &Path) -> Result<ftl::index::sled_store::SledIndex, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ftl::index::sled_store::SledIndex::open(dir) {
            Ok(i) => return Ok(i),
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("index: {e}")),
        }
    }
}

/// The parent's view of the child's reports, as a history.
struct Replayed {
    h: History,
    ops: HashMap<u64, u64>,
    flushes: HashMap<u64, u64>,
    reports: u64,
}

impl Replayed {
    fn line(&mut self, line: &str) -> Result<(), String> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            w.get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad report {line:?}"))
        };
        match w.first().copied() {
            Some("W") => {
                let op = self.h.write_tagged(num(2)?, num(3)?, num(4)? == 1, num(5)?);
                self.ops.insert(num(1)?, op);
            }
            Some("T") => {
                let op = self.h.trim(num(2)?, num(3)?);
                self.ops.insert(num(1)?, op);
            }
            Some("F") => {
                let token = self.h.flush_started();
                self.flushes.insert(num(1)?, token);
            }
            // The child injects no faults and every thread fails on any error: an "E" is
            // a failure, reported here at once (its "FAIL" line comes only after every
            // thread was joined, and a kill in between let the error pass; found by
            // review, 2026-11-29).
            Some("E") => return Err(format!("the child's operation failed: {line}")),
            Some("D") => {
                let id = num(1)?;
                if let Some(token) = self.flushes.remove(&id) {
                    self.h.flush_completed(token);
                } else if let Some(&op) = self.ops.get(&id) {
                    self.h.complete(op)
                }
            }
            Some("FAIL") => return Err(format!("the child failed: {line}")),
            _ => return Ok(()), // the test harness's own lines
        }
        self.reports += 1;
        Ok(())
    }
}

/// What a kill run saw: reports read, and entries the staging area gave back.
struct KillRun {
    reports: u64,
    staged_entries: u64,
}

fn kill_run(seed: u64) -> Result<KillRun, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (img, idx, stage) = child_paths(dir.path());
    let (size, opts) = geometry(seed);
    format_backing(&img, &idx, Some(size), &opts, false).map_err(|e| e.to_string())?;
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args([
            "--ignored",
            "--exact",
            "child_run",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .env(CHILD_SEED, seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let watchdog = Watchdog::arm(format!("process-death run of seed {seed}"), RUN_LIMIT);
    watchdog.kill_on_expiry(child.id());
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut r = SmallRng::seed_from_u64(seed ^ 0x4b11);
    let kill_after: u64 = r.gen_range(1..=6000);
    let mut seen = Replayed {
        h: History::new(),
        ops: HashMap::new(),
        flushes: HashMap::new(),
        reports: 0,
    };
    let mut result = Ok(());
    while seen.reports < kill_after {
        match lines.next() {
            Some(Ok(l)) => {
                if let Err(e) = seen.line(&l) {
                    result = Err(e);
                    break;
                }
            }
            _ => {
                result = Err("the child ended before it was killed".to_string());
                break;
            }
        }
    }
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    // Reports already in the pipe happened before the kill, too.
    for l in lines.map_while(|l| l.ok()) {
        if let Err(e) = seen.line(&l) {
            result = result.and(Err(e));
        }
    }
    // Reaped below: its pid may be reused, so the watchdog no longer kills it.
    watchdog.kill_on_expiry(0);
    let _ = child.wait();
    result?;
    // The checker over the killed image and what the child staged, as `ftlblk check`
    // sees them before anything reopens the backing (read-only).
    {
        let dev = ftl::backing::open_device(&img, None).map_err(|e| e.to_string())?;
        let index = open_index_waiting(&idx)?;
        let (sb, _) = ftl::read_superblock_readonly(&dev).map_err(|e| e.to_string())?;
        let staged = ftl::backing::staging_file(&stage, &sb.uuid_string());
        let area = if staged.exists() {
            Some(
                ftl::staging::StagingArea::open_file_snapshot(&staged)
                    .map_err(|e| format!("staging file: {e}"))?,
            )
        } else {
            None
        };
        let report = ftl::check::check_staged(&dev, &index, true, area)
            .map_err(|e| format!("check of the killed image: {e}"))?;
        if !report.clean() {
            return Err(format!(
                "checker on the killed image: {:#?}",
                report.problems
            ));
        }
    }
    // Reopen as `ftlblk recover` does: the staging area gives back what the child staged.
    let (f, rep) = open_backing_staged(&img, &idx, config(seed), &StagingPlace::Dir(stage))
        .map_err(|e| format!("reopen after the kill: {e}"))?;
    let cap = f.capacity_blocks();
    let mut b = vec![0u8; 4096];
    let mut bad = Vec::new();
    for lba in 0..cap {
        f.read(lba, &mut b)
            .map_err(|e| format!("read {lba} after the kill: {e}"))?;
        if let Err(e) = seen.h.settle(lba, observe(lba, &b), Crash::ProcessDeath) {
            bad.push(e);
        }
    }
    f.close().map_err(|e| format!("close: {e}"))?;
    drop(f);
    if !bad.is_empty() {
        return Err(format!(
            "{} LBAs wrong after the kill at {} reports (recovery {:?}):\n  {}",
            bad.len(),
            seen.reports,
            rep.recovery,
            bad.iter().take(8).cloned().collect::<Vec<_>>().join("\n  ")
        ));
    }
    let dev = ftl::backing::open_device(&img, None).map_err(|e| e.to_string())?;
    let index = open_index_waiting(&idx)?;
    let report = ftl::check::check(&dev, &index, true).map_err(|e| format!("check: {e}"))?;
    if !report.clean() {
        return Err(format!("checker after the kill: {:#?}", report.problems));
    }
    Ok(KillRun {
        reports: seen.reports,
        staged_entries: rep.recovery.staged.entries,
    })
}

#[test]
fn process_deaths_at_random_instants_lose_no_completed_write() {
    let mut failures = Vec::new();
    let seeds = seeds(CI_KILLS);
    let (mut staged, mut reports) = (0, 0);
    for &seed in &seeds {
        match kill_run(seed) {
            Ok(k) => {
                staged += (k.staged_entries > 0) as u64;
                reports += k.reports;
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!(
        "process deaths: {} seeds, {} failed, {reports} operations reported, {staged} \
         kills gave back staged writes",
        seeds.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        seeds.len() < 10 || staged > 0,
        "no kill left anything staged: the staging area was not exercised"
    );
}
