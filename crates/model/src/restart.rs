//! When nvidia-gridd is restarted: every decision to restart it, in one place. Pure: the
//! caller passes what it read (whether systemd has gridd's unit, what the agent remembers),
//! the time (seconds on a monotonic clock) and the jitter.
//!
//! - After an install or an adoption ([`for_install`], [`after_install`]): when what gridd
//!   reads changed ([`for_change`]: the token, its mode, gridd.conf, a valid token moved
//!   away), a restart is still owed, the token in place is not the one gridd was last
//!   restarted for, or (without a license) files gridd may have failed on were moved aside.
//!   Not where systemd has no gridd unit (the driver that brings it starts gridd with the
//!   token); left to the user with `--no-restart`; owed while the service's budget or backoff
//!   says wait, and paid by the next restart made for that token ([`pays_owed`]).
//! - By the service while something fails ([`Remedy::decide`], [`Remedy::service_restart`]):
//!   when a restart can help, after a grace period, with exponential backoff, jitter and a
//!   budget per hour; never for what a restart cannot fix, nor where the agent only observes,
//!   gridd's unit is missing, or its own work (a restart, an adoption) is under way.
//! - For a new token in the service ([`Remedy::may_restart_for_token`]): the same budget,
//!   and, while a license is held, the same backoff; and what the service does with the
//!   restart its adoption planned ([`for_adopted_token`]).

use std::collections::VecDeque;

use chrono::{DateTime, Utc};

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::config::{Service, Settings};
use crate::report::{Reason, State};

// ---- After an install or an adoption.

/// What the agent remembers between installs: which token gridd was restarted for (or is
/// owed a restart for), and whether that restart is still owed.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct InstallState {
    /// The SHA-256 (hex) of the token gridd was last restarted for, or is owed a restart for.
    pub token_sha256: Option<String>,
    pub restart_pending: bool,
    pub updated_at: Option<String>,
}

/// Whether nvidia-gridd was restarted after an install or an adoption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restart {
    /// Nothing it reads changed.
    NotNeeded,
    /// A restart was due, but `--no-restart` was given.
    Skipped,
    /// A dry run: a restart would be made.
    WouldRestart,
    /// The service's restart budget or backoff says wait: the restart stays owed and is made
    /// once they allow it.
    Deferred,
    /// Due: the changes need it and nothing says wait; it is owed (remembered, so that a
    /// crash does not lose it) until the caller makes it: `install` at once, the service
    /// through its own restart of gridd, which its remedy sees.
    Due,
    /// Restarted.
    Done,
    /// Not tried: the restart command restarts gridd's systemd unit, and systemd has no such
    /// unit (the driver that brings it is not installed). gridd reads the token when it
    /// first starts. The unit's name.
    NoUnit(String),
    /// The restart command failed or ran out of time: why, on one line. The restart stays
    /// pending: the next install or adopt retries it.
    Failed(String),
}

/// What one change of an install or an adoption does to what gridd reads
/// (`install::Change::touch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touch {
    /// The token is written.
    Token,
    /// The token's mode is set.
    TokenMode,
    /// gridd.conf is written.
    GriddConf,
    /// The token in place until now, under this name, is moved aside: a newer one replaces it.
    Replaced(String),
    /// A valid token gridd may have read, under this name, is moved aside.
    ValidTokenMoved(String),
    /// Another file is moved out of the token directory (a stray, a refused token).
    Stray,
    /// Nothing gridd reads (the directory, a temporary file, the copy of the old token).
    Nothing,
}

/// Why gridd has to be restarted to see a change, when it has: what it reads changed (the
/// token, its mode, gridd.conf, or a valid token it may be licensed with is moved away). A
/// stray moved aside changes nothing gridd holds.
pub fn for_change(touch: &Touch) -> Option<String> {
    Some(match touch {
        Touch::Token => "the token changed".into(),
        Touch::Replaced(name) => format!("a newer token replaces {name}"),
        Touch::ValidTokenMoved(name) => {
            format!("a valid token gridd may have read ({name}) was moved aside")
        }
        Touch::TokenMode => "the token's mode changed".into(),
        Touch::GriddConf => "gridd.conf changed".into(),
        Touch::Stray | Touch::Nothing => return None,
    })
}

