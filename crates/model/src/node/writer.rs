//! The Node writer's decisions, pure: whether a condition is written (again), the
//! `lastTransitionTime` it carries, when the opt-in taint is owed, and the backoff after a
//! failed write. No clock, no `/proc`, no I/O: the writer (the agent's `kube`) drives it as
//! quinn-proto's `Connection` is driven. What happens goes in with [`NodeWriter::handle`]
//! (a condition from the service, the node's uptime, the answer to an action); what to do
//! comes out of [`NodeWriter::poll`], until it says nothing more, and
//! [`NodeWriter::poll_timeout`] says when to poll again if nothing happens before.
//!
//! One write is, in this order: the Node's condition read once ([`Action::ReadNode`]), where
//! the condition's patch is due; the patch ([`Action::Patch`]); then, unless the condition's
//! patch failed, the taint where it is owed ([`Action::Taint`]); last its outcome, for the
//! service ([`Action::Done`]). Each action but the last waits for its answer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::backoff::Backoff;
use crate::node::condition::{Condition, Outcome, TYPE, wants_taint};
use crate::time::{Now, rfc3339};

/// The waits after failed writes: 5 s, doubling, at most 5 min.
pub const BACKOFF: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));

/// What the writer is told, with the moment it happened ([`NodeWriter::handle`]).
#[derive(Debug, Clone)]
pub enum Input {
    /// The condition the service wants on the Node now (it changed).
    Condition(Condition),
    /// How long the node has been up, read now (`/proc/uptime`); until it is told, zero.
    Uptime(Duration),
    /// The answer to [`Action::ReadNode`]: the Node's condition (status and
    /// `lastTransitionTime`, or none), or why it could not be read.
    NodeRead(Result<Option<(String, String)>, String>),
    /// The answer to [`Action::Patch`].
    Patched(Result<(), String>),
    /// The answer to [`Action::Taint`].
    Tainted(Result<(), String>),
}

/// What the writer asks of the API, one at a time ([`NodeWriter::poll`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Read the Node's condition; answer [`Input::NodeRead`].
    ReadNode,
    /// Send this status patch (the condition, merged by its type); answer [`Input::Patched`].
    Patch(Value),
    /// Put the taint on (`true`) or take it off; answer [`Input::Tainted`].
    Taint(bool),
    /// A write is over: how it went, for the service. No answer.
    Done(Outcome),
}

/// The status the Node should show, and since when (`lastTransitionTime`, RFC 3339).
#[derive(Debug, Clone)]
struct Since {
    status: &'static str,
    at: String,
}

/// The condition last written, when (monotonic), and its `lastTransitionTime`.
#[derive(Debug, Clone)]
struct Written {
    cond: Condition,
    at: Duration,
    transition: String,
}

/// Where a write stands: the action to ask next, or the answer it waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    ReadNode,
    Patch,
    Taint,
    Done,
    /// An action was asked; its answer moves the write on.
    Waiting,
}

/// A write under way: the condition, what is done of it, and its outcome so far.
#[derive(Debug, Clone)]
struct Write {
    cond: Condition,
    step: Step,
    /// The `lastTransitionTime` of the patch sent.
    transition: String,
    /// The taint asked for.
    want: bool,
    outcome: Outcome,
}

/// The writer's view of its Node: what it wrote, what the Node had, and when to try again.
#[derive(Debug, Clone)]
pub struct NodeWriter {
    /// `lastHeartbeatTime` is refreshed at least this often.
    heartbeat: Duration,
    /// Whether the opt-in taint is kept (`kubernetes.taint_unlicensed`).
    taint: bool,
    /// What the Node shows, as this writer last wrote it.
    written: Option<Written>,
    /// The status to show and since when: taken when the status changes, kept across
    /// failed tries, so that `lastTransitionTime` is the change's time, not a retry's.
    since: Option<Since>,
    /// What the Node has: its condition's status and last transition (read once, then kept).
    known: Option<Option<(String, String)>>,
    /// Whether the Node carries the taint, as the agent last made it (`None`: not known).
    tainted: Option<bool>,
    backoff: Backoff,
    /// The retry owed after a failure (monotonic).
    retry_at: Option<Duration>,
    /// The condition the service last sent, and whether it came since the last turn.
    current: Option<Condition>,
    changed: bool,
    /// When to write without a change (monotonic): the retry, else the heartbeat.
    wake: Duration,
    /// The node's uptime as last told, and when (monotonic).
    uptime: Option<(Duration, Duration)>,
    write: Option<Write>,
}

