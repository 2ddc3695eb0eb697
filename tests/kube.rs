//! The license on the Node, end to end: the real agent in a simulated pod (the service
//! account's token and CA in a directory of the test's, `KUBERNETES_SERVICE_HOST`/`_PORT`,
//! `NODE_NAME`) against the simulated API server of `tests/sim/kube_api.rs`, and the
//! simulated GPU. The condition `VgpuLicensed` follows the license (status, CamelCase reason,
//! message with the edition), `lastTransitionTime` moves only on a change, the heartbeat
//! refreshes `lastHeartbeatTime`, other writers' conditions stay, a 403 or an API that is down
//! is a warning and a count while the rest of the service goes on, and nothing is written
//! where the agent is not in a pod. How often and when the writer writes, retries and keeps
//! the taint is `crates/model/tests/node_writer.rs`'s, in simulated time; here the real
//! writer sends: the waits are for what it sends (its heartbeat and retries included), and no
//! sleep is longer than one write's sending. The taint's scenarios give the agent the uptime they need
//! ([`Agent::start_booted`]), whatever this machine's.

use std::time::Duration;

use crate::common::sim::kube_api::{ApiMode, FakeApi, node_object};
use crate::common::sim::{self, Agent, Machine, Mode, Setup, write_gridd_conf};
use serde_json::{Value, json};
use vgpu_license_model::node::condition;

const T: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-worker-1";
pub(crate) const TOKEN: &str = "sa-token-for-tests";

/// node-problem-detector's condition on the same Node: never touched by the agent.
fn npd_condition() -> Value {
    json!({"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
           "message": "kernel has no deadlock",
           "lastHeartbeatTime": "2026-12-01T00:00:00Z",
           "lastTransitionTime": "2026-11-01T00:00:00Z"})
}

/// A machine whose agent runs as in a pod of `api`'s cluster; its DLS answers from the start
/// when `dls_up`.
fn in_pod(api: &FakeApi, heartbeat: u64, dls_up: bool) -> (Machine, Agent) {
    in_pod_with(api, heartbeat, dls_up, "")
}

/// [`in_pod`], with more keys of `[kubernetes]`.
fn in_pod_with(api: &FakeApi, heartbeat: u64, dls_up: bool, kube: &str) -> (Machine, Agent) {
    in_pod_as(api, heartbeat, dls_up, kube, NODE)
}

/// [`in_pod_with`], on the node `node` (its `NODE_NAME`), the service account's token
/// [`TOKEN`].
pub(crate) fn in_pod_as(
    api: &FakeApi,
    heartbeat: u64,
    dls_up: bool,
    kube: &str,
    node: &str,
) -> (Machine, Agent) {
    in_pod_up(api, heartbeat, dls_up, kube, node, None)
}

/// [`in_pod_with`] on a node that booted `up` ago ([`Agent::start_booted`]).
fn in_pod_booted(
    api: &FakeApi,
    heartbeat: u64,
    dls_up: bool,
    kube: &str,
    up: Duration,
) -> (Machine, Agent) {
    in_pod_up(api, heartbeat, dls_up, kube, NODE, Some(up))
}

fn in_pod_up(
    api: &FakeApi,
    heartbeat: u64,
    dls_up: bool,
    kube: &str,
    node: &str,
    up: Option<Duration>,
) -> (Machine, Agent) {
    let m = Machine::new(Setup::default());
    if !dls_up {
        m.dls.set_mode(Mode::Refusing);
    }
    let sa = m.service_account(TOKEN, &api.ca_pem);
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nservice_account_dir = \"{}\"\nheartbeat_seconds = {heartbeat}\n{kube}",
        sa.display()
    ));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let port = api.port().to_string();
    let env: [(&str, &std::ffi::OsStr); 3] = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".as_ref()),
        ("KUBERNETES_SERVICE_PORT", port.as_ref()),
        ("NODE_NAME", node.as_ref()),
    ];
    let a = match up {
        Some(up) => Agent::start_booted(&m, &env, up),
        None => Agent::start_with_env(&m, &env),
    };
    (m, a)
}

/// Long past the taint's settling time after boot (5 min).
const UP_LONG: Duration = Duration::from_secs(3600);

