//! What the simulator's programs share: the simulated machine's settings (`sim.json`), the
//! GPU's license state (`state.json`, written by the simulated nvidia-gridd, read by the
//! simulated nvidia-smi), gridd's pid file, the restart counter, syslog output, and starting
//! and stopping the simulated gridd.
//!
//! Everything lives in one directory, the sim dir: `--sim-dir DIR`, else `$SIM_DIR`, else
//! `/var/lib/vgpu-sim` (the boot test's guest, where the agent's unit sets no variable).
//!
//! Only the GPU, the driver's tools and a DLS are simulated: journald, journalctl and the
//! network (loopback TLS) are the real ones. Nothing here comes from the agent's code: the
//! token is judged by the simulator's own reading of its format (`jws.rs`), the edition by the
//! driver's rule as domain.md states it, so that the agent and the simulator cannot share a
//! mistake.

#![allow(dead_code)]

use std::fs;
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::{Deserialize, Serialize};

pub const DEFAULT_SIM_DIR: &str = "/var/lib/vgpu-sim";
pub const CONFIG_FILE: &str = "sim.json";
pub const STATE_FILE: &str = "state.json";
pub const PID_FILE: &str = "gridd.pid";
pub const RESTARTS_FILE: &str = "restarts";
/// While a restart runs: the phase systemd's unit is in ("deactivating", "queued", then
/// "activating").
pub const RESTARTING_FILE: &str = "gridd.restarting";

/// The unit's ActiveState as systemd gives it: a restart passes through `deactivating`
/// (the old process stopping), `inactive` with the restart's start job queued (`queued`; see
/// [`start_job`]) and `activating` (the new one starting); otherwise the unit is `active`
/// while gridd runs.
pub fn unit_state(dir: &Path) -> &'static str {
    let phase = fs::read_to_string(dir.join(RESTARTING_FILE)).unwrap_or_default();
    match (phase.trim(), running_gridd(dir)) {
        ("deactivating", _) => "deactivating",
        (_, Some(_)) => "active",
        ("activating", None) => "activating",
        _ => "inactive",
    }
}

/// The job systemd holds for the unit during a restart, as `systemctl list-jobs` names it:
/// the restart's own (`restart`) until its stop is done, a `start` job after.
pub fn start_job(dir: &Path) -> Option<&'static str> {
    let phase = fs::read_to_string(dir.join(RESTARTING_FILE)).unwrap_or_default();
    match phase.trim() {
        "deactivating" => Some("restart"),
        "queued" | "activating" => Some("start"),
        _ => None,
    }
}
pub const GRIDD_LOG: &str = "gridd.log";
pub const GRIDD_OUT: &str = "gridd.out";
pub const GRIDD_BIN: &str = "sim-nvidia-gridd";

/// How the simulated nvidia-smi behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmiMode {
    /// Prints the GPU as the state file says.
    Normal,
    /// Never answers (a wedged driver): the agent's time limit must kill it.
    Hang,
    /// Fails as with no driver loaded (exit 9).
    NoDriver,
    /// Leaves a process in a session of its own holding its output open (its pid appended
    /// to `holders` in the sim dir), then prints as `normal` and exits.
    DetachedHolder,
    /// Prints its output again and again, never ending (its pid in `smi.pid`).
    Endless,
}

/// What gridd logs when it cannot reach the DLS: the real wording is not known (no sample
/// shows a network failure; see `gridd_lines.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkFailure {
    /// `Failed to acquire license from <host> (Info: <edition> - Error: Generic network
    /// communication failure)`: the form real failure lines carry.
    Full,
    /// `Failed to acquire license from <host>`, nothing more.
    Bare,
}

