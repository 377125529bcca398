//! The tiny geometry of the property tests: 32 segments of 64 KiB, 16 KiB flash pages, on
//! the crash-simulating device with the in-memory index, and the checks of an FTL against
//! the model. All of it is `ftl::model` (shared with `ftl/tests` and `cleaner/tests`),
//! re-exported here under the names the targets use.

pub use ftl::model::tiny::*;
pub use ftl::model::{check_after_crash, check_read, checker};
