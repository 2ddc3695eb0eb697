//! Clones and restored snapshots: a copy of a guest carries nvidia-gridd's client state
//! (`/var/lib/nvidia/GridLicensing`) and may present itself to the DLS as the same client as
//! the original. At boot, before nvidia-gridd starts (`vgpu-license-agent-identity.service`),
//! this guest's identity is compared with the one recorded at the last boot; when it changed,
//! gridd's client state is moved aside (kept, never deleted) and the change recorded for the
//! service to report once, as an event of kind `clone_detected`.
//!
//! The identity is the DMI product UUID (new for every KubeVirt VM, and for a clone) and the
//! machine-id (new when the image was sealed, the same on a cloned disk); either changing is a
//! new machine. The MAC addresses are recorded and shown, but alone they do not count: a NIC
//! added or replaced is not a clone. Nor does a transient machine-id (a stateless image's,
//! new at every boot): only the product UUID tells such a guest from another.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use chrono::Utc;
use serde::Deserialize;

use crate::files::fsutil;
use crate::files::input::{self, Links};
use crate::model::config::Settings;
use crate::model::text::show_path;

pub use crate::files::layout::{CLONE_FILE, CLONE_SEEN_FILE, IDENTITY_FILE};
use crate::model::identity::{CloneDetected, Identity};

/// Reads this machine's identity below `root` (`/` on a guest; a fixture tree in tests).
pub fn read(root: &Path) -> Identity {
    let text = |rel: &str| {
        input::read_text(&root.join(rel), 4096, Links::Follow)
            .ok()
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
    };
    let mut macs: Vec<String> = fs::read_dir(root.join("sys/class/net"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name() != "lo")
                .filter_map(|e| input::read_text(&e.path().join("address"), 64, Links::Follow).ok())
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|m| !m.is_empty() && m != "00:00:00:00:00:00")
                .collect()
        })
        .unwrap_or_default();
    macs.sort();
    macs.dedup();
    Identity {
        // A machine-id made at this boot says nothing of the machine: not compared.
        machine_id: text("etc/machine-id").filter(|_| !transient_machine_id(root)),
        product_uuid: text("sys/class/dmi/id/product_uuid"),
        macs,
    }
}

/// This boot's ID, as the kernel gives it (`None` where it cannot be read).
pub fn boot_id() -> Option<String> {
    let id = input::read_text(
        Path::new("/proc/sys/kernel/random/boot_id"),
        64,
        Links::Refuse,
    )
    .ok()?;
    Some(id.trim().to_string()).filter(|s| !s.is_empty())
}

/// Whether `/etc/machine-id` is the transient one systemd makes at each boot of a stateless
/// image (an empty or missing `/etc/machine-id`): it mounts a new ID over the file, from
/// `/run/machine-id`, so the file is a mount point (`proc/self/mountinfo`, read below `root`).
/// Such an ID is new at every boot; taken for a new machine, gridd's client state would be
/// moved aside at every boot.
pub fn transient_machine_id(root: &Path) -> bool {
    input::read_text(&root.join("proc/self/mountinfo"), 4 << 20, Links::Follow).is_ok_and(|info| {
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some("/etc/machine-id"))
    })
}

/// What [`check`] did.
#[derive(Debug, PartialEq)]
pub enum Checked {
    /// No identity was recorded: this one is now.
    Recorded,
    Unchanged,
    Clone(Box<CloneDetected>),
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    input::read_file(path, 1 << 20, Links::Refuse)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// The boot-time check: compares, moves gridd's client state aside on a clone, records.
pub fn check(settings: &Settings, root: &Path) -> anyhow::Result<Checked> {
    crate::files::layout::check_state_dir(settings)?;
    let state = &settings.paths.state_dir;
    fsutil::create_dir_mode(state, 0o755)
        .with_context(|| format!("cannot create {}", show_path(state)))?;
    let now = read(root);
    let recorded: Option<Identity> = read_json(&state.join(IDENTITY_FILE));
    let result = match recorded {
        None => Checked::Recorded,
        Some(old) if !now.is_another_machine_than(&old) => Checked::Unchanged,
        Some(old) => {
            let stamp = Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
            let moved_to = move_client_state(settings, &stamp)?;
            let record = CloneDetected {
                at: crate::model::time::whole_secs(Utc::now()),
                old,
                new: now.clone(),
                moved_to,
            };
            let json = serde_json::to_vec_pretty(&record)?;
            fsutil::write_atomic(&state.join(CLONE_FILE), &json, 0o644)
                .with_context(|| format!("cannot write {}", show_path(&state.join(CLONE_FILE))))?;
            Checked::Clone(Box::new(record))
        }
    };
    if result != Checked::Unchanged {
        let json = serde_json::to_vec_pretty(&now)?;
        fsutil::write_atomic(&state.join(IDENTITY_FILE), &json, 0o644)
            .with_context(|| format!("cannot write {}", show_path(&state.join(IDENTITY_FILE))))?;
    }
    Ok(result)
}

/// The names of nvidia-gridd's own client state directories: all that such a directory holds
/// is gridd's.
pub const CLIENT_STATE_DIR_NAMES: [&str; 2] = ["GridLicensing", "vGPULicensing"];

/// The entries of one of `paths.gridd_client_state`, once it is known to hold only gridd's
/// client state: a directory named as gridd names its own (any content is gridd's), or one
/// that holds nothing but such directories. Anything else (`/var/lib`, a directory shared with
/// other programs) is refused with the path named, so that a path one level too wide is never
/// emptied or moved aside. `then` ends the error: what was (not) done.
pub fn client_state_entries(dir: &Path, then: &str) -> anyhow::Result<Vec<(OsString, PathBuf)>> {
    let own = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| CLIENT_STATE_DIR_NAMES.contains(&n));
    crate::files::dir::managed_entries(dir, |name, m| {
        own || (m.is_dir() && CLIENT_STATE_DIR_NAMES.contains(&name))
    })
    .map_err(|e| match e {
        crate::files::dir::ManagedDirError::Unexpected(names) => anyhow!(
            "nvidia-gridd's client state {} (paths.gridd_client_state) holds what is not gridd's client state ({}): only gridd's own directories ({}) are ever emptied or moved; point paths.gridd_client_state at them in the agent's config; {then}",
            show_path(dir),
            shown(&names),
            CLIENT_STATE_DIR_NAMES
                .map(|n| format!("/var/lib/nvidia/{n}"))
                .join(", "),
        ),
        e => anyhow!(
            "nvidia-gridd's client state {} (paths.gridd_client_state) {e}; {then}",
            show_path(dir)
        ),
    })
}

