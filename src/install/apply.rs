//! Carrying out an install's plan: new files written and synced next to their targets, a copy
//! of the token being replaced kept aside, the new token renamed into place, then the strays
//! moved aside; every step that changed something is undone on an error. A whole token is in
//! the directory at every instant, so that a crash at any step leaves the guest with one
//! (the next install or adoption finishes the job).

use super::*;
use crate::files::dir::Dir;

/// How to take back one step of [`apply`] that already changed something.
enum Undo {
    Chmod(PathBuf, u32),
    /// Write these bytes back at the path, with this mode.
    Restore(PathBuf, Vec<u8>, u32),
    /// Move back from the first path to the second.
    MoveBack(PathBuf, PathBuf),
    RemoveFile(PathBuf),
    /// Remove a directory made for this install (only when empty again).
    RemoveDir(PathBuf),
}

impl Undo {
    fn run(self) {
        let _ = match self {
            Undo::Chmod(p, mode) => Dir::open(&p).and_then(|d| d.set_mode(mode)),
            Undo::Restore(p, bytes, mode) => fsutil::write_atomic(&p, &bytes, mode),
            Undo::MoveBack(from, to) => fsutil::move_path(&from, &to),
            Undo::RemoveFile(p) => fs::remove_file(&p),
            Undo::RemoveDir(p) => fs::remove_dir(&p),
        };
    }
}

/// Applies a plan, in its phases: the new files staged ([`stage_files`]), the small fixes,
/// the token swapped in and the strays moved aside ([`swap_in`]), then the token's mode and
/// gridd.conf ([`finish`]). On an error before the token is renamed into place, everything
/// is undone. Returns the changes as made (stray destinations may differ from the plan's).
pub(super) fn apply(
    whole: &Plan,
    previous: Option<&Previous>,
    settings: &Settings,
) -> anyhow::Result<Vec<Change>> {
    let paths = &settings.paths;
    let plan = whole.outcome.changes.as_slice();
    let (token_bytes, conf) = (whole.token.as_slice(), &whole.conf);
    let (replaced_root, stamp) = (whole.replaced_root.as_path(), whole.stamp.as_str());
    let mut staged = stage_files(
        plan,
        &paths.token_path(),
        &paths.token_dir,
        token_bytes,
        conf,
    )?;
    // From here every step that changes something records how to take it back: when a
    // later step fails, they are undone in reverse order (directory modes restored, strays
    // moved back, the copy of the previous token and the directories made for it removed), so
    // "nothing was changed" stays true.
    let mut undo: Vec<Undo> = Vec::new();
    let mut done = Vec::new();
    let token = staged.token.take();
    let result = small_fixes(plan, &mut undo, &mut done).and_then(|()| {
        swap_in(
            plan,
            previous,
            token,
            paths,
            (replaced_root, stamp),
            &mut undo,
            &mut done,
        )
    });
    if let Err(e) = result {
        for step in undo.into_iter().rev() {
            step.run();
        }
        staged.discard();
        return Err(e);
    }
    finish(plan, previous, staged.conf.take(), paths, &mut done)?;
    Ok(done)
}

/// An error writing `what` in `at`, with the fix its cause calls for.
fn write_err(what: &str, at: &Path, e: io::Error) -> anyhow::Error {
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
        format!(
            "cannot write {what} in {}",
            crate::model::text::show_path(at)
        ),
        e,
        fix,
    )
}

/// The new files, written and synced beside their targets, and the directories made for
/// them: nothing visible has changed yet.
#[derive(Default)]
struct StagedFiles {
    token: Option<fsutil::Staged>,
    conf: Option<fsutil::Staged>,
    created_dirs: Vec<PathBuf>,
}

impl StagedFiles {
    /// Drops what was staged and removes the directories made for it.
    fn discard(&mut self) {
        drop(self.token.take());
        drop(self.conf.take());
        for d in self.created_dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
    }
}

