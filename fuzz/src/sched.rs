//! The `sched` target (feature `sched`): several logical threads' operations on one FTL,
//! interleaved as the input says, ending in a crash at the point the input schedules it,
//! checked by the history model ([`ftl::sched`], the scenario the shuttle tests explore
//! with random schedules).
//!
//! Input: a process-death flag (else a power cut), a prefill flag, the power cut's seed,
//! up to [`MAX_THREADS`](ftl::sched::MAX_THREADS) scripts of up to [`MAX_STEPS`]
//! `arbitrary`-decoded [`Step`]s, and then the schedule: every remaining byte is one
//! scheduling decision (low 2 bits: which runnable thread, modulo their number; high 6
//! bits: how many further decisions it keeps running). When the bytes run out, the
//! running thread keeps going until it blocks or yields, then the next one runs.

use arbitrary::Unstructured;
use ftl::model::Crash;
use ftl::sched::{Scenario, Step};
use shuttle::scheduler::{Schedule, Scheduler, Task, TaskId};

/// Steps per script at most.
pub const MAX_STEPS: usize = 24;

/// A decoded input.
#[derive(Debug, Clone)]
pub struct Input {
    pub scenario: Scenario,
    pub schedule: Vec<u8>,
}

/// Decodes an input; `None` when it holds fewer than two threads with steps.
pub fn decode(data: &[u8]) -> Option<Input> {
    let mut u = Unstructured::new(data);
    let death: bool = u.arbitrary().ok()?;
    let prefill: bool = u.arbitrary().ok()?;
    let seed: u64 = u.arbitrary().ok()?;
    let mut threads = Vec::new();
    for t in u.arbitrary_iter::<Vec<Step>>().ok()? {
        let t = t.ok()?;
        if threads.len() < ftl::sched::MAX_THREADS && !t.is_empty() {
            threads.push(t.into_iter().take(MAX_STEPS).collect());
        }
    }
    if threads.len() < 2 {
        return None;
    }
    Some(Input {
        scenario: Scenario {
            threads,
            crash: if death {
                Crash::ProcessDeath
            } else {
                Crash::PowerCut
            },
            seed,
            prefill,
        },
        schedule: u.take_rest().to_vec(),
    })
}

/// Takes each scheduling decision from the input (see the module docs).
struct ByteScheduler {
    bytes: Vec<u8>,
    pos: usize,
    hold: u32,
    started: bool,
}

impl Scheduler for ByteScheduler {
    fn new_execution(&mut self) -> Option<Schedule> {
        if self.started {
            return None;
        }
        self.started = true;
        Some(Schedule::new(0))
    }

    fn next_task(
        &mut self,
        runnable: &[&Task],
        current: Option<TaskId>,
        is_yielding: bool,
    ) -> Option<TaskId> {
        let cur = current.and_then(|c| runnable.iter().position(|t| t.id() == c));
        if self.hold > 0 {
            if let Some(i) = cur {
                self.hold -= 1;
                return Some(runnable[i].id());
            }
        }
        if let Some(&b) = self.bytes.get(self.pos) {
            self.pos += 1;
            self.hold = (b >> 2) as u32;
            return Some(runnable[(b & 3) as usize % runnable.len()].id());
        }
        Some(match cur {
            Some(i) if !is_yielding => runnable[i].id(),
            Some(i) => runnable[(i + 1) % runnable.len()].id(),
            None => runnable[0].id(),
        })
    }

    fn next_u64(&mut self) -> u64 {
        0
    }
}

