//! The command line: the [`Cli`] clap parses and [`run`], which hands each subcommand to
//! the module that owns it.
//!
//! Called by `main` only. Imports every command module (and [`crate::args`] for `info`'s
//! options); no command module imports this one.

use crate::args::BackingArgs;
use crate::error::CliError;
use crate::{backing_cmd, bench, device_cmd, replay_cmd, stats_cmd};
use clap::{Parser, Subcommand};

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
    #[command(after_help = "Examples:
  ftlblk format --backing /var/lib/ftlblk/a.img --size 64G   # a new sparse file
  ftlblk format --backing /dev/nvme1n1 --segment-size 64M    # a whole SSD, its erase unit
  ftlblk format --backing a.img --force                      # start over (erases a.img)")]
    Format(backing_cmd::FormatArgs),
    /// Open a backing (recovering after a crash), print its superblock and figures as JSON,
    /// and close it cleanly.
    #[command(after_help = "Example (the device must not be served meanwhile):
  ftlblk info --backing /var/lib/ftlblk/a.img")]
    Info(BackingArgs),
    /// Measure the FTL in-process on a backing file: random write, random read, write+flush.
    #[command(after_help = "Examples:
  ftlblk bench --backing /tmp/b.img --size 2G                          # fresh device
  ftlblk bench --backing /tmp/b.img --size 2G --tests steady --passes 3  # full device
  ftlblk bench --backing /tmp/b.img --size 3G --tests fragread
scripts/bench.sh runs them beside raw fio on the same file and writes bench.json.")]
    Bench(bench::BenchArgs),
    /// Replay a trace or a synthetic workload through the real FTL and cleaner
    /// (metadata-only, in memory) and report write amplification.
    #[command(after_help = "Examples:
  ftlblk replay --workload zipf:0.99 --capacity 8G --loops 20
  ftlblk replay --workload hotcold:90/10 --policy cost-hotness --json
  ftlblk replay --trace io_traces.csv.gz --format alibaba --volume 12 --capacity wss --utilization 90
  ftlblk replay --trace cbs.csv --format tencent --volume 1283 --capacity wss --json")]
    Replay(replay_cmd::ReplayArgs),
    /// Verify every invariant of a backing and its index offline (read-only); exits 1
    /// when a problem is found, 2 when it cannot check (every command exits 2 on
    /// failure). With --rebuild-index, first rebuild a lost or damaged index from the log.
    /// Past 64 GiB exported, its check of the map against the log sorts the log's records
    /// into scratch files beside the index, INDEX.check-spill (32 bytes per block of the log,
    /// removed when done); the backing and the index's records are not changed.
    #[command(after_help = "Examples (the device must not be served meanwhile):
  ftlblk check --backing /var/lib/ftlblk/a.img
  ftlblk check --backing /var/lib/ftlblk/a.img --rebuild-index   # the index is lost")]
    Check(backing_cmd::CheckArgs),
    /// Serve a backing as /dev/ublkbN (formatting a new backing file first) and print the
    /// device as JSON; returns once the device is live while a daemon keeps serving it.
    Add(device_cmd::AddArgs),
    /// Delete a device: stop it through the kernel and wait for its daemon to checkpoint
    /// the FTL and exit.
    #[command(after_help = "Examples:
  ftlblk del -n 0      # /dev/ublkb0
  ftlblk del --all")]
    Del(device_cmd::DelArgs),
    /// List the devices ftlblk serves (or served, when a daemon died and the kernel keeps
    /// the device for `recover`).
    #[command(after_help = "Example:
  ftlblk list --json")]
    List(device_cmd::ListArgs),
    /// Re-attach a new daemon to device N after its daemon died (kill -9, crash): the FTL
    /// recovers and the kernel re-issues the requests that were in flight.
    #[command(after_help = "Example (after the daemon of /dev/ublkb0 died):
  ftlblk recover -n 0
