//! A machine whose NVIDIA driver brought no `nvidia-gridd.service` (a driver purged and put
//! back without it, a build without the unit), with the restart command of the default
//! config: `systemctl restart nvidia-gridd.service`. What operators rely on: neither `install`
//! nor the service tries a restart that can only fail; both say that there is no unit to
//! restart and what brings it, and the token stays installed.

use std::process::Command;
use std::time::Duration;

use crate::common::sim::{self, Agent, Machine, write_gridd_conf};
use crate::service::agent_says;

/// The machine without gridd's unit, its restart command systemctl's on that unit.
fn without_gridd_unit() -> Machine {
    let m = Machine::new(sim::setup(|c| c.gridd_unit = false));
    m.set_config(
        "restart_gridd",
        &format!(
            "[\"{}/bin/systemctl\", \"restart\", \"nvidia-gridd.service\"]",
            m.root().display()
        ),
    );
    write_gridd_conf(&m);
    m
}

const SAID: &str = "there is no nvidia-gridd.service to restart";

#[test]
fn install_without_a_gridd_unit_says_so_instead_of_failing_a_restart() {
    let m = without_gridd_unit();
    let tok = m.token();
    let f = m.path("in/t.tok");
    sim::write_mode(&f, &tok, 0o600);
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .arg("--config")
        .arg(&m.config)
        .args(["install", "--token-file"])
        .arg(&f)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(SAID), "{stdout}");
    assert!(stdout.contains("guest driver"), "what to do: {stdout}");
    assert!(!stderr.contains("not found"), "no restart tried: {stderr}");
    assert_eq!(std::fs::read(m.token_path()).unwrap(), tok);
    // Nothing owed: a second run changes nothing and says nothing of a restart.
    let again = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .arg("--config")
        .arg(&m.config)
        .args(["install", "--token-file"])
        .arg(&f)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("nothing to change"), "{stdout}");
}

#[test]
fn the_service_adopting_a_token_without_a_gridd_unit_tries_no_restart() {
    let m = without_gridd_unit();
    m.drop_token(0o744);
    let a = Agent::start(&m);
    sim::wait_for(
        "the agent saying there is no unit to restart",
        Duration::from_secs(30),
        || agent_says(&m, &a).contains(SAID).then_some(()),
        || a.context(),
    );
    let v = a.wait_status("gridd_not_running", Duration::from_secs(30), |v| {
        sim::reason(v) == Some("gridd_not_running")
    });
    assert!(
        v["failure"]["message"]
            .as_str()
            .is_some_and(|s| s.contains("is not installed")),
        "{v:#}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let said = agent_says(&m, &a);
    assert!(!said.contains("restarting nvidia-gridd failed"), "{said}");
    assert_eq!(said.matches(SAID).count(), 1, "said once: {said}");
    assert_eq!(a.metric("vgpu_license_gridd_restarts_total"), Some(0.0));
}