/// The writer's sending of one write (a read and a patch of the Node), with room to spare:
/// what a request that would follow a write the test saw needs to be seen.
const ONE_WRITE: Duration = Duration::from_secs(1);

/// The taint's PATCHes of the Node (not of its status).
fn taint_patches(api: &FakeApi) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.starts_with(&format!("PATCH /api/v1/nodes/{NODE} ")))
        .collect()
}

fn wait_condition(api: &FakeApi, a: &Agent, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    sim::wait_for(
        what,
        T,
        || api.condition(NODE, "VgpuLicensed").filter(|c| f(c)),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    )
}

/// A manifest of the repository, as JSON (the first document of the file).
fn manifest(rel: &str) -> Value {
    fn json_of(y: &yaml_rust2::Yaml) -> Value {
        use yaml_rust2::Yaml;
        match y {
            Yaml::String(s) | Yaml::Real(s) => Value::String(s.clone()),
            Yaml::Integer(i) => json!(i),
            Yaml::Boolean(b) => json!(b),
            Yaml::Array(a) => Value::Array(a.iter().map(json_of).collect()),
            Yaml::Hash(h) => Value::Object(
                h.iter()
                    .map(|(k, v)| (k.as_str().expect("a string key").to_string(), json_of(v)))
                    .collect(),
            ),
            _ => Value::Null,
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let docs =
        yaml_rust2::YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    json_of(&docs[0])
}

/// The NodeReadinessRule the project ships.
const READINESS_RULE: &str = "deploy/kubernetes/node-readiness/nodereadinessrule.yaml";

/// Whether `node` meets `rule`'s conditions, as the Node Readiness Controller judges them:
/// each condition of the rule (all of them, or any with `conditionPolicy: anyOf`) has its
/// required status on the Node, an absent one counting as its `defaultStatus`, else
/// `Unknown`. The controller keeps the rule's taint on a selected node that does not.
fn readiness_rule_met(rule: &Value, node: &Value) -> bool {
    let spec = &rule["spec"];
    let on_node = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut each = spec["conditions"].as_array().unwrap().iter().map(|want| {
        let have = on_node
            .iter()
            .find(|c| c["type"] == want["type"])
            .map(|c| c["status"].clone())
            .or_else(|| want.get("defaultStatus").cloned())
            .unwrap_or(json!("Unknown"));
        have == want["requiredStatus"]
    });
    if spec["conditionPolicy"] == "anyOf" {
        each.any(|ok| ok)
    } else {
        each.all(|ok| ok)
    }
}

/// The shipped NodeReadinessRule waits for the condition the agent writes (its type, status
/// True), with a taint key the controller accepts: its CRD's CEL rules (the
/// `readiness.k8s.io/` prefix, one `/`, a name of 1 to 63 characters that starts and ends
/// alphanumeric), which the schema check of `tests/fleet.rs` does not run. It gates again
/// whenever the license is lost, only the vGPU nodes, and the agent's DaemonSet, which runs
/// on every GPU node, tolerates its taint (the agent must start on a tainted node to take the
/// taint off).
#[test]
fn the_readiness_rule_waits_for_the_agents_condition() {
    let rule = manifest(READINESS_RULE);
    assert_eq!(rule["apiVersion"], "readiness.node.x-k8s.io/v1alpha1");
    assert_eq!(rule["kind"], "NodeReadinessRule");
    let spec = &rule["spec"];
    assert_eq!(
        spec["conditions"],
        json!([{"type": condition::TYPE, "requiredStatus": "True"}]),
        "{rule}"
    );
    let key = spec["taint"]["key"].as_str().unwrap();
    let name = key
        .strip_prefix("readiness.k8s.io/")
        .unwrap_or_else(|| panic!("{key}: the controller takes only readiness.k8s.io/ keys"));
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    assert!(
        key.len() <= 253
            && (1..=63).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && alnum(name.chars().next())
            && alnum(name.chars().last()),
        "{key}"
    );
    assert_eq!(spec["taint"]["effect"], "NoSchedule");
    assert!(spec["taint"].get("value").is_none(), "{rule}");
    assert_eq!(spec["enforcementMode"], "continuous");
    assert_eq!(
        spec["nodeSelector"],
        json!({"matchLabels": {"nvidia.com/vgpu.present": "true"}})
    );
    let pod =
        &manifest("deploy/kubernetes/daemonset/40-daemonset.yaml")["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    assert!(
        pod["tolerations"]
            .as_array()
            .unwrap()
            .contains(&json!({"key": key, "operator": "Exists", "effect": "NoSchedule"})),
        "{pod}"
    );
    // A node the agent never wrote to stays gated.
    assert!(!readiness_rule_met(&rule, &node_object(NODE, vec![])));
}

#[test]
fn scenario_the_node_condition_follows_the_license() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![npd_condition()])]);
    // The DLS away at first: no license, the condition False with the report's reason.
    let (m, a) = in_pod(&api, 5, false);
    let c = wait_condition(&api, &a, "VgpuLicensed False", |c| c["status"] == "False");
    let reason = c["reason"].as_str().unwrap();
    assert!(
        reason.chars().next().unwrap().is_ascii_uppercase() && !reason.contains('_'),
        "{reason}"
    );
    assert_eq!(c["type"], "VgpuLicensed");
    let unlicensed_since = c["lastTransitionTime"].as_str().unwrap().to_string();
    assert!(
        api.requests().iter().any(|r| r.starts_with(&format!(
            "PATCH /api/v1/nodes/{NODE}/status 200 application/strategic-merge-patch+json"
        ))),
        "{:?}",
        api.requests()
    );
    // The other writer's condition is as it was.
    assert_eq!(api.condition(NODE, "KernelDeadlock"), Some(npd_condition()));
    // The shipped NodeReadinessRule keeps the node gated.
    let rule = manifest(READINESS_RULE);
    assert!(!readiness_rule_met(&rule, &api.node(NODE).unwrap()));
    // The failure's message, once.
    // (status.json and the condition are written apart: the report with the failure is
    // waited for, not assumed.)
    let failure = a.wait_status("the failure", T, |v| v["failure"]["message"].is_string())
        ["failure"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    let message = c["message"].as_str().unwrap();
    assert!(message.matches(&failure).count() <= 1, "{message}");

    // The DLS back: True, Licensed, the edition and the expiry in the message.
    m.dls.set_mode(Mode::Up);
    let c = wait_condition(&api, &a, "VgpuLicensed True", |c| c["status"] == "True");
    assert_eq!(c["reason"], "Licensed");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("NVIDIA RTX Virtual Workstation"),
        "{message}"
    );
    assert!(message.contains("expires"), "{message}");
    let since = c["lastTransitionTime"].as_str().unwrap().to_string();
    assert!(
        since >= unlicensed_since,
        "{since} after {unlicensed_since}"
    );
    // What the agent wrote meets the rule: the controller takes its taint off.
    assert!(
        readiness_rule_met(&rule, &api.node(NODE).unwrap()),
        "{:?}",
        api.node(NODE)
    );

    // The heartbeat moves, the transition does not.
    let beat = c["lastHeartbeatTime"].as_str().unwrap().to_string();
    let c = wait_condition(&api, &a, "a heartbeat", |c| {
        c["lastHeartbeatTime"].as_str() != Some(beat.as_str())
    });
    assert_eq!(c["lastTransitionTime"], since.as_str());
    assert_eq!(c["status"], "True");
    assert_eq!(api.condition(NODE, "KernelDeadlock"), Some(npd_condition()));
}

