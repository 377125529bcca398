//! Tunables of an open FTL ([`Config`]), given to `Ftl::open` by its owner.

/// Tunables of an open FTL.
#[derive(Debug, Clone)]
pub struct Config {
    /// Discard (TRIM / punch hole) segments on the backing when they are freed.
    pub discard_freed: bool,
    /// Blocks appended since the last checkpoint after which one is due (0: a sixteenth
    /// of the exported capacity, at least 1024).
    pub checkpoint_blocks: u64,
    /// Free segments that only relocations into [`crate::GC_STREAM`] (`Ftl::relocate`)
    /// may take; user writes, TRIM records and relocations into other streams never do:
    /// the cleaner's room to finish its victim.
    pub gc_reserve_segments: usize,
    /// With a cleaner attached, how long a write waits for a free segment before it
    /// fails with ENOSPC.
    pub space_wait: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            discard_freed: true,
            checkpoint_blocks: 0,
            gc_reserve_segments: 2,
            space_wait: std::time::Duration::from_secs(30),
        }
    }
}

impl Config {
    /// `checkpoint_blocks` with its default filled in for `exported_blocks`.
    pub(crate) fn resolved(self, exported_blocks: u64) -> Config {
        Config {
            checkpoint_blocks: if self.checkpoint_blocks == 0 {
                (exported_blocks / 16).max(1024)
            } else {
                self.checkpoint_blocks
            },
            ..self
        }
    }
}
