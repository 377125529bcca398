//! The device subcommands: `add`, `recover`, `del`, `list` (`stats` is
//! [`crate::stats_cmd`]).
//!
//! - `add` / `recover` check their options, then either serve the device in this process
//!   (`--foreground`: [`crate::daemon::run`]) or start that same command as a background
//!   daemon through [`crate::launch`], which waits until it reports the device live (then
//!   its record is printed as JSON and the command exits 0) or fails (exit 2 with the
//!   daemon's message, or the tail of its log when it died without one).
//! - `del` stops a device through the kernel (STOP_DEV + DEL_DEV with a fresh control
//!   handle), waits for its daemon to exit (it checkpoints the FTL and releases the
//!   backing on the way), and removes the run files. A kernel device without an ftlblk
//!   record is another server's as far as `del` knows: deleted only with `--force`.
//! - `list` shows the devices of `/run/ftlblk/*.json` whose daemon is alive or whose
//!   kernel device still exists.
//!
//! Owns the commands' arguments. Called by [`crate::cli`] only.

use crate::args::{check_seconds, parse_seconds, parse_size};
use crate::daemon::{self, DaemonConfig, Mode};
use crate::error::CliError;
use crate::kctl;
use crate::launch;
use crate::output::{human_bytes, outln, print_json};
use crate::runfiles::{self, DeviceRecord};
use clap::Args;
use ftl::backing::default_index_dir;
use libublk::sys;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options `--config` replaces (a configuration file says them all).
const CONFIG_KEYS: [&str; 11] = [
    "backing",
    "size",
    "index",
    "queues",
    "id",
    "depth",
    "io_buf_size",
    "no_cleaner",
    "map_cache",
    "metrics_listen",
    "discard_delay",
];

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  ftlblk add --backing /var/lib/ftlblk/a.img --size 64G     # /dev/ublkbN on a sparse file
  ftlblk add --backing /dev/nvme1n1 --map-cache 2G          # a formatted block device
  ftlblk add --config /etc/ftlblk/db.toml --foreground      # what ftlblk@db.service runs

