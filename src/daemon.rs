//! The device server: `ftlblk add --foreground` and `ftlblk recover --foreground`.
//!
//! Contract of [`run`]:
//! 1. Marks the process an I/O flusher (`PR_SET_IO_FLUSHER`, inherited by every thread
//!    started after it), then opens the FTL (recovering after a crash). `add` formats a
//!    missing backing file (created sparse) or a blank regular file without an ftlblk
//!    superblock first (first and last MiB zero, no other backing's map in its index); a
//!    block device is never formatted implicitly. A backing another server holds fails
//!    with the FTL's `Busy` error (a block device mounted or claimed otherwise: its EBUSY)
//!    and nothing is created in the kernel.
//! 2. Starts the write-time stream classifier, the cleaner thread (unless disabled; its
//!    output split by age through the classifier) and the control plane ([`Control`](crate::control::Control):
//!    signals, checkpoint timer, stats socket).
//! 3. `add` creates a new ublk device; `recover` sends START_USER_RECOVERY for the
//!    existing one and re-attaches (the kernel re-issues the requests in flight when the
//!    previous server died). Then libublk's `run_target` runs the queues ([`crate::ublk`]).
//! 4. Once the kernel has the device (before START_DEV): writes `/run/ftlblk/N.json` (a
//!    failed write is retried when live and then by the control plane's timer).
//!    When `/dev/ublkbN` is live: prints the record as JSON on
//!    stdout, and reports it on the readiness pipe of the `add`/`recover` that started this
//!    daemon in the background ([`crate::launch`]); any failure before that is reported
//!    there.
//! 5. When the device stops (SIGINT/SIGTERM, or `ftlblk del` through the kernel): stops
//!    the control plane and the cleaner, closes the FTL (flush + checkpoint), removes the
//!    run files and deletes the device. Returns `Ok` after a clean stop.
//!
//! Called by [`crate::device_cmd`] (`--foreground`, which is also how a background daemon
//! runs once [`crate::launch`] has started it).

use crate::background::Background;
use crate::control::Event;
use crate::error::{describe_ublk, CliError};
use crate::kctl;
use crate::launch::{self, Notifier};
use crate::offload::Offload;
use crate::runfiles::{self, DeviceRecord};
use crate::ublk;
use ftl::backing::{format_backing, open_backing_staged, FileFtl, StagingPlace};
use ftl::device::BLOCK_SIZE;
use ftl::{BlockDevice, Config, Error as FtlError, FormatOptions};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::UblkFlags;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of a backing file `add` creates when none is given.
pub const DEFAULT_CREATE_SIZE: u64 = 8 << 30;

/// I/O worker threads per queue (see [`crate::offload`]).
const IO_WORKERS_PER_QUEUE: usize = 4;

/// File descriptors the daemon needs beyond one eventfd per tag: per queue its ring and
/// the ublk char device, per thread its io_uring (offload workers of both lanes, chunk
/// writers, the cleaner's threads), sled, the backing, the staging file, sockets.
const FDS_BESIDE_TAGS: u64 = 512;

/// The open-file limit a device of `queues` queues of `depth` tags needs, and what to
/// set the soft limit to, given the current `soft` and `hard` limits: `Ok(None)` when
/// the soft limit is enough, `Ok(Some(new))` to raise it (to the hard limit), an error
/// when even the hard limit is too low. Every tag takes an eventfd
/// ([`crate::offload`]): at depth 128 on 8 queues that is 1024, the usual soft limit, and
/// tags that could not get one never registered: `add` hung until its start timeout
/// (found by review, 2026-11-27).
fn fd_limit_plan(queues: u16, depth: u16, soft: u64, hard: u64) -> Result<Option<u64>, CliError> {
    let needed = queues as u64 * depth as u64 + FDS_BESIDE_TAGS;
    if soft >= needed {
        Ok(None)
    } else if hard >= needed {
        Ok(Some(hard))
    } else {
        Err(CliError::Device(format!(
            "{queues} queues of depth {depth} need about {needed} open files (one eventfd \
             per tag), but the hard limit is {hard}: raise it (`ulimit -Hn`, or \
             LimitNOFILE= in a systemd unit) or use fewer --queues or a smaller --depth \
             (a device re-attached by `recover` keeps its own: `del` it, then `add` it again)"
        )))
    }
}

