//! The state machine: observations in, the report out. Pure functions over values: no I/O,
//! no clock (the caller passes the moment of observation).

use std::path::Path;

use chrono::{DateTime, Utc};

use crate::identity::CloneDetected;
use crate::observe::app_log::{self, AppLog};
use crate::observe::journal::{GriddEvent, ScanStats, Stamp};
use crate::observe::smi::{LicenseStatus, SmiGpu, SmiSnapshot, classify_status};
use crate::observe::unit::UnitState;
use crate::report::{
    DlsEndpoint, Event, EventKind, Failure, Finding, Gpu, License, LicensingMode, Reason, Report,
    ServiceFacts, State,
};
use crate::time::{LogTime, rfc3339, whole_secs};
use crate::token::Token;

pub use crate::observations::{LogFold, NodeSeen, Observations, Since};
pub use crate::observe::smi::edition_for_profile;

/// Events a report keeps (the latest ones): the service's, `status`'s and `diagnose`'s
/// reports, and `analyze`'s unless `--max-events` says otherwise.
pub const MAX_EVENTS: usize = 200;

impl Since {
    /// Since when the report's failure `f` holds, where it is known.
    fn of(&self, f: &Failure) -> Option<DateTime<Utc>> {
        match f.reason {
            Reason::TokenRejected => self.token_rejected,
            Reason::TokenSourceRejected => self.source_rejected,
            Reason::DriverUnavailable | Reason::TokenStale => self
                .seen
                .as_ref()
                .filter(|((reason, message), _)| f.reason == *reason && f.message == *message)
                .map(|(_, since)| *since),
            _ => self
                .own
                .as_ref()
                .filter(|((reason, message), _)| f.reason == *reason && f.message == *message)
                .map(|(_, since)| *since),
        }
    }
}

/// Advice in the GPU Operator's terms on its node: what the operator changes, never what
/// only the agent would (it does not install or restart there).
fn operator_advice(f: &mut Failure, state: State, node: &NodeSeen) {
    let name = node.node_name.as_deref();
    match f.reason {
        _ if state == State::NoDriver && !node.driver_ready => {
            f.advice = crate::policy::driver_pod_advice(name);
        }
        Reason::TokenMissing
        | Reason::TokenInvalid
        | Reason::TokenExpired
        | Reason::FeatureTypeInvalid
        | Reason::TokenRejected => {
            f.advice = crate::policy::operator_fix(name);
        }
        Reason::GriddNotRunning => f.advice = crate::policy::driver_pod_advice(name),
        Reason::TokenStale => {
            f.advice = format!(
                "gridd runs with the token its driver pod copied when it started; the licensing Secret changed since (the operator mounts it with subPath: gpu-operator #2279). At a quiet moment, since it evicts this node's GPU workloads, make the driver pod again: {}",
                crate::policy::driver_pod_recycle(name)
            );
        }
        Reason::ClockSkew => {
            f.advice = format!(
                "The node's clock disagrees with the DLS: check `timedatectl` on the node (NTP synchronized) and the DLS appliance's clock, fix it, then make this node's driver pod again, since its gridd does not try again after a clock failure: {}",
                crate::policy::driver_pod_recycle(name)
            );
        }
        Reason::TrustedStore => {
            f.advice = format!(
                "nvidia-gridd's trusted store in the driver container is damaged or from another machine: make this node's driver pod again, which starts gridd with a store of its own: {}",
                crate::policy::driver_pod_recycle(name)
            );
        }
        Reason::RenewalStalled => {
            f.advice = format!(
                "gridd has not renewed the lease for longer than its renewal interval allows: the license runs out at its expiry. Run `vgpu-license-agent diagnose` on the node (DNS, TCP, TLS, the clock against the DLS) and look for this node in the DLS's log; make the driver pod again only once the DLS answers (its gridd returns the lease as it stops): {}",
                crate::policy::driver_pod_recycle(name)
            );
        }
        _ => {}
    }
}

/// Where the report's failure comes from: the agent's own finding (or its probe's), or gridd's
/// failure as its log gives it.
enum Chosen {
    Own(Finding),
    Log(GriddEvent),
}

/// The time of the log's last line as an instant, assuming UTC where the zone is unknown.
/// Local time is at most this far ahead of UTC anywhere (UTC+14).
const UNKNOWN_ZONE_SLACK_HOURS: i64 = 14;

fn approx_utc(st: &Stamp) -> Option<DateTime<Utc>> {
    st.utc().or_else(|| st.naive_as_utc())
}

/// Whether a lease acquired at `acq` with `expiry` is still valid at the log's `last` line.
fn lease_valid_at(acq: Option<&Stamp>, expiry: DateTime<Utc>, last: Option<&Stamp>) -> bool {
    let Some(last) = last else {
        return true; // The log does not say when it ends: as of its last line, held.
    };
    if let Some(t) = last.utc() {
        return expiry > t;
    }
    if let Some(t) = approx_utc(last) {
        // The log's zone is unknown: held unless past the expiry in every zone on Earth.
        return expiry
            .checked_add_signed(chrono::Duration::hours(UNKNOWN_ZONE_SLACK_HOURS))
            .is_none_or(|e| e > t);
    }
    // No year anywhere: compare positions within the year, the window from the acquisition
    // to the expiry possibly wrapping over New Year. The line's zone is unknown here too:
    // the same slack as above.
    let e = Stamp::from_utc(expiry).ord() + UNKNOWN_ZONE_SLACK_HOURS * 3600;
    let l = last.ord();
    match acq {
        Some(a) if a.ord() <= e => a.ord() <= l && l <= e,
        Some(a) => l >= a.ord() || l <= e,
        None => l <= e,
    }
}

fn event_of(e: &GriddEvent) -> Event {
    Event {
        at: e.stamp.and_then(|s| s.at()),
        kind: e.what.kind,
        server: e.what.server.clone(),
        edition: e.what.edition.clone(),
        expiry: e.what.expiry.map(whole_secs),
        reason: e.what.reason,
        message: e.message.clone(),
    }
}

/// Fills the year of yearless events from a later event that has one (oldest first).
fn resolve_years(events: &mut [GriddEvent]) {
    let mut later: Option<Stamp> = None;
    for e in events.iter_mut().rev() {
        let Some(st) = e.stamp.as_mut() else { continue };
        match (st.year, later) {
            (Some(_), _) => later = Some(*st),
            (None, Some(l)) => {
                let y = l.year.expect("only stamps with a year are kept");
                st.year = Some(if st.month > l.month { y - 1 } else { y });
            }
            (None, None) => {}
        }
    }
}

