//! The host's view: on a vGPU host (KubeVirt or Cozystack GPU nodes, Proxmox, OpenStack,
//! libvirt), every VM's vGPU as the vGPU manager shows it (`nvidia-smi vgpu -q`), each
//! judged on its own by its guest driver's license status, and the host's report of them.
//! The same flow as a guest's (observations in, one report out), seen from the hypervisor:
//! [`crate::state::evaluate`] hands a host's observations here.

use chrono::{DateTime, Utc};

use crate::observations::Observations;
use crate::observe::smi::{HostVgpu, LicenseStatus, classify_status};
use crate::observe::vgpu_mgr::{HostLog, LicenseLine};
use crate::report::{KubeVirt, Report, Role, State, Vm, VmState};
use crate::text::escape;
use crate::time::whole_secs;

/// Whether observations are a host's: nvidia-smi's output is the host's `vgpu -q`, or,
/// without nvidia-smi, the log is the vGPU manager's and none of gridd's.
pub fn is_host(obs: &Observations) -> bool {
    match &obs.smi {
        Some(smi) => smi.host_view,
        None => {
            obs.host_log.as_ref().is_some_and(HostLog::any)
                && obs.log.as_ref().is_none_or(|(fold, _)| fold.total() == 0)
        }
    }
}

/// Whether `s` is an RFC 1123 label, as a Kubernetes namespace's name is: 1 to 63 lowercase
/// letters, digits and `-`, beginning and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| inner(c) || *c == b'-')
        && inner(&b[0])
        && inner(&b[b.len() - 1])
}

/// Whether `s` is an RFC 1123 subdomain, as a Kubernetes object's name is: at most 253
/// characters, labels joined by `.`.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The KubeVirt VirtualMachineInstance a VM's name says it is: virt-launcher names the
/// libvirt domain `NAMESPACE_NAME`. A namespace cannot hold `_`, so the name splits at the
/// first one; both parts must be names Kubernetes allows, or it is no KubeVirt name.
///
/// ```
/// use vgpu_license_model::host::kubevirt_of;
///
/// let k = kubevirt_of("tenant-a_vm-gpu-1").unwrap();
/// assert_eq!((k.namespace.as_str(), k.vmi.as_str()), ("tenant-a", "vm-gpu-1"));
/// assert!(kubevirt_of("instance-00000005").is_none());
/// ```
pub fn kubevirt_of(vm_name: &str) -> Option<KubeVirt> {
    let (namespace, vmi) = vm_name.split_once('_')?;
    (is_dns_label(namespace) && is_dns_subdomain(vmi)).then(|| KubeVirt {
        namespace: namespace.to_string(),
        vmi: vmi.to_string(),
    })
}

/// A field as printed, `None` where nvidia-smi says it has none (`N/A`, empty).
fn known(v: Option<&str>) -> Option<&str> {
    v.map(str::trim)
        .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("N/A"))
}

/// One vGPU's state and lease expiry: its guest driver's license status, as the guest's own
/// `nvidia-smi -q` would say it; `unknown` where no guest driver answers (`N/A`).
pub fn vm_state(
    guest_driver: Option<&str>,
    license_status: Option<&str>,
) -> (VmState, Option<DateTime<Utc>>) {
    if known(guest_driver).is_none() {
        return (VmState::Unknown, None);
    }
    match license_status.map(classify_status) {
        Some(LicenseStatus::Licensed(expiry)) => (VmState::Licensed, expiry.map(whole_secs)),
        Some(LicenseStatus::Unlicensed) => (VmState::Unlicensed, None),
        Some(LicenseStatus::Restricted) => (VmState::Restricted, None),
        Some(LicenseStatus::Unknown) | None => (VmState::Unknown, None),
    }
}

/// One VM's vGPU as the report lists it.
pub fn vm_of(v: &HostVgpu) -> Vm {
    let (state, expiry) = vm_state(v.guest_driver.as_deref(), v.license_status.as_deref());
    let owned = |f: &Option<String>| known(f.as_deref()).map(str::to_string);
    Vm {
        vm_name: v.vm_name.clone(),
        vm_uuid: owned(&v.vm_uuid),
        vgpu_uuid: owned(&v.vgpu_uuid),
        vgpu_id: owned(&v.vgpu_id),
        profile: v.profile.clone(),
        gpu: v.gpu_bus_id.clone(),
        guest_driver: owned(&v.guest_driver),
        license_status: v.license_status.clone(),
        state,
        expiry,
        since: None,
        kubevirt: v.vm_name.as_deref().and_then(kubevirt_of),
    }
}

