//! A directory held open, and every operation in it relative to its descriptor: the one file
//! vocabulary of the agent's own directories (the token directory, the state directory, the
//! output directories). A name is never followed through a symlink (`O_NOFOLLOW`,
//! `AT_SYMLINK_NOFOLLOW`), nothing is inherited by a child (`O_CLOEXEC`), and an entry is
//! looked at once ([`Dir::look`]): what it is and what it holds come from the same
//! descriptor, so nothing swapped in between the two is ever read.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;

/// A stray larger than this is never copied across file systems: no token or gridd.conf is
/// that large, and copying a stray of any size could fill the state file system.
pub const MAX_STRAY_COPY_BYTES: u64 = 1 << 20;

/// An open directory.
#[derive(Debug)]
pub struct Dir {
    file: File,
}

/// An entry of a [`Dir`], looked at once: a descriptor of the entry itself (`O_PATH`, which
/// neither follows a link nor opens a FIFO or a device) and what that descriptor is.
#[derive(Debug)]
pub struct Entry {
    fd: File,
    meta: fs::Metadata,
}

impl Dir {
    /// Opens the directory `path`, never through a symlink at its last component (that is
    /// `ELOOP`; a file that is not a directory, `ENOTDIR`).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)?;
        Ok(Dir { file })
    }

    /// Opens the directory `path` as [`Dir::open`] does, and says why where it cannot be:
    /// `None` where nothing is there.
    pub fn open_if_there(path: &Path) -> Result<Option<Dir>, NotOpened> {
        match Dir::open(path) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            // A link at the last component fails with ELOOP, or with ENOTDIR under
            // O_DIRECTORY: which one it was is in the entry itself.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::ELOOP | nix::libc::ENOTDIR)
                ) =>
            {
                match fs::symlink_metadata(path) {
                    Ok(m) if m.file_type().is_symlink() => {
                        Err(NotOpened::Symlink(fs::read_link(path).unwrap_or_default()))
                    }
                    Ok(_) => Err(NotOpened::NotDir),
                    Err(e) => Err(NotOpened::Io(e)),
                }
            }
            Err(e) => Err(NotOpened::Io(e)),
        }
    }

    /// `/`, where [`crate::files::outdir`]'s walk starts.
    pub fn root() -> io::Result<Dir> {
        Ok(Dir {
            file: File::open("/")?,
        })
    }

    /// Opens the directory `name` in this one, never through a link (`..` is the parent).
    pub fn open_dir<P: ?Sized + nix::NixPath>(&self, name: &P) -> io::Result<Dir> {
        let file = self.open_at(name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())?;
        Ok(Dir { file })
    }

    /// The directory's own metadata.
    pub fn metadata(&self) -> io::Result<fs::Metadata> {
        self.file.metadata()
    }

    /// Changes the directory's own mode.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        self.file.set_permissions(fs::Permissions::from_mode(mode))
    }

    /// Flushes the directory's entries to disk.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// The names in the directory, `.` and `..` left out, in the order the file system keeps
    /// them. `keep` is called once per name, and stops the listing where it returns false.
    pub fn each_name(&self, mut keep: impl FnMut(OsString) -> bool) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let mut listing = nix::dir::Dir::openat(
            self.file.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        for entry in listing.iter() {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            if !keep(name.to_os_string()) {
                break;
            }
        }
        Ok(())
    }

    /// The names in the directory, sorted.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let mut out = Vec::new();
        self.each_name(|n| {
            out.push(n);
            true
        })?;
        out.sort();
        Ok(out)
    }

    /// Looks at the entry `name` once, without following a link or opening it for reading.
    pub fn look<P: ?Sized + nix::NixPath>(&self, name: &P) -> io::Result<Entry> {
        let fd = self.open_at(name, OFlag::O_PATH, Mode::empty())?;
        let meta = fd.metadata()?;
        Ok(Entry { fd, meta })
    }

    /// What the entry `name` is, a link not followed.
    pub fn stat<P: ?Sized + nix::NixPath>(&self, name: &P) -> io::Result<nix::sys::stat::FileStat> {
        Ok(nix::sys::stat::fstatat(
            self.file.as_fd(),
            name,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?)
    }

    /// Sets the times of the entry `name` to now, a link not followed.
    pub fn touch<P: ?Sized + nix::NixPath>(&self, name: &P) -> io::Result<()> {
        use nix::sys::stat::{UtimensatFlags, utimensat};
        use nix::sys::time::TimeSpec;
        Ok(utimensat(
            self.file.as_fd(),
            name,
            &TimeSpec::UTIME_NOW,
            &TimeSpec::UTIME_NOW,
            UtimensatFlags::NoFollowSymlink,
        )?)
    }

    /// Where the symlink `name` points.
    pub fn read_link<P: ?Sized + nix::NixPath>(&self, name: &P) -> io::Result<PathBuf> {
        Ok(nix::fcntl::readlinkat(self.file.as_fd(), name)?.into())
    }

    /// Opens `name` for reading, never through a link, with `extra` flags (`O_NONBLOCK`).
    pub fn open_read<P: ?Sized + nix::NixPath>(&self, name: &P, extra: OFlag) -> io::Result<File> {
        self.open_at(name, OFlag::O_RDONLY | extra, Mode::empty())
    }

    /// Creates the new file `name` (exclusively, never through a link) holding `bytes`, at
    /// `mode` whatever the umask; synced to disk when `sync`.
    pub fn write_new<P: ?Sized + nix::NixPath>(
        &self,
        name: &P,
        bytes: &[u8],
        mode: u32,
        sync: bool,
    ) -> io::Result<()> {
        let mut f = self.open_at(
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY,
            Mode::from_bits_truncate(0o600),
        )?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    }

    /// Renames the entry `from` to `to`, both in this directory.
    pub fn rename<P: ?Sized + nix::NixPath, Q: ?Sized + nix::NixPath>(
        &self,
        from: &P,
        to: &Q,
    ) -> io::Result<()> {
        Ok(nix::fcntl::renameat(
            self.file.as_fd(),
            from,
            self.file.as_fd(),
            to,
        )?)
    }

    /// Removes the file (or link) `name`.
    pub fn remove_file<P: ?Sized + nix::NixPath>(&self, name: &P) -> io::Result<()> {
        Ok(nix::unistd::unlinkat(
            self.file.as_fd(),
            name,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )?)
    }

    /// Makes directory `name` here (mode `mode`) when it is not there, and opens it without
    /// following a link: `(the directory, whether it was made)`.
    pub fn make_dir<P: ?Sized + nix::NixPath>(
        &self,
        name: &P,
        mode: u32,
    ) -> io::Result<(Dir, bool)> {
        let made = match nix::sys::stat::mkdirat(
            self.file.as_fd(),
            name,
            Mode::from_bits_truncate(mode as nix::libc::mode_t),
        ) {
            Ok(()) => true,
            Err(nix::errno::Errno::EEXIST) => false,
            Err(e) => return Err(e.into()),
        };
        let dir = self.open_dir(name)?;
        if made {
            // The umask may have taken bits off.
            dir.set_mode(mode)?;
        }
        Ok((dir, made))
    }

    /// Makes a new directory `name` (or `name-2`, `name-3`, ... when taken) here, and opens
    /// it without following a link: the directory and its name.
    pub fn make_unique_dir(&self, name: &str, mode: u32) -> io::Result<(Dir, String)> {
        for n in 1..1000 {
            let candidate = if n == 1 {
                name.to_string()
            } else {
                format!("{name}-{n}")
            };
            match self.make_dir(candidate.as_str(), mode)? {
                (dir, true) => return Ok((dir, candidate)),
                (_, false) => continue,
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "too many directories of that name",
        ))
    }

    /// Moves `from` (an entry of this directory, shown as `shown`) to `to` in the directory
    /// `into`, by a rename relative to both. Across file systems a regular file or a link is
    /// copied and then removed, but a file larger than [`MAX_STRAY_COPY_BYTES`] is refused
    /// ([`NotCopied`]) and anything else is never copied.
    pub fn move_to(&self, from: &OsStr, into: &Dir, to: &OsStr, shown: &Path) -> io::Result<()> {
        let renamed = if crate::files::fsutil::fault("exdev") {
            Err(nix::errno::Errno::EXDEV)
        } else {
            nix::fcntl::renameat(self.file.as_fd(), from, into.file.as_fd(), to)
        };
        match renamed {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EXDEV) => {}
            Err(e) => return Err(e.into()),
        }
        self.copy_across(from, into, to, shown)?;
        self.remove_file(from)
    }

    /// The entry `from` (shown as `shown`) copied to `to` in `into`, on another file system:
    /// a link as a link, a regular file up to [`MAX_STRAY_COPY_BYTES`]; anything else is
    /// [`NotCopied`].
    fn copy_across(&self, from: &OsStr, into: &Dir, to: &OsStr, shown: &Path) -> io::Result<()> {
        let entry = self.look(from)?;
        let not_copied = |size| {
            io::Error::other(NotCopied {
                path: shown.to_path_buf(),
                size,
            })
        };
        let ft = entry.meta.file_type();
        if ft.is_symlink() {
            let target = self.read_link(from)?;
            nix::unistd::symlinkat(target.as_os_str(), into.file.as_fd(), to)?;
            Ok(())
        } else if ft.is_file() {
            if entry.meta.len() > MAX_STRAY_COPY_BYTES {
                return Err(not_copied(Some(entry.meta.len())));
            }
            let bytes =
                crate::files::input::read_capped(entry.open()?, MAX_STRAY_COPY_BYTES as usize)
                    .map_err(|e| io::Error::other(e.to_string()))?;
            into.write_copy(to, &bytes, entry.meta.mode() & 0o7777)
        } else {
            Err(not_copied(None))
        }
    }

    /// Writes the copy `to` of a stray, synced; a copy cut short is removed.
    fn write_copy(&self, to: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
        let written = if crate::files::fsutil::fault("copy-enospc") {
            // Half a copy, then a full disk.
            let _ = self.write_new(to, &bytes[..bytes.len() / 2], 0o600, true);
            Err(io::Error::from_raw_os_error(nix::libc::ENOSPC))
        } else {
            self.write_new(to, bytes, mode, true)
        };
        if written.is_err() {
            let _ = self.remove_file(to);
        }
        written
    }

    /// `openat` of `name` with `flags`, never through a link (`O_NOFOLLOW`), the descriptor
    /// not inherited (`O_CLOEXEC`).
    fn open_at<P: ?Sized + nix::NixPath>(
        &self,
        name: &P,
        flags: OFlag,
        mode: Mode,
    ) -> io::Result<File> {
        let fd = nix::fcntl::openat(
            self.file.as_fd(),
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            mode,
        )?;
        Ok(File::from(fd))
    }
}

