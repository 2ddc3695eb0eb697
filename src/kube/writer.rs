//! The writer of the Node condition, the acting half: it reads the clocks and the node's
//! uptime, sends what [`crate::model::node::writer`] decides, and tells the outcome.

use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Api, Session};
use crate::model::node::condition::{Condition, Outcome, TAINT_EFFECT, TAINT_KEY};
use crate::model::node::writer::{Action, Input, NodeWriter};
use crate::model::time::Now;

/// How long the node has been up (`/proc/uptime`); none when it cannot be read.
fn uptime() -> Option<Duration> {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Writes the condition `rx` holds whenever it changes and at least every heartbeat
/// (`kubernetes.heartbeat_seconds`), until `stop`; each outcome is told to `tell`. After a
/// failure it tries again with backoff ([`crate::model::node::writer::BACKOFF`]: 5 s,
/// doubling, at most 5 min).
pub async fn write_condition(
    api: Api,
    mut rx: watch::Receiver<Option<Condition>>,
    tell: impl Fn(Outcome),
    mut stop: watch::Receiver<bool>,
) {
    let mut writer = NodeWriter::new(api.heartbeat, api.taint);
    let mut sender = Sender {
        api,
        session: Session::default(),
    };
    let start = Instant::now();
    let now = || Now {
        mono: start.elapsed(),
        wall: Utc::now(),
    };
    loop {
        if let Some(up) = uptime() {
            writer.handle(Input::Uptime(up), now());
        }
        while let Some(action) = writer.poll(now()) {
            let input = match action {
                Action::ReadNode => Input::NodeRead(sender.read_node().await),
                Action::Patch(body) => Input::Patched(sender.patch(&body).await),
                Action::Taint(want) => Input::Tainted(sender.taint(want).await),
                Action::Done(outcome) => {
                    tell(outcome);
                    continue;
                }
            };
            writer.handle(input, now());
        }
        tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                if let Some(cond) = rx.borrow_and_update().clone() {
                    writer.handle(Input::Condition(cond), now());
                }
            }
            _ = tokio::time::sleep_until(start + writer.poll_timeout()) => {}
            _ = stop.changed() => return,
        }
    }
}

/// What sends the writer's actions to the API.
struct Sender {
    api: Api,
    session: Session,
}

impl Sender {
    /// The Node's condition: its status and `lastTransitionTime`, or none.
    async fn read_node(&mut self) -> Result<Option<(String, String)>, String> {
        let client = self
            .session
            .client(&self.api)
            .map_err(|e| format!("{e:#}"))?;
        self.api
            .current(&client)
            .await
            .map_err(|e| format!("{e:#}"))
    }

    /// Sends the condition's patch.
    async fn patch(&mut self, body: &serde_json::Value) -> Result<(), String> {
        let client = self
            .session
            .client(&self.api)
            .map_err(|e| format!("{e:#}"))?;
        self.api
            .patch(&client, body)
            .await
            .map_err(|e| format!("{e:#}"))
    }

    /// Puts the taint on (`want`) or takes it off, where the Node has it otherwise.
    async fn taint(&mut self, want: bool) -> Result<(), String> {
        let client = self
            .session
            .client(&self.api)
            .map_err(|e| format!("{e:#}"))?;
        let changed = (self.api.sync_taint(&client, want).await).map_err(|e| format!("{e:#}"))?;
        if changed {
            tracing::info!(
                "{} the taint {TAINT_KEY}:{TAINT_EFFECT} {} node {}",
                if want { "put" } else { "took" },
                if want { "on" } else { "off" },
                crate::model::text::escape(&self.api.node)
            );
        }
        Ok(())
    }
}
