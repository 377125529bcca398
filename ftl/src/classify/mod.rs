//! Write-time stream classification by expected lifetime.
//!
//! Every block written - by the user or relocated by the cleaner - is placed into one of
//! [`CLASSES`] classes by the number of user writes it is expected to stay live, and each
//! class has its own stream (its own open segment), so segments fill with blocks that die
//! at about the same time.
//!
//! ## The estimate (pure functions here, per-block state in [`Classifier`])
//! - Per block: the user-write clock of its last write (`u32`, modulo 2^32; a sweep of
//!   one slot a write holds every age below 2^32, so an idle block never looks young
//!   again when the clock turns) and a [`Stat`] (`u16`): how
//!   many rewrite intervals were seen (capped) and their running mean, log-coded. 6 bytes
//!   per block ([`Classifier::BYTES_PER_BLOCK`]) on a device of at most
//!   [`Params::tracked_blocks`]; a larger one keeps that many slots, each tagged with the
//!   LBA that holds it (10 bytes a slot): an LBA hashes to a slot, and a write whose LBA
//!   does not hold its slot takes it and counts as a first write. Blocks rewritten often
//!   keep their slots; the state is bounded whatever the capacity.
//! - A user write that ends an interval `d` folds `d` into the mean; the block is expected
//!   to live the new mean again (for a block rewritten at a steady rate, the mean of its
//!   intervals is the maximum-likelihood estimate of its lifetime; SepBIT's "a block lives
//!   as long as the one it invalidates", averaged). A first write (no history) is expected
//!   to live the scale `S` below.
//! - A relocated block that has survived `age` user writes since its last write: with `n`
//!   intervals seen, `(n * mean + age) / n` (the same estimate, counting the interval still
//!   open); with none, `age`. One the classifier has no history of goes one class colder
//!   than a first write: with shared slots, its LBA holds no slot (its history lost past
//!   the scale, or never kept); without, it was last written before the server started.
//! - A relocated block never rewritten since its first write (no interval seen) that has
//!   survived `static_age` scales (2 by default) goes to the coldest class that has a
//!   stream, if that is colder than its age says ([`relocation_class`]). Lifetimes of
//!   real and Zipf workloads are heavy-tailed: such a block is most likely never
//!   rewritten at all (fio's Zipf leaves 22-38% of a device so), and the age alone
//!   keeps it in the classes of blocks that die, copied with every victim there (a
//!   small gain: MiDAS's setting, fio form, 3.036 -> 3.013 WAF; `docs/waf.md`). It
//!   takes no stream of its own: on a small device a stream costs more spare than the
//!   separation saves (2 GiB, 7% spare: +1.5-2.2% WAF).
//! - The scale `S` is the number of live blocks (counted by the classifier, and at least
//!   the FTL's mapped blocks, given by [`write_classified`]: after a start the classifier
//!   has seen only the blocks written since): by Little's law it is the mean lifetime,
//!   in user writes, of the blocks the user overwrites (SepBIT's adaptive threshold is the
//!   running average of that lifetime; this is its steady-state value, exact and
//!   noise-free). Classes are log-spaced around it: with the defaults (7 classes, factor
//!   4) class 3 holds lifetimes in `[S/2, 2S)`, class 2 `[S/8, S/2)`, class 4 `[2S, 8S)`.
//!
//! ## Stream budget
//! An open segment costs free space until it fills, so a class keeps a stream of its own
//! only while it pays for it. Every `period` placements [`plan`]:
//! - activates the classes that took at least `activate_permille` of the placements, and
//!   keeps active ones above `deactivate_permille` (hysteresis);
//! - measures, per class, how long the blocks user writes put there really lived: the
//!   share of them rewritten within the class's nominal lifetime gives an implied mean
//!   lifetime ([`implied_lifetime_log2`]; counted over placements, so blocks that outlive
//!   the measurement still count). Neighbouring active classes whose blocks live within
//!   `min_separation_log2` of each other are not told apart by the estimate, and share
//!   the busier one's stream. On uniform overwrites (every block lives alike, whatever its
//!   history) this leaves one stream; on skewed workloads every class that separates.
//! - sends inactive classes to the nearest active one.
//!
//! Until the first plan everything goes to the class of `S`. A class that loses its
//! stream leaves an open segment behind: [`Classifier::idle_streams`] names the streams
//! to close (`Ftl::close_stream`) after a plan ([`Classifier::plans`] counts them).
//!
//! ## Streams
//! Class `c` writes to stream `c` (0 ..= 6); [`crate::GC_STREAM`] (7) is left to
//! relocations the FTL diverts when their stream would need the last free segment.
//! Relocations go to the class of their estimate (old never-rewritten blocks: see above),
//! the same streams as user writes of the same expected lifetime (for a block with a
//! steady write rate, surviving a relocation says nothing new about its remaining life
//! beyond what the estimate counts).
//! Placements known otherwise (oracles, [`Classifier::on_write_known`],
//! [`Classifier::place`]) use the same classes and plan, measured by share only.
//!
//! ## Invariants
//! - Memory is fixed at construction: 6 bytes per tracked block (10 when slots are
//!   shared) plus a few counters.
//! - Every function returns a class `< params.classes` and a stream `< CLASSES`; LBAs past
//!   the capacity are classified without history and not recorded.
//! - Concurrent calls are safe (atomics, relaxed): a race can only misplace a block, never
//!   corrupt state or panic.

