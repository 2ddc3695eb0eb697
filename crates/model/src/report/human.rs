//! The short summary a person reads: state, edition, expiry in UTC and local time, the
//! failure and its fix.

use std::fmt::Write;

use chrono::{DateTime, Local, Utc};

use super::{Gpu, Report, Role, State, Vm, VmState, host_tally, vgpu_tally};
use crate::text::escape;

fn describe(state: State) -> &'static str {
    match state {
        State::Licensed => "licensed",
        State::Unlicensed => "unlicensed (full speed for now; throttled after the grace period)",
        State::Restricted => "unlicensed and RESTRICTED (the GPU is throttled)",
        State::NotLicensable => "not licensable (no vGPU here needs a license)",
        State::NoGpu => "no NVIDIA GPU in this guest: nothing to license",
        State::NoDriver => "no NVIDIA driver answers",
        State::Unknown => "unknown (not enough to tell)",
    }
}

/// `2024-12-14 17:16:31 UTC (2024-12-15 01:16:31 +08:00 local)`
pub fn both_times(t: DateTime<Utc>) -> String {
    format!(
        "{} UTC ({} local)",
        t.format("%Y-%m-%d %H:%M:%S"),
        t.with_timezone(&Local).format("%Y-%m-%d %H:%M:%S %:z")
    )
}

/// The first line a monitoring check shows, in the monitoring-plugin form: the status word of
/// the exit code, then the state and what matters most (`OK: licensed (NVIDIA RTX Virtual
/// Workstation) until 2026-12-03 10:00:00 UTC`, `CRITICAL: unlicensed: token_missing: ...`).
pub fn summary_line(r: &Report) -> String {
    let word = match r.exit_code {
        0 => "OK",
        1 => "WARNING",
        2 => "CRITICAL",
        _ => "UNKNOWN",
    };
    let mut line = format!("{word}: {}", r.state.as_str());
    if r.state == State::NoGpu {
        line.push_str(": no NVIDIA GPU in this guest, nothing to license");
    }
    if let Some(tally) = vgpu_tally(r).or_else(|| host_tally(r)) {
        let _ = write!(line, ": {}", escape(&tally));
    }
    if let Some(l) = &r.license
        && r.state == State::Licensed
    {
        if let Some(ed) = &l.edition {
            let _ = write!(line, " ({})", escape(ed));
        }
        if let Some(exp) = l.expiry {
            let _ = write!(line, " until {}", exp.format("%Y-%m-%d %H:%M:%S UTC"));
        }
    }
    if let Some(f) = &r.failure {
        let _ = write!(line, ": {}: {}", f.reason.as_str(), escape(&f.message));
    }
    line
}

/// Renders the report for a terminal.
pub fn render(r: &Report) -> String {
    if r.role == Role::Host {
        return render_host(r);
    }
    let mut o = String::new();
    license_lines(&mut o, r);
    where_lines(&mut o, r);
    failure_lines(&mut o, r);
    event_lines(&mut o, r);
    o
}

/// A host's state, said of its guests.
fn describe_host(state: State) -> &'static str {
    match state {
        State::Licensed => "licensed (every guest whose driver answers holds a license)",
        State::Unlicensed => {
            "a guest is unlicensed (full speed for now; throttled after the grace period)"
        }
        State::Restricted => "a guest is unlicensed and RESTRICTED (its vGPU is throttled)",
        State::NotLicensable => {
            "nothing asks for a license (no active vGPU, or none whose guest driver answers)"
        }
        State::Unknown => "unknown (not enough to tell)",
        other => describe(other),
    }
}

/// A host's report: its state, the headline, one line per VM's vGPU, the notes.
fn render_host(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Host:     {}", describe_host(r.state));
    if let Some(tally) = host_tally(r) {
        let _ = writeln!(o, "vGPUs:    {}", escape(&tally));
    }
    for v in r.vms.iter().flatten() {
        let _ = writeln!(o, "VM:       {}", vm_line(v));
    }
    for n in &r.notes {
        let _ = writeln!(o, "Note:     {}", escape(n));
    }
    o
}

/// `tenant-b_vm-b: restricted (Unlicensed (Restricted)), NVIDIA L40S-24Q on GPU
/// 00000000:41:00.0, guest driver 580.105.08, KubeVirt namespace tenant-b, VMI vm-b`.
fn vm_line(v: &Vm) -> String {
    let shown = |f: &Option<String>| escape(f.as_deref().unwrap_or("?")).into_owned();
    let name = match v.vm_name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => escape(n).into_owned(),
        None => escape(&v.name()).into_owned(),
    };
    let state = match (v.state, v.expiry) {
        (VmState::Licensed, Some(exp)) => {
            format!("licensed until {}", exp.format("%Y-%m-%d %H:%M:%S UTC"))
        }
        (VmState::Licensed, None) => "licensed".to_string(),
        (VmState::Unknown, _) if v.guest_driver.is_none() => {
            "unknown (no guest driver answers yet)".to_string()
        }
        (VmState::Unknown, _) if v.license_status.is_none() => {
            "unknown (this output shows no License Status)".to_string()
        }
        (s, _) => format!("{} ({})", s.as_str(), shown(&v.license_status)),
    };
    let mut line = format!(
        "{name}: {state}, {} on GPU {}, guest driver {}",
        shown(&v.profile),
        shown(&v.gpu),
        v.guest_driver
            .as_deref()
            .map_or_else(|| "none".to_string(), |d| escape(d).into_owned()),
    );
    if let Some(k) = &v.kubevirt {
        let _ = write!(
            line,
            ", KubeVirt namespace {}, VMI {}",
            escape(&k.namespace),
            escape(&k.vmi)
        );
    }
    line
}

