//! The token directory as nvidia-gridd reads it, and the one rule that says which file in it is
//! the installed token.
//!
//! gridd reads whatever file is in `/etc/nvidia/ClientConfigToken`: the DLS's download name
//! (`client_configuration_token_MM-DD-YYYY-HH-MM-SS.tok`), a site's own name
//! (`bgo-client-token-latest`) and the standard `client_configuration_token.tok` are all the
//! token. So the installed token is the regular file there that decodes as a token, whatever
//! its name. With several, the rule is:
//!
//! 1. one that is valid now beats one that is expired or not yet valid;
//! 2. then the one that appeared last in the directory (its inode's change time, which a
//!    copy, a move into the directory and a write all set, and `cp -p` or `mv` of an old
//!    download do too): a token copied beside the installed one, as NVIDIA's guide rotates,
//!    is the operator's intent and wins, even while the old one is still valid by its dates;
//! 3. then the later `iat` (issued at), then the one named `paths.token_file`, then the name,
//!    so the choice is stable.
//!
//! docs/install.md says the same for operators.
//!
//! Every other entry is a stray: an old token, a misplaced gridd.conf, an editor's backup, a
//! README. gridd may read a stray and exit on it, so `install` and the service move strays into
//! `<state_dir>/replaced/` (nothing is lost). A directory that shows it is *not* a token
//! directory is refused, never cleaned: it holds the configured gridd.conf, a subdirectory, a
//! device node, or more than [`MAX_ENTRIES`] entries (`token_dir = "/etc/nvidia"` by mistake).
//! A FIFO or a socket is moved aside by a rename, never opened; where that would take a copy
//! (another file system), it is named with "remove it".
//!
//! Files are opened without following links and without blocking, and only regular files up
//! to the token's size cap are read.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::files::dir::{Dir, Entry, NotOpened};
use crate::files::input::{self, ReadError};
use crate::model::text::show_path;
use crate::model::token::{MAX_TOKEN_BYTES, Token, TokenError};

/// More entries than a token directory ever has: such a directory is some other directory.
pub const MAX_ENTRIES: usize = 64;

/// What a file that was read says.
#[derive(Debug, Clone)]
pub enum Content {
    /// It decodes as a token (valid now or not: that is judged at each observation).
    Token(Token),
    /// It does not decode.
    Invalid(TokenError),
    /// It cannot be read (permissions, I/O): the reason.
    Unreadable(String),
}

/// The installed token: the file gridd reads as the token.
#[derive(Debug, Clone)]
pub struct Installed {
    pub path: PathBuf,
    pub name: OsString,
    /// Its bytes, as read (empty when it could not be read).
    pub bytes: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub ino: u64,
    /// Its size and file system, as looked at.
    pub size: u64,
    pub dev: u64,
    pub content: Content,
}

impl Installed {
    /// Whether it is under the configured standard name.
    pub fn has_name(&self, token_file: &str) -> bool {
        self.name == token_file
    }
}

/// Why an entry is a stray.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrayKind {
    /// Another file that decodes as a token.
    OldToken,
    /// A regular file that is no token (a gridd.conf, a backup, a README, a broken token).
    NotAToken,
    /// A symlink (moved as the link, never followed).
    Link,
    /// A FIFO or a socket (moved by a rename, never opened).
    Special,
}

#[derive(Debug, Clone)]
pub struct Stray {
    pub path: PathBuf,
    pub name: OsString,
    pub kind: StrayKind,
    /// Size in bytes (of the link itself for a link).
    pub size: u64,
    pub dev: u64,
    /// For a file named or shaped like a token: why it is not the token, in the words the
    /// agent uses for a token alone in the directory ("expired at ...", what does not decode,
    /// or that a newer valid token appeared after it). `None` for any other stray.
    pub verdict: Option<String>,
    /// It is a token valid now whose bytes differ from the installed token's: gridd may be
    /// licensed with it, so moving it changes what gridd reads.
    pub other_token: bool,
    /// The SHA-256 of its bytes (hex), when it decodes as a token.
    pub sha256: Option<String>,
}

