//! The simulator's harness: a simulated machine (a temporary root with the simulated GPU,
//! nvidia-smi, nvidia-gridd and a fake DLS) and the real agent (`vgpu-license-agent run`)
//! running against it, with the real journald and journalctl.
//!
//! The simulator's programs are the package `vgpu-sim` (`tests/sim/`), built on first use
//! (`cargo build -p vgpu-sim`) into `target/<profile>/`, beside the agent.
//!
//! All simulated gridds of all tests log to the one system journal as `nvidia-gridd`, as
//! the real one does in a guest. Each machine's agent runs the real `journalctl` through a
//! wrapper that keeps the agent's own options and matches and adds two of the machine's own:
//! `--since` its start, and, in each of the agent's match groups, the command line of its
//! gridd (which names the machine's sim dir). The machines of every test therefore run at the
//! same time, each agent seeing its own gridd alone, as in a VM of its own. A scenario about
//! what else a journal holds (lines forged by another program) sets
//! [`Setup::whole_journal`]: its agent gets the agent's matches alone, and its machine holds
//! [`journal_lock`] exclusively (every other machine holds it shared), so that no other
//! machine's gridd logs meanwhile.

#![allow(dead_code)]

#[path = "../sim/dls.rs"]
pub mod dls;
#[path = "../sim/gridd_lines.rs"]
pub mod gridd_lines;
#[path = "../sim/https.rs"]
pub mod https;
#[path = "../sim/kube_api.rs"]
pub mod kube_api;
#[path = "../sim/proxy.rs"]
pub mod proxy;
#[path = "../sim/shared.rs"]
pub mod shared;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

#[allow(unused_imports)]
pub use dls::{FakeDls, Mode};
#[allow(unused_imports)]
pub use proxy::ConnectProxy;
#[allow(unused_imports)]
pub use shared::{GpuState, NetworkFailure, SimConfig, SmiMode};

use super::BIN;

/// Where the simulator's programs are built: beside the agent that `cargo test` built.
pub fn programs_dir() -> PathBuf {
    Path::new(BIN)
        .parent()
        .expect("the binary's directory")
        .to_path_buf()
}

/// Builds the simulator's programs, once per test process (`cargo test` does not build
/// another package's programs, and would leave those of an earlier build stale).
fn build_programs() -> Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(&cargo);
            cmd.args(["build", "-p", "vgpu-sim", "--quiet"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .stdin(Stdio::null());
            let profile = programs_dir()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            if profile.as_deref() == Some("release") {
                cmd.arg("--release");
            }
            match cmd.output() {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(format!(
                    "cargo build -p vgpu-sim failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                )),
                Err(e) => Err(format!("cannot run {}: {e}", cargo.to_string_lossy())),
            }
        })
        .clone()
}

/// One of the simulator's programs (built on first use); panics with how to build it when it
/// cannot be had.
pub fn program(name: &str) -> PathBuf {
    let built = build_programs();
    let p = programs_dir().join(name);
    assert!(
        p.is_file(),
        "{} is missing ({}): build the simulator with `cargo build -p vgpu-sim`",
        p.display(),
        built.err().unwrap_or_default()
    );
    p
}

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
const JOURNAL_DEV_LOG: &str = "/run/systemd/journal/dev-log";

fn journald_answers() -> bool {
    Path::new(JOURNAL_DEV_LOG).exists()
        && std::os::unix::net::UnixDatagram::unbound()
            .and_then(|s| s.connect(JOURNAL_SOCKET))
            .is_ok()
}

/// Makes sure journald runs: where nothing answers on its socket (a container, CI), starts
/// `/lib/systemd/systemd-journald` (once, detached) and waits for its sockets. The journald
/// it starts is stopped when this test process ends, however it ends (see [`stop_at_exit`]).
pub fn ensure_journald() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let r = DONE.get_or_init(|| {
        // Every test process that uses a journald holds this shared until it ends; the
        // watcher of a journald a test started waits for all of them (see [`stop_at_exit`]).
        std::mem::forget(lock_file_as(JOURNALD_USERS, FlockArg::LockShared));
        if journald_answers() {
            return Ok(());
        }
        // Across processes too: one starts it, the others wait for its sockets.
        let _lock = lock_file("/tmp/vgpu-license-agent-journald.lock");
        if journald_answers() {
            return Ok(());
        }
        let bin = [
            "/lib/systemd/systemd-journald",
            "/usr/lib/systemd/systemd-journald",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("systemd-journald is not installed (apt-get install systemd)")?;
        // What journald makes that was not there before goes with it.
        let made: Vec<&str> = ["/run/systemd/journal", "/run/log/journal"]
            .into_iter()
            .filter(|d| !Path::new(d).exists())
            .collect();
        let mut cmd = Command::new(bin);
        cmd.env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        in_own_session(&mut cmd);
        let mut journald = cmd
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e} (run the tests as root)"))?;
        if let Err(e) = stop_at_exit(journald.id(), &made) {
            let _ = journald.kill();
            let _ = journald.wait();
            return Err(e);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if journald_answers() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "started {bin}, but nothing answers on {JOURNAL_SOCKET} (run the tests as root)"
        ))
    });
    if let Err(e) = r {
        panic!("journald: {e}");
    }
}

