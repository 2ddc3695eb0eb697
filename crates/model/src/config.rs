//! The agent's settings: all-optional TOML fragments (`config.toml`, then the `config.d/*.toml`
//! drop-ins in name order), merged key by key (later wins), then validated into one typed
//! [`Settings`]. Reading the files, with their ownership checks, is the agent's.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use url::Url;

/// Default location of the main config file.
pub const DEFAULT_CONFIG: &str = "/etc/vgpu-license-agent/config.toml";

/// The validated settings every command works from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub paths: Paths,
    pub commands: Commands,
    pub gridd: Gridd,
    pub service: Service,
    pub kubernetes: Kubernetes,
}

/// The Node condition on a Kubernetes node (`[kubernetes]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Kubernetes {
    pub node_condition: Switch,
    /// A host agent's access to the API: a kubeconfig file (YAML or JSON).
    pub kubeconfig: Option<PathBuf>,
    /// The GPU Operator's licensing Secret (opt-in), read to tell a token gridd does not run
    /// yet: its namespace and name.
    pub licensing_secret: Option<SecretRef>,
    /// The Node to write; default `$NODE_NAME`, else the host name.
    pub node_name: Option<String>,
    /// Where a pod's service account is mounted (token, ca.crt).
    pub service_account_dir: PathBuf,
    /// The condition's `lastHeartbeatTime` is refreshed at least this often.
    pub heartbeat: Duration,
    /// The NoSchedule taint `vgpu-license-agent/unlicensed` while the vGPU is unlicensed or
    /// restricted (opt-in).
    pub taint_unlicensed: bool,
}

