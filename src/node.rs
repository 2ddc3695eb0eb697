//! Where the driver and nvidia-gridd run: on this host, or in a GPU Operator's driver
//! container, and so whether the agent manages or only observes.
//!
//! On a Kubernetes GPU node with NVIDIA's GPU Operator, the GRID guest driver and nvidia-gridd
//! run in the operator's driver container, which shares its root with the node at
//! `paths.driver_root` (`/run/nvidia/driver`); the node has no `nvidia-gridd.service`, and the
//! operator owns the token and gridd.conf (from its licensing Secret) and gridd (started once
//! by the container's entrypoint). There the agent observes only: nvidia-smi is run inside the
//! driver root (`chroot`, as the operator's maintainers advise), the token and gridd.conf are
//! read under it, and nothing is installed, adopted, moved or restarted.
//!
//! A node is one when the driver root holds nvidia-smi, or the operator's validation markers'
//! directory exists beside it (it stays while the driver pod is made again), and the host has
//! no unit of gridd's own. Judged at each observation: the driver pod comes and goes.

use std::path::{Path, PathBuf};

use crate::config::{ServiceMode, Settings};
use crate::node_mode::{Mode, Node};

/// Where gridd's unit files would be on the host.
const UNIT_DIRS: [&str; 4] = [
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
];

/// The operator's validation markers' directory, beside the driver root.
pub fn validations_dir(driver_root: &Path) -> PathBuf {
    driver_root
        .parent()
        .unwrap_or(Path::new("/run/nvidia"))
        .join("validations")
}

/// Whether the operator says its driver container is ready (`.driver-ctr-ready`).
pub fn driver_ready(driver_root: &Path) -> bool {
    validations_dir(driver_root)
        .join(".driver-ctr-ready")
        .exists()
}

/// Whether the host has a unit file of gridd's own.
fn host_unit(unit: &str) -> bool {
    UNIT_DIRS.iter().any(|d| Path::new(d).join(unit).exists())
}

/// Whether `root` is a GPU Operator's driver root in use: it holds nvidia-smi, or the
/// operator's markers are beside it (the driver pod between two lives).
fn operator_root(root: &Path) -> bool {
    ["usr/bin/nvidia-smi", "bin/nvidia-smi"]
        .iter()
        .any(|p| root.join(p).is_file())
        || validations_dir(root).is_dir()
}

/// Looks at this node now (a few `stat`s, no process).
pub fn detect(settings: &Settings) -> Node {
    let root = &settings.paths.driver_root;
    let operator = operator_root(root) && !host_unit(&settings.gridd.unit);
    let driver_root = operator.then(|| root.clone());
    let (mode, manage_refused) = match settings.service.mode {
        ServiceMode::Observe => (Mode::Observe, false),
        ServiceMode::Auto if operator => (Mode::Observe, false),
        ServiceMode::Manage if operator => (Mode::Observe, true),
        ServiceMode::Auto | ServiceMode::Manage => (Mode::Manage, false),
    };
    Node {
        mode,
        driver_ready: driver_root.as_deref().is_some_and(driver_ready),
        node_name: driver_root.as_ref().and_then(|_| node_name()),
        driver_root,
        manage_refused,
    }
}

/// This node's name for a `kubectl` command: `$NODE_NAME` (a pod's downward API), else the
/// host name.
pub fn node_name() -> Option<String> {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(root: &Path) -> Settings {
        let mut s = Settings::default();
        s.paths.driver_root = root.join("run/nvidia/driver");
        s
    }

    #[test]
    fn a_driver_root_with_nvidia_smi_is_a_gpu_operator_node_observed() {
        let d = tempfile::tempdir().unwrap();
        let s = settings(d.path());
        assert_eq!(
            detect(&s).mode,
            Mode::Manage,
            "nothing there: a plain guest"
        );
        let bin = s.paths.driver_root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nvidia-smi"), "").unwrap();
        let n = detect(&s);
        assert_eq!(n.mode, Mode::Observe);
        assert_eq!(
            n.driver_root.as_deref(),
            Some(s.paths.driver_root.as_path())
        );
        let eff = n.apply(&s);
        assert_eq!(
            eff.paths.token_dir,
            s.paths.driver_root.join("etc/nvidia/ClientConfigToken")
        );
        assert_eq!(eff.commands.smi_root.as_ref(), Some(&s.paths.driver_root));

        // The driver pod gone, its markers left: still the operator's node.
        std::fs::remove_dir_all(s.paths.driver_root.join("usr")).unwrap();
        std::fs::create_dir_all(validations_dir(&s.paths.driver_root)).unwrap();
        assert_eq!(detect(&s).mode, Mode::Observe);

        // manage is refused there; observe is observe anywhere.
        let mut m = s.clone();
        m.service.mode = ServiceMode::Manage;
        assert!(detect(&m).manage_refused);
        let mut o = settings(&d.path().join("elsewhere"));
        o.service.mode = ServiceMode::Observe;
        let n = detect(&o);
        assert_eq!((n.mode, n.driver_root), (Mode::Observe, None));
    }
}