impl Entry {
    /// What the entry is (a link is a link).
    pub fn metadata(&self) -> &fs::Metadata {
        &self.meta
    }

    /// The regular file looked at, opened for reading: the very inode [`Dir::look`] found,
    /// reopened through its descriptor (no second lookup of the name, so nothing renamed
    /// over it in between is read). Anything but a regular file is refused.
    pub fn open(&self) -> io::Result<File> {
        if !self.meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let own = Path::new("/proc/self/fd").join(self.fd.as_raw_fd().to_string());
        match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_CLOEXEC | nix::libc::O_NOCTTY)
            .open(own)
        {
            // The descriptor is open, so only a missing /proc makes this fail so.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(io::Error::other(
                "cannot reopen it through /proc/self/fd: mount /proc",
            )),
            other => other,
        }
    }
}

/// Whether a process has `file` (a regular file opened for reading, as [`Entry::open`]
/// gives one) open for writing now (`cp`, scp or `cat >` still at it, however long it
/// pauses): the kernel refuses a read lease (`F_SETLEASE`) on such a file. The lease, when
/// given, is let go at once. `None` where the kernel says nothing either way: a file of
/// another owner (leases need the owner or CAP_LEASE, which the service's unit does not
/// give), a file system without leases.
pub fn open_for_writing(file: &File) -> Option<bool> {
    use nix::libc::{EAGAIN, F_RDLCK, F_SETLEASE, F_UNLCK, fcntl};
    quiet_lease_breaks();
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(2) on a descriptor owned by `file`, open for the whole call; an int
    // argument, as F_SETLEASE takes.
    if unsafe { fcntl(fd, F_SETLEASE, F_RDLCK) } == 0 {
        // SAFETY: as above.
        unsafe { fcntl(fd, F_SETLEASE, F_UNLCK) };
        return Some(false);
    }
    (io::Error::last_os_error().raw_os_error() == Some(EAGAIN)).then_some(true)
}