/// A Secret's namespace and name (`kubernetes.licensing_secret = "NAMESPACE/NAME"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl SecretRef {
    /// `NAMESPACE/NAME`, each an RFC 1123 name, as the API takes them.
    pub fn parse(v: &str) -> Result<SecretRef, String> {
        let (namespace, name) = v.split_once('/').unwrap_or_default();
        let ns_ok = node_name_problem(namespace).is_none()
            && !namespace.contains('.')
            && namespace.len() <= 63;
        if !ns_ok || node_name_problem(name).is_some() {
            return Err(format!(
                "kubernetes.licensing_secret = {}: expected \"NAMESPACE/NAME\" of the GPU Operator's licensing Secret (driver.licensingConfig.secretName in its namespace, as `kubectl -n gpu-operator get secret` shows it), or \"\" for none",
                shown_value(v)
            ));
        }
        Ok(SecretRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `auto`, `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Paths {
    pub token_dir: PathBuf,
    pub token_file: String,
    pub gridd_conf: PathBuf,
    pub state_dir: PathBuf,
    pub status_file: PathBuf,
    pub metrics_textfile: PathBuf,
    /// nvidia-gridd's client state directories (`prepare-image --purge-client-state` empties
    /// them).
    pub gridd_client_state: Vec<PathBuf>,
    /// A file, or a directory holding one token, that the service watches and installs from
    /// (a Kubernetes Secret shared into the guest, say).
    pub token_source: Option<PathBuf>,
    /// sysfs's PCI devices: no NVIDIA device there is `no_gpu` (nothing to license).
    pub pci_devices: PathBuf,
    /// Where a GPU Operator's driver container shares its root with the node.
    pub driver_root: PathBuf,
}

impl Paths {
    /// Full path of the installed token.
    pub fn token_path(&self) -> PathBuf {
        self.token_dir.join(&self.token_file)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Commands {
    pub nvidia_smi: String,
    pub journalctl: String,
    pub systemctl: String,
    pub restart_gridd: Vec<String>,
    /// Time limit for every command the agent runs.
    pub timeout: Duration,
    /// nvidia-smi is run inside this root (`chroot ROOT nvidia_smi`): a GPU Operator's driver
    /// root, where its libraries are. Not a config key: set where the node is one
    /// (the agent's `node`).
    pub smi_root: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gridd {
    pub feature_type: u8,
    /// `feature_type` was set in a config file (not the default): the service then keeps
    /// gridd.conf at that value; otherwise it leaves a FeatureType already there alone.
    pub feature_type_configured: bool,
    /// nvidia-gridd's systemd unit.
    pub unit: String,
}

/// Thresholds of the long-running service. Defaults suit a real DLS: leases of about a day,
/// renewed by gridd, a grace period of about 15 minutes.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// A lease expiring sooner than this is a warning.
    pub expiry_warning: Duration,
    /// nvidia-smi is read this often while no license is held.
    pub poll_unlicensed: Duration,
    /// ... and at least this often while one is held (gridd's lines, the driver pod's signs
    /// and the lease's expiry ask for their own readings sooner).
    pub poll_licensed: Duration,
    /// Unlicensed this long with a failure a retry can clear: restart nvidia-gridd.
    pub restart_grace: Duration,
    /// First wait between restarts of nvidia-gridd; doubles after each, up to `restart_backoff_max`.
    pub restart_backoff: Duration,
    pub restart_backoff_max: Duration,
    /// At most this many restarts of nvidia-gridd in any hour.
    pub restart_budget_per_hour: u32,
    /// Time limit of each step of a DLS probe (DNS, TCP, TLS, HTTPS).
    pub probe_timeout: Duration,
    /// A guest clock off the DLS's by more than this is a failure (`clock_skew`).
    pub clock_skew_max: Duration,
    /// Optional Unix socket serving the metrics over HTTP (`GET /metrics`).
    pub metrics_socket: Option<PathBuf>,
    /// Optional TCP address serving the metrics (opt-in, e.g. "127.0.0.1:9841").
    pub metrics_listen: Option<String>,
    /// Optional URL the report is POSTed to on every state change (HTTPS, verified).
    pub webhook_url: Option<String>,
    /// The first look at the token directory that no change caused, this long after the
    /// start (later ones follow the watch's interval). Set only by the key
    /// `service.first_token_look_seconds`, which the default config and the man page leave
    /// out: the tests shorten it to see what the watch alone does.
    pub first_token_look: Duration,
    /// Whether the agent manages the token, gridd.conf and gridd, or only observes.
    pub mode: ServiceMode,
    /// Whether this machine is a vGPU guest or the host of vGPU VMs.
    pub role: ServiceRole,
}

/// `service.role`: whose license the agent reports, a guest's own or, on a vGPU host, its
/// VMs'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceRole {
    /// A host where `nvidia-smi -q` shows `Virtualization Mode : Host VGPU` for a GPU, a
    /// guest elsewhere.
    Auto,
    /// A vGPU guest: its own license, gridd and token.
    Guest,
    /// A vGPU host: its VMs' licenses (`nvidia-smi vgpu -q`); nothing is installed,
    /// adopted or restarted.
    Host,
}

impl ServiceRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceRole::Auto => "auto",
            ServiceRole::Guest => "guest",
            ServiceRole::Host => "host",
        }
    }
}

/// `service.mode`: who owns the token, gridd.conf and gridd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceMode {
    /// Observe on a GPU Operator node (the operator owns them), manage elsewhere.
    Auto,
    /// The agent installs the token, edits gridd.conf and restarts gridd (refused on a GPU
    /// Operator node).
    Manage,
    /// The agent only reads.
    Observe,
}

impl ServiceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceMode::Auto => "auto",
            ServiceMode::Manage => "manage",
            ServiceMode::Observe => "observe",
        }
    }
}

impl Default for Kubernetes {
    fn default() -> Self {
        Kubernetes {
            node_condition: Switch::Auto,
            kubeconfig: None,
            licensing_secret: None,
            node_name: None,
            service_account_dir: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            heartbeat: Duration::from_secs(240),
            taint_unlicensed: false,
        }
    }
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            token_dir: "/etc/nvidia/ClientConfigToken".into(),
            token_file: "client_configuration_token.tok".into(),
            gridd_conf: "/etc/nvidia/gridd.conf".into(),
            state_dir: "/var/lib/vgpu-license-agent".into(),
            status_file: "/run/vgpu-license-agent/status.json".into(),
            metrics_textfile: "/var/lib/prometheus/node-exporter/vgpu_license_agent.prom".into(),
            gridd_client_state: vec![
                "/var/lib/nvidia/GridLicensing".into(),
                "/var/lib/nvidia/vGPULicensing".into(),
            ],
            token_source: None,
            pci_devices: "/sys/bus/pci/devices".into(),
            driver_root: "/run/nvidia/driver".into(),
        }
    }
}

impl Default for Commands {
    fn default() -> Self {
        Commands {
            nvidia_smi: "nvidia-smi".into(),
            journalctl: "journalctl".into(),
            systemctl: "systemctl".into(),
            restart_gridd: vec![
                "systemctl".into(),
                "restart".into(),
                "nvidia-gridd.service".into(),
            ],
            timeout: Duration::from_secs(30),
            smi_root: None,
        }
    }
}

impl Default for Gridd {
    fn default() -> Self {
        Gridd {
            feature_type: 1,
            feature_type_configured: false,
            unit: "nvidia-gridd.service".into(),
        }
    }
}

impl Default for Service {
    fn default() -> Self {
        Service {
            expiry_warning: Duration::from_secs(12 * 3600),
            poll_unlicensed: Duration::from_secs(15),
            poll_licensed: Duration::from_secs(3600),
            restart_grace: Duration::from_secs(120),
            restart_backoff: Duration::from_secs(60),
            restart_backoff_max: Duration::from_secs(1800),
            restart_budget_per_hour: 4,
            probe_timeout: Duration::from_secs(5),
            clock_skew_max: Duration::from_secs(60),
            metrics_socket: None,
            metrics_listen: None,
            webhook_url: None,
            first_token_look: Duration::from_secs(30),
            mode: ServiceMode::Auto,
            role: ServiceRole::Auto,
        }
    }
}

/// A config error: which file, and what is wrong in it (one line).
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub message: String,
}

/// A refused value as an error shows it: quoted and escaped, unless it may carry a secret
/// (a URL, credentials), which a misplaced value often is.
pub fn shown_value(v: &str) -> String {
    if v.contains("://") || v.contains('@') || v.contains('?') {
        "(a URL; not shown, it may hold credentials)".into()
    } else {
        format!("\"{}\"", crate::text::escape(v))
    }
}

/// A TOML or type error's message without the value it quotes: a URL there may hold
/// credentials, and a misplaced token is a secret. `invalid type: string "https://u:p@h",
/// expected u64` becomes `invalid type: a string, expected u64`; any other quoted text is cut.
fn without_values(message: &str) -> String {
    for lead in ["invalid type: ", "invalid value: ", "invalid length "] {
        if let Some(rest) = message.strip_prefix(lead) {
            let kind = rest.split([' ', ',', '`', '"']).next().unwrap_or("");
            let expected = rest.rfind(", expected ").map_or("", |i| &rest[i..]);
            return format!("{lead}a {kind}{expected}");
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let expected = rest.find(", expected ").map_or("", |i| &rest[i..]);
        return format!("unknown value{expected}");
    }
    keys_only(message)
}

/// A message with its keys (`unknown field `x``) and punctuation (`expected `"``) named; a
/// quoted string is a value, and so is a "key" that is no key (`"https://u:p@h" = 1`).
fn keys_only(message: &str) -> String {
    let shown = |tick: &str| {
        let key_like = tick.chars().count() <= 1
            || tick
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        format!("`{}`", if key_like { tick } else { "..." })
    };
    let mut out = String::with_capacity(message.len());
    let mut tick: Option<String> = None;
    let mut quoted = false;
    let mut escaped = false;
    for c in message.chars() {
        if let Some(t) = tick.as_mut() {
            if c == '`' {
                out.push_str(&shown(t));
                tick = None;
            } else {
                t.push(c);
            }
        } else if quoted {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    quoted = false;
                    out.push_str("...\"");
                }
                _ => escaped = false,
            }
        } else if c == '`' {
            tick = Some(String::new());
        } else {
            out.push(c);
            quoted = c == '"';
        }
    }
    if let Some(t) = tick {
        out.push_str(&shown(&t));
    }
    if quoted {
        out.push_str("...");
    }
    out
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config {}: {}",
            crate::text::show_path(&self.file),
            crate::text::escape(&self.message)
        )
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fragment {
    #[serde(default)]
    paths: PathsFragment,
    #[serde(default)]
    commands: CommandsFragment,
    #[serde(default)]
    gridd: GriddFragment,
    #[serde(default)]
    service: ServiceFragment,
    #[serde(default)]
    kubernetes: KubernetesFragment,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct KubernetesFragment {
    node_condition: Option<String>,
    kubeconfig: Option<String>,
    licensing_secret: Option<String>,
    node_name: Option<String>,
    taint_unlicensed: Option<bool>,
    service_account_dir: Option<PathBuf>,
    heartbeat_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathsFragment {
    token_dir: Option<PathBuf>,
    token_file: Option<String>,
    gridd_conf: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    status_file: Option<PathBuf>,
    metrics_textfile: Option<PathBuf>,
    gridd_client_state: Option<Vec<PathBuf>>,
    token_source: Option<PathBuf>,
    pci_devices: Option<PathBuf>,
    driver_root: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandsFragment {
    nvidia_smi: Option<String>,
    journalctl: Option<String>,
    systemctl: Option<String>,
    restart_gridd: Option<Vec<String>>,
    timeout_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GriddFragment {
    feature_type: Option<u8>,
    unit: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFragment {
    expiry_warning_hours: Option<u64>,
    poll_unlicensed_seconds: Option<u64>,
    poll_licensed_seconds: Option<u64>,
    restart_grace_seconds: Option<u64>,
    restart_backoff_seconds: Option<u64>,
    restart_backoff_max_seconds: Option<u64>,
    restart_budget_per_hour: Option<u32>,
    probe_timeout_seconds: Option<u64>,
    clock_skew_max_seconds: Option<u64>,
    metrics_socket: Option<PathBuf>,
    metrics_listen: Option<String>,
    webhook_url: Option<String>,
    first_token_look_seconds: Option<u64>,
    mode: Option<String>,
    role: Option<String>,
}

/// A config file larger than this is not one.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// The range of `commands.timeout_seconds` (and of `install --timeout`).
pub const RANGE_TIMEOUT: (u64, u64) = (1, 3600);

/// Every number in the config is checked against a range when it is loaded, so that no
/// value can overflow a time computed from it later (a panic would end the service).
fn in_range(key: &str, v: u64, (min, max): (u64, u64)) -> Result<(), String> {
    if v < min || v > max {
        return Err(format!("{key} = {v}: expected between {min} and {max}"));
    }
    Ok(())
}

macro_rules! merge {
    ($dst:expr, $src:expr, $($field:ident),+) => {
        $( if let Some(v) = $src.$field { $dst.$field = v.into(); } )+
    };
}

/// Sets each duration a fragment gives, once its number (of seconds, or of `unit` seconds)
/// is in its range: `durations!(dst, src, "section.", field = key * unit in (min, max), ...)`.
macro_rules! durations {
    ($dst:expr, $src:expr, $section:literal, $($field:ident = $key:ident * $unit:literal in $range:expr),+ $(,)?) => {
        $( if let Some(v) = $src.$key {
            in_range(concat!($section, stringify!($key)), v, $range)?;
            $dst.$field = Duration::from_secs(v * $unit);
        } )+
    };
}

impl Settings {
    /// Merges one TOML fragment over these settings, or on error (one line: where and what)
    /// leaves them as they were.
    pub fn apply_toml(&mut self, text: &str) -> Result<(), String> {
        let mut next = self.clone();
        next.merge_toml(text)?;
        *self = next;
        Ok(())
    }

    fn merge_toml(&mut self, text: &str) -> Result<(), String> {
        let frag: Fragment = toml::from_str(text).map_err(|e| parse_error(text, &e))?;
        let p = frag.paths;
        merge!(
            self.paths,
            p,
            token_dir,
            token_file,
            gridd_conf,
            state_dir,
            status_file,
            metrics_textfile,
            gridd_client_state,
            token_source,
            pci_devices,
            driver_root
        );
        let c = frag.commands;
        merge!(
            self.commands,
            c,
            nvidia_smi,
            journalctl,
            systemctl,
            restart_gridd
        );
        durations!(self.commands, c, "commands.", timeout = timeout_seconds * 1 in RANGE_TIMEOUT);
        self.gridd.feature_type_configured |= frag.gridd.feature_type.is_some();
        merge!(self.gridd, frag.gridd, feature_type, unit);
        self.service.merge(frag.service)?;
        self.merge_kubernetes(frag.kubernetes)?;
        self.validate()
    }

    fn merge_kubernetes(&mut self, k: KubernetesFragment) -> Result<(), String> {
        let kube = &mut self.kubernetes;
        if let Some(v) = k.node_condition {
            kube.node_condition = match v.as_str() {
                "auto" => Switch::Auto,
                "on" => Switch::On,
                "off" => Switch::Off,
                _ => {
                    return Err(format!(
                        "kubernetes.node_condition = {}: expected \"auto\" (on when running in a pod with a service account), \"on\" or \"off\"",
                        shown_value(&v)
                    ));
                }
            };
        }
        if let Some(v) = k.kubeconfig {
            kube.kubeconfig = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        if let Some(v) = k.licensing_secret {
            kube.licensing_secret = (!v.is_empty()).then(|| SecretRef::parse(&v)).transpose()?;
        }
        if let Some(v) = k.node_name {
            if let Some(why) = node_name_problem(&v).filter(|_| !v.is_empty()) {
                return Err(format!(
                    "kubernetes.node_name {why}; set it to the Node's name as `kubectl get nodes` shows it, or leave it unset for $NODE_NAME"
                ));
            }
            kube.node_name = (!v.is_empty()).then_some(v);
        }
        if let Some(d) = k.service_account_dir {
            kube.service_account_dir = d;
        }
        durations!(kube, k, "kubernetes.", heartbeat = heartbeat_seconds * 1 in (5, 300));
        if let Some(t) = k.taint_unlicensed {
            kube.taint_unlicensed = t;
        }
        Ok(())
    }

    /// Checks the settings as a whole: each value in its range, paths absolute, no output
    /// over what the agent manages.
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.gridd.feature_type, 0 | 1 | 2 | 4) {
            return Err(format!(
                "gridd.feature_type = {}: expected 0 (unlicensed), 1 (NVIDIA vGPU), 2 (RTX Virtual Workstation) or 4 (Virtual Compute Server)",
                self.gridd.feature_type
            ));
        }
        if self.commands.restart_gridd.is_empty() || self.commands.restart_gridd[0].is_empty() {
            return Err(
                "commands.restart_gridd: expected a command and its arguments, e.g. [\"systemctl\", \"restart\", \"nvidia-gridd.service\"]"
                    .into(),
            );
        }
        self.service.validate()?;
        if self.commands.timeout.is_zero() {
            return Err("commands.timeout_seconds: expected at least 1".into());
        }
        self.paths.validate()?;
        self.check_output_overlap()
    }

    /// The files the agent writes (`paths.status_file`, `paths.metrics_textfile`,
    /// `service.metrics_socket`) never are, or lie inside, what it manages or reads: the
    /// token directory, the token source, gridd.conf, its state directory. Written there, a
    /// report would overwrite gridd.conf or the token, or be adopted as a stray and moved aside
    /// again and again.
    fn check_output_overlap(&self) -> Result<(), String> {
        let p = &self.paths;
        let mut managed: Vec<(&str, &Path, bool)> = vec![
            ("paths.token_dir", &p.token_dir, true),
            ("paths.gridd_conf", &p.gridd_conf, false),
            ("paths.state_dir", &p.state_dir, true),
        ];
        if let Some(src) = &p.token_source {
            managed.push(("paths.token_source", src, true));
        }
        let mut outputs: Vec<(&str, &Path)> = vec![
            ("paths.status_file", &p.status_file),
            ("paths.metrics_textfile", &p.metrics_textfile),
        ];
        if let Some(sock) = &self.service.metrics_socket {
            outputs.push(("service.metrics_socket", sock));
        }
        for (i, (key, out)) in outputs.iter().enumerate() {
            let out = normalize(out);
            for (mkey, m, is_dir) in &managed {
                let m = normalize(m);
                if out == m || (*is_dir && out.starts_with(&m)) {
                    return Err(format!(
                        "{key} = {}: {} {mkey}, which the agent manages; its output there would overwrite what is there or be taken for a stray: choose a path of its own (the default is {})",
                        shown_value(&out.to_string_lossy()),
                        if out == m {
                            "the same path as"
                        } else {
                            "inside"
                        },
                        default_output(key)
                    ));
                }
            }
            for (other_key, other) in &outputs[i + 1..] {
                if out == normalize(other) {
                    return Err(format!(
                        "{key} and {other_key} are the same file: give each its own path"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A path without `.` components, trailing slashes or repeated `/` (no link is resolved: the
/// paths may not exist yet).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

impl Service {
    /// Merges `[service]` over these settings.
    fn merge(&mut self, sv: ServiceFragment) -> Result<(), String> {
        durations!(
            self,
            sv,
            "service.",
            expiry_warning = expiry_warning_hours * 3600 in (0, 24 * 365),
            poll_unlicensed = poll_unlicensed_seconds * 1 in (1, 3600),
            poll_licensed = poll_licensed_seconds * 1 in (1, 86_400),
            restart_grace = restart_grace_seconds * 1 in (0, 3600),
            restart_backoff = restart_backoff_seconds * 1 in (1, 86_400),
            restart_backoff_max = restart_backoff_max_seconds * 1 in (1, 7 * 86_400),
            probe_timeout = probe_timeout_seconds * 1 in (1, 300),
            clock_skew_max = clock_skew_max_seconds * 1 in (1, 86_400),
            first_token_look = first_token_look_seconds * 1 in (1, 3600),
        );
        if let Some(n) = sv.restart_budget_per_hour {
            in_range("service.restart_budget_per_hour", u64::from(n), (0, 60))?;
            self.restart_budget_per_hour = n;
        }
        merge!(self, sv, metrics_socket, metrics_listen, webhook_url);
        if let Some(m) = sv.mode {
            self.mode = match m.as_str() {
                "auto" => ServiceMode::Auto,
                "manage" => ServiceMode::Manage,
                "observe" => ServiceMode::Observe,
                _ => {
                    return Err(format!(
                        "service.mode = {}: expected \"auto\" (observe on a GPU Operator node, manage elsewhere), \"manage\" or \"observe\"",
                        shown_value(&m)
                    ));
                }
            };
        }
        if let Some(r) = sv.role {
            self.role = match r.as_str() {
                "auto" => ServiceRole::Auto,
                "guest" => ServiceRole::Guest,
                "host" => ServiceRole::Host,
                _ => {
                    return Err(format!(
                        "service.role = {}: expected \"auto\" (a host where nvidia-smi -q shows Virtualization Mode : Host VGPU, a guest elsewhere), \"guest\" or \"host\"",
                        shown_value(&r)
                    ));
                }
            };
        }
        Ok(())
    }

    /// The checks of `[service]` that the ranges do not make.
    fn validate(&self) -> Result<(), String> {
        for (key, d) in [
            ("service.poll_unlicensed_seconds", self.poll_unlicensed),
            ("service.poll_licensed_seconds", self.poll_licensed),
            ("service.restart_backoff_seconds", self.restart_backoff),
            ("service.probe_timeout_seconds", self.probe_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{key}: expected at least 1"));
            }
        }
        if self.restart_backoff_max < self.restart_backoff {
            return Err(
                "service.restart_backoff_max_seconds: expected at least restart_backoff_seconds"
                    .into(),
            );
        }
        if let Some(addr) = &self.metrics_listen
            && listen_address(addr).is_none()
        {
            return Err(format!(
                "service.metrics_listen = {}: expected an address and port, e.g. \"127.0.0.1:9841\", or \":9841\" for every address",
                shown_value(addr)
            ));
        }
        if let Some(url) = &self.webhook_url {
            // The value is not shown: a webhook URL often carries its credentials.
            webhook_url(url)?;
        }
        Ok(())
    }
}

impl Paths {
    /// `[paths]`: a token file name, absolute paths, a token source outside the token
    /// directory.
    fn validate(&self) -> Result<(), String> {
        let f = &self.token_file;
        if f.is_empty() || f.contains('/') || f == "." || f == ".." {
            return Err(format!(
                "paths.token_file = {}: expected a file name without '/'",
                shown_value(f)
            ));
        }
        for (key, p) in [
            ("paths.token_dir", &self.token_dir),
            ("paths.gridd_conf", &self.gridd_conf),
            ("paths.state_dir", &self.state_dir),
            ("paths.status_file", &self.status_file),
            ("paths.metrics_textfile", &self.metrics_textfile),
            ("paths.pci_devices", &self.pci_devices),
        ] {
            if !p.is_absolute() {
                return Err(format!(
                    "{key} = {}: expected an absolute path",
                    shown_value(&p.to_string_lossy())
                ));
            }
        }
        if let Some(p) = &self.token_source
            && (!p.is_absolute() || p.starts_with(&self.token_dir))
        {
            return Err(format!(
                "paths.token_source = {}: expected an absolute path outside paths.token_dir (the file or directory the token comes from, e.g. a mounted Kubernetes Secret)",
                shown_value(&p.to_string_lossy())
            ));
        }
        for p in &self.gridd_client_state {
            if !p.is_absolute() || p.parent().is_none() {
                return Err(format!(
                    "paths.gridd_client_state: {}: expected absolute paths of directories below /",
                    shown_value(&p.to_string_lossy())
                ));
            }
        }
        Ok(())
    }
}

/// A TOML error as one line: the line number and its key (a name says more than a number;
/// the value is left out, a URL in it may hold credentials), and what is wrong.
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let line = e
        .span()
        .map(|s| {
            let n = text[..s.start].matches('\n').count();
            let line = text.lines().nth(n).unwrap_or("");
            let shown = line.split('=').next().unwrap_or("").trim();
            let key_like = shown
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.[] \"'".contains(c));
            if shown.is_empty() || shown.len() > 120 || !key_like {
                format!("line {}: ", n + 1)
            } else {
                format!("line {} ({shown}): ", n + 1)
            }
        })
        .unwrap_or_default();
    format!("{line}{}", without_values(&e.message().replace('\n', " ")))
}

fn default_output(key: &str) -> &'static str {
    match key {
        "paths.status_file" => "/run/vgpu-license-agent/status.json",
        "paths.metrics_textfile" => "/var/lib/prometheus/node-exporter/vgpu_license_agent.prom",
        _ => "unset",
    }
}

/// Whether `url` goes to this machine: its host, as parsed (not as written: `localhost@host`
/// and `127.0.0.1.host` name `host`), is a loopback address (127.0.0.0/8, ::1) or exactly
/// `localhost`.
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    }
}

/// The rule for every URL the agent sends to (`--token-url`, its redirects, the webhook):
/// HTTPS, or plain HTTP only to the loopback (a local proxy or relay), judged by the URL's
/// parsed host.
pub fn allowed(url: &Url) -> bool {
    url.scheme() == "https" || (url.scheme() == "http" && is_loopback(url))
}

/// `service.webhook_url` judged by [`allowed`], at config load and before each POST: the
/// report it carries names the guest. The message never shows the URL, which often holds
/// credentials.
pub fn webhook_url(url: &str) -> Result<Url, String> {
    let parsed = Url::parse(url.trim())
        .map_err(|_| "service.webhook_url is not a URL; give an https:// URL".to_string())?;
    if !allowed(&parsed) {
        return Err(
            "service.webhook_url: expected an https:// URL (plain http only to a loopback address: 127.0.0.0/8, ::1 or localhost)"
                .into(),
        );
    }
    Ok(parsed)
}

/// Where `metrics_listen` asks to listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// `:PORT`: every address of the guest, as node_exporter's `:9100`.
    Any(u16),
    /// `ADDRESS:PORT` (`[ADDRESS]:PORT` for IPv6).
    At(std::net::SocketAddr),
}

/// `metrics_listen`'s value, or `None` when it is neither `ADDRESS:PORT` nor `:PORT`.
pub fn listen_address(value: &str) -> Option<Listen> {
    match value.strip_prefix(':') {
        Some(port) if port.bytes().all(|b| b.is_ascii_digit()) => {
            port.parse().ok().map(Listen::Any)
        }
        Some(_) => None,
        None => value.parse().ok().map(Listen::At),
    }
}

/// Why `name` cannot be a Node's name (a phrase after the name, which it does not repeat:
/// a config value may be a secret put in the wrong key), or `None` where it can: a Node's name is an RFC 1123
/// subdomain (as the API server checks it): at most 253 characters, dot-separated labels of
/// lower-case letters, digits and `-`, each starting and ending with a letter or digit. A
/// name such as `..` or `status` would otherwise make another URL of the API.
pub fn node_name_problem(name: &str) -> Option<String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        return None;
    }
    Some(
        "is not a Kubernetes node name (an RFC 1123 subdomain: lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit, at most 253 characters)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value in the wrong place (a URL with credentials, a token) is never quoted back:
    /// whatever TOML or the types say about it, the error names the line and the key.
    #[test]
    fn type_and_syntax_errors_never_quote_the_value() {
        let secret = "https://user:hunter2@dls.example/?key=s3cr3t";
        for text in [
            format!("[service]\npoll_unlicensed_seconds = \"{secret}\"\n"),
            format!("[gridd]\nfeature_type = \"{secret}\"\n"),
            format!("[paths]\ntoken_dir = [\"{secret}\"]\n"),
            format!("\"{secret}\" = 1\n"),
            format!("[service]\nwebhook_url = {{ u = \"{secret}\" }}\n"),
            format!("[service]\npoll_unlicensed_seconds = \"{secret}\n"),
            format!("[service]\nrestart_budget_per_hour = -1 # {secret}\n"),
        ] {
            let err = Settings::default().apply_toml(&text).unwrap_err();
            assert!(
                !err.contains("hunter2") && !err.contains("s3cr3t"),
                "{text:?} -> {err}"
            );
            assert!(err.starts_with("line "), "{err}");
        }
        // What helps is still there: the key, the type expected, the keys known.
        let err = Settings::default()
            .apply_toml("[service]\npoll_unlicensed_seconds = \"x\"\n")
            .unwrap_err();
        assert_eq!(
            err,
            "line 2 (poll_unlicensed_seconds): invalid type: a string, expected u64"
        );
        let err = Settings::default().apply_toml("timeout = 1\n").unwrap_err();
        assert!(err.contains("unknown field `timeout`"), "{err}");
        assert!(err.contains("`service`"), "{err}");
    }

    #[test]
    fn the_role_is_auto_guest_or_host() {
        assert_eq!(Settings::default().service.role, ServiceRole::Auto);
        for (text, role) in [
            ("auto", ServiceRole::Auto),
            ("guest", ServiceRole::Guest),
            ("host", ServiceRole::Host),
        ] {
            let mut s = Settings::default();
            s.apply_toml(&format!("[service]\nrole = \"{text}\"\n"))
                .unwrap();
            assert_eq!((s.service.role, s.service.role.as_str()), (role, text));
        }
        let e = Settings::default()
            .apply_toml("[service]\nrole = \"hypervisor\"\n")
            .unwrap_err();
        assert!(
            e.contains("service.role = \"hypervisor\"") && e.contains("\"guest\" or \"host\""),
            "{e}"
        );
    }

    #[test]
    fn later_fragments_win_key_by_key() {
        let mut s = Settings::default();
        s.apply_toml("[paths]\ntoken_dir = \"/a\"\n[gridd]\nfeature_type = 4\n")
            .unwrap();
        s.apply_toml("[paths]\ngridd_conf = \"/b.conf\"\n").unwrap();
        assert_eq!(s.paths.token_dir, PathBuf::from("/a"));
        assert_eq!(s.paths.gridd_conf, PathBuf::from("/b.conf"));
        assert_eq!(s.gridd.feature_type, 4);
        assert_eq!(s.commands.nvidia_smi, "nvidia-smi");
    }

    #[test]
    fn errors_name_the_key_and_what_is_expected() {
        let mut s = Settings::default();
        let e = s.apply_toml("[paths]\ntoken_dri = \"/a\"\n").unwrap_err();
        assert!(e.contains("token_dri") && e.contains("line 2"), "{e}");
        let e = s.apply_toml("[gridd]\nfeature_type = 3\n").unwrap_err();
        assert!(
            e.contains("gridd.feature_type") && e.contains("expected"),
            "{e}"
        );
        let e = s
            .apply_toml("[gridd]\nfeature_type = \"one\"\n")
            .unwrap_err();
        assert!(e.contains("line 2") && !e.contains('\n'), "{e}");
        let e = s.apply_toml("[paths]\nstate_dir = \"rel\"\n").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let mut s = Settings::default();
        let e = s
            .apply_toml("[paths]\ngridd_client_state = [\"/\"]\n")
            .unwrap_err();
        assert!(e.contains("gridd_client_state"), "{e}");
        s.apply_toml("[paths]\ngridd_client_state = [\"/x/GridLicensing\"]\n")
            .unwrap();
        assert_eq!(
            s.paths.gridd_client_state,
            vec![PathBuf::from("/x/GridLicensing")]
        );
    }

    /// An output path that is, or lies inside, what the agent manages is refused, with the
    /// key and the clash named: written there, a report would overwrite gridd.conf or the
    /// token, or be adopted as a stray again and again.
    #[test]
    fn outputs_never_overlap_what_the_agent_manages() {
        for (text, key, clash) in [
            (
                "[paths]\nstatus_file = \"/etc/nvidia/gridd.conf\"\n",
                "paths.status_file",
                "same path as paths.gridd_conf",
            ),
            (
                "[paths]\nstatus_file = \"/etc/nvidia/ClientConfigToken/status.tok\"\n",
                "paths.status_file",
                "inside paths.token_dir",
            ),
            (
                "[paths]\nmetrics_textfile = \"/etc/nvidia/ClientConfigToken/./x.prom\"\n",
                "paths.metrics_textfile",
                "inside paths.token_dir",
            ),
            (
                "[paths]\nstatus_file = \"/var/lib/vgpu-license-agent/status.json\"\n",
                "paths.status_file",
                "inside paths.state_dir",
            ),
            (
                "[service]\nmetrics_socket = \"/etc/nvidia/gridd.conf\"\n",
                "service.metrics_socket",
                "same path as paths.gridd_conf",
            ),
            (
                "[paths]\ntoken_source = \"/run/secret\"\nstatus_file = \"/run/secret/token\"\n",
                "paths.status_file",
                "inside paths.token_source",
            ),
            (
                "[paths]\nmetrics_textfile = \"/run/vgpu-license-agent/status.json\"\n",
                "paths.status_file and paths.metrics_textfile",
                "same file",
            ),
        ] {
            let mut s = Settings::default();
            let e = s.apply_toml(text).unwrap_err();
            assert!(e.contains(key) && e.contains(clash), "{text}: {e}");
            assert_eq!(s, Settings::default(), "a refused fragment changes nothing");
        }
    }
}