A backing whose daemon died while its device stayed in the kernel is re-attached
(as `ftlblk recover`) instead of getting a second device.")]
pub struct AddArgs {
    /// Backing file or block device. A missing file is created sparse (see --size; never
    /// under /dev, where a missing path is a device not there yet) and
    /// formatted; an existing regular file without an ftlblk format is formatted only
    /// when its first and last MiB read as zeros and its index holds no other backing's
    /// map (else: `ftlblk format --backing B --force`); a formatted backing is opened, recovering
    /// after a crash. A block device is never formatted implicitly (use `ftlblk format`).
    #[arg(long, required_unless_present = "config")]
    pub backing: Option<PathBuf>,
    /// Read the device's options from this TOML file (keys: backing, index, size,
    /// queues, depth, io_buf_size, map_cache, cleaner, id, metrics_listen,
    /// discard_delay; see
    /// `scripts/ftlblk-example.toml`) instead of the command line.
    #[arg(long, value_name = "FILE", conflicts_with_all = CONFIG_KEYS)]
    pub config: Option<PathBuf>,
    /// Size of a backing file that does not exist yet (default 8G). For an existing
    /// unformatted file: how much of it to use (default: all). Ignored for a formatted
    /// backing. Suffixes K, M, G, T.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Directory of the sled index (default: <backing>.ftlidx beside a file; for a block
    /// device /var/lib/ftlblk/<its path, / as ->.ftlidx, e.g. dev-vg0-data.ftlidx).
    #[arg(long)]
    pub index: Option<PathBuf>,
    /// Hardware queues of the device, each served by its own thread (default: the number
    /// of CPUs).
    #[arg(long)]
    pub queues: Option<u16>,
    /// Requests in flight per queue (1 to 4096).
    #[arg(long, default_value_t = 128)]
    pub depth: u16,
    /// Device number N of /dev/ublkbN (default: the kernel picks the lowest free one).
    #[arg(long)]
    pub id: Option<u32>,
    /// Largest request the device accepts, which is also the io buffer of each tag
    /// (a multiple of 4K, at most 32M).
    #[arg(long, value_parser = parse_size, default_value = "512K")]
    pub io_buf_size: u64,
    /// Do not run the background cleaner (segment garbage collection). Without it the
    /// device fails writes with ENOSPC once the free segments are used up.
    #[arg(long)]
    pub no_cleaner: bool,
    /// RAM for the LBA map's page cache (e.g. 256M, 2G). The map takes 8 bytes per 4 KiB
    /// block (2 GiB per TiB); pages beyond the cache stay in the index and are read on
    /// a miss. Default 256M: the whole map of a device of up to about 128 GiB.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub map_cache: u64,
    /// Seconds a freed segment stays free before it is discarded (TRIM, or a hole
    /// punched in a backing file). Segments reused sooner are overwritten whole instead:
    /// on a full device under overwrites, discarding each freed segment at once cost a
    /// fifth of the IOPS. 0: discard every segment as it is freed (space goes back to a
    /// thin backing at once).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, default_value = "2")]
    pub discard_delay: f64,
    /// Serve Prometheus metrics (OpenMetrics text: bytes written, WAF, free segments,
    /// cleaning, checkpoints, per-stream writes, READ/WRITE/FLUSH/DISCARD latency
    /// histograms) over HTTP on this address, e.g. 127.0.0.1:9400 (`GET /metrics`). Off
    /// by default; `ftlblk stats -n N --prometheus` prints the same once.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// Serve the device in this process until SIGINT/SIGTERM or `ftlblk del`, logging to
    /// stderr, instead of starting a background daemon and returning once the device is
    /// live.
    #[arg(long)]
    pub foreground: bool,
    /// Create a missing backing only if this machine never formatted one at its path
    /// (set by --config: a file's `size` is for the first start; the background daemon
    /// gets it passed on).
    #[arg(long, hide = true)]
    pub create_once: bool,
}

#[derive(Args, Debug, Clone)]
pub struct RecoverArgs {
    /// Device number N of /dev/ublkbN whose daemon died (its /run/ftlblk/N.json names the
    /// backing, index and queue layout).
    #[arg(short = 'n', long = "number")]
    pub id: u32,
    /// Serve in this process instead of starting a background daemon.
    #[arg(long)]
    pub foreground: bool,
}

#[derive(Args, Debug, Clone)]
pub struct DelArgs {
    /// Device number N of /dev/ublkbN to delete.
    #[arg(
        short = 'n',
        long = "number",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub id: Option<u32>,
    /// Delete every device that has a record in /run/ftlblk and is still in the kernel
    /// or served (a record left by a dead daemon of a device already gone stays: `del -n`
    /// removes it).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Seconds to wait for each daemon to checkpoint and exit. A process still holding
    /// /dev/ublkbN open keeps the kernel's device until it closes it: `del` then says so
    /// and succeeds (the backing is closed).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Delete the kernel device even without an ftlblk record in /run/ftlblk (it may be
    /// another ublk server's).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    /// Print JSON (an array of device records with their state) instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn absolute(p: &Path) -> Result<PathBuf, CliError> {
    std::path::absolute(p).map_err(|e| CliError::io(p.display().to_string(), e))
}

fn default_queues() -> u16 {
    std::thread::available_parallelism()
        .map(|n| n.get().min(sys::UBLK_MAX_NR_QUEUES as usize) as u16)
        .unwrap_or(1)
}

impl AddArgs {
    /// These options with a configuration file's in place of the ones it replaces.
    fn with_file(mut self, f: crate::config_file::DeviceFile) -> Self {
        self.backing = Some(f.backing);
        self.index = f.index;
        self.size = f.size;
        self.queues = f.queues;
        self.id = f.id;
        if let Some(d) = f.depth {
            self.depth = d;
        }
        if let Some(b) = f.io_buf_size {
            self.io_buf_size = b;
        }
        if let Some(m) = f.map_cache {
            self.map_cache = m;
        }
        if let Some(d) = f.discard_delay {
            self.discard_delay = d;
        }
        self.no_cleaner = f.cleaner == Some(false);
        self.metrics_listen = f.metrics_listen;
        self.config = None;
        // A service starts from its file at every boot: a missing backing is created at
        // the first start only (`known.rs`).
        self.create_once = true;
        self
    }
}

