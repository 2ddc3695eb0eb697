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
            self.probing.failure = None;
            self.probing.last = None;
        } else {
            self.probe_step(now, fx);
        }
        self.restart_step(now, state, reason, fx);
    }

    /// A failure gridd (or the agent) left vague: the agent finds the cause itself. A new one
    /// at once; the same one again after the rate limit (what was found may have been fixed
    /// since). Clock skew that gridd named is probed too, more rarely, to measure it.
    fn probe_step(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let Some(report) = &self.published.report else {
            return;
        };
        let base = self.base_reason(now);
        let (worth_it, repeat) = match base.map(policy::of) {
            Some(p) if p.probe_measures => (true, MEASURE_REPEAT),
            Some(p) => (p.probe_refines, PROBE_REPEAT),
            None => (report.state == State::Unlicensed, PROBE_REPEAT),
        };
        let key = (
            base.unwrap_or(Reason::Unspecified),
            self.seen
                .fold
                .failure_message()
                .unwrap_or_default()
                .to_string(),
        );
        let news = self.probing.last.as_ref() != Some(&key);
        if worth_it && !self.busy.probe && (news || self.schedule.due(Timer::Probe, now.mono)) {
            self.busy.probe = true;
            self.probing.last = Some(key);
            let every = self.settings.service.poll_unlicensed.max(repeat);
            self.schedule.set(Timer::Probe, now.mono + every);
            let nodes = report.dls.clone().unwrap_or_default();
            fx.push(Effect::Probe(nodes));
        }
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

    /// A probe of the DLS ended: its verdict, and the clock skew it measured.
    pub(super) fn on_probed(&mut self, verdict: Option<Finding>, skew: Option<f64>) {
        self.busy.probe = false;
        if skew.is_some() {
            self.probing.skew = skew;
        }
        self.probing.failure = verdict;
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
        self.probing.last = None;
        self.schedule.smi_soon(now.mono + Duration::from_secs(1));
    }
}
