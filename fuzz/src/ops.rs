//! The `ops` target: a sequence of block-device operations on the tiny crash device,
//! every read checked against the reference model, every crash followed by the offline
//! checker, a reopen and a check of every LBA against what the model allows.
//!
//! The operations ([`Op`]) and their interpreter ([`run`]) are `ftl::model::ops`, shared
//! with the crash property test (`ftl/tests/crash_model.rs`); this file decodes them.
//!
//! Input: `arbitrary`-decoded operations (at most [`MAX_OPS`]), each preceded by a
//! "continue" byte (see [`crate::enc`]), in the format `arbitrary` derives for [`Op`]
//! (with ftl's `arbitrary` feature; `CloseStream` is skipped). LBAs are taken modulo [`SPAN`] so overwrites are
//! frequent; ranges are clipped to the span.
//!
//! Acceptable: `Error::NoSpace` from an operation that appends (the log is full without a
//! cleaner); the case then stops and goes to the final crash check. Anything else
//! unexpected (an error, a wrong read, a checker problem) fails the case.

use arbitrary::Unstructured;

pub use ftl::model::ops::{run, Op, Outcome, SPAN, USER_STREAMS};

/// Operations per case at most.
pub const MAX_OPS: usize = 200;

/// Decodes `data` into at most [`MAX_OPS`] operations.
pub fn parse(data: &[u8]) -> Vec<Op> {
    let mut u = Unstructured::new(data);
    let Ok(iter) = u.arbitrary_iter::<Op>() else {
        return Vec::new();
    };
    iter.take(MAX_OPS).map_while(Result::ok).collect()
}

/// libFuzzer entry: panics on any violated property.
pub fn fuzz(data: &[u8]) {
    let ops = parse(data);
    if let Err(e) = run(&ops) {
        panic!("ops: {e}\nops: {ops:#?}");
    }
}