impl NodeWriter {
    pub fn new(heartbeat: Duration, taint: bool) -> NodeWriter {
        NodeWriter {
            heartbeat,
            taint,
            written: None,
            since: None,
            known: None,
            tainted: None,
            backoff: BACKOFF,
            retry_at: None,
            current: None,
            changed: false,
            wake: heartbeat,
            uptime: None,
            write: None,
        }
    }

    /// What happened at `now`: a condition from the service, the node's uptime, or the
    /// answer to the action [`NodeWriter::poll`] asked last.
    pub fn handle(&mut self, input: Input, now: Now) {
        match (input, self.write.as_mut()) {
            (Input::Condition(cond), _) => {
                self.current = Some(cond);
                self.changed = true;
            }
            (Input::Uptime(up), _) => self.uptime = Some((now.mono, up)),
            // An answer with no write under way: nothing asked for it.
            (_, None) => {}
            (Input::NodeRead(Ok(current)), Some(w)) => {
                self.known = Some(current);
                w.step = Step::Patch;
            }
            (Input::NodeRead(Err(e)) | Input::Patched(Err(e)), Some(w)) => {
                w.outcome.condition = Some(Err(e));
                w.step = Step::Done;
            }
            (Input::Patched(Ok(())), Some(w)) => {
                self.written = Some(Written {
                    cond: w.cond.clone(),
                    at: now.mono,
                    transition: w.transition.clone(),
                });
                w.outcome.condition = Some(Ok(()));
                w.step = Step::Taint;
            }
            (Input::Tainted(result), Some(w)) => {
                if result.is_ok() {
                    self.tainted = Some(w.want);
                }
                w.outcome.taint = Some((w.want, result));
                w.step = Step::Done;
            }
        }
    }

    /// What to do at `now`, if anything: the next action of the write under way (none while
    /// it waits for an answer), else a write where a condition came or the wait ran out.
    pub fn poll(&mut self, now: Now) -> Option<Action> {
        if self.write.is_none() {
            self.turn(now);
        }
        let mut w = self.write.take()?;
        let action = match w.step {
            Step::Waiting | Step::Done => None,
            Step::ReadNode => Some(Action::ReadNode),
            Step::Patch => {
                w.transition = self.transition(&w.cond);
                Some(Action::Patch(patch(&w.cond, &w.transition, now.wall)))
            }
            Step::Taint => self.taint_owed(&w.cond, self.uptime_at(now)).map(|want| {
                w.want = want;
                Action::Taint(want)
            }),
        };
        if action.is_some() {
            w.step = Step::Waiting;
        }
        if w.step == Step::Waiting {
            self.write = Some(w);
            return action;
        }
        // Nothing more to ask: the write is over.
        self.settle(&w.outcome, now);
        self.wake = self.next_write(now);
        Some(Action::Done(w.outcome))
    }

    /// When to poll again if nothing is handled before (monotonic): the retry after a
    /// failure, else the heartbeat. A write under way moves on with its answers, not the time.
    pub fn poll_timeout(&self) -> Duration {
        self.wake
    }

