//! `prepare-image`: ready a golden image so that clones start clean.

use crate::cli::PrepareImageArgs;
use crate::config::Settings;

pub fn run(_args: &PrepareImageArgs, _settings: &Settings) -> anyhow::Result<()> {
    Err(crate::not_built("prepare-image"))
}
