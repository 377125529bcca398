//! The daemon's control plane: a tokio current-thread runtime on its own thread.
//!
//! Contract:
//! - **Signals.** SIGINT and SIGTERM are handled from the moment [`Control::spawn`]
//!   returns. A signal once the device is live stops it through the kernel (STOP_DEV with
//!   a fresh control handle created on this thread, see [`crate::kctl`]): the queues
//!   abort, `run_target` returns on the main thread, which then checkpoints the FTL and
//!   deletes the device. A signal before the device is live is remembered;
//!   [`Shared::mark_live`] tells the main thread to stop the device itself.
//! - **Checkpoints.** Every second, when [`ftl::Ftl::checkpoint_due`], a checkpoint runs
//!   on tokio's blocking pool (one at a time); [`Control::shutdown`] waits for it.
//! - **Discards.** On the same tick, when freed segments wait for their discard, one job
//!   at a time discards those past the delay ([`ftl::Ftl::discard_waiting`]) beside any
//!   checkpoint; [`Control::shutdown`] waits for it too.
//! - **Streams.** On the same tick, when the classifier has made a new stream plan, the
//!   streams it no longer uses are closed ([`ftl::Ftl::close_stream`]) on the blocking pool.
//! - **Record.** Once told the device is live ([`Event::Live`]), the same tick keeps its
//!   record written ([`runfiles::keep_record`]): one the start could not write, or one
//!   removed under the daemon, is written again.
//! - **Stats.** Once told the device is live ([`Event::Live`]), the runtime serves
//!   `/run/ftlblk/N.sock`: each connection receives one [`StatsDocument`] (the device
//!   record, the FTL's, classifier's and cleaner's figures) and is closed. The socket is
//!   removed on shutdown if it is still this one (the id may be another device's by then).
//!
//! Started by [`crate::background`]; the daemon ([`crate::daemon`]) sends it [`Event`]s and
//! reads [`Shared`]. Uses [`crate::kctl`], [`crate::runfiles`] and [`crate::stats_doc`].

