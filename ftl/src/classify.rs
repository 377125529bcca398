//! Write-time stream classification (SFS groups by hotness when writing; SepBIT infers a
//! block's lifespan from its previous one).
//!
//! The state is one `u32` per block: the user-write clock at the block's last write
//! (0 = never written). A write whose block was last written `d` user writes ago is
//! expected to live about `d` again: hot if `d` is below `hot_window`, warm below
//! `warm_window`, cold otherwise or if never written. The cleaner's relocations are split
//! by age the same way (young / old GC output). [`classify`] is the pure function;
//! [`Classifier`] holds the bounded per-block state.

use crate::engine::StreamId;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// User stream for blocks expected to die soon.
pub const HOT: StreamId = StreamId(1);
/// User stream for blocks of middling lifetime.
pub const WARM: StreamId = StreamId(2);
/// User stream for long-lived (or first-written) blocks.
pub const COLD: StreamId = StreamId(3);
/// Cleaner output for blocks relocated young.
pub const GC_YOUNG: StreamId = StreamId(crate::engine::FIRST_GC_STREAM);
/// Cleaner output for blocks relocated old (the FTL's `GC_STREAM`).
pub const GC_OLD: StreamId = crate::engine::GC_STREAM;

/// Thresholds in user writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Windows {
    pub hot: u64,
    pub warm: u64,
}

impl Windows {
    /// Defaults for a device of `capacity` blocks: hot below 1/8 of the capacity in
    /// writes, warm below the capacity.
    pub fn for_capacity(capacity: u64) -> Self {
        Windows {
            hot: (capacity / 8).max(1),
            warm: capacity.max(2),
        }
    }
}

/// Classifies a user write whose block was last written `since` user writes ago
/// (`None`: never written).
pub fn classify(since: Option<u64>, w: Windows) -> StreamId {
    match since {
        Some(d) if d < w.hot => HOT,
        Some(d) if d < w.warm => WARM,
        _ => COLD,
    }
}

/// Classifies a relocation of a block last written `since` user writes ago.
pub fn classify_gc(since: Option<u64>, w: Windows) -> StreamId {
    match since {
        Some(d) if d < w.warm => GC_YOUNG,
        _ => GC_OLD,
    }
}

/// Per-block write clock (4 bytes per block) and the windows.
pub struct Classifier {
    last: Box<[AtomicU32]>,
    clock: AtomicU64,
    pub windows: Windows,
}

impl Classifier {
    pub fn new(capacity: u64) -> Self {
        Classifier {
            last: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            clock: AtomicU64::new(1),
            windows: Windows::for_capacity(capacity),
        }
    }

    /// Bytes of state per block.
    pub const BYTES_PER_BLOCK: usize = 4;

    fn since(&self, lba: u64, now: u64) -> Option<u64> {
        let last = self.last.get(lba as usize)?.load(Ordering::Relaxed);
        // The clock is stored modulo 2^32 (never 0); distances wrap accordingly.
        (last != 0).then(|| (now as u32).wrapping_sub(last) as u64)
    }

    /// Classifies a user write of `lba` and records it.
    pub fn on_write(&self, lba: u64) -> StreamId {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let s = classify(self.since(lba, now), self.windows);
        if let Some(slot) = self.last.get(lba as usize) {
            slot.store((now as u32).max(1), Ordering::Relaxed);
        }
        s
    }

    /// Stream for relocating `lba` (does not change its clock).
    pub fn on_relocate(&self, lba: u64) -> StreamId {
        classify_gc(
            self.since(lba, self.clock.load(Ordering::Relaxed)),
            self.windows,
        )
    }

    /// Forgets `lba` (trimmed).
    pub fn on_trim(&self, lba: u64, blocks: u64) {
        for l in lba..lba.saturating_add(blocks) {
            if let Some(slot) = self.last.get(l as usize) {
                slot.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_classification() {
        let w = Windows { hot: 10, warm: 100 };
        assert_eq!(classify(Some(3), w), HOT);
        assert_eq!(classify(Some(50), w), WARM);
        assert_eq!(classify(Some(500), w), COLD);
        assert_eq!(classify(None, w), COLD);
        assert_eq!(classify_gc(Some(50), w), GC_YOUNG);
        assert_eq!(classify_gc(None, w), GC_OLD);
    }

    #[test]
    fn stateful_classifier_learns_lifetimes() {
        let c = Classifier::new(1000);
        assert_eq!(
            c.windows,
            Windows {
                hot: 125,
                warm: 1000
            }
        );
        assert_eq!(c.on_write(5), COLD, "first write: no history");
        assert_eq!(c.on_write(5), HOT, "rewritten right away");
        for i in 0..400 {
            c.on_write(100 + i % 300);
        }
        assert_eq!(c.on_write(5), WARM);
        c.on_trim(5, 1);
        assert_eq!(c.on_write(5), COLD);
        assert_eq!(c.on_relocate(5), GC_YOUNG);
    }
}
