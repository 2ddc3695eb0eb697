//! `install`: the token and gridd.conf from the command line, the outcome printed.

use std::time::Duration;

use anyhow::anyhow;

use crate::cli::InstallArgs;
use crate::install::{Request, check_feature_type, install, nothing_changed, source};
use crate::model::config::Settings;
use crate::model::install::{Outcome, Restart};

/// `vgpu-license-agent install`.
pub fn run(args: &InstallArgs, settings: &Settings) -> anyhow::Result<()> {
    if !args.dry_run {
        needs_root(settings)?;
    }
    let feature_type = args.feature_type.unwrap_or(settings.gridd.feature_type);
    check_feature_type(feature_type)?;
    let timeout = args
        .timeout
        .map(Duration::from_secs)
        .unwrap_or(settings.commands.timeout);
    let given = args.source.given()?;
    let token = source::read(given, args.ca_file.as_deref(), timeout, args.retries)?;
    refuse_where_the_platform_licenses(args, settings)?;
    let req = Request {
        token,
        feature_type,
        force: args.force,
        dry_run: args.dry_run,
        restart: !args.no_restart,
    };
    let outcome = install(&req, settings)?;
    tell(&outcome)
}

/// A guest its cloud platform licenses (nvidia-smi: `Licensed (Expiry: N/A)` and no token)
/// needs no token, and one installed there makes gridd go to a DLS instead: refused, unless
/// `--force`.
fn refuse_where_the_platform_licenses(
    args: &InstallArgs,
    settings: &Settings,
) -> anyhow::Result<()> {
    if !args.force
        && let crate::model::assemble::SmiRead::Snapshot(smi) =
            crate::observe::live::read_smi(settings)
        && crate::model::state::licensing_mode(None, None, Some(&smi), None)
            == crate::model::report::LicensingMode::CloudProvider
    {
        return Err(anyhow!(
            "this guest is licensed by its cloud platform (nvidia-smi shows a license with no expiry and no token is installed): it needs no client configuration token, and installing one would send nvidia-gridd to a DLS instead; use --force to install it anyway; {}",
            nothing_changed()
        ));
    }
    Ok(())
}

/// The install's warnings on standard error, its lines on standard output; a failed restart
/// is an error.
fn tell(outcome: &Outcome) -> anyhow::Result<()> {
    for w in &outcome.warnings {
        eprintln!(
            "vgpu-license-agent: warning: {}",
            crate::model::text::escape(&w.to_string())
        );
    }
    for line in outcome.lines() {
        println!("{}", crate::model::text::for_terminal(&line));
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

/// The first of the directories install writes that this user may not write, with its key.
fn unwritable(settings: &Settings) -> Option<(&'static str, std::path::PathBuf)> {
    use nix::unistd::{AccessFlags, access};
    let p = &settings.paths;
    let conf_dir = p.gridd_conf.parent().unwrap_or(std::path::Path::new("/"));
    for (key, dir) in [
        ("paths.state_dir", p.state_dir.as_path()),
        ("paths.token_dir", p.token_dir.as_path()),
        ("paths.gridd_conf", conf_dir),
    ] {
        // The directory, or the nearest one above it that exists: install creates the rest.
        let existing = dir.ancestors().find(|d| d.exists())?;
        if access(existing, AccessFlags::W_OK).is_err() {
            return Some((key, dir.to_path_buf()));
        }
    }
    None
}

/// Install as a user who cannot write its directories (not root, say) fails before it
/// begins, saying the one thing that fixes it.
fn needs_root(settings: &Settings) -> anyhow::Result<()> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    match unwritable(settings) {
        Some((key, dir)) => Err(anyhow!(
            "install writes {} ({key}), which this user may not: run as root (sudo); {}",
            crate::model::text::show_path(&dir),
            nothing_changed()
        )),
        None => Ok(()),
    }
}
