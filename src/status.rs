//! `status`: the current state, from the live report when the service runs, else observed on
//! the spot; exit codes of a monitoring plugin; `--wait` until licensed.

use std::time::{Duration, SystemTime};

use crate::config::Settings;
use crate::live;
use crate::model::report::Report;
use crate::model::state::{MAX_EVENTS, evaluate};

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
    crate::command::process_runs(pid, "vgpu-license-ag")
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
