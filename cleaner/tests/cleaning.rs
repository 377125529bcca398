//! The cleaner against the reference model: slices, preemption, crashes, full devices.

use cleaner::{Budget, Cleaner, CleanerConfig, Policy, SliceEnd};
use ftl::device::crash::CrashDevice;
use ftl::index::mem::MemIndex;
use ftl::model::tiny::{self, CrashFtl};
use ftl::model::{block_for, check_after_crash, check_read, checker, mem_ftl, Model};
use ftl::{BlockDevice, FormatOptions, Ftl, IndexStore, StreamId};
use proptest::prelude::*;
use std::sync::Arc;

/// The tiny crash device and index, formatted, and the FTL open on them.
fn formatted_and_open() -> (Arc<CrashDevice>, Arc<MemIndex>, Arc<CrashFtl>) {
    let (dev, idx, f) = tiny::crash_ftl();
    (dev, idx, Arc::new(f))
}

fn open(dev: &Arc<CrashDevice>, idx: &Arc<MemIndex>) -> Arc<CrashFtl> {
    Arc::new(tiny::open(dev, idx).unwrap())
}

/// Every map entry points into a segment that is not free, and each segment's live
/// count equals the entries pointing into it.
fn check_invariants<D: BlockDevice, I: IndexStore>(f: &Ftl<D, I>) -> Result<(), String> {
    let snap = f.segment_snapshot();
    let mut counts = vec![0u32; snap.len()];
    for lba in 0..f.capacity_blocks() {
        if let Some(p) = f.map_entry(lba).unwrap().pba() {
            let s = f.geometry().segment_of(p as u64) as usize;
            if snap[s].state == "free" {
                return Err(format!("lba {lba} maps into free segment {s}"));
            }
            counts[s] += 1;
        }
    }
    for s in &snap {
        if counts[s.segment as usize] != s.valid {
            return Err(format!(
                "segment {} counts {} live but the map has {}",
                s.segment, s.valid, counts[s.segment as usize]
            ));
        }
    }
    Ok(())
}

/// Writes one block, cleaning (whole victims, then a checkpoint) whenever the log is full.
fn write_cleaning(
    f: &CrashFtl,
    c: &mut Cleaner<Arc<CrashDevice>, Arc<MemIndex>>,
    lba: u64,
    data: &[u8],
    fua: bool,
) -> Result<(), String> {
    for _ in 0..64 {
        match f.write(lba, data, fua, StreamId(1)) {
            Ok(()) => return Ok(()),
            Err(ftl::Error::NoSpace) => {
                // Whatever the slice freed (or found nothing to clean), the checkpoint
                // below makes the dead segments free; the write is then retried.
                c.run_slice(Policy::Greedy, Budget::unbounded(), &|| false)
                    .map_err(|e| e.to_string())?;
                f.checkpoint().map_err(|e| e.to_string())?;
            }
            Err(e) => return Err(format!("write {lba}: {e}")),
        }
    }
    Err(format!("write {lba}: no space even after cleaning"))
}

#[derive(Debug, Clone)]
enum Op {
    Write { lba: u64, fua: bool },
    Read { lba: u64 },
    Trim { lba: u64, blocks: u64 },
    Flush,
    Checkpoint,
    Slice { blocks: usize, policy: u8 },
    PreemptedSlice,
    Crash { seed: u64 },
}

fn op(span: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..span, prop::bool::weighted(0.1)).prop_map(|(lba, fua)| Op::Write { lba, fua }),
        3 => (0..span).prop_map(|lba| Op::Read { lba }),
        1 => (0..span, 1..8u64).prop_map(move |(lba, b)| Op::Trim { lba, blocks: b.min(span - lba) }),
        1 => Just(Op::Flush),
        1 => Just(Op::Checkpoint),
        2 => (1..20usize, 0..3u8).prop_map(|(blocks, policy)| Op::Slice { blocks, policy }),
        1 => Just(Op::PreemptedSlice),
        1 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
    ]
}

