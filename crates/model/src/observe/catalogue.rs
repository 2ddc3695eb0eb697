//! The catalogue of nvidia-gridd's messages: every wording the agent knows, what it means
//! (the event kind, the failure reason, the licensing path it belongs to) and where it was
//! seen. This is the file a new driver branch touches: add its wordings to [`WORDINGS`] (and
//! the causes of its errors to [`ERRORS`]), each with its [`Source`]. The tests check that
//! every wording whose source is a sample of `tests/fixtures/samples/` is in that sample.
//!
//! The table is read in order and the first wording that fits a message wins, so a longer
//! prefix comes before a shorter one that it starts with. What is read from the rest of the
//! message (server, edition, expiry, the error's cause) is named by the wording's [`Fields`].

use chrono::{DateTime, Utc};

use crate::observe::meaning::{EventKind, Reason};
use crate::observe::smi::expiry_in;

/// Where a wording was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A real log in `tests/fixtures/samples/` (each names where it was published).
    Sample(&'static str),
    /// A document: NVIDIA's guides or headers, the project's contract.
    Doc(&'static str),
    /// Published only in descriptions, never verbatim: matched loosely, with the reason.
    Unsampled(&'static str),
}

/// Which licensing path a wording belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Any (or the token-based DLS/CLS path, the default of today's drivers).
    Any,
    /// The legacy license server (FlexNet, port 7070; vGPU 13 and older).
    Legacy,
    /// A cloud platform that licenses the GPU itself (no token, no server).
    CloudProvider,
}

/// What the rest of a message holds, after the wording's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fields {
    /// Nothing more.
    None,
    /// `(Info: <server>; <edition>)`.
    Acquiring,
    /// `(Info: <server>, <edition>; Expiry: <time>)`, or the legacy `Server URL : http://...`.
    Lease,
    /// `(Info: <server>)`.
    Returned,
    /// ` <server> (Info: <edition> - Error: <cause>)`, or a bare ` <server>`.
    AcquireFailedFrom,
    /// ` <server> (Error: <cause>)`.
    ReturnFailedTo,
    /// `<edition> Edition.`: the legacy edition, up to the first period.
    LegacyEdition,
    /// `<edition> license.`: the legacy failure (`Failed to acquire NVIDIA vGPU license.`),
    /// never `license from ...`.
    LegacyFailedEdition,
    /// `<edition>.`: the legacy state message after an acquisition.
    LicensedFor,
    /// ` <server> ... not reachable` (or `unreachable`).
    ServerUnreachable,
    /// `<N>)`: 0 on a guest that leases its license, 1 or more where the platform licenses
    /// the GPU.
    SoftwarePackage,
}

/// One wording of gridd.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    /// The message starts with this.
    pub starts: &'static str,
    pub kind: EventKind,
    /// The failure it reports, if any (`Fields` may read a more specific one).
    pub reason: Option<Reason>,
    pub path: Path,
    pub fields: Fields,
    pub source: Source,
}

const fn w(
    starts: &'static str,
    kind: EventKind,
    reason: Option<Reason>,
    fields: Fields,
    source: Source,
) -> Wording {
    Wording {
        starts,
        kind,
        reason,
        path: Path::Any,
        fields,
        source,
    }
}

const fn legacy(mut wording: Wording) -> Wording {
    wording.path = Path::Legacy;
    wording
}

const fn cloud(mut wording: Wording) -> Wording {
    wording.path = Path::CloudProvider;
    wording
}

use EventKind as K;
use Fields as F;
use Reason as R;
use Source::{Doc, Sample, Unsampled};

/// gridd's header of the D-Bus interface, the source of the legacy state texts.
const DBUS_HEADER: &str = "nv_grid_dbus.h, NVIDIA's gridd D-Bus header (NV_GRID_LICENSE_* states)";

