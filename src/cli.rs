//! Command-line interface.

use crate::args::{BackingArgs, GeometryArgs};
use crate::bench;
use clap::{Args, Parser, Subcommand};
use ftl::backing::{format_backing, open_backing_staged, StagingPlace};
use ftl::Config;

/// ftlblk: a block device whose every write is appended to a log on the backing SSD.
#[derive(Parser, Debug)]
#[command(name = "ftlblk", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Format a backing file or block device (a missing file is created sparse with --size).
    Format(FormatArgs),
    /// Open a backing (recovering after a crash), print its superblock and figures as JSON,
    /// and close it cleanly.
    Info(BackingArgs),
    /// Measure the FTL in-process on a backing file: random write, random read, write+flush.
    Bench(bench::BenchArgs),
    /// Replay a trace or a synthetic workload through the real FTL and cleaner
    /// (metadata-only, in memory) and report write amplification.
    Replay(crate::replay_cmd::ReplayArgs),
    /// Verify every invariant of a backing and its index offline (read-only); exits 1
    /// when a problem is found.
    Check(crate::check_cmd::CheckArgs),
    /// Serve a backing as /dev/ublkbN (formatting a new backing file first) and print the
    /// device as JSON; returns once the device is live while a daemon keeps serving it.
    Add(crate::device_cmd::AddArgs),
    /// Delete a device: stop it through the kernel and wait for its daemon to checkpoint
    /// the FTL and exit.
    Del(crate::device_cmd::DelArgs),
    /// List the devices ftlblk serves (or served, when a daemon died and the kernel keeps
    /// the device for `recover`).
    List(crate::device_cmd::ListArgs),
    /// Re-attach a new daemon to device N after its daemon died (kill -9, crash): the FTL
    /// recovers and the kernel re-issues the requests that were in flight.
    Recover(crate::device_cmd::RecoverArgs),
    /// Show a device's figures from its daemon: WAF, free segments, mapped blocks,
    /// flushes, trims, discards, cleaning (copies, slices, preemptions, throttle), streams.
    Stats(crate::device_cmd::StatsArgs),
}

#[derive(Args, Debug)]
pub struct FormatArgs {
    #[command(flatten)]
    pub backing: BackingArgs,
    #[command(flatten)]
    pub geometry: GeometryArgs,
    /// Overwrite an existing ftlblk format (its data is lost).
    #[arg(long)]
    pub force: bool,
}

pub fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Format(a) => {
            let opts = a.geometry.options()?;
            let sb = format_backing(
                &a.backing.backing,
                &a.backing.index_dir(),
                a.geometry.size,
                &opts,
                a.force,
            )
            .map_err(|e| e.to_string())?;
            let g = sb.geometry;
            let out = serde_json::json!({
                "backing": a.backing.backing,
                "index": a.backing.index_dir(),
                "uuid": sb.uuid_string(),
                "exported_bytes": g.exported_bytes(),
                "segment_bytes": g.segment_bytes,
                "segments": g.segment_count,
                "flash_page_bytes": g.flash_page_bytes,
                "op_percent": g.op_permille as f64 / 10.0,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        Cmd::Info(a) => {
            // The server's staging directory: what a killed server staged is replayed
            // here too rather than left behind by a newer checkpoint.
            let staging = StagingPlace::Dir(crate::runfiles::run_dir());
            let (f, report) =
                open_backing_staged(&a.backing, &a.index_dir(), Config::default(), &staging)
                    .map_err(|e| e.to_string())?;
            let out = serde_json::json!({
                "uuid": f.superblock().uuid_string(),
                "geometry": f.geometry(),
                "open": report,
                "stats": f.stats(),
            });
            f.close().map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        Cmd::Bench(a) => bench::run(a),
        Cmd::Replay(a) => crate::replay_cmd::run(a),
        Cmd::Check(a) => match crate::check_cmd::run(a)? {
            true => Ok(()),
            false => Err("the checker found problems".into()),
        },
        Cmd::Add(a) => crate::device_cmd::add(a),
        Cmd::Del(a) => crate::device_cmd::del(a),
        Cmd::List(a) => crate::device_cmd::list(a),
        Cmd::Recover(a) => crate::device_cmd::recover(a),
        Cmd::Stats(a) => crate::device_cmd::stats(a),
    }
}
