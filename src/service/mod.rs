//! `run`: the long-running service, a shell around [`core::Core`]. Events come in (gridd's
//! journal from a `journalctl --follow` child, the answers of nvidia-smi, systemd, the token
//! adoption, restarts and DLS probes, which run as blocking jobs off the event loop, each with
//! its own time limit, signals, the watcher), the core decides, and the shell carries out its
//! effects: start those jobs, and send the report everywhere (status.json, the metrics
//! textfile and socket, the journal, systemd's status line, the webhook). The shell owns no
//! licensing logic.

/// The service's judgement, without I/O: the model's ([`vgpu_license_model::service`]).
pub use vgpu_license_model::service as core;
mod dir_watch;
mod follower;
pub mod instance;
pub mod memory;
pub mod metrics_server;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::install;
use crate::kube;
use crate::model::config::Settings;
use crate::model::report::Finding;
use crate::observe::live;

pub use self::core::status_line;
use self::core::{Core, Effect, Event, HEARTBEAT, Now, Publication};

/// How long a stop waits for a restart of gridd under way to end.
const RESTART_AT_STOP: Duration = Duration::from_secs(20);

/// Runs the service until SIGTERM or SIGINT; logs to standard error with `log_stderr`.
pub fn run(settings: Settings, config_path: &Path, log_stderr: bool) -> anyhow::Result<ExitCode> {
    memory::one_arena();
    init_logging(log_stderr);
    crate::config::check_outputs_on_disk(&settings)
        .map_err(|e| anyhow::anyhow!("{}: {e}", crate::model::text::show_path(config_path)))?;
    let _instance = instance::lock(&settings)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // The blocking jobs (nvidia-smi, systemctl, probes) come every few seconds to
        // minutes: their threads stay, instead of being made anew (a wakeup and a clone
        // each) for every job.
        .thread_keep_alive(Duration::from_secs(600))
        .max_blocking_threads(8)
        .build()
        .context("cannot start the runtime")?;
    let code = rt.block_on(main_loop(settings, config_path.to_path_buf()));
    // A restart of gridd under way ends first: killed halfway, a restart command that stops
    // gridd and then starts it would leave it stopped. Bounded well within the unit's
    // TimeoutStopSec (30 s).
    if crate::gridd::restart_under_way() {
        tracing::info!("stopping once the restart of nvidia-gridd under way has ended");
        if !crate::gridd::wait_for_restarts(RESTART_AT_STOP) {
            tracing::warn!(
                "the restart of nvidia-gridd did not end within {} s: stopped all the same; check that nvidia-gridd runs",
                RESTART_AT_STOP.as_secs()
            );
        }
    }
    // Commands still running (a hung nvidia-smi, say) are killed; their threads reap them.
    crate::gridd::command::kill_all();
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

/// Logs go where the operator looks: to the journal under systemd, to standard error when
/// it is a terminal (`run` started by hand) or with `--log-stderr`, and to standard error
/// where there is no journald. Never both under systemd, whose standard error is the journal.
/// The agent's own lines from INFO up and its libraries' warnings and errors only: an HTTP
/// client's DEBUG and TRACE lines would bury the agent's in the journal and in `kubectl
/// logs`. `RUST_LOG` (`debug`, or `vgpu_license_agent=debug,vgpu_license_model=debug,hyper=trace`,
/// ...) says otherwise.
fn init_logging(log_stderr: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let (filter, bad) = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let journald = (!log_stderr)
        .then(|| tracing_journald::layer().ok())
        .flatten()
        .map(|l| l.with_field_prefix(None));
    let stderr = (log_stderr || journald.is_none() || std::io::stderr().is_terminal()).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_writer(std::io::stderr)
    });
    let _ = tracing_subscriber::registry()
        .with(journald)
        .with(stderr)
        .with(filter)
        .try_init();
    if let Some(bad) = bad {
        warn!(
            "RUST_LOG is not a log filter ({bad}); the default is used: the agent's INFO lines and up, its libraries' warnings"
        );
    }
}

