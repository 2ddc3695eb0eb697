//! nvidia-gridd's log into events.
//!
//! Accepted, line by line and mixed freely: `journalctl -o json` (only entries that journald's
//! own fields show nvidia-gridd sent: see [`Trust`]), journalctl/syslog text (`host
//! nvidia-gridd[PID]: msg`, `nvidia-gridd: msg`, with or without a timestamp; short,
//! short-precise, short-iso and short-full styles), a pasted `systemctl status nvidia-gridd`
//! (its `Active: ... since` header gives the year and zone), the Windows container's
//! `ctime:<N>:msg` style and bare gridd messages one per line. Lines of other programs are
//! ignored even when their text looks like gridd's. Text, which cannot say who logged it, is
//! read only from saved logs, never from the agent's own journal stream.
//!
//! The input is streamed in large chunks: a `journalctl -o json` export is searched for
//! `nvidia-gridd` and only the lines holding it are parsed, so memory stays flat and the speed
//! stays close to `grep`'s.

use std::collections::VecDeque;
use std::io::{self, Read};

use chrono::DateTime;
use memchr::{memchr, memmem, memrchr};

pub use crate::observe::catalogue::{Classified, classify, reason_of_error};
use crate::observe::entry::{self, Field, Fields};
use crate::observe::lines::Lines;
use crate::observe::meaning::{EventKind, Reason};
pub use crate::observe::stamp::Stamp;
use crate::observe::stamp::parse_stamp;

const IDENT: &str = "nvidia-gridd";
/// gridd's unit, as journald records it in `_SYSTEMD_UNIT`.
const UNIT: &str = "nvidia-gridd.service";
/// Lines longer than this are skipped (no gridd line is anywhere near it).
pub const MAX_LINE: usize = 8 << 20;
const CHUNK: usize = 1 << 20;
/// How close (seconds) a specific failure line must be to a bare `Failed to acquire license`.
const INHERIT_WINDOW_SECS: i64 = 5;

/// One meaningful gridd log line: when, from which process, its text, and what it says.
#[derive(Debug, Clone, PartialEq)]
pub struct GriddEvent {
    pub stamp: Option<Stamp>,
    pub pid: Option<u32>,
    pub message: String,
    pub what: Classified,
}

/// Year (and zone) a pasted `systemctl status` header gives the lines below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    pub year: i32,
    pub month: u32,
    pub offset: Option<i32>,
}

/// What a scan saw besides the events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScanStats {
    pub bytes: u64,
    /// Lines from nvidia-gridd (or bare gridd messages) turned into events.
    pub gridd_lines: u64,
    pub skipped_long_lines: u64,
    /// Set by a reader that kept only the newest part of a longer log: the oldest entries
    /// were not read.
    pub older_dropped: bool,
    /// The time of the log's last line, when it had one.
    pub last_stamp: Option<Stamp>,
    pub context: Option<Context>,
}

/// `name[pid]` or `name` -> (name, pid).
fn parse_ident(tok: &str) -> Option<(&str, Option<u32>)> {
    if tok.is_empty() || tok.contains(char::is_whitespace) {
        return None;
    }
    match tok.split_once('[') {
        Some((name, pid)) => {
            let pid = pid.strip_suffix(']')?;
            (!name.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
                .then(|| (name, pid.parse().ok()))
        }
        None => Some((tok, None)),
    }
}

/// A syslog-style line split into who logged it and what.
#[derive(Debug, PartialEq)]
pub(crate) enum TextLine<'a> {
    /// `[time] [host] ident[pid]: message`
    Logged {
        stamp: Option<Stamp>,
        ident: &'a str,
        pid: Option<u32>,
        message: &'a str,
    },
    /// No program named: perhaps a bare gridd message.
    Bare {
        stamp: Option<Stamp>,
        message: &'a str,
    },
}

fn split_logged(rest: &str) -> Option<(&str, Option<u32>, &str)> {
    let colon = rest.find(':')?;
    let head = rest[..colon].trim();
    let message = rest[colon + 1..]
        .strip_prefix(' ')
        .unwrap_or(&rest[colon + 1..]);
    let mut words = head.split_whitespace();
    let (a, b, c) = (words.next()?, words.next(), words.next());
    if c.is_some() {
        return None;
    }
    let ident_tok = b.unwrap_or(a);
    let (ident, pid) = parse_ident(ident_tok)?;
    // A program name has no dots or slashes that a sentence would; `host ident` needs a
    // timestamp-less host that looks like one.
    if ident.contains(['.', '/', '(', ')', ',', ';']) {
        return None;
    }
    Some((ident, pid, message))
}

pub(crate) fn parse_text_line(line: &str) -> Option<TextLine<'_>> {
    // Pasted docs comment lines out with '#'; pagers and shells indent.
    let line = line.trim_start_matches(|c: char| c.is_whitespace() || c == '#');
    let line = line.trim_end();
    if line.is_empty() {
        return None;
    }
    let (stamp, rest) = match parse_stamp(line) {
        Some((st, rest)) => (Some(st), rest.trim_start()),
        None => (None, line),
    };
    // Windows container style: <N>:message
    if let Some(r) = rest.strip_prefix('<')
        && let Some((n, msg)) = r.split_once(">:")
        && n.bytes().all(|b| b.is_ascii_digit())
    {
        return Some(TextLine::Bare {
            stamp,
            message: msg,
        });
    }
    match split_logged(rest) {
        Some((ident, pid, message)) => Some(TextLine::Logged {
            stamp,
            ident,
            pid,
            message,
        }),
        None => Some(TextLine::Bare {
            stamp,
            message: rest,
        }),
    }
}

