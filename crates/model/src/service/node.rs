//! On a Kubernetes node: where the driver runs, the Node condition's writes and the
//! licensing Secret.

use tracing::{info, warn};

use super::{Core, Effect, Now};
use crate::node::{Mode, Node};

/// The writes to the Node (the condition, the opt-in taint): whether each fails, so that
/// a streak of failures is one warning, and its end one line.
#[derive(Debug, Default)]
pub(super) struct NodeWrites {
    /// The last write of the Node condition failed.
    condition_failing: bool,
    /// A write of the opt-in taint fails.
    taint_failing: bool,
}

impl NodeWrites {
    /// A write to the Node: a failure of the condition's patch or of the taint's is a
    /// warning naming which (once per streak of each in the journal). How many parts failed.
    pub(super) fn written(&mut self, outcome: crate::node::condition::Outcome) -> u64 {
        use crate::node::condition::{TAINT_EFFECT, TAINT_KEY, TYPE};
        let mut failed = 0;
        if let Some(result) = outcome.condition {
            let what = format!("the Node condition {TYPE}");
            failed += part(
                result,
                &what,
                &mut self.condition_failing,
                "was not written",
            );
        }
        if let Some((want, result)) = outcome.taint {
            let what = format!("the taint {TAINT_KEY}:{TAINT_EFFECT}");
            let says = if want {
                "could not be put on the Node"
            } else {
                "could not be taken off the Node"
            };
            failed += part(result, &what, &mut self.taint_failing, says);
        }
        failed
    }
}

/// One part of a Node write: `failing` is its streak's flag. 1 when it failed.
fn part(result: Result<(), String>, what: &str, failing: &mut bool, failed: &str) -> u64 {
    match result {
        Ok(()) => {
            if std::mem::take(failing) {
                info!("{what} is written again");
            }
            0
        }
        Err(why) => {
            if !std::mem::replace(failing, true) {
                warn!(
                    "{what} {failed} (retried with backoff): {}",
                    crate::text::escape(&why)
                );
            }
            1
        }
    }
}

impl Core {
    /// Where the driver runs, as just looked at: on a change, the settings of the new place
    /// and a reading there at once.
    pub(super) fn node_seen(&mut self, node: Node, now: Now, fx: &mut Vec<Effect>) {
        if node == self.node {
            return;
        }
        let moved = node.driver_root != self.node.driver_root || node.mode != self.node.mode;
        // The operator's driver pod came or went (its marker): its root, its token, changed.
        let pod_changed = node.driver_ready != self.node.driver_ready;
        if moved {
            match &node.driver_root {
                Some(root) => info!(
                    "GPU Operator node: the driver runs in the operator's driver container (root {}); observing only",
                    crate::text::show_path(root)
                ),
                None if node.mode == Mode::Observe => {
                    info!("service.mode = \"observe\": observing only")
                }
                None => {}
            }
            if node.manage_refused {
                warn!(
                    "service.mode = \"manage\" is refused on a GPU Operator node (the operator owns the token, gridd.conf and gridd): observing only"
                );
            }
        }
        self.settings = node.apply(&self.base);
        self.node = node;
        self.published.dirty = true;
        if moved || pod_changed {
            self.readings.soon(now.mono);
            self.read_token(now, fx);
        }
    }
}