fn policy(p: u8) -> Policy {
    [Policy::Greedy, Policy::CostBenefit, Policy::CostHotness][p as usize % 3]
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (dev, idx, mut f) = formatted_and_open();
    let span = (f.capacity_blocks() * 9 / 10).max(1);
    let mut c = Cleaner::new(f.clone());
    let mut m = Model::new();
    let fail = |step: usize, e: String| TestCaseError::fail(format!("step {step}: {e}"));
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Write { lba, fua } => {
                let lba = lba % span;
                let data = m.write(lba, 1);
                write_cleaning(&f, &mut c, lba, &data, fua).map_err(|e| fail(step, e))?;
                if fua {
                    m.fua_completed(lba, 1);
                }
            }
            Op::Read { lba } => check_read(&f, &m, lba % span, 1).map_err(|e| fail(step, e))?,
            Op::Trim { lba, blocks } => {
                let lba = lba % span;
                let blocks = blocks.min(span - lba);
                f.trim(lba, blocks).map_err(|e| fail(step, e.to_string()))?;
                m.trim(lba, blocks);
            }
            Op::Flush => {
                f.flush().map_err(|e| fail(step, e.to_string()))?;
                m.flush();
            }
            Op::Checkpoint => {
                f.checkpoint().map_err(|e| fail(step, e.to_string()))?;
                check_invariants(&f).map_err(|e| fail(step, e))?;
            }
            Op::Slice { blocks, policy: p } => {
                c.run_slice(policy(p), Budget::blocks(blocks), &|| false)
                    .map_err(|e| fail(step, e.to_string()))?;
            }
            Op::PreemptedSlice => {
                c.run_slice(Policy::Greedy, Budget::blocks(1), &|| true)
                    .map_err(|e| fail(step, e.to_string()))?;
            }
            Op::Crash { seed } => {
                drop(c);
                drop(f);
                dev.crash(seed).unwrap();
                checker(&dev, &idx).map_err(|e| fail(step, e))?;
                f = open(&dev, &idx);
                c = Cleaner::new(f.clone());
                check_after_crash(&f, &mut m).map_err(|e| fail(step, e))?;
                check_invariants(&f).map_err(|e| fail(step, e))?;
            }
        }
    }
    for lba in 0..span {
        check_read(&f, &m, lba, 1).map_err(|e| TestCaseError::fail(format!("final: {e}")))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn cleaning_never_loses_or_resurrects_data(ops in prop::collection::vec(op(1000), 1..400)) {
        run(ops)?;
    }
}

#[test]
fn preempted_cleaning_resumes_where_it_stopped_and_finishes() {
    let (dev, _idx, f) = formatted_and_open();
    // Fill several segments, then overwrite every other block so victims are half live.
    for lba in 0..120 {
        f.write(lba, &block_for(lba, 1), false, StreamId(1))
            .unwrap();
    }
    for lba in (0..120).step_by(2) {
        f.write(lba, &block_for(lba, 2), false, StreamId(1))
            .unwrap();
    }
    f.flush().unwrap();
    let mut c = Cleaner::new(f.clone());
    let end = c
        .run_slice(Policy::Greedy, Budget::blocks(2), &|| true)
        .unwrap();
    let SliceEnd::Preempted { victim, moved } = end else {
        panic!("expected a preemption, got {end:?}")
    };
    assert_eq!(moved, 2);
    assert_eq!(c.current_victim(), Some(victim));
    // A user write lands on one of the victim's live blocks meanwhile.
    let live = f.live_blocks(victim).unwrap();
    let hit = live.last().unwrap().lba;
    f.write(hit, &block_for(hit, 99), false, StreamId(1))
        .unwrap();
    let mut slices = 1;
    loop {
        match c
            .run_slice(Policy::Greedy, Budget::blocks(2), &|| true)
            .unwrap()
        {
            SliceEnd::Preempted { victim: v, .. } => {
                assert_eq!(v, victim, "resumes the same victim")
            }
            SliceEnd::Finished { victim: v, .. } => {
                assert_eq!(v, victim);
                break;
            }
            SliceEnd::NoVictim => panic!("lost its victim"),
        }
        slices += 1;
        assert!(slices < 100);
    }
    assert_eq!(
        f.segment_valid(victim),
        0,
        "nothing live left in the victim"
    );
    assert!(c.stats.preemptions >= 2);
    assert!(
        c.stats.blocks_skipped >= 1,
        "the overwritten block was not moved"
    );
    let mut b = vec![0u8; 4096];
    f.read(hit, &mut b).unwrap();
    assert_eq!(
        b,
        block_for(hit, 99),
        "the user's write won over the relocation"
    );
    for lba in 0..120 {
        f.read(lba, &mut b).unwrap();
        let want = if lba == hit {
            99
        } else if lba % 2 == 0 {
            2
        } else {
            1
        };
        assert_eq!(b, block_for(lba, want), "lba {lba}");
    }
    // The cleaned victim is freed (and discarded) only through a checkpoint.
    let discarded = dev.discarded_bytes();
    f.checkpoint().unwrap();
    assert!(dev.discarded_bytes() > discarded);
    check_invariants(&f).unwrap();
}

