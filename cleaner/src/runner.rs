//! The cleaning thread: ties policies, triggers and slices to a live FTL.
//!
//! Each turn it (1) sets the writers' throttle from free space, (2) cleans in the
//! foreground (greedy, back to back, yielding only between slices) while free segments are
//! at or below the low watermark, (3) otherwise cleans in the background (cost-benefit or
//! cost-hotness) when the device is idle and the interval `Ci` has elapsed, yielding as
//! soon as foreground I/O shows up at the end of a slice, and (4) checkpoints when
//! cleaned segments wait for one to become free or the FTL says one is due.

use crate::policy::Policy;
use crate::slice::{Budget, Cleaner, CleanerStats, SliceEnd};
use crate::trigger::{
    background_interval, checkpoint_needed, foreground_needed, throttle_delay, CheckpointInputs,
};
use ftl::{BlockDevice, Ftl, IndexStore};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Tunables of the cleaning thread.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CleanerConfig {
    pub foreground_policy: Policy,
    pub background_policy: Policy,
    /// Length of a cleaning slice. Default 2 ms, from the sweep of `benches/gc.rs`
    /// (90%-full 1 GiB file backing, 4 KiB random overwrites; docs/gc-bench.json): slices of
    /// 0.5 to 20 ms all gave p99.9 write latency 1.15-1.43 ms and max 2.3-7.3 ms (2 MiB
    /// segments; with the 16 MiB of the old 64-segment default, 0.9-1.1 ms and 3.5-8.6
    /// ms), because the proportional throttle keeps writers from waiting on a victim;
    /// shorter slices cost preemptions (700 at 0.5 ms vs 166 at 2 ms), longer ones bound
    /// the worst wait of a writer that does need space less tightly (7.3 ms at 20 ms).
    /// 2 ms is 50x under OrcFS's 100 ms.
    pub slice: Duration,
    /// Clean whole victims at once (the non-preemptive baseline).
    pub non_preemptive: bool,
    /// Foreground cleaning at or below this many free segments (0: reserve + 2).
    pub low_watermark: usize,
    /// MinFree of the background interval formula (0: an eighth of the segments).
    pub min_free: usize,
    /// MinCi of the background interval formula.
    pub min_interval: Duration,
    /// No foreground request for this long counts as idle.
    pub idle_gap: Duration,
    /// Throttling starts at this many free segments (0: low watermark + 4).
    pub throttle_start: usize,
    /// Per-block write delay when free space reaches the reserve.
    pub max_write_delay: Duration,
    /// Background cleaning skips victims fuller than this.
    pub max_background_utilization: f64,
    /// Idle this long with dead segments waiting: checkpoint, so they are freed and
    /// discarded on the backing (see [`crate::trigger::checkpoint_needed`]).
    pub idle_checkpoint: Duration,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            foreground_policy: Policy::Greedy,
            background_policy: Policy::CostBenefit,
            slice: Duration::from_millis(2),
            non_preemptive: false,
            low_watermark: 0,
            min_free: 0,
            min_interval: Duration::from_millis(20),
            idle_gap: Duration::from_millis(2),
            throttle_start: 0,
            max_write_delay: Duration::from_micros(200),
            max_background_utilization: 0.9,
            idle_checkpoint: Duration::from_secs(1),
        }
    }
}

/// What the thread reports.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RunnerStats {
    pub cleaner: CleanerStats,
    pub throttle_ns_per_block: u64,
    pub foreground_slices: u64,
    pub background_slices: u64,
    pub checkpoints: u64,
    pub errors: u64,
}

/// A running cleaner thread; stops (and detaches from the FTL) on drop.
pub struct CleanerHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<RunnerStats>>,
    last_error: Arc<Mutex<Option<String>>>,
}

impl CleanerHandle {
    /// Current figures.
    pub fn stats(&self) -> RunnerStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// The last error the thread hit, if any (it keeps running).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }
    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CleanerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the cleaning thread for `ftl`.
pub fn spawn<D, I>(ftl: Arc<Ftl<D, I>>, cfg: CleanerConfig) -> std::io::Result<CleanerHandle>
where
    D: BlockDevice + 'static,
    I: IndexStore + 'static,
{
    spawn_with_gc_stream(ftl, cfg, |_| ftl::GC_STREAM)
}

/// [`spawn`], with relocated blocks written to the stream `gc_stream(lba)` picks (GC
/// output split by age, see `ftl::classify`) instead of the single GC stream.
pub fn spawn_with_gc_stream<D, I>(
    ftl: Arc<Ftl<D, I>>,
    cfg: CleanerConfig,
    gc_stream: impl Fn(u64) -> ftl::StreamId + Send + 'static,
) -> std::io::Result<CleanerHandle>
where
    D: BlockDevice + 'static,
    I: IndexStore + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Mutex::new(RunnerStats::default()));
    let last_error = Arc::new(Mutex::new(None));
    ftl.attach_cleaner(true);
    let (s2, st2, e2) = (stop.clone(), stats.clone(), last_error.clone());
    let thread = std::thread::Builder::new()
        .name("ftl-cleaner".into())
        .spawn(move || {
            let cleaner = Cleaner::new(ftl.clone()).with_gc_stream(gc_stream);
            run(ftl.clone(), cleaner, cfg, &s2, &st2, &e2);
            ftl.attach_cleaner(false);
            ftl.set_write_delay(Duration::ZERO);
        })?;
    Ok(CleanerHandle {
        stop,
        thread: Some(thread),
        stats,
        last_error,
    })
}