/// The simulated machine (`sim.json` in the sim dir). Every field has a default; `SIM_<FIELD>`
/// in the environment overrides the file (value as JSON, or as a plain string).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// The token directory gridd reads (every regular file in it but dot files).
    pub token_dir: PathBuf,
    /// gridd.conf, only to log what gridd logs about it.
    pub gridd_conf: PathBuf,
    /// The vGPU profile as nvidia-smi prints it.
    pub profile: String,
    pub bus_id: String,
    /// A passthrough GPU with the data-center driver: nothing to license.
    pub passthrough: bool,
    /// Length of a lease the fake DLS grants.
    pub lease_seconds: u64,
    /// gridd renews after this fraction of the lease.
    pub renew_fraction: f64,
    /// How often gridd looks at the token directory again and retries a failed acquisition.
    pub retry_seconds: f64,
    /// Whether gridd retries a failed acquisition by itself; `false` models the gridd that
    /// started before the network and waits for a restart.
    pub acquire_retry: bool,
    /// Whether gridd notices a token that appeared after its start without a restart.
    pub pickup_new_token: bool,
    /// A DLS `Date` further than this from the guest clock fails with clock windback. How far
    /// the real gridd tolerates is not known (domain.md names clock skew as the most common
    /// failure, without a figure): a minute here, and the tests use skews of an hour.
    pub skew_tolerance_seconds: i64,
    /// Unlicensed this long: nvidia-smi says `Unlicensed (Restricted)`.
    pub grace_seconds: u64,
    pub smi_mode: SmiMode,
    /// gridd returns its license when stopped (nvidia-smi then says unlicensed).
    pub return_on_shutdown: bool,
    /// Time limit of gridd's TCP connect and TLS exchange with the DLS.
    pub network_timeout_ms: u64,
    /// How long gridd lingers after its last line before exiting, so that journald still
    /// finds the process to record `_COMM` from.
    pub exit_linger_ms: u64,
    /// Also print gridd's lines on standard error (they always go to syslog when it answers).
    pub echo: bool,
    /// The guest driver's version, as nvidia-smi prints it: what gridd logs at start and how
    /// nvidia-smi words an unlicensed GPU follow it (see `unlicensed_wording`).
    pub driver_version: String,
    /// How gridd words a failure to reach the DLS.
    pub network_failure: NetworkFailure,
    /// How many vGPUs the VM has (nvidia-smi lists each, each with its own license section).
    pub gpu_count: u32,
    /// The profiles of the vGPUs, first to last, where they differ (a MIG-backed slice beside
    /// a whole-card profile); a vGPU past the list's end has `profile`.
    pub gpu_profiles: Vec<String>,
    /// The vGPUs (by index, from 0) gridd holds no license for, as when the DLS has none of
    /// their edition: nvidia-smi shows them unlicensed (restricted after `grace_seconds`),
    /// whatever the others hold.
    pub unlicensed_gpus: Vec<u32>,
    /// A cloud GPU instance whose platform licenses the GPU: gridd never leases, nvidia-smi
    /// says `Licensed (Expiry: N/A)`.
    pub platform_licensed: bool,
    /// Whether systemd has `nvidia-gridd.service` (the driver installed brings it); without
    /// it `systemctl` answers for it as for any unit it does not know.
    pub gridd_unit: bool,
    /// How long a restart's start job waits queued, behind the units it is ordered after.
    pub restart_queued_ms: u64,
    /// A vGPU host (the vGPU manager's driver): `nvidia-smi -q` shows `Virtualization Mode :
    /// Host VGPU` and no license of its own, `nvidia-smi vgpu -q` lists the VMs of `vms.json`
    /// (see [`SimVm`]); no gridd runs there.
    pub host: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            token_dir: "/etc/nvidia/ClientConfigToken".into(),
            gridd_conf: "/etc/nvidia/gridd.conf".into(),
            profile: "NVIDIA L40S-24Q".into(),
            bus_id: "00000000:02:01.0".into(),
            passthrough: false,
            lease_seconds: 86400,
            renew_fraction: 0.2,
            retry_seconds: 5.0,
            acquire_retry: true,
            pickup_new_token: true,
            skew_tolerance_seconds: 60,
            grace_seconds: 1200,
            smi_mode: SmiMode::Normal,
            return_on_shutdown: true,
            network_timeout_ms: 3000,
            exit_linger_ms: 300,
            echo: false,
            driver_version: "550.90.07".into(),
            network_failure: NetworkFailure::Full,
            gpu_count: 1,
            gpu_profiles: Vec::new(),
            unlicensed_gpus: Vec::new(),
            platform_licensed: false,
            gridd_unit: true,
            restart_queued_ms: 300,
            host: false,
        }
    }
}

impl SimConfig {
    /// The edition the profile asks for: the driver's rule (domain.md, "Profile letter and
    /// edition"), the profile's last letter.
    pub fn edition(&self) -> String {
        edition_of(&self.profile)
    }