/// One or two sentences a person can follow, per reason.
pub fn advice(
    reason: Reason,
    server: Option<&str>,
    edition: Option<&str>,
    profile: Option<&str>,
) -> String {
    let dls = server.map_or("the DLS".to_string(), |s| format!("the DLS {s}"));
    // The same at the start of a sentence.
    let the_dls = server.map_or("The DLS".to_string(), |s| format!("The DLS {s}"));
    match reason {
        Reason::TokenMissing => "No client configuration token is installed: download it from the DLS and install it with `vgpu-license-agent install --token-file FILE` (or drop it with cloud-init write_files), which restarts nvidia-gridd.".into(),
        Reason::TokenInvalid => "nvidia-gridd could not read the token: keep exactly one file in /etc/nvidia/ClientConfigToken, the .tok from the DLS byte for byte (no gridd.conf, no old tokens); `vgpu-license-agent install --token-file FILE` does that and restarts nvidia-gridd.".into(),
        Reason::TokenExpired => "The client configuration token has expired: generate a new one on the DLS (Service Instance > Generate client config token) and install it with `vgpu-license-agent install`.".into(),
        Reason::ClockSkew => format!("The guest clock disagrees with {dls}: check `timedatectl` (NTP synchronized, the right time zone) here and the DLS appliance's clock, fix it (e.g. `systemctl restart systemd-timesyncd` or chronyd), then `systemctl restart nvidia-gridd`; restarting gridd alone does not help."),
        Reason::NoLicenseAvailable => {
            let ed = edition.map(String::from).or_else(|| profile.and_then(edition_for_profile).map(String::from));
            let why = match (profile, profile.and_then(edition_for_profile)) {
                (Some(p), Some(_)) => format!(", which the vGPU profile {p} needs (its last letter picks the edition)"),
                _ => String::new(),
            };
            match ed {
                Some(ed) => format!("{the_dls} has no free license of {ed}{why}: add licenses of that edition to the DLS's pool (or free some) and bind them to this service instance, or give the VM a profile whose edition the DLS holds."),
                None => format!("{the_dls} has no free license of the edition this profile needs: add licenses of that edition to the DLS's pool, or free some."),
            }
        }
        Reason::TrustedStore => "nvidia-gridd's local trusted store is damaged or from another machine (a cloned image?): stop nvidia-gridd, move /var/lib/nvidia/GridLicensing aside, start it again; seal images with `vgpu-license-agent prepare-image --purge-client-state`.".into(),
        Reason::LicensingUnsupported => "This GPU is not a licensable vGPU (passthrough or bare metal under the GRID guest driver): nothing to license here; use the data-center driver, or give the VM a vGPU profile.".into(),
        Reason::FeatureTypeInvalid => "FeatureType in /etc/nvidia/gridd.conf does not fit this GPU: set FeatureType=1 for a vGPU (the driver picks the edition from the profile), e.g. `vgpu-license-agent install --feature-type 1 ...`; 2 or 4 only for passthrough, then restart nvidia-gridd.".into(),
        Reason::DlsUnreachable => format!("{the_dls} cannot be reached from this guest: check DNS, the firewall (TCP 443 or the port in the token) and any proxy; `vgpu-license-agent diagnose` tries each step and names the one that fails."),
        Reason::DriverUnavailable => "No NVIDIA driver answers: install the NVIDIA vGPU (GRID) guest driver that matches the host's vGPU manager, or load it (`vgpu-license-agent diagnose` says which).".into(),
        Reason::TokenStale => "gridd runs with the token its driver pod copied when it started; the licensing Secret was changed since, and only a new driver pod copies it (gpu-operator #2279). Make the driver pod again at a quiet moment: it evicts this node's GPU workloads.".into(),
        Reason::CudaNotLicensed => APP_LICENSE_ADVICE.into(),
        Reason::TokenRejected => "The installed token still holds. A file meant as a new token was refused and moved to the agent's replaced/ directory (the message says which and why): download the token from the DLS again and copy it unchanged into the token directory; to choose a valid token that lost, run the install command the message gives.".into(),
        Reason::RenewalStalled => format!("gridd has not renewed the lease from {dls} for longer than its renewal interval allows: the license runs out at its expiry. Run `vgpu-license-agent diagnose` (DNS, TCP, TLS, the clock against the DLS) and look for this client in the DLS's log; restart nvidia-gridd only once the DLS answers: a restart returns the lease."),
        Reason::TokenSourceRejected => "The platform's token source (paths.token_source: a Kubernetes Secret shared into the guest, say) holds a token the agent refused (expired, undecodable, or no token at all), so it was not installed: put a valid client configuration token from the DLS into the Secret; the installed token, if any, stays until then.".into(),
        Reason::GriddNotRunning => "nvidia-gridd is not running: `systemctl enable --now nvidia-gridd`, then read `journalctl -u nvidia-gridd` if it stops again.".into(),
        Reason::Unspecified => format!("nvidia-gridd failed to get a license from {dls} without saying why: run `vgpu-license-agent diagnose` to check DNS, TCP, TLS and the clock against the DLS."),
        Reason::Other => format!("nvidia-gridd reported an error from the licensing library: run `vgpu-license-agent diagnose`; if {dls} is reachable and the clock is right, look for this client in the DLS's own log."),
    }
}

/// The advice where the finding's own words narrow the reason down: a token source whose
/// share did not mount.
fn advice_of_message(reason: Reason, message: &str) -> Option<String> {
    match reason {
        Reason::TokenSourceRejected if crate::policy::share_not_mounted(message) => {
            Some(SHARE_NOT_MOUNTED_ADVICE.into())
        }
        _ => None,
    }
}

/// The token source's share did not mount: the Secret behind it may be fine.
pub const SHARE_NOT_MOUNTED_ADVICE: &str = "The share that brings the token into this guest (paths.token_source: a KubeVirt virtiofs volume of the Secret) did not mount, so there is nothing to install yet; the Secret itself may be fine, and rotating it does not help. `findmnt` shows the mount missing; `systemctl --failed` and `journalctl -b -u '*.mount'` say why (the VM's volume, virtiofs in the guest). Once it is mounted, the service installs the token as soon as it sees it.";

/// nvidia-gridd's unit does not exist: `systemctl enable --now` cannot work.
pub const GRIDD_MISSING_ADVICE: &str = "nvidia-gridd's systemd unit is not installed: it comes with the NVIDIA vGPU (GRID) guest driver (the data-center driver has none; some builds ship the daemon without its unit): install the GRID guest driver, or add a unit running /usr/bin/nvidia-gridd; `vgpu-license-agent diagnose` shows what is there.";

/// Where `status`'s advice sends the reader next, word for word, and what `diagnose` says in
/// its place: there the reader is looking at the checks that command runs.
const DIAGNOSE_POINTERS: &[(&str, &str)] = &[
    // dls_unreachable
    (
        "; `vgpu-license-agent diagnose` tries each step and names the one that fails.",
        "; the dls-dns, dls-tcp, dls-tls and dls-https checks here name the step that fails.",
    ),
    // driver_unavailable
    (
        " (`vgpu-license-agent diagnose` says which).",
        " (the driver check here says which).",
    ),
    // renewal_stalled, on a guest and on a GPU Operator node
    (
        "Run `vgpu-license-agent diagnose` (DNS, TCP, TLS, the clock against the DLS) and look",
        "The checks here try DNS, TCP, TLS and the clock against the DLS; look",
    ),
    (
        "Run `vgpu-license-agent diagnose` on the node (DNS, TCP, TLS, the clock against the DLS) and look",
        "The checks here try DNS, TCP, TLS and the clock against the DLS; look",
    ),
    // unspecified
    (
        "run `vgpu-license-agent diagnose` to check DNS, TCP, TLS and the clock against the DLS.",
        "the dls and clock checks here try DNS, TCP, TLS and the clock against the DLS.",
    ),
    // other
    ("run `vgpu-license-agent diagnose`; if ", "if "),
    // gridd's unit missing
    ("; `vgpu-license-agent diagnose` shows what is there.", "."),
    // cuda_not_licensed
    (
        " (`vgpu-license-agent diagnose` checks the token, nvidia-gridd and the DLS)",
        " (the checks here look at the token, nvidia-gridd and the DLS)",
    ),
];

/// `status`'s advice as `diagnose` gives it: where it sends the reader to `diagnose`, the
/// checks `diagnose` has just shown instead.
pub fn in_diagnose(advice: &str) -> String {
    DIAGNOSE_POINTERS
        .iter()
        .fold(advice.to_string(), |a, (from, to)| a.replace(from, to))
}

/// What to do when no driver answers, from what nvidia-smi (or the shell) said: the driver
/// comes before the license, so this is the fix that matters first.
pub fn driver_advice(why: &str) -> String {
    let w = why.to_ascii_lowercase();
    if w.contains("in the gpu operator's driver root") && w.contains("the agent refuses it") {
        "The GPU Operator's driver root, or nvidia-smi in it, can be changed by a user other than root, and the agent runs nvidia-smi there as root: it is not run until the owner and mode named are root's alone. The driver container made by the operator is root's: find who changed it (`ls -ld` of the path named) and make the driver pod again (`kubectl delete pod` of the node's nvidia-driver-daemonset pod).".into()
    } else if w.contains("chroot: cannot change root directory") && w.contains("not permitted") {
        "The agent was not let into the GPU Operator's driver root to run nvidia-smi there (chroot refused): it needs CAP_SYS_CHROOT and the chroot system call, which the packaged unit grants; a drop-in that sets CapabilityBoundingSet= or SystemCallFilter= takes them away (`systemctl cat vgpu-license-agent`), and in a pod the container needs CAP_SYS_CHROOT.".into()
    } else if w.contains("permission denied") {
        "nvidia-smi could not be run or could not open the GPU's device files as this user: run the agent as root (`sudo vgpu-license-agent ...`)".into()
    } else if w.contains("no such file") || w.contains("not found") {
        "No NVIDIA driver is installed: install the NVIDIA vGPU (GRID) guest driver of the host's vGPU software release (it brings nvidia-smi and nvidia-gridd), then check that `nvidia-smi -q` lists the GPU; the license comes after the driver.".into()
    } else if w.contains("version mismatch") {
        "The NVIDIA kernel module and its user-space libraries are of different versions (a driver update without a reboot): reboot the guest, or reinstall one driver version; the license comes after the driver.".into()
    } else if w.contains("(driver nvidia)") {
        "The NVIDIA kernel module is loaded but nvidia-smi cannot use it: look for NVRM or Xid errors in `dmesg`, reboot after a driver update (the module and its libraries must be of one version), or reinstall the GRID guest driver; the license comes after the driver.".into()
    } else if w.contains("failed to initialize nvml")
        || w.contains("couldn't communicate")
        || w.contains("has failed")
        || w.contains("no driver bound")
    {
        "The NVIDIA kernel module is not loaded (often built for another kernel after a kernel update): check `dmesg | grep -i nvrm` and `dkms status`, rebuild or reinstall the GRID guest driver for the running kernel (`uname -r`) and reboot; the license comes after the driver.".into()
    } else {
        "No NVIDIA driver answers: check that the GRID guest driver is installed for the running kernel (`dkms status`, `dmesg | grep -i nvrm`) and that `nvidia-smi -q` lists the GPU; the license comes after the driver.".into()
    }
}

