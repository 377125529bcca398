//! Known open ftl bugs, so a fuzz run keeps looking for new ones.
//!
//! Each bug found is kept as a regression input (`regressions/<target>/`, listed in
//! `regressions/KNOWN_OPEN` while unfixed). Until it is fixed, libFuzzer would stop at
//! the first input that hits it again, within seconds, every run. So the libFuzzer
//! wrappers (only they) install [`install_filter`]: a panic whose location and message
//! match a bug listed here does not abort; the input is rejected (kept out of the
//! corpus) and the run goes on. Any other panic aborts as usual.
//!
//! `FTL_FUZZ_KNOWN=report` turns the filter off (every known bug is reported again);
//! when a bug is fixed, delete its entry here and in `regressions/KNOWN_OPEN`.
//! `cargo test` never filters: `known_open_regressions` (ignored) replays them strictly.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A known, not yet fixed, bug: a panic in `file` whose message contains `message`.
pub struct KnownBug {
    /// Names the regression inputs (`regressions/<target>/<id>*`).
    pub id: &'static str,
    /// Source file (suffix) of the panic location.
    pub file: &'static str,
    pub message: &'static str,
}

/// Every open one.
pub const OPEN: &[KnownBug] = &[];

thread_local! {
    static HIT: Cell<Option<&'static str>> = const { Cell::new(None) };
}

fn known(file: &str, message: &str) -> Option<&'static KnownBug> {
    OPEN.iter()
        .find(|b| file.ends_with(b.file) && message.contains(b.message))
}

/// Whether the filter is on for this process.
pub fn filtering() -> bool {
    std::env::var("FTL_FUZZ_KNOWN").map_or(true, |v| v != "report")
}

/// Installs a panic hook in front of the current one (libFuzzer's, which aborts) that
/// lets panics of known bugs unwind instead. Call from `fuzz_target!(init: ...)`.
pub fn install_filter() {
    if !filtering() {
        return;
    }
    let next = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        let file = info.location().map_or("", |l| l.file());
        if let Some(bug) = known(file, msg) {
            HIT.with(|h| h.set(Some(bug.id)));
            return;
        }
        next(info)
    }));
}

/// Runs a target; `false` when it hit a known bug (the input is rejected).
pub fn run_filtered(target: fn(&[u8]), data: &[u8]) -> bool {
    HIT.with(|h| h.set(None));
    match catch_unwind(AssertUnwindSafe(|| target(data))) {
        Ok(()) => true,
        Err(p) => {
            if HIT.with(|h| h.get()).is_some() {
                false
            } else {
                std::panic::resume_unwind(p)
            }
        }
    }
}
