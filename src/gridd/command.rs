//! Running the commands of the config (`restart_gridd`, `nvidia-smi`) with a time limit that
//! always holds: the command runs in its own process group, killed whole when time is up.
//! Its output is complete when the command itself exits, whoever else still holds the pipes
//! (a daemon it started in a session of its own); a command that prints more than the cap is
//! stopped at the cap. One thread reads both pipes with poll(2): nothing is left behind.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Output kept from each stream, at most: a command that prints more is killed.
pub const MAX_OUTPUT: usize = 8 << 20;

/// How long a wait for output lasts before the command is checked for its exit again, where
/// the kernel gives no descriptor to wait on for it (pidfd_open, Linux 5.3).
const TICK: Duration = Duration::from_millis(20);

/// A descriptor that becomes readable when the process `pid` exits: the wait for output
/// is also the wait for the exit, with no wakeup in between.
fn exit_fd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::pid_t, 0) };
    // SAFETY: a descriptor pidfd_open just made, owned by nothing else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

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
    /// It printed more than this many bytes on one stream and was killed.
    TooMuchOutput(usize),
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
            RunError::TooMuchOutput(n) => write!(f, "printed more than {} MiB: killed", n >> 20),
        }
    }
}

impl std::error::Error for RunError {}

impl RunError {
    /// Whether the command could not be started for want of the agent's own resources (no
    /// process or descriptor left under its limits, no memory): nothing about the command.
    pub fn is_own_limit(&self) -> bool {
        use nix::libc::{EAGAIN, EMFILE, ENFILE, ENOMEM};
        matches!(self, RunError::Spawn(e) if matches!(e.raw_os_error(), Some(EAGAIN | EMFILE | ENFILE | ENOMEM)))
    }
}

/// One output pipe of the command and what was read from it; `None` once at its end.
struct Stream<R> {
    pipe: Option<R>,
    buf: Vec<u8>,
    /// Keep the newest [`MAX_OUTPUT`] bytes (whole lines) instead of stopping at the cap.
    tail: bool,
    /// Whether older lines were dropped to keep the newest.
    dropped: bool,
}

impl<R> Stream<R> {
    fn new(pipe: Option<R>, tail: bool) -> Stream<R> {
        Stream {
            pipe,
            buf: Vec::new(),
            tail,
            dropped: false,
        }
    }
}

/// What one look at the pipes found.
enum Pumped {
    /// Something was read, or a pipe reached its end.
    Moved,
    /// Nothing within the wait.
    Quiet,
    /// A stream passed [`MAX_OUTPUT`].
    TooMuch,
}

