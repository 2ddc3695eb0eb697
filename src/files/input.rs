//! Every file the agent reads goes through here, so that no input can hang it or fill its
//! memory: a path must name a regular file (a FIFO, a device, a socket or a directory is
//! refused before a byte is read; the open itself never blocks, thanks to `O_NONBLOCK`), and
//! reading stops one byte past a cap instead of counting on. Standard input, the one stream
//! the agent accepts, is read against a deadline as well as a cap.
//!
//! Files in directories the agent manages (the token directory, the state directory,
//! gridd.conf) are opened with `O_NOFOLLOW`: a symlink planted there is never followed. A
//! path that root names on the command line or in the config may be a symlink (a Kubernetes
//! Secret volume is made of them), but what it points to must still be a regular file.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Whether a symlink at the last component of a path is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow it (a path named by root); what it points to must be a regular file.
    Follow,
    /// Refuse it (a file in a directory the agent manages).
    Refuse,
}

/// Why an input could not be read. Its `Display` follows "cannot read `<path>`: ", as in
/// "cannot read /x: not a regular file but a FIFO".
#[derive(Debug)]
pub enum ReadError {
    /// The open or a read failed.
    Io(io::Error),
    /// The path names a symlink where none is accepted.
    Symlink,
    /// The path names something other than a regular file: its kind.
    NotRegular(&'static str),
    /// More than this many bytes.
    TooLarge(usize),
    /// Standard input sent nothing more before the deadline.
    Stalled(Duration),
}

impl ReadError {
    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Symlink => f.write_str("a symlink, which the agent never follows here"),
            ReadError::NotRegular(kind) => write!(f, "not a regular file but {kind}"),
            ReadError::TooLarge(cap) => write!(f, "larger than {}", human_size(*cap)),
            ReadError::Stalled(d) => write!(
                f,
                "the input did not end within {} s; pipe in a whole file",
                d.as_secs()
            ),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symlink"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading without blocking (a FIFO with no writer would block a plain open)
/// and returns it only if it is a regular file.
pub fn open_regular(path: &Path, links: Links) -> Result<File, ReadError> {
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC | nix::libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        // O_NOFOLLOW on a symlink fails with ELOOP.
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) && links == Links::Refuse => {
            return Err(ReadError::Symlink);
        }
        Err(e) => return Err(ReadError::Io(e)),
    };
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        return Err(ReadError::NotRegular(kind_of(ft)));
    }
    // Regular files never block, but reads should not see O_NONBLOCK's EAGAIN on the odd
    // file system that honours it: clear it.
    let fl =
        nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let fl = nix::fcntl::OFlag::from_bits_truncate(fl) & !nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_SETFL(fl)).map_err(io::Error::from)?;
    Ok(file)
}

/// Reads all of `r`, or fails once it holds more than `cap` bytes (reading one byte past the
/// cap, never the rest).
pub fn read_capped(r: impl Read, cap: usize) -> Result<Vec<u8>, ReadError> {
    let mut buf = Vec::new();
    r.take(cap as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > cap {
        return Err(ReadError::TooLarge(cap));
    }
    Ok(buf)
}

/// The whole content of the regular file at `path`, at most `cap` bytes.
pub fn read_file(path: &Path, cap: usize, links: Links) -> Result<Vec<u8>, ReadError> {
    read_capped(open_regular(path, links)?, cap)
}

/// The whole content of the regular file at `path` as text (invalid UTF-8 is an error).
pub fn read_text(path: &Path, cap: usize, links: Links) -> Result<String, ReadError> {
    String::from_utf8(read_file(path, cap, links)?).map_err(|_| {
        ReadError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "is not UTF-8 text",
        ))
    })
}

/// Standard input as a reader that fails with [`ReadError::Stalled`] (as an `io::Error`) when
/// the whole stream has not ended within `deadline`.
pub struct Stdin {
    deadline: Instant,
    limit: Duration,
}

impl Stdin {
    pub fn new(limit: Duration) -> Stdin {
        Stdin {
            deadline: Instant::now() + limit,
            limit,
        }
    }
}

impl Read for Stdin {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let stdin = io::stdin();
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    ReadError::Stalled(self.limit),
                ));
            }
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let fd = stdin.as_fd();
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => continue,
                // Straight from the descriptor: std's buffered handle could hold bytes that
                // poll cannot see, and the next poll would wait for nothing.
                Ok(_) => {
                    // SAFETY: fd 0 stays open for the life of the process; ManuallyDrop
                    // never closes it.
                    let mut raw = std::mem::ManuallyDrop::new(unsafe {
                        <File as std::os::fd::FromRawFd>::from_raw_fd(0)
                    });
                    return match raw.read(buf) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        r => r,
                    };
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Standard input, at most `cap` bytes, ended within `deadline`.
pub fn read_stdin(cap: usize, deadline: Duration) -> Result<Vec<u8>, ReadError> {
    read_capped(Stdin::new(deadline), cap).map_err(unwrap_stalled)
}

