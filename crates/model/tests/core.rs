//! The service's decisions, driven in-process with simulated time and a simulated world: no
//! root, no journald, no threads. Each scenario feeds the core the lines real gridd logs
//! (in the orders the samples show) and the answers nvidia-smi and systemd give, and checks
//! what users rely on: the report, whether and when gridd is restarted, whether and when the
//! DLS is probed, how often the core wakes.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use vgpu_license_model::assemble::{SmiRead, TokenProblem, TokenRead};
use vgpu_license_model::config::Settings;
use vgpu_license_model::install::{Outcome, Restart};
use vgpu_license_model::observe::journal::{self, GriddEvent};
use vgpu_license_model::observe::smi;
use vgpu_license_model::observe::unit::UnitState;
use vgpu_license_model::policy;
use vgpu_license_model::report::{Reason, State};
use vgpu_license_model::service::{
    AFTER_EXPIRY, AdoptError, Core, Effect, Event, HEARTBEAT, MEASURE_REPEAT, Now, PROBE_REPEAT,
    SMI_FLOOR,
};
use vgpu_license_model::token::testing::token_with;
use vgpu_license_model::token::{Token, TokenError, Untimely};

const LICENSED: &str = "GPU 00000000:02:01.0\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : Licensed (Expiry: 2099-1-1 0:0:0 GMT)\n";
const UNLICENSED: &str = "GPU 00000000:02:01.0\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : Unlicensed (Unrestricted)\n";

/// gridd lines as the samples show them (the `(Info: ... - Error: ...)` forms are those of
/// tests/fixtures/samples; the bare form is gridd's when it says nothing more).
const ACQUIRED: &str = "License acquired successfully. (Info: dls-a.example, NVIDIA RTX Virtual Workstation; Expiry: 2099-1-1 0:0:0 GMT)";
const BARE_FAILURE: &str = "Failed to acquire license from dls-a.example";
const WINDBACK: &str = "Failed to acquire license from dls-a.example (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)";
const NETWORK: &str = "Failed to acquire license from dls-a.example (Info: NVIDIA RTX Virtual Workstation - Error: Generic network communication failure)";
const NO_POOL: &str = "Failed to acquire license from dls-a.example (Info: NVIDIA RTX Virtual Workstation - Error: No pool features found for : NVIDIA RTX Virtual Workstation)";
const UNSUPPORTED: &str = "Licensing not supported for GPUs in the system";
const PID_FILE: &str = "Failed to unlock PID file: Bad file descriptor";
const PID_CLOSE: &str = "Failed to close PID file: Bad file descriptor";
const TOKEN_BAD: &str = "Failed to decode signature from token";
const TRUSTED_STORE: &str = "Failed to update local trusted store - Maximum buffer size exceeded";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

fn gridd(pid: u32, message: &str) -> GriddEvent {
    let line = format!("Nov 30 12:00:00 guest nvidia-gridd[{pid}]: {message}\n");
    let mut out = Vec::new();
    journal::scan(line.as_bytes(), |e| out.push(e)).unwrap();
    assert_eq!(out.len(), 1, "{message}");
    out.remove(0)
}

/// A client configuration token with the structure of a real one, valid from 2023 to 2035;
/// `jti` to make tokens differ.
fn valid_token(jti: &str) -> String {
    token_with(jti, 1_700_000_000, 2_078_691_200)
}

fn token() -> Token {
    Token::decode(valid_token("core").as_bytes()).unwrap()
}

/// What the world answers, and what the core asked of it.
struct World {
    smi: String,
    smi_hangs: bool,
    /// The PCI bus shows no NVIDIA device (nvidia-smi is not asked).
    smi_no_device: bool,
    unit: Option<UnitState>,
    token: Result<Token, TokenProblem>,
    /// The token directory's files held open for writing, and since when.
    held: Vec<(String, DateTime<Utc>)>,
    probe: Option<(Reason, String)>,
    /// The clock skew the probe measures.
    skew: Option<f64>,
    /// Lines gridd logs after each restart.
    after_restart: Vec<&'static str>,
    restarts: Vec<Duration>,
    probes: Vec<Duration>,
    ticks: u32,
    pid: u32,
    /// What an adoption answers (no token in the directory, by default).
    adopt: fn() -> Result<Box<Outcome>, AdoptError>,
    /// When the core started an adoption, and the token reads it asked for.
    adopts: Vec<Duration>,
    token_reads: u32,
    /// When the core asked nvidia-smi.
    smi_reads: Vec<Duration>,
}

impl World {
    /// A look at the token directory: the token and the files held open.
    fn token_read(&self) -> Event {
        Event::Token(Box::new(TokenRead {
            held_writers: self.held.clone(),
            ..TokenRead::of(self.token.clone())
        }))
    }

    fn new(smi: &str) -> World {
        World {
            smi: smi.to_string(),
            smi_hangs: false,
            smi_no_device: false,
            unit: Some(UnitState::Active),
            token: Ok(token()),
            held: Vec::new(),
            probe: None,
            skew: None,
            after_restart: Vec::new(),
            restarts: Vec::new(),
            probes: Vec::new(),
            ticks: 0,
            pid: 100,
            adopt: || Err(AdoptError::NoToken(std::path::PathBuf::new())),
            adopts: Vec::new(),
            token_reads: 0,
            smi_reads: Vec::new(),
        }
    }
}

struct Sim {
    core: Core,
    world: World,
    mono: Duration,
    /// The core's first effects, carried out with whatever comes first (a gridd line of
    /// this boot's journal, or time passing), as the journal's backlog comes with them.
    pending: Vec<Effect>,
}

impl Sim {
    fn new(settings: Settings, world: World) -> Sim {
        let now = Now {
            mono: Duration::ZERO,
            wall: t0(),
        };
        let mut core = Core::new(settings, HEARTBEAT, true, now);
        let pending = core.start(now);
        Sim {
            core,
            world,
            mono: Duration::ZERO,
            pending,
        }
    }

    fn now(&self) -> Now {
        Now {
            mono: self.mono,
            wall: t0() + chrono::Duration::from_std(self.mono).unwrap(),
        }
    }

    /// The world answers every effect at once (a probe, a restart, nvidia-smi take no time
    /// here); what it answers comes back as events.
    fn carry_out(&mut self, effects: Vec<Effect>) {
        let mut queue = effects;
        while !queue.is_empty() {
            let mut next = Vec::new();
            let mut answered = false;
            for e in queue {
                let now = self.now();
                if matches!(e, Effect::ReadSmi) {
                    self.world.smi_reads.push(self.mono);
                }
                let event = match e {
                    Effect::ReadSmi if self.world.smi_hangs => Some(Event::Smi(SmiRead::TimedOut(
                        "nvidia-smi: it did not finish within 10s and was killed".into(),
                    ))),
                    Effect::ReadSmi if self.world.smi_no_device => {
                        Some(Event::Smi(SmiRead::Snapshot(smi::SmiSnapshot {
                            no_device: true,
                            ..Default::default()
                        })))
                    }
                    Effect::ReadSmi => Some(Event::Smi(SmiRead::Snapshot(
                        smi::parse(self.world.smi.as_bytes()).unwrap(),
                    ))),
                    Effect::CheckUnit => Some(Event::Unit(self.world.unit.clone())),
                    Effect::ReadToken => {
                        self.world.token_reads += 1;
                        Some(self.world.token_read())
                    }
                    Effect::Adopt { .. } => {
                        self.world.adopts.push(self.mono);
                        Some(Event::Adopted((self.world.adopt)()))
                    }
                    Effect::RestartGridd { .. } => {
                        self.world.restarts.push(self.mono);
                        self.world.pid += 1;
                        for line in self.world.after_restart.clone() {
                            let ev = gridd(self.world.pid, line);
                            next.extend(self.core.handle(Event::Gridd(Box::new(ev)), now));
                        }
                        Some(Event::Restarted(Ok(())))
                    }
                    Effect::Probe(_) => {
                        self.world.probes.push(self.mono);
                        Some(Event::Probed {
                            verdict: self.world.probe.clone(),
                            skew: self.world.skew,
                        })
                    }
                    Effect::ReadLastShutdown => Some(Event::LastShutdown(None)),
                    Effect::ReadSecret | Effect::VmEvent(_) => None,
                    Effect::Publish(_) | Effect::Ready => None,
                };
                if let Some(ev) = event {
                    next.extend(self.core.handle(ev, now));
                    answered = true;
                }
            }
            // As the shell does: after a batch of answers, what follows from them.
            if answered {
                next.extend(self.core.tick(self.now()));
            }
            queue = next;
        }
    }

    /// A timer wakeup (answers to the effects are not counted: they are the world's).
    fn tick(&mut self) {
        self.world.ticks += 1;
        let fx = self.core.tick(self.now());
        self.carry_out(fx);
    }

    /// gridd logs a line; the core hears it and settles (the report is made within the
    /// report gap).
    fn log(&mut self, message: &str) {
        let ev = gridd(self.world.pid, message);
        self.handle(Event::Gridd(Box::new(ev)));
    }

