//! `analyze`: the report of saved outputs, as text, JSON or metrics.

use std::process::ExitCode;

use anyhow::Context;

use crate::analyze::analyze;
use crate::cli::AnalyzeArgs;
use crate::model::report::{human, metrics};

/// The `analyze` command.
pub fn run(args: &AnalyzeArgs) -> anyhow::Result<ExitCode> {
    let report = analyze(args)?;
    if args.metrics {
        let counters = metrics::Counters::from_events(&report);
        print!("{}", metrics::render(&report, &counters));
    } else if args.json {
        let mut out = serde_json::to_string_pretty(&report).context("serializing the report")?;
        out.push('\n');
        print!("{}", crate::model::text::json_for_terminal(&out));
    } else {
        print!(
            "{}",
            crate::model::text::for_terminal(&human::render(&report))
        );
    }
    Ok(ExitCode::from(report.exit_code))
}