/// The host of NVIDIA's Cloud License Service, as a CLS token names it.
pub const CLS_HOST: &str = "api.cls.licensing.nvidia.com";

fn is_cls(host: &str) -> bool {
    host.trim_end_matches('.').eq_ignore_ascii_case(CLS_HOST)
}

/// `Licensed (Expiry: N/A)`: a license without a lease, as cloud platforms that license the
/// GPU themselves show it (smi-dcgm-license-strings.txt lists `N/A` among NVML's expiries).
fn expiry_not_applicable(status: &str) -> bool {
    matches!(classify_status(status), LicenseStatus::Licensed(None))
        && status.to_ascii_lowercase().contains("n/a")
}

/// How the guest is licensed, from the most direct evidence down: the token names its
/// service; gridd's own lines name the cloud platform or the legacy path; nvidia-smi's
/// lease-less license on a guest without a token is the platform's; gridd.conf's
/// `ServerAddress` means the legacy server only where nothing shows the token path (drivers
/// of the token era ignore the key, and templates keep it); last, the server gridd's
/// token-path lines name.
pub fn licensing_mode(
    token: Option<&Token>,
    log: Option<&LogFold>,
    smi: Option<&SmiSnapshot>,
    legacy_server: Option<&str>,
) -> LicensingMode {
    if let Some(t) = token {
        return if t.nodes.iter().any(|n| is_cls(&n.host)) {
            LicensingMode::Cls
        } else {
            LicensingMode::Dls
        };
    }
    if log.is_some_and(|f| f.cloud_provider) {
        return LicensingMode::CloudProvider;
    }
    if log.is_some_and(|f| f.legacy) {
        return LicensingMode::Legacy;
    }
    let lease_less = smi.is_some_and(|s| {
        s.gpus.iter().any(|g| {
            g.license_status
                .as_deref()
                .is_some_and(expiry_not_applicable)
        })
    });
    if lease_less {
        return LicensingMode::CloudProvider;
    }
    if legacy_server.is_some() && !log.is_some_and(|f| f.nls) {
        return LicensingMode::Legacy;
    }
    match log.and_then(|f| f.nls_server.as_deref()) {
        Some(h) if is_cls(h) => LicensingMode::Cls,
        Some(_) => LicensingMode::Dls,
        None => LicensingMode::Unknown,
    }
}

/// What a guest of the legacy license server is told instead of the DLS advice.
fn legacy_advice(reason: Reason, server: Option<&str>) -> Option<String> {
    let at = server.map_or(String::new(), |s| format!(" {s}"));
    match reason {
        Reason::DlsUnreachable | Reason::Unspecified | Reason::Other => Some(format!(
            "nvidia-gridd could not get a license from the legacy license server{at}: check ServerAddress and ServerPort (default 7070) in /etc/nvidia/gridd.conf, that the server runs and that TCP to that port is open from this guest. {LEGACY_EOL}"
        )),
        _ => None,
    }
}

/// The legacy path's end, and the way off it.
const LEGACY_EOL: &str = "NVIDIA's legacy license server is end of life: move to a DLS (a guest driver of vGPU 14 or later, a DLS instance, and its client configuration token installed with `vgpu-license-agent install --token-file FILE`); the legacy keys are then ignored and may stay in gridd.conf.";

/// Observations -> report.
pub fn evaluate(mut obs: Observations) -> Report {
    // A vGPU host's observations: every VM's vGPU, judged one by one.
    if crate::host::is_host(&obs) {
        return crate::host::evaluate(obs);
    }
    let mode = licensing_mode(
        obs.token.as_ref(),
        obs.log.as_ref().map(|(f, _)| f),
        obs.smi.as_ref(),
        obs.legacy_server.as_deref(),
    );
    let mut log = LogView::of(obs.log.take());
    let mut notes = observation_notes(&obs, mode, &log.events);
    let grounds = Grounds::of(&obs, mode, log.state);
    let state = grounds.state;
    let failure = failure_of(&obs, &grounds, &mut log, &mut notes);
    notes.extend(also_noted(&obs, failure.as_ref()));
    notes.extend(obs.token_notes.iter().cloned());
    notes.extend(held_note(&obs.held_writers));
    if let Some(node) = &obs.node {
        notes.extend(node_notes(node));
    }
    let license = renewed(state, smi_license(obs.smi.as_ref()), log.license);
    let expiring = expiry_notes(&obs, state, license.as_ref(), &mut notes);
    let mut events: Vec<Event> = log.events.iter().map(event_of).collect();
    notes.extend(saved_notes(&obs, failure.as_ref(), &events));
    if let Some(c) = &obs.clone_detected {
        // The agent's own event, before gridd's lines of this boot (it ran before gridd).
        events.insert(0, clone_event(c));
    }
    let failure = failure.map(|f| dated(f, &obs.since));
    Report {
        state,
        observed_at: grounds.exact_at,
        license,
        gpus: gpus_of(obs.smi.as_ref()),
        events,
        exit_code: exit_code_of(state, failure.is_some(), expiring),
        failure,
        dls: obs.token.as_ref().map(dls_of),
        licensing_mode: Some(mode),
        events_omitted: log.omitted,
        notes,
        agent_pid: obs.agent_pid,
        last_shutdown: obs.last_shutdown.take(),
        mode: obs
            .node
            .as_ref()
            .map(|n| if n.observe { "observe" } else { "manage" }.to_string()),
        driver_root: obs.node.as_ref().map(|n| n.driver_root.clone()),
        gridd_unit: obs.gridd_unit.as_ref().map(|u| u.as_str().to_string()),
        service: service_facts(&obs),
        ..Report::default()
    }
}

/// The report's failure: the one the grounds choose, a blocking one first, refined by the
/// probe where gridd was vague, else an application's CUDA error.
fn failure_of(
    obs: &Observations,
    grounds: &Grounds,
    log: &mut LogView,
    notes: &mut Vec<String>,
) -> Option<Failure> {
    let failure = grounds.chosen_failure(obs, log);
    let failure = blocking_first(
        grounds.state,
        failure,
        obs.smi.as_ref(),
        grounds.exact_at.map(LogTime::Utc),
        notes,
    );
    let failure = grounds.refined(failure, obs);
    let app = obs.app_log.as_ref().map(|(_, found)| found);
    failure.or_else(|| app_failure(grounds.state, app))
}

/// The service's facts: what it measured, and what the observations say of the token.
fn service_facts(obs: &Observations) -> Option<ServiceFacts> {
    obs.service.clone().map(|f| ServiceFacts {
        token_rejected: obs.token_rejected.is_some() || obs.source_rejected.is_some(),
        token_stale: obs.token_stale.is_some(),
        held_writers: obs.held_writers.len(),
        ..f
    })
}

/// The failure, dated since when the agent's own finding holds where that is known.
fn dated(mut f: Failure, since: &Since) -> Failure {
    if let Some(since) = since.of(&f) {
        f.at = Some(LogTime::Utc(whole_secs(since)));
    }
    f
}

/// A clone found at boot, as the report's event.
fn clone_event(c: &CloneDetected) -> Event {
    Event {
        at: Some(LogTime::Utc(c.at)),
        kind: EventKind::CloneDetected,
        server: None,
        edition: None,
        expiry: None,
        reason: None,
        message: c.message(),
    }
}

/// What the report says of saved outputs, last: what they are or lack, an application's log,
/// a log whose lines carry no year.
fn saved_notes(obs: &Observations, failure: Option<&Failure>, events: &[Event]) -> Vec<String> {
    let mut notes = obs.input_notes.clone();
    if let Some((path, found)) = &obs.app_log {
        notes.extend(app_log_notes(path, found, failure));
    }
    // Times of day without a year, and no dated line to take it from.
    if obs.saved_log_timed && events.iter().all(|e| e.at.is_none()) {
        notes.push(NO_YEAR.into());
    }
    notes
}

/// Syslog-style lines without a year (journalctl's default output, /var/log/messages), with
/// no dated line after them to take it from: their times cannot be placed.
const NO_YEAR: &str = "gridd's lines carry no year (journalctl's default output, or syslog), so no event has a time and a lease cannot be judged against the clock: save the log with `journalctl -u nvidia-gridd -o short-iso` (or `-o json`)";

