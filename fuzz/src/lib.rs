//! Fuzz targets of the `ftl` crate, as plain functions.
//!
//! The libFuzzer wrappers in `fuzz_targets/` (built by `cargo +nightly fuzz`) and the
//! replay tests in `tests/` (built by `cargo test` on stable) call the same functions:
//!
//! - [`ops::fuzz`]: sequences of block-device operations, crashes and reopens on the
//!   crash-simulating device, checked against the reference model [`ftl::model::Model`];
//! - [`decode::fuzz`]: arbitrary bytes through every on-disk decoder;
//! - [`open_corrupt::fuzz`]: a small formatted image damaged by the fuzzer, then the
//!   offline checker, `Ftl::open` and reads of every LBA;
//! - [`request::fuzz`]: the ublk edge's block-request decoding against an oracle;
//! - `sched::fuzz` (feature `sched`): several threads' operations on one FTL, interleaved
//!   and crashed as the input schedules them, against the history model.
//!
//! Every target panics on a violated property, so libFuzzer reports it as a crash. Each
//! also has a `run`-style function that returns the failure as a `String` instead.
//!
//! [`enc`] writes inputs in the byte format `arbitrary` decodes, so [`seeds`] can build
//! the committed seed corpus from readable structures.

pub mod decode;
pub mod enc;
pub mod known;
pub mod open_corrupt;
pub mod ops;
pub mod request;
#[cfg(feature = "sched")]
pub mod sched;
pub mod seeds;
pub mod tiny;

/// A target's entry point: panics on a violated property.
pub type Target = fn(&[u8]);

/// The fuzz targets by name, as `fuzz_targets/<name>.rs` and `corpus/<name>/` call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("ops", ops::fuzz),
    ("decode", decode::fuzz),
    ("open_corrupt", open_corrupt::fuzz),
    ("request", request::fuzz),
];