#[test]
fn scenario_a_forbidden_or_absent_api_is_a_warning_and_a_count() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![npd_condition()])]);
    api.set_mode(ApiMode::Forbidden);
    let (m, a) = in_pod(&api, 5, true);
    // The first write refused (a 403 to its first request); then the API away: the next
    // try finds no server.
    sim::wait_for(
        "a refused write",
        T,
        || (!api.requests().is_empty()).then_some(()),
        || a.context(),
    );
    api.set_mode(ApiMode::Down);
    let answered = api.requests().len() as f64;
    sim::wait_for(
        "an error beyond the answered tries, with the API down",
        T,
        || {
            a.metric("vgpu_license_node_condition_errors_total")
                .filter(|n| *n > answered)
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    // The rest of the service goes on: licensed in status.json.
    a.wait_state("licensed", T);
    let said = a.journal_lines().join("\n");
    assert_eq!(
        said.matches("was not written").count(),
        1,
        "one streak: {said}"
    );
    assert!(said.contains("HTTP 403"), "{said}");
    assert!(!said.contains(TOKEN), "the token is a secret");
    assert!(api.condition(NODE, "VgpuLicensed").is_none());
    // Then slow, and answering: the condition comes at the next try.
    api.set_mode(ApiMode::Slow(Duration::from_millis(500)));
    let c = wait_condition(&api, &a, "VgpuLicensed True once allowed", |c| {
        c["status"] == "True"
    });
    assert_eq!(c["reason"], "Licensed");
    assert_eq!(a.status().unwrap()["state"], "licensed");
    drop(m);
}

#[test]
fn scenario_nothing_is_written_outside_a_pod() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    // KUBERNETES_SERVICE_HOST alone (a host's leftover environment), no service account.
    let port = api.port().to_string();
    let a = Agent::start_with_env(
        &m,
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".as_ref()),
            ("KUBERNETES_SERVICE_PORT", port.as_ref()),
        ],
    );
    a.wait_state("licensed", T);
    // The writer is started (and says so) before the first report, or never.
    let said = a.journal_lines().join("\n");
    assert!(!said.contains("writing the condition"), "{said}");
    assert!(api.requests().is_empty(), "{:?}", api.requests());
}

