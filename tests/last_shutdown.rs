//! The last shutdown's lease, read by the service from the previous boot's journal: the real
//! agent against the simulator, with a journalctl that serves a recorded previous boot (the
//! test machine's own journal holds one boot only).

use std::fs;
use std::time::Duration;

use crate::common::sim::{Agent, Machine, Setup, wait_for};

const T: Duration = Duration::from_secs(45);

/// A previous boot as `journalctl -o json` prints it: gridd held a lease, shut down, and its
/// return failed (the network was already down).
fn previous_boot(returned: bool) -> String {
    let line = |usec: u64, msg: &str| {
        serde_json::json!({
            "__REALTIME_TIMESTAMP": usec.to_string(),
            "_UID": "0", "_COMM": "nvidia-gridd", "_PID": "812",
            "SYSLOG_IDENTIFIER": "nvidia-gridd", "MESSAGE": msg,
        })
        .to_string()
            + "\n"
    };
    let base = 1_764_460_800_000_000u64; // 2025-11-30T00:00:00Z
    let mut s = line(
        base,
        "License acquired successfully. (Info: 10.0.0.5, NVIDIA RTX Virtual Workstation; Expiry: 2025-12-1 0:0:0 GMT)",
    );
    s += &line(base + 3_600_000_000, "Shutdown (812)");
    s += &if returned {
        line(
            base + 3_601_000_000,
            "License returned successfully. (Info: 10.0.0.5)",
        )
    } else {
        line(
            base + 3_625_000_000,
            "Failed to return license to 10.0.0.5 (Error: Generic network communication failure)",
        )
    };
    s
}

fn run(returned: bool) {
    let m = Machine::new(Setup::default());
    let recorded = m.path("previous-boot.json");
    fs::write(&recorded, previous_boot(returned)).unwrap();
    // The machine's journalctl, but `--boot=-1` answers with the recorded previous boot.
    let wrapper = m.path("bin/journalctl");
    let real = fs::read_to_string(&wrapper).unwrap();
    fs::write(
        &wrapper,
        real.replacen(
            "#!/bin/sh\n",
            &format!(
                "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --boot=-1 ] && exec cat '{}'; done\n",
                recorded.display()
            ),
            1,
        ),
    )
    .unwrap();
    crate::common::make_executable(&wrapper);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("the last shutdown in the report", T, |v| {
        v["last_shutdown"].is_object()
    });
    assert_eq!(v["last_shutdown"]["lease_returned"], returned, "{v:#}");
    assert_eq!(
        v["last_shutdown"]["at"],
        if returned {
            "2025-11-30T01:00:01Z"
        } else {
            "2025-11-30T01:00:25Z"
        }
    );
    assert_eq!(
        v["last_shutdown"]["stop_seconds"].as_f64(),
        Some(if returned { 1.0 } else { 25.0 })
    );
    wait_for(
        "the metric",
        T,
        || a.metric("vgpu_license_last_return_success"),
        || a.context(),
    );
    assert_eq!(
        a.metric("vgpu_license_last_return_success"),
        Some(if returned { 1.0 } else { 0.0 })
    );
    assert_eq!(
        a.metric("vgpu_license_last_shutdown_timestamp_seconds"),
        Some(if returned {
            1_764_464_401.0
        } else {
            1_764_464_425.0
        })
    );
}

#[test]
fn scenario_a_lease_left_held_at_the_last_shutdown_is_reported() {
    run(false);
}

#[test]
fn scenario_a_lease_returned_at_the_last_shutdown_is_reported() {
    run(true);
}
