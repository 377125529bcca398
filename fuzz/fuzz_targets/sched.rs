#![no_main]
//! libFuzzer wrapper of `ftl_fuzz::sched::fuzz` (build with `--features sched`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ftl_fuzz::sched::fuzz(data));
