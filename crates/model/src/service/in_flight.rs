//! Work running off the service's loop, so that nothing is started twice, and the
//! questions to systemd about gridd's unit, one at a time ([`super::unit::GriddUnit`] asks
//! them).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Work running off the loop, so that nothing is started twice.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    pub(super) adopt: bool,
    /// A restart of the agent's own runs: why (said with its result, in one line).
    pub(super) restart: Option<String>,
    /// How many of the agent's own restarts have ended, and how many had when the adoption
    /// in flight began: one that asks for a restart read what the agent owed before a
    /// restart that ended meanwhile, which may have paid it.
    pub(super) restarts_ended: u64,
    pub(super) adopt_after: u64,
    pub(super) probe: bool,
    /// The token directory is being read.
    pub(super) token: bool,
    /// Since when (the latest read, and the latest adoption): how long a look takes sets the
    /// gap before the next one a burst of changes asks for ([`super::look_gap`]).
    pub(super) token_since: Duration,
    pub(super) adopt_since: Duration,
    /// It changed again while it was being read: read it once more when the answer comes.
    pub(super) token_again: bool,
}

/// Asking systemd whether gridd's unit runs, one question at a time, each with its number.
/// One rule says which answers count: "not running" is believed only if its question was
/// asked after gridd's last start and after the end of the agent's own last restart of it,
/// and no restart or adoption of the agent's own runs as it comes. Otherwise it may predate
/// the start, or be the agent's own doing between its stop and its start: it is set aside
/// and the question asked again once that work is over.
#[derive(Debug, Default)]
pub(super) struct UnitQuestion {
    /// The newest question's number (0: none asked yet).
    pub(super) asked: u64,
    /// The newest question is on its way.
    pub(super) in_flight: bool,
    /// The number of the first question asked after gridd's last start or the end of the
    /// agent's own last restart: answers to older ones may predate it.
    pub(super) fresh_from: u64,
    /// A question wanted while one was on its way: asked when that one is answered.
    pub(super) wanted: u64,
    /// A question wanted once the agent's own work is over.
    pub(super) wanted_after_own: u64,
    /// The process whose life answers the question on its way (see
    /// [`super::Core::running_gridd`]).
    pub(super) vouched: Option<u32>,
    /// When the newest question was sent: a line of gridd's logged well before it is in its
    /// answer.
    pub(super) asked_at: Option<DateTime<Utc>>,
}

impl UnitQuestion {
    /// A question is wanted: whether to send one now (none on its way); else it is asked
    /// once the one on its way is answered.
    pub(super) fn ask(&mut self) -> bool {
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
    pub(super) fn settled(&self) -> bool {
        !self.in_flight && self.asked >= self.fresh_from && self.wanted_after_own <= self.asked
    }

    /// gridd started, or the agent's own restart of it ended: from now on.
    pub(super) fn gridd_moved(&mut self) {
        self.fresh_from = self.asked + 1;
    }

    /// Ask again once the agent's own work is over.
    pub(super) fn after_own_work(&mut self) {
        self.wanted_after_own = self.asked + 1;
    }

    /// Whether a question is owed now, with the agent's own work running or not.
    pub(super) fn owed(&self, own_work: bool) -> bool {
        !own_work && self.wanted_after_own > self.asked
    }

    /// The answer to the question on its way: whether it is believed, and whether to ask
    /// again now.
    pub(super) fn answered(&mut self, not_running: bool, own_work: bool) -> (bool, bool) {
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
    pub(super) fn own_work(&self) -> bool {
        self.restart.is_some() || self.adopt
    }
}
