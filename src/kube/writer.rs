//! The writer of the Node condition, the acting half: it reads the clocks and the node's
//! uptime, sends what [`crate::model::node::writer`] decides, and tells the outcome.

use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Api, Session};
use crate::model::node::condition::{Condition, Outcome};
use crate::model::node::writer::NodeWriter;
use crate::model::time::Now;

/// How long the node has been up (`/proc/uptime`); zero when it cannot be read.
fn uptime() -> Duration {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

/// Writes the condition `rx` holds whenever it changes and at least every heartbeat
/// (`kubernetes.heartbeat_seconds`),
/// until `stop`; each outcome is told to `tell`. After a failure it tries again with backoff
/// ([`crate::model::node::writer::BACKOFF`]: 5 s, doubling, at most 5 min).
pub async fn write_condition(
    api: Api,
    mut rx: watch::Receiver<Option<Condition>>,
    tell: impl Fn(Outcome),
    mut stop: watch::Receiver<bool>,
) {
    let mut node = Sender {
        writer: NodeWriter::new(api.heartbeat, api.taint),
        api,
        session: Session::default(),
        start: Instant::now(),
    };
    loop {
        let wait = node.start + node.writer.next_write(node.now());
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
        if !node.writer.take(&cond, changed, node.now()) {
            continue;
        }
        let outcome = node.write(&cond).await;
        node.writer.settle(&outcome, node.now());
        tell(outcome);
    }
}

/// The decisions, and what sends them to the API.
struct Sender {
    writer: NodeWriter,
    api: Api,
    session: Session,
    /// The origin of the writer's monotonic time.
    start: Instant,
}

impl Sender {
    fn now(&self) -> Now {
        Now {
            mono: self.start.elapsed(),
            wall: Utc::now(),
        }
    }

    /// Writes the condition where it is due, and the taint where it is owed.
    async fn write(&mut self, cond: &Condition) -> Outcome {
        let condition = if self.writer.condition_due(cond, self.now()) {
            Some(
                self.write_condition(cond)
                    .await
                    .map_err(|e| format!("{e:#}")),
            )
        } else {
            None
        };
        let taint = if matches!(condition, Some(Err(_))) {
            None
        } else {
            self.keep_taint(cond).await
        };
        Outcome { condition, taint }
    }

    /// Patches the condition, the Node's own read first where it is not known yet.
    async fn write_condition(&mut self, cond: &Condition) -> anyhow::Result<()> {
        let client = self.session.client(&self.api)?;
        if self.writer.needs_node() {
            let current = self.api.current(&client).await?;
            self.writer.node_read(current);
        }
        let transition = self.writer.transition(cond);
        let body = crate::model::node::writer::patch(cond, &transition, Utc::now());
        self.api.patch(&client, &body).await?;
        self.writer.condition_written(cond, transition, self.now());
        Ok(())
    }

    /// The taint, where it is owed. `None` where nothing was owed.
    async fn keep_taint(&mut self, cond: &Condition) -> Option<(bool, Result<(), String>)> {
        let want = self.writer.taint_owed(cond, uptime())?;
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
                        crate::model::node::condition::TAINT_KEY,
                        crate::model::node::condition::TAINT_EFFECT,
                        if want { "on" } else { "off" },
                        crate::model::text::escape(&self.api.node)
                    );
                }
                self.writer.taint_written(want);
                Ok(())
            }
            Err(e) => Err(format!("{e:#}")),
        };
        Some((want, result))
    }
}