fn run<D: BlockDevice, I: IndexStore>(
    ftl: Arc<Ftl<D, I>>,
    mut cleaner: Cleaner<D, I>,
    cfg: CleanerConfig,
    stop: &AtomicBool,
    stats: &Mutex<RunnerStats>,
    last_error: &Mutex<Option<String>>,
) {
    let segs = ftl.geometry().segment_count as usize;
    let reserve = ftl.gc_reserve_segments();
    let low = if cfg.low_watermark == 0 {
        reserve + 2
    } else {
        cfg.low_watermark
    };
    let min_free = if cfg.min_free == 0 {
        (segs / 8).max(low + 1)
    } else {
        cfg.min_free
    };
    let throttle_start = if cfg.throttle_start == 0 {
        low + 4
    } else {
        cfg.throttle_start
    };
    let budget = if cfg.non_preemptive {
        Budget::unbounded()
    } else {
        Budget::time(cfg.slice)
    };
    let bps = ftl.geometry().blocks_per_segment() as f64;
    let mut last_bg = Instant::now();
    let mut last_ops = ftl.foreground_ops();
    let mut last_activity = Instant::now();
    let mut last_checkpoint = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let free = ftl.free_segments();
        let delay = throttle_delay(free, reserve, throttle_start, cfg.max_write_delay);
        ftl.set_write_delay(delay);
        let ops = ftl.foreground_ops();
        if ops != last_ops {
            last_ops = ops;
            last_activity = Instant::now();
        }
        let mut turn = || -> Result<bool, crate::Error> {
            // Cleaned segments become free only through a durable checkpoint.
            let now = CheckpointInputs {
                free,
                dead: ftl.dead_segments(),
                throttle_start,
                due: ftl.checkpoint_due(),
                idle_for: last_activity.elapsed(),
                since_last: last_checkpoint.elapsed(),
            };
            if checkpoint_needed(now, cfg.idle_checkpoint) {
                last_checkpoint = Instant::now();
                ftl.checkpoint()?;
                stats.lock().unwrap_or_else(|p| p.into_inner()).checkpoints += 1;
                return Ok(true);
            }
            if foreground_needed(free, low) {
                let end = cleaner.run_slice(cfg.foreground_policy, budget, &|| true)?;
                stats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .foreground_slices += 1;
                return Ok(end != SliceEnd::NoVictim);
            }
            let idle = last_activity.elapsed() >= cfg.idle_gap;
            let interval = background_interval(free, min_free, cfg.min_interval);
            if idle && last_bg.elapsed() >= interval {
                last_bg = Instant::now();
                if cleaner.current_victim().is_none()
                    && !worth_background(
                        &ftl,
                        cfg.background_policy,
                        bps,
                        cfg.max_background_utilization,
                    )
                {
                    return Ok(false);
                }
                let start_ops = ftl.foreground_ops();
                let end = cleaner.run_slice(cfg.background_policy, budget, &|| {
                    ftl.foreground_ops() != start_ops
                })?;
                stats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .background_slices += 1;
                return Ok(end != SliceEnd::NoVictim);
            }
            Ok(false)
        };
        let worked = match turn() {
            Ok(w) => w,
            Err(e) => {
                *last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                stats.lock().unwrap_or_else(|p| p.into_inner()).errors += 1;
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        };
        {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            s.cleaner = cleaner.stats;
            s.throttle_ns_per_block = delay.as_nanos() as u64;
        }
        if !worked {
            std::thread::sleep(
                cfg.idle_gap
                    .min(Duration::from_millis(1))
                    .max(Duration::from_micros(200)),
            );
        } else if !foreground_needed(ftl.free_segments(), low) {
            // Quasi-preemption between slices: give foreground requests the device.
            std::thread::yield_now();
        }
    }
}

fn worth_background<D: BlockDevice, I: IndexStore>(
    ftl: &Ftl<D, I>,
    policy: Policy,
    bps: f64,
    max_u: f64,
) -> bool {
    let snap = ftl.segment_snapshot();
    match crate::policy::pick_victim(policy, &snap, ftl.current_seq(), bps as u32, &[]) {
        Some(v) => (ftl.segment_valid(v) as f64 / bps) <= max_u,
        None => false,
    }
}
