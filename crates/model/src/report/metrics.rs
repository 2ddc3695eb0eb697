//! The report as Prometheus text (classic exposition format), and the same samples as
//! OpenMetrics for the scrapers that ask for it (see `service::metrics_server`). Names are fixed by the
//! contract: alert rules and dashboards depend on them.

use std::fmt::Write;

use super::{Reason, Report, Role, ServiceFacts, State, Vm, VmState};

/// What the metrics count beyond one report (the facts they show are the report's,
/// [`Report::service`] among them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Failures seen, by reason (index: position in [`Reason::ALL`]).
    pub failures: [u64; Reason::ALL.len()],
    /// Restarts of nvidia-gridd the agent made.
    pub gridd_restarts: u64,
    /// Failed writes of the Node condition.
    pub node_condition_errors: u64,
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

/// A metric of one series without labels: its header and its value.
fn one(o: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    header(o, name, kind, help);
    let _ = writeln!(o, "{name} {value}");
}

/// The one series that carries what only the guest knows about itself, so that a fleet's
/// queries can join it (`* on (instance) group_left (profile) vgpu_license_guest_info`)
/// instead of every series carrying these labels (a driver update would then start a new
/// series of each).
pub const GUEST_INFO: &str = "vgpu_license_guest_info";

/// A label value in the exposition formats: backslash, double quote and line feed escaped.
fn label_value(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// The labels of [`GUEST_INFO`], in name order; unknown ones are left out (an empty label is
/// no label to Prometheus anyway).
pub fn guest_labels(report: &Report) -> Vec<(&'static str, String)> {
    let mut profiles: Vec<&str> = Vec::new();
    for p in report.gpus.iter().filter_map(|g| g.profile.as_deref()) {
        if !profiles.contains(&p) {
            profiles.push(p);
        }
    }
    let edition = report
        .license
        .as_ref()
        .and_then(|l| l.edition.as_deref())
        .or_else(|| report.gpus.iter().find_map(|g| g.edition.as_deref()));
    // How the guest is licensed, as the report says (the one rule: state::licensing_mode).
    let licensing = report
        .licensing_mode
        .filter(|m| *m != crate::report::LicensingMode::Unknown)
        .map(crate::report::LicensingMode::as_str);
    let mut labels = vec![("agent_version", env!("CARGO_PKG_VERSION").to_string())];
    let known = [
        ("driver_version", facts(report).driver_version.clone()),
        ("edition", edition.map(str::to_string)),
        ("licensing", licensing.map(str::to_string)),
        (
            "profile",
            (!profiles.is_empty()).then(|| profiles.join(",")),
        ),
    ];
    for (k, v) in known {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            labels.push((k, v));
        }
    }
    labels
}

/// The service's facts of `report` (none from another source).
fn facts(report: &Report) -> &ServiceFacts {
    static NONE: ServiceFacts = ServiceFacts {
        clock_skew_seconds: None,
        driver_version: None,
        token_expiry: None,
        token_rejected: false,
        token_stale: false,
        held_writers: 0,
    };
    report.service.as_ref().unwrap_or(&NONE)
}

/// Renders the metrics: a guest's, or on a host every VM's vGPU ([`render_host`]).
pub fn render(report: &Report, c: &Counters) -> String {
    if report.role == Role::Host {
        return render_host(report);
    }
    let mut o = String::with_capacity(2048);
    one(
        &mut o,
        "vgpu_license_licensed",
        "gauge",
        "1 when a vGPU license is held, else 0.",
        u8::from(report.state == State::Licensed),
    );
    state(&mut o, report);
    failures(&mut o, report, c);
    one(
        &mut o,
        "vgpu_license_gridd_restarts_total",
        "counter",
        "Restarts of nvidia-gridd made by the agent.",
        c.gridd_restarts,
    );
    where_known(&mut o, report);
    agent_info(&mut o, report);
    one(
        &mut o,
        "vgpu_license_node_condition_errors_total",
        "counter",
        "Failed writes of the Node condition VgpuLicensed (API down, 403).",
        c.node_condition_errors,
    );
    one(
        &mut o,
        "vgpu_license_token_rejected",
        "gauge",
        "1 while a file dropped in the token directory (or the token source) was refused and the refusal is recent, else 0.",
        u8::from(facts(report).token_rejected),
    );
    one(
        &mut o,
        "vgpu_license_token_stale",
        "gauge",
        "1 while the GPU Operator's licensing Secret (kubernetes.licensing_secret) holds another token than the one nvidia-gridd runs with, else 0.",
        u8::from(facts(report).token_stale),
    );
    one(
        &mut o,
        "vgpu_license_token_dir_held_writers",
        "gauge",
        "Files of the token directory that a process has kept open for writing for more than 2 minutes (an editor left open, a stuck copy): each is judged once its writer closes it.",
        facts(report).held_writers,
    );
    per_gpu(&mut o, report);
    guest_info(&mut o, report);
    o
}

