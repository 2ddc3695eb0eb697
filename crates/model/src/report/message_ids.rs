//! Stable journald `MESSAGE_ID`s of the agent's messages, and the journal fields that the
//! catalog (`packaging/vgpu-license-agent.catalog`, installed to
//! `/usr/lib/systemd/catalog/`) substitutes into its explanations (`@FIELD@`).
//!
//! `journalctl -x` shows the catalog's text under every message that carries one of these IDs;
//! `journalctl MESSAGE_ID=<id>` finds all of them. The IDs never change and are never reused.
//! The test below keeps this module and the catalog in step.

use super::Reason;

/// The license state changed (fields [`FIELD_PREVIOUS_STATE`], [`FIELD_STATE`]).
pub const STATE_CHANGED: &str = "f88411b76b9c4907b4ce071bda889b25";
/// A license was acquired (fields [`FIELD_EDITION`], [`FIELD_EXPIRY`]).
pub const LICENSED: &str = "729c2283a4104443987647bbbdf7bc0c";
/// The agent restarted nvidia-gridd (field [`FIELD_REASON`]: why).
pub const GRIDD_RESTARTED: &str = "31602623c30e4df49af475adaf9637e4";

/// A failure, one ID per stable reason code of the contract; see [`for_reason`].
pub const FAILURE_TOKEN_MISSING: &str = "91e3825562d64f1c9f1447a1ab880cf7";
pub const FAILURE_TOKEN_INVALID: &str = "28a03ceb689844908669752047f4f669";
pub const FAILURE_TOKEN_EXPIRED: &str = "4d73322a47984dfa93ed8558433d85b4";
pub const FAILURE_CLOCK_SKEW: &str = "c5f3bb742f1445b3a0ee2da2fcc7a97e";
pub const FAILURE_NO_LICENSE_AVAILABLE: &str = "9005c3928134434a8f9b8ab315f7da7d";
pub const FAILURE_TRUSTED_STORE: &str = "f8fa69b9babe4524b0b035ddd548313d";
pub const FAILURE_LICENSING_UNSUPPORTED: &str = "1d179654ed3e47ac8bbe5dc690038567";
pub const FAILURE_FEATURE_TYPE_INVALID: &str = "5cddb187c43f464dbea734acd0125a5f";
pub const FAILURE_DLS_UNREACHABLE: &str = "e526d0b694ff430096612100c7534dcc";
pub const FAILURE_GRIDD_NOT_RUNNING: &str = "97318e70705840c2a9c6011223070aaf";
pub const FAILURE_UNSPECIFIED: &str = "f9987d50f90a49f093a9818273e35ce9";
pub const FAILURE_OTHER: &str = "88cef4ab9cf5485c9ea15e557d20fc62";
pub const FAILURE_RENEWAL_STALLED: &str = "9a6f696648e74ebd8b1658f29f1299a7";
pub const FAILURE_TOKEN_SOURCE_REJECTED: &str = "b1e0c6a4d3f94a5c8e27f6a9d0c5b713";
pub const FAILURE_DRIVER_UNAVAILABLE: &str = "ab2f5d0e8c8b4b2a9e6c1d7f3a4b5c6d";
pub const FAILURE_TOKEN_REJECTED: &str = "d3c9e1f27a6b4e0c8f5a2b1c9d8e7f60";
pub const FAILURE_TOKEN_STALE: &str = "06bfd2bd51ba4b4d987a704e679bb520";
pub const FAILURE_CUDA_NOT_LICENSED: &str = "c11bf052c4664bce9b5e2e5dd0185fc2";
/// This guest's identity changed since the last boot: a clone, or a restored snapshot.
pub const CLONE_DETECTED: &str = "61ca0f88976e42a09aca3ba48149cfc2";

/// Every ID above, with its constant's name.
pub const ALL: [(&str, &str); 22] = [
    ("STATE_CHANGED", STATE_CHANGED),
    ("LICENSED", LICENSED),
    ("GRIDD_RESTARTED", GRIDD_RESTARTED),
    ("FAILURE_TOKEN_MISSING", FAILURE_TOKEN_MISSING),
    ("FAILURE_TOKEN_INVALID", FAILURE_TOKEN_INVALID),
    ("FAILURE_TOKEN_EXPIRED", FAILURE_TOKEN_EXPIRED),
    ("FAILURE_CLOCK_SKEW", FAILURE_CLOCK_SKEW),
    ("FAILURE_NO_LICENSE_AVAILABLE", FAILURE_NO_LICENSE_AVAILABLE),
    ("FAILURE_TRUSTED_STORE", FAILURE_TRUSTED_STORE),
    (
        "FAILURE_LICENSING_UNSUPPORTED",
        FAILURE_LICENSING_UNSUPPORTED,
    ),
    ("FAILURE_FEATURE_TYPE_INVALID", FAILURE_FEATURE_TYPE_INVALID),
    ("FAILURE_DLS_UNREACHABLE", FAILURE_DLS_UNREACHABLE),
    ("FAILURE_GRIDD_NOT_RUNNING", FAILURE_GRIDD_NOT_RUNNING),
    ("FAILURE_UNSPECIFIED", FAILURE_UNSPECIFIED),
    ("FAILURE_OTHER", FAILURE_OTHER),
    ("FAILURE_RENEWAL_STALLED", FAILURE_RENEWAL_STALLED),
    (
        "FAILURE_TOKEN_SOURCE_REJECTED",
        FAILURE_TOKEN_SOURCE_REJECTED,
    ),
    ("FAILURE_DRIVER_UNAVAILABLE", FAILURE_DRIVER_UNAVAILABLE),
    ("FAILURE_TOKEN_REJECTED", FAILURE_TOKEN_REJECTED),
    ("FAILURE_TOKEN_STALE", FAILURE_TOKEN_STALE),
    ("FAILURE_CUDA_NOT_LICENSED", FAILURE_CUDA_NOT_LICENSED),
    ("CLONE_DETECTED", CLONE_DETECTED),
];