/// How bad a state is, for the worst of several: restricted, then unlicensed, then unknown
/// (as a guest's several vGPUs are ranked).
fn rank(s: VmState) -> u8 {
    match s {
        VmState::Licensed => 0,
        VmState::Unknown => 1,
        VmState::Unlicensed => 2,
        VmState::Restricted => 3,
    }
}

/// The host's state: the worst vGPU's among those whose guest driver answers (`licensed`
/// when every one of them is). A vGPU without a guest driver (a VM booting, a guest without
/// NVIDIA's driver) asks for no license yet and fails none: it is named, never the state.
/// With no vGPU whose guest driver answers (none active, or only such), nothing on the host
/// needs a license now: `not_licensable` (exit 0), not `licensed`, which would claim a
/// lease that no guest holds.
pub fn host_state(vms: &[Vm]) -> State {
    vms.iter()
        .filter(|v| v.guest_driver.is_some())
        .map(|v| v.state)
        .max_by_key(|s| rank(*s))
        .map_or(State::NotLicensable, VmState::state)
}

/// The state the vGPU manager's log alone shows: each process's (each VM's vGPU's) last
/// license state, the worst of them; `None` where it logged no license state.
pub fn log_state(log: &HostLog) -> Option<State> {
    log.last_by_process
        .iter()
        .map(|l| l.state)
        .max_by_key(|s| rank(*s))
        .map(VmState::state)
}

/// The exit code of a host's state, as for a guest: 0 every guest licensed (or none asks),
/// 1 one unlicensed, 2 one restricted, 3 unknown.
pub fn exit_code(state: State) -> u8 {
    match state {
        State::Licensed | State::NotLicensable | State::NoGpu => 0,
        State::Unlicensed => 1,
        State::Restricted | State::NoDriver => 2,
        State::Unknown => 3,
    }
}

/// The host's report of its observations.
pub fn evaluate(obs: Observations) -> Report {
    let vms: Option<Vec<Vm>> = obs
        .smi
        .as_ref()
        .filter(|s| s.host_view)
        .map(|s| s.host_vgpus.iter().map(vm_of).collect());
    let log = obs.host_log.as_ref().filter(|l| l.any());
    let state = match (&vms, log) {
        (Some(vms), _) => host_state(vms),
        (None, Some(log)) => log_state(log).unwrap_or(State::Unknown),
        (None, None) => State::Unknown,
    };
    let mut notes = Vec::new();
    if vms.is_some() {
        notes.push(
            "this is the host's view (nvidia-smi vgpu -q): each VM's vGPU and the license its guest driver reports".to_string(),
        );
    }
    if let Some(log) = log {
        notes.extend(log_notes(log, vms.is_some()));
    }
    notes.extend(obs.own_notes.iter().cloned());
    notes.extend(obs.input_notes.iter().cloned());
    Report {
        state,
        role: Role::Host,
        observed_at: obs.at.filter(|_| obs.at_is_exact).map(whole_secs),
        vms,
        notes,
        exit_code: exit_code(state),
        agent_pid: obs.agent_pid,
        mode: obs.node.as_ref().map(|_| "observe".to_string()),
        driver_root: obs.node.as_ref().map(|n| n.driver_root.clone()),
        ..Report::default()
    }
}

/// How many of the log's license-state lines the notes list (the newest).
const LISTED: usize = 20;

