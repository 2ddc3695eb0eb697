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

pub mod journal_boot;

use std::path::{Path, PathBuf};

use crate::model::config::{ServiceMode, Settings};
use crate::model::node::{Mode, Node};

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
    let ready = driver_root.as_deref().is_some_and(driver_ready);
    Node {
        mode,
        driver_ready: ready,
        pod_going: !ready
            && driver_root
                .as_deref()
                .is_some_and(|r| validations_dir(r).is_dir()),
        node_name: driver_root.as_ref().and_then(|_| node_name()),
        driver_root,
        manage_refused,
    }
}

/// What another owner of a driver root could do.
const ROOT_RISK: &str =
    "could make root run any program (the agent runs nvidia-smi there by chroot, as root)";

/// The nvidia-smi that root runs in the driver root `root` by `chroot`, as a path inside the
/// root with no link left on the way (`smi` is `commands.nvidia_smi`: a name, looked for in
/// `usr/bin`, `bin`, `usr/sbin` and `sbin` in that order, or a path inside the root), once
/// every directory on the way and the file itself are found root's alone (the config's rule,
/// [`crate::config::owned_safely`]); a link on the way is followed inside the root, as
/// `chroot` would follow it, and judged by its owner first (a link's own mode means
/// nothing). The path is what `chroot` is given, so that the program run is the file
/// checked, whatever PATH the agent or the root has. An error says which file is refused and
/// whose it is.
pub fn checked_smi(root: &Path, smi: &str) -> Result<PathBuf, String> {
    let inside: PathBuf = if smi.contains('/') {
        PathBuf::from(smi.trim_start_matches('/'))
    } else {
        ["usr/bin", "bin", "usr/sbin", "sbin"]
            .iter()
            .map(|d| Path::new(d).join(smi))
            .find(|p| root.join(p).symlink_metadata().is_ok())
            .unwrap_or_else(|| Path::new("usr/bin").join(smi))
    };
    resolve_in_root(root, &inside).map_err(|p| format!("nvidia-smi is not run: {p}"))
}

/// The most links followed on the way to nvidia-smi (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// One step of the walk to nvidia-smi: a link is refused unless root's or the agent's own
/// user's (the kernel follows it); anything else is held to [`crate::config::owned_safely`].
fn judge_step(host: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let what = format!("{} in the GPU Operator's driver root", host.display());
    if meta.file_type().is_symlink() {
        use std::os::unix::fs::MetadataExt;
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != 0 && meta.uid() != me {
            return Err(format!(
                "{what} is a link owned by uid {}, who {ROOT_RISK}; the agent refuses it",
                meta.uid()
            ));
        }
        return Ok(());
    }
    crate::config::owned_safely(meta, &what, ROOT_RISK)
}

