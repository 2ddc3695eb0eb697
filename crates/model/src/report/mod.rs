//! The one report type (`--json`, `status.json`) and the codes the outside relies on.
//! Schema: `vgpu-license-agent/report/v1`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::observe::meaning::{EventKind, Reason, VmState};
use crate::time::{LogTime, rfc3339_secs};

pub mod human;
pub mod message_ids;
pub mod metrics;

pub const SCHEMA: &str = "vgpu-license-agent/report/v1";

/// The license state of the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Licensed,
    Unlicensed,
    Restricted,
    NotLicensable,
    /// No NVIDIA device on the guest's PCI bus: nothing to license (a golden image booted on
    /// a VM without a vGPU). Never an alert.
    NoGpu,
    NoDriver,
    Unknown,
}

impl State {
    pub const ALL: [State; 7] = [
        State::Licensed,
        State::Unlicensed,
        State::Restricted,
        State::NotLicensable,
        State::NoGpu,
        State::NoDriver,
        State::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Licensed => "licensed",
            State::Unlicensed => "unlicensed",
            State::Restricted => "restricted",
            State::NotLicensable => "not_licensable",
            State::NoGpu => "no_gpu",
            State::NoDriver => "no_driver",
            State::Unknown => "unknown",
        }
    }
}

/// A failure as it travels before it is a report's `failure`: its reason and the one line that
/// says what was found (the agent's own findings, the probe's verdict, the service's memory of
/// what it already reported or probed).
pub type Finding = (Reason, String);

/// How this guest gets its license: each needs different things, and different advice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LicensingMode {
    /// An on-premises Delegated License Service, named by the client configuration token.
    Dls,
    /// NVIDIA's Cloud License Service (`api.cls.licensing.nvidia.com`), named by the token.
    Cls,
    /// The cloud platform licenses the GPU itself: no token is needed.
    CloudProvider,
    /// The legacy FlexNet license server (`ServerAddress` in gridd.conf, port 7070).
    Legacy,
    /// Nothing observed tells.
    Unknown,
}

impl LicensingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LicensingMode::Dls => "dls",
            LicensingMode::Cls => "cls",
            LicensingMode::CloudProvider => "cloud_provider",
            LicensingMode::Legacy => "legacy",
            LicensingMode::Unknown => "unknown",
        }
    }

    /// For a person, where no token was read (the mode then comes from gridd's log): what
    /// the mode means, without claiming a token named it.
    pub fn describe_for(self, token_read: bool) -> &'static str {
        match self {
            LicensingMode::Dls if !token_read => {
                "DLS (an on-premises Delegated License Service, as gridd's log names it; no token was read)"
            }
            LicensingMode::Cls if !token_read => {
                "CLS (NVIDIA's Cloud License Service, as gridd's log names it; no token was read)"
            }
            m => m.describe(),
        }
    }

    /// For a person: what the mode means.
    pub fn describe(self) -> &'static str {
        match self {
            LicensingMode::Dls => {
                "DLS (an on-premises Delegated License Service named by the token)"
            }
            LicensingMode::Cls => "CLS (NVIDIA's Cloud License Service named by the token)",
            LicensingMode::CloudProvider => {
                "cloud provider (the platform licenses the GPU; no token needed)"
            }
            LicensingMode::Legacy => {
                "legacy license server (FlexNet, ServerAddress in gridd.conf; end of life)"
            }
            LicensingMode::Unknown => "unknown (nothing observed tells)",
        }
    }
}

/// One meaningful gridd log line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// RFC 3339 when the log gave the zone; a local wall-clock time without offset when the
    /// log (syslog text) did not say its zone; null when the line had no time or no year.
    pub at: Option<LogTime>,
    pub kind: EventKind,
    pub server: Option<String>,
    pub edition: Option<String>,
    #[serde(default, with = "rfc3339_secs::option")]
    pub expiry: Option<DateTime<Utc>>,
    pub reason: Option<Reason>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct License {
    pub status: Option<String>,
    pub edition: Option<String>,
    #[serde(default, with = "rfc3339_secs::option")]
    pub expiry: Option<DateTime<Utc>>,
}

/// One GPU of the guest. NVIDIA licenses each vGPU of a VM on its own: its own state and
/// expiry (reports of earlier versions lack them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub bus_id: Option<String>,
    pub profile: Option<String>,
    pub virtualization_mode: Option<String>,
    pub license_status: Option<String>,
    pub edition: Option<String>,
    /// This GPU's own state (`licensed`, `unlicensed`, `restricted`, `not_licensable`,
    /// `unknown`); null when nvidia-smi's output tells nothing of it.
    #[serde(default)]
    pub state: Option<State>,
    /// This GPU's lease expiry, where its License Status gives a date.
    #[serde(default, with = "rfc3339_secs::option")]
    pub expiry: Option<DateTime<Utc>>,
}