/// An input the command line names: `-` is standard input (it must end within
/// `stdin_deadline`), anything else a regular file (links followed: the operator named it).
/// At most `cap` bytes.
pub fn read_named(path: &Path, cap: usize, stdin_deadline: Duration) -> Result<Vec<u8>, ReadError> {
    if is_stdin(path) {
        read_stdin(cap, stdin_deadline)
    } else {
        read_file(path, cap, Links::Follow)
    }
}

/// Whether the command line's `path` means standard input (`-`).
pub fn is_stdin(path: &Path) -> bool {
    path == Path::new("-")
}

/// How an input the command line names is called in messages: `standard input`, or its path
/// escaped for a terminal.
pub fn named(path: &Path) -> String {
    if is_stdin(path) {
        "standard input".into()
    } else {
        crate::model::text::show_path(path)
    }
}

/// A [`ReadError::Stalled`] that travelled inside an `io::Error`, unwrapped.
pub fn unwrap_stalled(e: ReadError) -> ReadError {
    match e {
        ReadError::Io(io) if io.kind() == io::ErrorKind::TimedOut => match io.into_inner() {
            Some(inner) => match inner.downcast::<ReadError>() {
                Ok(r) => *r,
                Err(other) => ReadError::Io(io::Error::new(io::ErrorKind::TimedOut, other)),
            },
            None => ReadError::Io(io::Error::from(io::ErrorKind::TimedOut)),
        },
        other => other,
    }
}

/// A file (`-`: standard input, within `stdin_deadline`) as a reader that fails with
/// [`ReadError::TooLarge`] (inside an `io::Error`) past `cap` bytes: for inputs read as a
/// stream, such as a saved journal.
pub fn open_stream(
    path: &Path,
    cap: usize,
    stdin_deadline: Duration,
) -> Result<Box<dyn Read>, ReadError> {
    let inner: Box<dyn Read> = if path == Path::new("-") {
        Box::new(Stdin::new(stdin_deadline))
    } else {
        Box::new(open_regular(path, Links::Follow)?)
    };
    Ok(Box::new(Capped {
        inner,
        left: cap as u64,
        cap,
    }))
}

struct Capped {
    inner: Box<dyn Read>,
    left: u64,
    cap: usize,
}

impl Read for Capped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // At the cap: one more byte means too large; none means it ended there.
            let mut one = [0u8; 1];
            return match self.inner.read(&mut one)? {
                0 => Ok(0),
                _ => Err(io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    ReadError::TooLarge(self.cap),
                )),
            };
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// The one-line text of an `io::Error` that may carry a [`ReadError`] (from [`open_stream`]).
pub fn describe(e: &io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<ReadError>()) {
        Some(r) => r.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_file(&p, 100, Links::Follow).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file but a FIFO");
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = read_file(Path::new("/dev/zero"), 100, Links::Follow).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file but a character device");
        let d = tempfile::tempdir().unwrap();
        let e = read_file(d.path(), 100, Links::Follow).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular("a directory")), "{e:?}");
    }

    #[test]
    fn a_symlink_is_refused_or_followed_to_a_regular_file_only() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::write(&real, b"abc").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            read_file(&link, 100, Links::Refuse),
            Err(ReadError::Symlink)
        ));
        assert_eq!(read_file(&link, 100, Links::Follow).unwrap(), b"abc");
        let dev = d.path().join("dev");
        std::os::unix::fs::symlink("/dev/zero", &dev).unwrap();
        assert!(matches!(
            read_file(&dev, 100, Links::Follow),
            Err(ReadError::NotRegular(_))
        ));
    }

    #[test]
    fn reading_stops_one_byte_past_the_cap() {
        let mut endless = io::repeat(b'y');
        let e = read_capped(&mut endless, 1000).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge(1000)));
        assert_eq!(read_capped(&b"12345"[..], 5).unwrap(), b"12345");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("big");
        let mut f = File::create(&p).unwrap();
        f.write_all(&[b'x'; 4097]).unwrap();
        assert_eq!(
            read_file(&p, 4096, Links::Follow).unwrap_err().to_string(),
            "larger than 4 KiB"
        );
    }

    #[test]
    fn a_stream_fails_past_its_cap_and_ends_at_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j");
        std::fs::write(&p, [b'a'; 10]).unwrap();
        let mut out = Vec::new();
        open_stream(&p, 10, Duration::from_secs(1))
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out.len(), 10);
        let e = open_stream(&p, 9, Duration::from_secs(1))
            .unwrap()
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(describe(&e), "larger than 9 bytes");
    }
}