impl Stray {
    /// A stray with nothing read from it.
    pub fn plain(
        path: PathBuf,
        name: OsString,
        kind: StrayKind,
        meta: Option<&fs::Metadata>,
    ) -> Stray {
        Stray {
            size: meta.map_or(0, |m| m.len()),
            dev: meta.map_or(0, |m| m.dev()),
            path,
            name,
            kind,
            verdict: None,
            other_token: false,
            sha256: None,
        }
    }
}

/// The token directory as it is now.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub dir: PathBuf,
    /// Whether the directory exists.
    pub exists: bool,
    /// Its mode and owner, when it exists.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub dev: Option<u64>,
    pub token: Option<Installed>,
    pub strays: Vec<Stray>,
    /// Temporary files of an interrupted install of ours.
    pub temps: Vec<PathBuf>,
    /// Why this is not a token directory, when it is not: every change is refused.
    pub refusal: Option<String>,
    /// Entries not looked at, in a directory with more than [`MAX_ENTRIES`]: only counted.
    pub uncounted: usize,
    /// The latest change of a regular file looked at that is no whole token (its inode's
    /// change time, nanoseconds since the epoch): such a file changed a moment ago may still
    /// be being written. A file that decodes as a token is whole (a cut one does not decode).
    pub last_change: Option<i128>,
    /// The files open for writing now that are no whole token: left out of the rest (never
    /// the token, never a stray moved under its writer), judged once their writer closes
    /// them, while the rest of the directory is judged now.
    pub held: Vec<Held>,
}

/// A file of the token directory that a process has open for writing, and is no whole token.
#[derive(Debug, Clone)]
pub struct Held {
    pub name: OsString,
    /// Its last change (inode change time, nanoseconds since the epoch).
    pub changed: i128,
}

use crate::model::token::HELD_BOUND;

impl Listing {
    /// The strays' names for a message: a few, and how many more.
    pub fn stray_names(&self) -> String {
        let mut all: Vec<String> = self
            .strays
            .iter()
            .map(|s| crate::model::text::escape(&s.name.to_string_lossy()).into_owned())
            .collect();
        // The entries only counted still count in "and N more".
        all.extend(std::iter::repeat_n(String::new(), self.uncounted));
        crate::model::text::few_and_count(&all)
    }

    /// How long until every file looked at has been still for `settle`, at `now`; `None`
    /// when they have. A writer (`cp`, scp, `cat >`) creates a file, then writes it, maybe
    /// in several writes: what is seen in between is no verdict on it. A file still open for
    /// writing is never still, however long ago it changed; one whose change time is in the
    /// future (a clock set back) is.
    pub fn settling(
        &self,
        now: DateTime<Utc>,
        settle: std::time::Duration,
    ) -> Option<std::time::Duration> {
        // A file held open for writing is out of the listing and holds nothing up: its
        // writer closing it is a change the directory's watch sees (IN_CLOSE_WRITE), which
        // brings the look that judges it.
        let now = i128::from(now.timestamp_nanos_opt()?);
        let age = now - self.last_change?;
        let settle = settle.as_nanos() as i128;
        (0..settle)
            .contains(&age)
            .then(|| std::time::Duration::from_nanos((settle - age) as u64))
    }

    /// The files held open for writing and their last change, for a report to judge (the
    /// model names those held past [`HELD_BOUND`]).
    pub fn held_since(&self) -> Vec<(String, DateTime<Utc>)> {
        self.held
            .iter()
            .filter_map(|h| {
                let since = i64::try_from(h.changed).ok()?;
                Some((
                    crate::model::text::escape(&h.name.to_string_lossy()).into_owned(),
                    DateTime::from_timestamp_nanos(since),
                ))
            })
            .collect()
    }

    /// Whether a file that is no whole token is open for writing now (its writer pausing
    /// between writes).
    pub fn being_written(&self) -> bool {
        !self.held.is_empty()
    }