impl Gpu {
    /// Whether nvidia-smi shows a license status for it: a vGPU, licensed or not.
    pub fn is_vgpu(&self) -> bool {
        self.license_status.is_some()
    }

    /// `00000000:03:01.0 NVIDIA RTX Pro 6000 Blackwell DC-48C`, as a person names it.
    pub fn name(&self) -> String {
        format!(
            "{} {}",
            self.bus_id.as_deref().unwrap_or("-"),
            self.profile.as_deref().unwrap_or("unknown profile")
        )
    }
}

/// With several vGPUs, how many hold a license and which do not: `1 of 2 vGPUs licensed;
/// not licensed: 00000000:03:01.0 NVIDIA RTX Pro 6000 Blackwell DC-48C (Unlicensed
/// (Restricted))`. `None` with one vGPU or none, whose status says it all.
pub fn vgpu_tally(r: &Report) -> Option<String> {
    let vgpus: Vec<&Gpu> = r.gpus.iter().filter(|g| g.is_vgpu()).collect();
    if vgpus.len() < 2 {
        return None;
    }
    let (licensed, not): (Vec<&Gpu>, Vec<&Gpu>) =
        vgpus.iter().partition(|g| g.state == Some(State::Licensed));
    let mut line = format!("{} of {} vGPUs licensed", licensed.len(), vgpus.len());
    if !not.is_empty() {
        let named: Vec<String> = not
            .iter()
            .map(|g| {
                format!(
                    "{} ({})",
                    g.name(),
                    g.license_status.as_deref().unwrap_or("?")
                )
            })
            .collect();
        line.push_str("; not licensed: ");
        line.push_str(&named.join(", "));
    }
    Some(line)
}

/// Whose view a report is: a guest's own license, or a vGPU host's view of every VM's vGPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The agent reads its own guest (reports of earlier versions, which lack `role`, are).
    #[default]
    Guest,
    /// A vGPU host: every VM's vGPU in `vms`, as the vGPU manager shows it.
    Host,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Guest => "guest",
            Role::Host => "host",
        }
    }
}

impl VmState {
    /// The report's state of the same name.
    pub fn state(self) -> State {
        match self {
            VmState::Licensed => State::Licensed,
            VmState::Unlicensed => State::Unlicensed,
            VmState::Restricted => State::Restricted,
            VmState::Unknown => State::Unknown,
        }
    }
}

/// The KubeVirt VirtualMachineInstance a VM is, read from its name (`NAMESPACE_NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeVirt {
    pub namespace: String,
    pub vmi: String,
}

/// One VM's vGPU on a host (`nvidia-smi vgpu -q`): who it is, and its own license.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vm {
    /// The hypervisor's name of the VM (libvirt's domain name).
    pub vm_name: Option<String>,
    pub vm_uuid: Option<String>,
    #[serde(default)]
    pub vgpu_uuid: Option<String>,
    #[serde(default)]
    pub vgpu_id: Option<String>,
    /// `vGPU Name`: the profile (`NVIDIA L40S-24Q`).
    #[serde(default)]
    pub profile: Option<String>,
    /// The physical GPU's bus id.
    #[serde(default)]
    pub gpu: Option<String>,
    /// The guest driver's version; `None` where none answers (`N/A`).
    #[serde(default)]
    pub guest_driver: Option<String>,
    /// `License Status` as printed.
    #[serde(default)]
    pub license_status: Option<String>,
    pub state: VmState,
    #[serde(default, with = "rfc3339_secs::option")]
    pub expiry: Option<DateTime<Utc>>,
    /// When this state was first seen (the service's memory; null offline).
    #[serde(default, with = "rfc3339_secs::option")]
    pub since: Option<DateTime<Utc>>,
    #[serde(default)]
    pub kubevirt: Option<KubeVirt>,
}

impl Vm {
    /// As a person names the VM: `NAMESPACE/VMI` under KubeVirt, else its name, else its
    /// vGPU ID. Not escaped.
    pub fn name(&self) -> String {
        if let Some(k) = &self.kubevirt {
            return format!("{}/{}", k.namespace, k.vmi);
        }
        match (self.vm_name.as_deref(), self.vgpu_id.as_deref()) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(id)) => format!("vGPU {id}"),
            _ => "a VM without a name".to_string(),
        }
    }
}

