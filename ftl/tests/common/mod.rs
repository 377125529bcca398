//! Shared helpers for the ftl integration tests. What the cleaner's tests and the fuzz
//! targets share too lives in `ftl::model` (re-exported here).
#![allow(dead_code, unused_imports)]

use ftl::StreamId;

pub use ftl::model::tiny::{crash_ftl as tiny_crash, options as tiny, CrashFtl};
pub use ftl::model::{check_after_crash, check_read, checker, mem_ftl, MemFtl};

pub const S0: StreamId = StreamId(1);
