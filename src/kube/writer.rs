//! The writer of the Node condition: when to write, what `lastTransitionTime` to send, the
//! opt-in taint, and the backoff after failures.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Api, Session};
use crate::node_condition::{Condition, Outcome, TYPE};

/// The longest wait between two tries after failures.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// How long the node has been up (`/proc/uptime`); zero when it cannot be read.
fn uptime() -> Duration {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    crate::time::rfc3339(t)
}

/// The patch that sets the condition, merged by its type.
fn body(c: &Condition, transition: &str, heartbeat: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": TYPE,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": heartbeat,
    }]}})
}

/// Writes the condition `rx` holds whenever it changes and at least every heartbeat
/// (`kubernetes.heartbeat_seconds`),
/// until `stop`; each outcome is told to `tell`. After a failure it tries again with backoff
/// (5 s, doubling, at most 5 min).
pub async fn write_condition(
    api: Api,
    mut rx: watch::Receiver<Option<Condition>>,
    tell: impl Fn(Outcome),
    mut stop: watch::Receiver<bool>,
) {
    let mut node = NodeWriter {
        api,
        session: Session::default(),
        written: None,
        since: None,
        known: None,
        tainted: None,
        backoff: Duration::from_secs(5),
        retry_at: None,
    };
    loop {
        let wait = node.next_write();
        let changed = tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
            _ = tokio::time::sleep_until(wait) => false,
            _ = stop.changed() => return,
        };
        let Some(cond) = rx.borrow_and_update().clone() else {
            continue;
        };
        node.note(&cond);
        if changed && node.holds(&cond) {
            continue;
        }
        let outcome = node.write(&cond).await;
        node.settle(&outcome);
        tell(outcome);
    }
}

/// The status the Node should show, and since when (`lastTransitionTime`, RFC 3339).
struct Since {
    status: &'static str,
    at: String,
}

/// The writer's view of its Node: what it wrote, what the Node had, and when to try again.
struct NodeWriter {
    api: Api,
    session: Session,
    /// The condition last written, when, and its `lastTransitionTime`: what the Node shows.
    written: Option<(Condition, tokio::time::Instant, String)>,
    /// The status to show and since when: taken when the status changes, kept across
    /// failed tries, so that `lastTransitionTime` is the change's time, not a retry's.
    since: Option<Since>,
    /// What the Node has: its condition's status and last transition (read once, then kept).
    known: Option<Option<(String, String)>>,
    /// Whether the Node carries the taint, as the agent last made it (`None`: not known).
    tainted: Option<bool>,
    backoff: Duration,
    retry_at: Option<tokio::time::Instant>,
}

impl NodeWriter {
    /// When to write next without a change: the retry after a failure, else the heartbeat.
    fn next_write(&self) -> tokio::time::Instant {
        match self.retry_at {
            Some(t) => t,
            None => tokio::time::Instant::now() + self.api.heartbeat,
        }
    }

    /// Whether the Node holds this condition already, with no retry owed.
    fn holds(&self, cond: &Condition) -> bool {
        let same = self.written.as_ref().is_some_and(|(w, _, _)| w == cond);
        same && self.retry_at.is_none()
    }

    /// A condition to show: its status's time is taken now where the status changed.
    fn note(&mut self, cond: &Condition) {
        if self.since.as_ref().is_none_or(|s| s.status != cond.status) {
            self.since = Some(Since {
                status: cond.status,
                at: rfc3339(Utc::now()),
            });
        }
    }

    /// The condition's `lastTransitionTime`: the time the Node shows where it shows this
    /// status already (what this writer wrote last, else what the Node had when first read:
    /// a change that never reached it, or an agent restarted), else when the status changed.
    fn transition(&mut self, cond: &Condition) -> String {
        self.note(cond);
        let shown = match &self.written {
            Some((w, _, at)) => Some((w.status, at.as_str())),
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

    /// Writes the condition (unless the Node holds it and no heartbeat is due) and the
    /// taint (where it is kept and owed).
    async fn write(&mut self, cond: &Condition) -> Outcome {
        let fresh = self
            .written
            .as_ref()
            .is_some_and(|(w, at, _)| w == cond && at.elapsed() < self.api.heartbeat);
        let condition = if fresh {
            None
        } else {
            let result = self.write_condition(cond).await;
            Some(
                result
                    .map(|transition| {
                        self.written =
                            Some((cond.clone(), tokio::time::Instant::now(), transition));
                    })
                    .map_err(|e| format!("{e:#}")),
            )
        };
        let taint = if matches!(condition, Some(Err(_))) {
            None
        } else {
            self.keep_taint(cond).await
        };
        Outcome { condition, taint }
    }

    /// Patches the condition: its `lastTransitionTime`.
    async fn write_condition(&mut self, cond: &Condition) -> anyhow::Result<String> {
        let client = self.session.client(&self.api)?;
        if self.known.is_none() {
            self.known = Some(self.api.current(&client).await?);
        }
        let transition = self.transition(cond);
        let now = rfc3339(Utc::now());
        self.api
            .patch(&client, &body(cond, &transition, &now))
            .await?;
        Ok(transition)
    }

    /// The taint, only when what it should be changed: a taint taken off by hand stays off
    /// until the license changes again. `None` where nothing was owed.
    async fn keep_taint(&mut self, cond: &Condition) -> Option<(bool, Result<(), String>)> {
        let want = self.api.taint && crate::node_condition::wants_taint(cond, uptime());
        if !self.api.taint || self.tainted == Some(want) {
            return None;
        }
        let synced = match self.session.client(&self.api) {
            Ok(client) => self.api.sync_taint(&client, want).await,
            Err(e) => Err(e),
        };
        let result = match synced {
            Ok(changed) => {
                if changed {
                    tracing::info!(
                        "{} the taint {}:{} {} node {}",
                        if want { "put" } else { "took" },
                        crate::node_condition::TAINT_KEY,
                        crate::node_condition::TAINT_EFFECT,
                        if want { "on" } else { "off" },
                        crate::text::escape(&self.api.node)
                    );
                }
                self.tainted = Some(want);
                Ok(())
            }
            Err(e) => Err(format!("{e:#}")),
        };
        Some((want, result))
    }

    /// What a write leaves: a try again after the backoff where a part of it failed.
    fn settle(&mut self, outcome: &Outcome) {
        if outcome.failed() {
            self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        } else {
            self.backoff = Duration::from_secs(5);
            self.retry_at = None;
        }
    }
}
