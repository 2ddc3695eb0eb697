//! The service's judgement, without I/O: when to read nvidia-smi, ask systemd, adopt the
//! token, restart gridd, probe the DLS and publish the report. Events (what the world told
//! us) go in through [`Core::handle`], time passes through [`Core::tick`], and out come
//! [`Effect`]s for the shell to carry out; [`Core::next_wake`] says when to call again. The
//! time is passed in ([`Now`]), so tests drive the core with simulated time, in-process.
//!
//! What is remembered (deadlines, restarts, what was probed) lives here; what was read (the
//! gridd fold, the last nvidia-smi answer, the token) too, as values. The per-reason policy is
//! [`crate::policy`]'s; the report is [`crate::state::evaluate`]'s.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::warn;

use crate::assemble::{SmiRead, TokenRead};
use crate::config::Settings;
use crate::install::Outcome;
use crate::node::Node;
use crate::observe::journal::GriddEvent;
use crate::observe::unit::UnitState;
use crate::report::metrics::Counters;
use crate::report::{DlsEndpoint, EventKind, Finding, Report};
use crate::restart::Remedy;
use crate::state::{LogFold, MAX_EVENTS};

mod adoption;
mod failing;
mod findings;
mod host;
mod in_flight;
mod node;
mod readings;
mod report;
mod schedule;
mod seen;
mod unit;

use adoption::Adoption;
use failing::Probing;
use findings::Findings;
pub use host::vm_change_line;
use in_flight::InFlight;
use readings::Readings;
use report::Published;
pub use report::status_line;
use schedule::{Schedule, Timer};
use seen::Seen;
pub use seen::stalled;
use unit::GriddUnit;

/// The service's slowest pace: the report is remade at least this often (a state that changes
/// with time alone), and the token's periodic look rides on its wakeups (nvidia-smi's turn
/// keeps its own time). Under
/// systemd's watchdog, half its interval when that is shorter. status.json and the metrics are
/// written only when the report changed or holds a new observation (`status` tells a live
/// service by the observation's age and the writer's pid). Each wakeup costs a guest a VM
/// exit: a licensed, quiet agent wakes about once a heartbeat, and for each reading.
pub const HEARTBEAT: Duration = Duration::from_secs(120);
/// Reports are made at most this often: a burst of gridd lines (this boot's journal read at
/// start, a crash loop) makes a few reports, not one per line. The first after a quiet spell
/// is made at once.
pub const MIN_REPORT_GAP: Duration = Duration::from_millis(100);
/// The least time from one answer of nvidia-smi to the next reading's start, whatever asks
/// for it (gridd's lines, the driver pod's signs, a reload): a flood of events (a readiness
/// marker made and removed in a loop, a crash loop's lines) costs about a reading a second,
/// never nvidia-smi back to back (each call costs the driver about 2 s of work, 24 s without
/// the persistence daemon).
pub const SMI_FLOOR: Duration = Duration::from_secs(1);
/// A lease's expiry reached without a renewal line is read this long after it, so that
/// nvidia-smi shows the lease gone rather than its last second.
pub const AFTER_EXPIRY: Duration = Duration::from_secs(1);
/// How often systemd is asked whether gridd runs while no license is held.
const UNIT_CHECK: Duration = Duration::from_secs(5);
/// While something may change with time alone (grace, backoff, acquiring): look every second.
const BUSY_TICK: Duration = Duration::from_secs(1);
/// The same unchanged vague failure is probed again at most this often (or at the
/// unlicensed poll interval, when longer).
pub const PROBE_REPEAT: Duration = Duration::from_secs(30);
/// A failure the probe only measures (clock skew that gridd named itself) is probed again at
/// most this often: the gauge follows the clock, without a connection every half minute.
pub const MEASURE_REPEAT: Duration = Duration::from_secs(300);
/// The token is looked at again this often without a change seen: inotify misses none in a
/// directory on a local file system (an overflow of its queue is a change too), so this look
/// is for what no watch sees (a file system mounted over the directory later), and each look
/// reads the token directory and gridd.conf, from the disk once they have left the page cache.
const ADOPT_WATCHED: Duration = Duration::from_secs(1800);
const ADOPT_UNWATCHED: Duration = Duration::from_secs(30);
/// After a failed adoption, the token directory's changes start the next one no sooner than
/// this (the periodic look and the end of the wait do): an adoption undone on a full state
/// file system changes the directory itself, and must not wake the agent into a storm.
const ADOPT_AFTER_FAILURE: Duration = Duration::from_secs(30);
/// How long a refused token file, or a rotation made, stays in the report.
pub const TOKEN_NOTICE_FOR: Duration = Duration::from_secs(24 * 3600);
/// The least time between two looks at the token directory (reads and adoptions) that its
/// changes cause.
const TOKEN_READ_GAP: Duration = Duration::from_millis(500);

