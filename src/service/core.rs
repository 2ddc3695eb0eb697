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
use tracing::{error, info, warn};

use crate::assemble::{self, Parts, SmiRead, TokenProblem};
use crate::config::Settings;
use crate::node_mode::{Mode, Node};
use crate::observe::journal::GriddEvent;
use crate::observe::smi::SmiSnapshot;
use crate::plan::{Aside, Change, Outcome, Restart, SETTLE};
use crate::policy;
use crate::remedy::{Decision, Remedy};
use crate::report::metrics::{self, Counters};
use crate::report::{DlsEndpoint, EventKind, Finding, Reason, Report, State, message_ids};
use crate::state::{LogFold, MAX_EVENTS, evaluate};
use crate::time::LogTime;
use crate::token::{Token, TokenError};

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
    /// Whether gridd's unit runs (`None`: systemd could not say).
    Unit(Option<Result<(), String>>),
    /// The installed token, read again.
    Token(Result<Token, TokenProblem>),
    /// gridd.conf's `ServerAddress` (the legacy license server), read with the token.
    LegacyServer(Option<String>),
    /// Something changed in the token directory or gridd.conf.
    TokenDirChanged,
    /// On a GPU Operator node, the driver pod's root or its ready marker changed.
    DriverPodChanged,
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
    CloneDetected(Box<crate::guest_identity::CloneDetected>),
    /// Where the driver runs, looked at again (a GPU Operator's driver pod comes and goes).
    Node(Box<Node>),
    /// A write of the Node condition: done, or why not.
    NodeCondition(crate::node_condition::Outcome),
    /// The licensing Secret (`kubernetes.licensing_secret`), read: what it holds, or why it
    /// could not be read.
    LicensingSecret(Result<crate::node_mode::SecretToken, String>),
    /// Answers that came together (a reading, where the driver runs, systemd's word), in
    /// order: one batch, one report.
    Together(Vec<Event>),
}

pub use crate::plan::AdoptError;

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    ReadSmi,
    CheckUnit,
    ReadToken,
    /// Adopt a dropped token with install's code.
    Adopt {
        licensed: bool,
        retry_owed: bool,
    },
    RestartGridd {
        why: String,
    },
    Probe(Vec<DlsEndpoint>),
    /// Read the previous boot's journal for the last shutdown's lease.
    ReadLastShutdown,
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

/// Work running off the loop, so that nothing is started twice.
#[derive(Debug, Default)]
struct InFlight {
    smi: bool,
    unit: UnitQuestion,
    adopt: bool,
    /// A restart of the agent's own runs: why (said with its result, in one line).
    restart: Option<String>,
    probe: bool,
    /// The token directory is being read.
    token: bool,
    /// Since when (the latest read, and the latest adoption): how long a look takes sets the
    /// gap before the next one a burst of changes asks for ([`look_gap`]).
    token_since: Duration,
    adopt_since: Duration,
    /// It changed again while it was being read: read it once more when the answer comes.
    token_again: bool,
}

/// Asking systemd whether gridd's unit runs, one question at a time, each with its number.
/// One rule says which answers count: "not running" is believed only if its question was
/// asked after gridd's last start and after the end of the agent's own last restart of it,
/// and no restart or adoption of the agent's own runs as it comes. Otherwise it may predate
/// the start, or be the agent's own doing between its stop and its start: it is set aside
/// and the question asked again once that work is over.
#[derive(Debug, Default)]
struct UnitQuestion {
    /// The newest question's number (0: none asked yet).
    asked: u64,
    /// The newest question is on its way.
    in_flight: bool,
    /// The number of the first question asked after gridd's last start or the end of the
    /// agent's own last restart: answers to older ones may predate it.
    fresh_from: u64,
    /// A question wanted while one was on its way: asked when that one is answered.
    wanted: u64,
    /// A question wanted once the agent's own work is over.
    wanted_after_own: u64,
    /// The process whose life answers the question on its way (see [`Core::running_gridd`]).
    vouched: Option<u32>,
    /// When the newest question was sent: a line of gridd's logged well before it is in its
    /// answer.
    asked_at: Option<DateTime<Utc>>,
}

impl UnitQuestion {
    /// A question is wanted: whether to send one now (none on its way); else it is asked
    /// once the one on its way is answered.
    fn ask(&mut self) -> bool {
        if self.in_flight {
            self.wanted = self.asked + 1;
            false
        } else {
            self.asked += 1;
            self.in_flight = true;
            true
        }
    }

    /// No answer is on its way or owed, and none was asked for since gridd last moved: the
    /// last answer stands for the gridd running now.
    fn settled(&self) -> bool {
        !self.in_flight && self.asked >= self.fresh_from && self.wanted_after_own <= self.asked
    }

    /// gridd started, or the agent's own restart of it ended: from now on.
    fn gridd_moved(&mut self) {
        self.fresh_from = self.asked + 1;
    }

    /// Ask again once the agent's own work is over.
    fn after_own_work(&mut self) {
        self.wanted_after_own = self.asked + 1;
    }

    /// Whether a question is owed now, with the agent's own work running or not.
    fn owed(&self, own_work: bool) -> bool {
        !own_work && self.wanted_after_own > self.asked
    }

    /// The answer to the question on its way: whether it is believed, and whether to ask
    /// again now.
    fn answered(&mut self, not_running: bool, own_work: bool) -> (bool, bool) {
        self.in_flight = false;
        self.vouched = None;
        let believed = !not_running || (!own_work && self.asked >= self.fresh_from);
        if !believed {
            self.after_own_work();
        }
        (believed, self.wanted > self.asked || self.owed(own_work))
    }
}

impl InFlight {
    /// The agent is restarting gridd, or adopting a token (which may restart it).
    fn own_work(&self) -> bool {
        self.restart.is_some() || self.adopt
    }
}

/// When each periodic or owed piece of work is next due (monotonic times).
#[derive(Debug)]
struct Schedule {
    /// nvidia-smi's next reading.
    smi: Duration,
    /// `smi` was brought forward by an event (not the periodic reading).
    smi_for_event: bool,
    /// When the last reading was started (the system's clock, as gridd's lines are dated).
    smi_started: Option<DateTime<Utc>>,
    /// systemd is asked about gridd's unit next (while no license is held).
    unit: Duration,
    /// The same vague failure may be probed again.
    probe: Duration,
    /// The token directory is looked at again, in case a change escaped the watcher.
    adopt: Duration,
    /// `adopt` is the deadline of a restart owed for a new token (the budget or the backoff
    /// said wait): the service wakes for it, licensed or not.
    adopt_owed: bool,
    /// `adopt` is the first look after the start: it keeps its own time too (later ones
    /// come on the heartbeat's wakeups).
    adopt_first: bool,
    /// A look at the token directory owed for changes seen during the last one: when.
    token_read: Option<Duration>,
}

impl Schedule {
    /// nvidia-smi read by `at` at the latest, because something happened: brought forward,
    /// never put back.
    fn smi_soon(&mut self, at: Duration) {
        if at < self.smi {
            self.smi = at;
            self.smi_for_event = true;
        }
    }
}

/// The reports made, and what status.json and the metrics last got.
#[derive(Debug)]
struct Published {
    /// The latest report.
    report: Option<Report>,
    /// The metrics last written.
    metrics: String,
    /// When the latest report was written or remade for the heartbeat, or the service started:
    /// a report is remade at least every heartbeat, and the periodic turns ride on its beat.
    beat: Duration,
    /// When the latest report was made.
    made: Option<Duration>,
    /// Something happened since the latest report.
    dirty: bool,
    /// The next report is written whatever it holds (the last write failed).
    rewrite: bool,
    /// systemd was told the service is ready (after the first report).
    ready: bool,
}

impl Published {
    /// The report is remade at least every `heartbeat` (a state that changes with time alone).
    fn heartbeat_due(&self, now: Duration, heartbeat: Duration) -> bool {
        now >= self.beat + heartbeat
    }

    /// A report is made at most every [`MIN_REPORT_GAP`].
    fn gap_over(&self, now: Duration) -> bool {
        self.made.is_none_or(|t| now >= t + MIN_REPORT_GAP)
    }