/// What the vGPU manager's log says, for a person: what it is, each process's last license
/// state, and its latest license-state lines. Escaped.
fn log_notes(log: &HostLog, with_vms: bool) -> Vec<String> {
    let mut notes = vec![if with_vms {
        "the vGPU manager's log (nvidia-vgpu-mgr) is read beside it: one process per VM's vGPU"
            .to_string()
    } else {
        "this is the host's vGPU manager log (nvidia-vgpu-mgr): one process per VM's vGPU, each logging the license state its guest driver reports; `nvidia-smi vgpu -q` on the host names the VM of each".to_string()
    }];
    if log.states.is_empty() {
        notes.push(format!(
            "the vGPU manager logged {} line(s) and no `vGPU license state` line: no guest driver reported a license state in it",
            log.lines
        ));
        return notes;
    }
    let last: Vec<String> = log
        .last_by_process
        .iter()
        .map(|l| format!("{} {}", l.process(), describe(l)))
        .collect();
    notes.push(format!(
        "each process's last license state: {}",
        crate::text::few_and_count(&last)
    ));
    let shown = log.states.len().min(LISTED);
    let older = log.omitted + (log.states.len() - shown) as u64;
    if older > 0 {
        notes.push(format!(
            "{} license state line(s), the last {shown} listed",
            log.omitted + log.states.len() as u64
        ));
    }
    for l in log.states.iter().skip(log.states.len() - shown) {
        notes.push(format!(
            "{}{}: vGPU license state: {}",
            l.when().map(|w| format!("{w} ")).unwrap_or_default(),
            l.process(),
            escape(&l.status)
        ));
    }
    notes
}

/// `Licensed (since Sep 24 18:44:17)`.
fn describe(l: &LicenseLine) -> String {
    match l.when() {
        Some(w) => format!("{} (at {w})", escape(&l.status)),
        None => escape(&l.status).into_owned(),
    }
}

/// A Kubernetes Event on the VirtualMachineInstance that runs a VM, at a change of its
/// vGPU's license (a host's service on KubeVirt; the agent sends it, confirmed by the VMI's
/// firmware UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmEvent {
    pub namespace: String,
    pub vmi: String,
    /// The VM UUID the vGPU manager shows: the VMI's `spec.domain.firmware.uuid`.
    pub vm_uuid: Option<String>,
    /// `Warning` (restricted, unlicensed), else `Normal` (licensed).
    pub warning: bool,
    /// `VgpuRestricted`, `VgpuUnlicensed` or `VgpuLicensed`.
    pub reason: String,
    pub message: String,
}

