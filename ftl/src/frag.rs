//! Fragmentation: what large reads tell about it, and what to do about it (issue 18).
//!
//! Owns the read-side meter ([`FragMeter`]), the policy (pure functions over plain
//! figures: [`level_of`], [`worth_defrag`], [`whole_write_blocks`]) and the bounded
//! queue of read windows waiting to be rewritten contiguously ([`DefragQueue`]). The
//! engine feeds the meter and the queue from every read (`engine/defrag.rs`); the
//! cleaner's runner drains the queue when free space allows; the classified write path
//! asks [`whole_write_blocks`] how large a write must be to stay in one stream. Nothing
//! here does I/O.
//!
//! The levels follow the F2FS multi-level-threshold study (MTS: thresholds of 16 KiB,
//! 32/64 KiB, then everything as fragmentation grows), measured as the mean physically
//! contiguous run of recent large reads:
//!
//! | level  | mean run of recent large reads | window rewritten when its mean run is under | a write stays in one stream from |
//! | ------ | ------------------------------ | ------------------------------------------- | -------------------------------- |
//! | low    | >= 16 blocks (64 KiB)          | 4 blocks (16 KiB)                           | 16 blocks (64 KiB)               |
//! | medium | >= 4 blocks (16 KiB)           | 16 blocks (64 KiB)                          | 8 blocks (32 KiB)                |
//! | high   | < 4 blocks                     | the window (any split)                      | 2 blocks (every multi-block write) |
//!
//! Rewriting never overwrites in place: a window's blocks are relocated (compare and
//! swap against the entries the read verified) into a fresh segment, so a FLUSH's
//! promise is kept exactly as by the cleaner.

use crate::sync::{lock, AtomicU64, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// Reads of at least this many device-resident blocks (64 KiB) count as large reads:
/// they feed the meter and may queue their window.
pub const MIN_READ_BLOCKS: usize = 16;

/// Weight of one large read in the recent mean run (an exponential average).
const RECENT_WEIGHT: f64 = 1.0 / 64.0;

/// Fragmentation level of the device, from the mean run of recent large reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FragLevel {
    Low,
    Medium,
    High,
}

/// The level of a mean contiguous run (blocks); no large read yet (`None`) is low.
pub fn level_of(mean_run_blocks: Option<f64>) -> FragLevel {
    match mean_run_blocks {
        Some(r) if r < 4.0 => FragLevel::High,
        Some(r) if r < 16.0 => FragLevel::Medium,
        _ => FragLevel::Low,
    }
}

/// Whether a large read of `blocks` device-resident blocks that took `runs` backing reads
/// is worth rewriting contiguously at `level` (see the module's table).
pub fn worth_defrag(level: FragLevel, blocks: usize, runs: usize) -> bool {
    if blocks < MIN_READ_BLOCKS || runs <= 1 {
        return false;
    }
    let mean = blocks as f64 / runs as f64;
    match level {
        FragLevel::Low => mean < 4.0,
        FragLevel::Medium => mean < 16.0,
        FragLevel::High => true,
    }
}

/// Writes of at least this many blocks go to one stream whole, rather than split by the
/// classifier block by block (see the module's table).
pub fn whole_write_blocks(level: FragLevel) -> usize {
    match level {
        FragLevel::Low => 16,
        FragLevel::Medium => 8,
        FragLevel::High => 2,
    }
}

/// The read-side meter: large reads, their backing reads (runs) and blocks, lifetime and
/// recent. Updated by every reader thread (relaxed atomics; a lost update of the recent
/// average only delays it).
#[derive(Debug)]
pub struct FragMeter {
    reads: AtomicU64,
    runs: AtomicU64,
    blocks: AtomicU64,
    /// Recent mean run, as f64 bits (0: none yet).
    recent_bits: AtomicU64,
}

impl Default for FragMeter {
    fn default() -> Self {
        FragMeter {
            reads: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            blocks: AtomicU64::new(0),
            recent_bits: AtomicU64::new(0),
        }
    }
}

