//! `install`: validated, atomic, idempotent install of the token and gridd.conf.

use crate::cli::InstallArgs;
use crate::config::Settings;

pub fn run(_args: &InstallArgs, _settings: &Settings) -> anyhow::Result<()> {
    Err(crate::not_built("install"))
}
