//! Metadata-only replay: the real FTL and cleaner on a sparse in-memory device, with zero
//! payloads (so only chunk summaries take memory). Cleaning runs synchronously when the
//! log runs out of free segments, with the configured victim policy; user writes and
//! relocations go to the streams [`crate::placement`] picks.
//!
//! Deterministic: the same ops and configuration give the same report.

pub use crate::placement::ClassifierKind;
use crate::placement::Placer;
use crate::trace::TraceOp;
use crate::Error;
use cleaner::{Budget, Cleaner, Policy, SliceEnd};
use ftl::device::sparse::SparseDevice;
use ftl::index::mem::MemIndex;
use ftl::{Config, FormatOptions, Ftl, StreamId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Replay configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimConfig {
    /// Logical capacity of the simulated device, in blocks.
    pub capacity_blocks: u64,
    /// Over-provisioning per mille of the physical size.
    pub op_permille: u32,
    /// Segment size in bytes (default: the FTL's default for the size).
    pub segment_bytes: Option<u64>,
    pub classifier: ClassifierKind,
    /// Classes (streams) the classifying kinds may use, 1 ..= `ftl::classify::CLASSES`.
    pub classes: u8,
    /// Blocks whose history the online classifier keeps (`None`: its default,
    /// `ftl::classify::DEFAULT_TRACKED_BLOCKS`); fewer than the capacity shares slots.
    #[serde(default)]
    pub tracked_blocks: Option<u64>,
    /// Wear-aware allocation and static wear levelling (`ftl::Config::wear_levelling`).
    #[serde(default)]
    pub wear_levelling: bool,
    /// The workload's write probability per LBA, for the `frequency` classifier
    /// (`workload::write_probabilities`); without it the trace's counts stand in.
    #[serde(skip)]
    pub write_probabilities: Option<Arc<[f64]>>,
    pub policy: Policy,
    /// Server restarts spread evenly over the run's block writes: at each, the online
    /// classifier forgets everything (a new process starts with no history).
    #[serde(default)]
    pub restarts: u32,
    /// Points of the WAF-over-time series.
    pub series_points: usize,
}

/// Figures of one stream.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StreamFigures {
    pub stream: u8,
    /// Blocks placed in the stream: `user_blocks + relocated_blocks`.
    pub blocks: u64,
    /// User writes the placement sent here.
    pub user_blocks: u64,
    /// Blocks relocated into the stream (the FTL's count: a relocation it diverted to
    /// its GC stream counts there).
    pub relocated_blocks: u64,
    /// Relocations the placement sent here (the FTL may still divert one to its GC
    /// stream, or find the block overwritten and not move it). `relocated_blocks` was
    /// this until 2026-11-29, when a review found 11% of the MiDAS row's relocations
    /// credited to the stream they were sent to, not the one that took them.
    pub relocations_placed: u64,
    /// At the end of the run: segments the stream holds (open or closed), and the live
    /// blocks in them.
    pub segments: u32,
    pub live_blocks: u64,
}

/// What a replay measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimReport {
    pub config: SimConfig,
    /// The geometry the device was formatted with (segment size resolved).
    pub geometry: ftl::Geometry,
    pub user_blocks: u64,
    pub trimmed_blocks: u64,
    pub backing_blocks: u64,
    pub relocated_blocks: u64,
    /// Chunk summaries and flash-page padding written (metadata in the log), whole run.
    pub summary_blocks: u64,
    pub padding_blocks: u64,
    /// The same over the second half of the run, per user block written then.
    pub metadata_per_user_block_steady: f64,
    /// Backing blocks written / user blocks written, whole run.
    pub waf: f64,
    /// The same over the second half of the run (steady state).
    pub waf_steady: f64,
    pub segments_cleaned: u64,
    /// Segment reuse counts at the end of the run, and the victims static wear levelling
    /// picked (their copies are in the WAF).
    pub wear: ftl::WearFigures,
    pub wear_victims: u64,
    /// Their copies beyond those of the victims the policy would have taken.
    pub wear_extra_blocks: u64,
    /// Checkpoints written (each frees the segments cleaned before it).
    pub checkpoints: u64,
    /// Relocations the FTL sent to its GC stream because their stream would have needed
    /// the last free segment.
    pub relocated_diverted: u64,
    pub per_stream: Vec<StreamFigures>,
    /// Victim utilisation at cleaning time, 10 bins of 10%.
    pub victim_utilization_histogram: [u64; 10],
    /// (user blocks written, cumulative WAF).
    pub waf_series: Vec<(u64, f64)>,
    pub classifier_bytes_per_block: usize,
    /// Classes that had a stream of their own at the end (bit `c` = class `c`).
    pub active_classes: u8,
    /// Desnoyers' greedy WAF for the logical / physical ratio at the end (uniform random
    /// overwrites under greedy, one stream; an oracle placement does better). It counts
    /// summary blocks, the reserve and open segments as room, so it is a little
    /// generous (about 1% on the uniform rows).
    pub analytic_greedy_waf: f64,
}

