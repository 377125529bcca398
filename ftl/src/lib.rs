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
//!    page size with zeros; the padding is counted in [`records::Counters::padding_bytes`].
//!
//! ## Layout
//! - [`device`]: the backing-device trait and its file (io_uring, O_DIRECT), memory and
//!   crash-simulating implementations;
//! - [`index`]: the index-store trait, sled and memory implementations;
//! - [`geometry`], [`superblock`], [`summary`], [`records`]: on-disk structures;
//! - [`engine`] (I/O API), [`checkpoint`], [`recovery`], [`lifecycle`] (format, open);
//! - [`staging`]: the chunk buffers, kept where they outlive the server process;
//! - [`model`]: the reference model shared by property tests and fuzz targets.

mod append;
pub mod backing;
pub mod check;
pub mod chunks;
pub mod classify;
pub mod codec;
mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod geometry;
pub mod index;
pub mod lifecycle;
pub mod log;
pub mod map;
pub mod model;
pub mod records;
pub mod recovery;
pub mod request;
#[cfg(feature = "shuttle")]
pub mod sched;
pub mod segments;
mod space;
pub mod staging;
mod stream;
pub mod summary;
pub mod superblock;
mod sync;
mod tables;
pub mod tracker;
pub mod writers;

pub use append::PendingChunks;
pub use config::Config;
pub use device::BlockDevice;
pub use engine::checkpoint::{dead_batch_due, CheckpointReport, CheckpointTimesNs};
pub use engine::reloc::{LiveBlock, MAX_READ_BYTES, READ_GAP_BLOCKS};
pub use engine::stats::Stats;
pub use engine::{BlockLocation, Ftl, READ_RETRIES};
pub use error::{Error, Result};
pub use geometry::{FormatOptions, Geometry};
pub use index::IndexStore;
pub use lifecycle::{format, read_superblock, OpenReport};
pub use map::MapEntry;
pub use stream::{StreamId, GC_STREAM, STREAMS, TRIM_STREAM};
pub use writers::ChunkWriters;