    fn handle(&mut self, ev: Event) {
        let mut fx = std::mem::take(&mut self.pending);
        fx.extend(self.core.handle(ev, self.now()));
        fx.extend(self.core.tick(self.now()));
        self.carry_out(fx);
        self.run(Duration::from_millis(200));
    }

    /// Lets `d` pass, waking the core whenever it asks.
    fn run(&mut self, d: Duration) {
        let pending = std::mem::take(&mut self.pending);
        self.carry_out(pending);
        let end = self.mono + d;
        loop {
            let wake = self.core.next_wake(self.now());
            assert!(wake >= self.mono, "a wake in the past");
            if wake > end {
                break;
            }
            self.mono = wake;
            self.tick();
        }
        self.mono = end;
    }

    /// Runs to the next reading of nvidia-smi and holds its answer back: it is on its way
    /// until [`Sim::answer_held`].
    fn hold_next_reading(&mut self) {
        loop {
            self.mono = self.core.next_wake(self.now());
            let mut fx = self.core.tick(self.now());
            let reading = fx.contains(&Effect::ReadSmi);
            fx.retain(|e| *e != Effect::ReadSmi);
            self.carry_out(fx);
            if reading {
                return;
            }
        }
    }

    /// The reading held back answers `smi` now: what the core does then, not yet carried
    /// out.
    fn answer_held(&mut self, smi: &str) -> Vec<Effect> {
        let read = SmiRead::Snapshot(smi::parse(smi.as_bytes()).unwrap());
        let mut fx = self.core.handle(Event::Smi(read), self.now());
        fx.extend(self.core.tick(self.now()));
        fx
    }

    fn state(&self) -> State {
        self.core.report().expect("a report").state
    }

    fn reason(&self) -> Option<Reason> {
        self.core
            .report()
            .and_then(|r| r.failure.as_ref())
            .map(|f| f.reason)
    }
}

fn settings() -> Settings {
    let mut s = Settings::default();
    s.service.restart_grace = Duration::from_secs(120);
    s.service.restart_backoff = Duration::from_secs(60);
    s.service.restart_backoff_max = Duration::from_secs(1800);
    s.service.restart_budget_per_hour = 6;
    s
}

const S: fn(u64) -> Duration = Duration::from_secs;

/// A guest that acquired its license a minute ago, the core settled.
fn licensed_for_a_minute() -> Sim {
    let mut sim = Sim::new(settings(), World::new(LICENSED));
    sim.log(ACQUIRED);
    sim.run(S(60));
    sim
}

/// gridd's unit in `state` (inactive, failed): not running.
fn stopped(state: &str) -> UnitState {
    UnitState::Stopped {
        unit: "nvidia-gridd.service".into(),
        state: state.into(),
    }
}

/// systemd knows no unit of gridd's.
fn missing_unit() -> UnitState {
    UnitState::NotInstalled {
        unit: "nvidia-gridd.service".into(),
    }
}

/// systemd's answer: gridd's unit is not running.
fn inactive() -> Event {
    Event::Unit(Some(stopped("inactive")))
}

#[test]
fn licensed_and_quiet_the_core_wakes_once_per_heartbeat_at_most() {
    let mut sim = licensed_for_a_minute();
    assert_eq!(sim.state(), State::Licensed);
    assert_eq!(sim.reason(), None);
    let before = sim.world.ticks;
    sim.run(S(3600));
    let wakes = sim.world.ticks - before;
    // One per heartbeat, and one per reading of nvidia-smi (one an hour while licensed and
    // quiet, on its own time); the token's look rides on the heartbeat.
    let readings = (3600 / settings().service.poll_licensed.as_secs() as u32).max(1);
    let most = 3600 / HEARTBEAT.as_secs() as u32 + readings + 1;
    assert!(
        wakes <= most,
        "{wakes} wakeups in an idle hour, at most {most}"
    );
    assert!(sim.world.restarts.is_empty() && sim.world.probes.is_empty());
}

/// nvidia-smi's License Status with this expiry, as gridd's driver prints it (unpadded).
fn licensed_until(exp: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    LICENSED.replace(
        "2099-1-1 0:0:0",
        &format!(
            "{}-{}-{} {}:{}:{}",
            exp.year(),
            exp.month(),
            exp.day(),
            exp.hour(),
            exp.minute(),
            exp.second()
        ),
    )
}

#[test]
fn a_renewal_that_stalls_is_a_warning_until_the_expiry_moves_again() {
    let exp = t0() + chrono::Duration::hours(24);
    let mut sim = Sim::new(settings(), World::new(&licensed_until(exp)));
    sim.log(ACQUIRED);
    // Renewals come at about a fifth of the lease: two fifths (9.6 h of 24) without one is
    // a stall.
    sim.run(S(9 * 3600));
    assert_eq!(sim.reason(), None, "not yet");
    sim.run(S(3600));
    let r = sim.core.report().unwrap();
    assert_eq!(r.state, State::Licensed);
    assert_eq!(sim.reason(), Some(Reason::RenewalStalled), "{r:?}");
    assert_eq!(r.exit_code, 1);
    let f = r.failure.as_ref().unwrap();
    assert!(
        f.message.contains("runs out at 2026-12-01T12:00:00Z"),
        "{}",
        f.message
    );
    // Counted once however long it lasts; no restart (it would return the lease).
    let failures = sim.core.counters().failures;
    sim.run(S(3600));
    assert_eq!(sim.core.counters().failures, failures);
    assert!(sim.world.restarts.is_empty());
    // gridd logs a renewal, with the new expiry: the warning goes at once, with no reading
    // of nvidia-smi (readings are an hour apart while licensed; the line says it all).
    let later = exp + chrono::Duration::hours(10);
    // Away from the hour's reading.
    sim.run(S(600));
    assert_eq!(sim.reason(), Some(Reason::RenewalStalled));
    sim.world.smi = licensed_until(later);
    let reads = sim.world.smi_reads.len();
    sim.log(&renewed_until(later));
    sim.run(S(2));
    assert_eq!(sim.world.smi_reads.len(), reads, "no reading for a renewal");
    let r = sim.core.report().unwrap();
    assert_eq!(sim.reason(), None);
    assert_eq!(r.exit_code, 0);
    assert_eq!(
        r.license.as_ref().and_then(|l| l.expiry),
        Some(later),
        "the report says the renewed expiry"
    );
}

/// gridd's renewal line, as the samples show it
/// (tests/fixtures/samples/gridd-log-fastapi-dls-5-windows.txt), with this expiry.
fn renewed_until(exp: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    format!(
        "License renewed successfully. (Info: dls-a.example, NVIDIA RTX Virtual Workstation; Expiry: {}-{}-{} {}:{}:{} GMT)",
        exp.year(),
        exp.month(),
        exp.day(),
        exp.hour(),
        exp.minute(),
        exp.second()
    )
}

#[test]
fn a_bare_failure_after_a_license_is_probed_at_once() {
    let mut w = World::new(LICENSED);
    w.probe = Some((
        Reason::DlsUnreachable,
        "TCP dls-a.example:443: connection refused".into(),
    ));
    let mut sim = Sim::new(settings(), w);
    sim.log(ACQUIRED);
    sim.run(S(100));
    // The license is lost: gridd says only that it failed.
    sim.world.smi = UNLICENSED.into();
    let seen = sim.mono;
    sim.log(BARE_FAILURE);
    sim.run(S(2));
    let first = sim.world.probes.first().copied().expect("a probe");
    assert!(
        first >= seen && first <= seen + S(2),
        "probed at {first:?}, seen at {seen:?}"
    );
    assert_eq!(sim.reason(), Some(Reason::DlsUnreachable));
    // The same unchanged failure is probed again only after the rate limit.
    sim.run(S(20));
    assert_eq!(sim.world.probes.len(), 1, "{:?}", sim.world.probes);
    sim.run(PROBE_REPEAT);
    assert!(sim.world.probes.len() >= 2);
}

#[test]
fn licensing_unsupported_outranks_the_housekeeping_that_follows_it() {
    let mut sim = Sim::new(settings(), World::new(UNLICENSED));
    sim.log(UNSUPPORTED);
    sim.log(PID_FILE);
    sim.log(PID_CLOSE);
    // The failure is the specific line, not the housekeeping after it.
    assert_eq!(sim.reason(), Some(Reason::LicensingUnsupported));
    sim.run(S(3600));
    assert!(sim.world.restarts.is_empty(), "{:?}", sim.world.restarts);
    assert!(sim.world.probes.is_empty(), "{:?}", sim.world.probes);
}

#[test]
fn clock_skew_and_other_causes_a_restart_cannot_fix_are_reported_not_retried() {
    for (line, reason) in [
        (NO_POOL, Reason::NoLicenseAvailable),
        (TOKEN_BAD, Reason::TokenInvalid),
        (TRUSTED_STORE, Reason::TrustedStore),
    ] {
        let mut sim = Sim::new(settings(), World::new(UNLICENSED));
        sim.log(line);
        assert_eq!(sim.reason(), Some(reason), "{line}");
        sim.run(S(3600));
        assert!(
            sim.world.restarts.is_empty(),
            "{line}: {:?}",
            sim.world.restarts
        );
        assert!(
            sim.world.probes.is_empty(),
            "{line}: {:?}",
            sim.world.probes
        );
        assert_eq!(sim.reason(), Some(reason), "{line}");
    }
}