/// Every wording, in the order they are tried.
#[rustfmt::skip]
pub const WORDINGS: &[Wording] = &[
    w("Started (", K::Started, None, F::None, Sample("gridd-log-jp-dls-guide-1.txt")),
    w("Shutdown (", K::Shutdown, None, F::None, Sample("gridd-log-cudaerror4vgpu-1.txt")),
    // The Windows service's last line.
    w("End Logging", K::Shutdown, None, F::None, Sample("gridd-log-fastapi-dls-4-windows.txt")),
    w("NLS initialized", K::Initialized, None, F::None, Sample("gridd-log-fastapi-dls-1.txt")),
    // `Acquiring license for GRID vGPU Edition.`: the edition is the name before ` Edition`.
    legacy(w("Acquiring license for ", K::Acquiring, None, F::LegacyEdition, Doc(DBUS_HEADER))),
    w("Acquiring license", K::Acquiring, None, F::Acquiring, Sample("gridd-log-fastapi-dls-1.txt")),
    w("License acquired successfully", K::Acquired, None, F::Lease, Sample("gridd-log-fastapi-dls-1.txt")),
    w("License renewed successfully", K::Renewed, None, F::Lease, Sample("gridd-log-fastapi-dls-5-windows.txt")),
    // `Failed to acquire NVIDIA GRID Virtual Workstation license.` (also in AWS's EC2 guide for
    // G3 instances): no cause given.
    legacy(w("Failed to acquire ", K::AcquireFailed, Some(R::Unspecified), F::LegacyFailedEdition, Sample("gridd-log-aws-g3-docs-legacy.txt"))),
    // `Failed to renew license for GRID vGPU Edition.`: the lease ran out unrenewed. No
    // renewal kind exists in the contract: it is a failed acquisition of the next lease.
    legacy(w("Failed to renew license for ", K::AcquireFailed, Some(R::Unspecified), F::LegacyEdition, Doc(DBUS_HEADER))),
    // A state message repeating the acquisition after `Server URL`: an event, not a second one.
    legacy(w("Your system is licensed for ", K::Other, None, F::LicensedFor, Sample("gridd-log-legacy-flexnet-1.txt"))),
    legacy(w("License server", K::AcquireFailed, Some(R::DlsUnreachable), F::ServerUnreachable, Unsampled("the FlexNet era's `License server ... not reachable`, quoted in descriptions of legacy license-server failures"))),
    w("License returned successfully", K::Returned, None, F::Returned, Sample("gridd-log-fastapi-dls-4-windows.txt")),
    w("Failed to acquire license from", K::AcquireFailed, Some(R::Unspecified), F::AcquireFailedFrom, Sample("flexnet-embedded-error-strings.txt")),
    w("Failed to return license to", K::ReturnFailed, Some(R::Unspecified), F::ReturnFailedTo, Sample("gridd-log-fastapi-dls-4-windows.txt")),
    w("Unable to fetch the client configuration token", K::TokenError, Some(R::TokenMissing), F::None, Sample("gridd-log-nrec-1.txt")),
    w("Failed to decode signature from token", K::TokenError, Some(R::TokenInvalid), F::None, Sample("gridd-log-cudaerror4vgpu-1.txt")),
    w("Failed to read configurations from client configuration token", K::TokenError, Some(R::TokenInvalid), F::None, Sample("gridd-log-cudaerror4vgpu-1.txt")),
    w("Failed to setup cloud License Manager", K::TokenError, Some(R::TokenInvalid), F::None, Sample("gridd-log-cudaerror4vgpu-1.txt")),
    w("Failed to update local trusted store", K::Other, Some(R::TrustedStore), F::None, Doc("the project's contract (docs: a published log quoted there)")),
    w("Failed to register client", K::Other, Some(R::TrustedStore), F::None, Doc("the project's contract (docs: a published log quoted there)")),
    w("Licensing not supported for GPUs in the system", K::Unsupported, Some(R::LicensingUnsupported), F::None, Doc("the project's contract (a real log of a GRID driver on a non-vGPU GPU)")),
    w("Invalid feature type requested", K::ConfigNotice, Some(R::FeatureTypeInvalid), F::None, Sample("gridd-log-azure-docs-32746-legacy.txt")),
    // gridd's word that it holds no license and the GPU will be restricted, without a cause: a
    // failure of its own (unless a later acquisition clears it), as generic as a bare
    // `Failed to acquire license from <server>`; a specific failure before it stands.
    w("Valid GRID license not found", K::UnlicensedNotice, Some(R::Unspecified), F::None, Sample("gridd-log-fastapi-dls-3-windows.txt")),
    w("Valid vGPU license not found", K::UnlicensedNotice, Some(R::Unspecified), F::None, Unsampled("the same notice under the vGPU name of later branches, by analogy with `Valid GRID license not found`")),
    w("Mismatch between client and server", K::Mismatch, None, F::None, Sample("gridd-log-fastapi-dls-5-windows.txt")),
    w("Failed to get a response from any of the servers", K::AcquireFailed, Some(R::DlsUnreachable), F::None, Sample("flexnet-embedded-error-strings.txt")),
    w("Configuration parameter (", K::ConfigNotice, None, F::None, Sample("gridd-log-fastapi-dls-2.txt")),
    w("Failed to open file /etc/nvidia/gridd.conf", K::ConfigNotice, None, F::None, Sample("gridd-log-fnos-1.txt")),
    w("Unable to open directory /etc/nvidia/license", K::ConfigNotice, None, F::None, Sample("gridd-log-azure-docs-32746-legacy.txt")),
    // `vGPU Software package (0)` starts every gridd of a guest that leases its license; on
    // cloud GPU instances whose platform licenses the GPU (AWS g6f, Azure and GCP GRID images)
    // gridd says `vGPU Software package (1)` and never tries to acquire.
    w("vGPU Software package (", K::Other, None, F::SoftwarePackage, Sample("gridd-log-fastapi-dls-1.txt")),
    cloud(w("Platform detection successful", K::Other, None, F::None, Unsampled("published logs of AWS g6f, Azure and GCP GRID images describe it; no verbatim log here yet"))),
    w("vGPU Software package", K::Other, None, F::None, Sample("gridd-log-cudaerror4vgpu-1.txt")),
    w("Ignore service provider", K::Other, None, F::None, Sample("gridd-log-cudaerror4vgpu-1.txt")),
    w("Service provider detection complete", K::Other, None, F::None, Sample("gridd-log-legacy-flexnet-1.txt")),
    // gridd's housekeeping as it exits: events, never the failure (the contract).
    w("Failed to unlock PID file", K::Other, None, F::None, Doc("the project's contract (a real log: after `Licensing not supported`)")),
    w("Failed to close PID file", K::Other, None, F::None, Unsampled("the same exit path as `Failed to unlock PID file`, seen in the same real log")),
    w("Failed to remove PID file", K::Other, None, F::None, Unsampled("the same exit path as `Failed to unlock PID file`")),
    w("Failed to handle license change events", K::Other, None, F::None, Doc("the project's contract (a real log: gridd exiting)")),
];

