//! gridd's unit as the service knows it: systemd's last answer that counts, and the
//! questions to systemd, one at a time ([`UnitQuestion`]).

use chrono::{DateTime, Utc};

use super::in_flight::UnitQuestion;
use crate::observe::unit::UnitState;
use crate::report::EventKind;

/// What systemd last said of gridd's unit, and the questions asked of it.
#[derive(Debug, Default)]
pub(super) struct GriddUnit {
    /// systemd's last answer that was believed (`None`: none yet, systemd could not say, or
    /// a "not running" voided by gridd's start since).
    state: Option<UnitState>,
    pub(super) question: UnitQuestion,
}

impl GriddUnit {
    /// systemd's last word.
    pub(super) fn state(&self) -> Option<&UnitState> {
        self.state.as_ref()
    }

    /// systemd's last word is that gridd's unit does not run.
    pub(super) fn down(&self) -> bool {
        self.state.as_ref().is_some_and(|u| !u.running())
    }

    /// systemd's last word is that gridd's unit does not exist.
    pub(super) fn missing(&self) -> bool {
        self.state.as_ref().is_some_and(UnitState::missing)
    }

    /// gridd logged its start: a "not running" said before it is void until systemd answers
    /// again, so that no report meanwhile calls the new gridd down (nor restarts it).
    pub(super) fn started(&mut self) {
        self.question.gridd_moved();
        if self.down() {
            self.state = None;
        }
    }

    /// A line of gridd's (`kind`) logged after systemd's last answer: a start voids a "not
    /// running" said before it. Whether to ask again: a start, a stop, or any line while
    /// gridd was said down.
    pub(super) fn after_line(&mut self, kind: EventKind) -> bool {
        if kind == EventKind::Started {
            self.started();
        }
        matches!(kind, EventKind::Started | EventKind::Shutdown) || self.down()
    }

    /// A restart or adoption of the agent's own is over (`restarted`: gridd was restarted, or
    /// the attempt made; `own_work`: other work of the agent's own still runs): whether to
    /// ask now, a "not running" answer set aside while it ran being checked again.
    pub(super) fn own_work_ended(&mut self, restarted: bool, own_work: bool) -> bool {
        if restarted {
            self.question.gridd_moved();
        }
        self.question.owed(own_work)
    }

    /// A question is wanted at `now`: whether to send it now. `gridd_pid`: the process that
    /// logged gridd's latest line, which answers in systemd's stead while it runs, when
    /// systemd's last word is that gridd runs and nothing moved since.
    pub(super) fn ask(&mut self, gridd_pid: Option<u32>, now: DateTime<Utc>) -> bool {
        let up = self.state.as_ref().is_some_and(UnitState::running);
        let running = (up && self.question.settled())
            .then_some(gridd_pid)
            .flatten();
        if !self.question.ask() {
            return false;
        }
        self.question.vouched = running;
        self.question.asked_at = Some(now);
        true
    }

    /// systemd's answer: believed unless the agent's own work was under way. Whether to ask
    /// again now.
    pub(super) fn answered(&mut self, u: Option<UnitState>, own_work: bool) -> bool {
        let not_running = u.as_ref().is_some_and(|u| !u.running());
        let (believed, again) = self.question.answered(not_running, own_work);
        if believed {
            self.state = u;
        }
        again
    }
}
