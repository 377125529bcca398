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
    /// Cleaning one victim failed: a block of it did not read back (an I/O error, a
    /// checksum that does not match) or its summaries are unreadable. The cleaner leaves
    /// that victim for a while and cleans others (`slice::SHUN_FOR`).
    #[error("cleaning segment {victim}: {source}")]
    Victim {
        victim: u32,
        #[source]
        source: ftl::Error,
    },
}

impl Error {
    /// Wraps an FTL error met while cleaning `victim`.
    pub(crate) fn of_victim(victim: u32) -> impl FnOnce(ftl::Error) -> Error {
        move |source| Error::Victim { victim, source }
    }

    /// Whether the cleaner ran out of free segments (its relocations found none).
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            Error::Ftl(ftl::Error::NoSpace)
                | Error::Victim {
                    source: ftl::Error::NoSpace,
                    ..
                }
        )
    }

    /// The victim being cleaned when the error came, whoever's fault it was.
    pub(crate) fn victim(&self) -> Option<u32> {
        match self {
            Error::Victim { victim, .. } => Some(*victim),
            _ => None,
        }
    }

    /// Whether the error belongs to the victim (so that cleaning others may succeed): a
    /// read of its blocks or summaries failing, a summary or block failing its checksum.
    /// Not running out of space, not a device that no longer takes writes, not the
    /// index: listing a victim reads map pages through it, and an index read failing
    /// shunned one healthy victim after another (found by review, 2026-11-30; the
    /// relocations' own errors were told apart the day before, `slice::relocation_error`).
    pub fn victim_at_fault(&self) -> Option<u32> {
        match self {
            Error::Victim {
                victim,
                source:
                    ftl::Error::Io { .. } | ftl::Error::Corrupt(_) | ftl::Error::DataChecksum { .. },
            } => Some(*victim),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Running out of free segments is told apart, wrapped or not: the runner waits for a
    /// freed segment then instead of sleeping 100 ms blind; it is never the victim's fault.
    #[test]
    fn no_space_is_told_apart() {
        let wrapped = Error::of_victim(3)(ftl::Error::NoSpace);
        assert!(wrapped.is_no_space() && wrapped.victim_at_fault().is_none());
        assert!(Error::Ftl(ftl::Error::NoSpace).is_no_space());
        let bad_block = Error::of_victim(3)(ftl::Error::DataChecksum { lba: 1, pba: 2 });
        assert!(!bad_block.is_no_space());
        assert_eq!(bad_block.victim_at_fault(), Some(3));
        assert!(!Error::Ftl(ftl::Error::ReadOnly("x".into())).is_no_space());
        // The index's errors are not the victim's.
        for e in [
            ftl::Error::Index("page read".into()),
            ftl::Error::IndexStuck("commit".into()),
            ftl::Error::ReadOnly("x".into()),
            ftl::Error::KeptMoving { lba: 1, tries: 16 },
        ] {
            assert_eq!(Error::of_victim(3)(e).victim_at_fault(), None);
        }
        let summary = Error::of_victim(3)(ftl::Error::Corrupt("summary".into()));
        assert_eq!(summary.victim_at_fault(), Some(3));
    }
}
