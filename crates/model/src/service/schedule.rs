//! When each periodic or owed piece of the service's work is next due: a table of named
//! timers (monotonic times), in place of deadlines whose meaning flags changed. Which of
//! them wake the service, and when, is [`super::Core::next_wake`]'s: nvidia-smi's keeps its
//! own time, the owed ones wake it at once, the periodic look rides on the heartbeat's
//! wakeups.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Now, SMI_FLOOR};

/// The service's timers, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// nvidia-smi's next reading at its pace (the licensed or unlicensed poll), or an hour
    /// away while a reading runs (a hung nvidia-smi is killed at its time limit).
    Smi,
    /// nvidia-smi read soon because something happened: brought forward, never put back,
    /// and kept across a reading already running (it may show the license from before).
    SmiSoon,
    /// systemd is asked about gridd's unit next (while no license is held).
    Unit,
    /// The same vague failure may be probed again.
    Probe,
    /// The token directory's periodic look, in case a change escaped the watcher: it comes
    /// on the heartbeat's wakeups, at most one heartbeat late.
    Look,
    /// The first look after the start: it keeps its own time.
    FirstLook,
    /// An adoption owed (a restart the budget or the backoff said to wait for, a writer
    /// settling, the gap after a look in a burst): the service wakes for it, licensed or not.
    Owed,
    /// A look at the token directory owed for changes seen during the last one.
    TokenRead,
}

/// How many timers there are.
const TIMERS: usize = Timer::TokenRead as usize + 1;

/// The timers' deadlines (`None`: not set), and when the last reading was started and
/// answered.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    at: [Option<Duration>; TIMERS],
    /// When the last reading answered (monotonic): the next starts [`SMI_FLOOR`] after it
    /// at the soonest, whatever asks.
    pub(super) smi_answered: Option<Duration>,
    /// When the last reading was started (the system's clock, as gridd's lines are dated),
    /// and on the monotonic clock.
    pub(super) smi_started: Option<DateTime<Utc>>,
    pub(super) smi_began: Duration,
}

impl Schedule {
    /// The timer's deadline.
    pub(super) fn at(&self, t: Timer) -> Option<Duration> {
        self.at[t as usize]
    }

    pub(super) fn set(&mut self, t: Timer, at: Duration) {
        self.at[t as usize] = Some(at);
    }

    /// Brought forward to `at`, never put back.
    pub(super) fn set_earlier(&mut self, t: Timer, at: Duration) {
        let slot = &mut self.at[t as usize];
        *slot = Some(slot.map_or(at, |was| was.min(at)));
    }

    pub(super) fn stop(&mut self, t: Timer) {
        self.at[t as usize] = None;
    }

    /// Whether the timer is set and its deadline has come.
    pub(super) fn due(&self, t: Timer, now: Duration) -> bool {
        self.at(t).is_some_and(|at| now >= at)
    }

    /// Whether any of `timers` is due.
    pub(super) fn any_due(&self, timers: &[Timer], now: Duration) -> bool {
        timers.iter().any(|&t| self.due(t, now))
    }

    /// nvidia-smi read by `at` at the latest, because something happened: brought forward,
    /// never put back.
    pub(super) fn smi_soon(&mut self, at: Duration) {
        self.set_earlier(Timer::SmiSoon, at);
    }

    /// When nvidia-smi is next read: its pace, or sooner for an event; never sooner than
    /// [`SMI_FLOOR`] after the last answer, so that no flood of events runs it back to back.
    pub(super) fn smi(&self) -> Option<Duration> {
        let due = [self.at(Timer::Smi), self.at(Timer::SmiSoon)]
            .into_iter()
            .flatten()
            .min()?;
        Some(self.smi_answered.map_or(due, |a| due.max(a + SMI_FLOOR)))
    }

    /// A reading starts: nothing more is asked of nvidia-smi until it answers.
    pub(super) fn smi_started(&mut self, now: Now) {
        self.set(Timer::Smi, now.mono + Duration::from_secs(3600));
        self.stop(Timer::SmiSoon);
        self.smi_started = Some(now.wall);
        self.smi_began = now.mono;
    }

    /// The earliest deadline among `timers` (those set).
    pub(super) fn earliest(&self, timers: &[Timer]) -> Option<Duration> {
        timers.iter().filter_map(|&t| self.at(t)).min()
    }
}
