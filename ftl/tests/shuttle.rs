//! Deterministic schedule exploration of the engine's synchronization with [shuttle]:
//! the real `Ftl` (built with `--features shuttle`, so its locks, condition variables and
//! atomics are shuttle's) runs under randomized, replayable thread schedules.
//!
//! Run: `cargo test -p ftl --features shuttle --test shuttle --release`.
//! `FTL_SHUTTLE_ITERATIONS` sets the schedules per test (default 300); a failure prints
//! the schedule, which `shuttle::replay` reproduces.
#![cfg(feature = "shuttle")]

mod common;

use common::{tiny_crash, CrashFtl};
use ftl::device::crash::CrashDevice;
use ftl::index::mem::MemIndex;
use ftl::model::{block_for, Crash};
use ftl::sched::{Scenario, Step};
use ftl::StreamId;
use shuttle::scheduler::PctScheduler;
use shuttle::thread;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn iterations() -> usize {
    std::env::var("FTL_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

/// Runs `f` under `iterations` PCT schedules of depth 3 (bugs that need up to three
/// ordering constraints between threads are found with good probability).
fn explore(f: impl Fn() + Send + Sync + 'static) {
    let mut cfg = shuttle::Config::new();
    cfg.stack_size = 1 << 20;
    cfg.max_steps = shuttle::MaxSteps::FailAfter(20_000_000);
    let runner = shuttle::Runner::new(PctScheduler::new(3, iterations()), cfg);
    runner.run(f);
}

fn open_tiny() -> (Arc<CrashDevice>, Arc<MemIndex>, Arc<CrashFtl>) {
    let (dev, idx, f) = tiny_crash();
    (dev, idx, Arc::new(f))
}

/// Engine rule 4 (`write_chunk_io`): a failed chunk write poisons the FTL BEFORE the
/// tracker learns the chunk is done, so no FLUSH (or checkpoint) waiting for that chunk
/// can sync and acknowledge writes that never reached the device.
#[test]
fn a_failed_chunk_write_is_never_covered_by_a_flush() {
    explore(|| {
        let (dev, _idx, f) = open_tiny();
        dev.faults.writes.store(true, Ordering::SeqCst);
        let stream = StreamId(1);
        // X writes one block (buffered in the open chunk), then flushes: the flush covers
        // it, so it may return Ok only if that block reached the device, which no write
        // does here.
        let x = {
            let f = f.clone();
            thread::spawn(move || {
                f.write(1, &block_for(1, 1), false, stream)?;
                f.flush()
            })
        };
        // W closes the stream: it seals the open chunk (holding X's block, if X wrote
        // first) and writes it, which fails; X's flush then finds nothing open and waits
        // for W's chunk.
        let w = {
            let f = f.clone();
            thread::spawn(move || {
                let _ = f.close_stream(stream);
            })
        };
        let flushed = x.join().unwrap();
        w.join().unwrap();
        assert!(
            flushed.is_err(),
            "a FLUSH returned Ok although the chunk holding the write it covers failed"
        );
    });
}

/// Scenarios drawn from `seed`: 2..=4 script threads of 3..=16 steps each.
fn scenario(seed: u64, crash: Crash) -> Scenario {
    use rand::{Rng, SeedableRng};
    let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
    let threads = r.gen_range(2..=4);
    let step = |r: &mut rand::rngs::SmallRng| match r.gen_range(0..100) {
        0..=39 => Step::Write {
            lba: r.gen(),
            blocks: r.gen(),
            fua: r.gen_bool(0.3),
            stream: r.gen(),
        },
        40..=49 => Step::Trim {
            lba: r.gen(),
            blocks: r.gen(),
        },
        50..=64 => Step::Flush,
        65..=74 => Step::Read { lba: r.gen() },
        75..=84 => Step::Checkpoint,
        85..=91 => Step::CloseStream { stream: r.gen() },
        _ => Step::Clean { max: r.gen() },
    };
    Scenario {
        threads: (0..threads)
            .map(|_| (0..r.gen_range(3..=16)).map(|_| step(&mut r)).collect())
            .collect(),
        crash,
        seed,
        prefill: r.gen_bool(0.7),
    }
}

/// Every ordering between threads, explored: random scenarios, each under its own PCT
/// schedules, crashed where the scheduler runs the crasher; checked by the checker and
/// the history.
fn explore_scenarios(crash: Crash) {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    explore(move || {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let s = scenario(i, crash);
        if let Err(e) = ftl::sched::run(&s) {
            panic!("scenario {i}: {e}\n{s:#?}");
        }
    });
}

#[test]
fn power_cuts_at_any_schedule_point_lose_nothing_acknowledged() {
    explore_scenarios(Crash::PowerCut);
}

#[test]
fn process_deaths_at_any_schedule_point_lose_no_completed_write() {
    explore_scenarios(Crash::ProcessDeath);
}
