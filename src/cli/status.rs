//! `status`: the current state, from the live report when the service runs, else observed on
//! the spot; exit codes of a monitoring plugin; `--wait` until licensed.

use std::time::{Duration, SystemTime};

use crate::cli::StatusArgs;
use crate::model::config::Settings;
use crate::model::report::Report;
use crate::model::report::{State, human};
use crate::model::state::{MAX_EVENTS, evaluate};
use crate::observe::live;
use std::process::ExitCode;
use std::time::Instant;

/// Where a report came from.
pub enum Source {
    /// The service's status.json, this old.
    Service(Duration),
    /// Observed now by this command.
    Observed,
}

/// The writer is still running and is the agent (not a recycled pid, not a zombie): its
/// name as the kernel keeps it, cut to 15 bytes.
fn service_alive(pid: u32) -> bool {
    crate::gridd::command::process_runs(pid, "vgpu-license-ag")
}

/// A status.json larger than this was not written by the service (a few KB, or a few
/// hundred KB with many events).
pub const MAX_STATUS_BYTES: usize = 16 << 20;

/// The service's report, when a running service wrote it.
pub fn from_service(settings: &Settings) -> Option<(Report, Duration)> {
    let path = &settings.paths.status_file;
    // Root's own file, but bounded all the same: a FIFO or a huge file there must not hang
    // or fill `status`.
    let bytes =
        crate::files::input::read_file(path, MAX_STATUS_BYTES, crate::files::input::Links::Refuse)
            .ok()?;
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
        None => {
            // On a GPU Operator node, the driver's files under its root.
            let settings = &crate::node::detect(settings).apply(settings);
            (
                evaluate(live::observe(settings, chrono::Utc::now(), MAX_EVENTS)),
                Source::Observed,
            )
        }
    }
}

/// The `status` command.
pub fn run(args: &StatusArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let (report, source) = wait(args, settings);
    // A report whose observation is older than the service's cadence allows says nothing
    // about now: a starved or hung service keeps rewriting it.
    let stale = match source {
        Source::Service(_) => stale_for(&report, settings),
        Source::Observed => None,
    };
    if args.npd {
        return Ok(npd(&report, stale));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(args, &report, source, stale);
    }
    if args.require_licensed {
        return Ok(if done(args, report.state) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if stale.is_some() {
        return Ok(ExitCode::from(3));
    }
    // 0-3 whatever a status.json says: a monitoring system reads anything else as a crash.
    Ok(ExitCode::from(report.exit_code.min(3)))
}

/// What ends the wait: a license, or (for --require-licensed, which gates workloads) a GPU
/// that needs none.
fn done(args: &StatusArgs, state: State) -> bool {
    state == State::Licensed
        || (args.require_licensed && matches!(state, State::NotLicensable | State::NoGpu))
}

/// The current report and where it comes from, with `--wait` once the wait is [`done`] or
/// over.
fn wait(args: &StatusArgs, settings: &Settings) -> (crate::model::report::Report, Source) {
    let deadline = args.wait.map(|s| Instant::now() + Duration::from_secs(s));
    loop {
        let (report, source) = current(settings);
        match deadline {
            Some(d) if !done(args, report.state) && Instant::now() < d => {
                std::thread::sleep(
                    Duration::from_secs(1).min(d.saturating_duration_since(Instant::now())),
                );
            }
            _ => break (report, source),
        }
    }
}

/// The report for a person: its summary (or that it is stale), where it comes from, the
/// report, and what a wait ended without.
fn print_human(
    args: &StatusArgs,
    report: &crate::model::report::Report,
    source: Source,
    stale: Option<i64>,
) {
    match &stale {
        Some(age) => println!(
            "UNKNOWN: the service's report is stale: its observation is {age} s old, more than its cadence allows; the service may be hung or starved (`systemctl status vgpu-license-agent`)"
        ),
        None => println!(
            "{}",
            crate::model::text::for_terminal(&human::summary_line(report))
        ),
    }
    match source {
        Source::Service(age) => println!(
            "From the running service's report ({} s old).",
            age.as_secs()
        ),
        Source::Observed => println!("The service is not running: observed now."),
    }
    print!(
        "{}",
        crate::model::text::for_terminal(&human::render(report))
    );
    if args.wait.is_some() && !done(args, report.state) {
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

/// How old the report's observation is (seconds), when that is older than the service's
/// cadence allows: the licensed poll interval twice over, plus a command's time limit and the
/// heartbeat.
fn stale_for(report: &crate::model::report::Report, settings: &Settings) -> Option<i64> {
    let age = (chrono::Utc::now() - report.observed_at?).num_seconds();
    let svc = &settings.service;
    let allowed = 2 * svc.poll_licensed.max(svc.poll_unlicensed).as_secs()
        + settings.commands.timeout.as_secs()
        + crate::service::core::HEARTBEAT.as_secs();
    (age > allowed as i64).then_some(age)
}

/// node-problem-detector's custom plugin: a line of at most 200 bytes (its default
/// `max_output_length`), exit 0 OK, 1 a problem, 2 unknown.
fn npd(report: &crate::model::report::Report, stale: Option<i64>) -> ExitCode {
    let (code, mut line) = match (stale, report.state) {
        (Some(age), _) => (
            2,
            format!("the agent's report is stale ({age} s old): is vgpu-license-agent running?"),
        ),
        (None, State::Licensed | State::NoGpu | State::NotLicensable) => {
            (0, crate::service::status_line(report))
        }
        (None, State::Unknown) => (2, crate::service::status_line(report)),
        // The status line names the failure's reason and message already.
        (None, _) => (1, crate::service::status_line(report)),
    };
    if line.len() > 200 {
        let mut cut = 200;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    println!("{}", crate::model::text::escape(&line));
    ExitCode::from(code)
}