#[test]
fn full_device_overwritten_at_random_keeps_running_with_the_background_cleaner() {
    // 100% logically full, then uniform random overwrites for 4x the capacity from two
    // writers while the cleaning thread runs: no write may fail, nothing may be lost.
    let opts = FormatOptions {
        segment_bytes: Some(1 << 20),
        ..Default::default()
    };
    let f = Arc::new(mem_ftl(64 << 20, &opts).2);
    let cap = f.capacity_blocks();
    for lba in 0..cap {
        f.write(lba, &block_for(lba, 1), false, StreamId(1))
            .unwrap();
    }
    let handle = cleaner::spawn(f.clone(), CleanerConfig::default()).unwrap();
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                use rand::{Rng, SeedableRng};
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                let mut last = std::collections::HashMap::new();
                for i in 0..2 * cap {
                    // Each writer owns the LBAs of its parity, so the final state is known.
                    let lba = (rng.gen_range(0..cap / 2) * 2 + t).min(cap - 1);
                    f.write(lba, &block_for(lba, 10 + i), false, StreamId(1))
                        .unwrap();
                    last.insert(lba, 10 + i);
                }
                last
            })
        })
        .collect();
    let mut expect = std::collections::HashMap::new();
    for w in writers {
        expect.extend(w.join().unwrap());
    }
    let stats = handle.stats();
    handle.stop();
    assert!(stats.cleaner.segments_cleaned > 0, "{stats:?}");
    let mut b = vec![0u8; 4096];
    for lba in 0..cap {
        f.read(lba, &mut b).unwrap();
        let want = expect.get(&lba).copied().unwrap_or(1);
        assert_eq!(b, block_for(lba, want), "lba {lba}");
    }
    let s = f.stats();
    assert!(s.waf > 1.0, "cleaning copied blocks: WAF {}", s.waf);
    check_invariants(&f).unwrap();
}

/// Read-driven defragmentation as the runner schedules it: while large reads keep coming
/// (a scan) it rewrites queued windows, but at most one turn of `DEFRAG_WINDOWS_PER_TURN`
/// per `DEFRAG_SCAN_INTERVAL`; once the readers stop it drains the queue; and the readers,
/// checking every block while windows move under them, never see a wrong one.
#[test]
fn defragmentation_is_paced_under_reads_and_drains_when_idle() {
    use cleaner::trigger::{DEFRAG_SCAN_INTERVAL, DEFRAG_WINDOWS_PER_TURN};
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    const REGION: u64 = 32768;
    const WINDOW: u64 = 32;
    let f = Arc::new(mem_ftl(256 << 20, &FormatOptions::default()).2);
    let data: Vec<u8> = (0..REGION).flat_map(|l| block_for(l, 1)).collect();
    f.write(0, &data, false, StreamId(1)).unwrap();
    // A quarter overwritten at random in another stream: every window scattered.
    let mut gens = vec![1u64; REGION as usize];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    for i in 0..REGION / 4 {
        let l = rng.gen_range(0..REGION);
        gens[l as usize] = 10 + i;
        f.write(l, &block_for(l, 10 + i), false, StreamId(2))
            .unwrap();
    }
    f.flush().unwrap();
    let before = f.fragmentation(0, REGION, WINDOW).unwrap();
    assert!(before.reads_per_window() > 4.0, "{before:?}");
    let gens = Arc::new(gens);
    let cfg = CleanerConfig {
        // Readers starved of a CPU for a moment must not look idle.
        idle_gap: Duration::from_millis(200),
        ..CleanerConfig::default()
    };
    let handle = cleaner::spawn(f.clone(), cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (f, stop, gens) = (f.clone(), stop.clone(), gens.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; WINDOW as usize * 4096];
                let mut w = t * WINDOW;
                // Every reader reads each of its windows at least once (a slow build
                // covered a fraction of the region in the first 300 ms, and the windows
                // never read stayed scattered), then goes on until told to stop.
                let mut reads = 0;
                while reads < REGION / (2 * WINDOW) || !stop.load(Ordering::SeqCst) {
                    reads += 1;
                    f.read(w, &mut b).unwrap();
                    for (k, blk) in b.chunks(4096).enumerate() {
                        let l = w + k as u64;
                        assert!(
                            blk == block_for(l, gens[l as usize]).as_slice(),
                            "block {l} read back wrong while windows moved"
                        );
                    }
                    w = (w + 2 * WINDOW) % REGION;
                }
            })
        })
        .collect();
    std::thread::sleep(DEFRAG_SCAN_INTERVAL + Duration::from_millis(300));
    let busy = handle.stats().defrag_windows;
    let elapsed = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    // Large reads keep coming (a scan): one turn per scan interval (and slack for a turn
    // or two the runner may take while both readers wait for a CPU).
    let turns = 2 + (elapsed.as_millis() / DEFRAG_SCAN_INTERVAL.as_millis()) as u64;
    assert!(busy > 0, "no window rewritten in {elapsed:?} of reads");
    assert!(
        busy <= turns * DEFRAG_WINDOWS_PER_TURN as u64,
        "{busy} windows rewritten in {elapsed:?} of reads: not paced"
    );
    let t = Instant::now();
    while f.defrag_waiting() > 0 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(f.defrag_waiting(), 0, "the queue did not drain once idle");
    handle.stop();
    let after = f.fragmentation(0, REGION, WINDOW).unwrap();
    assert!(after.reads_per_window() < 1.5, "{after:?}");
    let mut b = vec![0u8; 4096];
    for l in 0..REGION {
        f.read(l, &mut b).unwrap();
        assert_eq!(b, block_for(l, gens[l as usize]), "lba {l}");
    }
}