/// The longest gap [`look_gap`] sets: a token copied in is looked at within it.
const LOOK_GAP_MAX: Duration = Duration::from_secs(2);

/// The gap before the next look that changes ask for, after a look that `took` this long:
/// [`TOKEN_READ_GAP`], or four times the look where that is longer (a directory of 20,000
/// files takes a while to read), up to [`LOOK_GAP_MAX`], so that a burst of changes keeps
/// the looks to a fifth of a core or so, however large the directory.
fn look_gap(took: Duration) -> Duration {
    (took * 4).clamp(TOKEN_READ_GAP, LOOK_GAP_MAX)
}

pub use crate::time::Now;

/// What the world told the service.
#[derive(Debug)]
pub enum Event {
    /// The journal follower (re)started: the fold is rebuilt from this boot's entries.
    JournalRestarted,
    Gridd(Box<GriddEvent>),
    Smi(SmiRead),
    /// gridd's unit as systemd says it (`None`: systemd could not say).
    Unit(Option<UnitState>),
    /// The token directory and gridd.conf, read again.
    Token(Box<TokenRead>),
    /// Something changed in the token directory or gridd.conf.
    TokenDirChanged,
    /// On a GPU Operator node, the driver pod's root or its ready marker changed.
    DriverPodChanged,
    /// systemd (the journal's `_PID=1`, a field no other process can forge) logged a line
    /// about gridd's unit: it started, stopped, failed or its process was killed. Its state
    /// is asked again, and nvidia-smi read soon: gridd's death shows there only at the
    /// lease's end.
    GriddUnitLine,
    Adopted(Result<Box<Outcome>, AdoptError>),
    Restarted(Result<(), String>),
    Probed {
        verdict: Option<Finding>,
        skew: Option<f64>,
    },
    /// A new config, already validated.
    Reloaded(Box<Settings>),
    /// What gridd did with its lease as the previous boot ended.
    LastShutdown(Option<crate::shutdown::LastShutdown>),
    /// A clone found at this boot, not reported before.
    CloneDetected(Box<crate::identity::CloneDetected>),
    /// Where the driver runs, looked at again (a GPU Operator's driver pod comes and goes).
    Node(Box<Node>),
    /// A write of the Node condition: done, or why not.
    NodeCondition(crate::node::condition::Outcome),
    /// The licensing Secret (`kubernetes.licensing_secret`), read: what it holds, or why it
    /// could not be read.
    LicensingSecret(Result<crate::node::SecretToken, String>),
    /// On a vGPU host, the vGPU manager (`nvidia-vgpu-mgr`) logged a line: a VM's vGPU
    /// started or stopped, or its guest's license changed.
    VgpuMgr,
    /// Answers that came together (a reading, where the driver runs, systemd's word), in
    /// order: one batch, one report.
    Together(Vec<Event>),
}

