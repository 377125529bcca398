//! The segment table: state, owner stream, live-block counts, free list.
//!
//! Invariants:
//! - a segment is in the free list iff its state is `Free`;
//! - `valid[s]` equals the number of map entries pointing into segment `s` whenever no
//!   append is in progress (appends update map and counts under the same stripe lock);
//! - `unwritten[s] > 0` while some chunk of `s` is only in memory; readers then look in
//!   the owning stream's buffers (`owner[s]`) before the device;
//! - a `Closed` segment with `valid == 0` becomes `Free` only after a checkpoint that
//!   records it dead, or a free record naming it, is durable (see `engine/checkpoint.rs`
//!   and `engine/free.rs`).
//!
//! Owns per-segment state and counters, changed only through its methods (the appender's
//! `note_append` / `chunk_begin` / `chunk_end`, the checkpoint's `release`, recovery's
//! `count_live`). Called by the appender, the checkpoint, relocation, recovery and the
//! checker.

use crate::records::{SegState, SegmentRecord};
use crate::stream::TRIM_STREAM;
use crate::sync::{AtomicU32, AtomicU8, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// Per-segment metadata kept under the table lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegInfo {
    pub state: SegState,
    pub stream: u8,
    pub erase_count: u32,
    pub opened_seq: u64,
}

/// Mutable part of the table.
pub struct SegTableInner {
    pub info: Vec<SegInfo>,
    pub free: VecDeque<u32>,
    /// Segments of the TRIM stream whose records were carried forward
    /// (`engine/tombstones.rs`); cleared when the segment is freed.
    pub carried: Vec<bool>,
}

/// The segment table. Its counters change only through the methods below, each named
/// for the step of the log that calls it.
pub struct Segments {
    inner: Mutex<SegTableInner>,
    valid: Box<[AtomicU32]>,
    unwritten: Box<[AtomicU32]>,
    owner: Box<[AtomicU8]>,
}

/// A plain copy of one segment's statistics, for policies and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SegmentSnapshot {
    pub segment: u32,
    pub state: &'static str,
    pub stream: u8,
    pub valid: u32,
    pub erase_count: u32,
    pub opened_seq: u64,
}

impl Segments {
    /// Builds the table from records (index 0 is the metadata segment, never used), live
    /// counts included.
    pub fn from_records(records: &[SegmentRecord]) -> Self {
        let info: Vec<SegInfo> = records
            .iter()
            .map(|r| SegInfo {
                state: r.state,
                stream: r.stream,
                erase_count: r.erase_count,
                opened_seq: r.opened_seq,
            })
            .collect();
        let free = info
            .iter()
            .enumerate()
            .filter(|(i, s)| *i != 0 && s.state == SegState::Free)
            .map(|(i, _)| i as u32)
            .collect();
        let n = info.len();
        Segments {
            inner: Mutex::new(SegTableInner {
                carried: vec![false; info.len()],
                info,
                free,
            }),
            valid: records.iter().map(|r| AtomicU32::new(r.valid)).collect(),
            unwritten: (0..n).map(|_| AtomicU32::new(0)).collect(),
            owner: records.iter().map(|r| AtomicU8::new(r.stream)).collect(),
        }
    }

    /// Records of a freshly formatted device: segment 0 closed (metadata), the rest free.
    pub fn fresh_records(count: u32) -> Vec<SegmentRecord> {
        (0..count)
            .map(|s| SegmentRecord {
                segment: s,
                state: if s == 0 {
                    SegState::Closed
                } else {
                    SegState::Free
                },
                stream: 0,
                erase_count: 0,
                opened_seq: 0,
                valid: 0,
            })
            .collect()
    }

