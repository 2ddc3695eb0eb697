//! What the service has seen: gridd's log folded, the last nvidia-smi answer, the token,
//! the lease and since when.

use std::time::Duration;

use chrono::{DateTime, Utc};

use tracing::{info, warn};

use super::{AFTER_EXPIRY, Now};
use crate::assemble::{SmiRead, TokenProblem};
use crate::config::Service;
use crate::install::SETTLE;
use crate::observe::journal::GriddEvent;
use crate::observe::smi::SmiSnapshot;
use crate::report::{EventKind, State, message_ids};
use crate::state::{LogFold, MAX_EVENTS, smi_state};
use crate::token::{Token, TokenError};

/// What the world last said: gridd's lines, nvidia-smi, systemd, the token, what the agent
/// found at start.
#[derive(Debug)]
pub(super) struct Seen {
    pub(super) fold: LogFold,
    pub(super) smi: Option<SmiSnapshot>,
    /// The last reading, when it failed or timed out.
    pub(super) smi_error: Option<SmiRead>,
    /// Why the agent could not start the last reading at all (its own limits), while it
    /// cannot: the reading before stands.
    pub(super) smi_unstarted: Option<String>,
    /// When nvidia-smi last answered (or failed to): the report's `observed_at`, which a
    /// report remade on the heartbeat does not move.
    pub(super) observed_at: Option<DateTime<Utc>>,
    /// The process that logged gridd's latest line (the journal's `_PID`).
    pub(super) gridd_pid: Option<u32>,
    pub(super) token: Option<Result<Token, TokenProblem>>,
    /// When the token directory last changed (the watch's word).
    pub(super) token_dir_changed: Option<Duration>,
    pub(super) legacy_server: Option<String>,
    /// The lease's expiry as nvidia-smi last showed it, and since when it has not moved.
    pub(super) lease: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// When a renewal line last moved the lease (monotonic): a reading begun before it shows
    /// the lease from before.
    pub(super) lease_line: Option<Duration>,
    /// That lease was there at the agent's first reading: as old as it is, not one the agent
    /// saw come (gridd's failures since it came still count).
    pub(super) lease_at_start: bool,
    pub(super) last_shutdown: Option<crate::shutdown::LastShutdown>,
    pub(super) clone: Option<crate::identity::CloneDetected>,
    /// The licensing Secret as last read, or why it could not be.
    pub(super) secret: Option<Result<crate::node::SecretToken, String>>,
    /// When the Secret's last answer came (monotonic).
    pub(super) secret_at: Option<Duration>,
    /// When the token gridd runs with was last seen to change (monotonic): a Secret read
    /// before it says nothing of it.
    pub(super) token_at: Option<Duration>,
    /// The token directory's files held open for writing at the last look, and their last
    /// change.
    pub(super) held: Vec<(String, DateTime<Utc>)>,
    /// gridd said it acquired (or renewed) a license, heard at this time (monotonic), and
    /// no reading begun since has answered: "no license" is not yet news, and gridd is not
    /// restarted for it (the reading that shows the license is on its way).
    pub(super) license_said: Option<Duration>,
}

impl Seen {
    pub(super) fn new() -> Seen {
        Seen {
            fold: LogFold::new(MAX_EVENTS),
            smi: None,
            smi_error: None,
            smi_unstarted: None,
            observed_at: None,
            gridd_pid: None,
            token: None,
            token_dir_changed: None,
            legacy_server: None,
            lease: None,
            lease_line: None,
            lease_at_start: false,
            last_shutdown: None,
            clone: None,
            secret: None,
            secret_at: None,
            token_at: None,
            held: Vec::new(),
            license_said: None,
        }
    }
}

impl Seen {
    /// A line of gridd's, into the fold, with the process that logged it. `news`: the line
    /// asks for a reading (no reading started well after it shows what it says, and it is
    /// no renewal of the lease shown), so that gridd's word that it holds a license awaits
    /// the reading that shows it.
    pub(super) fn gridd_line(&mut self, e: GriddEvent, news: bool, now: Now) {
        let kind = e.what.kind;
        match kind {
            EventKind::Acquired | EventKind::Renewed if news => {
                self.license_said = Some(now.mono);
            }
            EventKind::Shutdown | EventKind::Started => self.license_said = None,
            _ => {}
        }
        // A process that said it shuts down stands for nothing until systemd was asked.
        if kind == EventKind::Shutdown {
            self.gridd_pid = None;
        } else if e.pid.is_some() {
            self.gridd_pid = e.pid;
        }
        self.fold.push(e);
    }

