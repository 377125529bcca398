//! Model-based property test: random sequences of write / read / trim / flush / FUA write /
//! checkpoint / closing a stream's open segment / crash + reopen on the crash-simulating
//! device / death of the process (staging area kept) + reopen, against the reference model.

mod common;

use common::*;
use ftl::model::Model;
use ftl::{Config, Ftl, StreamId};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Write {
        lba: u64,
        blocks: u64,
        fua: bool,
        stream: u8,
    },
    Read {
        lba: u64,
    },
    Trim {
        lba: u64,
        blocks: u64,
    },
    Flush,
    Checkpoint,
    CloseStream {
        stream: u8,
    },
    Crash {
        seed: u64,
    },
    /// The process dies: the device keeps every completed write, the staging area lives.
    Kill,
}

fn op(cap: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..cap, 1..6u64, prop::bool::weighted(0.15), 0..3u8)
            .prop_map(move |(lba, b, fua, stream)| Op::Write { lba, blocks: b.min(cap - lba), fua, stream }),
        4 => (0..cap).prop_map(|lba| Op::Read { lba }),
        1 => (0..cap, 1..20u64).prop_map(move |(lba, b)| Op::Trim { lba, blocks: b.min(cap - lba) }),
        1 => Just(Op::Flush),
        1 => Just(Op::Checkpoint),
        1 => (0..3u8).prop_map(|stream| Op::CloseStream { stream }),
        1 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
        1 => Just(Op::Kill),
    ]
}

/// Capacity of the tiny geometry; ops address only the first part so overwrites are
/// frequent and the log does not run out of space without a cleaner.
const SPAN: u64 = 96;

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (dev, idx, f) = tiny_crash();
    let mut f = Some(f);
    let mut m = Model::new();
    for (step, op) in ops.into_iter().enumerate() {
        let ftl = f.as_ref().unwrap();
        match op {
            Op::Write {
                lba,
                blocks,
                fua,
                stream,
            } => {
                let data = m.write(lba, blocks);
                match ftl.write(lba, &data, fua, StreamId(stream)) {
                    Ok(()) if fua => m.fua_completed(lba, blocks),
                    Ok(()) => {}
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: write: {e}"))),
                }
            }
            Op::Read { lba } => check_read(ftl, &m, lba, 1)
                .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?,
            Op::Trim { lba, blocks } => {
                ftl.trim(lba, blocks)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: trim: {e}")))?;
                m.trim(lba, blocks);
            }
            Op::Flush => {
                ftl.flush()
                    .map_err(|e| TestCaseError::fail(format!("step {step}: flush: {e}")))?;
                m.flush();
            }
            Op::Checkpoint => {
                ftl.checkpoint()
                    .map_err(|e| TestCaseError::fail(format!("step {step}: checkpoint: {e}")))?;
            }
            Op::CloseStream { stream } => {
                ftl.close_stream(StreamId(stream))
                    .map_err(|e| TestCaseError::fail(format!("step {step}: close: {e}")))?;
            }
            Op::Crash { seed } => {
                drop(f.take());
                dev.crash(seed).unwrap();
                // The offline checker must find the crashed image consistent.
                let report = ftl::check::check(&*dev, &*idx, true)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: check: {e}")))?;
                prop_assert!(
                    report.clean(),
                    "step {}: checker: {:?}",
                    step,
                    report.problems
                );
                let (nf, _) = Ftl::open(dev.clone(), idx.clone(), Config::default())
                    .map_err(|e| TestCaseError::fail(format!("step {step}: reopen: {e}")))?;
                check_after_crash(&nf, &mut m)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                f = Some(nf);
            }
            Op::Kill => {
                let staging = f.as_ref().unwrap().staging().clone();
                drop(f.take());
                let (nf, rep) =
                    Ftl::open_staged(dev.clone(), idx.clone(), Config::default(), staging)
                        .map_err(|e| {
                            TestCaseError::fail(format!("step {step}: reopen after kill: {e}"))
                        })?;
                prop_assert!(
                    !rep.recovery.staged.ignored_stale,
                    "step {}: staging ignored",
                    step
                );
                m.process_died();
                // Strict: every completed write and trim, flushed or not.
                for lba in 0..nf.capacity_blocks() {
                    check_read(&nf, &m, lba, 1).map_err(|e| {
                        TestCaseError::fail(format!("step {step}: after kill: {e}"))
                    })?;
                }
                f = Some(nf);
            }
        }
    }
    // Final crash: everything flushed must be there.
    drop(f.take());
    dev.crash(0xfeed).unwrap();
    let (nf, _) = Ftl::open(dev.clone(), idx.clone(), Config::default())
        .map_err(|e| TestCaseError::fail(format!("final reopen: {e}")))?;
    check_after_crash(&nf, &mut m).map_err(|e| TestCaseError::fail(format!("final: {e}")))?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn crash_consistency_against_the_model(ops in prop::collection::vec(op(SPAN), 1..120)) {
        run(ops)?;
    }
}

#[test]
fn flushed_data_survives_a_crash_that_loses_every_unsynced_write() {
    // Deterministic worst case: crash seeds are random, so also check the "lose all" path
    // by crashing with nothing unsynced but the last unflushed writes.
    let (dev, idx, f) = tiny_crash();
    let mut m = Model::new();
    let d = m.write(0, 4);
    f.write(0, &d, false, S0).unwrap();
    f.flush().unwrap();
    m.flush();
    let d = m.write(2, 4);
    f.write(2, &d, false, S0).unwrap();
    let d = m.write(40, 1);
    f.write(40, &d, true, StreamId(2)).unwrap();
    m.fua_completed(40, 1);
    drop(f);
    for seed in 0..20 {
        dev.crash(seed).unwrap();
        let (f2, _) = Ftl::open(dev.clone(), idx.clone(), Config::default()).unwrap();
        let mut mm = m.clone();
        check_after_crash(&f2, &mut mm).unwrap();
        // The FUA write must be exactly there.
        check_read(&f2, &m, 40, 1).unwrap();
    }
}
