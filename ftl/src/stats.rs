//! Figures for `ftlblk stats` and benchmarks.

use crate::device::{BlockDevice, BLOCK_SIZE};
use crate::engine::Ftl;
use crate::index::IndexStore;
use crate::records::Counters;
use std::sync::atomic::Ordering;

/// A plain snapshot of the FTL's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    pub exported_blocks: u64,
    pub block_size: usize,
    pub segment_bytes: u64,
    pub segment_count: u32,
    pub free_segments: usize,
    pub dead_segments: usize,
    pub mapped_blocks: u64,
    pub epoch: u64,
    pub checkpoints: u64,
    pub counters: Counters,
    /// Backing blocks written / user blocks written (lifetime).
    pub waf: f64,
    /// RAM of the L2P map entries (location + crc32c, 8 bytes per exported block).
    pub map_ram_bytes: u64,
    /// RAM of the checkpoint's dirty-page bitmap (1 bit per 512 blocks).
    pub map_dirty_bitmap_bytes: u64,
    /// `map_ram_bytes` per exported block.
    pub map_ram_bytes_per_block: f64,
    pub index_bytes_on_disk: u64,
    /// Nanoseconds writers spent in the cleaner's throttle since open (summed over
    /// writers).
    pub throttled_ns: u64,
    /// Nanoseconds writers spent waiting for a free segment since open.
    pub space_wait_ns: u64,
    /// Where checkpoints spent their time since open.
    pub checkpoint_times: crate::checkpoint::CheckpointTimesNs,
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Current figures.
    pub fn stats(&self) -> Stats {
        let counters = self.counters.get();
        let waf = if counters.user_blocks_written == 0 {
            0.0
        } else {
            (counters.backing_blocks_written) as f64 / counters.user_blocks_written as f64
        };
        let map_ram_bytes = self.map.ram_bytes();
        let (throttled_ns, space_wait_ns) = self.flow_wait_ns();
        Stats {
            exported_blocks: self.geo.exported_blocks,
            block_size: BLOCK_SIZE,
            segment_bytes: self.geo.segment_bytes,
            segment_count: self.geo.segment_count,
            free_segments: self.segs.free_count(),
            dead_segments: self.segs.dead_closed().len(),
            mapped_blocks: self.mapped.load(Ordering::Relaxed),
            epoch: self.epoch,
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            counters,
            waf,
            map_ram_bytes,
            map_dirty_bitmap_bytes: self.map.dirty_ram_bytes(),
            map_ram_bytes_per_block: map_ram_bytes as f64 / self.geo.exported_blocks.max(1) as f64,
            index_bytes_on_disk: self.index.size_on_disk(),
            throttled_ns,
            space_wait_ns,
            checkpoint_times: self.checkpoint_times.get(),
        }
    }

    /// Per-segment statistics (for cleaning policies).
    pub fn segment_snapshot(&self) -> Vec<crate::segments::SegmentSnapshot> {
        self.segs.snapshot()
    }
}