/// gridd names the clock skew itself: no restart (it cannot help), but the probe measures the
/// skew for the gauge (and its alert), once at once and then every few minutes, never
/// replacing gridd's reason.
#[test]
fn clock_skew_named_by_gridd_is_measured_not_retried() {
    let mut w = World::new(UNLICENSED);
    w.skew = Some(312.0);
    // What the probe would say of the DLS does not replace gridd's specific reason.
    w.probe = Some((
        Reason::ClockSkew,
        "guest clock is 312 s ahead of DLS dls-a.example".into(),
    ));
    let mut sim = Sim::new(settings(), w);
    let seen = sim.mono;
    sim.log(WINDBACK);
    sim.run(S(2));
    assert_eq!(sim.reason(), Some(Reason::ClockSkew));
    let first = sim.world.probes.first().copied().expect("a probe");
    assert!(first <= seen + S(2), "probed at {first:?}");
    let facts = sim.core.report().unwrap().service.clone().unwrap();
    assert_eq!(facts.clock_skew_seconds, Some(312.0));
    sim.run(S(3600));
    assert!(sim.world.restarts.is_empty(), "{:?}", sim.world.restarts);
    let n = sim.world.probes.len();
    let most = (3600 / MEASURE_REPEAT.as_secs() + 2) as usize;
    assert!(
        (2..=most).contains(&n),
        "{n} probes in an hour: {:?}",
        sim.world.probes
    );
    assert_eq!(sim.reason(), Some(Reason::ClockSkew));
}

#[test]
fn an_unreachable_dls_is_retried_after_the_grace_with_backoff_and_a_budget() {
    let mut w = World::new(UNLICENSED);
    w.after_restart = vec![NETWORK];
    let mut sim = Sim::new(settings(), w);
    sim.log(NETWORK);
    assert_eq!(sim.reason(), Some(Reason::DlsUnreachable));
    sim.run(S(119));
    assert!(sim.world.restarts.is_empty(), "inside the grace");
    sim.run(S(3600));
    let r = &sim.world.restarts;
    assert_eq!(r.len(), 6, "the budget: {r:?}");
    assert!(r[0] >= S(120) && r[0] <= S(125), "{r:?}");
    // Each wait at least 0.8 of the doubling backoff (jitter is ±20 %).
    let mut backoff = 60.0;
    for w in r.windows(2) {
        let gap = (w[1] - w[0]).as_secs_f64();
        assert!(gap >= 0.8 * backoff, "{gap} s < 0.8 x {backoff} s: {r:?}");
        backoff = (backoff * 2.0_f64).min(1800.0);
    }
}

#[test]
fn gridd_not_running_is_restarted_at_once_and_a_missing_token_is_not() {
    let mut w = World::new(UNLICENSED);
    w.unit = Some(stopped("inactive"));
    let mut sim = Sim::new(settings(), w);
    sim.run(S(5));
    assert_eq!(sim.reason(), Some(Reason::GriddNotRunning));
    let first = sim.world.restarts.first().copied().expect("a restart");
    assert!(first <= S(1), "restarted at {first:?}");

    let mut w = World::new(UNLICENSED);
    w.token = Err(TokenProblem::Missing);
    let mut sim = Sim::new(settings(), w);
    sim.run(S(3600));
    assert_eq!(sim.reason(), Some(Reason::TokenMissing));
    assert!(sim.world.restarts.is_empty() && sim.world.probes.is_empty());
}

/// gridd restarted by hand while systemd was being asked: the answer ("inactive") was true
/// between the stop and the start, and is old news once gridd says it started. Asked once
/// more, systemd says gridd runs, and a licensed guest reports no failure.
#[test]
fn a_unit_answer_older_than_gridds_start_is_asked_again() {
    let mut sim = licensed_for_a_minute();
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));

    let now = sim.now();
    let asked = sim
        .core
        .handle(Event::Gridd(Box::new(gridd(100, "Shutdown (100)"))), now);
    assert!(asked.contains(&Effect::CheckUnit), "{asked:?}");
    // The new gridd's first line comes before systemd's answer to that question.
    let fx = sim
        .core
        .handle(Event::Gridd(Box::new(gridd(101, "Started (101)"))), now);
    let mut again = sim.core.handle(inactive(), now);
    again.extend(fx);
    assert!(again.contains(&Effect::CheckUnit), "{again:?}");
    // Not believed meanwhile: while systemd is asked again, time passes and nvidia-smi
    // answers; no failure is reported, and gridd is not restarted for it.
    let restarts = sim.world.restarts.len();
    sim.mono += S(1);
    let fx = sim.core.tick(sim.now());
    sim.carry_out(fx.into_iter().filter(|e| *e != Effect::CheckUnit).collect());
    assert_eq!(sim.world.restarts.len(), restarts);
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    sim.world.pid = 101;
    sim.carry_out(again);
    sim.run(S(5));
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
}

/// gridd exited on a failure that explains it (systemd: inactive, believed); then it is
/// started from outside (systemd's `Restart=`, an operator). Its `Started` line voids the old
/// "not running" until systemd answers again: no report meanwhile calls it down, counts
/// `gridd_not_running` or restarts it.
#[test]
fn a_gridd_started_from_outside_is_not_called_down_before_systemd_answers() {
    let mut w = World::new(UNLICENSED);
    w.unit = Some(stopped("inactive"));
    let mut sim = Sim::new(settings(), w);
    sim.log(TOKEN_BAD);
    sim.log("Shutdown (100)");
    sim.run(S(60));
    assert_eq!(sim.reason(), Some(Reason::TokenInvalid));
    let restarts = sim.world.restarts.len();
    // The new gridd's first line; systemd's answer has not come yet.
    sim.world.pid = 101;
    let now = sim.now();
    let mut fx = sim
        .core
        .handle(Event::Gridd(Box::new(gridd(101, "Started (101)"))), now);
    assert!(fx.contains(&Effect::CheckUnit), "{fx:?}");
    sim.mono += Duration::from_millis(200);
    fx.extend(sim.core.tick(sim.now()));
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::RestartGridd { .. })),
        "{fx:?}"
    );
    assert_ne!(sim.reason(), Some(Reason::GriddNotRunning));
    assert_eq!(gridd_not_running_counted(&sim), 0);
    // systemd says it runs: believed.
    sim.world.unit = Some(UnitState::Active);
    sim.carry_out(fx);
    sim.run(S(5));
    assert_eq!(sim.world.restarts.len(), restarts);
    assert_eq!(gridd_not_running_counted(&sim), 0);
}

/// A token file caught while it is written (made empty, then filled, as `cp` and cloud-init
/// do) is no verdict: nothing calls the token empty meanwhile; once the directory has been
/// still a second and it is still empty, it is reported.
#[test]
fn a_token_caught_while_it_is_written_is_looked_at_again_not_reported() {
    let mut sim = licensed_for_a_minute();
    sim.world.token = Err(TokenProblem::Invalid(TokenError::Empty));
    sim.handle(Event::TokenDirChanged);
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    // The write ends; the next look finds the token.
    sim.world.token = Ok(token());
    sim.run(S(2));
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    assert!(
        sim.world.token_reads >= 2,
        "looked at again: {}",
        sim.world.token_reads
    );
    // One that stays empty is what it is, a second later.
    sim.world.token = Err(TokenProblem::Invalid(TokenError::Empty));
    sim.handle(Event::TokenDirChanged);
    assert_eq!(sim.reason(), None);
    sim.run(S(2));
    assert_eq!(sim.reason(), Some(Reason::TokenInvalid));
}

/// An adoption that leaves gridd's restart due, as it ends: what `install` reports; the
/// core then makes the restart itself.
fn restarted_for_the_token() -> Event {
    Event::Adopted(Ok(Box::new(Outcome {
        dry_run: false,
        token_summary: String::new(),
        changes: Vec::new(),
        warnings: Vec::new(),
        restart: Restart::Due,
        restart_reason: Some("the token changed".into()),
        kept_name: None,
        restart_command: "systemctl restart nvidia-gridd".into(),
    })))
}

/// An adoption's outcome with `restart`, nothing changed.
fn adopted_with(restart: Restart) -> Result<Box<Outcome>, AdoptError> {
    Ok(Box::new(Outcome {
        dry_run: false,
        token_summary: String::new(),
        changes: Vec::new(),
        warnings: Vec::new(),
        restart_reason: (restart == Restart::Due)
            .then(|| "an earlier restart is still owed".into()),
        restart,
        kept_name: None,
        restart_command: "systemctl restart nvidia-gridd".into(),
    }))
}

