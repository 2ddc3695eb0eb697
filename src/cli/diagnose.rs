//! `diagnose`: live checks, one line each with what is wrong and how to fix it: the driver,
//! the vGPU mode, the token (present, decodable, valid now, mode, alone in its directory),
//! gridd.conf, nvidia-gridd's unit, every DLS node of the token (DNS, TCP, TLS, HTTPS) and the
//! clock against the DLS, then the license itself.
//!
//! The same observation as `status` and the service ([`live::observe`]), so the report it
//! prints with `--json` is the one they print; the DLS probe's verdict becomes the report's
//! failure where the report knows nothing more specific ([`crate::model::policy::probe_refines`]).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cli::JsonArg;
use crate::model::assemble::{self, TokenProblem, token_at};
use crate::model::config::Settings;
use crate::model::gridd_conf::{GriddConf, feature_type_advice};
use crate::model::observe::smi::SmiSnapshot;
use crate::model::observe::unit::UnitState;
use crate::model::report::human::both_times;
use crate::model::report::{LicensingMode, Reason, Report, State};
use crate::model::state;
use crate::model::token::Untimely;
use crate::observe::live;
use crate::probe::{self, NodeProbe, StepName};
use anyhow::Context;
use std::process::ExitCode;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not checked (with the reason in the message).
    Skip,
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// `driver`, `vgpu`, `token`, `token-mode`, `token-dir`, `gridd.conf`, `gridd`,
    /// `dls-dns`, `dls-tcp`, `dls-tls`, `dls-https`, `clock`, `license`.
    pub name: &'static str,
    pub status: Status,
    /// What was found (what is wrong, when it is).
    pub message: String,
    /// How to fix it, where something is wrong.
    pub fix: Option<String>,
}

fn check(name: &'static str, status: Status, message: impl Into<String>) -> Check {
    Check {
        name,
        status,
        message: message.into(),
        fix: None,
    }
}

impl Check {
    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

/// Everything `diagnose` found.
#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
    pub probes: Vec<NodeProbe>,
    pub report: Report,
}

impl Diagnosis {
    /// 0 all checks pass, 1 a warning, 2 a failure, 3 nothing could be checked.
    pub fn exit_code(&self) -> u8 {
        exit_code(&self.checks)
    }

    /// The report with the checks and the probes added (`checks`, `dls_probes`).
    pub fn to_json(&self) -> serde_json::Result<serde_json::Value> {
        let mut v = serde_json::to_value(&self.report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("checks".into(), serde_json::to_value(&self.checks)?);
            o.insert("dls_probes".into(), serde_json::to_value(&self.probes)?);
        }
        Ok(v)
    }
}

/// 0 all checks pass, 1 a warning, 2 a failure, 3 nothing could be checked (all skipped).
pub fn exit_code(checks: &[Check]) -> u8 {
    match checks.iter().map(|c| c.status).max() {
        Some(Status::Fail) => 2,
        Some(Status::Warn) => 1,
        Some(Status::Ok) => 0,
        Some(Status::Skip) | None => 3,
    }
}

/// The checklist for a terminal: `FAIL token      the installed token expired ... -> fix`,
/// then a count.
pub fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut o = String::new();
    for c in checks {
        let _ = write!(
            o,
            "{:<4} {:<width$}  {}",
            c.status.label(),
            c.name,
            c.message
        );
        if let Some(fix) = &c.fix {
            let _ = write!(o, " -> {fix}");
        }
        o.push('\n');
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        o,
        "{} {}: {} ok, {} warning, {} failed, {} skipped",
        checks.len(),
        if checks.len() == 1 { "check" } else { "checks" },
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    );
    o
}

/// Runs every check now.
pub fn diagnose(settings: &Settings, now: DateTime<Utc>) -> Diagnosis {
    // On a GPU Operator node, the driver's files under its root, and its fixes.
    let node = crate::node::detect(settings);
    let settings = &node.apply(settings);
    let mut d = diagnose_at(settings, now);
    if node.driver_root.is_some() {
        operator_fixes(&mut d.checks, &node);
    }
    for c in &mut d.checks {
        c.fix = c.fix.take().map(|f| state::in_diagnose(&f));
    }
    d
}

/// On a GPU Operator node every fix is one that works there: the token, the token directory
/// and gridd.conf are the operator's Secret's, and a driver that does not answer is its
/// driver pod. The token's mode is the entrypoint's copy of the Secret's (0644 as a Secret
/// volume gives it), which gridd, as root, reads: nothing to fix.
fn operator_fixes(checks: &mut [Check], node: &crate::model::node::Node) {
    let name = node.node_name.as_deref();
    for c in checks.iter_mut().filter(|c| c.fix.is_some()) {
        match c.name {
            "token-mode" => {
                c.status = Status::Ok;
                c.message = format!(
                    "{}: the GPU Operator's driver container copies it so from the Secret, and its gridd reads it as root",
                    c.message.split(',').next().unwrap_or_default()
                );
                c.fix = None;
            }
            "token" | "token-dir" | "token-owner" | "gridd.conf" => {
                c.fix = Some(crate::model::policy::operator_fix(name));
            }
            "driver" if !node.driver_ready => {
                c.fix = Some(crate::model::policy::driver_pod_advice(name));
            }
            _ => {}
        }
    }
}