    /// The files held open for writing, unchanged for longer than [`HELD_BOUND`] at `now`:
    /// their names and for how long, in seconds.
    pub fn stuck_writers(&self, now: DateTime<Utc>) -> Vec<(String, u64)> {
        let Some(now) = now.timestamp_nanos_opt().map(i128::from) else {
            return Vec::new();
        };
        self.held
            .iter()
            .filter_map(|h| {
                let secs = u64::try_from((now - h.changed) / 1_000_000_000).ok()?;
                (secs >= HELD_BOUND.as_secs()).then(|| {
                    (
                        crate::model::text::escape(&h.name.to_string_lossy()).into_owned(),
                        secs,
                    )
                })
            })
            .collect()
    }

    /// Whether a stray is a misplaced gridd.conf (gridd exits on it).
    pub fn has_gridd_conf(&self) -> bool {
        self.strays
            .iter()
            .any(|s| s.name.to_string_lossy().eq_ignore_ascii_case("gridd.conf"))
    }
}

/// A few names, escaped, and a count of the rest.
pub fn names(all: impl Iterator<Item = String>) -> String {
    let all: Vec<String> = all
        .map(|n| crate::model::text::escape(&n).into_owned())
        .collect();
    crate::model::text::few_and_count(&all)
}

/// Why the directory cannot be looked at at all.
#[derive(Debug)]
pub enum ScanError {
    /// It is a symlink (to this).
    Symlink(PathBuf),
    /// It exists and is not a directory.
    NotDir,
    Io(io::Error),
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::Symlink(to) => write!(
                f,
                "is a symlink (to {}), and the agent never follows a symlink out of a directory it manages: make it a real directory, or point paths.token_dir at the real one",
                show_path(to)
            ),
            ScanError::NotDir => f.write_str("is not a directory: move that file away"),
            ScanError::Io(e) => write!(f, "cannot be read: {e}"),
        }
    }
}

impl std::error::Error for ScanError {}

/// Looks at the token directory: which file is the token, what else is there, and whether
/// it is a token directory at all. Changes nothing. `gridd_conf` is the configured gridd.conf
/// (a directory that holds it is not a token directory); `now` decides rule 1.
pub fn scan(
    dir: &Path,
    token_file: &str,
    gridd_conf: &Path,
    now: DateTime<Utc>,
) -> Result<Listing, ScanError> {
    let mut out = Listing {
        dir: dir.to_path_buf(),
        ..Listing::default()
    };
    let opened = match Dir::open_if_there(dir) {
        Ok(Some(d)) => d,
        Ok(None) => return Ok(out),
        Err(NotOpened::Symlink(to)) => return Err(ScanError::Symlink(to)),
        Err(NotOpened::NotDir) => return Err(ScanError::NotDir),
        Err(NotOpened::Io(e)) => return Err(ScanError::Io(e)),
    };
    let m = opened.metadata().map_err(ScanError::Io)?;
    out.exists = true;
    out.mode = Some(m.mode() & 0o7777);
    out.uid = Some(m.uid());
    out.dev = Some(m.dev());
    let entries = entries(&opened, dir, token_file, &mut out.uncounted)?;
    let mut sorting = Sorting {
        dir: &opened,
        token_file,
        gridd_conf,
        conf_here: gridd_conf.parent() == Some(dir),
        crowded: entries.len() > MAX_ENTRIES,
        out,
        wrong: Vec::new(),
        link_at_token: None,
        candidates: Vec::new(),
    };
    for (name, path) in entries {
        sorting.entry(name, path)?;
    }
    let Sorting {
        mut out,
        crowded,
        wrong,
        link_at_token,
        candidates,
        ..
    } = sorting;
    choose(&mut out, candidates, token_file, now);
    out.refusal = refusal(dir, crowded, wrong, link_at_token);
    Ok(out)
}

