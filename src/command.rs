//! Running the commands of the config (`restart_gridd`, `nvidia-smi`) with a time limit that
//! always holds: the command runs in its own process group, killed whole when time is up, and
//! a child that keeps its output open cannot make the caller wait.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Output kept from each stream, at most.
const MAX_OUTPUT: u64 = 8 << 20;

/// What a finished command left.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    /// The last non-empty line of stderr (else stdout), for a one-line error.
    pub fn last_line(&self) -> Option<String> {
        [&self.stderr, &self.stdout].iter().find_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(|l| l.chars().take(300).collect())
        })
    }
}

/// Why a command gave no output.
#[derive(Debug)]
pub enum RunError {
    /// It could not be started (not found, not executable).
    Spawn(std::io::Error),
    /// It ran past the limit and was killed.
    TimedOut(Duration),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(e) => write!(f, "cannot start it: {e}"),
            RunError::TimedOut(t) => {
                write!(
                    f,
                    "it did not finish within {}s and was killed",
                    t.as_secs()
                )
            }
        }
    }
}

impl std::error::Error for RunError {}

fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut r).take(MAX_OUTPUT).read_to_end(&mut buf);
        // Past the cap, drain: a command blocked on a full pipe would run into its limit.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
        let _ = tx.send(buf);
    });
    rx
}

/// Whether the child has exited, without reaping it: while it is a zombie its pid (and so
/// its process group's id) cannot be reused, and the group can be killed safely.
fn exited(pid: Pid) -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    matches!(
        waitid(
            Id::Pid(pid),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT
        ),
        Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) | Err(_)
    )
}

/// Process groups of the commands running now, so that a stopping service leaves none.
static RUNNING: std::sync::Mutex<Vec<Pid>> = std::sync::Mutex::new(Vec::new());

/// Keeps a process group in [`RUNNING`] while its command runs.
struct Running(Pid);

impl Running {
    fn register(pgid: Pid) -> Running {
        RUNNING.lock().unwrap_or_else(|e| e.into_inner()).push(pgid);
        Running(pgid)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| *p != self.0);
    }
}

/// Kills every command still running (and what it started), for a clean stop. Their
/// callers see them end and reap them.
pub fn kill_all() {
    for pgid in RUNNING.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = killpg(*pgid, Signal::SIGKILL);
    }
}

/// Runs `argv` with standard input closed, waiting at most `timeout`.
pub fn run(argv: &[String], timeout: Duration) -> Result<Output, RunError> {
    let (program, args) = argv.split_first().ok_or_else(|| {
        RunError::Spawn(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ))
    })?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(RunError::Spawn)?;
    let out_rx = reader(child.stdout.take().expect("piped"));
    let err_rx = reader(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + timeout;
    let pgid = Pid::from_raw(child.id() as i32);
    let _running = Running::register(pgid);
    let finished = loop {
        if exited(pgid) {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The whole group ends with its leader: what the command left running in the background
    // (holding its output open, or not) would otherwise outlive it, and the readers would
    // wait for it. The leader is not reaped yet, so the group's id is still its own.
    let _ = killpg(pgid, Signal::SIGKILL);
    let status = child.wait();
    if !finished {
        return Err(RunError::TimedOut(timeout));
    }
    let status = status.map_err(RunError::Spawn)?;
    // The pipes close once the group is gone; the grace only covers a grandchild that moved
    // to a group of its own and kept them open.
    let grace = Duration::from_secs(2);
    Ok(Output {
        status,
        stdout: out_rx.recv_timeout(grace).unwrap_or_default(),
        stderr: err_rx.recv_timeout(grace).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn output_and_status() {
        let o = run(
            &sh("echo out; echo err >&2; exit 3"),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.last_line().as_deref(), Some("err"));
    }

    #[test]
    fn a_hanging_command_is_killed_in_time() {
        let start = Instant::now();
        let e = run(&sh("sleep 30 & sleep 30"), Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_child_left_holding_the_output_loses_nothing_and_is_ended() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("pid");
        let script = format!(
            "echo first; (echo $$ >/dev/null; sleep 300) & echo $! >{}; echo last",
            crate::text::show_path(&pidfile)
        );
        let start = Instant::now();
        let o = run(&sh(&script), Duration::from_secs(20)).unwrap();
        assert!(o.status.success());
        assert_eq!(o.stdout, b"first\nlast\n");
        assert!(start.elapsed() < Duration::from_secs(10));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Gone, or a zombie of an init that has not reaped it yet. The kill is sent before
        // `run` returns; the kernel may still be tearing the process down (its files are
        // closed before it leaves the run queue), so allow it a moment.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.split_whitespace().nth(2).is_none_or(|s| s != "Z"))
        };
        let until = Instant::now() + Duration::from_secs(5);
        while alive() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(), "the background child {pid} outlived its command");
    }

    #[test]
    fn a_missing_command_is_a_spawn_error() {
        let e = run(&["/nonexistent/cmd".into()], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, RunError::Spawn(_)));
    }
}
