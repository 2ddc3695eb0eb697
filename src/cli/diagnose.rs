//! `diagnose [--json]`: every check now, one line each, or the JSON of them all.

use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;

use crate::cli::JsonArg;
use crate::config::Settings;
use crate::diagnose::{diagnose, render};

/// `diagnose [--json]`.
pub fn run(args: &JsonArg, settings: &Settings) -> anyhow::Result<ExitCode> {
    let d = diagnose(settings, Utc::now());
    if args.json {
        let v = d.to_json().context("serializing the report")?;
        let mut out = serde_json::to_string_pretty(&v).context("serializing the report")?;
        out.push('\n');
        print!("{out}");
    } else {
        print!("{}", crate::model::text::for_terminal(&render(&d.checks)));
    }
    Ok(ExitCode::from(d.exit_code()))
}
