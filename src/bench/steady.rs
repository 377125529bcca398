//! `ftlblk bench --tests steady,...`: the device users live on, full and overwritten,
//! wired the way the daemon wires it ([`crate::background::Background`]: the online
//! classifier, the cleaner with its GC streams, background checkpoints).
//!
//! Each test formats the backing, fills `fill_pct`% of the exported capacity with
//! sequential 1 MiB writes (`jobs` threads), then runs `jobs` threads of 4 KiB random
//! overwrites over the filled region (the workload's distribution, [`replay::workload`])
//! for `passes` passes over it. Each pass is reported (IOPS, WAF over the pass, latency
//! percentiles from HDR histograms), with a timeline of IOPS and latency per
//! [`SLOT`] and of the cleaner's state. The read/write mix first runs one write-only
//! pass to reach the steady state, then the mix for one region of operations.
//!
//! Tests: `steady` (100% fill, uniform), `steady80` (80% fill, uniform), `steadyzipf`
//! (100%, zipf:0.99), `steadymix` (100%, uniform, 70% reads / 30% writes).
//!
//! Called by [`super::run`] only.

use crate::background::Background;
use crate::error::CliError;
use ftl::backing::FileFtl;
use ftl::classify::write_classified;
use ftl::device::BLOCK_SIZE;
use ftl::Counters;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use replay::plot::{TimePoint, Timeline};
use replay::workload::{Sampler, Workload};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Length of one timeline interval.
pub const SLOT: Duration = Duration::from_millis(250);

/// Highest latency the histograms hold (longer ones are recorded as this).
const MAX_LATENCY_NS: u64 = 100_000_000_000;

/// One steady-state test.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: &'static str,
    pub fill_pct: u32,
    pub workload: &'static str,
    /// Share of reads in the measured phase (0 for write-only).
    pub read_pct: u32,
}

/// The tests `ftlblk bench` knows, by name.
pub fn spec(name: &str) -> Option<Spec> {
    let s = |name, fill_pct, workload, read_pct| Spec {
        name,
        fill_pct,
        workload,
        read_pct,
    };
    Some(match name {
        "steady" => s("steady", 100, "uniform", 0),
        "steady80" => s("steady80", 80, "uniform", 0),
        "steadyzipf" => s("steadyzipf", 100, "zipf:0.99", 0),
        "steadymix" => s("steadymix", 100, "uniform", 70),
        _ => return None,
    })
}

/// What a run needs besides the spec.
pub struct Run<'a> {
    pub ftl: &'a Arc<FileFtl>,
    pub jobs: usize,
    pub passes: u32,
    pub seed: u64,
    /// The disks holding the backing and the index (`waf_on_disk`).
    pub disks: &'a Disks,
}

fn histogram() -> Histogram<u64> {
    // 2 significant digits from 1 ns to 100 s: a few tens of KiB.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 2).expect("valid histogram bounds")
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Latency figures of a histogram, in milliseconds.
fn latency_json(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "ops": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "p999_ms": ms(h.value_at_quantile(0.999)),
        "max_ms": ms(h.max()),
    })
}

/// Histograms indexed by a number (a pass, a timeline slot) that threads add their
/// local histogram into when they move on to the next number.
#[derive(Default)]
struct Buckets(Mutex<Vec<Histogram<u64>>>);

impl Buckets {
    fn add(&self, i: usize, h: &mut Histogram<u64>) {
        if h.is_empty() {
            return;
        }
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while v.len() <= i {
            v.push(histogram());
        }
        // Same bounds and precision: cannot fail.
        let _ = v[i].add(&*h);
        h.reset();
    }
    fn take(self) -> Vec<Histogram<u64>> {
        self.0.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// A thread's open histogram for bucket `at` of a [`Buckets`].
struct Local<'a> {
    into: &'a Buckets,
    at: usize,
    h: Histogram<u64>,
}

impl<'a> Local<'a> {
    fn new(into: &'a Buckets) -> Self {
        Local {
            into,
            at: 0,
            h: histogram(),
        }
    }
    fn record(&mut self, at: usize, ns: u64) {
        if at != self.at {
            self.into.add(self.at, &mut self.h);
            self.at = at;
        }
        self.h.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
    }
}

impl Drop for Local<'_> {
    fn drop(&mut self) {
        self.into.add(self.at, &mut self.h);
    }
}