/// Runs `cmd` in a session of its own: a ^C to the test run, or its terminal closing, does not
/// reach it.
fn in_own_session(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

/// Held shared by every test process that uses a journald (close-on-exec, so not by what
/// the tests run).
const JOURNALD_USERS: &str = "/tmp/vgpu-license-agent-journald.users";

/// Stops the journald `pid` when this process ends, and removes the directories it `made`: a
/// watcher in a session of its own (a ^C to the test run does not reach it) reads a pipe whose
/// one writer is this process, so that its end of file comes when this process ends, even
/// killed. It then waits until no other test process uses that journald ([`JOURNALD_USERS`])
/// and signals only a process that is still that journald. (No test knows it is the last;
/// the test binary has no hook at its end.)
fn stop_at_exit(pid: u32, made: &[&str]) -> Result<(), String> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("pipe for journald's watcher: {e}"))?;
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(
            r#"cat >/dev/null
users=$1 pid=$2; shift 2
exec 9>"$users" && flock 9
alive() {
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd-journal ] &&
    ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
alive && kill -TERM "$pid"
i=0
while alive && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
alive && kill -KILL "$pid"
rm -rf "$@""#,
        )
        .arg("journald-watcher")
        .arg(JOURNALD_USERS)
        .arg(pid.to_string())
        .args(made)
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    in_own_session(&mut cmd);
    cmd.spawn()
        .map_err(|e| format!("cannot start journald's watcher: {e}"))?;
    // Held until this process ends; close-on-exec, so no program a test runs holds it.
    std::mem::forget(write);
    Ok(())
}

fn lock_file(path: &str) -> Flock<fs::File> {
    lock_file_as(path, FlockArg::LockExclusive)
}

fn lock_file_as(path: &str, how: FlockArg) -> Flock<fs::File> {
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    Flock::lock(f, how)
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("lock {path}: {e}"))
}

/// Held by every test that runs a simulated gridd (see the module's doc): shared, or
/// `exclusive` by the one whose agent reads every gridd line of the journal. A file lock, so
/// that it holds across test binaries run at the same time.
pub fn journal_lock(exclusive: bool) -> Flock<fs::File> {
    lock_file_as(
        "/tmp/vgpu-license-agent-sim-journal.lock",
        if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        },
    )
}

/// Polls `f` until it gives a value; panics after `timeout` with `what` and `context()`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub use dls::token_for;

/// `token` with its payload changed by `f`, re-encoded, its header and signature kept.
pub fn edit_payload(token: &[u8], f: impl FnOnce(&mut Value)) -> Vec<u8> {
    use base64::Engine;
    let e = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let text = String::from_utf8(token.to_vec()).expect("a token is text");
    let parts: Vec<&str> = text.split('.').collect();
    let mut payload: Value = serde_json::from_slice(&e.decode(parts[1]).unwrap()).unwrap();
    f(&mut payload);
    format!(
        "{}.{}.{}",
        parts[0],
        e.encode(payload.to_string()),
        parts[2]
    )
    .into_bytes()
}

/// gridd's journal entries (JSON objects) of this boot matching `matches`
/// (`journalctl` match arguments), optionally since a `--since` value.
pub fn journal(matches: &[&str], since: Option<&str>) -> Vec<Value> {
    let mut cmd = Command::new("journalctl");
    cmd.args(["--boot", "--output=json", "--no-pager"]);
    if let Some(s) = since {
        cmd.arg(format!("--since={s}"));
    }
    let out = cmd.args(matches).output().expect("journalctl runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `MESSAGE` of a journal entry (journald gives non-UTF-8 messages as byte arrays).
pub fn message(e: &Value) -> String {
    match &e["MESSAGE"] {
        Value::String(s) => s.clone(),
        Value::Array(b) => String::from_utf8_lossy(
            &b.iter()
                .filter_map(|v| v.as_u64().map(|x| x as u8))
                .collect::<Vec<_>>(),
        )
        .into_owned(),
        _ => String::new(),
    }
}

/// Writes `bytes` to `path` with `mode`, creating the directory.
pub fn write_mode(path: &Path, bytes: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
    // A token's mode has an x bit (0744) but it is never run: no copy of it is made in the
    // directory (the agent watches a token's directory, and would see the copy).
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes the program `path` (0755), safe to run at once ([`super::set_program_mode`]).
pub fn write_program(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
    super::set_program_mode(path, 0o755);
}

/// Copies `from` to `at` inside `root` (its directories made), keeping its mode.
fn copy_into_root(root: &Path, from: &Path, at: &Path) {
    let to = root.join(at.strip_prefix("/").unwrap());
    fs::create_dir_all(to.parent().unwrap()).unwrap();
    fs::copy(fs::canonicalize(from).unwrap(), &to).unwrap();
    // Its mode kept, through a copy no test thread had open for writing (ETXTBSY otherwise).
    let mode = fs::metadata(&to).unwrap().permissions().mode() & 0o7777;
    super::set_program_mode(&to, mode);
}

/// A program copied into `root` at `at`, with the libraries it loads at their own paths.
fn copy_with_libraries(root: &Path, program: &Path, at: &Path) {
    copy_into_root(root, program, at);
    let ldd = Command::new("ldd").arg(program).output().expect("ldd runs");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let lib = line
            .split("=>")
            .last()
            .and_then(|s| s.split_whitespace().next())
            .filter(|s| s.starts_with('/'));
        if let Some(lib) = lib {
            copy_into_root(root, Path::new(lib), Path::new(lib));
        }
    }
}

fn write_script(path: &Path, text: &str) {
    write_program(path, text.as_bytes());
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// `/proc/PID/stat`: (state letter, parent pid, start time in ticks).
pub fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((
        f.first()?.chars().next()?,
        f.get(1)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

/// The processes whose parent is `pid`: (pid, comm, start time).
pub fn children_of(pid: i32) -> Vec<(i32, String, u64)> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((_, ppid, start)) = proc_stat(p)
            && ppid == pid
        {
            let comm = fs::read_to_string(format!("/proc/{p}/comm"))
                .unwrap_or_default()
                .trim()
                .to_string();
            v.push((p, comm, start));
        }
    }
    v
}

/// The report's schema, checked on every status.json read.
fn validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(
            &fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report.schema.json"),
            )
            .unwrap(),
        )
        .unwrap();
        jsonschema::validator_for(&schema).unwrap()
    })
}