/// The cause behind an `Error: <text>` of gridd or of the FlexNet Embedded client library: a
/// text containing the needle (any case) has the reason. Tried in order.
#[rustfmt::skip]
pub const ERRORS: &[(&str, Reason, Source)] = &[
    ("windback", R::ClockSkew, Sample("flexnet-embedded-error-strings.txt")),
    ("allowed time to process response has expired", R::ClockSkew, Sample("flexnet-embedded-error-strings.txt")),
    ("clock", R::ClockSkew, Unsampled("any other error about the clock")),
    ("no pool features found", R::NoLicenseAvailable, Sample("flexnet-embedded-error-strings.txt")),
    ("insufficient count", R::NoLicenseAvailable, Sample("flexnet-embedded-error-strings.txt")),
    ("requested feature was not found", R::NoLicenseAvailable, Sample("flexnet-embedded-error-strings.txt")),
    ("generic network communication failure", R::DlsUnreachable, Sample("gridd-log-fastapi-dls-4-windows.txt")),
    ("failed to get a response from any of the servers", R::DlsUnreachable, Sample("flexnet-embedded-error-strings.txt")),
    ("platform network api failed", R::DlsUnreachable, Sample("flexnet-embedded-error-strings.txt")),
    ("libcurl error", R::DlsUnreachable, Sample("flexnet-embedded-error-strings.txt")),
    ("could not initialize a comm handle", R::DlsUnreachable, Sample("flexnet-embedded-error-strings.txt")),
    ("connection refused", R::DlsUnreachable, Unsampled("the system's own text for a closed port")),
    ("could not resolve", R::DlsUnreachable, Unsampled("curl's text for a name that does not resolve")),
    ("timed out", R::DlsUnreachable, Doc("the project's contract: a request that `timed out`")),
    ("trusted store", R::TrustedStore, Doc("a published log: `Failed to update local trusted store - Maximum buffer size exceeded` (the project's contract)")),
    ("trusted storage", R::TrustedStore, Sample("flexnet-embedded-error-strings.txt")),
];