    /// The `i`th vGPU's profile.
    pub fn gpu_profile(&self, i: u32) -> &str {
        self.gpu_profiles
            .get(i as usize)
            .map_or(&self.profile, String::as_str)
    }

    /// The driver's major version (550 of `550.90.07`).
    pub fn driver_major(&self) -> u32 {
        self.driver_version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// What nvidia-smi says of a GPU without a license within its grace period: driver 535
    /// says plain `Unlicensed` (smi-cudaerror4vgpu-1.txt, 535.183.06), driver 510
    /// `Unlicensed (Unrestricted)` (smi-jp-dls-guide-1.txt, 510.47.03). No sample shows what
    /// 550 says: the simulator keeps 510's wording there.
    pub fn unlicensed_wording(&self) -> &'static str {
        if self.driver_major() == 535 {
            "Unlicensed"
        } else {
            "Unlicensed (Unrestricted)"
        }
    }

    pub fn load(dir: &Path) -> SimConfig {
        let mut value = match fs::read(dir.join(CONFIG_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                eprintln!("sim: {}: {e}", dir.join(CONFIG_FILE).display());
                serde_json::Value::Object(Default::default())
            }),
            Err(_) => serde_json::Value::Object(Default::default()),
        };
        let keys: Vec<String> = match serde_json::to_value(SimConfig::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        };
        if let serde_json::Value::Object(map) = &mut value {
            for key in keys {
                if let Ok(v) = std::env::var(format!("SIM_{}", key.to_ascii_uppercase())) {
                    let parsed = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
                    map.insert(key, parsed);
                }
            }
        }
        serde_json::from_value(value).unwrap_or_else(|e| {
            eprintln!("sim: bad settings in {}: {e}", dir.display());
            SimConfig::default()
        })
    }

    pub fn save(&self, dir: &Path) -> io::Result<()> {
        write_atomic(
            &dir.join(CONFIG_FILE),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )
    }
}

pub const VMS_FILE: &str = "vms.json";

/// Where a VM's guest is, as the host's vGPU manager sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmPhase {
    /// The VM runs and its guest driver has not loaded (`Guest Driver Version : N/A`).
    Booting,
    /// The guest driver runs without a license, within its grace period.
    Unlicensed,
    Licensed,
    /// The guest driver runs without a license, throttled.
    Restricted,
}

/// One VM's vGPU on a simulated host (`vms.json`, a list, in the order `vgpu -q` prints it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimVm {
    pub vgpu_id: String,
    pub vm_uuid: String,
    pub vm_name: String,
    pub vgpu_uuid: String,
    pub profile: String,
    pub phase: VmPhase,
    /// The guest driver's version, once it loads.
    pub guest_driver: String,
    /// Unix time the guest's lease ends, while licensed.
    pub expiry: Option<i64>,
}

