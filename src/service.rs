//! `run`: the long-running service. It wires the pieces and owns no licensing logic: gridd's
//! journal is followed by a `journalctl --follow` child, nvidia-smi, the unit check, the
//! token adoption, restarts and DLS probes run as blocking jobs off the event loop (each with
//! its own time limit), and every result comes back as a message. After each message the one
//! state machine makes the report, and the report goes everywhere: status.json, the metrics
//! textfile and socket, the journal, systemd's status line.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::config::Settings;
use crate::install::{self, NoToken, Restart, TokenRejected};
use crate::live::{self, SmiRead};
use crate::observe::journal::{GriddEvent, LineParser, ScanStats, Stamp};
use crate::observe::smi::SmiSnapshot;
use crate::remedy::{Decision, Remedy};
use crate::report::metrics::{self, Counters};
use crate::report::{Reason, Report, State, message_ids};
use crate::state::{LogFold, Observations, evaluate};

/// Events kept in the live report.
const MAX_EVENTS: usize = 200;
/// status.json is rewritten at least this often: its age tells `status` the service lives.
const HEARTBEAT: Duration = Duration::from_secs(30);
/// Reports are made at most this often: a burst of gridd lines (this boot's journal read at
/// start, a crash loop) makes a few reports, not one per line. The first after a quiet spell
/// is made at once.
const MIN_REPORT_GAP: Duration = Duration::from_millis(100);
/// How often systemd is asked whether gridd runs while no license is held.
const UNIT_CHECK: Duration = Duration::from_secs(5);

/// What comes back to the event loop.
enum Msg {
    /// The follower (re)started: the fold is rebuilt from this boot's entries.
    FollowerStarted,
    Gridd(Box<GriddEvent>),
    FollowerExited(String),
    Smi(SmiRead),
    Unit(Option<Result<(), String>>),
    TokenDirChanged,
    Adopted(Result<install::Outcome, AdoptError>),
    Restarted(Result<(), String>),
    Probed(Option<(Reason, String)>, Option<f64>),
}

enum AdoptError {
    NoToken,
    Rejected(String),
    Other(String),
}

/// Work running off the loop, so that nothing is started twice.
#[derive(Default)]
struct InFlight {
    smi: bool,
    unit: bool,
    adopt: bool,
    restart: bool,
    probe: bool,
}

struct Agent {
    settings: Settings,
    config_path: PathBuf,
    tx: mpsc::UnboundedSender<Msg>,
    fold: LogFold,
    smi: Option<SmiSnapshot>,
    /// The last reading, when it failed or timed out.
    smi_error: Option<SmiRead>,
    gridd_unit: Option<Result<(), String>>,
    probe_failure: Option<(Reason, String)>,
    /// The failure's reason as gridd's own lines give it, before a probe refined it: whether
    /// the agent keeps probing (a clock skew it found is looked at again, and clears).
    gridd_reason: Option<Reason>,
    counters: Counters,
    remedy: Remedy,
    report: Option<Report>,
    failure_key: Option<(Reason, String)>,
    own_since: Option<((Reason, String), chrono::DateTime<Utc>)>,
    busy: InFlight,
    next_smi: Instant,
    next_unit: Instant,
    next_probe: Instant,
    adopt_again: bool,
    next_adopt: Instant,
    epoch: Instant,
    /// When status.json was last written.
    written: Instant,
    /// Something happened since the last report.
    dirty: bool,
    /// The token directory is watched (else it is looked at every 30 s).
    watching: bool,
    metrics_tx: watch::Sender<String>,
}

/// Runs the service until SIGTERM or SIGINT.
pub fn run(settings: Settings, config_path: &Path) -> anyhow::Result<ExitCode> {
    init_logging();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let code = rt.block_on(main_loop(settings, config_path.to_path_buf()));
    // Commands still running (a hung nvidia-smi, say) are killed; their threads reap them.
    crate::command::kill_all();
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

fn init_logging() {
    use tracing_subscriber::prelude::*;
    let journald = tracing_journald::layer()
        .ok()
        .map(|l| l.with_field_prefix(None));
    let stderr = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_writer(std::io::stderr)
    });
    let _ = tracing_subscriber::registry()
        .with(journald)
        .with(stderr)
        .try_init();
}