/// The state, the licensing mode and the license held.
fn license_lines(o: &mut String, r: &Report) {
    let _ = writeln!(o, "State:    {}", describe(r.state));
    if r.mode.as_deref() == Some("observe") {
        let place = match r.driver_root.as_ref().and_then(|d| d.as_deref()) {
            Some(root) => format!(
                "a GPU Operator node: the driver container (root {}) owns the token, gridd.conf and gridd",
                escape(root)
            ),
            None => "service.mode = \"observe\"".to_string(),
        };
        let _ = writeln!(o, "Agent:    observes only, changes nothing ({place})");
    }
    if let Some(mode) = r.licensing_mode {
        let _ = writeln!(o, "Licensing: {}", mode.describe_for(r.dls.is_some()));
    }
    if let Some(l) = &r.license {
        if let Some(ed) = &l.edition {
            let _ = writeln!(o, "Edition:  {}", escape(ed));
        }
        // Several vGPUs, each licensed on its own: how many hold a license, and which not.
        if let Some(tally) = vgpu_tally(r) {
            let _ = writeln!(o, "Status:   {}", escape(&tally));
        } else if let Some(st) = &l.status {
            let _ = writeln!(o, "Status:   {}", escape(st));
        }
        if let Some(exp) = l.expiry {
            let _ = writeln!(o, "Expires:  {}", both_times(exp));
        }
    }
}

/// The GPUs, the DLS nodes the token names, and the server gridd last named.
fn where_lines(o: &mut String, r: &Report) {
    for g in &r.gpus {
        let _ = writeln!(
            o,
            "GPU:      {} ({}){}",
            escape(&g.name()),
            escape(g.virtualization_mode.as_deref().unwrap_or("mode not shown")),
            gpu_license(g),
        );
    }
    if let Some(dls) = &r.dls {
        let nodes: Vec<String> = dls
            .iter()
            .map(|d| format!("{}:{}", escape(&d.host), d.port))
            .collect();
        let _ = writeln!(o, "DLS:      {}", nodes.join(", "));
    }
    if let Some(last) = r.events.iter().rev().find(|e| e.server.is_some()) {
        let _ = writeln!(
            o,
            "Server:   {} (from gridd's last {} line)",
            escape(last.server.as_deref().unwrap_or_default()),
            serde_json::to_value(last.kind)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        );
    }
}

/// A GPU's own license after its name: `: Licensed until 2026-12-07 10:00:00 UTC`,
/// `: Unlicensed (Restricted)`; nothing for a GPU that shows no license status.
fn gpu_license(g: &Gpu) -> String {
    match (g.license_status.as_deref(), g.expiry) {
        (Some(_), Some(exp)) if g.state == Some(State::Licensed) => {
            format!(": Licensed until {}", exp.format("%Y-%m-%d %H:%M:%S UTC"))
        }
        (Some(status), _) => format!(": {}", escape(status)),
        (None, _) => String::new(),
    }
}

/// The failure and its fix, and the notes.
fn failure_lines(o: &mut String, r: &Report) {
    if let Some(f) = &r.failure {
        let at = f.at.map(|a| format!(" at {a}")).unwrap_or_default();
        let _ = writeln!(
            o,
            "Failure:  {}{at}: {}",
            f.reason.as_str(),
            escape(&f.message)
        );
        let _ = writeln!(o, "Fix:      {}", escape(&f.advice));
    }
    for n in &r.notes {
        let _ = writeln!(o, "Note:     {}", escape(n));
    }
}

/// How many events gridd's log gave, and the last five.
fn event_lines(o: &mut String, r: &Report) {
    if r.events.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "Events:   {} from gridd's log{}; the last ones:",
        r.events.len(),
        if r.events_omitted > 0 {
            format!(" (and {} older ones left out)", r.events_omitted)
        } else {
            String::new()
        }
    );
    for e in r.events.iter().rev().take(5).rev() {
        let _ = writeln!(
            o,
            "  {}  {}",
            e.at.map_or_else(|| "(no time)".into(), |a| a.to_string()),
            escape(&e.message)
        );
    }
}