impl SimVm {
    pub fn load_all(dir: &Path) -> Vec<SimVm> {
        fs::read(dir.join(VMS_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    pub fn save_all(dir: &Path, vms: &[SimVm]) -> io::Result<()> {
        write_atomic(&dir.join(VMS_FILE), serde_json::to_string(vms)?.as_bytes())
    }

    /// `Guest Driver Version` and `License Status` as the host's `nvidia-smi vgpu -q` prints
    /// them (smi-host-vgpu-q-*.txt: `N/A` and `N/A (Expiry: N/A)` before the guest driver
    /// loads; the guest's own wording after).
    pub fn guest_columns(&self) -> (String, String) {
        let driver = self.guest_driver.clone();
        match self.phase {
            VmPhase::Booting => ("N/A".into(), "N/A (Expiry: N/A)".into()),
            VmPhase::Unlicensed => (driver, "Unlicensed (Unrestricted)".into()),
            VmPhase::Restricted => (driver, "Unlicensed (Restricted)".into()),
            VmPhase::Licensed => {
                let exp = self
                    .expiry
                    .and_then(|e| DateTime::from_timestamp(e, 0))
                    .map_or("N/A".to_string(), gmt);
                (driver, format!("Licensed (Expiry: {exp})"))
            }
        }
    }
}

/// The GPU's license as the driver holds it (`state.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct GpuState {
    pub licensed: bool,
    /// Unix time the lease ends.
    pub expiry: Option<i64>,
    pub edition: Option<String>,
    pub server: Option<String>,
    /// Unix time since which no license is held (the grace period counts from it).
    pub unlicensed_since: i64,
}

impl GpuState {
    pub fn load(dir: &Path) -> Option<GpuState> {
        serde_json::from_slice(&fs::read(dir.join(STATE_FILE)).ok()?).ok()
    }

    pub fn save(&self, dir: &Path) -> io::Result<()> {
        write_atomic(
            &dir.join(STATE_FILE),
            serde_json::to_string(self)?.as_bytes(),
        )
    }

    /// `License Status` as nvidia-smi prints it at `now`.
    pub fn license_status(&self, cfg: &SimConfig, now: i64) -> String {
        if cfg.platform_licensed {
            // DCGM's strings (smi-dcgm-license-strings.txt) compose `Licensed` with the expiry
            // `N/A`.
            return "Licensed (Expiry: N/A)".into();
        }
        match self.expiry {
            // The legacy license server's license: no expiry. NVML's state string alone
            // (smi-dcgm-license-strings.txt lists plain `Licensed`; domain.md too).
            None if self.licensed => "Licensed".into(),
            Some(exp) if self.licensed && exp > now => {
                let t = DateTime::from_timestamp(exp, 0).unwrap_or_default();
                format!("Licensed (Expiry: {})", gmt(t))
            }
            _ => {
                let since = match self.expiry {
                    Some(exp) if self.licensed => exp,
                    _ => self.unlicensed_since,
                };
                if now.saturating_sub(since) >= cfg.grace_seconds as i64 {
                    "Unlicensed (Restricted)".into()
                } else {
                    cfg.unlicensed_wording().into()
                }
            }
        }
    }
}

/// The edition a profile asks for: the driver's rule (domain.md, "Profile letter and
/// edition"), the profile's last letter.
pub fn edition_of(profile: &str) -> String {
    let name = profile.split_whitespace().last().unwrap_or_default();
    match name.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('Q') => "NVIDIA RTX Virtual Workstation",
        Some('A') => "NVIDIA Virtual Applications",
        Some('C') => "NVIDIA Virtual Compute Server",
        _ => "NVIDIA Virtual PC",
    }
    .to_string()
}

/// `2026-12-1 7:3:9 GMT`: gridd's and nvidia-smi's format, no zero padding.
pub fn gmt(t: DateTime<Utc>) -> String {
    format!(
        "{}-{}-{} {}:{}:{} GMT",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// An HTTP `Date`: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(t: DateTime<Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// Writes a file by rename, so that readers never see half of it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)
}

/// The sim dir from `--sim-dir DIR` in `args` (removed from them), else `$SIM_DIR`, else the
/// default.
pub fn sim_dir(args: &mut Vec<String>) -> PathBuf {
    if let Some(i) = args.iter().position(|a| a == "--sim-dir")
        && i + 1 < args.len()
    {
        let dir = args.remove(i + 1);
        args.remove(i);
        return dir.into();
    }
    std::env::var_os("SIM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_SIM_DIR.into())
}

/// Lines to journald as syslog datagrams: `<PRI>nvidia-gridd[PID]: message`, so that journald
/// records `SYSLOG_IDENTIFIER=nvidia-gridd` and, from the sender's process, `_COMM`.
pub struct Syslog {
    ident: String,
    pid: u32,
    socket: Option<(std::os::unix::net::UnixDatagram, PathBuf)>,
    echo: bool,
    log_file: Option<PathBuf>,
}

/// Severities of syslog(3).
pub const ERR: u8 = 3;
pub const WARNING: u8 = 4;
pub const INFO: u8 = 6;

impl Syslog {
    pub fn new(ident: &str, echo: bool, log_file: Option<PathBuf>) -> Syslog {
        let target = std::env::var_os("SIM_SYSLOG_SOCKET")
            .map(PathBuf::from)
            .into_iter()
            .chain(["/run/systemd/journal/dev-log".into(), "/dev/log".into()])
            .find(|p: &PathBuf| p.exists());
        let socket = target.and_then(|t| {
            std::os::unix::net::UnixDatagram::unbound()
                .ok()
                .map(|s| (s, t))
        });
        Syslog {
            ident: ident.into(),
            pid: std::process::id(),
            socket,
            echo,
            log_file,
        }
    }

    pub fn log(&self, severity: u8, msg: &str) {
        // LOG_DAEMON is facility 3.
        let line = format!(
            "<{}>{}[{}]: {}",
            3 * 8 + severity,
            self.ident,
            self.pid,
            msg
        );
        let sent = self
            .socket
            .as_ref()
            .is_some_and(|(s, t)| s.send_to(line.as_bytes(), t).is_ok());
        if self.echo || !sent {
            eprintln!("{}[{}]: {}", self.ident, self.pid, msg);
        }
        if let Some(f) = &self.log_file
            && let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(f)
        {
            let _ = writeln!(
                f,
                "{} {}[{}]: {}",
                Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ"),
                self.ident,
                self.pid,
                msg
            );
        }
    }
}

/// `/proc/PID/stat`'s state letter and comm, when the process exists.
fn proc_stat(pid: i32) -> Option<(char, String)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_string();
    let state = stat[close + 1..].trim_start().chars().next()?;
    Some((state, comm))
}

/// Whether `pid` is a live (not zombie) simulated gridd.
pub fn gridd_alive(pid: i32) -> bool {
    matches!(proc_stat(pid), Some((s, comm)) if s != 'Z' && s != 'X' && comm == "nvidia-gridd")
}

/// The pid of the running simulated gridd, if one runs.
pub fn running_gridd(dir: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    gridd_alive(pid).then_some(pid)
}

/// The simulated gridd's binary: `$SIM_GRIDD_BIN`, else `sim-nvidia-gridd` next to this one.
pub fn gridd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SIM_GRIDD_BIN") {
        return p.into();
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(GRIDD_BIN)))
        .unwrap_or_else(|| GRIDD_BIN.into())
}