/// Why nvidia-gridd must be restarted after changes that touch what it reads as `touches`
/// (for the token whose SHA-256 is `sha`), in true words, or `None`: what it reads changed, a restart is still owed (made
/// when the caller's budget allows), or the token in place is not the one it was last
/// restarted for. A stray moved aside costs a licensed gridd no restart; without a license it
/// may be what gridd failed on.
pub fn for_install(
    touches: &[Touch],
    state: &InstallState,
    sha: &str,
    licensed: bool,
) -> Option<String> {
    let mut why: Vec<String> = Vec::new();
    for r in touches.iter().filter_map(for_change) {
        if !why.contains(&r) {
            why.push(r);
        }
    }
    if !why.is_empty() {
        return Some(why.join("; "));
    }
    let restarted_for = state.token_sha256.as_deref();
    if state.restart_pending {
        // Owed until made: where the service's budget or backoff says wait (its request's
        // `restart` false), it stays owed, with its deadline, rather than being forgotten.
        Some("an earlier restart is still owed (it failed, was interrupted or had to wait)".into())
    } else if restarted_for.is_some_and(|s| s != sha) {
        Some("the token in place is not the one nvidia-gridd was last restarted for".into())
    } else if restarted_for.is_none() && !licensed {
        Some("the agent has not restarted it since this token was put in place".into())
    } else if !licensed && touches.contains(&Touch::Stray) {
        Some("files nvidia-gridd may have failed on were moved out of the token directory".into())
    } else {
        None
    }
}

/// The restart that changes needing one get once they are made, and whether it stays owed
/// (remembered until it succeeds): due (the caller makes it), owed for later (`owe`: the
/// service makes it when its budget allows), left to the user (`restart` false:
/// `--no-restart`), or none where systemd has no gridd unit (`unit_missing`, the unit's name
/// `unit`): the gridd a driver install brings starts with this token.
pub fn after_install(restart: bool, owe: bool, unit_missing: bool, unit: &str) -> (Restart, bool) {
    if !restart {
        let r = if owe {
            Restart::Deferred
        } else {
            Restart::Skipped
        };
        (r, owe)
    } else if unit_missing {
        (Restart::NoUnit(unit.to_string()), false)
    } else {
        (Restart::Due, true)
    }
}

/// The restart a dry run would make for its reason, if any.
pub fn in_dry_run(reason: Option<&str>, restart: bool) -> Restart {
    match (reason, restart) {
        (None, _) => Restart::NotNeeded,
        (Some(_), true) => Restart::WouldRestart,
        (Some(_), false) => Restart::Skipped,
    }
}

/// Whether a restart of gridd made for the token `target` (its SHA-256, taken when the
/// restart began) pays the one owed: a token adopted while it ran is still owed its own,
/// since gridd may have started before it was in place.
pub fn pays_owed(state: &InstallState, target: Option<&str>) -> bool {
    state.restart_pending && state.token_sha256.as_deref() == target
}

/// Whether the restart command restarts gridd's systemd unit (it names the unit, as the
/// default `systemctl restart nvidia-gridd.service` does): then, where systemd has no such
/// unit, the restart could only fail ("Unit ... not found"). Another restart command (a
/// script, gridd without a unit) is run as configured.
pub fn command_restarts_unit(settings: &Settings) -> bool {
    let unit = settings.gridd.unit.as_str();
    let stem = unit.strip_suffix(".service").unwrap_or(unit);
    settings
        .commands
        .restart_gridd
        .iter()
        .skip(1)
        .any(|a| a == unit || a == stem)
}

// ---- By the service: the remedy while something fails.

/// What the service does with the restart an adoption of a token planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRestart {
    /// Made now, by the service itself (so that its remedy sees it before it happens): why.
    Now(String),
    /// Owed, but the service's own work changes what is owed: adopt again in a second. A
    /// restart of its own runs (the owed one follows it), or one ended while the adoption
    /// ran (what it found owed may be paid).
    AdoptAgain,
    /// The adoption made it (an older agent's): counted and said.
    Made,
    /// The budget or backoff says wait: adopt again when they allow.
    Deferred,
    /// The adoption's attempt failed: it counts against the budget and backoff too.
    Failed(String),
    /// None to make or count.
    None,
}