fn diagnose_at(settings: &Settings, now: DateTime<Utc>) -> Diagnosis {
    let mut look = live::look(settings, now, state::MAX_EVENTS);
    // What only the running service knows, as `status` shows it from the service's report.
    look.served = crate::cli::status::from_service(settings).map(|(served, _)| served);
    if look.smi.no_device {
        // Nothing to license: no check below applies, and none fails.
        return nothing_to_license(settings, assemble::observe(settings, &look));
    }
    if look.smi.host_view {
        // A vGPU host: no token, gridd or DLS of its own; its VMs' licenses, each with its fix.
        return host_diagnosis(settings, assemble::observe(settings, &look), &look.smi);
    }
    // A token whose dates this guest's clock rejects still names its DLS: asking it is how the
    // clock is measured ("not valid yet" is itself the sign of a clock behind).
    let named = look.token.as_ref().ok().cloned();
    let targets = named.as_ref().map(probe::targets).unwrap_or_default();
    let via = live::gridd_proxy(settings);
    let proxy = via.as_ref().ok().and_then(Option::as_ref);
    let probes = probe::probe_all(&targets, proxy, settings.service.probe_timeout);
    // The probe's finding is an observation: `evaluate` applies it where gridd was vague.
    look.probe = probe::verdict(&probes, settings.service.clock_skew_max);
    let obs = assemble::observe(settings, &look);
    let mode = state::licensing_mode(
        obs.token.as_ref(),
        obs.log.as_ref().map(|(f, _)| f),
        obs.smi.as_ref(),
        obs.legacy_server.as_deref(),
    );
    let smi = &look.smi;
    let mut checks = local_checks(settings, now, smi, mode, obs.token.is_some());
    checks.extend(proxy_check(&via));
    if named.is_some() {
        let driver = smi.driver_version.as_deref();
        checks.extend(dls_checks(&probes, &targets, settings, now, mode, driver));
    } else {
        let skipped = "DLS checks skipped: no usable token names a DLS";
        checks.push(check("dls", Status::Skip, skipped));
    }
    let report = state::evaluate(obs);
    checks.push(license_check(&report, &checks));
    Diagnosis {
        checks,
        probes,
        report,
    }
}

/// The DLS's checks: each address the token names, probed, and those left unprobed.
fn dls_checks(
    probes: &[NodeProbe],
    targets: &[(String, u16)],
    settings: &Settings,
    now: DateTime<Utc>,
    mode: LicensingMode,
    driver: Option<&str>,
) -> Vec<Check> {
    let mut checks = Vec::new();
    for p in probes {
        checks.extend(probe_checks(p, settings, now, mode, driver));
    }
    checks.extend(not_probed_check(targets));
    checks
}

/// A vGPU host's checks: the vGPU manager's driver and its service, then one line per VM's
/// vGPU with its guest's fix (a host holds no token, gridd or lease of its own, so none of a
/// guest's checks applies).
fn host_diagnosis(settings: &Settings, obs: state::Observations, smi: &SmiSnapshot) -> Diagnosis {
    let report = state::evaluate(obs);
    let vms = report.vms.clone().unwrap_or_default();
    let mut checks = vec![check(
        "driver",
        Status::Ok,
        format!(
            "the vGPU manager's driver{} answers: {} active vGPU(s) (nvidia-smi vgpu -q)",
            smi.driver_version
                .as_deref()
                .map_or(String::new(), |v| format!(
                    " {}",
                    crate::model::text::escape(v)
                )),
            vms.len()
        ),
    )];
    checks.push(vgpu_manager_check(settings));
    checks.extend(vms.iter().map(vm_check));
    Diagnosis {
        checks,
        probes: Vec::new(),
        report,
    }
}

/// The vGPU manager's service: its systemd unit, or the GPU Operator's container.
fn vgpu_manager_check(settings: &Settings) -> Check {
    if let Some(root) = &settings.commands.smi_root {
        return check(
            "vgpu-manager",
            Status::Ok,
            format!(
                "the vGPU manager runs in the GPU Operator's container (its root {})",
                crate::model::text::show_path(root)
            ),
        );
    }
    const UNIT: &str = "nvidia-vgpu-mgr.service";
    let argv = vec![
        settings.commands.systemctl.clone(),
        "is-active".into(),
        UNIT.into(),
    ];
    let state = crate::gridd::command::run(&argv, settings.commands.timeout)
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    match state.as_str() {
        "active" => check("vgpu-manager", Status::Ok, format!("{UNIT} is active")),
        "" => check(
            "vgpu-manager",
            Status::Skip,
            format!("systemctl cannot tell whether {UNIT} runs"),
        ),
        other => check(
            "vgpu-manager",
            Status::Warn,
            format!("{UNIT} is {}", crate::model::text::escape(other)),
        )
        .fix(format!(
            "`systemctl status {UNIT}` and `journalctl -u {UNIT}`: the vGPU manager must run for any VM to get its vGPU"
        )),
    }
}

