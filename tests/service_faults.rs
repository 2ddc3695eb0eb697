//! What the machine does to `vgpu-license-agent run`, end to end: journald restarted under it
//! (a journald of the test's own, in a mount namespace of its own: the machine's is left alone),
//! nvidia-smi hanging on every call, the disk under status.json full, SIGTERM at random moments
//! of heavy work, gridd crash-looping, the token directory pulled away, FIFOs planted in it.
//! The real agent, journald and journalctl against the simulator of `tests/sim/`, as in
//! `tests/service.rs` (whose scenarios cover journalctl killed, nvidia-smi hanging once a
//! license is held, and one SIGTERM with a hung nvidia-smi).
//!
//!     cargo test --test service_faults
//!
//! Every scenario holds the simulator's journal lock (through its `Machine`), so they run one
//! at a time, also against the other test binaries' scenarios. Checks poll until a deadline
//! and assert the final state; the few fixed waits are windows in which something must NOT
//! happen, or the pause of a slow hand between two steps.
//!
//! The systemd side is played by the test where it matters: `NOTIFY_SOCKET` and
//! `WATCHDOG_USEC` point the agent at a socket of the test's, whose watchdog pings prove that
//! the agent's loop never stalled for as long as systemd would have killed it.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::sim::{
    self, Agent, Machine, Setup, SmiMode, has_event, reason, setup, wait_for, write_gridd_conf,
};
use crate::common::{Mount, skipped};
use crate::service::settle;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Deadline of a change the agent must make or report.
const T: Duration = Duration::from_secs(30);
/// `WATCHDOG_USEC` the agent is given: systemd kills a service that has not pinged for this
/// long, so no gap between two pings may reach it.
const WATCHDOG: Duration = Duration::from_secs(10);

// ---- The scenarios' common steps (as in tests/service.rs) ----

fn notes(v: &Value) -> Vec<String> {
    v["notes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the restart command as the agent would (counted); returns the new gridd's pid.
fn restart_gridd_by_hand(m: &Machine) -> i32 {
    let out = Command::new(sim::program("sim-restart-gridd"))
        .arg("--sim-dir")
        .arg(&m.sim)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// What the agent logged (its journal entries and its standard error), as text.
fn agent_says(m: &Machine, a: &Agent) -> String {
    let mut s: String = m
        .agent_journal(a.pid())
        .iter()
        .map(|e| sim::message(e) + "\n")
        .collect();
    s += &a.logs();
    s
}

fn mode(p: &Path) -> Option<u32> {
    fs::symlink_metadata(p)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
}

/// The machine licensed, with the agent (started by `start`) watching and settled: licensed,
/// it has seen the gridd that runs, and every restart it made is done and counted.
fn licensed_with(s: Setup, start: impl FnOnce(&Machine) -> Agent) -> (Machine, Agent) {
    let m = Machine::new(s);
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = start(&m);
    settle(&m, &a);
    (m, a)
}

fn licensed(s: Setup) -> (Machine, Agent) {
    licensed_with(s, Agent::start)
}

// ---- systemd's notification socket ----

/// A notification socket, as systemd gives a `Type=notify` service: what the agent sends
/// (`READY=1`, `STATUS=...`, `WATCHDOG=1`), each line with when it came.
struct Notifications {
    _dir: tempfile::TempDir,
    path: PathBuf,
    got: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    /// When the agent was started: its first ping is due from then.
    spawned: Mutex<Option<Instant>>,
}

impl Notifications {
    fn listen() -> Notifications {
        let dir = tempfile::Builder::new()
            .prefix("vgpu-notify-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        // So that the thread sees `stop` when nothing comes.
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while !s.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let now = Instant::now();
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    g.lock()
                        .unwrap()
                        .extend(text.lines().map(|l| (now, l.to_string())));
                }
            }
        });
        Notifications {
            _dir: dir,
            path,
            got,
            stop,
            spawned: Mutex::new(None),
        }
    }

    /// The agent, told to notify this socket and to ping a watchdog of [`WATCHDOG`].
    fn start_agent(&self, m: &Machine) -> Agent {
        let usec = WATCHDOG.as_micros().to_string();
        *self.spawned.lock().unwrap() = Some(Instant::now());
        Agent::start_with_env(
            m,
            &[
                ("NOTIFY_SOCKET", self.path.as_os_str()),
                ("WATCHDOG_USEC", OsStr::new(&usec)),
            ],
        )
    }

    fn pings(&self) -> Vec<Instant> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| l == "WATCHDOG=1")
            .map(|(t, _)| *t)
            .collect()
    }

    /// Panics unless the watchdog was pinged from the agent's start until now with no gap as
    /// long as [`WATCHDOG`]: systemd would have killed an agent whose loop stalled that long.
    fn assert_watchdog_kept(&self, a: &Agent) {
        let since = self.spawned.lock().unwrap().expect("the agent was started");
        let pings = self.pings();
        assert!(
            !pings.is_empty(),
            "no watchdog ping at all\n{}",
            a.context()
        );
        let mut last = since;
        for t in pings.into_iter().chain([Instant::now()]) {
            let gap = t.duration_since(last);
            assert!(
                gap < WATCHDOG,
                "no watchdog ping for {gap:?} (systemd kills the agent after {WATCHDOG:?})\n{}",
                a.context()
            );
            last = t;
        }
    }
}

