//! What the agent does about each failure reason, in one table: whether a restart of gridd
//! can clear it, whether the agent's own DLS probe can say more, which `diagnose` checks
//! already show it, and how telling it is. Every caller (the restart decision, the probe, the
//! failure selection, `diagnose`) asks here, so that they cannot disagree.

use crate::report::Reason;

/// How much a failure of a reason says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// It names nothing specific (`unspecified`, `other`): a later specific line of the same
    /// gridd process replaces it, it never replaces an earlier specific one.
    Generic,
    /// It names the cause.
    Specific,
}

/// The policy of one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A new attempt by gridd may clear it: restarting gridd is worth it (after the grace).
    pub restart_helps: bool,
    /// The agent's DLS probe (DNS, TCP, TLS, HTTPS Date) may name the cause more precisely.
    pub probe_refines: bool,
    /// The probe cannot name another cause but measures this one (the clock's skew against
    /// the DLS, for the skew gauge and its alert): it runs, at a slower pace.
    pub probe_measures: bool,
    /// The `diagnose` checks whose failure already says what this reason says.
    pub diagnose_checks: &'static [&'static str],
    pub severity: Severity,
}

const DLS_CHECKS: &[&str] = &["dls-dns", "dls-tcp", "dls-tls", "dls-https"];

/// The table.
pub fn of(reason: Reason) -> Policy {
    use Reason as R;
    use Severity::{Generic, Specific};
    let (restart_helps, probe_refines, diagnose_checks, severity): (_, _, &[&str], _) = match reason
    {
        // A restart changes nothing here: the token, the DLS's pool, the GPU, the clock or
        // the config must change first. The checks say which.
        R::TokenMissing | R::TokenInvalid | R::TokenExpired => (false, false, &["token"], Specific),
        // The platform delivers a bad token: its rotation must be fixed where it is made.
        R::TokenSourceRejected => (false, false, &["token-source"], Specific),
        // The installed token holds; the refused file is named, with why.
        R::TokenRejected => (false, false, &["token-dir"], Specific),
        // gridd holds the token its pod started with; only a new pod copies the Secret.
        R::TokenStale => (false, false, &[], Specific),
        // The application's word for the license: what the agent finds on the guest
        // (`status`) names the cause; the application's log alone cannot.
        R::CudaNotLicensed => (false, false, &[], Specific),
        // The driver must answer first: a restart of gridd cannot load it.
        R::DriverUnavailable => (false, false, &["driver"], Specific),
        // gridd's own word: the probe only measures by how much (see `probe_measures`).
        R::ClockSkew => (false, false, &["clock"], Specific),
        R::NoLicenseAvailable | R::TrustedStore | R::LicensingUnsupported => {
            (false, false, &[], Specific)
        }
        R::FeatureTypeInvalid => (false, false, &["gridd.conf"], Specific),
        // The network may come back: gridd tries again when restarted; the probe says
        // which step (DNS, TCP, TLS) fails.
        R::DlsUnreachable => (true, true, DLS_CHECKS, Specific),
        R::GriddNotRunning => (true, false, &["gridd"], Specific),
        // The lease still holds: a restart would return it and, with the DLS lost, leave
        // the guest with none. Reported, with the time it runs out.
        R::RenewalStalled => (false, false, &[], Specific),
        // gridd said nothing specific: a new attempt may succeed, and the probe may find
        // the cause (a closed port, a skewed clock) that gridd did not name.
        R::Unspecified | R::Other => (true, true, &[], Generic),
    };
    Policy {
        restart_helps,
        probe_refines,
        probe_measures: reason == R::ClockSkew,
        diagnose_checks,
        severity,
    }
}

/// Whether a restart of gridd can clear the current failure (`None`: no failure, but no
/// license either: gridd is stuck acquiring).
pub fn restart_helps(reason: Option<Reason>) -> bool {
    reason.is_none_or(|r| of(r).restart_helps)
}

/// Whether the DLS probe may say more than the current failure (`None`: no license and no
/// reason given).
pub fn probe_refines(reason: Option<Reason>) -> bool {
    reason.is_none_or(|r| of(r).probe_refines)
}