    /// A report made at `now`: whether status.json and the metrics are written (the report
    /// changed, its metrics did, or it holds a new observation: `status` tells a live service
    /// by its `observed_at`); else only the copy in memory moves.
    fn made_at(
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

/// What the world last said: gridd's lines, nvidia-smi, systemd, the token, what the agent
/// found at start.
#[derive(Debug)]
struct Seen {
    fold: LogFold,
    smi: Option<SmiSnapshot>,
    /// The last reading, when it failed or timed out.
    smi_error: Option<SmiRead>,
    /// Why the agent could not start the last reading at all (its own limits), while it
    /// cannot: the reading before stands.
    smi_unstarted: Option<String>,
    /// When nvidia-smi last answered (or failed to): the report's `observed_at`, which a
    /// report remade on the heartbeat does not move.
    observed_at: Option<DateTime<Utc>>,
    unit: Option<Result<(), String>>,
    /// The process that logged gridd's latest line (the journal's `_PID`).
    gridd_pid: Option<u32>,
    token: Option<Result<Token, TokenProblem>>,
    /// When the token directory last changed (the watch's word).
    token_dir_changed: Option<Duration>,
    legacy_server: Option<String>,
    /// The lease's expiry as nvidia-smi last showed it, and since when it has not moved.
    lease: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// That lease was there at the agent's first reading: as old as it is, not one the agent
    /// saw come (gridd's failures since it came still count).
    lease_at_start: bool,
    last_shutdown: Option<crate::shutdown::LastShutdown>,
    clone: Option<crate::guest_identity::CloneDetected>,
    /// The licensing Secret as last read, or why it could not be.
    secret: Option<Result<crate::node_mode::SecretToken, String>>,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            fold: LogFold::new(MAX_EVENTS),
            smi: None,
            smi_error: None,
            smi_unstarted: None,
            observed_at: None,
            unit: None,
            gridd_pid: None,
            token: None,
            token_dir_changed: None,
            legacy_server: None,
            lease: None,
            lease_at_start: false,
            last_shutdown: None,
            clone: None,
            secret: None,
        }
    }
}

/// The agent's own probe of the DLS, for the failures gridd states vaguely.
#[derive(Debug, Default)]
struct Probing {
    /// The vague failure the last probe was started for: the same one is probed again only
    /// after [`PROBE_REPEAT`]; a new one at once.
    last: Option<Finding>,
    /// What the probe found, until a license or a new token makes it old news.
    failure: Option<Finding>,
}

/// Adopting the token that the token directory (or the token source) holds.
#[derive(Debug, Default)]
struct Adoption {
    /// The directory changed during an adoption: another one follows it.
    again: bool,
    /// The last adoption failed at this time: the directory's changes (many of them the
    /// adoption's own undo) do not start another one before [`ADOPT_AFTER_FAILURE`].
    failed: Option<Duration>,
    /// The token source holds a token the agent refused: why.
    source_rejected: Option<String>,
    /// When the agent first refused it: the warning's date (the last nvidia-smi reading,
    /// minutes old while licensed, may be older than the token).
    source_rejected_at: Option<DateTime<Utc>>,
    /// The token source was read at least once (before, a missing token is not counted:
    /// the source may bring one).
    source_read: bool,
    /// Files meant as tokens that an adoption refused and moved aside: what to say, and
    /// until when (monotonic).
    rejected: Option<(String, Duration)>,
    /// When the agent refused them: the warning's date.
    rejected_at: Option<DateTime<Utc>>,
    /// The last rotation an adoption made: a note, and until when.
    rotated: Option<(String, Duration)>,
    /// The last "token not adopted" line logged: the same refusal, met again at each change
    /// of the directory while it stands, is said once (until something else happens).
    refusal_said: Option<String>,
    /// The last adoption deferred gridd's restart, and said so; and until when.
    deferral_said: bool,
    deferred_until: Option<Duration>,
    /// The directory's changes start no adoption before this (monotonic): the last one's end
    /// and the gap its length set ([`look_gap`]).
    calm_at: Duration,
    /// Its deadline came while an adoption ran: the next one is made as that one ends.
    due: bool,
}

/// An adoption that changed something, said line by line: each names what it is about
/// ("token: ...", "restarted ..."). A file meant as a token that was refused is a warning:
/// the operator who copied it believes the rotation went through. The token's warnings are
/// said with what was done, not at every periodic look (the report keeps what lasts, an
/// expiring token among it).
fn say_outcome(outcome: &Outcome) {
    let refused: Vec<String> = outcome
        .changes
        .iter()
        .filter(|c| {
            matches!(
                c,
                Change::MoveStray {
                    why: Aside::Refused { .. },
                    ..
                }
            )
        })
        .map(|c| c.describe(true))
        .collect();
    // The restart made is said by [`say_restarted`], with its catalog entry.
    let restart = (outcome.restart == Restart::Done).then(|| {
        crate::plan::restarted_line(
            &outcome.restart_command,
            outcome.restart_reason.as_deref().unwrap_or(""),
        )
    });
    for line in outcome.lines() {
        if Some(&line) == restart.as_ref() {
            continue;
        }
        if refused.contains(&line) {
            warn!(
                message_id = message_ids::FAILURE_TOKEN_REJECTED,
                "token not adopted: {}",
                crate::text::escape(&line)
            );
        } else {
            info!("{}", crate::text::escape(&line));
        }
    }
    for w in &outcome.warnings {
        warn!("token: {}", crate::text::escape(w));
    }
}

/// A restart of gridd the agent made, in one line: the command and why, the reason also as a
/// field (the catalog entry's text names it).
fn say_restarted(command: &str, why: &str) {
    info!(
        message_id = message_ids::GRIDD_RESTARTED,
        vgpu_license_reason = why,
        "{}",
        crate::text::escape(&crate::plan::restarted_line(command, why))
    );
}

impl Adoption {
    /// Whether a refusal is news: not the one last said.
    fn news(&mut self, line: &str) -> bool {
        if self.refusal_said.as_deref() == Some(line) {
            return false;
        }
        self.refusal_said = Some(line.to_string());
        true
    }

    /// Remembers what an adoption refused or rotated, for the report of the next while. A
    /// new token in place with nothing refused ends an earlier refusal: the operator
    /// copied the right file.
    fn took(&mut self, outcome: &Outcome, now: Now) {
        let until = now.mono + TOKEN_NOTICE_FOR;
        let mut refused = Vec::new();
        let mut new_token = false;
        for c in &outcome.changes {
            match c {
                Change::MoveStray {
                    from,
                    to,
                    why: Aside::Refused { why, valid },
                } => refused.push(format!(
                    "{} was not adopted and is now {}: {why}{}",
                    crate::text::show_path(from),
                    crate::text::show_path(to),
                    if *valid {
                        format!(
                            "; to choose it instead: vgpu-license-agent install --token-file {}",
                            crate::text::show_path(to)
                        )
                    } else {
                        String::new()
                    }
                )),
                Change::MoveStray {
                    from,
                    to,
                    why: Aside::Previous,
                } => {
                    new_token = true;
                    self.rotated = Some((
                        format!(
                            "The token was rotated at {}: a newer token replaces {}, which is kept at {} (to go back: vgpu-license-agent install --token-file {}).",
                            crate::time::rfc3339(now.wall),
                            crate::text::show_path(from),
                            crate::text::show_path(to),
                            crate::text::show_path(to)
                        ),
                        until,
                    ));
                }
                Change::WriteToken { .. } => new_token = true,
                _ => {}
            }
        }
        if !refused.is_empty() {
            self.rejected = Some((refused.join("; "), until));
            self.rejected_at = Some(now.wall);
        } else if new_token {
            self.rejected = None;
        }
    }

    /// What is still recent at `now`.
    fn recent(notice: &Option<(String, Duration)>, now: Now) -> Option<String> {
        notice
            .as_ref()
            .filter(|(_, until)| now.mono < *until)
            .map(|(s, _)| s.clone())
    }
}

