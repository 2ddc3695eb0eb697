//! `analyze`: saved outputs through the same parsers and state machine that the service
//! feeds live.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::AnalyzeArgs;
use crate::observe::{journal, smi};
use crate::report::{Report, human, metrics};
use crate::state::{LogFold, Observations, evaluate};
use crate::token::Token;

/// An input that could not be read or understood (exit code 3, unknown).
#[derive(Debug)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

/// nvidia-smi output of many GPUs is a few hundred KB; this bounds a wrong file.
const MAX_SMI_BYTES: u64 = 64 << 20;

fn open(path: &Path) -> Result<Box<dyn Read>, InputError> {
    if path == Path::new("-") {
        return Ok(Box::new(io::stdin().lock()));
    }
    File::open(path)
        .map(|f| Box::new(f) as Box<dyn Read>)
        .map_err(|e| InputError(format!("cannot read {}: {e}", path.display())))
}

fn read_smi(path: &Path) -> Result<smi::SmiSnapshot, InputError> {
    let mut bytes = Vec::new();
    open(path)?
        .take(MAX_SMI_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| InputError(format!("cannot read {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_SMI_BYTES {
        return Err(InputError(format!(
            "{}: larger than {} MB, not nvidia-smi output; give the output of `nvidia-smi -q`",
            path.display(),
            MAX_SMI_BYTES >> 20
        )));
    }
    smi::parse(&bytes).map_err(|e| InputError(format!("{}: {e}", path.display())))
}

/// Builds the report from saved outputs.
pub fn analyze(args: &AnalyzeArgs) -> Result<Report, InputError> {
    if args.smi.is_none() && args.journal.is_none() {
        return Err(InputError(
            "nothing to analyze: give --smi FILE (saved `nvidia-smi -q`) and/or --journal FILE (gridd's log); `-` reads standard input".into(),
        ));
    }
    if args.smi.as_deref() == Some(Path::new("-"))
        && args.journal.as_deref() == Some(Path::new("-"))
    {
        return Err(InputError(
            "--smi and --journal cannot both read standard input: save one of them to a file"
                .into(),
        ));
    }
    let mut obs = Observations {
        expiry_warning: chrono::Duration::hours(12),
        ..Observations::default()
    };
    let mut notes = Vec::new();
    if let Some(path) = &args.smi {
        let snap = read_smi(path)?;
        if snap.gpus.is_empty() && snap.driver_error.is_none() && !snap.whole {
            notes.push(format!(
                "{}: no nvidia-smi -q output found (no `GPU ...` section, no `License Status` line)",
                path.display()
            ));
        }
        obs.at = snap.timestamp.map(|t| t.and_utc());
        obs.smi = Some(snap);
    }
    if let Some(path) = &args.journal {
        let mut fold = LogFold::new(args.max_events);
        let stats = journal::scan(open(path)?, |e| fold.push(e))
            .map_err(|e| InputError(format!("cannot read {}: {e}", path.display())))?;
        if fold.total() == 0 {
            notes.push(format!("{}: no nvidia-gridd lines found", path.display()));
        }
        if let Some(last) = stats.last_stamp.filter(|_| obs.at.is_none()) {
            obs.at_is_exact = last.utc().is_some();
            obs.at = last.utc().or_else(|| last.naive_as_utc());
        }
        obs.log = Some((fold, stats));
    }
    if let Some(path) = &args.token {
        let mut bytes = Vec::new();
        open(path)?
            .take(crate::token::MAX_TOKEN_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| InputError(format!("cannot read {}: {e}", path.display())))?;
        let token =
            Token::decode(&bytes).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
        obs.token = Some(token);
    }
    let mut report = evaluate(obs);
    report.notes.extend(notes);
    Ok(report)
}

/// The `analyze` command.
pub fn run(args: &AnalyzeArgs) -> anyhow::Result<ExitCode> {
    let report = analyze(args)?;
    if args.metrics {
        let counters = metrics::Counters::from_events(&report);
        print!("{}", metrics::render(&report, &counters));
    } else if args.json {
        let mut out = serde_json::to_string_pretty(&report).context("serializing the report")?;
        out.push('\n');
        print!("{out}");
    } else {
        print!("{}", human::render(&report));
    }
    Ok(ExitCode::from(report.exit_code))
}
