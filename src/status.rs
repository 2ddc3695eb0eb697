//! `status`: the current state, from the live report when the service runs, else observed on
//! the spot; exit codes of a monitoring plugin; `--wait` until licensed.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use crate::cli::StatusArgs;
use crate::config::Settings;
use crate::live;
use crate::report::{Report, State, human};
use crate::state::evaluate;

/// Where a report came from.
pub enum Source {
    /// The service's status.json, this old.
    Service(Duration),
    /// Observed now by this command.
    Observed,
}

fn service_alive(pid: u32) -> bool {
    // The writer is still running and is the agent (not a recycled pid).
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.trim_end().starts_with("vgpu-license-ag"))
}

/// The service's report, when a running service wrote it.
pub fn from_service(settings: &Settings) -> Option<(Report, Duration)> {
    let path = &settings.paths.status_file;
    let bytes = std::fs::read(path).ok()?;
    let report: Report = serde_json::from_slice(&bytes).ok()?;
    if !report.agent_pid.is_some_and(service_alive) {
        return None;
    }
    let age = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .unwrap_or_default();
    Some((report, age))
}

/// The current report and its source.
pub fn current(settings: &Settings) -> (Report, Source) {
    match from_service(settings) {
        Some((r, age)) => (r, Source::Service(age)),
        None => (
            evaluate(live::observe(settings, chrono::Utc::now(), 200)),
            Source::Observed,
        ),
    }
}

/// The `status` command.
pub fn run(args: &StatusArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let deadline = args.wait.map(|s| Instant::now() + Duration::from_secs(s));
    let (report, source) = loop {
        let (report, source) = current(settings);
        match deadline {
            Some(d) if report.state != State::Licensed && Instant::now() < d => {
                std::thread::sleep(Duration::from_secs(1).min(d - Instant::now()));
            }
            _ => break (report, source),
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        match source {
            Source::Service(age) => println!(
                "From the running service's report ({} s old).",
                age.as_secs()
            ),
            Source::Observed => println!("The service is not running: observed now."),
        }
        print!("{}", human::render(&report));
        if args.wait.is_some() && report.state != State::Licensed {
            println!(
                "Not licensed after waiting {} s{}",
                args.wait.unwrap_or_default(),
                report
                    .failure
                    .as_ref()
                    .map(|f| format!(": {}", f.reason.as_str()))
                    .unwrap_or_default()
            );
        }
    }
    Ok(ExitCode::from(report.exit_code))
}
