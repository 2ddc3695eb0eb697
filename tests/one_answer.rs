//! One answer for one machine: `status` on its own (no service running) says what the
//! service said a moment before, field for field where both can know it: the state and exit
//! code, the licensing mode, the license, each vGPU, the failure's reason and advice. What
//! only the service can know (its pid, a file it refused, its probe's words) is left out.

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::common::sim::{Agent, Machine, Mode, NetworkFailure, setup, write_gridd_conf};
use crate::service::{T, licensed};

/// What both must say alike.
fn answer(v: &Value) -> Value {
    let gpus: Vec<Value> = v["gpus"]
        .as_array()
        .map(|g| {
            g.iter()
                .map(|g| {
                    json!([
                        g["bus_id"],
                        g["profile"],
                        g["license_status"],
                        g["state"],
                        g["expiry"]
                    ])
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "state": v["state"],
        "exit_code": v["exit_code"],
        "licensing_mode": v["licensing_mode"],
        "license": v["license"],
        "gpus": gpus,
        "dls": v["dls"],
        "reason": v["failure"]["reason"],
        "advice": v["failure"]["advice"],
    })
}

/// The service's last report, then `status --json` of the same machine once the service
/// has stopped.
fn served_then_alone(m: &Machine, mut a: Agent) -> (Value, Value) {
    let served = a.status().expect("the service's status.json");
    a.signal(Signal::SIGTERM);
    a.wait_exit(T).expect("the service stops on SIGTERM");
    let out = m.cli(&["status", "--json"]);
    let alone: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        alone["agent_pid"].is_null(),
        "observed by status itself: {alone:#}"
    );
    assert_eq!(
        out.status.code(),
        alone["exit_code"].as_i64().map(|c| c as i32)
    );
    (served, alone)
}

#[test]
fn scenario_licensed_status_alone_says_what_the_service_said() {
    let (m, a) = licensed(setup(|s| s.gpu_count = 2));
    let (served, alone) = served_then_alone(&m, a);
    assert_eq!(served["state"], "licensed", "{served:#}");
    assert_eq!(
        answer(&alone),
        answer(&served),
        "alone:\n{alone:#}\nserved:\n{served:#}"
    );
}

#[test]
fn scenario_dls_down_status_alone_says_what_the_service_said() {
    let m = Machine::new(setup(|s| {
        s.acquire_retry = false;
        s.network_failure = NetworkFailure::Full;
        s.gpu_count = 2;
        s.unlicensed_gpus = vec![1];
    }));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    // No restart of gridd: the machine holds still between the service's report and
    // `status`'s look (a restart stopped with the service would change what is seen).
    m.set_config("restart_budget_per_hour", "0");
    m.dls.set_mode(Mode::Refusing);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_status("gridd's network failure reported", T, |v| {
        v["failure"]["reason"] == "dls_unreachable" && v["state"] != "licensed"
    });
    let (served, alone) = served_then_alone(&m, a);
    assert_eq!(
        answer(&alone),
        answer(&served),
        "alone:\n{alone:#}\nserved:\n{served:#}"
    );
}
