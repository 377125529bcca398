//! Tunables of an open FTL ([`Config`]), given to `Ftl::open` by its owner.

/// The default checkpoint interval's cap: 1 GiB of appended blocks (a recovery replays
/// at most about that much log).
pub const MAX_DEFAULT_CHECKPOINT_BLOCKS: u64 = (1 << 30) / 4096;

/// Tunables of an open FTL.
#[derive(Debug, Clone)]
pub struct Config {
    /// Discard (TRIM / punch hole) freed segments on the backing.
    pub discard_freed: bool,
    /// How long a freed segment stays free before it is discarded (`engine/discard.rs`:
    /// the cleaner's runner and each checkpoint discard those that waited this long;
    /// segments reused sooner are not discarded, they are overwritten whole). Zero:
    /// discarded as they are freed.
    pub discard_delay: std::time::Duration,
    /// Blocks appended since the last checkpoint after which one is due (0: a quarter of
    /// the exported capacity, at least 1024 and at most [`MAX_DEFAULT_CHECKPOINT_BLOCKS`]).
    /// It bounds the log recovery replays; dead segments no longer wait for checkpoints
    /// (free records), so they can be rarer: a quarter against a sixteenth gave 10-15%
    /// more steady-state IOPS in 5 of 6 A/B pairs (fewer map pages written to the index,
    /// fewer early seals).
    pub checkpoint_blocks: u64,
    /// Free segments that only relocations into [`crate::GC_STREAM`] (`Ftl::relocate`)
    /// may take; user writes, TRIM records and relocations into other streams never do:
    /// the cleaner's room to finish its victim.
    pub gc_reserve_segments: usize,
    /// With a cleaner attached, how long a write waits for a free segment before it
    /// fails with ENOSPC.
    pub space_wait: std::time::Duration,
    /// Bytes of RAM the map's page cache may hold (`map.rs`; dirty pages may exceed it
    /// until the checkpoint it calls for).
    pub map_cache_bytes: u64,
    /// Map pages a checkpoint commits to the index in one batch; more go in several
    /// (checkpoint rule 7).
    pub checkpoint_page_batch: usize,
    /// Wear-aware allocation (a stream whose segments live long to the most worn free
    /// segment, one whose segments die young to the least worn; undecided, relocated data
    /// to the most worn, user data to the least) and static wear levelling by the cleaner
    /// (`docs/wear.md`). Off: free segments are reused in the order they were freed, as
    /// before.
    pub wear_levelling: bool,
    /// Read-driven defragmentation: large reads that find their range scattered queue
    /// it to be rewritten contiguously by the cleaner's runner (`frag.rs`,
    /// `docs/fragmentation.md`). Off: reads are only measured.
    pub defrag: bool,
    /// Bytes of read data the defragmentation queue holds at most; windows past it are
    /// queued as ranges and read again when rewritten.
    pub defrag_queue_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            discard_freed: true,
            discard_delay: std::time::Duration::from_secs(2),
            checkpoint_blocks: 0,
            gc_reserve_segments: 2,
            space_wait: std::time::Duration::from_secs(30),
            map_cache_bytes: crate::map::DEFAULT_CACHE_BYTES,
            defrag: true,
            defrag_queue_bytes: 16 << 20,
            wear_levelling: true,
            checkpoint_page_batch: 4096,
        }
    }
}

impl Config {
    /// `checkpoint_blocks` with its default filled in for `exported_blocks`.
    pub(crate) fn resolved(self, exported_blocks: u64) -> Config {
        Config {
            checkpoint_blocks: if self.checkpoint_blocks == 0 {
                (exported_blocks / 4).clamp(1024, MAX_DEFAULT_CHECKPOINT_BLOCKS)
            } else {
                self.checkpoint_blocks
            },
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_checkpoint_interval_is_a_quarter_of_the_capacity_within_bounds() {
        let at = |blocks: u64| Config::default().resolved(blocks).checkpoint_blocks;
        assert_eq!(at(400_000), 100_000);
        assert_eq!(at(100), 1024, "tiny devices: at least 1024");
        assert_eq!(at(1 << 32), MAX_DEFAULT_CHECKPOINT_BLOCKS, "16 TiB: capped");
        let set = Config {
            checkpoint_blocks: 7,
            ..Config::default()
        };
        assert_eq!(
            set.resolved(1 << 32).checkpoint_blocks,
            7,
            "a set value is kept"
        );
    }
}
