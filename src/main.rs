//! `ftlblk`: a ublk block device server backed by a host-side log-structured FTL.
//!
//! This binary is the CLI over the `ftl` crate: `format`, `info`, `bench`, `replay`, `check`.
//! The ublk front end (`add`, `del`, `list`, `recover`, `stats`) arrives with it.

mod bench;
mod check_cmd;
mod cli;
mod replay_cmd;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ftlblk: error: {e}");
            ExitCode::FAILURE
        }
    }
}
