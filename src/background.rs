//! The FTL's background machinery, wired the way a running device has it: the online
//! classifier (user write streams and GC output streams), the pool of threads that write
//! the chunks user writes fill ([`ftl::ChunkWriters`]), the cleaner thread with the
//! default [`CleanerConfig`], and the control plane (background checkpoints, closing the
//! streams a new plan no longer uses). The daemon starts it for every device, and
//! `ftlblk bench`'s steady-state tests start the same, so the benchmark measures what a
//! user runs. Callers write through [`ftl::classify::write_classified`] with
//! [`Background::classifier`] and [`Background::writers`].
//!
//! Called by [`crate::daemon`] and [`crate::bench`](mod@crate::bench); uses [`crate::control`].

use crate::control::Control;
use crate::error::CliError;
use crate::metrics::Live;
use cleaner::{CleanerConfig, CleanerHandle};
use ftl::backing::FileFtl;
use ftl::classify::Classifier;
use ftl::ChunkWriters;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Threads writing the chunks user writes fill.
const CHUNK_WRITERS: usize = 4;

/// How often a running server saves the classifier's history besides at its stop: a
/// server killed without a stop leaves the next start a history at most this old (the
/// blocks written since have an older last write in it, so their next write is placed a
/// little colder). A save of a device past 32 GiB writes 80 MiB.
const SAVE_EVERY: Duration = Duration::from_secs(600);

/// The running parts; [`Background::stop`] ends them (before the FTL is closed).
pub struct Background {
    pub classifier: Arc<Classifier>,
    /// Latencies the ublk queues record and the WAF window the control plane samples.
    pub live: Arc<Live>,
    pub writers: Arc<ChunkWriters>,
    pub cleaner: Option<Arc<CleanerHandle>>,
    pub control: Control,
    /// Where the classifier's history goes, every [`SAVE_EVERY`] and when the machinery
    /// stops, for the next start.
    saver: Option<Saver>,
}

/// The classifier's state file of one device (`ftl::classify::STATE_FILE` in its index
/// directory) and what binds it to this session.
struct StateFile {
    path: PathBuf,
    uuid: [u8; 16],
    epoch: u64,
}

impl StateFile {
    /// The state file of `ftl` in `index_dir`, bound to this open.
    fn of(ftl: &FileFtl, index_dir: &Path) -> StateFile {
        StateFile {
            path: index_dir.join(ftl::classify::STATE_FILE),
            uuid: ftl.superblock().uuid,
            epoch: ftl.epoch(),
        }
    }

    /// The history saved for this open of `ftl`, if there is one and it is this open's.
    fn load(&self, ftl: &FileFtl) -> ftl::Result<Option<Classifier>> {
        let cap = ftl.capacity_blocks();
        let params = ftl::classify::Params::for_capacity(cap);
        Classifier::load_state(&self.path, &self.uuid, self.epoch, cap, params)
    }

    /// Saves `c`'s history; a failure is named on stderr and costs only the history.
    fn save(&self, c: &Classifier) {
        if let Err(e) = c.save_state(&self.path, &self.uuid, self.epoch) {
            eprintln!(
                "ftlblk: the classifier's history was not saved ({e}); a start after this \
                 server begins without one"
            );
        }
    }
}

/// The thread that saves the classifier's history every `every` until stopped.
struct Saver {
    file: Arc<StateFile>,
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Saver {
    /// With `restored`, saves once before it returns: the restored history then carries
    /// this session's epoch, so a server killed before its first periodic save leaves
    /// it to the next start (it would be stale after this session's open; found by
    /// review).
    fn spawn(
        file: StateFile,
        classifier: Arc<Classifier>,
        every: Duration,
        restored: bool,
    ) -> std::io::Result<Saver> {
        if restored {
            file.save(&classifier);
        }
        let file = Arc::new(file);
        let (stop, stopped) = mpsc::channel::<()>();
        let f = file.clone();
        let thread = std::thread::Builder::new()
            .name("ftlblk-history".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    f.save(&classifier);
                }
            })?;
        Ok(Saver { file, stop, thread })
    }

    /// Stops the periodic saves (waiting for one under way), then saves once more.
    fn finish(self, classifier: &Classifier) {
        drop(self.stop);
        if self.thread.join().is_err() {
            eprintln!("ftlblk: the classifier's history thread panicked");
        }
        self.file.save(classifier);
    }
}

