//! Where the replay puts each block: one stream, the online classifier, or the same
//! classes fed with knowledge of the trace.
//!
//! All three classifying kinds share [`ftl::classify::Classifier`]'s classes, scale and
//! stream budget, and differ only in the lifetime estimate they hand it:
//! - `online`: the classifier's own estimate from each block's history;
//! - `oracle`: the true distance to the block's next overwrite (look-ahead);
//! - `frequency`: the block's true mean rewrite interval, `1 / p` for a workload that
//!   writes it with probability `p` per write: the best any history-based classifier can
//!   know on a stationary workload. Without the workload's probabilities (a trace), the
//!   trace's own counts stand in; for blocks written once or twice they leak the future.
//!
//! Invariant: the oracle's look-ahead is indexed by block writes in trace order, so
//! [`Placer::user`] must be called once per block write, in order.

use crate::trace::TraceOp;
use ftl::classify::{Classifier, Params};
use ftl::{StreamId, GC_STREAM};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How blocks are placed into streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassifierKind {
    /// One user stream, one GC stream.
    None,
    /// Classes by each block's expected lifetime from its history.
    Online,
    /// Classes by each write's true next overwrite (look-ahead).
    Oracle,
    /// Classes by each block's true mean rewrite interval over the trace.
    Frequency,
}

impl std::str::FromStr for ClassifierKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ClassifierKind::None),
            "online" => Ok(ClassifierKind::Online),
            "oracle" => Ok(ClassifierKind::Oracle),
            "frequency" => Ok(ClassifierKind::Frequency),
            o => Err(format!(
                "unknown classifier {o:?} (none, online, oracle, frequency)"
            )),
        }
    }
}

/// The placement state of one replay.
pub struct Placer {
    kind: ClassifierKind,
    classifier: Classifier,
    /// Oracle: next-overwrite distance of every block write, in block writes.
    next: Vec<u32>,
    /// Oracle: block-write index at which each LBA is next written (`u64::MAX`: never).
    next_write_at: Vec<AtomicU64>,
    /// Frequency: mean rewrite interval of each LBA (infinite: never written).
    interval: Vec<f64>,
    /// Block writes so far.
    clock: AtomicU64,
}

impl Placer {
    /// A placer for `ops` on a device of `capacity` blocks, with `classes` classes;
    /// `probabilities`: the workload's per-LBA write probability, for `frequency`.
    pub fn new(
        kind: ClassifierKind,
        ops: &[TraceOp],
        capacity: u64,
        classes: u8,
        probabilities: Option<&[f64]>,
        tracked_blocks: Option<u64>,
    ) -> Self {
        let defaults = Params::for_capacity(capacity);
        let params = Params {
            classes,
            tracked_blocks: tracked_blocks.unwrap_or(defaults.tracked_blocks),
            ..defaults
        };
        let (mut next, mut interval) = (Vec::new(), Vec::new());
        match (kind, probabilities) {
            (ClassifierKind::Oracle, _) => next = lookahead(ops),
            (ClassifierKind::Frequency, Some(p)) => {
                interval = p.iter().map(|&p| 1.0 / p).collect();
            }
            (ClassifierKind::Frequency, None) => interval = mean_intervals(ops, capacity),
            _ => {}
        }
        let slots = if kind == ClassifierKind::Oracle {
            capacity
        } else {
            0
        };
        Placer {
            kind,
            classifier: Classifier::with_params(capacity, params),
            next,
            next_write_at: (0..slots).map(|_| AtomicU64::new(u64::MAX)).collect(),
            interval,
            clock: AtomicU64::new(0),
        }
    }

    /// Stream of the next block write, to `lba`.
    pub fn user(&self, lba: u64) -> StreamId {
        let wi = self.clock.fetch_add(1, Relaxed);
        match self.kind {
            ClassifierKind::None => StreamId(1),
            ClassifierKind::Online => self.classifier.on_write(lba),
            ClassifierKind::Oracle => {
                let d = self.next.get(wi as usize).copied().unwrap_or(u32::MAX);
                let known = (d != u32::MAX).then_some(d as u64);
                if let Some(slot) = self.next_write_at.get(lba as usize) {
                    slot.store(known.map_or(u64::MAX, |d| wi + d), Relaxed);
                }
                self.classifier.on_write_known(lba, known.map(|d| d as f64))
            }
            ClassifierKind::Frequency => {
                let l = self.interval(lba);
                self.classifier.on_write_known(lba, l)
            }
        }
    }

    /// The FTL's mapped blocks, the online classifier's scale (as the server's writes
    /// give it, [`ftl::classify::write_classified`]).
    pub fn observe_live(&self, mapped: u64) {
        self.classifier.observe_live(mapped);
    }

    /// A server restart: the online classifier forgets everything it learned.
    pub fn restart(&self) {
        self.classifier.reset();
    }