/// The log filter: `RUST_LOG`'s where it is one (with why not where it is not), else the
/// default.
fn log_filter(rust_log: Option<&str>) -> (tracing_subscriber::filter::Targets, Option<String>) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let default = Targets::new()
        .with_target(env!("CARGO_CRATE_NAME"), LevelFilter::INFO)
        // The core's own lines come from the model, where it decides.
        .with_target("vgpu_license_model", LevelFilter::INFO)
        .with_default(LevelFilter::WARN);
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        None => (default, None),
        Some(text) => match text.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (
                default,
                Some(crate::model::text::escape(&e.to_string()).into_owned()),
            ),
        },
    }
}

fn notify(state: &[sd_notify::NotifyState]) {
    let _ = sd_notify::notify(state);
}

/// The shell's clock: monotonic time since start, and the wall clock.
struct Clock(Instant);

impl Clock {
    fn now(&self) -> Now {
        Now {
            mono: self.0.elapsed(),
            wall: Utc::now(),
        }
    }

    fn instant(&self, at: Duration) -> Instant {
        self.0 + at
    }
}

/// What the shell needs to carry out effects.
struct Shell {
    tx: mpsc::UnboundedSender<Event>,
    metrics_tx: watch::Sender<String>,
    /// status.json and the metrics textfile: what each last got.
    outputs: RefCell<Outputs>,
    /// The token directory's watch (none where it cannot be watched).
    watch: Option<dir_watch::Watch>,
    /// The Node condition for its writer (none when not on a Kubernetes node).
    condition: Option<watch::Sender<Option<crate::model::node::condition::Condition>>>,
    /// Asks the licensing Secret's reader for a read now (none without one).
    secret_now: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Where Events on KubeVirt VMIs go (a host with the API; none elsewhere).
    vm_events: Option<kube::events::Sender>,
}

impl Shell {
    fn carry_out(&self, core: &Core, effects: Vec<Effect>) {
        let settings = core.settings();
        let mut reads = Reads::default();
        for effect in effects {
            let settings = settings.clone();
            let tx = self.tx.clone();
            match effect {
                Effect::ReadSmi => reads.smi = true,
                Effect::CheckUnit => reads.unit = true,
                Effect::ReadToken => reads.token = true,
                Effect::Adopt {
                    licensed,
                    may_restart,
                } => reads.adopt = Some((licensed, may_restart)),
                Effect::RestartGridd { for_token, .. } => blocking(tx, move || {
                    let target = for_token.then(|| install::restart_target(&settings));
                    let restarted = crate::gridd::restart_gridd(&settings);
                    if restarted.is_ok()
                        && let Some(target) = target
                        && let Err(e) = install::restart_made(&settings, target.as_deref())
                    {
                        tracing::warn!("{}", crate::model::text::escape(&e));
                    }
                    Event::Restarted(restarted)
                }),
                Effect::Probe(nodes) => blocking(tx, move || {
                    let (verdict, skew) = probe_dls(&settings, &nodes);
                    Event::Probed { verdict, skew }
                }),
                Effect::ReadLastShutdown => reads.last_shutdown = true,
                Effect::VmEvent(e) => {
                    if let Some(s) = &self.vm_events {
                        s.send(*e);
                    }
                }
                Effect::ReadSecret => {
                    if let Some(n) = &self.secret_now {
                        n.notify_one();
                    }
                }
                Effect::Publish(p) => self.publish(&settings, *p),
                Effect::Ready => notify(&[sd_notify::NotifyState::Ready]),
            }
        }
        self.read(settings, reads, core.running_gridd());
    }

    /// Carries out a batch's reads as one job on one thread, whose answers come back as one
    /// batch ([`read_batch`]).
    fn read(&self, settings: &Settings, reads: Reads, running: Option<u32>) {
        if reads == Reads::default() {
            return;
        }
        // Before the token is read, the token directory is watched again if it was made anew
        // since: a watch ends with its directory, and the change that made the new one may
        // have been folded into an event the shell had already taken (while the directory was
        // still missing), so that only this read sees it.
        if reads.token
            && let Some(w) = &self.watch
        {
            w.again();
        }
        let settings = settings.clone();
        blocking(self.tx.clone(), move || {
            read_batch(&settings, reads, running)
        });
    }