/// How the machine is set up before the agent starts.
pub struct Setup {
    pub sim: SimConfig,
    /// Extra lines for the agent's config (appended after `[service]`'s keys).
    pub service_extra: String,
    /// The agent's `commands.timeout_seconds`.
    pub command_timeout: u64,
    /// The DLS node (host, port) the machine's token names; `None`: this machine's fake DLS
    /// on the loopback. A CLS guest's token names `api.cls.licensing.nvidia.com:443`, which
    /// the simulated machine reaches only through a [`ConnectProxy`].
    pub token_node: Option<(String, u16)>,
    /// The agent reads every gridd line of the machine's journal, not only this machine's
    /// gridd's (see the module's doc): no other machine runs meanwhile.
    pub whole_journal: bool,
    /// A GPU Operator node: the driver container's root at `run/nvidia/driver` of the
    /// machine (nvidia-smi only in there, with its libraries, run by `chroot`; the token and
    /// gridd.conf in its `/etc/nvidia`; the simulator's state in its `/sim`), no gridd unit.
    pub gpu_operator: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            sim: SimConfig {
                retry_seconds: 1.0,
                exit_linger_ms: 200,
                ..SimConfig::default()
            },
            service_extra: String::new(),
            command_timeout: 3,
            token_node: None,
            whole_journal: false,
            gpu_operator: false,
        }
    }
}

/// `CONNECT` target of NVIDIA's Cloud License Service, as a CLS token names it.
pub const CLS_TARGET: &str = "api.cls.licensing.nvidia.com:443";

/// A legacy license server for the simulated gridd (drivers up to 470): a TCP listener on
/// port 7070 of a loopback address of its own (gridd only connects to it), which can go down
/// and come back.
pub struct LegacyServer {
    pub addr: std::net::SocketAddr,
    listener: Option<std::net::TcpListener>,
    n: u8,
}

/// The addresses of the legacy servers alive in this process, down ones too: a server taken
/// down must not have its address taken by another test's, which would answer its gridd.
static LEGACY_TAKEN: std::sync::Mutex<std::collections::BTreeSet<u8>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

impl Drop for LegacyServer {
    fn drop(&mut self) {
        LEGACY_TAKEN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.n);
    }
}

impl LegacyServer {
    /// Up, on 127.0.70.N:7070 for the first N free.
    pub fn start() -> LegacyServer {
        let mut taken = LEGACY_TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        let (n, addr, l) = (70..90u8)
            .filter(|n| !taken.contains(n))
            .find_map(|n| {
                let addr: std::net::SocketAddr = format!("127.0.70.{n}:7070").parse().ok()?;
                std::net::TcpListener::bind(addr).ok().map(|l| (n, addr, l))
            })
            .expect("a free 127.0.70.N:7070");
        taken.insert(n);
        LegacyServer {
            addr,
            listener: Some(l),
            n,
        }
    }

    /// Down (connections refused) or up again.
    pub fn set_up(&mut self, up: bool) {
        self.listener = if up {
            Some(std::net::TcpListener::bind(self.addr).expect("the server's address again"))
        } else {
            None
        };
    }

    /// gridd.conf's lines naming this server.
    pub fn gridd_conf(&self) -> String {
        format!(
            "ServerAddress={}\nServerPort={}\nFeatureType=1\n",
            self.addr.ip(),
            self.addr.port()
        )
    }
}

