//! `token inspect`.
use std::process::ExitCode;
pub fn run(
    _args: &crate::cli::TokenInspectArgs,
    _s: &crate::config::Settings,
) -> anyhow::Result<ExitCode> {
    Err(crate::not_built("token inspect"))
}