/// One VM's vGPU: its state as its guest driver reports it, and what its guest needs.
fn vm_check(v: &crate::model::report::Vm) -> Check {
    use crate::model::report::VmState;
    let what = format!(
        "VM {} (vGPU {}, {} on GPU {})",
        crate::model::text::escape(&v.name()),
        crate::model::text::escape(v.vgpu_id.as_deref().unwrap_or("?")),
        crate::model::text::escape(v.profile.as_deref().unwrap_or("?")),
        crate::model::text::escape(v.gpu.as_deref().unwrap_or("?"))
    );
    let owner = v.kubevirt.as_ref().map_or(String::new(), |k| {
        format!(
            "; its owner sees it in `kubectl -n {} describe vmi {}`",
            k.namespace, k.vmi
        )
    });
    let guest_fix = format!(
        "in the guest: its client configuration token (`vgpu-license-agent install --token-file FILE`, or the platform's Secret), gridd.conf's FeatureType, and its way to the DLS; `vgpu-license-agent status` inside it names the cause{owner}"
    );
    let status =
        crate::model::text::escape(v.license_status.as_deref().unwrap_or("?")).into_owned();
    match v.state {
        VmState::Licensed => check("vm", Status::Ok, format!("{what}: licensed ({status})")),
        VmState::Unlicensed => check(
            "vm",
            Status::Warn,
            format!("{what}: no license ({status}): throttled after the grace period"),
        )
        .fix(guest_fix),
        VmState::Restricted => check(
            "vm",
            Status::Fail,
            format!("{what}: throttled ({status}): its CUDA calls fail"),
        )
        .fix(guest_fix),
        VmState::Unknown => check(
            "vm",
            Status::Ok,
            format!("{what}: no guest driver answers (booting, or a guest without NVIDIA's driver): nothing asks for a license"),
        )
        .fix(format!(
            "where the VM should use its vGPU, install NVIDIA's vGPU guest driver of the host's branch in it{owner}"
        )),
    }
}

/// No NVIDIA device on the guest: one check that says so, and the report.
fn nothing_to_license(settings: &Settings, obs: state::Observations) -> Diagnosis {
    Diagnosis {
        checks: vec![check(
            "gpu",
            Status::Ok,
            format!(
                "no NVIDIA device on this guest's PCI bus ({}): nothing to license",
                crate::model::text::show_path(&settings.paths.pci_devices)
            ),
        )],
        probes: Vec::new(),
        report: state::evaluate(obs),
    }
}

/// The checks of this guest itself: the driver, the vGPU, the licensing mode, the token,
/// gridd.conf and gridd.
fn local_checks(
    settings: &Settings,
    now: DateTime<Utc>,
    smi: &SmiSnapshot,
    mode: LicensingMode,
    token_read: bool,
) -> Vec<Check> {
    let mut checks = vec![driver_check(smi)];
    checks.push(vgpu_check(smi));
    let status = if mode == LicensingMode::Unknown {
        Status::Skip
    } else {
        Status::Ok
    };
    checks.push(check(
        "mode",
        status,
        format!("licensing mode: {}", mode.describe_for(token_read)),
    ));
    checks.extend(token_checks(settings, now, mode));
    checks.push(gridd_conf_check(settings, smi, mode));
    checks.push(gridd_check(settings));
    checks
}

/// The proxy gridd.conf names, where it names one: the DLS checks go through it.
fn proxy_check(via: &Result<Option<crate::model::gridd_conf::Proxy>, String>) -> Option<Check> {
    match via {
        Ok(Some(proxy)) => Some(check(
            "proxy",
            Status::Ok,
            format!(
                "gridd reaches its license service through proxy {proxy} (gridd.conf ProxyServerAddress{}); the checks below go the same way",
                if proxy.user.is_some() { ", with ProxyUserName" } else { "" }
            ),
        )),
        Ok(None) => None,
        Err(e) => Some(
            check("proxy", Status::Fail, e.clone())
                .fix("fix the proxy keys in gridd.conf, then `systemctl restart nvidia-gridd`; the checks below go without a proxy"),
        ),
    }
}

/// A token that names more DLS endpoints than are probed: a warning.
fn not_probed_check(targets: &[(String, u16)]) -> Option<Check> {
    let left = probe::not_probed(targets);
    (left > 0).then(|| {
        check(
            "dls",
            Status::Warn,
            format!(
                "the token names {} DLS endpoints; the first {} were probed, {left} not",
                targets.len(),
                probe::MAX_PROBED
            ),
        )
        .fix("a DLS has one or two nodes: download the client configuration token again from the DLS")
    })
}

fn driver_check(smi: &SmiSnapshot) -> Check {
    if let Some(why) = smi.unanswered.as_ref().filter(|_| smi.gpus.is_empty()) {
        return check("driver", Status::Fail, format!("nvidia-smi did not answer: {why}")).fix(
            "look for NVRM or Xid errors in `dmesg`; a hung driver is usually cleared by rebooting the guest",
        );
    }
    if smi.gpus.is_empty() {
        return match &smi.driver_error {
            Some(why) => check("driver", Status::Fail, why.clone()).fix(state::driver_advice(why)),
            None => check("driver", Status::Fail, "nvidia-smi lists no GPU").fix(
                "attach a vGPU to this VM (`lspci | grep -i nvidia` shows it) and load the guest driver",
            ),
        };
    }
    let n = smi.gpus.len();
    let version = smi
        .driver_version
        .as_deref()
        .map(|v| format!("driver {v}, "))
        .unwrap_or_default();
    check(
        "driver",
        Status::Ok,
        format!(
            "nvidia-smi answers: {version}{n} GPU{}",
            if n == 1 { "" } else { "s" }
        ),
    )
}