/// node-problem-detector's custom plugin form: one line, 0 licensed, 1 not, as its protocol
/// says; the plugin config shipped for it runs exactly that command.
#[test]
fn scenario_status_npd_speaks_node_problem_detectors_protocol() {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Refusing);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_status("a failure", T, |v| !v["failure"].is_null());
    let npd = || {
        let out = m.cli(&["status", "--npd"]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = npd();
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.len() <= 201, "{out}");
    // The failure's reason, once: not the line and the reason again.
    let reason = a.status().unwrap()["failure"]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(out.matches(&reason).count() <= 1, "{out}");
    m.dls.set_mode(Mode::Up);
    a.wait_state("licensed", T);
    let (code, out) = npd();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("licensed"), "{out}");

    let plugin: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("deploy/kubernetes/node-problem-detector/vgpu-license-monitor.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(plugin["plugin"], "custom");
    let rule = &plugin["rules"][0];
    assert_eq!(rule["args"], json!(["status", "--npd"]));
    assert_eq!(rule["condition"], plugin["conditions"][0]["type"]);
    assert!(
        plugin["pluginConfig"]["max_output_length"]
            .as_u64()
            .unwrap()
            >= 200,
        "the line fits"
    );
}

/// `kubernetes.taint_unlicensed = true`: the node carries `vgpu-license-agent/unlicensed:
/// NoSchedule` while its vGPU is unlicensed (the node up far past the settling time),
/// and loses it once licensed; another writer's taints, one added while the agent's was on
/// included, stay as they are. Without the key, no taint is ever written.
#[test]
fn scenario_the_opt_in_taint_follows_the_license_and_leaves_other_taints() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let gpu = json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"});
    api.set_taints(NODE, json!([gpu.clone()]));
    let (m, a) = in_pod_booted(&api, 5, false, "taint_unlicensed = true\n", UP_LONG);
    let ours =
        |t: &Value| t["key"] == "vgpu-license-agent/unlicensed" && t["effect"] == "NoSchedule";
    sim::wait_for(
        "the taint on the unlicensed node",
        T,
        || api.taints(NODE).iter().any(ours).then_some(()),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    assert!(api.taints(NODE).contains(&gpu), "{:?}", api.taints(NODE));
    assert!(
        api.requests().iter().any(|r| r.starts_with(&format!(
            "PATCH /api/v1/nodes/{NODE} 200 application/merge-patch+json"
        ))),
        "{:?}",
        api.requests()
    );
    // Another writer's taint, added while ours is on.
    let drain = json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
    let mut now = api.taints(NODE);
    now.push(drain.clone());
    api.set_taints(NODE, Value::Array(now));
    // Licensed: ours goes, theirs stay.
    m.dls.set_mode(Mode::Up);
    sim::wait_for(
        "the taint off the licensed node",
        T,
        || (!api.taints(NODE).iter().any(ours)).then_some(()),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    let left = api.taints(NODE);
    assert!(left.contains(&gpu) && left.contains(&drain), "{left:?}");
    assert!(
        api.condition(NODE, "VgpuLicensed")
            .is_some_and(|c| c["status"] == "True"),
        "{:?}",
        api.node(NODE)
    );
}

/// A reload that turns the taint off, or changes any key of `[kubernetes]`, says that the
/// key waits for a restart, by name: never a bare "config reloaded" while the Node goes on
/// being written as before.
#[test]
fn scenario_a_reload_names_the_kubernetes_keys_that_wait_for_a_restart() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let (m, a) = in_pod_booted(&api, 5, false, "taint_unlicensed = true\n", UP_LONG);
    wait_condition(&api, &a, "VgpuLicensed False", |c| c["status"] == "False");
    m.write_config(&m.config_text().replace(
        "taint_unlicensed = true",
        "taint_unlicensed = false\nnode_name = \"other\"",
    ));
    a.signal(nix::sys::signal::Signal::SIGHUP);
    let said = |key: &str| {
        a.journal_lines().iter().any(|l| {
            l.contains(&format!("kubernetes.{key} changed"))
                && l.contains("takes effect when the service restarts")
        })
    };
    sim::wait_for(
        "the reload naming kubernetes.taint_unlicensed and kubernetes.node_name",
        T,
        || (said("taint_unlicensed") && said("node_name")).then_some(()),
        || a.context(),
    );
    assert!(!said("heartbeat_seconds"), "{}", a.context());
}

