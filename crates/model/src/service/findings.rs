//! The failures the service has reported: since when each of the agent's own findings holds,
//! and which failure was last logged and counted, so that each is said once.

use chrono::{DateTime, Utc};
use tracing::warn;

use crate::report::{Finding, Reason, Report, message_ids};

/// A finding, and since when it holds.
type Held = Option<(Finding, DateTime<Utc>)>;

/// What the service remembers of the failures it reported.
#[derive(Debug, Default)]
pub(super) struct Findings {
    /// The failure last logged (and counted), so that each is logged once.
    logged: Option<Finding>,
    /// The agent's own finding, and since when it holds.
    own_since: Held,
    /// A finding of what the agent sees (no driver, a stale Secret), and since when the
    /// service has reported it.
    seen: Held,
}

impl Findings {
    /// The agent's own finding at `now`: it holds since it was first seen, not since this
    /// moment.
    pub(super) fn own(&mut self, own: Option<&Finding>, now: DateTime<Utc>) {
        match (own, &self.own_since) {
            (Some(o), Some((k, _))) if o == k => {}
            (Some(o), _) => self.own_since = Some((o.clone(), now)),
            (None, _) => self.own_since = None,
        }
    }

    /// Since when a finding of what the agent sees holds (the report's `failure.at`, one
    /// journal line per streak): from the first report that made it.
    pub(super) fn seen_in(&mut self, report: &Report, now: DateTime<Utc>) {
        let seen = report
            .failure
            .as_ref()
            .filter(|f| matches!(f.reason, Reason::DriverUnavailable | Reason::TokenStale));
        self.seen = match (seen, self.seen.take()) {
            (Some(f), Some(((r, m), at))) if f.reason == r && f.message == m => Some(((r, m), at)),
            (Some(f), _) => Some((
                (f.reason, f.message.clone()),
                match f.at {
                    Some(crate::time::LogTime::Utc(at)) => at,
                    _ => now,
                },
            )),
            (None, _) => None,
        };
    }

    /// The report's failure, when it is new: logged with its catalog entry, and its reason
    /// given to be counted. One that is `premature` (no token before the token source is
    /// read) is neither, nor remembered.
    pub(super) fn new_failure(&mut self, report: &Report, premature: bool) -> Option<Reason> {
        let key = report.failure.as_ref().map(|f| {
            (
                f.reason,
                format!(
                    "{}|{}",
                    f.message,
                    f.at.map(|a| a.to_string()).unwrap_or_default()
                ),
            )
        });
        let mut new = None;
        if let Some(f) = &report.failure
            && key != self.logged
            && !premature
        {
            new = Some(f.reason);
            warn!(
                message_id = message_ids::for_reason(f.reason),
                vgpu_license_reason = f.reason.as_str(),
                "{}: {} -> {}",
                f.reason.as_str(),
                crate::text::escape(&f.message),
                crate::text::escape(&f.advice)
            );
        }
        if !premature {
            self.logged = key;
        }
        new
    }

    /// Since when the agent's own finding holds, and the finding of what it sees.
    pub(super) fn since(&self) -> (Held, Held) {
        (self.own_since.clone(), self.seen.clone())
    }
}
