//! Seeded synthetic workloads: the same name and seed give the same ops.
//!
//! Every workload first fills its `logical` blocks sequentially, then overwrites them:
//! - `uniform`: every block equally likely;
//! - `zipf:S`: block popularity follows Zipf with exponent S (ranks scattered over LBAs);
//! - `fio-zipf:S`: the same ranks placed the way fio places them (`random_distribution=zipf`):
//!   rank r goes to block `(r x 0x61C8864680B583EB mod 2^64) mod blocks`, which is not a
//!   permutation, so several ranks share a block and some blocks are never overwritten
//!   (about 22% of them at 8 GB of 4 KiB blocks). Traces made with fio, such as the MiDAS
//!   evaluation's, have that shape;
//! - `hotcold:W/D`: W% of the writes go to D% of the blocks (the rest to the others);
//! - `seqmix`: half sequential runs of 64 blocks from random starts, half uniform.

use crate::trace::TraceOp;
use crate::Error;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// A parsed workload name.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    Uniform,
    Zipf(f64),
    /// Zipf with fio's rank -> block hash instead of a permutation.
    FioZipf(f64),
    HotCold {
        writes_pct: f64,
        data_pct: f64,
    },
    SeqMix,
}

impl std::str::FromStr for Workload {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |m: &str| Error::Workload(s.to_string(), m.to_string());
        if s == "uniform" {
            return Ok(Workload::Uniform);
        }
        if s == "seqmix" {
            return Ok(Workload::SeqMix);
        }
        for (prefix, fio) in [("zipf:", false), ("fio-zipf:", true)] {
            if let Some(t) = s.strip_prefix(prefix) {
                let theta: f64 = t
                    .parse()
                    .map_err(|_| bad(&format!("{prefix}S needs a number, e.g. {prefix}0.99")))?;
                if !(theta > 0.0 && theta < 5.0) {
                    return Err(bad("zipf exponent must be in (0, 5)"));
                }
                return Ok(if fio {
                    Workload::FioZipf(theta)
                } else {
                    Workload::Zipf(theta)
                });
            }
        }
        if let Some(t) = s.strip_prefix("hotcold:") {
            let (w, d) = t
                .split_once('/')
                .ok_or_else(|| bad("hotcold:W/D, e.g. hotcold:90/10"))?;
            let w: f64 = w.parse().map_err(|_| bad("W is not a number"))?;
            let d: f64 = d.parse().map_err(|_| bad("D is not a number"))?;
            if !(0.0 < w && w < 100.0 && 0.0 < d && d < 100.0) {
                return Err(bad(
                    "W and D must be percentages strictly between 0 and 100",
                ));
            }
            return Ok(Workload::HotCold {
                writes_pct: w,
                data_pct: d,
            });
        }
        Err(bad(
            "unknown workload (uniform, zipf:S, fio-zipf:S, hotcold:W/D, seqmix)",
        ))
    }
}

/// fio's rank scrambler (`__hash_u64` in fio's `hash.h`, used by `zipf_next`).
const FIO_GOLDEN_RATIO_64: u64 = 0x61C8_8646_80B5_83EB;

/// The seeded generator and the rank -> LBA map both functions below start from: a seeded
/// permutation, or for `fio-zipf` fio's hash (the generator is shuffled the same way in
/// both cases, so the draws that follow do not depend on the map).
fn layout_of(w: &Workload, logical: u64, seed: u64) -> (SmallRng, Vec<u64>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut perm: Vec<u64> = (0..logical).collect();
    perm.shuffle(&mut rng);
    if let Workload::FioZipf(_) = w {
        for (r, lba) in perm.iter_mut().enumerate() {
            *lba = (r as u64).wrapping_mul(FIO_GOLDEN_RATIO_64) % logical;
        }
    }
    (rng, perm)
}

#[cfg(test)]
fn layout(logical: u64, seed: u64) -> (SmallRng, Vec<u64>) {
    layout_of(&Workload::Uniform, logical, seed)
}

/// Hot blocks of `hotcold:W/D` over `logical` blocks: at least one, and at least one
/// cold block when there are two; one block is all hot (it was `clamp(1, 0)`, a panic;
/// found by review, 2026-11-29).
fn hot_blocks(logical: u64, data_pct: f64) -> u64 {
    if logical < 2 {
        return logical;
    }
    ((logical as f64 * data_pct / 100.0) as u64).clamp(1, logical - 1)
}