/// The classifier for `ftl`: the history the previous session saved in `index_dir` if it
/// is there and this session's (see `ftl/src/classify/state.rs`), else a new one; and
/// whether it was restored. A file that is not used is named on stderr with the reason;
/// the device starts without history.
fn classifier_for(ftl: &FileFtl, state: Option<&StateFile>) -> (Classifier, bool) {
    let cap = ftl.capacity_blocks();
    let Some(s) = state else {
        return (Classifier::new(cap), false);
    };
    match s.load(ftl) {
        Ok(Some(c)) => {
            eprintln!(
                "ftlblk: the classifier's history restored from {} ({} blocks tracked)",
                s.path.display(),
                c.tracked_blocks()
            );
            (c, true)
        }
        Ok(None) => (Classifier::new(cap), false),
        Err(e) => {
            eprintln!(
                "ftlblk: the classifier's history in {} is not used ({e}); starting without one",
                s.path.display()
            );
            (Classifier::new(cap), false)
        }
    }
}

/// For a command that opens the device without serving it (`ftlblk info`): binds the
/// classifier's history the last server saved in `index_dir` to this open, so that the
/// next server still finds it its own (every open moves the epoch on, and a history is
/// taken only by the open right after the session that saved it). Nothing happens when
/// there is no history or it was already stale; a failure to save is named on stderr
/// (the next start then begins without history, as it would have anyway).
pub fn keep_history(ftl: &FileFtl, index_dir: &Path) {
    let s = StateFile::of(ftl, index_dir);
    if !s.path.exists() {
        return;
    }
    if let Ok(Some(c)) = s.load(ftl) {
        s.save(&c);
    }
}

impl Background {
    /// Starts the classifier, the cleaner (unless `cleaner` is false) and the control
    /// plane; `signals`: the control plane handles SIGINT and SIGTERM (the daemon);
    /// `metrics`: a bound listener the control plane serves the metrics on;
    /// `index_dir`: where the classifier's history of the last session is read from and
    /// this one's is written, every [`SAVE_EVERY`] and when it stops (the daemon;
    /// `None`: started new, not kept).
    pub fn start(
        ftl: &Arc<FileFtl>,
        cleaner: bool,
        signals: bool,
        metrics: Option<std::net::TcpListener>,
        index_dir: Option<&Path>,
    ) -> Result<Self, CliError> {
        Self::start_saving_every(ftl, cleaner, signals, metrics, index_dir, SAVE_EVERY)
    }

    fn start_saving_every(
        ftl: &Arc<FileFtl>,
        cleaner: bool,
        signals: bool,
        metrics: Option<std::net::TcpListener>,
        index_dir: Option<&Path>,
        save_every: Duration,
    ) -> Result<Self, CliError> {
        // The lifetime counters before any thread below writes, relocates or checkpoints:
        // the metrics count from here.
        let live = Arc::new(Live::opened_with(ftl.stats().counters));
        // Write-time stream classification: in memory, kept across a clean restart.
        let state = index_dir.map(|d| StateFile::of(ftl, d));
        let (classifier, restored) = classifier_for(ftl, state.as_ref());
        let classifier = Arc::new(classifier);
        let saver = state
            .map(|s| Saver::spawn(s, classifier.clone(), save_every, restored))
            .transpose()
            .map_err(|e| CliError::io("cannot start the classifier's history thread", e))?;
        let writers = Arc::new(
            ChunkWriters::spawn(ftl, CHUNK_WRITERS, "ftl-chunk-writer")
                .map_err(|e| CliError::io("cannot start the chunk writers", e))?,
        );
        let cleaner = if cleaner {
            let c = classifier.clone();
            Some(Arc::new(
                cleaner::spawn_with_gc_stream(ftl.clone(), CleanerConfig::default(), move |lba| {
                    c.on_relocate(lba)
                })
                .map_err(|e| CliError::io("cannot start the cleaner", e))?,
            ))
        } else {
            None
        };
        let control = Control::spawn(
            ftl.clone(),
            cleaner.clone(),
            classifier.clone(),
            live.clone(),
            metrics,
            signals,
        )
        .map_err(|e| CliError::io("cannot start the control plane", e))?;
        Ok(Background {
            classifier,
            live,
            writers,
            cleaner,
            control,
            saver,
        })
    }