/// Idle cleaning stops at `max_background_utilization` also when the emptiest victim is
/// one the cleaner left after a failure (a block that fails its checksum): the check of
/// whether idle cleaning is worth it ranked that victim first, and the slice then took
/// the next one however full, so an idle device was cleaned down to segments of one dead
/// block.
#[test]
fn idle_cleaning_passed_a_shunned_victim_takes_none_over_the_limit() {
    let opts = FormatOptions {
        segment_bytes: Some(1 << 20),
        ..Default::default()
    };
    let (dev, _, f) = mem_ftl(64 << 20, &opts);
    let f = Arc::new(f);
    let cap = f.capacity_blocks();
    let geo = f.geometry();
    let bps = geo.blocks_per_segment() as u64;
    for lba in 0..cap {
        f.write(lba, &block_for(lba, 1), false, StreamId(1))
            .unwrap();
    }
    let seg_of = |lba: u64| {
        let p = f.map_entry(lba).unwrap().pba().unwrap();
        geo.segment_of(p as u64)
    };
    // Segment X: all but one block overwritten. Every other segment: one block in 16.
    let x = seg_of(0);
    let mut kept = None;
    for lba in 0..cap {
        let s = seg_of(lba);
        let overwrite = if s == x {
            if kept.is_none() {
                kept = Some(lba);
                false
            } else {
                true
            }
        } else {
            lba % 16 == 0
        };
        if overwrite {
            f.write(lba, &block_for(lba, 2), false, StreamId(1))
                .unwrap();
        }
    }
    f.checkpoint().unwrap();
    // The block X keeps, damaged on the device: cleaning X fails, and X is shunned.
    let kept = kept.unwrap();
    let p = f.map_entry(kept).unwrap().pba().unwrap() as u64;
    dev.write_at(p * 4096, &[0x5A; 4096]).unwrap();
    let snap = f.segment_snapshot();
    let cap_data = cleaner::policy::data_capacity(bps as u32) as f64;
    let fullest_below: Vec<_> = snap
        .iter()
        .filter(|s| s.state == "closed" && s.segment != x && s.segment != 0)
        .filter(|s| s.valid as f64 / cap_data <= 0.9)
        .map(|s| s.segment)
        .collect();
    assert!(
        fullest_below.is_empty(),
        "segments at most 90% live: {fullest_below:?}"
    );
    let handle = cleaner::spawn(f.clone(), CleanerConfig::default()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let stats = handle.stats();
    handle.stop();
    assert!(
        stats.cleaner.victims_abandoned >= 1,
        "X was tried: {stats:?}"
    );
    assert_eq!(
        stats.cleaner.blocks_copied, 0,
        "idle cleaning took victims over 90% live: {stats:?}"
    );
}