/// Stages the new files first; on an error, whatever was staged is discarded.
fn stage_files(
    plan: &[Change],
    target: &Path,
    dir: &Path,
    token_bytes: &[u8],
    conf: &ConfPlan,
) -> anyhow::Result<StagedFiles> {
    let mut out = StagedFiles::default();
    let staged = (|| -> anyhow::Result<()> {
        for change in plan {
            match change {
                Change::CreateDir { path, mode } => {
                    let created = fsutil::create_dir_mode(path, *mode)
                        .map_err(|e| write_err("the token directory", path, e))?;
                    out.created_dirs.extend(created.then(|| path.clone()));
                }
                Change::WriteToken { .. } => {
                    out.token = Some(
                        fsutil::stage(target, token_bytes, TOKEN_MODE, None)
                            .map_err(|e| write_err("the new token", dir, e))?,
                    );
                }
                Change::WriteGriddConf { path, .. } => {
                    let parent = path.parent().unwrap_or(Path::new("/"));
                    let created = fsutil::create_dir_mode(parent, 0o755)
                        .map_err(|e| write_err("gridd.conf", parent, e))?;
                    out.created_dirs
                        .extend(created.then(|| parent.to_path_buf()));
                    out.conf = Some(
                        fsutil::stage(path, &conf.bytes, conf.mode, conf.owner)
                            .map_err(|e| write_err("the new gridd.conf", parent, e))?,
                    );
                }
                _ => {}
            }
        }
        Ok(())
    })();
    match staged {
        Ok(()) => Ok(out),
        Err(e) => {
            out.discard();
            Err(e)
        }
    }
}