fn vgpu_check(smi: &SmiSnapshot) -> Check {
    if smi.gpus.is_empty() {
        return check("vgpu", Status::Skip, "no GPU to look at");
    }
    let name = |g: &crate::model::observe::smi::SmiGpu| {
        format!(
            "{} {}",
            g.bus_id.as_deref().unwrap_or("GPU"),
            g.profile.as_deref().unwrap_or("(unknown profile)")
        )
    };
    let mut vgpu = Vec::new();
    let mut other = Vec::new();
    let mut unknown = Vec::new();
    for g in &smi.gpus {
        match g.virtualization_mode.as_deref().map(str::trim) {
            Some(m) if m.eq_ignore_ascii_case("VGPU") => vgpu.push(name(g)),
            Some(m) => other.push(format!("{} is in {m} mode", name(g))),
            None => unknown.push(name(g)),
        }
    }
    if !other.is_empty() {
        return check(
            "vgpu",
            Status::Warn,
            format!(
                "{}: not a vGPU, so not licensable (nothing to license there)",
                other.join(", ")
            ),
        )
        .fix("nothing to do if passthrough is meant (use the data-center driver there); for a licensed vGPU, give the VM a vGPU profile");
    }
    if vgpu.is_empty() {
        return check(
            "vgpu",
            Status::Skip,
            "nvidia-smi does not show the virtualization mode",
        );
    }
    let mut msg = format!("{}: VGPU mode", vgpu.join(", "));
    if !unknown.is_empty() {
        let _ = write!(msg, "; mode not shown for {}", unknown.join(", "));
    }
    check("vgpu", Status::Ok, msg)
}

const INSTALL_FIX: &str = "generate a client configuration token on the DLS (Service Instance > Generate client config token) and run `vgpu-license-agent install --token-file FILE`";

fn token_checks(settings: &Settings, now: DateTime<Utc>, mode: LicensingMode) -> Vec<Check> {
    let ts = live::token_state(settings, now);
    let path = crate::model::text::show_path(&ts.path).to_string();
    let main = match &token_at(&ts.token, now) {
        Ok(t) => token_ok_check(t, &path, now),
        // The platform or the legacy server licenses this guest: no token is the normal case.
        Err(TokenProblem::Missing)
            if matches!(mode, LicensingMode::CloudProvider | LicensingMode::Legacy) =>
        {
            check(
                "token",
                Status::Skip,
                format!(
                    "no token at {path}, and none needed: the licensing mode is {}",
                    mode.describe()
                ),
            )
        }
        Err(p) => token_problem_check(p, &path, settings),
    };
    let mode = token_mode_check(ts.mode, &path);
    let dir = crate::model::text::show_path(&settings.paths.token_dir);
    let strays = token_dir_check(settings, &ts, &dir);
    let owner = token_owner_check(&ts, &dir);
    let mut checks = vec![main, mode, strays];
    checks.extend(owner);
    checks.extend(source_check(settings));
    checks
}

/// A token valid now: its expiry and its DLS nodes; a warning when it expires soon.
fn token_ok_check(t: &crate::model::token::Token, path: &str, now: DateTime<Utc>) -> Check {
    let n = t.nodes.len();
    let until = t
        .expires
        .map(|e| format!("valid until {}", both_times(e)))
        .unwrap_or_else(|| "no expiry".into());
    let soon = t.expires_soon(now).is_some();
    let msg = format!(
        "{path}: decodes, {until}, {n} DLS node{}",
        if n == 1 { "" } else { "s" }
    );
    if soon {
        check(
            "token",
            Status::Warn,
            format!(
                "{msg}: expires within {} days",
                crate::model::token::EXPIRY_WARNING_DAYS
            ),
        )
        .fix(INSTALL_FIX)
    } else {
        check("token", Status::Ok, msg)
    }
}

/// No token usable now: why, and its fix.
fn token_problem_check(p: &TokenProblem, path: &str, settings: &Settings) -> Check {
    let fix = match p {
        // The platform brings the token: installing one by hand is not the way.
        TokenProblem::Missing if settings.paths.token_source.is_some() => format!(
            "the service installs the token from the token source {} (paths.token_source) once it holds one: see the token-source check",
            settings
                .paths
                .token_source
                .as_deref()
                .map(crate::model::text::show_path)
                .unwrap_or_default()
        ),
        TokenProblem::Missing
        | TokenProblem::Invalid(_)
        | TokenProblem::Untimely(Untimely::Expired(_)) => INSTALL_FIX.to_string(),
        TokenProblem::Unreadable(_) => format!(
            "check the file's permissions (`ls -l {}`); `vgpu-license-agent install` sets them",
            crate::model::text::show_path(&settings.paths.token_dir)
        ),
        TokenProblem::Untimely(Untimely::NotYetValid(_)) => "check this guest's clock (`timedatectl`); a DLS whose clock is ahead issues tokens that are not valid yet".into(),
    };
    let msg = match p {
        TokenProblem::Missing => format!("no token at {path}"),
        p => format!("{path}: {p}"),
    };
    check("token", Status::Fail, msg).fix(fix)
}

/// The token file's mode: NVIDIA asks for 0744.
fn token_mode_check(mode: Option<u32>, path: &str) -> Check {
    match mode {
        None => check("token-mode", Status::Skip, "no token file"),
        Some(0o744) => check("token-mode", Status::Ok, "mode 0744"),
        Some(m) => check(
            "token-mode",
            Status::Warn,
            format!(
                "mode {m:04o}, NVIDIA asks for 0744 (nvidia-gridd need not run as the file's owner)"
            ),
        )
        .fix(format!(
            "chmod 0744 {path} (`vgpu-license-agent install` sets it)"
        )),
    }
}

