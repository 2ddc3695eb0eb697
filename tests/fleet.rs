//! The fleet's view of the agents (docs/fleet.md, deploy/kubernetes/):
//!
//! - the manifests are what `deploy/kubernetes/generate.py` makes of their sources, and each
//!   validates against its custom resource's schema (`tests/fixtures/crds/`);
//! - every query of the Grafana dashboard parses (`promtool check rules`);
//! - a real Prometheus (Debian's `prometheus`), and a real VictoriaMetrics with vmalert
//!   (Debian's `victoria-metrics`), scrape three real agents (`vgpu-license-agent run` against
//!   the simulator, each on its own loopback address, as each VM has its own pod IP) with the
//!   PodMonitor's (VMPodScrape's) own relabelling and the packaged alert rules: one guest
//!   licensed, one without a token (restricted), one whose clock is an hour off the DLS's,
//!   then fixed. Their HTTP APIs must show the series with the labels the dashboard relies on,
//!   the alerts firing and resolving, and data for every query of the dashboard;
//! - the same two engines scrape stand-in guests that serve set series (a counter already above
//!   zero when its series appears, series that vanish, a guest without a GPU, a passthrough
//!   guest, a lease left unreturned, a token about to expire, an agent that does not answer, a
//!   VM that did not opt in to the scrape): every alert fires and resolves on both, and both
//!   fire exactly the same alerts.
//!
//! The live test holds the journal lock of the simulator (`tests/common/sim.rs`) for its whole
//! run; its three simulated gridds log to the one journal, and each agent reads only its own
//! gridd's lines (see [`Guest::new`]).
//!
//!     cargo test --test fleet

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::sim::{self, FakeDls, SimConfig, shared};
use crate::common::skipped;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Deadline of anything the agents or the scrapers must do.
const T: Duration = Duration::from_secs(60);
/// The agent's port in the manifests' relabelling; the test serves on another, free one.
const MANIFEST_PORT: &str = "9841";

// ---------------------------------------------------------------- helpers

/// `name` on PATH (or in /usr/sbin, /sbin), if there.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// python3 with PyYAML and jsonschema, or why not. Debian's own python3 first: that is the
/// one the packages tests/all.sh installs (python3-yaml, python3-jsonschema) serve; a python3
/// earlier in PATH (pyenv's, say) may have neither.
fn python() -> Result<PathBuf, String> {
    let debian = PathBuf::from("/usr/bin/python3");
    let py = if debian.is_file() {
        debian
    } else {
        which("python3").ok_or("python3 is missing (apt-get install python3)")?
    };
    let ok = Command::new(&py)
        .args(["-c", "import yaml, jsonschema"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "{} lacks PyYAML or jsonschema (apt-get install python3-yaml python3-jsonschema)",
            py.display()
        ))
    }
}

