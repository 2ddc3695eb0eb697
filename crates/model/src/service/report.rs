//! The service's report: its observations (what the service remembers, as values), the
//! report made of them, and what status.json, the metrics and the journal last got.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::info;

use super::adoption::Adoption;
use super::seen::stalled;
use super::{Core, Effect, MIN_REPORT_GAP, Now, Publication};
use crate::assemble::{self, TokenProblem};
use crate::observe::smi::SmiSnapshot;
use crate::observe::unit::UnitState;
use crate::policy;
use crate::report::metrics;
use crate::report::{Finding, Reason, Report, State, message_ids};
use crate::state::{LogFold, evaluate};
use crate::token::Token;

/// The reports made, and what status.json and the metrics last got.
#[derive(Debug)]
pub(super) struct Published {
    /// The latest report.
    pub(super) report: Option<Report>,
    /// The metrics last written.
    pub(super) metrics: String,
    /// When the latest report was written or remade for the heartbeat, or the service started:
    /// a report is remade at least every heartbeat, and the periodic turns ride on its beat.
    pub(super) beat: Duration,
    /// When the latest report was made.
    pub(super) made: Option<Duration>,
    /// Something happened since the latest report.
    pub(super) dirty: bool,
    /// The next report is written whatever it holds (the last write failed).
    pub(super) rewrite: bool,
    /// systemd was told the service is ready (after the first report).
    pub(super) ready: bool,
}

impl Published {
    /// Nothing published yet, at the service's start (`now`, monotonic).
    pub(super) fn new(now: Duration) -> Published {
        Published {
            report: None,
            metrics: String::new(),
            beat: now,
            made: None,
            dirty: false,
            rewrite: false,
            ready: false,
        }
    }

    /// The latest report says a license is held.
    pub(super) fn licensed(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(|r| r.state == State::Licensed)
    }

    /// A license held and no failure: nothing changes with time alone.
    pub(super) fn quiet(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(|r| r.state == State::Licensed && r.failure.is_none())
    }

    /// Whether gridd's unit decides the next step, by the latest report: not with a license
    /// held, nor where gridd cannot help (nothing to license, no GPU, no driver).
    pub(super) fn unit_matters(&self) -> bool {
        self.report.as_ref().is_some_and(|r| {
            !matches!(
                r.state,
                State::Licensed | State::NotLicensable | State::NoGpu | State::NoDriver
            )
        })
    }

    /// The report is remade while something may change with time alone (grace, backoff,
    /// expiry), and at least as often as the `heartbeat`.
    pub(super) fn remake_if_due(&mut self, now: Duration, heartbeat: Duration) {
        if !self.licensed() || self.heartbeat_due(now, heartbeat) {
            self.dirty = true;
        }
    }

    /// The report is written out again at the next tick (a write of it failed).
    pub(super) fn write_again(&mut self) {
        self.dirty = true;
        self.rewrite = true;
    }

    /// Whether a report is made at `now`: something happened, the first report's readings
    /// are in (`readable`), and the gap since the last is over. With a license held and
    /// nothing happening, a wakeup that just asked for a reading or a look (`asked`) leaves
    /// the report to their answers: one report, not a heartbeat's and then (held back by
    /// the gap, a second wakeup) the answers'.
    pub(super) fn due(&mut self, now: Duration, readable: bool, asked: bool) -> bool {
        let due = self.dirty && readable && self.gap_over(now) && !(asked && self.quiet());
        if due {
            self.dirty = false;
            self.made = Some(now);
        }
        due
    }

    /// The first report is out: whether it is this one (systemd is told the service is
    /// ready once).
    pub(super) fn first_out(&mut self) -> bool {
        !std::mem::replace(&mut self.ready, true)
    }

    /// When a report held back by the gap is due (`None`: none is waiting).
    pub(super) fn held_back(&self, now: Duration, readable: bool) -> Option<Duration> {
        (self.dirty && readable).then(|| self.made.map_or(now, |t| t + MIN_REPORT_GAP).max(now))
    }