/// One sample of the monitor thread.
#[derive(Debug, Clone, serde::Serialize)]
struct Monitor {
    t: f64,
    free_segments: usize,
    dead_segments: usize,
    write_pace_us: f64,
    user_blocks: u64,
    relocated_blocks: u64,
    checkpoints: u64,
    /// Writer time spent in the throttle and waiting for free segments, cumulative ms.
    throttled_ms: f64,
    space_wait_ms: f64,
    /// Free segments the cleaner holds for writers above its floor.
    headroom_segments: usize,
    longest_space_wait_us: u64,
}

fn sample(ftl: &FileFtl, bg: &Background, start: Instant) -> Monitor {
    let s = ftl.stats();
    Monitor {
        t: start.elapsed().as_secs_f64(),
        free_segments: s.free_segments,
        dead_segments: s.dead_segments,
        write_pace_us: ftl.write_pace().as_secs_f64() * 1e6,
        user_blocks: s.counters.user_blocks_written,
        relocated_blocks: s.counters.relocated_blocks,
        checkpoints: s.checkpoints,
        throttled_ms: s.throttled_ns as f64 / 1e6,
        space_wait_ms: s.space_wait_ns as f64 / 1e6,
        headroom_segments: bg
            .cleaner
            .as_ref()
            .map_or(0, |c| c.stats().headroom_segments),
        longest_space_wait_us: bg
            .cleaner
            .as_ref()
            .map_or(0, |c| c.stats().longest_space_wait_us),
    }
}

