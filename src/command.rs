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
        let _ = tx.send(buf);
    });
    rx
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
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => break None,
        }
    };
    let Some(status) = status else {
        // The command and whatever it started in its group.
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = child.wait();
        return Err(RunError::TimedOut(timeout));
    };
    let grace = Duration::from_millis(500);
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
    fn a_missing_command_is_a_spawn_error() {
        let e = run(&["/nonexistent/cmd".into()], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, RunError::Spawn(_)));
    }
}
