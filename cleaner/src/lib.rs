//! # cleaner: segment cleaning for the ftl crate
//!
//! - [`policy`]: victim selection as pure functions over a snapshot of segment statistics
//!   (greedy, cost-benefit, cost-hotness);
//! - [`trigger`]: when to clean and how hard to throttle writers, as pure functions;
//! - [`slice`]: quasi-preemptive cleaning: work in slices, yield to foreground I/O at the
//!   end of a slice, resume where it stopped (victim and next block are kept);
//! - `pipeline`: the slice's helper threads (a prefetcher picking and reading the next
//!   victim, writers of the chunks relocation seals), so its steps overlap;
//! - [`runner`]: the background thread that ties them to a live FTL, paces writers at its
//!   measured rate and checkpoints (on a thread of its own) to free cleaned segments.
//!
//! Invariants: relocation is a compare-and-swap on the map (a block overwritten
//! meanwhile is not moved); relocated blocks go, in LBA order, into the FTL's GC stream;
//! a cleaned segment becomes free only through a durable checkpoint (the FTL's rule), and
//! only then is it discarded on the backing.

mod pipeline;
pub mod policy;
pub mod runner;
pub mod slice;
pub mod trigger;

pub use policy::Policy;
pub use runner::{spawn, spawn_with_gc_stream, CleanerConfig, CleanerHandle, RunnerStats};
pub use slice::{Budget, Cleaner, CleanerStats, SliceEnd, VictimTimes};

/// Errors of the cleaner.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Ftl(#[from] ftl::Error),
    #[error("unknown cleaning policy {0:?} (greedy, cost-benefit, cost-hotness)")]
    UnknownPolicy(String),
    #[error("cannot start a checkpoint thread: {0}")]
    CheckpointThread(std::io::Error),
}
