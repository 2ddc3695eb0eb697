//! `nvidia-smi -q` (text, whole or an excerpt, indentation kept or lost) and `nvidia-smi -q -x`
//! (XML) into a per-GPU snapshot. Unknown lines are ignored, so new driver branches that add
//! lines do not break parsing.

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
pub fn parse(input: &[u8]) -> Result<SmiSnapshot, String> {
    let text = String::from_utf8_lossy(input);
    let trimmed = text.trim_start();
    if trimmed.starts_with('<') {
        parse_xml(trimmed)
    } else {
        Ok(parse_text(&text))
    }
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

/// Parses `nvidia-smi -q` text, whole or an excerpt.
pub fn parse_text(text: &str) -> SmiSnapshot {
    let mut snap = SmiSnapshot::default();
    // The section a key belongs to: its lowercased header and the header's indentation.
    let mut section: Option<(String, usize)> = None;
    for raw in text.lines() {
        let indent = indent_of(raw);
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if lower.contains("nvsmi log") || lower.starts_with("attached gpus") {
            snap.whole = true;
        }
        if snap.driver_error.is_none() && DRIVER_ERRORS.iter().any(|e| lower.contains(e)) {
            snap.driver_error = Some(line.to_string());
            continue;
        }
        if let Some(id) = line.strip_prefix("GPU ").map(str::trim)
            && is_bus_id(id)
        {
            snap.gpus.push(SmiGpu {
                bus_id: Some(id.to_string()),
                ..SmiGpu::default()
            });
            section = None;
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            // A section header.
            section = Some((lower, indent));
            if section
                .as_ref()
                .is_some_and(|s| s.0 == "vgpu software licensed product")
            {
                current(&mut snap).has_license_section = true;
            }
            continue;
        };
        if let Some((_, sec_indent)) = &section
            && indent <= *sec_indent
            && (indent > 0 || *sec_indent > 0)
        {
            section = None;
        }
        let key = key.trim();
        let value = value.trim();
        let value = (!value.is_empty()).then(|| value.to_string());
        let in_license = section
            .as_ref()
            .is_some_and(|s| s.0 == "vgpu software licensed product");
        if key.eq_ignore_ascii_case("Timestamp") {
            snap.timestamp = value.as_deref().and_then(parse_smi_timestamp);
        } else if key.eq_ignore_ascii_case("Driver Version") {
            snap.driver_version = value;
        } else if key.eq_ignore_ascii_case("Product Name") {
            if in_license {
                let gpu = current_for(&mut snap, |g| g.edition.is_some());
                gpu.edition = value;
                gpu.has_license_section = true;
            } else if section.is_none() {
                let gpu = current(&mut snap);
                if gpu.profile.is_none() {
                    gpu.profile = value;
                }
            }
        } else if key.eq_ignore_ascii_case("License Status") {
            let gpu = current_for(&mut snap, |g| g.license_status.is_some());
            gpu.license_status = value;
            gpu.has_license_section = true;
        } else if key.eq_ignore_ascii_case("Virtualization Mode") {
            current(&mut snap).virtualization_mode = value;
        }
    }
    snap
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

/// Parses `nvidia-smi -q -x`.
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
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        // nvidia-smi -q -x of eight GPUs is about 5000 nodes.
        nodes_limit: 1_000_000,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, opts)
        .map_err(|e| format!("not valid nvidia-smi XML: {e}"))?;
    let root = doc.root_element();
    if root.tag_name().name() != "nvidia_smi_log" {
        return Err(format!(
            "XML but not nvidia-smi -q -x output (root element <{}>, expected <nvidia_smi_log>)",
            root.tag_name().name()
        ));
    }
    let child_text = |n: roxmltree::Node, path: &[&str]| -> Option<String> {
        let mut node = n;
        for name in path {
            node = node.children().find(|c| c.has_tag_name(*name))?;
        }
        node.text()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
    };
    let mut snap = SmiSnapshot {
        whole: true,
        driver_version: child_text(root, &["driver_version"]),
        timestamp: child_text(root, &["timestamp"]).and_then(|t| parse_smi_timestamp(&t)),
        ..SmiSnapshot::default()
    };
    for gpu in root.children().filter(|c| c.has_tag_name("gpu")) {
        let lic = gpu
            .children()
            .find(|c| c.has_tag_name("vgpu_software_licensed_product"));
        snap.gpus.push(SmiGpu {
            bus_id: gpu.attribute("id").map(String::from),
            profile: child_text(gpu, &["product_name"]),
            virtualization_mode: child_text(
                gpu,
                &["gpu_virtualization_mode", "virtualization_mode"],
            ),
            license_status: lic.and_then(|l| child_text(l, &["license_status"])),
            edition: lic.and_then(|l| child_text(l, &["licensed_product_name"])),
            has_license_section: lic.is_some(),
        });
    }
    Ok(snap)
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
}
