//! gridd's journal, followed: `journalctl --follow -o json` as a child process, its lines
//! parsed into gridd's events for the service's loop, restarted with backoff whenever it ends.
//!
//! The child is a plain `std::process` child whose pipes the loop reads without blocking:
//! tokio's process driver would take SIGCHLD for the whole process, so that every reading's
//! nvidia-smi, reaped by its own job's thread, would also interrupt the loop's wait.

use std::os::fd::OwnedFd;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};
use tracing::{error, warn};

use super::core::Event;
use crate::model::backoff::Backoff;
use crate::model::observe::journal::LineParser;

/// The longest journal entry (one line of JSON) the follower reads: far above any of gridd's
/// (journald cuts a syslog line at 48 KiB); a longer one is skipped, never held whole.
const FOLLOW_MAX_LINE: usize = 1 << 20;

/// The waits before journalctl is started again: half a second, doubling, at most 30 s.
const RESTART_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// A journalctl that ran this long was following well: the next restart waits the first
/// wait again.
const RAN_WELL: Duration = Duration::from_secs(60);

/// The most of journalctl's standard error read once it ended, for why it did.
const STDERR_KEPT: u64 = 4096;

/// Reads the next line of `r` into `line`, without its newline; a line longer than
/// [`FOLLOW_MAX_LINE`] is skipped to its end. `false` at the end of the stream.
async fn next_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    line.clear();
    // A long line's buffer is not kept for the quiet hours after it.
    line.shrink_to(64 << 10);
    let mut skipping = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(false);
        }
        let (take, end) = match memchr::memchr(b'\n', avail) {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if line.len() + take > FOLLOW_MAX_LINE {
            skipping = true;
            line.clear();
        } else if !skipping {
            line.extend_from_slice(&avail[..take]);
        }
        r.consume(take + usize::from(end));
        if end {
            if !skipping {
                return Ok(true);
            }
            skipping = false;
            line.clear();
        }
    }
}

/// A running journalctl: killed and reaped when dropped (the service stopping, the follower's
/// task dropped with the runtime), so that none outlives the agent.
struct Journalctl {
    child: Child,
    stdout: BufReader<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
}