/// Whether gridd's failure `reason` explains why gridd is not running, better than "not
/// running" does: a specific cause that a restart cannot clear (gridd exits on a token it
/// rejects, on a GPU it cannot license). The report then gives the cause, and gridd is not
/// restarted for nothing; a restart follows from fixing it (a new token is adopted with one).
pub fn explains_exit(reason: Reason) -> bool {
    let p = of(reason);
    p.severity == Severity::Specific && !p.restart_helps
}

/// Whether a failure of reason `new` from the same gridd process replaces the current
/// failure `old`: a generic line never hides a specific one before it.
pub fn replaces(old: Reason, new: Reason) -> bool {
    of(new).severity >= of(old).severity
}

/// The agent's own failure, of the two it finds itself: the installed token's problem, else
/// gridd's unit not running, unless gridd's last failure (`log`) explains why it exited
/// ([`explains_exit`]). Each caller carries what it knows of a failure as `T`.
pub fn own_failure<T>(token: Option<T>, unit_down: Option<T>, log: Option<Reason>) -> Option<T> {
    token.or_else(|| unit_down.filter(|_| !log.is_some_and(explains_exit)))
}

/// Which failure is the most telling, the one a report gives: the agent's own
/// ([`own_failure`]), else the DLS probe's finding where gridd's failure says nothing
/// specific ([`probe_refines`]; `None` before a probe), else gridd's failure from its log,
/// with its reason. `status`, `diagnose`, `analyze` and the service all choose here.
pub fn most_telling<T>(own: Option<T>, probe: Option<T>, log: Option<(Reason, T)>) -> Option<T> {
    let log_reason = log.as_ref().map(|(r, _)| *r);
    own.or_else(|| probe.filter(|_| probe_refines(log_reason)))
        .or_else(|| log.map(|(_, f)| f))
}

/// How a token source's refusal says that the share bringing it did not mount.
pub const SHARE_NOT_MOUNTED: &str = "not a mounted share";

/// Whether a token source's refusal says that its share did not mount: then the Secret
/// behind it may be fine, and the fix is the mount.
pub fn share_not_mounted(why: &str) -> bool {
    why.contains(SHARE_NOT_MOUNTED)
}

/// Whether a guest driver of this version (nvidia-smi's `Driver Version`) is of vGPU 18 or
/// later (the R570 branch on), which needs DLS 3.4 or later.
pub fn needs_dls_3_4(driver_version: &str) -> bool {
    driver_version
        .split('.')
        .next()
        .and_then(|m| m.trim().parse::<u32>().ok())
        .is_some_and(|major| major >= 570)
}

/// The GPU Operator's namespace and its driver pods' label, as its Helm chart sets them.
pub const OPERATOR_NAMESPACE: &str = "gpu-operator";
pub const DRIVER_POD_LABEL: &str = "app=nvidia-driver-daemonset";

/// What the operator changes instead of the agent on a GPU Operator node, one line: the
/// Secret and its keys, its token checked, and this node's driver pod made again (which alone
/// reads it).
/// The Secret's token is checked where kubectl runs, before a driver pod is made again for it:
/// `token inspect -` exits 0 only for a valid token, and names its DLS.
pub fn operator_fix(node_name: Option<&str>) -> String {
    format!(
        "the GPU Operator owns the token and gridd.conf on this node: put the client configuration token from the DLS, unchanged, into the Secret named by the ClusterPolicy's driver.licensingConfig.secretName (keys client_configuration_token.tok and gridd.conf, with FeatureType=1); check its token before the pod is made again for it (exit 0 only for a valid token, with the DLS it names): kubectl -n {OPERATOR_NAMESPACE} get secret <secret> -o jsonpath='{{.data.client_configuration_token\\.tok}}' | base64 -d | vgpu-license-agent token inspect -; then make this node's driver pod again, since only a new pod reads it: {}",
        driver_pod_recycle(node_name)
    )
}