/// An adoption reads what the agent owes gridd while a restart of the agent's own runs; the
/// restart ends before the adoption does, and may have paid it (a rotation's own chmod wakes
/// such an adoption). Its "restart due" is then read again, not made at once: one rotation,
/// one restart, however the two interleave. What is still owed after it is made.
#[test]
fn a_restart_owed_as_read_before_a_restart_ended_is_read_again() {
    for still_owed in [false, true] {
        let mut sim = licensed_for_a_minute();
        let now = sim.now();
        sim.core.handle(Event::TokenDirChanged, now);
        let fx = sim.core.handle(restarted_for_the_token(), now);
        assert!(
            fx.iter().any(|e| matches!(e, Effect::RestartGridd { .. })),
            "{fx:?}"
        );
        sim.mono += S(5);
        let now = sim.now();
        let fx = sim.core.handle(Event::TokenDirChanged, now);
        assert!(
            fx.iter().any(|e| matches!(e, Effect::Adopt { .. })),
            "{fx:?}"
        );
        sim.core.handle(Event::Restarted(Ok(())), now);
        let fx = sim
            .core
            .handle(Event::Adopted(adopted_with(Restart::Due)), now);
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::RestartGridd { .. })),
            "a second restart for what the first one paid: {fx:?}"
        );
        sim.world.adopt = if still_owed {
            || adopted_with(Restart::Due)
        } else {
            || adopted_with(Restart::NotNeeded)
        };
        sim.run(S(5));
        assert!(!sim.world.adopts.is_empty(), "not read again");
        assert_eq!(
            sim.world.restarts.len(),
            usize::from(still_owed),
            "still owed: {still_owed}"
        );
    }
}

fn gridd_not_running_counted(sim: &Sim) -> u64 {
    let i = Reason::ALL
        .iter()
        .position(|r| *r == Reason::GriddNotRunning)
        .unwrap();
    sim.core.counters().failures[i]
}

/// The agent restarts gridd itself (for a dropped token): between the stop and the start
/// systemd says "inactive", and that is the agent's own doing. Whether the question was
/// asked during the restart or just before it, the answer is neither reported nor counted
/// as `gridd_not_running` (a fleet alerts on the count), and systemd is asked again once the
/// restart is over.
#[test]
fn gridd_stopped_by_the_agents_own_restart_is_not_its_failure() {
    // Asked during the adoption.
    let mut sim = licensed_for_a_minute();
    let now = sim.now();
    let fx = sim.core.handle(Event::TokenDirChanged, now);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Adopt { .. })),
        "{fx:?}"
    );
    let fx = sim
        .core
        .handle(Event::Gridd(Box::new(gridd(100, "Shutdown (100)"))), now);
    assert!(fx.contains(&Effect::CheckUnit), "{fx:?}");
    let fx = sim.core.handle(inactive(), now);
    assert!(
        !fx.contains(&Effect::CheckUnit),
        "asked again mid-restart: {fx:?}"
    );
    sim.core.tick(sim.now());
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    // The adoption leaves the restart due: the core makes it, and asks again once it is over.
    let fx = sim.core.handle(restarted_for_the_token(), now);
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::RestartGridd {
                for_token: true,
                ..
            }
        )),
        "the core makes the token's restart: {fx:?}"
    );
    assert!(
        !fx.contains(&Effect::CheckUnit),
        "asked mid-restart: {fx:?}"
    );
    let fx = sim.core.handle(Event::Restarted(Ok(())), now);
    assert!(fx.contains(&Effect::CheckUnit), "not asked again: {fx:?}");
    sim.world.pid = 101;
    sim.carry_out(fx);
    sim.log("Started (101)");
    sim.run(S(10));
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    assert_eq!(gridd_not_running_counted(&sim), 0);

    // Asked just before the adoption began, answered after it ended.
    let mut sim = licensed_for_a_minute();
    let now = sim.now();
    let fx = sim
        .core
        .handle(Event::Gridd(Box::new(gridd(100, "Shutdown (100)"))), now);
    assert!(fx.contains(&Effect::CheckUnit), "{fx:?}");
    sim.core.handle(Event::TokenDirChanged, now);
    let mut fx = sim.core.handle(restarted_for_the_token(), now);
    fx.extend(sim.core.handle(inactive(), now));
    fx.extend(sim.core.handle(Event::Restarted(Ok(())), now));
    fx.retain(|e| !matches!(e, Effect::RestartGridd { .. }));
    assert!(fx.contains(&Effect::CheckUnit), "not asked again: {fx:?}");
    sim.core.tick(sim.now());
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    sim.world.pid = 101;
    sim.carry_out(fx);
    sim.run(S(10));
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
    assert_eq!(gridd_not_running_counted(&sim), 0);

    // gridd that stays down after the agent's restart is reported, at once.
    let mut sim = licensed_for_a_minute();
    let now = sim.now();
    sim.core.handle(Event::TokenDirChanged, now);
    sim.world.unit = Some(stopped("failed"));
    let fx = sim.core.handle(restarted_for_the_token(), now);
    sim.carry_out(fx);
    sim.run(S(1));
    assert_eq!(sim.reason(), Some(Reason::GriddNotRunning));
    assert_eq!(gridd_not_running_counted(&sim), 1);
}

/// While systemd's last word is that gridd runs, the process of gridd's latest line stands for
/// it (a periodic check looks at that process, not at systemd); a start or stop logged since,
/// or a question on its way, and systemd is asked.
#[test]
fn gridd_running_is_the_process_systemd_last_saw_run() {
    let mut sim = licensed_for_a_minute();
    let now = sim.now();
    let ask = |sim: &mut Sim, ev: Event| {
        let fx = sim.core.handle(ev, now);
        (fx.contains(&Effect::CheckUnit), sim.core.running_gridd())
    };
    let line = |pid, msg: &str| Event::Gridd(Box::new(gridd(pid, msg)));
    assert_eq!(ask(&mut sim, inactive()), (false, None));
    assert_eq!(
        ask(&mut sim, line(100, "License renewed successfully.")),
        (true, None),
        "systemd's last word was 'not running'"
    );
    assert_eq!(
        ask(&mut sim, Event::Unit(Some(UnitState::Active))),
        (false, None)
    );
    assert_eq!(
        ask(&mut sim, line(100, "License renewed successfully.")),
        (false, None),
        "nothing to ask"
    );
    let mut fx = Vec::new();
    for _ in 0..900 {
        sim.mono += S(1);
        fx = sim.core.tick(sim.now());
        if !fx.is_empty() {
            break;
        }
    }
    assert!(
        fx.contains(&Effect::CheckUnit),
        "the periodic check: {fx:?}"
    );
    assert_eq!(
        sim.core.running_gridd(),
        Some(100),
        "vouched for by gridd's process"
    );
    assert_eq!(
        ask(&mut sim, Event::Unit(Some(UnitState::Active))),
        (false, None)
    );
    assert_eq!(
        ask(&mut sim, line(100, "Shutdown (100)")),
        (true, None),
        "a stop: systemd is asked"
    );
    assert_eq!(ask(&mut sim, inactive()), (false, None));
    assert_eq!(
        ask(&mut sim, line(101, "Started (101)")),
        (true, None),
        "a start: systemd is asked"
    );
}

/// systemd said gridd was not running, and then gridd logs: that answer is old news.
#[test]
fn a_line_from_gridd_after_systemd_said_it_was_down_asks_again() {
    let mut sim = licensed_for_a_minute();
    let now = sim.now();
    let fx = sim.core.handle(inactive(), now);
    assert!(!fx.contains(&Effect::CheckUnit), "{fx:?}");
    let fx = sim.core.handle(
        Event::Gridd(Box::new(gridd(
            100,
            "Acquiring license. (Info: dls-a.example; NVIDIA RTX Virtual Workstation)",
        ))),
        now,
    );
    assert!(fx.contains(&Effect::CheckUnit), "{fx:?}");
    sim.carry_out(fx);
    sim.run(S(5));
    assert_eq!((sim.state(), sim.reason()), (State::Licensed, None));
}

/// gridd exits on a token it rejects (or a GPU it cannot license): its last words are the
/// cause, "not running" only the consequence. The report gives the cause, and gridd is not
/// restarted for nothing. A crash after a failure a retry can clear is still restarted.
#[test]
fn gridds_last_words_explain_why_it_is_not_running() {
    for (line, reason, restarted) in [
        (TOKEN_BAD, Reason::TokenInvalid, false),
        (UNSUPPORTED, Reason::LicensingUnsupported, false),
        (NETWORK, Reason::GriddNotRunning, true),
    ] {
        let mut w = World::new(UNLICENSED);
        w.unit = Some(stopped("failed"));
        let mut sim = Sim::new(settings(), w);
        sim.log(line);
        sim.log("Shutdown (100)");
        sim.run(S(600));
        assert_eq!(sim.reason(), Some(reason), "{line}");
        assert_eq!(
            !sim.world.restarts.is_empty(),
            restarted,
            "{line}: {:?}",
            sim.world.restarts
        );
    }
}