/// A writer that opens the file in the moment the lease is held breaks it, and the kernel
/// tells the holder with SIGIO, whose default action ends the process. A handler that does
/// nothing takes it instead (a handler, unlike an ignored signal, is not passed on to the
/// programs the agent runs).
fn quiet_lease_breaks() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    extern "C" fn nothing(_: nix::libc::c_int) {}
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let action = SigAction::new(
            SigHandler::Handler(nothing),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        let _ = unsafe { sigaction(Signal::SIGIO, &action) };
    });
}

/// Why a directory was not opened.
#[derive(Debug)]
pub enum NotOpened {
    /// It is a symlink (to this).
    Symlink(PathBuf),
    /// It is not a directory.
    NotDir,
    Io(io::Error),
}

/// Why a directory the agent manages is not trusted.
#[derive(Debug)]
pub enum ManagedDirError {
    /// It is a symlink (to this): the agent never follows one out of its own directories.
    Symlink(PathBuf),
    /// It exists but is not a directory.
    NotDir,
    /// It holds what the agent does not expect there (these names, escaped).
    Unexpected(Vec<String>),
    Io(io::Error),
}

impl std::fmt::Display for ManagedDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ManagedDirError::Symlink(to) => write!(
                f,
                "is a symlink (to {}), and the agent never follows a symlink out of a directory it manages: make it a real directory, or point the config at the real one",
                crate::model::text::show_path(to)
            ),
            ManagedDirError::NotDir => f.write_str("is not a directory: move that file away"),
            ManagedDirError::Unexpected(names) => {
                let list = crate::model::text::few_and_count(names);
                write!(
                    f,
                    "holds what is not the agent's ({list}): the agent changes nothing in a directory it does not own; give it a directory of its own in the config, or move those away"
                )
            }
            ManagedDirError::Io(e) => write!(f, "cannot be read: {e}"),
        }
    }
}