/// What an application's log says of the license, where the failure does not say it already.
fn app_log_notes(path: &Path, found: &AppLog, failure: Option<&Failure>) -> Vec<String> {
    let at = |e: &app_log::CudaError| {
        format!(
            "{} line {}: `{}`",
            crate::text::show_path(path),
            e.line,
            crate::text::escape(&e.text)
        )
    };
    if let Some(e) = &found.license {
        let told = failure.is_some_and(|f| f.message == e.text);
        return if told {
            Vec::new()
        } else {
            vec![format!(
                "{}: CUDA error 102, the application was refused the GPU because the vGPU held no license then",
                at(e)
            )]
        };
    }
    let mut notes = Vec::new();
    if let Some(e) = &found.hint {
        notes.push(format!(
            "{}: this is how CUDA fails on a vGPU throttled for want of a license, though other causes give it too (a CUDA runtime newer than the driver allows, the driver not installed right, the device held by another process): run `vgpu-license-agent status` on the guest to see its license",
            at(e)
        ));
    }
    if let Some(e) = &found.other {
        notes.push(format!(
            "{}: a CUDA error that is not a license error (a license failure reads `device doesn't have valid Grid license`, CUDA error 102)",
            at(e)
        ));
    }
    if !found.any() {
        notes.push(format!(
            "{}: no CUDA error found",
            crate::text::show_path(path)
        ));
    }
    notes
}

/// What the report says of the observation itself and of how the guest is licensed, before
/// any verdict.
fn observation_notes(
    obs: &Observations,
    mode: LicensingMode,
    events: &[GriddEvent],
) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(why) = obs.smi.as_ref().and_then(|s| s.unanswered.as_ref()) {
        notes.push(format!("nvidia-smi did not answer: {why}"));
    }
    notes.extend(obs.own_notes.iter().cloned());
    match mode {
        LicensingMode::Legacy => notes.push(format!(
            "This guest uses the legacy licensing path (a FlexNet license server, port 7070 by default; vGPU 13 and older, drivers up to the 470 branch): gridd.conf's ServerAddress and ServerPort name the server (BackupServerAddress and BackupServerPort a second one), and no client configuration token is involved. {LEGACY_EOL}"
        )),
        LicensingMode::CloudProvider => notes.push("The cloud platform licenses this guest's GPU itself: no client configuration token or license server is needed, and installing a token is not a fix here.".into()),
        _ => {}
    }
    if events.iter().any(|e| {
        e.stamp
            .is_some_and(|s| s.year.is_some() && s.utc().is_none())
    }) {
        notes.push("The log's times carry no time zone: they are shown as the logging host's local time, without an offset.".into());
    }
    notes
}

/// The state: nvidia-smi, where it was read, decides it; the log where nvidia-smi cannot.
fn state_of(smi: Option<&SmiSnapshot>, log_state: Option<State>) -> State {
    match (smi.map(smi_state), log_state) {
        (Some(State::Unknown), Some(l)) => l,
        (Some(s), _) => s,
        (None, Some(l)) => l,
        (None, None) => State::Unknown,
    }
}

/// Where neither nvidia-smi nor gridd's log tells, an application refused the GPU with CUDA
/// error 102: the vGPU was throttled for want of a license. A weaker hint (`operation not
/// supported` alone) decides nothing.
fn app_state(state: State, app: Option<&AppLog>) -> State {
    match app {
        Some(a) if state == State::Unknown && a.license.is_some() => State::Restricted,
        _ => state,
    }
}

/// What to do about an application's CUDA error 102.
pub const APP_LICENSE_ADVICE: &str = "The application was refused the GPU because this vGPU held no license (CUDA error 102, cudaErrorDeviceNotLicensed): not a memory or code bug, and a fallback to the CPU only hides it. On the guest, run `vgpu-license-agent status`: it shows each vGPU's license and why one is missing (`vgpu-license-agent diagnose` checks the token, nvidia-gridd and the DLS); fix what it names, then run the job again.";

/// An application's CUDA error 102 as the report's failure, where nothing more telling was
/// found and no license is held now.
fn app_failure(state: State, app: Option<&AppLog>) -> Option<Failure> {
    let line = app?.license.as_ref()?;
    matches!(state, State::Restricted | State::Unlicensed).then(|| Failure {
        reason: Reason::CudaNotLicensed,
        message: line.text.clone(),
        at: None,
        advice: advice(Reason::CudaNotLicensed, None, None, None),
    })
}

/// What the report's failure and its advice rest on, besides the observations.
/// What the running service remembers and a one-shot observation cannot see (a file it
/// refused and moved aside, a token source it refused, a Secret ahead of gridd's token), from
/// the report it published: its failure's words where it is of `reason`, so that `diagnose`
/// says what `status` says.
pub fn served_finding(served: &Report, reason: Reason) -> Option<String> {
    if let Some(f) = served.failure.as_ref().filter(|f| f.reason == reason) {
        return Some(f.message.clone());
    }
    let also = format!("{ALSO}{}: ", reason.as_str());
    served
        .notes
        .iter()
        .find_map(|n| n.strip_prefix(&also).map(String::from))
}

/// How a note begins that carries a warning another failure leads: `also REASON: MESSAGE`.
const ALSO: &str = "also ";

/// The service's findings about the token that a leading failure would hide (a file
/// refused, the token source refused, the licensing Secret's other token), as notes: the
/// operator who just copied a token sees it was refused even while the DLS is unreachable,
/// and `diagnose` and `token inspect` find it in the service's report.
fn also_noted(obs: &Observations, failure: Option<&Failure>) -> Vec<String> {
    [
        (Reason::TokenRejected, &obs.token_rejected),
        (Reason::TokenSourceRejected, &obs.source_rejected),
        (Reason::TokenStale, &obs.token_stale),
    ]
    .into_iter()
    .filter(|_| !obs.node.as_ref().is_some_and(|n| n.pod_going))
    .filter(|(reason, _)| failure.is_some_and(|f| f.reason != *reason))
    .filter_map(|(reason, why)| Some(format!("{ALSO}{}: {}", reason.as_str(), why.as_ref()?)))
    .collect()
}

/// A token's dates are judged by this guest's clock: where the DLS probe finds that clock
/// off, a token that reads as expired or not yet valid is the clock's doing, and the clock
/// is the failure (with the token's words after it).
fn clock_before_dates(own: Option<Finding>, probe: Option<&Finding>) -> Option<Finding> {
    match (own, probe) {
        (Some((Reason::TokenExpired, token)), Some((Reason::ClockSkew, clock))) => Some((
            Reason::ClockSkew,
            format!("{clock}; by this clock, {token}"),
        )),
        (own, _) => own,
    }
}

struct Grounds {
    /// The observation's time, where it is exact: what the agent's own findings are dated.
    exact_at: Option<DateTime<Utc>>,
    /// The vGPU profile of the first GPU that shows one.
    profile: Option<String>,
    mode: LicensingMode,
    /// Where the platform or the legacy server licenses the guest, a missing token is no
    /// failure: asking for one would be wrong advice.
    token_needed: bool,
    /// gridd's unit does not exist: its fix is the driver that brings it.
    unit_missing: bool,
    /// The first DLS the token names.
    dls_host: Option<String>,
    state: State,
}

impl Grounds {
    fn of(obs: &Observations, mode: LicensingMode, log_state: Option<State>) -> Grounds {
        Grounds {
            exact_at: obs.at.filter(|_| obs.at_is_exact).map(whole_secs),
            profile: obs
                .smi
                .as_ref()
                .and_then(|s| s.gpus.iter().find_map(|g| g.profile.clone())),
            mode,
            token_needed: !matches!(mode, LicensingMode::CloudProvider | LicensingMode::Legacy),
            unit_missing: obs.gridd_unit.as_ref().is_some_and(UnitState::missing),
            dls_host: obs
                .token
                .as_ref()
                .and_then(|t| t.nodes.first())
                .map(|n| n.host.clone()),
            state: app_state(
                state_of(obs.smi.as_ref(), log_state),
                obs.app_log.as_ref().map(|(_, found)| found),
            ),
        }
    }

    /// gridd's failure, unless it is a missing token where none is needed or it came before
    /// the lease the service saw come.
    fn log_failure(
        &self,
        failure: Option<GriddEvent>,
        lease_since: Option<DateTime<Utc>>,
    ) -> Option<GriddEvent> {
        let failure =
            failure.filter(|f| self.token_needed || f.what.reason != Some(Reason::TokenMissing));
        failure.filter(|f| {
            let before_the_lease = lease_since
                .zip(f.stamp.and_then(|s| s.utc()))
                .is_some_and(|(since, at)| at < since);
            !before_the_lease
        })
    }