/// `Active: active (running) since Mon 2024-09-16 01:16:29 CST; 11s ago`
pub(crate) fn parse_status_header(line: &str) -> Option<Context> {
    let t = line.trim_start();
    if !t.starts_with("Active:") {
        return None;
    }
    let since = &t[t.find(" since ")? + " since ".len()..];
    let since = since.split(';').next()?;
    let (st, _) = parse_stamp(since)?;
    Some(Context {
        year: st.year?,
        month: st.month,
        offset: st.offset,
    })
}

/// A line's time, given the year and zone of the pasted `systemctl status` header above it.
pub(crate) fn in_context(stamp: Stamp, context: Option<Context>) -> Stamp {
    let mut st = stamp;
    if let Some(ctx) = context {
        // Only yearless syslog lines take the header's year and zone; a line with its
        // own year said its own zone (or that it had none we know).
        if st.year.is_none() {
            // The header's year, but across New Year: a January line under a December
            // header is from the next year, a December line under a January header (a
            // line from before the unit started) from the one before.
            let (m, c) = (i64::from(st.month), i64::from(ctx.month));
            st.year = Some(if c - m > 6 {
                ctx.year + 1
            } else if m - c > 6 {
                ctx.year - 1
            } else {
                ctx.year
            });
            st.offset = ctx.offset;
        }
    }
    st
}

/// Whose word a journal entry is taken on for having come from nvidia-gridd.
///
/// `SYSLOG_IDENTIFIER` is whatever the sender wrote: any local user can run `logger -t
/// nvidia-gridd "... Clock windback has been detected"`, and a forged failure would steer the
/// agent (clock skew, for one, stops its restarts). The fields starting with `_` are journald's
/// own, taken from the sending socket's credentials and the sender's `/proc` entry; journald
/// drops any a client sends. Only they can tell gridd's lines from such forgeries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// The agent's own `journalctl -o json` of this machine: an entry counts only when journald
    /// vouches that root sent it (`_UID=0`) and that the sender was gridd (`_COMM`, `_EXE` or
    /// `_SYSTEMD_UNIT`). When journald could not read the sender's process (it had already
    /// exited: gridd's last lines can be such), root's word in `SYSLOG_IDENTIFIER` is taken.
    Journal,
    /// A saved log the operator hands to `analyze`: the same checks for the fields it has, and
    /// `SYSLOG_IDENTIFIER` alone for entries without any (hand-made or trimmed exports); the
    /// file is the operator's own, and its text lines cannot be checked at all.
    Export,
}

/// Whether journald's fields of `entry` show that nvidia-gridd logged it, under `trust`.
fn from_gridd(entry: &Fields, trust: Trust) -> bool {
    match &entry.uid {
        Some(uid) if uid.as_str() != Some("0") => return false,
        None if trust == Trust::Journal => return false,
        _ => {}
    }
    let is = |field: &Option<Field>, want: &dyn Fn(&str) -> bool| {
        field.as_ref().map(|v| v.as_str().is_some_and(want))
    };
    let process = [
        is(&entry.comm, &|c| c == IDENT),
        is(&entry.exe, &|e| {
            e.strip_suffix(IDENT).is_some_and(|d| d.ends_with('/'))
        }),
        is(&entry.unit, &|u| u == UNIT),
    ];
    if process.iter().any(Option::is_some) {
        // What journald knows of the sender decides; a name it chose for itself does not.
        process.contains(&Some(true))
    } else {
        str_of(&entry.syslog_identifier) == Some(IDENT)
    }
}

pub(crate) fn str_of<'f>(field: &'f Option<Field>) -> Option<&'f str> {
    field.as_ref()?.as_str()
}

/// The time of a journal entry.
pub(crate) fn stamp_of(entry: &Fields) -> Option<Stamp> {
    let us = str_of(&entry.realtime)?.parse::<i64>().ok()?;
    DateTime::from_timestamp_micros(us).map(Stamp::from_utc)
}

/// What the parser takes from one journal JSON entry: its time and, when it is gridd's (see
/// [`from_gridd`]) and has a message, the message read.
#[derive(Debug)]
struct JsonEntry {
    stamp: Option<Stamp>,
    gridd: Option<GriddLine>,
}

#[derive(Debug)]
struct GriddLine {
    pid: Option<u32>,
    message: String,
    what: Classified,
}

/// A line that is one journal JSON entry (it starts with `{`), read; `None` for any other,
/// which is read as text.
fn json_entry(line: &[u8], trust: Trust) -> Option<JsonEntry> {
    let first = line.iter().find(|b| !b.is_ascii_whitespace());
    (first == Some(&b'{'))
        .then(|| read_entry(line, trust))
        .flatten()
}

