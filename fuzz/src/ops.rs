//! The `ops` target: a sequence of block-device operations on the tiny crash device,
//! every read checked against the reference model, every crash followed by the offline
//! checker, a reopen and a check of every LBA against what the model allows.
//!
//! The operations ([`Op`]) and their interpreter ([`run`]) are `ftl::model::ops`, shared
//! with the crash property test (`ftl/tests/crash_model.rs`); this file decodes them.
//!
//! Input: `arbitrary`-decoded operations (at most [`MAX_OPS`]), each preceded by a
//! "continue" byte (see [`crate::enc`]), in the format of [`Input`]: the first thirteen
//! variants of [`Op`], in its order. LBAs are taken modulo [`SPAN`] so overwrites are
//! frequent; ranges are clipped to the span.
//!
//! Acceptable: `Error::NoSpace` from an operation that appends (the log is full without a
//! cleaner); the case then stops and goes to the final crash check. Anything else
//! unexpected (an error, a wrong read, a checker problem) fails the case.

use arbitrary::{Arbitrary, Unstructured};

pub use ftl::model::ops::{run, Op, Outcome, SPAN, USER_STREAMS};

/// Operations per case at most.
pub const MAX_OPS: usize = 200;

/// The byte format of one [`Op`]: what `arbitrary` derives for an enum of [`Op`]'s first
/// thirteen variants, in its order, with the same fields (the `ftl` crate cannot derive
/// `Arbitrary` for [`Op`] itself: its `arbitrary` dependency comes only with the `shuttle`
/// feature). Variants that [`Op`] gains later are not in it: adding one here would move
/// every variant's byte values and change what the committed corpus and regression
/// inputs mean.
#[derive(Arbitrary, Debug)]
enum Input {
    Write {
        lba: u8,
        blocks: u8,
        fua: bool,
        stream: u8,
    },
    Trim {
        lba: u8,
        blocks: u8,
    },
    WriteZeroes {
        lba: u8,
        blocks: u8,
    },
    Flush,
    FuaWrite {
        lba: u8,
        blocks: u8,
        stream: u8,
    },
    Checkpoint,
    Relocate {
        lba: u8,
    },
    Clean {
        seg: u8,
        max: u8,
    },
    Crash {
        seed: u64,
    },
    Invalid {
        lba: u64,
        blocks: u8,
        kind: u8,
    },
    Fault {
        kind: u8,
        seed: u64,
    },
    Close,
    Read {
        lba: u8,
        blocks: u8,
    },
}

impl From<Input> for Op {
    fn from(i: Input) -> Op {
        match i {
            Input::Write {
                lba,
                blocks,
                fua,
                stream,
            } => Op::Write {
                lba,
                blocks,
                fua,
                stream,
            },
            Input::Trim { lba, blocks } => Op::Trim { lba, blocks },
            Input::WriteZeroes { lba, blocks } => Op::WriteZeroes { lba, blocks },
            Input::Flush => Op::Flush,
            Input::FuaWrite {
                lba,
                blocks,
                stream,
            } => Op::FuaWrite {
                lba,
                blocks,
                stream,
            },
            Input::Checkpoint => Op::Checkpoint,
            Input::Relocate { lba } => Op::Relocate { lba },
            Input::Clean { seg, max } => Op::Clean { seg, max },
            Input::Crash { seed } => Op::Crash { seed },
            Input::Invalid { lba, blocks, kind } => Op::Invalid { lba, blocks, kind },
            Input::Fault { kind, seed } => Op::Fault { kind, seed },
            Input::Close => Op::Close,
            Input::Read { lba, blocks } => Op::Read { lba, blocks },
        }
    }
}

/// Decodes `data` into at most [`MAX_OPS`] operations.
pub fn parse(data: &[u8]) -> Vec<Op> {
    let mut u = Unstructured::new(data);
    let Ok(iter) = u.arbitrary_iter::<Input>() else {
        return Vec::new();
    };
    iter.take(MAX_OPS)
        .map_while(Result::ok)
        .map(Op::from)
        .collect()
}

/// libFuzzer entry: panics on any violated property.
pub fn fuzz(data: &[u8]) {
    let ops = parse(data);
    if let Err(e) = run(&ops) {
        panic!("ops: {e}\nops: {ops:#?}");
    }
}