/// Starts a simulated gridd ([`gridd_bin`]) detached from the caller (own session, output
/// to `gridd.out`), and waits until it has written its pid file. Returns its pid.
pub fn start_gridd(dir: &Path) -> io::Result<i32> {
    start_gridd_bin(&gridd_bin(), dir)
}

/// [`start_gridd`] with the binary given.
pub fn start_gridd_bin(bin: &Path, dir: &Path) -> io::Result<i32> {
    let mut cmd = Command::new(bin);
    cmd.arg("--sim-dir").arg(dir).env("SIM_DIR", dir);
    start_gridd_command(cmd, dir)
}

/// [`start_gridd_bin`] with the command that becomes gridd (by `exec`: its pid is gridd's),
/// given `dir`, the sim dir as this side names it.
pub fn start_gridd_command(mut cmd: Command, dir: &Path) -> io::Result<i32> {
    fs::create_dir_all(dir)?;
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(GRIDD_OUT))?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = child.id() as i32;
    // Not waited for: it outlives this process, like a daemon.
    drop(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if fs::read_to_string(dir.join(PID_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            == Some(pid)
        {
            return Ok(pid);
        }
        if proc_stat(pid).is_none_or(|(s, _)| s == 'Z') {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(pid)
}

/// Stops the running simulated gridd: SIGTERM (it logs `Shutdown`), SIGKILL after `grace`.
/// Returns the pid it stopped.
pub fn stop_gridd(dir: &Path, grace: Duration) -> Option<i32> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let pid = running_gridd(dir)?;
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while gridd_alive(pid) {
        if Instant::now() >= deadline {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(pid)
}

/// Appends a line to the restart counter.
pub fn count_restart(dir: &Path, old: Option<i32>) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(RESTARTS_FILE))?;
    writeln!(
        f,
        "{} restart (was {})",
        Utc::now().to_rfc3339(),
        old.map_or("not running".to_string(), |p| p.to_string())
    )
}

/// Restarts the simulated gridd as `systemctl restart` would: stop, start, counted, the unit
/// `deactivating`, `inactive` with the start job queued, then `activating` meanwhile (see
/// [`unit_state`]). The queued start waits a moment, as one does behind the units it is
/// ordered after.
pub fn restart_gridd(dir: &Path) -> io::Result<i32> {
    let phase = dir.join(RESTARTING_FILE);
    write_atomic(&phase, b"deactivating\n")?;
    let old = stop_gridd(dir, Duration::from_secs(5));
    write_atomic(&phase, b"queued\n")?;
    let queued = SimConfig::load(dir).restart_queued_ms;
    std::thread::sleep(Duration::from_millis(queued));
    write_atomic(&phase, b"activating\n")?;
    let started = count_restart(dir, old).and_then(|()| start_gridd(dir));
    let _ = fs::remove_file(&phase);
    started
}
