//! Cleaning benchmarks (`cargo bench -p cleaner --bench gc`):
//!
//! 1. Write latency under cleaning: steady 4 KiB random overwrites of a 90%-full device,
//!    in-process on a file backing (O_DIRECT, io_uring), one writer at QD1, with
//!    (a) time-sliced cleaning, (b) the same cleaner non-preemptive (whole victims),
//!    (c) no cleaning at all (a 10%-full device, where the run fits in free space).
//!    Reports p50 / p99 / p99.9 / max per run and p99.9 and max against run (c).
//! 2. WAF under uniform random overwrites at the default over-provisioning against the
//!    analytic greedy figure (Desnoyers: WAF = 1 / (1 - u), (u - 1) / ln u = logical /
//!    physical), on the in-memory device with greedy cleaning run synchronously.
//!
//! 3. Slice-length sweep: run 1(a) again for each slice length of GC_BENCH_SLICES (ms,
//!    default "0.5,1,2,5,10,20"): p99.9 and max write latency, IOPS and blocks copied per
//!    slice length; the default slice (`CleanerConfig::default().slice`) is picked from it.
//!
//! Environment: GC_BENCH_DIR (default /var/tmp/ftlblk-gc-bench), GC_BENCH_SIZE_MB (default
//! 1024), GC_BENCH_OPS (default 200000), GC_BENCH_SLICES (empty: no sweep), GC_BENCH_JSON
//! (write the results there too).