/// Fills `blocks` blocks from LBA 0 with 1 MiB writes on `jobs` threads; returns seconds.
fn fill(ftl: &Arc<FileFtl>, bg: &Background, blocks: u64, jobs: usize) -> Result<f64, CliError> {
    const PIECE: u64 = 256;
    let next = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| -> Result<(), CliError> {
        let handles: Vec<_> = (0..jobs)
            .map(|_| {
                s.spawn(|| -> Result<(), CliError> {
                    let mut buf = vec![0x3cu8; PIECE as usize * BLOCK_SIZE];
                    loop {
                        let lba = next.fetch_add(PIECE, Ordering::Relaxed);
                        if lba >= blocks {
                            return Ok(());
                        }
                        let n = PIECE.min(blocks - lba) as usize;
                        // Each block names its LBA, as the overwrites do: reads check it.
                        for (k, b) in buf.chunks_mut(BLOCK_SIZE).take(n).enumerate() {
                            stamp(b, lba + k as u64, 0);
                        }
                        write_classified(
                            ftl,
                            &bg.classifier,
                            Some(&bg.writers),
                            lba,
                            &buf[..n * BLOCK_SIZE],
                            false,
                        )
                        .map_err(|e| CliError::ftl_at(format!("fill write at {lba}"), e))?;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| CliError::Panicked("fill thread"))??;
        }
        Ok(())
    })?;
    ftl.flush()?;
    Ok(start.elapsed().as_secs_f64())
}

/// What one phase of random operations measured.
struct Phase {
    seconds: f64,
    /// Write latency per pass, and the counters at each pass boundary (one more).
    writes: Vec<Histogram<u64>>,
    reads: Histogram<u64>,
    bounds: Vec<Bound>,
    timeline: Vec<TimePoint>,
    monitor: Vec<Monitor>,
}

/// Runs `ops` random operations over `region` blocks, `read_pct`% of them reads; a pass
/// is `region` operations.
fn random_phase(
    run: &Run,
    bg: &Background,
    sampler: &Sampler,
    region: u64,
    ops: u64,
    read_pct: u32,
    seed: u64,
) -> Result<Phase, CliError> {
    let ftl = run.ftl;
    let passes = ops.div_ceil(region) as usize;
    let next = AtomicU64::new(0);
    let write_buckets = Buckets::default();
    let read_buckets = Buckets::default();
    let slots = Buckets::default();
    let bounds: Vec<Mutex<Option<Bound>>> = (0..=passes).map(|_| Mutex::new(None)).collect();
    let done = AtomicBool::new(false);
    let mut monitor = Vec::new();
    let start = Instant::now();
    *bounds[0].lock().unwrap_or_else(|p| p.into_inner()) = Some(bound_at(start, run));
    std::thread::scope(|s| -> Result<(), CliError> {
        let mon = s.spawn(|| {
            let mut out = Vec::new();
            while !done.load(Ordering::Relaxed) {
                out.push(sample(ftl, bg, start));
                std::thread::sleep(SLOT);
            }
            out
        });
        let handles: Vec<_> = (0..run.jobs)
            .map(|t| {
                let (next, bounds) = (&next, &bounds);
                let (wb, rb, sl) = (&write_buckets, &read_buckets, &slots);
                s.spawn(move || -> Result<(), CliError> {
                    let mut rng = SmallRng::seed_from_u64(seed ^ (t as u64 + 1) << 32);
                    let mut buf = vec![0u8; BLOCK_SIZE];
                    let (mut w, mut r, mut slot) = (Local::new(wb), Local::new(rb), Local::new(sl));
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= ops {
                            return Ok(());
                        }
                        let pass = (i / region) as usize;
                        if i % region == 0 && i > 0 {
                            *bounds[pass].lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(bound_at(Instant::now(), run));
                        }
                        let lba = sampler.sample(&mut rng);
                        let read = read_pct > 0 && rng.gen_range(0..100) < read_pct;
                        let t0 = Instant::now();
                        if read {
                            ftl.read(lba, &mut buf)
                                .map_err(|e| CliError::ftl_at(format!("read of block {lba}"), e))?;
                        } else {
                            stamp(&mut buf, lba, i + 1);
                            write_classified(
                                ftl,
                                &bg.classifier,
                                Some(&bg.writers),
                                lba,
                                &buf,
                                false,
                            )
                            .map_err(|e| CliError::ftl_at(format!("write of block {lba}"), e))?;
                        }
                        let t1 = Instant::now();
                        let ns = (t1 - t0).as_nanos() as u64;
                        if read {
                            check_stamp(&buf, lba, ops)?;
                            r.record(0, ns);
                        } else {
                            w.record(pass, ns);
                        }
                        let at = ((t1 - start).as_nanos() / SLOT.as_nanos()) as usize;
                        slot.record(at, ns);
                    }
                })
            })
            .collect();
        let mut result = Ok(());
        for h in handles {
            let r = h
                .join()
                .map_err(|_| CliError::Panicked("writer thread"))
                .and_then(|r| r);
            if result.is_ok() {
                result = r;
            }
        }
        // The end, before the monitor is joined: it sleeps in slots of 250 ms, which
        // counted into the last pass's time (up to 8% of a 3 s pass; found by review,
        // 2026-11-27).
        *bounds[passes].lock().unwrap_or_else(|p| p.into_inner()) =
            Some(bound_at(Instant::now(), run));
        done.store(true, Ordering::Relaxed);
        monitor = mon
            .join()
            .map_err(|_| CliError::Panicked("monitor thread"))?;
        result
    })?;
    // Past the timing: every 61st block of the region read back and checked.
    let mut buf = vec![0u8; BLOCK_SIZE];
    for lba in (0..region).step_by(61) {
        ftl.read(lba, &mut buf)
            .map_err(|e| CliError::ftl_at(format!("read back of block {lba}"), e))?;
        check_stamp(&buf, lba, ops)?;
    }
    let bounds: Vec<Bound> = bounds
        .into_iter()
        .map(|b| b.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CliError::Bench("a pass boundary was not recorded".into()))?;
    let seconds = (bounds[passes].0 - start).as_secs_f64();
    let mut writes = write_buckets.take();
    writes.resize_with(passes, histogram);
    let reads = read_buckets.take().pop().unwrap_or_else(histogram);
    let timeline = time_points(&slots.take(), SLOT.as_secs_f64(), seconds);
    Ok(Phase {
        seconds,
        writes,
        reads,
        bounds,
        timeline,
        monitor,
    })
}

/// The timeline of a phase of `seconds` from its slots of `slot` seconds: each point at
/// its slot's end, its rate over the part of the slot the phase lasted (the last slot is
/// cut short by the phase's end: divided by a whole slot it plotted a drop to an eighth
/// of the rate at the end of every run; found by review, 2026-11-29).
fn time_points(slots: &[Histogram<u64>], slot: f64, seconds: f64) -> Vec<TimePoint> {
    slots
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let end = ((i + 1) as f64 * slot).min(seconds.max(i as f64 * slot));
            let len = end - i as f64 * slot;
            TimePoint {
                t: end,
                iops: if len > 0.0 { h.len() as f64 / len } else { 0.0 },
                p99_ms: ms(h.value_at_quantile(0.99)),
                max_ms: ms(h.max()),
            }
        })
        .filter(|p| p.t > 0.0)
        .collect()
}