    /// The most telling failure of the agent's own, its probe's and gridd's log's.
    fn chosen_failure(&self, obs: &Observations, log: &mut LogView) -> Option<Failure> {
        let log_failure = self.log_failure(log.failure.take(), obs.lease_since);
        // A refused rotation is why no token is installed; with one installed, a warning
        // ([`Grounds::refined`]).
        let own_failure = match (obs.own_failure.clone(), &obs.source_rejected) {
            (Some((Reason::TokenMissing, _)), Some(why)) => {
                Some((Reason::TokenSourceRejected, why.clone()))
            }
            (own, _) => own,
        };
        let own_failure = clock_before_dates(own_failure, obs.probe_failure.as_ref());
        // Nothing here needs a license: the agent's token and gridd findings do not matter.
        let own_failure =
            own_failure.filter(|(r, _)| self.token_needed || *r != Reason::TokenMissing);
        let licensable = |_: &Finding| self.state != State::NotLicensable;
        let chosen = crate::policy::most_telling(
            own_failure.filter(licensable).map(Chosen::Own),
            obs.probe_failure
                .clone()
                .filter(licensable)
                .map(Chosen::Own),
            log_failure.map(|f| (f.what.reason.unwrap_or(Reason::Other), Chosen::Log(f))),
        );
        Some(match chosen? {
            Chosen::Own(finding) => self.own_failure(finding),
            Chosen::Log(f) => log_failure_of(f, &log.events, self.profile.as_deref()),
        })
    }

    /// A finding of the agent's own as the report's failure.
    fn own_failure(&self, (reason, message): Finding) -> Failure {
        let advice_of_unit = (reason == Reason::GriddNotRunning && self.unit_missing)
            .then(|| GRIDD_MISSING_ADVICE.to_string());
        Failure {
            reason,
            advice: advice_of_unit
                .or_else(|| advice_of_message(reason, &message))
                .unwrap_or_else(|| {
                    advice(
                        reason,
                        self.dls_host.as_deref(),
                        None,
                        self.profile.as_deref(),
                    )
                }),
            message,
            at: self.exact_at.map(LogTime::Utc),
        }
    }

    /// The failure with the advice of this guest's licensing (the legacy server's, the GPU
    /// Operator's), or without one the warnings of a license that still holds.
    fn refined(&self, failure: Option<Failure>, obs: &Observations) -> Option<Failure> {
        let failure = failure.map(|mut f| {
            if self.mode == LicensingMode::Legacy
                && let Some(a) = legacy_advice(f.reason, obs.legacy_server.as_deref())
            {
                f.advice = a;
            }
            f
        });
        // A bad rotation while the installed token still holds: a warning, so that a fleet sees
        // it before the old token runs out.
        let failure = failure
            .or_else(|| self.token_warning(Reason::TokenSourceRejected, &obs.source_rejected));
        // A file meant as a new token, refused while the installed token holds: a warning, so
        // that the operator who copied it does not believe the rotation went through.
        let failure =
            failure.or_else(|| self.token_warning(Reason::TokenRejected, &obs.token_rejected));
        // A Secret changed that gridd has not taken: a warning, so that a fleet finds the
        // nodes that run an old token (or would start with a bad one).
        let failure = failure.or_else(|| self.token_warning(Reason::TokenStale, &obs.token_stale));
        let operator = obs.node.as_ref().filter(|n| n.driver_root.is_some());
        // A driver pod going (its readiness marker first, gridd, then its root) or not yet
        // ready: its token is being taken away or put in place, so what the token
        // directory shows is no word on the Secret ("put the token into the Secret" to an
        // operator who just deleted the pod). What nvidia-smi shows still stands.
        let failure = failure.filter(|f| {
            !(operator.is_some_and(|n| n.pod_going)
                && matches!(
                    f.reason,
                    Reason::TokenMissing
                        | Reason::TokenInvalid
                        | Reason::TokenExpired
                        | Reason::TokenStale
                        | Reason::TokenRejected
                        | Reason::FeatureTypeInvalid
                ))
        });
        let failure = failure.map(|mut f| {
            if let Some(node) = operator {
                operator_advice(&mut f, self.state, node);
            }
            f
        });
        failure.or_else(|| self.renewal_warning(obs.renewal_stalled.clone()))
    }

    /// A refused token or rotation as a warning, where there is a license to hold.
    fn token_warning(&self, reason: Reason, why: &Option<String>) -> Option<Failure> {
        let why = why
            .clone()
            .filter(|_| !matches!(self.state, State::NoGpu | State::NotLicensable))?;
        Some(warning(reason, why, self.exact_at.map(LogTime::Utc)))
    }

    /// A lease held whose renewals have stalled: a warning while it still holds.
    fn renewal_warning(&self, stalled: Option<(DateTime<Utc>, String)>) -> Option<Failure> {
        let (since, message) = stalled.filter(|_| self.state == State::Licensed)?;
        Some(Failure {
            reason: Reason::RenewalStalled,
            advice: advice(Reason::RenewalStalled, self.dls_host.as_deref(), None, None),
            message,
            at: Some(LogTime::Utc(whole_secs(since))),
        })
    }
}

/// Notes on a lease, or the token, that runs out soon; whether either does.
fn expiry_notes(
    obs: &Observations,
    state: State,
    license: Option<&License>,
    notes: &mut Vec<String>,
) -> bool {
    let expiring_soon = lease_expiring_soon(state, license, obs.at, obs.expiry_warning);
    // The token's own expiry: the next acquisition or renewal after it fails.
    let token_soon = obs
        .token
        .as_ref()
        .zip(obs.at)
        .and_then(|(t, at)| t.expires_soon(at));
    if let Some(exp) = token_soon {
        notes.push(format!(
            "The installed client configuration token expires at {} (within {} days): generate a new one on the DLS and install it before then.",
            rfc3339(exp),
            crate::token::EXPIRY_WARNING_DAYS
        ));
    }
    if expiring_soon {
        notes.push(format!(
            "The lease expires within {} hours and has not been renewed.",
            obs.expiry_warning.num_hours()
        ));
    }
    expiring_soon || token_soon.is_some()
}

/// What blocks what: no device, then the driver, then gridd, the token and the DLS. Without
/// a device there is nothing to fix; without a driver the driver is the fix, and what else
/// was found is listed in `notes`, not the headline.
fn blocking_first(
    state: State,
    failure: Option<Failure>,
    smi: Option<&SmiSnapshot>,
    at: Option<LogTime>,
    notes: &mut Vec<String>,
) -> Option<Failure> {
    match state {
        State::NoGpu => {
            notes.push("No NVIDIA device is on this guest's PCI bus (vendor 0x10de): nothing to license here. A VM of this image with a vGPU is licensed as usual.".into());
            None
        }
        State::NoDriver => {
            let why = smi
                .and_then(|s| s.driver_error.clone())
                .unwrap_or_else(|| "nvidia-smi lists no GPU".into());
            if let Some(f) = &failure {
                notes.push(format!(
                    "Also found, to look at once the driver answers: {} ({})",
                    f.reason.as_str(),
                    f.message
                ));
            }
            Some(Failure {
                reason: Reason::DriverUnavailable,
                advice: driver_advice(&why),
                message: why,
                at,
            })
        }
        _ => failure,
    }
}

/// Whether a lease held expires within `expiry_warning` of the observation (`at`).
fn lease_expiring_soon(
    state: State,
    license: Option<&License>,
    at: Option<DateTime<Utc>>,
    expiry_warning: chrono::Duration,
) -> bool {
    let expiry = license.and_then(|l| l.expiry);
    match (state, expiry, at) {
        (State::Licensed, Some(exp), Some(at)) => exp - at < expiry_warning,
        _ => false,
    }
}

/// The GPUs as the report lists them, each with its own state and expiry.
fn gpus_of(smi: Option<&SmiSnapshot>) -> Vec<Gpu> {
    smi.map(|s| {
        s.gpus
            .iter()
            .map(|g| Gpu {
                bus_id: g.bus_id.clone(),
                profile: g.profile.clone(),
                virtualization_mode: g.virtualization_mode.clone(),
                license_status: g.license_status.clone(),
                edition: g.edition.clone(),
                state: gpu_state(g),
                expiry: gpu_expiry(g),
            })
            .collect()
    })
    .unwrap_or_default()
}

/// One GPU's state: its License Status; without one, nothing to license on a GPU that is no
/// vGPU, and unknown on a vGPU whose section the output cut off.
fn gpu_state(g: &SmiGpu) -> Option<State> {
    if let Some(status) = g.license_status.as_deref() {
        return Some(match classify_status(status) {
            LicenseStatus::Licensed(_) => State::Licensed,
            LicenseStatus::Unlicensed => State::Unlicensed,
            LicenseStatus::Restricted => State::Restricted,
            LicenseStatus::Unknown => State::Unknown,
        });
    }
    let vgpu_mode = g
        .virtualization_mode
        .as_deref()
        .map(|m| m.eq_ignore_ascii_case("VGPU"));
    let vgpu_profile = g
        .profile
        .as_deref()
        .is_some_and(crate::observe::smi::is_vgpu_profile);
    match vgpu_mode {
        _ if vgpu_profile => Some(State::Unknown),
        Some(true) => Some(State::Unknown),
        Some(false) => Some(State::NotLicensable),
        None => None,
    }
}

/// One GPU's lease expiry, where its License Status gives a date.
fn gpu_expiry(g: &SmiGpu) -> Option<DateTime<Utc>> {
    match classify_status(g.license_status.as_deref()?) {
        LicenseStatus::Licensed(exp) => exp.map(whole_secs),
        _ => None,
    }
}