#[test]
fn scenario_without_the_key_no_taint_is_written() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let (_m, a) = in_pod_booted(&api, 5, false, "", UP_LONG);
    wait_condition(&api, &a, "VgpuLicensed False", |c| c["status"] == "False");
    // A taint would follow the condition's patch in the same write.
    std::thread::sleep(ONE_WRITE);
    assert!(api.taints(NODE).is_empty(), "{:?}", api.taints(NODE));
    assert!(taint_patches(&api).is_empty(), "{:?}", api.requests());
}

/// With the key, a node booted a moment ago: an unlicensed vGPU is gridd's first
/// acquisition still under way, not a failure: no taint yet (it comes past the settling
/// time, `crates/model/tests/node_writer.rs`).
#[test]
fn scenario_a_node_just_booted_gets_no_taint_yet() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let (_m, a) = in_pod_booted(
        &api,
        5,
        false,
        "taint_unlicensed = true\n",
        Duration::from_secs(10),
    );
    wait_condition(&api, &a, "VgpuLicensed False", |c| c["status"] == "False");
    std::thread::sleep(ONE_WRITE);
    assert!(api.taints(NODE).is_empty(), "{:?}", api.taints(NODE));
    assert!(taint_patches(&api).is_empty(), "{:?}", api.requests());
}

