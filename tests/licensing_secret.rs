//! The licensing Secret against the token gridd runs with, end to end, on a GPU Operator
//! node (the simulated driver container of `gpu_operator.rs`) whose agent runs as in the
//! DaemonSet's pod, against the simulated API: the Secret is read only where a Role grants
//! get on that one name (a 403 is said once, with the Role to apply, and is no verdict on the
//! license); a Secret that holds another token than gridd's is a warning, `token_stale`,
//! with the driver pod's recycle command and a gauge a fleet can count; a Secret put back
//! in step clears it.

use std::time::Duration;

use crate::common::sim::kube_api::{FakeApi, node_object};
use crate::common::sim::{self, Agent, Machine, Setup, reason, token_for, write_gridd_conf};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-worker-1";
const NS: &str = "gpu-operator";
const SECRET: &str = "licensing-config";
const KEY: &str = "client_configuration_token.tok";

/// A GPU Operator node licensed with the machine's token, its agent in a pod of `api`'s
/// cluster reading the Secret at each 5 s heartbeat.
fn node_in_cluster(api: &FakeApi) -> (Machine, Agent) {
    node_in_cluster_with(api, "heartbeat_seconds = 5\n", |_| {})
}

/// [`node_in_cluster`] with `kube`'s keys of `[kubernetes]`, and `prepare` done to the node
/// before its gridd and agent start.
fn node_in_cluster_with(
    api: &FakeApi,
    kube: &str,
    prepare: impl FnOnce(&Machine),
) -> (Machine, Agent) {
    let m = Machine::new(Setup {
        gpu_operator: true,
        ..Setup::default()
    });
    let sa = m.service_account(crate::kube::TOKEN, &api.ca_pem);
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nservice_account_dir = \"{}\"\n{kube}licensing_secret = \"{NS}/{SECRET}\"\n",
        sa.display()
    ));
    prepare(&m);
    write_gridd_conf(&m);
    sim::write_mode(&m.token_path(), &m.token(), 0o644);
    m.start_gridd();
    let port = api.port().to_string();
    let a = Agent::start_with_env(
        &m,
        &[
            ("SIM_DIR", m.container_sim().unwrap().as_os_str()),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".as_ref()),
            ("KUBERNETES_SERVICE_PORT", port.as_ref()),
            ("NODE_NAME", NODE.as_ref()),
        ],
    );
    a.wait_state("licensed", T);
    (m, a)
}

fn stale_gauge(a: &Agent) -> Option<f64> {
    a.metric("vgpu_license_token_stale")
}

