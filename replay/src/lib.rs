//! # replay: write amplification of the real FTL and cleaner, measured on traces
//!
//! - [`trace`]: parsers for fio iologs, MSR Cambridge CSV, blkparse text, a plain CSV and
//!   the Alibaba and Tencent CBS cloud block traces (with a volume filter, plain or gzip);
//!   malformed lines are errors naming the line, never panics;
//! - [`workload`]: seeded synthetic workloads (uniform, zipf, hot/cold, sequential mix);
//! - [`sim`]: drives the real FTL and cleaner on a sparse in-memory device with zero
//!   payloads (metadata-only);
//! - [`placement`]: one stream, or lifetime classes chosen by the online classifier, by an
//!   oracle that knows each write's next overwrite, or by each block's true write rate;
//! - [`model`]: the analytic greedy WAF the uniform workload is held to.

pub mod model;
pub mod placement;
pub mod plot;
pub mod sim;
pub mod trace;
pub mod workload;

/// Errors of the replay crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{file}:{line}: {msg}")]
    Parse {
        file: String,
        line: usize,
        msg: String,
    },
    #[error("cannot read {0}: {1}")]
    Io(String, std::io::Error),
    #[error("bad workload {0:?}: {1}")]
    Workload(String, String),
    #[error(transparent)]
    Ftl(#[from] ftl::Error),
    #[error(transparent)]
    Cleaner(#[from] cleaner::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{file}: {msg}")]
    Trace { file: String, msg: String },
}