/// The entries to look at, sorted: their names and paths. A directory with more entries
/// than a token directory ever has (a sync tool's 20,000 files, `/etc` by mistake) is not
/// read whole: its first entries and the token's own path are looked at, the rest only
/// counted (in `uncounted`), so that a look costs the same whatever the directory holds.
fn entries(
    opened: &Dir,
    dir: &Path,
    token_file: &str,
    uncounted: &mut usize,
) -> Result<Vec<(OsString, PathBuf)>, ScanError> {
    let mut entries = Vec::new();
    opened
        .each_name(|name| {
            if entries.len() <= MAX_ENTRIES {
                let path = dir.join(&name);
                entries.push((name, path));
            } else {
                *uncounted += 1;
            }
            true
        })
        .map_err(ScanError::Io)?;
    let crowded = entries.len() > MAX_ENTRIES;
    if crowded && !entries.iter().any(|(n, _)| n == token_file) && opened.stat(token_file).is_ok() {
        entries.push((token_file.into(), dir.join(token_file)));
        *uncounted = uncounted.saturating_sub(1);
    }
    entries.sort();
    Ok(entries)
}

/// What each entry of the directory is, as [`scan`] goes through them.
struct Sorting<'a> {
    /// The directory, open.
    dir: &'a Dir,
    token_file: &'a str,
    gridd_conf: &'a Path,
    /// The configured gridd.conf is in this directory.
    conf_here: bool,
    /// More entries than a token directory ever has: only the token's path is read.
    crowded: bool,
    out: Listing,
    /// What shows this is not a token directory.
    wrong: Vec<String>,
    /// Why the token's own path cannot be written through, where it cannot.
    link_at_token: Option<String>,
    /// The regular files, and when each appeared.
    candidates: Vec<(Installed, i128)>,
}

impl Sorting<'_> {
    fn entry(&mut self, name: OsString, path: PathBuf) -> Result<(), ScanError> {
        let shown = name.to_string_lossy().into_owned();
        let entry = match self.dir.look(name.as_os_str()) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ScanError::Io(e)),
        };
        let meta = entry.metadata().clone();
        let ft = meta.file_type();
        if crate::files::fsutil::is_temp_name(&shown) && ft.is_file() {
            self.out.temps.push(path);
        } else if let Some(wrong) = self.not_of_a_token_dir(&name, &path, &shown, ft) {
            self.wrong.push(wrong);
        } else if name == self.token_file && (ft.is_symlink() || ft.is_fifo() || ft.is_socket()) {
            self.at_token_path(&name, &path, &meta);
        } else if ft.is_symlink() {
            self.out
                .strays
                .push(Stray::plain(path, name, StrayKind::Link, Some(&meta)));
        } else if ft.is_fifo() || ft.is_socket() {
            self.out
                .strays
                .push(Stray::plain(path, name, StrayKind::Special, Some(&meta)));
        } else {
            self.regular(name, path, &entry);
        }
        Ok(())
    }

    /// An entry that shows this is not a token directory: the configured gridd.conf, a
    /// directory, a device.
    fn not_of_a_token_dir(
        &self,
        name: &OsString,
        path: &Path,
        shown: &str,
        ft: fs::FileType,
    ) -> Option<String> {
        if self.conf_here && Some(name.as_os_str()) == self.gridd_conf.file_name() {
            Some(format!("the configured gridd.conf {}", show_path(path)))
        } else if ft.is_dir() {
            Some(format!(
                "the directory {}",
                crate::model::text::escape(shown)
            ))
        } else if ft.is_block_device() || ft.is_char_device() {
            Some(format!("the device {}", crate::model::text::escape(shown)))
        } else {
            None
        }
    }

    /// A FIFO, a socket or a symlink at the token's own path: what gridd reads as the token,
    /// and never written through.
    fn at_token_path(&mut self, name: &OsString, path: &Path, meta: &fs::Metadata) {
        let ft = meta.file_type();
        if ft.is_fifo() || ft.is_socket() {
            // Reported as the token, and never opened or moved (a FIFO would block whoever
            // reads it).
            let kind = if ft.is_fifo() { "a FIFO" } else { "a socket" };
            self.out.token = Some(installed(
                path,
                name,
                meta,
                Vec::new(),
                Content::Unreadable(format!("not a regular file but {kind}")),
            ));
            self.link_at_token = Some(format!(
                "the token path {} is not a regular file but {kind}; remove it (rm {}) and run install again",
                show_path(path),
                show_path(path)
            ));
        } else {
            // Refused, as every symlink the agent would write through (a link elsewhere in
            // the directory is moved aside as a link).
            let to = (self.dir.read_link(name.as_os_str()))
                .map(|t| format!(" (pointing to {})", show_path(&t)))
                .unwrap_or_default();
            self.link_at_token = Some(format!(
                "the token {} is a symlink{to}; the agent never writes through a symlink: remove it (rm {}) and run install again",
                show_path(path),
                show_path(path)
            ));
        }
    }

    /// A regular file: a candidate for the token, read only if it may be one.
    fn regular(&mut self, name: OsString, path: PathBuf, entry: &Entry) {
        let worth_reading = !self.crowded || name == self.token_file;
        let meta = entry.metadata();
        let Some((bytes, content, writing)) = regular_content(entry, worth_reading) else {
            return;
        };
        if !matches!(content, Content::Token(_)) {
            if writing {
                self.out.held.push(Held {
                    name,
                    changed: appeared(meta),
                });
                return;
            }
            self.out.last_change = self.out.last_change.max(Some(appeared(meta)));
        }
        self.candidates.push((
            installed(&path, &name, meta, bytes, content),
            appeared(meta),
        ));
    }
}