/// The metrics shown only where known: the clock's skew against the DLS, the last shutdown,
/// the token's expiry.
fn where_known(o: &mut String, report: &Report) {
    let facts = facts(report);
    if let Some(skew) = facts.clock_skew_seconds {
        one(
            o,
            "vgpu_license_dls_clock_skew_seconds",
            "gauge",
            "Guest clock minus the DLS's clock, last measured, in seconds.",
            skew,
        );
    }
    if let Some(last) = &report.last_shutdown {
        last_shutdown(o, last);
    }
    if let Some(exp) = facts.token_expiry {
        one(
            o,
            "vgpu_license_token_expiry_timestamp_seconds",
            "gauge",
            "The installed client configuration token's expiry (exp), Unix time.",
            exp,
        );
    }
}

/// The agent's own info, where the report gives its mode (not `analyze`'s, which reads no
/// machine).
fn agent_info(o: &mut String, report: &Report) {
    let Some(mode) = &report.mode else {
        return;
    };
    // Where the driver runs: the GPU Operator's driver container, or the host.
    let driver = match &report.driver_root {
        Some(Some(_)) => "gpu_operator",
        _ => "host",
    };
    header(
        o,
        "vgpu_license_agent_info",
        "gauge",
        "Always 1; the agent's version, whether it manages or only observes, and where the driver runs (host or gpu_operator).",
    );
    let _ = writeln!(
        o,
        "vgpu_license_agent_info{{version=\"{}\",mode=\"{}\",driver=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        mode,
        driver
    );
}

/// What only the guest knows, as the labels of one series.
fn guest_info(o: &mut String, report: &Report) {
    header(
        o,
        GUEST_INFO,
        "gauge",
        "Always 1; its labels say what only the guest knows: vGPU profile, driver version, edition, licensing (dls, cls, cloud_provider or legacy).",
    );
    let labels: Vec<String> = guest_labels(report)
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
        .collect();
    let _ = writeln!(o, "{GUEST_INFO}{{{}}} 1", labels.join(","));
}