/// Marks block `b` as `lba`'s, written by operation `generation` (0: the fill).
fn stamp(b: &mut [u8], lba: u64, generation: u64) {
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
}

/// A block read from `lba` is one written there (the fill's or an overwrite's of the
/// `ops` the phase issues): a bench on an FTL that misplaced blocks reports an error, not
/// a figure (found by review, 2026-11-29: the steady tests never looked at what they
/// read, and the fill wrote every block alike).
fn check_stamp(b: &[u8], lba: u64, ops: u64) -> Result<(), CliError> {
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let (owner, generation) = (word(0), word(8));
    if owner != lba || generation > ops {
        return Err(CliError::Bench(format!(
            "block {lba} read back block {owner}'s data of write {generation} (of {ops})"
        )));
    }
    Ok(())
}

/// A pass boundary: when, the FTL's counters, and the bytes written to the disks
/// holding the backing and the index.
type Bound = (Instant, Counters, Option<u64>);

/// The boundary at `at`: the FTL's counters and the disks' written bytes now.
fn bound_at(at: Instant, run: &Run) -> Bound {
    (at, run.ftl.stats().counters, run.disks.written_bytes())
}

/// The block devices holding some files (the backing and the index), whose written
/// bytes the kernel counts per device (`/sys/dev/block/M:m/stat`, sectors written): every
/// byte the disk took, the index's sled files and the file system's journal with the
/// log, and any other process's writes to the same disk (so meaningful on an otherwise
/// idle machine). Until 2026-11-30 the figure came from the process's `write_bytes`
/// (`/proc/self/io`), which counts a buffered write as the whole page-cache folio it
/// dirties: on a kernel with large folios each small sled commit counted up to a few
/// hundred KiB it never wrote, and the index's share of the writes came out 11% where
/// the disk took 2-3%.
pub struct Disks(Vec<std::path::PathBuf>);

impl Disks {
    /// The devices of `paths` (each a file or directory that exists); none where one is
    /// not a block device's (tmpfs, overlay: the figure is then left out).
    pub fn of(paths: &[&std::path::Path]) -> Self {
        use std::os::unix::fs::MetadataExt;
        let mut devs: Vec<u64> = Vec::new();
        for p in paths {
            match std::fs::metadata(p) {
                Ok(m) => {
                    if !devs.contains(&m.dev()) {
                        devs.push(m.dev());
                    }
                }
                Err(_) => return Disks(Vec::new()),
            }
        }
        let stats: Vec<std::path::PathBuf> = devs
            .iter()
            .map(|&d| {
                let (major, minor) = (libc::major(d), libc::minor(d));
                std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"))
            })
            .collect();
        if stats.iter().all(|s| s.is_file()) {
            Disks(stats)
        } else {
            Disks(Vec::new())
        }
    }

