//! When each periodic or owed piece of the service's work is next due.

use super::*;

/// When each periodic or owed piece of work is next due (monotonic times).
#[derive(Debug)]
pub(super) struct Schedule {
    /// nvidia-smi's next reading.
    pub(super) smi: Duration,
    /// `smi` was brought forward by an event (not the periodic reading).
    pub(super) smi_for_event: bool,
    /// When the last reading was started (the system's clock, as gridd's lines are dated).
    pub(super) smi_started: Option<DateTime<Utc>>,
    /// systemd is asked about gridd's unit next (while no license is held).
    pub(super) unit: Duration,
    /// The same vague failure may be probed again.
    pub(super) probe: Duration,
    /// The token directory is looked at again, in case a change escaped the watcher.
    pub(super) adopt: Duration,
    /// `adopt` is the deadline of a restart owed for a new token (the budget or the backoff
    /// said wait): the service wakes for it, licensed or not.
    pub(super) adopt_owed: bool,
    /// `adopt` is the first look after the start: it keeps its own time too (later ones
    /// come on the heartbeat's wakeups).
    pub(super) adopt_first: bool,
    /// A look at the token directory owed for changes seen during the last one: when.
    pub(super) token_read: Option<Duration>,
}

impl Schedule {
    /// nvidia-smi read by `at` at the latest, because something happened: brought forward,
    /// never put back.
    pub(super) fn smi_soon(&mut self, at: Duration) {
        if at < self.smi {
            self.smi = at;
            self.smi_for_event = true;
        }
    }
}