/// Runs one input; the violated property, if any.
pub fn run(data: &[u8]) -> Result<(), String> {
    let Some(input) = decode(data) else {
        return Ok(());
    };
    let scheduler = ByteScheduler {
        bytes: input.schedule.clone(),
        pos: 0,
        hold: 0,
        started: false,
    };
    let mut cfg = shuttle::Config::new();
    cfg.stack_size = 1 << 20;
    cfg.max_steps = shuttle::MaxSteps::FailAfter(50_000_000);
    cfg.silence_warnings = true;
    let failure = std::sync::Arc::new(std::sync::Mutex::new(None));
    let f2 = failure.clone();
    let scenario = input.scenario.clone();
    shuttle::Runner::new(scheduler, cfg).run(move || {
        if let Err(e) = ftl::sched::run(&scenario) {
            *f2.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    });
    let e = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
    match e {
        Some(e) => Err(format!("{e}\n{:#?}", input.scenario)),
        None => Ok(()),
    }
}

/// The target: panics on a violated property.
pub fn fuzz(data: &[u8]) {
    if let Err(e) = run(data) {
        panic!("{e}");
    }
}

/// Writes an input in the byte format [`decode`] reads.
pub fn encode(death: bool, prefill: bool, threads: Vec<Vec<Step>>, schedule: &[u8]) -> Vec<u8> {
    let mut e = crate::enc::Enc::default();
    e.bool(death).bool(prefill).u64(7);
    e.seq(&threads, |e, t| {
        e.seq(t, |e, s| {
            e.variant(variant(s), 7);
            match *s {
                Step::Write {
                    lba,
                    blocks,
                    fua,
                    stream,
                } => {
                    e.u8(lba).u8(blocks).bool(fua).u8(stream);
                }
                Step::Trim { lba, blocks } => {
                    e.u8(lba).u8(blocks);
                }
                Step::Read { lba } => {
                    e.u8(lba);
                }
                Step::CloseStream { stream } => {
                    e.u8(stream);
                }
                Step::Clean { max } => {
                    e.u8(max);
                }
                Step::Flush | Step::Checkpoint => {}
            }
        });
    });
    e.0.extend_from_slice(schedule);
    e.0
}

/// Seeds: readable scenarios (each followed by a short schedule).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let w = |lba: u8, blocks: u8, fua: bool, stream: u8| Step::Write {
        lba,
        blocks,
        fua,
        stream,
    };
    let build = encode;
    let writer = |s: u8| -> Vec<Step> {
        (0..8)
            .flat_map(|i| [w(i * 3, 4, i % 3 == 0, s + i), Step::Read { lba: i * 3 }])
            .collect()
    };
    vec![
        (
            "checkpoint-vs-writers-power-cut",
            build(
                false,
                true,
                vec![
                    vec![Step::Checkpoint, Step::Read { lba: 0 }, Step::Checkpoint],
                    writer(1),
                    vec![
                        Step::Clean { max: 255 },
                        Step::Flush,
                        Step::Clean { max: 255 },
                    ],
                ],
                &[0x41, 0x06, 0x81, 0x02, 0x43, 0xfe],
            ),
        ),
        (
            "flush-group-process-death",
            build(
                true,
                false,
                vec![
                    vec![
                        w(0, 8, false, 1),
                        Step::Flush,
                        w(8, 8, true, 2),
                        Step::Flush,
                    ],
                    vec![
                        w(1, 3, false, 1),
                        Step::Flush,
                        Step::CloseStream { stream: 1 },
                    ],
                    vec![
                        w(2, 5, false, 3),
                        Step::Trim { lba: 2, blocks: 3 },
                        Step::Flush,
                    ],
                ],
                &[0x05, 0x09, 0x0e, 0x21, 0x06],
            ),
        ),
        (
            "cleaning-while-trimming-power-cut",
            build(
                false,
                true,
                vec![
                    vec![
                        Step::Trim { lba: 0, blocks: 16 },
                        Step::Flush,
                        Step::Read { lba: 3 },
                    ],
                    vec![
                        Step::Clean { max: 8 },
                        Step::Clean { max: 8 },
                        Step::Checkpoint,
                    ],
                    writer(4),
                ],
                &[0x02, 0x41, 0x80, 0x03],
            ),
        ),
    ]
}

fn variant(s: &Step) -> u32 {
    match s {
        Step::Write { .. } => 0,
        Step::Trim { .. } => 1,
        Step::Flush => 2,
        Step::Read { .. } => 3,
        Step::Checkpoint => 4,
        Step::CloseStream { .. } => 5,
        Step::Clean { .. } => 6,
    }
}