    /// What the previous boot's journal says of its end: a lease left held is said.
    pub(super) fn last_shutdown_read(&mut self, record: Option<crate::shutdown::LastShutdown>) {
        if let Some(r) = record.as_ref().filter(|r| !r.lease_returned) {
            warn!(
                "the previous shutdown left the lease held on the DLS until it expires: {}",
                crate::text::escape(&r.message)
            );
        }
        self.last_shutdown = record;
    }

    /// A clone found at boot: said once, and kept for the report.
    pub(super) fn clone_found(&mut self, c: crate::identity::CloneDetected) {
        warn!(
            message_id = message_ids::CLONE_DETECTED,
            "{}",
            crate::text::escape(&c.message())
        );
        self.clone = Some(c);
    }

    /// A token file being written (made empty, then filled; or part written) is no verdict
    /// yet: looked at again once the directory has been still for a while. When, where so.
    pub(super) fn settling(
        &self,
        t: &Result<Token, TokenProblem>,
        now: Duration,
    ) -> Option<Duration> {
        let partial = matches!(
            t,
            Err(TokenProblem::Invalid(
                TokenError::Empty | TokenError::Truncated(_)
            ))
        );
        self.token_dir_changed
            .map(|changed| changed + SETTLE)
            .filter(|&until| partial && now < until)
    }

    /// The token, read at `now`: whether it changed (`None`: the same), and whether it
    /// replaced one read before (the first read is no news). A Secret read before a change
    /// says nothing of the new token.
    pub(super) fn token_read(
        &mut self,
        t: Result<Token, TokenProblem>,
        now: Duration,
    ) -> Option<bool> {
        let same = self.token.as_ref().is_some_and(|old| same_token(old, &t));
        let replaced = self.token.is_some();
        self.token = Some(t);
        if same {
            return None;
        }
        self.token_at = Some(now);
        Some(replaced)
    }

    /// The licensing Secret, read at `now`: a failure to read it is a warning once per
    /// streak (it is also in the report's notes while it lasts).
    pub(super) fn secret_read(
        &mut self,
        read: Result<crate::node::SecretToken, String>,
        now: Duration,
    ) {
        self.secret_at = Some(now);
        let was_failing = matches!(self.secret, Some(Err(_)));
        match &read {
            Err(why) if !was_failing => warn!(
                "the licensing Secret is not read (tried again at each heartbeat): {}",
                crate::text::escape(why)
            ),
            Ok(_) if was_failing => info!("the licensing Secret is read again"),
            _ => {}
        }
        self.secret = Some(read);
    }

    /// The first report waits for the first nvidia-smi answer (or failure) and the token.
    pub(super) fn readable(&self) -> bool {
        (self.smi.is_some() || self.smi_error.is_some()) && self.token.is_some()
    }

    /// A reading of nvidia-smi, begun at `began` (monotonic): the license as it shows it, or
    /// why it shows none. One the agent could not even start (its own limits) leaves the last
    /// reading standing, as old as it is: stale, not wrong. Whether it shows a license.
    pub(super) fn smi_read(&mut self, read: SmiRead, began: Duration, now: Now) -> bool {
        // A reading begun after gridd said it holds a license answers that word.
        if self.license_said.is_some_and(|said| said <= began) {
            self.license_said = None;
        }
        match read {
            SmiRead::Unstarted(why) => {
                if self.smi_unstarted.as_deref() != Some(why.as_str()) {
                    warn!("{}", crate::text::escape(&why));
                }
                self.smi_unstarted = Some(why);
                false
            }
            SmiRead::Snapshot(s) => self.smi_snapshot(s, began, now),
            SmiRead::Failed(ref why) | SmiRead::TimedOut(ref why) => {
                self.smi_unstarted = None;
                self.observed_at = Some(now.wall);
                if self.smi_error.as_ref().map(SmiRead::reason) != Some(why.as_str()) {
                    warn!("nvidia-smi: {}", crate::text::escape(why));
                }
                self.smi_error = Some(read);
                false
            }
        }
    }

    /// nvidia-smi's answer: the lease it shows, and since when (a lease that did not move,
    /// or an older one shown by a reading begun before a renewal line, keeps its time).
    /// Whether it shows a license.
    fn smi_snapshot(&mut self, s: SmiSnapshot, began: Duration, now: Now) -> bool {
        self.smi_unstarted = None;
        self.observed_at = Some(now.wall);
        // A reading begun before a renewal line was heard shows the lease from before it.
        let older = self.lease_line.is_some_and(|heard| began < heard);
        let lease = match (lease_expiry(&s), self.lease) {
            (Some(exp), Some((old, since))) if old == exp => Some((old, since)),
            (Some(exp), Some((old, since))) if exp < old && older => Some((old, since)),
            (Some(exp), _) => Some((exp, now.wall)),
            (None, _) => None,
        };
        if lease.map(|l| l.0) != self.lease.map(|l| l.0) {
            self.lease_at_start = self.smi.is_none() && self.smi_error.is_none();
        }
        self.lease = lease;
        let licensed = smi_state(&s) == State::Licensed;
        self.smi = Some(s);
        self.smi_error = None;
        licensed
    }