#[test]
fn a_hung_nvidia_smi_is_unknown_and_asked_again_later() {
    let mut w = World::new(LICENSED);
    w.smi_hangs = true;
    let mut sim = Sim::new(settings(), w);
    sim.run(S(60));
    let r = sim.core.report().unwrap();
    assert_eq!(r.state, State::Unknown);
    assert!(
        r.notes.iter().any(|n| n.contains("did not finish")),
        "{:?}",
        r.notes
    );
}

#[test]
fn a_new_token_is_news_for_the_probe() {
    let mut w = World::new(UNLICENSED);
    w.probe = Some((Reason::DlsUnreachable, "DNS: no such host".into()));
    let mut sim = Sim::new(settings(), w);
    sim.log(BARE_FAILURE);
    sim.run(S(5));
    assert_eq!(sim.world.probes.len(), 1);
    // A token dropped and adopted: the same failure text is probed again at once.
    let mut t = token();
    t.token_id = Some("another".into());
    sim.world.token = Ok(t);
    // The new token's DLS answers: the old DLS's verdict is not shown for the new token.
    sim.world.probe = None;
    sim.handle(Event::TokenDirChanged);
    sim.run(S(2));
    assert_eq!(sim.world.probes.len(), 2, "{:?}", sim.world.probes);
    assert_ne!(sim.reason(), Some(Reason::DlsUnreachable));
}

/// How a scenario sets up its world.
type Setup = Box<dyn Fn(&mut World)>;

/// Every reason of the contract, as gridd or the agent meets it: restarts exactly where the
/// policy table says a restart helps, probes exactly where it says a probe refines.
#[test]
fn every_reason_follows_the_policy_table() {
    let cases: Vec<(Reason, Setup, Option<&str>)> = vec![
        (
            Reason::TokenMissing,
            Box::new(|w| w.token = Err(TokenProblem::Missing)),
            None,
        ),
        (Reason::TokenInvalid, Box::new(|_| {}), Some(TOKEN_BAD)),
        (
            Reason::TokenExpired,
            Box::new(|w| w.token = Err(TokenProblem::Untimely(Untimely::Expired(t0())))),
            None,
        ),
        (Reason::ClockSkew, Box::new(|_| {}), Some(WINDBACK)),
        (Reason::NoLicenseAvailable, Box::new(|_| {}), Some(NO_POOL)),
        (Reason::TrustedStore, Box::new(|_| {}), Some(TRUSTED_STORE)),
        (Reason::DlsUnreachable, Box::new(|_| {}), Some(NETWORK)),
        (
            Reason::GriddNotRunning,
            Box::new(|w| w.unit = Some(stopped("inactive"))),
            None,
        ),
        (Reason::Unspecified, Box::new(|_| {}), Some(BARE_FAILURE)),
        (
            Reason::Other,
            Box::new(|_| {}),
            Some(
                "Failed to acquire license from dls-a.example (Info: NVIDIA RTX Virtual Workstation - Error: Storage anchor break found.)",
            ),
        ),
        (
            Reason::FeatureTypeInvalid,
            Box::new(|_| {}),
            Some("Invalid feature type requested"),
        ),
    ];
    for (reason, setup, line) in cases {
        let mut w = World::new(UNLICENSED);
        setup(&mut w);
        let mut sim = Sim::new(settings(), w);
        if let Some(line) = line {
            sim.log(line);
        }
        sim.run(S(600));
        assert_eq!(sim.reason(), Some(reason), "{reason:?}");
        let p = policy::of(reason);
        assert_eq!(
            !sim.world.restarts.is_empty(),
            p.restart_helps,
            "{reason:?}: restarts {:?}",
            sim.world.restarts
        );
        assert_eq!(
            !sim.world.probes.is_empty(),
            p.probe_refines || p.probe_measures,
            "{reason:?}: probes {:?}",
            sim.world.probes
        );
    }
}

/// One step of an arbitrary life.
#[derive(Debug, Clone)]
enum Step {
    Wait(u64),
    Log(usize),
    Smi(bool),
    Unit(bool),
    Token(bool),
    Probe(Option<Reason>),
}

const LINES: &[&str] = &[
    ACQUIRED,
    BARE_FAILURE,
    WINDBACK,
    NETWORK,
    NO_POOL,
    UNSUPPORTED,
    PID_FILE,
    TOKEN_BAD,
    TRUSTED_STORE,
];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..300).prop_map(Step::Wait),
        4 => (0..LINES.len()).prop_map(Step::Log),
        1 => any::<bool>().prop_map(Step::Smi),
        1 => any::<bool>().prop_map(Step::Unit),
        1 => any::<bool>().prop_map(Step::Token),
        1 => prop::option::of(prop::sample::select(vec![
            Reason::DlsUnreachable,
            Reason::ClockSkew,
        ]))
        .prop_map(Step::Probe),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever happens, in whatever order: restarts stay within the hourly budget, never
    /// two inside the backoff, never one for a failure the table says a restart cannot fix,
    /// and a new vague failure is probed within 2 s.
    #[test]
    fn restarts_and_probes_keep_their_rules(steps in prop::collection::vec(step(), 1..40)) {
        let cfg = settings();
        let mut sim = Sim::new(cfg.clone(), World::new(UNLICENSED));
        for s in steps {
            match s {
                Step::Wait(secs) => sim.run(Duration::from_secs(secs)),
                Step::Log(i) => sim.log(LINES[i]),
                Step::Smi(licensed) => {
                    sim.world.smi = if licensed { LICENSED } else { UNLICENSED }.into();
                    sim.run(Duration::from_secs(1));
                }
                Step::Unit(up) => {
                    sim.world.unit = Some(if up { UnitState::Active } else { stopped("inactive") });
                    sim.run(Duration::from_secs(1));
                }
                Step::Token(ok) => {
                    sim.world.token = if ok { Ok(token()) } else { Err(TokenProblem::Missing) };
                    sim.handle(Event::TokenDirChanged);
                }
                Step::Probe(r) => sim.world.probe = r.map(|r| (r, "probe".to_string())),
            }
            let r = &sim.world.restarts;
            for (i, t) in r.iter().enumerate() {
                let in_hour = r[i..].iter().filter(|u| **u < *t + Duration::from_secs(3600)).count();
                prop_assert!(in_hour <= cfg.service.restart_budget_per_hour as usize, "{r:?}");
            }
            for w in r.windows(2) {
                prop_assert!(
                    (w[1] - w[0]).as_secs_f64() >= 0.8 * cfg.service.restart_backoff.as_secs_f64(),
                    "{r:?}"
                );
            }
        }
    }

    /// With a failure a restart cannot fix, no restart ever comes, whatever the timing.
    #[test]
    fn never_a_restart_for_what_a_restart_cannot_fix(
        line in prop::sample::select(vec![WINDBACK, NO_POOL, TOKEN_BAD, TRUSTED_STORE, UNSUPPORTED]),
        waits in prop::collection::vec(0u64..900, 1..8),
    ) {
        let mut sim = Sim::new(settings(), World::new(UNLICENSED));
        sim.log(line);
        for w in waits {
            sim.run(Duration::from_secs(w));
            if w % 3 == 0 {
                sim.log(line);
            }
        }
        prop_assert!(sim.world.restarts.is_empty(), "{line}: {:?}", sim.world.restarts);
    }

    /// A vague failure, new to the core, is probed within 2 s of being seen.
    #[test]
    fn a_new_vague_failure_is_probed_within_two_seconds(
        before in 0u64..600,
        line in prop::sample::select(vec![BARE_FAILURE, "Failed to acquire license from dls-a.example (Info: NVIDIA RTX Virtual Workstation - Error: Storage anchor break found.)"]),
    ) {
        let mut sim = Sim::new(settings(), World::new(LICENSED));
        sim.log(ACQUIRED);
        sim.run(Duration::from_secs(before));
        sim.world.smi = UNLICENSED.into();
        let seen = sim.mono;
        sim.log(line);
        sim.run(Duration::from_secs(2));
        prop_assert!(
            sim.world.probes.iter().any(|p| *p >= seen && *p <= seen + Duration::from_secs(2)),
            "{:?} (seen at {seen:?})",
            sim.world.probes
        );
    }
}

/// A burst of changes in the token directory (a sync tool writing thousands of files) is one
/// read and one adoption in flight, and one more of each after them: never one per change.
#[test]
fn a_burst_of_token_directory_changes_is_coalesced() {
    let mut sim = licensed_for_a_minute();
    let (reads, adopts) = (sim.world.token_reads, sim.world.adopts.len());
    let mut fx = Vec::new();
    for _ in 0..10_000 {
        fx.extend(sim.core.handle(Event::TokenDirChanged, sim.now()));
    }
    let asked = fx
        .iter()
        .filter(|e| matches!(e, Effect::ReadToken | Effect::Adopt { .. }))
        .count();
    assert_eq!(asked, 2, "one read and one adoption for 10,000 changes");
    sim.carry_out(fx);
    sim.run(S(5));
    assert!(
        sim.world.token_reads - reads <= 2,
        "{}",
        sim.world.token_reads - reads
    );
    // One at once, one for the changes seen meanwhile, one after the gap at most.
    assert!(
        sim.world.adopts.len() - adopts <= 3,
        "{:?}",
        sim.world.adopts
    );
    assert_eq!(sim.state(), State::Licensed);
}