/// What gridd's log says: its events (years resolved), the state its lines show, its
/// failure, the lease it holds, and how many events were left out.
struct LogView {
    events: Vec<GriddEvent>,
    state: Option<State>,
    failure: Option<GriddEvent>,
    license: Option<License>,
    omitted: u64,
}

impl LogView {
    fn of(log: Option<(LogFold, ScanStats)>) -> LogView {
        let Some((fold, stats)) = log else {
            return LogView {
                events: Vec::new(),
                state: None,
                failure: None,
                license: None,
                omitted: 0,
            };
        };
        let mut events: Vec<GriddEvent> = fold.events.into_iter().collect();
        resolve_years(&mut events);
        let state = if fold.unsupported {
            Some(State::NotLicensable)
        } else if let Some(h) = &fold.holding {
            let valid = h
                .what
                .expiry
                .is_none_or(|exp| lease_valid_at(h.stamp.as_ref(), exp, stats.last_stamp.as_ref()));
            Some(if valid {
                State::Licensed
            } else {
                State::Unlicensed
            })
        } else if fold.license_lines > 0 {
            // Something was said about the license and none is held.
            Some(State::Unlicensed)
        } else {
            None
        };
        let license = fold.holding.as_ref().map(|h| License {
            status: None,
            edition: h.what.edition.clone(),
            expiry: h.what.expiry.map(whole_secs),
        });
        LogView {
            events,
            state,
            failure: fold.failure,
            license,
            omitted: fold.omitted,
        }
    }
}

/// The license as nvidia-smi shows it, else as gridd's lines do. A lease gridd's lines show
/// renewed past the expiry nvidia-smi showed was renewed after that reading (an expiry only
/// moves forward while the lease is held): the report says the later one.
fn renewed(state: State, smi: Option<License>, log: Option<License>) -> Option<License> {
    match (smi, log) {
        (Some(mut s), Some(l)) => {
            if let (State::Licensed, Some(was), Some(now)) = (state, s.expiry, l.expiry)
                && now > was
            {
                s.expiry = Some(now);
            }
            Some(s)
        }
        (s, l) => s.or(l),
    }
}

/// The license as nvidia-smi shows it: the vGPU that decides the state (each vGPU is
/// licensed on its own, so the worst one), and among licensed ones the first to expire.
fn smi_license(smi: Option<&SmiSnapshot>) -> Option<License> {
    smi.and_then(|s| {
        s.gpus
            .iter()
            .filter(|g| g.has_license_section)
            .min_by_key(|g| license_rank(g))
    })
    .map(|g| License {
        status: g.license_status.clone(),
        edition: g.edition.clone(),
        expiry: gpu_expiry(g),
    })
}

/// Restricted first, then unlicensed, unknown, and licensed by expiry (none last).
fn license_rank(g: &SmiGpu) -> (u8, i64) {
    match g.license_status.as_deref().map(classify_status) {
        Some(LicenseStatus::Restricted) => (0, 0),
        Some(LicenseStatus::Unlicensed) => (1, 0),
        Some(LicenseStatus::Unknown) | None => (2, 0),
        Some(LicenseStatus::Licensed(exp)) => (3, exp.map_or(i64::MAX, |e| e.timestamp())),
    }
}

/// The failure a line of gridd's says, dated with the year the event list found for it
/// (from a later dated line).
fn log_failure_of(f: GriddEvent, events: &[GriddEvent], profile: Option<&str>) -> Failure {
    let reason = f.what.reason.unwrap_or(Reason::Other);
    let stamp = events
        .iter()
        .rev()
        .find(|e| {
            e.message == f.message
                && e.stamp.map(|s| (s.month, s.day, s.secs))
                    == f.stamp.map(|s| (s.month, s.day, s.secs))
        })
        .and_then(|e| e.stamp)
        .or(f.stamp);
    Failure {
        reason,
        advice: advice(
            reason,
            f.what.server.as_deref(),
            f.what.edition.as_deref(),
            profile,
        ),
        at: stamp.and_then(|s| s.at()),
        message: f.message,
    }
}

/// A warning of the agent's own (a refused token or rotation) while the license holds.
fn warning(reason: Reason, message: String, at: Option<LogTime>) -> Failure {
    Failure {
        reason,
        advice: advice_of_message(reason, &message)
            .unwrap_or_else(|| advice(reason, None, None, None)),
        message,
        at,
    }
}

/// Files held open for writing in the token directory for minutes: named, with what to do.
fn held_note(held: &[(String, u64)]) -> Option<String> {
    (!held.is_empty()).then(|| {
        let named: Vec<String> = held
            .iter()
            .map(|(name, secs)| format!("{name} (for {secs} s)"))
            .collect();
        format!(
            "the token directory holds a file a process keeps open for writing: {}; it is judged once its writer closes it, and holds nothing else up: `fuser -v` on the token directory's files names the process (an editor left open, a stuck copy)",
            named.join(", ")
        )
    })
}

/// What a GPU Operator node's report says of it.
fn node_notes(node: &NodeSeen) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(root) = &node.driver_root {
        notes.push(format!(
            "GPU Operator node: the driver and nvidia-gridd run in the operator's driver container (its root {root}); the agent only observes here: the operator owns the token, gridd.conf and gridd."
        ));
    }
    if node.manage_refused {
        notes.push("service.mode = \"manage\" is refused on a GPU Operator node: the agent observes. Set it to \"auto\" or \"observe\".".into());
    }
    if node.driver_root.is_some() && node.pod_going {
        notes.push("the driver pod is going, or not ready yet (the operator's .driver-ctr-ready marker is absent): its token is no verdict on the licensing Secret until the pod is ready".into());
    }
    notes
}

/// The monitoring exit code: 0 OK, 1 warning, 2 critical, 3 unknown.
fn exit_code_of(state: State, failing: bool, expiring: bool) -> u8 {
    match state {
        State::Licensed if failing || expiring => 1,
        State::Licensed | State::NotLicensable | State::NoGpu => 0,
        State::Unlicensed if failing => 2,
        State::Unlicensed => 1,
        State::Restricted | State::NoDriver => 2,
        State::Unknown => 3,
    }
}

/// The DLS endpoints a token names.
fn dls_of(t: &Token) -> Vec<DlsEndpoint> {
    t.nodes
        .iter()
        .map(|n| DlsEndpoint {
            host: n.host.clone(),
            port: n.lease_port,
        })
        .collect()
}

/// The state nvidia-smi alone shows.
pub fn smi_state(s: &SmiSnapshot) -> State {
    if s.no_device {
        return State::NoGpu;
    }
    // The hypervisor's view of its VMs says nothing of this machine's own license.
    if s.host_view {
        return State::Unknown;
    }
    if s.gpus.is_empty() {
        // nvidia-smi's own complaint, or a whole output that lists no GPU. One that did not
        // answer at all proves nothing.
        return if s.unanswered.is_some() {
            State::Unknown
        } else if s.driver_error.is_some() || s.whole {
            State::NoDriver
        } else {
            State::Unknown
        };
    }
    let statuses: Vec<LicenseStatus> = s
        .gpus
        .iter()
        .filter_map(|g| g.license_status.as_deref().map(classify_status))
        .collect();
    if statuses.is_empty() {
        return without_license_section(s);
    }
    if statuses.contains(&LicenseStatus::Restricted) {
        State::Restricted
    } else if statuses.contains(&LicenseStatus::Unlicensed) {
        State::Unlicensed
    } else if statuses.contains(&LicenseStatus::Unknown) {
        State::Unknown
    } else {
        State::Licensed
    }
}