/// `--since` of a simulated machine that starts now.
pub fn since_now() -> String {
    format!(
        "@{:.6}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    )
}

/// The simulated gridd of the sim dir `sim`: its program, canonical (the path the
/// simulator's own programs start it by, next to themselves, so that its command line is the
/// same whoever starts it), and the journal match that selects its lines (that command line).
pub fn gridd_identity(sim: &Path) -> (PathBuf, String) {
    let bin = fs::canonicalize(program("sim-nvidia-gridd")).unwrap();
    let m = format!("_CMDLINE={} --sim-dir {}", bin.display(), sim.display());
    (bin, m)
}

/// A machine's `journalctl`: the real one with the caller's options and matches, `--since`
/// the machine's start (earlier tests' gridd lines are not its own) and, given a gridd's
/// match, that match in each of the caller's match groups (before the first match and after
/// each `+`), which hides the other machines' gridds.
pub fn journalctl_wrapper(since: &str, gridd_match: Option<&str>) -> String {
    let Some(m) = gridd_match else {
        return format!("#!/bin/sh\nexec journalctl '--since={since}' \"$@\"\n");
    };
    format!(
        "#!/bin/sh\n\
         m='{m}'\n\
         first=1\n\
         for a do\n\
         shift\n\
         case $a in\n\
         -*) set -- \"$@\" \"$a\" ;;\n\
         +) set -- \"$@\" + \"$m\" ;;\n\
         *) [ $first = 1 ] && set -- \"$@\" \"$m\"; first=0; set -- \"$@\" \"$a\" ;;\n\
         esac\n\
         done\n\
         [ $first = 1 ] && set -- \"$@\" \"$m\"\n\
         exec journalctl '--since={since}' \"$@\"\n"
    )
}

/// A simulated machine in a temporary root. Holds the journal lock for its life.
pub struct Machine {
    pub dir: tempfile::TempDir,
    /// The sim dir: sim.json, the GPU state, gridd's pid file, the restart counter.
    pub sim: PathBuf,
    pub config: PathBuf,
    pub dls: FakeDls,
    /// `--since` of the agent's journal: this machine's boot.
    pub since: String,
    /// The journal match that selects this machine's gridd: its command line, which names
    /// the sim dir.
    pub gridd_match: String,
    /// The simulated gridd's program, as this machine's gridd is started by every path.
    gridd_bin: PathBuf,
    /// A GPU Operator node's driver container, where its gridd runs.
    container: Option<ContainerSim>,
    token_node: Option<(String, u16)>,
    lock: Flock<fs::File>,
}

/// The GPU Operator's driver container as the node sees it: its root shared at the driver
/// root, gridd started in it once by its entrypoint, in a mount namespace of its own whose `/`
/// is that root and whose `/dev/log` is the node's (the DaemonSet mounts it in), in the node's
/// PID namespace (`hostPID: true`). The simulated gridd and nvidia-smi are copied in at the
/// real ones' paths, with the libraries they load.
struct ContainerSim {
    root: PathBuf,
    /// The sim dir, as the container names it.
    sim: PathBuf,
}

impl ContainerSim {
    const GRIDD: &str = "/usr/bin/nvidia-gridd";

    /// A container path, as the node sees it.
    fn host(&self, at: &Path) -> PathBuf {
        self.root.join(at.strip_prefix("/").unwrap_or(at))
    }

    /// The program the node sees run as gridd, and the journal match of its lines.
    fn gridd_identity(&self) -> (PathBuf, String) {
        let m = format!("_CMDLINE={} --sim-dir {}", Self::GRIDD, self.sim.display());
        (self.host(Path::new(Self::GRIDD)), m)
    }

    /// The entrypoint's `nvidia-gridd`: `unshare` makes the mount namespace (and `exec`s, so
    /// the pid is gridd's), mounts the node's journal socket at the container's `/dev/log`,
    /// and enters the root.
    fn gridd_command(&self) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(
                "mount --bind /run/systemd/journal/dev-log \"$1/dev/log\" && \
                 exec chroot \"$1\" \"$2\" --sim-dir \"$3\"",
            )
            .arg("sh")
            .arg(&self.root)
            .arg(Self::GRIDD)
            .arg(&self.sim)
            .env_remove("SIM_SYSLOG_SOCKET");
        cmd
    }
}

