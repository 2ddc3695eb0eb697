//! `nvidia-smi -q` (text, whole or an excerpt, indentation kept or lost) and `nvidia-smi -q -x`
//! (XML) into a per-GPU snapshot. Unknown lines are ignored, so new driver branches that add
//! lines do not break parsing. Pasted text is read too: lines behind a log's time and
//! `host program:`, Ansible's quoted `stdout_lines`, a listing's line numbers, a license
//! section flattened onto one line. The host's `nvidia-smi vgpu -q` is recognised as the
//! host's view of its VMs, never as a guest's own.

use chrono::{DateTime, Utc};

use crate::time::parse_gmt;

/// One GPU as nvidia-smi shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmiGpu {
    /// `00000000:02:01.0`; `None` for an excerpt with no `GPU ...` line.
    pub bus_id: Option<String>,
    /// The first `Product Name`: the vGPU profile (`GRID A100-4C`, `NVIDIA L40S-24Q`).
    pub profile: Option<String>,
    /// `VGPU`, `Pass-Through`, `None`, ...
    pub virtualization_mode: Option<String>,
    /// `License Status` as printed.
    pub license_status: Option<String>,
    /// `Product Name` under `vGPU Software Licensed Product`: the edition.
    pub edition: Option<String>,
    /// Whether the `vGPU Software Licensed Product` section (or a License Status) was seen.
    pub has_license_section: bool,
}

/// What one nvidia-smi output says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmiSnapshot {
    pub driver_version: Option<String>,
    /// nvidia-smi's `Timestamp` (the guest's local time; its zone is not printed).
    pub timestamp: Option<chrono::NaiveDateTime>,
    pub gpus: Vec<SmiGpu>,
    /// A whole `-q` output (its header was seen), not an excerpt.
    pub whole: bool,
    /// nvidia-smi's own complaint when there is no driver or no device.
    pub driver_error: Option<String>,
    /// nvidia-smi did not answer within its time limit (the one-line reason): what the GPU
    /// shows is unknown, which is not the same as no driver.
    pub unanswered: Option<String>,
    /// The guest's PCI bus holds no NVIDIA device (vendor 0x10de): nothing to license, and
    /// nvidia-smi was not asked.
    pub no_device: bool,
    /// The hypervisor host's `nvidia-smi vgpu -q` (`vGPU ID`, `VM Name`, `Guest Driver
    /// Version` blocks), not a guest's own view: one entry per VM's vGPU.
    pub host_vgpus: Vec<HostVgpu>,
    /// The output is the host's view (see [`SmiSnapshot::host_vgpus`]), even with no vGPU
    /// active (`Active vGPUs : 0`).
    pub host_view: bool,
}

/// One VM's vGPU as the host's `nvidia-smi vgpu -q` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostVgpu {
    /// The physical GPU (`GPU 00000000:01:00.0` above the block).
    pub gpu_bus_id: Option<String>,
    pub vgpu_id: Option<String>,
    pub vm_name: Option<String>,
    pub vm_uuid: Option<String>,
    /// `vGPU UUID` (empty on some drivers: `None`).
    pub vgpu_uuid: Option<String>,
    /// `vGPU Name`: the profile (`NVIDIA RTXA6000-2Q`).
    pub profile: Option<String>,
    /// `N/A` while the guest driver is not loaded.
    pub guest_driver: Option<String>,
    /// `N/A (Expiry: N/A)`, `Unlicensed (Unrestricted)`, `Licensed (Expiry: ...)`.
    pub license_status: Option<String>,
}

/// The editions, as driver 595 and later name them next to the names before it: the same
/// license, so a comparison of editions goes through [`same_edition`].
pub const EDITION_RENAMES: &[(&str, &str)] =
    &[("NVIDIA Virtual Compute Server", "NVIDIA vGPU for Compute")];

/// An edition's name in one spelling (the one before driver 595), whichever was printed.
pub fn canonical_edition(name: &str) -> &str {
    let n = name.trim();
    EDITION_RENAMES
        .iter()
        .find(|(old, new)| n.eq_ignore_ascii_case(old) || n.eq_ignore_ascii_case(new))
        .map_or(n, |(old, _)| old)
}

/// Whether two edition names are the same license (`NVIDIA Virtual Compute Server` is
/// `NVIDIA vGPU for Compute` from driver 595 on).
pub fn same_edition(a: &str, b: &str) -> bool {
    canonical_edition(a).eq_ignore_ascii_case(canonical_edition(b))
}

/// Whether a GPU's product name is a vGPU profile: its last word ends in `-<n><letter>`
/// (`A10-12Q`, `GRID A100-4C`, `NVIDIA L40S-24Q`, MIG-backed `H100L-1-12C`); a physical
/// GPU's name never does (`NVIDIA H100 80GB HBM3`, `Tesla V100-SXM2-32GB`).
pub fn is_vgpu_profile(name: &str) -> bool {
    let Some(last) = name.split_whitespace().last() else {
        return false;
    };
    let Some((_, tail)) = last.rsplit_once('-') else {
        return false;
    };
    let b = tail.as_bytes();
    b.len() >= 2
        && b[..b.len() - 1].iter().all(u8::is_ascii_digit)
        && b[b.len() - 1].is_ascii_alphabetic()
}