/// The platform's token source, as the service would take it: a token there that the agent
/// refuses is never installed, so a bad rotation shows here before the old token runs out.
fn source_check(settings: &Settings) -> Option<Check> {
    let checked = crate::install::check_source(settings)?;
    let shown = settings
        .paths
        .token_source
        .as_deref()
        .map(crate::model::text::show_path)
        .unwrap_or_default();
    Some(match checked {
        Ok(summary) => check(
            "token-source",
            Status::Ok,
            format!("{shown}: {summary}"),
        ),
        Err(why) if crate::model::policy::share_not_mounted(&why) => {
            check("token-source", Status::Fail, format!("{shown}: {why}")).fix(format!(
                "mount the share (`findmnt {shown}` shows none; `systemctl --failed` and `journalctl -b -u '*.mount'` say why): the Secret need not change, and the service installs its token as soon as it sees it"
            ))
        }
        Err(why) => check("token-source", Status::Fail, format!("{shown}: {why}")).fix(
            "put a valid client configuration token from the DLS into the source (rotate the Kubernetes Secret again); the service installs it as soon as it sees it",
        ),
    })
}

/// What else the token directory holds: strays are a problem until they are moved aside (a
/// non-token file makes gridd fail to decode and exit), a directory that is not a token
/// directory is refused.
fn token_dir_check(settings: &Settings, ts: &live::TokenState, dir: &str) -> Check {
    let Some(listing) = &ts.listing else {
        return check(
            "token-dir",
            Status::Fail,
            match &ts.token {
                Err(TokenProblem::Unreadable(why)) => why.clone(),
                _ => format!("{dir} cannot be read"),
            },
        )
        .fix(format!(
            "make {dir} a real directory owned by root (mode 0755), or set paths.token_dir"
        ));
    };
    if !listing.exists {
        return check("token-dir", Status::Skip, format!("no directory {dir}"));
    }
    if let Some(why) = &listing.refusal {
        return check("token-dir", Status::Fail, why.clone()).fix(format!(
            "point paths.token_dir at the directory gridd reads, or move what is not a token out of {dir}"
        ));
    }
    if let Some(c) = strays_check(settings, listing, dir) {
        return c;
    }
    match &listing.token {
        Some(_) => check("token-dir", Status::Ok, format!("only the token in {dir}")),
        None => check("token-dir", Status::Ok, format!("{dir} is empty")),
    }
}

/// Strays in the token directory: a failure where one is no token (gridd may exit on it), a
/// warning where they are old tokens or a file is still being written.
fn strays_check(
    settings: &Settings,
    listing: &crate::token::dir::Listing,
    dir: &str,
) -> Option<Check> {
    if let Some(c) = stuck_writers_check(listing, dir) {
        return Some(c);
    }
    let moved = format!(
        "move them out of {dir} (the running service moves strays to {}/replaced/ at its next look; `vgpu-license-agent install --token-file FILE` does too)",
        crate::model::text::show_path(&settings.paths.state_dir)
    );
    let not_tokens = listing
        .strays
        .iter()
        .any(|s| s.kind != crate::token::dir::StrayKind::OldToken);
    let (status, text) = if not_tokens {
        let what = if listing.has_gridd_conf() {
            "nvidia-gridd reads every file there and exits on a gridd.conf (its place is /etc/nvidia/gridd.conf)"
        } else {
            "nvidia-gridd reads every file there and may fail to decode them and exit"
        };
        let text = format!("{dir} also holds {}: {what}", listing.stray_names());
        (Status::Fail, text)
    } else if !listing.strays.is_empty() {
        let text = format!(
            "{dir} also holds old tokens ({}): which one nvidia-gridd uses is not known",
            listing.stray_names()
        );
        (Status::Warn, text)
    } else {
        return None;
    };
    Some(check("token-dir", status, text).fix(moved))
}

/// A file of the token directory that a process keeps open for writing past the bound.
fn stuck_writers_check(listing: &crate::token::dir::Listing, dir: &str) -> Option<Check> {
    let stuck = listing.stuck_writers(chrono::Utc::now());
    if stuck.is_empty() {
        return None;
    }
    let named: Vec<String> = stuck
        .iter()
        .map(|(n, secs)| format!("{n} (for {secs} s)"))
        .collect();
    let text = format!(
        "{dir} holds a file that a process keeps open for writing: {}; it is judged once its writer closes it, the rest of the directory is not held up",
        named.join(", ")
    );
    Some(check("token-dir", Status::Warn, text).fix(format!(
        "`fuser -v {dir}/*` names the process (an editor, a stuck copy): let it finish or stop it"
    )))
}

/// The token directory and the token must be root's and writable by root alone: anyone else
/// who can write there can replace the token gridd reads.
fn token_owner_check(ts: &live::TokenState, dir: &str) -> Option<Check> {
    let listing = ts.listing.as_ref().filter(|l| l.exists)?;
    let mut wrong = Vec::new();
    let me = nix::unistd::geteuid().as_raw();
    if let (Some(uid), Some(mode)) = (listing.uid, listing.mode) {
        if uid != 0 && uid != me {
            wrong.push(format!("{dir} is owned by uid {uid}"));
        }
        if mode & 0o022 != 0 {
            wrong.push(format!("{dir} is writable by others (mode {mode:04o})"));
        }
    }
    if let Some(t) = &listing.token {
        if t.uid != 0 && t.uid != me {
            wrong.push(format!(
                "the token {} is owned by uid {}",
                crate::model::text::show_path(&t.path),
                t.uid
            ));
        }
        if t.mode & 0o022 != 0 {
            wrong.push(format!(
                "the token {} is writable by others (mode {:04o})",
                crate::model::text::show_path(&t.path),
                t.mode
            ));
        }
    }
    Some(if wrong.is_empty() {
        check(
            "token-owner",
            Status::Ok,
            "the token and its directory are root's",
        )
    } else {
        check(
            "token-owner",
            Status::Fail,
            format!("{}: whoever owns them can replace the token", wrong.join("; ")),
        )
        .fix(format!(
            "chown root:root {dir} {}; chmod 0755 {dir}; chmod 0744 the token (`vgpu-license-agent install` as root sets the modes, and refuses a directory owned by another user)",
            listing
                .token
                .as_ref()
                .map(|t| crate::model::text::show_path(&t.path))
                .unwrap_or_default()
        ))
    })
}

