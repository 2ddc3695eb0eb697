//! nvidia-gridd's unit and process operations: whether its unit (or, without one, its
//! process) runs, and its restart with the configured command.

pub mod command;

use crate::model::config::Settings;

/// How long a `deactivating` unit is asked again before it counts as not running.
const DEACTIVATING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

use crate::model::observe::unit::UnitState;

/// What systemd says of nvidia-gridd's unit (or, without one, whether its process runs);
/// `None` when systemctl cannot answer (no systemd here).
///
/// A unit that is `deactivating` is asked again for a few seconds: in a restart (an
/// operator's `systemctl restart`) it passes on to `activating`, and only a stop ends in
/// `inactive`. An `inactive` or `failed` unit that systemd holds a start job for (a restart
/// between its stop and its start, a `systemctl --no-block restart` queued at boot behind the
/// units it is ordered after) is coming back, not stopped; so is one that is active when
/// asked again after the job question (the restart ended in between). Taken for "not
/// running", a restart by hand would be followed by the agent's own.
pub fn unit_state(settings: &Settings) -> Option<UnitState> {
    // On a GPU Operator node gridd has no unit: the driver pod's state says more.
    if settings.commands.smi_root.is_some() {
        return None;
    }
    let argv = vec![
        settings.commands.systemctl.clone(),
        "is-active".into(),
        settings.gridd.unit.clone(),
    ];
    let deadline = std::time::Instant::now() + DEACTIVATING_WAIT;
    let state = loop {
        let out = command::run(&argv, settings.commands.timeout).ok()?;
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if state != "deactivating" || std::time::Instant::now() >= deadline {
            break state;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    let running = |s: &str| matches!(s, "active" | "reloading" | "activating");
    let unit = || settings.gridd.unit.clone();
    let not_installed = || UnitState::NotInstalled { unit: unit() };
    Some(match state.as_str() {
        s if running(s) => UnitState::Active,
        "inactive" | "failed" if start_queued(settings) => UnitState::StartQueued(state),
        // A restart that ended between the two questions: its job is gone and the unit is
        // up again. Asked once more, the unit says so.
        "inactive" | "failed"
            if command::run(&argv, settings.commands.timeout)
                .is_ok_and(|o| running(String::from_utf8_lossy(&o.stdout).trim())) =>
        {
            UnitState::Active
        }
        // systemd answers `inactive` for a unit that does not exist at all: its fix is the
        // driver that brings it, not `systemctl enable`.
        "inactive" if !unit_exists(settings) => not_installed(),
        "inactive" | "failed" | "deactivating" => UnitState::Stopped {
            unit: unit(),
            state,
        },
        // gridd started by hand, or by a driver container, runs without a unit.
        "unknown" if gridd_process_runs() => UnitState::WithoutUnit,
        // "unknown" for a unit that does not exist, nothing when systemd is not running.
        "unknown" => not_installed(),
        _ => return None,
    })
}

/// Whether systemd knows gridd's unit (`LoadState` other than `not-found`); when it cannot
/// say, the unit is taken to exist.
fn unit_exists(settings: &Settings) -> bool {
    let argv = vec![
        settings.commands.systemctl.clone(),
        "show".into(),
        "-p".into(),
        "LoadState".into(),
        "--value".into(),
        settings.gridd.unit.clone(),
    ];
    command::run(&argv, settings.commands.timeout).map_or(true, |out| {
        String::from_utf8_lossy(&out.stdout).trim() != "not-found"
    })
}

/// Whether the restart command restarts gridd's systemd unit (it names the unit, as the
/// default `systemctl restart nvidia-gridd.service` does) and systemd says there is no such
/// unit: then the restart could only fail ("Unit ... not found"). Another restart command
/// (a script, gridd without a unit) is run as configured.
pub fn restart_unit_missing(settings: &Settings) -> bool {
    crate::model::restart::command_restarts_unit(settings) && !unit_exists(settings)
}

/// Whether systemd holds a job that starts gridd's unit (`systemctl list-jobs`: `ID UNIT TYPE
/// STATE`; a restart's job is a start job once its stop is done).
fn start_queued(settings: &Settings) -> bool {
    let unit = &settings.gridd.unit;
    let argv = vec![
        settings.commands.systemctl.clone(),
        "list-jobs".into(),
        "--no-legend".into(),
        unit.clone(),
    ];
    let Ok(out) = command::run(&argv, settings.commands.timeout) else {
        return false;
    };
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 3
            && (f[1] == unit || f[1].strip_suffix(".service") == Some(unit.as_str()))
            && matches!(
                f[2],
                "start" | "restart" | "try-restart" | "reload-or-start"
            )
    })
}

/// Whether nvidia-gridd runs as a process: named `nvidia-gridd` (`/proc/*/comm`) and run from
/// a program file of that name (`/proc/*/exe`, as its own mount namespace names it: a driver
/// container's `/usr/bin/nvidia-gridd` too).
pub fn gridd_process_runs() -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .any(|e| {
            std::fs::read(e.path().join("comm"))
                .is_ok_and(|c| c.trim_ascii_end() == b"nvidia-gridd")
                && std::fs::read_link(e.path().join("exe"))
                    .is_ok_and(|x| x.file_name().is_some_and(|n| n == "nvidia-gridd"))
        })
}

/// Whether process `pid` is still a running gridd (named `nvidia-gridd`, neither a zombie
/// nor dead): the process of a line gridd logged, looked at again. One read of
/// `/proc/PID/stat`; no question to systemd.
pub fn still_runs(pid: u32) -> bool {
    crate::gridd::command::process_runs(pid, "nvidia-gridd")
}

/// Runs the configured restart command with the configured time limit.
pub fn restart_gridd(settings: &Settings) -> Result<(), String> {
    let _under_way = UnderWay::begin();
    let cmd = &settings.commands.restart_gridd;
    match crate::gridd::command::run(cmd, settings.commands.timeout) {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "{}{}",
            out.status,
            out.last_line()
                .map(|l| format!(": {l}"))
                .unwrap_or_default()
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Restarts of gridd under way in this process: a stop of the service waits for them
/// ([`wait_for_restarts`]), since a restart command killed halfway (a script that stops gridd,
/// then starts it) can leave gridd stopped. (`systemctl restart` queues a job that outlives its
/// client; a script of the config's does not.)
static RESTARTS_UNDER_WAY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One restart under way, for as long as it lives.
struct UnderWay;

impl UnderWay {
    fn begin() -> UnderWay {
        RESTARTS_UNDER_WAY.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        UnderWay
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        RESTARTS_UNDER_WAY.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits, at most `limit`, until no restart of gridd is under way; whether none is.
pub fn wait_for_restarts(limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if RESTARTS_UNDER_WAY.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether a restart of gridd is under way in this process.
pub fn restart_under_way() -> bool {
    RESTARTS_UNDER_WAY.load(std::sync::atomic::Ordering::SeqCst) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process named nvidia-gridd runs; killed and not yet reaped (a zombie) it does not.
    #[test]
    fn a_gridd_runs_until_it_dies_zombie_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("nvidia-gridd");
        crate::files::fsutil::write_test_program(&bin, "#!/bin/sh\nwhile :; do sleep 1; done\n");
        let mut child = std::process::Command::new(&bin).spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !still_runs(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(still_runs(pid), "a running nvidia-gridd");
        assert!(!still_runs(std::process::id()), "another name");
        child.kill().unwrap();
        let zombie = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
            && std::time::Instant::now() < zombie
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!still_runs(pid), "a zombie is not running");
        child.wait().unwrap();
        assert!(!still_runs(pid), "gone");
    }
}
