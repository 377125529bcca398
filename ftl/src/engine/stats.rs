//! Figures for `ftlblk stats` and benchmarks: [`Stats`], a plain snapshot read from every
//! part of the engine. Read-only; called by the control plane, benchmarks and tests.

use super::Ftl;
use crate::device::{BlockDevice, BLOCK_SIZE};
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
    /// Free segments waiting for their discard on the backing (`Config::discard_delay`).
    pub undiscarded_segments: usize,
    pub mapped_blocks: u64,
    pub epoch: u64,
    pub checkpoints: u64,
    /// Free-record commits since open (dead segments freed between checkpoints).
    pub free_records: u64,
    /// Segments those freed.
    pub segments_freed_by_records: u64,
    /// Of `free_records`, those committed while a checkpoint synced and committed its map
    /// pages (checkpoint rule 8).
    pub free_records_beside_checkpoints: u64,
    /// Segments checkpoints freed by their own free records right after their log sync,
    /// before their map pages (checkpoint rule 9).
    pub segments_freed_early_by_checkpoints: u64,
    pub counters: Counters,
    /// Backing blocks written / user blocks written (lifetime).
    pub waf: f64,
    /// RAM of the cached L2P map pages (entries of location + crc32c, 8 bytes each).
    pub map_ram_bytes: u64,
    /// `map_ram_bytes` per exported block.
    pub map_ram_bytes_per_block: f64,
    /// The map's page cache: bound, size, hits and misses.
    pub map_cache: crate::map::MapCacheStats,
    pub index_bytes_on_disk: u64,
    /// Nanoseconds writers spent in the cleaner's throttle since open (summed over
    /// writers).
    pub throttled_ns: u64,
    /// Nanoseconds writers spent waiting for a free segment since open.
    pub space_wait_ns: u64,
    /// Where checkpoints spent their time since open.
    pub checkpoint_times: super::checkpoint::CheckpointTimesNs,
    /// Where free records spent their time since open (`snapshot_ns`: sealing and
    /// writing the chunks that killed their segments).
    pub free_times: super::checkpoint::CheckpointTimesNs,
    /// Segment reuse counts: min, mean, max and spread.
    pub wear: crate::segments::WearFigures,
    /// What large reads cost and what read-driven defragmentation did.
    pub fragmentation: super::defrag::FragFigures,
    /// Blocks appended per stream since open (user writes and relocations).
    pub stream_blocks_written: Vec<u64>,
    /// TRIM segments whose records could not be carried (a summary that does not read,
    /// an index read that failed) since open, and the last such error: each stays
    /// allocated until a later carry succeeds (`engine/tombstones.rs`).
    pub tombstone_carry_failures: u64,
    pub tombstone_carry_error: Option<String>,
}

impl<D: BlockDevice, I: IndexStore> Ftl<D, I> {
    /// Current figures.
    pub fn stats(&self) -> Stats {
        let counters = self.t.counters.get();
        let waf = if counters.user_blocks_written == 0 {
            0.0
        } else {
            (counters.backing_blocks_written) as f64 / counters.user_blocks_written as f64
        };
        let (t, map) = (&self.t, &self.t.map);
        let map_ram_bytes = map.ram_bytes();
        let (throttled_ns, space_wait_ns) = self.flow_wait_ns();
        Stats {
            exported_blocks: t.geo.exported_blocks,
            block_size: BLOCK_SIZE,
            segment_bytes: t.geo.segment_bytes,
            segment_count: t.geo.segment_count,
            free_segments: t.segs.free_count(),
            dead_segments: t.segs.dead_closed().len(),
            undiscarded_segments: t.segs.undiscarded_count(),
            mapped_blocks: t.mapped.load(Ordering::Relaxed),
            epoch: self.epoch,
            checkpoints: self.ckpt.count(),
            free_records: self.ckpt.frees.load(Ordering::Relaxed),
            segments_freed_by_records: self.ckpt.freed_segments.load(Ordering::Relaxed),
            free_records_beside_checkpoints: self.ckpt.frees_beside.load(Ordering::Relaxed),
            segments_freed_early_by_checkpoints: self.ckpt.own_freed.load(Ordering::Relaxed),
            counters,
            waf,
            map_ram_bytes,
            map_cache: map.cache_stats(),
            map_ram_bytes_per_block: map_ram_bytes as f64 / t.geo.exported_blocks.max(1) as f64,
            index_bytes_on_disk: self.ckpt.index.size_on_disk(),
            throttled_ns,
            space_wait_ns,
            checkpoint_times: self.ckpt.times(),
            free_times: self.ckpt.free_times(),
            wear: t.segs.wear(),
            fragmentation: self.frag_figures(),
            stream_blocks_written: self
                .stream_blocks
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
            tombstone_carry_failures: self.carry_failures.load(Ordering::Relaxed),
            tombstone_carry_error: self
                .carry_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Per-segment statistics (for cleaning policies).
    pub fn segment_snapshot(&self) -> Vec<crate::segments::SegmentSnapshot> {
        self.t.segs.snapshot()
    }
}