    /// Stops the control plane (waiting for a running checkpoint), then the cleaner, then
    /// the periodic saves, and saves the classifier's history once more (with
    /// `index_dir`). Called once nothing writes any more.
    pub fn stop(self) {
        self.control.shutdown();
        drop(self.cleaner);
        if let Some(s) = self.saver {
            s.finish(&self.classifier);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftl::backing::{format_backing, open_backing_in};
    use ftl::classify::write_classified;
    use ftl::device::BLOCK_SIZE;
    use ftl::{Config, FormatOptions};

    /// A 64 MiB file backing, formatted, in a directory of its own.
    struct Formatted {
        dir: tempfile::TempDir,
    }

    impl Formatted {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let opts = FormatOptions::default();
            let index = dir.path().join("b.idx");
            format_backing(
                &dir.path().join("b.img"),
                &index,
                Some(64 << 20),
                &opts,
                false,
            )
            .unwrap();
            Formatted { dir }
        }

        fn index(&self) -> std::path::PathBuf {
            self.dir.path().join("b.idx")
        }

        /// Opens the device, as a server does.
        fn open(&self) -> Arc<FileFtl> {
            let p = self.dir.path();
            let (f, _) = open_backing_in(
                &p.join("b.img"),
                &self.index(),
                Config::default(),
                &p.join("staging"),
            )
            .unwrap();
            Arc::new(f)
        }
    }

    /// The classifier's whole history, as a save would write it.
    fn history(bg: &Background) -> Vec<u8> {
        bg.classifier.encode_state(&[0; 16], 0)
    }

    /// A clean stop saves the classifier's history in the index directory and the next
    /// start of the device takes it whole; so does the start after a server that restored
    /// it and was killed before its first periodic save. After an open in between, the
    /// file is stale and not used.
    #[test]
    fn a_restart_keeps_the_classifiers_history_and_a_stale_one_is_not_used() {
        let d = Formatted::new();
        let (index, open) = (d.index(), || d.open());
        let f = open();
        let bg = Background::start(&f, false, false, None, Some(&index)).unwrap();
        let fresh = history(&bg);
        for round in 0..3u8 {
            for lba in 0..64 {
                let data = vec![round; BLOCK_SIZE];
                write_classified(
                    &f,
                    &bg.classifier,
                    None,
                    lba * (round as u64 + 1),
                    &data,
                    false,
                )
                .unwrap();
            }
        }
        let learned = history(&bg);
        assert_ne!(learned, fresh);
        bg.stop();
        f.close().unwrap();
        drop(f);
        assert!(index.join(ftl::classify::STATE_FILE).exists());

        let f = open();
        let bg = Background::start(&f, false, false, None, Some(&index)).unwrap();
        assert!(history(&bg) == learned, "the history was not restored");
        assert!(bg.classifier.restored(), "restored, but not said so");
        write_classified(&f, &bg.classifier, None, 5, &[9u8; BLOCK_SIZE], false).unwrap();
        // Killed before any periodic save: no stop, no close. The restored history was
        // saved again with this session's epoch when it started, so the next start has
        // it (without that save the file was the first session's, stale after this open).
        drop(bg);
        drop(f);

        // A start of the device, stopped cleanly: the history it began with.
        let started_with = || {
            let f = open();
            let bg = Background::start(&f, false, false, None, Some(&index)).unwrap();
            let h = history(&bg);
            bg.stop();
            f.close().unwrap();
            h
        };
        assert!(
            started_with() == learned,
            "the kill lost the restored history"
        );

        // An open and close of the device that keeps the history (as `ftlblk info`
        // does): the next start still takes it.
        let f = open();
        keep_history(&f, &index);
        f.close().unwrap();
        drop(f);
        assert!(
            started_with() == learned,
            "an info in between lost the history"
        );

        // An open and close of the device in between that does not keep it: stale.
        open().close().unwrap();
        assert!(started_with() == fresh, "a stale history was restored");
    }

    /// A server killed without a stop leaves the history of its last periodic save, and
    /// the next start takes it.
    #[test]
    fn a_killed_server_leaves_its_last_periodic_save() {
        let d = Formatted::new();
        let (index, open) = (d.index(), || d.open());
        let f = open();
        let every = Duration::from_millis(20);
        let bg =
            Background::start_saving_every(&f, false, false, None, Some(&index), every).unwrap();
        for lba in 0..64 {
            write_classified(&f, &bg.classifier, None, lba, &[1u8; BLOCK_SIZE], false).unwrap();
        }
        let learned = history(&bg);
        // Several periods after the last write: a save since holds it.
        std::thread::sleep(Duration::from_millis(200));
        drop(bg);
        drop(f);
        let f = open();
        let bg = Background::start(&f, false, false, None, Some(&index)).unwrap();
        assert!(
            history(&bg) == learned,
            "the periodic save was not restored"
        );
        bg.stop();
        f.close().unwrap();
    }
}
