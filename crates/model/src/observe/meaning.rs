//! What the sources' lines mean, in the report's words: the kind of a gridd line
//! ([`EventKind`]), the reason of a failure ([`Reason`]), a VM's license as a host sees it
//! ([`VmState`]). The parsers say them; the report (which re-exports them) carries them.

use serde::{Deserialize, Serialize};

/// What a meaningful gridd log line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Started,
    Initialized,
    Acquiring,
    Acquired,
    Renewed,
    Returned,
    AcquireFailed,
    ReturnFailed,
    TokenError,
    UnlicensedNotice,
    Mismatch,
    Unsupported,
    ConfigNotice,
    Shutdown,
    Other,
    /// The agent's own: this guest's identity changed since the last boot.
    CloneDetected,
}

/// Stable failure reason codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    TokenMissing,
    TokenInvalid,
    TokenExpired,
    ClockSkew,
    NoLicenseAvailable,
    TrustedStore,
    LicensingUnsupported,
    FeatureTypeInvalid,
    DlsUnreachable,
    GriddNotRunning,
    /// The platform's token source holds a token the agent refused.
    TokenSourceRejected,
    RenewalStalled,
    /// The state is `no_driver`: no driver answers.
    DriverUnavailable,
    /// A file dropped in the token directory was refused and moved aside while the
    /// installed token holds.
    TokenRejected,
    /// On a GPU Operator node, the licensing Secret holds another token than the one gridd
    /// runs with.
    TokenStale,
    /// An application's log says CUDA error 102 (`cudaErrorDeviceNotLicensed`): the
    /// workload itself was refused for want of a license.
    CudaNotLicensed,
    Unspecified,
    Other,
}

impl Reason {
    pub const ALL: [Reason; 18] = [
        Reason::TokenMissing,
        Reason::TokenInvalid,
        Reason::TokenExpired,
        Reason::ClockSkew,
        Reason::NoLicenseAvailable,
        Reason::TrustedStore,
        Reason::LicensingUnsupported,
        Reason::FeatureTypeInvalid,
        Reason::DlsUnreachable,
        Reason::GriddNotRunning,
        Reason::TokenSourceRejected,
        Reason::RenewalStalled,
        Reason::DriverUnavailable,
        Reason::TokenRejected,
        Reason::TokenStale,
        Reason::CudaNotLicensed,
        Reason::Unspecified,
        Reason::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TokenMissing => "token_missing",
            Reason::TokenInvalid => "token_invalid",
            Reason::TokenExpired => "token_expired",
            Reason::ClockSkew => "clock_skew",
            Reason::NoLicenseAvailable => "no_license_available",
            Reason::TrustedStore => "trusted_store",
            Reason::LicensingUnsupported => "licensing_unsupported",
            Reason::FeatureTypeInvalid => "feature_type_invalid",
            Reason::DlsUnreachable => "dls_unreachable",
            Reason::GriddNotRunning => "gridd_not_running",
            Reason::TokenSourceRejected => "token_source_rejected",
            Reason::RenewalStalled => "renewal_stalled",
            Reason::DriverUnavailable => "driver_unavailable",
            Reason::TokenRejected => "token_rejected",
            Reason::TokenStale => "token_stale",
            Reason::CudaNotLicensed => "cuda_not_licensed",
            Reason::Unspecified => "unspecified",
            Reason::Other => "other",
        }
    }
}

/// One VM's vGPU license, as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    Licensed,
    /// No license, still at full speed (`Unlicensed`, `Unlicensed (Unrestricted)`).
    Unlicensed,
    /// No license, throttled (`Unlicensed (Restricted)`).
    Restricted,
    /// No guest driver answers (`N/A`: a VM booting, a guest without NVIDIA's driver), or a
    /// license status this version does not know.
    Unknown,
}

impl VmState {
    pub const ALL: [VmState; 4] = [
        VmState::Licensed,
        VmState::Unlicensed,
        VmState::Restricted,
        VmState::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Licensed => "licensed",
            VmState::Unlicensed => "unlicensed",
            VmState::Restricted => "restricted",
            VmState::Unknown => "unknown",
        }
    }
}