fn notify(state: &[sd_notify::NotifyState]) {
    let _ = sd_notify::notify(state);
}

async fn main_loop(settings: Settings, config_path: PathBuf) -> anyhow::Result<ExitCode> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (metrics_tx, metrics_rx) = watch::channel(String::new());
    let now = Instant::now();
    let mut agent = Agent {
        remedy: Remedy::new(&settings.service),
        settings,
        config_path,
        tx: tx.clone(),
        fold: LogFold::new(MAX_EVENTS),
        smi: None,
        smi_error: None,
        gridd_unit: None,
        probe_failure: None,
        gridd_reason: None,
        counters: Counters::default(),
        report: None,
        failure_key: None,
        own_since: None,
        busy: InFlight::default(),
        next_smi: now,
        next_unit: now,
        next_probe: now,
        adopt_again: false,
        next_adopt: now + Duration::from_secs(30),
        epoch: now,
        written: now,
        dirty: false,
        watching: false,
        metrics_tx,
    };
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("SIGHUP handler")?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let follower = tokio::spawn(follow_journal(
        live::journal_args(&agent.settings, true),
        tx.clone(),
        stop_rx.clone(),
    ));
    let _watcher = watch_paths(&agent.settings, tx.clone());
    agent.watching = _watcher.is_some();
    let servers = serve_metrics(&agent.settings, metrics_rx).await;
    // The token is adopted once the first report says whether gridd already holds a license.
    agent.check_unit();
    agent.read_smi();

    let watchdog_every = sd_notify::watchdog_enabled()
        .map_or(Duration::from_secs(10), |d| d / 3)
        .max(Duration::from_millis(100));
    let mut watchdog = tokio::time::interval(watchdog_every);
    let mut next_tick = Instant::now() + Duration::from_secs(1);
    let mut ready = false;
    let mut last_report: Option<Instant> = None;
    let mut deferred: Option<Instant> = None;

    info!("vgpu-license-agent started");
    loop {
        // What happened may have brought a deadline nearer (nvidia-smi after a gridd line, a
        // new failure in the last report).
        next_tick = next_tick.min(agent.next_tick());
        tokio::select! {
            Some(msg) = rx.recv() => {
                agent.handle(msg);
                // A backlog (this boot's journal at start) makes one report, not one each.
                while let Ok(msg) = rx.try_recv() {
                    agent.handle(msg);
                }
                agent.dirty = true;
            }
            _ = tokio::time::sleep_until(next_tick.into()) => {
                agent.tick();
                next_tick = agent.next_tick();
            }
            _ = watchdog.tick() => notify(&[sd_notify::NotifyState::Watchdog]),
            _ = sighup.recv() => { agent.reload(); agent.dirty = true; }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = sleep_until_some(deferred) => deferred = None,
        }
        if deferred.is_some() {
            continue;
        }
        if let Some(at) = last_report.map(|t| t + MIN_REPORT_GAP)
            && agent.dirty
            && at > Instant::now()
        {
            deferred = Some(at);
            continue;
        }
        // The first report (after the first nvidia-smi answer or failure) makes us ready.
        if std::mem::take(&mut agent.dirty) && (agent.smi.is_some() || agent.smi_error.is_some()) {
            last_report = Some(Instant::now());
            agent.publish();
            if !ready {
                ready = true;
                notify(&[sd_notify::NotifyState::Ready]);
                agent.adopt();
            }
        }
    }
    info!("stopping");
    notify(&[sd_notify::NotifyState::Stopping]);
    let _ = stop_tx.send(true);
    // The follower kills and reaps its journalctl; blocking jobs end within their limits.
    let _ = tokio::time::timeout(Duration::from_secs(5), follower).await;
    for s in servers {
        s.abort();
    }
    Ok(ExitCode::SUCCESS)
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

