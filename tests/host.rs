//! The host's view through `analyze`: the bundled real `nvidia-smi vgpu -q` outputs and vGPU
//! manager logs of vGPU hosts, each report validated against the report's JSON Schema (by
//! `samples::analyze`), its exit code, the headline a platform team reads, and the metrics
//! through `promtool check metrics`.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::skipped;
use crate::samples::{analyze, fixture, run_analyze};

fn sample(name: &str) -> String {
    fixture("samples").join(name).display().to_string()
}

/// `analyze` with `args` (not `--json`): standard output and the exit code.
fn run(args: &[&str], stdin: Option<&[u8]>) -> (String, i32) {
    let out = run_analyze(args, stdin);
    (
        String::from_utf8(out.stdout).unwrap(),
        out.status.code().unwrap(),
    )
}

fn line<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

fn notes(r: &Value) -> Vec<&str> {
    r["notes"]
        .as_array()
        .map(|n| n.iter().map(|n| n.as_str().unwrap()).collect())
        .unwrap_or_default()
}

/// A real host (two VMs on a Blackwell GPU): one guest whose driver says `Unlicensed
/// (Unrestricted)`, one whose driver has not loaded yet.
#[test]
fn a_host_with_an_unlicensed_guest_and_a_booting_one() {
    let (r, code) = analyze(&["--smi", &sample("smi-host-vgpu-q-two-vms.txt")], None);
    assert_eq!(
        (r["role"].as_str(), r["state"].as_str(), code),
        (Some("host"), Some("unlicensed"), 1)
    );
    assert_eq!(r["gpus"], serde_json::json!([]));
    assert_eq!(r["license"], Value::Null);
    let vms = r["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 2);
    assert_eq!(
        vms[0],
        serde_json::json!({
            "vm_name": "instance-00000004",
            "vm_uuid": "083bc63f-0a3c-4647-9bb4-27f905b7d7bb",
            "vgpu_uuid": "c47a3625-859f-11f1-84fe-7572c7d51d3e",
            "vgpu_id": "3251637554",
            "profile": "NVIDIA RTX Pro 6000 Blackwell DC-3Q",
            "gpu": "00000001:C8:00.0",
            "guest_driver": null,
            "license_status": "N/A (Expiry: N/A)",
            "state": "unknown",
            "expiry": null,
            "since": null,
            "kubevirt": null
        })
    );
    assert_eq!(vms[1]["vm_name"], "instance-00000005");
    assert_eq!(vms[1]["guest_driver"], "580.105.08");
    assert_eq!(vms[1]["license_status"], "Unlicensed (Unrestricted)");
    assert_eq!(vms[1]["state"], "unlicensed");

    let (text, code) = run(&["--smi", &sample("smi-host-vgpu-q-two-vms.txt")], None);
    assert_eq!(code, 1);
    assert_eq!(
        line(&text, "vGPUs:"),
        [
            "vGPUs:    0 of 2 vGPUs licensed; unlicensed: instance-00000005 (NVIDIA RTX Pro 6000 Blackwell DC-3Q on 00000001:C8:00.0); no guest driver: instance-00000004 (NVIDIA RTX Pro 6000 Blackwell DC-3Q on 00000001:C8:00.0)"
        ],
        "{text}"
    );
    assert_eq!(
        line(&text, "VM:"),
        [
            "VM:       instance-00000004: unknown (no guest driver answers yet), NVIDIA RTX Pro 6000 Blackwell DC-3Q on GPU 00000001:C8:00.0, guest driver none",
            "VM:       instance-00000005: unlicensed (Unlicensed (Unrestricted)), NVIDIA RTX Pro 6000 Blackwell DC-3Q on GPU 00000001:C8:00.0, guest driver 580.105.08",
        ],
        "{text}"
    );
    assert!(
        text.starts_with("Host:     a guest is unlicensed"),
        "{text}"
    );
}

/// A real Proxmox-style host (vgpu_unlock, driver 525) whose only VM has no guest driver
/// yet: nothing asks for a license, so nothing alerts; the VM is still named.
#[test]
fn a_host_whose_only_vm_has_no_guest_driver_yet() {
    let (r, code) = analyze(&["--smi", &sample("smi-host-vgpu-q-akb486.txt")], None);
    assert_eq!((r["state"].as_str(), code), (Some("not_licensable"), 0));
    let vm = &r["vms"][0];
    assert_eq!(vm["vm_name"], "win10test,debug-threads=on");
    // Driver 525 prints the VM UUID and the vGPU UUID empty: null, not "".
    assert_eq!(
        (&vm["vm_uuid"], &vm["vgpu_uuid"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(vm["vgpu_id"], "3251634190");
    assert_eq!(vm["gpu"], "00000000:01:00.0");
    assert_eq!(vm["state"], "unknown");
    // A comma is no KubeVirt name.
    assert_eq!(vm["kubevirt"], Value::Null);
    let (text, code) = run(&["--smi", &sample("smi-host-vgpu-q-akb486.txt")], None);
    assert_eq!(code, 0);
    assert_eq!(
        line(&text, "vGPUs:"),
        [
            "vGPUs:    0 of 1 vGPUs licensed; no guest driver: win10test,debug-threads=on (NVIDIA RTXA6000-2Q on 00000000:01:00.0)"
        ]
    );
}

/// A MIG-backed vGPU whose guest driver answers, in an output without its License Status:
/// not enough to tell.
#[test]
fn a_guest_driver_without_a_license_status_is_unknown() {
    let (r, code) = analyze(&["--smi", &sample("smi-host-vgpu-q-mig-backed.txt")], None);
    assert_eq!((r["state"].as_str(), code), (Some("unknown"), 3));
    assert_eq!(r["vms"][0]["guest_driver"], "580.105.08");
    assert_eq!(r["vms"][0]["license_status"], Value::Null);
    assert_eq!(
        r["vms"][0]["profile"],
        "NVIDIA RTX Pro 6000 Blackwell DC-1-2Q"
    );
}

/// KubeVirt's virt-launcher names the domain `NAMESPACE_NAME`: the report and the headline
/// say the namespace and the VMI. The real output with its VMs renamed so, given on
/// standard input as `nvidia-smi vgpu -q | vgpu-license-agent analyze --smi -` gives it.
#[test]
fn kubevirt_vms_are_named_by_namespace_and_vmi() {
    let real = std::fs::read_to_string(sample("smi-host-vgpu-q-two-vms.txt")).unwrap();
    let renamed = real
        .replace("instance-00000004", "tenant-a_gpu-vm-1")
        .replace("instance-00000005", "tenant-b_vm-b")
        .replace("Unlicensed (Unrestricted)", "Unlicensed (Restricted)");
    let (r, code) = analyze(&["--smi", "-"], Some(renamed.as_bytes()));
    assert_eq!((r["state"].as_str(), code), (Some("restricted"), 2));
    assert_eq!(
        r["vms"][1]["kubevirt"],
        serde_json::json!({"namespace": "tenant-b", "vmi": "vm-b"})
    );
    assert_eq!(r["vms"][1]["vm_name"], "tenant-b_vm-b");
    assert_eq!(
        r["vms"][0]["kubevirt"],
        serde_json::json!({"namespace": "tenant-a", "vmi": "gpu-vm-1"})
    );
    let (text, code) = run(&["--smi", "-"], Some(renamed.as_bytes()));
    assert_eq!(code, 2);
    assert_eq!(
        line(&text, "vGPUs:"),
        [
            "vGPUs:    0 of 2 vGPUs licensed; restricted: tenant-b/vm-b (NVIDIA RTX Pro 6000 Blackwell DC-3Q on 00000001:C8:00.0); no guest driver: tenant-a/gpu-vm-1 (NVIDIA RTX Pro 6000 Blackwell DC-3Q on 00000001:C8:00.0)"
        ]
    );
    assert!(
        text.contains(
            "VM:       tenant-b_vm-b: restricted (Unlicensed (Restricted)), NVIDIA RTX Pro 6000 Blackwell DC-3Q on GPU 00000001:C8:00.0, guest driver 580.105.08, KubeVirt namespace tenant-b, VMI vm-b\n"
        ),
        "{text}"
    );
    // Once licensed, every guest with a driver is: the host is licensed, exit 0, and the
    // expiry is each VM's own.
    let licensed = renamed.replace(
        "Unlicensed (Restricted)",
        "Licensed (Expiry: 2026-12-3 6:55:24 GMT)",
    );
    let (r, code) = analyze(&["--smi", "-"], Some(licensed.as_bytes()));
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["vms"][1]["expiry"], "2026-12-03T06:55:24Z");
}

/// An output pasted twice lists each vGPU once.
#[test]
fn a_vgpu_listed_twice_is_one_vm() {
    let real = std::fs::read_to_string(sample("smi-host-vgpu-q-two-vms.txt")).unwrap();
    let twice = format!("{real}{real}");
    let (r, _) = analyze(&["--smi", "-"], Some(twice.as_bytes()));
    assert_eq!(r["vms"].as_array().unwrap().len(), 2);
}

/// A VM name holding a terminal's escape and a line feed cannot reach the terminal raw nor
/// forge a line of the text.
#[test]
fn a_hostile_vm_name_is_escaped_in_the_text() {
    let real = std::fs::read_to_string(sample("smi-host-vgpu-q-two-vms.txt")).unwrap();
    let hostile = real.replace("instance-00000005", "x\u{1b}]0;owned\u{7}\u{202e}y");
    let (text, _) = run(&["--smi", "-"], Some(hostile.as_bytes()));
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
    assert!(
        text.contains("x\\u{1b}]0;owned\\u{7}\\u{202e}y: unlicensed"),
        "{text}"
    );
    // The JSON keeps the name as it was (JSON escapes it).
    let (r, _) = analyze(&["--smi", "-"], Some(hostile.as_bytes()));
    assert_eq!(r["vms"][1]["vm_name"], "x\u{1b}]0;owned\u{7}\u{202e}y");
}

/// `promtool check metrics` on `text`: `None` where promtool is missing.
fn promtool_check(text: &str) -> Option<(bool, String)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let promtool = std::env::split_paths(&path)
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())?;
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

#[test]
fn host_metrics_per_vm_pass_promtool() {
    let (m, code) = run(
        &["--metrics", "--smi", &sample("smi-host-vgpu-q-two-vms.txt")],
        None,
    );
    assert_eq!(code, 1);
    let series: Vec<&str> = m.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        series,
        [
            r#"vgpu_license_vm_licensed{vm="instance-00000004",vm_uuid="083bc63f-0a3c-4647-9bb4-27f905b7d7bb",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="",vmi=""} 0"#,
            r#"vgpu_license_vm_licensed{vm="instance-00000005",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="094593d6-85a0-11f1-802e-72c7d51d3e72",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="",vmi=""} 0"#,
            r#"vgpu_license_vm_restricted{vm="instance-00000004",vm_uuid="083bc63f-0a3c-4647-9bb4-27f905b7d7bb",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="",vmi=""} 0"#,
            r#"vgpu_license_vm_restricted{vm="instance-00000005",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="094593d6-85a0-11f1-802e-72c7d51d3e72",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="",vmi=""} 0"#,
            // instance-00000004 has no guest driver (N/A): 0, so no alert takes it for unlicensed.
            r#"vgpu_license_vm_guest_driver{vm="instance-00000004",vm_uuid="083bc63f-0a3c-4647-9bb4-27f905b7d7bb",vgpu_uuid="c47a3625-859f-11f1-84fe-7572c7d51d3e",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="",vmi=""} 0"#,
            r#"vgpu_license_vm_guest_driver{vm="instance-00000005",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="094593d6-85a0-11f1-802e-72c7d51d3e72",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="",vmi=""} 1"#,
            r#"vgpu_license_host_vgpus{state="licensed"} 0"#,
            r#"vgpu_license_host_vgpus{state="unlicensed"} 1"#,
            r#"vgpu_license_host_vgpus{state="restricted"} 0"#,
            r#"vgpu_license_host_vgpus{state="unknown"} 1"#,
        ]
    );
    // No guest series on a host: the host holds no license of its own.
    assert!(
        !m.contains("vgpu_license_licensed ") && !m.contains("vgpu_license_state{"),
        "{m}"
    );

    // Names a label must escape: a quote, a backslash, a line feed cannot be typed into
    // nvidia-smi's lines, but a quote and a backslash can be in a domain's name.
    let real = std::fs::read_to_string(sample("smi-host-vgpu-q-two-vms.txt")).unwrap();
    let kubevirt = real
        .replace("instance-00000004", r#"a "quoted" \name"#)
        .replace("instance-00000005", "tenant-b_vm-b")
        .replace(
            "Unlicensed (Unrestricted)",
            "Licensed (Expiry: 2026-12-3 6:55:24 GMT)",
        );
    let (k, code) = run(&["--metrics", "--smi", "-"], Some(kubevirt.as_bytes()));
    assert_eq!(code, 0);
    assert!(
        k.contains(r#"vgpu_license_vm_licensed{vm="a \"quoted\" \\name",vm_uuid="083bc63f-0a3c-4647-9bb4-27f905b7d7bb""#),
        "{k}"
    );
    assert!(
        k.contains(r#"vgpu_license_vm_expiry_timestamp_seconds{vm="tenant-b_vm-b",vm_uuid="f0adb76f-7612-4c68-84b4-375a4e6c5476",vgpu_uuid="094593d6-85a0-11f1-802e-72c7d51d3e72",profile="NVIDIA RTX Pro 6000 Blackwell DC-3Q",namespace="tenant-b",vmi="vm-b"} 1796280924"#),
        "{k}"
    );
    assert_eq!(
        k.matches("vgpu_license_vm_expiry_timestamp_seconds{")
            .count(),
        1
    );

    let (akb, _) = run(
        &["--metrics", "--smi", &sample("smi-host-vgpu-q-akb486.txt")],
        None,
    );
    // No vGPU UUID printed (driver 525): the vGPU ID keeps the series apart.
    assert!(
        akb.contains(r#"vm_uuid="",vgpu_uuid="3251634190","#),
        "{akb}"
    );
    let (mig, _) = run(
        &[
            "--metrics",
            "--smi",
            &sample("smi-host-vgpu-q-mig-backed.txt"),
        ],
        None,
    );

    let Some(_) = promtool_check("") else {
        return skipped("promtool is missing (apt-get install prometheus)");
    };
    for (what, text) in [
        ("two-vms", &m),
        ("kubevirt", &k),
        ("akb486", &akb),
        ("mig-backed", &mig),
    ] {
        let (ok, said) = promtool_check(text).unwrap();
        assert!(ok, "{what}: promtool check metrics: {said}\n{text}");
    }
    // And the check bites: a label value whose quote is not escaped is refused.
    let broken = k.replace(r#"a \"quoted\" \\name"#, r#"a "quoted" name"#);
    assert!(!promtool_check(&broken).unwrap().0);
}

/// The vGPU manager's journal (a Proxmox host's, vgpu_unlock-rs issue 37): the host's, each
/// line a VM's license state; standard input gives the same.
#[test]
fn the_vgpu_managers_log_is_the_hosts() {
    let path = sample("host-vgpu-mgr-log-vgpu_unlock-rs-37.txt");
    let (r, code) = analyze(&["--journal", &path], None);
    assert_eq!(
        (r["role"].as_str(), r["state"].as_str(), code),
        (Some("host"), Some("licensed"), 0)
    );
    assert!(r.get("vms").is_none(), "no vgpu -q read: no VM list");
    let n = notes(&r);
    assert!(
        n[0].starts_with("this is the host's vGPU manager log (nvidia-vgpu-mgr)"),
        "{n:?}"
    );
    assert_eq!(
        n[1..],
        [
            "each process's last license state: nvidia-vgpu-mgr[1869902] Licensed (at Sep 24 18:44:17)",
            "Sep 24 18:43:42 nvidia-vgpu-mgr[1869902]: vGPU license state: Unlicensed (Unrestricted)",
            "Sep 24 18:44:17 nvidia-vgpu-mgr[1869902]: vGPU license state: Licensed",
        ]
    );
    let bytes = std::fs::read(&path).unwrap();
    let (from_stdin, code) = analyze(&["--journal", "-"], Some(&bytes));
    assert_eq!(code, 0);
    assert_eq!(from_stdin["notes"], r["notes"]);

    // A guest that stays unlicensed: the host says so (exit 1).
    let unlicensed: String = String::from_utf8(bytes)
        .unwrap()
        .lines()
        .filter(|l| !l.ends_with("vGPU license state: Licensed"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (r, code) = analyze(&["--journal", "-"], Some(unlicensed.as_bytes()));
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 1));
}

/// Ubuntu's guide pastes `systemctl status nvidia-vgpu-mgr`: its header gives the year and
/// zone, so each line is dated exactly.
#[test]
fn a_pasted_vgpu_manager_status_dates_its_lines() {
    let (r, code) = analyze(
        &[
            "--journal",
            &sample("host-vgpu-mgr-log-ubuntu-server-docs.txt"),
        ],
        None,
    );
    assert_eq!(
        (r["role"].as_str(), r["state"].as_str(), code),
        (Some("host"), Some("licensed"), 0)
    );
    assert_eq!(r["observed_at"], "2021-09-15T06:55:52Z");
    let n = notes(&r);
    assert!(
        n.contains(&"2021-09-15T06:55:50Z nvidia-vgpu-mgr[4260]: vGPU license state: Unlicensed (Unrestricted)"),
        "{n:?}"
    );
    assert!(
        !n.iter().any(|n| n.contains("no nvidia-gridd lines")),
        "{n:?}"
    );
    let (text, code) = run(
        &[
            "--journal",
            &sample("host-vgpu-mgr-log-ubuntu-server-docs.txt"),
        ],
        None,
    );
    assert_eq!(code, 0);
    assert!(text.contains("Note:     each process's last license state: nvidia-vgpu-mgr[4260] Licensed (at 2021-09-15T06:55:52Z)"), "{text}");
}

/// A guest's report says it is a guest's, and lists no VMs.
#[test]
fn a_guests_report_is_the_guests() {
    let (r, code) = analyze(&["--smi", &sample("smi-jp-dls-guide-2.txt")], None);
    assert_eq!(r["role"], "guest");
    assert!(r.get("vms").is_none());
    assert_eq!(code, 0);
}

/// The schema the reports are checked against refuses a VM state it does not know: the
/// validation above can fail.
#[test]
fn the_schema_checks_each_vms_state() {
    let schema: Value =
        serde_json::from_slice(&std::fs::read(fixture("report.schema.json")).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let (mut r, _) = analyze(&["--smi", &sample("smi-host-vgpu-q-two-vms.txt")], None);
    assert!(v.is_valid(&r));
    r["vms"][0]["state"] = Value::from("not_licensable");
    assert!(!v.is_valid(&r));
    r["vms"][0]["state"] = Value::from("unknown");
    r["role"] = Value::from("hypervisor");
    assert!(!v.is_valid(&r));
}

// ---- The service on a simulated vGPU host ----

use std::time::{Duration, Instant};

use crate::common::sim::{Agent, Machine, Setup};

const VM_A: (&str, &str, &str) = (
    "3251637554",
    "tenant-a_vm-a",
    "6939a743-b4d3-4b8f-b917-a8f7009744ee",
);
const VM_B: (&str, &str, &str) = (
    "3251637566",
    "tenant-b_vm-b",
    "43f26719-90d9-4b25-80eb-040b44132eb8",
);

/// The report's entry of the VM whose vGPU ID is `id`.
fn vm<'a>(r: &'a Value, id: &str) -> Option<&'a Value> {
    r["vms"]
        .as_array()?
        .iter()
        .find(|v| v["vgpu_id"].as_str() == Some(id))
}

/// The value of a host metric for the VM named `vm`, if it has a series.
fn vm_metric(metrics: &str, name: &str, vm: &str) -> Option<f64> {
    let label = format!("vm=\"{vm}\"");
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        rest.contains(&label)
            .then(|| l.rsplit_once(' ')?.1.parse().ok())?
    })
}

/// A `since` as the report writes it.
fn since_of(v: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(v["since"].as_str().expect("a since"))
        .unwrap()
        .into()
}

/// The service on a vGPU host (found in `auto` by `Virtualization Mode : Host VGPU`), at its
/// default intervals, in a pod of a KubeVirt cluster: one tenant's VM licensed all along,
/// another's booting, then licensing, licensed, throttled and stopped. Each change reaches
/// `status --json` (`vms`, each VM's `since`) within 10 s of the vGPU manager's line, the
/// metrics (no series left for the VM once it is gone), the journal (one line per change,
/// naming that VM's states only) and the VMI, as one Event (through the API stand-in, with
/// the host's RBAC: get VMIs, create events); the host changes nothing (a token dropped
/// there stays as dropped, no restart) and writes no condition to its Node.
#[test]
fn the_service_on_a_host_follows_each_vms_license() {
    let m = Machine::new(Setup {
        // The agent reads the vGPU manager's lines, which name no machine: no other machine
        // runs meanwhile.
        whole_journal: true,
        ..Setup::default()
    });
    m.update_sim(|c| c.host = true);
    // The service's own intervals, not the test machine's short ones.
    let config: String = m
        .config_text()
        .lines()
        .filter(|l| !l.starts_with("poll_"))
        .map(|l| format!("{l}\n"))
        .collect();
    m.write_config(&config);
    let dropped = m.drop_token(0o600);
    m.vgpu_mgr(&[VM_A.0, "licensed", VM_A.1, VM_A.2]);
    m.vgpu_mgr(&[VM_B.0, "booting", VM_B.1, VM_B.2]);
    // The cluster: both VMIs, the host's RBAC, the agent in a pod with a service account.
    use crate::common::sim::kube_api::{FakeApi, node_object};
    let api = FakeApi::start(crate::kube::TOKEN, vec![node_object("gpu-host-1", vec![])]);
    api.set_vmi("tenant-a", "vm-a", VM_A.2);
    api.set_vmi("tenant-b", "vm-b", VM_B.2);
    api.grant_host();
    let sa = m.service_account(crate::kube::TOKEN, &api.ca_pem);
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nservice_account_dir = \"{}\"\n",
        sa.display()
    ));
    let port = api.port().to_string();
    let started = chrono::Utc::now();
    let agent = Agent::start_with_env(
        &m,
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".as_ref()),
            ("KUBERNETES_SERVICE_PORT", port.as_ref()),
            ("NODE_NAME", "gpu-host-1".as_ref()),
        ],
    );
    let events_of = |reason: &str| {
        api.events()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect::<Vec<_>>()
    };
    let r = agent.wait_status("the host's report", Duration::from_secs(20), |r| {
        r["role"] == "host" && r["vms"].as_array().is_some_and(|v| v.len() == 2)
    });
    assert_eq!(r["state"], "licensed", "{r:#}");
    assert_eq!(vm(&r, VM_B.0).unwrap()["state"], "unknown");
    assert_eq!(vm(&r, VM_B.0).unwrap()["guest_driver"], Value::Null);
    let a_since = since_of(vm(&r, VM_A.0).unwrap());
    assert!(a_since >= started - chrono::Duration::seconds(1), "{r:#}");
    let metrics = agent.metrics();
    assert_eq!(
        vm_metric(&metrics, "vgpu_license_vm_licensed", VM_A.1),
        Some(1.0),
        "{metrics}"
    );

    let steps = [
        (
            "unlicensed",
            "unlicensed",
            1,
            "unknown -> unlicensed",
            "VgpuUnlicensed",
        ),
        (
            "licensed",
            "licensed",
            0,
            "unlicensed -> licensed",
            "VgpuLicensed",
        ),
        (
            "restricted",
            "restricted",
            2,
            "licensed -> restricted",
            "VgpuRestricted",
        ),
    ];
    for (i, (phase, state, code, line, reason)) in steps.into_iter().enumerate() {
        if i == 0 {
            // Right after a periodic reading, the next one 15 s away: only the line can
            // explain a change seen within 10 s.
            let last = agent.status().unwrap()["observed_at"].clone();
            agent.wait_status("a periodic reading", Duration::from_secs(20), |r| {
                r["observed_at"] != last
            });
        }
        let before = chrono::Utc::now();
        let logged = Instant::now();
        m.vgpu_mgr(&[VM_B.0, phase]);
        let r = agent.wait_status(
            &format!("tenant-b's VM {state}"),
            Duration::from_secs(10),
            |r| vm(r, VM_B.0).is_some_and(|v| v["state"] == state),
        );
        assert!(logged.elapsed() < Duration::from_secs(10));
        assert_eq!(
            (r["state"].as_str(), r["exit_code"].as_i64()),
            (Some(state), Some(code))
        );
        // Since the reading that showed it (whole seconds); the other VM's since stays.
        let b_since = since_of(vm(&r, VM_B.0).unwrap());
        assert!(
            b_since >= before - chrono::Duration::seconds(1) && b_since <= chrono::Utc::now(),
            "{b_since} for a change at {before}"
        );
        assert_eq!(since_of(vm(&r, VM_A.0).unwrap()), a_since);
        // The metrics hold what status.json holds (written first).
        let metrics = agent.metrics();
        for (name, value) in [
            ("vgpu_license_vm_licensed", state == "licensed"),
            ("vgpu_license_vm_restricted", state == "restricted"),
        ] {
            assert_eq!(
                vm_metric(&metrics, name, VM_B.1),
                Some(f64::from(u8::from(value))),
                "{name} after {phase}: {metrics}"
            );
        }
        // The VMI's Event, sent once the report has the change (a loaded machine may take
        // most of the 10 s to show it: the Event has 10 s of its own).
        let event = crate::common::sim::wait_for(
            &format!("the Event {reason} on tenant-b/vm-b"),
            Duration::from_secs(10),
            || events_of(reason).pop(),
            || {
                format!(
                    "{}\n--- API requests: {:?}",
                    agent.context(),
                    api.requests()
                )
            },
        );
        assert_eq!(event["involvedObject"]["name"], "vm-b", "{event:#}");
        assert_eq!(
            event["involvedObject"]["uid"].as_str(),
            api.vmi_uid("tenant-b", "vm-b").as_deref()
        );
        let warning = if reason == "VgpuLicensed" {
            "Normal"
        } else {
            "Warning"
        };
        assert_eq!(event["type"], warning, "{event:#}");
        let want = format!("VM tenant-b/vm-b (vGPU {}): {line}", VM_B.0);
        crate::common::sim::wait_for(
            &format!("the journal line {want:?}"),
            Duration::from_secs(5),
            || {
                agent
                    .journal_lines()
                    .iter()
                    .any(|l| l.ends_with(&want))
                    .then_some(())
            },
            || agent.journal_lines().join("\n"),
        );
    }

    // Stopped: no line says so; the next periodic reading (15 s by default) does.
    m.vgpu_mgr(&[VM_B.0, "stopped"]);
    let r = agent.wait_status("tenant-b's VM gone", Duration::from_secs(25), |r| {
        r["vms"].as_array().is_some_and(|v| v.len() == 1)
    });
    assert_eq!(r["state"], "licensed");
    assert!(vm(&r, VM_A.0).is_some());
    let metrics = agent.metrics();
    assert!(!metrics.contains(VM_B.1), "{metrics}");
    assert!(
        metrics.contains("vgpu_license_host_vgpus{state=\"restricted\"} 0"),
        "{metrics}"
    );
    let lines = agent.journal_lines();
    let gone = format!("VM tenant-b/vm-b (vGPU {}): gone (was restricted)", VM_B.0);
    crate::common::sim::wait_for(
        "the line of the VM gone",
        Duration::from_secs(5),
        || {
            agent
                .journal_lines()
                .iter()
                .any(|l| l.ends_with(&gone))
                .then_some(())
        },
        || lines.join("\n"),
    );
    // Each VM's lines name its own states, never another VM's.
    let lines = agent.journal_lines();
    let b_lines: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("VM tenant-b/"))
        .collect();
    assert_eq!(b_lines.len(), 5, "{lines:#?}");
    assert!(
        b_lines.iter().all(|l| !l.contains("tenant-a")),
        "{b_lines:#?}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains("VM tenant-a/")).count(),
        1,
        "vm-a's one line, as first seen: {lines:#?}"
    );
    // One Event per change of vm-b's license, none for vm-a (licensed all along), none for
    // vm-b's going; the host's Node carries no license condition of its own.
    let events = api.events();
    assert_eq!(events.len(), 3, "{events:#?}");
    assert!(events.iter().all(|e| e["involvedObject"]["name"] == "vm-b"));
    assert!(api.condition("gpu-host-1", "VgpuLicensed").is_none());
    // Nothing changed on the host: the token as dropped, gridd never restarted.
    assert_eq!(std::fs::read(m.token_path()).unwrap(), dropped);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(m.token_path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(m.restarts(), 0);
    assert!(
        lines.iter().any(|l| l.contains("this is a vGPU host")),
        "{lines:#?}"
    );
}