impl Journalctl {
    fn spawn(argv: &[String]) -> std::io::Result<Journalctl> {
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let missing = || std::io::Error::other("journalctl's pipes were not made");
        let pipes = (|| {
            let out = child.stdout.take().ok_or_else(missing)?;
            let err = child.stderr.take().ok_or_else(missing)?;
            Ok::<_, std::io::Error>((
                pipe::Receiver::from_owned_fd(OwnedFd::from(out))?,
                pipe::Receiver::from_owned_fd(OwnedFd::from(err))?,
            ))
        })();
        match pipes {
            Ok((out, err)) => Ok(Journalctl {
                child,
                stdout: BufReader::new(out),
                stderr: Some(err),
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Stops journalctl (it never ends by itself while following) and reaps it.
    fn end(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What journalctl wrote to its standard error, once it ended (the start of it).
    async fn said(&mut self) -> String {
        let mut said = String::new();
        if let Some(err) = self.stderr.take() {
            let _ = err.take(STDERR_KEPT).read_to_string(&mut said).await;
        }
        said
    }
}

impl Drop for Journalctl {
    fn drop(&mut self) {
        self.end();
    }
}

/// Whose lines a follower reads, and what it makes of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lines {
    /// gridd's: its events, the fold rebuilt from this boot's whenever journalctl starts.
    Gridd,
    /// The vGPU manager's on a host: each one a sign that a VM changed (the reading names
    /// which, and how), new lines only.
    VgpuMgr,
}

/// Follows gridd's journal (or the vGPU manager's), restarting `journalctl` with backoff
/// whenever it ends.
pub async fn follow_journal(
    argv: Vec<String>,
    lines: Lines,
    tx: mpsc::UnboundedSender<Event>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = RESTART_BACKOFF;
    loop {
        let started = Instant::now();
        let why = match Journalctl::spawn(&argv) {
            Err(e) => format!("cannot start {}: {e}", argv[0]),
            Ok(mut journalctl) => {
                if lines == Lines::Gridd {
                    let _ = tx.send(Event::JournalRestarted);
                }
                let Some(why) = follow(&mut journalctl, lines, &tx, &mut stop).await else {
                    // Stopping: dropped, journalctl is killed and reaped.
                    return;
                };
                journalctl.end();
                stop_if_unreadable(&journalctl.said().await);
                why
            }
        };
        warn!("journal follower stopped: {why}; restarting it");
        if started.elapsed() > RAN_WELL {
            backoff.reset();
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.failed()) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Sends gridd's events from journalctl's lines until it ends (why) or the service stops
/// (`None`).
async fn follow(
    journalctl: &mut Journalctl,
    lines: Lines,
    tx: &mpsc::UnboundedSender<Event>,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let mut line = Vec::new();
    let (etx, mut erx) = mpsc::unbounded_channel();
    let mut parser = LineParser::new(|e| {
        let _ = etx.send(e);
    });
    loop {
        tokio::select! {
            more = next_line(&mut journalctl.stdout, &mut line) => match more {
                Ok(true) if lines == Lines::VgpuMgr => {
                    if crate::model::observe::vgpu_mgr::is_own_entry(&line) {
                        let _ = tx.send(Event::VgpuMgr);
                    }
                }
                Ok(true) => {
                    if from_systemd(&line) {
                        let _ = tx.send(Event::GriddUnitLine);
                    }
                    parser.feed(&line);
                    while let Ok(e) = erx.try_recv() {
                        let _ = tx.send(Event::Gridd(Box::new(e)));
                    }
                }
                Ok(false) => return Some("journalctl ended".to_string()),
                Err(e) => return Some(format!("reading journalctl: {e}")),
            },
            _ = stop.changed() => return None,
        }
    }
}

/// Whether a line of journalctl's JSON is systemd's own (`_PID` 1, which journald fills in
/// from the sender's credentials): the follower's filter passes only its lines about
/// gridd's unit.
fn from_systemd(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"_PID\"").is_some()
        && serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|v| v["_PID"] == "1")
}

/// A journal this user may not read never becomes readable by restarting: said, and the
/// service ends.
fn stop_if_unreadable(said: &str) {
    if said.contains("insufficient permissions") {
        error!(
            "cannot read nvidia-gridd's journal ({}): {}; stopping",
            said.trim(),
            if nix::unistd::geteuid().is_root() {
                "give the service the systemd-journal group (SupplementaryGroups=)"
            } else {
                "run as root (sudo)"
            }
        );
        crate::gridd::command::kill_all();
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journalctl_is_restarted_after_half_a_second_doubling_to_30_s() {
        let ms = Duration::from_millis;
        assert_eq!(
            RESTART_BACKOFF.schedule(8),
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000].map(ms)
        );
    }

    #[tokio::test]
    async fn a_line_past_the_cap_is_skipped_and_the_next_one_read() {
        let mut input = vec![b'x'; FOLLOW_MAX_LINE * 3];
        input.extend_from_slice(b"\n{\"MESSAGE\":\"next\"}\nlast");
        let mut r = BufReader::new(&input[..]);
        let mut line = Vec::new();
        assert!(next_line(&mut r, &mut line).await.unwrap());
        assert_eq!(line, b"{\"MESSAGE\":\"next\"}");
        assert!(line.capacity() <= FOLLOW_MAX_LINE);
        // A last line without its newline is no whole entry.
        assert!(!next_line(&mut r, &mut line).await.unwrap());
    }

    #[test]
    fn systemd_s_own_lines_are_told_from_gridd_s() {
        let systemd = br#"{"_PID":"1","_UID":"0","UNIT":"nvidia-gridd.service","MESSAGE":"nvidia-gridd.service: Main process exited, code=killed, status=9/KILL"}"#;
        assert!(from_systemd(systemd));
        let gridd = br#"{"_PID":"812","_UID":"0","_COMM":"nvidia-gridd","MESSAGE":"License acquired successfully."}"#;
        assert!(!from_systemd(gridd));
        // A process that names itself so in its message, not in journald's field, is not.
        let forged = br#"{"_PID":"4242","MESSAGE":"\"_PID\":\"1\""}"#;
        assert!(!from_systemd(forged));
    }
}