/// The API failing every status write (a 500) while the license comes back: the condition
/// is sent again at each try with the same `lastTransitionTime`, the time of the change, and
/// the Node gets that time once the API answers, not the time of the write that went through.
/// (Compared among the writes, not with this machine's clock, which a VM's host may step.)
#[test]
fn scenario_retries_keep_the_time_of_the_change() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let (m, a) = in_pod(&api, 300, false);
    wait_condition(&api, &a, "VgpuLicensed False", |c| c["status"] == "False");
    api.set_mode(ApiMode::FailStatus(500));
    m.dls.set_mode(Mode::Up);
    a.wait_state("licensed", T);
    // The times sent with True since the last False: the tries of one change (under load
    // the license may come, go with a restart of gridd, and come again: a new change).
    let sent_true = |api: &FakeApi| -> Vec<String> {
        let mut run = Vec::new();
        for p in api.status_patches() {
            let c = &p["status"]["conditions"][0];
            if c["status"] == "True" {
                run.push(c["lastTransitionTime"].as_str().unwrap().to_string());
            } else {
                run.clear();
            }
        }
        run
    };
    // Two tries refused (the backoff's schedule is `crates/model/tests/node_writer.rs`'s).
    sim::wait_for(
        "two refused writes of True",
        T,
        || (sent_true(&api).len() >= 2).then_some(()),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    api.set_mode(ApiMode::Up);
    // The next try comes on the backoff's schedule (5 s doubling): after four refused
    // writes (a False among them, on a loaded machine) it is 40 s away.
    let c = sim::wait_for(
        "VgpuLicensed True",
        Duration::from_secs(120),
        || {
            api.condition(NODE, "VgpuLicensed")
                .filter(|c| c["status"] == "True")
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    let tries = sent_true(&api);
    assert!(
        tries.len() >= 3 && tries.iter().all(|t| *t == tries[0]),
        "one lastTransitionTime across the retries: {tries:?}"
    );
    assert_eq!(c["lastTransitionTime"], tries[0].as_str());
    let said = a.journal_lines().join("\n");
    assert_eq!(
        said.matches("was not written").count(),
        1,
        "one warning for the streak: {said}"
    );
    assert!(said.contains("HTTP 500"), "{said}");
}

/// `taint_unlicensed` without the role to patch the Node: the condition is written (and
/// never said not to be), the taint's 403 is one warning for the streak that names the taint
/// and what to grant, and the taint comes off once the role is there.
#[test]
fn scenario_a_refused_taint_is_said_as_the_taint() {
    let api = FakeApi::start(TOKEN, vec![node_object(NODE, vec![])]);
    let ours = json!({"key": "vgpu-license-agent/unlicensed", "effect": "NoSchedule"});
    api.set_taints(NODE, json!([ours.clone()]));
    api.set_mode(ApiMode::ForbidTaint);
    let (_m, a) = in_pod_with(&api, 300, true, "taint_unlicensed = true\n");
    wait_condition(&api, &a, "VgpuLicensed True", |c| c["status"] == "True");
    let refused = |api: &FakeApi| {
        api.requests()
            .iter()
            .filter(|r| r.starts_with(&format!("PATCH /api/v1/nodes/{NODE} 403")))
            .count()
    };
    sim::wait_for(
        "a refused taint write, said",
        T,
        || {
            (refused(&api) >= 1
                && a.journal_lines()
                    .join("\n")
                    .contains("could not be taken off the Node"))
            .then_some(())
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    let said = a.journal_lines().join("\n");
    assert_eq!(
        said.matches(
            "the taint vgpu-license-agent/unlicensed:NoSchedule could not be taken off the Node"
        )
        .count(),
        1,
        "{said}"
    );
    assert!(said.contains("patch on nodes"), "the fix: {said}");
    assert!(
        !said.contains("was not written"),
        "the condition was written: {said}"
    );
    api.set_mode(ApiMode::Up);
    sim::wait_for(
        "the taint off",
        T,
        || (!api.taints(NODE).contains(&ours)).then_some(()),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    sim::wait_for(
        "said written again",
        T,
        || {
            a.journal_lines()
                .join("\n")
                .contains("the taint vgpu-license-agent/unlicensed:NoSchedule is written again")
                .then_some(())
        },
        || a.context(),
    );
}

/// An Event on a KubeVirt VMI from a vGPU host: the VMI read first and confirmed by its
/// firmware UUID (the VM UUID the vGPU manager shows), then one Event created on it, of the
/// shape the API validates; refused without the host's ClusterRole (403, naming it), and
/// never sent to a VMI whose firmware UUID is another VM's.
#[test]
fn an_event_goes_to_the_vmi_its_firmware_uuid_confirms() {
    use vgpu_license_agent::kube::events::{VmEvent, post};
    let api = FakeApi::start(TOKEN, vec![node_object("gpu-host-1", vec![])]);
    let uuid = "43f26719-90d9-4b25-80eb-040b44132eb8";
    api.set_vmi("tenant-b", "vm-b", uuid);
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(&kc, crate::trust::kubeconfig(&api, None)).unwrap();
    std::fs::set_permissions(&kc, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut settings = vgpu_license_model::config::Settings::default();
    settings.kubernetes.kubeconfig = Some(kc);
    settings.kubernetes.node_name = Some("gpu-host-1".into());
    let target = vgpu_license_agent::kube::target(&settings)
        .unwrap()
        .unwrap();
    let event = VmEvent {
        namespace: "tenant-b".into(),
        vmi: "vm-b".into(),
        vm_uuid: Some(uuid.to_uppercase()),
        warning: true,
        reason: "VgpuRestricted".into(),
        message: "vGPU NVIDIA L40S-24Q (vGPU ID 2) on GPU 00000000:41:00.0: Unlicensed (Restricted): throttled".into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut session = vgpu_license_agent::kube::Session::default();
    let mut send = |e: &VmEvent| rt.block_on(post(&target, &mut session, e, chrono::Utc::now()));

    let err = send(&event).unwrap_err().to_string();
    assert!(
        err.contains("403") && err.contains("deploy/kubernetes/host/"),
        "{err}"
    );
    assert!(api.events().is_empty());

    api.grant_host();
    send(&event).unwrap();
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["reason"], "VgpuRestricted");
    assert_eq!(e["source"]["component"], "vgpu-license-agent");
    assert_eq!(e["involvedObject"]["kind"], "VirtualMachineInstance");
    assert_eq!(
        e["involvedObject"]["uid"].as_str(),
        api.vmi_uid("tenant-b", "vm-b").as_deref()
    );
    assert_eq!(e["metadata"]["namespace"], "tenant-b");

    // The VMI made again under that name for another VM: no Event, and said.
    api.set_vmi("tenant-b", "vm-b", "00000000-0000-0000-0000-000000000001");
    let err = send(&event).unwrap_err().to_string();
    assert!(
        err.contains("firmware UUID") && err.contains("no Event"),
        "{err}"
    );
    assert_eq!(api.events().len(), 1);
    // A VMI that is gone: 404, said as such.
    let gone = VmEvent {
        vmi: "vm-gone".into(),
        ..event.clone()
    };
    let err = send(&gone).unwrap_err().to_string();
    assert!(err.contains("404") && err.contains("no such VMI"), "{err}");
    // Only the VMI and the Events were asked for.
    for r in api.requests() {
        assert!(
            r.starts_with("GET /apis/kubevirt.io/v1/namespaces/tenant-b/virtualmachineinstances/")
                || r.starts_with("POST /api/v1/namespaces/tenant-b/events "),
            "{r}"
        );
    }
}

/// The host's manifests: its ClusterRole grants what the Events need and nothing more (get
/// VMIs, create events: nothing of Nodes or Secrets), its DaemonSet runs on the vm-vgpu hosts
/// with the guest nodes' access (the same securityContext, not privileged) under its own
/// service account and config, and that config is one `config check` takes, in the host's
/// role.
#[test]
fn the_hosts_manifests_grant_the_events_and_nothing_more() {
    let role = manifest("deploy/kubernetes/host/20-clusterrole.yaml");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let host = manifest("deploy/kubernetes/host/40-daemonset.yaml");
    let guest = manifest("deploy/kubernetes/daemonset/40-daemonset.yaml");
    let (h, g) = (
        &host["spec"]["template"]["spec"],
        &guest["spec"]["template"]["spec"],
    );
    assert_eq!(
        h["nodeSelector"],
        json!({"nvidia.com/gpu.workload.config": "vm-vgpu"})
    );
    assert_eq!(h["serviceAccountName"], "vgpu-license-agent-host");
    assert_eq!(
        h["containers"][0]["securityContext"],
        g["containers"][0]["securityContext"]
    );
    assert_ne!(h["containers"][0]["securityContext"]["privileged"], true);
    let binding = manifest("deploy/kubernetes/host/21-clusterrolebinding.yaml");
    assert_eq!(binding["subjects"][0]["name"], h["serviceAccountName"]);
    let config_map = h["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "config")
        .unwrap();
    assert_eq!(config_map["configMap"]["name"], "vgpu-license-agent-host");
    let cm = manifest("deploy/kubernetes/host/30-configmap.yaml");
    let text = cm["data"]["config.toml"].as_str().unwrap();
    assert!(text.contains("role = \"host\""), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(crate::common::BIN)
        .arg("--config")
        .arg(&file)
        .args(["config", "check"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}
