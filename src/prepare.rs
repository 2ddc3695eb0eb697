//! `prepare-image`: ready a golden image so that clones start clean: no token (each clone gets
//! its own through cloud-init or `install`), no agent state (old tokens kept aside, install
//! records, live report, metrics), and, with `--purge-client-state`, none of nvidia-gridd's
//! client state.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;

use crate::config::Settings;
use crate::fsutil;

/// What `prepare-image` removed (or, in a dry run, would remove) and what it left.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prepared {
    pub dry_run: bool,
    /// Removed (or to be removed), in order.
    pub removed: Vec<PathBuf>,
    /// gridd's client state directories that hold something, with their entries, left in
    /// place (without `--purge-client-state`).
    pub client_state_left: Vec<(PathBuf, usize)>,
}

impl Prepared {
    /// The lines printed on standard output.
    pub fn lines(&self) -> Vec<String> {
        let verb = if self.dry_run {
            "would remove"
        } else {
            "removed"
        };
        let mut out: Vec<String> = self
            .removed
            .iter()
            .map(|p| format!("{verb} {}", crate::text::show_path(p)))
            .collect();
        if self.removed.is_empty() {
            out.push("no token and no agent state to remove".into());
        }
        for (dir, n) in &self.client_state_left {
            out.push(format!(
                "left in place: nvidia-gridd's client state {} ({n} entries); clones must not share it: run again with --purge-client-state",
                crate::text::show_path(dir)
            ));
        }
        out.push(
            "before sealing the image: stop nvidia-gridd and vgpu-license-agent (systemctl stop nvidia-gridd.service vgpu-license-agent.service) so they write nothing more, and reset /etc/machine-id with your sealing tool (virt-sysprep --operations machine-id, or truncate -s 0 /etc/machine-id)".into(),
        );
        out
    }
}

fn entries(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(fsutil::list_dir(dir)?.into_iter().map(|(_, p)| p).collect())
}

/// Removes the token and the agent's state (and gridd's client state with `purge`).
pub fn prepare(settings: &Settings, purge: bool, dry_run: bool) -> anyhow::Result<Prepared> {
    let paths = &settings.paths;
    let cannot = |what: &Path, e: io::Error| {
        anyhow!(
            "cannot read {}: {e}; check it and run prepare-image again",
            crate::text::show_path(what)
        )
    };
    // Hold the install lock, so that no install or adopt runs meanwhile.
    let _lock = if !dry_run && paths.state_dir.is_dir() {
        Some(
            fsutil::lock(
                &paths.state_dir.join("install.lock"),
                settings.commands.timeout * 2 + Duration::from_secs(30),
            )
            .map_err(|_| {
                anyhow!(
                    "cannot take the lock in {}: an install is running; wait for it and run prepare-image again",
                    crate::text::show_path(&paths.state_dir)
                )
            })?,
        )
    } else {
        None
    };
    // Every directory is checked before anything is removed: one that is a symlink or holds
    // what is not the agent's stops the whole command, with nothing removed.
    let mut plan: Vec<PathBuf> = crate::install::token_dir_entries(settings)?
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    crate::install::check_state_dir(settings)?;
    plan.extend(entries(&paths.state_dir).map_err(|e| cannot(&paths.state_dir, e))?);
    for (key, f) in [
        ("paths.status_file", &paths.status_file),
        ("paths.metrics_textfile", &paths.metrics_textfile),
    ] {
        match f.symlink_metadata() {
            Ok(m) if m.is_file() || m.file_type().is_symlink() => plan.push(f.clone()),
            Ok(_) => {
                return Err(anyhow!(
                    "{} ({key}) is not a file; the agent removes only its own files: check the config; nothing was removed",
                    crate::text::show_path(f)
                ));
            }
            Err(_) => {}
        }
    }
    let mut left = Vec::new();
    for dir in &paths.gridd_client_state {
        // gridd's own directory: any content is its state, but a link out of it is not.
        let inside: Vec<PathBuf> = fsutil::managed_entries(dir, |_, _| true)
            .map_err(|e| {
                anyhow!(
                    "nvidia-gridd's client state {} (paths.gridd_client_state) {e}; nothing was removed",
                    crate::text::show_path(dir)
                )
            })?
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        if inside.is_empty() {
            continue;
        }
        if purge {
            plan.extend(inside);
        } else {
            left.push((dir.clone(), inside.len()));
        }
    }
    // The lock file is no state: it is removed last and silently, held until the end.
    let lock_path = paths.state_dir.join("install.lock");
    plan.retain(|p| *p != lock_path);
    let mut done = Prepared {
        dry_run,
        removed: Vec::new(),
        client_state_left: left,
    };
    for p in plan {
        if !dry_run {
            match fsutil::remove_tree(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(anyhow!(
                        "cannot remove {}: {e}; remove it yourself and run prepare-image again (removed so far: {})",
                        crate::text::show_path(&p),
                        done.removed.len()
                    ));
                }
            }
        }
        done.removed.push(p);
    }
    if !dry_run {
        let _ = std::fs::remove_file(&lock_path);
    }
    Ok(done)
}