    /// Bytes written to the devices so far (`None` where not counted).
    pub fn written_bytes(&self) -> Option<u64> {
        if self.0.is_empty() {
            return None;
        }
        let mut total = 0u64;
        for s in &self.0 {
            total += sectors_written(&std::fs::read_to_string(s).ok()?)? * 512;
        }
        Some(total)
    }
}

/// The sectors-written field (the seventh) of a block device's `stat` file.
fn sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

/// Bytes the disks took per user byte between two boundaries (`None` without the
/// device's accounting).
fn waf_of_disk_writes(a: &Bound, b: &Bound) -> Option<f64> {
    let user =
        b.1.user_blocks_written
            .saturating_sub(a.1.user_blocks_written);
    let written = b.2?.checked_sub(a.2?)?;
    (user > 0).then(|| written as f64 / (user * BLOCK_SIZE as u64) as f64)
}

fn waf(a: &Counters, b: &Counters) -> f64 {
    let user = b.user_blocks_written.saturating_sub(a.user_blocks_written);
    let backing = b
        .backing_blocks_written
        .saturating_sub(a.backing_blocks_written);
    backing as f64 / user.max(1) as f64
}

/// The median (the mean of the middle two of an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The passes a steady-state figure is taken over: all but the first when there are
/// several (the first starts from a freshly filled device, where the cleaner finds
/// nothing to clean yet, and ran 13-55% faster than the last in bench.json; found by
/// review, 2026-11-27).
fn steady_passes(passes: usize) -> std::ops::Range<usize> {
    if passes > 1 {
        1..passes
    } else {
        0..passes
    }
}

/// Whether the last two of `iops` (the steady passes) agree within `SETTLED_PCT`
/// percent; `None` with one (the mix's, or two passes run: nothing to compare).
fn settled(iops: &[f64]) -> Option<bool> {
    match iops {
        [.., a, b] => Some((a - b).abs() <= SETTLED_PCT / 100.0 * a.max(*b)),
        _ => None,
    }
}

/// How far the last two passes may differ for the run to count as settled.
const SETTLED_PCT: f64 = 10.0;