    /// The report made of what was observed, published: logged where its state changed, in
    /// status.json's and the metrics' forms, and whether each is written and the webhook
    /// told.
    pub(super) fn publication(
        &mut self,
        report: Report,
        counters: &metrics::Counters,
        now: Duration,
        heartbeat: Duration,
    ) -> Publication {
        let previous = self.report.as_ref().map(|r| r.state);
        if previous != Some(report.state) {
            log_state_change(&report, previous);
        }
        let mut json = serde_json::to_vec_pretty(&report).unwrap_or_default();
        json.push(b'\n');
        let metrics_text = metrics::render(&report, counters);
        let write = self.made_at(now, heartbeat, &report, &metrics_text);
        let webhook = previous.is_some() && previous != Some(report.state);
        Publication {
            report,
            json,
            metrics: metrics_text,
            write,
            webhook,
        }
    }

    /// The report is remade at least every `heartbeat` (a state that changes with time alone).
    pub(super) fn heartbeat_due(&self, now: Duration, heartbeat: Duration) -> bool {
        now >= self.beat + heartbeat
    }

    /// A report is made at most every [`MIN_REPORT_GAP`].
    pub(super) fn gap_over(&self, now: Duration) -> bool {
        self.made.is_none_or(|t| now >= t + MIN_REPORT_GAP)
    }

    /// A report made at `now`: whether status.json and the metrics are written (the report
    /// changed, its metrics did, or it holds a new observation: `status` tells a live service
    /// by its `observed_at`); else only the copy in memory moves.
    pub(super) fn made_at(
        &mut self,
        now: Duration,
        heartbeat: Duration,
        report: &Report,
        metrics: &str,
    ) -> bool {
        let (changed, observed) = match &self.report {
            Some(old) => (
                !same_report(old, report),
                old.observed_at != report.observed_at,
            ),
            None => (true, true),
        };
        let write =
            std::mem::take(&mut self.rewrite) || changed || observed || self.metrics != metrics;
        if write || self.heartbeat_due(now, heartbeat) {
            self.beat = now;
        }
        if write {
            self.metrics = metrics.to_string();
        }
        self.report = Some(report.clone());
        write
    }
}

/// Whether the report's failure is a missing token.
pub(super) fn f_is_missing(report: &Report) -> bool {
    report
        .failure
        .as_ref()
        .is_some_and(|f| f.reason == Reason::TokenMissing)
}

pub(super) fn log_state_change(report: &Report, previous: Option<State>) {
    let edition = report
        .license
        .as_ref()
        .and_then(|l| l.edition.clone())
        .unwrap_or_default();
    let expiry = report
        .license
        .as_ref()
        .and_then(|l| l.expiry)
        .map(crate::time::rfc3339)
        .unwrap_or_default();
    let id = if report.state == State::Licensed {
        message_ids::LICENSED
    } else {
        message_ids::STATE_CHANGED
    };
    info!(
        message_id = id,
        vgpu_license_state = report.state.as_str(),
        vgpu_license_previous_state = previous.map_or("none", State::as_str),
        vgpu_license_edition = crate::text::escape(&edition).as_ref(),
        vgpu_license_expiry = expiry.as_str(),
        "license state: {}",
        crate::text::escape(&status_line(report))
    );
}

/// Two reports differ for the outside when anything but the time of observation differs.
pub(super) fn same_report(a: &Report, b: &Report) -> bool {
    // The time and the agent's pid are the only fields that may differ: a field added to the
    // report counts as soon as it is in the report.
    a.state == b.state && {
        let mut b = b.clone();
        b.observed_at.clone_from(&a.observed_at);
        b.agent_pid = a.agent_pid;
        *a == b
    }
}