fn gridd_conf_check(settings: &Settings, smi: &SmiSnapshot, mode: LicensingMode) -> Check {
    let path = &settings.paths.gridd_conf;
    let shown = crate::model::text::show_path(path);
    let bytes = match gridd_conf_bytes(path, &shown) {
        Ok(b) => b,
        Err(c) => return c,
    };
    let conf = GriddConf::parse(&bytes);
    let mut findings: Vec<ConfFinding> = Vec::new();
    let ft_note = feature_type_findings(&conf, smi, &shown, &mut findings);
    for w in conf.warnings(&settings.paths.token_dir) {
        // A token path gridd will not find is fatal; legacy keys are only confusing, except
        // on a guest of the legacy server, where they are what licenses it: keep them.
        let status = if w.contains("ClientConfigTokenPath") {
            Status::Fail
        } else if mode == LicensingMode::Legacy {
            continue;
        } else {
            Status::Warn
        };
        findings.push((status, w, None));
    }
    findings_check(&shown, &findings).unwrap_or_else(|| {
        let fits = smi
            .gpus
            .iter()
            .find_map(|g| g.profile.as_deref())
            .map(|p| format!(", which fits the profile {p}"))
            .unwrap_or_default();
        check(
            "gridd.conf",
            Status::Ok,
            format!("{shown}: {ft_note}{fits}"),
        )
    })
}

/// What is wrong in gridd.conf: how bad, what, and its fix where it has one.
type ConfFinding = (Status, String, Option<String>);

/// gridd.conf's bytes, or the check that says why there are none to look at.
fn gridd_conf_bytes(path: &std::path::Path, shown: &str) -> Result<Vec<u8>, Check> {
    match crate::files::input::read_file(
        path,
        crate::install::MAX_GRIDD_CONF_BYTES,
        crate::files::input::Links::Refuse,
    ) {
        Ok(b) => Ok(b),
        Err(e) if e.is_not_found() => Err(check(
            "gridd.conf",
            Status::Ok,
            format!(
                "{shown} is absent: nvidia-gridd runs on its defaults (it logs that it cannot open the file, harmlessly)"
            ),
        )),
        Err(e @ crate::files::input::ReadError::NotRegular(_)) => Err(check(
            "gridd.conf",
            Status::Fail,
            format!("{shown} cannot be read: {e}"),
        )
        .fix(format!(
            "nvidia-gridd reads a regular file there: remove it (`rm {shown}`) and write the file (`vgpu-license-agent install` does)"
        ))),
        Err(e) => Err(check(
            "gridd.conf",
            Status::Warn,
            format!("{shown} cannot be read: {e}"),
        )
        .fix(format!("check its permissions: 0644 (`ls -l {shown}`)"))),
    }
}

/// What is wrong with gridd.conf's FeatureType, into `findings`; what it is, for a
/// gridd.conf with nothing wrong.
fn feature_type_findings(
    conf: &GriddConf,
    smi: &SmiSnapshot,
    shown: &str,
    findings: &mut Vec<ConfFinding>,
) -> String {
    let restart = "then `systemctl restart nvidia-gridd`";
    let ft_fix = format!(
        "set FeatureType=1 in {shown} (`vgpu-license-agent install --feature-type 1` does it), {restart}"
    );
    let Some(e) = conf.get("FeatureType") else {
        return "FeatureType not set".to_string();
    };
    let Ok(ft) = e.value.parse::<u8>() else {
        findings.push((
            Status::Fail,
            format!(
                "line {}: FeatureType={} is not a number gridd knows",
                e.line, e.value
            ),
            Some(ft_fix),
        ));
        return String::new();
    };
    if let Some(advice) = feature_type_advice(ft, &smi.gpus) {
        findings.push((Status::Fail, advice, Some(ft_fix)));
    } else if !matches!(ft, 0 | 1 | 2 | 4) {
        findings.push((
            Status::Warn,
            format!("FeatureType={ft} is not a value gridd knows (0, 1, 2 or 4)"),
            Some(ft_fix),
        ));
    }
    format!("FeatureType={ft}")
}

