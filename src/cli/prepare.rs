//! `prepare-image`: a guest made ready to be a golden image, each change printed.

use crate::cli::PrepareImageArgs;
use crate::config::Settings;
use crate::prepare::prepare;

/// `vgpu-license-agent prepare-image`.
pub fn run(args: &PrepareImageArgs, settings: &Settings) -> anyhow::Result<()> {
    let done = prepare(settings, args.purge_client_state, args.dry_run)?;
    for line in done.lines() {
        println!("{}", crate::text::for_terminal(&line));
    }
    Ok(())
}
