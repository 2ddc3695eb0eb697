//! `analyze`: saved outputs through the parsers and the state machine.
use std::process::ExitCode;

/// An input that could not be read or understood (exit code 3, unknown).
#[derive(Debug)]
pub struct InputError(pub String);
impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for InputError {}

pub fn run(_args: &crate::cli::AnalyzeArgs) -> anyhow::Result<ExitCode> {
    Err(crate::not_built("analyze"))
}
