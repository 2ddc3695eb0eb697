//! The last shutdown's lease: did nvidia-gridd return it to the DLS as it stopped? A guest
//! killed before gridd returns its lease (KubeVirt's 30 s grace period ran out, the network
//! went down first) keeps it held on the DLS until it expires, and a fleet's pool runs dry.
//! Read at start from the previous boot's journal; pure here.

use chrono::{DateTime, Utc};

use crate::observe::journal::GriddEvent;
use crate::report::EventKind;

/// The record's type is the report's vocabulary; named here too for the callers.
pub use crate::report::LastShutdown;

/// The record for gridd's lines of one boot (oldest first), or `None` when it held no
/// lease at the end (nothing could leak) or logged nothing.
pub fn judge(events: &[GriddEvent]) -> Option<LastShutdown> {
    use EventKind as K;
    let last = events.last()?;
    let at = |e: &GriddEvent| e.stamp.and_then(|s| s.utc());
    // Where the lease stood at the end: taken by the last acquire/renew, given back by a
    // return; a failed return leaves it held on the DLS.
    let mut held = false;
    let mut verdict: Option<&GriddEvent> = None;
    let mut shutdown_at: Option<DateTime<Utc>> = None;
    for e in events {
        match e.what.kind {
            K::Acquired | K::Renewed => {
                held = true;
                verdict = None;
                shutdown_at = None;
            }
            K::Returned => {
                held = false;
                verdict = Some(e);
            }
            K::ReturnFailed => verdict = Some(e),
            K::Shutdown => shutdown_at = shutdown_at.or(at(e)),
            _ => {}
        }
    }
    let stop_seconds = match (shutdown_at, at(last)) {
        (Some(a), Some(b)) if b >= a => Some((b - a).num_milliseconds() as f64 / 1000.0),
        _ => None,
    };
    let record = |returned: bool, message: &str| LastShutdown {
        at: at(last).map(crate::time::whole_secs),
        lease_returned: returned,
        message: message.to_string(),
        stop_seconds,
    };
    match verdict {
        Some(e) if e.what.kind == K::Returned => Some(record(true, &e.message)),
        Some(e) => Some(record(false, &e.message)),
        None if held => Some(record(false, &last.message)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str) -> Vec<GriddEvent> {
        let mut v = Vec::new();
        crate::observe::journal::scan(text.as_bytes(), |e| v.push(e)).unwrap();
        v
    }

    const ACQ: &str = "2026-11-29T10:00:00+0000 g nvidia-gridd[5]: License acquired successfully. (Info: dls.example, NVIDIA RTX Virtual Workstation; Expiry: 2026-11-30 10:0:0 GMT)\n";

    #[test]
    fn a_returned_lease_a_failed_return_and_a_leaked_one() {
        let ok = events(&format!(
            "{ACQ}2026-11-29T18:00:00+0000 g nvidia-gridd[5]: Shutdown (5)\n\
             2026-11-29T18:00:01+0000 g nvidia-gridd[5]: License returned successfully. (Info: dls.example)\n\
             2026-11-29T18:00:02+0000 g nvidia-gridd[5]: End Logging\n"
        ));
        let r = judge(&ok).unwrap();
        assert!(r.lease_returned);
        assert_eq!(
            r.at.map(crate::time::rfc3339).as_deref(),
            Some("2026-11-29T18:00:02Z")
        );
        assert_eq!(r.stop_seconds, Some(2.0));

        let failed = events(&format!(
            "{ACQ}2026-11-29T18:00:00+0000 g nvidia-gridd[5]: Failed to return license to dls.example (Error: Generic network communication failure)\n"
        ));
        let r = judge(&failed).unwrap();
        assert!(!r.lease_returned);
        assert!(r.message.starts_with("Failed to return license"));

        // Killed while holding it: gridd said nothing more.
        let r = judge(&events(ACQ)).unwrap();
        assert!(!r.lease_returned);

        // No lease, nothing to return.
        assert_eq!(
            judge(&events(
                "2026-11-29T10:00:00+0000 g nvidia-gridd[5]: Started (5)\n"
            )),
            None
        );
        assert_eq!(judge(&[]), None);
    }
}