impl Drop for Notifications {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---- Processes ----

/// The agent's descendants whose name contains `name`, zombies included: a child the agent
/// never reaps is left behind as much as one still running.
fn descendants(pid: u32, name: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let mut todo = vec![pid as i32];
    while let Some(p) = todo.pop() {
        for (child, comm, _) in sim::children_of(p) {
            if comm.contains(name) {
                found.push(child);
            }
            todo.push(child);
        }
    }
    found
}

/// Live processes named like `name` whose command line names this machine's directory
/// (the simulator's programs take `--sim-dir`): what outlives the agent.
fn machine_processes(m: &Machine, name: &str) -> Vec<i32> {
    let needle = m.root().as_os_str().as_encoded_bytes().to_vec();
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        if comm.contains(name) && cmdline.windows(needle.len()).any(|w| w == needle) {
            found.push(pid);
        }
    }
    found
}

// ---- journald ----
//
// The journald this scenario stops is one of its own, never the machine's: the scenario runs
// on a thread of its own in a mount namespace of its own, where an empty tmpfs hides each
// directory journald serves or writes (its sockets, the volatile and the persistent journal),
// and a journald the test starts there serves the simulated gridd, the agent and the test's
// own journalctl, all started from that thread. The machine's journald, if one runs, is
// never signalled, and nothing logged there reaches the machine's journal (journald's own
// messages included: to its standard error, not the kernel's log).

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
const JOURNAL_DEV_LOG: &str = "/run/systemd/journal/dev-log";
/// What journald serves and writes in: its sockets, the volatile and the persistent journal.
const JOURNAL_DIRS: [&str; 3] = [
    "/run/systemd/journal",
    "/run/log/journal",
    "/var/log/journal",
];
const CLONE_NEWNS: std::ffi::c_int = 0x0002_0000;

unsafe extern "C" {
    /// unshare(2), from the C library the test links anyway.
    fn unshare(flags: std::ffi::c_int) -> std::ffi::c_int;
}

fn journald_answers() -> bool {
    Path::new(JOURNAL_DEV_LOG).exists()
        && UnixDatagram::unbound()
            .and_then(|s| s.connect(JOURNAL_SOCKET))
            .is_ok()
}

fn journald_bin() -> Option<&'static str> {
    [
        "/lib/systemd/systemd-journald",
        "/usr/lib/systemd/systemd-journald",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
}

fn mount(args: &[&str], at: &Path) -> Result<(), String> {
    let out = Command::new("mount")
        .args(args)
        .arg(at)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mount {} {}: {}",
            args.join(" "),
            at.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Puts the calling thread, and every process it starts from now on, in a mount namespace of
/// its own whose mounts do not propagate to the machine's, with an empty tmpfs on each of
/// [`JOURNAL_DIRS`]. `Err` says why it cannot (not root, no mount namespaces).
fn private_journal_dirs() -> Result<(), String> {
    // SAFETY: unshare(2) touches no memory of ours; CLONE_NEWNS (with the CLONE_FS it
    // implies) changes the calling thread's file system context only, not its process's.
    if unsafe { unshare(CLONE_NEWNS) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNS): {} (needs root with CAP_SYS_ADMIN)",
            std::io::Error::last_os_error()
        ));
    }
    // Before anything is mounted: a mount on a shared mount point would show on the machine.
    mount(&["--make-rprivate"], Path::new("/"))?;
    for dir in JOURNAL_DIRS {
        shadow(Path::new(dir))?;
    }
    Ok(())
}