/// The `MESSAGE_ID` of a failure with this reason.
pub fn for_reason(reason: Reason) -> &'static str {
    match reason {
        Reason::TokenMissing => FAILURE_TOKEN_MISSING,
        Reason::TokenInvalid => FAILURE_TOKEN_INVALID,
        Reason::TokenExpired => FAILURE_TOKEN_EXPIRED,
        Reason::ClockSkew => FAILURE_CLOCK_SKEW,
        Reason::NoLicenseAvailable => FAILURE_NO_LICENSE_AVAILABLE,
        Reason::TrustedStore => FAILURE_TRUSTED_STORE,
        Reason::LicensingUnsupported => FAILURE_LICENSING_UNSUPPORTED,
        Reason::FeatureTypeInvalid => FAILURE_FEATURE_TYPE_INVALID,
        Reason::DlsUnreachable => FAILURE_DLS_UNREACHABLE,
        Reason::GriddNotRunning => FAILURE_GRIDD_NOT_RUNNING,
        Reason::Unspecified => FAILURE_UNSPECIFIED,
        Reason::Other => FAILURE_OTHER,
        Reason::RenewalStalled => FAILURE_RENEWAL_STALLED,
        Reason::TokenSourceRejected => FAILURE_TOKEN_SOURCE_REJECTED,
        Reason::DriverUnavailable => FAILURE_DRIVER_UNAVAILABLE,
        Reason::TokenRejected => FAILURE_TOKEN_REJECTED,
        Reason::TokenStale => FAILURE_TOKEN_STALE,
        Reason::CudaNotLicensed => FAILURE_CUDA_NOT_LICENSED,
    }
}

/// Journal fields the catalog's texts use; a message with one of the IDs above carries the
/// fields its entry names (values as in the report: state and reason codes, RFC 3339 times).
pub const FIELD_STATE: &str = "VGPU_LICENSE_STATE";
pub const FIELD_PREVIOUS_STATE: &str = "VGPU_LICENSE_PREVIOUS_STATE";
pub const FIELD_REASON: &str = "VGPU_LICENSE_REASON";
pub const FIELD_EDITION: &str = "VGPU_LICENSE_EDITION";
pub const FIELD_EXPIRY: &str = "VGPU_LICENSE_EXPIRY";

/// Every field above.
pub const FIELDS: [&str; 5] = [
    FIELD_STATE,
    FIELD_PREVIOUS_STATE,
    FIELD_REASON,
    FIELD_EDITION,
    FIELD_EXPIRY,
];

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    const CATALOG: &str = include_str!("../../../../packaging/vgpu-license-agent.catalog");

    /// The catalog's entries: ID -> text (Subject line and body).
    fn catalog_entries() -> BTreeMap<String, String> {
        let mut entries = BTreeMap::new();
        let mut current: Option<(String, String)> = None;
        for line in CATALOG.lines() {
            if let Some(header) = line.strip_prefix("-- ") {
                if let Some((id, text)) = current.take() {
                    assert!(entries.insert(id.clone(), text).is_none(), "{id} twice");
                }
                let mut words = header.split_whitespace();
                let id = words.next().expect("an ID after `-- `").to_string();
                assert_eq!(
                    words.next(),
                    None,
                    "{header}: a language variant is unexpected"
                );
                current = Some((id, String::new()));
            } else if let Some((_, text)) = current.as_mut() {
                text.push_str(line);
                text.push('\n');
            }
        }
        if let Some((id, text)) = current.take() {
            assert!(entries.insert(id.clone(), text).is_none(), "{id} twice");
        }
        entries
    }

    #[test]
    fn ids_are_128_bit_lowercase_hex_and_unique() {
        let mut seen = BTreeSet::new();
        for (name, id) in ALL {
            assert_eq!(id.len(), 32, "{name}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{name}: {id}"
            );
            assert!(u128::from_str_radix(id, 16).is_ok(), "{name}");
            assert!(seen.insert(id), "{name}: {id} is used twice");
        }
    }

    #[test]
    fn code_and_catalog_have_the_same_ids() {
        let entries = catalog_entries();
        for (name, id) in ALL {
            let text = entries
                .get(id)
                .unwrap_or_else(|| panic!("{name} ({id}) has no entry in the catalog"));
            assert!(
                text.starts_with("Subject: "),
                "{name}: entry without Subject"
            );
        }
        let ours: BTreeSet<&str> = ALL.iter().map(|(_, id)| *id).collect();
        for id in entries.keys() {
            assert!(
                ours.contains(id.as_str()),
                "catalog entry {id} has no constant here"
            );
        }
    }

    #[test]
    fn every_reason_has_its_own_entry_naming_the_code() {
        let entries = catalog_entries();
        let mut seen = BTreeSet::new();
        for reason in Reason::ALL {
            let id = for_reason(reason);
            assert!(seen.insert(id), "{reason:?} shares {id}");
            let subject = entries[id].lines().next().unwrap_or_default();
            assert!(
                subject.split_whitespace().any(|w| w == reason.as_str()),
                "{id}: {subject:?} does not name {}",
                reason.as_str()
            );
        }
    }

    #[test]
    fn catalog_uses_only_declared_fields() {
        for (id, text) in catalog_entries() {
            let mut parts = text.split('@');
            parts.next();
            while let (Some(field), Some(_)) = (parts.next(), parts.next()) {
                assert!(FIELDS.contains(&field), "{id}: @{field}@ is not in FIELDS");
            }
        }
    }
}
