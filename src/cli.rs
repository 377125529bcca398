//! Command-line interface.

use crate::bench;
use clap::{Args, Parser, Subcommand};
use ftl::backing::{default_index_dir, format_backing, open_backing_staged, StagingPlace};
use ftl::{Config, FormatOptions};
use std::path::PathBuf;

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

/// Where the backing and its index are.
#[derive(Args, Debug, Clone)]
pub struct BackingArgs {
    /// Backing file or block device.
    #[arg(long)]
    pub backing: PathBuf,
    /// Directory of the sled index (default: <backing>.ftlidx beside a file,
    /// /var/lib/ftlblk/<name>.ftlidx for a block device).
    #[arg(long)]
    pub index: Option<PathBuf>,
}

impl BackingArgs {
    pub fn index_dir(&self) -> PathBuf {
        self.index
            .clone()
            .unwrap_or_else(|| default_index_dir(&self.backing))
    }
}

/// Geometry options of `format`.
#[derive(Args, Debug, Clone, Default)]
pub struct GeometryArgs {
    /// Size to create a missing backing file with, and to use of the backing (e.g. 2G, 512M).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Segment size: the unit of log space and of cleaning; a power of two matching the
    /// SSD's erase unit (default: at least 512 segments, 1 MiB .. 256 MiB; cleaning needs
    /// hundreds of segments to separate hot data from cold).
    #[arg(long, value_parser = parse_size)]
    pub segment_size: Option<u64>,
    /// Over-provisioning in percent of the physical size (default 20).
    #[arg(long)]
    pub op_percent: Option<f64>,
    /// Flash page size for block patching: a FLUSH pads the log to it (power of two,
    /// 4K to 1M and at most a quarter of the segment; default 16K).
    #[arg(long, value_parser = parse_size)]
    pub page_size: Option<u64>,
}

impl GeometryArgs {
    pub fn options(&self) -> Result<FormatOptions, String> {
        let op_permille = match self.op_percent {
            Some(p) if !(0.0..100.0).contains(&p) => {
                return Err(format!("--op-percent {p} must be in 0..100"))
            }
            Some(p) => Some((p * 10.0).round() as u32),
            None => None,
        };
        let page = match self.page_size {
            Some(p) if p > u32::MAX as u64 => return Err(format!("--page-size {p} is too large")),
            Some(p) => Some(p as u32),
            None => None,
        };
        Ok(FormatOptions {
            segment_bytes: self.segment_size,
            op_permille,
            flash_page_bytes: page,
            size_bytes: self.size,
            ..Default::default()
        })
    }
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

/// Parses sizes like 4096, 64K, 512M, 2G, 1T (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let mult: u64 = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                other => {
                    return Err(format!(
                        "unknown size suffix {other:?} in {s:?} (use K, M, G, T)"
                    ))
                }
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 512M, 2G)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("2X").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn op_percent_is_validated() {
        let g = GeometryArgs {
            op_percent: Some(150.0),
            ..Default::default()
        };
        assert!(g.options().is_err());
        let g = GeometryArgs {
            op_percent: Some(7.5),
            ..Default::default()
        };
        assert_eq!(g.options().unwrap().op_permille, Some(75));
    }
}