/// An empty tmpfs on `dir`; where `dir` does not exist, on its nearest existing parent, with
/// `dir` made in it: nothing is made on the machine's own file systems.
fn shadow(dir: &Path) -> Result<(), String> {
    if dir.is_dir() {
        return mount(&["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], dir);
    }
    let parent = dir
        .parent()
        .ok_or_else(|| format!("{}: no parent to mount on", dir.display()))?;
    shadow(parent)?;
    fs::create_dir(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))
}

/// A journald of the test's own, started in the namespace of [`private_journal_dirs`] as a
/// child of the thread that made it (which it does not outlive: its parent-death signal is
/// SIGKILL), stopped when dropped.
struct OwnJournald {
    child: Option<Child>,
    /// Its own log (standard error), for a failure message.
    log: tempfile::NamedTempFile,
}

impl OwnJournald {
    /// Starts it and waits up to 10 s for its socket to answer.
    fn start() -> Result<OwnJournald, String> {
        let bin = journald_bin().ok_or("systemd-journald is not installed")?;
        let log = tempfile::NamedTempFile::new().map_err(|e| format!("a temporary file: {e}"))?;
        let stderr = log.reopen().map_err(|e| format!("a temporary file: {e}"))?;
        let mut cmd = Command::new(bin);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            // journald's own messages (started, stopped, a dirty file replaced) go to the
            // kernel's log by default, which the machine's journald reads: to its stderr.
            .env("SYSTEMD_LOG_TARGET", "console")
            // Not a service of whichever systemd runs this test.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .process_group(0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e}"))?;
        let mut j = OwnJournald {
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if journald_answers() {
                return Ok(j);
            }
            if let Some(status) = j.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(format!("{bin} exited at start: {status}\n{}", j.said()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "started {bin}, but nothing answers on {JOURNAL_SOCKET}\n{}",
            j.said()
        ))
    }

    /// What it logged.
    fn said(&self) -> String {
        fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Sends it `signal` and waits until it is gone (SIGKILL after 10 s).
    fn stop(&mut self, signal: Signal) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("journald did not stop within 10 s of {signal}: killed");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops it with `signal` (SIGTERM: a clean stop; SIGKILL: a crash, its journal file
    /// left dirty), starts another and waits until it answers.
    fn restart(&mut self, signal: Signal) {
        self.stop(signal);
        *self = OwnJournald::start().unwrap_or_else(|e| panic!("journald: {e}"));
    }
}

impl Drop for OwnJournald {
    fn drop(&mut self) {
        self.stop(Signal::SIGTERM);
    }
}

/// The agent's `journalctl` follower, when one runs.
fn follower(a: &Agent) -> Option<i32> {
    a.children()
        .into_iter()
        .find(|(_, comm, _)| comm == "journalctl")
        .map(|(pid, _, _)| pid)
}

fn realtime_usec(e: &Value) -> u128 {
    e["__REALTIME_TIMESTAMP"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn now_usec() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

// ---- The scenarios ----

/// journald stopped and started again under the running agent, cleanly and by a crash: what
/// gridd logs once journald is back reaches status.json, and the agent's own lines reach the
/// new journald. The journald stopped is the test's own (see "journald" above).
#[test]
fn scenario_journald_restarted_under_the_agent() {
    // The other scenarios of this binary use the machine's journald (started where none runs):
    // made sure of here, in the machine's namespace, before this one leaves it.
    sim::ensure_journald();
    let name = std::thread::current()
        .name()
        .unwrap_or("scenario_journald_restarted_under_the_agent")
        .to_string();
    // A thread of its own: the namespace goes with it, whatever happens.
    let scenario = std::thread::Builder::new()
        .name(name)
        .spawn(journald_restarted_under_the_agent)
        .unwrap();
    if let Err(panic) = scenario.join() {
        std::panic::resume_unwind(panic);
    }
}

fn journald_restarted_under_the_agent() {
    if let Err(e) = private_journal_dirs() {
        skipped(&format!("no journal of the test's own: {e}"));
        return;
    }
    // Declared first, dropped last: stopped once the agent and the simulator are gone.
    let mut journald = OwnJournald::start().unwrap_or_else(|e| panic!("journald: {e}"));
    let (m, a) = licensed(Setup::default());
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        let before = follower(&a);
        journald.restart(signal);
        let back = now_usec();
        let new = restart_gridd_by_hand(&m);
        a.wait_status(
            &format!("gridd's first lines after journald's restart ({signal}) in status.json"),
            T,
            |v| has_event(v, &format!("Started ({new})")) && v["state"] == "licensed",
        );
        eprintln!(
            "journald restarted ({signal}): the agent's journalctl {before:?}, now {:?}",
            follower(&a)
        );
        // The agent's own log: a reload is always logged, and must be in the new journal.
        a.signal(Signal::SIGHUP);
        wait_for(
            &format!("the agent's lines in the journal after journald's restart ({signal})"),
            T,
            || {
                m.agent_journal(a.pid())
                    .iter()
                    .any(|e| realtime_usec(e) >= back && sim::message(e).contains("reloaded"))
                    .then_some(())
            },
            || a.context(),
        );
    }
    assert!(journald_answers());
}

/// nvidia-smi hangs on every call (a wedged driver) from the agent's start, and nothing else
/// tells the state (no token, no gridd): the agent keeps running and its loop never stalls,
/// the report says `unknown` (a hung nvidia-smi says nothing of the driver: not `no_driver`)
/// with a note naming the time limit, and no nvidia-smi outlives its limit or the agent.
#[test]
fn scenario_nvidia_smi_hanging_on_every_call() {
    let m = Machine::new(Setup {
        command_timeout: 2,
        ..setup(|s| s.smi_mode = SmiMode::Hang)
    });
    write_gridd_conf(&m);
    let notify = Notifications::listen();
    let mut a = notify.start_agent(&m);
    let v = a.wait_status("the hung nvidia-smi in the report", T, |v| {
        notes(v).iter().any(|n| n.contains("nvidia-smi"))
    });
    assert_eq!(v["state"], "unknown", "{v:#}");
    assert_eq!(v["exit_code"], 3, "{v:#}");
    let note = notes(&v)
        .into_iter()
        .find(|n| n.contains("nvidia-smi"))
        .unwrap();
    assert!(
        note.contains("commands.timeout_seconds")
            && ["2s", "2 s", "2 seconds"].iter().any(|t| note.contains(t)),
        "the note must name the time limit (2 s, commands.timeout_seconds): {note}"
    );

    // Through several time limits: never more than one nvidia-smi at a time (each killed at
    // its limit and reaped), and the agent's loop alive all along.
    let until = Instant::now() + Duration::from_secs(12);
    let mut seen = HashSet::new();
    while Instant::now() < until {
        let smis = descendants(a.pid(), "nvidia-smi");
        assert!(
            smis.len() <= 1,
            "{} nvidia-smi under the agent: {smis:?}\n{}",
            smis.len(),
            a.context()
        );
        seen.extend(smis);
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{} nvidia-smi runs seen in 12 s, one at a time", seen.len());
    assert!(a.running(), "{}", a.context());
    notify.assert_watchdog_kept(&a);
    let v = a.status().unwrap();
    assert_eq!(v["state"], "unknown", "{v:#}");

    // A monitoring check gets UNKNOWN (3), not a guess.
    let out = Command::new(crate::common::BIN)
        .arg("--config")
        .arg(&m.config)
        .arg("status")
        .env_remove("VGPU_LICENSE_AGENT_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Stopped: no nvidia-smi left behind.
    a.signal(Signal::SIGTERM);
    let status = a
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s after SIGTERM\n{}", a.context()));
    assert_eq!(status.code(), Some(0), "{}", a.context());
    let left = wait_for(
        "no nvidia-smi left once the agent stopped",
        Duration::from_secs(10),
        || {
            let left = machine_processes(&m, "nvidia-smi");
            left.is_empty().then_some(left)
        },
        || format!("{:?}", machine_processes(&m, "nvidia-smi")),
    );
    assert!(left.is_empty());
}

/// status.json's file system full: the last good status.json stays whole, the failure is
/// logged once (not once per write), and status.json catches up once there is room again.
#[test]
fn scenario_disk_under_status_json_full() {
    let m = Machine::new(Setup::default());
    let status_dir = m.status_path().parent().unwrap().to_path_buf();
    // Room for status.json and its next copy (written beside it, then renamed over it), which
    // a filler then takes.
    let Some(_mount) = Mount::tmpfs(&status_dir, "size=16k,mode=0755") else {
        skipped("no tmpfs can be mounted here (needs root with CAP_SYS_ADMIN)");
        return;
    };
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    settle(&m, &a);
    let good = fs::read(m.status_path()).unwrap();

    let filler_path = status_dir.join("filler");
    let mut filler = fs::File::create(&filler_path).unwrap();
    // Small pieces, so that not a byte of room is left.
    while filler.write_all(&[0u8; 512]).is_ok() {}
    drop(filler);

    // The token taken away and put back, again and again: each time a new report (the
    // missing token said, then gone), published at once (the metrics file, on another file
    // system, shows it), and not one of them fits into status.json. Ends with the token away.
    let token = m.token_path();
    let aside = m.path("aside.tok");
    let missing = "vgpu_license_failure{reason=\"token_missing\"}";
    for round in 1..=3 {
        fs::rename(&token, &aside).unwrap();
        wait_for(
            "the missing token in the metrics",
            T,
            || (a.metric(missing) == Some(1.0)).then_some(()),
            || a.context(),
        );
        if round < 3 {
            fs::rename(&aside, &token).unwrap();
            wait_for(
                "the token back in the metrics",
                T,
                || (a.metric(missing) == Some(0.0)).then_some(()),
                || a.context(),
            );
        }
        assert_eq!(
            fs::read(m.status_path()).unwrap(),
            good,
            "status.json changed on a full disk\n{}",
            a.context()
        );
        // Whole, valid JSON (and valid against the schema).
        a.status().unwrap();
    }

    let status = m.status_path().display().to_string();
    let failures = || -> Vec<String> {
        m.agent_journal(a.pid())
            .iter()
            .map(sim::message)
            .filter(|msg| msg.contains(&status))
            .collect()
    };
    wait_for(
        "the write failure in the agent's journal",
        T,
        || (!failures().is_empty()).then_some(()),
        || a.context(),
    );
    // Time for any later line to reach the journal.
    std::thread::sleep(Duration::from_secs(2));
    let logged = failures();
    assert!(logged[0].contains("No space left on device"), "{logged:#?}");

    // Room again: status.json catches up with the last report by itself (at the latest with
    // its heartbeat), with nothing new happening; and takes the next change at once.
    fs::remove_file(&filler_path).unwrap();
    a.wait_status(
        "status.json written again: the token missing",
        Duration::from_secs(60),
        |v| reason(v) == Some("token_missing"),
    );
    fs::rename(&aside, &token).unwrap();
    a.wait_status("status.json: the token back", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    let names: Vec<String> = fs::read_dir(&status_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["status.json"], "a temporary file left behind");
    // Checked last, so that a failure here still shows that the rest holds.
    assert_eq!(
        logged.len(),
        1,
        "the failure to write status.json logged {} times for 5 failed writes or more: once \
         is enough, until it can be written again\n{logged:#?}",
        logged.len()
    );
}

/// A small random generator (xorshift64), seeded from the clock; the seed is printed so that
/// a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn from_clock() -> Rng {
        let seed = std::env::var("VGPU_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            })
            | 1;
        eprintln!("random seed: {seed} (VGPU_TEST_SEED={seed} replays it)");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// SIGTERM at random moments while the agent rewrites status.json again and again (gridd
/// restarted in a loop: every restart is a new report): status.json is replaced whole, so
/// that neither a reader meanwhile nor one after the stop ever finds half of it, and the
/// stop leaves no temporary file behind.
#[test]
fn scenario_sigterm_at_random_moments_never_leaves_status_json_half_written() {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let mut rng = Rng::from_clock();
    let stop = Arc::new(AtomicBool::new(false));
    let restarted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let restarter = {
        let (stop, restarted, sim_dir, bin) = (
            stop.clone(),
            restarted.clone(),
            m.sim.clone(),
            sim::program("sim-restart-gridd"),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let ok = Command::new(&bin)
                    .arg("--sim-dir")
                    .arg(&sim_dir)
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                restarted.fetch_add(usize::from(ok), Ordering::Relaxed);
            }
        })
    };
    let reader = {
        let (stop, path) = (stop.clone(), m.status_path());
        std::thread::spawn(move || {
            let mut reads = 0usize;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(bytes) = fs::read(&path) {
                    reads += 1;
                    if serde_json::from_slice::<Value>(&bytes).is_err() {
                        return Err(String::from_utf8_lossy(&bytes).into_owned());
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(reads)
        })
    };

    let status_dir = m.status_path().parent().unwrap().to_path_buf();
    // At least 8 rounds, and as many more as it takes for gridd to have been restarted 8
    // times under them (a gridd restart takes longer on a loaded machine); a restarter that
    // does nothing ends it at 40 rounds, and fails below.
    let mut round = 0;
    while round < 8 || (restarted.load(Ordering::Relaxed) < 8 && round < 40) {
        round += 1;
        let spawned = Instant::now();
        let mut a = Agent::start(&m);
        let pid = a.pid();
        wait_for(
            "this agent's first report",
            T,
            || a.status().filter(|v| v["agent_pid"] == pid),
            || a.context(),
        );
        let first = spawned.elapsed();
        let after = rng.below(2000);
        std::thread::sleep(Duration::from_millis(after));
        a.signal(Signal::SIGTERM);
        let signalled = Instant::now();
        let status = a.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| {
            panic!(
                "round {round}: still running 15 s after SIGTERM\n{}",
                a.context()
            )
        });
        assert_eq!(status.code(), Some(0), "round {round}\n{}", a.context());
        eprintln!(
            "round {round}: first report after {first:?}, SIGTERM {after} ms later, gone {:?} after it",
            signalled.elapsed()
        );
        // Whole (or removed by the stop), never half written.
        let _ = a.status();
        let mut names: Vec<String> = fs::read_dir(&status_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.retain(|n| n != "status.json");
        assert!(
            names.is_empty(),
            "round {round} (SIGTERM {after} ms after the first report): left behind: {names:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    restarter.join().unwrap();
    let restarts = restarted.load(Ordering::Relaxed);
    let reads = reader
        .join()
        .unwrap()
        .unwrap_or_else(|half| panic!("a reader found status.json half written:\n{half}"));
    eprintln!("{round} rounds, {restarts} gridd restarts, {reads} reads of status.json, all whole");
    assert!(restarts >= 8, "too little activity: {restarts} restarts");
    assert!(reads >= 100, "too few reads: {reads}");
}

/// The `[service]` key `key` of the machine's config.
fn config_number(m: &Machine, key: &str) -> usize {
    m.config_text()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("{key} in the config"))
}

/// gridd crash-looping: every gridd dies a second after it starts. The agent restarts it
/// while its budget allows, `restart_budget_per_hour` times and not once more, then says
/// that gridd is not running.
#[test]
fn scenario_gridd_crash_looping_stays_within_the_restart_budget() {
    let (m, a) = licensed(Setup::default());
    let budget = config_number(&m, "restart_budget_per_hour");
    let mut crashed: Vec<i32> = Vec::new();
    let mut current: Option<(i32, Instant)> = None;
    // Crash every gridd until the budget is spent, and then for longer than the backoff's
    // longest wait and a unit check: a restart past the budget would come in that window.
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut spent: Option<Instant> = None;
    while spent.is_none_or(|t| t.elapsed() < Duration::from_secs(20)) {
        assert!(
            Instant::now() < give_up,
            "the budget ({budget}) not spent in 120 s: {} restarts\n{}",
            m.restarts(),
            a.context()
        );
        if let Some(pid) = m.gridd_pid() {
            match current {
                Some((p, born)) if p == pid => {
                    if born.elapsed() >= Duration::from_secs(1) && crashed.last() != Some(&pid) {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                        crashed.push(pid);
                    }
                }
                _ => current = Some((pid, Instant::now())),
            }
        }
        if spent.is_none() && m.restarts() >= budget {
            spent = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let restarts = m.restarts();
    eprintln!("{} gridds crashed, {restarts} restarts", crashed.len());
    assert_eq!(
        restarts,
        budget,
        "restarts of a crash-looping gridd: {restarts}, budget {budget} per hour\n{}",
        a.context()
    );
    // gridd stays down now: said, and counted right.
    let v = a.wait_status("gridd_not_running reported", T, |v| {
        reason(v) == Some("gridd_not_running")
    });
    assert!(
        v["failure"]["advice"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{v:#}"
    );
    wait_for(
        "every restart in the metrics",
        T,
        || (a.metric("vgpu_license_gridd_restarts_total") == Some(restarts as f64)).then_some(()),
        || a.context(),
    );
    assert_eq!(m.restarts(), budget, "{}", a.context());
}

/// The token directory removed and made again, twice: once at once (the directory and the
/// token in it), once as a slow hand does it (the directory, then a while later the token).
/// Either way the agent reports the missing token meanwhile, and adopts the token dropped
/// into the new directory (here with the wrong mode, which only its adoption fixes) as soon
/// as it is there.
#[test]
fn scenario_token_directory_briefly_missing() {
    // The first look that no change causes comes 2 s after the start (30 s by default).
    let setup = Setup {
        service_extra: "first_token_look_seconds = 2\n".into(),
        ..Setup::default()
    };
    let mut started = Instant::now();
    let (m, a) = licensed_with(setup, |m| {
        started = Instant::now();
        Agent::start(m)
    });
    let dir = m.token_dir();
    for pause in [Duration::ZERO, Duration::from_secs(3)] {
        if !pause.is_zero() {
            // Besides its watch, the agent looks at the token directory on a timer: once soon
            // after its start (2 s here), then every few minutes. Past that first look, only a
            // watch on the new directory can notice the token within the deadline.
            let first_look = started + Duration::from_secs(4);
            std::thread::sleep(first_look.saturating_duration_since(Instant::now()));
        }
        fs::remove_dir_all(&dir).unwrap();
        a.wait_status("the missing token reported", T, |v| {
            reason(v) == Some("token_missing")
        });
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        std::thread::sleep(pause);
        m.drop_token(0o600);
        let dropped = Instant::now();
        wait_for(
            &format!(
                "the token dropped {pause:?} after its directory was made again adopted (mode 0744)"
            ),
            T,
            || (mode(&m.token_path()) == Some(0o744)).then_some(()),
            || {
                format!(
                    "token mode {:o}\n{}",
                    mode(&m.token_path()).unwrap_or(0),
                    a.context()
                )
            },
        );
        eprintln!(
            "token dropped {pause:?} after its directory: adopted after {:?}",
            dropped.elapsed()
        );
        a.wait_status("the token back in the report", T, |v| {
            v["state"] == "licensed" && v["failure"].is_null()
        });
        assert_eq!(fs::read(m.token_path()).unwrap(), m.token());
    }
}

/// A FIFO planted in the token directory as `planted.tok`: the agent never opens it (a read
/// would block until a writer came): it moves it aside, says so, goes on working (the
/// watchdog pinged all along), and adopts the valid token dropped afterwards.
#[test]
fn scenario_a_fifo_planted_in_the_token_directory() {
    let notify = Notifications::listen();
    let (m, a) = licensed_with(Setup::default(), |m| notify.start_agent(m));
    let fifo = m.token_dir().join("planted.tok");
    mkfifo(&fifo);
    wait_for(
        "the FIFO moved out of the token directory",
        T,
        || fs::symlink_metadata(&fifo).is_err().then_some(()),
        || a.context(),
    );
    // Moved as it is, to where install keeps what it moves aside.
    let replaced = m.path("var/lib/vgpu-license-agent/replaced");
    let moved = fs::read_dir(&replaced)
        .unwrap()
        .map(|d| d.unwrap().path().join("planted.tok"))
        .find(|p| fs::symlink_metadata(p).is_ok())
        .expect("planted.tok kept under replaced/");
    assert!(fs::symlink_metadata(&moved).unwrap().file_type().is_fifo());
    wait_for(
        "the move in the agent's log",
        T,
        || agent_says(&m, &a).contains("planted.tok").then_some(()),
        || a.context(),
    );

    // cloud-init's write_files, with the wrong mode: adopted.
    m.drop_token(0o600);
    wait_for(
        "the token dropped after the FIFO adopted (mode 0744)",
        T,
        || (mode(&m.token_path()) == Some(0o744)).then_some(()),
        || a.context(),
    );
    a.wait_status("licensed, nothing wrong", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    notify.assert_watchdog_kept(&a);
}

/// A FIFO at the token's own path: reported as an unusable token at once (never opened for
/// reading: that would block), the agent goes on working (gridd's later lines reach
/// status.json, the watchdog pinged all along), and a valid token put in its place is
/// adopted.
#[test]
fn scenario_a_fifo_at_the_token_path() {
    let notify = Notifications::listen();
    let (m, a) = licensed_with(Setup::default(), |m| notify.start_agent(m));
    let token_path = m.token_path();
    fs::remove_file(&token_path).unwrap();
    mkfifo(&token_path);
    let v = a.wait_status("the FIFO reported", T, |v| {
        reason(v) == Some("token_invalid")
    });
    let message = v["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("FIFO"), "{v:#}");

    // Still working: a new gridd's lines reach status.json while the FIFO is there.
    let new = restart_gridd_by_hand(&m);
    a.wait_status("the new gridd's lines in status.json", T, |v| {
        has_event(v, &format!("Started ({new})"))
    });
    assert!(
        fs::symlink_metadata(&token_path)
            .unwrap()
            .file_type()
            .is_fifo()
    );

    // A valid token renamed over it (with the wrong mode): adopted, gridd licensed again.
    let staged = m.path("staged.tok");
    sim::write_mode(&staged, &m.token(), 0o600);
    fs::rename(&staged, &token_path).unwrap();
    wait_for(
        "the token put in the FIFO's place adopted (mode 0744)",
        T,
        || (mode(&token_path) == Some(0o744)).then_some(()),
        || a.context(),
    );
    a.wait_status("licensed, nothing wrong", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    notify.assert_watchdog_kept(&a);
}

/// The service's heartbeat and a margin: how long an output may wait to be written.
const HEARTBEAT_AND_MORE: Duration =
    Duration::from_secs(vgpu_license_agent::service::core::HEARTBEAT.as_secs() + 40);

/// The metrics textfile's directory swapped, by the user whose home holds it (prometheus's
/// `/var/lib/prometheus` on Debian), for a link to the token directory: the agent writes
/// nothing there (so nothing is adopted, moved or restarted for it), says why in its log,
/// and goes on writing status.json.
#[test]
fn scenario_the_metrics_directory_swapped_for_another_users_link() {
    let (m, a) = licensed_with(Setup::default(), Agent::start);
    let home = m.path("var/lib/prometheus");
    let exporter = home.join("node-exporter");
    // The home is the other user's, as Debian makes it; the swap is theirs too.
    std::os::unix::fs::chown(&home, Some(65534), None).unwrap();
    fs::remove_dir_all(&exporter).unwrap();
    std::os::unix::fs::symlink(m.token_dir(), &exporter).unwrap();
    std::os::unix::fs::lchown(&exporter, Some(65534), None).unwrap();
    let restarts = m.restarts();
    let token_dir_before = names(&m.token_dir());
    wait_for(
        "the refusal in the agent's log (at the next heartbeat)",
        HEARTBEAT_AND_MORE,
        || {
            agent_says(&m, &a)
                .contains("root follows no link another user could have made")
                .then_some(())
        },
        || a.context(),
    );
    // Heartbeats go on writing status.json; none of them writes into the token directory.
    let written = a.status().unwrap()["observed_at"].clone();
    wait_for(
        "status.json written again",
        HEARTBEAT_AND_MORE,
        || (a.status().unwrap()["observed_at"] != written).then_some(()),
        || a.context(),
    );
    assert_eq!(names(&m.token_dir()), token_dir_before, "{}", a.context());
    assert_eq!(m.restarts(), restarts, "{}", a.context());
    assert!(
        !agent_says(&m, &a).contains("vgpu_license_agent.prom is not"),
        "{}",
        a.context()
    );
    // The operator makes it a real directory again: written there at the next heartbeat.
    fs::remove_file(&exporter).unwrap();
    fs::create_dir(&exporter).unwrap();
    wait_for(
        "the metrics written again",
        HEARTBEAT_AND_MORE,
        || {
            fs::read_to_string(m.metrics_path())
                .ok()
                .filter(|t| t.contains("vgpu_license_state"))
        },
        || a.context(),
    );
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// A pids cgroup of the test's own (cgroup v1's `pids` controller, as systemd's `TasksMax=`
/// sets for a unit), holding one process; removed again when dropped.
struct TasksMax {
    dir: PathBuf,
}

impl TasksMax {
    /// Moves process `pid` (all its threads) into a new cgroup whose limit is what it runs
    /// now: it can make no process or thread more.
    fn reached(pid: u32) -> TasksMax {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/pids/vgpu-license-test-{pid}"));
        fs::create_dir(&dir).expect("a pids cgroup can be made (cgroup v1, pids controller)");
        let t = TasksMax { dir };
        fs::write(t.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        let current = fs::read_to_string(t.dir.join("pids.current")).unwrap();
        t.set(current.trim());
        t
    }

    fn set(&self, max: &str) {
        fs::write(self.dir.join("pids.max"), max).unwrap();
    }

    /// How many forks or clones the limit refused.
    fn refused(&self) -> u64 {
        let events = fs::read_to_string(self.dir.join("pids.events")).unwrap();
        events
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for TasksMax {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.split_whitespace() {
            let _ = fs::write("/sys/fs/cgroup/pids/cgroup.procs", p);
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// The agent at its own limits (its unit's `TasksMax=` reached: EAGAIN for every fork, as
/// `RLIMIT_NPROC` gives too) says so, and the last reading stands: a licensed guest stays
/// licensed, stale, never `no_driver` with a driver fix. Once it can start commands again,
/// the readings go on.
#[test]
fn scenario_the_agent_at_its_own_limits_keeps_the_last_reading() {
    let (m, a) = licensed_with(Setup::default(), Agent::start);
    let limit = TasksMax::reached(a.pid());
    let v = a.wait_status("the agent's own trouble in the report", T, |v| {
        v["notes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n.as_str().is_some_and(|n| n.contains("could not start")))
        })
    });
    assert!(limit.refused() > 0, "the limit was reached");
    assert_eq!(v["state"], "licensed", "{v}");
    assert!(v["failure"].is_null(), "{v}");
    let stale = v["observed_at"].clone();
    // Readings every 2 s, none of which can start.
    std::thread::sleep(Duration::from_secs(5));
    let v = a.status().unwrap();
    assert_eq!(v["state"], "licensed", "{v}");
    assert_eq!(
        v["observed_at"], stale,
        "the last reading's time stays: {v}"
    );
    assert!(
        agent_says(&m, &a).contains("the agent could not start"),
        "{}",
        a.context()
    );
    limit.set("max");
    a.wait_status("readings again, the note gone", T, |v| {
        v["observed_at"] != stale && !v.to_string().contains("could not start")
    });
}

/// One agent, one budget. A second `run` beside the service (an operator's by hand) is
/// refused at once with the running one's pid, and restarts nothing. The restarts of gridd
/// outlive the agent: once a crash-looping gridd has spent `restart_budget_per_hour`, an
/// agent restarted in the same boot (systemd's `Restart=`, an upgrade) does not start
/// spending a fresh one.
#[test]
fn scenario_one_agent_one_budget() {
    let (m, mut a) = licensed(Setup::default());
    let budget = config_number(&m, "restart_budget_per_hour");
    let second = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .arg("--config")
        .arg(&m.config)
        .args(["run", "--log-stderr"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "another vgpu-license-agent service is running (pid {})",
            a.pid()
        )),
        "{said}"
    );
    // Crash gridd until the budget is spent.
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut last_killed = None;
    while m.restarts() < budget {
        assert!(
            Instant::now() < give_up,
            "budget not spent: {}",
            a.context()
        );
        if let Some(pid) = m.gridd_pid().filter(|p| Some(*p) != last_killed) {
            std::thread::sleep(Duration::from_millis(500));
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            last_killed = Some(pid);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The agent restarted, as systemd's Restart= would.
    a.signal(Signal::SIGTERM);
    assert!(a.wait_exit(T).is_some(), "{}", a.context());
    if let Some(pid) = m.gridd_pid() {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let b = Agent::start(&m);
    b.wait_status("gridd_not_running reported by the new agent", T, |v| {
        reason(v) == Some("gridd_not_running")
    });
    // Past the backoff's longest wait: a fresh budget would have restarted gridd by now.
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(m.restarts(), budget, "{}", b.context());
    assert!(
        agent_says(&m, &b).contains("count against this hour's budget"),
        "{}",
        b.context()
    );
}

/// `config check --reload PID` (the unit's `ExecReload=`) signals only the running service,
/// the process that holds its lock: never another process named like the agent (a
/// `status --wait` of an operator's, which SIGHUP would end).
#[test]
fn scenario_reload_signals_only_the_service() {
    let (m, a) = licensed(Setup::default());
    // A process whose name is the agent's, as `status --wait` is.
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("vgpu-license-agent");
    fs::copy("/bin/sleep", &named).unwrap();
    // Through a copy no thread of this process had open for writing (ETXTBSY otherwise).
    crate::common::make_executable(&named);
    let mut other = Command::new(&named).arg("60").spawn().unwrap();
    let reload = |pid: u32| m.cli(&["config", "check", "--reload", &pid.to_string()]);
    let out = reload(other.id());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing was signalled"),
        "{out:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        other.try_wait().unwrap().is_none(),
        "the other process was not signalled"
    );
    let _ = other.kill();
    let _ = other.wait();
    let out = reload(a.pid());
    assert!(out.status.success(), "{out:?}");
    wait_for(
        "the service reloaded",
        T,
        || agent_says(&m, &a).contains("config reloaded").then_some(()),
        || a.context(),
    );
}