impl std::error::Error for ManagedDirError {}

/// The entries of a directory the agent manages, sorted by name, after checking that it is
/// one: not a symlink, a directory (or absent: no entries), holding only what `expected`
/// accepts (given each entry's name and its own metadata, links not followed). Nothing is
/// changed here; a caller that would move or remove entries calls this first, so a wrong
/// `token_dir = "/etc/nvidia"` or a symlink to `/` is refused, not cleaned.
pub fn managed_entries(
    dir: &Path,
    expected: impl Fn(&str, &fs::Metadata) -> bool,
) -> Result<Vec<(OsString, PathBuf)>, ManagedDirError> {
    let open = match Dir::open_if_there(dir) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(Vec::new()),
        Err(NotOpened::Symlink(to)) => return Err(ManagedDirError::Symlink(to)),
        Err(NotOpened::NotDir) => return Err(ManagedDirError::NotDir),
        Err(NotOpened::Io(e)) => return Err(ManagedDirError::Io(e)),
    };
    let names = open.names().map_err(ManagedDirError::Io)?;
    let mut unexpected = Vec::new();
    for name in &names {
        let ok = match open.look(name.as_os_str()) {
            Ok(e) => expected(&name.to_string_lossy(), e.metadata()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(ManagedDirError::Io(e)),
        };
        if !ok {
            unexpected.push(crate::model::text::escape(&name.to_string_lossy()).into_owned());
        }
    }
    if !unexpected.is_empty() {
        return Err(ManagedDirError::Unexpected(unexpected));
    }
    Ok(names
        .into_iter()
        .map(|n| {
            let path = dir.join(&n);
            (n, path)
        })
        .collect())
}

/// A stray that would have to be copied across file systems, and is not copied: larger than
/// any file that belongs in the token directory (`Some(size)`), or a FIFO or socket (`None`).
#[derive(Debug)]
pub struct NotCopied {
    pub path: PathBuf,
    pub size: Option<u64>,
}

impl std::fmt::Display for NotCopied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = crate::model::text::show_path(&self.path);
        match self.size {
            Some(size) => write!(
                f,
                "{shown} is {size} bytes, larger than any token or gridd.conf, and the state directory is on another file system, so moving it aside would copy it: move or remove it yourself (rm {shown})"
            ),
            None => write!(
                f,
                "{shown} is a FIFO or socket, which cannot be moved to the state directory on another file system: remove it (rm {shown})"
            ),
        }
    }
}