    /// Locks the mutable part. Poisoning is recovered (the data stays consistent: every
    /// critical section leaves the table valid before anything that can panic).
    pub fn lock(&self) -> MutexGuard<'_, SegTableInner> {
        crate::sync::lock(&self.inner)
    }

    /// A block was appended into segment `new`, replacing one in `old` (if mapped):
    /// called under the block's stripe lock, right after the map change, so no segment
    /// ever counts fewer live blocks than the map points into it (a lock-free reader
    /// never sees a segment dead while a map entry still names it).
    pub fn note_append(&self, new: u32, old: Option<u32>) {
        self.valid[new as usize].fetch_add(1, Ordering::SeqCst);
        if let Some(o) = old {
            self.note_unmap(o);
        }
    }

    /// A mapped block of segment `seg` was unmapped (trimmed or overwritten).
    pub fn note_unmap(&self, seg: u32) {
        self.valid[seg as usize].fetch_sub(1, Ordering::SeqCst);
    }

    /// Recovery: a block of the recovered map lives in `seg`.
    pub fn count_live(&self, seg: u32) {
        self.valid[seg as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Live blocks of `seg` (0 for a segment that does not exist).
    pub fn valid(&self, seg: u32) -> u32 {
        self.valid
            .get(seg as usize)
            .map_or(0, |v| v.load(Ordering::SeqCst))
    }

    /// A chunk of `stream` opened in `seg`: until [`Segments::chunk_end`], reads of
    /// `seg` look in the stream's buffers first.
    pub fn chunk_begin(&self, seg: u32, stream: u8) {
        self.owner[seg as usize].store(stream, Ordering::SeqCst);
        self.unwritten[seg as usize].fetch_add(1, Ordering::SeqCst);
    }

    /// A chunk of `seg` is on the device (or was dropped empty).
    pub fn chunk_end(&self, seg: u32) {
        self.unwritten[seg as usize].fetch_sub(1, Ordering::SeqCst);
    }

    /// The stream whose buffers may hold blocks of `seg`, while some chunk of it is only
    /// in memory.
    pub fn buffered_owner(&self, seg: u32) -> Option<u8> {
        (self.unwritten[seg as usize].load(Ordering::SeqCst) > 0)
            .then(|| self.owner[seg as usize].load(Ordering::SeqCst))
    }

    /// Takes a free segment for `stream`, opened at entry sequence `seq`, unless that
    /// would leave `keep` or fewer free (the cleaner's reserve).
    pub fn allocate(&self, stream: u8, seq: u64, keep: usize) -> Option<u32> {
        let mut t = self.lock();
        if t.free.len() <= keep {
            return None;
        }
        let seg = t.free.pop_front()?;
        let i = &mut t.info[seg as usize];
        i.state = SegState::Open;
        i.stream = stream;
        i.opened_seq = seq;
        self.owner[seg as usize].store(stream, Ordering::SeqCst);
        Some(seg)
    }

    /// Marks an open segment closed.
    pub fn close(&self, seg: u32) {
        let mut t = self.lock();
        t.info[seg as usize].state = SegState::Closed;
    }

    /// Returns dead segments to the free list (after their death is durable).
    pub fn release(&self, segs: &[u32]) {
        let mut t = self.lock();
        for &s in segs {
            let i = &mut t.info[s as usize];
            if i.state != SegState::Free {
                i.state = SegState::Free;
                i.erase_count += 1;
                t.free.push_back(s);
                t.carried[s as usize] = false;
            }
        }
    }

    /// Sets every live count to zero (recovery recounts them from the map).
    pub fn clear_counts(&self) {
        for v in self.valid.iter() {
            v.store(0, Ordering::SeqCst);
        }
    }

    /// Free segment count.
    pub fn free_count(&self) -> usize {
        self.lock().free.len()
    }

    /// Closed segments with no live block (reclaimable at the next checkpoint).
    pub fn dead_closed(&self) -> Vec<u32> {
        let t = self.lock();
        t.info
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                *i != 0
                    && s.state == SegState::Closed
                    && self.valid[*i].load(Ordering::SeqCst) == 0
                    // Tombstone rule 1: a TRIM segment once its records are carried.
                    && (s.stream != TRIM_STREAM.0 || t.carried[*i])
            })
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Closed segments of the TRIM stream whose records are not carried yet.
    pub fn uncarried_trim_segments(&self) -> Vec<u32> {
        let t = self.lock();
        (1..t.info.len())
            .filter(|&i| {
                let s = &t.info[i];
                s.state == SegState::Closed && s.stream == TRIM_STREAM.0 && !t.carried[i]
            })
            .map(|i| i as u32)
            .collect()
    }

    /// Marks a TRIM segment carried (tombstone rule 1).
    pub fn set_carried(&self, seg: u32) {
        let mut t = self.lock();
        if let Some(c) = t.carried.get_mut(seg as usize) {
            *c = true;
        }
    }

    /// The smallest `opened_seq` of the allocated segments other than `except` (sorted):
    /// no block numbered below it is in the log outside free segments and `except`
    /// (`None`: no such segment).
    pub fn oldest_opened(&self, except: &[u32]) -> Option<u64> {
        let t = self.lock();
        t.info
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(i, s)| {
                s.state != SegState::Free && except.binary_search(&(*i as u32)).is_err()
            })
            .map(|(_, s)| s.opened_seq)
            .min()
    }

    /// Records for a checkpoint; `dead` segments are recorded as free.
    pub fn records(&self, dead: &[u32]) -> Vec<SegmentRecord> {
        let t = self.lock();
        t.info
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let is_dead = dead.contains(&(i as u32));
                SegmentRecord {
                    segment: i as u32,
                    state: if is_dead { SegState::Free } else { s.state },
                    stream: s.stream,
                    erase_count: s.erase_count + is_dead as u32,
                    opened_seq: s.opened_seq,
                    valid: self.valid[i].load(Ordering::SeqCst),
                }
            })
            .collect()
    }

    /// Plain copies of every segment's statistics.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let t = self.lock();
        t.info
            .iter()
            .enumerate()
            .map(|(i, s)| SegmentSnapshot {
                segment: i as u32,
                state: match s.state {
                    SegState::Free => "free",
                    SegState::Open => "open",
                    SegState::Closed => "closed",
                },
                stream: s.stream,
                valid: self.valid[i].load(Ordering::SeqCst),
                erase_count: s.erase_count,
                opened_seq: s.opened_seq,
            })
            .collect()
    }

    /// Recovery: a free segment found holding the next chunk of `stream` becomes open.
    pub fn take_for_recovery(&self, seg: u32, stream: u8, seq: u64) -> bool {
        let mut t = self.lock();
        let Some(pos) = t.free.iter().position(|&s| s == seg) else {
            return false;
        };
        t.free.remove(pos);
        let i = &mut t.info[seg as usize];
        i.state = SegState::Open;
        i.stream = stream;
        i.opened_seq = seq;
        self.owner[seg as usize].store(stream, Ordering::SeqCst);
        true
    }

    /// Times `seg` was freed for reuse.
    pub fn erase_count(&self, seg: u32) -> u32 {
        self.lock().info.get(seg as usize).map_or(0, |i| i.erase_count)
    }

    /// State of one segment.
    pub fn state(&self, seg: u32) -> Option<SegState> {
        self.lock().info.get(seg as usize).map(|i| i.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_close_release() {
        let t = Segments::from_records(&Segments::fresh_records(4));
        assert_eq!(t.free_count(), 3);
        let s = t.allocate(2, 10, 0).unwrap();
        assert_eq!(s, 1);
        t.chunk_begin(s, 2);
        assert_eq!(t.buffered_owner(s), Some(2));
        t.chunk_end(s);
        assert_eq!(t.buffered_owner(s), None);
        t.close(s);
        assert_eq!(t.dead_closed(), vec![1]);
        let recs = t.records(&[1]);
        assert_eq!(recs[1].state, SegState::Free);
        assert_eq!(recs[0].state, SegState::Closed);
        t.release(&[1]);
        assert_eq!(t.free_count(), 3);
        assert_eq!(t.snapshot()[1].erase_count, 1);
        t.note_append(2, None);
        t.note_append(3, Some(2));
        assert_eq!((t.valid(2), t.valid(3)), (0, 1));
        assert!(t.allocate(0, 0, 3).is_none(), "the reserve is kept");
        t.allocate(0, 0, 0);
        t.allocate(0, 0, 0);
        t.allocate(0, 0, 0);
        assert!(t.allocate(0, 0, 0).is_none());
    }
}
