//! Shared helpers for the ftl integration tests. What the cleaner's tests and the fuzz
//! targets share too lives in `ftl::model` (re-exported here).
#![allow(dead_code, unused_imports)]

use ftl::StreamId;

pub use ftl::model::tiny::{crash_ftl as tiny_crash, options as tiny, CrashFtl};
pub use ftl::model::{check_after_crash, check_read, checker, mem_ftl, MemFtl};

pub const S0: StreamId = StreamId(1);

/// Writes LBAs 0..48 (three tiny segments) in stream 1, `rounds` times over, each round
/// flushed and then handed to `after` (round number): every round but the last kills the
/// segments of the one before.
pub fn overwrite_rounds<D: ftl::BlockDevice, I: ftl::IndexStore>(
    f: &ftl::Ftl<D, I>,
    rounds: u64,
    mut after: impl FnMut(u64),
) {
    for round in 0..rounds {
        for l in 0..48 {
            f.write(l, &ftl::model::block_for(l, round * 100 + l + 1), false, S0)
                .unwrap();
        }
        f.flush().unwrap();
        after(round);
    }
}