    fn publish(&self, settings: &Settings, p: Publication) {
        if let Some(c) = &self.condition {
            let cond = crate::model::node::condition::of(&p.report, &status_line(&p.report));
            c.send_if_modified(|old| {
                let changed = *old != cond;
                *old = cond;
                changed
            });
        }
        if p.write {
            // The metrics first: whoever sees a report in status.json finds it in the
            // metrics already (a monitor that checks one against the other, a test).
            self.metrics_tx.send_replace(p.metrics.clone());
            if settings
                .paths
                .metrics_textfile
                .parent()
                .is_some_and(Path::is_dir)
            {
                self.outputs.borrow_mut().write(
                    &settings.paths.metrics_textfile,
                    p.metrics.as_bytes(),
                    Write::TouchSame,
                );
            }
            // status.json holds the observation's time: new bytes at every write.
            self.outputs
                .borrow_mut()
                .write(&settings.paths.status_file, &p.json, Write::MakeDir);
            notify(
                &[sd_notify::NotifyState::Status(&crate::model::text::escape(
                    &status_line(&p.report),
                ))],
            );
        }
        if p.webhook
            && let Some(url) = settings.service.webhook_url.clone()
        {
            let timeout = settings.commands.timeout;
            tokio::spawn(async move {
                if let Err(e) = crate::http::post_json(&url, p.json, timeout).await {
                    warn!("webhook: {e}");
                }
            });
        }
    }
}

/// Where to send the Node condition, and how to ask for a read of the licensing Secret now.
type NodeChannels = (
    watch::Sender<Option<crate::model::node::condition::Condition>>,
    Option<std::sync::Arc<tokio::sync::Notify>>,
);

/// Starts the writer of the Node condition where the agent runs on a Kubernetes node and may
/// write it (and the reader of the licensing Secret where the config names one); returns
/// where to send the condition, and the Secret reader's bell.
fn node_condition_writer(
    settings: &Settings,
    tx: &mpsc::UnboundedSender<Event>,
    stop: &watch::Receiver<bool>,
) -> Option<NodeChannels> {
    let api = match kube::target(settings) {
        Ok(Some(api)) => api,
        Ok(None) => {
            if let Some(why) = kube::unreadable_secret(settings) {
                warn!("{why}");
            }
            return None;
        }
        Err(e) => {
            warn!("the Node condition is not written: {e:#}");
            return None;
        }
    };
    info!(
        "writing the condition {} of node {}",
        crate::model::node::condition::TYPE,
        crate::model::text::escape(&api.node)
    );
    let secret_now = settings.kubernetes.licensing_secret.clone().map(|name| {
        info!(
            "reading the licensing Secret {name} at each heartbeat and when the token gridd runs with changes"
        );
        let tx = tx.clone();
        let bell = std::sync::Arc::new(tokio::sync::Notify::new());
        tokio::spawn(kube::secret::follow(
            api.clone(),
            name,
            settings.kubernetes.heartbeat,
            bell.clone(),
            move |read| {
                let _ = tx.send(Event::LicensingSecret(read));
            },
            stop.clone(),
        ));
        bell
    });
    let (cond_tx, cond_rx) = watch::channel(None);
    let tx = tx.clone();
    let tell = move |o| _ = tx.send(Event::NodeCondition(o));
    tokio::spawn(kube::write_condition(api, cond_rx, tell, stop.clone()));
    Some((cond_tx, secret_now))
}

/// The answers of one batch's reads, in this order: the token, an adoption, nvidia-smi with
/// where the driver runs, systemd's word, and (at the start) how the last boot ended. A
/// reading after an adoption shows what it did; the first report says all of it, and the
/// start's questions take one thread, not one each.
fn read_batch(settings: &Settings, reads: Reads, running: Option<u32>) -> Event {
    let mut events = Vec::new();
    if reads.token || reads.smi {
        // Where the driver runs is looked at with each reading and each look at the token,
        // first: a GPU Operator's driver pod comes and goes, and a token read while its pod
        // goes (its readiness marker gone) is no verdict on the Secret.
        events.push(Event::Node(Box::new(crate::node::detect(settings))));
    }
    if reads.token {
        let read = live::token_read(settings, Utc::now());
        events.push(Event::Token(Box::new(read)));
    }
    if let Some((licensed, may_restart)) = reads.adopt {
        let adopted = install::adopt(settings, licensed, may_restart).map(Box::new);
        events.push(Event::Adopted(adopted));
    }
    if reads.smi {
        events.push(Event::Smi(live::read_smi(settings)));
    }
    if reads.unit {
        events.push(vouched_or_asked(settings, running));
    }
    if reads.last_shutdown {
        // What check-identity found at this boot, reported once, with it.
        if let Some(c) = crate::identity::take_unreported(settings) {
            events.push(Event::CloneDetected(Box::new(c)));
        }
        let shutdown = crate::image::prepared::last_shutdown(settings);
        events.push(Event::LastShutdown(shutdown));
    }
    Event::Together(events)
}