/// What the service does with the restart an adoption planned (`planned`, its reason):
/// `restarting` whether a restart of the service's own runs, `ended_meanwhile` whether one
/// ended while the adoption ran.
pub fn for_adopted_token(
    planned: &Restart,
    reason: Option<&str>,
    restarting: bool,
    ended_meanwhile: bool,
) -> TokenRestart {
    match planned {
        Restart::Due if restarting || ended_meanwhile => TokenRestart::AdoptAgain,
        Restart::Due => TokenRestart::Now(reason.unwrap_or("for the token").to_string()),
        Restart::Done => TokenRestart::Made,
        Restart::Deferred => TokenRestart::Deferred,
        Restart::Failed(why) => TokenRestart::Failed(why.clone()),
        _ => TokenRestart::None,
    }
}

/// What else the service knows when its remedy would restart gridd: each is a reason not to
/// restart it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Circumstances {
    /// The agent manages gridd here (not `service.mode = "observe"`, not a GPU Operator
    /// node).
    pub manages: bool,
    /// systemd has no gridd unit (systemctl answers exit 5): it comes with the GRID guest
    /// driver, which is the fix.
    pub unit_missing: bool,
    /// A restart of the agent's own runs.
    pub restarting: bool,
    /// An adoption runs.
    pub adopting: bool,
    /// gridd just said it holds a license: the reading that shows it is on its way.
    pub license_said: bool,
    /// The report is not the latest reading's (the report gap held it back).
    pub report_stale: bool,
}

impl Circumstances {
    /// Whether nothing here stands in a restart's way.
    pub fn allow(&self) -> bool {
        self.manages
            && !self.unit_missing
            && !self.restarting
            && !self.adopting
            && !self.license_said
            && !self.report_stale
    }
}

/// The spread of a restart's backoff, in [0, 1), from the wall clock's nanoseconds.
pub fn jitter(wall: DateTime<Utc>) -> f64 {
    f64::from(wall.timestamp_subsec_nanos() % 1000) / 1000.0
}

/// The decision for now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing to do.
    Nothing,
    /// Restart gridd, for this reason.
    Restart(String),
    /// A restart would help but must wait: the reason (backoff, budget).
    Wait(String),
    /// A restart cannot help: report and wait for something to change.
    Hold(String),
}

/// Restart bookkeeping.
#[derive(Debug, Clone)]
pub struct Remedy {
    /// Times of the restarts within the last hour.
    restarts: VecDeque<f64>,
    /// No restart before this time.
    not_before: f64,
    /// The wait after the next restart.
    backoff: Backoff,
    /// Since when the guest has been without a license (reset by a restart).
    unlicensed_since: Option<f64>,
    /// Whether restarts were recorded since [`Remedy::take_changed`] last asked.
    changed: bool,
}

impl Remedy {
    pub fn new(cfg: &Service) -> Self {
        Remedy {
            restarts: VecDeque::new(),
            not_before: 0.0,
            backoff: Backoff::new(cfg.restart_backoff, cfg.restart_backoff_max),
            unlicensed_since: None,
            changed: false,
        }
    }

    /// Bookkeeping that goes on from restarts made before `now` (by an earlier run of the
    /// agent, in the same clock): they count against the budget, and the backoff runs from
    /// the last of them.
    pub fn with_history(cfg: &Service, past: &[f64], now: f64) -> Self {
        let mut r = Remedy::new(cfg);
        r.restarts = past
            .iter()
            .copied()
            .filter(|t| *t <= now && now - t < 3600.0)
            .collect();
        r.restarts.make_contiguous().sort_by(|a, b| a.total_cmp(b));
        if let Some(last) = r.restarts.back() {
            r.not_before = last + cfg.restart_backoff.as_secs_f64();
        }
        r
    }

