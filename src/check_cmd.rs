//! `ftlblk check`: the offline checker over a backing and its index (read-only).

use crate::args::BackingArgs;
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
    // What a dead server of this backing staged is part of what the next open sees: check
    // it too (a private view; the file is left as it is).
    let (sb, _) = ftl::lifecycle::read_superblock_readonly(&dev).map_err(|e| e.to_string())?;
    let staged_file = ftl::backing::staging_file(&crate::runfiles::run_dir(), &sb.uuid_string());
    let staging = if staged_file.exists() {
        Some(
            ftl::staging::StagingArea::open_file_snapshot(&staged_file)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let report =
        ftl::check::check_staged(&dev, &index, !a.no_data, staging).map_err(|e| e.to_string())?;
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
    if report.staged.entries > 0 {
        eprintln!(
            "note: {} holds {} completed writes ({} chunks) a server of this backing staged \
             when it stopped uncleanly; they are checked above and written to the log by the \
             next `ftlblk recover` (or any open of the backing)",
            staged_file.display(),
            report.staged.entries,
            report.staged.open_chunks + report.staged.sealed_chunks
        );
    } else if report.staged.ignored_stale {
        eprintln!(
            "note: {} belongs to an older session of this backing and is ignored",
            staged_file.display()
        );
    }
    Ok(report.clean())
}
