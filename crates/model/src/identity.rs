//! A guest's identity (what tells this machine from another) and the clone found at boot,
//! as values. No I/O: the agent's `identity` reads, records and compares them.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::text::show_path;

/// What tells this machine from another.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    pub machine_id: Option<String>,
    pub product_uuid: Option<String>,
    pub macs: Vec<String>,
}

/// A clone found at boot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloneDetected {
    #[serde(with = "crate::time::rfc3339_secs")]
    pub at: DateTime<Utc>,
    pub old: Identity,
    pub new: Identity,
    /// Where gridd's client state went.
    pub moved_to: Option<PathBuf>,
}

impl CloneDetected {
    /// The event's text.
    pub fn message(&self) -> String {
        let show = |o: &Option<String>| o.clone().unwrap_or_else(|| "unknown".into());
        let moved = match &self.moved_to {
            Some(p) => format!(
                "nvidia-gridd's client state was moved aside to {}",
                show_path(p)
            ),
            None => "nvidia-gridd had no client state to move aside".into(),
        };
        format!(
            "this guest's identity changed since the last boot (product UUID {} -> {}, machine-id {} -> {}): a clone or a restored snapshot; {moved}, so that it registers with the DLS as a client of its own",
            show(&self.old.product_uuid),
            show(&self.new.product_uuid),
            show(&self.old.machine_id),
            show(&self.new.machine_id),
        )
    }
}
impl Identity {
    /// Whether `self` (now) is another machine than `old`: the product UUID or the
    /// machine-id changed (one that was unknown before does not count).
    pub fn is_another_machine_than(&self, old: &Identity) -> bool {
        let changed =
            |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(a), Some(b)) if a != b);
        changed(&self.product_uuid, &old.product_uuid) || changed(&self.machine_id, &old.machine_id)
    }
}