/// The device of `backing` whose daemon died while the kernel kept the device (user
/// recovery): `add` re-attaches it rather than creating a second device on the backing.
/// The backing is matched by identity, not by spelling: a path through a symlink
/// (`/dev/disk/by-id/...`), `..` or another mount of it created a second device while the
/// first still held its I/O for `recover` (found by review, 2026-11-27).
fn orphaned_device_of(backing: &Path) -> Option<u32> {
    orphan_among(
        &runfiles::all_records(),
        |r| same_backing(&r.backing, backing),
        runfiles::daemon_alive,
        runfiles::kernel_has_device,
    )
}

/// The first of `records` of the backing (`ours`) whose daemon is dead and whose device
/// the kernel still has. The kernel's look is part of the choice: a stale record of the
/// backing under a lower id (a daemon killed while it closed, a `del` that timed out)
/// hid the orphan after it, and `add` made a second device on the backing (found by
/// review, 2026-11-29).
fn orphan_among(
    records: &[runfiles::DeviceRecord],
    ours: impl Fn(&runfiles::DeviceRecord) -> bool,
    alive: impl Fn(&runfiles::DeviceRecord) -> bool,
    in_kernel: impl Fn(u32) -> bool,
) -> Option<u32> {
    records
        .iter()
        .find(|r| ours(r) && !alive(r) && in_kernel(r.id))
        .map(|r| r.id)
}

/// Whether two paths name the same backing: the same block device (`st_rdev`) or the
/// same file (`st_dev`, `st_ino`); equal spellings when neither can be looked at.
fn same_backing(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) if x.file_type().is_block_device() && y.file_type().is_block_device() => {
            x.rdev() == y.rdev()
        }
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// The smallest `--map-cache`: one map page (512 entries of 8
/// bytes).
const MIN_MAP_CACHE: u64 = 512 * 8;

