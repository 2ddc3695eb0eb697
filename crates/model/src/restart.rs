//! What to do about a state: restart nvidia-gridd when a restart can help, with exponential
//! backoff, jitter and a budget per hour; never for what a restart cannot fix. Pure: the
//! caller passes the time (seconds on a monotonic clock) and the jitter.

use std::collections::VecDeque;

use crate::backoff::Backoff;
use crate::config::Service;
use crate::report::{Reason, State};

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
}