/// What a regular file holds: its bytes where they were read, what they are, and, for one
/// that is no whole token, whether a process has it open for writing; `None` where it is
/// gone.
fn regular_content(entry: &Entry, worth_reading: bool) -> Option<(Vec<u8>, Content, bool)> {
    let meta = entry.metadata();
    let writing = |file: &fs::File| crate::files::dir::open_for_writing(file) == Some(true);
    let unread = |content| {
        let written = entry.open().is_ok_and(|f| writing(&f));
        Some((Vec::new(), content, written))
    };
    if !worth_reading {
        return unread(Content::Invalid(TokenError::TooLarge(0)));
    }
    if meta.len() > MAX_TOKEN_BYTES as u64 {
        return unread(Content::Invalid(TokenError::TooLarge(meta.len() as usize)));
    }
    let file = match entry.open() {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some((Vec::new(), Content::Unreadable(e.to_string()), false)),
    };
    match input::read_capped(&file, MAX_TOKEN_BYTES) {
        Ok(bytes) => match Token::decode(&bytes) {
            Ok(t) => Some((bytes, Content::Token(t), false)),
            Err(e) => Some((bytes, Content::Invalid(e), writing(&file))),
        },
        Err(ReadError::TooLarge(_)) => Some((
            Vec::new(),
            Content::Invalid(TokenError::TooLarge(MAX_TOKEN_BYTES + 1)),
            writing(&file),
        )),
        Err(e) if e.is_not_found() => None,
        Err(e) => Some((
            Vec::new(),
            Content::Unreadable(e.to_string()),
            writing(&file),
        )),
    }
}

/// Why this is not a token directory, or why its token's path cannot be written through.
fn refusal(
    dir: &Path,
    crowded: bool,
    mut wrong: Vec<String>,
    link_at_token: Option<String>,
) -> Option<String> {
    let dir_shown = show_path(dir);
    if crowded {
        wrong.insert(
            0,
            format!("more entries than a token directory ever has (over {MAX_ENTRIES})"),
        );
    }
    if !wrong.is_empty() {
        Some(format!(
            "the token directory {dir_shown} (paths.token_dir) is not a token directory: it holds {}; the agent changes nothing in it: point paths.token_dir at the directory gridd reads (/etc/nvidia/ClientConfigToken), or move those away",
            names(wrong.into_iter())
        ))
    } else {
        link_at_token
    }
}

/// When an entry appeared in the directory, as far as the file system tells: its inode's last
/// change (a copy, a move into the directory, a write, a chmod), in nanoseconds.
fn appeared(meta: &fs::Metadata) -> i128 {
    i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
}

/// Whether a file's name says it is meant as a token: the standard name, or `*.tok`.
fn token_named(name: &OsString, token_file: &str) -> bool {
    name == token_file || name.to_string_lossy().ends_with(".tok")
}