/// The host's headline: how many vGPUs hold a license, and each VM that does not, worst
/// first: `1 of 3 vGPUs licensed; restricted: tenant-b/vm-b (NVIDIA L40S-24Q on
/// 00000000:41:00.0); unlicensed: ...; no guest driver: ...`. `None` on a guest's report or
/// a host's without `vms`. Not escaped.
pub fn host_tally(r: &Report) -> Option<String> {
    let vms = r.vms.as_ref().filter(|_| r.role == Role::Host)?;
    if vms.is_empty() {
        return Some("no active vGPU".to_string());
    }
    let licensed = vms.iter().filter(|v| v.state == VmState::Licensed).count();
    let mut line = format!("{licensed} of {} vGPUs licensed", vms.len());
    type Belongs = fn(&Vm) -> bool;
    let groups: [(&str, Belongs); 4] = [
        ("restricted", |v| v.state == VmState::Restricted),
        ("unlicensed", |v| v.state == VmState::Unlicensed),
        ("unknown", |v| {
            v.state == VmState::Unknown && v.guest_driver.is_some()
        }),
        ("no guest driver", |v| v.guest_driver.is_none()),
    ];
    for (word, belongs) in groups {
        let named: Vec<String> = vms
            .iter()
            .filter(|v| belongs(v))
            .map(|v| {
                format!(
                    "{} ({} on {})",
                    v.name(),
                    v.profile.as_deref().unwrap_or("unknown profile"),
                    v.gpu.as_deref().unwrap_or("an unnamed GPU")
                )
            })
            .collect();
        if !named.is_empty() {
            line.push_str(&format!("; {word}: {}", named.join(", ")));
        }
    }
    Some(line)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: Reason,
    pub message: String,
    /// As an event's: the failure of a line of gridd's is dated as the line is.
    pub at: Option<LogTime>,
    pub advice: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DlsEndpoint {
    pub host: String,
    pub port: u16,
}

/// The report: what every output of the agent is made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub state: State,
    /// `guest` (the agent's own guest) or `host` (a vGPU host: every VM's vGPU in `vms`).
    #[serde(default)]
    pub role: Role,
    #[serde(default, with = "rfc3339_secs::option")]
    pub observed_at: Option<DateTime<Utc>>,
    pub license: Option<License>,
    pub gpus: Vec<Gpu>,
    /// On a host: one entry per VM's vGPU, as `nvidia-smi vgpu -q` lists them; absent on a
    /// guest, and on a host whose `nvidia-smi vgpu -q` was not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vms: Option<Vec<Vm>>,
    pub events: Vec<Event>,
    pub failure: Option<Failure>,
    pub dls: Option<Vec<DlsEndpoint>>,
    /// How the guest is licensed. Optional in report/v1: reports of earlier versions lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licensing_mode: Option<LicensingMode>,
    /// Older events left out of `events` to keep the report bounded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub events_omitted: u64,
    /// Remarks a person should read (legacy licensing, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Monitoring-plugin exit code: 0 ok, 1 warning, 2 critical, 3 unknown.
    pub exit_code: u8,
    /// The service process that wrote this report (`status.json` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_pid: Option<u32>,
    /// Whether gridd returned its lease as the previous boot ended (`status.json` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_shutdown: Option<LastShutdown>,
    /// `manage` (the agent installs the token and restarts gridd) or `observe` (it only
    /// reads: a GPU Operator node, or `service.mode = "observe"`); absent from `analyze`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The GPU Operator driver container's root the agent read from; null on a plain guest
    /// (absent from `analyze`, which reads no machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_root: Option<Option<String>>,
    /// gridd's unit as systemd said it at the observation: `active`, `start_queued` (coming
    /// back), `without_unit` (gridd runs without one), `inactive`, `failed`, `deactivating`
    /// or `not_installed`; absent where systemd was not asked (`analyze`, a GPU Operator
    /// node, a vGPU host) or could not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gridd_unit: Option<String>,
    /// What the service measured and found beside the license, which its metrics show (not
    /// in the JSON: the contract's fields are the report's there); `None` from any other
    /// source.
    #[serde(skip)]
    pub service: Option<ServiceFacts>,
}

/// A report that knows nothing yet: the state unknown (exit 3), every fact absent. Each
/// maker (state.rs for a guest, host.rs for a host) sets what it knows on top of it, so a
/// fact added to the report is absent from the others without a word there.
impl Default for Report {
    fn default() -> Report {
        Report {
            schema: SCHEMA.to_string(),
            state: State::Unknown,
            role: Role::default(),
            observed_at: None,
            license: None,
            gpus: Vec::new(),
            vms: None,
            events: Vec::new(),
            failure: None,
            dls: None,
            licensing_mode: None,
            events_omitted: 0,
            notes: Vec::new(),
            exit_code: 3,
            agent_pid: None,
            last_shutdown: None,
            mode: None,
            driver_root: None,
            gridd_unit: None,
            service: None,
        }
    }
}