/// One line of journal JSON, read (`None`: it is not JSON). Pure: the threads that read an
/// export's sections ([`section_hits`]) read their lines with it.
fn read_entry(line: &[u8], trust: Trust) -> Option<JsonEntry> {
    let entry = entry::read(line)?;
    let stamp = stamp_of(&entry);
    let message = match &entry.message {
        _ if !from_gridd(&entry, trust) => None,
        Some(Field::Str(s)) => Some(s.clone().into_owned()),
        Some(Field::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    let Some(message) = message else {
        return Some(JsonEntry { stamp, gridd: None });
    };
    let pid = [&entry.pid, &entry.syslog_pid]
        .into_iter()
        .find_map(|f| str_of(f).and_then(|p| p.parse().ok()));
    let what = classify(&message).unwrap_or_else(|| Classified::new(EventKind::Other));
    Some(JsonEntry {
        stamp,
        gridd: Some(GriddLine { pid, message, what }),
    })
}

/// The line parser: feed it lines, it emits events. Keeps only O(1) state. [`scan`] and
/// [`scan_journal`] drive it over a whole input; the service feeds it the lines of its
/// `journalctl --output=json --follow`.
pub struct LineParser<F: FnMut(GriddEvent)> {
    sink: F,
    trust: Trust,
    stats: ScanStats,
    /// Recent specific failures: (pid, time, reason, line number).
    recent: VecDeque<(Option<u32>, Option<i64>, Reason, u64)>,
    line_no: u64,
}

impl<F: FnMut(GriddEvent)> LineParser<F> {
    /// A parser of the agent's own `journalctl --output=json`: only entries journald vouches
    /// for count ([`Trust::Journal`]), and lines that are not journal JSON are ignored.
    pub fn new(sink: F) -> Self {
        Self::with_trust(sink, Trust::Journal)
    }

    pub fn with_trust(sink: F, trust: Trust) -> Self {
        LineParser {
            sink,
            trust,
            stats: ScanStats::default(),
            recent: VecDeque::new(),
            line_no: 0,
        }
    }

    /// Parses one line (without its newline): journal JSON when it starts with `{`, else text
    /// (text only under [`Trust::Export`]).
    pub fn feed(&mut self, line: &[u8]) {
        self.line(line, true);
    }

    /// What the lines so far said besides their events.
    pub fn stats(&self) -> &ScanStats {
        &self.stats
    }

    fn emit(&mut self, stamp: Option<Stamp>, pid: Option<u32>, message: &str, c: Classified) {
        let mut c = c;
        let t = stamp.map(|s| s.ord());
        if c.kind == EventKind::AcquireFailed && c.reason == Some(Reason::Unspecified) {
            // A bare failure takes the reason of the specific lines just before it.
            let inherited = self.recent.iter().rev().find(|(p, at, _, n)| {
                *p == pid
                    && self.line_no - n <= 4
                    && match (at, t) {
                        (Some(a), Some(b)) => (b - a).abs() <= INHERIT_WINDOW_SECS,
                        _ => true,
                    }
            });
            if let Some((_, _, r, _)) = inherited {
                c.reason = Some(*r);
            }
        } else if let Some(r) = c.reason.filter(|r| *r != Reason::Unspecified) {
            if self.recent.len() == 4 {
                self.recent.pop_front();
            }
            self.recent.push_back((pid, t, r, self.line_no));
        }
        if matches!(c.kind, EventKind::Acquired | EventKind::Renewed) {
            self.recent.clear();
        }
        self.stats.gridd_lines += 1;
        (self.sink)(GriddEvent {
            stamp,
            pid,
            message: message.trim().to_string(),
            what: c,
        });
    }

    fn with_context(&self, stamp: Option<Stamp>) -> Option<Stamp> {
        Some(in_context(stamp?, self.stats.context))
    }

    /// One journal entry read by [`read_entry`].
    fn entry(&mut self, entry: JsonEntry) {
        if entry.stamp.is_some() {
            self.stats.last_stamp = entry.stamp;
        }
        if let Some(gridd) = entry.gridd {
            self.emit(entry.stamp, gridd.pid, &gridd.message, gridd.what);
        }
    }

    fn text_line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        if let Some(ctx) = parse_status_header(&text) {
            self.stats.context = Some(ctx);
            return;
        }
        match parse_text_line(&text) {
            Some(TextLine::Logged {
                stamp,
                ident,
                pid,
                message,
            }) => {
                let stamp = self.with_context(stamp);
                if stamp.is_some() {
                    self.stats.last_stamp = stamp;
                }
                if ident == IDENT {
                    let c = classify(message).unwrap_or_else(|| Classified::new(EventKind::Other));
                    self.emit(stamp, pid, message, c);
                }
            }
            Some(TextLine::Bare { stamp, message }) => {
                let stamp = self.with_context(stamp);
                // An application's CUDA error is its own, never a bare gridd message, though
                // its text may read like a failure (`... Error: ...`).
                let cuda = || crate::observe::app_log::classify(message).is_some();
                if let Some(c) = classify(message).filter(|_| !cuda()) {
                    if stamp.is_some() {
                        self.stats.last_stamp = stamp;
                    }
                    self.emit(stamp, None, message, c);
                }
            }
            None => {}
        }
    }

    fn line(&mut self, line: &[u8], json: bool) {
        self.line_no += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if json && let Some(entry) = json_entry(line, self.trust) {
            self.entry(entry);
            return;
        }
        // Text says nothing journald vouches for: `journalctl --output=json` prints none, so
        // such a line in the agent's own journal stream is not gridd's.
        if self.trust == Trust::Export {
            self.text_line(line);
        }
    }
}

/// Reads a saved gridd log from `reader` ([`Trust::Export`]), calling `sink` for every event,
/// oldest first.
pub fn scan<R: Read, F: FnMut(GriddEvent)>(reader: R, sink: F) -> io::Result<ScanStats> {
    scan_with(reader, Trust::Export, sink)
}

/// Reads the agent's own `journalctl --output=json` ([`Trust::Journal`]) from `reader`.
pub fn scan_journal<R: Read, F: FnMut(GriddEvent)>(reader: R, sink: F) -> io::Result<ScanStats> {
    scan_with(reader, Trust::Journal, sink)
}

fn scan_with<R: Read, F: FnMut(GriddEvent)>(
    reader: R,
    trust: Trust,
    sink: F,
) -> io::Result<ScanStats> {
    let mut sc = LineParser::with_trust(sink, trust);
    let finder = memmem::Finder::new(IDENT.as_bytes());
    let mut lines = Lines::new(reader, CHUNK, MAX_LINE, false);
    let mut json: Option<bool> = None;
    // The last complete line seen in JSON mode: its time is the log's last time.
    let mut last_line: Vec<u8> = Vec::new();
    while let Some((_, region)) = lines.next_region()? {
        let is_json = match json {
            Some(j) => j,
            None => match region.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(i) => *json.insert(region[i] == b'{'),
                // Blank lines before the first: nothing in either mode.
                None => continue,
            },
        };
        if is_json {
            json_hits(region, &finder, |line| sc.line(line, true));
            keep_last_line(region, &mut last_line);
        } else {
            for line in region
                .strip_suffix(b"\n")
                .unwrap_or(region)
                .split(|b| *b == b'\n')
            {
                sc.line(line, false);
            }
        }
    }
    sc.stats.bytes = lines.bytes;
    sc.stats.skipped_long_lines = lines.skipped_long;
    if let Some(t) = last_line_time(&last_line) {
        sc.stats.last_stamp = Some(t);
    }
    Ok(sc.stats)
}