/// The check of gridd.conf's findings, as bad as the worst; `None` without any.
fn findings_check(shown: &str, findings: &[ConfFinding]) -> Option<Check> {
    let worst = findings.iter().map(|f| f.0).max()?;
    let msg = findings
        .iter()
        .map(|f| f.1.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let fixes: Vec<String> = findings.iter().filter_map(|f| f.2.clone()).collect();
    let c = check("gridd.conf", worst, format!("{shown}: {msg}"));
    Some(if fixes.is_empty() {
        c
    } else {
        c.fix(fixes.join("; "))
    })
}

fn gridd_check(settings: &Settings) -> Check {
    let unit = &settings.gridd.unit;
    if settings.commands.smi_root.is_some() {
        return check(
            "gridd",
            Status::Ok,
            "nvidia-gridd runs in the GPU Operator's driver container, without a unit on the node: its lines are read from the node's journal",
        );
    }
    match crate::gridd::unit_state(settings) {
        Some(UnitState::Active) => check("gridd", Status::Ok, format!("{unit} is active")),
        Some(UnitState::WithoutUnit) => check(
            "gridd",
            Status::Ok,
            format!("nvidia-gridd runs, started without {unit} (by hand, or by a driver container)"),
        ),
        Some(UnitState::StartQueued(state)) => check(
            "gridd",
            Status::Warn,
            format!("{unit} is {state}, with a start job queued: systemd starts it once what it is ordered after is up"),
        )
        .fix(format!("`systemctl list-jobs` shows what the start waits for; `systemctl status {unit}` shows it once started")),
        Some(down @ UnitState::NotInstalled { .. }) => {
            check("gridd", Status::Fail, down.down().unwrap_or_default())
                .fix(state::GRIDD_MISSING_ADVICE)
        }
        Some(down @ UnitState::Stopped { .. }) => {
            check("gridd", Status::Fail, down.down().unwrap_or_default()).fix(format!(
                "`systemctl enable --now {unit}`, then `journalctl -u {unit}` if it stops again"
            ))
        }
        None => check(
            "gridd",
            Status::Skip,
            format!(
                "{} cannot tell whether {unit} runs (no systemd here?)",
                settings.commands.systemctl
            ),
        ),
    }
}

fn step_check_name(step: StepName) -> &'static str {
    match step {
        StepName::Dns => "dls-dns",
        StepName::Tcp => "dls-tcp",
        StepName::Tls => "dls-tls",
        StepName::Https => "dls-https",
    }
}

fn step_fix(step: StepName, p: &NodeProbe, mode: LicensingMode, driver: Option<&str>) -> String {
    let (host, port) = (crate::model::text::escape(&p.host), p.port);
    if step == StepName::Dns && !crate::probe::is_host_name(&p.host) {
        return "the token names a DLS that is no host name: download a new token from the DLS (and check that nothing edited this one)".into();
    }
    if let Some(fix) = way_fix(step, p, mode) {
        return fix;
    }
    match step {
        StepName::Dns => format!(
            "check /etc/resolv.conf and that this guest's DNS server knows {host} (`getent hosts {host}`), or generate a token on a DLS configured with its IP address"
        ),
        StepName::Tcp => format!(
            "open TCP {port} from this guest to {host} (firewall, security group, network policy) and check that the DLS appliance is up"
        ),
        StepName::Tls => {
            let mut fix = format!(
                "check that {} is the DLS's HTTPS port (the port in the token) and that no proxy or middlebox intercepts TLS on the way",
                p.endpoint()
            );
            if let Some(v) = driver.filter(|v| crate::model::policy::needs_dls_3_4(v)) {
                fix.push_str(&format!(
                    "; with driver {v} (vGPU 18 or later) the DLS must be 3.4 or later, and an older appliance fails the TLS handshake while DNS, TCP and the clock are fine: check its version in its web console and upgrade it"
                ));
            }
            fix
        }
        StepName::Https => "the DLS took the TLS connection but did not answer HTTP: check the appliance's health (its web console) and any proxy on the way".into(),
    }
}

/// The fix of a failed DNS or TCP step where the way to the license service is the cause:
/// gridd.conf's proxy, or the internet to NVIDIA's Cloud License Service.
fn way_fix(step: StepName, p: &NodeProbe, mode: LicensingMode) -> Option<String> {
    let (host, port) = (crate::model::text::escape(&p.host), p.port);
    match (step, &p.proxy) {
        (StepName::Dns, Some(proxy)) => Some(format!(
            "check the proxy's name in gridd.conf's ProxyServerAddress ({proxy}) and /etc/resolv.conf"
        )),
        (StepName::Tcp, Some(proxy)) if p.inconclusive => Some(format!(
            "read `journalctl -u nvidia-gridd` to see whether gridd gets through proxy {proxy}; `curl --proxy {proxy} --proxy-user USER https://{}/` checks the credentials by hand",
            p.endpoint()
        )),
        (StepName::Tcp, Some(proxy)) => Some(format!(
            "check that proxy {proxy} is up and allows CONNECT to {} (its access rules), and that gridd.conf names the right proxy",
            p.endpoint()
        )),
        (StepName::Dns | StepName::Tcp, None) if mode == LicensingMode::Cls => Some(format!(
            "NVIDIA's Cloud License Service is on the internet: allow TCP {port} from this guest to {host}; where the guest reaches the internet only through a proxy, set ProxyServerAddress and ProxyServerPort in gridd.conf (and ProxyUserName, ProxyCredentialsFilePath for one that asks for credentials), then `systemctl restart nvidia-gridd`"
        )),
        _ => None,
    }
}

fn probe_checks(
    p: &NodeProbe,
    settings: &Settings,
    now: DateTime<Utc>,
    mode: LicensingMode,
    driver: Option<&str>,
) -> Vec<Check> {
    let ep = p.endpoint();
    let mut out = Vec::new();
    let mut blocked: Option<StepName> = None;
    for name in StepName::ALL {
        let cn = step_check_name(name);
        let Some(s) = p.step(name) else {
            let why = blocked
                .map(|b| format!("{b} failed"))
                .unwrap_or_else(|| "not reached".into());
            out.push(check(cn, Status::Skip, format!("{ep}: skipped, {why}")));
            continue;
        };
        if !s.ok {
            blocked = Some(name);
            // A proxy that wants gridd's own credentials stops the check, not gridd.
            let status = if p.inconclusive {
                Status::Warn
            } else {
                Status::Fail
            };
            out.push(
                check(cn, status, format!("{ep}: {name} failed: {}", s.detail))
                    .fix(step_fix(name, p, mode, driver)),
            );
            continue;
        }
        out.push(passed_step_check(p, s, now));
    }
    out.push(clock_check(p, settings.service.clock_skew_max));
    out
}