/// A YAML file as JSON, read by PyYAML.
fn yaml_file(py: &Path, path: &Path) -> Value {
    let out = Command::new(py)
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn percent_encode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// One HTTP/1.0 GET: (status, headers as one lowercased string, body).
fn http_get(
    addr: &str,
    target: &str,
    accept: Option<&str>,
) -> Result<(u16, String, String), String> {
    let sa: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(s, "GET {target} HTTP/1.0\r\nHost: {addr}\r\n{accept}\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .map_err(|e| format!("read {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer from {addr}: {text:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line from {addr}: {head:?}"))?;
    Ok((status, head.to_ascii_lowercase(), body.to_string()))
}

fn wait_for<V>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<V>,
    ctx: impl Fn() -> String,
) -> V {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}\n{}", ctx());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// SIGKILLs every process whose command line names `dir` (the simulator's programs, the
/// journalctl of the agent's wrapper).
fn kill_mentioning(dir: &Path) {
    let needle = dir.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    for p in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid as u32 == me {
            continue;
        }
        if let Ok(cmdline) = fs::read(p.path().join("cmdline"))
            && cmdline.windows(needle.len()).any(|w| w == needle)
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// A child process killed (TERM, then KILL) when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Daemon {
        let f = fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Daemon { child, log }
    }

    fn log_tail(&self) -> String {
        tail(&self.log, 30)
    }

    fn assert_running(&mut self) {
        if let Some(s) = self.child.try_wait().unwrap() {
            panic!("{} exited ({s}):\n{}", self.log.display(), self.log_tail());
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- offline checks

#[test]
fn manifests_are_what_their_sources_make() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return skipped(&why),
    };
    let out = Command::new(py)
        .arg(Path::new(ROOT).join("deploy/kubernetes/generate.py"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where the fleet guide is published on a web server, one option points every alert's
/// runbook_url and the dashboard's link there; by default the dashboard links nothing (the
/// guide's installed path is on the guests' disks, not where a browser can open it).
#[test]
fn a_published_runbook_base_reaches_every_alert_and_the_dashboard() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return skipped(&why),
    };
    let generate = |args: &[&str]| {
        Command::new(&py)
            .arg(Path::new(ROOT).join("deploy/kubernetes/generate.py"))
            .args(args)
            .output()
            .unwrap()
    };
    let base = "https://wiki.example.com/vgpu/fleet.md";
    let dir = tempfile::tempdir().unwrap();
    let out = generate(&[
        "--runbook-base",
        base,
        "--output",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    for rel in [
        "prometheus-operator/prometheusrule.yaml",
        "cozystack/vmrule.yaml",
    ] {
        let text = fs::read_to_string(dir.path().join(rel)).unwrap();
        let urls: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
            .collect();
        assert!(urls.len() >= 10, "{rel}: {urls:?}");
        for u in urls {
            assert!(u.starts_with(&format!("{base}#vgpu")), "{rel}: {u}");
        }
    }
    let dashboard = fs::read_to_string(dir.path().join("grafana/grafanadashboard.yaml")).unwrap();
    assert!(
        dashboard.contains(&format!("\"url\": \"{base}#alerts\"")),
        "{dashboard}"
    );
    // Unpublished: no link, and no other address than the data's.
    let committed =
        fs::read_to_string(Path::new(ROOT).join("deploy/kubernetes/grafana/grafanadashboard.yaml"))
            .unwrap();
    assert!(committed.contains("\"links\": []"), "{committed}");
    assert!(!committed.contains("https://"), "{committed}");
    // A runbook_url must be a web address.
    let out = generate(&["--runbook-base", "/usr/share/doc", "--check"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--runbook-base wants"));
}

#[test]
fn manifests_validate_against_the_crd_schemas() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return skipped(&why),
    };
    let dir = Path::new(ROOT).join("deploy/kubernetes");
    let mut manifests = Vec::new();
    for sub in fs::read_dir(&dir).unwrap().flatten() {
        if sub.path().is_dir() {
            for f in fs::read_dir(sub.path()).unwrap().flatten() {
                if f.path()
                    .extension()
                    .is_some_and(|e| e == "yaml" || e == "yml")
                {
                    manifests.push(f.path());
                }
            }
        }
    }
    assert!(manifests.len() >= 5, "{manifests:?}");
    let out = Command::new(py)
        .arg(Path::new(ROOT).join("tests/fixtures/crds/validate.py"))
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A kind without a schema would only be skipped: every manifest must have been checked.
    let n = manifests.len();
    assert!(
        text.contains(&format!("{n} document(s): {n} valid, 0 invalid, 0 skipped")),
        "{text}"
    );
}

/// The dashboard's queries, with Grafana's variables as the test gives them: every namespace,
/// and a rate interval of a minute (the test scrapes every second). (panel title, expression).
fn dashboard_queries() -> Vec<(String, String)> {
    let d: Value = serde_json::from_str(
        &fs::read_to_string(
            Path::new(ROOT).join("deploy/kubernetes/dashboard/vgpu-license-fleet.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut v = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            v.push((
                p["title"].as_str().unwrap().to_string(),
                expr.replace("$namespace", ".*")
                    .replace("$__rate_interval", "1m"),
            ));
        }
    }
    v
}

#[test]
fn dashboard_queries_parse() {
    let Some(promtool) = which("promtool") else {
        return skipped("promtool is missing (apt-get install prometheus)");
    };
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    // promtool parses expressions in rule files: each query becomes a recording rule.
    let dir = tempfile::tempdir().unwrap();
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, e))| json!({"record": format!("dashboard_query_{i}"), "expr": e}))
        .collect();
    let file = dir.path().join("dashboard.rules.yml");
    fs::write(
        &file,
        serde_json::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]})).unwrap(),
    )
    .unwrap();
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every panel asks the data source the dashboard's variable names.
    let d: Value = serde_json::from_str(
        &fs::read_to_string(
            Path::new(ROOT).join("deploy/kubernetes/dashboard/vgpu-license-fleet.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for p in d["panels"].as_array().unwrap() {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
}

/// Every alert's runbook is the fleet guide the package installs, at the alert's own section.
fn assert_runbook(name: &str, annotations: &Value) {
    let url = annotations["runbook_url"].as_str().unwrap_or_default();
    assert_eq!(
        url,
        format!(
            "file:///usr/share/doc/vgpu-license-agent/fleet.md#{}",
            name.to_lowercase()
        ),
        "{name}"
    );
    let guide = fs::read_to_string(Path::new(ROOT).join("docs/fleet.md")).unwrap();
    assert!(
        guide.contains(&format!("\n#### {name}\n")),
        "docs/fleet.md has no section for {name}"
    );
}

/// The agent's series a query reads (`vgpu_license_*` names).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("vgpu_license_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

// ---------------------------------------------------------------- the live test

/// One simulated VM: its machine (GPU, nvidia-smi, nvidia-gridd, a DLS of its own) and its
/// agent, serving its metrics on `addr` (its "pod IP").
struct Guest {
    vm: &'static str,
    namespace: &'static str,
    dir: tempfile::TempDir,
    sim: PathBuf,
    config: PathBuf,
    dls: FakeDls,
    gridd_bin: PathBuf,
    ip: String,
    addr: String,
    agent: Option<Daemon>,
}

impl Guest {
    fn new(
        vm: &'static str,
        namespace: &'static str,
        ip: &str,
        port: u16,
        f: impl FnOnce(&mut SimConfig),
    ) -> Guest {
        let dir = tempfile::Builder::new()
            .prefix("vgpu-fleet-")
            .tempdir()
            .unwrap();
        let r = dir.path().to_path_buf();
        let sim = r.join("sim");
        fs::create_dir_all(&sim).unwrap();
        let mut cfg = SimConfig {
            retry_seconds: 1.0,
            exit_linger_ms: 200,
            token_dir: r.join("etc/nvidia/ClientConfigToken"),
            gridd_conf: r.join("etc/nvidia/gridd.conf"),
            ..SimConfig::default()
        };
        f(&mut cfg);
        cfg.save(&sim).unwrap();
        sim::write_mode(&cfg.gridd_conf, b"FeatureType=1\n", 0o644);
        fs::create_dir_all(&cfg.token_dir).unwrap();
        let dls = FakeDls::start();
        let (gridd_bin, gridd_match) = sim::gridd_identity(&sim);
        let since = sim::since_now();
        let script = |name: &str, text: String| {
            sim::write_program(&r.join("bin").join(name), text.as_bytes());
        };
        for (name, prog) in [
            ("nvidia-smi", "sim-nvidia-smi"),
            ("systemctl", "sim-systemctl"),
        ] {
            script(
                name,
                format!(
                    "#!/bin/sh\nexec '{}' --sim-dir '{}' \"$@\"\n",
                    sim::program(prog).display(),
                    sim.display()
                ),
            );
        }
        // Each VM has a journal of its own; here the three gridds share the machine's: the
        // real journalctl, with the agent's options and matches, selects this guest's gridd
        // alone by its command line (it names this guest's sim dir).
        script(
            "journalctl",
            sim::journalctl_wrapper(&since, Some(&gridd_match)),
        );
        let config = r.join("agent/config.toml");
        fs::create_dir_all(config.parent().unwrap()).unwrap();
        fs::write(
            &config,
            format!(
                "{paths}\
                 [commands]\n\
                 nvidia_smi = \"{r}/bin/nvidia-smi\"\n\
                 journalctl = \"{r}/bin/journalctl\"\n\
                 systemctl = \"{r}/bin/systemctl\"\n\
                 restart_gridd = [\"{restart}\", \"--sim-dir\", \"{sim}\"]\n\
                 timeout_seconds = 3\n\
                 [service]\n\
                 poll_unlicensed_seconds = 1\n\
                 poll_licensed_seconds = 2\n\
                 restart_grace_seconds = 2\n\
                 restart_backoff_seconds = 1\n\
                 restart_backoff_max_seconds = 4\n\
                 restart_budget_per_hour = 0\n\
                 probe_timeout_seconds = 2\n",
                paths = crate::common::paths_toml(&r),
                r = r.display(),
                sim = sim.display(),
                restart = sim::program("sim-restart-gridd").display(),
            ),
        )
        .unwrap();
        // The listener as an operator turns it on in a guest: a drop-in (cloud-init's
        // write_files, say), on the pod network's address.
        let addr = format!("{ip}:{port}");
        sim::write_mode(
            &r.join("agent/config.d/50-metrics.toml"),
            format!("[service]\nmetrics_listen = \"{addr}\"\n").as_bytes(),
            0o644,
        );
        Guest {
            vm,
            namespace,
            dir,
            sim,
            config,
            dls,
            gridd_bin,
            ip: ip.to_string(),
            addr,
            agent: None,
        }
    }

    fn drop_token(&self) {
        let cfg = SimConfig::load(&self.sim);
        sim::write_mode(
            &cfg.token_dir.join("client_configuration_token.tok"),
            &sim::token_for("127.0.0.1", self.dls.port(), self.vm),
            0o744,
        );
    }

    /// Starts the simulated gridd unless one runs.
    fn start_gridd(&self) {
        if shared::running_gridd(&self.sim).is_none() {
            shared::start_gridd_bin(&self.gridd_bin, &self.sim)
                .expect("the simulated gridd starts");
        }
    }

    fn start_agent(&mut self) {
        let mut cmd = Command::new(crate::common::BIN);
        cmd.args(["run", "--config"])
            .arg(&self.config)
            .env_remove("VGPU_LICENSE_AGENT_CONFIG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("VGPU_LICENSE_AGENT_FAULT")
            .env("SIM_DIR", &self.sim);
        self.agent = Some(Daemon::spawn(&mut cmd, self.dir.path().join("agent.log")));
    }

    /// The agent's metrics over its listener, in the text format.
    fn metrics(&self) -> Option<String> {
        match http_get(&self.addr, "/metrics", None) {
            Ok((200, _, body)) => Some(body),
            _ => None,
        }
    }

    fn sample(&self, series: &str) -> Option<f64> {
        self.metrics()?.lines().find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == series).then(|| v.parse().ok())?
        })
    }

    fn context(&self) -> String {
        format!(
            "--- {}: status.json:\n{}\n--- agent's log (tail):\n{}\n--- gridd (tail):\n{}",
            self.vm,
            fs::read_to_string(self.dir.path().join("run/vgpu-license-agent/status.json"))
                .unwrap_or_default(),
            tail(&self.dir.path().join("agent.log"), 20),
            tail(&self.sim.join(shared::GRIDD_LOG), 10),
        )
    }

    /// A static target that carries what Kubernetes discovery gives this VM's virt-launcher
    /// pod's `compute` container, with `container` and `port` changed as given.
    fn target(&self, container: &str, port: Option<u16>, vm_label: bool) -> Value {
        pod_target(
            self.vm,
            self.namespace,
            &self.ip,
            container,
            port,
            vm_label,
            true,
        )
    }
}