/// A path's parts as a walk takes them: names and `..`, the root and `.` left out.
fn walk_parts(p: &Path) -> Vec<std::ffi::OsString> {
    use std::path::Component;
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// `inside` resolved inside `root` as `chroot root` would resolve it, each step checked; a
/// part that does not exist ends the walk (running it then fails as a missing program).
fn resolve_in_root(root: &Path, inside: &Path) -> Result<PathBuf, String> {
    let meta = root
        .symlink_metadata()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    judge_step(root, &meta)?;
    let mut todo: std::collections::VecDeque<_> = walk_parts(inside).into();
    let mut at = PathBuf::new();
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            // Inside the root, as in any root, `/..` is `/`.
            at.pop();
            continue;
        }
        let host = root.join(&at).join(&part);
        let Ok(meta) = host.symlink_metadata() else {
            at.push(part);
            at.extend(todo);
            break;
        };
        judge_step(&host, &meta)?;
        if !meta.file_type().is_symlink() {
            at.push(part);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(format!(
                "{} leads through more than {MAX_LINKS} links; the agent refuses it",
                host.display()
            ));
        }
        let target = std::fs::read_link(&host).map_err(|e| format!("{}: {e}", host.display()))?;
        if target.is_absolute() {
            at = PathBuf::new();
        }
        for p in walk_parts(&target).into_iter().rev() {
            todo.push_front(p);
        }
    }
    Ok(Path::new("/").join(at))
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

        // A root or an nvidia-smi that another user owns, or may write, is not run.
        use std::os::unix::fs::PermissionsExt;
        let root = &s.paths.driver_root;
        let smi = root.join("usr/bin/nvidia-smi");
        std::fs::create_dir_all(smi.parent().unwrap()).unwrap();
        std::fs::write(&smi, "").unwrap();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&smi, 0o755);
        let at = Ok(PathBuf::from("/usr/bin/nvidia-smi"));
        assert_eq!(checked_smi(root, "nvidia-smi"), at);
        assert_eq!(checked_smi(root, "/usr/bin/nvidia-smi"), at);
        mode(&smi, 0o777);
        let why = checked_smi(root, "nvidia-smi").unwrap_err();
        assert!(
            why.contains("usr/bin/nvidia-smi") && why.contains("writable by other users"),
            "{why}"
        );
        mode(&smi, 0o755);
        mode(&root.join("usr"), 0o775);
        let why = checked_smi(root, "/usr/bin/nvidia-smi").unwrap_err();
        assert!(
            why.contains("/usr in the GPU Operator") && why.contains("0775"),
            "{why}"
        );
        mode(&root.join("usr"), 0o755);
        std::fs::remove_dir_all(root.join("usr")).unwrap();

        // manage is refused there; observe is observe anywhere.
        let mut m = s.clone();
        m.service.mode = ServiceMode::Manage;
        assert!(detect(&m).manage_refused);
        let mut o = settings(&d.path().join("elsewhere"));
        o.service.mode = ServiceMode::Observe;
        let n = detect(&o);
        assert_eq!((n.mode, n.driver_root), (Mode::Observe, None));
    }

    /// A link on the way to nvidia-smi is followed inside the root, as `chroot` follows it,
    /// and what it leads to is checked and is what runs.
    #[test]
    fn links_to_nvidia_smi_are_followed_inside_the_root_and_checked() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let opt = root.join("opt/nvidia");
        std::fs::create_dir_all(&opt).unwrap();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(opt.join("nvidia-smi"), "").unwrap();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&opt.join("nvidia-smi"), 0o755);
        // An absolute link means the root's /opt, not the host's.
        symlink("/opt/nvidia/nvidia-smi", root.join("usr/bin/nvidia-smi")).unwrap();
        assert_eq!(
            checked_smi(root, "nvidia-smi"),
            Ok(PathBuf::from("/opt/nvidia/nvidia-smi"))
        );
        // What the link leads to is judged as nvidia-smi itself would be.
        mode(&opt.join("nvidia-smi"), 0o777);
        let why = checked_smi(root, "nvidia-smi").unwrap_err();
        assert!(
            why.contains("opt/nvidia/nvidia-smi") && why.contains("writable by other users"),
            "{why}"
        );
        mode(&opt.join("nvidia-smi"), 0o755);
        // A merged /usr: bin is a relative link to usr/bin, and `..` stays inside the root.
        std::fs::remove_file(root.join("usr/bin/nvidia-smi")).unwrap();
        symlink(
            "../../../../opt/nvidia/nvidia-smi",
            root.join("usr/bin/nvidia-smi"),
        )
        .unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        assert_eq!(
            checked_smi(root, "/bin/nvidia-smi"),
            Ok(PathBuf::from("/opt/nvidia/nvidia-smi"))
        );
        // A loop of links is refused, not followed forever.
        std::fs::remove_file(root.join("usr/bin/nvidia-smi")).unwrap();
        symlink("nvidia-smi", root.join("usr/bin/nvidia-smi")).unwrap();
        let why = checked_smi(root, "nvidia-smi").unwrap_err();
        assert!(why.contains("more than 40 links"), "{why}");
    }
}
