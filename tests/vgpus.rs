//! Guests with several vGPUs (`tests/fixtures/vgpus/`): NVIDIA licenses each vGPU on its own,
//! so each is reported with its own license, and one that is not licensed is named.

use std::process::Command;

use serde_json::{Value, json};

use crate::samples::{analyze, fixture};

const BIN: &str = env!("CARGO_BIN_EXE_vgpu-license-agent");

const DC_1_12Q: &str = "NVIDIA RTX Pro 6000 Blackwell DC-1-12Q";
const DC_48C: &str = "NVIDIA RTX Pro 6000 Blackwell DC-48C";

fn vgpus(name: &str) -> String {
    fixture("vgpus").join(name).display().to_string()
}

/// Each vGPU as the report must give it: bus id, profile, License Status, state, expiry.
fn expected(three: bool) -> Value {
    let gpu = |bus: &str, profile: &str, edition: &str, status: &str, state: &str, expiry| {
        json!({
            "bus_id": bus,
            "profile": profile,
            "virtualization_mode": "VGPU",
            "license_status": status,
            "edition": edition,
            "state": state,
            "expiry": expiry,
        })
    };
    let rtx = "NVIDIA RTX Virtual Workstation";
    let mut gpus = vec![
        gpu(
            "00000000:02:01.0",
            DC_1_12Q,
            rtx,
            "Licensed (Expiry: 2026-12-7 15:2:11 GMT)",
            "licensed",
            Value::from("2026-12-07T15:02:11Z"),
        ),
        gpu(
            "00000000:03:01.0",
            DC_48C,
            "NVIDIA Virtual Compute Server",
            "Unlicensed (Restricted)",
            "restricted",
            Value::Null,
        ),
    ];
    if three {
        gpus.push(gpu(
            "00000000:04:01.0",
            DC_1_12Q,
            rtx,
            "Licensed (Expiry: 2026-12-7 9:40:3 GMT)",
            "licensed",
            Value::from("2026-12-07T09:40:03Z"),
        ));
    }
    Value::from(gpus)
}

#[test]
fn each_vgpu_has_its_own_license_in_text_and_xml() {
    for (name, three) in [
        ("smi-two-vgpus-blackwell.txt", false),
        ("smi-two-vgpus-blackwell.xml", false),
        ("smi-three-vgpus-blackwell.txt", true),
        ("smi-three-vgpus-blackwell.xml", true),
        ("smi-two-vgpus-fragment.xml", false),
    ] {
        let (r, code) = analyze(&["--smi", &vgpus(name)], None);
        assert_eq!(r["gpus"], expected(three), "{name}: {r:#}");
        // The worst vGPU decides: restricted, and the license shown is that vGPU's.
        assert_eq!(
            (r["state"].as_str(), code),
            (Some("restricted"), 2),
            "{name}"
        );
        assert_eq!(
            r["license"],
            json!({"status": "Unlicensed (Restricted)", "edition": "NVIDIA Virtual Compute Server", "expiry": null}),
            "{name}"
        );
    }
}

#[test]
fn the_human_report_gives_each_vgpus_line_and_names_the_one_not_licensed() {
    let out = Command::new(BIN)
        .args(["analyze", "--smi", &vgpus("smi-three-vgpus-blackwell.txt")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let want = [
        "Status:   2 of 3 vGPUs licensed; not licensed: 00000000:03:01.0 NVIDIA RTX Pro 6000 Blackwell DC-48C (Unlicensed (Restricted))",
        "GPU:      00000000:02:01.0 NVIDIA RTX Pro 6000 Blackwell DC-1-12Q (VGPU): Licensed until 2026-12-07 15:02:11 UTC",
        "GPU:      00000000:03:01.0 NVIDIA RTX Pro 6000 Blackwell DC-48C (VGPU): Unlicensed (Restricted)",
        "GPU:      00000000:04:01.0 NVIDIA RTX Pro 6000 Blackwell DC-1-12Q (VGPU): Licensed until 2026-12-07 09:40:03 UTC",
    ];
    for line in want {
        assert!(lines.contains(&line), "{line:?} not in:\n{text}");
    }
    assert!(
        text.contains("State:    unlicensed and RESTRICTED"),
        "{text}"
    );
    // No first vGPU's "Licensed" or expiry stands for a throttled guest.
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("Status:   Licensed") || l.starts_with("Expires:")),
        "{text}"
    );
}

#[test]
fn every_vgpu_licensed_shows_the_count_and_the_first_expiry() {
    let text = std::fs::read_to_string(vgpus("smi-three-vgpus-blackwell.txt")).unwrap();
    let all = text.replace(
        "Unlicensed (Restricted)",
        "Licensed (Expiry: 2026-12-8 1:0:0 GMT)",
    );
    let (r, code) = analyze(&["--smi", "-"], Some(all.as_bytes()));
    assert_eq!((r["state"].as_str(), code), (Some("licensed"), 0), "{r:#}");
    // The lease that runs out first is the guest's.
    assert_eq!(r["license"]["expiry"], "2026-12-07T09:40:03Z", "{r:#}");
    let out = Command::new(BIN)
        .args(["analyze", "--smi", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(all.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let human = String::from_utf8(out.stdout).unwrap();
    assert!(
        human.contains("Status:   3 of 3 vGPUs licensed\n"),
        "{human}"
    );
    assert!(
        human.contains("Expires:  2026-12-07 09:40:03 UTC ("),
        "{human}"
    );
}

#[test]
fn the_metrics_give_each_vgpu_by_bus_id() {
    let out = Command::new(BIN)
        .args([
            "analyze",
            "--metrics",
            "--smi",
            &vgpus("smi-two-vgpus-blackwell.xml"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for (bus, profile, v) in [
        ("00000000:02:01.0", DC_1_12Q, 1),
        ("00000000:03:01.0", DC_48C, 0),
    ] {
        let series =
            format!("vgpu_license_gpu_licensed{{bus_id=\"{bus}\",profile=\"{profile}\"}} {v}");
        assert!(text.lines().any(|l| l == series), "{series}:\n{text}");
    }
}