/// The reads one batch of effects asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Reads {
    smi: bool,
    unit: bool,
    token: bool,
    /// An adoption: (licensed, may_restart).
    adopt: Option<(bool, bool)>,
    /// How the last boot ended (and what check-identity found at this one).
    last_shutdown: bool,
}

/// Whether gridd runs: while the process systemd last said runs (`running`) still does, that
/// stands; else systemd is asked.
fn vouched_or_asked(settings: &Settings, running: Option<u32>) -> Event {
    if running.is_some_and(crate::gridd::still_runs) {
        return Event::Unit(Some(crate::model::observe::unit::UnitState::Active));
    }
    Event::Unit(crate::gridd::unit_state(settings))
}

/// Runs `job` off the loop; its result comes back as an event.
fn blocking(tx: mpsc::UnboundedSender<Event>, job: impl FnOnce() -> Event + Send + 'static) {
    tokio::task::spawn_blocking(move || {
        let _ = tx.send(job());
    });
}

/// SIGTERM and SIGINT (stop), SIGHUP (reload).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }
}

/// What woke the loop.
enum Woken {
    /// The first of what waits on the channel (answers of work off the loop, journal lines):
    /// the rest is taken in the same batch, one at a time.
    Queued(Event),
    /// A watch's change: the token directory's, the driver pod's.
    Watched(Event),
    /// The core's next wake (or a write's retry) came.
    Alarm,
    /// SIGHUP.
    Reload,
    /// SIGTERM or SIGINT.
    Stop,
}

/// The service's running parts: the core, the shell that carries out its effects, and what
/// feeds them.
struct Running {
    core: Core,
    shell: Shell,
    rx: mpsc::UnboundedReceiver<Event>,
    driver_watch: Option<dir_watch::DriverWatch>,
    follower: tokio::task::JoinHandle<()>,
    servers: Vec<tokio::task::JoinHandle<()>>,
    /// Whether systemd's watchdog is pinged.
    watchdog: bool,
}

/// Starts the service's parts: the journal follower, the Node writer, the watches, the
/// metrics servers, and the core with the restarts this boot already made.
async fn start(
    settings: Settings,
    clock: &Clock,
    started: f64,
    stop_rx: &watch::Receiver<bool>,
) -> Running {
    let (tx, rx) = mpsc::unbounded_channel();
    let (metrics_tx, metrics_rx) = watch::channel(String::new());
    let follower = tokio::spawn(follower::follow_journal(
        live::journal_args(&settings, true),
        follower::Lines::Gridd,
        tx.clone(),
        stop_rx.clone(),
    ));
    let node = crate::node::detect(&settings);
    let (condition, secret_now, vm_events) = kube_parts(&settings, &tx, stop_rx);
    let (watch, driver_watch) = watches(&settings, node.mode);
    let servers = serve_metrics(&settings, metrics_rx).await;
    let watchdog = sd_notify::watchdog_enabled();
    let mut core = make_core(settings, watchdog, watch.is_some(), clock, started);
    let shell = Shell {
        tx,
        metrics_tx,
        outputs: RefCell::default(),
        watch,
        condition,
        secret_now,
        vm_events,
    };
    // Before the first effects: on a GPU Operator node they read under its driver root.
    for effects in [
        core.handle(Event::Node(Box::new(node)), clock.now()),
        core.start(clock.now()),
    ] {
        shell.carry_out(&core, effects);
    }
    Running {
        core,
        shell,
        rx,
        driver_watch,
        follower,
        servers,
        watchdog: watchdog.is_some(),
    }
}