/// A step that passed; a warning where it is TLS and the certificate is not valid now.
fn passed_step_check(p: &NodeProbe, s: &probe::Step, now: DateTime<Utc>) -> Check {
    let (cn, ep) = (step_check_name(s.name), p.endpoint());
    if s.name == StepName::Tls
        && let Some(cert) = &p.certificate
        && !cert.valid_at(now)
    {
        return check(
            cn,
            Status::Warn,
            format!(
                "{ep}: {}; the certificate is not valid now (valid {} to {}), nvidia-gridd may refuse it",
                s.detail, cert.not_before, cert.not_after
            ),
        )
        .fix("renew the DLS appliance's certificate");
    }
    check(cn, Status::Ok, format!("{ep}: {}", s.detail))
}

/// The guest's clock against the DLS's `Date`, within `max`.
fn clock_check(p: &NodeProbe, max: std::time::Duration) -> Check {
    let ep = p.endpoint();
    match p.clock_skew_seconds {
        Some(skew) if skew.abs() <= max.as_secs_f64() => check(
            "clock",
            Status::Ok,
            format!(
                "guest clock is {} DLS {} (within {} s)",
                probe::skew_words(skew),
                p.host,
                max.as_secs()
            ),
        ),
        Some(skew) => check(
            "clock",
            Status::Fail,
            format!(
                "guest clock is {} DLS {} (more than the {} s allowed): gridd's requests are refused",
                probe::skew_words(skew),
                p.host,
                max.as_secs()
            ),
        )
        .fix(state::advice(Reason::ClockSkew, Some(&p.host), None, None)),
        None if p.reachable() => check(
            "clock",
            Status::Skip,
            format!("{ep}: the DLS sent no usable Date header"),
        ),
        None => check(
            "clock",
            Status::Skip,
            format!("{ep}: skipped, no HTTPS answer"),
        ),
    }
}

/// The license itself, as the report has it (its exit code gives the status, as `status`'s
/// does); the report's failure is shown where no failing check above says it already.
fn license_check(report: &Report, checks: &[Check]) -> Check {
    let lic = report.license.as_ref();
    let mut msg = match report.state {
        State::Licensed => "licensed",
        State::Unlicensed => "unlicensed (full speed for now, throttled after the grace period)",
        State::Restricted => "unlicensed and restricted: the GPU is throttled",
        State::NotLicensable => "not licensable: no vGPU here needs a license",
        State::NoGpu => "no NVIDIA GPU in this guest",
        State::NoDriver => "no driver answers",
        State::Unknown => "unknown: nvidia-smi and gridd's log do not tell",
    }
    .to_string();
    if let Some(ed) = lic.and_then(|l| l.edition.as_deref()) {
        let _ = write!(msg, ", {ed}");
    }
    if let Some(exp) = lic.and_then(|l| l.expiry) {
        let _ = write!(msg, ", lease until {}", both_times(exp));
    }
    for n in &report.notes {
        let _ = write!(msg, "; {n}");
    }
    let status = match report.exit_code {
        0 => Status::Ok,
        1 => Status::Warn,
        2 => Status::Fail,
        _ => Status::Skip,
    };
    match &report.failure {
        Some(f) if !covered(f.reason, checks) => {
            let _ = write!(msg, "; {}: {}", f.reason.as_str(), f.message);
            check("license", status, msg).fix(f.advice.clone())
        }
        _ => check("license", status, msg),
    }
}

/// Whether a failing check already says what a failure of this reason says.
fn covered(reason: Reason, checks: &[Check]) -> bool {
    let names = crate::model::policy::of(reason).diagnose_checks;
    checks
        .iter()
        .any(|c| c.status == Status::Fail && names.contains(&c.name))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_worst_check() {
        let c = |s| check("x", s, "m");
        assert_eq!(exit_code(&[c(Status::Ok), c(Status::Skip)]), 0);
        assert_eq!(exit_code(&[c(Status::Ok), c(Status::Warn)]), 1);
        assert_eq!(
            exit_code(&[c(Status::Warn), c(Status::Fail), c(Status::Ok)]),
            2
        );
        assert_eq!(exit_code(&[c(Status::Skip), c(Status::Skip)]), 3);
        assert_eq!(exit_code(&[]), 3);
    }

    #[test]
    fn lines_are_aligned_with_the_fix_after_an_arrow() {
        let out = render(&[
            check("token", Status::Fail, "the installed token expired").fix("install a new one"),
            check("gridd.conf", Status::Ok, "FeatureType=1"),
            check("clock", Status::Skip, "no HTTPS answer"),
        ]);
        assert_eq!(
            out,
            "FAIL token       the installed token expired -> install a new one\n\
             OK   gridd.conf  FeatureType=1\n\
             SKIP clock       no HTTPS answer\n\
             3 checks: 1 ok, 0 warning, 1 failed, 1 skipped\n"
        );
    }

    #[test]
    fn a_failure_is_repeated_only_where_no_check_said_it() {
        let checks = [
            check("dls-tcp", Status::Fail, "refused"),
            check("token", Status::Ok, "fine"),
        ];
        assert!(covered(Reason::DlsUnreachable, &checks));
        assert!(!covered(Reason::TokenInvalid, &checks));
        assert!(!covered(Reason::NoLicenseAvailable, &checks));
    }
}
