//! Carrying out an install's plan: new files written next to their targets, strays moved
//! aside, then the renames; every step that changed something is undone on an error before
//! the token is in place.

use super::*;

/// Applies a plan. On an error before the token is renamed into place, everything is undone.
/// Returns the changes as made (stray destinations may differ from the plan's).
/// How to take back one step of [`apply`] that already changed something.
enum Undo {
    Chmod(PathBuf, u32),
    /// Move back from the first path to the second.
    MoveBack(PathBuf, PathBuf),
    RemoveFile(PathBuf),
    /// Remove a directory made for this install (only when empty again).
    RemoveDir(PathBuf),
}

impl Undo {
    fn run(self) {
        let _ = match self {
            Undo::Chmod(p, mode) => fsutil::chmod_dir_no_follow(&p, mode),
            Undo::MoveBack(from, to) => fsutil::move_path(&from, &to),
            Undo::RemoveFile(p) => fs::remove_file(&p),
            Undo::RemoveDir(p) => fs::remove_dir(&p),
        };
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn apply(
    plan: &[Change],
    previous: Option<&Previous>,
    token_bytes: &[u8],
    conf_bytes: &[u8],
    conf_mode: u32,
    conf_owner: Option<(u32, u32)>,
    settings: &Settings,
    replaced_root: &Path,
    stamp: &str,
) -> anyhow::Result<Vec<Change>> {
    let paths = &settings.paths;
    let target = paths.token_path();
    let dir = &paths.token_dir;
    let mut done = Vec::new();
    let write_err = |what: &str, at: &Path, e: io::Error| {
        let fix = match e.raw_os_error() {
            Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT) => {
                "make room on that file system, then run install again"
            }
            Some(nix::libc::EROFS) => {
                "the file system is read-only: remount it read-write (or, for the service, check ReadWritePaths= in its unit), then run install again"
            }
            Some(nix::libc::EPERM) | Some(nix::libc::EACCES) => {
                "run install as root (sudo); under systemd, check the unit's sandbox (ReadWritePaths=, SystemCallFilter=)"
            }
            _ => {
                "check that the directory is writable and the file system healthy, then run install again"
            }
        };
        io_err(
            format!("cannot write {what} in {}", crate::text::show_path(at)),
            e,
            fix,
        )
    };

    // Stage the new files first: nothing visible changes yet. Directories created for them
    // are removed again when staging fails.
    let mut token_stage = None;
    let mut conf_stage = None;
    let mut created_dirs: Vec<PathBuf> = Vec::new();
    let staged = (|| -> anyhow::Result<()> {
        for change in plan {
            match change {
                Change::CreateDir { path, mode } => {
                    let created = fsutil::create_dir_mode(path, *mode)
                        .map_err(|e| write_err("the token directory", path, e))?;
                    created_dirs.extend(created.then(|| path.clone()));
                }
                Change::WriteToken { .. } => {
                    token_stage = Some(
                        fsutil::stage(&target, token_bytes, TOKEN_MODE, None)
                            .map_err(|e| write_err("the new token", dir, e))?,
                    );
                }
                Change::WriteGriddConf { path, .. } => {
                    let parent = path.parent().unwrap_or(Path::new("/"));
                    let created = fsutil::create_dir_mode(parent, 0o755)
                        .map_err(|e| write_err("gridd.conf", parent, e))?;
                    created_dirs.extend(created.then(|| parent.to_path_buf()));
                    conf_stage = Some(
                        fsutil::stage(path, conf_bytes, conf_mode, conf_owner)
                            .map_err(|e| write_err("the new gridd.conf", parent, e))?,
                    );
                }
                _ => {}
            }
        }
        Ok(())
    })();
    if let Err(e) = staged {
        drop(token_stage.take());
        drop(conf_stage.take());
        for d in created_dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
        return Err(e);
    }

    // From here every step that changes something records how to take it back: when a
    // later step fails, they are undone in reverse order (directory modes restored, strays
    // moved back, the copy of the previous token and the directories made for it removed), so
    // "nothing was changed" stays true.
    let mut undo: Vec<Undo> = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        // Small fixes first: one that fails leaves the strays where they are.
        for change in plan {
            match change {
                Change::CreateDir { .. } | Change::ChmodDir { .. } => {
                    if let Change::ChmodDir { path, from, to } = change {
                        fsutil::chmod_dir_no_follow(path, *to).map_err(|e| {
                            io_err(
                                format!(
                                    "cannot change the mode of {}",
                                    crate::text::show_path(path)
                                ),
                                e,
                                "check the file system",
                            )
                        })?;
                        undo.push(Undo::Chmod(path.clone(), *from));
                    }
                    done.insert(0, change.clone());
                }
                // Our own leftovers: removing one again is nothing to undo.
                Change::RemoveTemp { path } => match fs::remove_file(path) {
                    Ok(()) => done.push(change.clone()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(io_err(
                            format!("cannot remove {}", crate::text::show_path(path)),
                            e,
                            "remove it yourself",
                        ));
                    }
                },
                _ => {}
            }
        }
        // Move strays (and keep the previous token) aside.
        let aside: Vec<&Change> = plan
            .iter()
            .filter(|c| matches!(c, Change::MoveStray { .. } | Change::SavePrevious { .. }))
            .collect();
        if !aside.is_empty() {
            let moved = (|| -> io::Result<()> {
                // Every directory is made and opened relative to its parent's descriptor,
                // without following links, and every move is made relative to them: a
                // `replaced/` (or token directory) swapped for a symlink after the check is
                // never written through.
                let state_fd = fsutil::open_dir_no_follow(&paths.state_dir)?;
                let (root_fd, created) = fsutil::make_dir_in(&state_fd, "replaced", REPLACED_MODE)?;
                if created {
                    undo.push(Undo::RemoveDir(replaced_root.to_path_buf()));
                }
                let (into_fd, name) = fsutil::make_unique_dir_in(&root_fd, stamp, REPLACED_MODE)?;
                let into = replaced_root.join(name);
                undo.push(Undo::RemoveDir(into.clone()));
                let dir_fd = fsutil::open_dir_no_follow(dir)?;
                for c in &aside {
                    match c {
                        Change::MoveStray { from, why, .. } => {
                            let to = into.join(from.file_name().unwrap_or_default());
                            if fsutil::fault("stray-move-fails")
                                && done.iter().any(|d| matches!(d, Change::MoveStray { .. }))
                            {
                                return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
                            }
                            fsutil::move_out(&dir_fd, from, &into_fd, &to)?;
                            undo.push(Undo::MoveBack(to.clone(), from.clone()));
                            done.push(Change::MoveStray {
                                from: from.clone(),
                                to,
                                why: why.clone(),
                            });
                        }
                        Change::SavePrevious { from, .. } => {
                            let to = into.join(&paths.token_file);
                            // Registered first: a write that fails half way is removed too.
                            undo.push(Undo::RemoveFile(to.clone()));
                            // The bytes that were read and checked, never a second read by
                            // path (which a swapped link or FIFO would redirect or block).
                            let bytes = previous.map(|p| p.bytes.as_slice()).unwrap_or_default();
                            fsutil::write_new_in(&into_fd, &paths.token_file, bytes, 0o600)?;
                            done.push(Change::SavePrevious {
                                from: from.clone(),
                                to,
                            });
                        }
                        _ => {}
                    }
                }
                fsutil::fsync_dir(&into)?;
                fsutil::fsync_dir(dir)
            })();
            moved.map_err(|e| {
                if let Some(big) = e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<fsutil::NotCopied>())
                {
                    return anyhow!("{big}; {}", nothing_changed());
                }
                io_err(
                    format!(
                        "cannot move the other files of {} aside into {}",
                        crate::text::show_path(dir),
                        crate::text::show_path(replaced_root)
                    ),
                    e,
                    "make room in the state directory or make it writable, then run install again",
                )
            })?;
        }
        if let Some(stage) = token_stage {
            if fsutil::fault("token-commit-fails") {
                drop(stage);
                return Err(write_err(
                    "the new token",
                    dir,
                    io::Error::from_raw_os_error(nix::libc::EIO),
                ));
            }
            stage
                .commit()
                .map_err(|e| write_err("the new token", dir, e))?;
            done.push(plan_entry(plan, |c| matches!(c, Change::WriteToken { .. })));
        }
        Ok(())
    })();
    if let Err(e) = result {
        for step in undo.into_iter().rev() {
            step.run();
        }
        drop(conf_stage.take());
        for d in created_dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
        return Err(e);
    }
    for change in plan {
        if let Change::ChmodToken { path, to, .. } = change {
            // On the file that was read: one swapped for a link meanwhile is not followed.
            fsutil::chmod_checked(path, *to, previous.map(|p| p.ino)).map_err(|e| {
                io_err(
                    format!("cannot change the mode of {}", crate::text::show_path(path)),
                    e,
                    "check that it is still the token that was read, then run install again",
                )
            })?;
            done.push(change.clone());
        }
    }
    if let Some(stage) = conf_stage {
        stage.commit().map_err(|e| {
            anyhow!(
                "the token is installed, but {} could not be replaced: {e}; make the directory writable and run install again",
                crate::text::show_path(&paths.gridd_conf)
            )
        })?;
        done.push(plan_entry(plan, |c| {
            matches!(c, Change::WriteGriddConf { .. })
        }));
    }
    Ok(done)
}
