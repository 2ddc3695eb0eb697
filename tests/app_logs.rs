//! `analyze --app-log`: an application's own log (`tests/fixtures/app-logs/`). CUDA error 102
//! names the license as the cause, with the command to run next on the guest; TensorFlow's
//! `operation not supported` alone is a hint; other CUDA errors never are the license.

use std::process::Command;

use serde_json::Value;

use crate::samples::{analyze, fixture};

const BIN: &str = env!("CARGO_BIN_EXE_vgpu-license-agent");

fn app_log(name: &str) -> String {
    fixture("app-logs").join(name).display().to_string()
}

fn notes(r: &Value) -> Vec<&str> {
    r["notes"]
        .as_array()
        .map(|n| n.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn cuda_error_102_is_the_license_with_the_next_command() {
    for (name, line) in [
        (
            "pytorch-not-licensed.txt",
            "RuntimeError: CUDA error: device doesn't have valid Grid license",
        ),
        (
            "tensorflow-not-licensed.txt",
            "device doesn't have valid Grid license",
        ),
    ] {
        let (r, code) = analyze(&["--app-log", &app_log(name)], None);
        assert_eq!(
            (r["state"].as_str(), code),
            (Some("restricted"), 2),
            "{name}: {r:#}"
        );
        let f = &r["failure"];
        assert_eq!(f["reason"], "cuda_not_licensed", "{name}");
        assert_eq!(f["message"], line, "{name}");
        let advice = f["advice"].as_str().unwrap();
        assert!(advice.contains("CUDA error 102"), "{name}: {advice}");
        assert!(
            advice.contains("not a memory or code bug"),
            "{name}: {advice}"
        );
        assert!(
            advice.contains("run `vgpu-license-agent status`"),
            "{name}: {advice}"
        );
    }
}

#[test]
fn the_human_report_names_the_license_and_what_to_run() {
    let out = Command::new(BIN)
        .args(["analyze", "--app-log", &app_log("pytorch-not-licensed.txt")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("State:    unlicensed and RESTRICTED"),
        "{text}"
    );
    assert!(
        text.contains(
            "Failure:  cuda_not_licensed: RuntimeError: CUDA error: device doesn't have valid Grid license\n"
        ),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("Fix:") && l.contains("`vgpu-license-agent status`")),
        "{text}"
    );
}

#[test]
fn operation_not_supported_alone_is_a_hint_not_a_verdict() {
    let (r, code) = analyze(
        &[
            "--app-log",
            &app_log("tensorflow-operation-not-supported.txt"),
        ],
        None,
    );
    assert_eq!((r["state"].as_str(), code), (Some("unknown"), 3), "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
    let hint = notes(&r)
        .into_iter()
        .find(|n| n.contains("line 5: `tensorflow.python.framework.errors_impl.InternalError: cudaSetDevice() on GPU:0 failed. Status: operation not supported`"))
        .unwrap_or_else(|| panic!("no hint: {r:#}"));
    assert!(hint.contains("for want of a license"), "{hint}");
    // Its other causes, one of them a driver that was not installed right.
    assert!(hint.contains("the driver not installed right"), "{hint}");
    assert!(hint.contains("run `vgpu-license-agent status`"), "{hint}");
}

#[test]
fn out_of_memory_and_invalid_device_ordinal_are_never_the_license() {
    for (name, line) in [
        ("pytorch-out-of-memory.txt", 7),
        ("pytorch-invalid-device-ordinal.txt", 8),
    ] {
        let (r, code) = analyze(&["--app-log", &app_log(name)], None);
        assert_eq!(
            (r["state"].as_str(), code),
            (Some("unknown"), 3),
            "{name}: {r:#}"
        );
        assert!(r["failure"].is_null(), "{name}: {r:#}");
        let n = notes(&r);
        assert!(
            n.iter().any(|n| n.contains(&format!("line {line}: "))
                && n.contains("a CUDA error that is not a license error")),
            "{name}: {n:#?}"
        );
        assert!(
            !n.iter().any(|n| n.contains("for want of a license")),
            "{name}: {n:#?}"
        );
    }
}

/// People give the job's log where gridd's is asked for: a --journal file without gridd's
/// lines is read as an application's log too.
#[test]
fn a_jobs_log_given_as_the_journal_is_read_as_the_application_s() {
    let (r, code) = analyze(&["--journal", &app_log("pytorch-not-licensed.txt")], None);
    assert_eq!(
        (r["state"].as_str(), code),
        (Some("restricted"), 2),
        "{r:#}"
    );
    assert_eq!(
        r["failure"]["message"],
        "RuntimeError: CUDA error: device doesn't have valid Grid license"
    );
    let (r, _) = analyze(&["--journal", &app_log("pytorch-out-of-memory.txt")], None);
    assert_eq!(r["state"], "unknown", "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
}

/// nvidia-smi decides the state now; the job's error 102 is history, said in a note.
#[test]
fn a_license_held_now_makes_the_jobs_error_a_note() {
    let smi = fixture("samples")
        .join("smi-jp-dls-guide-2.txt")
        .display()
        .to_string();
    let (r, _) = analyze(
        &[
            "--smi",
            &smi,
            "--app-log",
            &app_log("pytorch-not-licensed.txt"),
        ],
        None,
    );
    assert_eq!(r["state"], "licensed", "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
    assert!(
        notes(&r)
            .iter()
            .any(|n| n.contains("line 10: `RuntimeError: CUDA error: device doesn't have valid Grid license`: CUDA error 102")),
        "{r:#}"
    );
}