/// `ftlblk add`.
pub fn add(a: AddArgs) -> Result<(), CliError> {
    let file = a.config.clone();
    let a = match &a.config {
        Some(path) => {
            let file = crate::config_file::load(path)?;
            a.with_file(file)
        }
        None => a,
    };
    // A value out of range is named where it was given: the file and its key, or the
    // option (a file's `queues = 0` was reported as "--queues 0"; found by review,
    // 2026-11-29).
    let named = |key: &str, value: String| match &file {
        Some(f) => format!("{}: {key} = {value}", f.display()),
        None => format!("--{} {value}", key.replace('_', "-")),
    };
    let queues = a.queues.unwrap_or_else(default_queues);
    if queues == 0 || queues as u32 > sys::UBLK_MAX_NR_QUEUES {
        return Err(CliError::BadArgs(format!(
            "{} must be 1..={}",
            named("queues", queues.to_string()),
            sys::UBLK_MAX_NR_QUEUES
        )));
    }
    if a.depth == 0 || a.depth as u32 > sys::UBLK_MAX_QUEUE_DEPTH {
        return Err(CliError::BadArgs(format!(
            "{} must be 1..={}",
            named("depth", a.depth.to_string()),
            sys::UBLK_MAX_QUEUE_DEPTH
        )));
    }
    if a.io_buf_size < 4096 || !a.io_buf_size.is_multiple_of(4096) || a.io_buf_size > 32 << 20 {
        return Err(CliError::BadArgs(format!(
            "{} must be a multiple of 4K between 4K and 32M",
            named("io_buf_size", a.io_buf_size.to_string())
        )));
    }
    // 0 in a device's record means "a daemon older than the option" (`recover` then
    // takes the default), so 0 was not kept across a recover (found by review,
    // 2026-11-29); the cache holds a map page at least.
    if a.map_cache < MIN_MAP_CACHE {
        return Err(CliError::BadArgs(format!(
            "{} must be at least {MIN_MAP_CACHE} bytes (one map page)",
            named("map_cache", a.map_cache.to_string())
        )));
    }
    // A configuration file's delay did not go through the option's parser.
    check_seconds(a.discard_delay)?;
    let Some(backing) = a.backing.as_deref() else {
        return Err(CliError::BadArgs("add needs --backing or --config".into()));
    };
    // A service's backing missing where this machine formatted one: refused before
    // anything else (the daemon looks again before it creates one).
    if a.create_once && !backing.exists() {
        let index = match &a.index {
            Some(i) => i.clone(),
            None => default_index_dir(backing),
        };
        crate::known::may_create(&crate::known::state_dir(), backing, &index)?;
    }
    // After the arguments: `add --depth 0` on a host without ublk said "needs root"
    // rather than what was wrong with it (found by review, 2026-11-29).
    kctl::require_ublk()?;
    let backing = absolute(backing)?;
    if let Some(id) = orphaned_device_of(&backing) {
        eprintln!(
            "ftlblk: device {id} of {} lost its daemon; re-attaching it (ftlblk recover -n {id})",
            backing.display()
        );
        return recover(RecoverArgs {
            id,
            foreground: a.foreground,
        });
    }
    let index = match &a.index {
        Some(i) => absolute(i)?,
        None => default_index_dir(&backing),
    };
    let cfg = DaemonConfig {
        backing,
        index,
        size: a.size,
        queues,
        depth: a.depth,
        io_buf_bytes: a.io_buf_size as u32,
        cleaner: !a.no_cleaner,
        map_cache_bytes: a.map_cache,
        discard_delay: Duration::from_secs_f64(a.discard_delay),
        mode: Mode::Add { id: a.id },
        log: launch::log_from_env(),
        metrics_listen: a.metrics_listen.clone(),
        create_once: a.create_once,
    };
    if a.foreground {
        return daemon::run(cfg);
    }
    let mut args: Vec<OsString> = vec![
        "add".into(),
        "--foreground".into(),
        "--backing".into(),
        cfg.backing.clone().into(),
        "--index".into(),
        cfg.index.clone().into(),
        "--queues".into(),
        queues.to_string().into(),
        "--depth".into(),
        a.depth.to_string().into(),
        "--io-buf-size".into(),
        a.io_buf_size.to_string().into(),
        "--map-cache".into(),
        a.map_cache.to_string().into(),
        "--discard-delay".into(),
        a.discard_delay.to_string().into(),
    ];
    if let Some(s) = a.size {
        args.extend(["--size".into(), s.to_string().into()]);
    }
    if let Some(id) = a.id {
        args.extend(["--id".into(), id.to_string().into()]);
    }
    if a.no_cleaner {
        args.push("--no-cleaner".into());
    }
    if a.create_once {
        args.push("--create-once".into());
    }
    if let Some(m) = &a.metrics_listen {
        args.extend(["--metrics-listen".into(), m.into()]);
    }
    let rec = launch::start_background(args, &launch::provisional_log(a.id))?;
    let short = std::fs::File::open(&rec.backing)
        .ok()
        .and_then(|f| ftl::device::file::host_space_short(&f));
    if let Some(w) = short.map(daemon::host_space_warning(&rec.backing)) {
        eprintln!("{w}");
    }
    print_json(&rec)
}