impl FragMeter {
    /// Counts one read of `blocks` device-resident blocks in `runs` backing reads (reads
    /// smaller than [`MIN_READ_BLOCKS`] are not counted).
    pub fn observe(&self, blocks: usize, runs: usize) {
        if blocks < MIN_READ_BLOCKS || runs == 0 {
            return;
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.runs.fetch_add(runs as u64, Ordering::Relaxed);
        self.blocks.fetch_add(blocks as u64, Ordering::Relaxed);
        let run = blocks as f64 / runs as f64;
        let old = f64::from_bits(self.recent_bits.load(Ordering::Relaxed));
        let new = if old == 0.0 {
            run
        } else {
            old + (run - old) * RECENT_WEIGHT
        };
        self.recent_bits.store(new.to_bits(), Ordering::Relaxed);
    }

    /// Mean run of recent large reads (`None` before the first).
    pub fn recent_mean_run(&self) -> Option<f64> {
        let r = f64::from_bits(self.recent_bits.load(Ordering::Relaxed));
        (r > 0.0).then_some(r)
    }

    /// The device's level now.
    pub fn level(&self) -> FragLevel {
        level_of(self.recent_mean_run())
    }

    /// Lifetime figures.
    pub fn figures(&self) -> (u64, u64, u64) {
        (
            self.reads.load(Ordering::Relaxed),
            self.runs.load(Ordering::Relaxed),
            self.blocks.load(Ordering::Relaxed),
        )
    }
}

/// A read window waiting to be rewritten: the blocks the read found on the device, each
/// with the map entry it was verified against, and their data (in the same order); or,
/// when the queue had no room for the data, only the range (`blocks` empty), read again
/// when its turn comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefragWindow {
    pub lba: u64,
    pub count: u32,
    /// `(lba, entry)` of each block (empty: read the range again).
    pub blocks: Vec<(u64, crate::map::MapEntry)>,
    pub data: Vec<u8>,
}

/// Ranges (windows queued without their data) the queue holds at most.
pub const MAX_QUEUED_RANGES: usize = 1 << 16;