/// Raises the soft open-file limit as far as [`fd_limit_plan`] says.
fn ensure_fd_limit(queues: u16, depth: u16) -> Result<(), CliError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(CliError::io(
            "getrlimit(RLIMIT_NOFILE)",
            io::Error::last_os_error(),
        ));
    }
    if let Some(new) = fd_limit_plan(queues, depth, lim.rlim_cur, lim.rlim_max)? {
        let raised = libc::rlimit {
            rlim_cur: new,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(CliError::io(
                "setrlimit(RLIMIT_NOFILE)",
                io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// How long the daemon waits for `/dev/ublkbN` to appear after START_DEV.
const BDEV_WAIT: Duration = Duration::from_secs(10);

/// What to serve.
#[derive(Debug, Clone)]
pub enum Mode {
    /// A new device (`None`: the kernel picks the id).
    Add { id: Option<u32> },
    /// Re-attach to device `id` after its server died. `uuid`: the backing's, as its
    /// record says (empty in a record that has none: not checked).
    Recover {
        id: u32,
        recoveries: u32,
        uuid: String,
    },
}

/// Refuses to re-attach device `id` to a backing other than the one it served: the
/// kernel's device (and the file system on it, its page cache) belongs to the backing
/// of uuid `expected`; `found` is the uuid of what the record's path opens now (a
/// reconnected or renamed disk, a file replaced or restored from another device).
/// Found by review (2026-11-29): `recover` opened whatever the path held and wrote its
/// uuid into the record.
pub(crate) fn check_recover_target(
    id: u32,
    backing: &Path,
    expected: &str,
    found: &str,
) -> Result<(), CliError> {
    if expected.is_empty() || expected == found {
        return Ok(());
    }
    Err(CliError::Device(format!(
        "device {id} was served from the backing of uuid {expected}, but {} now holds \
         uuid {found}: not re-attaching it (find the backing of uuid {expected} with \
         `ftlblk info --backing PATH`; `ftlblk del -n {id} --force` removes the device)",
        backing.display()
    )))
}

/// Everything the daemon needs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub backing: PathBuf,
    pub index: PathBuf,
    /// Size for a missing backing file, and of the backing to use when formatting.
    pub size: Option<u64>,
    pub queues: u16,
    pub depth: u16,
    pub io_buf_bytes: u32,
    pub cleaner: bool,
    /// Bytes of RAM the map's page cache may hold.
    pub map_cache_bytes: u64,
    /// How long a freed segment waits for its discard (`ftl::Config::discard_delay`).
    pub discard_delay: std::time::Duration,
    pub mode: Mode,
    /// The log file stdout/stderr go to (background daemons).
    pub log: Option<PathBuf>,
    /// Address to serve Prometheus metrics on (`add --metrics-listen`).
    pub metrics_listen: Option<String>,
    /// A missing backing is created only if this machine never formatted one at its
    /// path (`known.rs`): a config file's start.
    pub create_once: bool,
}

/// Binds the metrics listener (`add --metrics-listen ADDR`), non-blocking for the
/// control plane's runtime.
fn metrics_listener(addr: &str) -> Result<std::net::TcpListener, CliError> {
    let what = || format!("cannot serve metrics on {addr} (--metrics-listen HOST:PORT)");
    let l = std::net::TcpListener::bind(addr).map_err(|e| CliError::io(what(), e))?;
    l.set_nonblocking(true)
        .map_err(|e| CliError::io(what(), e))?;
    Ok(l)
}

/// The warning for a sparse backing file whose file system has less free space than
/// its holes ([`ftl::device::file::host_space_short`]): printed by the daemon into its
/// log and by `add` on the terminal.
pub fn host_space_warning(backing: &Path) -> impl Fn((u64, u64)) -> String + '_ {
    move |(holes, free)| {
        format!(
            "ftlblk: warning: {} is a sparse file with {} not yet allocated, and its file \
             system has {} free: once that is used up, writes fail and the device turns \
             read-only (EROFS) until it is restarted with space freed there",
            backing.display(),
            crate::output::human_bytes(holes),
            crate::output::human_bytes(free)
        )
    }
}

/// Opens the FTL for `cfg`, formatting a new or unformatted backing file for `add`.
fn open_ftl(cfg: &DaemonConfig) -> Result<FileFtl, CliError> {
    let open = || {
        let staging = StagingPlace::Dir(runfiles::run_dir());
        let ftl_cfg = Config {
            map_cache_bytes: cfg.map_cache_bytes,
            discard_delay: cfg.discard_delay,
            ..Config::default()
        };
        open_backing_staged(&cfg.backing, &cfg.index, ftl_cfg, &staging).map(|(f, report)| {
            eprintln!(
                "ftlblk: opened {}: {}",
                cfg.backing.display(),
                serde_json::to_string(&report).unwrap_or_default()
            );
            f
        })
    };
    let formatted = |sb: ftl::superblock::Superblock| {
        crate::known::record_or_warn(&cfg.backing, &sb.uuid_string());
        eprintln!(
            "ftlblk: formatted {} (uuid {}, {} bytes exported)",
            cfg.backing.display(),
            sb.uuid_string(),
            sb.geometry.exported_bytes()
        );
    };
    if matches!(cfg.mode, Mode::Recover { .. }) {
        return Ok(open()?);
    }
    if !cfg.backing.exists() {
        if cfg.create_once {
            crate::known::may_create(&crate::known::state_dir(), &cfg.backing, &cfg.index)?;
        }
        let size = cfg.size.unwrap_or(DEFAULT_CREATE_SIZE);
        let sb = format_backing(
            &cfg.backing,
            &cfg.index,
            Some(size),
            &FormatOptions::default(),
            false,
        )?;
        formatted(sb);
        return Ok(open()?);
    }
    match open() {
        Ok(f) => {
            // A backing formatted before records were kept (or by a user who could not
            // write them) is recorded at its first start (found by review, 2026-11-29).
            crate::known::record_if_unknown(&cfg.backing, &f.superblock().uuid_string());
            Ok(f)
        }
        Err(FtlError::NotFormatted(..)) if cfg.backing.is_file() => {
            let opts = FormatOptions {
                size_bytes: cfg.size,
                ..Default::default()
            };
            let sb = format_backing(&cfg.backing, &cfg.index, None, &opts, false)?;
            formatted(sb);
            Ok(open()?)
        }
        Err(FtlError::NotFormatted(..)) => Err(CliError::Unformatted(cfg.backing.clone())),
        Err(e) => Err(e.into()),
    }
}

/// Waits for a device node to appear.
fn wait_for_path(p: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !p.exists() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Serves one device until it is stopped (see the module docs); a failure before the
/// device is live is also reported to the launcher that started this daemon, if any.
pub fn run(cfg: DaemonConfig) -> Result<(), CliError> {
    let notifier = Arc::new(Notifier::from_env());
    let r = serve_device(cfg, &notifier);
    if let Err(e) = &r {
        notifier.err(&e.to_string());
    }
    r
}

fn serve_device(cfg: DaemonConfig, notifier: &Arc<Notifier>) -> Result<(), CliError> {
    kctl::require_ublk()?;
    // Before any thread starts: every thread the FTL starts does I/O the queues wait for.
    ublk::set_io_flusher();
    ensure_fd_limit(cfg.queues, cfg.depth)?;
    runfiles::ensure_run_dir()?;
    if let Mode::Recover { id, .. } = cfg.mode {
        // Before opening the FTL: a live device has nothing to recover.
        let state = kctl::state(id)?;
        if state == "live" {
            return Err(CliError::Device(format!(
                "ublk device {id} is live: it has a server, nothing to recover"
            )));
        }
    }
    // Bound before anything is opened: a taken address fails the start, not the scrape.
    let metrics = cfg
        .metrics_listen
        .as_deref()
        .map(metrics_listener)
        .transpose()?;
    let ftl = Arc::new(open_ftl(&cfg)?);
    if let Mode::Recover { id, uuid, .. } = &cfg.mode {
        let found = ftl.superblock().uuid_string();
        if let Err(e) = check_recover_target(*id, &cfg.backing, uuid, &found) {
            // That backing's own open was sound: closed as any other.
            let _ = ftl.close();
            return Err(e);
        }
    }
    if let Some(w) = ftl
        .device()
        .host_space_short()
        .map(host_space_warning(&cfg.backing))
    {
        eprintln!("{w}");
    }
    let bg = match Background::start(&ftl, cfg.cleaner, true, metrics, Some(&cfg.index)) {
        Ok(bg) => bg,
        Err(e) => {
            // Closed as any other (no device yet, nothing served): its staging file
            // claimed by this session was left, and a later `del` of the backing warned of
            // writes to replay (found by review, 2026-11-29).
            let _ = ftl.close();
            return Err(e);
        }
    };

    let mut delete_after_close = None;
    let result = serve(&cfg, &ftl, &bg, notifier, &mut delete_after_close);

    bg.stop();
    // Also removes the staging file; on failure it stays and the next open replays it.
    let closed = ftl
        .close()
        .map_err(|e| CliError::ftl_at("closing the FTL", e));
    if let Some(id) = delete_after_close {
        // A kernel without DEL_DEV_ASYNC: the delete that waits for the last opener of
        // /dev/ublkbN, now that nothing is lost by waiting.
        if let Err(e) = kctl::delete(id) {
            eprintln!("ftlblk: {e}");
        }
    }
    match (&result, &closed) {
        (Ok(Some(id)), _) => {
            let (pid, start) = runfiles::own_process();
            runfiles::remove_record_of(*id, pid, start, &ftl.superblock().uuid_string());
            eprintln!(
                "ftlblk: device {id} removed, FTL {}",
                if closed.is_ok() {
                    "checkpointed and closed"
                } else {
                    "NOT closed cleanly"
                }
            );
        }
        (Ok(None), _) => eprintln!("ftlblk: stopped before the device was created"),
        (Err(_), _) => {}
    }
    result.and(closed).map(|_| ())
}

/// Creates (or re-attaches) the device and runs it; returns its id once stopped, or
/// `None` when a stop was requested before it was created.
fn serve(
    cfg: &DaemonConfig,
    ftl: &Arc<FileFtl>,
    bg: &Background,
    notifier: &Arc<Notifier>,
    delete_after_close: &mut Option<u32>,
) -> Result<Option<u32>, CliError> {
    let (classifier, control) = (&bg.classifier, &bg.control);
    let shared = control.shared();
    if shared.stop_requested() {
        return Ok(None);
    }
    let (dev_flags, id_arg, recoveries) = match cfg.mode {
        Mode::Add { id } => (
            UblkFlags::UBLK_DEV_F_ADD_DEV,
            id.map_or(Ok(-1), i32::try_from)
                .map_err(|_| CliError::BadArgs("device id out of range".into()))?,
            0,
        ),
        Mode::Recover { id, recoveries, .. } => {
            let ctrl = kctl::open(id)?;
            kctl::check(ctrl.start_user_recover())
                .map_err(|source| CliError::RecoveryRefused { id, source })?;
            drop(ctrl);
            (UblkFlags::UBLK_DEV_F_RECOVER_DEV, id as i32, recoveries + 1)
        }
    };
    let ctrl = UblkCtrlBuilder::default()
        .name("ftlblk")
        .id(id_arg)
        .nr_queues(cfg.queues)
        .depth(cfg.depth)
        .io_buf_bytes(cfg.io_buf_bytes)
        .ctrl_flags(ublk::CTRL_FLAGS)
        .dev_flags(dev_flags)
        .build()
        .map_err(|e| match (&cfg.mode, &e) {
            (Mode::Add { id: Some(id) }, libublk::UblkError::UringIOError(n))
                if *n == -libc::EEXIST =>
            {
                CliError::Device(format!("ublk device {id} already exists"))
            }
            _ => CliError::ublk("cannot create the ublk device", e),
        })?;
    let id = ctrl.dev_info().dev_id;
    let log = launch::settle_log(cfg.log.as_ref(), id);
    let (pid, pid_start) = runfiles::own_process();
    let record = DeviceRecord {
        id,
        block_device: runfiles::bdev_path(id),
        char_device: runfiles::cdev_path(id),
        backing: cfg.backing.clone(),
        index: cfg.index.clone(),
        size_bytes: ftl.capacity_blocks() * BLOCK_SIZE as u64,
        block_size: BLOCK_SIZE as u32,
        queues: cfg.queues,
        depth: cfg.depth,
        io_buf_bytes: cfg.io_buf_bytes,
        cleaner: cfg.cleaner,
        pid,
        pid_start,
        socket: runfiles::socket_path(id),
        log,
        uuid: ftl.superblock().uuid_string(),
        recoveries,
        map_cache_bytes: cfg.map_cache_bytes,
        metrics_listen: cfg.metrics_listen.clone(),
        discard_delay_ms: Some(record_ms(cfg.discard_delay)),
    };
    // The kernel has the device from here on (ADD_DEV; for `recover`, the old one): its
    // record is written now, not once `/dev/ublkbN` appears (up to BDEV_WAIT later). A
    // kill -9 in between left a device no record named, which `list` did not show and
    // only `del --force` removed. A write that fails here is retried when the device is
    // live, then by the control plane's timer.
    if let Err(e) = runfiles::write_record(&record) {
        eprintln!("ftlblk: warning: {e}; trying again once the device is live");
    }
    // A new device (`add`) that fails to start from here is deleted (libublk's drop of
    // its control handle, or the failed start below): its record goes with it, or it
    // named a dead pid and a device id another server may take next (found by review
    // of this change, 2026-11-29). A recovered device stays, quiesced: its record keeps
    // what the next `recover` needs.
    let record_guard = runfiles::RecordGuard::new(
        id,
        record.uuid.clone(),
        matches!(cfg.mode, Mode::Add { .. }),
    );
    let backing_fd = ftl.device().raw_fd().ok_or(CliError::NoBackingFd)?;

    let tgt_ftl = ftl.clone();
    let tgt_init = move |dev: &mut UblkDev| ublk::init_target(dev, &tgt_ftl, backing_fd);
    let q_ftl = ftl.clone();
    // Enough workers that every queue can have several writes and flushes in flight (the
    // FTL batches concurrent flushes into one device sync); as many again for flushes
    // alone (`offload::Lane`).
    let workers = (cfg.queues as usize * IO_WORKERS_PER_QUEUE).clamp(4, 64);
    let offload = Offload::new(workers).map_err(|e| CliError::io("cannot start I/O workers", e))?;
    let q_offload = offload.clone();
    let q_classifier = classifier.clone();
    let q_writers = bg.writers.clone();
    let q_live = bg.live.clone();
    let q_fn = move |qid: u16, dev: &UblkDev| {
        ublk::run_queue(
            qid,
            dev,
            q_ftl.clone(),
            q_classifier.clone(),
            q_writers.clone(),
            q_offload.clone(),
            q_live.clone(),
        )
    };
    let tx = control.sender();
    let live_notifier = notifier.clone();
    let live_record = record.clone();
    // Why the start failed, if it did: the daemon then exits with an error (it exited 0,
    // and a service manager did not restart it; found by review, 2026-11-27).
    let start_failed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let failed = start_failed.clone();
    let gone = shared.clone();
    let device_fn = move |d_ctrl: &UblkCtrl| {
        let rec = live_record;
        // STOP_DEV; one that fails leaves the next signal to try again.
        let send_stop = || match kctl::check(d_ctrl.kill_dev()) {
            Ok(_) => shared.mark_stop_sent(),
            Err(e) => eprintln!(
                "ftlblk: stopping device {}: {}; send SIGTERM again to retry",
                rec.id,
                describe_ublk(&e)
            ),
        };
        let stop = |why: String| {
            eprintln!("ftlblk: {why}");
            live_notifier.err(&why);
            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            send_stop();
        };
        if !wait_for_path(&rec.block_device, BDEV_WAIT) {
            return stop(format!(
                "{} did not appear within {BDEV_WAIT:?}",
                rec.block_device.display()
            ));
        }
        // The record is bookkeeping (`list`, `del`, finding an orphan to re-attach): a
        // device that serves I/O is not stopped for it. Stopping one being recovered
        // failed the I/O the kernel held for it, and lost the device. The control plane
        // keeps trying to write it.
        if let Err(e) = runfiles::keep_record(&rec, runfiles::own_process()) {
            eprintln!(
                "ftlblk: warning: device {} runs, but its record could not be written ({e}): \
                 `ftlblk list` and `ftlblk del` will not find it until it is; the daemon \
                 keeps trying (SIGTERM stops the device)",
                rec.id
            );
        }
        let _ = tx.send(Event::Live(Box::new(rec.clone())));
        if let Ok(s) = serde_json::to_string_pretty(&rec) {
            // A reader that went away (`add --foreground | head`) must not panic the
            // device's start.
            let _ = crate::output::print_line(&s);
        }
        live_notifier.ok(&rec);
        if shared.mark_live(rec.id) {
            eprintln!("ftlblk: a stop was requested during start-up; stopping");
            send_stop();
        }
    };
    eprintln!(
        "ftlblk: {} ublk device {id} ({} queues, depth {}) over {}",
        if recoveries > 0 {
            "re-attaching"
        } else {
            "starting"
        },
        cfg.queues,
        cfg.depth,
        cfg.backing.display()
    );
    let ran = ctrl.run_target(tgt_init, q_fn, device_fn);
    // Stopped (or never started): a late signal must not STOP_DEV the id, another
    // server's once it is free.
    gone.mark_gone();
    ran.map_err(|e| CliError::ublk(format!("ublk device {id} failed"), e))?;
    // Ran: a failed start below removes the record itself, a clean stop leaves it to
    // `serve_device`.
    record_guard.disarm();
    offload.shutdown();
    eprintln!("ftlblk: device {id} stopped; closing the FTL");
    // The queues are gone: delete the device (a recovered one is not deleted on drop).
    // Without waiting for its last opener: a synchronous DEL_DEV waits until nothing holds
    // /dev/ublkbN open (a mounted file system, the kernel's NVMe-oF target), and a SIGTERM
    // then hung here, before the FTL's checkpoint and close, until a SIGKILL (found by
    // review, 2026-11-29). Kernels without DEL_DEV_ASYNC (before 6.9: their drivers answer
    // ENOTSUPP, 524, or EOPNOTSUPP) and any other failure of it take the waiting one.
    // The waiting one runs only once the FTL is closed (`serve_device`, after the close):
    // before it, a reader holding /dev/ublkbN open kept a pre-6.9 kernel's daemon from
    // its checkpoint until systemd's SIGKILL, the completed writes left in the tmpfs
    // staging file only (found by review, 2026-11-29). The control handle is disowned so
    // that its drop does not run it either.
    let deleted = match kctl::check(ctrl.del_dev_async()) {
        Err(libublk::UblkError::UringIOError(n)) | Err(libublk::UblkError::OtherError(n))
            if n == -libc::ENODEV || n == -libc::ENOENT =>
        {
            Err(libublk::UblkError::OtherError(n))
        }
        Err(_) => {
            ctrl.disown();
            *delete_after_close = Some(id);
            Ok(0)
        }
        ok => ok,
    };
    match deleted {
        Ok(_) => {}
        Err(libublk::UblkError::UringIOError(n)) | Err(libublk::UblkError::OtherError(n))
            if n == -libc::ENODEV || n == -libc::ENOENT => {}
        Err(e) => eprintln!("ftlblk: deleting device {id}: {}", describe_ublk(&e)),
    }
    let failed = start_failed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if failed.is_some() {
        // Deleted: a record left from an earlier session (recovery) names nothing now
        // (unless another daemon took the freed id meanwhile).
        let (pid, start) = runfiles::own_process();
        runfiles::remove_record_of(id, pid, start, &record.uuid);
    }
    start_outcome(id, failed)
}

/// What serving device `id` comes to once its queues stopped: an error when its start
/// failed (`why`), so that the daemon exits with a failure status.
fn start_outcome(id: u32, why: Option<String>) -> Result<Option<u32>, CliError> {
    match why {
        None => Ok(Some(id)),
        Some(why) => Err(CliError::Device(format!(
            "ublk device {id} failed to start: {why}"
        ))),
    }
}

/// A delay as the device record keeps it, in milliseconds, rounded up: a delay under a
/// millisecond recorded as 0 made `recover` discard at once, a different mode (found by
/// review, 2026-11-27).
fn record_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `recover` re-attaches a device only to the backing it served: a record without a
    /// uuid (older) is not checked, one that names another uuid is refused with both.
    #[test]
    fn recover_refuses_a_backing_of_another_uuid() {
        let p = Path::new("/dev/sdz");
        assert!(check_recover_target(3, p, "aaaa", "aaaa").is_ok());
        assert!(check_recover_target(3, p, "", "bbbb").is_ok());
        let e = check_recover_target(3, p, "aaaa", "bbbb")
            .unwrap_err()
            .to_string();
        for want in [
            "device 3",
            "uuid aaaa",
            "uuid bbbb",
            "/dev/sdz",
            "del -n 3 --force",
        ] {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        assert!(!e.contains("  "), "a run of spaces in {e:?}");
    }

    #[test]
    fn a_delay_under_a_millisecond_is_not_recorded_as_zero() {
        use std::time::Duration;
        assert_eq!(record_ms(Duration::ZERO), 0);
        assert_eq!(record_ms(Duration::from_nanos(1)), 1);
        assert_eq!(record_ms(Duration::from_micros(500)), 1);
        assert_eq!(record_ms(Duration::from_millis(2000)), 2000);
    }

    #[test]
    fn the_open_file_limit_is_raised_when_the_tags_need_it() {
        // 8 queues of 128 tags: 1024 eventfds, more than the usual soft limit.
        let need = 8 * 128 + FDS_BESIDE_TAGS;
        assert_eq!(fd_limit_plan(8, 128, 1024, 524_288).unwrap(), Some(524_288));
        assert_eq!(fd_limit_plan(8, 128, need, need).unwrap(), None);
        assert_eq!(fd_limit_plan(1, 128, 1024, 1024).unwrap(), None);
        let e = fd_limit_plan(8, 128, 1024, 1024).unwrap_err().to_string();
        assert!(
            e.contains("hard limit is 1024") && e.contains("--queues"),
            "{e}"
        );
        assert!(!e.contains("  "), "one space between words: {e}");
    }

    #[test]
    fn a_failed_start_is_an_error_not_a_clean_exit() {
        assert_eq!(start_outcome(3, None).unwrap(), Some(3));
        let e = start_outcome(3, Some("/dev/ublkb3 did not appear".into())).unwrap_err();
        assert!(e.to_string().contains("device 3 failed to start"), "{e}");
    }

    #[test]
    fn ensure_fd_limit_leaves_enough_for_the_tags() {
        let (queues, depth) = (4u16, 1024u16);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let need = queues as u64 * depth as u64 + FDS_BESIDE_TAGS;
        match ensure_fd_limit(queues, depth) {
            Ok(()) => {
                // SAFETY: as above.
                assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
                assert!(lim.rlim_cur >= need, "soft limit {}", lim.rlim_cur);
            }
            Err(e) => assert!(lim.rlim_max < need, "{e}"),
        }
    }
}