/// The Event a VM's change of state from `before` makes, where it makes one: a KubeVirt VM
/// (its name `NAMESPACE_NAME`) whose guest driver reports a license, no license, or a
/// throttled vGPU. A VM without a guest driver (`unknown`), one gone, and one first seen
/// (the service's start: nothing changed) make none.
pub fn vm_event(vm: &Vm, before: Option<VmState>) -> Option<VmEvent> {
    let kv = vm.kubevirt.as_ref()?;
    let before = before.filter(|b| *b != vm.state)?;
    let (warning, reason) = match vm.state {
        VmState::Restricted => (true, "VgpuRestricted"),
        VmState::Unlicensed => (true, "VgpuUnlicensed"),
        VmState::Licensed => (false, "VgpuLicensed"),
        VmState::Unknown => return None,
    };
    let show = |v: &Option<String>| crate::text::escape(v.as_deref().unwrap_or("?")).into_owned();
    let status = match vm.state {
        VmState::Restricted => {
            "unlicensed and throttled now: its CUDA calls fail until the guest holds a license (its token, gridd.conf FeatureType, its way to the DLS)"
        }
        VmState::Unlicensed => {
            "no license: full speed for the grace period, then throttled (its token, gridd.conf FeatureType, its way to the DLS)"
        }
        _ => "licensed",
    };
    Some(VmEvent {
        namespace: kv.namespace.clone(),
        vmi: kv.vmi.clone(),
        vm_uuid: vm.vm_uuid.clone(),
        warning,
        reason: reason.to_string(),
        message: format!(
            "vGPU {} (vGPU ID {}, GPU {}): {} ({}; was {}), as its guest driver reports to the host's vGPU manager",
            show(&vm.profile),
            show(&vm.vgpu_id),
            show(&vm.gpu),
            status,
            show(&vm.license_status),
            before.as_str()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::smi;

    fn vgpu(name: &str, driver: &str, status: &str) -> HostVgpu {
        HostVgpu {
            gpu_bus_id: Some("00000000:41:00.0".into()),
            vgpu_id: Some("3251634190".into()),
            vm_name: Some(name.into()),
            vm_uuid: Some("083bc63f-0a3c-4647-9bb4-27f905b7d7bb".into()),
            vgpu_uuid: None,
            profile: Some("NVIDIA L40S-24Q".into()),
            guest_driver: Some(driver.into()),
            license_status: Some(status.into()),
        }
    }

    #[test]
    fn each_vgpu_is_judged_by_its_guest_drivers_status() {
        let v = vm_of(&vgpu(
            "tenant-a_vm-a",
            "580.105.08",
            "Licensed (Expiry: 2026-12-3 6:55:24 GMT)",
        ));
        assert_eq!(v.state, VmState::Licensed);
        assert_eq!(
            v.expiry.map(crate::time::rfc3339).as_deref(),
            Some("2026-12-03T06:55:24Z")
        );
        assert_eq!(v.guest_driver.as_deref(), Some("580.105.08"));
        assert_eq!(v.since, None);
        let state = |driver: &str, status: &str| vm_of(&vgpu("vm", driver, status)).state;
        assert_eq!(state("580.105.08", "Licensed"), VmState::Licensed);
        assert_eq!(
            state("580.105.08", "Unlicensed (Unrestricted)"),
            VmState::Unlicensed
        );
        assert_eq!(state("580.105.08", "Unlicensed"), VmState::Unlicensed);
        assert_eq!(
            state("580.105.08", "Unlicensed (Restricted)"),
            VmState::Restricted
        );
        // No guest driver: nothing to tell, whatever the status says.
        assert_eq!(state("N/A", "N/A (Expiry: N/A)"), VmState::Unknown);
        let driverless = vm_of(&vgpu("vm", "N/A", "N/A (Expiry: N/A)"));
        assert_eq!(driverless.guest_driver, None);
        assert_eq!(
            driverless.license_status.as_deref(),
            Some("N/A (Expiry: N/A)")
        );
        // A driver, and a status this version does not know.
        assert_eq!(state("580.105.08", "Uninitialized"), VmState::Unknown);
        let mut none = vgpu("vm", "580.105.08", "");
        none.license_status = None;
        assert_eq!(vm_of(&none).state, VmState::Unknown);
    }

    #[test]
    fn kubevirt_names_split_at_the_first_underscore() {
        let k = |name: &str| kubevirt_of(name).map(|k| (k.namespace, k.vmi));
        assert_eq!(k("tenant-b_vm-b"), Some(("tenant-b".into(), "vm-b".into())));
        assert_eq!(
            k("default_my.vm-1"),
            Some(("default".into(), "my.vm-1".into()))
        );
        // A second `_` belongs to neither: a VMI's name cannot hold one.
        assert_eq!(k("a_b_c"), None);
        for name in [
            "instance-00000005",
            "win10test,debug-threads=on",
            "Tenant_vm",
            "tenant_Vm",
            "_vm",
            "tenant_",
            "-tenant_vm",
            "tenant_vm-",
            "tenant_vm\n",
            "",
        ] {
            assert_eq!(k(name), None, "{name:?}");
        }
        let long = "a".repeat(64);
        assert_eq!(k(&format!("{long}_vm")), None);
        assert!(k(&format!("{}_vm", "a".repeat(63))).is_some());
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(&"a.".repeat(127)));
    }

    #[test]
    fn the_host_is_its_worst_guest_with_a_driver() {
        let vms = |list: &[(&str, &str)]| -> Vec<Vm> {
            list.iter()
                .map(|(driver, status)| vm_of(&vgpu("vm", driver, status)))
                .collect()
        };
        let lic = ("580.105.08", "Licensed (Expiry: 2026-12-3 6:55:24 GMT)");
        let unl = ("580.105.08", "Unlicensed (Unrestricted)");
        let res = ("580.105.08", "Unlicensed (Restricted)");
        let odd = ("580.105.08", "Uninitialized");
        let none = ("N/A", "N/A (Expiry: N/A)");
        assert_eq!(host_state(&vms(&[lic, lic])), State::Licensed);
        assert_eq!(host_state(&vms(&[lic, none])), State::Licensed);
        assert_eq!(host_state(&vms(&[lic, unl, none])), State::Unlicensed);
        assert_eq!(host_state(&vms(&[res, unl, lic])), State::Restricted);
        assert_eq!(host_state(&vms(&[lic, odd, unl])), State::Unlicensed);
        assert_eq!(host_state(&vms(&[lic, odd])), State::Unknown);
        // Nothing asks for a license: no vGPU, or none with a guest driver.
        assert_eq!(host_state(&[]), State::NotLicensable);
        assert_eq!(host_state(&vms(&[none, none])), State::NotLicensable);
        let codes: Vec<u8> = [
            State::Licensed,
            State::NotLicensable,
            State::Unlicensed,
            State::Restricted,
            State::Unknown,
        ]
        .into_iter()
        .map(exit_code)
        .collect();
        assert_eq!(codes, [0, 0, 1, 2, 3]);
    }

    fn host_report(text: &str) -> Report {
        let snap = smi::parse(text.as_bytes()).unwrap();
        let obs = Observations {
            smi: Some(snap),
            ..Default::default()
        };
        assert!(is_host(&obs));
        crate::state::evaluate(obs)
    }

    const TWO_TENANTS: &str = "GPU 00000000:41:00.0
    Active vGPUs                          : 3
    vGPU ID                               : 1
        VM UUID                           : 6939a743-b4d3-4b8f-b917-a8f7009744ee
        VM Name                           : tenant-a_vm-a
        vGPU Name                         : NVIDIA L40S-24Q
        vGPU UUID                         : c47a3625-859f-11f1-84fe-7572c7d51d3e
        Guest Driver Version              : 580.105.08
        License Status                    : Licensed (Expiry: 2026-12-3 6:55:24 GMT)
    vGPU ID                               : 2
        VM UUID                           : 43f26719-90d9-4b25-80eb-040b44132eb8
        VM Name                           : tenant-b_vm-b
        vGPU Name                         : NVIDIA L40S-24Q
        Guest Driver Version              : 580.105.08
        License Status                    : Unlicensed (Restricted)
    vGPU ID                               : 3
        VM UUID                           : f0adb76f-7612-4c68-84b4-375a4e6c5476
        VM Name                           : instance-00000005
        vGPU Name                         : NVIDIA L40S-24Q
        Guest Driver Version              : N/A
        License Status                    : N/A (Expiry: N/A)
";

    #[test]
    fn the_hosts_report_lists_every_vm_and_names_those_not_licensed() {
        let r = host_report(TWO_TENANTS);
        assert_eq!(r.role, Role::Host);
        assert_eq!((r.state, r.exit_code), (State::Restricted, 2));
        assert!(r.gpus.is_empty() && r.license.is_none() && r.failure.is_none());
        let vms = r.vms.as_ref().unwrap();
        assert_eq!(vms.len(), 3);
        assert_eq!(
            vms[1].kubevirt,
            Some(KubeVirt {
                namespace: "tenant-b".into(),
                vmi: "vm-b".into()
            })
        );
        assert_eq!(vms[2].kubevirt, None);
        assert_eq!(
            vms[0].vgpu_uuid.as_deref(),
            Some("c47a3625-859f-11f1-84fe-7572c7d51d3e")
        );
        assert_eq!(vms[1].vgpu_uuid, None);
        assert_eq!(
            crate::report::host_tally(&r).unwrap(),
            "1 of 3 vGPUs licensed; restricted: tenant-b/vm-b (NVIDIA L40S-24Q on 00000000:41:00.0); no guest driver: instance-00000005 (NVIDIA L40S-24Q on 00000000:41:00.0)"
        );
        // The JSON: role and vms as the schema has them.
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["role"], "host");
        assert_eq!(json["vms"][0]["expiry"], "2026-12-03T06:55:24Z");
        assert_eq!(json["vms"][0]["state"], "licensed");
        assert_eq!(json["vms"][1]["kubevirt"]["namespace"], "tenant-b");
        assert_eq!(json["vms"][2]["kubevirt"], serde_json::Value::Null);
        assert_eq!(json["vms"][2]["guest_driver"], serde_json::Value::Null);
        assert_eq!(json["vms"][2]["since"], serde_json::Value::Null);
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_host_with_no_active_vgpu_needs_no_license() {
        let r = host_report("GPU 00000000:41:00.0\n    Active vGPUs : 0\n");
        assert_eq!((r.state, r.exit_code), (State::NotLicensable, 0));
        assert_eq!(r.vms, Some(vec![]));
        assert_eq!(crate::report::host_tally(&r).unwrap(), "no active vGPU");
    }

    #[test]
    fn a_vm_name_with_control_characters_is_escaped_in_the_text() {
        let text = TWO_TENANTS.replace("instance-00000005", "evil\u{1b}[2J\nOK: all licensed");
        let r = host_report(&text);
        // The report keeps the name as it was; the human text escapes it.
        assert_eq!(
            r.vms.as_ref().unwrap()[2].vm_name.as_deref(),
            Some("evil\u{1b}[2J")
        );
        let human = crate::report::human::render(&r);
        assert!(!human.contains('\u{1b}'), "{human}");
        assert!(human.contains("evil\\u{1b}[2J"), "{human}");
    }

    #[test]
    fn host_metrics_are_per_vm_with_their_labels_escaped() {
        let text = TWO_TENANTS.replace("instance-00000005", r#"my "vm"\x"#);
        let r = host_report(&text);
        let m = crate::report::metrics::render(&r, &Default::default());
        let lines: Vec<&str> = m.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                r#"vgpu_license_vm_licensed{vm="tenant-a_vm-a",vm_uuid="6939a743-b4d3-4b8f-b917-a8f7009744ee",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA L40S-24Q",namespace="tenant-a",vmi="vm-a"} 1"#,
                // No vGPU UUID printed: the vGPU ID keeps the series apart.
                r#"vgpu_license_vm_licensed{vm="tenant-b_vm-b",vm_uuid="43f26719-90d9-4b25-80eb-040b44132eb8",vgpu_uuid="2",profile="NVIDIA L40S-24Q",namespace="tenant-b",vmi="vm-b"} 0"#,
                r#"vgpu_license_vm_licensed{vm="my \"vm\"\\x",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="3",profile="NVIDIA L40S-24Q",namespace="",vmi=""} 0"#,
                r#"vgpu_license_vm_restricted{vm="tenant-a_vm-a",vm_uuid="6939a743-b4d3-4b8f-b917-a8f7009744ee",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA L40S-24Q",namespace="tenant-a",vmi="vm-a"} 0"#,
                r#"vgpu_license_vm_restricted{vm="tenant-b_vm-b",vm_uuid="43f26719-90d9-4b25-80eb-040b44132eb8",vgpu_uuid="2",profile="NVIDIA L40S-24Q",namespace="tenant-b",vmi="vm-b"} 1"#,
                r#"vgpu_license_vm_restricted{vm="my \"vm\"\\x",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="3",profile="NVIDIA L40S-24Q",namespace="",vmi=""} 0"#,
                // The driverless VM (its guest driver N/A) tells itself apart from one unlicensed.
                r#"vgpu_license_vm_guest_driver{vm="tenant-a_vm-a",vm_uuid="6939a743-b4d3-4b8f-b917-a8f7009744ee",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA L40S-24Q",namespace="tenant-a",vmi="vm-a"} 1"#,
                r#"vgpu_license_vm_guest_driver{vm="tenant-b_vm-b",vm_uuid="43f26719-90d9-4b25-80eb-040b44132eb8",vgpu_uuid="2",profile="NVIDIA L40S-24Q",namespace="tenant-b",vmi="vm-b"} 1"#,
                r#"vgpu_license_vm_guest_driver{vm="my \"vm\"\\x",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="3",profile="NVIDIA L40S-24Q",namespace="",vmi=""} 0"#,
                r#"vgpu_license_vm_expiry_timestamp_seconds{vm="tenant-a_vm-a",vm_uuid="6939a743-b4d3-4b8f-b917-a8f7009744ee",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA L40S-24Q",namespace="tenant-a",vmi="vm-a"} 1796280924"#,
                r#"vgpu_license_host_vgpus{state="licensed"} 1"#,
                r#"vgpu_license_host_vgpus{state="unlicensed"} 0"#,
                r#"vgpu_license_host_vgpus{state="restricted"} 1"#,
                r#"vgpu_license_host_vgpus{state="unknown"} 1"#,
            ]
        );
        assert_eq!(m.matches("# TYPE ").count(), 5);
        // A line feed in a name cannot start a series of its own.
        let mut r = r;
        r.vms.as_mut().unwrap()[2].vm_name = Some("a\nvgpu_license_vm_licensed{} 1".into());
        let m = crate::report::metrics::render(&r, &Default::default());
        assert!(m.contains(r#"vm="a\nvgpu_license_vm_licensed{} 1""#), "{m}");
        assert!(
            !m.lines()
                .any(|l| l.starts_with("vgpu_license_vm_licensed{} "))
        );
    }

    #[test]
    fn the_vgpu_managers_log_alone_is_the_hosts_and_says_each_processs_state() {
        let log = crate::observe::vgpu_mgr::scan(
            b"Sep 24 18:43:42 gamma nvidia-vgpu-mgr[7]: notice: vmiop_log: (0x0): vGPU license state: Unlicensed (Unrestricted)\n\
              Sep 24 18:43:50 gamma nvidia-vgpu-mgr[8]: notice: vmiop_log: (0x0): vGPU license state: Licensed\n\
              Sep 24 18:44:17 gamma nvidia-vgpu-mgr[7]: notice: vmiop_log: (0x0): vGPU license state: Licensed\n",
        );
        let obs = Observations {
            host_log: Some(log),
            ..Default::default()
        };
        assert!(is_host(&obs));
        let r = crate::state::evaluate(obs);
        assert_eq!(
            (r.role, r.state, r.exit_code),
            (Role::Host, State::Licensed, 0)
        );
        assert_eq!(r.vms, None);
        assert!(
            r.notes[0].starts_with("this is the host's vGPU manager log"),
            "{:?}",
            r.notes
        );
        assert_eq!(
            r.notes[1],
            "each process's last license state: nvidia-vgpu-mgr[8] Licensed (at Sep 24 18:43:50), nvidia-vgpu-mgr[7] Licensed (at Sep 24 18:44:17)"
        );
        assert_eq!(
            r.notes[2],
            "Sep 24 18:43:42 nvidia-vgpu-mgr[7]: vGPU license state: Unlicensed (Unrestricted)"
        );
        assert_eq!(r.notes.len(), 5);
        // A process whose last word is restricted makes the host's state.
        let log = crate::observe::vgpu_mgr::scan(
            b"Sep 24 18:44:17 g nvidia-vgpu-mgr[7]: vGPU license state: Unlicensed (Restricted)\n",
        );
        assert_eq!(log_state(&log), Some(State::Restricted));
    }

    /// An Event at each change of a KubeVirt VM's license, and none where nothing changed
    /// (first seen), no guest driver answers, or the VM is not KubeVirt's.
    #[test]
    fn an_event_is_a_kubevirt_vms_change_of_license() {
        let r = host_report(TWO_TENANTS);
        let vms = r.vms.as_ref().unwrap();
        let b = vms
            .iter()
            .find(|v| v.vm_name.as_deref() == Some("tenant-b_vm-b"))
            .unwrap();
        assert_eq!(b.state, VmState::Restricted);
        let e = vm_event(b, Some(VmState::Licensed)).unwrap();
        assert_eq!(
            (
                e.namespace.as_str(),
                e.vmi.as_str(),
                e.warning,
                e.reason.as_str()
            ),
            ("tenant-b", "vm-b", true, "VgpuRestricted")
        );
        assert_eq!(e.vm_uuid.as_deref(), b.vm_uuid.as_deref());
        assert!(
            e.message.contains("throttled") && e.message.contains("was licensed"),
            "{}",
            e.message
        );
        assert_eq!(vm_event(b, None), None, "first seen: nothing changed");
        assert_eq!(vm_event(b, Some(VmState::Restricted)), None);
        let mut licensed = b.clone();
        licensed.state = VmState::Licensed;
        let e = vm_event(&licensed, Some(VmState::Restricted)).unwrap();
        assert_eq!((e.warning, e.reason.as_str()), (false, "VgpuLicensed"));
        let mut driverless = b.clone();
        driverless.state = VmState::Unknown;
        assert_eq!(vm_event(&driverless, Some(VmState::Licensed)), None);
        let mut openstack = b.clone();
        openstack.kubevirt = None;
        assert_eq!(vm_event(&openstack, Some(VmState::Licensed)), None);
    }
}
