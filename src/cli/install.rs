//! `install`: the token and gridd.conf from the command line, the outcome printed.

use std::time::Duration;

use anyhow::anyhow;

use crate::cli::InstallArgs;
use crate::config::Settings;
use crate::install::{Request, Restart, check_feature_type, install, nothing_changed, source};

/// `vgpu-license-agent install`.
pub fn run(args: &InstallArgs, settings: &Settings) -> anyhow::Result<()> {
    let feature_type = args.feature_type.unwrap_or(settings.gridd.feature_type);
    check_feature_type(feature_type)?;
    let timeout = args
        .timeout
        .map(Duration::from_secs)
        .unwrap_or(settings.commands.timeout);
    let token = source::read(&args.source, args.ca_file.as_deref(), timeout, args.retries)?;
    // A guest its cloud platform licenses (nvidia-smi: `Licensed (Expiry: N/A)` and no token)
    // needs no token, and one installed there makes gridd go to a DLS instead.
    if !args.force
        && let crate::live::SmiRead::Snapshot(smi) = crate::live::read_smi(settings)
        && crate::state::licensing_mode(None, None, Some(&smi), None)
            == crate::report::LicensingMode::CloudProvider
    {
        return Err(anyhow!(
            "this guest is licensed by its cloud platform (nvidia-smi shows a license with no expiry and no token is installed): it needs no client configuration token, and installing one would send nvidia-gridd to a DLS instead; use --force to install it anyway; {}",
            nothing_changed()
        ));
    }
    let req = Request {
        token,
        feature_type,
        force: args.force,
        dry_run: args.dry_run,
        restart: !args.no_restart,
    };
    let outcome = install(&req, settings)?;
    for w in &outcome.warnings {
        eprintln!(
            "vgpu-license-agent: warning: {}",
            crate::text::escape(&w.to_string())
        );
    }
    for line in outcome.lines() {
        println!("{}", crate::text::for_terminal(&line));
    }
    if let Restart::Failed(why) = &outcome.restart {
        let what = if outcome.changed() {
            "the token and gridd.conf are installed, but restarting nvidia-gridd failed"
        } else {
            "restarting nvidia-gridd failed"
        };
        return Err(anyhow!(
            "{what} ({}: {why}); restart it yourself, or run install again (it retries the restart)",
            outcome.restart_command
        ));
    }
    Ok(())
}
