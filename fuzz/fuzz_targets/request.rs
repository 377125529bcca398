#![no_main]
//! libFuzzer wrapper. The target is `ftl_fuzz::request::fuzz`, which `cargo test` replays on
//! every corpus and regression input; panics of known open bugs are filtered here only
//! (see `ftl_fuzz::known`).
use libfuzzer_sys::{fuzz_target, Corpus};

fuzz_target!(init: ftl_fuzz::known::install_filter(), |data: &[u8]| -> Corpus {
    if ftl_fuzz::known::run_filtered(ftl_fuzz::request::fuzz, data) {
        Corpus::Keep
    } else {
        Corpus::Reject
    }
});