/// A static target that carries what Kubernetes discovery gives a VM's virt-launcher pod: its
/// namespace, name, IP, labels (the VM's name unless `vm_label` is false, the scrape's opt-in
/// label when `opted_in`) and the container and declared port.
fn pod_target(
    vm: &str,
    namespace: &str,
    ip: &str,
    container: &str,
    port: Option<u16>,
    vm_label: bool,
    opted_in: bool,
) -> Value {
    let mut labels = json!({
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": format!("virt-launcher-{vm}-x7k2q"),
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_label_kubevirt_io": "virt-launcher",
        "__meta_kubernetes_pod_container_name": container,
    });
    if vm_label {
        labels["__meta_kubernetes_pod_label_vm_kubevirt_io_name"] = json!(vm);
    }
    if opted_in {
        let (meta, value) = opt_in_label();
        labels[meta] = json!(value);
    }
    if let Some(p) = port {
        labels["__meta_kubernetes_pod_container_port_number"] = json!(p.to_string());
    }
    json!({
        "targets": [format!("{vm}-{container}-{}.invalid:1", port.unwrap_or(0))],
        "labels": labels
    })
}

/// The label the manifests select a VM's pod by (besides `kubevirt.io: virt-launcher`), as
/// discovery names it, and its value. Both manifests select the same one.
fn opt_in_label() -> (String, String) {
    let mut found = Vec::new();
    for f in [
        "deploy/kubernetes/prometheus-operator/podmonitor.yaml",
        "deploy/kubernetes/cozystack/vmpodscrape.yaml",
    ] {
        let py = python().expect("python3 with PyYAML");
        let m = yaml_file(&py, &Path::new(ROOT).join(f));
        let labels = m["spec"]["selector"]["matchLabels"].as_object().unwrap();
        assert_eq!(labels["kubevirt.io"], "virt-launcher", "{f}");
        let (k, v) = labels
            .iter()
            .find(|(k, _)| *k != "kubevirt.io")
            .unwrap_or_else(|| panic!("{f}: no opt-in label in the selector: every VM a target"));
        let meta: String = k
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        found.push((
            format!("__meta_kubernetes_pod_label_{meta}"),
            v.as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(found[0], found[1], "the manifests select different labels");
    found.remove(0)
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.agent = None;
        let _ = shared::stop_gridd(&self.sim, Duration::from_secs(5));
        for _ in 0..3 {
            kill_mentioning(&self.sim);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A scraper under test: where to query, where its alerts are.
struct Scraper {
    name: &'static str,
    query_addr: String,
    alerts_addr: String,
    daemons: Vec<Daemon>,
}

impl Scraper {
    fn context(&mut self) -> String {
        let mut s = String::new();
        for d in &mut self.daemons {
            s += &format!("--- {} (tail):\n{}\n", d.log.display(), d.log_tail());
        }
        s
    }

    fn api(&self, addr: &str, target: &str) -> Result<Value, String> {
        let (status, _, body) = http_get(addr, target, None)?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if status != 200 || v["status"] != "success" {
            return Err(format!("{} {target}: {status} {body}", self.name));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's result: (labels, value) per series.
    fn query(&self, expr: &str) -> Result<Vec<(Value, f64)>, String> {
        let data = self.api(
            &self.query_addr,
            &format!("/api/v1/query?query={}", percent_encode(expr)),
        )?;
        let result = match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![json!({"metric": {}, "value": data["result"]})],
            other => return Err(format!("{expr}: result type {other:?}")),
        };
        Ok(result
            .into_iter()
            .map(|r| {
                let v = r["value"][1]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                (r["metric"].clone(), v)
            })
            .collect())
    }

    /// The value of the series of `expr` whose labels include `want`.
    fn value(&self, expr: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.query(expr)
            .ok()?
            .into_iter()
            .find_map(|(m, v)| want.iter().all(|(k, x)| m[*k] == *x).then_some(v))
    }

    /// Firing alerts: (alert name, labels, annotations).
    fn firing(&self) -> Vec<(String, Value, Value)> {
        let Ok(data) = self.api(&self.alerts_addr, "/api/v1/alerts") else {
            return Vec::new();
        };
        data["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                let name = a["labels"]["alertname"]
                    .as_str()
                    .or(a["name"].as_str())
                    .unwrap_or_default()
                    .to_string();
                (name, a["labels"].clone(), a["annotations"].clone())
            })
            .collect()
    }

    fn is_firing(&self, alert: &str, instance: &str) -> bool {
        self.firing()
            .iter()
            .any(|(n, l, _)| n == alert && l["instance"] == instance)
    }
}

/// The packaged alert rules, with every `for:` shortened to 3 s and every range (15 min, an
/// hour) to 30 s, so that the test need not wait ten minutes; the expressions are otherwise the
/// packaged ones.
fn test_rules() -> String {
    fs::read_to_string(Path::new(ROOT).join("packaging/vgpu-license-agent.rules.yml"))
        .unwrap()
        .lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("for: ") {
                format!("{}for: 3s\n", &l[..l.len() - t.len()])
            } else {
                format!("{}\n", l.replace("[15m]", "[30s]").replace("[1h]", "[30s]"))
            }
        })
        .collect()
}

#[test]
fn rules_avoid_what_the_engines_compute_differently() {
    // increase(), rate(), irate() and delta() extrapolate on Prometheus and count a new
    // series' first value on VictoriaMetrics: a guest that appears with a counter above zero
    // would alert on one engine only.
    let rules =
        fs::read_to_string(Path::new(ROOT).join("packaging/vgpu-license-agent.rules.yml")).unwrap();
    let exprs: String = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    for f in ["increase(", "rate(", "delta("] {
        assert!(!exprs.contains(f), "a rule uses {f}");
    }
    // Every window the test shortens is one the rules use, and no other is left unshortened.
    let shortened = test_rules();
    for w in ["[5m]", "[10m]", "[15m]", "[30m]", "[1h]", "[6h]", "[1d]"] {
        assert!(
            !shortened.contains(w),
            "the test leaves a {w} window as it is"
        );
    }
}

/// What an operator makes of a manifest's first pod endpoint: its own relabelling first (the
/// job label `NAMESPACE/NAME` and namespace, pod, container), then the manifest's, in the scrape
/// config's own spelling, with the agent's port replaced by the test's.
fn relabel_configs(manifest: &Value, key: &str, port: u16, operator_job: &str) -> Value {
    let mut out = vec![json!({"target_label": "job", "replacement": operator_job})];
    for (from, to) in [
        ("__meta_kubernetes_namespace", "namespace"),
        ("__meta_kubernetes_pod_name", "pod"),
        ("__meta_kubernetes_pod_container_name", "container"),
    ] {
        out.push(json!({"action": "replace", "source_labels": [from], "target_label": to}));
    }
    for r in manifest["spec"]["podMetricsEndpoints"][0][key]
        .as_array()
        .unwrap()
    {
        let mut c = serde_json::Map::new();
        for (k, v) in r.as_object().unwrap() {
            let k = match k.as_str() {
                "sourceLabels" => "source_labels",
                "targetLabel" => "target_label",
                other => other,
            };
            let v = match (k, v.as_str()) {
                ("replacement", Some(s)) => {
                    json!(s.replace(&format!(":{MANIFEST_PORT}"), &format!(":{port}")))
                }
                _ => v.clone(),
            };
            c.insert(k.to_string(), v);
        }
        out.push(Value::Object(c));
    }
    Value::Array(out)
}

/// The scrape job the Prometheus Operator makes of the PodMonitor (its job name), over `targets`.
const PROMETHEUS_JOB: (&str, &str) = (
    "podMonitor/monitoring/vgpu-license-agent/0",
    "monitoring/vgpu-license-agent",
);
/// The one the VictoriaMetrics operator makes of the VMPodScrape.
const VICTORIA_JOB: (&str, &str) = (
    "podScrape/tenant-a/vgpu-license-agent/0",
    "tenant-a/vgpu-license-agent",
);

fn scrape_job_over(job_name: &str, targets: Vec<Value>, relabel: Value) -> Value {
    json!({
        "job_name": job_name,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "metrics_path": "/metrics",
        "static_configs": targets,
        "relabel_configs": relabel,
    })
}

/// A scrape job over `guests` (and decoys the relabelling must drop: another container of the
/// pod, another declared port, a pod that is no VM's, a VM that did not opt in, whose agent
/// answers).
fn scrape_job(guests: &[Guest], job_name: &str, relabel: Value) -> Value {
    let mut targets = Vec::new();
    for g in guests {
        targets.push(g.target("compute", None, true));
        targets.push(g.target("guest-console-log", None, true));
        targets.push(g.target("compute", Some(8080), true));
    }
    targets.push(guests[0].target("compute", None, false));
    targets.push(pod_target(
        "vm-not-opted-in",
        guests[0].namespace,
        &guests[0].ip,
        "compute",
        None,
        true,
        false,
    ));
    scrape_job_over(job_name, targets, relabel)
}

/// The two scrapers over one scrape job each, with the manifests' own relabelling.
fn start_scrapers(
    py: &Path,
    work: &Path,
    prometheus: &Path,
    victoria: Option<&(PathBuf, PathBuf)>,
    port: u16,
    job: impl Fn(&str, Value) -> Value,
) -> Vec<Scraper> {
    let pod_monitor = yaml_file(
        py,
        &Path::new(ROOT).join("deploy/kubernetes/prometheus-operator/podmonitor.yaml"),
    );
    let pod_scrape = yaml_file(
        py,
        &Path::new(ROOT).join("deploy/kubernetes/cozystack/vmpodscrape.yaml"),
    );
    let prom_dir = work.join("prometheus");
    fs::create_dir_all(&prom_dir).unwrap();
    let mut scrapers = vec![start_prometheus(
        &prom_dir,
        prometheus,
        job(
            PROMETHEUS_JOB.0,
            relabel_configs(&pod_monitor, "relabelings", port, PROMETHEUS_JOB.1),
        ),
    )];
    if let Some((v, a)) = victoria {
        let vm_dir = work.join("victoria-metrics");
        fs::create_dir_all(&vm_dir).unwrap();
        scrapers.push(start_victoria_metrics(
            &vm_dir,
            v,
            a,
            job(
                VICTORIA_JOB.0,
                relabel_configs(&pod_scrape, "relabelConfigs", port, VICTORIA_JOB.1),
            ),
        ));
    }
    scrapers
}

fn start_prometheus(dir: &Path, bin: &Path, job: Value) -> Scraper {
    fs::write(dir.join("rules.yml"), test_rules()).unwrap();
    let config = json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [dir.join("rules.yml")],
        "scrape_configs": [job],
    });
    // JSON is YAML: Prometheus reads it as its config.
    fs::write(
        dir.join("prometheus.yml"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(bin);
    cmd.arg(format!(
        "--config.file={}",
        dir.join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        dir.join("data").display()
    ))
    .arg(format!("--web.listen-address={addr}"))
    .arg("--log.level=warn");
    let d = Daemon::spawn(&mut cmd, dir.join("prometheus.log"));
    Scraper {
        name: "Prometheus",
        query_addr: addr.clone(),
        alerts_addr: addr,
        daemons: vec![d],
    }
}

fn start_victoria_metrics(dir: &Path, vm_bin: &Path, vmalert: &Path, job: Value) -> Scraper {
    fs::write(dir.join("rules.yml"), test_rules()).unwrap();
    let config = json!({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]});
    fs::write(
        dir.join("scrape.yml"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    let vm_addr = format!("127.0.0.1:{}", free_port());
    let alert_addr = format!("127.0.0.1:{}", free_port());
    // Nothing listens there: vmalert wants somewhere to send alerts; the test reads its API.
    let notifier = format!("http://127.0.0.1:{}", free_port());
    let mut cmd = Command::new(vm_bin);
    cmd.arg(format!(
        "-promscrape.config={}",
        dir.join("scrape.yml").display()
    ))
    .arg(format!(
        "-storageDataPath={}",
        dir.join("vm-data").display()
    ))
    .arg(format!("-httpListenAddr={vm_addr}"))
    // Samples are queryable at once (the default holds back the last 30 s), and no
    // answer is cached: the test asks again and again.
    .arg("-search.latencyOffset=0s")
    .arg("-search.disableCache")
    .arg("-loggerLevel=WARN");
    let vm = Daemon::spawn(&mut cmd, dir.join("victoria-metrics.log"));
    let mut cmd = Command::new(vmalert);
    cmd.arg(format!("-rule={}", dir.join("rules.yml").display()))
        .arg(format!("-datasource.url=http://{vm_addr}"))
        .arg(format!("-notifier.url={notifier}"))
        .arg(format!("-httpListenAddr={alert_addr}"))
        .arg("-evaluationInterval=1s")
        .arg("-loggerLevel=WARN");
    let alert = Daemon::spawn(&mut cmd, dir.join("vmalert.log"));
    Scraper {
        name: "VictoriaMetrics",
        query_addr: vm_addr,
        alerts_addr: alert_addr,
        daemons: vec![vm, alert],
    }
}

#[test]
fn prometheus_and_victoria_metrics_watch_a_fleet_of_agents() {
    let started = Instant::now();
    let Some(prometheus) = which("prometheus") else {
        return skipped(
            "the real Prometheus is missing: apt-get install prometheus (do not start its service; the test runs its own)",
        );
    };
    let py = match python() {
        Ok(p) => p,
        Err(why) => return skipped(&why),
    };
    let victoria = match (which("victoria-metrics"), which("vmalert")) {
        (Some(v), Some(a)) => Some((v, a)),
        _ => {
            skipped(
                "VictoriaMetrics is missing (apt-get install victoria-metrics): its part of the fleet test does not run",
            );
            None
        }
    };
    sim::ensure_journald();
    // Shared: the guests' gridds log to the machine's journal while they run, which a
    // scenario that reads the whole journal must not see.
    let _journal = sim::journal_lock(false);

    // Three VMs, each with its own pod IP, the agent on the same port in each.
    let port = free_port();
    let mut guests = vec![
        Guest::new("vm-licensed", "tenant-a", "127.0.0.11", port, |_| {}),
        // gridd's requests fail without saying why (the bare `Failed to acquire license`), so
        // the agent probes the DLS itself; the DLS's clock goes wrong below.
        Guest::new("vm-skewed", "tenant-a", "127.0.0.12", port, |c| {
            c.network_timeout_ms = 0
        }),
        // No token; no grace period either: restricted at once.
        Guest::new("vm-no-token", "tenant-b", "127.0.0.13", port, |c| {
            c.grace_seconds = 0
        }),
    ];
    let instance = |g: &Guest| format!("{}/{}", g.namespace, g.vm);
    guests[0].drop_token();
    guests[0].start_gridd();
    guests[1].drop_token();
    guests[1].start_gridd();
    guests[2].start_gridd();
    for g in &mut guests {
        g.start_agent();
    }
    let context = |guests: &[Guest]| {
        guests
            .iter()
            .map(Guest::context)
            .collect::<Vec<_>>()
            .join("\n")
    };

    // The scrapers, with the manifests' own relabelling.
    let work = tempfile::Builder::new()
        .prefix("vgpu-fleet-scrapers-")
        .tempdir()
        .unwrap();
    let mut scrapers = start_scrapers(
        &py,
        work.path(),
        &prometheus,
        victoria.as_ref(),
        port,
        |name, relabel| scrape_job(&guests, name, relabel),
    );

    // The agents answer on their listeners: 404 elsewhere, OpenMetrics when asked.
    for g in &guests {
        wait_for(
            &format!("{}'s metrics listener", g.vm),
            T,
            || g.metrics(),
            || context(&guests),
        );
        let (status, _, _) = http_get(&g.addr, "/", None).unwrap();
        assert_eq!(status, 404);
        let (status, head, body) = http_get(
            &g.addr,
            "/metrics",
            Some("application/openmetrics-text; version=1.0.0"),
        )
        .unwrap();
        assert_eq!(status, 200);
        assert!(
            head.contains(
                "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"
            ),
            "{head}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
    wait_for(
        "vm-licensed licensed",
        T,
        || (guests[0].sample("vgpu_license_licensed")? == 1.0).then_some(()),
        || context(&guests),
    );
    wait_for(
        "vm-no-token restricted, for want of a token",
        T,
        || {
            (guests[2].sample("vgpu_license_state{state=\"restricted\"}")? == 1.0
                && guests[2].sample("vgpu_license_failure{reason=\"token_missing\"}")? == 1.0)
                .then_some(())
        },
        || context(&guests),
    );

    // Every scraper has every guest, once (the decoy targets dropped, the VM that did not opt
    // in among them), labelled by its VM, under the job the manifests name.
    for s in &mut scrapers {
        let ctx = s.context();
        wait_for(
            &format!("{}: three guests scraped", s.name),
            T,
            || {
                let r = s.query("vgpu_license_licensed").ok()?;
                (r.len() == 3).then_some(())
            },
            || format!("{}\n{:?}", ctx, s.query("up")),
        );
        let up = s.query("up").unwrap();
        assert_eq!(up.len(), 3, "{}: targets after relabelling: {up:?}", s.name);
        for (m, _) in &up {
            assert_eq!(m["job"], "vgpu-license-agent", "{}: {m}", s.name);
            assert_ne!(m["vm"], "vm-not-opted-in", "{}: {m}", s.name);
        }
        for g in &guests {
            let v = s.value("vgpu_license_licensed", &[("instance", &instance(g))]);
            assert!(v.is_some(), "{}: no series for {}", s.name, instance(g));
            let (m, _) = s
                .query(&format!("vgpu_license_guest_info{{vm=\"{}\"}}", g.vm))
                .unwrap()
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("{}: no guest info for {}", s.name, g.vm));
            assert_eq!(m["namespace"], g.namespace, "{m}");
            assert_eq!(m["instance"], instance(g), "{m}");
            assert_eq!(m["job"], "vgpu-license-agent", "{m}");
            assert_eq!(m["container"], "compute", "{m}");
            assert_eq!(m["profile"], "NVIDIA L40S-24Q", "{m}");
            assert_eq!(m["edition"], "NVIDIA RTX Virtual Workstation", "{m}");
            assert_eq!(m["driver_version"], "550.90.07", "{m}");
            assert_eq!(m["agent_version"], env!("CARGO_PKG_VERSION"), "{m}");
            // The token names a DLS (vm-no-token has none).
            if g.vm != "vm-no-token" {
                assert_eq!(m["licensing"], "dls", "{m}");
            }
        }
    }

    // Its DLS's clock goes an hour ahead of the guest's; the agent's next probe (every 30 s
    // while gridd's failure says nothing specific) measures it.
    guests[1].dls.set_skew(3600);
    wait_for(
        "vm-skewed's clock skew measured and reported",
        Duration::from_secs(75),
        || {
            let skew = guests[1].sample("vgpu_license_dls_clock_skew_seconds")?;
            ((skew + 3600.0).abs() < 10.0
                && guests[1].sample("vgpu_license_failure{reason=\"clock_skew\"}")? == 1.0)
                .then_some(())
        },
        || context(&guests),
    );
    let skewed = instance(&guests[1]);
    let no_token = instance(&guests[2]);
    let licensed = instance(&guests[0]);
    for s in &mut scrapers {
        let ctx = s.context();
        for (alert, inst) in [
            ("VgpuDlsClockSkew", &skewed),
            ("VgpuNotLicensed", &skewed),
            ("VgpuLicenseFailures", &skewed),
            ("VgpuNotLicensed", &no_token),
            ("VgpuLicenseRestricted", &no_token),
        ] {
            wait_for(
                &format!("{}: {alert} firing for {inst}", s.name),
                T,
                || s.is_firing(alert, inst).then_some(()),
                || format!("{ctx}\nfiring: {:?}", s.firing()),
            );
        }
        // By reason: gridd's own failures say nothing specific, the agent's probe says why.
        wait_for(
            &format!(
                "{}: VgpuLicenseFailures firing for {skewed}, reason clock_skew",
                s.name
            ),
            T,
            || {
                s.firing()
                    .iter()
                    .any(|(n, l, _)| {
                        n == "VgpuLicenseFailures"
                            && l["instance"] == *skewed
                            && l["reason"] == "clock_skew"
                    })
                    .then_some(())
            },
            || format!("{ctx}\nfiring: {:?}", s.firing()),
        );
        let firing = s.firing();
        assert!(
            !firing.iter().any(|(_, l, _)| l["instance"] == *licensed),
            "{}: an alert for the licensed guest: {firing:?}",
            s.name
        );
        for (name, _, a) in &firing {
            assert_runbook(name, a);
            if name == "VgpuDlsClockSkew" {
                // An hour, give or take the second the measurement took.
                let summary = a["summary"].as_str().unwrap_or_default();
                assert!(summary.contains(" 1h ") || summary.contains(" 59m "), "{a}");
            }
        }

        // The dashboard: every query answers, and says what the fleet is. A query over a
        // series these agents do not export (yet) must answer in the stand-in guests' test.
        let exported: String = guests.iter().filter_map(Guest::metrics).collect();
        for (title, expr) in dashboard_queries() {
            let r = s
                .query(&expr)
                .unwrap_or_else(|e| panic!("{}: {title}: {e}", s.name));
            let all_exported = metric_names(&expr)
                .iter()
                .all(|m| exported.contains(&format!("\n{m}")));
            assert!(
                !r.is_empty() || !all_exported,
                "{}: {title}: no data for {expr}",
                s.name
            );
        }
        let one = |title: &str| -> f64 {
            let (_, expr) = dashboard_queries()
                .into_iter()
                .find(|(t, _)| t == title)
                .unwrap();
            let r = s.query(&expr).unwrap();
            assert_eq!(r.len(), 1, "{title}: {r:?}");
            r[0].1
        };
        assert_eq!(one("Licensed"), 1.0);
        assert_eq!(one("Guests with a vGPU"), 3.0);
        assert_eq!(one("Not licensed"), 2.0);
        assert_eq!(one("Restricted (throttled)"), 1.0);
        assert!((one("Licensed share") - 1.0 / 3.0).abs() < 1e-9);
        let soonest = one("Soonest expiry");
        assert!(
            soonest > 86000.0 && soonest <= 86400.0,
            "soonest expiry in {soonest} s"
        );
        let by = |title: &str, label: &str| -> Vec<(String, f64)> {
            let (_, expr) = dashboard_queries()
                .into_iter()
                .find(|(t, _)| t == title)
                .unwrap();
            let mut v: Vec<(String, f64)> = s
                .query(&expr)
                .unwrap()
                .into_iter()
                .map(|(m, v)| (m[label].as_str().unwrap_or_default().to_string(), v))
                .filter(|(_, v)| *v != 0.0)
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let owned = |v: &[(&str, f64)]| -> Vec<(String, f64)> {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        assert_eq!(
            by("Guests by state", "state"),
            owned(&[("licensed", 1.0), ("restricted", 1.0), ("unlicensed", 1.0)])
        );
        assert_eq!(
            by("Guests failing, by reason", "reason"),
            owned(&[("clock_skew", 1.0), ("token_missing", 1.0)])
        );
        let table: Vec<(String, String, String)> = {
            let (_, expr) = dashboard_queries()
                .into_iter()
                .find(|(t, _)| t == "Guests not licensed, and why")
                .unwrap();
            let mut rows: Vec<_> = s
                .query(&expr)
                .unwrap()
                .into_iter()
                .map(|(m, _)| {
                    assert_eq!(m["profile"], "NVIDIA L40S-24Q", "{m}");
                    (
                        m["vm"].as_str().unwrap_or_default().to_string(),
                        m["state"].as_str().unwrap_or_default().to_string(),
                        m["reason"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            rows.sort();
            rows
        };
        let row = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            table,
            [
                row("vm-no-token", "restricted", "token_missing"),
                row("vm-skewed", "unlicensed", "clock_skew")
            ]
        );
        // An agent measures whenever it probes: the licensed guest's, if it probed before
        // its license came, is near 0.
        let skew = by("Clock skew against the DLS", "vm");
        for (vm, v) in &skew {
            match vm.as_str() {
                "vm-skewed" => assert!((v + 3600.0).abs() < 10.0, "{skew:?}"),
                _ => assert!(v.abs() < 10.0, "{skew:?}"),
            }
        }
        assert!(skew.iter().any(|(vm, _)| vm == "vm-skewed"), "{skew:?}");
        let expiries = by("Soonest lease expiries", "vm");
        assert_eq!(
            expiries.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["vm-licensed"]
        );
        let (_, restarts) = dashboard_queries()
            .into_iter()
            .find(|(t, _)| t == "Most gridd restarts, last hour")
            .unwrap();
        assert_eq!(s.query(&restarts).unwrap().len(), 3);
    }

    // Prometheus asked for OpenMetrics and got it: its metadata has the info type, which
    // only OpenMetrics can say.
    let prom = &scrapers[0];
    let meta = prom.api(&prom.query_addr, "/api/v1/metadata").unwrap();
    assert_eq!(meta["vgpu_license_guest"][0]["type"], "info", "{meta}");
    assert_eq!(
        meta["vgpu_license_failures"][0]["type"], "counter",
        "{meta}"
    );

    // The clock is fixed (and gridd's network with it) and gridd restarted, as the runbook
    // says: licensed again, and the clock-skew and not-licensed alerts resolve (the
    // restricted guest's stay).
    guests[1].dls.set_skew(0);
    let mut cfg = SimConfig::load(&guests[1].sim);
    cfg.network_timeout_ms = 3000;
    cfg.save(&guests[1].sim).unwrap();
    let _ = shared::stop_gridd(&guests[1].sim, Duration::from_secs(5));
    guests[1].start_gridd();
    wait_for(
        "vm-skewed licensed",
        T,
        || (guests[1].sample("vgpu_license_licensed")? == 1.0).then_some(()),
        || context(&guests),
    );
    for s in &mut scrapers {
        let ctx = s.context();
        wait_for(
            &format!("{}: vm-skewed's alerts resolved", s.name),
            T,
            || {
                (!s.is_firing("VgpuDlsClockSkew", &skewed)
                    && !s.is_firing("VgpuNotLicensed", &skewed))
                .then_some(())
            },
            || format!("{ctx}\nfiring: {:?}", s.firing()),
        );
        assert!(
            s.is_firing("VgpuLicenseRestricted", &no_token),
            "{:?}",
            s.firing()
        );
        assert_eq!(
            s.value("sum(vgpu_license_licensed)", &[]),
            Some(2.0),
            "{}",
            s.name
        );
        for d in &mut s.daemons {
            d.assert_running();
        }
    }
    eprintln!(
        "fleet test: {} scraper(s), {:.1} s",
        scrapers.len(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------- stand-in guests

/// The states and failure reasons the agent exports (docs/fleet.md, the contract).
const STATES: &[&str] = &[
    "licensed",
    "unlicensed",
    "restricted",
    "not_licensable",
    "no_gpu",
    "no_driver",
    "unknown",
];
const REASONS: &[&str] = &[
    "token_missing",
    "token_invalid",
    "token_expired",
    "clock_skew",
    "no_license_available",
    "trusted_store",
    "licensing_unsupported",
    "feature_type_invalid",
    "dls_unreachable",
    "gridd_not_running",
    "token_source_rejected",
    "renewal_stalled",
    "driver_unavailable",
    "token_rejected",
    "unspecified",
    "other",
];

/// What a stand-in guest's agent says: the series the agent writes, with set values.
#[derive(Clone)]
struct Series {
    state: &'static str,
    failure: Option<&'static str>,
    /// vgpu_license_failures_total by reason (0 for the others); None: the series are gone.
    counted: Option<Vec<(&'static str, u64)>>,
    restarts: u64,
    /// Further lines, as they stand in the text format.
    extra: Vec<String>,
}

impl Series {
    fn new(state: &'static str) -> Series {
        Series {
            state,
            failure: None,
            counted: Some(Vec::new()),
            restarts: 0,
            extra: Vec::new(),
        }
    }

    fn text(&self) -> String {
        let mut o = format!(
            "vgpu_license_licensed {}\n",
            u8::from(self.state == "licensed")
        );
        for s in STATES {
            o += &format!(
                "vgpu_license_state{{state=\"{s}\"}} {}\n",
                u8::from(*s == self.state)
            );
        }
        for r in REASONS {
            o += &format!(
                "vgpu_license_failure{{reason=\"{r}\"}} {}\n",
                u8::from(Some(*r) == self.failure)
            );
        }
        if let Some(counted) = &self.counted {
            for r in REASONS {
                let n = counted.iter().find(|(k, _)| k == r).map_or(0, |(_, n)| *n);
                o += &format!("vgpu_license_failures_total{{reason=\"{r}\"}} {n}\n");
            }
        }
        o += &format!("vgpu_license_gridd_restarts_total {}\n", self.restarts);
        o += "vgpu_license_guest_info{agent_version=\"1\",driver_version=\"550.90.07\",\
              edition=\"NVIDIA RTX Virtual Workstation\",licensing=\"dls\",\
              profile=\"NVIDIA L40S-24Q\"} 1\n";
        for l in &self.extra {
            o += l;
            o += "\n";
        }
        o
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A stand-in guest: serves `/metrics` on its own loopback address (its "pod IP") with the
/// series the test sets, and 503, as an agent that does not answer, while it has none.
struct FakeGuest {
    vm: &'static str,
    namespace: &'static str,
    ip: String,
    body: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeGuest {
    fn start(vm: &'static str, namespace: &'static str, ip: &str, port: u16) -> FakeGuest {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind((ip, port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let body = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (b, st) = (body.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((mut c, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = match b.lock().unwrap().clone() {
                    Some(text) => format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    ),
                    None => "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\
                             Connection: close\r\n\r\n"
                        .to_string(),
                };
                let _ = c.write_all(answer.as_bytes());
            }
        });
        FakeGuest {
            vm,
            namespace,
            ip: ip.to_string(),
            body,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, series: &Series) {
        *self.body.lock().unwrap() = Some(series.text());
    }

    fn instance(&self) -> String {
        format!("{}/{}", self.namespace, self.vm)
    }

    fn target(&self, opted_in: bool) -> Value {
        pod_target(
            self.vm,
            self.namespace,
            &self.ip,
            "compute",
            None,
            true,
            opted_in,
        )
    }
}

impl Drop for FakeGuest {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// (alert, instance, reason) of every firing alert, sorted.
fn firing_set(s: &Scraper) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = s
        .firing()
        .into_iter()
        .map(|(n, l, _)| {
            (
                n,
                l["instance"].as_str().unwrap_or_default().to_string(),
                l["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Polls every scraper until each fires at least `want`; then each must fire exactly `want`:
/// the same alerts on both engines, nothing more.
fn expect_firing(scrapers: &mut [Scraper], want: &[(&str, String, &str)], what: &str) {
    let mut want: Vec<(String, String, String)> = want
        .iter()
        .map(|(a, i, r)| (a.to_string(), i.clone(), r.to_string()))
        .collect();
    want.sort();
    let mut seen: Vec<Option<Vec<(String, String, String)>>> = vec![None; scrapers.len()];
    let deadline = Instant::now() + T;
    while seen.iter().any(Option::is_none) {
        for (i, s) in scrapers.iter().enumerate() {
            if seen[i].is_none() {
                let f = firing_set(s);
                if want.iter().all(|w| f.contains(w)) {
                    seen[i] = Some(f);
                }
            }
        }
        if Instant::now() >= deadline {
            let now: Vec<_> = scrapers.iter().map(|s| (s.name, firing_set(s))).collect();
            let ctx: String = scrapers.iter_mut().map(|s| s.context()).collect();
            panic!("{what}: timed out waiting for {want:?}\nfiring: {now:?}\n{ctx}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    for (s, f) in scrapers.iter().zip(seen) {
        assert_eq!(f.unwrap(), want, "{}: {what}: firing", s.name);
    }
}

/// Polls every scraper until none fires anything.
fn expect_quiet(scrapers: &mut [Scraper], what: &str) {
    for s in scrapers.iter_mut() {
        let ctx = s.context();
        wait_for(
            &format!("{}: {what}: no alert firing", s.name),
            T,
            || firing_set(s).is_empty().then_some(()),
            || format!("firing: {:?}\n{ctx}", firing_set(s)),
        );
    }
}

#[test]
fn every_alert_means_the_same_on_prometheus_and_victoria_metrics() {
    let Some(prometheus) = which("prometheus") else {
        return skipped(
            "the real Prometheus is missing: apt-get install prometheus (do not start its service; the test runs its own)",
        );
    };
    let (Some(vm_bin), Some(vmalert)) = (which("victoria-metrics"), which("vmalert")) else {
        return skipped(
            "VictoriaMetrics is missing (apt-get install victoria-metrics): the two engines cannot be compared",
        );
    };
    let py = match python() {
        Ok(p) => p,
        Err(why) => return skipped(&why),
    };
    let now = unix_now();
    let port = free_port();
    let g = |vm, ns, last: u8| FakeGuest::start(vm, ns, &format!("127.0.0.{}", 20 + last), port);
    let counted = g("vm-counted", "tenant-a", 1);
    let failing = g("vm-failing", "tenant-a", 2);
    let no_gpu = g("vm-no-gpu", "tenant-b", 3);
    let passthrough = g("vm-passthrough", "tenant-b", 4);
    let unreturned = g("vm-unreturned", "tenant-a", 5);
    let down = g("vm-down", "tenant-a", 6);
    let not_opted_in = g("vm-not-opted-in", "tenant-a", 7);
    let gpu = |bus: &str, licensed: u8| {
        format!(
            "vgpu_license_gpu_licensed{{bus_id=\"{bus}\",profile=\"NVIDIA L40S-24Q\"}} {licensed}"
        )
    };

    // vm-counted: licensed; its agent counted a failure and 5 gridd restarts before the scrape
    // began: the counters' series appear above zero, and nothing happens after.
    let mut counted_s = Series::new("licensed");
    counted_s.counted = Some(vec![("token_missing", 1)]);
    counted_s.restarts = 5;
    counted_s.extra = vec![
        gpu("00000000:02:00.0", 1),
        format!("vgpu_license_expiry_timestamp_seconds {}", now + 86400),
        format!(
            "vgpu_license_token_expiry_timestamp_seconds {}",
            now + 365 * 86400
        ),
    ];
    counted.set(&counted_s);
    // vm-failing: no token, restricted; its failure already counted 3 times when its series
    // appear; gridd restarted 3 times below.
    let mut failing_s = Series::new("restricted");
    failing_s.failure = Some("token_missing");
    failing_s.counted = Some(vec![("token_missing", 3)]);
    failing_s.extra = vec![gpu("00000000:02:00.0", 0), gpu("00000000:03:00.0", 0)];
    failing.set(&failing_s);
    // vm-no-gpu: the image on a VM without a GPU. Whatever else its series say, no alert.
    let mut no_gpu_s = Series::new("no_gpu");
    no_gpu_s.failure = Some("gridd_not_running");
    no_gpu_s.counted = Some(vec![("gridd_not_running", 2)]);
    no_gpu_s.extra = vec![
        "vgpu_license_last_return_success 0".into(),
        format!("vgpu_license_last_shutdown_timestamp_seconds {}", now - 600),
        format!(
            "vgpu_license_token_expiry_timestamp_seconds {}",
            now + 86400
        ),
        "vgpu_license_dls_clock_skew_seconds 300".into(),
    ];
    no_gpu.set(&no_gpu_s);
    // vm-passthrough: gridd says licensing is unsupported (a GPU that needs no license).
    let mut passthrough_s = Series::new("not_licensable");
    passthrough_s.failure = Some("licensing_unsupported");
    passthrough_s.counted = Some(vec![("licensing_unsupported", 1)]);
    passthrough_s.extra = vec![
        gpu("00000000:04:00.0", 0),
        "vgpu_license_dls_clock_skew_seconds 300".into(),
        "vgpu_license_last_return_success 0".into(),
    ];
    passthrough.set(&passthrough_s);
    // vm-unreturned: licensed; its lease was not returned at its shutdown 10 minutes ago, and
    // its token expires in 3 days.
    let mut unreturned_s = Series::new("licensed");
    let unreturned_extra = vec![
        gpu("00000000:02:00.0", 1),
        format!("vgpu_license_expiry_timestamp_seconds {}", now + 86400),
        "vgpu_license_last_return_success 0".to_string(),
        format!("vgpu_license_last_shutdown_timestamp_seconds {}", now - 600),
        format!(
            "vgpu_license_token_expiry_timestamp_seconds {}",
            now + 3 * 86400
        ),
    ];
    unreturned_s.extra = unreturned_extra.clone();
    unreturned.set(&unreturned_s);
    // vm-down answers nothing (503). vm-not-opted-in would alert on everything, if scraped.
    let mut not_opted_in_s = Series::new("restricted");
    not_opted_in_s.failure = Some("token_missing");
    not_opted_in.set(&not_opted_in_s);

    let guests = [
        &counted,
        &failing,
        &no_gpu,
        &passthrough,
        &unreturned,
        &down,
    ];
    let work = tempfile::Builder::new()
        .prefix("vgpu-fleet-engines-")
        .tempdir()
        .unwrap();
    let mut scrapers = start_scrapers(
        &py,
        work.path(),
        &prometheus,
        Some(&(vm_bin, vmalert)),
        port,
        |name, relabel| {
            let mut targets: Vec<Value> = guests.iter().map(|g| g.target(true)).collect();
            targets.push(not_opted_in.target(false));
            scrape_job_over(name, targets, relabel)
        },
    );

    // Every engine has scraped every guest twice before gridd's restarts on vm-failing (and on
    // the guests that must not alert for it).
    for s in &mut scrapers {
        let ctx = s.context();
        wait_for(
            &format!("{}: the guests scraped twice", s.name),
            T,
            || {
                let r = s
                    .query("count_over_time(vgpu_license_gridd_restarts_total[1m]) >= 2")
                    .ok()?;
                (r.len() == 5).then_some(())
            },
            || format!("{ctx}\nup: {:?}", s.query("up")),
        );
    }
    for (guest, series) in [
        (&failing, &mut failing_s),
        (&no_gpu, &mut no_gpu_s),
        (&passthrough, &mut passthrough_s),
    ] {
        series.restarts = 3;
        guest.set(series);
    }

    let a = |g: &FakeGuest| g.instance();
    expect_firing(
        &mut scrapers,
        &[
            ("VgpuNotLicensed", a(&failing), ""),
            ("VgpuLicenseRestricted", a(&failing), ""),
            ("VgpuLicenseFailures", a(&failing), "token_missing"),
            ("VgpuGriddRestartLoop", a(&failing), ""),
            ("VgpuLicenseTokenExpiringSoon", a(&unreturned), ""),
            ("VgpuLeaseNotReturned", a(&unreturned), ""),
            ("VgpuLicenseAgentDown", a(&down), ""),
        ],
        "the stand-in fleet",
    );
    for s in &mut scrapers {
        // The VM that did not opt in is no target; the others are, under the manifests' job.
        let up = s.query("up").unwrap();
        let mut vms: Vec<String> = up
            .iter()
            .map(|(m, _)| {
                assert_eq!(m["job"], "vgpu-license-agent", "{}: {m}", s.name);
                m["vm"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        vms.sort();
        assert_eq!(
            vms,
            [
                "vm-counted",
                "vm-down",
                "vm-failing",
                "vm-no-gpu",
                "vm-passthrough",
                "vm-unreturned"
            ],
            "{}",
            s.name
        );
        for (name, _, ann) in s.firing() {
            assert_runbook(&name, &ann);
        }

        // The dashboard: every query answers, the new series included.
        for (title, expr) in dashboard_queries() {
            let r = s
                .query(&expr)
                .unwrap_or_else(|e| panic!("{}: {title}: {e}", s.name));
            assert!(!r.is_empty(), "{}: {title}: no data for {expr}", s.name);
        }
        let panel = |title: &str| -> Vec<(Value, f64)> {
            let (_, expr) = dashboard_queries()
                .into_iter()
                .find(|(t, _)| t == title)
                .unwrap();
            s.query(&expr).unwrap()
        };
        let by_vm = |title: &str| -> Vec<(String, f64)> {
            let mut v: Vec<_> = panel(title)
                .into_iter()
                .map(|(m, v)| (m["vm"].as_str().unwrap_or_default().to_string(), v))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_eq!(panel("Guests with a vGPU")[0].1, 3.0, "{}", s.name);
        assert_eq!(panel("Not licensed")[0].1, 1.0, "{}", s.name);
        let mut gpus: Vec<(String, String, String)> = panel("GPUs not licensed")
            .into_iter()
            .map(|(m, _)| {
                let l = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                (l("vm"), l("bus_id"), l("profile"))
            })
            .collect();
        gpus.sort();
        let row = |bus: &str| {
            (
                "vm-failing".to_string(),
                bus.to_string(),
                "NVIDIA L40S-24Q".to_string(),
            )
        };
        assert_eq!(
            gpus,
            [row("00000000:02:00.0"), row("00000000:03:00.0")],
            "{}",
            s.name
        );
        let tokens = by_vm("Soonest token expiries");
        let left = tokens
            .iter()
            .find(|(vm, _)| vm == "vm-unreturned")
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{}: {tokens:?}", s.name));
        assert!(
            (left - 3.0 * 86400.0).abs() < 600.0,
            "{}: {tokens:?}",
            s.name
        );
        // Restarts counted before the scrape began count none, on either engine.
        let restarts = by_vm("Most gridd restarts, last hour");
        for (vm, want) in [("vm-counted", 0.0), ("vm-failing", 3.0)] {
            assert!(
                restarts.contains(&(vm.to_string(), want)),
                "{}: {restarts:?}",
                s.name
            );
        }
    }

    // Everything recovers: vm-failing gets its license, vm-unreturned's shutdown and token
    // series vanish, vm-down's agent answers, vm-counted's counters vanish. Every alert
    // resolves on both engines (the failure and restart ones once their window has passed).
    failing_s.state = "licensed";
    failing_s.failure = None;
    failing_s.extra = vec![gpu("00000000:02:00.0", 1), gpu("00000000:03:00.0", 1)];
    failing.set(&failing_s);
    unreturned_s.extra = unreturned_extra[..2].to_vec();
    unreturned.set(&unreturned_s);
    down.set(&Series::new("licensed"));
    counted_s.counted = None;
    counted.set(&counted_s);
    expect_quiet(&mut scrapers, "the fleet recovered");
    for s in &mut scrapers {
        assert_eq!(
            s.value("sum(vgpu_license_licensed)", &[]),
            Some(4.0),
            "{}",
            s.name
        );
        for d in &mut s.daemons {
            d.assert_running();
        }
    }
}