impl std::error::Error for NotCopied {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_managed_directory_is_refused_when_a_symlink_or_holding_the_unexpected() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::write(real.join("gridd.conf"), b"x").unwrap();
        fs::create_dir(real.join("sub")).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let only_tok = |n: &str, m: &fs::Metadata| n.ends_with(".tok") && m.is_file();
        assert!(matches!(
            managed_entries(&link, only_tok),
            Err(ManagedDirError::Symlink(_))
        ));
        let e = managed_entries(&real, only_tok).unwrap_err();
        assert!(e.to_string().contains("(gridd.conf, sub)"), "{e}");
        assert!(
            managed_entries(&d.path().join("absent"), only_tok)
                .unwrap()
                .is_empty()
        );
        fs::remove_file(real.join("gridd.conf")).unwrap();
        fs::remove_dir(real.join("sub")).unwrap();
        fs::write(real.join("a.tok"), b"x").unwrap();
        assert_eq!(managed_entries(&real, only_tok).unwrap().len(), 1);
        assert!(matches!(
            managed_entries(&real.join("a.tok"), only_tok),
            Err(ManagedDirError::NotDir)
        ));
    }

    #[test]
    fn a_look_and_its_read_are_one_file_even_when_the_name_is_replaced_between() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("a.tok"), b"first").unwrap();
        let dir = Dir::open(t.path()).unwrap();
        let entry = dir.look("a.tok").unwrap();
        assert!(entry.metadata().is_file());
        // Replaced by a FIFO after the look: the read is still of the file looked at, and
        // never blocks on the FIFO.
        fs::remove_file(t.path().join("a.tok")).unwrap();
        nix::unistd::mkfifo(&t.path().join("a.tok"), Mode::from_bits_truncate(0o600)).unwrap();
        let bytes = crate::files::input::read_capped(entry.open().unwrap(), 100).unwrap();
        assert_eq!(bytes, b"first");
    }

    #[test]
    fn a_link_is_looked_at_as_a_link_and_never_opened() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("target"), b"secret").unwrap();
        std::os::unix::fs::symlink(t.path().join("target"), t.path().join("a.tok")).unwrap();
        let dir = Dir::open(t.path()).unwrap();
        let entry = dir.look("a.tok").unwrap();
        assert!(entry.metadata().file_type().is_symlink());
        assert!(entry.open().is_err());
        let e = dir.open_read("a.tok", OFlag::empty()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ELOOP));
        assert_eq!(dir.read_link("a.tok").unwrap(), t.path().join("target"));
    }

    #[test]
    fn a_fifo_is_looked_at_without_blocking() {
        let t = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&t.path().join("p"), Mode::from_bits_truncate(0o600)).unwrap();
        let entry = Dir::open(t.path()).unwrap().look("p").unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(
            &entry.metadata().file_type()
        ));
        assert!(entry.open().is_err());
    }

    #[test]
    fn a_symlink_is_not_opened_as_a_directory() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("real")).unwrap();
        std::os::unix::fs::symlink(t.path().join("real"), t.path().join("link")).unwrap();
        assert!(Dir::open(&t.path().join("link")).is_err());
        match Dir::open_if_there(&t.path().join("link")) {
            Err(NotOpened::Symlink(to)) => assert_eq!(to, t.path().join("real")),
            other => panic!("{other:?}"),
        }
        fs::write(t.path().join("file"), b"").unwrap();
        assert!(matches!(
            Dir::open_if_there(&t.path().join("file")),
            Err(NotOpened::NotDir)
        ));
        assert!(matches!(
            Dir::open_if_there(&t.path().join("absent")),
            Ok(None)
        ));
        let parent = Dir::open(t.path()).unwrap();
        assert!(parent.open_dir("link").is_err());
        assert!(parent.open_dir("real").is_ok());
    }

    #[test]
    fn names_are_listed_sorted_without_dot_entries() {
        let t = tempfile::tempdir().unwrap();
        for n in ["b", "a", ".c"] {
            fs::write(t.path().join(n), b"").unwrap();
        }
        let names = Dir::open(t.path()).unwrap().names().unwrap();
        assert_eq!(names, [".c", "a", "b"]);
    }

    #[test]
    fn a_new_file_has_its_mode_whatever_the_umask_and_is_never_written_over() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open(t.path()).unwrap();
        dir.write_new("x", b"1", 0o644, true).unwrap();
        assert_eq!(
            fs::metadata(t.path().join("x")).unwrap().mode() & 0o777,
            0o644
        );
        let e = dir.write_new("x", b"2", 0o644, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(t.path().join("x")).unwrap(), b"1");
    }
}
