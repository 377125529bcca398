//! `ftlblk replay`: drives the real FTL and cleaner in metadata-only mode over a trace or
//! a synthetic workload and reports write amplification.
//!
//! Owns [`ReplayArgs`] and the report's printing. Called by [`crate::cli`] only.

use crate::args::parse_size;
use crate::error::CliError;
use crate::output::{human_bytes, outln, print_json};
use clap::Args;
use cleaner::Policy;
use replay::sim::{simulate, ClassifierKind, SimConfig};
use replay::trace::{read_file, remap_dense, remap_working_set, Format};
use replay::workload::{generate, write_probabilities, Workload};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace file to replay (--format says its format; csv unless given); or use --workload.
    #[arg(long, conflicts_with = "workload")]
    pub trace: Option<PathBuf>,
    /// Trace format: fio-iolog, msr, blkparse, csv (op,offset,length in bytes), alibaba
    /// (device_id,opcode,offset,length,timestamp), tencent (timestamp,offset,size,io_type,
    /// volume_id). A file named *.gz is decompressed.
    #[arg(long, default_value = "csv")]
    pub format: String,
    /// The volume to replay from a trace of many (alibaba device_id, tencent volume_id,
    /// msr Hostname_DiskNumber); a trace holding several needs it, and the error lists them.
    #[arg(long)]
    pub volume: Option<String>,
    /// Built-in workload: uniform, zipf:S, fio-zipf:S (zipf with the rank -> block hash of fio,
    /// which leaves some blocks never overwritten), hotcold:W/D (W% of writes to D% of the
    /// data), seqmix.
    #[arg(long)]
    pub workload: Option<String>,
    /// Logical capacity of the simulated device (e.g. 1G); the default 8G is the size of
    /// the file `ftlblk add` creates by default (which exports less: its spare comes out
    /// of the 8G, here it is added). WAF depends on it: the default geometry cuts
    /// a small device into small segments, where the log's metadata weighs more.
    /// `wss` (traces only): the trace's working set (distinct 4 KiB blocks written) divided
    /// by --utilization, with the trace's blocks mapped densely onto it.
    #[arg(long, value_parser = parse_capacity, default_value = "8G")]
    pub capacity: Capacity,
    /// Over-provisioning in percent of the physical size.
    #[arg(long, default_value_t = 20.0)]
    pub op: f64,
    /// Segment size (default: the FTL's default for the size).
    #[arg(long, value_parser = parse_size)]
    pub segment_size: Option<u64>,
    /// Lifetime classes (streams) at most, 1 ..= 7; 1 is one stream (classifier none).
    /// The classifier gives a class its own stream only while it is busy enough.
    #[arg(long, default_value_t = 7)]
    pub streams: u8,
    /// Blocks whose history the online classifier keeps (default 8Mi; a device with more
    /// blocks shares the slots, as a large device does): to measure what sharing costs.
    #[arg(long)]
    pub tracked_blocks: Option<u64>,
    /// Server restarts spread evenly over the run: at each, the online classifier forgets
    /// every block's history, as a new server process starts with none. To measure what
    /// a restart costs.
    #[arg(long, default_value_t = 0)]
    pub restarts: u32,
    /// Turn off wear-aware allocation and static wear levelling (free segments reused in
    /// the order they were freed): to measure what wear levelling costs and gives.
    #[arg(long)]
    pub no_wear_levelling: bool,
    /// Placement: none (one stream, GC output in another), online (write-time classifier,
    /// by each block's history), oracle (knows each write's next overwrite from the trace:
    /// the practical lower bound), frequency (knows each block's true write rate over the
    /// trace: the best a history-based classifier can know on a stationary workload).
    #[arg(long, default_value = "online")]
    pub classifier: String,
    /// Victim policy: greedy, cost-benefit, cost-hotness (the default, as the daemon's
    /// cleaner).
    #[arg(long, default_value = "cost-hotness")]
    pub policy: String,
    /// Workloads, and traces with `--capacity wss`: logical utilisation in percent of the
    /// capacity.
    #[arg(long, default_value_t = 80.0)]
    pub utilization: f64,
    /// Workloads: full overwrites of the logical data after the fill; traces: replay
    /// the trace this many times.
    #[arg(long, default_value_t = 8)]
    pub loops: u64,
    /// Random seed of a workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write a PNG with WAF over time and the victim-utilisation histogram.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `--capacity`: a size, or the trace's working set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    Bytes(u64),
    WorkingSet,
}

