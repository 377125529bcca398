//! # ftl: a host-side log-structured flash translation layer
//!
//! Every write is appended to the open *chunk* of a stream's open *segment*; chunks are
//! written sequentially, so random writes reach the backing as large sequential writes.
//! An LBA -> physical map in memory (8 bytes per block: location + crc32c) is
//! checkpointed into an [`index::IndexStore`] (sled) in the background; the log itself is
//! self-describing (chunk summaries), so recovery loads the last checkpoint and rolls
//! forward over the chunks written after it.
//!
//! ## Durability contract
//! 1. A completed write is visible to every later read.
//! 2. After a completed [`Ftl::flush`], every write completed before the flush survives a
//!    crash. A FUA write survives as soon as it completes. When only the *process* dies
//!    (the backing and the [`staging`] area survive, as with `kill -9` of the server),
//!    every completed write survives, flushed or not.
//! 3. After a crash at any instant, each LBA reads data that was written to it (what was
//!    flushed, or a later write), or zeros if it was never written or was trimmed and the
//!    trim was flushed; never another LBA's data, never garbage (each block's crc32c is
//!    checked on recovery and on every device read).
//! 4. A FLUSH costs a device sync of the log, never an index (sled) flush: the index is
//!    only written by checkpoints.
//! 5. A physical block is overwritten or discarded only after the map changes that made
//!    it dead are durable (a segment returns to the free list only through a durable
//!    checkpoint that records it dead).
//! 6. Block patching: a FLUSH/FUA that forces out a partly filled flash page pads it to the
//!    page size with zeros; the padding is counted in [`Counters::padding_bytes`].
//!
//! ## Layout (`docs/architecture.md` draws it)
//! The API: [`Ftl`] (`engine/`: the I/O API, with its children `reloc` for cleaners,
//! `checkpoint` and `stats`), [`Config`], the [`device`] trait and its file, memory and
//! crash-simulating backings, the [`index`] trait with sled and memory stores,
//! [`geometry`] and [`superblock`] (format), [`staging`] (the chunk buffers that outlive
//! the server process), [`check`] (the offline checker), [`classify`] (lifetime
//! placement), [`request`] (the block-request vocabulary of the ublk edge), [`backing`]
//! (opening a backing file or device with its index) and [`model`] (the reference model
//! shared by property tests, the concurrent crash harness and the fuzz targets).
//!
//! Inside, one concern each: `append` (the appender), `space` (flow control), `tables`
//! (map, segments, counters), `log` (open and sealed chunks), `tracker` (chain numbers,
//! group commit), `segments`, `map`, `summary` and `records` (on-disk structures),
//! `chunks` (the one walker over a segment's summaries), `recovery`, `lifecycle`
//! (format, open). They are public only with the `internals` feature, for tests, fuzzing
//! and tools that build on-disk structures.

// ----- the API -----
pub mod backing;
pub mod check;
pub mod classify;
pub mod device;
pub mod error;
pub mod frag;
pub mod geometry;
pub mod index;
pub mod model;
pub mod rebuild;
pub mod request;
pub mod staging;
pub mod superblock;

pub use append::PendingChunks;
pub use config::{Config, MAX_DEFAULT_CHECKPOINT_BLOCKS};
pub use device::BlockDevice;
pub use engine::checkpoint::{dead_batch_due, CheckpointReport, CheckpointTimesNs};
pub use engine::defrag::{DefragReport, FragFigures, DEFRAG_SPARE_SEGMENTS};
pub use engine::free::{FreeMode, FreeReport};
pub use engine::read::{DeviceBlock, Fragmentation, ReadSpan, ReadSpans, READ_SPAN_GAP_BLOCKS};
pub use engine::reloc::{
    victim_read_depth, LiveBlock, ReadCount, MAX_READ_BYTES, READ_GAP_BLOCKS, VICTIM_READ_DEPTH,
    VICTIM_READ_DEPTH_BESIDE_READS,
};
pub use engine::stats::Stats;
pub use engine::{BlockLocation, Ftl, READ_RETRIES};
pub use error::{Error, Result};
pub use geometry::{FormatOptions, Geometry};
pub use index::IndexStore;
pub use lifecycle::{format, read_superblock, read_superblock_readonly, OpenReport};
pub use log::data_room_from;
pub use map::{MapCacheStats, MapEntry, DEFAULT_CACHE_BYTES as DEFAULT_MAP_CACHE_BYTES};
pub use rebuild::{
    erase_counts_of, rebuild, rebuild_with, RebuildOptions, RebuildProgress, RebuildReport,
    DEFAULT_REBUILD_MEMORY,
};
pub use records::Counters;
pub use recovery::RecoveryReport;
pub use segments::{SegmentSnapshot, WearFigures};
pub use stream::{StreamId, GC_STREAM, STREAMS, TRIM_STREAM};
pub use writers::{ChunkSink, ChunkWriters};

// ----- internals: public only with the `internals` feature (tests, fuzzing, tools
// that build on-disk structures), private otherwise -----

/// Declares a module public with the `internals` feature and private without it.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

internal!(
    chunks, codec, engine, lifecycle, log, map, records, recovery, segments, summary, tracker,
    writers
);

mod append;
mod config;
#[cfg(feature = "shuttle")]
pub mod sched;
mod space;
mod stream;
mod sync;
mod tables;
