//! The project's build tools: `cargo xtask COMMAND` (the alias in .cargo/config.toml runs
//! `cargo run --package xtask --`).
//!
//! - `gen-docs OUT_DIR`: the man pages and shell completions the packages ship
//!   (packaging/build-release.sh runs it).
//! - `gen-journal [SIZE_MB] [GRIDD_PERCENT]`: a synthetic `journalctl -o json` export on
//!   standard output, for bench/journal.py.

mod gen_docs;
mod gen_journal;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "vgpu-license-agent's build tools")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Writes the man pages (OUT_DIR/man/) and shell completions (OUT_DIR/completions/).
    GenDocs {
        /// The directory to write into (created if missing).
        out_dir: PathBuf,
    },
    /// Writes a synthetic `journalctl -o json` export to standard output.
    GenJournal {
        /// About how many MiB to write.
        #[arg(default_value_t = 1024)]
        size_mb: u64,
        /// The share of nvidia-gridd's entries, in percent.
        #[arg(default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=100))]
        gridd_percent: u64,
    },
}

fn main() -> Result<()> {
    match Args::parse().task {
        Task::GenDocs { out_dir } => gen_docs::run(&out_dir),
        Task::GenJournal {
            size_mb,
            gridd_percent,
        } => gen_journal::run(size_mb, gridd_percent).context("writing the journal"),
    }
}