/// `ftlblk recover`.
pub fn recover(a: RecoverArgs) -> Result<(), CliError> {
    kctl::require_ublk()?;
    let id = a.id;
    let rec = runfiles::read_record(id)?.ok_or_else(|| {
        CliError::Device(format!(
            "no {}: ftlblk has no record of device {id}, so it does not know its backing",
            runfiles::record_path(id).display()
        ))
    })?;
    if runfiles::daemon_alive(&rec) {
        return Err(CliError::Device(format!(
            "device {id} is still served by pid {}: nothing to recover",
            rec.pid
        )));
    }
    if !runfiles::kernel_has_device(id) {
        return Err(CliError::Device(format!(
            "ublk device {id} no longer exists in the kernel: nothing to recover; start it \
             anew with `ftlblk add --backing {}`",
            ftl::error::shell_quote(&rec.backing.display().to_string())
        )));
    }
    let cfg = DaemonConfig {
        backing: rec.backing.clone(),
        index: rec.index.clone(),
        size: None,
        queues: rec.queues,
        depth: rec.depth,
        io_buf_bytes: rec.io_buf_bytes,
        cleaner: rec.cleaner,
        map_cache_bytes: if rec.map_cache_bytes == 0 {
            ftl::DEFAULT_MAP_CACHE_BYTES
        } else {
            rec.map_cache_bytes
        },
        discard_delay: rec
            .discard_delay_ms
            .map_or(ftl::Config::default().discard_delay, Duration::from_millis),
        mode: Mode::Recover {
            id,
            recoveries: rec.recoveries,
            uuid: rec.uuid.clone(),
        },
        log: launch::log_from_env(),
        metrics_listen: rec.metrics_listen.clone(),
        create_once: true,
    };
    if a.foreground {
        return daemon::run(cfg);
    }
    let args: Vec<OsString> = vec![
        "recover".into(),
        "-n".into(),
        id.to_string().into(),
        "--foreground".into(),
    ];
    let rec = launch::start_background(args, &runfiles::log_path(id))?;
    print_json(&rec)
}