type SimFtl = Ftl<Arc<SparseDevice>, Arc<MemIndex>>;

fn build(cfg: &SimConfig) -> Result<(Arc<SimFtl>, u64), Error> {
    let op = cfg.op_permille as f64 / 1000.0;
    let want = cfg.capacity_blocks * 4096;
    let mut backing = ((want as f64) / (1.0 - op)) as u64;
    if cfg.segment_bytes == Some(0) {
        // Sized below by division: the geometry's own check comes after it.
        return Err(Error::Config("a segment size of 0".into()));
    }
    for _ in 0..64 {
        let seg = cfg
            .segment_bytes
            .unwrap_or_else(|| ftl::geometry::default_segment_bytes(backing));
        let opts = FormatOptions {
            segment_bytes: Some(seg),
            op_permille: Some(cfg.op_permille),
            size_bytes: None,
            ..Default::default()
        };
        let size = backing.div_ceil(seg) * seg;
        match ftl::Geometry::resolve(size, &opts) {
            Ok(g) if g.exported_blocks >= cfg.capacity_blocks => {
                let dev = Arc::new(SparseDevice::new(size));
                let idx = Arc::new(MemIndex::new());
                ftl::format(&dev, &idx, &opts, false)?;
                let fcfg = Config {
                    gc_reserve_segments: 2,
                    discard_freed: true,
                    wear_levelling: cfg.wear_levelling,
                    ..Config::default()
                };
                let (f, _) = Ftl::open(dev, idx, fcfg)?;
                return Ok((Arc::new(f), g.exported_blocks));
            }
            Ok(_) => backing += seg,
            // Growing the device until it holds enough segments replayed the workload
            // at a fraction of the utilisation asked for, and said nothing (found by
            // review, 2026-11-29).
            Err(ftl::Error::TooSmall(e)) => {
                return Err(Error::Config(format!(
                    "a capacity of {} blocks is too small for segments of {} KiB ({e}): give a smaller --segment-size or a larger --capacity",
                    cfg.capacity_blocks,
                    seg >> 10
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Config(
        "could not size a device for that capacity".into(),
    ))
}

/// Replays `ops` (LBAs already within the capacity).
pub fn simulate(
    ops: &[TraceOp],
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SimReport, Error> {
    let (f, capacity) = build(cfg)?;
    let placer = Arc::new(Placer::new(
        cfg.classifier,
        ops,
        capacity,
        cfg.classes,
        cfg.write_probabilities.as_deref(),
        cfg.tracked_blocks,
    ));
    let gc_counts: Arc<[AtomicU64; 8]> = Arc::new(Default::default());
    let mut cleaner = {
        let (placer, counts) = (placer.clone(), gc_counts.clone());
        Cleaner::new(f.clone()).with_gc_stream(move |lba| {
            let s = placer.relocate(lba);
            if let Some(c) = counts.get(s.0 as usize) {
                c.fetch_add(1, Ordering::Relaxed);
            }
            s
        })
    };
    let zero = vec![0u8; 4096];
    let mut user_counts = [0u64; 8];
    let total_writes: u64 = ops
        .iter()
        .map(|o| {
            if let TraceOp::Write { blocks, .. } = o {
                *blocks as u64
            } else {
                0
            }
        })
        .sum();
    let every = (total_writes / cfg.series_points.max(1) as u64).max(1);
    let mut series = Vec::new();
    let mut half: Option<ftl::Counters> = None;
    let mut wi = 0u64;
    let mut trimmed = 0u64;
    let mut plans = 0u64;
    let mut checkpoints = 0u64;
    let mut restarts_done = 0u32;
    for op in ops {
        match *op {
            TraceOp::Write { lba, blocks } => {
                for l in lba..lba + blocks as u64 {
                    // Taken before the write, so a run of one write has it in its second
                    // half (found by review, 2026-11-29).
                    if half.is_none() && wi >= total_writes / 2 {
                        half = Some(f.stats().counters);
                    }
                    if restarts_done < cfg.restarts
                        && wi
                            >= total_writes / (cfg.restarts as u64 + 1) * (restarts_done as u64 + 1)
                    {
                        placer.restart();
                        restarts_done += 1;
                    }
                    placer.observe_live(f.mapped_blocks());
                    let stream: StreamId = placer.user(l);
                    checkpoints += write_cleaning(&f, &mut cleaner, cfg.policy, l, &zero, stream)?;
                    if placer.plans() != plans {
                        // Streams that fell idle give their open segments back.
                        plans = placer.plans();
                        for s in placer.idle_streams() {
                            f.close_stream(s)?;
                        }
                    }
                    if let Some(c) = user_counts.get_mut(stream.0 as usize) {
                        *c += 1;
                    }
                    wi += 1;
                    if wi.is_multiple_of(every) {
                        let c = f.stats().counters;
                        series.push((
                            wi,
                            c.backing_blocks_written as f64 / c.user_blocks_written.max(1) as f64,
                        ));
                        progress(wi, total_writes);
                    }
                }
            }
            TraceOp::Trim { lba, blocks } => {
                f.trim(lba, blocks as u64)?;
                placer.trim(lba, blocks as u64);
                trimmed += blocks as u64;
            }
            TraceOp::Read { .. } => {}
        }
    }
    // The open chunks' blocks count as written: a run short enough to end inside its
    // first chunks gave a WAF of 0 (found by review, 2026-11-29).
    f.flush()?;
    let end = f.stats().counters;
    let mid = half.unwrap_or_default();
    // Per user block written over the second half of the run.
    let steady =
        |n: u64| n as f64 / (end.user_blocks_written - mid.user_blocks_written).max(1) as f64;
    // Summary and padding blocks: the log's own metadata.
    let metadata =
        |c: &ftl::Counters| c.summary_blocks + c.padding_bytes / ftl::device::BLOCK_SIZE as u64;
    let hist = cleaner.victim_utilization;
    let appended = f.stats().stream_blocks_written;
    let mut per_stream: Vec<StreamFigures> = (0..8u8)
        .map(|s| {
            let (user, placed) = (
                user_counts[s as usize],
                gc_counts[s as usize].load(Ordering::Relaxed),
            );
            let all = appended.get(s as usize).copied().unwrap_or(user + placed);
            StreamFigures {
                stream: s,
                blocks: all.max(user),
                user_blocks: user,
                relocated_blocks: all.saturating_sub(user),
                relocations_placed: placed,
                ..Default::default()
            }
        })
        .collect();
    for seg in f.segment_snapshot() {
        if seg.segment == 0 || seg.state == "free" {
            continue;
        }
        if let Some(fig) = per_stream.get_mut(seg.stream as usize) {
            fig.segments += 1;
            fig.live_blocks += seg.valid as u64;
        }
    }
    per_stream.retain(|s| s.blocks > 0 || s.segments > 0);
    Ok(SimReport {
        config: cfg.clone(),
        geometry: *f.geometry(),
        user_blocks: end.user_blocks_written,
        trimmed_blocks: trimmed,
        backing_blocks: end.backing_blocks_written,
        relocated_blocks: end.relocated_blocks,
        summary_blocks: end.summary_blocks,
        padding_blocks: metadata(&end) - end.summary_blocks,
        metadata_per_user_block_steady: steady(metadata(&end) - metadata(&mid)),
        waf: end.backing_blocks_written as f64 / end.user_blocks_written.max(1) as f64,
        waf_steady: steady(end.backing_blocks_written - mid.backing_blocks_written),
        segments_cleaned: cleaner.stats.segments_cleaned,
        wear: f.stats().wear,
        wear_victims: cleaner.stats.wear_victims,
        wear_extra_blocks: cleaner.stats.wear_extra_blocks,
        checkpoints,
        relocated_diverted: f.relocations_diverted(),
        per_stream,
        victim_utilization_histogram: hist,
        waf_series: series,
        classifier_bytes_per_block: placer.bytes_per_block(),
        active_classes: placer.active_classes(),
        analytic_greedy_waf: {
            let g = f.geometry();
            let physical = (g.segment_count as u64 - 1) * g.blocks_per_segment() as u64;
            crate::model::greedy_waf(f.stats().mapped_blocks as f64 / physical.max(1) as f64)
        },
    })
}

/// Writes one block, cleaning first whenever the log is out of space; returns the
/// checkpoints that took.
fn write_cleaning(
    f: &Arc<SimFtl>,
    c: &mut Cleaner<Arc<SparseDevice>, Arc<MemIndex>>,
    policy: Policy,
    lba: u64,
    data: &[u8],
    stream: StreamId,
) -> Result<u64, Error> {
    let mut checkpoints = 0;
    loop {
        match f.write(lba, data, false, stream) {
            Ok(()) => return Ok(checkpoints),
            Err(ftl::Error::NoSpace) => {
                // Clean until two segments above the reserve are free or cleaned, then
                // free the cleaned ones with one checkpoint. (A checkpoint seals every
                // stream's open chunk: one per victim cost a summary and padding per
                // stream each time, 1-2% of the writes with 1-2 MiB segments.)
                let mut progressed = false;
                while f.free_segments() + f.dead_segments() <= f.gc_reserve_segments() + 1 {
                    match c.run_slice(policy, Budget::unbounded(), &|| false)? {
                        SliceEnd::NoVictim => break,
                        _ => progressed = true,
                    }
                }
                if !progressed && f.dead_segments() == 0 {
                    return Err(ftl::Error::NoSpace.into());
                }
                f.checkpoint()?;
                checkpoints += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