    /// The restarts of the last hour, oldest first, when any were recorded since the last
    /// call: what a later run of the agent goes on from.
    pub fn take_changed(&mut self, now: f64) -> Option<Vec<f64>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        self.restarts_last_hour(now);
        Some(self.restarts.iter().copied().collect())
    }

    /// Restarts made within the last hour.
    pub fn restarts_last_hour(&mut self, now: f64) -> usize {
        while self.restarts.front().is_some_and(|t| now - t >= 3600.0) {
            self.restarts.pop_front();
        }
        self.restarts.len()
    }

    /// Decides, given the state and the failure's reason.
    pub fn decide(
        &mut self,
        cfg: &Service,
        now: f64,
        state: State,
        reason: Option<Reason>,
    ) -> Decision {
        let gridd_down = reason == Some(Reason::GriddNotRunning);
        // A license held without gridd is lost at its expiry: gridd must run to renew it.
        if matches!(state, State::NotLicensable | State::NoGpu | State::NoDriver)
            || (state == State::Licensed && !gridd_down)
        {
            // Healthy (or nothing gridd can do): start over.
            self.unlicensed_since = None;
            self.backoff.reset();
            return Decision::Nothing;
        }
        if !crate::policy::restart_helps(reason) {
            let r = reason.map_or("unknown", Reason::as_str);
            return Decision::Hold(format!("a restart of nvidia-gridd cannot fix {r}"));
        }
        let since = *self.unlicensed_since.get_or_insert(now);
        if !gridd_down && now - since < cfg.restart_grace.as_secs_f64() {
            return Decision::Nothing;
        }
        if self.restarts_last_hour(now) >= cfg.restart_budget_per_hour as usize {
            return Decision::Wait(format!(
                "restart budget spent: {} restarts of nvidia-gridd in the last hour",
                self.restarts.len()
            ));
        }
        if now < self.not_before {
            return Decision::Wait(format!(
                "next restart of nvidia-gridd in {:.0} s (backoff)",
                self.not_before - now
            ));
        }
        let why = if gridd_down {
            "nvidia-gridd is not running".to_string()
        } else {
            format!(
                "no license for {:.0} s ({})",
                now - since,
                reason.map_or("no failure reported, still acquiring", Reason::as_str)
            )
        };
        Decision::Restart(why)
    }

    /// Why the service restarts gridd now, if it does: the remedy's decision
    /// ([`Remedy::decide`], always made: it keeps the grace and the backoff), where the
    /// circumstances allow it. The caller records the restart ([`Remedy::restarted`]).
    pub fn service_restart(
        &mut self,
        cfg: &Service,
        now: f64,
        state: State,
        reason: Option<Reason>,
        at: &Circumstances,
    ) -> Option<String> {
        match self.decide(cfg, now, state, reason) {
            Decision::Restart(why) if at.allow() => Some(why),
            _ => None,
        }
    }

    /// The next moment after `now` at which [`Remedy::decide`] may answer otherwise with
    /// nothing else changed: the grace's end, the backoff's, or a restart leaving the hour's
    /// budget. `None` when none is ahead.
    pub fn next_change(&self, cfg: &Service, now: f64) -> Option<f64> {
        let grace = self
            .unlicensed_since
            .map(|s| s + cfg.restart_grace.as_secs_f64());
        let leaves = self.restarts.front().map(|t| t + 3600.0);
        [grace, Some(self.not_before), leaves]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min_by(|a, b| a.total_cmp(b))
    }

    /// Whether a restart now stays within the budget and the backoff: restarts the agent owes
    /// for other reasons (one that failed before) wait for this too.
    pub fn may_restart(&mut self, cfg: &Service, now: f64) -> bool {
        self.restarts_last_hour(now) < cfg.restart_budget_per_hour as usize
            && now >= self.not_before
    }

    /// Whether a restart for a new token may be made now. The budget always counts; the
    /// backoff only while a license is held, where a restart returns it and rotations in a
    /// burst are churn. A new token while no license is held is the fix arriving: it goes in
    /// at once, whatever restarts failed before it.
    pub fn may_restart_for_token(&mut self, cfg: &Service, now: f64, licensed: bool) -> bool {
        if licensed {
            return self.may_restart(cfg, now);
        }
        self.restarts_last_hour(now) < cfg.restart_budget_per_hour as usize
    }

    /// When a restart for a new token is next allowed ([`Remedy::may_restart_for_token`]).
    pub fn next_allowed_for_token(&mut self, cfg: &Service, now: f64, licensed: bool) -> f64 {
        if licensed {
            self.next_allowed(cfg, now)
        } else {
            self.budget_frees(cfg, now)
        }
    }

    /// When the budget next allows a restart (now, where it does).
    fn budget_frees(&mut self, cfg: &Service, now: f64) -> f64 {
        if self.restarts_last_hour(now) >= cfg.restart_budget_per_hour as usize {
            self.restarts.front().map_or(now, |t| t + 3600.0)
        } else {
            now
        }
    }

    /// When (in the same seconds as `now`) the budget and the backoff next allow a restart.
    pub fn next_allowed(&mut self, cfg: &Service, now: f64) -> f64 {
        // The oldest restart of the hour leaving it frees one.
        self.budget_frees(cfg, now).max(self.not_before)
    }

    /// A reloaded config: the restarts made so far still count against the budget, and the
    /// backoff reached stays within the new bounds.
    pub fn reconfigure(&mut self, cfg: &Service) {
        self.backoff
            .rebound(cfg.restart_backoff, cfg.restart_backoff_max);
    }

    /// Records a restart made at `now`: the backoff doubles (up to the maximum), the grace
    /// period starts again. `jitter` in [0, 1) spreads the wait (±20 %), so that a fleet does
    /// not restart in step.
    pub fn restarted(&mut self, now: f64, jitter: f64) {
        self.restarts.push_back(now);
        self.changed = true;
        let spread = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
        self.not_before = now + self.backoff.failed().as_secs_f64() * spread;
        self.unlicensed_since = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Settings;

    #[test]
    fn restarts_of_an_earlier_run_count_and_the_backoff_runs_from_the_last() {
        let c = cfg();
        // Two restarts 10 and 30 min ago, one 2 h ago (out of the hour).
        let mut r = Remedy::with_history(&c, &[-7200.0, -1800.0, -600.0], 0.0);
        assert_eq!(r.restarts_last_hour(0.0), 2);
        assert!(r.may_restart(&c, 0.0));
        r.restarted(0.0, 0.5);
        assert_eq!(r.take_changed(0.0), Some(vec![-1800.0, -600.0, 0.0]));
        assert_eq!(r.take_changed(0.0), None);
        // The budget of 3 is spent until the oldest leaves the hour.
        assert!(!r.may_restart(&c, 1000.0));
        assert!(r.may_restart(&c, 1801.0));
        // A restart 30 s ago: the backoff (60 s) runs from it.
        let mut r = Remedy::with_history(&c, &[-30.0], 0.0);
        assert!(!r.may_restart(&c, 0.0));
        assert!(r.may_restart(&c, 31.0));
    }

    // ---- After an install or an adoption.

    #[test]
    fn after_install_the_restart_is_due_owed_left_or_none() {
        let unit = "nvidia-gridd.service";
        let no_unit = Restart::NoUnit(unit.into());
        // (restart may be made now, owed if not, unit missing) -> (restart, owed after).
        let cases = [
            ((true, false, false), (Restart::Due, true)),
            ((true, true, false), (Restart::Due, true)),
            ((true, false, true), (no_unit.clone(), false)),
            ((true, true, true), (no_unit, false)),
            ((false, false, false), (Restart::Skipped, false)),
            ((false, false, true), (Restart::Skipped, false)),
            ((false, true, false), (Restart::Deferred, true)),
            ((false, true, true), (Restart::Deferred, true)),
        ];
        for ((restart, owe, missing), want) in cases {
            assert_eq!(
                after_install(restart, owe, missing, unit),
                want,
                "restart {restart}, owe {owe}, unit missing {missing}"
            );
        }
        for (reason, restart, want) in [
            (None, true, Restart::NotNeeded),
            (None, false, Restart::NotNeeded),
            (Some("the token changed"), true, Restart::WouldRestart),
            (Some("the token changed"), false, Restart::Skipped),
        ] {
            assert_eq!(in_dry_run(reason, restart), want, "{reason:?} {restart}");
        }
    }

    #[test]
    fn each_change_gridd_reads_is_a_reason() {
        let cases = [
            (Touch::Token, Some("the token changed")),
            (Touch::TokenMode, Some("the token's mode changed")),
            (Touch::GriddConf, Some("gridd.conf changed")),
            (
                Touch::Replaced("old.tok".into()),
                Some("a newer token replaces old.tok"),
            ),
            (
                Touch::ValidTokenMoved("old.tok".into()),
                Some("a valid token gridd may have read (old.tok) was moved aside"),
            ),
            (Touch::Stray, None),
            (Touch::Nothing, None),
        ];
        for (touch, want) in cases {
            assert_eq!(for_change(&touch).as_deref(), want, "{touch:?}");
        }
    }

    #[test]
    fn reasons_are_said_once_each_in_order() {
        let touches = [
            Touch::Token,
            Touch::Nothing,
            Touch::Token,
            Touch::Replaced("old.tok".into()),
        ];
        assert_eq!(
            for_install(&touches, &InstallState::default(), "a", true).as_deref(),
            Some("the token changed; a newer token replaces old.tok")
        );
    }

    #[test]
    fn without_a_change_the_memory_and_the_license_decide() {
        let state = |sha: Option<&str>, owed| InstallState {
            token_sha256: sha.map(str::to_string),
            restart_pending: owed,
            updated_at: None,
        };
        let stray: &[Touch] = &[Touch::Nothing, Touch::Stray];
        // (touches, remembered, licensed) -> part of the reason, or none.
        let cases: [(&[Touch], InstallState, bool, Option<&str>); 9] = [
            (&[], state(Some("a"), false), true, None),
            (&[], state(Some("a"), false), false, None),
            (&[Touch::Nothing], state(Some("a"), false), false, None),
            (&[], state(Some("a"), true), true, Some("still owed")),
            (&[], state(Some("b"), false), true, Some("not the one")),
            (&[], state(None, false), true, None),
            (&[], state(None, false), false, Some("has not restarted it")),
            (
                stray,
                state(Some("a"), false),
                false,
                Some("may have failed on"),
            ),
            (stray, state(Some("a"), false), true, None),
        ];
        for (touches, st, licensed, want) in cases {
            let got = for_install(touches, &st, "a", licensed);
            match (want, got.as_deref()) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(g.contains(w), "{st:?} {licensed}: {g}"),
                (w, g) => panic!("{st:?} {licensed}: {g:?}, expected {w:?}"),
            }
        }
    }

    #[test]
    fn a_restart_pays_what_is_owed_only_for_its_own_token() {
        let owed = |sha: &str| InstallState {
            token_sha256: Some(sha.into()),
            restart_pending: true,
            updated_at: None,
        };
        assert!(pays_owed(&owed("a"), Some("a")));
        // A token adopted while it ran is owed its own.
        assert!(!pays_owed(&owed("b"), Some("a")));
        assert!(!pays_owed(&owed("a"), None));
        assert!(!pays_owed(&InstallState::default(), None));
    }

    #[test]
    fn only_a_command_naming_the_unit_needs_it() {
        let mut s = Settings::default();
        assert!(command_restarts_unit(&s), "{:?}", s.commands.restart_gridd);
        for (argv, names) in [
            (vec!["systemctl", "restart", "nvidia-gridd"], true),
            (vec!["systemctl", "restart", "nvidia-gridd.service"], true),
            (vec!["/usr/local/bin/restart-gridd"], false),
            (vec!["sh", "-c", "pkill nvidia-gridd; nvidia-gridd"], false),
        ] {
            s.commands.restart_gridd = argv.iter().map(|a| a.to_string()).collect();
            assert_eq!(command_restarts_unit(&s), names, "{argv:?}");
        }
    }

    // ---- By the service.

    #[test]
    fn the_service_restarts_only_where_nothing_stands_in_the_way() {
        let c = cfg();
        let clear = Circumstances {
            manages: true,
            ..Circumstances::default()
        };
        let down = Some(Reason::GriddNotRunning);
        // Each circumstance alone holds the restart back.
        let held = [
            Circumstances {
                manages: false,
                ..clear
            },
            Circumstances {
                unit_missing: true,
                ..clear
            },
            Circumstances {
                restarting: true,
                ..clear
            },
            Circumstances {
                adopting: true,
                ..clear
            },
            Circumstances {
                license_said: true,
                ..clear
            },
            Circumstances {
                report_stale: true,
                ..clear
            },
        ];
        for at in held {
            let mut m = Remedy::new(&c);
            assert_eq!(
                m.service_restart(&c, 0.0, State::Unlicensed, down, &at),
                None,
                "{at:?}"
            );
        }
        let mut m = Remedy::new(&c);
        assert_eq!(
            m.service_restart(&c, 0.0, State::Unlicensed, down, &clear),
            Some("nvidia-gridd is not running".into())
        );
    }

    #[test]
    fn a_restart_held_back_keeps_the_remedys_clock() {
        let c = cfg();
        let clear = Circumstances {
            manages: true,
            ..Circumstances::default()
        };
        // Held back or not, the remedy's clock runs: the grace starts at the first look.
        let mut m = Remedy::new(&c);
        let dls = Some(Reason::DlsUnreachable);
        let held = Circumstances {
            adopting: true,
            ..clear
        };
        assert_eq!(
            m.service_restart(&c, 0.0, State::Unlicensed, dls, &held),
            None
        );
        assert_eq!(
            m.service_restart(&c, 119.0, State::Unlicensed, dls, &clear),
            None
        );
        assert!(
            m.service_restart(&c, 120.0, State::Unlicensed, dls, &clear)
                .is_some_and(|why| why.starts_with("no license for 120 s"))
        );
        // Licensed with gridd running: nothing.
        assert_eq!(
            m.service_restart(&c, 200.0, State::Licensed, None, &clear),
            None
        );
    }

    fn cfg() -> Service {
        let mut s = Settings::default().service;
        s.restart_grace = Duration::from_secs(120);
        s.restart_backoff = Duration::from_secs(60);
        s.restart_backoff_max = Duration::from_secs(240);
        s.restart_budget_per_hour = 3;
        s
    }

    #[test]
    fn never_restarts_for_what_a_restart_cannot_fix() {
        let c = cfg();
        for r in [
            Reason::TokenInvalid,
            Reason::TokenExpired,
            Reason::TokenMissing,
            Reason::ClockSkew,
            Reason::NoLicenseAvailable,
            Reason::LicensingUnsupported,
        ] {
            let mut m = Remedy::new(&c);
            for t in 0..10_000 {
                let d = m.decide(&c, f64::from(t), State::Unlicensed, Some(r));
                assert!(matches!(d, Decision::Hold(_)), "{r:?}: {d:?}");
            }
        }
    }

    #[test]
    fn a_new_token_without_a_license_waits_for_the_budget_not_the_backoff() {
        let c = cfg();
        let mut m = Remedy::new(&c);
        m.restarted(0.0, 0.5);
        assert!(!m.may_restart_for_token(&c, 1.0, true), "licensed: backoff");
        assert_eq!(m.next_allowed_for_token(&c, 1.0, true), 60.0);
        assert!(
            m.may_restart_for_token(&c, 1.0, false),
            "unlicensed: at once"
        );
        m.restarted(1.0, 0.5);
        m.restarted(2.0, 0.5);
        assert!(
            !m.may_restart_for_token(&c, 3.0, false),
            "the budget still counts"
        );
        assert_eq!(m.next_allowed_for_token(&c, 3.0, false), 3600.0);
    }

    #[test]
    fn grace_backoff_and_budget() {
        let c = cfg();
        let mut m = Remedy::new(&c);
        let reason = Some(Reason::DlsUnreachable);
        // Within the grace period: nothing.
        assert_eq!(
            m.decide(&c, 0.0, State::Unlicensed, reason),
            Decision::Nothing
        );
        assert_eq!(
            m.decide(&c, 119.0, State::Unlicensed, reason),
            Decision::Nothing
        );
        let mut restarts = vec![];
        for t in 120..3600 {
            let now = f64::from(t);
            if let Decision::Restart(_) = m.decide(&c, now, State::Unlicensed, reason) {
                m.restarted(now, 0.5);
                restarts.push(t);
            }
        }
        // Budget of 3 per hour, each after the grace and the growing backoff.
        assert_eq!(restarts, vec![120, 240, 360]);
        assert!(matches!(
            m.decide(&c, 3000.0, State::Unlicensed, reason),
            Decision::Wait(_)
        ));
        // An hour after the first, the budget allows one more.
        assert!(matches!(
            m.decide(&c, 3721.0, State::Unlicensed, reason),
            Decision::Restart(_)
        ));
    }

    #[test]
    fn a_reload_keeps_the_restarts_made_and_bounds_the_backoff() {
        let c = cfg();
        let mut m = Remedy::new(&c);
        for t in [0.0, 1000.0, 2000.0] {
            assert!(m.may_restart(&c, t));
            m.restarted(t, 0.5);
        }
        // Budget spent: neither the remedy nor an owed restart may go.
        assert!(!m.may_restart(&c, 2500.0));
        let mut smaller = c.clone();
        smaller.restart_backoff_max = Duration::from_secs(100);
        m.reconfigure(&smaller);
        assert_eq!(m.backoff.peek(), Duration::from_secs(100));
        assert!(!m.may_restart(&smaller, 2500.0));
        assert!(matches!(
            m.decide(
                &smaller,
                2500.0,
                State::Unlicensed,
                Some(Reason::Unspecified)
            ),
            Decision::Wait(_)
        ));
        // Within backoff after a restart: not yet.
        let mut m = Remedy::new(&c);
        m.restarted(0.0, 0.5);
        assert!(!m.may_restart(&c, 30.0));
        assert!(m.may_restart(&c, 60.0));
    }

    #[test]
    fn the_restart_backoff_doubles_up_to_its_maximum_and_jitter_spreads_it() {
        let mut c = cfg();
        c.restart_budget_per_hour = 100;
        let mut m = Remedy::new(&c);
        let mut t = 0.0;
        let mut waits = vec![];
        for _ in 0..5 {
            m.restarted(t, 0.5);
            let next = m.next_allowed(&c, t);
            waits.push(next - t);
            t = next;
        }
        assert_eq!(waits, [60.0, 120.0, 240.0, 240.0, 240.0]);
        let mut m = Remedy::new(&c);
        m.restarted(0.0, 0.0);
        assert_eq!(m.next_allowed(&c, 0.0), 48.0);
    }

    #[test]
    fn gridd_down_is_restarted_without_grace_and_licensed_resets() {
        let c = cfg();
        let mut m = Remedy::new(&c);
        let d = m.decide(&c, 0.0, State::Unlicensed, Some(Reason::GriddNotRunning));
        assert!(matches!(d, Decision::Restart(_)));
        m.restarted(0.0, 0.0);
        // Licensed, but gridd died: it must run to renew the lease.
        assert!(matches!(
            m.decide(&c, 200.0, State::Licensed, Some(Reason::GriddNotRunning)),
            Decision::Restart(_)
        ));
        assert_eq!(m.decide(&c, 10.0, State::Licensed, None), Decision::Nothing);
        assert_eq!(m.backoff.peek(), c.restart_backoff);
    }

    #[test]
    fn an_adopted_tokens_restart_is_made_by_the_service_unless_its_own_work_changes_what_is_owed() {
        let due = Restart::Due;
        assert_eq!(
            for_adopted_token(&due, Some("the token changed"), false, false),
            TokenRestart::Now("the token changed".into())
        );
        assert_eq!(
            for_adopted_token(&due, None, false, false),
            TokenRestart::Now("for the token".into())
        );
        // A restart of the service's own runs, or one ended while the adoption ran: what is
        // owed is read again by the next adoption, not restarted twice.
        assert_eq!(
            for_adopted_token(&due, None, true, false),
            TokenRestart::AdoptAgain
        );
        assert_eq!(
            for_adopted_token(&due, None, false, true),
            TokenRestart::AdoptAgain
        );
        assert_eq!(
            for_adopted_token(&Restart::Deferred, None, true, false),
            TokenRestart::Deferred
        );
        assert_eq!(
            for_adopted_token(&Restart::Done, None, false, false),
            TokenRestart::Made
        );
        assert_eq!(
            for_adopted_token(&Restart::Failed("exit 1".into()), None, false, false),
            TokenRestart::Failed("exit 1".into())
        );
        for nothing in [
            Restart::NotNeeded,
            Restart::Skipped,
            Restart::NoUnit("u".into()),
        ] {
            assert_eq!(
                for_adopted_token(&nothing, None, true, true),
                TokenRestart::None
            );
        }
    }
}
