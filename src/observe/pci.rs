//! The guest's PCI bus, from sysfs: is there an NVIDIA GPU at all, and is a driver bound to
//! it? That tells a VM without a vGPU (`no_gpu`: nothing to license, never an alert) from one
//! whose driver is missing or broken (`no_driver`), before nvidia-smi is asked anything.

use std::path::{Path, PathBuf};

/// NVIDIA's PCI vendor id.
pub const NVIDIA_VENDOR: &str = "0x10de";

/// One NVIDIA display-class device (a GPU, a vGPU, a virtual function).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its address, e.g. `0000:02:01.0`.
    pub address: String,
    /// The kernel driver bound to it (`nvidia`, `nouveau`, `vfio-pci`), if any.
    pub driver: Option<String>,
}

/// What the PCI bus shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bus {
    pub gpus: Vec<Device>,
}

impl Bus {
    /// A one-line description of the NVIDIA devices and their drivers.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .gpus
            .iter()
            .take(4)
            .map(|d| match &d.driver {
                Some(drv) => format!("{} (driver {drv})", d.address),
                None => format!("{} (no driver bound)", d.address),
            })
            .collect();
        if self.gpus.len() > 4 {
            parts.push(format!("and {} more", self.gpus.len() - 4));
        }
        parts.join(", ")
    }

    /// Whether some NVIDIA device has the NVIDIA driver bound.
    pub fn nvidia_driver_bound(&self) -> bool {
        self.gpus
            .iter()
            .any(|d| d.driver.as_deref() == Some("nvidia"))
    }
}

/// Reads `devices` (sysfs `/sys/bus/pci/devices`). `None` when it cannot be read (no sysfs in
/// this container, say): then nothing is decided from the bus.
pub fn read(devices: &Path) -> Option<Bus> {
    let entries = std::fs::read_dir(devices).ok()?;
    let mut bus = Bus::default();
    // A bus with more devices than any VM has is not worth reading to the end.
    for entry in entries.flatten().take(4096) {
        let dir: PathBuf = entry.path();
        // An attribute that cannot be read for want of the agent's own resources (EMFILE,
        // ENOMEM) leaves the bus unknown, never a bus without the GPU.
        let attr = |name: &str| match crate::files::input::read_text(
            &dir.join(name),
            64,
            crate::files::input::Links::Follow,
        ) {
            Ok(s) => Some(Some(s.trim().to_ascii_lowercase())),
            Err(crate::files::input::ReadError::Io(e))
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOMEM)
                ) =>
            {
                None
            }
            Err(_) => Some(None),
        };
        if attr("vendor")?.as_deref() != Some(NVIDIA_VENDOR) {
            continue;
        }
        // Display controllers only (class 0x03xxxx): a GPU's HDMI audio function is 0x0403.
        if !attr("class")?.is_some_and(|c| c.starts_with("0x03")) {
            continue;
        }
        let driver = std::fs::read_link(dir.join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        bus.gpus.push(Device {
            address: entry.file_name().to_string_lossy().into_owned(),
            driver,
        });
    }
    bus.gpus.sort_by(|a, b| a.address.cmp(&b.address));
    Some(bus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn device(root: &Path, addr: &str, vendor: &str, class: &str, driver: Option<&str>) {
        let d = root.join(addr);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
        fs::write(d.join("class"), format!("{class}\n")).unwrap();
        if let Some(drv) = driver {
            let target = root.join("drivers").join(drv);
            fs::create_dir_all(&target).unwrap();
            std::os::unix::fs::symlink(&target, d.join("driver")).unwrap();
        }
    }

    #[test]
    fn tells_no_nvidia_device_from_a_device_without_a_driver() {
        let t = tempfile::tempdir().unwrap();
        let devs = t.path().join("devices");
        fs::create_dir_all(&devs).unwrap();
        // A virtio NIC and an Intel bridge: no GPU.
        device(
            &devs,
            "0000:00:01.0",
            "0x1af4",
            "0x020000",
            Some("virtio-pci"),
        );
        device(&devs, "0000:00:00.0", "0x8086", "0x060000", None);
        // An NVIDIA HDMI audio function alone is no GPU.
        device(
            &devs,
            "0000:03:00.1",
            "0x10de",
            "0x040300",
            Some("snd_hda_intel"),
        );
        assert_eq!(read(&devs).unwrap().gpus, vec![]);
        device(&devs, "0000:02:01.0", "0x10DE", "0x030200", None);
        let bus = read(&devs).unwrap();
        assert_eq!(bus.gpus.len(), 1);
        assert!(!bus.nvidia_driver_bound());
        assert_eq!(bus.describe(), "0000:02:01.0 (no driver bound)");
        fs::remove_dir_all(devs.join("0000:02:01.0")).unwrap();
        device(&devs, "0000:02:01.0", "0x10de", "0x030000", Some("nvidia"));
        assert!(read(&devs).unwrap().nvidia_driver_bound());
        assert_eq!(read(&t.path().join("absent")), None);
    }
}