use crate::error::CliError;
use crate::metrics::Live;
use crate::runfiles::{self, DeviceRecord};
use crate::stats_doc::StatsDocument;
use cleaner::CleanerHandle;
use ftl::backing::FileFtl;
use ftl::classify::Classifier;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Metrics connections served at once, and as many stats connections (each its own
/// cap); more are closed as they are accepted.
const METRICS_CONNECTIONS: usize = 16;

/// How long a metrics connection may take to send its request, and to take the reply.
const METRICS_IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the checkpoint timer looks at `checkpoint_due`.
const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

/// Messages from the main thread.
pub enum Event {
    /// The device is live: publish the stats socket for it.
    Live(Box<DeviceRecord>),
    /// Stop serving and end the runtime.
    Shutdown,
}

#[derive(Default)]
struct StopState {
    live_id: Option<u32>,
    stop_requested: bool,
    /// A STOP_DEV for the live device succeeded.
    stop_sent: bool,
}

/// Stop bookkeeping shared by the signal handler and the main thread.
#[derive(Default)]
pub struct Shared {
    state: Mutex<StopState>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that device `id` is live. Returns true when a stop was requested before:
    /// the caller must then stop the device itself.
    pub fn mark_live(&self, id: u32) -> bool {
        let mut st = self.lock();
        st.live_id = Some(id);
        st.stop_requested
    }

    /// Whether SIGINT/SIGTERM arrived.
    pub fn stop_requested(&self) -> bool {
        self.lock().stop_requested
    }

    /// Records that a STOP_DEV for the live device went through: later signals have
    /// nothing left to do.
    pub fn mark_stop_sent(&self) {
        self.lock().stop_sent = true;
    }

    /// The device stopped (its queues returned): a signal from here on sends no
    /// STOP_DEV. Its id is free in the kernel, and another server's `add` may already
    /// have it: a late SIGTERM (a host shutdown signals every process at once) stopped
    /// that server's device (found by review, 2026-11-29).
    pub fn mark_gone(&self) {
        let mut st = self.lock();
        st.live_id = None;
        st.stop_sent = true;
    }

    /// Handles a stop signal: stops the live device, or remembers the request.
    fn request_stop(&self, sig: &str) {
        self.request_stop_with(sig, crate::kctl::kill);
    }

    /// [`Self::request_stop`] with the STOP_DEV call given. A STOP_DEV that failed is
    /// tried again by the next signal (before, every later signal said "already stopping"
    /// and the daemon could no longer be stopped by signal).
    fn request_stop_with(&self, sig: &str, kill: impl FnOnce(u32) -> Result<(), CliError>) {
        let mut st = self.lock();
        if st.stop_sent {
            eprintln!("ftlblk: {sig}: already stopping");
            return;
        }
        let again = std::mem::replace(&mut st.stop_requested, true);
        let Some(id) = st.live_id else {
            if again {
                eprintln!("ftlblk: {sig}: already stopping as soon as the device is live");
            } else {
                eprintln!("ftlblk: {sig}: the device is not live yet; stopping as soon as it is");
            }
            return;
        };
        drop(st);
        eprintln!("ftlblk: {sig}: stopping ublk device {id}");
        match kill(id) {
            Ok(()) => self.mark_stop_sent(),
            Err(e) => eprintln!("ftlblk: {e}; send the signal again to retry"),
        }
    }
}

/// Handle on the control thread.
pub struct Control {
    tx: mpsc::UnboundedSender<Event>,
    thread: Option<std::thread::JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl Control {
    /// Starts the runtime; with `signals`, SIGINT and SIGTERM handlers are installed when
    /// this returns (a benchmark runs without them, so ^C still ends it).
    pub fn spawn(
        ftl: Arc<FileFtl>,
        cleaner: Option<Arc<CleanerHandle>>,
        classifier: Arc<Classifier>,
        live: Arc<Live>,
        metrics: Option<std::net::TcpListener>,
        signals: bool,
    ) -> io::Result<Control> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ftlblk-control".into())
            .spawn(move || {
                let parts = Parts {
                    ftl,
                    cleaner,
                    classifier,
                    live,
                };
                rt.block_on(serve(parts, metrics, signals, sh, rx, ready_tx))
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Control {
                tx,
                thread: Some(thread),
                shared,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other("the control thread died while starting"))
            }
        }
    }

    /// Stop bookkeeping (for the main thread's `device_fn`).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Sender for [`Event`]s (usable from any thread).
    pub fn sender(&self) -> mpsc::UnboundedSender<Event> {
        self.tx.clone()
    }

    /// Stops the runtime: waits for a running checkpoint, removes the socket.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Event::Shutdown);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                eprintln!("ftlblk: the control thread panicked");
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the runtime reports on.
struct Parts {
    ftl: Arc<FileFtl>,
    cleaner: Option<Arc<CleanerHandle>>,
    classifier: Arc<Classifier>,
    live: Arc<Live>,
}

impl Parts {
    /// The stats document now.
    fn document(&self, record: Option<&DeviceRecord>) -> serde_json::Result<StatsDocument> {
        let mut d =
            StatsDocument::collect(&self.ftl, self.cleaner.as_deref(), &self.classifier, record)?;
        self.live.fill(&mut d);
        Ok(d)
    }
}

async fn serve(
    parts: Parts,
    metrics: Option<std::net::TcpListener>,
    handle_signals: bool,
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Event>,
    ready: std::sync::mpsc::Sender<io::Result<()>>,
) {
    let signals = if handle_signals {
        signal(SignalKind::terminate())
            .and_then(|t| signal(SignalKind::interrupt()).map(|i| Some((t, i))))
    } else {
        Ok(None)
    };
    let (mut term, mut int) = match signals {
        Ok(Some((t, i))) => (Some(t), Some(i)),
        Ok(None) => (None, None),
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let metrics = match metrics.map(tokio::net::TcpListener::from_std).transpose() {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let (ftl, classifier) = (parts.ftl.clone(), parts.classifier.clone());
    let parts = Arc::new(parts);
    let mut tick = tokio::time::interval(CHECKPOINT_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut listener: Option<(UnixListener, PathBuf)> = None;
    // The socket file this daemon bound (its inode): removed at the end only if the path
    // still names it.
    let mut socket_id: Option<(u64, u64)> = None;
    let mut record: Option<DeviceRecord> = None;
    // The background jobs under way: a checkpoint, and discards of freed segments (apart:
    // a long discard must not hold a due checkpoint back).
    let mut checkpoint: Option<tokio::task::JoinHandle<()>> = None;
    let mut discarding: Option<tokio::task::JoinHandle<()>> = None;
    let failures = Arc::new(Repeats::new("background checkpoints"));
    let record_writes = Repeats::new("device record writes");
    // Caps of their own: remote metrics clients holding every slot starved `ftlblk stats`.
    let doc_slots = Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS));
    let stats_slots = Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS));
    let own = runfiles::own_process();
    let mut plans_seen = classifier.plans();
    loop {
        tokio::select! {
            _ = recv_signal(&mut term) => shared.request_stop("SIGTERM"),
            _ = recv_signal(&mut int) => shared.request_stop("SIGINT"),
            ev = rx.recv() => match ev {
                Some(Event::Live(rec)) => {
                    match bind(&rec.socket) {
                        Ok(l) => {
                            socket_id = file_id(&rec.socket);
                            listener = Some((l, rec.socket.clone()));
                        }
                        Err(e) => eprintln!("ftlblk: stats socket {}: {e}", rec.socket.display()),
                    }
                    record = Some(*rec);
                }
                Some(Event::Shutdown) | None => break,
            },
            _ = tick.tick() => {
                if let Some(rec) = &record {
                    // Written again if it could not be written at the start, or was
                    // removed under this daemon: without it `list`, `del` and `recover`
                    // do not know the device.
                    match runfiles::keep_record(rec, own) {
                        Ok(true) => {
                            eprintln!("ftlblk: device record {} written", rec.id);
                            record_writes.ok();
                        }
                        Ok(false) => record_writes.ok(),
                        Err(e) => {
                            record_writes.failed(&e.to_string());
                        }
                    }
                }
                let c = ftl.stats().counters;
                parts.live.waf.sample(
                    std::time::Instant::now(),
                    c.user_blocks_written,
                    c.backing_blocks_written,
                );
                let plans = classifier.plans();
                if plans != plans_seen {
                    plans_seen = plans;
                    let (f, c) = (ftl.clone(), classifier.clone());
                    // Streams the new plan no longer uses give up their open segments, so
                    // their free space can be cleaned back.
                    tokio::task::spawn_blocking(move || {
                        for s in c.idle_streams() {
                            if let Err(e) = f.close_stream(s) {
                                eprintln!("ftlblk: closing idle stream {}: {e}", s.0);
                            }
                        }
                    });
                }
                if checkpoint.as_ref().is_none_or(|h| h.is_finished()) && ftl.checkpoint_due() {
                    let f = ftl.clone();
                    // Only if still due once it holds the lock: the cleaner's runner
                    // takes due checkpoints too, and may have just started one.
                    let warn = failures.clone();
                    checkpoint = Some(tokio::task::spawn_blocking(move || {
                        match f.checkpoint_if_due() {
                            Ok(_) => warn.ok(),
                            Err(e) => {
                                warn.failed(&format!("background checkpoint failed: {e}"));
                            }
                        }
                    }));
                }
                if discarding.as_ref().is_none_or(|h| h.is_finished())
                    && ftl.undiscarded_segments() > 0
                {
                    // Freed segments go back to the backing once they waited the discard
                    // delay. The cleaner's turns and each checkpoint do it too, but
                    // without a cleaner (or with one that died) an idle device runs no
                    // checkpoint, and segments a checkpoint freed younger than the delay
                    // stayed allocated until the daemon stopped (found by review,
                    // 2026-11-27).
                    let f = ftl.clone();
                    discarding = Some(tokio::task::spawn_blocking(move || {
                        f.discard_waiting(false);
                    }));
                }
            }
            conn = accept_metrics(&metrics) => match conn {
                Ok(stream) => match doc_slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let (p, rec) = (parts.clone(), record.clone());
                        tokio::spawn(serve_metrics(stream, p, rec, slot));
                    }
                    // Closed at once: each connection held a descriptor for up to its
                    // header timeout, and a few hundred idle ones took the descriptors
                    // a SIGTERM's STOP_DEV needs (found by review, 2026-11-29).
                    Err(_) => drop(stream),
                },
                Err(e) => accept_failed("metrics listener", &e).await,
            },
            conn = accept(&listener) => match conn {
                Ok(mut stream) => {
                    // Built off the runtime's thread, as a metrics scrape's, under a cap
                    // of connections at once (more are closed).
                    let Ok(slot) = stats_slots.clone().try_acquire_owned() else {
                        drop(stream);
                        continue;
                    };
                    let (p, rec) = (parts.clone(), record.clone());
                    tokio::spawn(async move {
                        let _slot = slot;
                        let doc = tokio::task::spawn_blocking(move || stats_text(&p, rec.as_ref()));
                        let Ok(doc) = doc.await else { return };
                        let _ = tokio::time::timeout(METRICS_IO_TIMEOUT, async {
                            let _ = stream.write_all(doc.as_bytes()).await;
                            let _ = stream.shutdown().await;
                        })
                        .await;
                    });
                }
                Err(e) => accept_failed("stats socket", &e).await,
            },
        }
    }
    for h in [checkpoint, discarding].into_iter().flatten() {
        let _ = h.await;
    }
    if let Some((_, path)) = listener {
        // Only if the path is still this socket: once the kernel freed the id, another
        // daemon's `add` may have bound its own there (found by review, 2026-11-27).
        if socket_id.is_some() && file_id(&path) == socket_id {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// After a failed accept: says so and waits a little. An error such as EMFILE repeats at
/// once (nothing is taken off the queue), and the loop spun at full CPU filling the log,
/// on tmpfs beside the staging file (found by review, 2026-11-27).
async fn accept_failed(what: &str, e: &io::Error) {
    eprintln!("ftlblk: {what} accept: {e}");
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// How long the control plane waits after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(250);

/// Rate limit of a message that repeats every tick (a background checkpoint failing while
/// the FTL is poisoned): the first failure, then one line per [`REPEAT_EVERY`] failures,
/// and a line when it works again. The log lives in /run, on tmpfs.
struct Repeats {
    failed: std::sync::atomic::AtomicU64,
    /// What works again, for the line that says so ("background checkpoints").
    what: &'static str,
}

/// See [`Repeats`]: about ten minutes of one-second ticks.
const REPEAT_EVERY: u64 = 600;

impl Repeats {
    fn new(what: &'static str) -> Self {
        Repeats {
            failed: Default::default(),
            what,
        }
    }

    /// One more failure, printed if it is one to print (says whether).
    fn failed(&self, msg: &str) -> bool {
        let n = self
            .failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let print = n.is_multiple_of(REPEAT_EVERY);
        if print {
            let more = if n > 0 {
                format!(" ({} times so far)", n + 1)
            } else {
                String::new()
            };
            eprintln!("ftlblk: {msg}{more}");
        }
        print
    }

    /// It worked: the next failure prints again.
    fn ok(&self) {
        let n = self.failed.swap(0, std::sync::atomic::Ordering::Relaxed);
        if n > 0 {
            eprintln!("ftlblk: {} work again after {n} failures", self.what);
        }
    }
}

/// The next metrics connection; never, without a metrics listener.
async fn accept_metrics(l: &Option<tokio::net::TcpListener>) -> io::Result<tokio::net::TcpStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Answers one metrics connection: reads the request head (at most 8 KiB, 5 s), sends
/// the exposition of a fresh stats document ([`crate::metrics::render`]) and closes.
async fn serve_metrics(
    mut stream: tokio::net::TcpStream,
    parts: Arc<Parts>,
    record: Option<DeviceRecord>,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(METRICS_IO_TIMEOUT, async {
        while head.len() < 8192 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    if read.is_err() {
        return;
    }
    // Built off the runtime's thread: the document samples the map (index reads on a
    // device whose map is larger than its cache), and signals and the checkpoint tick
    // waited for it.
    let reply = tokio::task::spawn_blocking(move || {
        crate::metrics::http_response(&String::from_utf8_lossy(&head), || {
            let doc = parts.document(record.as_ref()).map_err(|e| e.to_string())?;
            crate::metrics::render(&doc).map_err(|e| e.to_string())
        })
    })
    .await;
    let Ok(reply) = reply else { return };
    // A client that does not read does not hold its slot for ever.
    let _ = tokio::time::timeout(METRICS_IO_TIMEOUT, async {
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// The next delivery of a handled signal; never, when it is not handled.
async fn recv_signal(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// The file `path` is now (device, inode), if any: a socket bound there is a new file.
fn file_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn bind(path: &PathBuf) -> io::Result<UnixListener> {
    runfiles::ensure_run_dir().map_err(io::Error::other)?;
    // A socket left by a crashed daemon for this id is stale: its daemon is gone.
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

async fn accept(l: &Option<(UnixListener, PathBuf)>) -> io::Result<tokio::net::UnixStream> {
    match l {
        Some((l, _)) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// The text a stats client receives ([`StatsDocument`]); a one-key `error` document when
/// it cannot be built.
fn stats_text(parts: &Parts, record: Option<&DeviceRecord>) -> String {
    parts
        .document(record)
        .and_then(|d| d.to_json())
        .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftl::backing::{format_backing, open_backing};
    use ftl::device::BLOCK_SIZE;
    use ftl::{Config, FormatOptions, StreamId};
    use std::io::{Read, Write};

    /// A signal whose STOP_DEV failed leaves the next signal to try again; once one went
    /// through, later signals send nothing more. A signal before the device is live is
    /// remembered and sends nothing.
    #[test]
    fn a_stop_that_failed_is_tried_again_by_the_next_signal() {
        let sh = Shared::default();
        let calls = std::cell::Cell::new(0);
        let failing = |_| {
            calls.set(calls.get() + 1);
            Err(CliError::Device("STOP_DEV refused".into()))
        };
        let working = |id| {
            assert_eq!(id, 7);
            calls.set(calls.get() + 1);
            Ok(())
        };
        sh.request_stop_with("SIGTERM", failing);
        assert_eq!(calls.get(), 0, "not live yet: nothing to stop");
        assert!(
            sh.mark_live(7),
            "the early request is reported to the main thread"
        );
        sh.request_stop_with("SIGTERM", failing);
        assert_eq!(calls.get(), 1);
        sh.request_stop_with("SIGINT", working);
        assert_eq!(calls.get(), 2, "the failed stop is tried again");
        sh.request_stop_with("SIGTERM", working);
        assert_eq!(calls.get(), 2, "a stop that went through is not sent again");
        // A device stopped by `del` (no STOP_DEV of this daemon's): once its queues
        // returned, a signal stops nothing (the id may be another server's by then).
        let sh = Shared::default();
        sh.mark_live(7);
        sh.mark_gone();
        sh.request_stop_with("SIGTERM", working);
        assert_eq!(calls.get(), 2, "a STOP_DEV sent for a device gone");
    }

    /// A control plane for `ftl` with no cleaner, metrics listener or signals.
    fn quiet_control(ftl: &Arc<FileFtl>) -> Control {
        let classifier = Arc::new(Classifier::new(ftl.capacity_blocks()));
        Control::spawn(
            ftl.clone(),
            None,
            classifier,
            Arc::new(Live::default()),
            None,
            false,
        )
        .expect("control plane")
    }

    /// A failure that repeats every tick is printed once, then once every
    /// [`REPEAT_EVERY`] times, and again at once after it worked.
    #[test]
    fn a_repeating_failure_is_printed_rarely() {
        let r = Repeats::new("x");
        let printed = (0..2 * REPEAT_EVERY).filter(|_| r.failed("x")).count();
        assert_eq!(printed, 2);
        r.ok();
        assert!(r.failed("x"), "the first failure after a success prints");
    }

    /// Freed segments go back to the backing on an idle device with no cleaner: the
    /// control plane's tick discards those that waited the discard delay (a checkpoint
    /// discards only those already past it, and an idle device runs no checkpoint).
    #[test]
    fn an_idle_device_without_a_cleaner_discards_its_freed_segments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (img, idx) = (dir.path().join("d.img"), dir.path().join("d.idx"));
        let opts = FormatOptions {
            segment_bytes: Some(1 << 20),
            ..Default::default()
        };
        format_backing(&img, &idx, Some(64 << 20), &opts, false).expect("format");
        let cfg = Config {
            discard_delay: Duration::from_millis(300),
            ..Config::default()
        };
        let (f, _) = open_backing(&img, &idx, cfg).expect("open");
        let blocks = 8 * 256u64;
        let data = vec![7u8; BLOCK_SIZE * 256];
        for lba in (0..blocks).step_by(256) {
            f.write(lba, &data, false, StreamId(1)).expect("write");
        }
        f.trim(0, blocks).expect("trim");
        f.checkpoint().expect("checkpoint");
        assert!(
            f.undiscarded_segments() > 0,
            "the checkpoint freed segments younger than the delay"
        );
        let ftl = Arc::new(f);
        let c = quiet_control(&ftl);
        let t = std::time::Instant::now();
        while ftl.undiscarded_segments() > 0 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(100));
        }
        c.shutdown();
        assert_eq!(
            ftl.undiscarded_segments(),
            0,
            "freed segments were left undiscarded"
        );
    }

    /// The stats socket is removed at shutdown only if the path still names it: once the
    /// kernel freed the id, another daemon may have bound its own there.
    #[test]
    fn a_socket_another_daemon_bound_at_the_path_is_left() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (img, idx) = (dir.path().join("s.img"), dir.path().join("s.idx"));
        format_backing(&img, &idx, Some(64 << 20), &FormatOptions::default(), false)
            .expect("format");
        let (f, _) = open_backing(&img, &idx, Config::default()).expect("open");
        let ftl = Arc::new(f);
        let sock = dir.path().join("9.sock");
        let rec = DeviceRecord {
            id: 9,
            block_device: runfiles::bdev_path(9),
            char_device: runfiles::cdev_path(9),
            backing: img.clone(),
            index: idx.clone(),
            size_bytes: 64 << 20,
            block_size: 4096,
            queues: 1,
            depth: 64,
            io_buf_bytes: 512 << 10,
            cleaner: false,
            pid: std::process::id(),
            pid_start: 0,
            socket: sock.clone(),
            log: None,
            uuid: "u".into(),
            recoveries: 0,
            map_cache_bytes: 0,
            metrics_listen: None,
            discard_delay_ms: None,
        };
        let run = |replace: bool| {
            let c = quiet_control(&ftl);
            c.sender()
                .send(Event::Live(Box::new(rec.clone())))
                .expect("send");
            let t = std::time::Instant::now();
            while !sock.exists() && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(sock.exists(), "the stats socket was bound");
            let other = replace.then(|| {
                std::fs::remove_file(&sock).expect("remove");
                std::os::unix::net::UnixListener::bind(&sock).expect("another daemon's bind")
            });
            c.shutdown();
            drop(other);
        };
        run(false);
        assert!(!sock.exists(), "its own socket is removed");
        run(true);
        assert!(sock.exists(), "another daemon's socket was removed");
    }

    /// The control plane serves the exposition on its metrics listener: a scrape of a
    /// device that took a write gets 200 and the byte counter; another path gets 404.
    #[test]
    fn the_metrics_listener_answers_scrapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (img, idx) = (dir.path().join("m.img"), dir.path().join("m.idx"));
        format_backing(&img, &idx, Some(64 << 20), &FormatOptions::default(), false)
            .expect("format");
        let (f, _) = open_backing(&img, &idx, Config::default()).expect("open");
        f.write(3, &[1u8; BLOCK_SIZE], false, StreamId(1))
            .expect("write");
        let ftl = Arc::new(f);
        let classifier = Arc::new(Classifier::new(ftl.capacity_blocks()));
        let live = Arc::new(Live::default());
        live.latencies
            .record(crate::metrics::Op::Write, Duration::from_micros(300));
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let addr = l.local_addr().expect("addr");
        let c = Control::spawn(ftl.clone(), None, classifier, live, Some(l), false)
            .expect("control plane");
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").expect("send");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("read");
            out
        };
        let r = get("/metrics");
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(r.contains("\nftlblk_user_bytes_total 4096\n"), "{r}");
        assert!(
            r.contains("ftlblk_request_latency_seconds_count{op=\"write\"} 1"),
            "{r}"
        );
        assert!(get("/nope").starts_with("HTTP/1.1 404"));
        // Idle connections beyond the cap are closed at once (they each held a descriptor
        // for the header timeout, without bound); the ones within it wait for a request,
        // and a scrape works again once they are gone.
        let idle: Vec<_> = (0..METRICS_CONNECTIONS)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut over = std::net::TcpStream::connect(addr).expect("connect");
        over.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        let mut byte = [0u8; 1];
        match over.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a connection over the cap was not closed: {other:?}"),
        }
        drop(idle);
        std::thread::sleep(Duration::from_millis(300));
        assert!(get("/metrics").starts_with("HTTP/1.1 200 OK"));
        c.shutdown();
    }
}