/// Calls `hit` with every line of `region` that holds gridd's name.
fn json_hits(region: &[u8], finder: &memmem::Finder, mut hit: impl FnMut(&[u8])) {
    let mut from = 0;
    while let Some(at) = finder.find(&region[from..]) {
        let pos = from + at;
        let ls = memrchr(b'\n', &region[..pos]).map_or(0, |i| i + 1);
        let le = memchr(b'\n', &region[pos..]).map_or(region.len(), |i| pos + i);
        hit(&region[ls..le]);
        from = le;
    }
}

/// Keeps the last line of `region` that is not blank (when it has one) in `last`.
fn keep_last_line(region: &[u8], last: &mut Vec<u8>) {
    let body = region.trim_ascii_end();
    if !body.is_empty() {
        let ls = memrchr(b'\n', body).map_or(0, |i| i + 1);
        last.clear();
        last.extend_from_slice(&body[ls..]);
    }
}

/// The time of a journal JSON entry.
fn last_line_time(line: &[u8]) -> Option<Stamp> {
    stamp_of(&entry::read(line)?)
}

/// The reads of a section's search ([`section_hits`]).
const SECTION_CHUNK: usize = 256 << 10;

/// A large `journalctl -o json` export can be searched a section at a time, sections at once
/// (the agent's threads, each reading its own part of the file): [`section_hits`] gives the
/// lines of a section that hold gridd's name, and [`SectionFold`] parses them in the file's
/// order; events and stats are what [`scan`] gives for the whole. Whether a file is such an
/// export: [`starts_with_json`].
pub struct SectionFold<F: FnMut(GriddEvent)> {
    parser: LineParser<F>,
    /// The last line of the sections so far: its time is the log's last time.
    last_line: Vec<u8>,
}

impl<F: FnMut(GriddEvent)> SectionFold<F> {
    pub fn new(sink: F) -> Self {
        SectionFold {
            parser: LineParser::with_trust(sink, Trust::Export),
            last_line: Vec::new(),
        }
    }

    /// The next section's hits, in the file's order.
    pub fn add(&mut self, hits: Hits) {
        let sc = &mut self.parser;
        for hit in hits.lines {
            match hit {
                Hit::Entry(entry) => {
                    sc.line_no += 1;
                    sc.entry(entry);
                }
                Hit::Other(line) => sc.line(&line, true),
            }
        }
        if !hits.last.is_empty() {
            self.last_line = hits.last;
        }
        sc.stats.bytes += hits.bytes;
        sc.stats.skipped_long_lines += hits.skipped_long;
    }