/// The service's state and judgement.
pub struct Core {
    /// The settings the agent works with on this node ([`Node::apply`] of `base`).
    settings: Settings,
    /// The settings as the config gives them.
    base: Settings,
    /// Where the driver runs, and whether the agent manages or only observes.
    node: Node,
    /// The last write of the Node condition failed.
    condition_failing: bool,
    /// A write of the opt-in taint fails (one warning per streak).
    taint_failing: bool,
    heartbeat: Duration,
    watching: bool,
    seen: Seen,
    probing: Probing,
    adoption: Adoption,
    counters: Counters,
    remedy: Remedy,
    /// The failure last logged (and counted), so that each is logged once.
    failure_key: Option<Finding>,
    /// The agent's own finding, and since when it holds.
    own_since: Option<(Finding, DateTime<Utc>)>,
    busy: InFlight,
    schedule: Schedule,
    published: Published,
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
            condition_failing: false,
            taint_failing: false,
            settings,
            heartbeat,
            watching,
            seen: Seen::new(),
            probing: Probing::default(),
            adoption: Adoption::default(),
            counters: Counters {
                mode: Mode::Manage.as_str(),
                driver: "host",
                ..Counters::default()
            },
            failure_key: None,
            own_since: None,
            busy: InFlight::default(),
            schedule: Schedule {
                smi: now.mono,
                smi_for_event: false,
                smi_started: None,
                unit: now.mono,
                probe: now.mono,
                adopt: now.mono + first_token_look,
                adopt_owed: false,
                adopt_first: true,
                token_read: None,
            },
            published: Published {
                report: None,
                metrics: String::new(),
                beat: now.mono,
                made: None,
                dirty: false,
                rewrite: false,
                ready: false,
            },
        }
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
        self.published.dirty = true;
        self.published.rewrite = true;
    }

    /// Whether the first report is out (systemd was told the service is ready).
    pub fn ready(&self) -> bool {
        self.published.ready
    }

    /// The process that answers the question to systemd on its way, in systemd's stead, while
    /// it still runs: gridd's, when systemd's last word before the question was that gridd
    /// runs and no start or stop was logged since.
    pub fn running_gridd(&self) -> Option<u32> {
        self.busy.unit.vouched
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
            Event::Token(t) => self.on_token(t, now),
            Event::LegacyServer(s) => self.seen.legacy_server = s,
            Event::TokenDirChanged => {
                self.seen.token_dir_changed = Some(now.mono);
                self.read_token(now, &mut fx);
                self.dir_changed(now, &mut fx);
            }
            Event::Node(n) => self.node_seen(*n, now, &mut fx),
            // Where the driver runs is looked at with the reading; a moment later, so that
            // the pod's other steps (the marker, the root, gridd) are done, and after a
            // reading on its way, which may predate the change.
            Event::DriverPodChanged => self
                .schedule
                .smi_soon(now.mono + Duration::from_millis(300)),
            Event::NodeCondition(outcome) => self.condition_written(outcome),
            Event::LicensingSecret(read) => self.secret_read(read),
            Event::Adopted(result) => self.on_adopted(result, now, &mut fx),
            Event::Restarted(result) => self.on_restarted(result, now, &mut fx),
            Event::Probed { verdict, skew } => self.on_probed(verdict, skew),
            Event::Reloaded(s) => self.reload(*s, now),
            Event::LastShutdown(record) => self.on_last_shutdown(record),
            Event::CloneDetected(c) => self.on_clone(*c),
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
            self.probing.failure = None;
        }
        // Read nvidia-smi right after gridd says something (coalesced), unless a reading
        // started well after the line was logged: it shows what the line says (this boot's
        // journal, read at start, asks for nothing more).
        let said = e.stamp.and_then(|s| s.utc());
        let before = |asked: Option<DateTime<Utc>>| {
            said.zip(asked)
                .is_some_and(|(said, asked)| said + chrono::Duration::seconds(1) <= asked)
        };
        let shown = before(self.schedule.smi_started);
        // Likewise systemd's answer to a question asked well after the line.
        let unit_knows = before(self.busy.unit.asked_at);
        // A process that said it shuts down stands for nothing until systemd was asked.
        if kind == EventKind::Shutdown {
            self.seen.gridd_pid = None;
        } else if e.pid.is_some() {
            self.seen.gridd_pid = e.pid;
        }
        self.seen.fold.push(e);
        if !shown {
            self.schedule
                .smi_soon(now.mono + Duration::from_millis(300));
        }
        if kind == EventKind::Started && self.node.driver_root.is_some() {
            // A new driver pod's gridd: the token it runs with is the new pod's.
            self.read_token(now, fx);
        }
        // A start or stop changes the unit's state; and a line from gridd while systemd was
        // last heard saying it is not running means that answer is old.
        if unit_knows {
            return;
        }
        if kind == EventKind::Started {
            self.busy.unit.gridd_moved();
            // systemd's "not running" was said before this start: void until it answers
            // again, so that no report meanwhile calls the new gridd down (nor restarts it).
            if matches!(self.seen.unit, Some(Err(_))) {
                self.seen.unit = None;
            }
        }
        if matches!(kind, EventKind::Started | EventKind::Shutdown)
            || matches!(self.seen.unit, Some(Err(_)))
        {
            self.check_unit(now, fx);
        }
    }

    /// systemd's answer about gridd's unit: believed unless the agent's own work was under
    /// way, which asks again once it is over.
    fn on_unit(&mut self, u: Option<Result<(), String>>, now: Now, fx: &mut Vec<Effect>) {
        let own_work = self.busy.own_work();
        let not_running = matches!(u, Some(Err(_)));
        let (believed, again) = self.busy.unit.answered(not_running, own_work);
        // One set aside is asked again once the agent's own restart is over (at once if it
        // is over already).
        if believed {
            self.seen.unit = u;
        }
        if again {
            self.check_unit(now, fx);
        }
    }

    /// The token as read: a new one is news for the probe.
    fn on_token(&mut self, t: Result<Token, TokenProblem>, now: Now) {
        self.busy.token = false;
        if std::mem::take(&mut self.busy.token_again) {
            // Changed again meanwhile: looked at again after a short gap, so that a burst of
            // changes is a few looks, not one after another for its length.
            let took = now.mono.saturating_sub(self.busy.token_since);
            self.schedule.token_read = Some(now.mono + look_gap(took));
        }
        // A token file being written (made empty, then filled; or part written) is no
        // verdict yet: looked at again once the directory has been still for a while.
        let partial = matches!(
            t,
            Err(TokenProblem::Invalid(
                TokenError::Empty | TokenError::Truncated(_)
            ))
        );
        if let Some(changed) = self.seen.token_dir_changed
            && partial
            && now.mono < changed + SETTLE
        {
            self.schedule.token_read = Some(changed + SETTLE);
            return;
        }
        if self
            .seen
            .token
            .as_ref()
            .is_some_and(|old| !same_token(old, &t))
        {
            // A new token is news: a vague failure is probed again at once, and what the
            // last probe found was about the old token's DLS.
            self.probing.last = None;
            self.probing.failure = None;
            self.published.dirty = true;
        }
        self.seen.token = Some(t);
    }

    /// An adoption's outcome: the source's verdict, what it changed, the restart it made.
    fn on_adopted(
        &mut self,
        result: Result<Box<Outcome>, AdoptError>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        self.busy.adopt = false;
        // Only a failure whose undo changed the directory (a full disk, say) waits: a token
        // or a directory refused as it stands (cloud-init still writing it, a FIFO at the
        // token path) changes nothing, and the next change is looked at at once.
        self.adoption.failed = match &result {
            Err(AdoptError::Other(_)) => Some(now.mono),
            _ => None,
        };
        // The source's verdict stands until the next adoption says otherwise (a good
        // rotation, or the source fixed back to the installed token).
        let rejected = match &result {
            Err(AdoptError::SourceRejected(why)) => Some(why.clone()),
            Err(AdoptError::Superseded | AdoptError::Settling(_)) => {
                self.adoption.source_rejected.clone()
            }
            _ => None,
        };
        if rejected != self.adoption.source_rejected {
            self.published.dirty = true;
            self.adoption.source_rejected_at = Some(now.wall);
        }
        self.adoption.source_rejected = rejected;
        self.adoption.source_read = true;
        if let Ok(o) = &result {
            self.adoption.took(o, now);
            self.published.dirty |= o.changed();
        }
        if result.as_ref().is_ok_and(|o| o.changed()) {
            self.read_token(now, fx);
        }
        let restarted = result
            .as_ref()
            .is_ok_and(|o| matches!(o.restart, Restart::Done | Restart::Failed(_)));
        let changed = result.as_ref().is_ok_and(|o| o.changed());
        self.adopted(result, now);
        self.own_work_ended(restarted, now, fx);
        // An adoption that did something (a restart of gridd takes seconds) says nothing of
        // how long a look takes.
        self.adoption.calm_at = now.mono
            + if restarted || changed {
                TOKEN_READ_GAP
            } else {
                look_gap(now.mono.saturating_sub(self.busy.adopt_since))
            };
        let again = std::mem::take(&mut self.adoption.again);
        if std::mem::take(&mut self.adoption.due) {
            self.adopt(now, fx);
        } else if again {
            self.adopt_at(self.adoption.calm_at);
        }
    }

    /// The agent's restart of gridd ended: counted or said, and its failure probed anew.
    fn on_restarted(&mut self, result: Result<(), String>, now: Now, fx: &mut Vec<Effect>) {
        let why = self.busy.restart.take().unwrap_or_default();
        // Whether gridd runs now is asked once the agent's own work is over.
        self.busy.unit.after_own_work();
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

    /// A probe of the DLS ended: its verdict, and the clock skew it measured.
    fn on_probed(&mut self, verdict: Option<Finding>, skew: Option<f64>) {
        self.busy.probe = false;
        if skew.is_some() {
            self.counters.clock_skew_seconds = skew;
        }
        self.probing.failure = verdict;
    }

    /// What the previous boot's journal says of its end.
    fn on_last_shutdown(&mut self, record: Option<crate::shutdown::LastShutdown>) {
        if let Some(r) = record.as_ref().filter(|r| !r.lease_returned) {
            warn!(
                "the previous shutdown left the lease held on the DLS until it expires: {}",
                crate::text::escape(&r.message)
            );
        }
        self.seen.last_shutdown = record;
    }

    /// A clone found at boot: said once, and kept for the report.
    fn on_clone(&mut self, c: crate::guest_identity::CloneDetected) {
        warn!(
            message_id = message_ids::CLONE_DETECTED,
            "{}",
            crate::text::escape(&c.message())
        );
        self.seen.clone = Some(c);
    }

    /// What is due at `now`: periodic reads, the report, a restart or a probe.
    pub fn tick(&mut self, now: Now) -> Vec<Effect> {
        let mut fx = Vec::new();
        if self.schedule.token_read.is_some_and(|t| now.mono >= t) {
            // The directory changed during the last look: look again, and adopt what is there
            // (the shell sends no new event for changes it knows a read is owed for).
            self.schedule.token_read = None;
            self.read_token(now, &mut fx);
            self.dir_changed(now, &mut fx);
        }
        // In case a change escaped the watcher (or there is none): look at the token again.
        if now.mono >= self.schedule.adopt {
            let owed = std::mem::take(&mut self.schedule.adopt_owed);
            self.schedule.adopt_first = false;
            self.schedule.adopt = now.mono
                + if self.watching {
                    ADOPT_WATCHED
                } else {
                    ADOPT_UNWATCHED
                };
            // An adoption owed (a writer settling, a deferred restart, the gap after a look
            // in a burst) comes with its reads already; the periodic look reads the token too.
            if !owed {
                self.read_token(now, &mut fx);
            }
            // A deadline met while an adoption runs (a deferred restart's) is kept: the next
            // adoption follows that one at once.
            if self.busy.adopt {
                self.adoption.due = true;
            } else {
                self.adopt(now, &mut fx);
            }
        }
        let licensed = self
            .published
            .report
            .as_ref()
            .is_some_and(|r| r.state == State::Licensed);
        // The report is remade while something may change with time alone (grace, backoff,
        // expiry), and at least as often as the heartbeat.
        if !licensed || self.published.heartbeat_due(now.mono, self.heartbeat) {
            self.published.dirty = true;
        }
        if now.mono >= self.schedule.smi {
            self.read_smi(now, &mut fx);
        }
        // Without a license, whether gridd runs decides the next step: ask systemd every few
        // seconds (with one, and where gridd cannot help, at nvidia-smi's pace).
        if now.mono >= self.schedule.unit
            && self.published.report.as_ref().is_some_and(|r| {
                !matches!(
                    r.state,
                    State::Licensed | State::NotLicensable | State::NoGpu | State::NoDriver
                )
            })
        {
            self.schedule.unit = now.mono + UNIT_CHECK;
            self.check_unit(now, &mut fx);
        }
        let readable = self.readable();
        let gap_over = self.published.gap_over(now.mono);
        // With a license held and nothing happening, a wakeup that just asked nvidia-smi or
        // looked at the token leaves the report to their answers: one report, not a
        // heartbeat's and then (held back by the gap, a second wakeup) the answers'.
        let asked = fx.iter().any(|e| {
            matches!(
                e,
                Effect::ReadSmi | Effect::ReadToken | Effect::Adopt { .. }
            )
        });
        if self.published.dirty && readable && gap_over && !(asked && self.quiet()) {
            self.published.dirty = false;
            self.published.made = Some(now.mono);
            self.publish(now, &mut fx);
            if !self.published.ready {
                self.published.ready = true;
                fx.push(Effect::Ready);
                self.adopt(now, &mut fx);
            }
        }
        self.remedy_step(now, &mut fx);
        fx
    }

    /// When [`Core::tick`] is next due: a report held back by the gap, else the next deadline
    /// (nvidia-smi's turn, a unit check, a probe, the restart's grace or backoff), at most one
    /// heartbeat away and at least a second, so that an idle hour, and a failing one, cost
    /// a wakeup per deadline rather than one a second.
    pub fn next_wake(&self, now: Now) -> Duration {
        let mut wake = self.next_wake_but_token(now);
        // A restart owed for a new token is made when the journal said it would be.
        if self.schedule.adopt_owed || self.schedule.adopt_first {
            wake = wake.min(self.schedule.adopt.max(now.mono));
        }
        self.schedule
            .token_read
            .map_or(wake, |t| wake.min(t.max(now.mono)))
    }

    fn next_wake_but_token(&self, now: Now) -> Duration {
        if self.published.dirty && self.readable() {
            return self
                .published
                .made
                .map_or(now.mono, |t| t + MIN_REPORT_GAP)
                .max(now.mono);
        }
        // nvidia-smi's turn keeps its own time: the licensed pace is the config's
        // (poll_licensed_seconds, "every 5 minutes"), not the next heartbeat after it (every
        // 6 minutes with a 2-minute heartbeat). The token's periodic look (half an hour
        // apart) comes on the heartbeat's wakeups, at most one heartbeat late.
        let mut at = (self.published.beat + self.heartbeat).min(self.schedule.smi);
        if !self.quiet() {
            // Without a license (or with a failure) the next step comes at one of these
            // deadlines, each known; in between, nothing changes with time alone that a
            // heartbeat late would matter for (a lease's or a token's warning, a notice's end).
            let ahead = |t: Duration| (t > now.mono).then_some(t);
            let remedy = self
                .remedy
                .next_change(&self.settings.service, secs(now))
                .map(|t| Duration::from_secs_f64(t.max(0.0)));
            for t in [
                ahead(self.schedule.unit),
                ahead(self.schedule.probe),
                remedy.and_then(ahead),
            ]
            .into_iter()
            .flatten()
            {
                at = at.min(t);
            }
        }
        at.clamp(now.mono + BUSY_TICK, now.mono + self.heartbeat)
    }

    /// A license held and no failure: nothing changes with time alone.
    fn quiet(&self) -> bool {
        self.published
            .report
            .as_ref()
            .is_some_and(|r| r.state == State::Licensed && r.failure.is_none())
    }

    /// The first report waits for the first nvidia-smi answer (or failure) and the token.
    fn readable(&self) -> bool {
        (self.seen.smi.is_some() || self.seen.smi_error.is_some()) && self.seen.token.is_some()
    }

    fn read_smi(&mut self, now: Now, fx: &mut Vec<Effect>) {
        if std::mem::replace(&mut self.busy.smi, true) {
            return;
        }
        // Until it answers, do not ask again: a hung nvidia-smi is killed at its time limit.
        self.schedule.smi = now.mono + Duration::from_secs(3600);
        self.schedule.smi_for_event = false;
        self.schedule.smi_started = Some(now.wall);
        fx.push(Effect::ReadSmi);
        // nvidia-smi shows a lease until it expires, even with gridd dead: ask systemd at
        // the same pace (and at the same moment, so that both answers make one report).
        self.check_unit(now, fx);
    }

    fn check_unit(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let running = (matches!(self.seen.unit, Some(Ok(()))) && self.busy.unit.settled())
            .then_some(self.seen.gridd_pid)
            .flatten();
        if self.busy.unit.ask() {
            self.busy.unit.vouched = running;
            self.busy.unit.asked_at = Some(now.wall);
            fx.push(Effect::CheckUnit);
        }
    }

    /// A restart or adoption of the agent's own is over (`restarted`: gridd was restarted, or
    /// the attempt made): a "not running" answer set aside while it ran is checked again.
    fn own_work_ended(&mut self, restarted: bool, now: Now, fx: &mut Vec<Effect>) {
        if restarted {
            self.busy.unit.gridd_moved();
        }
        if self.busy.unit.owed(self.busy.own_work()) {
            self.check_unit(now, fx);
        }
    }

    /// The time to the next periodic reading: the licensed pace while the report says
    /// licensed (before the first report, while the reading just made does), a minute near
    /// the lease's end, and the short pace without a license.
    fn smi_interval(&self, now: Now) -> Duration {
        let svc = &self.settings.service;
        // The reading just taken shows no license (gridd returned it, the driver pod is
        // going): the report of the reading before may still say licensed, and its 5-minute
        // interval would hide what comes next (the pod's root gone, a new pod).
        let fresh_unlicensed = self.seen.smi_error.is_some()
            || self
                .seen
                .smi
                .as_ref()
                .is_some_and(|s| !s.no_device && crate::state::smi_state(s) != State::Licensed);
        if fresh_unlicensed {
            return svc.poll_unlicensed;
        }
        let expiry = match &self.published.report {
            Some(r) if r.state == State::Licensed => {
                r.license.as_ref().and_then(|l| l.expiry).map(Some)
            }
            None => self
                .seen
                .smi
                .as_ref()
                .filter(|s| crate::state::smi_state(s) == State::Licensed)
                .map(lease_expiry),
            Some(_) => return svc.poll_unlicensed,
        };
        match expiry {
            None => svc.poll_unlicensed,
            Some(Some(e)) if (e - now.wall).num_seconds() < 3600 => {
                svc.poll_licensed.min(Duration::from_secs(60))
            }
            Some(_) => svc.poll_licensed,
        }
    }

    /// A write to the Node: a failure of the condition's patch or of the taint's is a
    /// warning naming which (once per streak of each in the journal) and a count, never more.
    fn condition_written(&mut self, outcome: crate::node_condition::Outcome) {
        use crate::node_condition::{TAINT_EFFECT, TAINT_KEY, TYPE};
        if let Some(result) = outcome.condition {
            let what = format!("the Node condition {TYPE}");
            self.node_write(
                result,
                &what,
                |c| &mut c.condition_failing,
                "was not written",
            );
        }
        if let Some((want, result)) = outcome.taint {
            let what = format!("the taint {TAINT_KEY}:{TAINT_EFFECT}");
            let failed = if want {
                "could not be put on the Node"
            } else {
                "could not be taken off the Node"
            };
            self.node_write(result, &what, |c| &mut c.taint_failing, failed);
        }
    }

    /// The licensing Secret, read: a failure to read it is a warning once per streak (it is
    /// also in the report's notes while it lasts).
    fn secret_read(&mut self, read: Result<crate::node_mode::SecretToken, String>) {
        let was_failing = matches!(self.seen.secret, Some(Err(_)));
        match &read {
            Err(why) if !was_failing => warn!(
                "the licensing Secret is not read (tried again at each heartbeat): {}",
                crate::text::escape(why)
            ),
            Ok(_) if was_failing => info!("the licensing Secret is read again"),
            _ => {}
        }
        self.seen.secret = Some(read);
    }

    /// One part of a Node write: `failing` is its streak's flag.
    fn node_write(
        &mut self,
        result: Result<(), String>,
        what: &str,
        failing: fn(&mut Self) -> &mut bool,
        failed: &str,
    ) {
        match result {
            Ok(()) => {
                if std::mem::take(failing(self)) {
                    info!("{what} is written again");
                }
            }
            Err(why) => {
                self.counters.node_condition_errors += 1;
                self.published.dirty = true;
                if !std::mem::replace(failing(self), true) {
                    warn!(
                        "{what} {failed} (retried with backoff): {}",
                        crate::text::escape(&why)
                    );
                }
            }
        }
    }

    /// Where the driver runs, as just looked at: on a change, the settings of the new place
    /// and a reading there at once.
    fn node_seen(&mut self, node: Node, now: Now, fx: &mut Vec<Effect>) {
        if node == self.node {
            return;
        }
        let moved = node.driver_root != self.node.driver_root || node.mode != self.node.mode;
        // The operator's driver pod came or went (its marker): its root, its token, changed.
        let pod_changed = node.driver_ready != self.node.driver_ready;
        if moved {
            match &node.driver_root {
                Some(root) => info!(
                    "GPU Operator node: the driver runs in the operator's driver container (root {}); observing only",
                    crate::text::show_path(root)
                ),
                None if node.mode == Mode::Observe => {
                    info!("service.mode = \"observe\": observing only")
                }
                None => {}
            }
            if node.manage_refused {
                warn!(
                    "service.mode = \"manage\" is refused on a GPU Operator node (the operator owns the token, gridd.conf and gridd): observing only"
                );
            }
        }
        self.settings = node.apply(&self.base);
        self.counters.mode = node.mode.as_str();
        self.counters.driver = node.driver();
        self.node = node;
        self.published.dirty = true;
        if moved || pod_changed {
            self.schedule.smi_soon(now.mono);
            self.read_token(now, fx);
        }
    }

    /// The token directory changed: adopt what is there, unless the last adoption failed
    /// moments ago (then when the wait is over).
    fn dir_changed(&mut self, now: Now, fx: &mut Vec<Effect>) {
        match self.adoption.failed {
            Some(t) if now.mono < t + ADOPT_AFTER_FAILURE => {
                self.schedule.adopt = self.schedule.adopt.min(t + ADOPT_AFTER_FAILURE);
            }
            // A burst of changes (a sync tool writing thousands of files) is adopted a gap
            // apart ([`look_gap`]), not in one adoption after another for its length: each
            // reads the whole directory.
            _ if now.mono < self.adoption.calm_at => self.adopt_at(self.adoption.calm_at),
            _ => self.adopt(now, fx),
        }
    }

    /// An adoption owed at `at`: the loop wakes for it.
    fn adopt_at(&mut self, at: Duration) {
        self.schedule.adopt = self.schedule.adopt.min(at);
        self.schedule.adopt_owed = true;
    }

    /// Reads the token directory, once at a time: a burst of changes (a sync tool writing
    /// thousands of files) costs one read in flight and one more after it, not one each.
    fn read_token(&mut self, now: Now, fx: &mut Vec<Effect>) {
        if std::mem::replace(&mut self.busy.token, true) {
            self.busy.token_again = true;
        } else {
            self.busy.token_since = now.mono;
            fx.push(Effect::ReadToken);
        }
    }

    /// A token dropped by cloud-init (or anyone): validated, mode fixed, strays moved aside,
    /// gridd restarted: the same code as `install`.
    fn adopt(&mut self, now: Now, fx: &mut Vec<Effect>) {
        // Whether gridd already holds a license decides whether a token in place needs a
        // restart: wait for the first report (it adopts at once).
        let Some(report) = &self.published.report else {
            return;
        };
        // Observing only: the token is the operator's (or the admin's) to put in place.
        if self.node.mode == Mode::Observe {
            return;
        }
        let licensed = report.state == State::Licensed;
        if std::mem::replace(&mut self.busy.adopt, true) {
            self.adoption.again = true;
            return;
        }
        // A new token's restart spends the same budget as every restart, and with a license
        // held the same backoff (40 rotations in 20 s are one restart now and the owed one
        // later, not 40); a new token while no license is held is the fix arriving.
        let retry_owed =
            self.remedy
                .may_restart_for_token(&self.settings.service, secs(now), licensed);
        self.busy.adopt_since = now.mono;
        fx.push(Effect::Adopt {
            licensed,
            retry_owed,
        });
    }

    fn adopted(&mut self, result: Result<Box<Outcome>, AdoptError>, now: Now) {
        if !self.adoption_is_news(&result) {
            return;
        }
        match result {
            Ok(outcome) => {
                // A restart still owed, met again by a look that changed nothing (the
                // agent's own chmod wakes it, and so does each periodic look), was said
                // when it was deferred: the journal says it once, and once when it is made.
                let said_already = self.adoption.deferral_said
                    && !outcome.changed()
                    && outcome.restart == Restart::Deferred;
                self.adoption.deferral_said = outcome.restart == Restart::Deferred;
                if !said_already && (outcome.changed() || outcome.restart != Restart::NotNeeded) {
                    say_outcome(&outcome);
                    // A new token, or one now in place: a vague failure is news again.
                    self.probing.last = None;
                }
                self.restart_done(&outcome, now, !said_already);
            }
            Err(AdoptError::NoToken(_)) => {}
            Err(AdoptError::Settling(wait)) => {
                // Judged once the writer is done: the deadline wakes the service.
                self.adopt_at(now.mono + wait);
            }
            Err(AdoptError::Superseded) => {
                info!("the token was replaced while being adopted: adopting the new one");
                self.adoption.again = true;
            }
            // cloud-init may still be writing it: the next change or tick tries again.
            Err(AdoptError::Rejected(why)) => {
                warn!(
                    "token not adopted: {}",
                    crate::text::escape(&why.to_string())
                )
            }
            Err(AdoptError::Refused(why) | AdoptError::Other(why)) => {
                error!("token not adopted: {}", crate::text::escape(&why))
            }
            Err(AdoptError::SourceRejected(why)) => {
                warn!(
                    message_id = message_ids::FAILURE_TOKEN_SOURCE_REJECTED,
                    "token not adopted: {}",
                    crate::text::escape(&why)
                )
            }
        }
    }

    /// Whether an adoption's outcome is to be said: a refusal only when it is not the one
    /// last said. A change made, or another outcome, ends the refusal (the next one is news
    /// again); a quiet look (nothing to do, a file still being written) does not.
    fn adoption_is_news(&mut self, result: &Result<Box<Outcome>, AdoptError>) -> bool {
        let refusal = match result {
            Err(AdoptError::Rejected(why)) => Some(why.to_string()),
            Err(
                AdoptError::Refused(why) | AdoptError::Other(why) | AdoptError::SourceRejected(why),
            ) => Some(why.clone()),
            _ => None,
        };
        match refusal {
            Some(why) => self.adoption.news(&why),
            None => {
                match result {
                    Ok(o) if !o.changed() && o.restart == Restart::NotNeeded => {}
                    Err(AdoptError::Settling(_) | AdoptError::NoToken(_)) => {}
                    _ => self.adoption.refusal_said = None,
                }
                true
            }
        }
    }

    /// What an adoption's restart of gridd means for the service: counted, owed until the
    /// budget allows, or failed (which counts too).
    fn restart_done(&mut self, outcome: &Outcome, now: Now, say_deferral: bool) {
        match &outcome.restart {
            Restart::Done => {
                self.counters.gridd_restarts += 1;
                self.remedy.restarted(secs(now), 0.5);
                say_restarted(
                    &outcome.restart_command,
                    outcome.restart_reason.as_deref().unwrap_or("for the token"),
                );
                self.schedule.smi_soon(now.mono + Duration::from_secs(1));
                // Asked once the adoption is over.
                self.busy.unit.after_own_work();
            }
            Restart::Deferred => {
                // Owed: adopted again (and gridd restarted) once the budget allows, at that
                // deadline, however quiet the service is meanwhile.
                let licensed = self
                    .published
                    .report
                    .as_ref()
                    .is_some_and(|r| r.state == State::Licensed);
                let at =
                    self.remedy
                        .next_allowed_for_token(&self.settings.service, secs(now), licensed);
                // Whole seconds, rounded up: the restart comes when the line says. A later
                // look that finds it still owed keeps the deadline said (rounding up again from
                // a later moment would move it).
                let until = match self.adoption.deferred_until {
                    Some(t) if !say_deferral && t > now.mono => t,
                    _ => {
                        let wait = Duration::from_secs_f64((at - secs(now)).max(1.0).ceil());
                        if say_deferral {
                            info!(
                                "nvidia-gridd is restarted for the new token in {:.0} s: the restart budget or backoff says wait",
                                wait.as_secs_f64()
                            );
                        }
                        now.mono + wait
                    }
                };
                self.adoption.deferred_until = Some(until);
                self.adopt_at(until);
            }
            Restart::Failed(why) => {
                // A failed attempt counts against the budget and the backoff too.
                self.remedy.restarted(secs(now), 0.5);
                error!(
                    "restarting nvidia-gridd failed: {}",
                    crate::text::escape(why)
                );
            }
            _ => {}
        }
    }

    /// The failure before any probe: the agent's own (token, unit), else gridd's.
    fn base_reason(&self, now: Now) -> Option<Reason> {
        let token = self
            .seen
            .token
            .as_ref()
            .map(|t| assemble::token_at(t, now.wall))
            .and_then(Result::err)
            .map(|p| p.reason());
        let unit = match &self.seen.unit {
            Some(Err(_)) => Some(Reason::GriddNotRunning),
            _ => None,
        };
        let log = self.seen.fold.failure_reason();
        let own = policy::own_failure(token, unit, log);
        policy::most_telling(own, None, log.map(|r| (r, r)))
    }

    /// A reading of nvidia-smi: the license as it shows it, or why it shows none. One the
    /// agent could not even start (its own limits) leaves the last reading standing, as old
    /// as it is: stale, not wrong.
    fn on_smi(&mut self, read: SmiRead, now: Now) {
        self.busy.smi = false;
        match read {
            SmiRead::Unstarted(why) => {
                if self.seen.smi_unstarted.as_deref() != Some(why.as_str()) {
                    warn!("{}", crate::text::escape(&why));
                }
                self.seen.smi_unstarted = Some(why);
            }
            SmiRead::Snapshot(s) => {
                self.seen.smi_unstarted = None;
                self.seen.observed_at = Some(now.wall);
                if crate::state::smi_state(&s) == State::Licensed {
                    self.probing.failure = None;
                }
                let lease = match (lease_expiry(&s), self.seen.lease) {
                    (Some(exp), Some((old, since))) if old == exp => Some((old, since)),
                    (Some(exp), _) => Some((exp, now.wall)),
                    (None, _) => None,
                };
                if lease.map(|l| l.0) != self.seen.lease.map(|l| l.0) {
                    self.seen.lease_at_start =
                        self.seen.smi.is_none() && self.seen.smi_error.is_none();
                }
                self.seen.lease = lease;
                self.seen.smi = Some(s);
                self.seen.smi_error = None;
            }
            SmiRead::Failed(ref why) | SmiRead::TimedOut(ref why) => {
                self.seen.smi_unstarted = None;
                self.seen.observed_at = Some(now.wall);
                if self.seen.smi_error.as_ref().map(SmiRead::reason) != Some(why.as_str()) {
                    warn!("nvidia-smi: {}", crate::text::escape(why));
                }
                self.seen.smi_error = Some(read);
            }
        }
        // Something gridd said while this reading ran (a restart) keeps the reading it asked
        // for: this one may show the license from before it.
        let next = now.mono + self.smi_interval(now);
        self.schedule.smi = if self.schedule.smi_for_event {
            self.schedule.smi.min(next)
        } else {
            next
        };
    }

    /// The restarts of gridd in the last hour, when they changed since the last call: the
    /// shell keeps them for the agent's next run, so that the budget is one per guest.
    pub fn restarts_changed(&mut self, now: Now) -> Option<Vec<f64>> {
        self.remedy.take_changed(secs(now))
    }

    /// Makes the report and says where it goes.
    fn publish(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let obs = self.observations(now);
        let report = self.report_of(obs);
        self.log_new_failure(&report);
        let previous = self.published.report.as_ref().map(|r| r.state);
        if previous != Some(report.state) {
            log_state_change(&report, previous);
        }
        let mut json = serde_json::to_vec_pretty(&report).unwrap_or_default();
        json.push(b'\n');
        self.counters.driver_version = self
            .seen
            .smi
            .as_ref()
            .and_then(|s| s.driver_version.clone());
        let metrics_text = metrics::render(&report, &self.counters);
        let write = self
            .published
            .made_at(now.mono, self.heartbeat, &report, &metrics_text);
        let webhook = previous.is_some() && previous != Some(report.state);
        fx.push(Effect::Publish(Box::new(Publication {
            report,
            json,
            metrics: metrics_text,
            write,
            webhook,
        })));
    }

    /// What the service has seen, as the observations a report is made of.
    /// What the licensing Secret says against the token gridd runs with: `token_stale`, or a
    /// note that it could not be read.
    fn licensing_secret(&self, obs: &mut crate::state::Observations) {
        let Some(name) = &self.settings.kubernetes.licensing_secret else {
            return;
        };
        match &self.seen.secret {
            Some(Ok(held)) => {
                let installed = self.seen.token.as_ref().and_then(|t| t.as_ref().ok());
                obs.token_stale = crate::node_mode::stale(name, held, installed);
            }
            Some(Err(why)) => obs.own_notes.push(format!(
                "the licensing Secret {name} could not be read: {why}"
            )),
            None => {}
        }
    }

    fn observations(&mut self, now: Now) -> crate::state::Observations {
        let smi = match (&self.seen.smi, &self.seen.smi_error) {
            (_, Some(failed)) => failed.clone().into_snapshot(),
            (Some(s), None) => s.clone(),
            (None, None) => SmiSnapshot::default(),
        };
        let missing = Err(TokenProblem::Missing);
        let obs = assemble::assemble(
            &self.settings,
            now.wall,
            Parts {
                smi,
                fold: Some(self.seen.fold.clone()),
                token: self.seen.token.as_ref().unwrap_or(&missing),
                unit: self.seen.unit.as_ref(),
                probe: self.probing.failure.clone(),
            },
        );
        // The agent's own findings hold since they were first seen, not since this moment.
        let own = obs
            .own_failure
            .clone()
            .or_else(|| self.probing.failure.clone());
        match (&own, &self.own_since) {
            (Some(o), Some((k, _))) if o == k => {}
            (Some(o), _) => self.own_since = Some((o.clone(), now.wall)),
            (None, _) => self.own_since = None,
        }
        let mut obs = obs;
        obs.legacy_server.clone_from(&self.seen.legacy_server);
        // A lease the agent saw come (or move): what gridd logged before it is over.
        obs.lease_since = self
            .seen
            .lease
            .filter(|_| !self.seen.lease_at_start)
            .map(|(_, since)| since);
        obs.renewal_stalled = self
            .seen
            .lease
            .and_then(|(exp, since)| stalled(exp, since, now.wall));
        obs.source_rejected
            .clone_from(&self.adoption.source_rejected);
        obs.node = Some(self.node.seen());
        obs.token_rejected = Adoption::recent(&self.adoption.rejected, now);
        obs.token_notes
            .extend(Adoption::recent(&self.adoption.rotated, now));
        if let Some(why) = &self.seen.smi_unstarted {
            obs.own_notes.push(format!(
                "{why}: the last reading stands, as of its time (observed_at)"
            ));
        }
        self.counters.token_rejected =
            obs.token_rejected.is_some() || obs.source_rejected.is_some();
        self.licensing_secret(&mut obs);
        self.counters.token_stale = obs.token_stale.is_some();
        // The observation is as old as nvidia-smi's last answer, however often it is written.
        if let Some(at) = self.seen.observed_at {
            obs.at = Some(at);
        }
        self.counters.token_expiry = self
            .seen
            .token
            .as_ref()
            .and_then(|t| t.as_ref().ok())
            .and_then(|t| t.expires)
            .map(|e| e.timestamp());
        obs
    }

    /// The report of `obs`, with what only the service knows (its pid, the last shutdown, a
    /// clone found at boot, since when its own finding holds).
    fn report_of(&self, obs: crate::state::Observations) -> Report {
        let mut report = evaluate(obs);
        report.agent_pid = Some(std::process::id());
        report.last_shutdown.clone_from(&self.seen.last_shutdown);
        if let Some(c) = &self.seen.clone {
            // The agent's own event, before gridd's lines of this boot (it ran before gridd).
            report.events.insert(
                0,
                crate::report::Event {
                    at: Some(LogTime::Utc(c.at)),
                    kind: EventKind::CloneDetected,
                    server: None,
                    edition: None,
                    expiry: None,
                    reason: None,
                    message: c.message(),
                },
            );
        }
        if let Some(f) = report.failure.as_mut()
            && let Some(since) = self.failure_since(f)
        {
            f.at = Some(LogTime::Utc(crate::time::whole_secs(since)));
        }
        report
    }

    /// Since when the agent's own finding `f` holds, where the agent knows it: the
    /// observation's time (nvidia-smi's last answer, minutes old while licensed) may predate
    /// what the finding is about.
    fn failure_since(&self, f: &crate::report::Failure) -> Option<DateTime<Utc>> {
        match f.reason {
            Reason::TokenRejected => self.adoption.rejected_at,
            Reason::TokenSourceRejected => self.adoption.source_rejected_at,
            _ => self
                .own_since
                .as_ref()
                .filter(|((reason, message), _)| f.reason == *reason && f.message == *message)
                .map(|(_, since)| *since),
        }
    }

    /// A new failure: counted once, logged with its catalog entry.
    fn log_new_failure(&mut self, report: &Report) {
        let key = report.failure.as_ref().map(|f| {
            (
                f.reason,
                format!(
                    "{}|{}",
                    f.message,
                    f.at.map(|a| a.to_string()).unwrap_or_default()
                ),
            )
        });
        // With a token source, no token before the source is read is not yet a failure: the
        // source may bring one.
        let premature = f_is_missing(report)
            && self.settings.paths.token_source.is_some()
            && !self.adoption.source_read;
        if let Some(f) = &report.failure
            && key != self.failure_key
            && !premature
        {
            self.counters.count_failure(f.reason);
            warn!(
                message_id = message_ids::for_reason(f.reason),
                vgpu_license_reason = f.reason.as_str(),
                "{}: {} -> {}",
                f.reason.as_str(),
                crate::text::escape(&f.message),
                crate::text::escape(&f.advice)
            );
        }
        if !premature {
            self.failure_key = key;
        }
    }

    /// Remedy: restart gridd when that can help, probe the DLS when a failure says nothing
    /// specific (or to measure a clock skew gridd named).
    fn remedy_step(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let Some(report) = &self.published.report else {
            return;
        };
        let state = report.state;
        let reason = report.failure.as_ref().map(|f| f.reason);
        if state == State::Licensed {
            self.probing.failure = None;
            self.probing.last = None;
        } else {
            // A failure gridd (or the agent) left vague: the agent finds the cause itself. A
            // new one at once; the same one again after the rate limit (what was found may
            // have been fixed since). Clock skew that gridd named is probed too, more rarely,
            // to measure it.
            let base = self.base_reason(now);
            let (worth_it, repeat) = match base.map(policy::of) {
                Some(p) if p.probe_measures => (true, MEASURE_REPEAT),
                Some(p) => (p.probe_refines, PROBE_REPEAT),
                None => (state == State::Unlicensed, PROBE_REPEAT),
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
            if worth_it && !self.busy.probe && (news || now.mono >= self.schedule.probe) {
                self.busy.probe = true;
                self.probing.last = Some(key);
                self.schedule.probe = now.mono + self.settings.service.poll_unlicensed.max(repeat);
                let nodes = report.dls.clone().unwrap_or_default();
                fx.push(Effect::Probe(nodes));
            }
        }
        let t = secs(now);
        // A unit that does not exist cannot be restarted (systemctl answers exit 5): it comes
        // with the GRID guest driver, which is the fix.
        let unit_missing = matches!(&self.seen.unit, Some(Err(why)) if policy::unit_missing(why));
        if let Decision::Restart(why) = self.remedy.decide(&self.settings.service, t, state, reason)
            && self.node.mode == Mode::Manage
            && !unit_missing
            && self.busy.restart.is_none()
            && !self.busy.adopt
        {
            self.busy.restart = Some(why.clone());
            let jitter = f64::from(now.wall.timestamp_subsec_nanos() % 1000) / 1000.0;
            self.remedy.restarted(t, jitter);
            fx.push(Effect::RestartGridd { why });
        }
    }

    /// A reloaded config. What was set up at start (the follower, the watcher, the
    /// listeners) keeps its old settings: say so rather than pretend.
    fn reload(&mut self, s: Settings, now: Now) {
        self.base = s.clone();
        let s = self.node.apply(&s);
        let (old, new) = (&self.settings, &s);
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
        self.remedy.reconfigure(&s.service);
        // What is set up at start keeps its old value until the restart, as said above: the
        // watcher still watches the old token directory, so the core does not switch to a
        // new one it would only see at the periodic look.
        let mut s = s;
        s.paths.token_dir.clone_from(&self.settings.paths.token_dir);
        s.paths
            .gridd_conf
            .clone_from(&self.settings.paths.gridd_conf);
        s.commands
            .journalctl
            .clone_from(&self.settings.commands.journalctl);
        s.service
            .metrics_socket
            .clone_from(&self.settings.service.metrics_socket);
        s.service
            .metrics_listen
            .clone_from(&self.settings.service.metrics_listen);
        self.settings = s;
        self.schedule.smi_soon(now.mono);
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

/// Whether the report's failure is a missing token.
fn f_is_missing(report: &Report) -> bool {
    report
        .failure
        .as_ref()
        .is_some_and(|f| f.reason == Reason::TokenMissing)
}

fn secs(now: Now) -> f64 {
    now.mono.as_secs_f64()
}

fn same_token(a: &Result<Token, TokenProblem>, b: &Result<Token, TokenProblem>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

fn log_state_change(report: &Report, previous: Option<State>) {
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
fn same_report(a: &Report, b: &Report) -> bool {
    // Every field but the observation's time and the agent's pid: a field added to the report
    // stops this compiling until it is placed on one side or the other.
    let Report {
        schema,
        state,
        observed_at: _,
        license,
        gpus,
        events,
        failure,
        dls,
        licensing_mode,
        events_omitted,
        notes,
        exit_code,
        agent_pid: _,
        last_shutdown,
        mode,
        driver_root,
    } = a;
    *schema == b.schema
        && *state == b.state
        && *license == b.license
        && *gpus == b.gpus
        && *events == b.events
        && *failure == b.failure
        && *dls == b.dls
        && *licensing_mode == b.licensing_mode
        && *events_omitted == b.events_omitted
        && *notes == b.notes
        && *exit_code == b.exit_code
        && *last_shutdown == b.last_shutdown
        && *mode == b.mode
        && *driver_root == b.driver_root
}

/// The one line `systemctl status` shows.
pub fn status_line(r: &Report) -> String {
    let mut line = r.state.as_str().to_string();
    if let Some(tally) = crate::report::vgpu_tally(r) {
        line.push_str(&format!(", {tally}"));
    }
    if let Some(l) = &r.license {
        if let Some(ed) = &l.edition {
            line.push_str(&format!(", {ed}"));
        }
        if let Some(exp) = l.expiry {
            line.push_str(&format!(", expires {}", crate::time::rfc3339(exp)));
        }
    }
    if let Some(f) = &r.failure {
        line.push_str(&format!("; {}: {}", f.reason.as_str(), f.message));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_event_brings_nvidia_smis_reading_forward_never_back() {
        let mut due = Schedule {
            smi: secs(60),
            smi_for_event: false,
            smi_started: None,
            unit: secs(0),
            probe: secs(0),
            adopt: secs(0),
            adopt_owed: false,
            adopt_first: false,
            token_read: None,
        };
        due.smi_soon(secs(90));
        assert_eq!((due.smi, due.smi_for_event), (secs(60), false));
        due.smi_soon(secs(5));
        assert_eq!((due.smi, due.smi_for_event), (secs(5), true));
    }

    #[test]
    fn status_json_is_written_on_news_or_a_new_observation_and_reports_keep_their_gap() {
        let heartbeat = secs(30);
        let mut p = Published {
            report: None,
            metrics: String::new(),
            beat: secs(0),
            made: None,
            dirty: false,
            rewrite: false,
            ready: false,
        };
        let r = evaluate(crate::state::Observations::default());
        assert!(p.made_at(secs(1), heartbeat, &r, "m"), "the first");
        assert!(!p.made_at(secs(2), heartbeat, &r, "m"), "nothing new");
        assert!(p.made_at(secs(3), heartbeat, &r, "m2"), "new metrics");
        let mut other = r.clone();
        other.state = if r.state == State::Licensed {
            State::Unlicensed
        } else {
            State::Licensed
        };
        assert!(p.made_at(secs(4), heartbeat, &other, "m2"), "a new state");
        assert!(!p.made_at(secs(600), heartbeat, &other, "m2"), "time alone");
        assert!(!p.heartbeat_due(secs(601), heartbeat), "just remade");
        assert!(p.heartbeat_due(secs(630), heartbeat));
        other.observed_at = Some("2026-12-03T12:00:00Z".parse().unwrap());
        assert!(
            p.made_at(secs(631), heartbeat, &other, "m2"),
            "a new observation"
        );
        assert_eq!(p.report.as_ref().map(|r| r.state), Some(other.state));
        assert!(p.gap_over(secs(0)), "none made yet");
        p.made = Some(secs(10));
        assert!(!p.gap_over(secs(10) + MIN_REPORT_GAP / 2));
        assert!(p.gap_over(secs(10) + MIN_REPORT_GAP));
    }

    #[test]
    fn one_unit_question_at_a_time_and_one_more_if_wanted_meanwhile() {
        let mut q = UnitQuestion::default();
        assert!(q.ask());
        assert!(!q.ask(), "one is on its way");
        assert_eq!(q.answered(false, false), (true, true), "the wanted one now");
        assert!(q.ask());
        assert_eq!(q.answered(true, false), (true, false));
    }

    #[test]
    fn not_running_from_before_gridd_started_is_asked_again_not_believed() {
        let mut q = UnitQuestion::default();
        assert!(q.ask());
        q.gridd_moved();
        assert_eq!(q.answered(true, false), (false, true));
        assert!(q.ask());
        assert_eq!(
            q.answered(true, false),
            (true, false),
            "asked after the start"
        );
        // A start while none is on its way: the next question is after it.
        q.gridd_moved();
        assert!(q.ask());
        assert_eq!(q.answered(true, false), (true, false));
        // "Running" is believed whenever it was asked.
        assert!(q.ask());
        q.gridd_moved();
        assert_eq!(q.answered(false, false), (true, false));
    }

    #[test]
    fn not_running_during_the_agents_own_work_waits_for_its_end() {
        let mut q = UnitQuestion::default();
        assert!(q.ask());
        assert_eq!(q.answered(true, true), (false, false), "not while it runs");
        assert!(q.owed(false) && !q.owed(true));
        assert!(q.ask());
        assert!(!q.owed(false), "asked since");
        assert_eq!(q.answered(true, false), (true, false));
        // Owed at the end of a restart with a question on its way: asked on its answer.
        assert!(q.ask());
        q.after_own_work();
        q.gridd_moved();
        assert_eq!(q.answered(false, false), (true, true));
    }
}