mod online;
mod state;
mod write;

pub use online::Classifier;
pub use state::STATE_FILE;
pub use write::write_classified;

use crate::stream::StreamId;

/// Number of classes (and streams) available for placement.
pub const CLASSES: usize = 7;

/// The stream class `class` writes to.
pub const fn stream_of(class: u8) -> StreamId {
    StreamId(class)
}

/// Tunables of the classifier.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Params {
    /// Classes in use, 1 ..= [`CLASSES`]; the scale sits in class `classes / 2`.
    pub classes: u8,
    /// log2 of the lifetime ratio between neighbouring classes.
    pub spacing_log2: f64,
    /// Intervals averaged per block before the mean turns into a moving average
    /// (1 ..= [`Stat::MAX_COUNT`]).
    pub max_samples: u8,
    /// Share of a period's placements (per mille) that gives a class its own stream.
    pub activate_permille: u64,
    /// Share below which an active class loses its stream.
    pub deactivate_permille: u64,
    /// Placements between two [`plan`]s.
    pub period: u64,
    /// Neighbouring classes whose blocks' measured lifetimes differ by less than this
    /// (log2) share a stream.
    pub min_separation_log2: f64,
    /// User writes a class needs in a period for its measured lifetime to count.
    pub min_samples: u64,
    /// Blocks whose history is kept: a device with more shares the slots (an LBA
    /// hashes to one, tagged; see [`Classifier`]), so the state stays bounded.
    pub tracked_blocks: u64,
    /// Age, in scales, past which a relocated block never rewritten since its first
    /// write goes to the coldest active class ([`relocation_class`]; infinite: never).
    pub static_age: f64,
}

/// The default bound on tracked blocks: 8 Mi slots (80 MiB), every block of a device of
/// up to 32 GiB.
pub const DEFAULT_TRACKED_BLOCKS: u64 = 8 << 20;

impl Params {
    /// Defaults for a device of `capacity` blocks (a plan every half capacity).
    pub fn for_capacity(capacity: u64) -> Self {
        Params {
            classes: CLASSES as u8,
            spacing_log2: 2.0,
            max_samples: Stat::MAX_COUNT,
            activate_permille: 30,
            deactivate_permille: 10,
            period: (capacity / 2).max(256),
            min_separation_log2: 1.0,
            min_samples: 64,
            tracked_blocks: DEFAULT_TRACKED_BLOCKS,
            static_age: 2.0,
        }
    }

    fn classes(&self) -> u8 {
        self.classes.clamp(1, CLASSES as u8)
    }

    /// The class the scale itself falls into.
    pub fn middle(&self) -> u8 {
        self.classes() / 2
    }
}

/// Per-block interval statistics, 16 bits: count of intervals seen (4 bits, capped) and
/// their mean, as `round(128 * log2(mean))` (12 bits: means up to 2^32, 0.5% steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat(pub u16);

impl Stat {
    /// Largest count a stat holds.
    pub const MAX_COUNT: u8 = 15;
    const LOG_SCALE: f64 = 128.0;
    const LOG_MAX: u16 = 0x0fff;

    /// A stat of `count` intervals (capped) averaging `mean` user writes.
    pub fn new(count: u8, mean: f64) -> Stat {
        let log = (mean.max(1.0).log2() * Self::LOG_SCALE).round();
        let log = if log.is_finite() {
            (log as u64).min(Self::LOG_MAX as u64) as u16
        } else {
            Self::LOG_MAX
        };
        Stat(((count.min(Self::MAX_COUNT) as u16) << 12) | log)
    }

    /// Intervals seen (capped).
    pub fn count(self) -> u8 {
        (self.0 >> 12) as u8
    }

    /// Their mean, in user writes (1 if none seen).
    pub fn mean(self) -> f64 {
        ((self.0 & Self::LOG_MAX) as f64 / Self::LOG_SCALE).exp2()
    }

    /// Folds one more interval in: running mean over the first `max_samples` intervals,
    /// a moving average with weight `1 / max_samples` after.
    pub fn observe(self, interval: u64, max_samples: u8) -> Stat {
        let n = (self.count() as u32 + 1).min(max_samples.clamp(1, Self::MAX_COUNT) as u32);
        let mean = if self.count() == 0 {
            interval as f64
        } else {
            self.mean() + (interval as f64 - self.mean()) / n as f64
        };
        Stat::new(n as u8, mean)
    }
}

/// Expected lifetime of a block the user writes now, given its stat after the write
/// (count 0: first write, expected to live the scale).
pub fn write_lifetime(stat: Stat, scale: u64) -> f64 {
    if stat.count() == 0 {
        scale.max(1) as f64
    } else {
        stat.mean()
    }
}