/// An adoption that fails (a full state file system) and is undone changes the directory
/// itself: those changes do not start another adoption before the wait is over, and the
/// next one comes by itself after it.
#[test]
fn a_failed_adoption_does_not_storm() {
    let mut sim = licensed_for_a_minute();
    sim.world.adopt = || {
        Err(AdoptError::Other(
            "cannot move the other files aside: No space left on device".into(),
        ))
    };
    sim.handle(Event::TokenDirChanged);
    let first = sim.world.adopts.len();
    assert!(first >= 1);
    // The undo's own changes, every 100 ms for 20 s.
    for _ in 0..200 {
        let fx = sim.core.handle(Event::TokenDirChanged, sim.now());
        sim.carry_out(fx);
        sim.run(Duration::from_millis(100));
    }
    assert_eq!(sim.world.adopts.len(), first, "{:?}", sim.world.adopts);
    // The wait over, the next look (on a heartbeat's wakeup, at most one late) tries again.
    sim.run(S(45));
    assert_eq!(sim.world.adopts.len(), first + 1, "{:?}", sim.world.adopts);
}

/// A token directory refused as it stands (a FIFO at the token path) changes nothing: the
/// operator's fix, the next change, is adopted at once, without the wait of a failure whose
/// undo changed the directory.
#[test]
fn a_refused_directory_is_looked_at_again_on_its_next_change() {
    let mut sim = licensed_for_a_minute();
    sim.world.adopt = || {
        Err(AdoptError::Refused(
            "the token path x is not a regular file but a FIFO; remove it".into(),
        ))
    };
    sim.handle(Event::TokenDirChanged);
    let first = sim.world.adopts.len();
    assert!(first >= 1);
    sim.run(S(2));
    sim.handle(Event::TokenDirChanged);
    sim.run(S(1));
    assert_eq!(sim.world.adopts.len(), first + 1, "{:?}", sim.world.adopts);
}

/// A gridd unit that does not exist (a build of the driver without it) is reported with the
/// fix that fits, and never restarted: systemctl would answer "unit not found" each time.
#[test]
fn a_gridd_unit_that_does_not_exist_is_never_restarted() {
    let mut w = World::new(UNLICENSED);
    w.unit = Some(missing_unit());
    let mut sim = Sim::new(settings(), w);
    sim.run(S(3600));
    assert_eq!(sim.reason(), Some(Reason::GriddNotRunning));
    assert!(sim.world.restarts.is_empty(), "{:?}", sim.world.restarts);
    let advice = &sim.core.report().unwrap().failure.as_ref().unwrap().advice;
    assert!(
        advice.contains("comes with the NVIDIA vGPU (GRID) guest driver"),
        "{advice}"
    );
    let unit = sim.core.report().unwrap().gridd_unit.clone();
    assert_eq!(unit.as_deref(), Some("not_installed"));
}

/// No NVIDIA device on the bus: `no_gpu`, exit 0, no failure, no restart, no probe.
#[test]
fn a_guest_without_a_gpu_is_left_alone() {
    let mut w = World::new("");
    w.unit = Some(missing_unit());
    w.token = Err(TokenProblem::Missing);
    w.smi_no_device = true;
    let mut sim = Sim::new(settings(), w);
    sim.run(S(3600));
    let r = sim.core.report().unwrap();
    assert_eq!((r.state, r.exit_code), (State::NoGpu, 0));
    assert!(r.failure.is_none(), "{:?}", r.failure);
    assert!(sim.world.restarts.is_empty() && sim.world.probes.is_empty());
}

/// gridd restarts while nvidia-smi is being read: the reading under way shows the license
/// from before the restart, so nvidia-smi is read again soon after it, not at the licensed
/// poll's pace minutes later. (Otherwise the report stays licensed, and a unit ordered after
/// vgpu-licensed.target starts, while gridd holds no license.)
#[test]
fn gridd_restarting_while_nvidia_smi_is_read_is_read_again() {
    let mut sim = licensed_for_a_minute();
    let now = sim.now();
    let mut fx = sim.core.handle(
        Event::Gridd(Box::new(gridd(
            100,
            "Acquiring license. (Info: dls-a.example; NVIDIA RTX Virtual Workstation)",
        ))),
        now,
    );
    sim.mono += Duration::from_millis(400);
    fx.extend(sim.core.tick(sim.now()));
    assert!(fx.contains(&Effect::ReadSmi), "{fx:?}");
    // The reading is under way (its answer held back) when gridd restarts.
    fx.retain(|e| *e != Effect::ReadSmi);
    sim.carry_out(fx);
    sim.world.smi = UNLICENSED.into();
    for line in ["Shutdown (100)", "Started (101)"] {
        sim.world.pid = 101;
        let fx = sim
            .core
            .handle(Event::Gridd(Box::new(gridd(101, line))), sim.now());
        sim.carry_out(fx);
    }
    sim.mono += Duration::from_millis(100);
    // The answer of the reading begun before the restart.
    let old = smi::parse(LICENSED.as_bytes()).unwrap();
    let fx = sim
        .core
        .handle(Event::Smi(SmiRead::Snapshot(old)), sim.now());
    sim.carry_out(fx);
    sim.run(S(2));
    assert_ne!(sim.state(), State::Licensed);
}

/// gridd says it acquired its license shortly before the grace ends, while a reading begun
/// before that line is on its way (a loaded guest: nvidia-smi is slow to answer). The stale
/// "no license" that reading brings, and the grace ending while the next reading is slow
/// too, are no reason to restart the gridd that just got one: the reading begun after the
/// line decides, and it shows the license.
#[test]
fn a_license_gridd_just_announced_is_not_restarted_before_a_reading_shows_it() {
    let mut sim = Sim::new(settings(), World::new(UNLICENSED));
    sim.log("Acquiring license. (Info: dls-a.example; NVIDIA RTX Virtual Workstation)");
    sim.run(S(100));
    // A reading starts; its answer is held back.
    sim.hold_next_reading();
    assert!(sim.world.restarts.is_empty(), "inside the grace");
    // gridd's line, stamped as journald stamps it, heard while the reading runs.
    sim.mono += Duration::from_millis(500);
    let line = format!(
        "{} guest nvidia-gridd[100]: {ACQUIRED}\n",
        sim.now().wall.to_rfc3339()
    );
    let mut events = Vec::new();
    journal::scan(line.as_bytes(), |e| events.push(e)).unwrap();
    let fx = sim
        .core
        .handle(Event::Gridd(Box::new(events.remove(0))), sim.now());
    sim.carry_out(fx);
    sim.world.smi = LICENSED.into();
    // The grace ends while the reading is still on its way, and then it answers from
    // before the line.
    for _ in 0..4 {
        sim.mono += S(1);
        let fx = sim.core.tick(sim.now());
        sim.carry_out(fx);
    }
    let fx = sim.answer_held(UNLICENSED);
    // The reading the line asked for starts as soon as the floor between readings allows
    // (never back to back), and is slow in its turn: longer than a grace.
    assert!(!fx.contains(&Effect::ReadSmi), "back to back: {fx:?}");
    sim.carry_out(fx);
    sim.mono += SMI_FLOOR;
    let mut fx = sim.core.tick(sim.now());
    assert!(fx.contains(&Effect::ReadSmi), "{fx:?}");
    fx.retain(|e| *e != Effect::ReadSmi);
    sim.carry_out(fx);
    for _ in 0..130 {
        sim.mono += S(1);
        let fx = sim.core.tick(sim.now());
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::RestartGridd { .. })),
            "restarted at {:?} with a license announced",
            sim.mono
        );
        sim.carry_out(fx);
    }
    let fx = sim.answer_held(LICENSED);
    sim.carry_out(fx);
    sim.run(S(30));
    assert!(sim.world.restarts.is_empty(), "{:?}", sim.world.restarts);
    assert_eq!(sim.state(), State::Licensed);
}

/// A reading that shows the license comes as the grace ends, within the report gap of the
/// last report (which said "no license"): gridd is not restarted on that report, which is
/// no longer what the agent knows.
#[test]
fn a_license_read_as_the_grace_ends_is_not_restarted_on_the_report_before_it() {
    let mut sim = Sim::new(settings(), World::new(UNLICENSED));
    sim.run(S(100));
    // A reading starts; its answer is held back (readings 15 s apart without a license).
    sim.hold_next_reading();
    assert!(sim.mono < S(119), "{:?}", sim.mono);
    assert!(sim.world.restarts.is_empty(), "inside the grace");
    // The last report before the grace ends: no license.
    sim.mono = Duration::from_millis(119_990);
    let fx = sim.core.tick(sim.now());
    assert!(fx.iter().any(|e| matches!(e, Effect::Publish(_))), "{fx:?}");
    sim.carry_out(fx);
    assert_eq!(sim.state(), State::Unlicensed);
    // The reading answers, 30 ms later, past the grace: a license.
    sim.mono = Duration::from_millis(120_020);
    sim.world.smi = LICENSED.into();
    let fx = sim.answer_held(LICENSED);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::RestartGridd { .. })),
        "restarted on the report before the license"
    );
    sim.carry_out(fx);
    sim.run(S(30));
    assert!(sim.world.restarts.is_empty(), "{:?}", sim.world.restarts);
    assert_eq!(sim.state(), State::Licensed);
}