/// The state, one series each, and the lease's expiry.
fn state(o: &mut String, report: &Report) {
    header(
        o,
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
    let expiry = report.license.as_ref().and_then(|l| l.expiry);
    if let Some(exp) = expiry {
        one(
            o,
            "vgpu_license_expiry_timestamp_seconds",
            "gauge",
            "Expiry of the lease, Unix time.",
            exp.timestamp(),
        );
    }
}

/// The failure the report shows now, as `vgpu_license_state` shows the state: a fleet's
/// "which guests fail, and why" is a sum over this, where the counter after it only says
/// that a failure was seen.
fn failures(o: &mut String, report: &Report, c: &Counters) {
    header(
        o,
        "vgpu_license_failure",
        "gauge",
        "1 for the reason of the failure the agent reports now, 0 for the others (all 0 without one).",
    );
    let current = report.failure.as_ref().map(|f| f.reason);
    for r in Reason::ALL {
        let _ = writeln!(
            o,
            "vgpu_license_failure{{reason=\"{}\"}} {}",
            r.as_str(),
            u8::from(current == Some(r))
        );
    }
    header(
        o,
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
}

/// `vgpu_license_gpu_licensed`, one series per GPU whose license status nvidia-smi shows.
fn per_gpu(o: &mut String, report: &Report) {
    let per_gpu: Vec<_> = report
        .gpus
        .iter()
        .filter(|g| g.license_status.is_some())
        .collect();
    if !per_gpu.is_empty() {
        header(
            o,
            "vgpu_license_gpu_licensed",
            "gauge",
            "Per GPU: 1 when its License Status says licensed, else 0.",
        );
        for g in per_gpu {
            let licensed = matches!(
                g.license_status
                    .as_deref()
                    .map(crate::observe::smi::classify_status),
                Some(crate::observe::smi::LicenseStatus::Licensed(_))
            );
            let _ = writeln!(
                o,
                "vgpu_license_gpu_licensed{{bus_id=\"{}\",profile=\"{}\"}} {}",
                label_value(g.bus_id.as_deref().unwrap_or("")),
                label_value(g.profile.as_deref().unwrap_or("")),
                u8::from(licensed)
            );
        }
    }
}

/// What the previous boot's last shutdown did with the lease.
fn last_shutdown(o: &mut String, last: &super::LastShutdown) {
    one(
        o,
        "vgpu_license_last_return_success",
        "gauge",
        "1 when nvidia-gridd returned its lease at the last shutdown, 0 when the lease was left held on the DLS.",
        u8::from(last.lease_returned),
    );
    if let Some(at) = last.at {
        one(
            o,
            "vgpu_license_last_shutdown_timestamp_seconds",
            "gauge",
            "The time of that shutdown (gridd's last line of the previous boot), Unix time.",
            at.timestamp(),
        );
    }
}

/// The labels of a VM's vGPU series, in the contract's order: `vm`, `vm_uuid`, `vgpu_uuid`
/// (the vGPU ID where nvidia-smi prints no vGPU UUID, as driver 525 does: each vGPU
/// keeps a series of its own), `profile`, `namespace` and `vmi` (empty off KubeVirt).
fn vm_labels(v: &Vm) -> String {
    let of = |f: &Option<String>| label_value(f.as_deref().unwrap_or(""));
    let (namespace, vmi) = v
        .kubevirt
        .as_ref()
        .map_or((String::new(), String::new()), |k| {
            (label_value(&k.namespace), label_value(&k.vmi))
        });
    format!(
        "vm=\"{}\",vm_uuid=\"{}\",vgpu_uuid=\"{}\",profile=\"{}\",namespace=\"{namespace}\",vmi=\"{vmi}\"",
        of(&v.vm_name),
        of(&v.vm_uuid),
        of(&v.vgpu_uuid.clone().or_else(|| v.vgpu_id.clone())),
        of(&v.profile),
    )
}

/// A host's metrics: per VM's vGPU whether its guest holds a license, whether it is
/// throttled, its lease's expiry where known; how many vGPUs are in each state. A VM that
/// is gone leaves no series. Nothing per VM where no `nvidia-smi vgpu -q` was read.
pub fn render_host(report: &Report) -> String {
    let mut o = String::with_capacity(1024);
    let Some(vms) = &report.vms else {
        return o;
    };
    // One series per label set: a listing that repeats a vGPU under another ID with the
    // same labels keeps its first.
    let mut seen = std::collections::HashSet::new();
    let vms: Vec<(&Vm, String)> = vms
        .iter()
        .map(|v| (v, vm_labels(v)))
        .filter(|(_, l)| seen.insert(l.clone()))
        .collect();
    let series = |o: &mut String, name: &str, help: &str, value: &dyn Fn(&Vm) -> Option<i64>| {
        let values: Vec<(&String, i64)> = vms
            .iter()
            .filter_map(|(v, l)| value(v).map(|x| (l, x)))
            .collect();
        if values.is_empty() {
            return;
        }
        header(o, name, "gauge", help);
        for (labels, x) in values {
            let _ = writeln!(o, "{name}{{{labels}}} {x}");
        }
    };
    series(
        &mut o,
        "vgpu_license_vm_licensed",
        "Per VM's vGPU on this host: 1 when its guest driver reports a license, else 0.",
        &|v| Some(i64::from(v.state == VmState::Licensed)),
    );
    series(
        &mut o,
        "vgpu_license_vm_restricted",
        "Per VM's vGPU on this host: 1 when it is unlicensed and throttled (Unlicensed (Restricted)), else 0.",
        &|v| Some(i64::from(v.state == VmState::Restricted)),
    );
    series(
        &mut o,
        "vgpu_license_vm_guest_driver",
        "Per VM's vGPU on this host: 1 when a guest driver answers (it can ask for a license), 0 while none does (a VM booting, a guest without NVIDIA's driver).",
        &|v| Some(i64::from(v.guest_driver.is_some())),
    );
    series(
        &mut o,
        "vgpu_license_vm_expiry_timestamp_seconds",
        "Per VM's vGPU on this host: its lease's expiry, Unix time (where its license status gives one).",
        &|v| v.expiry.map(|e| e.timestamp()),
    );
    header(
        &mut o,
        "vgpu_license_host_vgpus",
        "gauge",
        "Active vGPUs on this host, by the license state of each (unknown: no guest driver answers).",
    );
    for state in VmState::ALL {
        let n = vms.iter().filter(|(v, _)| v.state == state).count();
        let _ = writeln!(
            o,
            "vgpu_license_host_vgpus{{state=\"{}\"}} {n}",
            state.as_str()
        );
    }
    o
}

/// The content type of [`render`]'s text.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of [`openmetrics`]'s text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// [`render`]'s text as OpenMetrics 1.0: the same samples; a counter's family is named
/// without its `_total`, [`GUEST_INFO`] is of type `info` (its family without `_info`), HELP
/// texts escape double quotes too, and the text ends with `# EOF`. It converts only what
/// [`render`] writes (one HELP and TYPE per family, then its samples), which is why it is
/// done on the text: the service keeps one rendering of each report and serves it in the
/// format each scraper asks for.
pub fn openmetrics(text: &str) -> String {
    let mut types: Vec<(&str, &str)> = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ")
            && let Some((name, kind)) = rest.split_once(' ')
        {
            types.push((name, kind));
        }
    }
    let family = |name: &str| -> (String, String) {
        let kind = types
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("unknown", |(_, k)| k);
        match kind {
            "counter" => (
                name.strip_suffix("_total").unwrap_or(name).into(),
                kind.into(),
            ),
            "gauge" if name == GUEST_INFO => (
                name.strip_suffix("_info").unwrap_or(name).into(),
                "info".into(),
            ),
            _ => (name.into(), kind.into()),
        }
    };
    let mut o = String::with_capacity(text.len() + 64);
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let (fam, _) = family(name);
            let _ = writeln!(o, "# HELP {fam} {}", help.replace('"', "\\\""));
        } else if let Some(rest) = l.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
            let (fam, kind) = family(name);
            let _ = writeln!(o, "# TYPE {fam} {kind}");
        } else if !l.is_empty() {
            o.push_str(l);
            o.push('\n');
        }
    }
    o.push_str("# EOF\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::License;

    #[test]
    fn every_state_and_reason_is_a_series() {
        let report = Report {
            state: State::Licensed,
            license: Some(License {
                status: None,
                edition: None,
                expiry: Some("2030-01-01T00:00:00Z".parse().unwrap()),
            }),
            exit_code: 0,
            ..Report::default()
        };
        let mut c = Counters::default();
        c.count_failure(Reason::ClockSkew);
        c.count_failure(Reason::ClockSkew);
        c.gridd_restarts = 3;
        let report = Report {
            service: facts(None, Some(-2.5)),
            ..report
        };
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
        // No failure in the report: every reason's gauge is 0.
        assert_eq!(
            text.matches("vgpu_license_failure{").count(),
            Reason::ALL.len()
        );
        assert!(!text.contains("vgpu_license_failure{reason=\"clock_skew\"} 1"));
    }

    #[test]
    fn the_current_failure_is_one_gauge_by_reason() {
        let mut r = report();
        r.failure = Some(crate::report::Failure {
            reason: Reason::ClockSkew,
            message: "Clock windback has been detected".into(),
            at: None,
            advice: "fix the clock".into(),
        });
        let text = render(&r, &Counters::default());
        let ones: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("vgpu_license_failure{") && l.ends_with(" 1"))
            .collect();
        assert_eq!(ones, ["vgpu_license_failure{reason=\"clock_skew\"} 1"]);
        assert!(text.contains("# TYPE vgpu_license_failure gauge\n"));
    }

    fn report() -> Report {
        Report {
            state: State::Unlicensed,
            license: Some(License {
                status: Some("Unlicensed (Unrestricted)".into()),
                edition: None,
                expiry: None,
            }),
            gpus: vec![
                crate::report::Gpu {
                    bus_id: Some("00000000:02:01.0".into()),
                    profile: Some("NVIDIA L40S-24Q".into()),
                    virtualization_mode: Some("VGPU".into()),
                    license_status: None,
                    edition: Some("NVIDIA RTX Virtual Workstation".into()),
                    state: None,
                    expiry: None,
                },
                crate::report::Gpu {
                    bus_id: Some("00000000:02:02.0".into()),
                    profile: Some("NVIDIA L40S-24Q".into()),
                    virtualization_mode: Some("VGPU".into()),
                    license_status: None,
                    edition: None,
                    state: None,
                    expiry: None,
                },
            ],
            dls: Some(vec![crate::report::DlsEndpoint {
                host: "dls.example.com".into(),
                port: 443,
            }]),
            licensing_mode: Some(crate::report::LicensingMode::Dls),
            exit_code: 1,
            ..Report::default()
        }
    }

    /// The service's facts with the driver's version and the clock's skew.
    fn facts(driver_version: Option<&str>, skew: Option<f64>) -> Option<ServiceFacts> {
        Some(ServiceFacts {
            driver_version: driver_version.map(str::to_string),
            clock_skew_seconds: skew,
            ..ServiceFacts::default()
        })
    }

    #[test]
    fn what_only_the_guest_knows_is_on_one_info_series() {
        let r = Report {
            service: facts(Some("550.90.07"), None),
            ..report()
        };
        let text = render(&r, &Counters::default());
        let info: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("vgpu_license_guest_info{"))
            .collect();
        assert_eq!(
            info,
            [concat!(
                "vgpu_license_guest_info{agent_version=\"",
                env!("CARGO_PKG_VERSION"),
                "\",driver_version=\"550.90.07\",edition=\"NVIDIA RTX Virtual Workstation\",",
                "licensing=\"dls\",profile=\"NVIDIA L40S-24Q\"} 1"
            )]
        );
        // No other series carries them.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            if !l.starts_with(GUEST_INFO) {
                assert!(
                    !l.contains("profile=") && !l.contains("driver_version="),
                    "{l}"
                );
            }
        }
    }

    #[test]
    fn guest_labels_leave_out_what_is_unknown_and_escape_the_rest() {
        let mut r = report();
        r.gpus.clear();
        r.license = None;
        r.dls = Some(vec![crate::report::DlsEndpoint {
            host: "api.cls.licensing.nvidia.com".into(),
            port: 443,
        }]);
        // As state::evaluate says it for a token that names the CLS.
        r.licensing_mode = Some(crate::report::LicensingMode::Cls);
        r.service = facts(Some("5\"5\\0\n"), None);
        let text = render(&r, &Counters::default());
        let line = text
            .lines()
            .find(|l| l.starts_with(GUEST_INFO))
            .unwrap()
            .to_string();
        assert!(
            line.contains(r#"driver_version="5\"5\\0\n",licensing="cls"}"#),
            "{line}"
        );
        assert!(
            !line.contains("profile=") && !line.contains("edition="),
            "{line}"
        );
        r.dls = None;
        r.licensing_mode = Some(crate::report::LicensingMode::Unknown);
        r.service = None;
        let text = render(&r, &Counters::default());
        let line = text.lines().find(|l| l.starts_with(GUEST_INFO)).unwrap();
        assert_eq!(
            line,
            concat!(
                "vgpu_license_guest_info{agent_version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            )
        );
    }

    #[test]
    fn openmetrics_names_families_as_the_format_wants_and_ends_with_eof() {
        let mut c = Counters::default();
        c.count_failure(Reason::ClockSkew);
        c.gridd_restarts = 2;
        let r = Report {
            service: facts(None, Some(-3600.0)),
            ..report()
        };
        let classic = render(&r, &c);
        let om = openmetrics(&classic);
        assert!(om.ends_with("\n# EOF\n"), "{om}");
        assert_eq!(om.matches("# EOF").count(), 1);
        assert!(
            om.contains("# TYPE vgpu_license_failures counter\n"),
            "{om}"
        );
        assert!(
            om.contains("# HELP vgpu_license_failures Licensing failures"),
            "{om}"
        );
        assert!(om.contains("vgpu_license_failures_total{reason=\"clock_skew\"} 1\n"));
        assert!(om.contains("# TYPE vgpu_license_gridd_restarts counter\n"));
        assert!(om.contains("vgpu_license_gridd_restarts_total 2\n"));
        assert!(om.contains("# TYPE vgpu_license_guest info\n"), "{om}");
        assert!(om.contains("# TYPE vgpu_license_licensed gauge\n"));
        assert!(om.contains("# TYPE vgpu_license_dls_clock_skew_seconds gauge\n"));
        assert!(!om.contains("_total counter"), "{om}");
        // The samples are the classic text's, in the same order.
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .map(String::from)
                .collect()
        };
        assert_eq!(samples(&classic), samples(&om));
        // Every family's metadata precedes its samples, once.
        let mut seen = std::collections::HashSet::new();
        for l in om.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(seen.insert(l.to_string()), "{l} twice");
        }
    }

    #[test]
    fn openmetrics_escapes_double_quotes_in_help() {
        let om = openmetrics("# HELP x_total a \"b\" \\\\ c\n# TYPE x_total counter\nx_total 1\n");
        assert_eq!(
            om,
            "# HELP x a \\\"b\\\" \\\\ c\n# TYPE x counter\nx_total 1\n# EOF\n"
        );
    }
}
