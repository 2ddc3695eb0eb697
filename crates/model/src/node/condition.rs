//! The license as Kubernetes shows a node's health: the Node condition `VgpuLicensed`, made
//! from the report. Pure: the API writer (the agent's `kube`) sends it.
//!
//! `status`: `True` licensed, `False` unlicensed, restricted, failing or without a driver,
//! `Unknown` when the agent cannot tell; a node with nothing to license (`no_gpu`,
//! `not_licensable`) gets none. `reason` is the report's reason in the API's CamelCase
//! (`Licensed`, `TokenExpired`, `DlsUnreachable` ...), `message` the status line with the
//! edition and the lease's expiry.

pub use crate::config::node_name_problem;
use crate::report::{Reason, Report, State};

/// The condition's type.
pub const TYPE: &str = "VgpuLicensed";

/// One condition as the agent would write it (its times are the writer's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: String,
    pub message: String,
    /// The vGPU is unlicensed or restricted (what the opt-in taint keeps work off for); a
    /// node without a driver, or that the agent cannot read, is not.
    pub unlicensed: bool,
}

/// The opt-in taint's key and effect (`kubernetes.taint_unlicensed`).
pub const TAINT_KEY: &str = "vgpu-license-agent/unlicensed";
pub const TAINT_EFFECT: &str = "NoSchedule";

/// How long after boot an unlicensed vGPU is still taken for gridd's first acquisition
/// rather than a failure: no taint before.
pub const TAINT_SETTLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether the node should carry the taint: unlicensed past the settling time after boot
/// (`uptime`).
pub fn wants_taint(c: &Condition, uptime: std::time::Duration) -> bool {
    c.unlicensed && uptime >= TAINT_SETTLE
}

/// The Node's `spec.taints` with the agent's taint there or not (`want`), every other taint
/// as it was; `None` when nothing changes.
pub fn taints(current: &[serde_json::Value], want: bool) -> Option<Vec<serde_json::Value>> {
    let ours = |t: &serde_json::Value| t["key"] == TAINT_KEY && t["effect"] == TAINT_EFFECT;
    let has = current.iter().any(ours);
    if has == want {
        return None;
    }
    let mut out: Vec<serde_json::Value> = current.iter().filter(|t| !ours(t)).cloned().collect();
    if want {
        out.push(serde_json::json!({"key": TAINT_KEY, "effect": TAINT_EFFECT}));
    }
    Some(out)
}

/// `token_expired` -> `TokenExpired`.
pub fn camel(code: &str) -> String {
    code.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The condition a report means, or `None` where there is nothing to license.
pub fn of(report: &Report, status_line: &str) -> Option<Condition> {
    // A vGPU host holds no license of its own: its VMs' licenses go to their VMIs as
    // Events, never to the host's Node (one tenant's VM would gate the whole node).
    if report.role == crate::report::Role::Host {
        return None;
    }
    let reason = report.failure.as_ref().map(|f| f.reason);
    let (status, reason) = match report.state {
        State::NoGpu | State::NotLicensable => return None,
        // A warning (an expiring lease, a refused rotation) leaves the license held.
        State::Licensed => ("True", "Licensed".to_string()),
        State::Unknown => (
            "Unknown",
            reason.map_or("Unknown".into(), |r| camel(r.as_str())),
        ),
        State::NoDriver => (
            "False",
            camel(reason.unwrap_or(Reason::DriverUnavailable).as_str()),
        ),
        State::Unlicensed | State::Restricted => (
            "False",
            reason.map_or_else(|| camel(report.state.as_str()), |r| camel(r.as_str())),
        ),
    };
    let mut message = status_line.to_string();
    // The failure's message, where the status line does not carry it already.
    if let Some(f) = report
        .failure
        .as_ref()
        .filter(|f| !status_line.contains(&f.message))
    {
        message.push_str(": ");
        message.push_str(&f.message);
    }
    // The API caps a condition's message at 32 KiB; a line says enough.
    if message.len() > 1024 {
        let mut cut = 1024;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    Some(Condition {
        status,
        reason,
        message,
        unlicensed: matches!(report.state, State::Unlicensed | State::Restricted),
    })
}

/// What one write did: the condition's patch and the taint's, each where it was tried
/// (`None`: not tried this time), so that the service says which failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub condition: Option<Result<(), String>>,
    /// Whether the taint was to be on, and how its write went.
    pub taint: Option<(bool, Result<(), String>)>,
}

impl Outcome {
    pub fn failed(&self) -> bool {
        matches!(self.condition, Some(Err(_))) || matches!(self.taint, Some((_, Err(_))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_is_an_rfc_1123_subdomain() {
        for good in ["gpu-worker-1", "node.example.com", "a", "10.0.0.5"] {
            assert_eq!(node_name_problem(good), None, "{good}");
        }
        for bad in [
            "..",
            ".",
            "",
            "Node1",
            "-a",
            "a-",
            "a..b",
            "a/b",
            "status/../x",
            "a b",
        ] {
            assert!(node_name_problem(bad).is_some(), "{bad}");
        }
        assert!(node_name_problem(&"a".repeat(254)).is_some());
    }

    #[test]
    fn the_taint_is_added_and_removed_leaving_every_other_taint() {
        let gpu = serde_json::json!({"key": "nvidia.com/gpu", "effect": "NoSchedule"});
        let ours = serde_json::json!({"key": TAINT_KEY, "effect": TAINT_EFFECT});
        // Another effect under our key is someone else's.
        let other_effect = serde_json::json!({"key": TAINT_KEY, "effect": "NoExecute"});
        let added = taints(&[gpu.clone(), other_effect.clone()], true).unwrap();
        assert_eq!(added, vec![gpu.clone(), other_effect.clone(), ours.clone()]);
        assert_eq!(taints(&added, true), None);
        let removed = taints(&added, false).unwrap();
        assert_eq!(removed, vec![gpu.clone(), other_effect]);
        assert_eq!(taints(&[gpu], false), None);
        let c = |unlicensed| Condition {
            status: "False",
            reason: "Unlicensed".into(),
            message: String::new(),
            unlicensed,
        };
        assert!(!wants_taint(
            &c(true),
            TAINT_SETTLE - std::time::Duration::from_secs(1)
        ));
        assert!(wants_taint(&c(true), TAINT_SETTLE));
        assert!(!wants_taint(&c(false), TAINT_SETTLE * 10));
    }

    #[test]
    fn reasons_are_camel_case() {
        assert_eq!(camel("token_expired"), "TokenExpired");
        assert_eq!(camel("dls_unreachable"), "DlsUnreachable");
        assert_eq!(camel("restricted"), "Restricted");
        assert_eq!(camel("cuda_not_licensed"), "CudaNotLicensed");
        for r in Reason::ALL {
            let c = camel(r.as_str());
            assert!(c.chars().next().unwrap().is_ascii_uppercase() && !c.contains('_'));
        }
    }
}
