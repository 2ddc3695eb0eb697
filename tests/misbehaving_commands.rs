//! nvidia-smi that misbehaves, run in the agent's own process as the service runs it: a
//! daemon of another session left holding its output, output without end. Each read ends
//! with what nvidia-smi printed (or a one-line error), and leaves no descriptor, no thread and
//! no process behind.

use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::common::sim::{GpuState, SimConfig, SmiMode, program};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use vgpu_license_agent::gridd::command;
use vgpu_license_agent::observe::live;
use vgpu_license_model::assemble::SmiRead;
use vgpu_license_model::config::Settings;
use vgpu_license_model::observe::smi::{LicenseStatus, classify_status};

/// The tests of this module measure the whole process (CPU seconds, descriptors): one at a
/// time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A guest whose nvidia-smi is the simulator's, in `mode`, with a licensed GPU.
struct Guest {
    /// The guest's root, removed with it.
    _dir: tempfile::TempDir,
    sim: PathBuf,
    settings: Settings,
}

impl Guest {
    fn new(mode: SmiMode) -> Guest {
        let dir = tempfile::Builder::new()
            .prefix("vgpu-cmd-")
            .tempdir()
            .unwrap();
        let r = dir.path();
        let sim = r.join("sim");
        fs::create_dir_all(&sim).unwrap();
        SimConfig {
            smi_mode: mode,
            ..SimConfig::default()
        }
        .save(&sim)
        .unwrap();
        let now = chrono::Utc::now().timestamp();
        GpuState {
            licensed: true,
            expiry: Some(now + 86400),
            edition: Some("NVIDIA RTX Virtual Workstation".into()),
            server: Some("dls.example".into()),
            unlicensed_since: 0,
        }
        .save(&sim)
        .unwrap();
        let smi = r.join("bin/nvidia-smi");
        crate::common::sim::write_program(
            &smi,
            format!(
                "#!/bin/sh\nexec '{}' --sim-dir '{}' \"$@\"\n",
                program("sim-nvidia-smi").display(),
                sim.display()
            )
            .as_bytes(),
        );
        let config = r.join("agent/config.toml");
        fs::create_dir_all(config.parent().unwrap()).unwrap();
        // A limit far beyond any of these reads: one that ends by the limit fails the test
        // by its error, not by a clock.
        fs::write(
            &config,
            format!(
                "{}[commands]\nnvidia_smi = \"{}\"\ntimeout_seconds = 600\n",
                crate::common::paths_toml(r),
                smi.display()
            ),
        )
        .unwrap();
        let settings = vgpu_license_agent::config::load(&config).unwrap();
        Guest {
            _dir: dir,
            sim,
            settings,
        }
    }

    fn holders(&self) -> Vec<i32> {
        fs::read_to_string(self.sim.join("holders"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        // The holders are in sessions of their own: nothing the agent does ends them.
        for pid in self.holders() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's threads that run as the calling thread's name: those it started (a
/// thread's name is its creator's unless set). The test harness's threads for the other
/// tests have their own names.
fn threads_named_as_me() -> usize {
    let me = fs::read_to_string("/proc/thread-self/comm").unwrap();
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| *c == me)
        .count()
}

fn licensed_snapshot(read: SmiRead) {
    let SmiRead::Snapshot(snap) = read else {
        panic!("nvidia-smi read failed: {}", read.reason());
    };
    assert!(snap.whole, "the whole output was read: {snap:?}");
    assert_eq!(snap.gpus.len(), 1, "{snap:?}");
    let status = snap.gpus[0].license_status.as_deref().unwrap_or_default();
    assert!(
        matches!(classify_status(status), LicenseStatus::Licensed { .. }),
        "license status {status:?}"
    );
}

/// CPU seconds (user + system) of this process and of its reaped children.
fn cpu_seconds() -> (f64, f64) {
    use nix::sys::resource::{UsageWho, getrusage};
    let secs = |who| {
        let u = getrusage(who).unwrap();
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    };
    (secs(UsageWho::RUSAGE_SELF), secs(UsageWho::RUSAGE_CHILDREN))
}

fn gone(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_err()
}

#[test]
fn output_held_open_by_another_session_is_complete_when_nvidia_smi_exits() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let g = Guest::new(SmiMode::DetachedHolder);
    licensed_snapshot(live::read_smi(&g.settings));
    let holders = g.holders();
    assert_eq!(holders.len(), 1);
    assert!(
        !gone(holders[0]),
        "the holder still runs, the pipe still open: the read did not wait for it"
    );
    // The raw output too: up to nvidia-smi's last line, nothing lost.
    let argv = vec![g.settings.commands.nvidia_smi.clone(), "-q".into()];
    let out = command::run(&argv, Duration::from_secs(600)).unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("==============NVSMI LOG=============="),
        "{text}"
    );
    assert!(
        text.trim_end()
            .ends_with("Compute Mode                          : Default"),
        "{text}"
    );
}

#[test]
fn endless_output_ends_the_read_at_the_cap_and_the_command() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let g = Guest::new(SmiMode::Endless);
    let (self_before, children_before) = cpu_seconds();
    let read = live::read_smi(&g.settings);
    let (self_after, children_after) = cpu_seconds();
    eprintln!(
        "endless nvidia-smi: CPU {:.3}s in the reading process, {:.3}s in the command",
        self_after - self_before,
        children_after - children_before
    );
    let SmiRead::Failed(why) = read else {
        panic!("an endless output was read as {read:?}");
    };
    assert!(why.contains("printed more than 8 MiB: killed"), "{why}");
    assert!(!why.contains('\n'), "one line: {why}");
    let pid: i32 = fs::read_to_string(g.sim.join("smi.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(gone(pid), "the endless nvidia-smi {pid} still runs");
}

/// The descriptors and threads of a process are counted in a process of their own: the test
/// binary run again with this test alone, since the suite's other tests open descriptors and
/// start threads at the same time.
#[test]
fn fifty_misbehaving_reads_leave_no_descriptor_or_thread() {
    const ALONE: &str = "VGPU_TESTS_ALONE";
    let name = "misbehaving_commands::fifty_misbehaving_reads_leave_no_descriptor_or_thread";
    if std::env::var_os(ALONE).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "the test alone in a process:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let held = Guest::new(SmiMode::DetachedHolder);
    let endless = Guest::new(SmiMode::Endless);
    // One of each first: whatever is opened once per process (not per call) is open now.
    licensed_snapshot(live::read_smi(&held.settings));
    assert!(matches!(
        live::read_smi(&endless.settings),
        SmiRead::Failed(_)
    ));
    let (fds, threads) = (open_fds(), threads_named_as_me());
    for _ in 0..50 {
        licensed_snapshot(live::read_smi(&held.settings));
        assert!(matches!(
            live::read_smi(&endless.settings),
            SmiRead::Failed(_)
        ));
    }
    assert_eq!(
        held.holders().len(),
        51,
        "each read left its holder running"
    );
    assert_eq!(
        open_fds(),
        fds,
        "descriptors before and after 50 calls of each"
    );
    assert_eq!(
        threads_named_as_me(),
        threads,
        "threads before and after 50 calls of each"
    );
}