    /// What the sections held, as [`scan`] says it.
    pub fn finish(mut self) -> ScanStats {
        if let Some(t) = last_line_time(&self.last_line) {
            self.parser.stats.last_stamp = Some(t);
        }
        self.parser.stats
    }
}

/// Whether the first byte of a log that is not white space is a `{` (it is read in JSON
/// mode).
pub fn starts_with_json<R: Read>(reader: R) -> io::Result<bool> {
    let mut lines = Lines::new(reader, 64 << 10, MAX_LINE, false);
    while let Some((_, region)) = lines.next_region()? {
        if let Some(i) = region.iter().position(|b| !b.is_ascii_whitespace()) {
            return Ok(region[i] == b'{');
        }
    }
    Ok(false)
}

/// What one section of a JSON export holds for the parser: its lines that hold gridd's name
/// (read), its last line, and what was read.
#[derive(Default)]
pub struct Hits {
    lines: Vec<Hit>,
    last: Vec<u8>,
    bytes: u64,
    skipped_long: u64,
}

/// A line that holds gridd's name: a journal entry, or what [`LineParser::line`] will read
/// as text.
enum Hit {
    Entry(JsonEntry),
    Other(Vec<u8>),
}

impl Hit {
    /// As [`LineParser::line`] reads a line in JSON mode.
    fn read(line: &[u8]) -> Hit {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match json_entry(line, Trust::Export) {
            Some(entry) => Hit::Entry(entry),
            None => Hit::Other(line.to_vec()),
        }
    }
}