/// What a message text says, before the line's time and process are attached.
#[derive(Debug, Clone, PartialEq)]
pub struct Classified {
    pub kind: EventKind,
    pub server: Option<String>,
    pub edition: Option<String>,
    pub expiry: Option<DateTime<Utc>>,
    pub reason: Option<Reason>,
    /// A line of the legacy (pre-2022, port 7070 license server) licensing path.
    pub legacy: bool,
    /// A line that shows the cloud platform licenses the GPU (no token, no license server).
    pub cloud_provider: bool,
}

impl Classified {
    pub(crate) fn new(kind: EventKind) -> Self {
        Classified {
            kind,
            server: None,
            edition: None,
            expiry: None,
            reason: None,
            legacy: false,
            cloud_provider: false,
        }
    }
}

fn nonempty(s: &str) -> Option<String> {
    let s = s.trim().trim_end_matches(')').trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// The text after `(Info: ` up to the closing parenthesis (or the end of a truncated line).
fn info_of(msg: &str) -> Option<&str> {
    let at = msg.find("(Info:")? + "(Info:".len();
    let rest = &msg[at..];
    Some(rest.strip_suffix(')').unwrap_or(rest).trim())
}

/// The reason behind an `Error: <text>` ([`ERRORS`]; `other` for a cause not listed).
pub fn reason_of_error(text: &str) -> Reason {
    let t = text.to_ascii_lowercase();
    ERRORS
        .iter()
        .find(|(needle, _, _)| t.contains(needle))
        .map_or(Reason::Other, |(_, r, _)| *r)
}

/// The host of a legacy `Server URL : http://host:7070/request`.
fn host_of_url(url: &str) -> Option<String> {
    let rest = url.trim().split_once("://").map_or(url.trim(), |(_, r)| r);
    let hostport = rest.split('/').next()?;
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        hostport.rsplit_once(':').map_or(hostport, |(h, _)| h)
    };
    nonempty(host)
}