impl<R: Read> Stream<R> {
    /// One read, after poll(2) said the pipe is readable (so it does not block).
    fn read_once(&mut self, chunk: &mut [u8]) -> bool {
        let Some(pipe) = self.pipe.as_mut() else {
            return true;
        };
        match pipe.read(chunk) {
            Ok(0) => self.pipe = None,
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
        if !self.tail {
            return self.buf.len() <= MAX_OUTPUT;
        }
        // Twice the cap before a cut, so that the bytes moved stay a small part of those read.
        if self.buf.len() > 2 * MAX_OUTPUT || (self.pipe.is_none() && self.buf.len() > MAX_OUTPUT) {
            let from = self.buf.len() - MAX_OUTPUT;
            let cut = self.buf[from..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(self.buf.len(), |i| from + i + 1);
            self.buf.drain(..cut);
            self.dropped = true;
        }
        true
    }
}

/// Waits at most `wait` for either pipe to be readable (or `exit`, the child's exit), then
/// reads once from each pipe that is.
fn pump(
    out: &mut Stream<ChildStdout>,
    err: &mut Stream<ChildStderr>,
    exit: Option<std::os::fd::BorrowedFd>,
    wait: Duration,
    chunk: &mut [u8],
) -> Pumped {
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    let ready = {
        let mut fds = Vec::with_capacity(3);
        if let Some(p) = &out.pipe {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        if let Some(p) = &err.pipe {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        if let Some(fd) = exit {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Pumped::Quiet,
            Ok(_) => {}
            Err(_) => {
                // Not expected with pipes of our own; never spin on it.
                std::thread::sleep(wait);
                return Pumped::Quiet;
            }
        }
        // Readable, at its end (POLLHUP) or in error: a read tells which.
        let mut ready = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()));
        let out_ready = out.pipe.is_some() && ready.next().unwrap_or(false);
        let err_ready = err.pipe.is_some() && ready.next().unwrap_or(false);
        (out_ready, err_ready)
    };
    let fits = (!ready.0 || out.read_once(chunk)) && (!ready.1 || err.read_once(chunk));
    if !fits {
        Pumped::TooMuch
    } else if ready.0 || ready.1 {
        Pumped::Moved
    } else {
        Pumped::Quiet
    }
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

/// Whether process `pid` runs under the name `comm` (as the kernel keeps it: at most 15
/// bytes), neither a zombie nor dead: a pid looked at again, which may have been recycled.
/// One read of `/proc/PID/stat`.
pub fn process_runs(pid: u32, comm: &str) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `PID (COMM) STATE ...`: the name may hold spaces and parentheses, the state follows
    // the last `)`.
    let (Some(open), Some(close)) = (
        stat.iter().position(|&b| b == b'('),
        stat.iter().rposition(|&b| b == b')'),
    ) else {
        return false;
    };
    open < close
        && &stat[open + 1..close] == comm.as_bytes()
        && !matches!(stat.get(close + 2), Some(b'Z' | b'X' | b'x') | None)
}

/// Kills every command still running (and what it started), for a clean stop. Their
/// callers see them end and reap them.
pub fn kill_all() {
    for pgid in RUNNING.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = killpg(*pgid, Signal::SIGKILL);
    }
}

/// How a run ended.
enum End {
    Exited,
    TimedOut,
    TooMuch,
}

/// Runs `argv` with standard input closed, waiting at most `timeout`.
pub fn run(argv: &[String], timeout: Duration) -> Result<Output, RunError> {
    run_keeping(argv, timeout, false).map(|(o, _)| o)
}

/// [`run`] for a command whose newest output matters most (a log): past the cap, the oldest
/// whole lines are dropped rather than the command stopped. Also returns whether any were.
pub fn run_keeping_tail(argv: &[String], timeout: Duration) -> Result<(Output, bool), RunError> {
    run_keeping(argv, timeout, true)
}

fn run_keeping(argv: &[String], timeout: Duration, tail: bool) -> Result<(Output, bool), RunError> {
    let mut child = spawn(argv)?;
    let mut out = Stream::new(child.stdout.take(), tail);
    let mut err = Stream::new(child.stderr.take(), false);
    let deadline = Instant::now() + timeout;
    let pgid = Pid::from_raw(child.id() as i32);
    let _running = Running::register(pgid);
    let mut chunk = vec![0u8; 64 << 10];
    let exit = exit_fd(child.id());
    let tick = if exit.is_some() { timeout } else { TICK };
    let mut end = loop {
        if exited(pgid) {
            break End::Exited;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break End::TimedOut;
        }
        // With both pipes at their end, this only waits.
        let waiting = exit.as_ref().map(|f| f.as_fd());
        if let Pumped::TooMuch = pump(&mut out, &mut err, waiting, left.min(tick), &mut chunk) {
            break End::TooMuch;
        }
    };
    // The whole group ends with its leader: what the command left running in the background
    // would otherwise outlive it. The leader is not reaped yet, so the group's id is still
    // its own.
    let _ = killpg(pgid, Signal::SIGKILL);
    if let End::Exited = end {
        end = drain(&mut out, &mut err, deadline, &mut chunk);
    }
    // `out` and `err` drop on return: the pipes close, whoever else holds their other end.
    let status = child.wait();
    match end {
        End::TimedOut => Err(RunError::TimedOut(timeout)),
        End::TooMuch => Err(RunError::TooMuchOutput(MAX_OUTPUT)),
        End::Exited => Ok((
            Output {
                status: status.map_err(RunError::Spawn)?,
                stdout: out.buf,
                stderr: err.buf,
            },
            out.dropped,
        )),
    }
}

/// Starts `argv` in a process group of its own, its output piped and nothing on its input.
fn spawn(argv: &[String]) -> Result<std::process::Child, RunError> {
    let (program, args) = argv.split_first().ok_or_else(|| {
        RunError::Spawn(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ))
    })?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(RunError::Spawn)
}

/// What the command wrote before it exited is in the pipes now: takes what is there, without
/// waiting for an end that a holder in another session may never give.
fn drain(
    out: &mut Stream<ChildStdout>,
    err: &mut Stream<ChildStderr>,
    deadline: Instant,
    chunk: &mut [u8],
) -> End {
    loop {
        match pump(out, err, None, Duration::ZERO, chunk) {
            Pumped::Moved if Instant::now() < deadline => {}
            Pumped::TooMuch => return End::TooMuch,
            _ => return End::Exited,
        }
    }
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
            crate::model::text::show_path(&pidfile)
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
    fn output_past_the_cap_ends_the_run() {
        let e = run(&sh("yes"), Duration::from_secs(600)).unwrap_err();
        assert!(matches!(e, RunError::TooMuchOutput(MAX_OUTPUT)), "{e:?}");
        assert_eq!(e.to_string(), "printed more than 8 MiB: killed");
    }

    #[test]
    fn output_up_to_the_cap_is_kept() {
        let o = run(
            &sh(&format!("head -c {MAX_OUTPUT} /dev/zero; echo err >&2")),
            Duration::from_secs(600),
        )
        .unwrap();
        assert_eq!(o.stdout.len(), MAX_OUTPUT);
        assert_eq!(o.stderr, b"err\n");
    }

    #[test]
    fn a_missing_command_is_a_spawn_error() {
        let e = run(&["/nonexistent/cmd".into()], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, RunError::Spawn(_)));
    }
}
