//! Where the service writes its outputs (status.json, the metrics textfile): each write goes
//! through a descriptor of the output's directory, reached from `/` one component at a time,
//! and a symlink on the way is followed only where no other user could have put it there.
//!
//! The metrics textfile's usual directory is `/var/lib/prometheus/node-exporter`, and
//! `/var/lib/prometheus` is the prometheus user's home: that user could swap `node-exporter/`
//! for a link to the token directory. A path resolved by the kernel would follow it and root
//! would write there; this resolution refuses it, as systemd's `chase()` refuses an unsafe
//! transition.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::files::dir::Dir;

/// The most links followed in one path, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// A link the agent does not follow: who could have made it, and where.
#[derive(Debug)]
pub struct UnsafeLink {
    /// The link, as reached.
    pub link: PathBuf,
    /// The owner of the directory holding it (or of the link).
    pub uid: u32,
}

impl std::fmt::Display for UnsafeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = crate::model::text::show_path(&self.link);
        write!(
            f,
            "{shown} is a symlink in a directory that user {uid} can write, and root follows no link another user could have made: make {shown} a real directory (owned by root), or point the config at one",
            uid = self.uid
        )
    }
}

impl std::error::Error for UnsafeLink {}

/// Whether `uid` is root or the agent itself.
fn ours(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Opens the directory `path` (absolute), following a symlink on the way only when it is
/// owned by root (or the agent), or when the directory holding it is writable by root (or
/// the agent) alone. Every step is relative to the descriptor of the one before, so nothing
/// can be swapped between the check and the use.
pub fn open(path: &Path) -> io::Result<Dir> {
    let mut queue: VecDeque<OsString> = components(path);
    let mut dir = Dir::root()?;
    let mut reached = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = queue.pop_front() {
        if name == "/" {
            dir = Dir::root()?;
            reached = PathBuf::from("/");
            continue;
        }
        if name == ".." {
            dir = dir.open_dir("..")?;
            reached.pop();
            continue;
        }
        let st = dir.stat(name.as_os_str())?;
        if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFLNK {
            dir = dir.open_dir(name.as_os_str())?;
            reached.push(&name);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(io::Error::from_raw_os_error(nix::libc::ELOOP));
        }
        let holder = dir.metadata()?;
        let safe_holder = ours(holder.uid()) && holder.permissions().mode() & 0o022 == 0;
        if !ours(st.st_uid) && !safe_holder {
            return Err(io::Error::other(UnsafeLink {
                link: reached.join(&name),
                uid: if ours(holder.uid()) {
                    st.st_uid
                } else {
                    holder.uid()
                },
            }));
        }
        let target = dir.read_link(name.as_os_str())?;
        for c in components(&target).into_iter().rev() {
            queue.push_front(c);
        }
    }
    Ok(dir)
}

/// A path's components as names: `/` for the root, `..` for a parent, `.` left out.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir | Component::Prefix(_) => Some(OsString::from("/")),
            Component::ParentDir => Some(OsString::from("..")),
            Component::CurDir => None,
            Component::Normal(n) => Some(n.to_os_string()),
        })
        .collect()
}

/// The file a [`replace`] left: known again by its inode and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    ino: u64,
    len: u64,
}

/// Replaces `path` with `bytes` at `mode`, atomically for readers and without a sync (the
/// outputs are made anew at every start), through a descriptor of its directory reached by
/// [`open`]. `create_dir`: the directory itself is made (mode 0755) when it is missing.
/// Returns the file now there, for [`touch`].
pub fn replace(path: &Path, bytes: &[u8], mode: u32, create_dir: bool) -> io::Result<Written> {
    let (dir, name) = parent_and_name(path)?;
    let dir = match open(dir) {
        Err(e) if create_dir && e.kind() == io::ErrorKind::NotFound => make_dir(dir)?,
        other => other?,
    };
    let temp = format!(
        "{}{}",
        crate::files::fsutil::temp_prefix(&name.to_string_lossy()),
        crate::files::fsutil::unique()
    );
    let written = dir
        .write_new(temp.as_str(), bytes, mode, false)
        .and_then(|()| dir.rename(temp.as_str(), name));
    if written.is_err() {
        let _ = dir.remove_file(temp.as_str());
    }
    written?;
    let st = dir.stat(name)?;
    Ok(Written {
        ino: st.st_ino,
        len: st.st_size as u64,
    })
}

