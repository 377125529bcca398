//! The state every part of the engine reads and the appender changes: the L2P map, the
//! segment table, the mapped-block count and the lifetime counters.
//!
//! Owns no behaviour: [`Tables`] is a plain aggregate, so the appender, the checkpoint,
//! relocation and reads can be handed exactly the state they share. Changes follow the
//! appender's rule 1 (an entry's map change, its segment counts and its sequence number
//! under its stream and stripe locks); see `append.rs`.

use crate::geometry::Geometry;
use crate::map::L2p;
use crate::records::Counters;
use crate::segments::Segments;
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering;

/// Map, segment table and counters of one open FTL.
pub(crate) struct Tables {
    pub geo: Geometry,
    pub map: L2p,
    pub segs: Segments,
    pub counters: LiveCounters,
    /// Mapped LBAs.
    pub mapped: AtomicU64,
}

/// Live counters (atomics), persisted at each checkpoint.
#[derive(Default)]
pub(crate) struct LiveCounters {
    pub user_blocks_written: AtomicU64,
    pub backing_blocks_written: AtomicU64,
    pub padding_bytes: AtomicU64,
    pub summary_blocks: AtomicU64,
    pub trimmed_blocks: AtomicU64,
    pub flushes: AtomicU64,
    pub relocated_blocks: AtomicU64,
    pub discarded_bytes: AtomicU64,
}

impl LiveCounters {
    pub fn from(c: &Counters) -> Self {
        let l = LiveCounters::default();
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&l.user_blocks_written, c.user_blocks_written);
        set(&l.backing_blocks_written, c.backing_blocks_written);
        set(&l.padding_bytes, c.padding_bytes);
        set(&l.summary_blocks, c.summary_blocks);
        set(&l.trimmed_blocks, c.trimmed_blocks);
        set(&l.flushes, c.flushes);
        set(&l.relocated_blocks, c.relocated_blocks);
        set(&l.discarded_bytes, c.discarded_bytes);
        l
    }

    pub fn get(&self) -> Counters {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            user_blocks_written: get(&self.user_blocks_written),
            backing_blocks_written: get(&self.backing_blocks_written),
            padding_bytes: get(&self.padding_bytes),
            summary_blocks: get(&self.summary_blocks),
            trimmed_blocks: get(&self.trimmed_blocks),
            flushes: get(&self.flushes),
            relocated_blocks: get(&self.relocated_blocks),
            discarded_bytes: get(&self.discarded_bytes),
        }
    }

    /// Adds `n` to one counter.
    pub fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
}