/// The queue of windows to rewrite: data bounded in bytes (a window whose data does not
/// fit is queued as a range, read again later), ranges bounded in number (past that a
/// window is dropped and counted); a window starting where a queued one starts is not
/// queued twice.
#[derive(Debug)]
pub struct DefragQueue {
    inner: Mutex<Queued>,
    cap_bytes: usize,
    pub queued: AtomicU64,
    pub dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Queued {
    windows: VecDeque<DefragWindow>,
    starts: std::collections::HashSet<u64>,
    bytes: usize,
}

impl DefragQueue {
    /// A queue holding at most `cap_bytes` of data (0: a queue that takes nothing).
    pub fn new(cap_bytes: usize) -> Self {
        DefragQueue {
            inner: Mutex::new(Queued::default()),
            cap_bytes,
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queued> {
        lock(&self.inner)
    }

    /// Whether a window with `bytes` of data would be queued with its data now (callers
    /// check before copying; otherwise they offer the range alone).
    pub fn has_room(&self, bytes: usize) -> bool {
        self.cap_bytes > 0 && self.lock().bytes + bytes <= self.cap_bytes
    }

    /// Queues `w`; false when it was dropped (a disabled queue, no room for its data or
    /// range, or its start is queued already). A window whose data no longer fits (another
    /// reader's took the room since [`Self::has_room`]) is queued as its range alone, as
    /// one offered without room would have been (it was dropped; found by review,
    /// 2026-11-29).
    pub fn offer(&self, mut w: DefragWindow) -> bool {
        let mut g = self.lock();
        if !w.data.is_empty() && g.bytes + w.data.len() > self.cap_bytes {
            w.data = Vec::new();
            w.blocks = Vec::new();
        }
        let full = if w.data.is_empty() {
            g.windows.len() >= MAX_QUEUED_RANGES
        } else {
            g.bytes + w.data.len() > self.cap_bytes
        };
        if self.cap_bytes == 0 || full || g.starts.contains(&w.lba) {
            drop(g);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        g.bytes += w.data.len();
        g.starts.insert(w.lba);
        g.windows.push_back(w);
        self.queued.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Takes the oldest window.
    pub fn take(&self) -> Option<DefragWindow> {
        let mut g = self.lock();
        let w = g.windows.pop_front()?;
        g.bytes -= w.data.len();
        g.starts.remove(&w.lba);
        Some(w)
    }

    /// Windows waiting.
    pub fn len(&self) -> usize {
        self.lock().windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::MapEntry;

    #[test]
    fn levels_follow_the_mean_run() {
        assert_eq!(level_of(None), FragLevel::Low);
        assert_eq!(level_of(Some(32.0)), FragLevel::Low);
        assert_eq!(level_of(Some(16.0)), FragLevel::Low);
        assert_eq!(level_of(Some(15.9)), FragLevel::Medium);
        assert_eq!(level_of(Some(4.0)), FragLevel::Medium);
        assert_eq!(level_of(Some(2.4)), FragLevel::High);
    }

    #[test]
    fn the_threshold_widens_with_the_level() {
        // 32 blocks in 3 runs (mean 10.7): medium and high rewrite it, low does not.
        assert!(!worth_defrag(FragLevel::Low, 32, 3));
        assert!(worth_defrag(FragLevel::Medium, 32, 3));
        assert!(worth_defrag(FragLevel::High, 32, 3));
        // Badly split: every level.
        assert!(worth_defrag(FragLevel::Low, 32, 13));
        // Contiguous, or too small to count: never.
        for l in [FragLevel::Low, FragLevel::Medium, FragLevel::High] {
            assert!(!worth_defrag(l, 32, 1));
            assert!(!worth_defrag(l, MIN_READ_BLOCKS - 1, 8));
        }
        // 2 runs of 16: only high.
        assert!(!worth_defrag(FragLevel::Medium, 32, 2));
        assert!(worth_defrag(FragLevel::High, 32, 2));
        assert!(whole_write_blocks(FragLevel::Low) > whole_write_blocks(FragLevel::Medium));
        assert!(whole_write_blocks(FragLevel::Medium) > whole_write_blocks(FragLevel::High));
    }

    #[test]
    fn the_meter_averages_recent_large_reads_only() {
        let m = FragMeter::default();
        assert_eq!(m.level(), FragLevel::Low);
        m.observe(8, 8); // small: not counted
        assert_eq!(m.figures(), (0, 0, 0));
        m.observe(32, 16); // mean run 2
        assert_eq!(m.level(), FragLevel::High);
        for _ in 0..1000 {
            m.observe(32, 1);
        }
        assert_eq!(m.level(), FragLevel::Low, "contiguous reads bring it back");
        assert_eq!(m.figures(), (1001, 1016, 32032));
    }

    #[test]
    fn the_queue_is_bounded_and_takes_a_window_once() {
        let w = |lba: u64, n: usize, with_data: bool| DefragWindow {
            lba,
            count: n as u32,
            blocks: if with_data {
                (0..n as u64)
                    .map(|i| (lba + i, MapEntry::UNMAPPED))
                    .collect()
            } else {
                Vec::new()
            },
            data: if with_data {
                vec![0; n * 4096]
            } else {
                Vec::new()
            },
        };
        let q = DefragQueue::new(64 * 4096);
        assert!(q.offer(w(0, 32, true)));
        assert!(!q.offer(w(0, 32, true)), "the same window twice");
        assert!(
            !q.offer(w(0, 32, false)),
            "the same window twice, as a range"
        );
        assert!(q.has_room(32 * 4096));
        assert!(q.offer(w(32, 32, true)));
        assert!(!q.has_room(4096));
        // Data over the bound (another reader took the room after this one's
        // `has_room`): queued as its range, not dropped.
        assert!(
            q.offer(w(64, 1, true)),
            "data over the bound: queued as its range"
        );
        assert!(!q.offer(w(64, 32, false)), "its range is queued already");
        assert_eq!((q.len(), q.dropped.load(Ordering::Relaxed)), (3, 3));
        assert_eq!(q.take().map(|w| w.lba), Some(0));
        assert!(q.offer(w(0, 32, true)), "taken, so it may come again");
        assert_eq!(q.take().map(|w| w.lba), Some(32));
        assert_eq!(q.take().map(|w| (w.lba, w.data.len())), Some((64, 0)));
        assert_eq!(q.take().map(|w| w.lba), Some(0));
        assert!(q.take().is_none() && q.is_empty());
        let off = DefragQueue::new(0);
        assert!(!off.has_room(4096) && !off.offer(w(0, 32, false)));
    }
}