/// The core, with the restarts this boot already made. Under systemd's watchdog, the ping
/// rides on the heartbeat's wakeup (twice per period); without one there is no watchdog
/// timer at all.
fn make_core(
    settings: Settings,
    watchdog: Option<Duration>,
    watched: bool,
    clock: &Clock,
    started: f64,
) -> Core {
    let heartbeat = heartbeat_for(watchdog);
    // A token source is also looked at on the short interval: virtiofs (how KubeVirt shares
    // a Secret) reports no changes made on the host.
    let watched = watched && settings.paths.token_source.is_none();
    remove_leftovers(&settings);
    let restarts = earlier_restarts(&settings, started);
    Core::with_restarts(settings, heartbeat, watched, clock.now(), &restarts)
        .for_process(std::process::id())
}

type KubeParts = (
    Option<watch::Sender<Option<crate::model::node::condition::Condition>>>,
    Option<std::sync::Arc<tokio::sync::Notify>>,
    Option<kube::events::Sender>,
);

/// The Node condition's writer, the licensing Secret's bell, and the sender of Events on
/// VMIs, where the agent may write to the Kubernetes API.
fn kube_parts(
    settings: &Settings,
    tx: &mpsc::UnboundedSender<Event>,
    stop_rx: &watch::Receiver<bool>,
) -> KubeParts {
    let Some((condition, secret_now)) = node_condition_writer(settings, tx, stop_rx) else {
        return (None, None, None);
    };
    // Events on VMIs go where the Node condition does (they wait, idle, where no host's
    // change ever comes).
    let vm_events = kube::target(settings)
        .ok()
        .flatten()
        .map(|api| kube::events::spawn_sender(api, stop_rx.clone()));
    (Some(condition), secret_now, vm_events)
}

/// The token directory's watch (where the agent manages gridd: observing only, a GPU
/// Operator node's or `service.mode = "observe"`, nothing is adopted), and the driver pod's
/// (where a GPU Operator may run one, its comings and goings).
fn watches(
    settings: &Settings,
    mode: crate::model::node::Mode,
) -> (Option<dir_watch::Watch>, Option<dir_watch::DriverWatch>) {
    let watch = (mode == crate::model::node::Mode::Manage)
        .then(|| dir_watch::Watch::start(settings))
        .flatten();
    let driver_watch = settings
        .paths
        .driver_root
        .parent()
        .filter(|p| p.is_dir())
        .and_then(|_| dir_watch::DriverWatch::start(&settings.paths.driver_root));
    (watch, driver_watch)
}

/// Waits for what comes first: an event, a watch's change, the alarm or a signal.
async fn next(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    shell: &Shell,
    driver_watch: Option<&dir_watch::DriverWatch>,
    alarm: &Alarm,
    wake: Instant,
    signals: &mut Signals,
) -> Woken {
    tokio::select! {
        Some(event) = rx.recv() => Woken::Queued(event),
        _ = dir_watch::changed(shell.watch.as_ref()) => Woken::Watched(Event::TokenDirChanged),
        _ = dir_watch::driver_changed(driver_watch) => Woken::Watched(Event::DriverPodChanged),
        _ = alarm.until(wake) => Woken::Alarm,
        _ = signals.hup.recv() => Woken::Reload,
        _ = signals.term.recv() => Woken::Stop,
        _ = signals.int.recv() => Woken::Stop,
    }
}