/// nvidia-smi shows a new lease before gridd's lines saying so arrive (gridd restarted for a
/// token just installed): the token failure the gridd before it logged is over, and the
/// report is licensed without a warning (a `status --wait` then exits 0).
#[test]
fn a_new_lease_ends_the_failure_logged_before_it() {
    let mut sim = Sim::new(settings(), World::new(UNLICENSED));
    // Stamped as journald stamps it (the agent reads `journalctl -o json`).
    let line = format!(
        "{} guest nvidia-gridd[100]: Unable to fetch the client configuration token file\n",
        sim.now().wall.to_rfc3339()
    );
    let mut events = Vec::new();
    journal::scan(line.as_bytes(), |e| events.push(e)).unwrap();
    sim.handle(Event::Gridd(Box::new(events.remove(0))));
    sim.run(S(5));
    assert_eq!(sim.reason(), Some(Reason::TokenMissing));
    sim.world.smi = LICENSED.into();
    sim.run(S(120));
    let r = sim.core.report().unwrap();
    assert_eq!(
        (r.state, r.exit_code),
        (State::Licensed, 0),
        "{:?}",
        r.failure
    );
}

/// A file copied beside the installed token minutes after the last nvidia-smi reading (a
/// licensed core reads it minutes apart) and refused: the warning is dated when the file was
/// refused, never before it was there.
#[test]
fn a_refused_token_is_dated_when_it_was_refused_not_at_the_last_reading() {
    use vgpu_license_model::install::{Aside, Change};
    use vgpu_license_model::time::LogTime;
    let mut sim = licensed_for_a_minute();
    sim.run(S(100));
    sim.world.adopt = || {
        Ok(Box::new(Outcome {
            dry_run: false,
            token_summary: "token: 1900 bytes".into(),
            changes: vec![Change::MoveStray {
                from: "/etc/nvidia/ClientConfigToken/new.tok".into(),
                to: "/var/lib/vgpu-license-agent/replaced/x/new.tok".into(),
                why: Aside::Refused {
                    why: "this is not a client configuration token".into(),
                    valid: false,
                },
            }],
            warnings: Vec::new(),
            restart: Restart::NotNeeded,
            restart_reason: None,
            restart_command: String::new(),
            kept_name: None,
        }))
    };
    let copied = vgpu_license_model::time::whole_secs(sim.now().wall);
    sim.handle(Event::TokenDirChanged);
    sim.run(S(1));
    let r = sim.core.report().unwrap();
    assert_eq!(sim.reason(), Some(Reason::TokenRejected), "{r:?}");
    let Some(LogTime::Utc(at)) = r.failure.as_ref().unwrap().at else {
        panic!("dated in UTC: {r:?}")
    };
    assert!(at >= copied, "dated {at}, refused at {copied}");
    // A heartbeat later the warning keeps its date.
    sim.run(HEARTBEAT + S(1));
    let f = sim.core.report().unwrap().failure.clone().unwrap();
    assert_eq!(f.reason, Reason::TokenRejected);
    assert_eq!(f.at, Some(LogTime::Utc(at)), "the date stays");
}

/// Licensed and quiet, nvidia-smi is the safety net, not the clock: every change that
/// matters comes with a line of gridd's or at a deadline the core knows, so it is read once
/// an hour (the config's `poll_licensed_seconds`, 3600 by default, as its comments say), at
/// that pace and not at the next heartbeat after it. A pace of the config's own is kept the
/// same way (it was 12 readings an hour, every 5 minutes, before; 60 in a lease's last hour).
#[test]
fn licensed_the_readings_come_at_the_licensed_pace() {
    let mut sim = licensed_for_a_minute();
    let pace = settings().service.poll_licensed;
    assert_eq!(pace, S(3600), "the default");
    let from = sim.world.smi_reads.len();
    sim.run(S(3 * 3600));
    let reads = &sim.world.smi_reads[from..];
    assert_eq!(reads.len(), 3, "one reading an hour: {reads:?}");
    for w in reads.windows(2) {
        assert_eq!(w[1] - w[0], pace, "{reads:?}");
    }
    // A pace of the config's own (here 7 minutes) is kept the same way.
    let mut s = settings();
    s.service.poll_licensed = S(420);
    let mut sim = Sim::new(s, World::new(LICENSED));
    sim.log(ACQUIRED);
    sim.run(S(60));
    let from = sim.world.smi_reads.len();
    sim.run(S(3600));
    let reads = &sim.world.smi_reads[from..];
    assert!(reads.len() >= 8, "{reads:?}");
    for w in reads.windows(2) {
        assert_eq!(w[1] - w[0], S(420), "{reads:?}");
    }
}

/// Licensed with 26 hours to the lease's expiry, gridd quiet: the start's reading, then the
/// hour's, and nothing between (the heartbeat remakes the report without one).
#[test]
fn licensed_with_a_day_left_nothing_is_read_between_the_starts_reading_and_the_hours() {
    let exp = t0() + chrono::Duration::hours(26);
    let mut sim = Sim::new(settings(), World::new(&licensed_until(exp)));
    sim.run(S(3600) - S(1));
    assert_eq!(sim.world.smi_reads, [S(0)], "only the start's");
    assert_eq!(sim.state(), State::Licensed);
    sim.run(S(2 * 3600));
    assert_eq!(sim.world.smi_reads, [S(0), S(3600), S(7200)]);
    assert_eq!(sim.reason(), None);
}

/// A 15-minute lease renewed every 2.5 minutes (a fastapi-dls's, as
/// tests/fixtures/samples/gridd-log-fastapi-dls-5-windows.txt shows): each renewal line
/// carries the new expiry and moves the lease with no reading, so its expiry is never
/// reached and nvidia-smi is read once an hour, not every minute of the lease's "last hour".
#[test]
fn a_short_lease_renewed_by_gridds_lines_is_read_once_an_hour() {
    let lease = chrono::Duration::minutes(15);
    let mut sim = Sim::new(settings(), World::new(&licensed_until(t0() + lease)));
    let mut last = t0() + lease;
    for _ in 0..(3 * 3600 / 150) {
        sim.run(S(150) - Duration::from_millis(200));
        last = sim.now().wall + lease;
        // nvidia-smi would show the renewed lease too.
        sim.world.smi = licensed_until(last);
        sim.log(&renewed_until(last));
    }
    // Three hours: the start's reading and one each hour after it.
    let reads = &sim.world.smi_reads;
    assert_eq!(reads.len(), 3, "the start's and one an hour: {reads:?}");
    for w in reads.windows(2) {
        assert!(w[1] - w[0] >= S(3600), "{reads:?}");
    }
    let r = sim.core.report().unwrap();
    // Licensed, and never a stalled renewal (a 15-minute lease always expires within the
    // expiry warning: that note is the lease's length, not a failure).
    assert_eq!((r.state, r.failure.as_ref()), (State::Licensed, None));
    assert_eq!(
        r.license.as_ref().and_then(|l| l.expiry),
        Some(vgpu_license_model::time::whole_secs(last)),
        "the last renewal's expiry, not the hour-old reading's"
    );
}

/// 50 minutes to the lease's expiry and gridd silent (no renewal line): the stall is warned
/// on time alone, and nvidia-smi is read at the expiry, the deadline by which gridd should
/// have logged a renewal, and not before; that reading shows the license gone.
#[test]
fn a_lease_near_its_end_with_gridd_silent_is_read_at_its_expiry_and_not_before() {
    let exp = t0() + chrono::Duration::minutes(50);
    let mut sim = Sim::new(settings(), World::new(&licensed_until(exp)));
    sim.run(S(30 * 60));
    assert_eq!(
        sim.reason(),
        Some(Reason::RenewalStalled),
        "warned without a reading"
    );
    sim.run(S(20 * 60) - S(1));
    assert_eq!(sim.world.smi_reads, [S(0)], "none before the expiry");
    // The driver shows the license gone once it expired.
    sim.world.smi = UNLICENSED.into();
    sim.run(S(5));
    assert_eq!(sim.world.smi_reads, [S(0), S(50 * 60) + AFTER_EXPIRY]);
    assert_eq!(sim.state(), State::Unlicensed);
}

