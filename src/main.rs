//! `ftlblk`: a ublk block device server backed by a host-side log-structured FTL.
//!
//! This binary is the CLI over the `ftl` crate: `format`, `info`, `bench`, `replay`, `check`,
//! and the ublk front end: `add`, `del`, `list`, `recover`, `stats`.
//!
//! Front-end modules: [`ublk`] (data path), [`daemon`] (device server), [`control`]
//! (tokio control plane: signals, checkpoints, stats socket), [`offload`] (I/O workers),
//! [`kctl`] (kernel control),
//! [`runfiles`] (`/run/ftlblk`), [`device_cmd`] (the subcommands).

mod args;
mod background;
mod backing_cmd;
mod bench;
mod cli;
mod control;
mod daemon;
mod device_cmd;
mod error;
mod kctl;
mod launch;
mod offload;
mod output;
mod replay_cmd;
mod runfiles;
mod stats_cmd;
mod stats_doc;
mod ublk;

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