/// Marks `path` as written now (its mtime, which a textfile collector exports and a staleness
/// alert reads) without writing it, when it is still the file `was` (the same inode and
/// length, a regular file, never through a link); returns false, touching nothing, when it
/// is not. A rewrite of unchanged bytes would cost a guest a disk write and a wait for it
/// (a rename over a file makes ext4 start writing the new one's data at once); this costs an
/// inode update, written back with the next journal commit.
pub fn touch(path: &Path, was: Written) -> io::Result<bool> {
    let (dir, name) = parent_and_name(path)?;
    let dir = open(dir)?;
    let st = match dir.stat(name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        other => other?,
    };
    let regular = st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG;
    if !regular || st.st_ino != was.ino || st.st_size as u64 != was.len {
        return Ok(false);
    }
    dir.touch(name)?;
    Ok(true)
}

fn parent_and_name(path: &Path) -> io::Result<(&Path, &std::ffi::OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(d), Some(n)) if path.is_absolute() => Ok((d, n)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an absolute file path",
        )),
    }
}

/// Makes the missing directory `dir` (mode 0755), and its missing parents, each in its
/// parent reached by [`open`].
fn make_dir(dir: &Path) -> io::Result<Dir> {
    let (parent, name) = parent_and_name(dir)?;
    let parent = match open(parent) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => make_dir(parent)?,
        other => other?,
    };
    Ok(parent.make_dir(name, 0o755)?.0)
}

/// Removes the temporary files that a write of `path` killed before its rename left behind
/// (named by [`crate::files::fsutil::temp_prefix`], made by a process no longer alive). Returns how
/// many were removed.
pub fn remove_leftovers(path: &Path) -> usize {
    let Ok((dir, name)) = parent_and_name(path) else {
        return 0;
    };
    let Ok(dir) = open(dir) else {
        return 0;
    };
    let prefix = crate::files::fsutil::temp_prefix(&name.to_string_lossy());
    let mut removed = 0;
    // The listing is of the very directory opened; one that cannot be read has none removed.
    let _ = dir.each_name(|entry| {
        let file = entry.to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix(&prefix) else {
            return true;
        };
        let writer = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
        if !writer.is_some_and(alive) && dir.remove_file(file.as_str()).is_ok() {
            removed += 1;
        }
        true
    });
    removed
}

/// Whether process `pid` exists (this one included).
fn alive(pid: i32) -> bool {
    pid == std::process::id() as i32
        || !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_root_links_and_reaches_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
        let out = d.path().join("link/../link/out.prom");
        replace(&out, b"x 1\n", 0o644, false).unwrap();
        assert_eq!(std::fs::read(real.join("out.prom")).unwrap(), b"x 1\n");
        let m = std::fs::metadata(real.join("out.prom")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o644);
        // Only the file itself: no temporary left.
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 1);
    }

    #[test]
    fn touch_marks_the_file_written_now_only_while_it_is_the_one_written() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("m.prom");
        let file = replace(&out, b"x 1\n", 0o644, false).unwrap();
        let old = filetime(&out, 1_000_000);
        assert!(touch(&out, file).unwrap());
        let m = std::fs::metadata(&out).unwrap();
        assert!(m.mtime() > old, "the mtime moved to now");
        assert_eq!(std::fs::read(&out).unwrap(), b"x 1\n");
        // Another file there (someone else's write): left alone, and said.
        std::fs::remove_file(&out).unwrap();
        std::fs::write(&out, b"y 22\n").unwrap();
        let theirs = filetime(&out, 1_000_000);
        assert!(!touch(&out, file).unwrap());
        assert_eq!(std::fs::metadata(&out).unwrap().mtime(), theirs);
        // A link at the path is never followed; nothing there is no file.
        std::fs::remove_file(&out).unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), &out).unwrap();
        assert!(!touch(&out, file).unwrap());
        assert!(!d.path().join("elsewhere").exists());
        std::fs::remove_file(&out).unwrap();
        assert!(!touch(&out, file).unwrap());
    }

    /// Sets `path`'s mtime to `secs` (Unix time); returns it.
    fn filetime(path: &Path, secs: i64) -> i64 {
        let t = nix::sys::time::TimeSpec::new(secs, 0);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            path,
            &t,
            &t,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        secs
    }

    #[test]
    fn makes_the_missing_directory_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("run/agent/status.json");
        assert!(replace(&out, b"{}", 0o644, false).is_err());
        replace(&out, b"{}", 0o644, true).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"{}");
    }

    #[test]
    fn a_dead_writers_temporary_is_removed_a_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("s.json");
        let prefix = crate::files::fsutil::temp_prefix("s.json");
        // Beyond pid_max: no such process.
        let dead = d.path().join(format!("{prefix}999999999-0-0"));
        let live = d.path().join(format!("{prefix}{}-0-0", std::process::id()));
        let other = d.path().join(".other.vla-tmp-999999999-0-0");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"half").unwrap();
        }
        assert_eq!(remove_leftovers(&out), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
    }
}