/// Expected remaining lifetime of a block relocated `age` user writes after its last
/// write: the mean interval counting the open one, or `age` without history.
pub fn relocation_lifetime(stat: Stat, age: u64) -> f64 {
    let n = stat.count() as f64;
    if n == 0.0 {
        age.max(1) as f64
    } else {
        (n * stat.mean() + age as f64) / n
    }
}

/// Class of a block relocated `age` user writes after its last write, with `active` the
/// classes that have a stream (bit `c` = class `c`): the class of its
/// [`relocation_lifetime`], or, for a block with no interval seen that has survived
/// `p.static_age` scales, the coldest active class if that is colder.
pub fn relocation_class(stat: Stat, age: u64, scale: u64, active: u8, p: &Params) -> u8 {
    let own = class_of(relocation_lifetime(stat, age), scale, p);
    if stat.count() > 0 || (age as f64) < p.static_age * scale.max(1) as f64 {
        return own;
    }
    let coldest = (0..p.classes()).rev().find(|&c| active & (1 << c) != 0);
    coldest.map_or(own, |c| c.max(own))
}

/// Class of an expected lifetime (in user writes) around the scale `scale`.
pub fn class_of(lifetime: f64, scale: u64, p: &Params) -> u8 {
    let ratio = lifetime.max(1.0) / scale.max(1) as f64;
    let steps = (ratio.log2() / p.spacing_log2.max(0.1)).round();
    let c = p.middle() as f64 + steps;
    if c.is_nan() || c <= 0.0 {
        0
    } else {
        (c as u64).min(p.classes() as u64 - 1) as u8
    }
}

/// The lifetime class `class` stands for: its geometric centre.
pub fn class_lifetime(class: u8, scale: u64, p: &Params) -> f64 {
    let steps = class as f64 - p.middle() as f64;
    scale.max(1) as f64 * (steps * p.spacing_log2).exp2()
}

/// log2 of the mean lifetime implied if `died` of `placed` blocks died within `horizon`
/// writes, taking lifetimes as exponential: `horizon / -ln(1 - died / placed)`. Measured
/// over placements, not over deaths, so blocks that outlive the observation still count.
/// `None` if nothing died (no estimate) or nothing was placed.
pub fn implied_lifetime_log2(died: u64, placed: u64, horizon: f64) -> Option<f64> {
    if died == 0 || placed == 0 {
        return None;
    }
    let f = (died as f64 / placed as f64).min(0.999);
    Some((horizon / -(1.0 - f).ln()).log2())
}

/// Which classes get a stream of their own, from the last period's placements per class,
/// the log2 lifetime the user writes predicted into each class were measured to live
/// ([`implied_lifetime_log2`]; `None`: not measured), and the active set before (bit
/// `c` = class `c`).
///
/// A class is active if it took `activate_permille` of the placements (or
/// `deactivate_permille` and was active); then, while two neighbouring active classes
/// both have a measured lifetime and those differ by less than `min_separation_log2`
/// (the prediction does not tell their blocks apart), the one with fewer placements
/// drops out. Returns the new active set and, per class, the class whose stream it uses:
/// itself if active, else the nearest active one (the longer-lived on a tie). Never
/// returns an empty active set.
pub fn plan(
    counts: &[u64; CLASSES],
    realized: &[Option<f64>; CLASSES],
    active: u8,
    p: &Params,
) -> (u8, [u8; CLASSES]) {
    let n = p.classes() as usize;
    let total: u64 = counts[..n].iter().sum();
    let mut next = 0u8;
    for (c, &k) in counts[..n].iter().enumerate() {
        let Some(per_mille) = k.saturating_mul(1000).checked_div(total) else {
            break;
        };
        let was = active & (1 << c) != 0;
        if per_mille >= p.activate_permille || (was && per_mille >= p.deactivate_permille) {
            next |= 1 << c;
        }
    }
    if next == 0 {
        let busiest = (0..n).max_by_key(|&c| (counts[c], c)).unwrap_or(0);
        next = if total > 0 { 1 << busiest } else { active };
    }
    if next == 0 {
        next = 1 << p.middle();
    }
    loop {
        let on: Vec<usize> = (0..n).filter(|&c| next & (1 << c) != 0).collect();
        let merge = on
            .windows(2)
            .find_map(|w| match (realized[w[0]], realized[w[1]]) {
                (Some(a), Some(b)) if b - a < p.min_separation_log2 => {
                    Some(if counts[w[0]] < counts[w[1]] {
                        w[0]
                    } else {
                        w[1]
                    })
                }
                _ => None,
            });
        match merge {
            Some(c) => next &= !(1 << c),
            None => break,
        }
    }
    let mut map = [0u8; CLASSES];
    for (c, m) in map.iter_mut().enumerate() {
        *m = (0..n)
            .filter(|&a| next & (1 << a) != 0)
            .min_by_key(|&a| (a.abs_diff(c), usize::MAX - a))
            .unwrap_or(c) as u8;
    }
    (next, map)
}

#[cfg(test)]
mod tests;
