//! One agent per guest: the service holds a lock in its state directory for its whole run (a
//! second `run`, by hand beside the service, is refused with the first one's pid), and keeps
//! its restarts of gridd there, so that a restarted agent goes on spending the same
//! `restart_budget_per_hour` rather than a fresh one.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;

use serde::{Deserialize, Serialize};

use crate::files::fsutil;
use crate::files::layout::{RESTARTS_FILE, RUN_LOCK_FILE};
use crate::model::config::Settings;

/// The lock of the running service, released when dropped (or when the process ends, however
/// it ends).
#[derive(Debug)]
pub struct Instance {
    _file: File,
}

/// Takes the service's lock, or says who holds it.
pub fn lock(settings: &Settings) -> anyhow::Result<Instance> {
    let dir = &settings.paths.state_dir;
    crate::files::layout::check_state_dir(settings).map_err(|e| anyhow::anyhow!("{e}"))?;
    fsutil::create_dir_mode(dir, 0o755)
        .map_err(|e| anyhow::anyhow!("cannot make {}: {e}", crate::model::text::show_path(dir)))?;
    let path = dir.join(RUN_LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            anyhow::anyhow!("cannot open {}: {e}", crate::model::text::show_path(&path))
        })?;
    // A moment's wait: `running_pid` (a `config check --reload`) holds the lock shared for
    // an instant.
    let mut tries = 0;
    let locked = loop {
        match file.try_lock() {
            Err(std::fs::TryLockError::WouldBlock) if tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other,
        }
    };
    match locked {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let who = running_pid(settings).map_or(String::new(), |p| format!(" (pid {p})"));
            anyhow::bail!(
                "another vgpu-license-agent service is running{who}: one agent per guest, or both would restart gridd on their own budgets; look with `vgpu-license-agent status`, or stop it first (systemctl stop vgpu-license-agent)"
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            anyhow::bail!("cannot lock {}: {e}", crate::model::text::show_path(&path))
        }
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "{}", std::process::id());
    Ok(Instance { _file: file })
}

/// The pid of the running service: the process that holds the lock (`None` when none does).
pub fn running_pid(settings: &Settings) -> Option<u32> {
    let path = settings.paths.state_dir.join(RUN_LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    match file.try_lock_shared() {
        Err(std::fs::TryLockError::WouldBlock) => {}
        // Free (or unknown): no service holds it.
        _ => return None,
    }
    let mut pid = String::new();
    let _ = Read::by_ref(&mut file).take(32).read_to_string(&mut pid);
    pid.trim().parse().ok()
}

/// What is kept of the restarts: this boot's ID and each restart's time on the system's
/// monotonic clock (which a reboot starts again, as it starts gridd again).
#[derive(Debug, Serialize, Deserialize)]
struct Restarts {
    boot_id: String,
    monotonic_seconds: Vec<f64>,
}

/// The system's monotonic clock, in seconds (the clock of [`std::time::Instant`]).
pub fn monotonic_now() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}

/// The restarts an earlier run made in this boot, on a clock that started at `start` (the
/// system's monotonic seconds): negative, before it.
pub fn load_restarts(settings: &Settings, start: f64) -> Vec<f64> {
    let path = settings.paths.state_dir.join(RESTARTS_FILE);
    let Ok(bytes) =
        crate::files::input::read_file(&path, 64 << 10, crate::files::input::Links::Refuse)
    else {
        return Vec::new();
    };
    match serde_json::from_slice::<Restarts>(&bytes) {
        Ok(r) if Some(&r.boot_id) == crate::identity::boot_id().as_ref() => r
            .monotonic_seconds
            .iter()
            .filter(|t| t.is_finite())
            .map(|t| t - start)
            .collect(),
        _ => Vec::new(),
    }
}

/// Keeps `restarts` (seconds on the clock that started at `start`) for the next run.
pub fn save_restarts(settings: &Settings, start: f64, restarts: &[f64]) -> std::io::Result<()> {
    let Some(boot_id) = crate::identity::boot_id() else {
        return Ok(());
    };
    let kept = Restarts {
        boot_id,
        monotonic_seconds: restarts.iter().map(|t| t + start).collect(),
    };
    let json = serde_json::to_vec(&kept).map_err(std::io::Error::other)?;
    fsutil::write_atomic(&settings.paths.state_dir.join(RESTARTS_FILE), &json, 0o644)
}