/// The command that makes this node's driver pod again (its gridd is started once, by the
/// container's entrypoint: this is how it starts anew).
pub fn driver_pod_recycle(node_name: Option<&str>) -> String {
    let node = node_name.unwrap_or("<node>");
    format!(
        "kubectl -n {OPERATOR_NAMESPACE} delete pod -l {DRIVER_POD_LABEL} --field-selector spec.nodeName={node}"
    )
}

/// The driver pod of a GPU Operator node that is not running or not ready, one line.
pub fn driver_pod_advice(node_name: Option<&str>) -> String {
    let node = node_name.unwrap_or("<node>");
    format!(
        "the GPU Operator's driver pod on this node is not running or not ready (no driver answers in its root): kubectl -n {OPERATOR_NAMESPACE} get pods -l {DRIVER_POD_LABEL} --field-selector spec.nodeName={node} -o wide, and its log: kubectl -n {OPERATOR_NAMESPACE} logs -l {DRIVER_POD_LABEL} --field-selector spec.nodeName={node} -c nvidia-driver-ctr"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vgpu_18_drivers_need_dls_3_4() {
        assert!(needs_dls_3_4("570.124.06") && needs_dls_3_4("580.65.06"));
        assert!(!needs_dls_3_4("550.90.07") && !needs_dls_3_4("535.54.03"));
        assert!(!needs_dls_3_4("N/A") && !needs_dls_3_4(""));
    }

    #[test]
    fn every_reason_has_a_consistent_policy() {
        for r in Reason::ALL {
            let p = of(r);
            // What the probe can refine is vague, and a vague failure is worth a new attempt.
            if p.probe_refines {
                assert!(p.restart_helps, "{r:?}");
            }
            assert!(!(p.probe_refines && p.probe_measures), "{r:?}");
            if p.severity == Severity::Generic {
                assert!(p.probe_refines && p.diagnose_checks.is_empty(), "{r:?}");
            }
        }
        assert!(replaces(Reason::Other, Reason::LicensingUnsupported));
        assert!(!replaces(Reason::LicensingUnsupported, Reason::Other));
        assert!(replaces(Reason::Unspecified, Reason::Other));
        assert!(restart_helps(None) && probe_refines(None));
        assert!(!restart_helps(Some(Reason::ClockSkew)));
        assert!(explains_exit(Reason::TokenInvalid) && explains_exit(Reason::LicensingUnsupported));
        assert!(!explains_exit(Reason::DlsUnreachable) && !explains_exit(Reason::Other));
    }

    #[test]
    fn the_most_telling_failure_is_the_token_then_the_unit_then_the_probe_then_gridds() {
        use Reason as R;
        let choose = |token, unit, probe, log: Option<R>| {
            most_telling(own_failure(token, unit, log), probe, log.map(|r| (r, r)))
        };
        let down = Some(R::GriddNotRunning);
        let probe = Some(R::ClockSkew);
        // The token outranks everything, even gridd's own specific word.
        for log in [None, Some(R::Other), Some(R::LicensingUnsupported)] {
            assert_eq!(
                choose(Some(R::TokenExpired), down, probe, log),
                Some(R::TokenExpired)
            );
        }
        // A stopped gridd, unless its last words say why it stopped.
        assert_eq!(choose(None, down, probe, Some(R::Other)), down);
        assert_eq!(choose(None, down, probe, Some(R::DlsUnreachable)), down);
        assert_eq!(
            choose(None, down, probe, Some(R::TokenInvalid)),
            Some(R::TokenInvalid)
        );
        // The probe where gridd is vague or silent; gridd where it names the cause.
        assert_eq!(choose(None, None, probe, None), probe);
        assert_eq!(choose(None, None, probe, Some(R::Other)), probe);
        assert_eq!(choose(None, None, probe, Some(R::DlsUnreachable)), probe);
        assert_eq!(
            choose(None, None, probe, Some(R::NoLicenseAvailable)),
            Some(R::NoLicenseAvailable)
        );
        // Before a probe, gridd's word, vague or not.
        assert_eq!(choose(None, None, None, Some(R::Other)), Some(R::Other));
        assert_eq!(choose(None, None, None, None), None);
    }
}