`ftlblk add` of the same backing does the same.")]
    Recover(device_cmd::RecoverArgs),
    /// Show a device's figures from its daemon: WAF, free segments, mapped blocks,
    /// flushes, trims, discards, cleaning (copies, slices, preemptions, throttle), streams,
    /// fragmentation, request latencies.
    #[command(after_help = "Examples:
  ftlblk stats -n 0
  ftlblk stats -n 0 --json
  ftlblk stats -n 0 --prometheus     # what add --metrics-listen serves")]
    Stats(stats_cmd::StatsArgs),
    /// Export /dev/ublkbN over NVMe-oF (TCP) through the kernel's NVMe target (nvmet,
    /// configured in configfs), so other machines use it as an NVMe namespace.
    #[command(after_help = "Example:
  ftlblk export -n 0 --nvmet tcp:192.0.2.10:4420
  # on another machine: nvme connect -t tcp -a 192.0.2.10 -s 4420 -n <the nqn printed>")]
    Export(device_cmd::ExportArgs),
    /// Remove the NVMe-oF exports of /dev/ublkbN (disconnect the initiators first).
    #[command(after_help = "Example:
  ftlblk unexport -n 0")]
    Unexport(device_cmd::UnexportArgs),
}

/// Runs the command.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Format(a) => backing_cmd::format(a),
        Cmd::Export(a) => device_cmd::export(a),
        Cmd::Unexport(a) => device_cmd::unexport(a),
        Cmd::Info(a) => backing_cmd::info(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Replay(a) => replay_cmd::run(a),
        Cmd::Check(a) => backing_cmd::check(a),
        Cmd::Add(a) => device_cmd::add(a),
        Cmd::Del(a) => device_cmd::del(a),
        Cmd::List(a) => device_cmd::list(a),
        Cmd::Recover(a) => device_cmd::recover(a),
        Cmd::Stats(a) => stats_cmd::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The systemd unit's command line is one the binary takes: `add --config FILE
    /// --foreground` for the instance's file.
    /// Every command's --help ends with an example.
    #[test]
    fn every_command_has_an_example() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        for sub in cmd.get_subcommands_mut() {
            let name = sub.get_name().to_string();
            let help = sub.render_help().to_string();
            assert!(
                help.contains("Example") && help.contains(&format!("ftlblk {name}")),
                "`ftlblk {name} --help` has no example:\n{help}"
            );
        }
    }

    /// `--config` says every device option: one given beside it is refused, not
    /// silently dropped (`--depth` was let through and ignored).
    #[test]
    fn every_device_option_conflicts_with_config() {
        for opt in [
            &["--backing", "b.img"][..],
            &["--depth", "64"],
            &["--queues", "2"],
            &["--io-buf-size", "1M"],
            &["--map-cache", "1G"],
        ] {
            let mut argv = vec!["ftlblk", "add", "--config", "f.toml"];
            argv.extend_from_slice(opt);
            assert!(Cli::try_parse_from(&argv).is_err(), "{argv:?} was accepted");
        }
        assert!(Cli::try_parse_from(["ftlblk", "add", "--config", "f.toml"]).is_ok());
    }

    #[test]
    fn the_service_unit_runs_a_valid_command() {
        let unit = include_str!("../scripts/systemd/ftlblk@.service");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("the unit has an ExecStart");
        let argv: Vec<String> = exec
            .replace("%i", "db")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert!(argv[0].ends_with("/ftlblk"), "{exec}");
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{exec}: {e}"));
        match cli.cmd {
            Cmd::Add(a) => {
                assert_eq!(
                    a.config.as_deref(),
                    Some(std::path::Path::new("/etc/ftlblk/db.toml"))
                );
                assert!(a.foreground, "systemd supervises the process itself");
            }
            other => panic!("the unit runs {other:?}, not add"),
        }
        // The example configuration is one `add --config` reads.
        let example = include_str!("../scripts/ftlblk-example.toml");
        let f =
            crate::config_file::parse(std::path::Path::new("/etc/ftlblk/example.toml"), example)
                .expect("the example parses");
        assert_eq!(f.size, Some(8 << 30));
    }
}