/// The probability that an overwrite of [`generate`] (same workload, size and seed) hits
/// each LBA: the workload's true write rate per block, which a trace does not show.
/// `seqmix` is taken as uniform (its runs start at uniform positions).
pub fn write_probabilities(w: &Workload, logical: u64, seed: u64) -> Vec<f64> {
    let (_, perm) = layout_of(w, logical, seed);
    let mut p = vec![1.0 / logical as f64; logical as usize];
    match w {
        Workload::Uniform | Workload::SeqMix => {}
        Workload::Zipf(theta) | Workload::FioZipf(theta) => {
            let weight = |r: u64| 1.0 / (r as f64).powf(*theta);
            let total: f64 = (1..=logical).map(weight).sum();
            // Ranks sharing a block (fio's hash) add up.
            p.iter_mut().for_each(|x| *x = 0.0);
            for (r, &lba) in perm.iter().enumerate() {
                p[lba as usize] += weight(r as u64 + 1) / total;
            }
        }
        Workload::HotCold {
            writes_pct,
            data_pct,
        } => {
            let hot = hot_blocks(logical, *data_pct);
            // With no cold block the hot ones take every write.
            let hot_share = if hot < logical {
                writes_pct / 100.0
            } else {
                1.0
            };
            for (i, &lba) in perm.iter().enumerate() {
                p[lba as usize] = if (i as u64) < hot {
                    hot_share / hot as f64
                } else {
                    (1.0 - writes_pct / 100.0) / (logical - hot) as f64
                };
            }
        }
    }
    p
}

/// Draws single-block overwrite LBAs of a workload: shared (immutable) by any number of
/// threads, each with its own generator. `seqmix`, whose runs carry state from one draw to
/// the next, has none.
#[derive(Debug, Clone)]
pub struct Sampler {
    kind: Kind,
    logical: u64,
    /// Rank -> LBA (ranks are what the distribution draws).
    perm: Vec<u64>,
}

#[derive(Debug, Clone)]
enum Kind {
    Uniform,
    /// Uniform over the LBAs in `perm` (a list given, [`Sampler::of_list`]).
    List,
    /// Cumulative rank weights of Zipf; the last one is the total.
    Zipf(Vec<f64>),
    HotCold {
        writes_pct: f64,
        hot: u64,
    },
}

impl Sampler {
    /// The sampler of `w` over `logical` blocks; the rank layout comes from `seed` (as in
    /// [`generate`]). `None` for `seqmix`.
    pub fn new(w: &Workload, logical: u64, seed: u64) -> Option<Sampler> {
        Self::from_layout(w, logical, layout_of(w, logical, seed).1)
    }

    /// Uniform over `lbas` (say, the blocks a benchmark wrote: reads of unwritten blocks
    /// never reach the device). `None` when `lbas` is empty.
    pub fn of_list(lbas: Vec<u64>) -> Option<Sampler> {
        if lbas.is_empty() {
            return None;
        }
        Some(Sampler {
            kind: Kind::List,
            logical: lbas.len() as u64,
            perm: lbas,
        })
    }

    fn from_layout(w: &Workload, logical: u64, perm: Vec<u64>) -> Option<Sampler> {
        let kind = match w {
            Workload::Uniform => Kind::Uniform,
            Workload::Zipf(theta) | Workload::FioZipf(theta) => {
                let mut cdf = Vec::with_capacity(logical as usize);
                let mut acc = 0.0;
                for r in 1..=logical {
                    acc += 1.0 / (r as f64).powf(*theta);
                    cdf.push(acc);
                }
                Kind::Zipf(cdf)
            }
            Workload::HotCold {
                writes_pct,
                data_pct,
            } => Kind::HotCold {
                writes_pct: *writes_pct,
                hot: hot_blocks(logical, *data_pct),
            },
            Workload::SeqMix => return None,
        };
        Some(Sampler {
            kind,
            logical,
            perm,
        })
    }