impl Agent {
    fn now_secs(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::FollowerStarted => self.fold = LogFold::new(MAX_EVENTS),
            Msg::Gridd(e) => {
                let kind = e.what.kind;
                self.fold.push(*e);
                // Read nvidia-smi right after gridd says something (coalesced).
                self.next_smi = self
                    .next_smi
                    .min(Instant::now() + Duration::from_millis(300));
                if matches!(
                    kind,
                    crate::report::EventKind::Started | crate::report::EventKind::Shutdown
                ) {
                    self.check_unit();
                }
            }
            Msg::FollowerExited(why) => warn!("journal follower stopped: {why}; restarting it"),
            Msg::Smi(read) => {
                self.busy.smi = false;
                match read {
                    SmiRead::Snapshot(s) => {
                        self.smi = Some(s);
                        self.smi_error = None;
                    }
                    SmiRead::Failed(ref why) | SmiRead::TimedOut(ref why) => {
                        if self.smi_error.as_ref().map(SmiRead::reason) != Some(why.as_str()) {
                            warn!("nvidia-smi: {why}");
                        }
                        self.smi_error = Some(read);
                    }
                }
                self.next_smi = Instant::now() + self.smi_interval();
                // nvidia-smi shows a lease until it expires, even with gridd dead: ask
                // systemd at the same pace.
                self.check_unit();
            }
            Msg::Unit(u) => {
                self.busy.unit = false;
                self.gridd_unit = u;
            }
            Msg::TokenDirChanged => self.adopt(),
            Msg::Adopted(result) => {
                self.busy.adopt = false;
                self.adopted(result);
                if std::mem::take(&mut self.adopt_again) {
                    self.adopt();
                }
            }
            Msg::Restarted(result) => {
                self.busy.restart = false;
                match result {
                    Ok(()) => {
                        self.counters.gridd_restarts += 1;
                        info!(
                            message_id = message_ids::GRIDD_RESTARTED,
                            "restarted nvidia-gridd"
                        );
                    }
                    Err(why) => error!("restarting nvidia-gridd failed: {why}"),
                }
                self.check_unit();
                self.next_smi = Instant::now() + Duration::from_secs(1);
            }
            Msg::Probed(verdict, skew) => {
                self.busy.probe = false;
                if skew.is_some() {
                    self.counters.clock_skew_seconds = skew;
                }
                self.probe_failure = verdict;
            }
        }
    }

    /// nvidia-smi's interval: often while no license is held, rarely while one is, every
    /// minute in the last hour of a lease.
    fn smi_interval(&self) -> Duration {
        let svc = &self.settings.service;
        match &self.report {
            Some(r) if r.state == State::Licensed => {
                let near_expiry = r
                    .license
                    .as_ref()
                    .and_then(|l| l.expiry.as_deref())
                    .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
                    .is_some_and(|e| (e.with_timezone(&Utc) - Utc::now()).num_seconds() < 3600);
                if near_expiry {
                    svc.poll_licensed.min(Duration::from_secs(60))
                } else {
                    svc.poll_licensed
                }
            }
            _ => svc.poll_unlicensed,
        }
    }

    /// When to look at what is due again: every second while something may change with time
    /// alone (grace, backoff, acquiring); with a license held and no failure, at the next
    /// deadline, so that an idle hour costs next to no CPU.
    fn next_tick(&self) -> Instant {
        let now = Instant::now();
        let quiet = self
            .report
            .as_ref()
            .is_some_and(|r| r.state == State::Licensed && r.failure.is_none());
        if !quiet {
            return now + Duration::from_secs(1);
        }
        [self.next_smi, self.next_adopt, self.written + HEARTBEAT]
            .into_iter()
            .min()
            .unwrap_or(now)
            .clamp(now + Duration::from_secs(1), now + HEARTBEAT)
    }

    /// What is due now.
    fn tick(&mut self) {
        let now = Instant::now();
        // In case a change escaped the watcher (or there is none): look at the token again.
        if now >= self.next_adopt {
            self.next_adopt = now
                + if self.watching {
                    Duration::from_secs(300)
                } else {
                    Duration::from_secs(30)
                };
            self.adopt();
        }
        let licensed = self
            .report
            .as_ref()
            .is_some_and(|r| r.state == State::Licensed);
        // The report is remade while something may change with time alone (grace, backoff,
        // expiry), and at least as often as status.json's heartbeat.
        if !licensed || self.written.elapsed() >= HEARTBEAT {
            self.dirty = true;
        }
        if now >= self.next_smi {
            self.read_smi();
        }
        // Without a license, whether gridd runs decides the next step: ask systemd every few
        // seconds (with one, and where gridd cannot help, at nvidia-smi's pace).
        if now >= self.next_unit
            && self.report.as_ref().is_some_and(|r| {
                !matches!(
                    r.state,
                    State::Licensed | State::NotLicensable | State::NoDriver
                )
            })
        {
            self.next_unit = now + UNIT_CHECK;
            self.check_unit();
        }
        self.remedy_step();
    }

    fn read_smi(&mut self) {
        if std::mem::replace(&mut self.busy.smi, true) {
            return;
        }
        // Until it answers, do not ask again: a hung nvidia-smi is killed at its time limit.
        self.next_smi = Instant::now() + Duration::from_secs(3600);
        let settings = self.settings.clone();
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(Msg::Smi(live::read_smi(&settings)));
        });
    }

    fn check_unit(&mut self) {
        if std::mem::replace(&mut self.busy.unit, true) {
            return;
        }
        let settings = self.settings.clone();
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(Msg::Unit(live::gridd_running(&settings)));
        });
    }

    /// A token dropped by cloud-init (or anyone): validated, mode fixed, strays moved aside,
    /// gridd restarted: the same code as `install`.
    fn adopt(&mut self) {
        // Whether gridd already holds a license decides whether a token in place needs a
        // restart: wait for the first report (it adopts at once).
        let Some(report) = &self.report else { return };
        let licensed = report.state == State::Licensed;
        if std::mem::replace(&mut self.busy.adopt, true) {
            self.adopt_again = true;
            return;
        }
        let settings = self.settings.clone();
        let tx = self.tx.clone();
        let now = self.now_secs();
        let retry_owed = self.remedy.may_restart(&self.settings.service, now);
        tokio::task::spawn_blocking(move || {
            let result =
                install::adopt_dropped_token(&settings, licensed, retry_owed).map_err(|e| {
                    if e.downcast_ref::<NoToken>().is_some() {
                        AdoptError::NoToken
                    } else if let Some(r) = e.downcast_ref::<TokenRejected>() {
                        AdoptError::Rejected(r.to_string())
                    } else {
                        AdoptError::Other(format!("{e:#}"))
                    }
                });
            let _ = tx.send(Msg::Adopted(result));
        });
    }

    fn adopted(&mut self, result: Result<install::Outcome, AdoptError>) {
        match result {
            Ok(outcome) => {
                if outcome.changed() || outcome.restart != Restart::NotNeeded {
                    for line in outcome.lines() {
                        info!("token: {line}");
                    }
                }
                for w in &outcome.warnings {
                    warn!("token: {w}");
                }
                match outcome.restart {
                    Restart::Done => {
                        self.counters.gridd_restarts += 1;
                        self.remedy
                            .restarted(&self.settings.service, self.now_secs(), 0.5);
                        info!(
                            message_id = message_ids::GRIDD_RESTARTED,
                            "restarted nvidia-gridd for the token"
                        );
                        self.next_smi = Instant::now() + Duration::from_secs(1);
                        self.check_unit();
                    }
                    Restart::Failed(why) => {
                        // A failed attempt counts against the budget and the backoff too.
                        self.remedy
                            .restarted(&self.settings.service, self.now_secs(), 0.5);
                        error!("restarting nvidia-gridd failed: {why}");
                    }
                    _ => {}
                }
            }
            Err(AdoptError::NoToken) => {}
            // cloud-init may still be writing it: the next change or tick tries again.
            Err(AdoptError::Rejected(why)) => warn!("token not adopted: {why}"),
            Err(AdoptError::Other(why)) => error!("token not adopted: {why}"),
        }
    }

    fn observations(&self) -> Observations {
        let now = Utc::now();
        let mut obs = Observations {
            at: Some(now),
            at_is_exact: true,
            expiry_warning: chrono::Duration::from_std(self.settings.service.expiry_warning)
                .unwrap_or(chrono::Duration::hours(12)),
            ..Observations::default()
        };
        obs.smi = Some(match (&self.smi, &self.smi_error) {
            (_, Some(failed)) => failed.clone().into_snapshot(),
            (Some(s), None) => s.clone(),
            (None, None) => SmiSnapshot::default(),
        });
        // Live, the log ends now: a lease past its expiry is not held.
        let stats = ScanStats {
            last_stamp: Some(Stamp::from_utc(now)),
            ..ScanStats::default()
        };
        obs.log = Some((self.fold.clone(), stats));
        let token = live::token_state(&self.settings, now);
        match token.token {
            Ok(t) => obs.token = Some(t),
            Err(p) => obs.own_failure = Some((p.reason(), p.to_string())),
        }
        if obs.own_failure.is_none()
            && let Some(Err(why)) = &self.gridd_unit
        {
            obs.own_failure = Some((Reason::GriddNotRunning, why.clone()));
        }
        obs
    }

    /// Makes the report and sends it everywhere it changed.
    fn publish(&mut self) {
        let obs = self.observations();
        // The agent's own findings hold since they were first seen, not since this moment.
        let own = obs
            .own_failure
            .clone()
            .or_else(|| self.probe_failure.clone());
        match (&own, &self.own_since) {
            (Some(o), Some((k, _))) if o == k => {}
            (Some(o), _) => self.own_since = Some((o.clone(), Utc::now())),
            (None, _) => self.own_since = None,
        }
        let probe_failure = obs
            .own_failure
            .is_none()
            .then(|| self.probe_failure.clone())
            .flatten();
        let mut report = evaluate(obs.clone());
        self.gridd_reason = report.failure.as_ref().map(|f| f.reason);
        // The DLS probe names the cause of a failure gridd left vague.
        if let Some(p) = probe_failure
            && crate::probe::refines(report.failure.as_ref().map(|f| f.reason))
            && report.state != State::Licensed
        {
            let mut obs = obs;
            obs.own_failure = Some(p);
            report = evaluate(obs);
        }
        report.agent_pid = Some(std::process::id());
        if let (Some(f), Some(((reason, message), since))) =
            (report.failure.as_mut(), &self.own_since)
            && f.reason == *reason
            && f.message == *message
        {
            f.at = Some(crate::time::rfc3339(*since));
        }
        // A new failure: counted once, logged with its catalog entry.
        let key = report.failure.as_ref().map(|f| {
            (
                f.reason,
                format!("{}|{}", f.message, f.at.as_deref().unwrap_or("")),
            )
        });
        if key.is_some() && key != self.failure_key {
            let f = report.failure.as_ref().expect("key from failure");
            self.counters.count_failure(f.reason);
            warn!(
                message_id = message_ids::for_reason(f.reason),
                vgpu_license_reason = f.reason.as_str(),
                "{}: {} -> {}",
                f.reason.as_str(),
                f.message,
                f.advice
            );
        }
        self.failure_key = key;
        let previous = self.report.as_ref().map(|r| r.state);
        if previous != Some(report.state) {
            let edition = report
                .license
                .as_ref()
                .and_then(|l| l.edition.clone())
                .unwrap_or_default();
            let expiry = report
                .license
                .as_ref()
                .and_then(|l| l.expiry.clone())
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
                vgpu_license_edition = edition.as_str(),
                vgpu_license_expiry = expiry.as_str(),
                "license state: {}",
                status_line(&report)
            );
        }
        let changed = self
            .report
            .as_ref()
            .is_none_or(|old| !same_report(old, &report));
        let mut json = serde_json::to_vec_pretty(&report).unwrap_or_default();
        json.push(b'\n');
        let metrics_text = metrics::render(&report, &self.counters);
        let stale = self.written.elapsed() >= HEARTBEAT;
        if changed || stale || self.metrics_tx.borrow().as_str() != metrics_text {
            self.written = Instant::now();
            write_file(&self.settings.paths.status_file, &json, true);
            if self
                .settings
                .paths
                .metrics_textfile
                .parent()
                .is_some_and(Path::is_dir)
            {
                write_file(
                    &self.settings.paths.metrics_textfile,
                    metrics_text.as_bytes(),
                    false,
                );
            }
            notify(&[sd_notify::NotifyState::Status(&status_line(&report))]);
            self.metrics_tx.send_replace(metrics_text);
        }
        if previous.is_some() && previous != Some(report.state) {
            self.webhook(&json);
        }
        self.report = Some(report);
    }

    fn webhook(&self, json: &[u8]) {
        let Some(url) = self.settings.service.webhook_url.clone() else {
            return;
        };
        let body = json.to_vec();
        let timeout = self.settings.commands.timeout;
        tokio::spawn(async move {
            if let Err(e) = install::fetch::post_json(&url, body, timeout).await {
                warn!("webhook: {e}");
            }
        });
    }

    /// Remedy: restart gridd when that can help, probe the DLS when a failure has no
    /// specific reason.
    fn remedy_step(&mut self) {
        let Some(report) = &self.report else { return };
        let state = report.state;
        let reason = report.failure.as_ref().map(|f| f.reason);
        // A failure gridd left without a specific reason: the agent finds the cause itself,
        // and looks again while it lasts (what it found may have been fixed since).
        let vague = matches!(
            self.gridd_reason,
            Some(Reason::Unspecified) | Some(Reason::DlsUnreachable)
        ) || (state == State::Unlicensed && self.gridd_reason.is_none());
        if vague && Instant::now() >= self.next_probe {
            self.probe();
        }
        if state == State::Licensed {
            self.probe_failure = None;
        }
        let now = self.now_secs();
        match self
            .remedy
            .decide(&self.settings.service, now, state, reason)
        {
            Decision::Restart(why) if !self.busy.restart && !self.busy.adopt => {
                info!("restarting nvidia-gridd: {why}");
                self.busy.restart = true;
                let jitter = f64::from(Utc::now().timestamp_subsec_nanos() % 1000) / 1000.0;
                self.remedy.restarted(&self.settings.service, now, jitter);
                let settings = self.settings.clone();
                let tx = self.tx.clone();
                tokio::task::spawn_blocking(move || {
                    let _ = tx.send(Msg::Restarted(install::restart_gridd(&settings)));
                });
            }
            _ => {}
        }
    }

    fn probe(&mut self) {
        if std::mem::replace(&mut self.busy.probe, true) {
            return;
        }
        self.next_probe = Instant::now()
            + self
                .settings
                .service
                .poll_unlicensed
                .max(Duration::from_secs(30));
        let settings = self.settings.clone();
        let nodes = self
            .report
            .as_ref()
            .and_then(|r| r.dls.clone())
            .unwrap_or_default();
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let (verdict, skew) = probe_dls(&settings, &nodes);
            let _ = tx.send(Msg::Probed(verdict, skew));
        });
    }

    /// SIGHUP: the config again; a bad one is refused and the last good one kept.
    fn reload(&mut self) {
        match Settings::load(&self.config_path) {
            Ok(s) => {
                info!("config reloaded from {}", self.config_path.display());
                // What was set up at start (the follower, the watcher, the listeners) keeps
                // its old settings: say so rather than pretend.
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
                self.settings = s;
                self.next_smi = Instant::now();
            }
            Err(e) => error!("config not reloaded, keeping the last good one: {e}"),
        }
    }
}