pub use crate::install::AdoptError;

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    ReadSmi,
    CheckUnit,
    ReadToken,
    /// Adopt a dropped token with install's code.
    Adopt {
        licensed: bool,
        may_restart: bool,
    },
    /// Restart gridd, as every restart of the agent's own is made: `why`, and whether it is
    /// the restart a new token is owed (once made, none is owed any more).
    RestartGridd {
        why: String,
        for_token: bool,
    },
    Probe(Vec<DlsEndpoint>),
    /// Read the previous boot's journal for the last shutdown's lease.
    ReadLastShutdown,
    /// Read the licensing Secret now, not at the next heartbeat: the token gridd runs with
    /// changed (a new driver pod), and the Secret as read before is no verdict on it.
    ReadSecret,
    /// On a vGPU host under KubeVirt: an Event on a VM's VMI, its vGPU's license changed.
    VmEvent(Box<crate::host::VmEvent>),
    Publish(Box<Publication>),
    /// The first report is out: tell systemd the service is ready.
    Ready,
}

/// A report to send everywhere.
#[derive(Debug, Clone, PartialEq)]
pub struct Publication {
    pub report: Report,
    /// status.json's content.
    pub json: Vec<u8>,
    pub metrics: String,
    /// Write status.json, the metrics and systemd's status line (something changed, or a new
    /// observation was made); else only the in-memory copy changed.
    pub write: bool,
    /// The state changed from an earlier one: tell the webhook.
    pub webhook: bool,
}

/// The service's state and judgement.
pub struct Core {
    /// The settings the agent works with on this node ([`Node::apply`] of `base`).
    settings: Settings,
    /// The settings as the config gives them.
    base: Settings,
    /// Where the driver runs, and whether the agent manages or only observes.
    node: Node,
    /// The writes to the Node, and whether each fails.
    node_writes: node::NodeWrites,
    heartbeat: Duration,
    /// The process the reports name as their writer (`None` in tests of the core alone).
    pid: Option<u32>,
    watching: bool,
    seen: Seen,
    probing: Probing,
    adoption: Adoption,
    counters: Counters,
    remedy: Remedy,
    /// The failures reported: since when each holds, which was last logged.
    findings: Findings,
    /// gridd's unit: systemd's last word, and the questions to it.
    unit: GriddUnit,
    busy: InFlight,
    /// nvidia-smi's readings: the one running, and when the next is due.
    readings: Readings,
    schedule: Schedule,
    published: Published,
    /// On a vGPU host: each VM's vGPU, its state and since when.
    vms: host::VmMemory,
}

impl Core {
    /// A core for `settings`. `heartbeat`: how often the report is remade at least (and the
    /// watchdog pinged); `watching`: whether the token directory is watched.
    pub fn new(settings: Settings, heartbeat: Duration, watching: bool, now: Now) -> Core {
        Core::with_restarts(settings, heartbeat, watching, now, &[])
    }

    /// [`Core::new`], going on from the restarts of gridd that an earlier run of the agent
    /// made (seconds on this core's clock: before its start, negative).
    pub fn with_restarts(
        settings: Settings,
        heartbeat: Duration,
        watching: bool,
        now: Now,
        restarts: &[f64],
    ) -> Core {
        let first_token_look = settings.service.first_token_look;
        Core {
            remedy: Remedy::with_history(&settings.service, restarts, secs(now)),
            base: settings.clone(),
            node: Node::default(),
            node_writes: node::NodeWrites::default(),
            settings,
            heartbeat,
            pid: None,
            watching,
            seen: Seen::new(),
            probing: Probing::default(),
            adoption: Adoption::default(),
            counters: Counters::default(),
            findings: Findings::default(),
            unit: GriddUnit::default(),
            busy: InFlight::default(),
            readings: Readings::new(now.mono),
            schedule: Schedule::at_start(now.mono, first_token_look),
            published: Published::new(now.mono),
            vms: host::VmMemory::default(),
        }
    }