/// What gridd says, and the driver pod's signs, are read within 2 s, licensed or not: a
/// failure line, gridd's unit stopping (its last line) and a change of the driver pod.
#[test]
fn a_failure_a_unit_stop_and_a_driver_pod_change_are_read_within_two_seconds() {
    type Happen = fn(&mut Sim);
    let cases: [(&str, Happen); 4] = [
        ("a failure line", |sim| sim.log(NETWORK)),
        ("the unit stopping", |sim| {
            sim.world.unit = Some(stopped("inactive"));
            sim.log("Shutdown (100)");
        }),
        // gridd killed outright says nothing; systemd's own line about its unit does.
        ("systemd's line about the unit", |sim| {
            sim.world.unit = Some(stopped("failed"));
            sim.handle(Event::GriddUnitLine);
        }),
        ("the driver pod", |sim| sim.handle(Event::DriverPodChanged)),
    ];
    for (what, happen) in cases {
        let mut sim = licensed_for_a_minute();
        sim.run(S(600));
        let at = sim.mono;
        let before = sim.world.smi_reads.len();
        happen(&mut sim);
        sim.run(S(2) - Duration::from_millis(200));
        let after = &sim.world.smi_reads[before..];
        assert!(
            after.first().is_some_and(|&t| t >= at && t <= at + S(2)),
            "{what}: read at {after:?}, happened at {at:?}"
        );
        if what == "systemd's line about the unit" {
            assert_eq!(
                sim.core
                    .report()
                    .and_then(|r| r.failure.as_ref().map(|f| f.reason)),
                Some(Reason::GriddNotRunning),
                "{what}"
            );
        }
    }
}

/// A flood of events (a driver pod's readiness marker made and removed in a loop: 100
/// changes in 10 s) costs about a reading a second, never nvidia-smi back to back.
#[test]
fn a_flood_of_driver_pod_events_is_read_about_once_a_second() {
    let mut sim = licensed_for_a_minute();
    sim.run(S(600));
    let start = sim.mono;
    let before = sim.world.smi_reads.len();
    for _ in 0..100 {
        let now = sim.now();
        let mut fx = sim.core.handle(Event::DriverPodChanged, now);
        fx.extend(sim.core.tick(now));
        sim.carry_out(fx);
        sim.run(Duration::from_millis(100));
    }
    assert_eq!(sim.mono, start + S(10));
    let reads = &sim.world.smi_reads[before..];
    assert!(
        (5..=11).contains(&reads.len()),
        "{} readings in 10 s: {reads:?}",
        reads.len()
    );
    for w in reads.windows(2) {
        assert!(w[1] - w[0] >= SMI_FLOOR, "back to back: {reads:?}");
    }
}

/// A file held open for writing in the token directory (an editor left open): nothing for two
/// minutes (a copy takes seconds), then named in the report's notes and counted in the
/// metrics, on the heartbeat's own wakeups; gone once its writer closes it.
#[test]
fn a_file_held_open_for_minutes_is_named_in_the_report_and_counted() {
    let mut sim = licensed_for_a_minute();
    let held_since = sim.now().wall;
    sim.world.held = vec![("notes.txt".into(), held_since)];
    sim.handle(sim.world.token_read());
    let named = |sim: &Sim| {
        sim.core
            .report()
            .unwrap()
            .notes
            .iter()
            .find(|n| n.contains("notes.txt"))
            .cloned()
    };
    let gauge = |sim: &Sim| {
        vgpu_license_model::report::metrics::render(sim.core.report().unwrap(), sim.core.counters())
            .lines()
            .find(|l| l.starts_with("vgpu_license_token_dir_held_writers "))
            .map(str::to_string)
    };
    sim.run(S(60));
    assert_eq!(named(&sim), None, "a minute is a copy's time");
    assert_eq!(
        gauge(&sim).as_deref(),
        Some("vgpu_license_token_dir_held_writers 0")
    );
    sim.run(S(180));
    let note = named(&sim).expect("named past two minutes");
    assert!(note.contains("fuser -v") && note.contains(" s)"), "{note}");
    assert_eq!(sim.state(), State::Licensed, "no verdict on the license");
    assert_eq!(
        gauge(&sim).as_deref(),
        Some("vgpu_license_token_dir_held_writers 1")
    );
    // Its writer closes it: the next look finds it no more.
    sim.world.held.clear();
    sim.handle(sim.world.token_read());
    assert_eq!(named(&sim), None);
    assert_eq!(
        gauge(&sim).as_deref(),
        Some("vgpu_license_token_dir_held_writers 0")
    );
}

/// A vGPU host's reading (`nvidia-smi vgpu -q`, as the host's samples lay it out): two VMs
/// whose guests hold no license, one of them throttled.
const HOST_UNLICENSED: &str = "GPU 00000000:41:00.0
    Active vGPUs                          : 2
    vGPU ID                               : 3251637554
        VM UUID                           : 083bc63f-0a3c-4647-9bb4-27f905b7d7bb
        VM Name                           : tenant-a_vm-a
        vGPU Name                         : NVIDIA L40S-24Q
        vGPU UUID                         : c47a3625-859f-11f1-84fe-7572c7d51d3e
        Guest Driver Version              : 580.105.08
        License Status                    : Unlicensed (Unrestricted)
    vGPU ID                               : 3251637566
        VM UUID                           : f0adb76f-7612-4c68-84b4-375a4e6c5476
        VM Name                           : tenant-b_vm-b
        vGPU Name                         : NVIDIA L40S-24Q
        vGPU UUID                         : 094593d6-85a0-11f1-802e-72c7d51d3e72
        Guest Driver Version              : 580.105.08
        License Status                    : Unlicensed (Restricted)
";

/// A world where a guest's agent would act at once: gridd's unit down (restarted at once),
/// a token owed a restart (adopted, then gridd restarted), a vague failure (probed).
fn world_that_asks_for_action(smi: &str) -> World {
    let mut w = World::new(smi);
    w.unit = Some(stopped("inactive"));
    w.adopt = || adopted_with(Restart::Due);
    w
}

/// On a vGPU host the agent changes nothing: its VMs unlicensed for an hour, one of them
/// throttled, it restarts nothing, adopts nothing, probes no DLS, and names no failure of a
/// guest's (no gridd, no token there); it reports each VM, and since when each is in its
/// state. The same world with a guest's reading makes it act, as a guest's agent must.
#[test]
fn a_host_whose_vms_are_unlicensed_for_an_hour_changes_nothing() {
    let mut sim = Sim::new(settings(), world_that_asks_for_action(HOST_UNLICENSED));
    sim.run(S(3600));
    assert!(sim.core.is_host());
    let r = sim.core.report().unwrap();
    assert_eq!(
        (r.role, r.state, r.exit_code),
        (vgpu_license_model::report::Role::Host, State::Restricted, 2)
    );
    assert!(r.failure.is_none(), "{:?}", r.failure);
    assert_eq!(
        sim.world.restarts,
        Vec::<Duration>::new(),
        "no RestartGridd on a host"
    );
    assert_eq!(
        sim.world.adopts,
        Vec::<Duration>::new(),
        "no Adopt on a host"
    );
    assert_eq!(
        sim.world.probes,
        Vec::<Duration>::new(),
        "no probe on a host"
    );
    // Each VM in its state since the first reading, an hour ago.
    let vms = r.vms.as_ref().unwrap();
    assert_eq!(vms.len(), 2);
    assert!(vms.iter().all(|v| v.since == Some(t0())), "{vms:?}");
    // A guest licensed: its since moves to the reading that showed it; the other's stays.
    sim.world.smi = HOST_UNLICENSED.replacen(
        "Unlicensed (Unrestricted)",
        "Licensed (Expiry: 2026-12-3 6:55:24 GMT)",
        1,
    );
    // The vGPU manager logs the change between two periodic readings (15 s apart): the
    // reading comes within two seconds of its line, not at the next periodic one.
    sim.run(S(5));
    sim.handle(Event::VgpuMgr);
    sim.run(S(2));
    let read_at = *sim.world.smi_reads.last().unwrap();
    assert!(read_at > S(3605) && read_at <= S(3607), "{read_at:?}");
    let vms = sim.core.report().unwrap().vms.clone().unwrap();
    assert_eq!(
        vms[0].since,
        Some(t0() + chrono::Duration::seconds(read_at.as_secs() as i64)),
        "the reading's time, in whole seconds"
    );
    assert_eq!(vms[1].since, Some(t0()));
    assert_eq!(sim.world.restarts, Vec::<Duration>::new());

    // The guest's own reading in the same world: restarted and adopted within the hour.
    let mut guest = Sim::new(settings(), world_that_asks_for_action(UNLICENSED));
    guest.run(S(3600));
    assert!(!guest.core.is_host());
    assert!(!guest.world.restarts.is_empty() && !guest.world.adopts.is_empty());
}

/// `service.role = "guest"`: a host's reading is not taken for a host (the report is then
/// the guest's, whatever it makes of it), and `"host"` is a host before any reading.
#[test]
fn the_role_in_the_config_decides_over_the_reading() {
    let mut s = settings();
    s.service.role = vgpu_license_model::config::ServiceRole::Guest;
    let sim = Sim::new(s, World::new(HOST_UNLICENSED));
    assert!(!sim.core.is_host());
    let mut s = settings();
    s.service.role = vgpu_license_model::config::ServiceRole::Host;
    let sim = Sim::new(s, World::new(HOST_UNLICENSED));
    assert!(sim.core.is_host());
}
