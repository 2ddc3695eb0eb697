//! While something fails: the DLS probed to name the cause, gridd restarted within its
//! budget, and the answers.

use std::time::Duration;

use tracing::error;

use super::adoption::say_restarted;
use super::schedule::Timer;
use super::{Core, Effect, MEASURE_REPEAT, Now, PROBE_REPEAT, secs};
use crate::node::Mode;
use crate::policy;
use crate::report::{Finding, Reason, State};

/// The agent's own probe of the DLS, for the failures gridd states vaguely.
#[derive(Debug, Default)]
pub(super) struct Probing {
    /// The vague failure the last probe was started for: the same one is probed again only
    /// after [`PROBE_REPEAT`]; a new one at once.
    pub(super) last: Option<Finding>,
    /// What the probe found, until a license or a new token makes it old news.
    pub(super) failure: Option<Finding>,
    /// Guest clock minus the DLS's clock, last measured.
    pub(super) skew: Option<f64>,
}

impl Probing {
    /// A license held, or a new token: what the probe found is old news, and the next
    /// failure is news.
    pub(super) fn forget(&mut self) {
        self.failure = None;
        self.last = None;
    }

    /// The failure now is news whatever it is (gridd was restarted, a token put in place):
    /// probed at once.
    pub(super) fn news(&mut self) {
        self.last = None;
    }

    /// A license came: what the probe found was about the failure it ended.
    pub(super) fn license_came(&mut self) {
        self.failure = None;
    }

    /// Whether the failure now is worth a probe, and how long before the same one is probed
    /// again (the unlicensed poll, when longer, is the caller's). `base`: the failure before
    /// any probe; `message`: gridd's words for it; `state`: the report's; `due`: the rate
    /// limit's time came. A failure gridd (or the agent) left vague: the agent finds the cause
    /// itself, a new one at once, the same one again after the rate limit (what was found may
    /// have been fixed since). Clock skew that gridd named is probed too, more rarely, to
    /// measure it.
    pub(super) fn wanted(
        &self,
        base: Option<Reason>,
        message: &str,
        state: State,
        due: bool,
    ) -> Option<Duration> {
        let (worth_it, repeat) = match base.map(policy::of) {
            Some(p) if p.probe_measures => (true, MEASURE_REPEAT),
            Some(p) => (p.probe_refines, PROBE_REPEAT),
            None => (state == State::Unlicensed, PROBE_REPEAT),
        };
        let news = self.last.as_ref() != Some(&Probing::key(base, message));
        (worth_it && (news || due)).then_some(repeat)
    }

    /// A probe started for the failure `base` with gridd's `message`.
    pub(super) fn started(&mut self, base: Option<Reason>, message: &str) {
        self.last = Some(Probing::key(base, message));
    }

    /// A probe ended: its verdict, and the clock skew it measured (one that measured none
    /// leaves the last measure standing).
    pub(super) fn probed(&mut self, verdict: Option<Finding>, skew: Option<f64>) {
        if skew.is_some() {
            self.skew = skew;
        }
        self.failure = verdict;
    }

    /// What tells one vague failure from another: its reason and gridd's words.
    fn key(base: Option<Reason>, message: &str) -> (Reason, String) {
        (base.unwrap_or(Reason::Unspecified), message.to_string())
    }
}

impl Core {
    /// Remedy: restart gridd when that can help, probe the DLS when a failure says nothing
    /// specific (or to measure a clock skew gridd named).
    pub(super) fn remedy_step(&mut self, now: Now, fx: &mut Vec<Effect>) {
        // A vGPU host has no gridd to restart nor a lease to probe a DLS for: its VMs'
        // licenses are their guests' to fix.
        if self.is_host() {
            return;
        }
        let Some(report) = &self.published.report else {
            return;
        };
        let (state, reason) = (report.state, report.failure.as_ref().map(|f| f.reason));
        if state == State::Licensed {
            self.probing.forget();
        } else {
            let base = self.base_reason(now);
            let message = self.seen.fold.failure_message().unwrap_or_default();
            let due = self.schedule.due(Timer::Probe, now.mono);
            let wanted = self.probing.wanted(base, message, state, due);
            if let Some(repeat) = wanted.filter(|_| !self.busy.probe) {
                self.busy.probe = true;
                self.probing.started(base, message);
                let every = self.settings.service.poll_unlicensed.max(repeat);
                self.schedule.set(Timer::Probe, now.mono + every);
                fx.push(Effect::Probe(report.dls.clone().unwrap_or_default()));
            }
        }
        self.restart_step(now, state, reason, fx);
    }

    /// gridd restarted where the remedy says so and nothing else stands in the way
    /// ([`crate::restart`] decides both).
    fn restart_step(
        &mut self,
        now: Now,
        state: State,
        reason: Option<Reason>,
        fx: &mut Vec<Effect>,
    ) {
        let t = secs(now);
        let at = crate::restart::Circumstances {
            manages: self.node.mode == Mode::Manage,
            // A unit that does not exist cannot be restarted (systemctl answers exit 5): it
            // comes with the GRID guest driver, which is the fix.
            unit_missing: self.unit.missing(),
            restarting: self.busy.restart.is_some(),
            adopting: self.busy.adopt,
            license_said: self.seen.license_said.is_some(),
            report_stale: self.published.dirty,
        };
        let cfg = &self.settings.service;
        if let Some(why) = self.remedy.service_restart(cfg, t, state, reason, &at) {
            self.busy.restart = Some(why.clone());
            self.remedy.restarted(t, crate::restart::jitter(now.wall));
            fx.push(Effect::RestartGridd {
                why,
                for_token: false,
            });
        }
    }

    /// The agent's restart of gridd ended: counted or said, and its failure probed anew.
    pub(super) fn on_restarted(
        &mut self,
        result: Result<(), String>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        let why = self.busy.restart.take().unwrap_or_default();
        self.busy.restarts_ended += 1;
        // Whether gridd runs now is asked once the agent's own work is over.
        self.unit.question.after_own_work();
        self.own_work_ended(true, now, fx);
        // One line per restart, said once its result is known: why, and how it went.
        let command = self.settings.commands.restart_gridd.join(" ");
        match result {
            Ok(()) => {
                self.counters.gridd_restarts += 1;
                say_restarted(&command, &why);
            }
            Err(e) => error!(
                vgpu_license_reason = why.as_str(),
                "restarting nvidia-gridd ({}) failed: {}; it was restarted because {}",
                crate::text::escape(&command),
                crate::text::escape(&e),
                crate::text::escape(&why)
            ),
        }
        // A restarted gridd's failure is news: probe it at once.
        self.probing.news();
        self.readings.soon(now.mono + Duration::from_secs(1));
    }
}