/// Runs one steady-state test on a freshly formatted `run.ftl`; returns its JSON and the
/// timeline of its measured phase. `iops` (and each pass's) counts every operation: for
/// the mix, reads and writes together (`write_iops` and `read_iops` split them).
pub fn run(spec: &Spec, run: &Run) -> Result<(serde_json::Value, Timeline), CliError> {
    let ftl = run.ftl;
    let workload: Workload = spec.workload.parse()?;
    let region = (ftl.capacity_blocks() * spec.fill_pct as u64 / 100).max(1);
    let sampler = Sampler::new(&workload, region, run.seed).ok_or_else(|| {
        CliError::Bench(format!("{}: not a single-block workload", spec.workload))
    })?;
    let bg = Background::start(ftl, true, false, None, None)?;
    let result = (|| -> Result<(serde_json::Value, Vec<TimePoint>), CliError> {
        let fill_seconds = fill(ftl, &bg, region, run.jobs)?;
        let mut warmup = serde_json::Value::Null;
        let (ops, passes_label) = if spec.read_pct > 0 {
            // Reach the steady state first: one pass of writes alone.
            let w = random_phase(run, &bg, &sampler, region, region, 0, run.seed + 11)?;
            warmup = serde_json::json!({"seconds": w.seconds, "iops": region as f64 / w.seconds,
                "waf": waf(&w.bounds[0].1, &w.bounds[1].1)});
            (region, 1)
        } else {
            (region * run.passes as u64, run.passes)
        };
        let p = random_phase(
            run,
            &bg,
            &sampler,
            region,
            ops,
            spec.read_pct,
            run.seed + 12,
        )?;
        let mut passes = Vec::new();
        let mut all_writes = histogram();
        let mut iops = Vec::new();
        for (k, h) in p.writes.iter().enumerate() {
            let (t0, c0, _) = &p.bounds[k];
            let (t1, c1, _) = &p.bounds[k + 1];
            let secs = (*t1 - *t0).as_secs_f64();
            let n = (region.min(ops - k as u64 * region)) as f64;
            iops.push(n / secs);
            let _ = all_writes.add(h);
            let mut j = latency_json(h);
            j["pass"] = (k + 1).into();
            j["seconds"] = secs.into();
            j["iops"] = (n / secs).into();
            j["waf"] = waf(c0, c1).into();
            passes.push(j);
        }
        let steady = steady_passes(iops.len());
        let (first, last) = (&p.bounds[steady.start].1, &p.bounds[steady.end].1);
        let all_writes_waf = waf_of_disk_writes(&p.bounds[steady.start], &p.bounds[steady.end]);
        let mut steady_iops = iops[steady.clone()].to_vec();
        let cleaner = bg.cleaner.as_ref().map(|c| c.stats());
        let fs = ftl.stats();
        let ftl_stats = serde_json::json!({
            "checkpoints": fs.checkpoints,
            "checkpoint_times": fs.checkpoint_times,
            "free_times": fs.free_times,
            "free_records": fs.free_records,
            "segments_freed_by_records": fs.segments_freed_by_records,
            "free_records_beside_checkpoints": fs.free_records_beside_checkpoints,
            "segments_freed_early_by_checkpoints": fs.segments_freed_early_by_checkpoints,
            "throttled_ns": fs.throttled_ns,
            "space_wait_ns": fs.space_wait_ns,
            "chunk_writer_admit_wait_ns": bg.writers.admit_wait_ns(),
            "padding_bytes": fs.counters.padding_bytes,
            "summary_blocks": fs.counters.summary_blocks,
        });
        let json = serde_json::json!({
            "fill_pct": spec.fill_pct,
            // False when the file system refused O_DIRECT and the backing fell back to
            // the page cache: the figures are then not comparable with raw fio's.
            "direct_io": ftl.device().is_direct(),
            "workload": spec.workload,
            "read_pct": spec.read_pct,
            "jobs": run.jobs,
            "region_blocks": region,
            "fill_seconds": fill_seconds,
            "warmup": warmup,
            "passes_run": passes_label,
            // IOPS, their spread and WAF are over the passes from this one (1-based).
            "steady_from_pass": steady.start + 1,
            "settled": settled(&iops[steady.clone()]),
            "iops": median(&mut steady_iops),
            "iops_min": steady_iops.iter().copied().fold(f64::INFINITY, f64::min),
            "iops_max": steady_iops.iter().copied().fold(0.0, f64::max),
            "ops_per_second": ops as f64 / p.seconds,
            "write_iops": all_writes.len() as f64 / p.seconds,
            "read_iops": p.reads.len() as f64 / p.seconds,
            "waf": waf(first, last),
            // Every byte the disks holding the backing and the index took per user byte,
            // over the same passes (`Disks`): `waf` counts the log's writes only
            // (checkpoints' map pages, segment records and free records go to the index;
            // found by review, 2026-11-27). Null where the disks are not counted.
            "waf_on_disk": all_writes_waf,
            "write_latency": latency_json(&all_writes),
            "read_latency": if spec.read_pct > 0 { latency_json(&p.reads) } else { serde_json::Value::Null },
            "passes": passes,
            "cleaner_per_victim": cleaner.as_ref().map(|c| c.cleaner.per_victim()),
            "cleaner": cleaner,
            "ftl": ftl_stats,
            "timeline": p.timeline,
            "monitor": p.monitor,
        });
        Ok((json, p.timeline))
    })();
    bg.stop();
    let (json, points) = result?;
    let label = format!("{} ({}% full, {})", spec.name, spec.fill_pct, spec.workload);
    Ok((json, Timeline { label, points }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0]), 3.0);
        assert_eq!(median(&mut [2.0, 1.0]), 1.5);
        assert_eq!(median(&mut [4.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    /// An earlier bench.json's uniform run: 76.2K, 66.4K, 60.0K. The first pass (a fresh
    /// fill, no cleaning yet) is left out; the last two agree within 10% (9.6%), while
    /// its 80% fill's 183.7K, 120.6K, 106.0K do not (12%).
    #[test]
    fn steady_figures_leave_out_the_first_pass() {
        // A block read back is the LBA's own, of a write the phase issued.
        let mut b = vec![0u8; BLOCK_SIZE];
        stamp(&mut b, 7, 3);
        assert!(check_stamp(&b, 7, 10).is_ok());
        assert!(check_stamp(&b, 8, 10).is_err(), "another LBA's block");
        assert!(check_stamp(&b, 7, 2).is_err(), "a write never issued");
        assert!(check_stamp(&vec![0u8; BLOCK_SIZE], 7, 10).is_err(), "zeros");
        assert_eq!(steady_passes(1), 0..1);
        // The last slot, cut short by the phase's end, counts over its own length.
        let slot = |n: u64| {
            let mut h = histogram();
            for _ in 0..n {
                h.record(1000).unwrap();
            }
            h
        };
        let t = time_points(&[slot(250), slot(250), slot(30)], 0.25, 0.53);
        let iops: Vec<f64> = t.iter().map(|p| p.iops.round()).collect();
        assert_eq!(iops, vec![1000.0, 1000.0, 1000.0]);
        assert!((t[2].t - 0.53).abs() < 1e-9, "{}", t[2].t);
        assert_eq!(steady_passes(3), 1..3);
        let iops = [76.2, 66.4, 60.0];
        assert_eq!(median(&mut iops[steady_passes(3)].to_vec()), 63.2);
        assert_eq!(settled(&iops[steady_passes(3)]), Some(true));
        assert_eq!(
            settled(&[183.7, 120.6, 106.0][steady_passes(3)]),
            Some(false)
        );
        // Two passes run: one steady pass, nothing to compare.
        assert_eq!(settled(&[100.0, 60.0][steady_passes(2)]), None);
        assert_eq!(settled(&[60.0]), None);
        assert_eq!(settled(&[100.0, 95.0]), Some(true));
    }

    /// The disks' figure counts what reaches the device: 1 MiB written and synced counts
    /// at least 1 MiB (the process's `write_bytes` counted a small buffered write as its
    /// whole folio; this counts bytes the disk took). A workspace not on a block device
    /// (major 0: tmpfs, overlay) has nothing to count, and says so.
    #[test]
    fn the_disks_count_the_bytes_they_took() {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            sectors_written("  8  0 1000 0 2000 0 3000 12345 0 0 0 0 0 0 0 0 0"),
            Some(3000),
            "the seventh field"
        );
        assert_eq!(sectors_written("1 2 3"), None);
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let disks = Disks::of(&[dir.path()]);
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        if libc::major(dev) == 0 {
            assert!(
                disks.written_bytes().is_none(),
                "no block device, no figure"
            );
            return;
        }
        let before = disks.written_bytes().expect("a block device's counter");
        let mut f = std::fs::File::create(dir.path().join("x")).unwrap();
        f.write_all(&vec![0x5au8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let after = disks.written_bytes().unwrap();
        assert!(
            after - before >= 1 << 20,
            "{} bytes counted",
            after - before
        );
        assert!(Disks::of(&[&dir.path().join("missing")])
            .written_bytes()
            .is_none());
    }
}