/// Two reports differ for the outside when anything but the time of observation differs.
fn same_report(a: &Report, b: &Report) -> bool {
    a.state == b.state
        && a.license == b.license
        && a.gpus == b.gpus
        && a.events == b.events
        && a.failure == b.failure
        && a.dls == b.dls
        && a.exit_code == b.exit_code
        && a.notes == b.notes
}

/// The one line `systemctl status` shows.
pub fn status_line(r: &Report) -> String {
    let mut line = r.state.as_str().to_string();
    if let Some(l) = &r.license {
        if let Some(ed) = &l.edition {
            line.push_str(&format!(", {ed}"));
        }
        if let Some(exp) = &l.expiry {
            line.push_str(&format!(", expires {exp}"));
        }
    }
    if let Some(f) = &r.failure {
        line.push_str(&format!("; {}: {}", f.reason.as_str(), f.message));
    }
    line
}

fn write_file(path: &Path, bytes: &[u8], create_dir: bool) {
    if create_dir && let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = crate::fsutil::write_atomic(path, bytes, 0o644) {
        warn!("cannot write {}: {e}", path.display());
    }
}

/// Follows gridd's journal, restarting `journalctl` with backoff whenever it ends.
async fn follow_journal(
    argv: Vec<String>,
    tx: mpsc::UnboundedSender<Msg>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let started = Instant::now();
        let child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let why = match child {
            Err(e) => format!("cannot start {}: {e}", argv[0]),
            Ok(mut child) => {
                let _ = tx.send(Msg::FollowerStarted);
                let stdout = child.stdout.take().expect("piped");
                let mut lines = BufReader::new(stdout).split(b'\n');
                let (etx, mut erx) = mpsc::unbounded_channel();
                let mut parser = LineParser::new(|e| {
                    let _ = etx.send(e);
                });
                let why = loop {
                    tokio::select! {
                        line = lines.next_segment() => match line {
                            Ok(Some(line)) => {
                                parser.feed(&line);
                                while let Ok(e) = erx.try_recv() {
                                    let _ = tx.send(Msg::Gridd(Box::new(e)));
                                }
                            }
                            Ok(None) => break "journalctl ended".to_string(),
                            Err(e) => break format!("reading journalctl: {e}"),
                        },
                        _ = stop.changed() => {
                            let _ = child.kill().await;
                            return;
                        }
                    }
                };
                let _ = child.kill().await;
                let _ = child.wait().await;
                why
            }
        };
        let _ = tx.send(Msg::FollowerExited(why));
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(500);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// Watches the token directory (or, until it exists, its parent) and gridd.conf.
fn watch_paths(
    settings: &Settings,
    tx: mpsc::UnboundedSender<Msg>,
) -> Option<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let dir = settings.paths.token_dir.clone();
    let conf = settings.paths.gridd_conf.clone();
    // gridd.conf's directory may hold other files (status.json, say, in a custom layout): only
    // the token directory and gridd.conf itself matter; anything else would wake us for our
    // own writes.
    let relevant = move |p: &Path| p.starts_with(&dir) || dir.starts_with(p) || p == conf;
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let wanted = match ev {
            Ok(e) => {
                !e.kind.is_access() && (e.paths.is_empty() || e.paths.iter().any(|p| relevant(p)))
            }
            // Events were lost (queue overflow): look again.
            Err(_) => true,
        };
        if wanted {
            let _ = tx.send(Msg::TokenDirChanged);
        }
    })
    .map_err(|e| warn!("cannot watch the token directory: {e}; checking it on each tick"))
    .ok()?;
    let dir = &settings.paths.token_dir;
    let target = if dir.is_dir() {
        dir.clone()
    } else {
        dir.parent().map_or(dir.clone(), Path::to_path_buf)
    };
    for p in [
        target.as_path(),
        settings.paths.gridd_conf.parent().unwrap_or(Path::new("/")),
    ] {
        if let Err(e) = watcher.watch(p, RecursiveMode::NonRecursive) {
            warn!("cannot watch {}: {e}", p.display());
        }
    }
    if target != *dir {
        // Recursive on the parent until the directory exists.
        let _ = watcher.watch(&target, RecursiveMode::Recursive);
    }
    Some(watcher)
}