/// `diagnose` on a vGPU host: the vGPU manager's driver, then one line per VM's vGPU with
/// its guest's fix (a throttled guest fails, one without a license warns, one without a guest
/// driver is fine), and none of a guest's checks (a host has no token, gridd or DLS of its
/// own); `--json` carries the host's report.
#[test]
fn diagnose_on_a_host_checks_each_vm() {
    let m = Machine::new(Setup::default());
    m.update_sim(|c| c.host = true);
    m.vgpu_mgr(&[VM_A.0, "licensed", VM_A.1, VM_A.2]);
    m.vgpu_mgr(&[VM_B.0, "restricted", VM_B.1, VM_B.2]);
    m.vgpu_mgr(&[
        "3251637570",
        "booting",
        "tenant-c_vm-c",
        "0b1e6f0e-0c1d-4e55-9a51-3c7f2a1d9e01",
    ]);
    let out = m.cli(&["diagnose"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    let line = |vm: &str| {
        text.lines()
            .find(|l| l.contains(&format!("VM {vm} ")))
            .unwrap_or_else(|| panic!("no line for {vm}: {text}"))
            .to_string()
    };
    assert!(line("tenant-a/vm-a").starts_with("OK"), "{text}");
    let b = line("tenant-b/vm-b");
    assert!(
        b.starts_with("FAIL")
            && b.contains("throttled")
            && b.contains("kubectl -n tenant-b describe vmi vm-b"),
        "{b}"
    );
    let c = line("tenant-c/vm-c");
    assert!(c.starts_with("OK") && c.contains("no guest driver"), "{c}");
    for guest_only in ["token", "gridd.conf", "dls"] {
        assert!(
            !text
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(guest_only)),
            "{guest_only}: {text}"
        );
    }
    let out = m.cli(&["diagnose", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["role"], "host", "{v:#}");
    assert_eq!(v["vms"].as_array().map(Vec::len), Some(3), "{v:#}");
    assert_eq!(
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["name"] == "vm")
            .count(),
        3
    );
}
