//! File-system primitives of `install` and `prepare-image`: atomic replace of a file (never
//! through a symlink), moving files aside across file systems, and the lock that serializes
//! installs.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The part every temporary file of ours has in its name: `.<target name>.vla-tmp-<unique>`.
const TEMP_MARK: &str = ".vla-tmp-";

/// Name prefix of the temporary files staged for `target_name` (in the same directory).
pub fn temp_prefix(target_name: &str) -> String {
    format!(".{target_name}{TEMP_MARK}")
}

/// Whether a directory entry is a temporary file of ours (for any target).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARK)
}

/// A fault to inject, for tests on machines where a full disk or a crash cannot be made for
/// real. Read from `VGPU_LICENSE_AGENT_FAULT` in debug builds only; release builds ignore it.
pub(crate) fn fault(name: &str) -> bool {
    cfg!(debug_assertions)
        && std::env::var("VGPU_LICENSE_AGENT_FAULT").is_ok_and(|v| v.split(',').any(|f| f == name))
}

/// A new file written and synced next to its target, not yet renamed over it. Dropped without
/// [`Staged::commit`], it removes itself.
#[derive(Debug)]
pub struct Staged {
    temp: Option<PathBuf>,
    target: PathBuf,
}

fn dir_of(target: &Path) -> &Path {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub(crate) fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{:08x}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes `bytes` to a new temporary file in `target`'s directory (created exclusively, so a
/// symlink planted at the temporary path makes it fail instead of being followed), syncs it
/// and sets its mode (and owner, when given).
pub fn stage(
    target: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<Staged> {
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let dir = dir_of(target);
    // A read-only file system refuses the temporary file itself: nothing is created.
    if fault("erofs") {
        return Err(io::Error::from_raw_os_error(nix::libc::EROFS));
    }
    let (temp, mut file) = create_temp(dir, &name)?;
    let staged = Staged {
        temp: Some(temp),
        target: target.to_path_buf(),
    };
    if fault("enospc") {
        return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
    }
    file.write_all(bytes)?;
    file.sync_all()?;
    // The old file's owner, where it differs: a root-owned file (the usual case) needs no
    // chown at all, which the service's sandbox does not allow (no CAP_CHOWN, @chown filtered).
    if let Some((uid, gid)) = owner {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        if (m.uid(), m.gid()) != (uid, gid) {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
    }
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    file.sync_all()?;
    Ok(staged)
}

/// A new temporary file for `name` in `dir`, created exclusively (never through a link),
/// mode 0600; a name taken is tried again with another, a few times.
fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let mut attempt = 0;
    loop {
        let temp = dir.join(format!("{}{}", temp_prefix(name), unique()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&temp)
        {
            Ok(f) => return Ok((temp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 5 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

impl Staged {
    /// Renames the temporary file over the target (a symlink at the target is replaced, never
    /// followed) and syncs the directory.
    pub fn commit(mut self) -> io::Result<()> {
        let temp = self.temp.take().expect("committed once");
        if fault("abort-before-rename") {
            std::process::abort();
        }
        if let Err(e) = fs::rename(&temp, &self.target) {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        fsync_dir(dir_of(&self.target))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(t) = self.temp.take() {
            let _ = fs::remove_file(t);
        }
    }
}

/// Atomically replaces `target` with `bytes` at `mode`.
pub fn write_atomic(target: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    stage(target, bytes, mode, None)?.commit()
}

/// Syncs a directory, so that a rename or a new entry in it survives a crash.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing parents with `mode` (not masked by the umask). Returns
/// whether `dir` was created.
pub fn create_dir_mode(dir: &Path, mode: u32) -> io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    let mut missing = Vec::new();
    let mut p = dir;
    while !p.exists() {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(parent) => p = parent,
            None => break,
        }
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    for m in missing.iter().rev() {
        fs::set_permissions(m, fs::Permissions::from_mode(mode))?;
        if let Some(parent) = m.parent() {
            fsync_dir(parent)?;
        }
    }
    Ok(true)
}

/// The file mode bits (`0o7777`) of a metadata.
pub fn mode_of(meta: &fs::Metadata) -> u32 {
    meta.mode() & 0o7777
}

/// Moves `src` (a file, a symlink or a directory) to `dst`, by rename, or by copying and
/// removing where they are on different file systems. `dst` must not exist.
pub fn move_path(src: &Path, dst: &Path) -> io::Result<()> {
    let renamed = if fault("exdev") {
        Err(io::Error::from_raw_os_error(nix::libc::EXDEV))
    } else {
        fs::rename(src, dst)
    };
    match renamed {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::EXDEV) => {
            // A copy that fails half way is removed again: `src` stays whole and nothing is
            // left at `dst`.
            if let Err(e) = copy_tree(src, dst) {
                if fs::symlink_metadata(dst).is_ok() {
                    let _ = remove_tree(dst);
                }
                return Err(e);
            }
            remove_tree(src)
        }
        Err(e) => Err(e),
    }
}

fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(src)?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)?;
    } else if ft.is_dir() {
        fs::DirBuilder::new().mode(0o700).create(dst)?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
        }
        fs::set_permissions(dst, fs::Permissions::from_mode(mode_of(&meta)))?;
    } else if ft.is_file() {
        let mut from = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(src)?;
        let mut to = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)?;
        io::copy(&mut from, &mut to)?;
        if fault("copy-enospc") {
            return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
        }
        to.set_permissions(fs::Permissions::from_mode(mode_of(&meta)))?;
        to.sync_all()?;
    } else {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "not a file, a directory or a symlink",
        ));
    }
    Ok(())
}

