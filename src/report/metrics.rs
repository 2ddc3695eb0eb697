//! The report as Prometheus text (classic exposition format). Names are fixed by the
//! contract: alert rules depend on them.

use std::fmt::Write;

use chrono::DateTime;

use super::{Reason, Report, State};

/// What the metrics count beyond one report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Failures seen, by reason (index: position in [`Reason::ALL`]).
    pub failures: [u64; Reason::ALL.len()],
    /// Restarts of nvidia-gridd the agent made.
    pub gridd_restarts: u64,
    /// Guest clock minus the DLS's clock, last measured.
    pub clock_skew_seconds: Option<f64>,
}

impl Counters {
    pub fn count_failure(&mut self, reason: Reason) {
        if let Some(i) = Reason::ALL.iter().position(|r| *r == reason) {
            self.failures[i] += 1;
        }
    }

    /// Counts every failure event of a report (for `analyze --metrics`).
    pub fn from_events(report: &Report) -> Counters {
        let mut c = Counters::default();
        for r in report.events.iter().filter_map(|e| e.reason) {
            c.count_failure(r);
        }
        c
    }
}

fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

/// Renders the metrics.
pub fn render(report: &Report, c: &Counters) -> String {
    let mut o = String::with_capacity(2048);
    header(
        &mut o,
        "vgpu_license_licensed",
        "gauge",
        "1 when a vGPU license is held, else 0.",
    );
    let _ = writeln!(
        o,
        "vgpu_license_licensed {}",
        u8::from(report.state == State::Licensed)
    );
    header(
        &mut o,
        "vgpu_license_state",
        "gauge",
        "1 for the current license state, 0 for the others.",
    );
    for s in State::ALL {
        let _ = writeln!(
            o,
            "vgpu_license_state{{state=\"{}\"}} {}",
            s.as_str(),
            u8::from(report.state == s)
        );
    }
    let expiry = report
        .license
        .as_ref()
        .and_then(|l| l.expiry.as_deref())
        .and_then(|e| DateTime::parse_from_rfc3339(e).ok());
    if let Some(exp) = expiry {
        header(
            &mut o,
            "vgpu_license_expiry_timestamp_seconds",
            "gauge",
            "Expiry of the lease, Unix time.",
        );
        let _ = writeln!(
            o,
            "vgpu_license_expiry_timestamp_seconds {}",
            exp.timestamp()
        );
    }
    header(
        &mut o,
        "vgpu_license_failures_total",
        "counter",
        "Licensing failures seen, by reason.",
    );
    for (r, n) in Reason::ALL.iter().zip(c.failures) {
        let _ = writeln!(
            o,
            "vgpu_license_failures_total{{reason=\"{}\"}} {n}",
            r.as_str()
        );
    }
    header(
        &mut o,
        "vgpu_license_gridd_restarts_total",
        "counter",
        "Restarts of nvidia-gridd made by the agent.",
    );
    let _ = writeln!(o, "vgpu_license_gridd_restarts_total {}", c.gridd_restarts);
    if let Some(skew) = c.clock_skew_seconds {
        header(
            &mut o,
            "vgpu_license_dls_clock_skew_seconds",
            "gauge",
            "Guest clock minus the DLS's clock, last measured, in seconds.",
        );
        let _ = writeln!(o, "vgpu_license_dls_clock_skew_seconds {skew}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{License, SCHEMA};

    #[test]
    fn every_state_and_reason_is_a_series() {
        let report = Report {
            schema: SCHEMA.into(),
            state: State::Licensed,
            observed_at: None,
            license: Some(License {
                status: None,
                edition: None,
                expiry: Some("2030-01-01T00:00:00Z".into()),
            }),
            gpus: vec![],
            events: vec![],
            failure: None,
            dls: None,
            events_omitted: 0,
            notes: vec![],
            exit_code: 0,
            agent_pid: None,
        };
        let mut c = Counters::default();
        c.count_failure(Reason::ClockSkew);
        c.count_failure(Reason::ClockSkew);
        c.gridd_restarts = 3;
        c.clock_skew_seconds = Some(-2.5);
        let text = render(&report, &c);
        assert!(text.contains("vgpu_license_licensed 1\n"));
        assert!(text.contains("vgpu_license_state{state=\"licensed\"} 1\n"));
        assert!(text.contains("vgpu_license_state{state=\"restricted\"} 0\n"));
        assert!(text.contains("vgpu_license_expiry_timestamp_seconds 1893456000\n"));
        assert!(text.contains("vgpu_license_failures_total{reason=\"clock_skew\"} 2\n"));
        assert!(text.contains("vgpu_license_failures_total{reason=\"other\"} 0\n"));
        assert!(text.contains("vgpu_license_gridd_restarts_total 3\n"));
        assert!(text.contains("vgpu_license_dls_clock_skew_seconds -2.5\n"));
        assert_eq!(
            text.matches("vgpu_license_state{").count(),
            State::ALL.len()
        );
    }
}