/// The edition a vGPU profile needs (`NVIDIA L40S-24Q`, `GRID A100-4C`, MIG-backed
/// `H100L-1-12C`), from the profile's last letter.
pub fn edition_for_profile(profile: &str) -> Option<&'static str> {
    let name = profile.split_whitespace().last()?;
    if !name.contains('-') {
        return None;
    }
    match name.chars().last()?.to_ascii_uppercase() {
        'Q' => Some("NVIDIA RTX Virtual Workstation"),
        'B' => Some("NVIDIA Virtual PC"),
        'A' => Some("NVIDIA Virtual Applications"),
        // Driver 595 renamed it; a DLS may list the license under either name.
        'C' => Some("NVIDIA Virtual Compute Server (NVIDIA vGPU for Compute from driver 595)"),
        _ => None,
    }
}

/// A `License Status` value, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LicenseStatus {
    /// Licensed; the expiry when one was printed as a date (`N/A`, `Permanent` give `None`).
    Licensed(Option<DateTime<Utc>>),
    /// Unlicensed, still at full speed (`Unlicensed`, `Unlicensed (Unrestricted)`).
    Unlicensed,
    /// Unlicensed and throttled (`Unlicensed (Restricted)`).
    Restricted,
    /// `Unknown` or a text this version does not know.
    Unknown,
}

/// Classifies a `License Status` text as printed by any driver branch.
pub fn classify_status(status: &str) -> LicenseStatus {
    let s = status.trim().to_ascii_lowercase();
    if s.starts_with("unlicensed") {
        if s.contains("unrestricted") {
            LicenseStatus::Unlicensed
        } else if s.contains("restricted") {
            LicenseStatus::Restricted
        } else {
            LicenseStatus::Unlicensed
        }
    } else if s.starts_with("licensed") {
        LicenseStatus::Licensed(expiry_in(status))
    } else {
        LicenseStatus::Unknown
    }
}

/// The date in `... (Expiry: 2022-5-27 0:8:28 GMT)`, if any.
pub fn expiry_in(text: &str) -> Option<DateTime<Utc>> {
    let lower = text.to_ascii_lowercase();
    let at = lower.find("expiry:")? + "expiry:".len();
    let rest = &text[at..];
    let end = rest.find([')', ',', ';']).unwrap_or(rest.len());
    parse_gmt(&rest[..end])
}

const DRIVER_ERRORS: [&str; 6] = [
    "failed to initialize nvml",
    "nvidia-smi has failed",
    "no devices were found",
    "couldn't communicate with the nvidia driver",
    "nvidia-smi: command not found",
    "driver/library version mismatch",
];

/// Parses nvidia-smi output, text or XML, from bytes (invalid UTF-8 is replaced).
///
/// An excerpt of `nvidia-smi -q` in a licensed vGPU guest:
///
/// ```
/// use vgpu_license_model::observe::smi::{self, LicenseStatus};
///
/// let out = "GPU 00000000:02:01.0
///     Product Name                          : NVIDIA L40S-24Q
///     vGPU Software Licensed Product
///         Product Name                      : NVIDIA RTX Virtual Workstation
///         License Status                    : Licensed (Expiry: 2026-12-3 6:55:24 GMT)
/// ";
/// let s = smi::parse(out.as_bytes()).unwrap();
/// let gpu = &s.gpus[0];
/// assert_eq!(gpu.profile.as_deref(), Some("NVIDIA L40S-24Q"));
/// let LicenseStatus::Licensed(Some(expiry)) =
///     smi::classify_status(gpu.license_status.as_deref().unwrap())
/// else {
///     panic!("not licensed");
/// };
/// assert_eq!(expiry.to_rfc3339(), "2026-12-03T06:55:24+00:00");
/// ```
pub fn parse(input: &[u8]) -> Result<SmiSnapshot, String> {
    let text = String::from_utf8_lossy(input);
    let trimmed = text.trim_start();
    let mut snap = if trimmed.starts_with('<') {
        parse_xml(trimmed)?
    } else {
        parse_text(&text)
    };
    merge_repeated(&mut snap);
    Ok(snap)
}

/// One entry per device, however often a pasted output lists it (an output pasted twice,
/// two readings one after the other): a GPU by its bus id, a VM's vGPU by its physical GPU
/// and vGPU ID; the last listing, the newest, is kept at the first one's place.
fn merge_repeated(snap: &mut SmiSnapshot) {
    fn merge<T>(list: &mut Vec<T>, key: impl Fn(&T) -> Option<String>) {
        let mut kept: Vec<T> = Vec::with_capacity(list.len());
        let mut at = std::collections::HashMap::new();
        for item in list.drain(..) {
            match key(&item).and_then(|k| at.get(&k).copied().map(|i| (k, i))) {
                Some((_, i)) => kept[i] = item,
                None => {
                    if let Some(k) = key(&item) {
                        at.insert(k, kept.len());
                    }
                    kept.push(item);
                }
            }
        }
        *list = kept;
    }
    merge(&mut snap.gpus, |g| g.bus_id.clone());
    merge(&mut snap.host_vgpus, |v| {
        v.vgpu_id
            .as_ref()
            .map(|id| format!("{}/{id}", v.gpu_bus_id.as_deref().unwrap_or_default()))
    });
}