    /// One overwrite's LBA.
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        match &self.kind {
            Kind::Uniform => rng.gen_range(0..self.logical),
            Kind::List => self.perm[rng.gen_range(0..self.perm.len())],
            Kind::Zipf(cdf) => {
                // Inverse-CDF sampling over the ranks; rank r lives at perm[r].
                let total = cdf.last().copied().unwrap_or(0.0);
                let x = rng.gen::<f64>() * total;
                let r = cdf
                    .partition_point(|&c| c < x)
                    .min(self.logical as usize - 1);
                self.perm[r]
            }
            Kind::HotCold { writes_pct, hot } => {
                let i = if *hot >= self.logical || rng.gen::<f64>() * 100.0 < *writes_pct {
                    rng.gen_range(0..*hot)
                } else {
                    rng.gen_range(*hot..self.logical)
                };
                self.perm[i as usize]
            }
        }
    }
}

/// Generates the fill plus `overwrites` single-block writes over `logical` blocks.
pub fn generate(w: &Workload, logical: u64, overwrites: u64, seed: u64) -> Vec<TraceOp> {
    let (mut rng, perm) = layout_of(w, logical, seed);
    let mut ops: Vec<TraceOp> = (0..logical)
        .map(|lba| TraceOp::Write { lba, blocks: 1 })
        .collect();
    ops.reserve(overwrites as usize);
    if let Workload::SeqMix = w {
        let mut left = overwrites;
        while left > 0 {
            if rng.gen_bool(0.5) {
                let start = rng.gen_range(0..logical);
                let run = 64.min(left).min(logical - start);
                for k in 0..run {
                    ops.push(TraceOp::Write {
                        lba: start + k,
                        blocks: 1,
                    });
                }
                left -= run;
            } else {
                ops.push(TraceOp::Write {
                    lba: rng.gen_range(0..logical),
                    blocks: 1,
                });
                left -= 1;
            }
        }
        return ops;
    }
    let Some(sampler) = Sampler::from_layout(w, logical, perm) else {
        return ops;
    };
    for _ in 0..overwrites {
        ops.push(TraceOp::Write {
            lba: sampler.sample(&mut rng),
            blocks: 1,
        });
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data set of one block (`--capacity 8K` at 80%) replays every workload: hotcold
    /// panicked in `clamp(1, 0)`.
    #[test]
    fn a_one_block_data_set_replays_every_workload() {
        for w in ["uniform", "zipf:1.0", "hotcold:90/10", "seqmix"] {
            let w: Workload = w.parse().unwrap();
            let ops = generate(&w, 1, 5, 1);
            assert_eq!(ops.len(), 6, "{w:?}");
            assert!(ops.iter().all(|o| o.range() == (0, 1)), "{w:?}");
            let p = write_probabilities(&w, 1, 1);
            assert!((p[0] - 1.0).abs() < 1e-9, "{w:?}: {p:?}");
        }
        // Two blocks: one hot, one cold, the split as asked.
        let w: Workload = "hotcold:90/10".parse().unwrap();
        let mut p = write_probabilities(&w, 2, 1);
        p.sort_by(f64::total_cmp);
        assert!(
            (p[0] - 0.1).abs() < 1e-9 && (p[1] - 0.9).abs() < 1e-9,
            "{p:?}"
        );
    }

    #[test]
    fn names_parse_and_errors_explain() {
        assert_eq!(
            "zipf:0.99".parse::<Workload>().unwrap(),
            Workload::Zipf(0.99)
        );
        assert_eq!(
            "hotcold:90/10".parse::<Workload>().unwrap(),
            Workload::HotCold {
                writes_pct: 90.0,
                data_pct: 10.0
            }
        );
        assert!("hotcold:90".parse::<Workload>().is_err());
        assert!("zipf:x".parse::<Workload>().is_err());
        let e = "fio-zipf:x".parse::<Workload>().unwrap_err().to_string();
        assert!(
            e.contains("fio-zipf:0.99"),
            "the error names its own form: {e}"
        );
        assert!("random".parse::<Workload>().is_err());
    }

    #[test]
    fn a_list_sampler_draws_only_the_listed_lbas() {
        assert!(Sampler::of_list(Vec::new()).is_none());
        let s = Sampler::of_list(vec![7, 1 << 40, 3]).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            seen.insert(s.sample(&mut rng));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![3, 7, 1 << 40]);
    }

    #[test]
    fn seeded_and_skewed() {
        let w = Workload::HotCold {
            writes_pct: 90.0,
            data_pct: 10.0,
        };
        let a = generate(&w, 1000, 10_000, 1);
        assert_eq!(a, generate(&w, 1000, 10_000, 1));
        assert_ne!(a, generate(&w, 1000, 10_000, 2));
        // The hottest 10% of blocks take about 90% of the overwrites.
        let mut counts = vec![0u64; 1000];
        for op in &a[1000..] {
            counts[op.range().0 as usize] += 1;
        }
        counts.sort_unstable_by(|x, y| y.cmp(x));
        let top: u64 = counts[..100].iter().sum();
        assert!((8500..=9500).contains(&top), "{top}");
        let z = generate(&Workload::Zipf(0.99), 1000, 10_000, 1);
        assert!(z.iter().all(|o| o.range().0 < 1000));
    }

    /// A sampler drawn with the generator `generate` continues with writes exactly what
    /// `generate` writes (the benchmarks' threads and the replays share one layout).
    #[test]
    fn the_sampler_draws_what_generate_writes() {
        for w in [
            Workload::Zipf(0.9),
            Workload::FioZipf(0.9),
            Workload::HotCold {
                writes_pct: 90.0,
                data_pct: 10.0,
            },
            Workload::Uniform,
        ] {
            let ops = generate(&w, 500, 2000, 3);
            let sampler = Sampler::new(&w, 500, 3).expect("single-block workload");
            let (mut rng, _) = layout(500, 3);
            for op in &ops[500..] {
                assert_eq!(op.range().0, sampler.sample(&mut rng), "{w:?}");
            }
        }
        assert!(Sampler::new(&Workload::SeqMix, 500, 3).is_none());
    }

    /// The probabilities match the generated frequencies (so the layout is the same).
    #[test]
    fn probabilities_match_the_ops() {
        for w in [
            Workload::Zipf(0.99),
            Workload::FioZipf(0.99),
            Workload::HotCold {
                writes_pct: 80.0,
                data_pct: 20.0,
            },
            Workload::Uniform,
        ] {
            let n = 200_000u64;
            let ops = generate(&w, 1000, n, 7);
            let p = write_probabilities(&w, 1000, 7);
            assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{w:?}");
            let mut counts = vec![0f64; 1000];
            for op in &ops[1000..] {
                counts[op.range().0 as usize] += 1.0;
            }
            // The most popular LBA by probability is among the most written ones, and
            // the heaviest 10% by probability take their share of the writes.
            let mut by_p: Vec<usize> = (0..1000).collect();
            by_p.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let expected: f64 = by_p[..100].iter().map(|&l| p[l]).sum();
            let seen: f64 = by_p[..100].iter().map(|&l| counts[l]).sum::<f64>() / n as f64;
            assert!(
                (seen - expected).abs() < 0.01,
                "{w:?}: {seen} vs {expected}"
            );
        }
    }

    /// `fio-zipf` puts rank r where fio's `zipf_next` does, `(r x golden) mod blocks`; at
    /// 1000 blocks that reaches 308 of them (a figure computed apart, with numpy), and the
    /// rest are only ever written by the fill.
    #[test]
    fn fio_zipf_places_ranks_with_fios_hash() {
        let w: Workload = "fio-zipf:1.0".parse().unwrap();
        assert_eq!(w, Workload::FioZipf(1.0));
        let (_, map) = layout_of(&w, 1000, 5);
        assert_eq!(&map[..2], &[0, 131]);
        let p = write_probabilities(&w, 1000, 5);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert_eq!(p.iter().filter(|&&x| x > 0.0).count(), 308);
        let ops = generate(&w, 1000, 20_000, 5);
        let mut written = vec![false; 1000];
        for op in &ops[1000..] {
            written[op.range().0 as usize] = true;
        }
        for (lba, &x) in p.iter().enumerate() {
            assert!(
                !written[lba] || x > 0.0,
                "block {lba} has no rank but was drawn"
            );
        }
        // The zipf of the same size is a permutation: every block has a rank.
        let z = write_probabilities(&Workload::Zipf(1.0), 1000, 5);
        assert!(z.iter().all(|&x| x > 0.0));
    }
}