#[test]
fn scenario_a_licensing_secret_gridd_does_not_run_is_a_warning_to_recycle() {
    let api = FakeApi::start(crate::kube::TOKEN, vec![node_object(NODE, vec![])]);
    let (m, a) = node_in_cluster(&api);
    // The Secret rotated in place (a new DLS instance's token); the pod still runs the old.
    let rotated = token_for("127.0.0.1", m.dls.port(), "rotated-in-the-secret");
    api.set_secret(
        NS,
        SECRET,
        &[(KEY, &rotated), ("gridd.conf", b"FeatureType=1\n")],
    );

    // No Role yet: refused, said once with the Role to apply, no verdict on the license.
    sim::wait_for(
        "the 403 said in the journal",
        T,
        || {
            a.journal_lines()
                .iter()
                .any(|l| l.contains("licensing Secret") && l.contains("403"))
                .then_some(())
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    std::thread::sleep(Duration::from_secs(6));
    let said = a
        .journal_lines()
        .iter()
        .filter(|l| l.contains("licensing Secret is not read"))
        .count();
    assert_eq!(said, 1, "{}", a.context());
    assert!(
        a.journal_lines()
            .iter()
            .any(|l| l.contains("deploy/kubernetes/licensing-secret/")),
        "{}",
        a.context()
    );
    let v = a.status().unwrap();
    assert_eq!(v["state"], "licensed");
    assert!(v["failure"].is_null(), "{v:#}");
    assert_eq!(stale_gauge(&a), Some(0.0));
    // Only that Secret was asked for.
    for r in api.requests() {
        assert!(
            r.starts_with("GET /api/v1/namespaces/gpu-operator/secrets/licensing-config ")
                || r.contains("/api/v1/nodes/"),
            "{r}"
        );
    }

    // The Role applied: within a heartbeat, the warning with the recycle command.
    api.grant_secret(NS, SECRET);
    let v = a.wait_status("token_stale", T, |v| reason(v) == Some("token_stale"));
    assert_eq!(v["state"], "licensed");
    let advice = v["failure"]["advice"].as_str().unwrap();
    assert!(
        advice.contains(&format!(
            "delete pod -l app=nvidia-driver-daemonset --field-selector spec.nodeName={NODE}"
        )),
        "{advice}"
    );
    let message = v["failure"]["message"].as_str().unwrap();
    assert!(message.contains("another token"), "{message}");
    let text = String::from_utf8_lossy(&rotated).to_string();
    assert!(
        !v.to_string().contains(text.trim()),
        "the token's text is never shown"
    );
    sim::wait_for(
        "vgpu_license_token_stale 1",
        T,
        || (stale_gauge(&a) == Some(1.0)).then_some(()),
        || a.context(),
    );
    let (code, out) = status_cli(&m);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("WARNING") && out.contains("token_stale"),
        "{out}"
    );
    // `token inspect` gives the same answer: both tokens, told apart by their instance.
    let (code, out) = status_cli_args(&m, &["token", "inspect"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("Status:   token_stale")
            && out.contains("id rotated-in-the-secret")
            && out.contains("delete pod"),
        "{out}"
    );

    // The Secret put back to the token gridd runs with: in step again.
    api.set_secret(NS, SECRET, &[(KEY, &m.token())]);
    let v = a.wait_status("the warning gone", T, |v| v["failure"].is_null());
    assert_eq!(v["state"], "licensed");
    sim::wait_for(
        "vgpu_license_token_stale 0",
        T,
        || (stale_gauge(&a) == Some(0.0)).then_some(()),
        || a.context(),
    );
}

/// `status` of `m`, as an operator runs it: its exit code and standard output.
fn status_cli(m: &Machine) -> (Option<i32>, String) {
    status_cli_args(m, &["status"])
}

/// A command of the agent's on `m`, as an operator runs it: its exit code and standard
/// output.
fn status_cli_args(m: &Machine, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(crate::common::BIN)
        .arg("--config")
        .arg(&m.config)
        .args(args)
        .env("SIM_DIR", m.container_sim().unwrap())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The key missing from the Secret (a new pod would start without a token) is said too;
/// `config check` refuses a name that is no `NAMESPACE/NAME`.
#[test]
fn a_secret_without_the_token_and_a_bad_name_are_said() {
    let api = FakeApi::start(crate::kube::TOKEN, vec![node_object(NODE, vec![])]);
    api.grant_secret(NS, SECRET);
    api.set_secret(NS, SECRET, &[("gridd.conf", b"FeatureType=1\n")]);
    let (m, a) = node_in_cluster(&api);
    let v: Value = a.wait_status("token_stale", T, |v| reason(v) == Some("token_stale"));
    let message = v["failure"]["message"].as_str().unwrap();
    assert!(
        message.contains("holds no client_configuration_token.tok"),
        "{message}"
    );

    let config = std::fs::read_to_string(&m.config).unwrap();
    std::fs::write(
        &m.config,
        config.replace(&format!("{NS}/{SECRET}"), "licensing-config"),
    )
    .unwrap();
    let (code, err) = crate::trust::config_check(&m);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("NAMESPACE/NAME"), "{err}");
}

/// The rotation docs/kubernetes.md prescribes, at the default heartbeat (4 minutes between
/// reads of the Secret): the Secret rotated to a new DLS instance's token, then the driver
/// pod made again (gridd stopped, its marker and root gone, a new root with the new token,
/// gridd, the marker). The new pod runs the Secret's token: `token_stale` ("make the driver
/// pod again") never shows, in status nor on the Node, nor does `token_missing` while the pod
/// goes; the new pod is licensed.
#[test]
fn scenario_the_documented_rotation_is_never_token_stale() {
    let api = FakeApi::start(crate::kube::TOKEN, vec![node_object(NODE, vec![])]);
    api.grant_secret(NS, SECRET);
    let (m, a) = node_in_cluster_with(&api, "", |m| {
        api.set_secret(NS, SECRET, &[(KEY, &m.token())]);
        let validations = m.path("run/nvidia/validations");
        std::fs::create_dir_all(&validations).unwrap();
        std::fs::write(validations.join(".driver-ctr-ready"), b"").unwrap();
    });
    let marker = m.path("run/nvidia/validations/.driver-ctr-ready");
    let secret_reads = || {
        api.requests()
            .iter()
            .filter(|r| r.starts_with(&format!("GET /api/v1/namespaces/{NS}/secrets/{SECRET} 200")))
            .count()
    };
    sim::wait_for(
        "the Secret read at the start",
        T,
        || (secret_reads() > 0).then_some(()),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    let never = |v: &Value| {
        for r in ["token_stale", "token_missing"] {
            assert_ne!(reason(v), Some(r), "{v:#}\n{}", a.context());
        }
        if let Some(c) = api.condition(NODE, "VgpuLicensed") {
            assert!(
                c["reason"] != "TokenStale" && c["reason"] != "TokenMissing",
                "{c:#}"
            );
        }
    };

    // The Secret rotated, then the pod made again, as the docs say.
    let rotated = token_for("127.0.0.1", m.dls.port(), "the-new-dls-instance");
    api.set_secret(NS, SECRET, &[(KEY, &rotated)]);
    let root = m.path("run/nvidia/driver");
    let away = m.path("run/nvidia/driver.away");
    sim::shared::stop_gridd(&m.sim, Duration::from_secs(5));
    std::fs::remove_file(&marker).unwrap();
    std::fs::rename(&root, &away).unwrap();
    std::fs::create_dir(&root).unwrap();
    sim::wait_for(
        "driver_unavailable while the pod is gone",
        T,
        || {
            let v = a.status()?;
            never(&v);
            (reason(&v) == Some("driver_unavailable")).then_some(())
        },
        || a.context(),
    );
    // The new pod's root: a container's own, with the Secret's new token copied in (never
    // the old pod's token: that root is gone).
    let token_in = |r: &std::path::Path| r.join(m.token_path().strip_prefix(&root).unwrap());
    sim::write_mode(&token_in(&away), &rotated, 0o644);
    std::fs::remove_dir(&root).unwrap();
    std::fs::rename(&away, &root).unwrap();
    m.start_gridd();
    std::fs::write(&marker, b"").unwrap();
    sim::wait_for(
        "the new pod licensed with the Secret's token",
        T,
        || {
            let v = a.status()?;
            never(&v);
            (v["state"] == "licensed" && v["failure"].is_null()).then_some(())
        },
        || a.context(),
    );
    // And for a while after, well before the next heartbeat's read of the Secret.
    let end = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < end {
        never(&a.status().unwrap());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(stale_gauge(&a), Some(0.0));
    assert!(
        secret_reads() >= 2,
        "the Secret read again for the new token"
    );
}
