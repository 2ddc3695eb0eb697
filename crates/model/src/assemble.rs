//! An observation put together from what was read, as values: nvidia-smi's answer, the
//! token (or why there is none), gridd's log so far, systemd's word and the probe's finding
//! become the [`Observations`] that [`crate::state::evaluate`] judges. No I/O: the service's
//! core, `status` and `diagnose` share it; the agent's `live` does the reading.

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::observe::smi::SmiSnapshot;
use crate::report::{Finding, Reason};
use crate::state::{LogFold, Observations};
use crate::token::{Token, TokenError, Untimely};

/// What running `nvidia-smi -q` gave.
#[derive(Debug, Clone)]
pub enum SmiRead {
    Snapshot(SmiSnapshot),
    /// It could not be run or failed: the one-line reason.
    Failed(String),
    /// It did not answer within the time limit and was killed: the one-line reason.
    TimedOut(String),
    /// The agent could not start it for want of its own resources (processes, descriptors,
    /// memory under its limits): the agent's trouble, which says nothing of the GPU.
    Unstarted(String),
}

impl SmiRead {
    /// The one-line reason of a failed reading ("" for a snapshot).
    pub fn reason(&self) -> &str {
        match self {
            SmiRead::Snapshot(_) => "",
            SmiRead::Failed(why) | SmiRead::TimedOut(why) | SmiRead::Unstarted(why) => why,
        }
    }

    /// The snapshot that stands for this reading in the observations.
    pub fn into_snapshot(self) -> SmiSnapshot {
        match self {
            SmiRead::Snapshot(s) => s,
            SmiRead::Failed(why) => SmiSnapshot {
                driver_error: Some(why),
                ..SmiSnapshot::default()
            },
            SmiRead::TimedOut(why) | SmiRead::Unstarted(why) => SmiSnapshot {
                unanswered: Some(why),
                ..SmiSnapshot::default()
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum TokenProblem {
    Missing,
    Unreadable(String),
    Invalid(TokenError),
    Untimely(Untimely),
}

impl TokenProblem {
    pub fn reason(&self) -> Reason {
        match self {
            TokenProblem::Missing => Reason::TokenMissing,
            TokenProblem::Unreadable(_) | TokenProblem::Invalid(_) => Reason::TokenInvalid,
            TokenProblem::Untimely(_) => Reason::TokenExpired,
        }
    }
}

impl std::fmt::Display for TokenProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenProblem::Missing => f.write_str("no client configuration token is installed"),
            TokenProblem::Unreadable(e) => write!(f, "the token cannot be read: {e}"),
            TokenProblem::Invalid(e) => write!(f, "the installed token is unusable: {e}"),
            TokenProblem::Untimely(Untimely::Expired(t)) => write!(
                f,
                "the installed token expired at {}",
                crate::time::rfc3339(*t)
            ),
            TokenProblem::Untimely(Untimely::NotYetValid(t)) => write!(
                f,
                "the installed token is not valid before {} (is this guest's clock right?)",
                crate::time::rfc3339(*t)
            ),
        }
    }
}

/// What was read, as values: the parts of an observation.
pub struct Parts<'a> {
    pub smi: SmiSnapshot,
    /// gridd's log so far (live, it ends now).
    pub fold: Option<LogFold>,
    /// The installed token as last read (its validity is judged again at `now`).
    pub token: &'a Result<Token, TokenProblem>,
    /// Whether gridd's unit runs (`None`: systemd could not say).
    pub unit: Option<&'a Result<(), String>>,
    /// The DLS probe's finding, for `evaluate` to apply where gridd's failure is vague.
    pub probe: Option<Finding>,
}

/// The one way observations are put together, for `run`, `status` and `diagnose`. No I/O.
pub fn assemble(settings: &Settings, now: DateTime<Utc>, parts: Parts<'_>) -> Observations {
    let mut obs = Observations {
        at: Some(now),
        at_is_exact: true,
        expiry_warning: chrono::Duration::from_std(settings.service.expiry_warning)
            .unwrap_or(chrono::Duration::hours(12)),
        smi: Some(parts.smi),
        probe_failure: parts.probe,
        ..Observations::default()
    };
    // gridd's own last words may say why it is not running (see `policy::own_failure`).
    let log_reason = parts.fold.as_ref().and_then(|f| f.failure_reason());
    if let Some(fold) = parts.fold {
        // Live, the log ends now: a lease past its expiry is not held.
        let stats = crate::observe::journal::ScanStats {
            last_stamp: Some(crate::observe::journal::Stamp::from_utc(now)),
            ..Default::default()
        };
        obs.log = Some((fold, stats));
    }
    let token_failure = match token_at(parts.token, now) {
        Ok(t) => {
            obs.token = Some(t);
            None
        }
        Err(p) => Some((p.reason(), p.to_string())),
    };
    let unit_down = match parts.unit {
        Some(Err(why)) => Some((Reason::GriddNotRunning, why.clone())),
        _ => None,
    };
    obs.own_failure = crate::policy::own_failure(token_failure, unit_down, log_reason);
    obs
}

/// A token read earlier, judged at `now`: one valid then may have expired since.
pub fn token_at(
    token: &Result<Token, TokenProblem>,
    now: DateTime<Utc>,
) -> Result<Token, TokenProblem> {
    match token {
        Ok(t) => t
            .validity(now)
            .map(|()| t.clone())
            .map_err(TokenProblem::Untimely),
        Err(p) => Err(p.clone()),
    }
}
