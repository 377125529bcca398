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
use std::sync::Arc;

/// Threads writing the chunks user writes fill.
const CHUNK_WRITERS: usize = 4;

/// The running parts; [`Background::stop`] ends them (before the FTL is closed).
pub struct Background {
    pub classifier: Arc<Classifier>,
    /// Latencies the ublk queues record and the WAF window the control plane samples.
    pub live: Arc<Live>,
    pub writers: Arc<ChunkWriters>,
    pub cleaner: Option<Arc<CleanerHandle>>,
    pub control: Control,
}

impl Background {
    /// Starts the classifier, the cleaner (unless `cleaner` is false) and the control
    /// plane; `signals`: the control plane handles SIGINT and SIGTERM (the daemon);
    /// `metrics`: a bound listener the control plane serves the metrics on.
    pub fn start(
        ftl: &Arc<FileFtl>,
        cleaner: bool,
        signals: bool,
        metrics: Option<std::net::TcpListener>,
    ) -> Result<Self, CliError> {
        // The lifetime counters before any thread below writes, relocates or checkpoints:
        // the metrics count from here.
        let live = Arc::new(Live::opened_with(ftl.stats().counters));
        // Write-time stream classification (in memory, rebuilt from scratch at each start).
        let classifier = Arc::new(Classifier::new(ftl.capacity_blocks()));
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
        })
    }

    /// Stops the control plane (waiting for a running checkpoint), then the cleaner.
    pub fn stop(self) {
        self.control.shutdown();
        drop(self.cleaner);
    }
}