async fn main_loop(settings: Settings, config_path: PathBuf) -> anyhow::Result<ExitCode> {
    let clock = Clock(Instant::now());
    // The same moment on the system's clock, which the restarts are kept in.
    let started = instance::monotonic_now();
    let mut signals = Signals::new()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut run = start(settings, &clock, started, &stop_rx).await;
    let (core, shell) = (&mut run.core, &run.shell);
    let alarm = Alarm::new();
    info!("vgpu-license-agent started");
    // On a vGPU host (known from the first reading in `auto`), the vGPU manager's journal.
    let mut host_follower = None;
    let mut memory = MemoryRelease::new();
    loop {
        let mut wake = clock.instant(core.next_wake(clock.now()));
        // A file that could not be written (a full disk) is written again on a shorter pace
        // than the heartbeat's, so that it catches up soon after there is room again.
        let retrying = !shell.outputs.borrow().failing.is_empty();
        if retrying {
            wake = wake.min(Instant::now() + WRITE_RETRY);
        }
        let driver_watch = run.driver_watch.as_ref();
        match next(&mut run.rx, shell, driver_watch, &alarm, wake, &mut signals).await {
            Woken::Queued(first) => {
                memory.events += take_queued(core, shell, &mut run.rx, first, &clock);
            }
            Woken::Watched(event) => {
                memory.events += 1;
                let effects = core.handle(event, clock.now());
                shell.carry_out(core, effects);
            }
            Woken::Alarm => {
                if retrying {
                    core.write_again();
                }
                memory.on_quiet_wake(core.ready());
            }
            Woken::Reload => reload_into(core, shell, &config_path, clock.now()),
            Woken::Stop => break,
        }
        after_wake(core, shell, clock.now(), started, run.watchdog);
        if host_follower.is_none() && core.is_host() {
            host_follower = Some(follow_vgpu_mgr(core, shell, &stop_rx));
        }
    }
    stop(stop_tx, [Some(run.follower), host_follower], run.servers).await;
    Ok(ExitCode::SUCCESS)
}

/// The first event waiting on the channel and every one behind it, in one batch: a backlog
/// (this boot's journal at start) makes one report, not one each, and is taken one event at
/// a time, never held whole. Returns how many were taken.
fn take_queued(
    core: &mut Core,
    shell: &Shell,
    rx: &mut mpsc::UnboundedReceiver<Event>,
    first: Event,
    clock: &Clock,
) -> usize {
    let mut effects = core.handle(first, clock.now());
    let mut taken = 1;
    while let Ok(event) = rx.try_recv() {
        effects.extend(core.handle(event, clock.now()));
        taken += 1;
    }
    shell.carry_out(core, effects);
    taken
}

/// SIGHUP: the config read and validated again, and handed to the core; a bad one is said
/// and the last good one kept.
fn reload_into(core: &mut Core, shell: &Shell, config_path: &Path, now: Now) {
    match reload(config_path) {
        Ok(s) => {
            info!(
                "config reloaded from {}",
                crate::model::text::show_path(config_path)
            );
            let effects = core.handle(Event::Reloaded(Box::new(s)), now);
            shell.carry_out(core, effects);
        }
        Err(e) => error!("config not reloaded, keeping the last good one: {e}"),
    }
}

/// The heartbeat: under systemd's watchdog, half its interval where that is shorter.
fn heartbeat_for(watchdog: Option<Duration>) -> Duration {
    watchdog.map_or(HEARTBEAT, |d| {
        (d / 2).clamp(Duration::from_secs(1), HEARTBEAT)
    })
}

/// On a vGPU host: says so once, and follows the vGPU manager's journal, so that a VM's
/// change is read soon after its line rather than at the next periodic reading.
fn follow_vgpu_mgr(
    core: &Core,
    shell: &Shell,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    info!(
        "this is a vGPU host (service.role = {}): reporting each VM's vGPU license from nvidia-smi vgpu -q and the vGPU manager's journal; nothing is installed, adopted or restarted here",
        core.settings().service.role.as_str()
    );
    tokio::spawn(follower::follow_journal(
        live::vgpu_mgr_journal_args(core.settings()),
        follower::Lines::VgpuMgr,
        shell.tx.clone(),
        stop.clone(),
    ))
}

/// Stops the followers and the metrics servers.
async fn stop(
    stop_tx: watch::Sender<bool>,
    followers: [Option<tokio::task::JoinHandle<()>>; 2],
    servers: Vec<tokio::task::JoinHandle<()>>,
) {
    info!("stopping");
    notify(&[sd_notify::NotifyState::Stopping]);
    let _ = stop_tx.send(true);
    // The followers kill and reap their journalctl; blocking jobs end within their limits.
    for follower in followers.into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_secs(5), follower).await;
    }
    for s in servers {
        s.abort();
    }
}