fn parse_capacity(s: &str) -> Result<Capacity, String> {
    if s.eq_ignore_ascii_case("wss") {
        Ok(Capacity::WorkingSet)
    } else {
        parse_size(s)
            .map(Capacity::Bytes)
            .map_err(|e| e.to_string())
    }
}

/// `ftlblk replay`.
pub fn run(a: ReplayArgs) -> Result<(), CliError> {
    let mut capacity = match a.capacity {
        Capacity::Bytes(b) => b / 4096,
        Capacity::WorkingSet if a.trace.is_none() => {
            return Err(CliError::BadArgs(
                "--capacity wss sizes the device from a trace: give --trace".into(),
            ))
        }
        Capacity::WorkingSet => 0, // set from the trace below
    };
    if capacity == 0 && a.capacity != Capacity::WorkingSet {
        return Err(CliError::BadArgs("--capacity must be at least 4K".into()));
    }
    if !(1.0..=100.0).contains(&a.utilization) {
        return Err(CliError::BadArgs(format!(
            "--utilization {} must be in 1..=100",
            a.utilization
        )));
    }
    if a.volume.is_some() && a.trace.is_none() {
        return Err(CliError::BadArgs(
            "--volume selects a volume of a --trace".into(),
        ));
    }
    // The format's own range (1 ..= 90%, as `format --op-percent`).
    if !(1.0..=90.0).contains(&a.op) {
        return Err(CliError::BadArgs(format!(
            "--op {} must be in 1..=90 percent",
            a.op
        )));
    }
    let mut classifier: ClassifierKind = a.classifier.parse().map_err(CliError::BadArgs)?;
    match a.streams {
        1 => classifier = ClassifierKind::None,
        2..=7 => {}
        n => return Err(CliError::BadArgs(format!("--streams {n}: use 1 ..= 7"))),
    }
    if let Some(s) = a.segment_size.filter(|s| !s.is_power_of_two()) {
        // 0 divided by zero in the simulator's sizing before the geometry said anything.
        return Err(CliError::BadArgs(format!(
            "--segment-size {s}: a power of two (4M, 16M ...)"
        )));
    }
    let policy: Policy = a.policy.parse()?;
    let mut probabilities = None;
    let (ops, label) = match (&a.trace, &a.workload) {
        (Some(path), _) => {
            let format: Format = a.format.parse().map_err(CliError::BadArgs)?;
            if a.loops == 0 {
                // Workloads take 0 as "the fill only"; a trace has no fill of its own, and
                // 0 replayed it once anyway.
                return Err(CliError::BadArgs(
                    "--loops 0 with --trace: replay it at least once".into(),
                ));
            }
            let mut once = read_file(path, format, a.volume.as_deref())?;
            if !once
                .iter()
                .any(|op| matches!(op, replay::trace::TraceOp::Write { .. }))
            {
                // Whatever the capacity: it printed WAF 0.000 with a byte --capacity.
                return Err(CliError::BadArgs(format!(
                    "{} writes nothing: its working set is empty",
                    path.display()
                )));
            }
            if a.capacity == Capacity::WorkingSet {
                let ws = remap_working_set(&once);
                capacity = (ws.blocks as f64 * 100.0 / a.utilization).ceil() as u64;
                once = ws.ops;
            } else {
                let (dense, folded) = remap_dense(once, capacity);
                once = dense;
                if folded > 0 {
                    eprintln!(
                        "warning: the trace touches {folded} more 1 MiB extents than the \
                         device holds; they share blocks with others (use --capacity wss)"
                    );
                }
            }
            let total = (once.len() as u64)
                .checked_mul(a.loops)
                .filter(|&n| {
                    n <= isize::MAX as u64 / std::mem::size_of::<replay::trace::TraceOp>() as u64
                })
                .ok_or_else(|| {
                    CliError::BadArgs(format!(
                        "--loops {} replays more requests than memory holds",
                        a.loops
                    ))
                })?;
            let mut ops = Vec::with_capacity(total as usize);
            for _ in 0..a.loops {
                ops.extend_from_slice(&once);
            }
            let label = match &a.volume {
                Some(v) => format!("{} volume {v}", path.display()),
                None => path.display().to_string(),
            };
            (ops, label)
        }
        (None, Some(w)) => {
            let workload: Workload = w.parse()?;
            let logical = ((capacity as f64) * a.utilization / 100.0) as u64;
            if classifier == ClassifierKind::Frequency {
                probabilities = Some(write_probabilities(&workload, logical.max(1), a.seed).into());
            }
            (
                generate(
                    &workload,
                    logical.max(1),
                    a.loops.checked_mul(logical).ok_or_else(|| {
                        CliError::BadArgs(format!(
                            "--loops {} writes more blocks than a u64 counts",
                            a.loops
                        ))
                    })?,
                    a.seed,
                ),
                w.clone(),
            )
        }
        (None, None) => {
            return Err(CliError::BadArgs(
                "give --trace FILE --format F, or --workload NAME".into(),
            ))
        }
    };
    let cfg = SimConfig {
        capacity_blocks: capacity,
        op_permille: (a.op * 10.0).round() as u32,
        segment_bytes: a.segment_size,
        classifier,
        classes: a.streams,
        tracked_blocks: a.tracked_blocks,
        wear_levelling: !a.no_wear_levelling,
        write_probabilities: probabilities,
        policy,
        restarts: a.restarts,
        series_points: 100,
    };
    let tty = std::io::stderr().is_terminal() && !a.json;
    let started = std::time::Instant::now();
    let report = simulate(&ops, &cfg, &mut |done, total| {
        if tty {
            let pct = done * 100 / total.max(1);
            let bar = "#".repeat((pct / 2) as usize);
            eprint!("\r[{bar:<50}] {pct:>3}% {done}/{total} blocks");
            let _ = std::io::stderr().flush();
        }
    })
    .map_err(|e| {
        // Only the sizing errors get advice on sizing: every FTL error got "a smaller
        // --segment-size", an invalid one too (found by review, 2026-11-29).
        let sized = format!(
            "--capacity wss sized the device from the trace's working set: {} MiB at --utilization {}%",
            (capacity * 4096) >> 20,
            a.utilization
        );
        match (a.capacity, e) {
            (Capacity::WorkingSet, e @ replay::Error::Config(_)) => {
                CliError::BadArgs(format!("{e} ({sized})"))
            }
            (Capacity::WorkingSet, replay::Error::Ftl(e @ ftl::Error::NoSpace)) => {
                CliError::BadArgs(format!("{e} ({sized}): give a higher --op or a lower --utilization"))
            }
            (_, e) => e.into(),
        }
    })?;
    if tty {
        eprintln!();
    }
    if let Some(p) = &a.plot {
        replay::plot::plot(
            &report,
            &format!("{label}, {:?}, {}", classifier, a.policy),
            p,
        )
        .map_err(CliError::Plot)?;
    }
    if a.json {
        print_json(&report)?;
    } else {
        outln!("workload            {label}")?;
        outln!(
            "device              {} logical ({} blocks asked), {}% spare, {} segments",
            human_bytes(report.geometry.exported_blocks * 4096),
            capacity,
            a.op,
            human_bytes(report.geometry.segment_bytes)
        )?;
        outln!("classifier/policy   {classifier:?} / {}", a.policy)?;
        outln!("user blocks         {}", report.user_blocks)?;
        outln!("backing blocks      {}", report.backing_blocks)?;
        outln!("blocks copied       {}", report.relocated_blocks)?;
        outln!(
            "metadata in the log {} summaries, {} padding blocks ({:.4} per user block, second half)",
            report.summary_blocks, report.padding_blocks, report.metadata_per_user_block_steady
        )?;
        outln!("WAF (whole run)     {:.3}", report.waf)?;
        outln!("WAF (second half)   {:.3}", report.waf_steady)?;
        outln!("segments cleaned    {}", report.segments_cleaned)?;
        let w = &report.wear;
        outln!(
            "segment reuse       min {} / mean {:.1} / max {} (max/mean {:.2}, spread {}; {} wear-levelling victims, {} extra copies)",
            w.min, w.mean, w.max, w.max_over_mean, w.spread, report.wear_victims, report.wear_extra_blocks
        )?;
        outln!("diverted to GC      {} blocks", report.relocated_diverted)?;
        outln!(
            "victim utilisation  {:?} (10% bins)",
            report.victim_utilization_histogram
        )?;
        outln!(
            "per stream          user blocks, relocated in, segments and live blocks at the end"
        )?;
        for s in &report.per_stream {
            outln!(
                "  stream {}          {:>10} {:>10} {:>5} {:>10}",
                s.stream,
                s.user_blocks,
                s.relocated_blocks,
                s.segments,
                s.live_blocks
            )?;
        }
        outln!(
            "classes with stream {:#09b} (bit c = class c, hottest first)",
            report.active_classes
        )?;
        outln!(
            "analytic greedy WAF {:.3} (uniform random, same logical/physical ratio)",
            report.analytic_greedy_waf
        )?;
        outln!(
            "classifier memory   {} bytes per block",
            report.classifier_bytes_per_block
        )?;
        outln!(
            "replayed in         {:.1} s",
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ReplayArgs,
    }

    fn args(argv: &[&str]) -> ReplayArgs {
        Cli::try_parse_from(std::iter::once("replay").chain(argv.iter().copied()))
            .unwrap()
            .a
    }

    /// Bad arguments are errors, not panics or silent defaults (found by review,
    /// 2026-11-29): a segment size of 0 divided by zero; hotcold over one block panicked
    /// in a clamp; a trace with `--loops 0` replayed once; a trace that writes nothing
    /// printed WAF 0.000.
    #[test]
    fn bad_replay_arguments_are_errors() {
        let e = run(args(&[
            "--workload",
            "uniform",
            "--capacity",
            "64M",
            "--segment-size",
            "0",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("power of two"), "{e}");
        // Two blocks of data (one panicked in the workload's clamp; the smallest
        // device holds 16 segments) replay.
        run(args(&[
            "--workload",
            "hotcold:90/10",
            "--capacity",
            "1M",
            "--segment-size",
            "64K",
            "--utilization",
            "1",
            "--loops",
            "2",
        ]))
        .expect("two blocks of hotcold replay");
        // A capacity too small for the segments is an error: the device was grown until
        // they fitted, and the workload replayed at a fraction of the utilisation asked
        // for (found by review, 2026-11-29).
        let e = run(args(&[
            "--workload",
            "hotcold:90/10",
            "--capacity",
            "8K",
            "--loops",
            "2",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("too small for segments"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "r,0,4096\n").unwrap();
        let p = path.to_str().unwrap();
        let e = run(args(&[
            "--trace",
            p,
            "--format",
            "csv",
            "--capacity",
            "64M",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("writes nothing"), "{e}");
        std::fs::write(&path, "w,0,4096\n").unwrap();
        let e = run(args(&[
            "--trace",
            p,
            "--format",
            "csv",
            "--capacity",
            "64M",
            "--loops",
            "0",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("--loops 0"), "{e}");
    }

    #[test]
    fn capacity_is_a_size_or_the_working_set() {
        assert_eq!(parse_capacity("wss"), Ok(Capacity::WorkingSet));
        assert_eq!(parse_capacity("1G"), Ok(Capacity::Bytes(1 << 30)));
        assert!(parse_capacity("lots").is_err());
    }

    #[test]
    fn working_set_and_volume_need_a_trace() {
        let e = run(args(&["--workload", "uniform", "--capacity", "wss"])).unwrap_err();
        assert!(e.to_string().contains("--trace"), "{e}");
        let e = run(args(&["--workload", "uniform", "--volume", "3"])).unwrap_err();
        assert!(e.to_string().contains("--trace"), "{e}");
    }

    #[test]
    fn a_working_set_too_small_for_the_geometry_says_what_to_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "0,W,0,1048576,1\n0,W,4096,4096,2\n").unwrap();
        let p = path.to_str().unwrap();
        let wss = |extra: &[&str]| {
            let mut argv = vec!["--trace", p, "--format", "alibaba", "--capacity", "wss"];
            argv.extend_from_slice(extra);
            run(args(&argv)).unwrap_err().to_string()
        };
        let e = wss(&["--op", "1"]);
        assert!(e.contains("too small for segments"), "{e}");
        assert!(
            e.contains("--segment-size") && e.contains("working set"),
            "{e}"
        );
        // A segment size the format refuses is not a question of size: no advice to
        // make it smaller.
        let e = wss(&["--segment-size", "32K"]);
        assert!(e.contains("power of two between"), "{e}");
        assert!(!e.contains("smaller --segment-size"), "{e}");
        // Volumes listed when the trace holds several.
        std::fs::write(&path, "0,W,0,4096,1\n5,W,0,4096,2\n").unwrap();
        let e = run(args(&["--trace", p, "--format", "alibaba"])).unwrap_err();
        assert!(e.to_string().contains("--volume"), "{e}");
    }
}