use cleaner::{Budget, Cleaner, CleanerConfig, Policy, SliceEnd};
use ftl::backing::{format_backing, open_backing};
use ftl::device::mem::MemDevice;
use ftl::index::mem::MemIndex;
use ftl::{Config, FormatOptions, Ftl, StreamId};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(serde::Serialize)]
struct Latency {
    run: String,
    ops: u64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    iops: f64,
    blocks_copied: u64,
    preemptions: u64,
    waf: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn latency_run(name: &str, fill: f64, cleaner: Option<CleanerConfig>, ops: u64) -> Latency {
    let dir = std::env::var("GC_BENCH_DIR").unwrap_or_else(|_| "/var/tmp/ftlblk-gc-bench".into());
    std::fs::create_dir_all(&dir).expect("bench dir");
    let size = env_u64("GC_BENCH_SIZE_MB", 1024) << 20;
    let backing = std::path::Path::new(&dir).join("gc.img");
    let index = std::path::Path::new(&dir).join("gc.ftlidx");
    format_backing(
        &backing,
        &index,
        Some(size),
        &FormatOptions::default(),
        true,
    )
    .expect("format");
    let (f, _) = open_backing(&backing, &index, Config::default()).expect("open");
    let f = Arc::new(f);
    let cap = f.capacity_blocks();
    let filled = (cap as f64 * fill) as u64;
    let mut block = vec![0x5au8; 4096];
    for lba in 0..filled {
        block[..8].copy_from_slice(&lba.to_le_bytes());
        f.write(lba, &block, false, StreamId(1)).expect("fill");
    }
    f.flush().expect("flush");
    let handle = cleaner.map(|c| cleaner::spawn(f.clone(), c).expect("cleaner thread"));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut lat = Vec::with_capacity(ops as usize);
    let start = Instant::now();
    let before = f.stats().counters;
    for i in 0..ops {
        let lba = rng.gen_range(0..filled.max(1));
        block[8..16].copy_from_slice(&i.to_le_bytes());
        let t = Instant::now();
        f.write(lba, &block, false, StreamId(1)).expect("overwrite");
        lat.push(t.elapsed());
    }
    let secs = start.elapsed().as_secs_f64();
    let (copied, preemptions) = match handle {
        Some(h) => {
            let s = h.stats();
            h.stop();
            (s.cleaner.blocks_copied, s.cleaner.preemptions)
        }
        None => (0, 0),
    };
    let after = f.stats().counters;
    let user = after.user_blocks_written - before.user_blocks_written;
    let backing_written = after.backing_blocks_written - before.backing_blocks_written;
    f.close().expect("close");
    lat.sort();
    Latency {
        run: name.into(),
        ops,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        p999_us: percentile(&lat, 0.999),
        max_us: percentile(&lat, 1.0),
        iops: ops as f64 / secs,
        blocks_copied: copied,
        preemptions,
        waf: backing_written as f64 / user.max(1) as f64,
    }
}

/// Greedy WAF of Desnoyers' model for logical/physical ratio `alpha`.
fn analytic_greedy_waf(alpha: f64) -> f64 {
    // Solve (u - 1) / ln u = alpha for u in (0, 1) by bisection; the left side rises with u.
    let (mut lo, mut hi) = (1e-9, 1.0 - 1e-12);
    for _ in 0..200 {
        let mid: f64 = (lo + hi) / 2.0;
        if (mid - 1.0) / mid.ln() < alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    1.0 / (1.0 - (lo + hi) / 2.0)
}

#[derive(serde::Serialize)]
struct Waf {
    logical_blocks: u64,
    physical_log_blocks: u64,
    spare_factor: f64,
    analytic_greedy_waf: f64,
    measured_waf: f64,
    measured_copy_waf: f64,
    ratio: f64,
}

fn waf_run() -> Waf {
    let size = 256u64 << 20;
    let dev = Arc::new(MemDevice::new(size));
    let idx = Arc::new(MemIndex::new());
    let opts = FormatOptions {
        segment_bytes: Some(2 << 20),
        ..Default::default()
    };
    ftl::format(&dev, &idx, &opts, false).expect("format");
    // One reserved segment is all greedy cleaning needs to progress; every segment held
    // back lowers the effective spare factor the model assumes.
    let cfg = Config {
        gc_reserve_segments: 1,
        ..Config::default()
    };
    let f = Arc::new(Ftl::open(dev, idx, cfg).expect("open").0);
    let cap = f.capacity_blocks();
    let g = *f.geometry();
    let physical = (g.segment_count as u64 - 1) * g.blocks_per_segment() as u64;
    let block = vec![0x11u8; 4096];
    for lba in 0..cap {
        f.write(lba, &block, false, StreamId(1)).expect("fill");
    }
    let mut c = Cleaner::new(f.clone());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let write = |lba: u64, c: &mut Cleaner<_, _>| loop {
        match f.write(lba, &block, false, StreamId(1)) {
            Ok(()) => break,
            Err(ftl::Error::NoSpace) => {
                // Greedy cleaning of whole victims until a checkpoint frees segments.
                while f.free_segments() <= f.gc_reserve_segments() {
                    match c
                        .run_slice(Policy::Greedy, Budget::unbounded(), &|| false)
                        .expect("clean")
                    {
                        SliceEnd::NoVictim => break,
                        _ => {
                            f.checkpoint().expect("checkpoint");
                        }
                    }
                }
            }
            Err(e) => panic!("write: {e}"),
        }
    };
    // Warm up to steady state, then measure.
    for _ in 0..3 * cap {
        write(rng.gen_range(0..cap), &mut c);
    }
    let before = f.stats().counters;
    for _ in 0..4 * cap {
        write(rng.gen_range(0..cap), &mut c);
    }
    let after = f.stats().counters;
    let user = (after.user_blocks_written - before.user_blocks_written) as f64;
    let copied = (after.relocated_blocks - before.relocated_blocks) as f64;
    let backing = (after.backing_blocks_written - before.backing_blocks_written) as f64;
    let alpha = cap as f64 / physical as f64;
    let analytic = analytic_greedy_waf(alpha);
    Waf {
        logical_blocks: cap,
        physical_log_blocks: physical,
        spare_factor: 1.0 - alpha,
        analytic_greedy_waf: analytic,
        measured_waf: backing / user,
        measured_copy_waf: (user + copied) / user,
        ratio: (backing / user) / analytic,
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run small.
    let ops = env_u64("GC_BENCH_OPS", 200_000);
    let sliced = CleanerConfig::default();
    let whole = CleanerConfig {
        non_preemptive: true,
        ..CleanerConfig::default()
    };
    let runs = vec![
        latency_run("no-cleaning (10% full)", 0.10, None, ops),
        latency_run("time-sliced cleaning (90% full)", 0.90, Some(sliced), ops),
        latency_run("non-preemptive cleaning (90% full)", 0.90, Some(whole), ops),
    ];
    println!(
        "{:<38}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "run", "p50 us", "p99 us", "p99.9 us", "max us", "IOPS", "WAF"
    );
    for r in &runs {
        println!(
            "{:<38}{:>10.1}{:>10.1}{:>10.1}{:>10.0}{:>10.0}{:>10.2}",
            r.run, r.p50_us, r.p99_us, r.p999_us, r.max_us, r.iops, r.waf
        );
    }
    let base = &runs[0];
    for r in &runs[1..] {
        println!(
            "{}: p99.9 = {:.2}x the no-cleaning run (target <= 3x), max {:.1} ms (target <= 20 ms)",
            r.run,
            r.p999_us / base.p999_us,
            r.max_us / 1000.0
        );
    }
    let slices: Vec<f64> = std::env::var("GC_BENCH_SLICES")
        .unwrap_or_else(|_| "0.5,1,2,5,10,20".into())
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let mut sweep = Vec::new();
    for ms in &slices {
        let cfg = CleanerConfig {
            slice: Duration::from_secs_f64(ms / 1000.0),
            ..CleanerConfig::default()
        };
        sweep.push(latency_run(&format!("slice {ms} ms"), 0.90, Some(cfg), ops));
    }
    if !sweep.is_empty() {
        println!(
            "slice sweep (90% full, default slice {:?}):",
            CleanerConfig::default().slice
        );
        println!(
            "{:<14}{:>10}{:>10}{:>10}{:>10}{:>14}{:>12}",
            "slice", "p99 us", "p99.9 us", "max us", "IOPS", "copied", "preempted"
        );
        for r in &sweep {
            println!(
                "{:<14}{:>10.1}{:>10.1}{:>10.0}{:>10.0}{:>14}{:>12}",
                r.run, r.p99_us, r.p999_us, r.max_us, r.iops, r.blocks_copied, r.preemptions
            );
        }
    }
    let w = waf_run();
    println!(
        "WAF, uniform random overwrites, spare factor {:.3}: measured {:.3} (copies only {:.3}), analytic greedy {:.3}, ratio {:.3} (target within 10%)",
        w.spare_factor, w.measured_waf, w.measured_copy_waf, w.analytic_greedy_waf, w.ratio
    );
    if let Ok(path) = std::env::var("GC_BENCH_JSON") {
        let j = serde_json::json!({"latency": runs, "slice_sweep": sweep, "waf": w});
        std::fs::write(&path, serde_json::to_string_pretty(&j).unwrap_or_default())
            .expect("write json");
    }
}