/// What follows each wakeup: what is due now, the restarts kept for the agent's next run, and
/// the watchdog's ping.
fn after_wake(core: &mut Core, shell: &Shell, now: Now, started: f64, watchdog: bool) {
    let effects = core.tick(now);
    shell.carry_out(core, effects);
    if let Some(restarts) = core.restarts_changed(now)
        && let Err(e) = instance::save_restarts(core.settings(), started, &restarts)
    {
        warn!("cannot keep the restarts of nvidia-gridd for the agent's next run: {e}");
    }
    if watchdog {
        notify(&[sd_notify::NotifyState::Watchdog]);
    }
}

/// Removes the temporary files that an interrupted write of status.json or the metrics left.
fn remove_leftovers(settings: &Settings) {
    for path in [
        &settings.paths.status_file,
        &settings.paths.metrics_textfile,
    ] {
        let n = crate::files::outdir::remove_leftovers(path);
        if n > 0 {
            info!(
                "removed {n} temporary file(s) that an interrupted write of {} left",
                crate::model::text::show_path(path)
            );
        }
    }
}

/// The restarts of gridd that the agent's earlier run in this boot made (they count against
/// this hour's budget).
fn earlier_restarts(settings: &Settings, started: f64) -> Vec<f64> {
    let restarts = instance::load_restarts(settings, started);
    if !restarts.is_empty() {
        info!(
            "{} restart(s) of nvidia-gridd by the agent's earlier run in this boot count against this hour's budget",
            restarts.len()
        );
    }
    restarts
}

/// The config again (SIGHUP), checked as at the start.
fn reload(config_path: &Path) -> Result<Settings, crate::model::config::ConfigError> {
    crate::config::load(config_path).and_then(|s| {
        crate::config::check_outputs_on_disk(&s)
            .map(|()| s)
            .map_err(|message| crate::model::config::ConfigError {
                file: config_path.to_path_buf(),
                message,
            })
    })
}

/// How soon a report that could not be written is written again.
const WRITE_RETRY: Duration = Duration::from_secs(30);

/// When the loop gives memory back ([`memory::release`]): on a wakeup of the timer a minute
/// or more after the start (start-up's heap, once the first report is out), then after a
/// burst of events, at most once a minute.
struct MemoryRelease {
    events: usize,
    last: Instant,
    started: bool,
}

impl MemoryRelease {
    const BURST: usize = 16;
    const GAP: Duration = Duration::from_secs(60);

    fn new() -> MemoryRelease {
        MemoryRelease {
            events: 0,
            last: Instant::now(),
            started: false,
        }
    }

    fn on_quiet_wake(&mut self, ready: bool) {
        let news = if self.started {
            self.events >= Self::BURST
        } else {
            ready
        };
        if news && self.last.elapsed() >= Self::GAP {
            memory::release();
            self.events = 0;
            self.last = Instant::now();
            self.started = true;
        }
    }
}

/// The loop's one timer. tokio's timer wheel reaches a deadline seconds away in steps (a
/// 30 s heartbeat cost three wakeups); a timerfd wakes the process once, at the deadline, as
/// a guest that sleeps between heartbeats should. Without one, tokio's timer.
struct Alarm(Option<tokio::io::unix::AsyncFd<TimerFd>>);

struct TimerFd(nix::sys::timerfd::TimerFd);

impl std::os::fd::AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl Alarm {
    fn new() -> Alarm {
        use nix::sys::timerfd::{ClockId, TimerFlags};
        let fd = nix::sys::timerfd::TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(|e| warn!("no timerfd ({e}): timing with tokio's timer"))
        .ok()
        .and_then(|fd| {
            // SAFETY: the AsyncFd owns the TimerFd, so the descriptor it registers stays open
            // (and the same one) until the registration ends with it.
            unsafe { tokio::io::unix::AsyncFd::register(TimerFd(fd)) }.ok()
        });
        Alarm(fd)
    }

    /// Returns at `at` (at once if it has passed).
    async fn until(&self, at: Instant) {
        let fired = match &self.0 {
            Some(fd) => Self::timerfd(fd, at).await,
            None => Err(std::io::ErrorKind::Unsupported.into()),
        };
        if fired.is_err() {
            tokio::time::sleep_until(at.into()).await;
        }
    }

