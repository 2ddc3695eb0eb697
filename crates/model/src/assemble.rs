//! Observations made of what was read, as values: every source (the service's memory, a
//! one-shot look at the machine, saved outputs) answers the questions of [`Source`], and
//! [`observe`] makes of the answers the [`Observations`] that [`crate::state::evaluate`]
//! judges. No I/O: the agent's `live` and `analyze` do the reading.

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::identity::CloneDetected;
use crate::observe::app_log::AppLog;
use crate::observe::journal::ScanStats;
use crate::observe::smi::SmiSnapshot;
use crate::observe::unit::UnitState;
use crate::report::{Finding, LastShutdown, Reason, ServiceFacts};
use crate::state::{LogFold, NodeSeen, Observations, Since};
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

/// One look at the token directory and gridd.conf, as the service reads them together.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRead {
    /// The installed token, or why there is none usable.
    pub token: Result<Token, TokenProblem>,
    /// gridd.conf's `ServerAddress` (the legacy license server), when one is set.
    pub legacy_server: Option<String>,
    /// The token directory's files held open for writing, and their last change.
    pub held_writers: Vec<(String, DateTime<Utc>)>,
}

impl TokenRead {
    /// A look that found `token`, no legacy server and no file held open.
    pub fn of(token: Result<Token, TokenProblem>) -> TokenRead {
        TokenRead {
            token,
            legacy_server: None,
            held_writers: Vec::new(),
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

/// The questions every source of observations answers: the service's memory, a one-shot look
/// at the machine (`status`, `diagnose`), saved outputs (`analyze`). Each answer defaults to
/// nothing: a source answers what it can know, and [`observe`] makes the observations of the
/// answers. A fact new to the report is a new question here, answered by the sources that know
/// it.
pub trait Source {
    /// The moment of a look at the machine: the token's dates are judged at it, and gridd's
    /// log so far ends at it. Nothing for saved outputs, which are taken as they were.
    fn now(&self) -> Option<DateTime<Utc>> {
        None
    }
    /// The observation's time, and whether it is exact (a saved output's local time without
    /// its zone is not). By default the look's moment.
    fn at(&self) -> Option<(DateTime<Utc>, bool)> {
        self.now().map(|now| (now, true))
    }
    /// What nvidia-smi said.
    fn smi(&self) -> Option<SmiSnapshot> {
        None
    }
    /// gridd's log, folded.
    fn log(&self) -> Option<&LogFold> {
        None
    }
    /// How a saved log was read (its last line's time); a look's log ends at [`Source::now`].
    fn log_stats(&self) -> Option<&ScanStats> {
        None
    }
    /// The installed token as read (judged at [`Source::now`]), or why there is none.
    /// Nothing: the token was not looked at.
    fn token(&self) -> Option<&Result<Token, TokenProblem>> {
        None
    }
    /// Whether gridd's unit runs (nothing: systemd could not say, or was not asked).
    fn unit(&self) -> Option<&UnitState> {
        None
    }
    /// The DLS probe's finding.
    fn probe(&self) -> Option<Finding> {
        None
    }
    /// The license server gridd.conf names (the legacy licensing path).
    fn legacy_server(&self) -> Option<String> {
        None
    }
    /// When the lease nvidia-smi shows now was seen to come.
    fn lease_since(&self) -> Option<DateTime<Utc>> {
        None
    }
    /// Since when the lease's expiry counts as stalled, and what to say.
    fn renewal_stalled(&self) -> Option<(DateTime<Utc>, String)> {
        None
    }
    /// Why the token source's token was refused.
    fn source_rejected(&self) -> Option<String> {
        None
    }
    /// A file refused beside the installed token, recently: which and why.
    fn token_rejected(&self) -> Option<String> {
        None
    }
    /// Why the licensing Secret's token is not the one gridd runs with.
    fn token_stale(&self) -> Option<String> {
        None
    }
    /// The files of the token directory held open for writing, and their last change.
    fn held_writers(&self) -> Vec<(String, DateTime<Utc>)> {
        Vec::new()
    }
    /// What the service has to say about the token for a while.
    fn token_notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// The agent's own trouble in observing.
    fn own_notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Where the agent found the driver.
    fn node(&self) -> Option<NodeSeen> {
        None
    }
    /// An application's log and its CUDA errors.
    fn app_log(&self) -> Option<(PathBuf, AppLog)> {
        None
    }
    /// What saved outputs are or lack.
    fn input_notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// On a host, the vGPU manager's log: each VM's license state as the host logged it.
    fn host_log(&self) -> Option<crate::observe::vgpu_mgr::HostLog> {
        None
    }
    /// The service process that writes the report.
    fn agent_pid(&self) -> Option<u32> {
        None
    }
    /// What gridd did with its lease as the previous boot ended.
    fn last_shutdown(&self) -> Option<LastShutdown> {
        None
    }
    /// A clone found at this boot.
    /// What only the service measured or keeps (the clock's skew, the driver's version
    /// last read, the installed token's expiry); the rest of its facts are the evaluation's.
    fn service(&self) -> Option<ServiceFacts> {
        None
    }
    fn clone_detected(&self) -> Option<CloneDetected> {
        None
    }
    /// Since when the agent's own findings hold, where the source remembers.
    fn since(&self) -> Since {
        Since::default()
    }
}

/// The one way observations are made, whatever their source. No I/O.
pub fn observe(settings: &Settings, src: &impl Source) -> Observations {
    let (at, at_is_exact) = src
        .at()
        .map_or((None, false), |(at, exact)| (Some(at), exact));
    Observations {
        smi: src.smi(),
        log: log_of(src),
        saved_log_timed: saved_log_timed(src),
        token: judged_token(src).and_then(Result::ok),
        own_failure: own_failure(src),
        gridd_unit: src.unit().cloned(),
        probe_failure: src.probe(),
        legacy_server: src.legacy_server(),
        at,
        at_is_exact,
        expiry_warning: chrono::Duration::from_std(settings.service.expiry_warning)
            .unwrap_or(chrono::Duration::hours(12)),
        renewal_stalled: src.renewal_stalled(),
        lease_since: src.lease_since(),
        source_rejected: src.source_rejected(),
        token_rejected: src.token_rejected(),
        token_stale: src.token_stale(),
        held_writers: held_long(src),
        token_notes: src.token_notes(),
        own_notes: src.own_notes(),
        node: src.node(),
        app_log: src.app_log(),
        input_notes: src.input_notes(),
        host_log: src.host_log(),
        agent_pid: src.agent_pid(),
        last_shutdown: src.last_shutdown(),
        clone_detected: src.clone_detected(),
        service: src.service(),
        since: src.since(),
    }
}

/// The files held open for writing past [`crate::token::HELD_BOUND`] at the look's moment
/// (a saved output has none): their names and for how long, in whole seconds.
fn held_long(src: &impl Source) -> Vec<(String, u64)> {
    let Some(now) = src.now() else {
        return Vec::new();
    };
    src.held_writers()
        .into_iter()
        .filter_map(|(name, since)| {
            let secs = u64::try_from((now - since).num_seconds()).ok()?;
            (secs >= crate::token::HELD_BOUND.as_secs()).then_some((name, secs))
        })
        .collect()
}

/// The token as judged at the look's moment; a saved one as it was (no present to judge its
/// dates against).
fn judged_token(src: &impl Source) -> Option<Result<Token, TokenProblem>> {
    let token = src.token()?;
    Some(match src.now() {
        Some(now) => token_at(token, now),
        None => token.clone(),
    })
}

/// gridd's log and how it ends: a look's log ends at the look's moment (a lease past its
/// expiry is not held), a saved one at its last line.
fn log_of(src: &impl Source) -> Option<(LogFold, ScanStats)> {
    let fold = src.log()?.clone();
    let stats = match src.now() {
        Some(now) => ScanStats {
            last_stamp: Some(crate::observe::journal::Stamp::from_utc(now)),
            ..ScanStats::default()
        },
        None => src.log_stats().cloned().unwrap_or_default(),
    };
    Some((fold, stats))
}

/// A saved log whose gridd lines carry a time of day (they may still lack a year).
fn saved_log_timed(src: &impl Source) -> bool {
    src.now().is_none()
        && src.log().is_some_and(|f| f.total() > 0)
        && src.log_stats().is_some_and(|s| s.last_stamp.is_some())
}

/// The agent's own failure at the source's moment, of the two it finds itself: the token's
/// problem, else gridd's unit not running unless gridd's last words say why
/// ([`crate::policy::own_failure`]).
pub fn own_failure(src: &impl Source) -> Option<Finding> {
    let token_failure = judged_token(src)
        .and_then(Result::err)
        .map(|p| (p.reason(), p.to_string()));
    let unit_down = src
        .unit()
        .and_then(UnitState::down)
        .map(|why| (Reason::GriddNotRunning, why));
    let log_reason = src.log().and_then(LogFold::failure_reason);
    crate::policy::own_failure(token_failure, unit_down, log_reason)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Reason, State};
    use crate::state::evaluate;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn expired_token() -> Result<Token, TokenProblem> {
        Ok(Token {
            algorithm: None,
            issuer: None,
            audience: None,
            token_id: None,
            issued_at: None,
            not_before: None,
            expires: Some(at("2025-01-01T00:00:00Z")),
            instance_ref: None,
            scope_refs: Vec::new(),
            nodes: Vec::new(),
        })
    }

    /// A source that answers nothing but a token, and the moment of its look if any.
    struct TokenOnly(Result<Token, TokenProblem>, Option<DateTime<Utc>>);

    impl Source for TokenOnly {
        fn now(&self) -> Option<DateTime<Utc>> {
            self.1
        }
        fn token(&self) -> Option<&Result<Token, TokenProblem>> {
            Some(&self.0)
        }
    }

    struct Nothing;
    impl Source for Nothing {}

    /// Files held open for writing since `since`, seen at `now` (a saved output: none).
    struct Held(Option<DateTime<Utc>>, DateTime<Utc>);

    impl Source for Held {
        fn now(&self) -> Option<DateTime<Utc>> {
            self.0
        }
        fn held_writers(&self) -> Vec<(String, DateTime<Utc>)> {
            vec![
                ("notes.txt".into(), self.1),
                ("copy.tok".into(), self.0.unwrap_or(self.1)),
            ]
        }
    }

    /// A file held open for writing past the bound is named, one held a moment is a copy
    /// under way, and a saved output has no present to measure either against.
    #[test]
    fn files_held_open_past_the_bound_are_named() {
        let settings = Settings::default();
        let now = at("2026-12-06T12:00:00Z");
        let since = now - chrono::Duration::seconds(130);
        let obs = observe(&settings, &Held(Some(now), since));
        assert_eq!(obs.held_writers, vec![("notes.txt".to_string(), 130)]);
        let r = evaluate(obs);
        assert!(
            r.notes.iter().any(|n| n.contains("notes.txt (for 130 s)")),
            "{:?}",
            r.notes
        );
        assert!(
            observe(&settings, &Held(None, since))
                .held_writers
                .is_empty()
        );
    }

    #[test]
    fn a_source_that_answers_nothing_is_observed_as_unknown() {
        let obs = observe(&Settings::default(), &Nothing);
        assert!(obs.smi.is_none() && obs.log.is_none() && obs.token.is_none());
        assert!(obs.at.is_none() && !obs.at_is_exact);
        let report = evaluate(obs);
        assert_eq!(report.state, State::Unknown);
        assert!(report.failure.is_none(), "{report:?}");
    }

    #[test]
    fn a_look_judges_the_token_at_its_moment_a_saved_token_is_taken_as_it_was() {
        let now = at("2026-01-01T00:00:00Z");
        let look = observe(&Settings::default(), &TokenOnly(expired_token(), Some(now)));
        assert!(look.token.is_none());
        assert_eq!(look.own_failure.map(|f| f.0), Some(Reason::TokenExpired));
        assert_eq!(look.at, Some(now));

        let saved = observe(&Settings::default(), &TokenOnly(expired_token(), None));
        assert!(saved.token.is_some(), "a saved token names its DLS");
        assert!(saved.own_failure.is_none());
    }
}