    /// Stream for relocating `lba`.
    pub fn relocate(&self, lba: u64) -> StreamId {
        match self.kind {
            ClassifierKind::None => GC_STREAM,
            ClassifierKind::Online => self.classifier.on_relocate(lba),
            ClassifierKind::Oracle => {
                let at = self
                    .next_write_at
                    .get(lba as usize)
                    .map_or(u64::MAX, |a| a.load(Relaxed));
                let now = self.clock.load(Relaxed);
                self.classifier
                    .place((at != u64::MAX).then(|| at.saturating_sub(now) as f64))
            }
            ClassifierKind::Frequency => self.classifier.place(self.interval(lba)),
        }
    }

    fn interval(&self, lba: u64) -> Option<f64> {
        self.interval
            .get(lba as usize)
            .copied()
            .filter(|i| i.is_finite())
    }

    /// `blocks` blocks from `lba` were trimmed.
    pub fn trim(&self, lba: u64, blocks: u64) {
        self.classifier.on_trim(lba, blocks);
    }

    /// Classes that had a stream of their own at the last plan (bit `c` = class `c`).
    pub fn active_classes(&self) -> u8 {
        if self.kind == ClassifierKind::None {
            0
        } else {
            self.classifier.active_classes()
        }
    }

    /// Plans the classifier made so far (0 with one stream).
    pub fn plans(&self) -> u64 {
        if self.kind == ClassifierKind::None {
            0
        } else {
            self.classifier.plans()
        }
    }

    /// Streams that no longer receive writes under the current plan, and the GC stream
    /// (classes never write to it; it only takes diverted relocations).
    pub fn idle_streams(&self) -> Vec<StreamId> {
        if self.kind == ClassifierKind::None {
            return Vec::new();
        }
        let mut v = self.classifier.idle_streams();
        v.push(GC_STREAM);
        v
    }

    /// Bytes of per-block state the online classifier needs (0 for the others).
    pub fn bytes_per_block(&self) -> usize {
        if self.kind == ClassifierKind::Online {
            Classifier::BYTES_PER_BLOCK
        } else {
            0
        }
    }
}

fn block_writes(ops: &[TraceOp]) -> impl Iterator<Item = u64> + '_ {
    ops.iter().flat_map(|op| match *op {
        TraceOp::Write { lba, blocks } => lba..lba + blocks as u64,
        _ => 0..0,
    })
}

/// Next-overwrite distance (in block writes) of every block write (`u32::MAX`: never).
pub fn lookahead(ops: &[TraceOp]) -> Vec<u32> {
    let writes: Vec<u64> = block_writes(ops).collect();
    let mut next: HashMap<u64, usize> = HashMap::new();
    let mut out = vec![u32::MAX; writes.len()];
    for i in (0..writes.len()).rev() {
        if let Some(&n) = next.get(&writes[i]) {
            out[i] = (n - i).min(u32::MAX as usize - 1) as u32;
        }
        next.insert(writes[i], i);
    }
    out
}

/// Mean rewrite interval of each LBA below `capacity`: block writes in the trace / its
/// writes (infinite if none).
pub fn mean_intervals(ops: &[TraceOp], capacity: u64) -> Vec<f64> {
    let mut counts = vec![0u64; capacity as usize];
    let mut total = 0u64;
    for l in block_writes(ops) {
        if let Some(c) = counts.get_mut(l as usize) {
            *c += 1;
        }
        total += 1;
    }
    counts
        .into_iter()
        .map(|n| total as f64 / n as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(lba: u64) -> TraceOp {
        TraceOp::Write { lba, blocks: 1 }
    }

    #[test]
    fn lookahead_and_intervals() {
        let ops = [
            w(1),
            w(2),
            TraceOp::Read { lba: 1, blocks: 1 },
            w(1),
            w(3),
            w(1),
        ];
        assert_eq!(lookahead(&ops), vec![2, u32::MAX, 2, u32::MAX, u32::MAX]);
        let m = mean_intervals(&ops, 4);
        assert_eq!(m[1], 5.0 / 3.0);
        assert_eq!(m[2], 5.0);
        assert_eq!(m[0], f64::INFINITY);
    }

    #[test]
    fn oracle_relocation_uses_the_remaining_distance() {
        // LBA 0 is rewritten every 2 writes; LBA 1 never again.
        let mut ops = vec![w(1)];
        for i in 0..4000 {
            ops.push(w(if i % 2 == 0 { 0 } else { 2 + i }));
        }
        let p = Placer::new(ClassifierKind::Oracle, &ops, 5_000, 7, None, None);
        for op in &ops {
            p.user(op.range().0);
        }
        assert_eq!(
            p.relocate(1),
            StreamId(6),
            "never rewritten: longest-lived class"
        );
        let none = Placer::new(ClassifierKind::None, &ops, 10_000, 7, None, None);
        assert_eq!(none.user(0), StreamId(1));
        assert_eq!(none.relocate(0), GC_STREAM);
        assert_eq!(none.bytes_per_block(), 0);
        assert!("bogus".parse::<ClassifierKind>().is_err());
    }
}