    async fn timerfd(fd: &tokio::io::unix::AsyncFd<TimerFd>, at: Instant) -> std::io::Result<()> {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
        // A zero time would disarm the timer: the least is a nanosecond.
        let left = at
            .saturating_duration_since(Instant::now())
            .max(Duration::from_nanos(1));
        fd.get_ref().0.set(
            Expiration::OneShot(TimeSpec::from_duration(left)),
            TimerSetTimeFlags::empty(),
        )?;
        // Readiness may be left from a deadline set before this one: only a read that finds
        // the count says this one expired (setting the timer zeroes the count).
        loop {
            let mut ready = fd.readable().await?;
            if let Ok(read) = ready.try_io(|f| f.get_ref().0.wait().map_err(std::io::Error::from)) {
                return read;
            }
        }
    }
}

/// The files the service writes, and what the metrics textfile last got.
#[derive(Default)]
struct Outputs {
    /// Files whose last write failed (logged once until they are written again).
    failing: HashSet<PathBuf>,
    /// The bytes a file written with [`Write::TouchSame`] last got, and the file written.
    written: HashMap<PathBuf, (Vec<u8>, crate::files::outdir::Written)>,
}

/// How [`Outputs::write`] writes a file.
#[derive(Clone, Copy, PartialEq)]
enum Write {
    /// The file's directory is made (mode 0755) when it is missing.
    MakeDir,
    /// The same bytes as last time only mark the file written now (its mtime, which
    /// node-exporter exports for staleness alerts, moves as with a write), while it is
    /// still the file written then; the bytes are kept to tell.
    TouchSame,
}

impl Outputs {
    /// Writes `path` atomically, as `how` says. A failure (a full disk, say) is logged when it
    /// starts and when it ends, not on every write: the last good file stays whole meanwhile.
    fn write(&mut self, path: &Path, bytes: &[u8], how: Write) {
        let same = self
            .written
            .get(path)
            .filter(|(last, _)| last.as_slice() == bytes)
            .map(|(_, file)| *file);
        let outcome = match same {
            Some(file) if crate::files::outdir::touch(path, file).unwrap_or(false) => Ok(None),
            _ => crate::files::outdir::replace(path, bytes, 0o644, how == Write::MakeDir).map(Some),
        };
        match outcome {
            Ok(file) => {
                if let Some(file) = file.filter(|_| how == Write::TouchSame) {
                    self.written
                        .insert(path.to_path_buf(), (bytes.to_vec(), file));
                }
                if self.failing.remove(path) {
                    info!("{} is written again", crate::model::text::show_path(path));
                }
            }
            Err(e) => {
                self.written.remove(path);
                if self.failing.insert(path.to_path_buf()) {
                    warn!(
                        "cannot write {}: {e}; the last one written stays as it was, and this is logged again only once it can be written",
                        crate::model::text::show_path(path)
                    );
                }
            }
        }
    }
}

/// Serves `GET /metrics` on the configured Unix socket and TCP address
/// ([`metrics_server`]).
async fn serve_metrics(
    settings: &Settings,
    metrics: watch::Receiver<String>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let svc = &settings.service;
    metrics_server::serve(
        svc.metrics_socket.as_deref(),
        svc.metrics_listen.as_deref(),
        metrics,
    )
    .await
}

/// Probes every DLS node of the token: the failure the probes show (if any) and the clock
/// skew measured against the first node that answered.
fn probe_dls(
    settings: &Settings,
    nodes: &[crate::model::report::DlsEndpoint],
) -> (Option<Finding>, Option<f64>) {
    let targets: Vec<(String, u16)> = nodes.iter().map(|n| (n.host.clone(), n.port)).collect();
    // Through gridd.conf's proxy, as gridd goes; one gridd cannot use is diagnose's to explain.
    let via = crate::observe::live::gridd_proxy(settings).ok().flatten();
    let probes = crate::probe::probe_all(&targets, via.as_ref(), settings.service.probe_timeout);
    let skew = crate::probe::clock_skew(&probes);
    (
        crate::probe::verdict(&probes, settings.service.clock_skew_max),
        skew,
    )
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn rust_log_is_read_as_the_readme_says() {
        assert!(log_filter(None).1.is_none());
        for text in ["debug", "vgpu_license_agent=debug,hyper=trace", " info "] {
            assert!(log_filter(Some(text)).1.is_none(), "{text}");
        }
        assert!(log_filter(Some("=[")).1.is_some());
    }
}
