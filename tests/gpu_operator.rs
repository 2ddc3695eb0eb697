//! A Kubernetes GPU node with NVIDIA's GPU Operator, end to end (the real agent, the real
//! journald, the simulator): the GRID driver and nvidia-gridd run in the operator's driver
//! container, whose root is shared at the node's `run/nvidia/driver`; nvidia-smi is only in
//! there (run by `chroot`, with its libraries); the token and gridd.conf are the container's;
//! the node has no gridd unit. The agent finds this on its own, observes only (no install,
//! adoption, stray moving, gridd.conf edit or restart, whatever happens), reports licensed
//! and failing states with fixes in the operator's terms, and says what it is in the report
//! and the metrics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::sim::{self, Agent, Machine, Mode, Setup, reason, write_gridd_conf};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// Every file under `dir`: its bytes and mode (what "nothing changed" compares).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            out.extend(snapshot(&p));
        } else if m.is_file() {
            out.insert(
                p.clone(),
                (std::fs::read(&p).unwrap(), m.permissions().mode()),
            );
        }
    }
    out
}

fn cli(m: &Machine, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .arg("--config")
        .arg(&m.config)
        .args(args)
        .env("SIM_DIR", sim_dir(m))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The machine, its gridd started by the container's entrypoint with the Secret's token
/// (`token`), and the agent; returns once the agent has a report.
fn node(token: impl FnOnce(&Machine) -> Vec<u8>) -> (Machine, Agent) {
    node_where(|_| {}, token)
}

/// [`node`], with `before` done to the machine (its DLS, its simulated GPU) before gridd
/// starts.
fn node_where(
    before: impl FnOnce(&Machine),
    token: impl FnOnce(&Machine) -> Vec<u8>,
) -> (Machine, Agent) {
    let m = Machine::new(Setup {
        gpu_operator: true,
        ..Setup::default()
    });
    write_gridd_conf(&m);
    before(&m);
    let t = token(&m);
    sim::write_mode(&m.token_path(), &t, 0o644);
    m.start_gridd();
    let a = Agent::start_with_env(&m, &[("SIM_DIR", sim_dir(&m).as_os_str())]);
    a.wait_status("a report", T, |_| true);
    (m, a)
}

/// The sim dir as the driver container names it: nvidia-smi run in its root finds the
/// simulator's state there.
fn sim_dir(m: &Machine) -> &Path {
    m.container_sim().expect("a GPU Operator node")
}

fn driver_root(m: &Machine) -> PathBuf {
    m.path("run/nvidia/driver")
}

#[test]
fn scenario_gpu_operator_node_licensed_is_observed_and_said() {
    let (m, a) = node(Machine::token);
    let before = snapshot(&driver_root(&m).join("etc"));
    // The container's gridd: in a mount namespace of its own, in the node's PID namespace.
    let gridd = m.gridd_pid().expect("gridd runs");
    let ns = |pid: &str, ns: &str| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
    assert_ne!(ns(&gridd.to_string(), "mnt"), ns("self", "mnt"));
    assert_eq!(ns(&gridd.to_string(), "pid"), ns("self", "pid"));
    let v = a.wait_status("licensed, observed", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    assert_eq!(v["mode"], "observe", "{v:#}");
    assert_eq!(v["driver_root"], driver_root(&m).display().to_string());
    // The human report says it where the reader looks, beside the state.
    let (_, text, _) = cli(&m, &["status"]);
    let lines: Vec<&str> = text.lines().collect();
    let state = lines.iter().position(|l| l.starts_with("State:")).unwrap();
    let agent_line = lines.get(state + 1).copied().unwrap_or_default();
    assert!(
        agent_line.starts_with("Agent:    observes only")
            && agent_line.contains("GPU Operator node"),
        "{text}"
    );
    assert_eq!(v["gpus"][0]["profile"], "NVIDIA L40S-24Q");
    assert!(
        v["notes"].to_string().contains("GPU Operator node"),
        "{v:#}"
    );
    sim::wait_for(
        "the info metric: observe, gpu_operator",
        T,
        || {
            a.metrics()
                .lines()
                .any(|l| {
                    l.starts_with("vgpu_license_agent_info{")
                        && l.contains("mode=\"observe\"")
                        && l.contains("driver=\"gpu_operator\"")
                        && l.ends_with(" 1")
                })
                .then_some(())
        },
        || a.context(),
    );
    // status from the live report, and observed on the spot the same way.
    let (code, out, _) = cli(&m, &["status", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (s["state"].as_str(), s["mode"].as_str()),
        (Some("licensed"), Some("observe"))
    );

    // A token dropped on the node, a stray in the container's token directory: the agent
    // adopts, moves, edits and restarts nothing.
    sim::write_mode(&m.token_dir().join("README"), b"not ours\n", 0o644);
    let before = {
        let mut b = before;
        b.extend(snapshot(&m.token_dir()));
        b
    };
    let (code, _, err) = cli(
        &m,
        &["install", "--token-file", m.token_path().to_str().unwrap()],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("GPU Operator node"), "{err}");
    assert!(err.contains("driver.licensingConfig.secretName"), "{err}");
    assert!(err.contains("kubectl -n gpu-operator delete pod"), "{err}");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        snapshot(&driver_root(&m).join("etc")),
        before,
        "nothing changed"
    );
    assert_eq!(m.restarts(), 0, "never restarted: {}", a.context());
}

#[test]
fn scenario_gpu_operator_node_failures_are_fixed_in_the_operators_terms() {
    // The Secret's token has expired: the container's gridd fails with it.
    let (m, a) = node(|m| {
        sim::edit_payload(&m.token(), |p| {
            p["exp"] = 1_650_000_000.into();
        })
    });
    let v = a.wait_status("token_expired", T, |v| reason(v) == Some("token_expired"));
    assert_eq!(v["mode"], "observe");
    let advice = v["failure"]["advice"].as_str().unwrap();
    assert!(
        advice.contains("driver.licensingConfig.secretName"),
        "{advice}"
    );
    assert!(
        advice.contains("kubectl -n gpu-operator delete pod -l app=nvidia-driver-daemonset"),
        "{advice}"
    );
    let (code, out, _) = cli(&m, &["status"]);
    assert_eq!(code, Some(2), "{out}");
    let (_, out, _) = cli(&m, &["diagnose"]);
    assert!(
        !out.contains("vgpu-license-agent install"),
        "every fix works here:\n{out}"
    );
    assert!(!out.contains("systemctl"), "no unit to act on here:\n{out}");
    // The token's mode is the operator's copy of the Secret's (0644): gridd reads it.
    assert!(
        out.lines()
            .any(|l| l.starts_with("OK   token-mode   mode 0644")),
        "{out}"
    );
    assert!(!out.contains("chmod"), "no chmod works here:\n{out}");
    assert_eq!(m.restarts(), 0);

    // The advice's check of the Secret's token, run as printed from its pipe on (kubectl's
    // part prints the Secret's base64 value): it tells the expired token and one that is no
    // token from the one that works, before a driver pod is made again for nothing.
    let check = secret_check(advice);
    let expired = std::fs::read(m.token_path()).unwrap();
    let (code, out) = check(&expired);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("EXPIRED"), "{out}");
    let (code, out) = check(b"<html>404 Not Found</html>");
    assert_ne!(code, Some(0), "{out}");
    let (code, out) = check(&m.token());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("127.0.0.1"), "the DLS it names: {out}");
}