/// The rule (see the module's doc): which candidate is the token; the others are strays,
/// each with its verdict.
fn choose(
    out: &mut Listing,
    mut candidates: Vec<(Installed, i128)>,
    token_file: &str,
    now: DateTime<Utc>,
) {
    let rank = |(i, appeared): &(Installed, i128)| {
        let token = match &i.content {
            Content::Token(t) => Some(t),
            _ => None,
        };
        let valid = token.is_some_and(|t| t.validity(now).is_ok());
        // A file that does not decode is the token only under a token's name: the standard
        // one, or `*.tok`; a README is a stray, never "the token".
        (
            token.is_some() || token_named(&i.name, token_file),
            valid,
            token.is_some(),
            *appeared,
            token.and_then(|t| t.issued_at),
            i.name == token_file,
            std::cmp::Reverse(i.name.clone()),
        )
    };
    candidates.sort_by_cached_key(|c| std::cmp::Reverse(rank(c)));
    let mut candidates = candidates.into_iter();
    if let Some(first) = candidates.next() {
        let r = rank(&first);
        let (chosen, _) = first;
        if r.0 && out.token.is_none() {
            out.token = Some(chosen);
        } else {
            let verdict = verdict(&chosen, None, token_file, now);
            out.strays
                .push(as_stray(chosen, StrayKind::NotAToken, verdict, None, now));
        }
    }
    let chosen = out.token.as_ref();
    for (other, _) in candidates {
        let kind = match other.content {
            Content::Token(_) => StrayKind::OldToken,
            _ => StrayKind::NotAToken,
        };
        let verdict = verdict(&other, chosen, token_file, now);
        out.strays.push(as_stray(other, kind, verdict, chosen, now));
    }
    out.strays.sort_by(|a, b| a.name.cmp(&b.name));
}

/// Why a file that lost to `chosen` is not the token, for one named or shaped like a token.
fn verdict(
    lost: &Installed,
    chosen: Option<&Installed>,
    token_file: &str,
    now: DateTime<Utc>,
) -> Option<String> {
    match &lost.content {
        Content::Token(t) => Some(match t.validity(now) {
            Err(crate::model::token::Untimely::Expired(at)) => {
                format!("the token expired at {}", crate::model::time::rfc3339(at))
            }
            Err(crate::model::token::Untimely::NotYetValid(at)) => format!(
                "the token is not valid before {} (is this guest's clock right?)",
                crate::model::time::rfc3339(at)
            ),
            Ok(()) => match chosen {
                Some(c) => format!(
                    "a valid token, but {} appeared after it and is the token now (the newest valid token wins)",
                    crate::model::text::escape(&c.name.to_string_lossy())
                ),
                None => "a valid token, but not the one chosen".into(),
            },
        }),
        Content::Invalid(e) if token_named(&lost.name, token_file) => Some(e.to_string()),
        Content::Unreadable(why) if token_named(&lost.name, token_file) => {
            Some(format!("it cannot be read: {why}"))
        }
        _ => None,
    }
}

/// The SHA-256 of a token's bytes, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn installed(
    path: &Path,
    name: &OsString,
    meta: &fs::Metadata,
    bytes: Vec<u8>,
    content: Content,
) -> Installed {
    Installed {
        path: path.to_path_buf(),
        name: name.clone(),
        bytes,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        ino: meta.ino(),
        size: meta.len(),
        dev: meta.dev(),
        content,
    }
}