/// The one line `systemctl status` shows.
pub fn status_line(r: &Report) -> String {
    let mut line = r.state.as_str().to_string();
    if let Some(tally) = crate::report::vgpu_tally(r) {
        line.push_str(&format!(", {tally}"));
    }
    // A lease's edition and expiry where nvidia-smi shows the license: never beside "no
    // driver" (the last lease gridd logged, or a new pod's before its reading).
    if let Some(l) = r.license.as_ref().filter(|_| {
        matches!(
            r.state,
            State::Licensed | State::Unlicensed | State::Restricted
        )
    }) {
        if let Some(ed) = &l.edition {
            line.push_str(&format!(", {ed}"));
        }
        if let Some(exp) = l.expiry.filter(|_| r.state == State::Licensed) {
            line.push_str(&format!(", expires {}", crate::time::rfc3339(exp)));
        }
    }
    if let Some(f) = &r.failure {
        line.push_str(&format!("; {}: {}", f.reason.as_str(), f.message));
    }
    line
}

impl Core {
    /// Makes the report and says where it goes.
    pub(super) fn publish(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let mut report = evaluate(self.observations(now));
        if self.is_host() {
            fx.extend(self.vms.remember(&mut report, now.wall));
        }
        self.findings.seen_in(&report, now.wall);
        // A new failure: counted once, logged with its catalog entry. With a token source,
        // no token before the source is read is not yet a failure: the source may bring one.
        let premature = f_is_missing(&report)
            && self.settings.paths.token_source.is_some()
            && !self.adoption.source_read;
        if let Some(reason) = self.findings.new_failure(&report, premature) {
            self.counters.count_failure(reason);
        }
        let publication =
            self.published
                .publication(report, &self.counters, now.mono, self.heartbeat);
        fx.push(Effect::Publish(Box::new(publication)));
    }

    /// The observations a report is made of: the service's memory at `now`, answered as a
    /// source. Since when the agent's own finding holds is remembered first (it holds since
    /// it was first seen, not since this moment).
    pub(super) fn observations(&mut self, now: Now) -> crate::state::Observations {
        let own = assemble::own_failure(&self.memory(now)).or_else(|| self.probing.failure.clone());
        self.findings.own(own.as_ref(), now.wall);
        assemble::observe(&self.settings, &self.memory(now))
    }

    /// The service's memory at `now`, as a source of observations.
    pub(super) fn memory(&self, now: Now) -> Memory<'_> {
        Memory { core: self, now }
    }

    /// The failure before any probe: the agent's own (token, unit), else gridd's.
    pub(super) fn base_reason(&self, now: Now) -> Option<Reason> {
        let own = assemble::own_failure(&self.memory(now)).map(|(reason, _)| reason);
        let log = self.seen.fold.failure_reason();
        policy::most_telling(own, None, log.map(|r| (r, r)))
    }
}

/// No token read yet: none is installed, as far as the service knows.
static NOT_READ: Result<Token, TokenProblem> = Err(TokenProblem::Missing);

/// The service's memory at one moment: what it has seen, found and done, as the answers of
/// a source of observations.
pub(super) struct Memory<'a> {
    core: &'a Core,
    now: Now,
}