/// Removes a file, a symlink (not what it points to) or a directory tree.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// Creates a new directory under `parent` named `name`, or `name-2`, `name-3`, ... when taken,
/// with `mode`. Returns its path.
pub fn create_unique_dir(parent: &Path, name: &str, mode: u32) -> io::Result<PathBuf> {
    for n in 1..1000 {
        let candidate = if n == 1 {
            parent.join(name)
        } else {
            parent.join(format!("{name}-{n}"))
        };
        match fs::DirBuilder::new().mode(mode).create(&candidate) {
            Ok(()) => {
                fs::set_permissions(&candidate, fs::Permissions::from_mode(mode))?;
                return Ok(candidate);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "too many directories of that name",
    ))
}

/// The entries of a directory, sorted by name (none when it does not exist).
pub fn list_dir(dir: &Path) -> io::Result<Vec<(OsString, PathBuf)>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry?;
        out.push((entry.file_name(), entry.path()));
    }
    out.sort();
    Ok(out)
}

/// An exclusive lock on a file, held until dropped.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

/// Why a lock could not be taken.
#[derive(Debug)]
pub enum LockError {
    Io(io::Error),
    Busy,
}

/// Takes an exclusive lock on `path` (created when missing), waiting up to `wait`.
pub fn lock(path: &Path, wait: Duration) -> Result<Lock, LockError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(LockError::Io)?;
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Lock { _file: file }),
            Err(fs::TryLockError::WouldBlock) => {
                if Instant::now() >= deadline {
                    return Err(LockError::Busy);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(fs::TryLockError::Error(e)) => return Err(LockError::Io(e)),
        }
    }
}

/// Changes a file's mode through a descriptor opened without following links or blocking,
/// and only if it is a regular file (and, when given, still the inode that was checked).
pub fn chmod_checked(path: &Path, mode: u32, ino: Option<u64>) -> io::Result<()> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(
            nix::libc::O_NOFOLLOW
                | nix::libc::O_NONBLOCK
                | nix::libc::O_CLOEXEC
                | nix::libc::O_NOCTTY,
        )
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || ino.is_some_and(|i| i != m.ino()) {
        return Err(io::Error::other(
            "it was replaced by something else since it was checked",
        ));
    }
    f.set_permissions(fs::Permissions::from_mode(mode))
}

/// Test support: writes the script `path` (0755) through another process. A file this one
/// had open for writing may be held by a child that another test thread forks meanwhile,
/// and would not run (ETXTBSY).
#[cfg(test)]
pub(crate) fn write_test_program(path: &Path, body: &str) {
    let src = path.with_extension("src");
    fs::write(&src, body).unwrap();
    let ok = std::process::Command::new("install")
        .arg("-m0755")
        .arg(&src)
        .arg(path)
        .status()
        .unwrap();
    assert!(ok.success(), "install {}", path.display());
    fs::remove_file(&src).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_a_symlink_instead_of_following_it() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let target = d.path().join("t.tok");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_atomic(&target, b"new", 0o744).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        let meta = fs::symlink_metadata(&target).unwrap();
        assert!(meta.is_file());
        assert_eq!(mode_of(&meta), 0o744);
        assert_eq!(fs::read(&target).unwrap(), b"new");
    }

    #[test]
    fn dropped_stage_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("t");
        drop(stage(&target, b"x", 0o644, None).unwrap());
        assert!(list_dir(d.path()).unwrap().is_empty());
        assert!(is_temp_name(&format!("{}1-2-3", temp_prefix("t.tok"))));
        assert!(!is_temp_name("t.tok"));
    }

    #[test]
    fn lock_is_exclusive() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("lock");
        let held = lock(&p, Duration::from_millis(10)).unwrap();
        assert!(matches!(
            lock(&p, Duration::from_millis(100)),
            Err(LockError::Busy)
        ));
        drop(held);
        lock(&p, Duration::from_millis(10)).unwrap();
    }

    #[test]
    fn create_dir_mode_ignores_umask() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b");
        assert!(create_dir_mode(&p, 0o755).unwrap());
        assert_eq!(mode_of(&fs::metadata(&p).unwrap()), 0o755);
        assert_eq!(mode_of(&fs::metadata(d.path().join("a")).unwrap()), 0o755);
        assert!(!create_dir_mode(&p, 0o755).unwrap());
    }
}