impl Machine {
    pub fn new(setup: Setup) -> Machine {
        ensure_journald();
        let lock = journal_lock(setup.whole_journal);
        let dir = tempfile::Builder::new()
            .prefix("vgpu-sim-")
            .tempdir()
            .unwrap();
        let r = dir.path().to_path_buf();
        // gridd's files: in the driver container's root on a GPU Operator node, where gridd
        // names them by the container's paths; the sim dir's name there is this machine's
        // own, so that its gridd's command line tells it from other machines' in the journal.
        let driver_root = r.join("run/nvidia/driver");
        let container = setup.gpu_operator.then(|| ContainerSim {
            root: driver_root.clone(),
            sim: Path::new("/").join(format!("sim-{}", r.file_name().unwrap().to_string_lossy())),
        });
        let (files, sim) = match &container {
            Some(c) => (driver_root.clone(), c.host(&c.sim)),
            None => (r.clone(), r.join("sim")),
        };
        fs::create_dir_all(&sim).unwrap();
        let mut cfg = setup.sim;
        if container.is_none() {
            cfg.token_dir = files.join("etc/nvidia/ClientConfigToken");
            cfg.gridd_conf = files.join("etc/nvidia/gridd.conf");
        }
        cfg.save(&sim).unwrap();
        let token_dir = files.join("etc/nvidia/ClientConfigToken");
        fs::create_dir_all(&token_dir).unwrap();
        fs::set_permissions(&token_dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir_all(r.join("var/lib/prometheus/node-exporter")).unwrap();
        let dls = FakeDls::start();
        let since = since_now();
        let (gridd_bin, gridd_match) = match &container {
            Some(c) => c.gridd_identity(),
            None => gridd_identity(&sim),
        };
        let bin = r.join("bin");
        write_script(
            &bin.join("nvidia-smi"),
            &format!(
                "#!/bin/sh\nexec '{}' --sim-dir '{}' \"$@\"\n",
                program("sim-nvidia-smi").display(),
                sim.display()
            ),
        );
        write_script(
            &bin.join("systemctl"),
            &format!(
                "#!/bin/sh\nexec '{}' --sim-dir '{}' \"$@\"\n",
                program("sim-systemctl").display(),
                sim.display()
            ),
        );
        let journalctl =
            journalctl_wrapper(&since, (!setup.whole_journal).then_some(&*gridd_match));
        write_script(&bin.join("journalctl"), &journalctl);
        let config = r.join("agent/config.toml");
        fs::create_dir_all(config.parent().unwrap()).unwrap();
        let m = Machine {
            dir,
            sim,
            config,
            dls,
            since,
            gridd_match,
            gridd_bin,
            container,
            token_node: setup.token_node,
            lock,
        };
        m.write_config(&format!(
            "{paths}\
             [commands]\n\
             nvidia_smi = \"{r}/bin/nvidia-smi\"\n\
             journalctl = \"{r}/bin/journalctl\"\n\
             systemctl = \"{r}/bin/systemctl\"\n\
             restart_gridd = [\"{restart}\", \"--sim-dir\", \"{r}/sim\"]\n\
             timeout_seconds = {timeout}\n\
             [service]\n\
             poll_unlicensed_seconds = 1\n\
             poll_licensed_seconds = 2\n\
             restart_grace_seconds = 2\n\
             restart_backoff_seconds = 1\n\
             restart_backoff_max_seconds = 4\n\
             restart_budget_per_hour = 3\n\
             probe_timeout_seconds = 2\n\
             {extra}",
            paths = super::paths_toml(&r),
            r = r.display(),
            restart = program("sim-restart-gridd").display(),
            extra = setup.service_extra,
            timeout = setup.command_timeout,
        ));
        if setup.gpu_operator {
            m.make_driver_root(&driver_root);
        }
        m
    }

    /// The GPU Operator's driver root: nvidia-smi in it with the libraries it loads (the
    /// agent runs it by `chroot`), and the agent's config pointed at it, with the token and
    /// gridd.conf at their usual paths inside it.
    fn make_driver_root(&self, root: &Path) {
        copy_with_libraries(
            root,
            &program("sim-nvidia-smi"),
            Path::new("/usr/bin/nvidia-smi"),
        );
        copy_with_libraries(
            root,
            &program("sim-nvidia-gridd"),
            Path::new(ContainerSim::GRIDD),
        );
        // Where the container's /dev/log is mounted.
        write_mode(&root.join("dev/log"), b"", 0o644);
        let r = self.root().display().to_string();
        let text = self
            .config_text()
            .replace(
                &format!("token_dir = \"{r}/etc/nvidia/ClientConfigToken\""),
                "token_dir = \"/etc/nvidia/ClientConfigToken\"",
            )
            .replace(
                &format!("gridd_conf = \"{r}/etc/nvidia/gridd.conf\""),
                &format!(
                    "gridd_conf = \"/etc/nvidia/gridd.conf\"\ndriver_root = \"{}\"",
                    root.display()
                ),
            )
            .replace(
                &format!("nvidia_smi = \"{r}/bin/nvidia-smi\""),
                "nvidia_smi = \"/usr/bin/nvidia-smi\"",
            );
        assert!(text.contains("driver_root = "), "{text}");
        self.write_config(&text);
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write_config(&self, text: &str) {
        fs::write(&self.config, text).unwrap();
    }

    pub fn config_text(&self) -> String {
        fs::read_to_string(&self.config).unwrap()
    }

    /// Sets `key` (`restart_grace_seconds`, ...) to `value` in the machine's config, where
    /// the config has it: a key it lacks fails here, not as a test that silently changed
    /// nothing.
    pub fn set_config(&self, key: &str, value: &str) {
        let prefix = format!("{key} = ");
        let config = self.config_text();
        assert!(
            config.lines().any(|l| l.starts_with(&prefix)),
            "no {key} in the machine's config: {config}"
        );
        let edited: String = config
            .lines()
            .map(|l| match l.starts_with(&prefix) {
                true => format!("{prefix}{value}\n"),
                false => format!("{l}\n"),
            })
            .collect();
        self.write_config(&edited);
    }

    /// A pod's service account under the machine (its token and the API's CA), as the agent
    /// in a pod reads it: the directory to name as `kubernetes.service_account_dir`.
    pub fn service_account(&self, token: &str, ca_pem: &str) -> PathBuf {
        let sa = self.path("serviceaccount");
        fs::create_dir_all(&sa).unwrap();
        fs::write(sa.join("token"), token).unwrap();
        fs::write(sa.join("ca.crt"), ca_pem).unwrap();
        sa
    }

    /// A restart of the simulated gridd is under way (its unit between stop and start).
    pub fn restarting(&self) -> bool {
        self.sim.join(shared::RESTARTING_FILE).exists()
    }

    /// A command of the agent with this machine's config, run to its end.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap()
    }

    pub fn sim_config(&self) -> SimConfig {
        SimConfig::load(&self.sim)
    }

    /// Changes the simulated machine (read by nvidia-smi on each run, by gridd at start).
    pub fn update_sim(&self, f: impl FnOnce(&mut SimConfig)) {
        let mut c = self.sim_config();
        f(&mut c);
        c.save(&self.sim).unwrap();
    }

    /// The sim dir as the driver container names it (`SIM_DIR` of the nvidia-smi run in its
    /// root), on a GPU Operator node.
    pub fn container_sim(&self) -> Option<&Path> {
        self.container.as_ref().map(|c| c.sim.as_path())
    }

    /// The token directory gridd reads, as this side sees it.
    pub fn token_dir(&self) -> PathBuf {
        self.host_path(&self.sim_config().token_dir)
    }

    /// gridd's gridd.conf, as this side sees it.
    pub fn gridd_conf(&self) -> PathBuf {
        self.host_path(&self.sim_config().gridd_conf)
    }

    /// A path gridd names, as this side sees it (the driver container's are under its root).
    fn host_path(&self, p: &Path) -> PathBuf {
        match &self.container {
            Some(c) => c.host(p),
            None => p.to_path_buf(),
        }
    }

    pub fn token_path(&self) -> PathBuf {
        self.token_dir().join("client_configuration_token.tok")
    }

    /// A valid token for this machine's DLS (or [`Setup::token_node`]), signed by it.
    pub fn token(&self) -> Vec<u8> {
        match &self.token_node {
            Some((host, port)) => token_for(host, *port, "sim"),
            None => token_for("127.0.0.1", self.dls.port(), "sim"),
        }
    }

    /// [`Machine::token`] with its payload edited after signing (its `jti` changed, the
    /// signature kept): well formed, so the agent cannot tell, but its signature no longer
    /// verifies, and gridd rejects it.
    pub fn edited_token(&self) -> Vec<u8> {
        edit_payload(&self.token(), |p| p["jti"] = "edited".into())
    }

    /// Installs the token as cloud-init's write_files would, with `mode`.
    pub fn drop_token(&self, mode: u32) -> Vec<u8> {
        let t = self.token();
        write_mode(&self.token_path(), &t, mode);
        t
    }

    pub fn status_path(&self) -> PathBuf {
        self.path("run/vgpu-license-agent/status.json")
    }

    pub fn metrics_path(&self) -> PathBuf {
        self.path("var/lib/prometheus/node-exporter/vgpu_license_agent.prom")
    }

    /// Starts the simulated gridd (not counted as a restart); returns its pid.
    pub fn start_gridd(&self) -> i32 {
        match &self.container {
            Some(c) => shared::start_gridd_command(c.gridd_command(), &self.sim),
            None => shared::start_gridd_bin(&self.gridd_bin, &self.sim),
        }
        .expect("the simulated gridd starts")
    }

    pub fn gridd_pid(&self) -> Option<i32> {
        shared::running_gridd(&self.sim)
    }

    /// Kills the simulated gridd with SIGKILL (a crash: no Shutdown line).
    pub fn crash_gridd(&self) -> i32 {
        let pid = wait_for(
            "a simulated gridd to run",
            Duration::from_secs(10),
            || self.gridd_pid(),
            || self.gridd_log(),
        );
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        wait_for(
            "the killed gridd to be gone",
            Duration::from_secs(5),
            || (!shared::gridd_alive(pid)).then_some(()),
            String::new,
        );
        pid
    }

    /// Restarts done through the restart command.
    pub fn restarts(&self) -> usize {
        fs::read_to_string(self.sim.join(shared::RESTARTS_FILE))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    pub fn gpu_state(&self) -> Option<GpuState> {
        GpuState::load(&self.sim)
    }

    /// On a simulated vGPU host ([`SimConfig::host`]): the vGPU manager sees one VM's change
    /// (`args`: `VGPU_ID PHASE [VM_NAME VM_UUID]`, see `tests/sim/vgpu_mgr.rs`), and logs
    /// what it logs at it.
    pub fn vgpu_mgr(&self, args: &[&str]) {
        let out = Command::new(program("sim-nvidia-vgpu-mgr"))
            .arg("--sim-dir")
            .arg(&self.sim)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sim-nvidia-vgpu-mgr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The simulated nvidia-smi's `-q` output now.
    pub fn smi(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.path("bin/nvidia-smi"))
            .args(args)
            .output()
            .unwrap()
    }

    /// gridd's own log (a copy of what it sent to the journal), for failure messages.
    pub fn gridd_log(&self) -> String {
        tail(&self.sim.join(shared::GRIDD_LOG), 40)
    }

    /// Every message of this machine's gridd in the journal.
    pub fn journal_messages(&self) -> Vec<String> {
        self.gridd_entries(&[]).iter().map(message).collect()
    }

    /// This machine's gridd's journal entries that also match `matches`.
    pub fn gridd_entries(&self, matches: &[&str]) -> Vec<Value> {
        let mut all = vec![self.gridd_match.as_str()];
        all.extend_from_slice(matches);
        journal(&all, Some(&self.since))
    }

    /// The messages the simulated gridd `pid` of this machine logged to the journal.
    pub fn gridd_messages(&self, pid: i32) -> Vec<String> {
        self.gridd_entries(&[&format!("_PID={pid}")])
            .iter()
            .map(message)
            .collect()
    }

    /// The agent's entries in the journal (its own lines, with their MESSAGE_IDs) since this
    /// machine's start.
    pub fn agent_journal(&self, agent_pid: u32) -> Vec<Value> {
        journal(&[&format!("_PID={agent_pid}")], Some(&self.since))
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // Stop this machine's gridd before the lock goes, and let its last lines reach the
        // journal, so that a machine that reads the whole journal next does not see them.
        if let Some(pid) = shared::stop_gridd(&self.sim, Duration::from_secs(5)) {
            let deadline = Instant::now() + Duration::from_secs(5);
            let shutdown = format!("Shutdown ({pid})");
            while Instant::now() < deadline && !self.gridd_messages(pid).contains(&shutdown) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // A restart in flight when the agent was stopped may start one more gridd: every
        // process of this machine's simulation goes.
        for _ in 0..3 {
            kill_mentioning(&self.sim);
            if let Some(c) = &self.container {
                kill_mentioning(&c.sim);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// SIGKILLs every process whose command line names `dir` (the simulator's programs take
/// `--sim-dir DIR`).
fn kill_mentioning(dir: &Path) {
    let needle = dir.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    let Ok(procs) = fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid as u32 == me {
            continue;
        }
        let Ok(cmdline) = fs::read(p.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(needle.len()).any(|w| w == needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The real agent, `vgpu-license-agent run --config`, running against a [`Machine`].
pub struct Agent {
    child: Child,
    status: PathBuf,
    metrics: PathBuf,
    out: PathBuf,
    err: PathBuf,
    gridd_log: PathBuf,
    token: Vec<u8>,
    since: String,
}

impl Agent {
    pub fn start(m: &Machine) -> Agent {
        Agent::start_with_env(m, &[])
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// status.json, checked to be whole, valid JSON and valid against the report's schema;
    /// `None` while it does not exist.
    pub fn status(&self) -> Option<Value> {
        let bytes = match fs::read(&self.status) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("{}: {e}", self.status.display()),
        };
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "status.json is not whole JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        if let Err(e) = validator().validate(&v) {
            panic!("status.json does not match the report's schema: {e}\n{v:#}");
        }
        self.assert_no_secret(&String::from_utf8_lossy(&bytes));
        Some(v)
    }

    pub fn metrics(&self) -> String {
        fs::read_to_string(&self.metrics).unwrap_or_default()
    }

    /// A sample's value in the metrics textfile: `name` with its labels as written, e.g.
    /// `vgpu_license_state{state="licensed"}`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics().lines().find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == name).then(|| v.parse().ok())?
        })
    }

    /// The agent's output so far (stdout and stderr).
    pub fn logs(&self) -> String {
        format!(
            "{}\n{}",
            fs::read_to_string(&self.out).unwrap_or_default(),
            fs::read_to_string(&self.err).unwrap_or_default()
        )
    }

    /// The agent's own lines in the journal (it logs there when journald runs).
    pub fn journal_lines(&self) -> Vec<String> {
        journal(&[&format!("_PID={}", self.pid())], Some(&self.since))
            .iter()
            .map(|e| {
                let id = e["MESSAGE_ID"].as_str().unwrap_or("-");
                format!("[{id}] {}", message(e))
            })
            .collect()
    }

    /// What to print when a wait fails: the last status, the agent's and gridd's logs.
    pub fn context(&self) -> String {
        let status = fs::read_to_string(&self.status).unwrap_or_else(|_| "(none)".into());
        let journal = self.journal_lines();
        format!(
            "--- status.json:\n{status}\n--- metrics:\n{}\n--- agent's journal (tail):\n{}\n--- agent's stderr (tail):\n{}\n--- gridd (tail):\n{}",
            self.metrics(),
            journal[journal.len().saturating_sub(40)..].join("\n"),
            tail(&self.err, 40),
            tail(&self.gridd_log, 30),
        )
    }

    /// Waits until status.json satisfies `pred`; returns it.
    pub fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        wait_for(
            what,
            timeout,
            || self.status().filter(|v| pred(v)),
            || self.context(),
        )
    }

    pub fn wait_state(&self, state: &str, timeout: Duration) -> Value {
        self.wait_status(&format!("state {state:?}"), timeout, |v| {
            v["state"] == state
        })
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// The exit status, once it exited within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The agent's child processes now: (pid, comm, start time).
    pub fn children(&self) -> Vec<(i32, String, u64)> {
        children_of(self.child.id() as i32)
    }

    /// Panics if the token's content shows in `text`.
    pub fn assert_no_secret(&self, text: &str) {
        for part in super::secret_parts(&self.token) {
            assert!(!text.contains(&part), "the token's content was printed");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
            if self.wait_exit(Duration::from_secs(5)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        if !std::thread::panicking() {
            let logs = self.logs();
            self.assert_no_secret(&logs);
        }
    }
}

impl Agent {
    /// [`Agent::start`] with variables added to the agent's environment: `NOTIFY_SOCKET` and
    /// `WATCHDOG_USEC`, say, so that a test receives what systemd would (READY, STATUS, the
    /// watchdog's pings) and can tell that the agent's loop never stalls.
    pub fn start_with_env(m: &Machine, env: &[(&str, &std::ffi::OsStr)]) -> Agent {
        Agent::start_as(m, env, Command::new(BIN))
    }

    /// [`Agent::start_with_env`] on a node that booted `up` ago, whatever this machine's
    /// uptime: the agent runs in a time namespace of its own (`unshare --time`, root's),
    /// whose boot clock, and so its `/proc/uptime`, is set to say `up`. The same process
    /// (`unshare` execs the agent), with the machine's monotonic and wall clocks.
    pub fn start_booted(m: &Machine, env: &[(&str, &std::ffi::OsStr)], up: Duration) -> Agent {
        let host = fs::read_to_string("/proc/uptime").unwrap();
        let host: f64 = host.split_whitespace().next().unwrap().parse().unwrap();
        let offset = up.as_secs() as i64 - host.ceil() as i64;
        let mut cmd = Command::new("unshare");
        cmd.args(["--time", "--boottime", &offset.to_string(), BIN]);
        Agent::start_as(m, env, cmd)
    }

    /// The agent started by `cmd` (the agent's program, or what execs it).
    fn start_as(m: &Machine, env: &[(&str, &std::ffi::OsStr)], mut cmd: Command) -> Agent {
        let out = m.path("agent.out");
        let err = m.path("agent.err");
        cmd.args(["run", "--config"])
            .arg(&m.config)
            .env_remove("VGPU_LICENSE_AGENT_CONFIG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("VGPU_LICENSE_AGENT_FAULT")
            .env("SIM_DIR", &m.sim)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("vgpu-license-agent run starts");
        Agent {
            child,
            status: m.status_path(),
            metrics: m.metrics_path(),
            out,
            err,
            gridd_log: m.sim.join(shared::GRIDD_LOG),
            token: m.token(),
            since: m.since.clone(),
        }
    }
}

// ---- The scenarios' common steps (tests/service.rs, tests/service_faults.rs) ----

/// A machine's setup with its simulator configured by `f`.
pub fn setup(f: impl FnOnce(&mut SimConfig)) -> Setup {
    let mut s = Setup::default();
    f(&mut s.sim);
    s
}

/// gridd.conf as `install` writes it, so that the agent has nothing to fix there.
pub fn write_gridd_conf(m: &Machine) {
    write_mode(&m.gridd_conf(), b"FeatureType=1\n", 0o644);
}

/// The report's failure reason.
pub fn reason(v: &Value) -> Option<&str> {
    v["failure"]["reason"].as_str()
}

/// Whether the report's events hold one with `then` in its message after one with `first`.
pub fn has_event_after(v: &Value, first: &str, then: &str) -> bool {
    v["events"].as_array().is_some_and(|e| {
        let msg = |e: &Value| e["message"].as_str().unwrap_or("").to_string();
        e.iter()
            .position(|e| msg(e).contains(first))
            .is_some_and(|i| e[i + 1..].iter().any(|e| msg(e).contains(then)))
    })
}

/// Whether one of the report's events says `text`.
pub fn has_event(v: &Value, text: &str) -> bool {
    v["events"].as_array().is_some_and(|e| {
        e.iter()
            .any(|e| e["message"].as_str().is_some_and(|m| m.contains(text)))
    })
}