/// The state of GPUs that show no license section.
fn without_license_section(s: &SmiSnapshot) -> State {
    // A vGPU profile always has a licence section: an output without one was cut.
    if s.gpus.iter().any(|g| {
        g.profile
            .as_deref()
            .is_some_and(crate::observe::smi::is_vgpu_profile)
    }) {
        return State::Unknown;
    }
    let passthrough = s.gpus.iter().all(|g| {
        g.virtualization_mode
            .as_deref()
            .is_some_and(|m| !m.eq_ignore_ascii_case("VGPU"))
    });
    let any_vgpu = s.gpus.iter().any(|g| {
        g.virtualization_mode
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("VGPU"))
    });
    // No licence section: nothing to license on passthrough or bare metal; an excerpt
    // that cut the section off says nothing.
    if passthrough || (s.whole && !any_vgpu) {
        State::NotLicensable
    } else {
        State::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every advice `diagnose` can show, on a guest and on a GPU Operator node, with and
    /// without the DLS's name: none sends the reader to `diagnose` while they read it, and
    /// `status` keeps its pointers.
    #[test]
    fn advice_in_diagnose_never_sends_the_reader_to_diagnose() {
        let mut all = vec![GRIDD_MISSING_ADVICE.to_string()];
        let node = NodeSeen {
            observe: true,
            driver_root: Some("/run/nvidia/driver".into()),
            driver_ready: true,
            pod_going: false,
            node_name: Some("gpu-1".into()),
            manage_refused: false,
        };
        for r in Reason::ALL {
            for server in [None, Some("dls.example")] {
                let text = advice(r, server, None, Some("NVIDIA L40S-24Q"));
                let mut f = Failure {
                    reason: r,
                    message: String::new(),
                    at: None,
                    advice: text.clone(),
                };
                operator_advice(&mut f, State::Unlicensed, &node);
                all.extend([text, f.advice]);
            }
        }
        let pointing = all
            .iter()
            .filter(|a| a.contains("vgpu-license-agent diagnose"))
            .count();
        assert!(pointing >= 7, "status's pointers: {pointing}");
        for a in &all {
            let here = in_diagnose(a);
            assert!(
                !here.contains("vgpu-license-agent diagnose"),
                "{a}\n-> {here}"
            );
        }
    }

    #[test]
    fn editions_from_profiles() {
        assert_eq!(
            edition_for_profile("NVIDIA L40S-24Q"),
            Some("NVIDIA RTX Virtual Workstation")
        );
        assert_eq!(
            edition_for_profile("GRID A100-4C"),
            Some("NVIDIA Virtual Compute Server (NVIDIA vGPU for Compute from driver 595)")
        );
        // Both names of driver 595's rename, and they are the same license.
        let c = edition_for_profile("NVIDIA H100L-1-12C").unwrap();
        assert!(
            c.contains("NVIDIA Virtual Compute Server") && c.contains("NVIDIA vGPU for Compute")
        );
        assert!(crate::observe::smi::same_edition(
            "NVIDIA vGPU for Compute",
            "NVIDIA Virtual Compute Server"
        ));
        assert_eq!(edition_for_profile("GRID T4-2B"), Some("NVIDIA Virtual PC"));
        assert_eq!(
            edition_for_profile("GRID M60-8A"),
            Some("NVIDIA Virtual Applications")
        );
        assert_eq!(edition_for_profile("NVIDIA H100 80GB HBM3"), None);
    }

    #[test]
    fn a_specific_failure_outranks_later_generic_lines_of_the_same_process() {
        let fold_of = |text: &str| {
            let mut fold = LogFold::new(10);
            crate::observe::journal::scan(text.as_bytes(), |e| fold.push(e)).unwrap();
            fold
        };
        // The same process: the specific reason stays.
        let fold = fold_of(
            "Jan 1 00:00:00 h nvidia-gridd[7]: Failed to acquire license from d (Info: NVIDIA Virtual PC - Error: Clock windback has been detected)\n\
             Jan 1 00:00:01 h nvidia-gridd[7]: Failed to handle something: Error: bad\n\
             Jan 1 00:00:02 h nvidia-gridd[7]: Failed to acquire license from d\n",
        );
        assert_eq!(fold.failure_reason(), Some(Reason::ClockSkew));
        // A new process: its own failure, however vague, is the news.
        let fold = fold_of(
            "Jan 1 00:00:00 h nvidia-gridd[7]: Failed to acquire license from d (Info: NVIDIA Virtual PC - Error: Clock windback has been detected)\n\
             Jan 1 00:01:00 h nvidia-gridd[8]: Failed to acquire license from d\n",
        );
        assert_eq!(fold.failure_reason(), Some(Reason::Unspecified));
        // A generic failure gives way to a specific one after it.
        let fold = fold_of(
            "Jan 1 00:00:00 h nvidia-gridd[7]: Failed to acquire license from d\n\
             Jan 1 00:00:09 h nvidia-gridd[7]: Licensing not supported for GPUs in the system\n",
        );
        assert_eq!(fold.failure_reason(), Some(Reason::LicensingUnsupported));
    }

    #[test]
    fn the_failure_takes_the_year_its_event_got() {
        let text = "Dec 20 17:00:00 h nvidia-gridd[1]: Unable to fetch the client configuration token file\n\
                    2022-12-20T18:00:00+00:00 h nvidia-gridd[1]: NLS initialized\n";
        let mut fold = LogFold::new(10);
        let stats = crate::observe::journal::scan(text.as_bytes(), |e| fold.push(e)).unwrap();
        let r = evaluate(Observations {
            log: Some((fold, stats)),
            ..Default::default()
        });
        let f = r.failure.expect("a failure");
        assert_eq!(f.at, r.events[0].at);
        assert!(f.at.is_some_and(|a| a.to_string().starts_with("2022-12-20T17:00:00")));
    }

    /// nvidia-smi shows the lease of a gridd whose lines have not arrived yet: the token
    /// failure the gridd before it logged is over (the lease came after it), and the guest
    /// is licensed without a warning. One logged after the lease was first seen stands.
    #[test]
    fn a_failure_logged_before_the_lease_shown_is_over() {
        let smi = crate::observe::smi::parse(
            b"GPU 00000000:02:01.0\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : Licensed (Expiry: 2099-1-1 0:0:0 GMT)\n",
        )
        .unwrap();
        let log = "2026-12-02T08:06:46+00:00 h nvidia-gridd[133]: Unable to fetch the client configuration token file\n";
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let report = |since: &str| {
            evaluate(Observations {
                smi: Some(smi.clone()),
                log: Some(fold_of(log)),
                lease_since: Some(at(since)),
                ..Default::default()
            })
        };
        let r = report("2026-12-02T08:06:47Z");
        assert_eq!(
            (r.state, r.exit_code),
            (State::Licensed, 0),
            "{:?}",
            r.failure
        );
        assert!(r.failure.is_none());
        let r = report("2026-12-02T08:06:45Z");
        assert_eq!((r.state, r.exit_code), (State::Licensed, 1));
        assert_eq!(r.failure.map(|f| f.reason), Some(Reason::TokenMissing));
    }

    fn fold_of(text: &str) -> (LogFold, ScanStats) {
        let mut fold = LogFold::new(10);
        let stats = crate::observe::journal::scan(text.as_bytes(), |e| fold.push(e)).unwrap();
        (fold, stats)
    }

    fn token_for(host: &str) -> Token {
        Token {
            algorithm: None,
            issuer: None,
            audience: None,
            token_id: None,
            issued_at: None,
            not_before: None,
            expires: None,
            instance_ref: None,
            scope_refs: vec![],
            nodes: vec![crate::token::DlsNode {
                host: host.into(),
                auth_port: 443,
                lease_port: 443,
            }],
        }
    }

    const NO_TOKEN: &str = "no client configuration token is installed";

    /// A file refused beside the token while another failure leads: a note the operator
    /// sees, and that `diagnose` and `token inspect` find in the service's report.
    #[test]
    fn a_token_finding_another_failure_leads_is_kept_as_a_note() {
        let r = evaluate(Observations {
            smi: Some(crate::observe::smi::parse_text(
                "GPU 00000000:02:01.0\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        License Status : Unlicensed (Unrestricted)\n",
            )),
            own_failure: Some((Reason::DlsUnreachable, "DNS: no such host".into())),
            token_rejected: Some("client_configuration_token_12-01.tok: not a token".into()),
            ..Default::default()
        });
        assert_eq!(
            r.failure.as_ref().map(|f| f.reason),
            Some(Reason::DlsUnreachable)
        );
        assert_eq!(
            served_finding(&r, Reason::TokenRejected).as_deref(),
            Some("client_configuration_token_12-01.tok: not a token"),
            "{:?}",
            r.notes
        );
        assert_eq!(served_finding(&r, Reason::TokenStale), None);
        // Leading, it is the failure and no note.
        let r = evaluate(Observations {
            token_rejected: Some("x.tok: not a token".into()),
            smi: Some(crate::observe::smi::parse_text(
                "GPU 00000000:02:01.0\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        License Status : Licensed (Expiry: 2099-1-1 0:0:0 GMT)\n",
            )),
            ..Default::default()
        });
        assert_eq!(
            r.failure.as_ref().map(|f| f.reason),
            Some(Reason::TokenRejected)
        );
        assert!(
            !r.notes.iter().any(|n| n.starts_with(ALSO)),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn a_cloud_provider_guest_needs_no_token() {
        let smi = crate::observe::smi::parse_text(
            "vGPU Software Licensed Product\n    Product Name : NVIDIA RTX Virtual Workstation\n    License Status : Licensed (Expiry: N/A)\n",
        );
        let r = evaluate(Observations {
            smi: Some(smi.clone()),
            own_failure: Some((Reason::TokenMissing, NO_TOKEN.into())),
            ..Default::default()
        });
        assert_eq!(r.licensing_mode, Some(LicensingMode::CloudProvider));
        assert_eq!(
            (r.state, r.exit_code, &r.failure),
            (State::Licensed, 0, &None)
        );
        assert!(r.notes.iter().any(|n| n.contains("cloud platform")));
        // gridd's own word, even where nvidia-smi says nothing of a license yet.
        let r = evaluate(Observations {
            log: Some(fold_of(
                "Jan 1 00:00:00 h nvidia-gridd[7]: vGPU Software package (1)\n\
                 Jan 1 00:00:01 h nvidia-gridd[7]: Platform detection successful\n",
            )),
            own_failure: Some((Reason::TokenMissing, NO_TOKEN.into())),
            ..Default::default()
        });
        assert_eq!(r.licensing_mode, Some(LicensingMode::CloudProvider));
        // Those lines say nothing about a license: unknown, and no token asked for.
        assert_eq!(
            (r.state, r.exit_code, &r.failure),
            (State::Unknown, 3, &None)
        );
    }

    #[test]
    fn the_token_names_dls_or_cls() {
        for (host, mode) in [
            ("dls.example.com", LicensingMode::Dls),
            ("api.cls.licensing.nvidia.com", LicensingMode::Cls),
        ] {
            let r = evaluate(Observations {
                token: Some(token_for(host)),
                // A token-era gridd.conf keeps the legacy key: the token decides.
                legacy_server: Some("192.168.3.32".into()),
                ..Default::default()
            });
            assert_eq!(r.licensing_mode, Some(mode), "{host}");
        }
        // Without a token, the server gridd's lines name.
        let r = evaluate(Observations {
            log: Some(fold_of(
                "Jan 1 00:00:00 h nvidia-gridd[7]: Acquiring license. (Info: api.cls.licensing.nvidia.com; NVIDIA Virtual PC)\n",
            )),
            ..Default::default()
        });
        assert_eq!(r.licensing_mode, Some(LicensingMode::Cls));
        assert_eq!(r.state, State::Unlicensed);
    }

    #[test]
    fn server_address_means_legacy_only_without_the_token_path() {
        let r = evaluate(Observations {
            legacy_server: Some("10.0.0.7".into()),
            own_failure: Some((Reason::TokenMissing, NO_TOKEN.into())),
            ..Default::default()
        });
        assert_eq!(r.licensing_mode, Some(LicensingMode::Legacy));
        assert_eq!(r.failure, None, "no token is involved on the legacy path");
        assert!(r.notes.iter().any(|n| n.contains("end of life")));
        // A driver of the token path logs so; its ServerAddress is a leftover.
        let r = evaluate(Observations {
            legacy_server: Some("10.0.0.7".into()),
            log: Some(fold_of(
                "Jan 1 00:00:00 h nvidia-gridd[7]: Unable to fetch the client configuration token file\n",
            )),
            own_failure: Some((Reason::TokenMissing, NO_TOKEN.into())),
            ..Default::default()
        });
        assert_eq!(r.licensing_mode, Some(LicensingMode::Unknown));
        assert_eq!(r.failure.map(|f| f.reason), Some(Reason::TokenMissing));
    }

    #[test]
    fn a_log_proves_only_what_it_says_of_the_license() {
        let r = evaluate(Observations {
            log: Some(fold_of(
                "Jan 1 00:00:00 h nvidia-gridd[7]: Started (7)\n\
                 Jan 1 00:00:00 h nvidia-gridd[7]: vGPU Software package (0)\n\
                 Jan 1 00:00:01 h nvidia-gridd[7]: NLS initialized\n",
            )),
            ..Default::default()
        });
        assert_eq!((r.state, r.exit_code), (State::Unknown, 3));
        assert_eq!(r.events.len(), 3);
        // gridd's notice that it holds none: unlicensed, the notice the failure's text.
        let notice =
            "Valid GRID license not found. GPU features and performance will be restricted.";
        let r = evaluate(Observations {
            log: Some(fold_of(&format!(
                "Jan 1 00:00:01 h nvidia-gridd[7]: NLS initialized\nJan 1 00:00:02 h nvidia-gridd[7]: {notice}\n"
            ))),
            ..Default::default()
        });
        assert_eq!((r.state, r.exit_code), (State::Unlicensed, 2));
        let f = r.failure.unwrap();
        assert_eq!(
            (f.reason, f.message.as_str()),
            (Reason::Unspecified, notice)
        );
        // A specific failure before the notice stays the failure.
        let r = evaluate(Observations {
            log: Some(fold_of(&format!(
                "Jan 1 00:00:01 h nvidia-gridd[7]: Failed to acquire license from d (Info: NVIDIA Virtual PC - Error: Clock windback has been detected)\nJan 1 00:00:02 h nvidia-gridd[7]: {notice}\n"
            ))),
            ..Default::default()
        });
        assert_eq!(r.failure.unwrap().reason, Reason::ClockSkew);
        // A legacy lease has no expiry: its failed renewal ends it.
        let r = evaluate(Observations {
            log: Some(fold_of(
                "Oct 5 15:05:17 localhost nvidia-gridd: License acquired successfully. Server URL : http://10.0.0.7:7070/request\n\
                 Oct 6 15:05:17 localhost nvidia-gridd: Failed to renew license for GRID vGPU Edition.\n",
            )),
            ..Default::default()
        });
        assert_eq!((r.state, r.exit_code), (State::Unlicensed, 2));
        assert_eq!(r.licensing_mode, Some(LicensingMode::Legacy));
    }

    #[test]
    fn a_failure_of_the_gridd_before_a_restart_is_history() {
        // gridd failed for want of a token; a token was installed and gridd restarted: until
        // the new gridd says something, the old failure is no verdict (it is in the events).
        let before = "Jan 1 00:00:00 h nvidia-gridd[7]: Started (7)\n\
             Jan 1 00:00:01 h nvidia-gridd[7]: Unable to fetch the client configuration token file\n";
        let r = evaluate(Observations {
            log: Some(fold_of(before)),
            ..Default::default()
        });
        assert_eq!(r.failure.map(|f| f.reason), Some(Reason::TokenMissing));
        let r = evaluate(Observations {
            log: Some(fold_of(&format!(
                "{before}Jan 1 00:05:00 h nvidia-gridd[7]: Shutdown (7)\n\
                 Jan 1 00:05:01 h nvidia-gridd[9]: Started (9)\n"
            ))),
            ..Default::default()
        });
        assert_eq!(r.failure, None, "the failure of gridd 7 is not gridd 9's");
        assert_eq!(r.events.len(), 4, "the old failure stays in the events");
        // The new gridd's own failure is the failure again.
        let r = evaluate(Observations {
            log: Some(fold_of(&format!(
                "{before}Jan 1 00:05:01 h nvidia-gridd[9]: Started (9)\n\
                 Jan 1 00:05:02 h nvidia-gridd[9]: Failed to acquire license from d (Info: NVIDIA Virtual PC - Error: Clock windback has been detected)\n"
            ))),
            ..Default::default()
        });
        assert_eq!(r.failure.map(|f| f.reason), Some(Reason::ClockSkew));
    }

    #[test]
    fn yearless_lease_window_wraps_new_year() {
        let exp = crate::time::parse_gmt("2023-1-5 0:0:0 GMT").unwrap();
        let st = |m, d| Stamp {
            year: None,
            month: m,
            day: d,
            secs: 0,
            offset: None,
        };
        assert!(lease_valid_at(Some(&st(12, 20)), exp, Some(&st(12, 21))));
        assert!(lease_valid_at(Some(&st(12, 20)), exp, Some(&st(1, 4))));
        assert!(!lease_valid_at(Some(&st(12, 20)), exp, Some(&st(1, 6))));
    }

    #[test]
    fn a_yearless_log_in_an_unknown_zone_gets_the_same_slack_as_one_with_years() {
        let exp = crate::time::parse_gmt("2024-9-16 17:16:31 GMT").unwrap();
        let st = |year, h: u32| Stamp {
            year,
            month: 9,
            day: 16,
            secs: h * 3600,
            offset: None,
        };
        for year in [None, Some(2024)] {
            // 20:00 local may be 12:00 UTC (UTC+8): still held.
            assert!(
                lease_valid_at(Some(&st(year, 1)), exp, Some(&st(year, 20))),
                "{year:?}"
            );
        }
        // Past the expiry in every zone: not held.
        let late = Stamp {
            day: 17,
            secs: 8 * 3600,
            ..st(None, 0)
        };
        assert!(!lease_valid_at(Some(&st(None, 1)), exp, Some(&late)));
    }

    #[test]
    fn a_refused_chroot_into_the_driver_root_is_the_agents_sandbox_not_the_driver() {
        // As the agent's unit without CAP_SYS_CHROOT made it, on a booted GPU Operator node.
        let why = "nvidia-smi: chroot: cannot change root directory to '/run/nvidia/driver': Operation not permitted (NVIDIA device 0000:02:01.0 (driver nvidia))";
        let advice = driver_advice(why);
        assert!(advice.contains("CAP_SYS_CHROOT"), "{advice}");
        assert!(!advice.contains("dmesg"), "{advice}");
    }
}