fn shown(names: &[String]) -> String {
    crate::model::text::few_and_count(names)
}

/// Moves the content of gridd's client state directories into
/// `<state_dir>/replaced/<stamp>-clone/`; `None` when there was nothing to move.
fn move_client_state(settings: &Settings, stamp: &str) -> anyhow::Result<Option<PathBuf>> {
    let mut plan = Vec::new();
    for dir in &settings.paths.gridd_client_state {
        let entries = client_state_entries(dir, "nothing was moved")?;
        for (name, path) in entries {
            plan.push((dir.clone(), name, path));
        }
    }
    if plan.is_empty() {
        return Ok(None);
    }
    let replaced = settings
        .paths
        .state_dir
        .join(crate::files::layout::REPLACED_DIR);
    fsutil::create_dir_mode(&replaced, 0o700)?;
    let into = fsutil::create_unique_dir(&replaced, &format!("{stamp}-clone"), 0o700)?;
    let mut moved: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (dir, name, path) in plan {
        let sub = into.join(dir.file_name().unwrap_or_default());
        let result: io::Result<()> = (|| {
            fs::create_dir_all(&sub)?;
            let to = sub.join(&name);
            fsutil::move_path(&path, &to)?;
            moved.push((to, path.clone()));
            Ok(())
        })();
        if let Err(e) = result {
            // Back where it was: gridd finds its state as before, and the next boot tries again.
            for (to, from) in moved.iter().rev() {
                let _ = fsutil::move_path(to, from);
            }
            return Err(anyhow!(
                "cannot move {} aside into {}: {e}; nothing was moved",
                show_path(&path),
                show_path(&into)
            ));
        }
    }
    Ok(Some(into))
}

/// For the service: a clone found at this boot, not reported yet. Marks it reported.
pub fn take_unreported(settings: &Settings) -> Option<CloneDetected> {
    let state = &settings.paths.state_dir;
    let record: CloneDetected = read_json(&state.join(CLONE_FILE))?;
    let _ = fs::rename(state.join(CLONE_FILE), state.join(CLONE_SEEN_FILE));
    Some(record)
}

/// `vgpu-license-agent check-identity`.
pub fn run(settings: &Settings, root: &Path) -> anyhow::Result<()> {
    match check(settings, root)? {
        Checked::Recorded => println!("recorded this guest's identity"),
        Checked::Unchanged => println!("the same guest as at the last boot"),
        Checked::Clone(c) => println!("{}", crate::model::text::escape(&c.message())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(d: &Path, machine_id: &str, uuid: &str, mac: &str) {
        fs::create_dir_all(d.join("etc")).unwrap();
        fs::write(d.join("etc/machine-id"), format!("{machine_id}\n")).unwrap();
        fs::create_dir_all(d.join("sys/class/dmi/id")).unwrap();
        fs::write(d.join("sys/class/dmi/id/product_uuid"), format!("{uuid}\n")).unwrap();
        fs::create_dir_all(d.join("sys/class/net/eth0")).unwrap();
        fs::write(d.join("sys/class/net/eth0/address"), format!("{mac}\n")).unwrap();
    }

    #[test]
    fn a_changed_uuid_or_machine_id_is_a_clone_a_new_mac_alone_is_not() {
        let old = Identity {
            machine_id: Some("a".into()),
            product_uuid: Some("u".into()),
            macs: vec!["m".into()],
        };
        let mut new = old.clone();
        new.macs = vec!["n".into()];
        assert!(!new.is_another_machine_than(&old));
        new.product_uuid = Some("v".into());
        assert!(new.is_another_machine_than(&old));
        let mut new = old.clone();
        new.machine_id = Some("b".into());
        assert!(new.is_another_machine_than(&old));
        let mut new = old.clone();
        new.machine_id = None;
        assert!(!new.is_another_machine_than(&old));
    }

    #[test]
    fn identity_is_read_from_a_root() {
        let d = tempfile::tempdir().unwrap();
        root_with(d.path(), "ABC", "1234-UUID", "52:54:00:AA:BB:CC");
        let i = read(d.path());
        assert_eq!(i.machine_id.as_deref(), Some("abc"));
        assert_eq!(i.product_uuid.as_deref(), Some("1234-uuid"));
        assert_eq!(i.macs, vec!["52:54:00:aa:bb:cc"]);
    }
}