/// Serves `GET /metrics` on the configured Unix socket and TCP address.
async fn serve_metrics(
    settings: &Settings,
    metrics: watch::Receiver<String>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if let Some(path) = &settings.service.metrics_socket {
        let _ = std::fs::remove_file(path);
        match tokio::net::UnixListener::bind(path) {
            Ok(l) => {
                let m = metrics.clone();
                tasks.push(tokio::spawn(async move {
                    while let Ok((conn, _)) = l.accept().await {
                        tokio::spawn(answer(conn, m.borrow().clone()));
                    }
                }));
            }
            Err(e) => warn!("cannot listen on {}: {e}", path.display()),
        }
    }
    if let Some(addr) = &settings.service.metrics_listen {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                let m = metrics.clone();
                tasks.push(tokio::spawn(async move {
                    while let Ok((conn, _)) = l.accept().await {
                        tokio::spawn(answer(conn, m.borrow().clone()));
                    }
                }));
            }
            Err(e) => warn!("cannot listen on {addr}: {e}"),
        }
    }
    tasks
}

/// A minimal HTTP/1.0 answer: the metrics for any GET.
async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut conn: S,
    body: String,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await;
    let head = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(body.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// Probes every DLS node of the token: the failure the probes show (if any) and the clock
/// skew measured against the first node that answered.
fn probe_dls(
    settings: &Settings,
    nodes: &[crate::report::DlsEndpoint],
) -> (Option<(Reason, String)>, Option<f64>) {
    let targets: Vec<(String, u16)> = nodes.iter().map(|n| (n.host.clone(), n.port)).collect();
    let probes = crate::probe::probe_all(&targets, settings.service.probe_timeout);
    let skew = crate::probe::clock_skew(&probes);
    (
        crate::probe::verdict(&probes, settings.service.clock_skew_max),
        skew,
    )
}