fn as_stray(
    i: Installed,
    kind: StrayKind,
    verdict: Option<String>,
    chosen: Option<&Installed>,
    now: DateTime<Utc>,
) -> Stray {
    let sha256 = matches!(i.content, Content::Token(_)).then(|| sha256_hex(&i.bytes));
    let valid = matches!(&i.content, Content::Token(t) if t.validity(now).is_ok());
    let other_token = valid && chosen.is_none_or(|c| c.bytes != i.bytes);
    Stray {
        verdict,
        other_token,
        sha256,
        size: i.size,
        dev: i.dev,
        ..Stray::plain(i.path, i.name, kind, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token(exp_days: i64) -> String {
        let now = Utc::now().timestamp();
        crate::model::token::testing::make_token(&serde_json::json!({
            "iat": now - 86400, "nbf": now - 86400, "exp": now + exp_days * 86400,
            "service_instance_configuration": {
                "node_url_list": [{"url": "dls.example.com", "svc_port_set_idx": 0}],
                "svc_port_set_list": [{"svc_port_map": [
                    {"service": "auth", "port": 443}, {"service": "lease", "port": 443}]}]
            }
        }))
    }

    fn scan_dir(dir: &Path) -> Listing {
        scan(
            dir,
            "client_configuration_token.tok",
            Path::new("/etc/nvidia/gridd.conf"),
            Utc::now(),
        )
        .unwrap()
    }

    #[test]
    fn a_token_under_any_name_is_the_token() {
        for name in [
            "client_configuration_token_11-30-2026-10-00-00.tok",
            "bgo-client-token-latest",
        ] {
            let d = tempfile::tempdir().unwrap();
            fs::write(d.path().join(name), token(30)).unwrap();
            let l = scan_dir(d.path());
            let t = l.token.expect("a token");
            assert_eq!(t.name, name);
            assert!(matches!(t.content, Content::Token(_)));
            assert!(l.strays.is_empty());
            assert!(l.refusal.is_none());
        }
    }

    #[test]
    fn the_rule_picks_valid_then_the_last_to_appear() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("old.tok"), token(-1)).unwrap();
        fs::write(d.path().join("client_configuration_token.tok"), token(30)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(d.path().join("newer.tok"), token(30)).unwrap();
        let l = scan_dir(d.path());
        assert_eq!(l.token.unwrap().name, "newer.tok");
        assert_eq!(l.strays.len(), 2);
        assert!(l.strays.iter().all(|s| s.kind == StrayKind::OldToken));

        // Without it: the valid one, whatever appeared later.
        fs::remove_file(d.path().join("client_configuration_token.tok")).unwrap();
        let f = fs::File::options()
            .write(true)
            .open(d.path().join("old.tok"))
            .unwrap();
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
            .unwrap();
        assert_eq!(scan_dir(d.path()).token.unwrap().name, "newer.tok");
    }

    #[test]
    fn a_valid_token_that_appears_after_the_installed_one_wins() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("client_configuration_token.tok"), token(30)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let new = "client_configuration_token_12-01-2026-09-30-00.tok";
        fs::write(d.path().join(new), token(60)).unwrap();
        let l = scan_dir(d.path());
        assert_eq!(l.token.unwrap().name, new);
        let old = &l.strays[0];
        assert_eq!(old.kind, StrayKind::OldToken);
        assert!(old.other_token);
        assert!(old.verdict.as_ref().unwrap().contains(new), "{old:?}");

        // An expired one that appears later loses, and says why.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(d.path().join("late.tok"), token(-1)).unwrap();
        let l = scan_dir(d.path());
        assert_eq!(l.token.unwrap().name, new);
        let late = l.strays.iter().find(|s| s.name == "late.tok").unwrap();
        assert!(
            late.verdict
                .as_ref()
                .unwrap()
                .starts_with("the token expired at")
        );
        assert!(!late.other_token);

        // A broken `.tok` beside it: the words of a token alone in the directory.
        fs::write(d.path().join("cut.tok"), &token(60)[..40]).unwrap();
        let l = scan_dir(d.path());
        let cut = l.strays.iter().find(|s| s.name == "cut.tok").unwrap();
        let words = Token::decode(&token(60).as_bytes()[..40])
            .unwrap_err()
            .to_string();
        assert_eq!(cut.verdict.as_deref(), Some(words.as_str()));
    }

    #[test]
    fn a_file_changed_a_moment_ago_is_still_settling() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("new.tok"), "").unwrap();
        let l = scan_dir(d.path());
        let settle = std::time::Duration::from_secs(1);
        let wait = l.settling(Utc::now(), settle).expect("settling");
        assert!(wait <= settle);
        assert_eq!(
            l.settling(Utc::now() + chrono::Duration::seconds(2), settle),
            None
        );
        // A change time in the future (a clock set back) does not hold the verdict forever.
        assert_eq!(
            l.settling(Utc::now() - chrono::Duration::seconds(60), settle),
            None
        );
    }

    #[test]
    fn a_file_open_for_writing_is_held_out_and_holds_nothing_up() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("new.tok");
        let mut writer = fs::File::create(&path).unwrap();
        writer.write_all(&token(60).as_bytes()[..40]).unwrap();
        let later = Utc::now() + chrono::Duration::seconds(60);
        let settle = std::time::Duration::from_secs(1);
        let l = scan_dir(d.path());
        assert!(l.being_written());
        // Neither the token nor a stray: held out, named once its writer stays past the bound.
        assert!(l.token.is_none() && l.strays.is_empty(), "{l:?}");
        assert_eq!(l.held.len(), 1);
        assert_eq!(l.settling(later, settle), None);
        assert!(l.stuck_writers(later).is_empty());
        let much_later = Utc::now() + chrono::Duration::seconds(600);
        assert_eq!(l.stuck_writers(much_later)[0].0, "new.tok");
        // A valid token beside it is the token now, whatever the held file becomes.
        fs::write(d.path().join("other.tok"), token(60)).unwrap();
        let l = scan_dir(d.path());
        assert_eq!(
            l.token.as_ref().map(|t| t.name.clone()),
            Some("other.tok".into())
        );
        assert!(l.strays.is_empty(), "{l:?}");
        fs::remove_file(d.path().join("other.tok")).unwrap();
        // Closed by its writer: judged once still, as any file.
        drop(writer);
        let l = scan_dir(d.path());
        assert!(!l.being_written());
        assert_eq!(l.settling(later, settle), None);
        // Open only for reading: no writer.
        let _reader = fs::File::open(&path).unwrap();
        assert!(!scan_dir(d.path()).being_written());
        // A whole token open for writing is whole: nothing is waited for.
        fs::remove_file(&path).unwrap();
        let mut writer = fs::File::create(&path).unwrap();
        writer.write_all(token(60).as_bytes()).unwrap();
        assert!(!scan_dir(d.path()).being_written());
    }

    #[test]
    fn strays_are_named_and_a_readme_is_never_the_token() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("gridd.conf"), "FeatureType=1\n").unwrap();
        fs::write(d.path().join("README"), "hello").unwrap();
        let l = scan_dir(d.path());
        assert!(l.token.is_none());
        assert!(l.has_gridd_conf());
        assert_eq!(l.stray_names(), "README, gridd.conf");
        assert!(l.refusal.is_none(), "strays are moved, not refused");
        // A broken file under the standard name is the (broken) token.
        fs::write(d.path().join("client_configuration_token.tok"), "garbage").unwrap();
        let l = scan_dir(d.path());
        assert!(matches!(l.token.unwrap().content, Content::Invalid(_)));
    }

    #[test]
    fn a_directory_that_is_not_a_token_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("sub")).unwrap();
        let l = scan_dir(d.path());
        assert!(l.refusal.unwrap().contains("not a token directory"));

        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("gridd.conf"), "").unwrap();
        let l = scan(
            d.path(),
            "client_configuration_token.tok",
            &d.path().join("gridd.conf"),
            Utc::now(),
        )
        .unwrap();
        assert!(l.refusal.unwrap().contains("the configured gridd.conf"));

        let d = tempfile::tempdir().unwrap();
        for i in 0..=MAX_ENTRIES {
            fs::write(d.path().join(format!("f{i}")), "x").unwrap();
        }
        let l = scan_dir(d.path());
        let why = l.refusal.clone().unwrap();
        assert!(why.contains("more entries"), "{why}");
        assert!(
            l.stray_names()
                .ends_with(&format!("and {} more", MAX_ENTRIES + 1 - 5))
        );
    }

    #[test]
    fn a_fifo_is_a_stray_never_opened() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("pipe.tok");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let l = scan_dir(d.path());
        assert!(l.refusal.is_none());
        assert!(l.token.is_none());
        assert_eq!(l.stray_names(), "pipe.tok");
    }

    #[test]
    fn an_unreadable_token_is_reported_not_skipped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("client_configuration_token.tok");
        fs::write(&p, token(30)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o744)).unwrap();
        let l = scan_dir(d.path());
        assert_eq!(l.token.unwrap().mode, 0o744);
    }
}