    /// A turn of the writer at `now`, where a condition came or the wait ran out: a write
    /// starts where one is owed.
    fn turn(&mut self, now: Now) {
        if !self.changed && now.mono < self.wake {
            return;
        }
        let changed = std::mem::take(&mut self.changed);
        self.wake = self.next_write(now);
        let Some(cond) = self.current.clone() else {
            return;
        };
        if !self.take(&cond, changed, now) {
            return;
        }
        let step = match (self.condition_due(&cond, now), self.known.is_none()) {
            (true, true) => Step::ReadNode,
            (true, false) => Step::Patch,
            (false, _) => Step::Taint,
        };
        self.write = Some(Write {
            cond,
            step,
            transition: String::new(),
            want: false,
            outcome: Outcome {
                condition: None,
                taint: None,
            },
        });
    }

    /// The node's uptime at `now`, from what it was when told (zero where never told).
    fn uptime_at(&self, now: Now) -> Duration {
        self.uptime
            .map_or(Duration::ZERO, |(at, up)| up + now.mono.saturating_sub(at))
    }

    /// When to write next without a change (monotonic): the retry after a failure, else a
    /// heartbeat from `now`.
    fn next_write(&self, now: Now) -> Duration {
        self.retry_at.unwrap_or(now.mono + self.heartbeat)
    }

    /// The condition to show at `now`, from the service (`changed`) or because the wait ran
    /// out: whether to write. A change the Node holds already, with no retry owed, is not
    /// written again; a status that changed takes `now` as its transition time.
    fn take(&mut self, cond: &Condition, changed: bool, now: Now) -> bool {
        if self.since.as_ref().is_none_or(|s| s.status != cond.status) {
            self.since = Some(Since {
                status: cond.status,
                at: rfc3339(now.wall),
            });
        }
        let held = self.written.as_ref().is_some_and(|w| w.cond == *cond);
        !(changed && held && self.retry_at.is_none())
    }

    /// Whether the condition's patch is owed at `now`: not where this writer wrote the same
    /// condition less than a heartbeat ago (a retry of the taint alone).
    fn condition_due(&self, cond: &Condition, now: Now) -> bool {
        !self
            .written
            .as_ref()
            .is_some_and(|w| w.cond == *cond && now.mono.saturating_sub(w.at) < self.heartbeat)
    }

    /// The condition's `lastTransitionTime`: the time the Node shows where it shows this
    /// status already (what this writer wrote last, else what the Node had when first read:
    /// a change that never reached it, or an agent restarted), else when the status changed.
    fn transition(&self, cond: &Condition) -> String {
        let shown = match &self.written {
            Some(w) => Some((w.cond.status, w.transition.as_str())),
            None => self
                .known
                .as_ref()
                .and_then(|k| k.as_ref())
                .map(|(s, at)| (s.as_str(), at.as_str())),
        };
        match shown {
            Some((status, at)) if status == cond.status && !at.is_empty() => at.to_string(),
            _ => self
                .since
                .as_ref()
                .map_or_else(String::new, |s| s.at.clone()),
        }
    }

    /// The taint to write, on or off, where it is kept and what it should be changed since
    /// the agent last made it: a taint taken off by hand stays off until the license changes
    /// again. On only for an unlicensed vGPU on a node up past the settling time (`uptime`).
    fn taint_owed(&self, cond: &Condition, uptime: Duration) -> Option<bool> {
        let want = wants_taint(cond, uptime);
        (self.taint && self.tainted != Some(want)).then_some(want)
    }

    /// What a write leaves at `now`: a try again after the backoff where a part of it failed,
    /// else the backoff from its start.
    fn settle(&mut self, outcome: &Outcome, now: Now) {
        if outcome.failed() {
            self.retry_at = Some(now.mono + self.backoff.failed());
        } else {
            self.backoff.reset();
            self.retry_at = None;
        }
    }
}

/// The patch that sets the condition, merged by its type; `heartbeat` is the time of the
/// write.
fn patch(c: &Condition, transition: &str, heartbeat: DateTime<Utc>) -> Value {
    json!({"status": {"conditions": [{
        "type": TYPE,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": rfc3339(heartbeat),
    }]}})
}
