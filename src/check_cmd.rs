//! `ftlblk check`: the offline checker over a backing and its index (read-only).

use crate::cli::BackingArgs;
use clap::Args;

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub backing: BackingArgs,
    /// Skip reading every mapped block to verify its checksum.
    #[arg(long)]
    pub no_data: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the checker; `Ok(false)` when it found problems (exit status 1).
pub fn run(a: CheckArgs) -> Result<bool, String> {
    let dev = ftl::backing::open_device(&a.backing.backing, None).map_err(|e| e.to_string())?;
    let dir = a.backing.index_dir();
    if !dir.exists() {
        return Err(format!(
            "index {} does not exist (give --index)",
            dir.display()
        ));
    }
    let index = ftl::index::sled_store::SledIndex::open(&dir).map_err(|e| e.to_string())?;
    let report = ftl::check::check(&dev, &index, !a.no_data).map_err(|e| e.to_string())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "{}: {} segments ({} free), {} mapped blocks, {} verified, {} chunks replayed",
            report.uuid,
            report.segments,
            report.free_segments,
            report.mapped_blocks,
            report.blocks_verified,
            report.chunks_replayed
        );
        for p in &report.problems {
            println!("PROBLEM [{}] {}", p.check, p.detail);
        }
        println!("{}", if report.clean() { "clean" } else { "NOT CLEAN" });
    }
    let staged = ftl::backing::staging_file(&crate::runfiles::run_dir(), &report.uuid);
    if staged.exists() {
        eprintln!(
            "note: {} holds what a server of this backing staged when it stopped \
             uncleanly (this check does not include it); the next `ftlblk add` or \
             `recover` writes it to the log",
            staged.display()
        );
    }
    Ok(report.clean())
}