/// `ftlblk del`.
pub fn del(a: DelArgs) -> Result<(), CliError> {
    kctl::require_ublk()?;
    let ids: Vec<u32> = if a.all {
        runfiles::all_records()
            .into_iter()
            .filter(|r| runfiles::daemon_alive(r) || runfiles::kernel_has_device(r.id))
            .map(|r| r.id)
            .collect()
    } else {
        a.id.into_iter().collect()
    };
    let mut failed = Vec::new();
    for id in ids {
        match del_one(id, Duration::from_secs(a.timeout), a.force) {
            Ok(msg) => outln!("{msg}")?,
            Err(e) => {
                eprintln!("ftlblk: {e}");
                failed.push(id);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::DeleteFailed(failed))
    }
}

/// How long `del` waits for the kernel to remove a device once its server is gone.
const NODE_GRACE: Duration = Duration::from_secs(5);

fn del_one(id: u32, timeout: Duration, force: bool) -> Result<String, CliError> {
    // The kernel's NVMe target holds the device open: deleting under it would hang.
    if let Some(e) = crate::nvmet::exports(Path::new(crate::nvmet::CONFIGFS))
        .into_iter()
        .find(|e| e.device == runfiles::bdev_path(id))
    {
        return Err(CliError::Device(format!(
            "device {id} is exported over NVMe-oF as {} ({}): run `ftlblk unexport -n {id}` first",
            e.nqn,
            e.ports.join(", ")
        )));
    }
    // A record that cannot be read is named in the refusal below, not taken for none.
    let (rec, unreadable) = match runfiles::read_record(id) {
        Ok(r) => (r, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let daemon = rec
        .as_ref()
        .filter(|r| runfiles::daemon_alive(r))
        .map(|r| (r.pid, r.pid_start));
    if !runfiles::kernel_has_device(id) {
        return match (rec, daemon) {
            (Some(r), None) => {
                runfiles::remove_record_of(id, r.pid, r.pid_start, &r.uuid);
                Ok(format!(
                    "ublk device {id} was already gone; removed its stale record"
                ))
            }
            (Some(_), Some((pid, _))) => Err(CliError::Device(format!(
                "ublk device {id} does not exist in the kernel but its daemon (pid {pid}) runs: \
                 it is starting or stopping; try again"
            ))),
            (None, _) => Err(CliError::NotFound(id)),
        };
    }
    owned_or_forced(id, rec.is_some(), unreadable.as_deref(), force)?;
    // A device a file system has mounted (or anyone claims exclusively) is refused: the
    // waiting DEL_DEV blocks until its last opener lets go, and `del` hung there, before
    // its --timeout (found by review, 2026-11-29).
    if kctl::claimed(&runfiles::bdev_path(id)) {
        return Err(CliError::Device(format!(
            "ublk device {id} is in use (mounted, or claimed by another user): unmount it \
             first"
        )));
    }
    kctl::kill_and_delete_async(id)?;
    // No deadline past what an Instant holds (`--timeout 18446744073709551615` panicked
    // after the device was deleted; found by review, 2026-11-29).
    let deadline = Instant::now().checked_add(timeout);
    if let Some((pid, start)) = daemon {
        while runfiles::process_alive(pid, start) {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(CliError::Device(format!(
                    "ublk device {id} is deleted but its daemon (pid {pid}) did not exit within \
                     {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Only the record of the daemon stopped here: the freed id may already be another
    // device's, whose `add` wrote its own record.
    if let Some(r) = &rec {
        runfiles::remove_record_of(id, r.pid, r.pid_start, &r.uuid);
    } else {
        runfiles::remove_record(id);
    }
    // The server closed its backing cleanly only if its staging file is gone: one left
    // holds writes it completed that are not on the backing yet (its close failed, or it
    // was killed), and a reboot clears them. `del` said "deleted" and exited 0 (found by
    // review, 2026-11-29).
    if let Some(r) = &rec {
        let staged = ftl::backing::staging_file(&runfiles::run_dir(), &r.uuid);
        if runfiles::left_staging(&staged) {
            return Err(CliError::Device(format!(
                "ublk device {id} is deleted, but its server did not close its backing \
                 cleanly: {} holds writes it completed that may not be on the backing yet \
                 (its log says why). Replay them before a reboot clears them: `ftlblk add \
                 --backing {}` (then `ftlblk del` again if the device is not wanted)",
                staged.display(),
                r.backing.display()
            )));
        }
    }
    // The kernel removes the device when its last opener closes it: wait for that a few
    // seconds (within --timeout), then say who keeps it (its server is gone either way).
    let node_deadline = Instant::now() + NODE_GRACE;
    let node_deadline = deadline.map_or(node_deadline, |d| d.min(node_deadline));
    // The nodes go at once (STOP_DEV removes the disk, DEL_DEV_ASYNC the char device);
    // the id stays the kernel's until the last opener of the disk closes it.
    while runfiles::kernel_has_device(id) || kctl::id_held(id) {
        if Instant::now() >= node_deadline {
            let server = if daemon.is_some() {
                "its server closed the backing and exited"
            } else {
                "no ftlblk server served it"
            };
            return Ok(format!(
                "deleted ublk device {id} ({server}), but something still holds it open (a \
                 process that does not claim it exclusively: qemu, dd, a shell's \
                 redirection): the kernel keeps device id {id} until that closes it"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!("deleted ublk device {id}"))
}

/// A kernel device without an ftlblk record is deleted only with `--force`: a mistyped
/// number removed another ublk server's disk from under its file system (found by
/// review, 2026-11-27). A record that exists but cannot be read (`unreadable`: why) is
/// named as such: it was taken for none, and `del` called the device another server's
/// (found by review, 2026-11-29).
fn owned_or_forced(
    id: u32,
    has_record: bool,
    unreadable: Option<&str>,
    force: bool,
) -> Result<(), CliError> {
    if has_record || force {
        return Ok(());
    }
    let path = runfiles::record_path(id);
    Err(CliError::Device(match unreadable {
        Some(why) => format!(
            "the ftlblk record of ublk device {id} cannot be read ({why}); if the device is \
             this host's ftlblk device, `ftlblk del -n {id} --force` deletes it (and the \
             damaged {})",
            path.display()
        ),
        None => format!(
            "ublk device {id} has no ftlblk record ({}): it may be another ublk server's \
             device. `ftlblk del -n {id} --force` deletes it anyway",
            path.display()
        ),
    }))
}

/// One row of `list`.
#[derive(serde::Serialize)]
struct ListEntry {
    #[serde(flatten)]
    record: DeviceRecord,
    /// Kernel state: live, quiesced (no server: run `recover`), dead, or gone.
    state: String,
    daemon_running: bool,
    /// NVMe-oF exports of the device (`ftlblk export`).
    exports: Vec<crate::nvmet::Export>,
}

/// `ftlblk list`.
pub fn list(a: ListArgs) -> Result<(), CliError> {
    let have_ctl = kctl::require_ublk().is_ok();
    let entries: Vec<ListEntry> = runfiles::all_records()
        .into_iter()
        .filter_map(|r| {
            let alive = runfiles::daemon_alive(&r);
            let in_kernel = runfiles::kernel_has_device(r.id);
            if !alive && !in_kernel {
                return None;
            }
            let state = if !in_kernel {
                "gone".to_string()
            } else if have_ctl {
                kctl::state(r.id).unwrap_or("unknown").to_string()
            } else {
                "unknown".to_string()
            };
            let exports = crate::nvmet::exports(Path::new(crate::nvmet::CONFIGFS))
                .into_iter()
                .filter(|e| e.device == r.block_device)
                .collect();
            Some(ListEntry {
                record: r,
                state,
                daemon_running: alive,
                exports,
            })
        })
        .collect();
    if a.json {
        return print_json(&entries);
    }
    if entries.is_empty() {
        outln!("no ftlblk devices")?;
        return Ok(());
    }
    outln!(
        "{:<4} {:<14} {:<9} {:>10} {:>8} {:>7}  BACKING",
        "ID",
        "DEVICE",
        "STATE",
        "SIZE",
        "PID",
        "QUEUES"
    )?;
    for e in &entries {
        let pid = if e.daemon_running {
            e.record.pid.to_string()
        } else {
            "-".to_string()
        };
        outln!(
            "{:<4} {:<14} {:<9} {:>10} {:>8} {:>7}  {}",
            e.record.id,
            e.record.block_device.display(),
            e.state,
            human_bytes(e.record.size_bytes),
            pid,
            format!("{}x{}", e.record.queues, e.record.depth),
            e.record.backing.display()
        )?;
        for x in &e.exports {
            outln!(
                "     exported over NVMe-oF as {} on {}",
                x.nqn,
                x.ports.join(", ")
            )?;
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Device number N of /dev/ublkbN to export.
    #[arg(short = 'n', long = "number")]
    pub id: u32,
    /// Where the kernel's NVMe-oF target listens: tcp:ADDR:PORT (IPv6 in brackets).
    /// Any host that reaches it may connect (attr_allow_any_host): bind it to an address
    /// only trusted hosts reach.
    #[arg(long, value_name = "tcp:ADDR:PORT")]
    pub nvmet: crate::nvmet::Endpoint,
    /// The subsystem's NQN (default: nqn.2026-11.io.ftlblk:<uuid of the FTL>, the same
    /// across restarts).
    #[arg(long)]
    pub nqn: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct UnexportArgs {
    /// Device number N of /dev/ublkbN whose exports to remove.
    #[arg(short = 'n', long = "number")]
    pub id: u32,
}

/// `ftlblk export`: configures the kernel's NVMe target (configfs) to serve /dev/ublkbN.
pub fn export(a: ExportArgs) -> Result<(), CliError> {
    if let Some(n) = &a.nqn {
        crate::nvmet::check_nqn(n)?;
    }
    let rec = runfiles::read_record(a.id)?.ok_or(CliError::NotFound(a.id))?;
    if !rec.block_device.exists() {
        return Err(CliError::Device(format!(
            "{} does not exist: is device {} live (ftlblk list)?",
            rec.block_device.display(),
            a.id
        )));
    }
    let root = crate::nvmet::ensure_target()?;
    let nqn = a.nqn.unwrap_or_else(|| crate::nvmet::nqn_of(&rec.uuid));
    crate::nvmet::export(&root, &nqn, &rec.block_device, &a.nvmet)?;
    print_json(&serde_json::json!({
        "device": rec.block_device,
        "nqn": nqn,
        "transport": "tcp",
        "address": a.nvmet.addr,
        "port": a.nvmet.port,
        "connect": format!(
            "nvme connect -t tcp -a {} -s {} -n {nqn}",
            a.nvmet.addr, a.nvmet.port
        ),
    }))
}

/// `ftlblk unexport`.
pub fn unexport(a: UnexportArgs) -> Result<(), CliError> {
    let root = Path::new(crate::nvmet::CONFIGFS);
    let n = crate::nvmet::unexport(root, &runfiles::bdev_path(a.id))?;
    if n == 0 {
        return Err(CliError::Device(format!(
            "{} is not exported (ftlblk list shows exports)",
            runfiles::bdev_path(a.id).display()
        )));
    }
    outln!(
        "removed {n} NVMe-oF export(s) of {}",
        runfiles::bdev_path(a.id).display()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `add` finds the orphan of its backing past a stale record of the same backing
    /// under a lower id (its device gone from the kernel), and never a live daemon's or
    /// another backing's.
    #[test]
    fn an_orphan_is_found_past_a_stale_record_of_its_backing() {
        use crate::runfiles::tests::sample;
        let mut other = sample(2);
        other.backing = "/other".into();
        let records = vec![sample(1), other, sample(4), sample(6)];
        let ours = |r: &runfiles::DeviceRecord| r.backing == sample(1).backing;
        let dead = |_: &runfiles::DeviceRecord| false;
        let in_kernel = |id: u32| id == 2 || id == 4 || id == 6;
        assert_eq!(orphan_among(&records, ours, dead, in_kernel), Some(4));
        let live_4 = |r: &runfiles::DeviceRecord| r.id == 4;
        assert_eq!(orphan_among(&records, ours, live_4, in_kernel), Some(6));
        assert_eq!(orphan_among(&records, ours, dead, |_| false), None);
    }

    /// A backing named through a symlink or `..` is the same backing as its record's
    /// path; another file of the same name elsewhere, or a missing one, is not.
    #[test]
    fn a_backing_is_matched_by_identity_not_spelling() {
        let d = tempfile::tempdir().expect("tempdir");
        let img = d.path().join("disk.img");
        std::fs::write(&img, b"x").expect("write");
        std::fs::create_dir(d.path().join("sub")).expect("mkdir");
        let link = d.path().join("by-id");
        std::os::unix::fs::symlink(&img, &link).expect("symlink");
        let dotdot = d.path().join("sub/../disk.img");
        assert!(same_backing(&img, &link));
        assert!(same_backing(&img, &dotdot));
        let other = d.path().join("sub/disk.img");
        std::fs::write(&other, b"x").expect("write");
        assert!(!same_backing(&img, &other));
        let gone = d.path().join("gone.img");
        assert!(!same_backing(&img, &gone));
        assert!(same_backing(&gone, &gone));
    }

    /// `del` of a kernel device with no ftlblk record refuses unless forced, and names
    /// the way to force it.
    #[test]
    fn a_device_without_a_record_is_deleted_only_when_forced() {
        let e = owned_or_forced(3, false, None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ftlblk del -n 3 --force"), "{e}");
        assert!(e.contains("another ublk server"), "{e}");
        assert!(owned_or_forced(3, true, None, false).is_ok());
        assert!(owned_or_forced(3, false, None, true).is_ok());
        // A damaged record is named, with why, not taken for another server's device.
        let e = owned_or_forced(3, false, Some("expected value at line 1"), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot be read (expected value at line 1)"),
            "{e}"
        );
        assert!(!e.contains("another ublk server"), "{e}");
        assert!(e.contains("ftlblk del -n 3 --force"), "{e}");
    }
}
