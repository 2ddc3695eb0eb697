//! When each periodic or owed piece of the service's work is next due: a table of named
//! timers (monotonic times), in place of deadlines whose meaning flags changed, and which of
//! them wake the service, and when ([`Schedule::wake`], for [`super::Core::next_wake`]):
//! nvidia-smi's turn ([`super::readings::Readings`]) keeps its own time, the owed ones wake
//! it at once, the periodic look rides on the heartbeat's wakeups.

use std::time::Duration;

use super::{ADOPT_UNWATCHED, ADOPT_WATCHED, BUSY_TICK};

/// The service's timers, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
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

/// The timers' deadlines (`None`: not set).
#[derive(Debug, Default)]
pub(super) struct Schedule {
    at: [Option<Duration>; TIMERS],
}

impl Schedule {
    /// The timers at the service's start (`now`): the readings and the questions at once,
    /// the first look at the token `first_look` later.
    pub(super) fn at_start(now: Duration, first_look: Duration) -> Schedule {
        let mut s = Schedule::default();
        for t in [Timer::Unit, Timer::Probe] {
            s.set(t, now);
        }
        for t in [Timer::Look, Timer::FirstLook] {
            s.set(t, now + first_look);
        }
        s
    }

    /// Whether the timer is due: if so, it is stopped.
    pub(super) fn take(&mut self, t: Timer, now: Duration) -> bool {
        let due = self.due(t, now);
        if due {
            self.stop(t);
        }
        due
    }

    /// A look at the token directory at its deadline: the first and an owed one are done,
    /// and the periodic one is next due in half an hour where the directory is watched (in
    /// half a minute where not). Whether an adoption was owed.
    pub(super) fn looked(&mut self, now: Duration, watching: bool) -> bool {
        let owed = self.at(Timer::Owed).is_some();
        self.stop(Timer::Owed);
        self.stop(Timer::FirstLook);
        let every = if watching {
            ADOPT_WATCHED
        } else {
            ADOPT_UNWATCHED
        };
        self.set(Timer::Look, now + every);
        owed
    }

    /// When the service next wakes, but for the token's looks: at nvidia-smi's turn
    /// (`reading`), which keeps its own time (the licensed pace is the config's, poll_licensed_seconds, "every
    /// hour", or the lease's expiry, not the next heartbeat after it), and at the `beat`.
    /// Without a license or with a failure (`remedy`: `Some`, with the restart's next
    /// deadline, grace or backoff), at a unit check or a probe too: the next step comes at
    /// one of these deadlines, each known; in between, nothing changes with time alone that a
    /// heartbeat late would matter for (a lease's or a token's warning, a notice's end). At
    /// most one `heartbeat` away and at least [`BUSY_TICK`].
    pub(super) fn wake(
        &self,
        now: Duration,
        reading: Option<Duration>,
        beat: Duration,
        heartbeat: Duration,
        remedy: Option<Option<Duration>>,
    ) -> Duration {
        let mut at = reading.map_or(beat, |smi| beat.min(smi));
        if let Some(remedy) = remedy {
            let ahead = |t: Duration| (t > now).then_some(t);
            for t in [self.at(Timer::Unit), self.at(Timer::Probe), remedy]
                .into_iter()
                .flatten()
                .filter_map(ahead)
            {
                at = at.min(t);
            }
        }
        at.clamp(now + BUSY_TICK, now + heartbeat)
    }

    /// The service's next wakeup `wake`, brought forward for the token: a look owed for
    /// changes seen during the last one, and, while a restart is owed for a new token (made
    /// when the journal said it would be) or the first look waits (it keeps its own time),
    /// the looks' deadlines, whichever comes first. The periodic look alone comes on the
    /// heartbeat's wakeups, at most one heartbeat late.
    pub(super) fn with_token_looks(&self, mut wake: Duration, now: Duration) -> Duration {
        if self.at(Timer::Owed).is_some() || self.at(Timer::FirstLook).is_some() {
            let looks = self.earliest(&[Timer::Look, Timer::FirstLook, Timer::Owed]);
            wake = looks.map_or(wake, |t| wake.min(t.max(now)));
        }
        self.at(Timer::TokenRead)
            .map_or(wake, |t| wake.min(t.max(now)))
    }

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

    /// The earliest deadline among `timers` (those set).
    pub(super) fn earliest(&self, timers: &[Timer]) -> Option<Duration> {
        timers.iter().filter_map(|&t| self.at(t)).min()
    }
}