    /// A renewal line's expiry (`line`) against the lease the last reading showed: `None`
    /// where it is not a renewal of it (the reading shows no license, or the line's expiry is
    /// earlier than the lease known: this boot's older lines, read at start, move nothing),
    /// else whether the lease moved, to the expiry the line gives (its stall judged from now
    /// on), with no reading.
    pub(super) fn renewal(&mut self, line: Option<DateTime<Utc>>, now: Now) -> Option<bool> {
        let licensed = self.smi_error.is_none()
            && self
                .smi
                .as_ref()
                .is_some_and(|s| smi_state(s) == State::Licensed);
        let (Some(new), Some((old, _)), true) = (line, self.lease, licensed) else {
            return None;
        };
        if new < old {
            return None;
        }
        if new > old {
            self.lease = Some((new, now.wall));
            self.lease_at_start = false;
            self.lease_line = Some(now.mono);
        }
        Some(new > old)
    }

    /// When the next reading is due with nothing happening (monotonic), counted `from` the
    /// last answer, the last report's state being `reported`. Without a license:
    /// `poll_unlicensed` after it. With one, nvidia-smi is the safety net, not the clock:
    /// every change that matters comes with a line of gridd's (acquired, renewed, failed,
    /// returned, shut down), a restart or a driver pod's sign, each of which asks for its own
    /// reading, or falls at a deadline known here. So the next one comes `poll_licensed`
    /// after the last (an hour by default), or just after the lease's expiry where that comes
    /// first: a renewal is gridd's line and moves the lease with no reading
    /// ([`Seen::renewal`]), so an expiry reached without one is the deadline by which gridd
    /// should have logged it. A lease already past its expiry, still shown, is read at the
    /// unlicensed pace.
    pub(super) fn smi_pace(
        &self,
        svc: &Service,
        from: Duration,
        reported: Option<State>,
        now: Now,
    ) -> Duration {
        // The reading just taken shows no license (gridd returned it, the driver pod is
        // going): the report of the reading before may still say licensed, and its long
        // interval would hide what comes next (the pod's root gone, a new pod).
        let fresh_unlicensed = self.smi_error.is_some()
            || self
                .smi
                .as_ref()
                .is_some_and(|s| !s.no_device && smi_state(s) != State::Licensed);
        let licensed = match reported {
            Some(state) => state == State::Licensed,
            // Before the first report, as the reading just made says.
            None => self
                .smi
                .as_ref()
                .is_some_and(|s| smi_state(s) == State::Licensed),
        };
        if fresh_unlicensed || !licensed {
            return from + svc.poll_unlicensed;
        }
        let most = from + svc.poll_licensed;
        match self.lease.map(|(exp, _)| (exp - now.wall).to_std()) {
            // Licensed without an expiry (`Expiry: N/A`, a cloud provider's): nothing falls due.
            None => most,
            Some(Ok(left)) if !left.is_zero() => most.min(now.mono + left + AFTER_EXPIRY),
            Some(_) => from + svc.poll_unlicensed,
        }
    }
}

/// The expiry of the lease nvidia-smi shows (the first licensed GPU's).
fn lease_expiry(s: &SmiSnapshot) -> Option<DateTime<Utc>> {
    s.gpus.iter().find_map(|g| {
        match crate::observe::smi::classify_status(g.license_status.as_deref()?) {
            crate::observe::smi::LicenseStatus::Licensed(exp) => exp,
            _ => None,
        }
    })
}

/// gridd renews a lease at about a fifth of its period. An expiry that has not moved for
/// two fifths of what was left of it when first seen (and at least ten minutes) means the
/// renewals are failing: since when that holds, and what to say.
pub fn stalled(
    expiry: DateTime<Utc>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, String)> {
    let left_then = expiry - since;
    let allowed = (left_then * 2 / 5).max(chrono::Duration::minutes(10));
    let from = since + allowed;
    if now < from || now >= expiry {
        return None;
    }
    // The text stays the same while the stall lasts: it is one failure, counted once.
    Some((
        from,
        format!(
            "the lease's expiry has not moved since {} although gridd renews at about a fifth of the lease: renewals are failing; the license runs out at {}",
            crate::time::rfc3339(since),
            crate::time::rfc3339(expiry)
        ),
    ))
}

fn same_token(a: &Result<Token, TokenProblem>, b: &Result<Token, TokenProblem>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}