fn is_bus_id(s: &str) -> bool {
    // 00000000:02:01.0 (domain of 4 or 8 hex digits)
    let mut parts = s.split(':');
    let (Some(dom), Some(bus), Some(devfn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let hex = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit());
    let Some((dev, func)) = devfn.split_once('.') else {
        return false;
    };
    matches!(dom.len(), 4 | 8) && hex(dom) && bus.len() == 2 && hex(bus) && hex(dev) && hex(func)
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches([' ', '\t']).len()
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `2024-05-27T00:08:28.123Z ` (or `2024-05-27 00:08:28+0000 `): the rest after it.
fn after_iso_stamp(line: &str) -> Option<&str> {
    let b = line.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let ok = digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && matches!(b.get(10), Some(b'T' | b' '))
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19);
    if !ok {
        return None;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') || b.get(i) == Some(&b',') {
        i += 1;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    match b.get(i) {
        Some(b'Z') => i += 1,
        Some(b'+' | b'-') => {
            i += 1;
            while b.get(i).is_some_and(|c| c.is_ascii_digit() || *c == b':') {
                i += 1;
            }
        }
        _ => {}
    }
    let rest = &line[i..];
    rest.starts_with([' ', '\t']).then(|| &rest[1..])
}

/// `May 27 00:08:28 ` (syslog's time): the rest after it.
fn after_syslog_stamp(line: &str) -> Option<&str> {
    let month = line.get(..3)?;
    if !MONTHS.contains(&month) {
        return None;
    }
    let rest = line[3..].strip_prefix(' ')?.trim_start_matches(' ');
    let (day, rest) = rest.split_once(' ')?;
    if day.is_empty() || day.len() > 2 || !day.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (time, rest) = rest.split_once(' ')?;
    let t = time.as_bytes();
    let time_ok = time.len() >= 8
        && t[2] == b':'
        && t[5] == b':'
        && [0, 1, 3, 4, 6, 7].iter().all(|&k| t[k].is_ascii_digit());
    time_ok.then_some(rest)
}

/// `host ansible: ` or `host ident[pid]: ` after a log's time: the rest after it (the
/// paste's own indentation kept). nvidia-smi pads its keys (`License Status    : ...`), so
/// a word glued to its colon is a program's name, never a key.
fn after_host_ident(rest: &str) -> Option<&str> {
    let (host, tail) = rest.split_once(' ')?;
    if host.is_empty() || host.contains(':') {
        return None;
    }
    let colon = tail.find(':')?;
    let ident = &tail[..colon];
    let name = ident.split('[').next().unwrap_or(ident);
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/'))
        && ident[name.len()..].strip_prefix('[').is_none_or(|p| {
            p.strip_suffix(']')
                .is_some_and(|d| d.bytes().all(|c| c.is_ascii_digit()))
        });
    if !ok {
        return None;
    }
    let after = &tail[colon + 1..];
    Some(after.strip_prefix(' ').unwrap_or(after))
}

/// A line as nvidia-smi printed it, without what a log or a paste put around it: a log's
/// time (ISO or syslog) and `host program:`, Ansible's quoting of `stdout_lines`
/// (`"    License Status : Licensed",`), a leading line number of a rendered listing.
fn unwrap_line(raw: &str) -> &str {
    let mut line = raw.trim_end_matches(['\r', ' ', '\t']);
    let lead = line.trim_start_matches([' ', '\t']);
    if let Some(rest) = after_iso_stamp(lead).or_else(|| after_syslog_stamp(lead)) {
        line = after_host_ident(rest).unwrap_or(rest);
    }
    let lead = line.trim_start_matches([' ', '\t']);
    // No line of nvidia-smi starts with a digit: one that does is numbered by a listing
    // (`3Timestamp : ...`, `9 Product Name : ...`).
    let numbered = lead.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=4).contains(&numbered) {
        let rest = &lead[numbered..];
        let next = rest.trim_start_matches(' ');
        if next.starts_with(|c: char| c.is_ascii_alphabetic() || c == '=') {
            line = rest;
        }
    }
    let lead = line.trim_start_matches([' ', '\t']);
    if let Some(q) = lead.strip_prefix('"') {
        let q = q.strip_suffix(',').unwrap_or(q);
        if let Some(inner) = q.strip_suffix('"') {
            line = inner;
        }
    }
    line
}

/// The keys of the licence section, where a paste flattened it onto one line.
const FLAT_MARKERS: [&str; 3] = [
    "vGPU Software Licensed Product",
    "Product Name",
    "License Status",
];

/// A line holding several of the licence section's parts (`vGPU Software Licensed Product
/// Product Name : ... License Status : ...`, as a paste flattens it) split back into its
/// lines, the keys indented under the section's header. Any other line is itself.
fn unflatten(indent: usize, line: &str) -> Vec<(usize, &str)> {
    // Each part once: the line stays one GPU's (a GPU takes a line of its own).
    let mut cuts: Vec<usize> = FLAT_MARKERS
        .iter()
        .filter_map(|m| line.find(m))
        .filter(|&i| i > 0 && line[..i].ends_with([' ', '\t']))
        .collect();
    // Two of the section's parts at least: a sentence naming one key is no section.
    let at_start = FLAT_MARKERS.iter().any(|m| line.starts_with(m));
    if cuts.is_empty() || cuts.len() + usize::from(at_start) < 2 {
        return vec![(indent, line)];
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut parts = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for cut in cuts.into_iter().chain(std::iter::once(line.len())) {
        let part = line[from..cut].trim();
        if !part.is_empty() {
            let header = part.starts_with(FLAT_MARKERS[0]);
            let at = if parts.is_empty() || header {
                indent
            } else {
                indent + 4
            };
            parts.push((at, part));
        }
        from = cut;
    }
    parts
}

/// Parses `nvidia-smi -q` text, whole or an excerpt, or the host's `nvidia-smi vgpu -q`.
pub fn parse_text(text: &str) -> SmiSnapshot {
    let mut snap = SmiSnapshot::default();
    // The section a key belongs to: its lowercased header and the header's indentation.
    let mut section: Option<(String, usize)> = None;
    for raw in text.lines() {
        let unwrapped = unwrap_line(raw);
        let line = unwrapped.trim();
        if line.is_empty() {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if snap.driver_error.is_none() && DRIVER_ERRORS.iter().any(|e| lower.contains(e)) {
            snap.driver_error = Some(line.to_string());
            continue;
        }
        for (indent, line) in unflatten(indent_of(unwrapped), line) {
            parse_line(&mut snap, &mut section, indent, line);
        }
    }
    if snap.host_view {
        // The host's physical GPUs: each VM's vGPU names its own (`gpu_bus_id`); none of
        // them is a GPU of this output's reader.
        snap.gpus.clear();
    }
    snap
}

/// One line of `nvidia-smi -q` (or `vgpu -q`) text, trimmed, at its indentation.
fn parse_line(
    snap: &mut SmiSnapshot,
    section: &mut Option<(String, usize)>,
    indent: usize,
    line: &str,
) {
    let lower = line.to_ascii_lowercase();
    if lower.contains("nvsmi log") || lower.starts_with("attached gpus") {
        snap.whole = true;
    }
    if let Some(id) = line.strip_prefix("GPU ").map(str::trim)
        && is_bus_id(id)
    {
        snap.gpus.push(SmiGpu {
            bus_id: Some(id.to_string()),
            ..SmiGpu::default()
        });
        *section = None;
        return;
    }
    let Some((key, value)) = line.split_once(':') else {
        // A section header.
        *section = Some((lower, indent));
        if section.as_ref().is_some_and(|s| is_license_section(&s.0)) {
            current(snap).has_license_section = true;
        }
        return;
    };
    if let Some((_, sec_indent)) = &section
        && indent <= *sec_indent
        && (indent > 0 || *sec_indent > 0)
    {
        *section = None;
    }
    let key = key.trim();
    let value = value.trim();
    let value = (!value.is_empty()).then(|| value.to_string());
    let in_license = section.as_ref().is_some_and(|s| is_license_section(&s.0));
    if !host_key(snap, key, value.clone()) {
        guest_key(snap, key, value, in_license, section.is_none());
    }
}

/// A key of a guest's output: the driver, the vGPU's profile, its license.
fn guest_key(
    snap: &mut SmiSnapshot,
    key: &str,
    value: Option<String>,
    in_license: bool,
    top_level: bool,
) {
    if key.eq_ignore_ascii_case("Timestamp") {
        snap.timestamp = value.as_deref().and_then(parse_smi_timestamp);
    } else if key.eq_ignore_ascii_case("Driver Version") {
        snap.driver_version = value;
    } else if key.eq_ignore_ascii_case("Product Name") {
        if in_license {
            let gpu = current_for(snap, |g| g.edition.is_some());
            gpu.edition = value;
            gpu.has_license_section = true;
        } else if top_level {
            let gpu = current(snap);
            if gpu.profile.is_none() {
                gpu.profile = value;
            }
        }
    } else if key.eq_ignore_ascii_case("License Status") {
        let gpu = current_for(snap, |g| g.license_status.is_some());
        gpu.license_status = value;
        gpu.has_license_section = true;
    } else if key.eq_ignore_ascii_case("Virtualization Mode") {
        current(snap).virtualization_mode = value;
    }
}

/// The license's section, as drivers since 2020 name it (`vGPU Software Licensed Product`) and
/// as older ones did (`GRID Licensed Product`): its `Product Name` is the edition.
fn is_license_section(lower: &str) -> bool {
    matches!(
        lower,
        "vgpu software licensed product" | "grid licensed product"
    )
}

/// The keys of the host's `nvidia-smi vgpu -q`: `true` when `key` was one (a VM's `License
/// Status` there is that VM's, never this machine's).
fn host_key(snap: &mut SmiSnapshot, key: &str, value: Option<String>) -> bool {
    let is = |k: &str| key.eq_ignore_ascii_case(k);
    if is("Active vGPUs") {
        snap.host_view = true;
        return true;
    }
    if is("vGPU ID") {
        snap.host_view = true;
        let gpu_bus_id = snap.gpus.last().and_then(|g| g.bus_id.clone());
        snap.host_vgpus.push(HostVgpu {
            gpu_bus_id,
            vgpu_id: value,
            ..HostVgpu::default()
        });
        return true;
    }
    if !snap.host_view {
        return false;
    }
    let Some(vgpu) = snap.host_vgpus.last_mut() else {
        return false;
    };
    let slot = if is("VM Name") {
        &mut vgpu.vm_name
    } else if is("VM UUID") {
        &mut vgpu.vm_uuid
    } else if is("vGPU Name") {
        &mut vgpu.profile
    } else if is("vGPU UUID") {
        &mut vgpu.vgpu_uuid
    } else if is("Guest Driver Version") {
        &mut vgpu.guest_driver
    } else if is("License Status") {
        &mut vgpu.license_status
    } else {
        return false;
    };
    *slot = value;
    true
}

/// The GPU fields belong to: the last `GPU ...` section, or an implicit one in an excerpt.
fn current(snap: &mut SmiSnapshot) -> &mut SmiGpu {
    if snap.gpus.is_empty() {
        snap.gpus.push(SmiGpu::default());
    }
    snap.gpus.last_mut().expect("just ensured")
}

/// Like [`current`], but in an excerpt without `GPU ...` lines a field seen again starts the
/// next GPU (`nvidia-smi -q | grep -i license` on a guest with two vGPUs): one GPU's status
/// never hides another's.
fn current_for(snap: &mut SmiSnapshot, seen: impl Fn(&SmiGpu) -> bool) -> &mut SmiGpu {
    if snap
        .gpus
        .last()
        .is_some_and(|g| g.bus_id.is_none() && seen(g))
    {
        snap.gpus.push(SmiGpu::default());
    }
    current(snap)
}

/// `Mon Mar 31 05:01:08 2025`
fn parse_smi_timestamp(s: &str) -> Option<chrono::NaiveDateTime> {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    chrono::NaiveDateTime::parse_from_str(&s, "%a %b %d %H:%M:%S %Y").ok()
}

/// Whether an XML text has a DOCTYPE with an internal subset (`[...]`) or declares an entity.
fn declares_entities(text: &str) -> bool {
    if memchr::memmem::find(text.as_bytes(), b"<!ENTITY").is_some() {
        return true;
    }
    match text.find("<!DOCTYPE") {
        Some(i) => {
            let decl = &text[i..];
            match (decl.find('['), decl.find('>')) {
                (Some(open), Some(end)) => open < end,
                (Some(_), None) => true,
                _ => false,
            }
        }
        None => false,
    }
}

/// Parses `nvidia-smi -q -x`, whole or a fragment pasted from it (one or more `<gpu>`
/// elements, or the inside of one, with or without the XML declaration): a fragment is read
/// as if `<nvidia_smi_log>` enclosed it.
pub fn parse_xml(text: &str) -> Result<SmiSnapshot, String> {
    // nvidia-smi's XML names an external DTD (`<!DOCTYPE nvidia_smi_log SYSTEM "...">`),
    // which is never loaded, and declares no entities. A document that declares some is not
    // nvidia-smi's, and expanding them ("billion laughs") could take gigabytes: refused
    // before parsing.
    if declares_entities(text) {
        return Err(
            "XML with a DTD internal subset or entity declarations: nvidia-smi -q -x never writes one; give the unedited output of `nvidia-smi -q -x`".into(),
        );
    }
    let whole = xml_document(text);
    if let Ok(doc) = &whole
        && doc.root_element().has_tag_name("nvidia_smi_log")
    {
        return Ok(snapshot_of(doc.root_element(), true));
    }
    let body = without_prolog(text);
    if !body.starts_with("<nvidia_smi_log") {
        let wrapped = format!("<nvidia_smi_log>{body}</nvidia_smi_log>");
        if let Ok(doc) = xml_document(&wrapped)
            && holds_smi_elements(doc.root_element())
        {
            return Ok(snapshot_of(doc.root_element(), false));
        }
    }
    match whole {
        Ok(doc) => Err(format!(
            "XML but not nvidia-smi -q -x output (root element <{}>, expected <nvidia_smi_log>)",
            doc.root_element().tag_name().name()
        )),
        Err(e) => Err(format!("not valid nvidia-smi XML: {e}")),
    }
}

fn xml_document(text: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        // nvidia-smi -q -x of eight GPUs is about 5000 nodes.
        nodes_limit: 1_000_000,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, opts)
}

/// The text after the XML declaration and the DOCTYPE, where a paste kept them.
fn without_prolog(text: &str) -> &str {
    let mut rest = text.trim_start();
    for (open, close) in [("<?xml", "?>"), ("<!DOCTYPE", ">")] {
        if rest.starts_with(open)
            && let Some(end) = rest.find(close)
        {
            rest = rest[end + close.len()..].trim_start();
        }
    }
    rest
}

/// The elements a fragment of `nvidia-smi -q -x` is known by: a GPU, or the parts of one.
const FRAGMENT_ELEMENTS: [&str; 4] = [
    "gpu",
    "product_name",
    "gpu_virtualization_mode",
    "vgpu_software_licensed_product",
];

fn holds_smi_elements(root: roxmltree::Node) -> bool {
    root.children()
        .any(|c| FRAGMENT_ELEMENTS.iter().any(|n| c.has_tag_name(*n)))
}

/// The text of the element at `path` under `n`, trimmed; `None` when missing or empty.
fn child_text(n: roxmltree::Node, path: &[&str]) -> Option<String> {
    let mut node = n;
    for name in path {
        node = node.children().find(|c| c.has_tag_name(*name))?;
    }
    node.text()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
}

/// The snapshot `<nvidia_smi_log>` (or the element enclosing a fragment) holds: its `<gpu>`
/// elements, or, in a fragment of one GPU's inside, that GPU.
fn snapshot_of(root: roxmltree::Node, whole: bool) -> SmiSnapshot {
    let mut gpus: Vec<SmiGpu> = root
        .children()
        .filter(|c| c.has_tag_name("gpu"))
        .map(gpu_of)
        .collect();
    if gpus.is_empty() && !whole && holds_smi_elements(root) {
        gpus.push(gpu_of(root));
    }
    SmiSnapshot {
        whole,
        driver_version: child_text(root, &["driver_version"]),
        timestamp: child_text(root, &["timestamp"]).and_then(|t| parse_smi_timestamp(&t)),
        gpus,
        ..SmiSnapshot::default()
    }
}

fn gpu_of(gpu: roxmltree::Node) -> SmiGpu {
    let lic = gpu
        .children()
        .find(|c| c.has_tag_name("vgpu_software_licensed_product"));
    SmiGpu {
        bus_id: gpu.attribute("id").map(String::from),
        profile: child_text(gpu, &["product_name"]),
        virtualization_mode: child_text(gpu, &["gpu_virtualization_mode", "virtualization_mode"]),
        license_status: lic.and_then(|l| child_text(l, &["license_status"])),
        edition: lic.and_then(|l| child_text(l, &["licensed_product_name"])),
        has_license_section: lic.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_of_every_branch() {
        use LicenseStatus::*;
        assert_eq!(
            classify_status("Licensed (Expiry: 2022-5-27 0:8:28 GMT)"),
            Licensed(parse_gmt("2022-5-27 0:8:28 GMT"))
        );
        assert_eq!(classify_status("Licensed (Expiry: N/A)"), Licensed(None));
        assert_eq!(
            classify_status("Licensed (Expiry: Permanent)"),
            Licensed(None)
        );
        assert_eq!(classify_status("Licensed"), Licensed(None));
        assert_eq!(classify_status("Unlicensed"), Unlicensed);
        assert_eq!(classify_status("Unlicensed (Unrestricted)"), Unlicensed);
        assert_eq!(classify_status("Unlicensed (Restricted)"), Restricted);
        assert_eq!(classify_status("Unknown"), Unknown);
        assert_eq!(classify_status("Something new"), Unknown);
    }

    #[test]
    fn an_excerpt_of_two_gpus_keeps_both_statuses() {
        // `nvidia-smi -q | grep -i -A2 licensed` on a guest with two vGPUs.
        let text = "\
    vGPU Software Licensed Product
        Product Name                      : NVIDIA RTX Virtual Workstation
        License Status                    : Unlicensed (Restricted)
    vGPU Software Licensed Product
        Product Name                      : NVIDIA RTX Virtual Workstation
        License Status                    : Licensed (Expiry: 2030-1-1 0:0:0 GMT)
";
        let snap = parse_text(text);
        let statuses: Vec<_> = snap
            .gpus
            .iter()
            .map(|g| g.license_status.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(
            statuses,
            [
                "Unlicensed (Restricted)",
                "Licensed (Expiry: 2030-1-1 0:0:0 GMT)"
            ]
        );
        assert!(snap.gpus.iter().all(|g| g.edition.is_some()));
        // Bare status lines, one per GPU.
        let snap = parse_text("License Status : Licensed\nLicense Status : Unlicensed\n");
        assert_eq!(snap.gpus.len(), 2);
    }

    #[test]
    fn two_gpus_sections_tracked() {
        let text = "\
Attached GPUs                             : 2
GPU 00000000:02:01.0
    Product Name                          : NVIDIA L40S-24Q
    GPU Virtualization Mode
        Virtualization Mode               : VGPU
    vGPU Heterogeneous Mode               : Disabled
    vGPU Software Licensed Product
        Product Name                      : NVIDIA RTX Virtual Workstation
        License Status                    : Unlicensed (Restricted)
    PCI
        Bus                               : 0x02
GPU 00000000:03:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    GPU Virtualization Mode
        Virtualization Mode               : Pass-Through
";
        let s = parse_text(text);
        assert!(s.whole);
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].profile.as_deref(), Some("NVIDIA L40S-24Q"));
        assert_eq!(
            s.gpus[0].edition.as_deref(),
            Some("NVIDIA RTX Virtual Workstation")
        );
        assert_eq!(
            s.gpus[0].license_status.as_deref(),
            Some("Unlicensed (Restricted)")
        );
        assert_eq!(
            s.gpus[1].virtualization_mode.as_deref(),
            Some("Pass-Through")
        );
        assert!(!s.gpus[1].has_license_section);
    }

    #[test]
    fn indentation_lost() {
        let text = "GPU 00000000:02:01.0\nProduct Name : GRID A100-4C\nMIG Mode\nCurrent : Disabled\n\
vGPU Software Licensed Product\nProduct Name : NVIDIA Virtual Compute Server\nLicense Status : Licensed\n";
        let s = parse_text(text);
        assert_eq!(s.gpus[0].profile.as_deref(), Some("GRID A100-4C"));
        assert_eq!(
            s.gpus[0].edition.as_deref(),
            Some("NVIDIA Virtual Compute Server")
        );
    }

    #[test]
    fn xml_output() {
        let xml = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>550.90.07</driver_version>
  <attached_gpus>1</attached_gpus>
  <gpu id="00000000:02:01.0">
    <product_name>GRID RTX6000-1Q</product_name>
    <gpu_virtualization_mode>
      <virtualization_mode>VGPU</virtualization_mode>
      <host_vgpu_mode>N/A</host_vgpu_mode>
    </gpu_virtualization_mode>
    <vgpu_software_licensed_product>
      <licensed_product_name>NVIDIA RTX Virtual Workstation</licensed_product_name>
      <license_status>Licensed (Expiry: 2024-12-14 17:16:31 GMT)</license_status>
    </vgpu_software_licensed_product>
  </gpu>
</nvidia_smi_log>"#;
        let s = parse(xml.as_bytes()).unwrap();
        assert_eq!(s.driver_version.as_deref(), Some("550.90.07"));
        assert_eq!(s.gpus[0].bus_id.as_deref(), Some("00000000:02:01.0"));
        assert_eq!(s.gpus[0].virtualization_mode.as_deref(), Some("VGPU"));
        assert!(s.gpus[0].has_license_section);
        assert!(
            parse(b"<html></html>")
                .unwrap_err()
                .contains("nvidia_smi_log")
        );
        assert!(parse(b"<nvidia_smi_log>").is_err());
    }

    /// An output pasted twice (or two readings one after the other) lists each GPU twice:
    /// each is one GPU, the later listing kept.
    #[test]
    fn a_gpu_listed_twice_is_one_gpu() {
        let gpu = |bus: &str, status: &str| {
            format!(
                "GPU {bus}\n    Product Name : NVIDIA L40S-24Q\n    vGPU Software Licensed Product\n        Product Name : NVIDIA RTX Virtual Workstation\n        License Status : {status}\n"
            )
        };
        let once = gpu("00000000:02:00.0", "Unlicensed (Unrestricted)")
            + &gpu("00000000:03:00.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)");
        let later = gpu("00000000:02:00.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
            + &gpu("00000000:03:00.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)");
        let s = parse(format!("{once}{later}").as_bytes()).unwrap();
        let seen: Vec<_> = s
            .gpus
            .iter()
            .map(|g| {
                (
                    g.bus_id.as_deref().unwrap(),
                    g.license_status.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("00000000:02:00.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)"),
                ("00000000:03:00.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
            ]
        );
    }

    #[test]
    fn an_xml_fragment_is_read_as_if_nvidia_smi_log_enclosed_it() {
        let gpu = |bus: &str, status: &str| {
            format!(
                "<gpu id=\"{bus}\">\n\t<product_name>NVIDIA RTX Pro 6000 Blackwell DC-48C</product_name>\n\
                 \t<vgpu_software_licensed_product>\n\
                 \t\t<licensed_product_name>NVIDIA Virtual Compute Server</licensed_product_name>\n\
                 \t\t<license_status>{status}</license_status>\n\
                 \t</vgpu_software_licensed_product>\n</gpu>\n"
            )
        };
        let two = gpu("00000000:02:01.0", "Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
            + &gpu("00000000:03:01.0", "Unlicensed (Restricted)");
        let header =
            "<?xml version=\"1.0\" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n";
        for text in [two.clone(), format!("{header}{two}")] {
            let s = parse(text.as_bytes()).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(!s.whole, "a fragment is an excerpt");
            let seen: Vec<_> = s
                .gpus
                .iter()
                .map(|g| (g.bus_id.as_deref(), g.license_status.as_deref()))
                .collect();
            assert_eq!(
                seen,
                [
                    (
                        Some("00000000:02:01.0"),
                        Some("Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
                    ),
                    (Some("00000000:03:01.0"), Some("Unlicensed (Restricted)")),
                ]
            );
        }
        // One GPU's element alone, and the inside of one.
        let one = parse(gpu("00000000:02:01.0", "Unlicensed").as_bytes()).unwrap();
        assert_eq!(one.gpus.len(), 1);
        let inside = "<product_name>GRID A100-4C</product_name>\n<vgpu_software_licensed_product>\n\
            <licensed_product_name>NVIDIA Virtual Compute Server</licensed_product_name>\n\
            <license_status>Unlicensed (Restricted)</license_status>\n</vgpu_software_licensed_product>\n";
        let s = parse(inside.as_bytes()).unwrap();
        assert_eq!(s.gpus[0].profile.as_deref(), Some("GRID A100-4C"));
        assert_eq!(
            s.gpus[0].license_status.as_deref(),
            Some("Unlicensed (Restricted)")
        );
        // A whole output without its header is whole.
        let s = parse(format!("<nvidia_smi_log>{two}</nvidia_smi_log>").as_bytes()).unwrap();
        assert!(s.whole && s.gpus.len() == 2);
        // Other XML, and a whole output cut short, are still refused.
        assert!(parse(b"<a>1</a><b>2</b>").is_err());
        assert!(parse(b"<nvidia_smi_log><gpu>").is_err());
        assert!(parse(gpu("x", "Licensed").trim_end_matches(">\n").as_bytes()).is_err());
    }

    #[test]
    fn log_prefixes_quoting_and_listing_numbers_are_taken_off() {
        let status = |text: &str| {
            let s = parse_text(text);
            (
                s.gpus.first().and_then(|g| g.license_status.clone()),
                s.gpus.first().and_then(|g| g.edition.clone()),
            )
        };
        let want = (
            Some("Licensed (Expiry: 2024-5-27 0:8:28 GMT)".to_string()),
            Some("NVIDIA RTX Virtual Workstation".to_string()),
        );
        // A CI log's ISO times, with the section's indentation after them.
        let iso = "2024-05-27T00:08:28.123Z     vGPU Software Licensed Product\n\
2024-05-27T00:08:28.124Z         Product Name                      : NVIDIA RTX Virtual Workstation\n\
2024-05-27T00:08:28.125Z         License Status                    : Licensed (Expiry: 2024-5-27 0:8:28 GMT)\n";
        assert_eq!(status(iso), want);
        // syslog's time and `host program:` (a playbook's output in the journal).
        let syslog = "May 27 00:08:28 host ansible:     vGPU Software Licensed Product\n\
May 27 00:08:28 host ansible:         Product Name : NVIDIA RTX Virtual Workstation\n\
May 27 00:08:28 host ansible[77]:         License Status : Licensed (Expiry: 2024-5-27 0:8:28 GMT)\n";
        assert_eq!(status(syslog), want);
        // Ansible's `stdout_lines`, quoted one per line.
        let ansible = "TASK [check the license] *****\nok: [vm1] => {\n    \"out.stdout_lines\": [\n\
        \"    vGPU Software Licensed Product\",\n\
        \"        Product Name                      : NVIDIA RTX Virtual Workstation\",\n\
        \"        License Status                    : Licensed (Expiry: 2024-5-27 0:8:28 GMT)\"\n    ]\n}\n";
        assert_eq!(status(ansible), want);
        // Flattened onto one line, after a log's time.
        let flat = "2024-05-27T00:08:28Z vGPU Software Licensed Product Product Name : NVIDIA RTX Virtual Workstation License Status : Licensed (Expiry: 2024-5-27 0:8:28 GMT)";
        assert_eq!(status(flat), want);
        // A key is never taken for a program's name: nvidia-smi pads it before its colon.
        let s = parse_text("2024-05-27T00:08:28Z License Status : Unlicensed\n");
        assert_eq!(s.gpus[0].license_status.as_deref(), Some("Unlicensed"));
        // A line is one GPU's, however many times it repeats a key.
        let s =
            parse_text("License Status : Licensed (Expiry: License Status : Licensed (Expiry: ");
        assert_eq!(s.gpus.len(), 1);
        // A sentence naming one key is no flattened section.
        let s = parse_text("the License Status : Unlicensed line\n");
        assert!(s.gpus.iter().all(|g| g.edition.is_none()));
    }

    #[test]
    fn the_hosts_vgpu_q_fills_host_vgpus_never_a_guests_status() {
        let text = "GPU 00000000:01:00.0\n    Active vGPUs : 1\n    vGPU ID : 3251634190\n\
        VM Name : vm1\n        vGPU Name : NVIDIA RTXA6000-2Q\n        vGPU UUID : c47a3625-859f-11f1-84fe-7572c7d51d3e\n\
        Guest Driver Version : 550.90.07\n\
        License Status : Licensed (Expiry: 2030-1-1 0:0:0 GMT)\n";
        let s = parse_text(text);
        assert!(s.host_view);
        assert!(s.gpus.is_empty());
        assert_eq!(s.host_vgpus.len(), 1);
        let v = &s.host_vgpus[0];
        assert_eq!(v.gpu_bus_id.as_deref(), Some("00000000:01:00.0"));
        assert_eq!(v.vm_name.as_deref(), Some("vm1"));
        assert_eq!(v.profile.as_deref(), Some("NVIDIA RTXA6000-2Q"));
        assert_eq!(
            v.vgpu_uuid.as_deref(),
            Some("c47a3625-859f-11f1-84fe-7572c7d51d3e")
        );
        assert_eq!(v.guest_driver.as_deref(), Some("550.90.07"));
        assert_eq!(
            v.license_status.as_deref(),
            Some("Licensed (Expiry: 2030-1-1 0:0:0 GMT)")
        );
        // No vGPU active: still the host's view.
        let s = parse_text("GPU 00000000:01:00.0\n    Active vGPUs : 0\n");
        assert!(s.host_view && s.host_vgpus.is_empty());
        // A guest's own output is not.
        assert!(
            !parse_text("vGPU Software Licensed Product\nLicense Status : Licensed\n").host_view
        );
    }

    #[test]
    fn vgpu_profiles_and_both_names_of_an_edition() {
        for p in [
            "A10-12Q",
            "GRID A100-4C",
            "NVIDIA L40S-24Q",
            "NVIDIA H100L-1-12C",
            "NVIDIA H100-80C",
        ] {
            assert!(is_vgpu_profile(p), "{p}");
        }
        for p in [
            "NVIDIA H100 80GB HBM3",
            "Tesla V100-SXM2-32GB",
            "NVIDIA A100-SXM4-40GB",
            "Tesla T4",
            "",
            "-",
        ] {
            assert!(!is_vgpu_profile(p), "{p}");
        }
        assert!(same_edition(
            "NVIDIA vGPU for Compute",
            "NVIDIA Virtual Compute Server"
        ));
        assert!(same_edition(
            "nvidia vgpu for compute ",
            "NVIDIA vGPU for Compute"
        ));
        assert!(!same_edition(
            "NVIDIA vGPU for Compute",
            "NVIDIA RTX Virtual Workstation"
        ));
        assert_eq!(canonical_edition("NVIDIA Virtual PC"), "NVIDIA Virtual PC");
    }
}
