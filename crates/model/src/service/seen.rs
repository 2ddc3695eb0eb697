//! What the service has seen: gridd's log folded, the last nvidia-smi answer, the token,
//! the lease and since when.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::assemble::{SmiRead, TokenProblem};
use crate::observe::smi::SmiSnapshot;
use crate::state::{LogFold, MAX_EVENTS};
use crate::token::Token;

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

/// The expiry of the lease nvidia-smi shows (the first licensed GPU's).
pub(super) fn lease_expiry(s: &SmiSnapshot) -> Option<DateTime<Utc>> {
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

pub(super) fn same_token(a: &Result<Token, TokenProblem>, b: &Result<Token, TokenProblem>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}
