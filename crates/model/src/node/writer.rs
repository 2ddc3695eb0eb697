//! The Node writer's decisions, pure: whether a condition is written (again), the
//! `lastTransitionTime` it carries, when the opt-in taint is owed, and the backoff after a
//! failed write. No clock, no `/proc`, no I/O: the writer (the agent's `kube`) passes the moment
//! and the node's uptime, sends what is decided, and tells the result back.
//!
//! One write is, in this order: [`NodeWriter::take`] (a condition from the service, or the
//! wait ran out), then where [`NodeWriter::condition_due`]: the Node's condition read once
//! ([`NodeWriter::needs_node`], [`NodeWriter::node_read`]), the patch with
//! [`NodeWriter::transition`], [`NodeWriter::condition_written`]; then, unless the condition's
//! patch failed, the taint where [`NodeWriter::taint_owed`] ([`NodeWriter::taint_written`]);
//! last [`NodeWriter::settle`], and the next wait is [`NodeWriter::next_write`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::backoff::Backoff;
use crate::node::condition::{Condition, Outcome, TYPE, wants_taint};
use crate::time::{Now, rfc3339};

/// The waits after failed writes: 5 s, doubling, at most 5 min.
pub const BACKOFF: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));

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
        }
    }

    /// When to write next without a change (monotonic): the retry after a failure, else a
    /// heartbeat from `now`.
    pub fn next_write(&self, now: Now) -> Duration {
        self.retry_at.unwrap_or(now.mono + self.heartbeat)
    }

    /// The condition to show at `now`, from the service (`changed`) or because the wait ran
    /// out: whether to write. A change the Node holds already, with no retry owed, is not
    /// written again; a status that changed takes `now` as its transition time.
    pub fn take(&mut self, cond: &Condition, changed: bool, now: Now) -> bool {
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
    pub fn condition_due(&self, cond: &Condition, now: Now) -> bool {
        !self
            .written
            .as_ref()
            .is_some_and(|w| w.cond == *cond && now.mono.saturating_sub(w.at) < self.heartbeat)
    }

    /// Whether the Node's condition must be read before the patch (once: then it is known).
    pub fn needs_node(&self) -> bool {
        self.known.is_none()
    }

    /// The Node's condition as read: its status and `lastTransitionTime`, or none.
    pub fn node_read(&mut self, current: Option<(String, String)>) {
        self.known = Some(current);
    }

    /// The condition's `lastTransitionTime`: the time the Node shows where it shows this
    /// status already (what this writer wrote last, else what the Node had when first read:
    /// a change that never reached it, or an agent restarted), else when the status changed.
    pub fn transition(&self, cond: &Condition) -> String {
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

    /// The condition's patch went through at `now`, with this `transition`.
    pub fn condition_written(&mut self, cond: &Condition, transition: String, now: Now) {
        self.written = Some(Written {
            cond: cond.clone(),
            at: now.mono,
            transition,
        });
    }

    /// The taint to write, on or off, where it is kept and what it should be changed since
    /// the agent last made it: a taint taken off by hand stays off until the license changes
    /// again. On only for an unlicensed vGPU on a node up past the settling time (`uptime`).
    pub fn taint_owed(&self, cond: &Condition, uptime: Duration) -> Option<bool> {
        let want = wants_taint(cond, uptime);
        (self.taint && self.tainted != Some(want)).then_some(want)
    }

    /// The taint is now as `want` says.
    pub fn taint_written(&mut self, want: bool) {
        self.tainted = Some(want);
    }

    /// What a write leaves at `now`: a try again after the backoff where a part of it failed,
    /// else the backoff from its start.
    pub fn settle(&mut self, outcome: &Outcome, now: Now) {
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
pub fn patch(c: &Condition, transition: &str, heartbeat: DateTime<Utc>) -> Value {
    json!({"status": {"conditions": [{
        "type": TYPE,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": rfc3339(heartbeat),
    }]}})
}