/// The advice's check of the Secret's token: the shell pipe after `kubectl ... get secret`,
/// with this build's agent, given the token that the Secret holds.
fn secret_check(advice: &str) -> impl Fn(&[u8]) -> (Option<i32>, String) {
    let start = advice
        .find("kubectl -n gpu-operator get secret")
        .expect(advice);
    let end = start + advice[start..].find(';').expect(advice);
    let pipe = &advice[start..end];
    assert!(
        pipe.contains("-o jsonpath='{.data.client_configuration_token\\.tok}'"),
        "{pipe}"
    );
    let rest = pipe.split_once(" | ").expect(pipe).1.replace(
        "vgpu-license-agent",
        env!("CARGO_BIN_EXE_vgpu-license-agent"),
    );
    move |token: &[u8]| {
        use base64::Engine;
        let secret_value = base64::engine::general_purpose::STANDARD.encode(token);
        let mut child = Command::new("sh")
            .args(["-c", &rest])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(secret_value.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

/// The rest works the same on a GPU Operator node: each failure the container's gridd meets
/// is found and said with its reason, in `status`, `status --json` and the metrics (the node
/// said to be observed), with a fix that works there, and nothing restarted.
#[test]
fn scenario_gpu_operator_node_each_failure_in_status_and_metrics() {
    /// The reason and state wanted, what is done before gridd starts, the Secret's token.
    type Case = (
        &'static str,
        &'static str,
        fn(&Machine),
        fn(&Machine) -> Vec<u8>,
    );
    let cases: [Case; 4] = [
        (
            "clock_skew",
            "unlicensed",
            |m| m.dls.set_skew(3600),
            Machine::token,
        ),
        (
            "dls_unreachable",
            "unlicensed",
            |m| m.dls.set_mode(Mode::Refusing),
            Machine::token,
        ),
        // Past the grace period: nvidia-smi says Unlicensed (Restricted).
        (
            "dls_unreachable",
            "restricted",
            |m| {
                m.dls.set_mode(Mode::Refusing);
                m.update_sim(|c| c.grace_seconds = 0);
            },
            Machine::token,
        ),
        (
            "token_invalid",
            "unlicensed",
            |_| {},
            |_| b"<html>404 Not Found</html>".to_vec(),
        ),
    ];
    for (want, state, before, token) in cases {
        let (m, a) = node_where(before, token);
        let v = a.wait_status(want, T, |v| reason(v) == Some(want) && v["state"] == state);
        assert_eq!(v["mode"], "observe", "{want}: {v:#}");
        let advice = v["failure"]["advice"].as_str().unwrap_or_default();
        for unworkable in [
            "nvidia-gridd.service",
            "systemctl restart nvidia-gridd",
            "systemctl enable --now nvidia-gridd",
            "vgpu-license-agent install",
            "chmod",
        ] {
            assert!(!advice.contains(unworkable), "{want}: {advice}");
        }
        let (code, out, _) = cli(&m, &["status", "--json"]);
        let j: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(
            (code, reason(&j), j["state"].as_str()),
            (Some(2), Some(want), Some(state)),
            "{j:#}"
        );
        let (_, out, _) = cli(&m, &["status"]);
        assert!(out.contains(want), "{want}: {out}");
        sim::wait_for(
            "the failure and the observed node in the metrics",
            T,
            || {
                let text = a.metrics();
                (a.metric(&format!("vgpu_license_failure{{reason=\"{want}\"}}")) == Some(1.0)
                    && a.metric(&format!("vgpu_license_state{{state=\"{state}\"}}")) == Some(1.0)
                    && text.contains("mode=\"observe\""))
                .then_some(())
            },
            || a.context(),
        );
        assert_eq!(m.restarts(), 0, "{want}: {}", a.context());
    }
}

#[test]
fn scenario_gpu_operator_node_whose_gridd_dies_is_not_restarted_by_the_agent() {
    let (m, a) = node(Machine::token);
    a.wait_state("licensed", T);
    m.dls.set_mode(Mode::Refusing);
    m.crash_gridd();
    // Past the grace (2 s) and the backoff (1 s) of this machine's config: a managed guest's
    // gridd would have been restarted by now. The driver pod's is the operator's.
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(m.restarts(), 0, "{}", a.context());
    assert!(m.gridd_pid().is_none());
}

/// The driver pod goes away (an upgrade, a node drain, a crash) and comes back: its root at
/// the driver root is empty meanwhile, gridd is gone, the operator's validation markers stay
/// without `.driver-ctr-ready`. The agent follows at its readings: the node stays a GPU
/// Operator node, the failure says the driver pod is not running or ready (never "install the
/// driver", nor a token fix for the token that went with the pod), nothing is written on the
/// node; once the pod is back and its gridd licensed, so is the report.
#[test]
fn scenario_the_driver_pod_going_away_and_coming_back_is_followed() {
    let (m, a) = node(Machine::token);
    a.wait_state("licensed", T);
    let root = driver_root(&m);
    let validations = m.path("run/nvidia/validations");
    std::fs::create_dir_all(&validations).unwrap();
    std::fs::write(validations.join(".driver-ctr-ready"), b"").unwrap();
    let host_etc = snapshot(&m.path("etc"));

    // Away: the container's root leaves with it; its gridd with it.
    let away = m.path("run/nvidia/driver.away");
    std::fs::remove_file(validations.join(".driver-ctr-ready")).unwrap();
    m.crash_gridd();
    std::fs::rename(&root, &away).unwrap();
    std::fs::create_dir(&root).unwrap();
    let v = a.wait_status("the driver pod said to be away", T, |v| {
        v["state"] == "no_driver"
    });
    assert_eq!(v["mode"], "observe", "{v:#}");
    assert_eq!(reason(&v), Some("driver_unavailable"), "{v:#}");
    let advice = v["failure"]["advice"].as_str().unwrap_or_default();
    assert!(
        advice.contains("driver pod on this node is not running or not ready")
            && advice.contains("kubectl -n gpu-operator get pods"),
        "{v:#}"
    );
    assert!(!advice.contains("install"), "{advice}");
    let (code, out, _) = cli(&m, &["status"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("driver pod"), "{out}");

    // Back: the new pod's root, its gridd licensed, the marker written again.
    std::fs::remove_dir(&root).unwrap();
    std::fs::rename(&away, &root).unwrap();
    m.start_gridd();
    std::fs::write(validations.join(".driver-ctr-ready"), b"").unwrap();
    let v = a.wait_status("licensed again", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    assert_eq!(v["mode"], "observe", "{v:#}");
    assert_eq!(
        snapshot(&m.path("etc")),
        host_etc,
        "nothing written on the node"
    );
    assert_eq!(m.restarts(), 0, "{}", a.context());
}

/// An image of the test's own, in a container storage of the test's own (podman's images,
/// containers and state under `dir`, removed with it): the machine's /var/lib/containers and
/// /run/libpod are left as they were.
struct Image {
    tag: String,
    dir: tempfile::TempDir,
}

/// The DaemonSet's manifest, as the test reads it.
const DAEMONSET: &str = "deploy/kubernetes/daemonset/40-daemonset.yaml";

/// Capability numbers (linux/capability.h) of the names a securityContext may hold.
const CAPABILITIES: [(&str, u32); 17] = [
    ("CHOWN", 0),
    ("DAC_OVERRIDE", 1),
    ("DAC_READ_SEARCH", 2),
    ("FOWNER", 3),
    ("FSETID", 4),
    ("KILL", 5),
    ("SETGID", 6),
    ("SETUID", 7),
    ("SETPCAP", 8),
    ("NET_BIND_SERVICE", 10),
    ("NET_RAW", 13),
    ("SYS_CHROOT", 18),
    ("SYS_PTRACE", 19),
    ("SYS_ADMIN", 21),
    ("MKNOD", 27),
    ("AUDIT_WRITE", 29),
    ("SETFCAP", 31),
];

/// How podman runs the DaemonSet's container: its flags, its arguments, and the capabilities
/// the agent's process then holds (the effective set, as `/proc/PID/status` shows it).
struct PodRun {
    flags: Vec<String>,
    args: Vec<String>,
    capabilities: u64,
}

impl Image {
    /// podman on this storage.
    fn podman(&self) -> Command {
        let dir = self.dir.path();
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(dir.join("storage"))
            .arg("--runroot")
            .arg(dir.join("run"))
            .arg("--tmpdir")
            .arg(dir.join("libpod"))
            .args(["--storage-driver", "vfs"]);
        cmd
    }

    /// `podman run` as this machine runs it: runc with cgroupfs, and limits the sandbox can
    /// set.
    fn run(&self, args: &[&str]) -> std::process::Output {
        self.podman()
            .args([
                "--runtime",
                "runc",
                "--cgroup-manager",
                "cgroupfs",
                "run",
                "--rm",
                "--network=none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=4096:4096",
            ])
            .args(args)
            .output()
            .unwrap()
    }

    /// The DaemonSet's manifest as JSON (PyYAML reads it), or why it cannot be read here.
    fn daemonset() -> Result<Value, String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DAEMONSET);
        let out = Command::new("python3")
            .args([
                "-c",
                "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
            ])
            .arg(&path)
            .output()
            .map_err(|e| format!("python3: {e} (apt-get install python3 python3-yaml)"))?;
        if !out.status.success() {
            return Err(format!(
                "python3 with PyYAML cannot read {DAEMONSET} (apt-get install python3-yaml): {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    }

    /// What the DaemonSet's pod spec asks of its container, as podman flags, so that the two
    /// cannot drift: its securityContext (user, capabilities, privilege escalation, seccomp,
    /// read-only root), hostPID, env and volumes. `host` names what stands for each hostPath
    /// of the node here, `config` the ConfigMap's directory, `node` the Node's name. A field
    /// the test does not know fails it, rather than being left out: teach it here.
    fn pod_run(ds: &Value, host: impl Fn(&str) -> PathBuf, config: &Path, node: &str) -> PodRun {
        let pod = &ds["spec"]["template"]["spec"];
        let mut flags = Vec::new();
        for (key, v) in pod.as_object().expect("a pod spec") {
            match key.as_str() {
                // Scheduling and the API's side: nothing of the container's.
                "serviceAccountName"
                | "nodeSelector"
                | "affinity"
                | "tolerations"
                | "priorityClassName"
                | "terminationGracePeriodSeconds"
                | "containers"
                | "volumes" => {}
                // The NVIDIA runtime adds the GPU's device nodes to the container (and its
                // device cgroup); the simulated nvidia-smi opens none, and this machine has
                // no GPU: runc as it is stands for it.
                "runtimeClassName" => assert_eq!(v, "nvidia", "{DAEMONSET}"),
                "hostPID" if v == true => flags.push("--pid=host".into()),
                "hostPID" => {}
                other => panic!("{DAEMONSET}: the test cannot run the pod's {other}: {v}"),
            }
        }
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{DAEMONSET}: one container");
        let c = &containers[0];
        let mut args = Vec::new();
        let mut capabilities = u64::MAX;
        let cap = |name: &Value| -> (String, u32) {
            let name = name.as_str().unwrap();
            let bit = CAPABILITIES
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{DAEMONSET}: capability {name}: add it to CAPABILITIES"))
                .1;
            (name.to_string(), bit)
        };
        for (key, v) in c.as_object().expect("a container") {
            match key.as_str() {
                // The test's own image, and its own network (none: nothing scrapes here);
                // the limits are the ones this machine's sandbox lets podman set (`run`).
                "name" | "image" | "imagePullPolicy" | "ports" | "resources" | "volumeMounts" => {}
                "args" => {
                    args = v
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap().to_string())
                        .collect()
                }
                "env" => {
                    for e in v.as_array().unwrap() {
                        let name = e["name"].as_str().unwrap();
                        let value = match (&e["value"], &e["valueFrom"]) {
                            (Value::String(s), Value::Null) => s.clone(),
                            (Value::Null, from)
                                if from["fieldRef"]["fieldPath"] == "spec.nodeName" =>
                            {
                                node.to_string()
                            }
                            _ => panic!("{DAEMONSET}: the test cannot set env {e}"),
                        };
                        flags.push(format!("--env={name}={value}"));
                    }
                }
                "securityContext" => {
                    for (k, s) in v.as_object().unwrap() {
                        match (k.as_str(), s) {
                            ("runAsUser", _) => {
                                let group = v["runAsGroup"].as_u64().map(|g| format!(":{g}"));
                                flags.push(format!(
                                    "--user={}{}",
                                    s.as_u64().unwrap(),
                                    group.unwrap_or_default()
                                ));
                            }
                            ("runAsGroup", _) => assert!(v["runAsUser"].is_u64()),
                            ("privileged", Value::Bool(true)) => flags.push("--privileged".into()),
                            ("privileged", Value::Bool(false)) => {}
                            ("allowPrivilegeEscalation", Value::Bool(false)) => {
                                flags.push("--security-opt=no-new-privileges".into())
                            }
                            ("allowPrivilegeEscalation", Value::Bool(true)) => {}
                            ("readOnlyRootFilesystem", Value::Bool(true)) => {
                                // Kubernetes mounts no tmpfs of its own on /tmp or /run.
                                flags.extend([
                                    "--read-only".into(),
                                    "--read-only-tmpfs=false".into(),
                                ])
                            }
                            ("readOnlyRootFilesystem", Value::Bool(false)) => {}
                            ("seccompProfile", p) if p["type"] == "RuntimeDefault" => {
                                // The runtime's default profile: podman's own.
                                let profile = Path::new("/usr/share/containers/seccomp.json");
                                if profile.is_file() {
                                    flags.push(format!(
                                        "--security-opt=seccomp={}",
                                        profile.display()
                                    ));
                                }
                            }
                            ("capabilities", caps) => {
                                // Dropped first, then added, as the runtime does.
                                for k in caps.as_object().unwrap().keys() {
                                    assert!(k == "drop" || k == "add", "{DAEMONSET}: {k}");
                                }
                                let names =
                                    |op: &str| caps[op].as_array().cloned().unwrap_or_default();
                                for n in names("drop") {
                                    if n == "ALL" {
                                        flags.push("--cap-drop=all".into());
                                        capabilities = 0;
                                    } else {
                                        let (n, bit) = cap(&n);
                                        flags.push(format!("--cap-drop={n}"));
                                        capabilities &= !(1 << bit);
                                    }
                                }
                                for n in names("add") {
                                    let (n, bit) = cap(&n);
                                    flags.push(format!("--cap-add={n}"));
                                    capabilities |= 1 << bit;
                                }
                            }
                            _ => {
                                panic!("{DAEMONSET}: the test cannot set securityContext.{k}: {s}")
                            }
                        }
                    }
                }
                other => panic!("{DAEMONSET}: the test cannot run the container's {other}: {v}"),
            }
        }
        let volumes = pod["volumes"].as_array().expect("volumes");
        for m in c["volumeMounts"].as_array().expect("volumeMounts") {
            let name = m["name"].as_str().unwrap();
            let to = m["mountPath"].as_str().unwrap();
            let vol = volumes
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("{DAEMONSET}: no volume {name}"));
            let mut opts = Vec::new();
            for (k, o) in m.as_object().unwrap() {
                match (k.as_str(), o) {
                    ("name" | "mountPath", _) => {}
                    ("readOnly", Value::Bool(true)) => opts.push("ro"),
                    ("readOnly", Value::Bool(false)) => {}
                    ("mountPropagation", p) if p == "HostToContainer" => opts.push("rslave"),
                    _ => panic!("{DAEMONSET}: the test cannot mount {k}: {o}"),
                }
            }
            let from = if let Some(path) = vol["hostPath"]["path"].as_str() {
                host(path)
            } else if vol["configMap"].is_object() {
                config.to_path_buf()
            } else if vol["emptyDir"].is_object() {
                // An emptyDir: the container's own, empty at its start.
                flags.push(format!("--tmpfs={to}"));
                continue;
            } else {
                panic!("{DAEMONSET}: the test cannot make volume {vol}");
            };
            let opts = if opts.is_empty() {
                String::new()
            } else {
                format!(":{}", opts.join(","))
            };
            flags.push(format!("--volume={}:{to}{opts}", from.display()));
        }
        assert_ne!(capabilities, u64::MAX, "{DAEMONSET}: no capabilities named");
        PodRun {
            flags,
            args,
            capabilities,
        }
    }
}

/// The agent's OCI image (`make image`, here with this build's binary), run by podman exactly
/// as the DaemonSet of deploy/kubernetes/daemonset/ runs it on a GPU Operator node: the pod
/// spec's securityContext, env, volumes and args, read from the generated manifest
/// ([`Image::pod_run`]), with the node's /run/nvidia (the driver container's root at
/// /run/nvidia/driver, with nvidia-smi in it) and its journal directories standing for the
/// hostPaths. The service starts, finds the node, reads nvidia-smi in the driver root by the
/// chroot and journalctl it carries, and reports the license; its process holds exactly the
/// capabilities the manifest names, with no new privileges and a seccomp filter.
#[test]
fn the_image_reports_a_gpu_operator_node_as_the_daemonset_runs_it() {
    for tool in ["buildah", "podman", "runc"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return crate::common::skipped(&format!(
                "{tool} is not installed (apt-get install buildah podman runc)"
            ));
        }
    }
    let ds = match Image::daemonset() {
        Ok(ds) => ds,
        Err(why) => return crate::common::skipped(&why),
    };
    // The manifest asks for no more than the agent uses (generate.py says why each).
    let pod = &ds["spec"]["template"]["spec"];
    let security = &pod["containers"][0]["securityContext"];
    assert_ne!(security["privileged"], true, "{DAEMONSET}: not privileged");
    assert_ne!(pod["hostPID"], true, "{DAEMONSET}: no hostPID");
    assert_eq!(
        security["capabilities"],
        serde_json::json!({"drop": ["ALL"], "add": ["SYS_CHROOT"]}),
        "{DAEMONSET}"
    );
    assert_eq!(security["allowPrivilegeEscalation"], false, "{DAEMONSET}");
    assert_eq!(
        security["seccompProfile"]["type"], "RuntimeDefault",
        "{DAEMONSET}"
    );

    let image = Image {
        tag: format!("localhost/vgpu-license-agent:test-{}", std::process::id()),
        dir: tempfile::tempdir().unwrap(),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = Command::new("bash")
        .arg(root.join("packaging/build-image.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_vgpu-license-agent")])
        .args(["--tag", &image.tag])
        .arg("--output")
        .arg(image.dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&built.stdout);
    assert!(
        built.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(said.contains("digest sha256:"), "{said}");
    let archive = image.dir.path().join(format!(
        "vgpu-license-agent-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    let loaded = image
        .podman()
        .arg("load")
        .arg("-i")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(loaded.status.success(), "podman load: {loaded:?}");

    let (m, a) = node(Machine::token);
    a.wait_state("licensed", T);
    // The ConfigMap's directory: its config.toml (generate.py's --check keeps the two the
    // same), and the node's PCI bus as the test machine fakes it (this machine has no NVIDIA
    // device).
    let conf = tempfile::tempdir().unwrap();
    std::fs::copy(
        root.join("deploy/kubernetes/daemonset/config.toml"),
        conf.path().join("config.toml"),
    )
    .unwrap();
    std::fs::create_dir(conf.path().join("config.d")).unwrap();
    std::fs::write(
        conf.path().join("config.d/pci.toml"),
        "[paths]\npci_devices = \"/sim-sys/bus/pci/devices\"\n",
    )
    .unwrap();
    // The node's journal, empty: this machine's holds other tests' gridds of this boot, which
    // the real journalctl in the image would read as this node's.
    let journal = tempfile::tempdir().unwrap();
    let machine_id = journal.path().join("machine-id");
    std::fs::write(&machine_id, "5f3c0e6b2a9d4c81b7e04a1d9c2f6e35\n").unwrap();
    let journal_dir = journal.path().join("journal");
    std::fs::create_dir(&journal_dir).unwrap();
    let nvidia = m.path("run/nvidia");
    let host = |path: &str| match path {
        "/run/nvidia" => nvidia.clone(),
        "/var/log/journal" | "/run/log/journal" => journal_dir.clone(),
        "/etc/machine-id" => machine_id.clone(),
        other => panic!("{DAEMONSET}: hostPath {other} has no stand-in on the simulated node"),
    };
    let pod_run = Image::pod_run(&ds, host, conf.path(), "gpu-node-1");
    let name = format!("vgpu-license-agent-test-{}", std::process::id());
    // The simulator's own: its state, as the driver container names it, and its PCI bus.
    let mut args: Vec<String> = vec![
        "--detach".into(),
        format!("--name={name}"),
        format!("--env=SIM_DIR={}", sim_dir(&m).display()),
        format!("--volume={}:/sim-sys:ro", m.path("sys").display()),
    ];
    args.extend(pod_run.flags.iter().cloned());
    args.push(image.tag.clone());
    args.extend(pod_run.args.iter().cloned());
    /// The container, removed however the test ends.
    struct Running<'a>(&'a Image, &'a str);
    impl Drop for Running<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .podman()
                .args(["rm", "-f", "-t", "0", self.1])
                .output();
        }
    }
    let started = image.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let _running = Running(&image, &name);
    assert!(
        started.status.success(),
        "podman run {}: {started:?}",
        args.join(" ")
    );
    let logs = || {
        let out = image.podman().args(["logs", &name]).output().unwrap();
        format!(
            "podman run {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    // `status --json` in the pod (kubectl exec), with the service's own config: the
    // service's report.
    let config_args: Vec<&str> = pod_run
        .args
        .iter()
        .map(String::as_str)
        .take_while(|a| *a != "run")
        .collect();
    let status = || {
        let out = image
            .podman()
            .args(["exec", &name, "vgpu-license-agent"])
            .args(&config_args)
            .args(["status", "--json"])
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<Value>(&out.stdout).ok(),
        )
    };
    let v = sim::wait_for(
        "the service in the container reports licensed",
        T,
        || match status() {
            (Some(0), Some(v)) if v["state"] == "licensed" => Some(v),
            _ => None,
        },
        || format!("{:?}\n{}", status(), logs()),
    );
    assert_eq!(v["mode"], "observe", "{v:#}");
    assert_eq!(v["driver_root"], "/run/nvidia/driver", "{v:#}");
    assert_eq!(v["gpus"][0]["profile"], "NVIDIA L40S-24Q", "{v:#}");
    assert!(
        !v.to_string().contains("could not be read"),
        "the image's journalctl reads the journal: {v:#}"
    );
    // The agent's process holds what the manifest names and no more.
    let pid = image
        .podman()
        .args(["inspect", "--format", "{{.State.Pid}}", &name])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_string();
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |f: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{f}:")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{f} in /proc/{pid}/status"))
            .to_string()
    };
    let caps = |f: &str| u64::from_str_radix(&field(f), 16).unwrap();
    assert_eq!(
        (caps("CapEff"), caps("CapPrm"), caps("CapBnd")),
        (
            pod_run.capabilities,
            pod_run.capabilities,
            pod_run.capabilities
        ),
        "{proc_status}"
    );
    assert_eq!(field("NoNewPrivs"), "1", "{proc_status}");
    assert_eq!(field("Seccomp"), "2", "a seccomp filter: {proc_status}");
    assert_eq!(field("Uid").split_whitespace().next(), Some("0"));
    // The programs the agent runs there work in the image, with the libraries it carries.
    for (program, arg) in [
        ("/usr/bin/journalctl", "--version"),
        ("/usr/sbin/chroot", "--version"),
    ] {
        let out = image.run(&["--entrypoint", program, &image.tag, arg]);
        assert!(out.status.success(), "{program}: {out:?}");
    }
}

/// A new driver pod on `m`: its root (kept at `away` meanwhile) mounted again, `token`
/// copied in, gridd started, the readiness `marker` last.
fn driver_pod_back(m: &Machine, away: &Path, marker: &Path, token: &[u8]) {
    let root = driver_root(m);
    std::fs::remove_dir(&root).unwrap();
    std::fs::rename(away, &root).unwrap();
    sim::write_mode(&m.token_path(), token, 0o644);
    m.start_gridd();
    std::fs::write(marker, b"").unwrap();
}

/// A GPU Operator node on the service's default intervals (5 min between readings while
/// licensed, 15 s without), its driver pod ready (its marker, returned), licensed.
fn day_two_node() -> (Machine, Agent, PathBuf) {
    let m = Machine::new(Setup {
        gpu_operator: true,
        ..Setup::default()
    });
    m.set_config("poll_unlicensed_seconds", "15");
    m.set_config("poll_licensed_seconds", "300");
    write_gridd_conf(&m);
    sim::write_mode(&m.token_path(), &m.token(), 0o644);
    let validations = m.path("run/nvidia/validations");
    let marker = validations.join(".driver-ctr-ready");
    std::fs::create_dir_all(&validations).unwrap();
    std::fs::write(&marker, b"").unwrap();
    m.start_gridd();
    let a = Agent::start_with_env(&m, &[("SIM_DIR", sim_dir(&m).as_os_str())]);
    a.wait_state("licensed", T);
    (m, a, marker)
}

/// Day 2 with the service's default intervals (5 min between readings while licensed, 15 s
/// without): the driver pod deleted the usual way (gridd gets SIGTERM and returns its
/// license, the root is unmounted about 10 s later and the marker goes) is
/// `driver_unavailable` within 30 s, never advice about the Secret; made again with an
/// expired token, then with a valid one, each verdict is the new pod's token within 30 s.
#[test]
fn scenario_day_two_the_driver_pod_deleted_and_made_again() {
    let (m, a, marker) = day_two_node();
    let root = driver_root(&m);
    let away = m.path("run/nvidia/driver.away");
    let pod_gone = || {
        sim::shared::stop_gridd(&m.sim, Duration::from_secs(5));
        std::thread::sleep(Duration::from_secs(10));
        std::fs::remove_file(&marker).unwrap();
        std::fs::rename(&root, &away).unwrap();
        std::fs::create_dir(&root).unwrap();
    };
    let pod_back = |token: &[u8]| driver_pod_back(&m, &away, &marker, token);

    pod_gone();
    let v = a.wait_status("driver_unavailable within 30 s", T, |v| {
        reason(v) == Some("driver_unavailable")
    });
    let advice = v["failure"]["advice"].as_str().unwrap_or_default();
    assert!(advice.contains("driver pod"), "{v:#}");
    assert!(!advice.contains("Secret"), "{advice}");
    let failure_metric = |why: &str| {
        sim::wait_for(
            &format!("the metrics say {why}"),
            T,
            || {
                (a.metric(&format!("vgpu_license_failure{{reason=\"{why}\"}}")) == Some(1.0))
                    .then_some(())
            },
            || a.context(),
        )
    };
    failure_metric("driver_unavailable");

    let expired = sim::edit_payload(&m.token(), |p| p["exp"] = 1_650_000_000.into());
    pod_back(&expired);
    a.wait_status("the new pod's expired token within 30 s", T, |v| {
        reason(v) == Some("token_expired")
    });
    failure_metric("token_expired");

    pod_gone();
    a.wait_status("driver_unavailable again", T, |v| {
        reason(v) == Some("driver_unavailable")
    });
    pod_back(&m.token());
    a.wait_status("the new pod's valid token, licensed, within 30 s", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    sim::wait_for(
        "the metrics say licensed",
        T,
        || (a.metric("vgpu_license_licensed") == Some(1.0)).then_some(()),
        || a.context(),
    );
    assert_eq!(m.restarts(), 0, "{}", a.context());
}

/// Day 2 in another order, with the Node: the driver pod's root unmounted and its marker gone
/// before anything of gridd's is logged (gridd killed, no shutdown line), the service on its
/// default pace (a licensed reading every 5 minutes), its Node condition written to the API.
/// The pod's going is seen within seconds (the root and the marker are watched), in
/// `status`, `status --npd`, the metrics and the Node; the pod made again with a valid token
/// is licensed everywhere within 30 s.
#[test]
fn scenario_day_two_the_root_going_first_reaches_the_node_at_once() {
    use crate::common::sim::kube_api::{FakeApi, node_object};
    const NODE: &str = "gpu-worker-1";
    let api = FakeApi::start(crate::kube::TOKEN, vec![node_object(NODE, vec![])]);
    let m = Machine::new(Setup {
        gpu_operator: true,
        ..Setup::default()
    });
    let sa = m.service_account(crate::kube::TOKEN, &api.ca_pem);
    m.set_config("poll_unlicensed_seconds", "15");
    m.set_config("poll_licensed_seconds", "300");
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nservice_account_dir = \"{}\"\n",
        sa.display()
    ));
    write_gridd_conf(&m);
    sim::write_mode(&m.token_path(), &m.token(), 0o644);
    let validations = m.path("run/nvidia/validations");
    let marker = validations.join(".driver-ctr-ready");
    std::fs::create_dir_all(&validations).unwrap();
    std::fs::write(&marker, b"").unwrap();
    m.start_gridd();
    let port = api.port().to_string();
    let a = Agent::start_with_env(
        &m,
        &[
            ("SIM_DIR", sim_dir(&m).as_os_str()),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".as_ref()),
            ("KUBERNETES_SERVICE_PORT", port.as_ref()),
            ("NODE_NAME", NODE.as_ref()),
        ],
    );
    a.wait_state("licensed", T);
    let node_says = |status: &str, reason: &str| {
        sim::wait_for(
            &format!("the Node's VgpuLicensed {status}/{reason}"),
            T,
            || {
                api.condition(NODE, "VgpuLicensed")
                    .filter(|c| c["status"] == status && c["reason"] == reason)
            },
            || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
        )
    };
    node_says("True", "Licensed");
    let root = driver_root(&m);
    let away = m.path("run/nvidia/driver.away");

    // The root and the marker go first; gridd dies without a word.
    let gridd = m.gridd_pid().expect("gridd runs");
    std::fs::remove_file(&marker).unwrap();
    std::fs::rename(&root, &away).unwrap();
    std::fs::create_dir(&root).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gridd),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Within seconds: not at the next reading, minutes away, nor at the heartbeat's look
    // at gridd.
    let v = a.wait_status(
        "driver_unavailable within 10 s",
        Duration::from_secs(10),
        |v| reason(v) == Some("driver_unavailable"),
    );
    assert!(
        !v["failure"]["advice"]
            .as_str()
            .unwrap_or_default()
            .contains("Secret"),
        "{v:#}"
    );
    node_says("False", "DriverUnavailable");
    let (code, npd, _) = cli(&m, &["status", "--npd"]);
    assert_eq!(code, Some(1), "{npd}");
    assert!(npd.contains("driver_unavailable"), "{npd}");
    sim::wait_for(
        "the metrics say driver_unavailable",
        T,
        || {
            (a.metric("vgpu_license_failure{reason=\"driver_unavailable\"}") == Some(1.0))
                .then_some(())
        },
        || a.context(),
    );

    // A new pod: its root mounted, its token copied, gridd started, the marker last.
    driver_pod_back(&m, &away, &marker, &m.token());
    a.wait_status("licensed within 30 s", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    node_says("True", "Licensed");
    let (code, npd, _) = cli(&m, &["status", "--npd"]);
    assert_eq!(code, Some(0), "{npd}");
    assert_eq!(m.restarts(), 0, "{}", a.context());
}

/// Watches status.json every 200 ms for `d`, failing at once on a report whose failure is
/// `never`; returns the last report.
fn watch_never(a: &Agent, d: Duration, never: &str) -> serde_json::Value {
    let end = std::time::Instant::now() + d;
    let mut last = serde_json::Value::Null;
    while std::time::Instant::now() < end {
        if let Some(v) = a.status() {
            assert_ne!(reason(&v), Some(never), "{v:#}\n{}", a.context());
            last = v;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    last
}

/// Day 2, the marker first: the driver pod's readiness marker goes, gridd 5 s later (its
/// lease returned), the root 10 s after, as a pod whose preStop removes the marker does. The
/// pod's token going away is never `token_missing` ("put the token into the Secret"); the
/// pod gone is `driver_unavailable`, said once in the journal over a minute without the pod
/// (the default 15 s readings go on), and the pod made again is licensed.
#[test]
fn scenario_day_two_the_marker_going_first_is_no_verdict_on_the_token() {
    let (m, a, marker) = day_two_node();

    std::fs::remove_file(&marker).unwrap();
    // The agent has seen the marker go before anything else happens.
    a.wait_status("the pod's going noted", T, |v| {
        v["notes"].to_string().contains("driver pod is going")
    });
    watch_never(&a, Duration::from_secs(5), "token_missing");
    sim::shared::stop_gridd(&m.sim, Duration::from_secs(5));
    watch_never(&a, Duration::from_secs(10), "token_missing");
    let root = driver_root(&m);
    let away = m.path("run/nvidia/driver.away");
    std::fs::rename(&root, &away).unwrap();
    std::fs::create_dir(&root).unwrap();
    let deadline = std::time::Instant::now() + T;
    loop {
        let v = watch_never(&a, Duration::from_millis(500), "token_missing");
        if reason(&v) == Some("driver_unavailable") {
            assert!(
                !v["failure"]["advice"].to_string().contains("Secret"),
                "{v:#}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{v:#}\n{}",
            a.context()
        );
    }
    // A minute without the pod: readings every 15 s, one line.
    let v = watch_never(&a, Duration::from_secs(60), "token_missing");
    assert_eq!(reason(&v), Some("driver_unavailable"), "{v:#}");
    // The failure's own line (after its MESSAGE_ID), not the state change's; waited for, as
    // journald may write it late on a loaded machine.
    let said = || {
        a.journal_lines()
            .iter()
            .filter(|l| {
                l.split_once("] ")
                    .map_or(l.as_str(), |(_, m)| m)
                    .starts_with("driver_unavailable: ")
            })
            .count()
    };
    sim::wait_for(
        "driver_unavailable in the journal",
        T,
        || (said() > 0).then_some(()),
        || a.context(),
    );
    assert_eq!(said(), 1, "{}", a.context());

    driver_pod_back(&m, &away, &marker, &m.token());
    a.wait_status("licensed within 30 s", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    assert_eq!(m.restarts(), 0, "{}", a.context());
}
