//! nvidia-smi's readings: one at a time, at their pace or sooner when something happened,
//! never back to back. What a reading shows is [`super::seen::Seen`]'s to judge, and its
//! pace too ([`super::seen::Seen::smi_pace`]); when the next one starts is decided here.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Now, SMI_FLOOR};

/// The readings of nvidia-smi: the one running, and when the next is due.
#[derive(Debug, Default)]
pub(super) struct Readings {
    /// The next reading at its pace (the licensed or unlicensed poll), or an hour away while
    /// a reading runs (a hung nvidia-smi is killed at its time limit).
    pace: Option<Duration>,
    /// The next reading soon because something happened: brought forward, never put back,
    /// and kept across a reading already running (it may show the license from before).
    soon: Option<Duration>,
    /// A reading runs: nothing more is asked of nvidia-smi until it answers.
    pub(super) running: bool,
    /// When the last reading answered (monotonic): the next starts [`SMI_FLOOR`] after it at
    /// the soonest, whatever asks.
    pub(super) answered_at: Option<Duration>,
    /// When the last reading was started (the system's clock, as gridd's lines are dated),
    /// and on the monotonic clock.
    pub(super) started: Option<DateTime<Utc>>,
    pub(super) began: Duration,
}

impl Readings {
    /// The first reading at the service's start (`now`).
    pub(super) fn new(now: Duration) -> Readings {
        Readings {
            pace: Some(now),
            ..Readings::default()
        }
    }

    /// The next reading at its pace at `at`.
    pub(super) fn set_pace(&mut self, at: Duration) {
        self.pace = Some(at);
    }

    /// nvidia-smi read by `at` at the latest, because something happened: brought forward,
    /// never put back.
    pub(super) fn soon(&mut self, at: Duration) {
        self.soon = Some(self.soon.map_or(at, |was| was.min(at)));
    }

    /// When nvidia-smi is next read: its pace, or sooner for an event; never sooner than
    /// [`SMI_FLOOR`] after the last answer, so that no flood of events runs it back to back.
    pub(super) fn next(&self) -> Option<Duration> {
        let due = [self.pace, self.soon].into_iter().flatten().min()?;
        Some(self.answered_at.map_or(due, |a| due.max(a + SMI_FLOOR)))
    }

    /// Whether the next reading is due at `now`.
    pub(super) fn due(&self, now: Duration) -> bool {
        self.next().is_some_and(|t| now >= t)
    }

    /// A reading starts, unless one runs (then `false`): nothing more is asked of nvidia-smi
    /// until it answers.
    pub(super) fn start(&mut self, now: Now) -> bool {
        if std::mem::replace(&mut self.running, true) {
            return false;
        }
        self.pace = Some(now.mono + Duration::from_secs(3600));
        self.soon = None;
        self.started = Some(now.wall);
        self.began = now.mono;
        true
    }

    /// The reading answered at `now`. Something gridd said while it ran (a restart) keeps the
    /// reading it asked for: this one may show the license from before it (an event's
    /// earlier reading, asked meanwhile, stays: see [`Readings::soon`]).
    pub(super) fn answered(&mut self, now: Duration) {
        self.running = false;
        self.answered_at = Some(now);
    }
}