    /// The reports name `pid` as their writer: `status` believes a report only while its
    /// writer runs.
    pub fn for_process(mut self, pid: u32) -> Core {
        self.pid = Some(pid);
        self
    }

    /// The first things to do: ask systemd, read nvidia-smi and the token. The token is
    /// adopted once the first report says whether gridd already holds a license.
    pub fn start(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = vec![Effect::ReadLastShutdown];
        self.read_token(now, &mut fx);
        self.check_unit(now, &mut fx);
        self.read_smi(now, &mut fx);
        fx
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The report is written out again at the next tick (a write of it failed).
    pub fn write_again(&mut self) {
        self.published.write_again();
    }

    /// Whether the first report is out (systemd was told the service is ready).
    pub fn ready(&self) -> bool {
        self.published.ready
    }

    /// The process that answers the question to systemd on its way, in systemd's stead, while
    /// it still runs: gridd's, when systemd's last word before the question was that gridd
    /// runs and no start or stop was logged since.
    pub fn running_gridd(&self) -> Option<u32> {
        self.unit.question.vouched
    }

    pub fn report(&self) -> Option<&Report> {
        self.published.report.as_ref()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// One event. What follows from it over time comes from the next [`Core::tick`], which
    /// the shell calls after each batch of events.
    pub fn handle(&mut self, event: Event, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        self.published.dirty = true;
        match event {
            Event::JournalRestarted => self.seen.fold = LogFold::new(MAX_EVENTS),
            Event::Gridd(e) => self.on_gridd(*e, now, &mut fx),
            Event::Smi(read) => self.on_smi(read, now),
            Event::Unit(u) => self.on_unit(u, now, &mut fx),
            Event::Token(read) => self.on_token(*read, now, &mut fx),
            Event::TokenDirChanged => {
                self.seen.token_dir_changed = Some(now.mono);
                self.read_token(now, &mut fx);
                self.dir_changed(now, &mut fx);
            }
            Event::Node(n) => self.node_seen(*n, now, &mut fx),
            // Where the driver runs is looked at with the reading; a moment later, so that
            // the pod's other steps (the marker, the root, gridd) are done, and after a
            // reading on its way, which may predate the change.
            Event::GriddUnitLine => {
                self.unit.question.gridd_moved();
                self.check_unit(now, &mut fx);
                self.readings.soon(now.mono + Duration::from_millis(300));
            }
            Event::DriverPodChanged => self.readings.soon(now.mono + Duration::from_millis(300)),
            // Each failed part of a write to the Node is a count, and the report is remade.
            Event::NodeCondition(outcome) => {
                self.counters.node_condition_errors += self.node_writes.written(outcome);
            }
            Event::LicensingSecret(read) => self.seen.secret_read(read, now.mono),
            Event::Adopted(result) => self.on_adopted(result, now, &mut fx),
            Event::Restarted(result) => self.on_restarted(result, now, &mut fx),
            Event::Probed { verdict, skew } => {
                self.busy.probe = false;
                self.probing.probed(verdict, skew);
            }
            Event::Reloaded(s) => self.reload(*s, now),
            Event::LastShutdown(record) => self.seen.last_shutdown_read(record),
            Event::CloneDetected(c) => self.seen.clone_found(*c),
            Event::VgpuMgr => self.on_vgpu_mgr(now),
            Event::Together(events) => {
                for e in events {
                    fx.extend(self.handle(e, now));
                }
            }
        }
        fx
    }

    /// A line of gridd's: into the fold, nvidia-smi read right after, and systemd asked
    /// where the unit's state may have moved.
    fn on_gridd(&mut self, e: GriddEvent, now: Now, fx: &mut Vec<Effect>) {
        let kind = e.what.kind;
        if matches!(kind, EventKind::Acquired | EventKind::Renewed) {
            // What the probe found was about the failure this license ended.
            self.probing.license_came();
        }
        // Read nvidia-smi right after gridd says something (coalesced), unless a reading
        // started well after the line was logged: it shows what the line says (this boot's
        // journal, read at start, asks for nothing more).
        let said = e.stamp.and_then(|s| s.utc());
        let before = |asked: Option<DateTime<Utc>>| {
            said.zip(asked)
                .is_some_and(|(said, asked)| said + chrono::Duration::seconds(1) <= asked)
        };
        let shown = before(self.readings.started);
        // A renewal of the lease nvidia-smi shows says its new expiry itself: nothing a
        // reading would tell.
        let renewal = kind == EventKind::Renewed && self.lease_renewed(&e, now);
        // Likewise systemd's answer to a question asked well after the line.
        let unit_knows = before(self.unit.question.asked_at);
        self.seen.gridd_line(e, !shown && !renewal, now);
        if !shown && !renewal {
            self.readings.soon(now.mono + Duration::from_millis(300));
        }
        if kind == EventKind::Started && self.node.driver_root.is_some() {
            // A new driver pod's gridd: the token it runs with is the new pod's.
            self.read_token(now, fx);
        }
        // A start or stop changes the unit's state; and a line from gridd while systemd was
        // last heard saying it is not running means that answer is old.
        if !unit_knows && self.unit.after_line(kind) {
            self.check_unit(now, fx);
        }
    }

    /// A renewal line of the lease the last reading showed ([`Seen::renewal`]): the next
    /// reading's deadline moves with the lease. Whether it was that (else it is read as any
    /// line of gridd's).
    fn lease_renewed(&mut self, e: &GriddEvent, now: Now) -> bool {
        let expiry = e.what.expiry.map(crate::time::whole_secs);
        let Some(moved) = self.seen.renewal(expiry, now) else {
            return false;
        };
        // A reading on its way sets the pace when it answers.
        if moved && !self.readings.running {
            self.pace(now);
        }
        true
    }

    /// systemd's answer about gridd's unit: believed unless the agent's own work was under
    /// way, which asks again once it is over.
    fn on_unit(&mut self, u: Option<UnitState>, now: Now, fx: &mut Vec<Effect>) {
        // One set aside is asked again once the agent's own restart is over (at once if it
        // is over already).
        let again = self.unit.answered(u, self.busy.own_work());
        if again {
            self.check_unit(now, fx);
        }
    }

    /// What is due at `now`: periodic reads, the report, a restart or a probe.
    pub fn tick(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        if self.schedule.take(Timer::TokenRead, now.mono) {
            // The directory changed during the last look: look again, and adopt what is there
            // (the shell sends no new event for changes it knows a read is owed for).
            self.read_token(now, &mut fx);
            self.dir_changed(now, &mut fx);
        }
        // In case a change escaped the watcher (or there is none): look at the token again.
        let looks = [Timer::Look, Timer::FirstLook, Timer::Owed];
        if self.schedule.any_due(&looks, now.mono) {
            self.look(now, &mut fx);
        }
        self.published.remake_if_due(now.mono, self.heartbeat);
        self.reads_due(now, &mut fx);
        self.report_due(now, &mut fx);
        self.remedy_step(now, &mut fx);
        fx
    }

    /// The token directory's look at its deadline (periodic, the first, or an owed
    /// adoption's): the token read, and what is there adopted.
    fn look(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let owed = self.schedule.looked(now.mono, self.watching);
        // An adoption owed (a writer settling, a deferred restart, the gap after a look
        // in a burst) comes with its reads already; the periodic look reads the token too.
        if !owed {
            self.read_token(now, fx);
        }
        // A deadline met while an adoption runs (a deferred restart's) is kept: the next
        // adoption follows that one at once.
        if self.busy.adopt {
            self.adoption.due = true;
        } else {
            self.adopt(now, fx);
        }
    }

    /// nvidia-smi at its turn, and systemd every few seconds while no license is held.
    fn reads_due(&mut self, now: Now, fx: &mut Vec<Effect>) {
        if self.readings.due(now.mono) {
            self.read_smi(now, fx);
        }
        // Without a license, whether gridd runs decides the next step: ask systemd every few
        // seconds (with one, and where gridd cannot help, at nvidia-smi's pace).
        if self.schedule.due(Timer::Unit, now.mono) && self.published.unit_matters() {
            self.schedule.set(Timer::Unit, now.mono + UNIT_CHECK);
            self.check_unit(now, fx);
        }
    }

    /// The report, when something happened and the gap since the last is over; the first
    /// tells systemd the service is ready, and starts the first adoption.
    fn report_due(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let asked = fx.iter().any(|e| {
            matches!(
                e,
                Effect::ReadSmi | Effect::ReadToken | Effect::Adopt { .. }
            )
        });
        if self.published.due(now.mono, self.seen.readable(), asked) {
            self.publish(now, fx);
            if self.published.first_out() {
                fx.push(Effect::Ready);
                self.adopt(now, fx);
            }
        }
    }

    /// When [`Core::tick`] is next due: a report held back by the gap, else the next deadline
    /// (nvidia-smi's turn, a unit check, a probe, the restart's grace or backoff), at most one
    /// heartbeat away and at least a second, so that an idle hour, and a failing one, cost
    /// a wakeup per deadline rather than one a second.
    pub fn next_wake(&self, now: Now) -> Duration {
        let held_back = self.published.held_back(now.mono, self.seen.readable());
        let wake = held_back.unwrap_or_else(|| {
            // Without a license (or with a failure), the restart's next deadline counts too.
            let remedy = (!self.published.quiet()).then(|| {
                self.remedy
                    .next_change(&self.settings.service, secs(now))
                    .map(|t| Duration::from_secs_f64(t.max(0.0)))
            });
            let beat = self.published.beat + self.heartbeat;
            let reading = self.readings.next();
            self.schedule
                .wake(now.mono, reading, beat, self.heartbeat, remedy)
        });
        self.schedule.with_token_looks(wake, now.mono)
    }

    fn read_smi(&mut self, now: Now, fx: &mut Vec<Effect>) {
        // Until it answers, do not ask again: a hung nvidia-smi is killed at its time limit.
        if !self.readings.start(now) {
            return;
        }
        fx.push(Effect::ReadSmi);
        // nvidia-smi shows a lease until it expires, even with gridd dead: ask systemd at
        // the same pace (and at the same moment, so that both answers make one report).
        self.check_unit(now, fx);
    }

    fn check_unit(&mut self, now: Now, fx: &mut Vec<Effect>) {
        // A vGPU host runs no gridd.
        if self.is_host() {
            return;
        }
        if self.unit.ask(self.seen.gridd_pid, now.wall) {
            fx.push(Effect::CheckUnit);
        }
    }

    /// A restart or adoption of the agent's own is over ([`GriddUnit::own_work_ended`]): a
    /// question owed is sent.
    fn own_work_ended(&mut self, restarted: bool, now: Now, fx: &mut Vec<Effect>) {
        if self.unit.own_work_ended(restarted, self.busy.own_work()) {
            self.check_unit(now, fx);
        }
    }

    /// nvidia-smi's next reading at its pace ([`Seen::smi_pace`]), counted from the last
    /// answer.
    fn pace(&mut self, now: Now) {
        let from = self.readings.answered_at.unwrap_or(now.mono);
        let reported = self.published.report.as_ref().map(|r| r.state);
        let next = self
            .seen
            .smi_pace(&self.settings.service, from, reported, now);
        self.readings.set_pace(next);
    }

    /// A reading of nvidia-smi answered ([`Seen::smi_read`]); the next one at its pace.
    fn on_smi(&mut self, read: SmiRead, now: Now) {
        if self.seen.smi_read(read, self.readings.began, now) {
            self.probing.license_came();
        }
        self.readings.answered(now.mono);
        self.pace(now);
    }

    /// The restarts of gridd in the last hour, when they changed since the last call: the
    /// shell keeps them for the agent's next run, so that the budget is one per guest.
    pub fn restarts_changed(&mut self, now: Now) -> Option<Vec<f64>> {
        self.remedy.take_changed(secs(now))
    }

    /// A reloaded config. What was set up at start (the follower, the watcher, the
    /// listeners) keeps its old settings: say so rather than pretend.
    fn reload(&mut self, s: Settings, now: Now) {
        self.base = s.clone();
        let s = self.node.apply(&s);
        say_restart_only(&self.settings, &s);
        self.remedy.reconfigure(&s.service);
        self.settings = kept_from_start(s, &self.settings);
        self.readings.soon(now.mono);
    }
}

/// Each key of a reloaded config that takes effect only when the service restarts, and
/// changed from `old` to `new`: a warning.
fn say_restart_only(old: &Settings, new: &Settings) {
    for (key, changed) in [
        (
            "commands.journalctl",
            old.commands.journalctl != new.commands.journalctl,
        ),
        (
            "paths.token_dir",
            old.paths.token_dir != new.paths.token_dir,
        ),
        (
            "paths.gridd_conf",
            old.paths.gridd_conf != new.paths.gridd_conf,
        ),
        (
            "service.metrics_socket",
            old.service.metrics_socket != new.service.metrics_socket,
        ),
        (
            "service.metrics_listen",
            old.service.metrics_listen != new.service.metrics_listen,
        ),
    ] {
        if changed {
            warn!(
                "{key} changed: it takes effect when the service restarts (systemctl restart vgpu-license-agent)"
            );
        }
    }
    say_kubernetes_restart_only(&old.kubernetes, &new.kubernetes);
}

/// The Node writer and the Secret's reader are set up at the start with these: each key that
/// changed is said, and all keep their running values until the restart, so that what the
/// service writes and what it says it writes stay one.
fn say_kubernetes_restart_only(ok: &crate::config::Kubernetes, nk: &crate::config::Kubernetes) {
    for (key, changed) in [
        ("node_condition", ok.node_condition != nk.node_condition),
        ("kubeconfig", ok.kubeconfig != nk.kubeconfig),
        (
            "licensing_secret",
            ok.licensing_secret != nk.licensing_secret,
        ),
        ("node_name", ok.node_name != nk.node_name),
        (
            "service_account_dir",
            ok.service_account_dir != nk.service_account_dir,
        ),
        ("heartbeat_seconds", ok.heartbeat != nk.heartbeat),
        (
            "taint_unlicensed",
            ok.taint_unlicensed != nk.taint_unlicensed,
        ),
    ] {
        if changed {
            warn!(
                "kubernetes.{key} changed: it takes effect when the service restarts (systemctl restart vgpu-license-agent); until then the Node and the Secret are written and read as before"
            );
        }
    }
}

/// A reloaded config `s`, with what is set up at start kept as `running` has it until the
/// restart, as said: the watcher still watches the old token directory, so the core does not
/// switch to a new one it would only see at the periodic look.
fn kept_from_start(mut s: Settings, running: &Settings) -> Settings {
    s.paths.token_dir.clone_from(&running.paths.token_dir);
    s.paths.gridd_conf.clone_from(&running.paths.gridd_conf);
    s.commands
        .journalctl
        .clone_from(&running.commands.journalctl);
    s.service
        .metrics_socket
        .clone_from(&running.service.metrics_socket);
    s.service
        .metrics_listen
        .clone_from(&running.service.metrics_listen);
    s.kubernetes.clone_from(&running.kubernetes);
    s
}

fn secs(now: Now) -> f64 {
    now.mono.as_secs_f64()
}

#[cfg(test)]
mod tests;