/// The legacy server's `(Info: <url>; <edition>)`: a URL of the FlexNet license server
/// (`http://HOST:7070/request`), never the bare host of the token path.
fn legacy_info(info: &str) -> Option<(&str, &str)> {
    let (url, edition) = info.split_once(';').unwrap_or((info, ""));
    let url = url.trim();
    let is_url =
        starts_with_ignore_case(url, "http://") || starts_with_ignore_case(url, "https://");
    (is_url && ends_with_ignore_case(url.trim_end_matches('/'), "/request"))
        .then_some((url, edition))
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// Reads `rest` (the message after the wording's prefix) into `c` as `fields` says; `None`
/// when the message does not have the wording's form after all (the next wording is tried).
fn read_fields(fields: Fields, m: &str, rest: &str, c: &mut Classified) -> Option<()> {
    let legacy_edition = |s: &str| nonempty(s.trim().trim_end_matches("Edition"));
    match fields {
        F::None => {}
        F::Acquiring => {
            if let Some(info) = info_of(m) {
                let (server, edition) = info.split_once(';').unwrap_or((info, ""));
                c.server = nonempty(server);
                c.edition = nonempty(edition);
            }
        }
        F::Lease => read_lease(m, c),
        F::Returned => c.server = info_of(m).and_then(nonempty),
        F::AcquireFailedFrom => read_acquire_failed(rest, c),
        F::ReturnFailedTo => {
            let (server, err) = rest.split_once("(Error:").unwrap_or((rest, ""));
            c.server = nonempty(server);
            if !err.is_empty() {
                c.reason = Some(reason_of_error(err));
            }
        }
        F::LegacyEdition => c.edition = legacy_edition(rest.split('.').next().unwrap_or(rest)),
        F::LegacyFailedEdition => {
            if rest.starts_with("license") {
                return None;
            }
            let edition = rest
                .trim_end()
                .trim_end_matches('.')
                .strip_suffix(" license")?;
            c.edition = nonempty(edition);
        }
        F::LicensedFor => c.edition = legacy_edition(rest.trim_end().trim_end_matches('.')),
        F::ServerUnreachable => read_unreachable(rest, c)?,
        F::SoftwarePackage => {
            let n: u32 = rest.split(')').next()?.trim().parse().ok()?;
            c.cloud_provider = n >= 1;
        }
    }
    Some(())
}

/// A lease's line: the DLS's `(Info: server,edition; Expiry: ...)`, a legacy server's URL
/// and feature, or a legacy `Server URL : ...`.
fn read_lease(m: &str, c: &mut Classified) {
    if let Some((url, edition)) = info_of(m).and_then(legacy_info) {
        // `(Info: http://10.5.8.208:7070/request; Quadro-Virtual-DWS,5.0)`: the legacy
        // server's URL and the feature it served.
        c.server = host_of_url(url);
        c.edition = nonempty(edition);
        c.legacy = true;
    } else if let Some(info) = info_of(m) {
        let head = info.split(';').next().unwrap_or(info);
        let (server, edition) = head.split_once(',').unwrap_or((head, ""));
        c.server = nonempty(server);
        c.edition = nonempty(edition);
        c.expiry = expiry_in(info);
    } else if let Some((_, url)) = m.split_once("Server URL") {
        // `License acquired successfully. Server URL : http://host:7070/request`.
        c.server = host_of_url(url.trim_start().trim_start_matches(':'));
        c.legacy = true;
    }
}

/// `Failed to acquire license from SERVER (Info: EDITION - Error: ...)`.
fn read_acquire_failed(rest: &str, c: &mut Classified) {
    let Some((server, info)) = rest.split_once("(Info:") else {
        c.server = nonempty(rest);
        return;
    };
    c.server = nonempty(server);
    let info = info.trim().strip_suffix(')').unwrap_or(info.trim());
    match info.split_once("- Error:") {
        Some((edition, err)) => {
            c.edition = nonempty(edition);
            c.reason = Some(reason_of_error(err));
        }
        None => c.edition = nonempty(info),
    }
}

/// `... SERVER is not reachable` in its several forms; `None` where the words are not there.
fn read_unreachable(rest: &str, c: &mut Classified) -> Option<()> {
    if !(rest.contains("not reachable") || rest.contains("unreachable")) {
        return None;
    }
    let server = rest
        .split_whitespace()
        .next()
        .filter(|w| !matches!(*w, "is" | "not" | "unreachable"))
        .map(|w| w.trim_matches(|c: char| c == '(' || c == ')' || c == ','));
    c.server = server.and_then(|s| host_of_url(s).or_else(|| nonempty(s)));
    Some(())
}

/// Classifies one gridd message. `None` for text that says nothing known (it is still an
/// `other` event when the line was logged by nvidia-gridd).
///
/// A failure in the form gridd logs (the error text is the FlexNet client's), and a text that
/// is no gridd wording:
///
/// ```
/// use vgpu_license_model::observe::catalogue::classify;
/// use vgpu_license_model::report::{EventKind, Reason};
///
/// let c = classify(
///     "Failed to acquire license from 10.0.0.5 (Info: NVIDIA RTX Virtual Workstation - \
///      Error: Clock windback has been detected)",
/// )
/// .unwrap();
/// assert_eq!(c.kind, EventKind::AcquireFailed);
/// assert_eq!(c.server.as_deref(), Some("10.0.0.5"));
/// assert_eq!(c.reason, Some(Reason::ClockSkew));
/// assert!(classify("a line no gridd wording matches").is_none());
/// ```
pub fn classify(msg: &str) -> Option<Classified> {
    let m = msg.trim();
    classify_wording(m).map(|c| legacy_by_url(m, c))
}

/// A line that names a legacy license server's URL (`http://HOST:7070/request`, as that
/// path's lines name it) is the legacy path's, whatever its wording: its failure is the
/// license server's, never a DLS's. The URL is not the line's edition or server.
fn legacy_by_url(m: &str, mut c: Classified) -> Classified {
    // Every URL has it: most lines are done here, without being split into words.
    if !m.contains("://") {
        return c;
    }
    let url = m
        .split(|ch: char| ch.is_whitespace() || matches!(ch, '(' | ')' | ';' | ','))
        .find(|w| legacy_info(w).is_some());
    if let Some(url) = url {
        c.legacy = true;
        let named_by_url = |v: &Option<String>| v.as_deref().is_some_and(|v| v.contains("://"));
        if c.server.is_none() || named_by_url(&c.server) {
            c.server = host_of_url(url);
        }
        if named_by_url(&c.edition) {
            let after = c
                .edition
                .as_deref()
                .and_then(|e| e.split_once(';'))
                .map(|(_, e)| e);
            c.edition = after.and_then(nonempty);
        }
    }
    c
}

fn classify_wording(m: &str) -> Option<Classified> {
    for wording in WORDINGS {
        let Some(rest) = m.strip_prefix(wording.starts) else {
            continue;
        };
        let mut c = Classified::new(wording.kind);
        c.reason = wording.reason;
        c.legacy = wording.path == Path::Legacy;
        c.cloud_provider = wording.path == Path::CloudProvider;
        if read_fields(wording.fields, m, rest, &mut c).is_some() {
            return Some(c);
        }
    }
    // Any other failure: its cause, if the catalogue of errors knows it.
    (m.starts_with("Failed to ") || m.contains("Error:"))
        .then(|| Classified::new(K::Other))
        .map(|mut c| {
            c.reason = Some(reason_of_error(m));
            c
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> String {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/samples")
            .join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", crate::text::show_path(&path)))
    }

    #[test]
    fn every_sampled_wording_is_in_its_sample_and_classifies_there() {
        for wording in WORDINGS {
            let Source::Sample(name) = wording.source else {
                continue;
            };
            let text = sample(name);
            let line = text
                .lines()
                .find_map(|l| l.find(wording.starts).map(|at| &l[at..]))
                .unwrap_or_else(|| panic!("{name} does not hold {:?}", wording.starts));
            // The first line of the sample holding the wording reads as the wording says
            // (this also proves no wording earlier in the table hides it).
            let c = classify(line).unwrap_or_else(|| panic!("{line:?} unclassified"));
            assert_eq!(c.kind, wording.kind, "{line:?}");
            assert_eq!(c.legacy, wording.path == Path::Legacy, "{line:?}");
        }
    }

    #[test]
    fn every_sampled_error_cause_is_in_its_sample() {
        for (needle, reason, source) in ERRORS {
            if let Source::Sample(name) = source {
                assert!(
                    sample(name).to_ascii_lowercase().contains(needle),
                    "{name} does not hold {needle:?}"
                );
            }
            assert_eq!(reason_of_error(&needle.to_uppercase()), *reason, "{needle}");
        }
    }

    #[test]
    fn every_wording_is_reachable_and_says_where_it_comes_from() {
        for (i, wording) in WORDINGS.iter().enumerate() {
            // A wording whose prefix starts with an earlier unconditional one's would never be
            // tried.
            for earlier in &WORDINGS[..i] {
                let conditional = matches!(
                    earlier.fields,
                    F::LegacyFailedEdition | F::ServerUnreachable | F::SoftwarePackage
                );
                assert!(
                    conditional || !wording.starts.starts_with(earlier.starts),
                    "{:?} is hidden by {:?}",
                    wording.starts,
                    earlier.starts
                );
            }
            let said = match wording.source {
                Source::Sample(s) | Source::Doc(s) | Source::Unsampled(s) => s,
            };
            assert!(!said.trim().is_empty(), "{:?}", wording.starts);
        }
    }

    #[test]
    fn the_legacy_servers_acquisition_names_its_url_and_edition() {
        // tests/fixtures/samples/gridd-log-legacy-acquired-url-1.txt
        let c = classify("License acquired successfully. (Info: http://10.5.8.208:7070/request; Quadro-Virtual-DWS,5.0)").unwrap();
        assert_eq!(c.kind, K::Acquired);
        assert!(c.legacy);
        assert_eq!(c.server.as_deref(), Some("10.5.8.208"));
        assert_eq!(c.edition.as_deref(), Some("Quadro-Virtual-DWS,5.0"));
        // The token path's form stays the token path's.
        let c = classify("License acquired successfully. (Info: license.nvidia.space, NVIDIA RTX Virtual Workstation; Expiry: 2023-1-29 22:3:0 GMT)").unwrap();
        assert!(!c.legacy);
        assert_eq!(c.server.as_deref(), Some("license.nvidia.space"));
    }

    #[test]
    fn a_legacy_url_counts_in_any_case_and_anywhere_in_the_line() {
        let c = classify("License acquired successfully. (Info: HTTP://Flex.Example:7070/Request/; Quadro-Virtual-DWS,5.0)").unwrap();
        assert!(c.legacy);
        assert_eq!(c.server.as_deref(), Some("Flex.Example"));
        // A failure whose wording is the token path's, naming the legacy server's URL.
        let c = classify(
            "Failed to acquire license from https://10.5.8.208:7070/request (Error: timed out)",
        )
        .unwrap();
        assert!(c.legacy);
        assert_eq!(c.server.as_deref(), Some("10.5.8.208"));
        // A URL that is not the legacy server's request path is not the legacy path's.
        let c = classify(
            "Failed to acquire license from https://dls.example/request-other (Error: timed out)",
        )
        .unwrap();
        assert!(!c.legacy);
    }
}