/// The hits of the lines of a log that begin in `start..end`, read from `reader`, which
/// gives the log from the byte before `start` (from `start` itself where that is 0) to its
/// end (the section's last line may end after `end`). `buf` is kept between calls.
pub fn section_hits<R: Read>(
    reader: R,
    start: u64,
    end: u64,
    buf: &mut Vec<u8>,
) -> io::Result<Hits> {
    // From the byte before: when it is a newline, the section's first line begins at `start`.
    let from = start.saturating_sub(1);
    let finder = memmem::Finder::new(IDENT.as_bytes());
    let mut lines = Lines::with_buffer(
        reader,
        std::mem::take(buf),
        SECTION_CHUNK,
        MAX_LINE,
        start > 0,
    )
    .at_offset(from);
    let limit = end - from;
    let mut hits = Hits::default();
    while let Some((off, region)) = lines.next_region()? {
        if off >= limit {
            break;
        }
        let past = off + region.len() as u64 > limit;
        let region = if past {
            // Up to the newline that ends the line holding the section's last byte.
            let i = (limit - 1 - off) as usize;
            memchr(b'\n', &region[i..]).map_or(region, |j| &region[..i + j + 1])
        } else {
            region
        };
        json_hits(region, &finder, |line| hits.lines.push(Hit::read(line)));
        keep_last_line(region, &mut hits.last);
        if past {
            break;
        }
    }
    hits.bytes = (from + lines.bytes).min(end).saturating_sub(start);
    hits.skipped_long = lines.skipped_long;
    *buf = lines.into_buffer();
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::rfc3339;

    fn events(text: &str) -> (Vec<GriddEvent>, ScanStats) {
        let mut v = Vec::new();
        let st = scan(text.as_bytes(), |e| v.push(e)).unwrap();
        (v, st)
    }

    #[test]
    fn classifies_acquire_and_expiry() {
        let c = classify("License acquired successfully. (Info: 192.168.178.110, NVIDIA RTX Virtual Workstation; Expiry: 2022-12-21 16:53:33 GMT)").unwrap();
        assert_eq!(c.kind, EventKind::Acquired);
        assert_eq!(c.server.as_deref(), Some("192.168.178.110"));
        assert_eq!(c.edition.as_deref(), Some("NVIDIA RTX Virtual Workstation"));
        assert_eq!(rfc3339(c.expiry.unwrap()), "2022-12-21T16:53:33Z");
        let c =
            classify("Acquiring license. (Info: lisens88.uib.no; NVIDIA RTX Virtual Workstation)")
                .unwrap();
        assert_eq!(c.server.as_deref(), Some("lisens88.uib.no"));
        let c = classify(
            "License acquired successfully. Server URL : http://51.179.209.134:7070/request",
        )
        .unwrap();
        assert!(c.legacy);
        assert_eq!(c.server.as_deref(), Some("51.179.209.134"));
    }

    #[test]
    fn classifies_failures() {
        let c = classify("Failed to acquire license from dls.example (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)").unwrap();
        assert_eq!(c.reason, Some(Reason::ClockSkew));
        assert_eq!(c.server.as_deref(), Some("dls.example"));
        assert_eq!(c.edition.as_deref(), Some("NVIDIA RTX Virtual Workstation"));
        let c = classify("Failed to acquire license from 10.0.0.5 (Info: NVIDIA Virtual Compute Server - Error: No pool features found for : NVIDIA Virtual Compute Server)").unwrap();
        assert_eq!(c.reason, Some(Reason::NoLicenseAvailable));
        let c = classify("Failed to acquire license from 10.0.0.5 (Info: NVIDIA Virtual PC - Error: Storage anchor break found.)").unwrap();
        assert_eq!(c.reason, Some(Reason::Other));
        let c = classify(
            "Failed to return license to 192.168.178.110 (Error: Generic network communication failure)",
        )
        .unwrap();
        assert_eq!(
            (c.kind, c.reason),
            (EventKind::ReturnFailed, Some(Reason::DlsUnreachable))
        );
        assert_eq!(
            classify("Failed to open file /etc/nvidia/gridd.conf (No such file or directory)")
                .unwrap()
                .reason,
            None
        );
        assert_eq!(classify("hello"), None);
    }

    /// (kind, reason, edition, server, legacy, cloud_provider) of a message.
    fn what(
        msg: &str,
    ) -> (
        EventKind,
        Option<Reason>,
        Option<String>,
        Option<String>,
        bool,
        bool,
    ) {
        let c = classify(msg).unwrap_or_else(|| panic!("not classified: {msg}"));
        (
            c.kind,
            c.reason,
            c.edition,
            c.server,
            c.legacy,
            c.cloud_provider,
        )
    }

    #[test]
    fn legacy_wordings() {
        use EventKind as K;
        let ed = |s: &str| Some(s.to_string());
        // nv_grid_dbus.h's license states, as gridd logs them.
        assert_eq!(
            what("Acquiring license for GRID vGPU Edition."),
            (K::Acquiring, None, ed("GRID vGPU"), None, true, false)
        );
        assert_eq!(
            what("Acquiring license for GRID Virtual Workstation Edition."),
            (
                K::Acquiring,
                None,
                ed("GRID Virtual Workstation"),
                None,
                true,
                false
            )
        );
        // The same, on a driver of the token path, is not mistaken for a legacy one.
        assert!(!what("Acquiring license. (Info: 10.0.0.5; NVIDIA Virtual PC)").4);
        // AWS's EC2 guide for G3 instances quotes this one verbatim.
        assert_eq!(
            what("Failed to acquire NVIDIA GRID Virtual Workstation license."),
            (
                K::AcquireFailed,
                Some(Reason::Unspecified),
                ed("NVIDIA GRID Virtual Workstation"),
                None,
                true,
                false
            )
        );
        assert_eq!(
            what("Failed to acquire NVIDIA vGPU license."),
            (
                K::AcquireFailed,
                Some(Reason::Unspecified),
                ed("NVIDIA vGPU"),
                None,
                true,
                false
            )
        );
        assert_eq!(
            what("Failed to renew license for GRID vGPU Edition."),
            (
                K::AcquireFailed,
                Some(Reason::Unspecified),
                ed("GRID vGPU"),
                None,
                true,
                false
            )
        );
        // gridd-log-legacy-flexnet-1.txt
        assert_eq!(
            what("Your system is licensed for GRID vGPU."),
            (K::Other, None, ed("GRID vGPU"), None, true, false)
        );
        assert_eq!(
            what("Your system is licensed for GRID Virtual Workstation Edition."),
            (
                K::Other,
                None,
                ed("GRID Virtual Workstation"),
                None,
                true,
                false
            )
        );
        assert_eq!(
            what("License server 10.0.0.7 is not reachable"),
            (
                K::AcquireFailed,
                Some(Reason::DlsUnreachable),
                None,
                Some("10.0.0.7".into()),
                true,
                false
            )
        );
        assert_eq!(what("License server not reachable").0, K::AcquireFailed);
        assert_eq!(what("License server not reachable").3, None);
    }

    #[test]
    fn the_unlicensed_notice_is_a_failure_without_a_cause() {
        // gridd-log-fastapi-dls-3-windows.txt and -mirror-issue3-windows.txt
        let c = classify("Valid GRID license not found. GPU features and performance will be restricted. To enable full functionality please configure licensing details.").unwrap();
        assert_eq!(
            (c.kind, c.reason),
            (EventKind::UnlicensedNotice, Some(Reason::Unspecified))
        );
        let c = classify("Valid vGPU license not found.").unwrap();
        assert_eq!(c.reason, Some(Reason::Unspecified));
    }

    #[test]
    fn cloud_provider_wordings() {
        // `vGPU Software package (0)`: a guest that leases (gridd-log-jp-dls-guide-1.txt).
        assert_eq!(what("vGPU Software package (0)").0, EventKind::Other);
        assert!(!what("vGPU Software package (0)").5);
        // `(1)` and `Platform detection successful`: the platform licenses the GPU.
        assert!(what("vGPU Software package (1)").5);
        assert!(what("Platform detection successful").5);
        assert_eq!(what("Platform detection successful").1, None);
    }

    #[test]
    fn bare_failure_inherits_the_specific_reason() {
        let (ev, _) = events(
            "nvidia-gridd: Failed to update local trusted store - Maximum buffer size exceeded\n\
             nvidia-gridd: Failed to register client (2)\n\
             nvidia-gridd: Failed to acquire license from 10.0.0.5\n",
        );
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[2].what.reason, Some(Reason::TrustedStore));
        // Another process, or too far apart: no inheritance.
        let (ev, _) = events(
            "Jan 1 00:00:00 h nvidia-gridd[1]: Failed to register client (2)\n\
             Jan 1 00:00:01 h nvidia-gridd[2]: Failed to acquire license from 10.0.0.5\n\
             Jan 1 00:00:02 h nvidia-gridd[1]: Failed to register client (2)\n\
             Jan 1 00:01:02 h nvidia-gridd[1]: Failed to acquire license from 10.0.0.5\n",
        );
        assert_eq!(ev[1].what.reason, Some(Reason::Unspecified));
        assert_eq!(ev[3].what.reason, Some(Reason::Unspecified));
    }

    #[test]
    fn other_programs_are_ignored() {
        let (ev, _) = events(
            "Jun 05 16:36:00 h systemd[1]: Started NVIDIA Grid Daemon.\n\
             Jun 05 16:36:00 h sudo[77]: Failed to acquire license from x\n\
             Jun 05 16:36:00 h logger: License acquired successfully. (Info: a, b; Expiry: 2030-1-1 0:0:0 GMT)\n\
             Jun 05 16:36:01 h nvidia-gridd[5805]: Invalid feature type requested\n",
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].what.reason, Some(Reason::FeatureTypeInvalid));
        assert_eq!(ev[0].pid, Some(5805));
        assert_eq!(ev[0].stamp.unwrap().at(), None, "no year: never invented");
    }

    #[test]
    fn json_lines_only_gridd() {
        let text = concat!(
            r#"{"__REALTIME_TIMESTAMP":"1726420589000000","_COMM":"nvidia-gridd","_PID":"3239","MESSAGE":"NLS initialized"}"#,
            "\n",
            r#"{"__REALTIME_TIMESTAMP":"1726420590000000","_COMM":"bash","MESSAGE":"nvidia-gridd: License acquired successfully. (Info: x, y; Expiry: 2030-1-1 0:0:0 GMT)"}"#,
            "\n",
            r#"{"__REALTIME_TIMESTAMP":"1726420591000000","SYSLOG_IDENTIFIER":"nvidia-gridd","MESSAGE":[83,116,97,114,116,101,100,32,40,49,41]}"#,
            "\n",
            r#"{"__REALTIME_TIMESTAMP":"1726420599000000","_COMM":"sshd","MESSAGE":"x"}"#,
            "\n",
        );
        let (ev, st) = events(text);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].what.kind, EventKind::Initialized);
        assert_eq!(ev[0].pid, Some(3239));
        assert_eq!(
            ev[0].stamp.unwrap().at().map(|t| t.to_string()).as_deref(),
            Some("2024-09-15T17:16:29Z")
        );
        assert_eq!(ev[1].what.kind, EventKind::Started);
        assert_eq!(
            st.last_stamp
                .unwrap()
                .at()
                .map(|t| t.to_string())
                .as_deref(),
            Some("2024-09-15T17:16:39Z")
        );
    }

    #[test]
    fn only_entries_journald_vouches_for_are_gridds() {
        const WINDBACK: &str = "Failed to acquire license from dls.example (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)";
        let count = |trust: Trust, line: &str| {
            let mut n = 0;
            let mut p = LineParser::with_trust(|_| n += 1, trust);
            p.feed(line.as_bytes());
            n
        };
        let entry = |fields: &str| {
            format!(
                r#"{{"__REALTIME_TIMESTAMP":"1726420589000000",{fields}"MESSAGE":"{WINDBACK}"}}"#
            )
        };
        // (fields, counts from the agent's own journalctl, counts in a saved export)
        let cases = [
            // `logger -t nvidia-gridd` by a user: the name is the sender's, the rest journald's.
            (
                r#""_UID":"1000","_COMM":"logger","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                false,
                false,
            ),
            // A user's copy of a program named nvidia-gridd.
            (
                r#""_UID":"65534","_COMM":"nvidia-gridd","_EXE":"/tmp/x/nvidia-gridd","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                false,
                false,
            ),
            (r#""_UID":0,"_COMM":"nvidia-gridd","#, false, false),
            // root's logger is not gridd either.
            (
                r#""_UID":"0","_COMM":"logger","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                false,
                false,
            ),
            (
                r#""_UID":"0","_GID":"0","_COMM":"nvidia-gridd","_PID":"3239","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                true,
                true,
            ),
            (
                r#""_UID":"0","_COMM":"gridd-helper","_SYSTEMD_UNIT":"nvidia-gridd.service","#,
                true,
                true,
            ),
            (
                r#""_UID":"0","_COMM":"renamed","_EXE":"/usr/bin/nvidia-gridd","#,
                true,
                true,
            ),
            (
                r#""_UID":"0","_SYSTEMD_UNIT":"cron.service","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                false,
                false,
            ),
            // Sent by root from a process already gone when journald looked at it.
            (
                r#""_UID":"0","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                true,
                true,
            ),
            // No sender known at all: a hand-made or trimmed export only.
            (r#""SYSLOG_IDENTIFIER":"nvidia-gridd","#, false, true),
            (r#""_COMM":"nvidia-gridd","#, false, true),
            (
                r#""_COMM":"bash","SYSLOG_IDENTIFIER":"nvidia-gridd","#,
                false,
                false,
            ),
        ];
        for (fields, journal, export) in cases {
            let line = entry(fields);
            assert_eq!(count(Trust::Journal, &line), usize::from(journal), "{line}");
            assert_eq!(count(Trust::Export, &line), usize::from(export), "{line}");
        }
        // journalctl's JSON never holds text lines: in the agent's stream they are nobody's.
        let text = format!("Sep 16 01:16:29 h nvidia-gridd[1]: {WINDBACK}");
        assert_eq!(count(Trust::Journal, &text), 0);
        assert_eq!(count(Trust::Export, &text), 1);
        assert_eq!(count(Trust::Journal, &format!("{{not json {WINDBACK}")), 0);

        // The same through whole scans; a forged windback between gridd's own lines is dropped.
        let log = [
            r#"{"__REALTIME_TIMESTAMP":"1726420589000000","_UID":"0","_COMM":"nvidia-gridd","_PID":"3239","SYSLOG_IDENTIFIER":"nvidia-gridd","MESSAGE":"NLS initialized"}"#.to_string(),
            entry(r#""_UID":"1000","_COMM":"logger","_PID":"4000","SYSLOG_IDENTIFIER":"nvidia-gridd","#),
            r#"{"__REALTIME_TIMESTAMP":"1726420599000000","_UID":"0","_COMM":"nvidia-gridd","_PID":"3239","MESSAGE":"Acquiring license. (Info: d; e)"}"#.to_string(),
        ]
        .join("\n");
        for kinds in [
            {
                let mut v = Vec::new();
                scan_journal(log.as_bytes(), |e| v.push(e.what.kind)).unwrap();
                v
            },
            events(&log).0.into_iter().map(|e| e.what.kind).collect(),
        ] {
            assert_eq!(kinds, [EventKind::Initialized, EventKind::Acquiring]);
        }
        let mut n = 0;
        let st = scan_journal(
            format!("{text}\nSep 16 01:16:30 h nvidia-gridd[1]: NLS initialized\n").as_bytes(),
            |_| n += 1,
        )
        .unwrap();
        assert_eq!((n, st.gridd_lines), (0, 0));
    }

    #[test]
    fn text_styles_and_context() {
        let (ev, _) = events(
            "     Active: active (running) since Mon 2024-12-30 01:16:29 UTC; 11s ago\n\
             Dec 31 23:59:59 h nvidia-gridd[1]: NLS initialized\n\
             Jan 01 00:00:01 h nvidia-gridd[1]: Acquiring license. (Info: d; e)\n\
             2024-09-16T01:16:29+0800 h nvidia-gridd[3]: NLS initialized\n\
             Mon 2024-09-16 01:16:29 CST h nvidia-gridd[3]: NLS initialized\n\
             Tue Dec 20 17:25:11 2022:<1>:NLS initialized\n\
             <0>:End Logging\n\
             Acquiring license. (Info: bare; NVIDIA Virtual PC)\n",
        );
        let at: Vec<Option<String>> = ev
            .iter()
            .map(|e| e.stamp.and_then(|s| s.at()).map(|t| t.to_string()))
            .collect();
        assert_eq!(at[0].as_deref(), Some("2024-12-31T23:59:59Z"));
        assert_eq!(at[1].as_deref(), Some("2025-01-01T00:00:01Z"));
        assert_eq!(at[2].as_deref(), Some("2024-09-15T17:16:29Z"));
        assert_eq!(at[3].as_deref(), Some("2024-09-16T01:16:29"));
        assert_eq!(at[4].as_deref(), Some("2022-12-20T17:25:11"));
        assert_eq!(ev[5].what.kind, EventKind::Shutdown);
        assert_eq!(ev[6].what.server.as_deref(), Some("bare"));
        assert_eq!(ev.len(), 7);
    }

    #[test]
    fn a_status_header_gives_earlier_lines_its_year() {
        // Lines from before the unit's start (its previous run) keep the header's year, and
        // December lines under a January header are from the year before.
        let at = |header: &str, line: &str| {
            let (ev, _) = events(&format!(
                "     Active: active (running) since {header}; 1h ago\n{line} h nvidia-gridd[1]: NLS initialized\n"
            ));
            ev[0].stamp.and_then(|s| s.at()).map(|t| t.to_string())
        };
        let sat = "Sat 2025-03-01 00:00:05 UTC";
        assert_eq!(
            at(sat, "Feb 28 23:59:50").as_deref(),
            Some("2025-02-28T23:59:50Z")
        );
        assert_eq!(
            at(sat, "Mar 02 10:00:00").as_deref(),
            Some("2025-03-02T10:00:00Z")
        );
        let jan = "Thu 2026-01-01 00:00:05 UTC";
        assert_eq!(
            at(jan, "Dec 31 23:00:00").as_deref(),
            Some("2025-12-31T23:00:00Z")
        );
    }

    #[test]
    fn an_expiry_past_year_9999_is_no_expiry_and_no_panic() {
        let (ev, _) = events(
            "Tue Dec 20 17:25:11 2022:<1>:License acquired successfully. (Info: a, b; Expiry: 262142-12-31 23:59:59 GMT)\n",
        );
        assert_eq!(ev[0].what.kind, EventKind::Acquired);
        assert_eq!(ev[0].what.expiry, None);
    }
}