/// What the service knows beside the license, as its metrics show it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceFacts {
    /// Guest clock minus the DLS's clock, last measured.
    pub clock_skew_seconds: Option<f64>,
    /// The guest driver's version, as nvidia-smi printed it last.
    pub driver_version: Option<String>,
    /// The installed token's `exp`, Unix time.
    pub token_expiry: Option<i64>,
    /// A file dropped in the token directory (or the token source) was refused, recently.
    pub token_rejected: bool,
    /// The licensing Secret holds another token than gridd runs with.
    pub token_stale: bool,
    /// Files of the token directory held open for writing past the bound.
    pub held_writers: usize,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the previous boot's gridd did with its lease at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastShutdown {
    /// The time of gridd's last line of that boot.
    #[serde(default, with = "rfc3339_secs::option")]
    pub at: Option<DateTime<Utc>>,
    /// Whether it returned the lease it held (`License returned successfully`).
    pub lease_returned: bool,
    /// gridd's own line about it (`License returned ...`, `Failed to return license ...`,
    /// or its last line when it said nothing about the lease).
    pub message: String,
    /// Seconds from gridd's shutdown line to its last line, when both are dated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_seconds: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report as the writer writes it: every time field, an event dated by a zoned line and
    /// one by a line without a zone, and a null time.
    const WRITTEN: &str = concat!(
        r#"{"schema":"vgpu-license-agent/report/v1","state":"licensed","role":"guest","#,
        r#""observed_at":"2026-12-03T12:00:05Z","#,
        r#""license":{"status":null,"edition":"E","expiry":"2026-12-04T10:00:00Z"},"#,
        r#""gpus":[],"events":["#,
        r#"{"at":"2024-09-15T17:16:29Z","kind":"acquired","server":"dls.example","#,
        r#""edition":"E","expiry":"2026-12-04T10:00:00Z","reason":null,"message":"zoned"},"#,
        r#"{"at":"2022-12-20T17:25:11","kind":"acquire_failed","server":null,"#,
        r#""edition":null,"expiry":null,"reason":"other","message":"local"},"#,
        r#"{"at":null,"kind":"other","server":null,"edition":null,"expiry":null,"#,
        r#""reason":null,"message":"undated"}],"#,
        r#""failure":{"reason":"other","message":"local","at":"2022-12-20T17:25:11","#,
        r#""advice":"a"},"dls":null,"exit_code":0,"agent_pid":7,"#,
        r#""last_shutdown":{"at":"2026-11-29T18:00:02Z","lease_returned":true,"message":"m"}}"#,
    );

    #[test]
    fn times_are_written_back_byte_for_byte() {
        let read: Report = serde_json::from_str(WRITTEN).unwrap();
        let written = serde_json::to_string(&read).unwrap();
        assert_eq!(written, WRITTEN);
        let again: Report = serde_json::from_str(&written).unwrap();
        assert_eq!(again, read);
        assert_eq!(serde_json::to_string(&again).unwrap(), WRITTEN);
        // Each time field has its type, and its text is today's.
        let zoned = read.events[0].at.unwrap();
        assert!(matches!(zoned, LogTime::Utc(_)));
        assert_eq!(zoned.to_string(), "2024-09-15T17:16:29Z");
        let local = read.events[1].at.unwrap();
        assert!(matches!(local, LogTime::Local(_)));
        assert_eq!(local.to_string(), "2022-12-20T17:25:11");
        assert_eq!(read.events[2].at, None);
        assert_eq!(read.failure.as_ref().unwrap().at, Some(local));
        let text = |t: Option<DateTime<Utc>>| t.map(crate::time::rfc3339);
        assert_eq!(text(read.observed_at).unwrap(), "2026-12-03T12:00:05Z");
        let expiry = text(read.license.as_ref().unwrap().expiry).unwrap();
        assert_eq!(expiry, "2026-12-04T10:00:00Z");
        assert_eq!(text(read.events[0].expiry).unwrap(), expiry);
        let shutdown = read.last_shutdown.as_ref().unwrap().at;
        assert_eq!(text(shutdown).unwrap(), "2026-11-29T18:00:02Z");
    }

    #[test]
    fn a_report_without_its_times_reads_as_unknown_times() {
        let v1 = r#"{"schema":"vgpu-license-agent/report/v1","state":"unknown","license":null,"gpus":[],"events":[],"failure":null,"dls":null,"exit_code":3}"#;
        let read: Report = serde_json::from_str(v1).unwrap();
        assert_eq!(read.observed_at, None);
        // Written before the host's view: a guest's, and said so when written again.
        assert_eq!((read.role, read.vms.as_ref()), (Role::Guest, None));
        let again = serde_json::to_value(&read).unwrap();
        assert_eq!(again["role"], "guest");
        assert!(again.get("vms").is_none());
        let bad = v1.replace(r#""license":null"#, r#""license":null,"observed_at":"now""#);
        assert!(serde_json::from_str::<Report>(&bad).is_err());
    }
}
