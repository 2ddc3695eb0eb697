//! Every sample in `tests/fixtures/samples/` through `analyze`, with what the agent must
//! conclude from it; every report validated against the report's JSON Schema.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_vgpu-license-agent");

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn sample(name: &str) -> String {
    fixture("samples").join(name).display().to_string()
}

fn validator() -> jsonschema::Validator {
    let schema: Value =
        serde_json::from_slice(&std::fs::read(fixture("report.schema.json")).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

/// Runs `analyze --json` with `args`, checks the report against the schema, returns it and the
/// exit code.
/// `analyze` with `args`, `stdin` given on its standard input: what it left.
pub(crate) fn run_analyze(args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = Command::new(BIN)
        .arg("analyze")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

pub(crate) fn analyze(args: &[&str], stdin: Option<&[u8]>) -> (Value, i32) {
    let out = run_analyze(&[&["--json"], args].concat(), stdin);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let v = validator();
    let errors: Vec<String> = v.iter_errors(&report).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{args:?}: schema errors {errors:?}");
    (report, out.status.code().unwrap())
}

fn journal(name: &str) -> (Value, i32) {
    analyze(&["--journal", &sample(name)], None)
}

fn smi(name: &str) -> (Value, i32) {
    analyze(&["--smi", &sample(name)], None)
}

fn kinds(r: &Value) -> Vec<&str> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect()
}

/// Whether `ours` keeps everything `contract` says (report/v1 stays compatible): every key
/// and sub-schema of the contract is there; an enum may grow (a new reason); a `required`
/// list may not (new fields are optional); new keys are allowed. `Err`: where it differs.
fn extends(contract: &Value, ours: &Value, at: &str) -> Result<(), String> {
    match (contract, ours) {
        (Value::Object(c), Value::Object(o)) => {
            for (k, cv) in c {
                let ov = o.get(k).ok_or(format!("{at}/{k}: missing"))?;
                let here = format!("{at}/{k}");
                if k == "enum" {
                    let (ca, oa) = (cv.as_array().unwrap(), ov.as_array().unwrap());
                    if let Some(v) = ca.iter().find(|v| !oa.contains(v)) {
                        return Err(format!("{here}: {v} dropped"));
                    }
                } else {
                    extends(cv, ov, &here)?;
                }
            }
            Ok(())
        }
        (Value::Array(c), Value::Array(o)) => {
            if c.len() != o.len() {
                return Err(format!("{at}: {contract} became {ours}"));
            }
            for (i, (cv, ov)) in c.iter().zip(o).enumerate() {
                extends(cv, ov, &format!("{at}/{i}"))?;
            }
            Ok(())
        }
        (c, o) if c == o => Ok(()),
        _ => Err(format!("{at}: {contract} became {ours}")),
    }
}

#[test]
fn vendored_schema_extends_the_contract() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/schema/report.schema.json");
    let ours: Value =
        serde_json::from_slice(&std::fs::read(fixture("report.schema.json")).unwrap()).unwrap();
    // The reasons and fields the contract's text adds (renewal_stalled, last_shutdown) are
    // in ours; the contract's schema file may lag them.
    let reasons = ours["$defs"]["reason"]["enum"].as_array().unwrap();
    assert!(reasons.contains(&Value::from("renewal_stalled")));
    assert!(ours["properties"]["last_shutdown"].is_object());
    if let Ok(contract) = std::fs::read(&shared) {
        let contract: Value = serde_json::from_slice(&contract).unwrap();
        extends(&contract, &ours, "").unwrap_or_else(|e| {
            panic!("tests/fixtures/report.schema.json breaks the contract's schema at {e}")
        });
        // And the check bites: a dropped reason is caught.
        let mut broken = ours.clone();
        broken["$defs"]["reason"]["enum"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r != "token_missing");
        assert!(extends(&contract, &broken, "").is_err());
    } else {
        eprintln!(
            "note: {} is not here: checked the schema's own additions only",
            shared.display()
        );
    }
}

#[test]
fn legacy_driver_with_invalid_feature_type() {
    let (r, code) = journal("gridd-log-azure-docs-32746-legacy.txt");
    assert_eq!(r["state"], "unlicensed");
    assert_eq!(r["failure"]["reason"], "feature_type_invalid");
    assert_eq!(code, 2);
    // Nothing in these lines names the licensing path: no `Server URL`, no token-path line.
    assert_eq!(r["licensing_mode"], "unknown");
    // systemd's own line is not gridd's; a syslog line has no year: no time is invented.
    assert_eq!(r["events"].as_array().unwrap().len(), 4);
    assert!(
        r["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["at"].is_null())
    );
    assert_eq!(kinds(&r)[0], "config_notice");
}

#[test]
fn gridd_conf_in_the_token_directory() {
    let (r, code) = journal("gridd-log-cudaerror4vgpu-1.txt");
    assert_eq!(r["state"], "unlicensed");
    assert_eq!(r["failure"]["reason"], "token_invalid");
    assert!(
        r["failure"]["advice"]
            .as_str()
            .unwrap()
            .contains("exactly one file")
    );
    assert_eq!(code, 2);
    assert_eq!(
        kinds(&r),
        [
            "other",
            "other",
            "initialized",
            "token_error",
            "token_error",
            "token_error",
            "shutdown"
        ]
    );
    // The systemctl status header gives the year and the zone (UTC).
    assert_eq!(r["events"][0]["at"], "2025-03-31T06:53:50Z");
    assert_eq!(r["failure"]["at"], "2025-03-31T06:53:50Z");
}

#[test]
fn fastapi_dls_linux_client_licensed() {
    let (r, code) = journal("gridd-log-fastapi-dls-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["expiry"], "2022-12-21T16:53:33Z");
    assert_eq!(r["license"]["edition"], "NVIDIA RTX Virtual Workstation");
    assert_eq!(r["failure"], Value::Null);
    // No token to read, but gridd's `(Info: 192.168.178.110, ...)` names a DLS.
    assert_eq!(r["licensing_mode"], "dls");
    let last = r["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "acquired");
    assert_eq!(last["server"], "192.168.178.110");
    assert_eq!(last["at"], Value::Null);
}

#[test]
fn journalctl_follow_without_timestamps() {
    let (r, code) = journal("gridd-log-fastapi-dls-2.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["expiry"], "2023-01-29T22:03:00Z");
    assert_eq!(kinds(&r)[0], "config_notice");
    assert_eq!(r["events"].as_array().unwrap().len(), 6);
}

#[test]
fn systemctl_status_in_a_zone_that_is_not_utc() {
    let (r, code) = journal("gridd-log-fnos-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["expiry"], "2024-12-14T17:16:31Z");
    // CST is ambiguous: the header's year is taken, the local time kept without an offset.
    assert_eq!(r["events"][0]["at"], "2024-09-16T01:16:29");
    assert_eq!(r["events"].as_array().unwrap().len(), 10);
    // The same paste holds `nvidia-smi -q | grep License`: read as nvidia-smi output too.
    let (r, code) = smi("gridd-log-fnos-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["expiry"], "2024-12-14T17:16:31Z");
}

#[test]
fn acquiring_right_after_restart() {
    let (r, code) = journal("gridd-log-jp-dls-guide-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 1));
    assert_eq!(r["failure"], Value::Null);
    assert_eq!(kinds(&r).first(), Some(&"started"));
    assert_eq!(kinds(&r).last(), Some(&"acquiring"));
    assert_eq!(r["events"][5]["server"], "192.168.3.32");
    assert_eq!(r["events"][5]["edition"], "NVIDIA Virtual Compute Server");
    assert_eq!(r["events"][5]["at"], "2022-05-25T15:13:59Z");
    assert_eq!(r["licensing_mode"], "dls");
}

#[test]
fn legacy_flexnet_license_server() {
    let (r, code) = journal("gridd-log-legacy-flexnet-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["events"][2]["kind"], "acquired");
    assert_eq!(r["events"][2]["server"], "51.179.209.134");
    assert_eq!(r["licensing_mode"], "legacy");
    let note = r["notes"][0].as_str().unwrap();
    assert!(note.contains("legacy licensing"), "{note}");
    // The legacy keys explained, the end of life, the way off it.
    assert!(
        note.contains("ServerAddress") && note.contains("end of life"),
        "{note}"
    );
    assert!(note.contains("DLS") && note.contains("token"), "{note}");
    // `Your system is licensed for GRID vGPU.` names the edition of the legacy path.
    assert_eq!(r["events"][3]["kind"], "other");
    assert_eq!(r["events"][3]["edition"], "GRID vGPU");
}

#[test]
fn legacy_failed_acquire_names_its_edition() {
    let (r, code) = journal("gridd-log-aws-g3-docs-legacy.txt");
    // The log's one line says the acquisition failed, for no stated cause.
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 2));
    assert_eq!(kinds(&r), ["acquire_failed"]);
    assert_eq!(r["events"][0]["edition"], "NVIDIA GRID Virtual Workstation");
    assert_eq!(r["failure"]["reason"], "unspecified");
    assert_eq!(r["licensing_mode"], "legacy");
    // Told about the legacy server, not about a DLS or a token to install.
    let advice = r["failure"]["advice"].as_str().unwrap();
    assert!(advice.contains("legacy license server"), "{advice}");
    assert!(advice.contains("ServerAddress"), "{advice}");
}

#[test]
fn a_failure_that_names_a_legacy_server_url_is_the_legacy_servers() {
    // No published log shows a legacy failure line that names its server's URL; this one is
    // FlexNet's `Failed to acquire license from` wording (flexnet-embedded-error-strings.txt)
    // with the `(Info: http://HOST:7070/request; EDITION)` of the legacy lines that are
    // published (gridd-log-legacy-flexnet-1.txt, domain.md). Whatever the wording, the URL
    // says which path the line is on.
    let (r, code) = analyze(
        &["--journal", "-"],
        Some(
            b"Oct 5 15:04:45 localhost nvidia-gridd: Started (16224)\n\
              Oct 5 15:05:16 localhost nvidia-gridd: Failed to acquire license from 10.0.0.7 (Info: http://10.0.0.7:7070/request; GRID-Virtual-WS,2.0 - Error: Connection refused)\n",
        ),
    );
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 2));
    assert_eq!(r["licensing_mode"], "legacy", "{r:#}");
    let e = &r["events"][1];
    assert_eq!(
        (e["server"].as_str(), e["edition"].as_str()),
        (Some("10.0.0.7"), Some("GRID-Virtual-WS,2.0"))
    );
    let advice = r["failure"]["advice"].as_str().unwrap();
    assert!(advice.contains("legacy license server"), "{advice}");
    assert!(!advice.contains("The DLS"), "{advice}");
}

#[test]
fn a_log_that_says_nothing_of_a_license_proves_nothing() {
    // The first lines of gridd-log-legacy-flexnet-1.txt, before its acquisition: gridd has
    // not yet said anything about a license.
    let (r, code) = analyze(
        &["--journal", "-"],
        Some(
            b"Oct 5 15:04:45 localhost nvidia-gridd: Started (16224)\n\
                Oct 5 15:05:16 localhost nvidia-gridd: Service provider detection complete.\n",
        ),
    );
    assert_eq!((r["state"].as_str(), code), (Some("unknown"), 3));
    assert_eq!(r["events"].as_array().unwrap().len(), 2);
    assert_eq!(r["licensing_mode"], "unknown");
}

#[test]
fn commented_doc_paste_with_token_missing_then_fixed() {
    let (r, code) = journal("gridd-log-nrec-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert!(kinds(&r).contains(&"token_error"));
    let missing = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "token_error")
        .unwrap();
    assert_eq!(missing["reason"], "token_missing");
    // A later success cleared it.
    assert_eq!(r["failure"], Value::Null);
    assert_eq!(r["license"]["expiry"], "2024-10-19T06:58:28Z");
}

#[test]
fn windows_container_logs_same_library() {
    let (r, _) = journal("gridd-log-fastapi-dls-3-windows.txt");
    assert_eq!(r["state"], "licensed");
    assert_eq!(r["events"][0]["at"], "2022-12-20T17:25:11");
    let (r, code) = journal("gridd-log-fastapi-dls-4-windows.txt");
    // The last lease was returned and logging ended: nothing is held.
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 1));
    assert!(kinds(&r).contains(&"return_failed"));
    assert_eq!(r["failure"], Value::Null, "the later acquire cleared it");
    let (r, _) = journal("gridd-log-fastapi-dls-5-windows.txt");
    // Renewals with local (zone-less) times against a GMT expiry: still held.
    assert_eq!(r["state"], "licensed");
    assert!(kinds(&r).contains(&"mismatch"));
    let (r, code) = journal("gridd-log-fastapi-dls-mirror-issue3-windows.txt");
    // gridd says `Valid GRID license not found. GPU features and performance will be
    // restricted.` and nothing later acquires one: a failure (critical), the notice its text.
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 2));
    assert!(kinds(&r).contains(&"unlicensed_notice"));
    assert_eq!(r["failure"]["reason"], "unspecified");
    assert!(
        r["failure"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Valid GRID license not found.")
    );
    assert_eq!(r["failure"]["at"], "2024-04-22T22:12:41");
}

#[test]
fn other_programs_logs_give_nothing() {
    // (The vGPU manager's log is the host's: tests/host.rs.)
    for name in [
        "dls-server-log-fastapi-dls-linux-client.txt",
        "griddconf-jp-dls-guide-1.txt",
        "smi-jp-dls-guide-2.txt",
    ] {
        let (r, code) = journal(name);
        assert_eq!(r["events"].as_array().unwrap().len(), 0, "{name}");
        assert_eq!((r["state"].as_str(), code), (Some("unknown"), 3), "{name}");
    }
}

#[test]
fn smi_samples() {
    let (r, code) = smi("smi-cudaerror4vgpu-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 1));
    assert_eq!(r["gpus"][0]["bus_id"], "00000000:00:10.0");
    assert_eq!(r["gpus"][0]["profile"], "NVIDIA RTXA6000-24Q");
    assert_eq!(r["gpus"][0]["virtualization_mode"], "VGPU");
    assert_eq!(r["gpus"][0]["edition"], "NVIDIA RTX Virtual Workstation");
    assert_eq!(r["license"]["status"], "Unlicensed");

    let (r, code) = smi("smi-jp-dls-guide-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 1));
    assert_eq!(r["license"]["status"], "Unlicensed (Unrestricted)");
    assert_eq!(r["gpus"][0]["profile"], "GRID A100-4C");

    let (r, code) = smi("smi-jp-dls-guide-2.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["expiry"], "2022-05-27T00:08:28Z");
    assert_eq!(r["license"]["edition"], "NVIDIA Virtual Compute Server");
    // nvidia-smi's Timestamp has no zone: not reported as an exact time.
    assert_eq!(r["observed_at"], Value::Null);

    // Before 2020 the section was `GRID Licensed Product`: its Product Name is the edition.
    let (r, code) = smi("smi-grid-licensed-product-aws-g4-windows.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["edition"], "GRID vGaming");
    assert_eq!(r["gpus"][0]["profile"], Value::Null);

    let (r, _) = smi("smi-fastapi-dls-1.txt");
    assert_eq!(r["state"], "licensed");
    assert_eq!(r["license"]["expiry"], "2023-01-14T12:59:52Z");
    assert_eq!(r["gpus"][0]["bus_id"], Value::Null);

    let (r, _) = smi("smi-gpu-operator-220.txt");
    assert_eq!(r["state"], "unlicensed");
    assert_eq!(r["license"]["edition"], "NVIDIA Virtual Compute Server");

    let (r, code) = smi("smi-dcgm-license-strings.txt");
    assert_eq!((r["state"].as_str(), code), (Some("unknown"), 3));
}

#[test]
fn smi_decides_the_state_the_log_adds_events() {
    let (r, code) = analyze(
        &[
            "--smi",
            &sample("smi-jp-dls-guide-2.txt"),
            "--journal",
            &sample("gridd-log-jp-dls-guide-1.txt"),
            "--token",
            &fixture("example.tok").display().to_string(),
        ],
        None,
    );
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["events"].as_array().unwrap().len(), 6);
    assert_eq!(
        r["dls"],
        serde_json::json!([{"host": "dls.example.internal", "port": 443}])
    );
}

// Outputs that no sample shows, written as the drivers print them.

#[test]
fn restricted_passthrough_and_no_driver() {
    let restricted = b"GPU 00000000:02:01.0\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : Unlicensed (Restricted)\n";
    let (r, code) = analyze(&["--smi", "-"], Some(restricted));
    assert_eq!((r["state"].as_str(), code), (Some("restricted"), 2));

    let passthrough = b"==============NVSMI LOG==============\nAttached GPUs : 1\nGPU 00000000:17:00.0\n    Product Name : NVIDIA H100 80GB HBM3\n    GPU Virtualization Mode\n        Virtualization Mode : Pass-Through\n        Host VGPU Mode : N/A\n";
    let (r, code) = analyze(&["--smi", "-"], Some(passthrough));
    assert_eq!((r["state"].as_str(), code), (Some("not_licensable"), 0));

    let no_driver = b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n";
    let (r, code) = analyze(&["--smi", "-"], Some(no_driver));
    assert_eq!((r["state"].as_str(), code), (Some("no_driver"), 2));

    let xml = br#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log><timestamp>Thu May 26 00:18:44 2022</timestamp><driver_version>510.47.03</driver_version>
<gpu id="00000000:02:01.0"><product_name>GRID A100-4C</product_name>
<gpu_virtualization_mode><virtualization_mode>VGPU</virtualization_mode></gpu_virtualization_mode>
<vgpu_software_licensed_product><licensed_product_name>NVIDIA Virtual Compute Server</licensed_product_name>
<license_status>Licensed (Expiry: 2022-5-27 0:8:28 GMT)</license_status></vgpu_software_licensed_product></gpu></nvidia_smi_log>"#;
    let (r, code) = analyze(&["--smi", "-"], Some(xml));
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["expiry"], "2022-05-27T00:08:28Z");
}

#[test]
fn clock_skew_and_missing_edition_explained() {
    let log = b"Mar 02 10:00:00 vm nvidia-gridd[900]: Acquiring license. (Info: dls.example; NVIDIA RTX Virtual Workstation)\n\
Mar 02 10:00:01 vm nvidia-gridd[900]: Failed to acquire license from dls.example (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)\n";
    let (r, code) = analyze(&["--journal", "-"], Some(log));
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 2));
    assert_eq!(r["failure"]["reason"], "clock_skew");
    let advice = r["failure"]["advice"].as_str().unwrap();
    assert!(advice.contains("timedatectl") && advice.contains("restart nvidia-gridd"));

    let log = b"Mar 02 10:00:01 vm nvidia-gridd[900]: Failed to acquire license from dls.example (Info: NVIDIA Virtual Compute Server - Error: No pool features found for : NVIDIA Virtual Compute Server)\n";
    let smi = sample("smi-jp-dls-guide-1.txt");
    let (r, _) = analyze(&["--journal", "-", "--smi", &smi], Some(log));
    assert_eq!(r["failure"]["reason"], "no_license_available");
    let advice = r["failure"]["advice"].as_str().unwrap();
    assert!(advice.contains("NVIDIA Virtual Compute Server") && advice.contains("GRID A100-4C"));
}

#[test]
fn journal_json_export_and_trusted_store_sequence() {
    let lines = [
        r#"{"__REALTIME_TIMESTAMP":"1700000000000000","_COMM":"sshd","MESSAGE":"Accepted publickey"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000001000000","_COMM":"nvidia-gridd","_PID":"77","MESSAGE":"Failed to update local trusted store - Maximum buffer size exceeded"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000001000000","_COMM":"nvidia-gridd","_PID":"77","MESSAGE":"Failed to register client (2)"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000002000000","SYSLOG_IDENTIFIER":"nvidia-gridd","_PID":"77","MESSAGE":"Failed to acquire license from 10.0.0.5"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000003000000","_COMM":"bash","MESSAGE":"nvidia-gridd[77]: License acquired successfully. (Info: 10.0.0.5, NVIDIA Virtual PC; Expiry: 2030-1-1 0:0:0 GMT)"}"#,
    ];
    let (r, code) = analyze(&["--journal", "-"], Some(lines.join("\n").as_bytes()));
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 2));
    assert_eq!(r["events"].as_array().unwrap().len(), 3);
    assert_eq!(r["events"][2]["kind"], "acquire_failed");
    assert_eq!(r["events"][2]["reason"], "trusted_store");
    assert_eq!(r["failure"]["reason"], "trusted_store");
    assert_eq!(r["events"][2]["at"], "2023-11-14T22:13:22Z");
    assert_eq!(r["observed_at"], "2023-11-14T22:13:23Z");
}