impl assemble::Source for Memory<'_> {
    fn now(&self) -> Option<DateTime<Utc>> {
        Some(self.now.wall)
    }

    /// The observation is as old as nvidia-smi's last answer, however often it is written.
    fn at(&self) -> Option<(DateTime<Utc>, bool)> {
        Some((self.core.seen.observed_at.unwrap_or(self.now.wall), true))
    }

    fn smi(&self) -> Option<SmiSnapshot> {
        let seen = &self.core.seen;
        Some(match (&seen.smi, &seen.smi_error) {
            (_, Some(failed)) => failed.clone().into_snapshot(),
            (Some(s), None) => s.clone(),
            (None, None) => SmiSnapshot::default(),
        })
    }

    fn log(&self) -> Option<&LogFold> {
        Some(&self.core.seen.fold)
    }

    fn token(&self) -> Option<&Result<Token, TokenProblem>> {
        Some(self.core.seen.token.as_ref().unwrap_or(&NOT_READ))
    }

    fn unit(&self) -> Option<&UnitState> {
        self.core.unit.state()
    }

    fn probe(&self) -> Option<Finding> {
        self.core.probing.failure.clone()
    }

    fn legacy_server(&self) -> Option<String> {
        self.core.seen.legacy_server.clone()
    }

    /// A lease the agent saw come (or move): what gridd logged before it is over.
    fn lease_since(&self) -> Option<DateTime<Utc>> {
        let seen = &self.core.seen;
        seen.lease
            .filter(|_| !seen.lease_at_start)
            .map(|(_, since)| since)
    }

    fn renewal_stalled(&self) -> Option<(DateTime<Utc>, String)> {
        self.core
            .seen
            .lease
            .and_then(|(exp, since)| stalled(exp, since, self.now.wall))
    }

    fn source_rejected(&self) -> Option<String> {
        self.core.adoption.source_rejected.clone()
    }

    fn token_rejected(&self) -> Option<String> {
        Adoption::recent(&self.core.adoption.rejected, self.now)
    }

    fn held_writers(&self) -> Vec<(String, DateTime<Utc>)> {
        self.core.seen.held.clone()
    }

    /// What the licensing Secret says against the token gridd runs with.
    fn token_stale(&self) -> Option<String> {
        let name = self.core.settings.kubernetes.licensing_secret.as_ref()?;
        let Some(Ok(held)) = &self.core.seen.secret else {
            return None;
        };
        // Only a Secret read after the token gridd runs with came is a verdict on it; one
        // read before is on its way again (asked for when the token came).
        let seen = &self.core.seen;
        if seen
            .secret_at
            .zip(seen.token_at)
            .is_some_and(|(s, t)| s < t)
        {
            return None;
        }
        let installed = self.core.seen.token.as_ref().and_then(|t| t.as_ref().ok());
        crate::node::stale(name, held, installed)
    }

    fn token_notes(&self) -> Vec<String> {
        Adoption::recent(&self.core.adoption.rotated, self.now)
            .into_iter()
            .collect()
    }

    fn own_notes(&self) -> Vec<String> {
        let seen = &self.core.seen;
        let unstarted = seen
            .smi_unstarted
            .as_ref()
            .map(|why| format!("{why}: the last reading stands, as of its time (observed_at)"));
        let secret = match (
            &self.core.settings.kubernetes.licensing_secret,
            &seen.secret,
        ) {
            (Some(name), Some(Err(why))) => Some(format!(
                "the licensing Secret {name} could not be read: {why}"
            )),
            _ => None,
        };
        unstarted.into_iter().chain(secret).collect()
    }

    fn node(&self) -> Option<crate::state::NodeSeen> {
        Some(self.core.node.seen())
    }

    fn agent_pid(&self) -> Option<u32> {
        self.core.pid
    }

    fn last_shutdown(&self) -> Option<crate::shutdown::LastShutdown> {
        self.core.seen.last_shutdown.clone()
    }

    fn clone_detected(&self) -> Option<crate::identity::CloneDetected> {
        self.core.seen.clone.clone()
    }

    /// The clock's skew the probe last measured, the driver's version nvidia-smi last
    /// printed, and the installed token's expiry, whatever its dates.
    fn service(&self) -> Option<crate::report::ServiceFacts> {
        let seen = &self.core.seen;
        Some(crate::report::ServiceFacts {
            clock_skew_seconds: self.core.probing.skew,
            driver_version: seen.smi.as_ref().and_then(|s| s.driver_version.clone()),
            token_expiry: seen
                .token
                .as_ref()
                .and_then(|t| t.as_ref().ok())
                .and_then(|t| t.expires)
                .map(|e| e.timestamp()),
            ..Default::default()
        })
    }

    fn since(&self) -> crate::state::Since {
        let (own, seen) = self.core.findings.since();
        crate::state::Since {
            token_rejected: self.core.adoption.rejected_at,
            source_rejected: self.core.adoption.source_rejected_at,
            own,
            seen,
        }
    }
}