/// Small fixes first (the token directory's mode, our own leftover temporary files): one
/// that fails leaves the strays where they are.
fn small_fixes(
    plan: &[Change],
    undo: &mut Vec<Undo>,
    done: &mut Vec<Change>,
) -> anyhow::Result<()> {
    for change in plan {
        match change {
            Change::CreateDir { .. } | Change::ChmodDir { .. } => {
                if let Change::ChmodDir { path, from, to } = change {
                    Dir::open(path).and_then(|d| d.set_mode(*to)).map_err(|e| {
                        io_err(
                            format!(
                                "cannot change the mode of {}",
                                crate::model::text::show_path(path)
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
                        format!("cannot remove {}", crate::model::text::show_path(path)),
                        e,
                        "remove it yourself",
                    ));
                }
            },
            _ => {}
        }
    }
    Ok(())
}

/// The new token in, the others out. The order keeps a whole token in the directory at every
/// instant, whatever stops the install (power loss, SIGKILL): the previous token's copy is
/// kept aside first, then the new token is renamed into place, and only then do the strays
/// (the previous token under another name among them) leave. Each step is synced.
fn swap_in(
    plan: &[Change],
    previous: Option<&Previous>,
    token: Option<fsutil::Staged>,
    paths: &crate::model::config::Paths,
    (replaced_root, stamp): (&Path, &str),
    undo: &mut Vec<Undo>,
    done: &mut Vec<Change>,
) -> anyhow::Result<()> {
    let dir = &paths.token_dir;
    let target = paths.token_path();
    let aside = plan
        .iter()
        .any(|c| matches!(c, Change::MoveStray { .. } | Change::SavePrevious { .. }));
    let into = if aside {
        Some(
            replaced_dir(paths, replaced_root, stamp, undo)
                .map_err(|e| aside_err(dir, replaced_root, e))?,
        )
    } else {
        None
    };
    crash_point("crash-after-stage");
    if let Some((into_dir, into)) = &into {
        save_previous(plan, previous, paths, into_dir, into, undo, done)
            .map_err(|e| aside_err(dir, replaced_root, e))?;
    }
    crash_point("crash-after-save");
    if let Some(stage) = token {
        undo.push(commit_token(stage, previous, &target, dir)?);
        done.push(plan_entry(plan, |c| matches!(c, Change::WriteToken { .. })));
        crash_point("crash-after-commit");
    }
    if let Some((into_dir, into)) = &into {
        move_strays(plan, dir, into_dir, into, undo, done)
            .map_err(|e| aside_err(dir, replaced_root, e))?;
    }
    Ok(())
}

/// The staged token renamed into place; what takes it back: the previous token's bytes put
/// back at its path, or the new one removed where the path held none.
fn commit_token(
    stage: fsutil::Staged,
    previous: Option<&Previous>,
    target: &Path,
    dir: &Path,
) -> anyhow::Result<Undo> {
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
    Ok(match previous.filter(|p| p.path == target) {
        Some(p) => Undo::Restore(target.to_path_buf(), p.bytes.clone(), p.mode),
        None => Undo::RemoveFile(target.to_path_buf()),
    })
}

/// Once the token is in: its mode fixed (on the file that was read: one swapped for a link
/// meanwhile is not followed), and gridd.conf replaced.
fn finish(
    plan: &[Change],
    previous: Option<&Previous>,
    conf: Option<fsutil::Staged>,
    paths: &crate::model::config::Paths,
    done: &mut Vec<Change>,
) -> anyhow::Result<()> {
    for change in plan {
        if let Change::ChmodToken { path, to, .. } = change {
            fsutil::chmod_checked(path, *to, previous.map(|p| p.ino)).map_err(|e| {
                io_err(
                    format!(
                        "cannot change the mode of {}",
                        crate::model::text::show_path(path)
                    ),
                    e,
                    "check that it is still the token that was read, then run install again",
                )
            })?;
            done.push(change.clone());
        }
    }
    if let Some(stage) = conf {
        stage.commit().map_err(|e| {
            anyhow!(
                "the token is installed, but {} could not be replaced: {e}; make the directory writable and run install again",
                crate::model::text::show_path(&paths.gridd_conf)
            )
        })?;
        done.push(plan_entry(plan, |c| {
            matches!(c, Change::WriteGriddConf { .. })
        }));
    }
    Ok(())
}

/// Makes this install's directory under `replaced/`, relative to the state directory's
/// descriptor and without following links: a `replaced/` swapped for a symlink after the
/// check is never written through.
fn replaced_dir(
    paths: &crate::model::config::Paths,
    replaced_root: &Path,
    stamp: &str,
    undo: &mut Vec<Undo>,
) -> io::Result<(Dir, PathBuf)> {
    let state = Dir::open(&paths.state_dir)?;
    let (root, created) = state.make_dir(crate::files::layout::REPLACED_DIR, REPLACED_MODE)?;
    if created {
        undo.push(Undo::RemoveDir(replaced_root.to_path_buf()));
    }
    let (into_dir, name) = root.make_unique_dir(stamp, REPLACED_MODE)?;
    let into = replaced_root.join(name);
    undo.push(Undo::RemoveDir(into.clone()));
    Ok((into_dir, into))
}

/// Keeps a copy of the token being replaced at its own path: the bytes that were read and
/// checked, never a second read by path (which a swapped link or FIFO would redirect or
/// block). Synced before the new token takes its place.
fn save_previous(
    plan: &[Change],
    previous: Option<&Previous>,
    paths: &crate::model::config::Paths,
    into_dir: &Dir,
    into: &Path,
    undo: &mut Vec<Undo>,
    done: &mut Vec<Change>,
) -> io::Result<()> {
    for c in plan {
        if let Change::SavePrevious { from, .. } = c {
            let to = into.join(&paths.token_file);
            // Registered first: a write that fails half way is removed too.
            undo.push(Undo::RemoveFile(to.clone()));
            let bytes = previous.map(|p| p.bytes.as_slice()).unwrap_or_default();
            into_dir.write_new(paths.token_file.as_str(), bytes, 0o600, true)?;
            done.push(Change::SavePrevious {
                from: from.clone(),
                to,
            });
        }
    }
    into_dir.sync()
}

/// Moves the strays out of the token directory into `into`, by renames relative to the
/// directories' descriptors; both directories synced.
fn move_strays(
    plan: &[Change],
    dir: &Path,
    into_dir: &Dir,
    into: &Path,
    undo: &mut Vec<Undo>,
    done: &mut Vec<Change>,
) -> io::Result<()> {
    let token_dir = Dir::open(dir)?;
    for c in plan {
        if let Change::MoveStray { from, why, .. } = c {
            let to = into.join(from.file_name().unwrap_or_default());
            if fsutil::fault("stray-move-fails")
                && done.iter().any(|d| matches!(d, Change::MoveStray { .. }))
            {
                return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
            }
            let (Some(src), Some(dst)) = (from.file_name(), to.file_name()) else {
                return Err(io::Error::other("not a file name"));
            };
            token_dir.move_to(src, into_dir, dst, from)?;
            crash_point("crash-after-first-move");
            undo.push(Undo::MoveBack(to.clone(), from.clone()));
            done.push(Change::MoveStray {
                from: from.clone(),
                to,
                why: why.clone(),
            });
        }
    }
    crash_point("crash-after-all-moves");
    into_dir.sync()?;
    token_dir.sync()
}

/// A failure to keep the old files aside, as one line: a file too large to copy across file
/// systems is named; anything else with where and the fix.
fn aside_err(dir: &Path, replaced_root: &Path, e: io::Error) -> anyhow::Error {
    if let Some(big) = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<crate::files::dir::NotCopied>())
    {
        return anyhow!("{big}; {}", nothing_changed());
    }
    io_err(
        format!(
            "cannot move the other files of {} aside into {}",
            crate::model::text::show_path(dir),
            crate::model::text::show_path(replaced_root)
        ),
        e,
        "make room in the state directory or make it writable, then run install again",
    )
}

/// A test's stand-in for a power loss or a SIGKILL at this point of an install: the process
/// stops dead (debug builds only, see [`fsutil::fault`]).
fn crash_point(name: &str) {
    if fsutil::fault(name) {
        std::process::abort();
    }
}