/// In a `journalctl -o json` export, journald's own fields say who logged an entry: a user's
/// `logger -t nvidia-gridd` is not gridd, whatever it calls itself. Hand-made entries without
/// any such field are taken by their `SYSLOG_IDENTIFIER`.
#[test]
fn journal_json_export_with_forged_gridd_lines() {
    let lines = [
        r#"{"__REALTIME_TIMESTAMP":"1700000000000000","SYSLOG_IDENTIFIER":"nvidia-gridd","MESSAGE":"NLS initialized"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000001000000","_UID":"0","_COMM":"nvidia-gridd","_PID":"77","SYSLOG_IDENTIFIER":"nvidia-gridd","MESSAGE":"License acquired successfully. (Info: 10.0.0.5, NVIDIA Virtual PC; Expiry: 2035-1-1 0:0:0 GMT)"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000002000000","_UID":"1000","_COMM":"logger","_PID":"900","SYSLOG_IDENTIFIER":"nvidia-gridd","SYSLOG_PID":"77","MESSAGE":"Failed to acquire license from 10.0.0.5 (Info: NVIDIA Virtual PC - Error: Clock windback has been detected)"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700000003000000","_UID":"1000","_COMM":"nvidia-gridd","_EXE":"/home/u/nvidia-gridd","_PID":"901","SYSLOG_IDENTIFIER":"nvidia-gridd","MESSAGE":"Failed to acquire license from 10.0.0.5 (Info: NVIDIA Virtual PC - Error: Clock windback has been detected)"}"#,
    ];
    let (r, code) = analyze(&["--journal", "-"], Some(lines.join("\n").as_bytes()));
    let kinds: Vec<&str> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["initialized", "acquired"], "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0), "{r:#}");
}

#[test]
fn a_lease_that_expired_before_the_log_ends() {
    let lines = [
        r#"{"__REALTIME_TIMESTAMP":"1700000000000000","_COMM":"nvidia-gridd","MESSAGE":"License acquired successfully. (Info: d, NVIDIA Virtual PC; Expiry: 2023-11-15 22:13:20 GMT)"}"#,
        r#"{"__REALTIME_TIMESTAMP":"1700200000000000","_COMM":"kernel","MESSAGE":"later"}"#,
    ];
    let (r, code) = analyze(&["--journal", "-"], Some(lines.join("\n").as_bytes()));
    assert_eq!((r["state"].as_str(), code), (Some("unlicensed"), 1));
}

#[test]
fn bad_inputs_get_one_line_errors() {
    let out = Command::new(BIN).args(["analyze"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--smi") && err.contains("--journal"));

    let out = Command::new(BIN)
        .args(["analyze", "--journal", "/nonexistent/log"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("/nonexistent/log")
    );

    let out = Command::new(BIN)
        .args(["analyze", "--smi", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .unwrap()
                .write_all(b"<nvidia_smi_log><gpu>")?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("not valid nvidia-smi XML")
    );
}

/// A fragment of `nvidia-smi -q -x` as copied from an issue: two `<gpu>` elements, no
/// declaration and no enclosing `<nvidia_smi_log>`.
#[test]
fn a_pasted_fragment_of_the_xml_is_read() {
    let gpu = |bus: &str, status: &str| {
        format!(
            "<gpu id=\"{bus}\">\n<product_name>NVIDIA L40S-24Q</product_name>\n\
             <gpu_virtualization_mode>\n<virtualization_mode>VGPU</virtualization_mode>\n</gpu_virtualization_mode>\n\
             <vgpu_software_licensed_product>\n\
             <licensed_product_name>NVIDIA RTX Virtual Workstation</licensed_product_name>\n\
             <license_status>{status}</license_status>\n\
             </vgpu_software_licensed_product>\n</gpu>\n"
        )
    };
    let paste = gpu("00000000:02:01.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
        + &gpu("00000000:02:02.0", "Unlicensed (Restricted)");
    let (r, code) = analyze(&["--smi", "-"], Some(paste.as_bytes()));
    assert_eq!(
        (r["state"].as_str(), code),
        (Some("restricted"), 2),
        "{r:#}"
    );
    let statuses: Vec<_> = r["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["bus_id"].as_str(), g["license_status"].as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            (
                Some("00000000:02:01.0"),
                Some("Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
            ),
            (Some("00000000:02:02.0"), Some("Unlicensed (Restricted)")),
        ]
    );
}

#[test]
fn human_summary_names_state_failure_and_fix() {
    let out = Command::new(BIN)
        .args([
            "analyze",
            "--journal",
            &sample("gridd-log-cudaerror4vgpu-1.txt"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("State:    unlicensed"), "{text}");
    // `Failed to setup cloud License Manager` and `NLS initialized`: the token path, but no
    // token or server names the service.
    assert!(text.contains("Licensing: unknown"), "{text}");
    assert!(text.contains("Failure:  token_invalid"), "{text}");
    assert!(text.contains("Fix:"), "{text}");
    let out = Command::new(BIN)
        .args(["analyze", "--smi", &sample("smi-jp-dls-guide-2.txt")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Expires:  2022-05-27 00:08:28 UTC ("),
        "{text}"
    );
    assert!(text.contains("local)"), "{text}");
}

// Fragments: excerpts, flattened pastes, the legacy server's URL form (the host's view:
// tests/host.rs).

#[test]
fn an_excerpt_of_a_vgpu_guest_without_its_license_section_is_unknown() {
    // Driver 595's documented output, line-numbered as the page renders it, cut before the
    // license section: the profile H100-80C is a vGPU, so nothing says it is not licensable.
    let (r, code) = smi("smi-595-docs-excerpt-numbered.txt");
    assert_eq!((r["state"].as_str(), code), (Some("unknown"), 3));
    assert_eq!(r["gpus"][0]["bus_id"], "00000000:02:01.0");
    assert_eq!(r["gpus"][0]["profile"], "NVIDIA H100-80C");
    let note = r["notes"][0].as_str().unwrap();
    assert!(
        note.starts_with("the license section is not in this output")
            && note.contains("NVIDIA H100-80C"),
        "{note}"
    );
}

#[test]
fn a_license_section_flattened_by_a_paste_is_read() {
    let (r, code) = smi("smi-flattened-vcs-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["edition"], "NVIDIA Virtual Compute Server");
    assert_eq!(r["license"]["expiry"], "2021-11-13T18:29:59Z");
    // AWS's guide glues the section onto its own sentence.
    let (r, code) = smi("smi-flattened-aws-cloud-gaming.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["license"]["edition"], "NVIDIA Cloud Gaming");
    assert_eq!(r["license"]["status"], "Licensed (Expiry: N/A)");
    assert_eq!(r["gpus"][0]["profile"], Value::Null);
}

#[test]
fn the_legacy_servers_url_form_is_legacy_and_keeps_its_edition() {
    let (r, code) = journal("gridd-log-legacy-acquired-url-1.txt");
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0));
    assert_eq!(r["licensing_mode"], "legacy");
    let acquired = &r["events"][1];
    assert_eq!(acquired["kind"], "acquired");
    assert_eq!(acquired["server"], "10.5.8.208");
    assert_eq!(acquired["edition"], "Quadro-Virtual-DWS,5.0");
    assert_eq!(r["license"]["edition"], "Quadro-Virtual-DWS,5.0");
    assert_eq!(r["dls"], Value::Null);

    let (r, _) = journal("gridd-log-legacy-acquired-url-2.txt");
    assert_eq!(r["licensing_mode"], "legacy");
    assert_eq!(r["events"][0]["server"], "10.103.15.200");
    assert_eq!(r["license"]["edition"], "NVIDIA Virtual Compute Server");
}

#[test]
fn a_log_without_times_gets_the_journalctl_options_that_keep_them() {
    let hint = |r: &Value| {
        r["notes"].as_array().is_some_and(|n| {
            n.iter().any(|n| {
                let n = n.as_str().unwrap();
                n.contains("-o json") && n.contains("-o short-iso")
            })
        })
    };
    // `journalctl -u nvidia-gridd -f` as pasted without its times, and a bare quoted line.
    let (r, _) = journal("gridd-log-fastapi-dls-2.txt");
    assert!(hint(&r), "{r}");
    let (r, _) = journal("gridd-log-legacy-acquired-url-2.txt");
    assert!(hint(&r), "{r}");
    // Syslog lines, as `grep gridd /var/log/messages` and journalctl's default output write
    // them: a time of day, no year, so no event can be dated either.
    let (r, _) = journal("gridd-log-legacy-acquired-url-1.txt");
    assert!(hint(&r), "{r}");
    assert!(r["notes"].to_string().contains("carry no year"), "{r}");
    // A log whose lines can be dated needs no hint.
    let (r, _) = journal("gridd-log-jp-dls-guide-1.txt");
    assert!(!hint(&r), "{r}");
}
