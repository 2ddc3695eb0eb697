//! The vGPU manager's log on a host (`nvidia-vgpu-mgr`, one process per VM's vGPU): the
//! license state each guest's driver reports, as the host logs it
//! (`nvidia-vgpu-mgr[PID]: notice: vmiop_log: (0x0): vGPU license state: Unlicensed
//! (Unrestricted)`, then `... vGPU license state: Licensed`).
//!
//! Read from the same saved logs as gridd's: journalctl or syslog text, a pasted `systemctl
//! status nvidia-vgpu-mgr` (its `Active: ... since` header gives the year), and
//! `journalctl -o json` entries whose journald fields name the vGPU manager. Fed in chunks of
//! any size ([`Scan::feed`]), so that one pass over standard input can serve gridd's parser
//! and this one.

use std::collections::VecDeque;

use memchr::memmem;

use crate::observe::entry::{self, Field};
use crate::observe::journal::{
    Context, TextLine, in_context, parse_status_header, parse_text_line, stamp_of, str_of,
};
use crate::observe::meaning::VmState;
use crate::observe::smi::{LicenseStatus, classify_status};
use crate::observe::stamp::Stamp;

/// The vGPU manager's program name, as the journal and syslog name it.
pub const IDENT: &str = "nvidia-vgpu-mgr";
/// How many license-state lines a scan keeps (the newest).
pub const MAX_LINES: usize = 1000;
/// How many processes' last states a scan keeps (the latest seen).
const MAX_PROCESSES: usize = 4096;
/// A longer line is no vGPU manager's line: skipped.
const MAX_LINE: usize = 1 << 20;

/// One `vGPU license state: ...` line.
#[derive(Debug, Clone, PartialEq)]
pub struct LicenseLine {
    pub stamp: Option<Stamp>,
    /// The vGPU manager's process: one per VM's vGPU.
    pub pid: Option<u32>,
    /// The state as logged (`Unlicensed (Unrestricted)`, `Licensed`).
    pub status: String,
    pub state: VmState,
}

impl LicenseLine {
    /// `Sep 24 18:44:17` (the log's own wall-clock time; with its year where known:
    /// `2021-09-15 06:55:52`), or nothing for a line without a time.
    pub fn when(&self) -> Option<String> {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let st = self.stamp?;
        let clock = format!(
            "{:02}:{:02}:{:02}",
            st.secs / 3600,
            st.secs / 60 % 60,
            st.secs % 60
        );
        Some(match (st.year, st.utc()) {
            (_, Some(t)) => crate::time::rfc3339(t),
            (Some(y), None) => format!("{y}-{:02}-{:02} {clock}", st.month, st.day),
            (None, None) => format!(
                "{} {:2} {clock}",
                MONTHS.get(st.month as usize - 1).unwrap_or(&"?"),
                st.day
            ),
        })
    }

    /// `nvidia-vgpu-mgr[1869902]`, the process as the log names it.
    pub fn process(&self) -> String {
        match self.pid {
            Some(pid) => format!("{IDENT}[{pid}]"),
            None => IDENT.to_string(),
        }
    }
}

/// What a log held of the vGPU manager.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostLog {
    /// Lines the vGPU manager logged (of any kind).
    pub lines: u64,
    /// Its license-state lines, oldest first: the newest [`MAX_LINES`].
    pub states: VecDeque<LicenseLine>,
    /// License-state lines left out of `states` (older ones).
    pub omitted: u64,
    /// Each process's last license-state line, in the order of their last lines.
    pub last_by_process: Vec<LicenseLine>,
}

impl HostLog {
    /// Whether the log held any of the vGPU manager's lines.
    pub fn any(&self) -> bool {
        self.lines > 0
    }

    fn push(&mut self, line: LicenseLine) {
        self.last_by_process.retain(|l| l.pid != line.pid);
        if self.last_by_process.len() == MAX_PROCESSES {
            self.last_by_process.remove(0);
        }
        self.last_by_process.push(line.clone());
        if self.states.len() == MAX_LINES {
            self.states.pop_front();
            self.omitted += 1;
        }
        self.states.push_back(line);
    }
}

/// The state a `vGPU license state:` value says: `Licensed`, `Unlicensed (Unrestricted)`,
/// `Unlicensed (Restricted)` as the guest's own `License Status` says them.
pub fn state_of(status: &str) -> VmState {
    match classify_status(status) {
        LicenseStatus::Licensed(_) => VmState::Licensed,
        LicenseStatus::Unlicensed => VmState::Unlicensed,
        LicenseStatus::Restricted => VmState::Restricted,
        LicenseStatus::Unknown => VmState::Unknown,
    }
}

/// The value after `vGPU license state:` in a vGPU manager's message, if it is one.
fn license_state(message: &str) -> Option<&str> {
    const KEY: &str = "vgpu license state:";
    let at = message.to_ascii_lowercase().find(KEY)? + KEY.len();
    let status = message.get(at..)?.trim();
    (!status.is_empty()).then_some(status)
}

/// A scan of a log, fed in chunks: lines are cut at line feeds across chunks.
#[derive(Debug, Default)]
pub struct Scan {
    partial: Vec<u8>,
    /// The rest of an overlong line is being skipped.
    skipping: bool,
    context: Option<Context>,
    log: HostLog,
}

impl Scan {
    pub fn new() -> Scan {
        Scan::default()
    }

    /// The next bytes of the log.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while let Some(nl) = memchr::memchr(b'\n', bytes) {
            let (head, rest) = (&bytes[..nl], &bytes[nl + 1..]);
            if self.skipping {
                self.skipping = false;
            } else if self.partial.is_empty() {
                self.line(head);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(head);
                self.line(&line);
            }
            bytes = rest;
        }
        if self.skipping {
            return;
        }
        if self.partial.len() + bytes.len() > MAX_LINE {
            self.partial.clear();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    /// The log's end: its last line, if it had no line feed, and what the log held.
    pub fn finish(mut self) -> HostLog {
        if !self.skipping && !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
        }
        self.log
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let ours = memmem::find(line, IDENT.as_bytes()).is_some();
        let header = !ours && memmem::find(line, b"Active:").is_some();
        if !ours && !header {
            return;
        }
        let first = line.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'{') {
            if let Some((stamp, pid, message)) = json_line(line) {
                self.logged(stamp, pid, &message);
            }
            return;
        }
        let text = String::from_utf8_lossy(line);
        if let Some(ctx) = parse_status_header(&text) {
            self.context = Some(ctx);
            return;
        }
        if let Some(TextLine::Logged {
            stamp,
            ident,
            pid,
            message,
        }) = parse_text_line(&text)
            && ident == IDENT
        {
            let stamp = stamp.map(|s| in_context(s, self.context));
            self.logged(stamp, pid, message);
        }
    }

    fn logged(&mut self, stamp: Option<Stamp>, pid: Option<u32>, message: &str) {
        self.log.lines += 1;
        if let Some(status) = license_state(message) {
            self.log.push(LicenseLine {
                stamp,
                pid,
                status: status.to_string(),
                state: state_of(status),
            });
        }
    }
}

/// A `journalctl -o json` entry the vGPU manager logged: its time, process and message.
/// journald's own fields decide who sent it where it has them (`_COMM`, `_EXE`; root's
/// `_UID`), its `SYSLOG_IDENTIFIER` where it has none.
fn json_line(line: &[u8]) -> Option<(Option<Stamp>, Option<u32>, String)> {
    let entry = entry::read(line)?;
    if entry.uid.as_ref().is_some_and(|u| u.as_str() != Some("0")) {
        return None;
    }
    let comm = str_of(&entry.comm);
    let exe = str_of(&entry.exe);
    let ours = if comm.is_some() || exe.is_some() {
        comm == Some(IDENT)
            || exe.is_some_and(|e| e.strip_suffix(IDENT).is_some_and(|d| d.ends_with('/')))
    } else {
        str_of(&entry.syslog_identifier) == Some(IDENT)
    };
    if !ours {
        return None;
    }
    let message = match entry.message.as_ref()? {
        Field::Str(s) => s.clone().into_owned(),
        Field::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Field::Other => return None,
    };
    let pid = [&entry.pid, &entry.syslog_pid]
        .into_iter()
        .find_map(|f| str_of(f).and_then(|p| p.parse().ok()));
    Some((stamp_of(&entry), pid, message))
}

/// Whether a `journalctl -o json` entry is the vGPU manager's (root's, by journald's own
/// fields where it has them): what a follower of its journal acts on.
pub fn is_own_entry(line: &[u8]) -> bool {
    json_line(line).is_some()
}

/// A whole log at once.
pub fn scan(bytes: &[u8]) -> HostLog {
    let mut s = Scan::new();
    s.feed(bytes);
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_37: &str = "\
Sep 24 18:43:42 gamma nvidia-vgpu-mgr[1869902]: notice: vmiop_log: Driver Version: 552.74
Sep 24 18:43:42 gamma nvidia-vgpu-mgr[1869902]: notice: vmiop_log: (0x0): vGPU license state: Unlicensed (Unrestricted)
Sep 24 18:44:17 gamma nvidia-vgpu-mgr[1869902]: notice: vmiop_log: (0x0): vGPU license state: Licensed
";

    #[test]
    fn license_state_lines_and_their_processes() {
        let log = scan(ISSUE_37.as_bytes());
        assert_eq!(log.lines, 3);
        assert_eq!(log.states.len(), 2);
        assert_eq!(log.states[0].status, "Unlicensed (Unrestricted)");
        assert_eq!(log.states[0].state, VmState::Unlicensed);
        assert_eq!(log.states[1].state, VmState::Licensed);
        assert_eq!(log.states[1].pid, Some(1869902));
        assert_eq!(log.states[1].when().as_deref(), Some("Sep 24 18:44:17"));
        assert_eq!(log.states[1].process(), "nvidia-vgpu-mgr[1869902]");
        // One process: its last line is its state.
        assert_eq!(log.last_by_process.len(), 1);
        assert_eq!(log.last_by_process[0].state, VmState::Licensed);
        assert_eq!(state_of("Unlicensed (Restricted)"), VmState::Restricted);
        assert_eq!(state_of("Uninitialized"), VmState::Unknown);
    }

    #[test]
    fn fed_in_any_chunks_the_same() {
        let whole = scan(ISSUE_37.as_bytes());
        for size in [1, 7, 64] {
            let mut s = Scan::new();
            for chunk in ISSUE_37.as_bytes().chunks(size) {
                s.feed(chunk);
            }
            assert_eq!(s.finish(), whole, "chunks of {size}");
        }
        // The last line without its line feed is read too.
        let cut = ISSUE_37.trim_end();
        assert_eq!(scan(cut.as_bytes()), whole);
    }

    #[test]
    fn other_programs_and_gridd_are_not_the_vgpu_manager() {
        let text = "Sep 24 18:43:42 g nvidia-gridd[9]: vGPU license state: Licensed\n\
                    Sep 24 18:43:42 g logger: nvidia-vgpu-mgr[1]: vGPU license state: Licensed\n\
                    vGPU license state: Licensed\n";
        let log = scan(text.as_bytes());
        assert_eq!(log.lines, 0);
        assert!(log.states.is_empty() && !log.any());
    }

    #[test]
    fn a_status_header_gives_the_year() {
        let text = "     Active: active (running) since Tue 2021-09-14 07:30:19 UTC; 3min 58s ago\n\
                    Sep 15 06:55:52 node-watt nvidia-vgpu-mgr[4260]: notice: vmiop_log: (0x0): vGPU license state: Licensed\n";
        let log = scan(text.as_bytes());
        assert_eq!(
            log.states[0].when().as_deref(),
            Some("2021-09-15T06:55:52Z")
        );
    }

    #[test]
    fn journal_json_needs_journalds_word_for_the_sender() {
        let entry = |fields: &str| {
            format!(
                r#"{{"__REALTIME_TIMESTAMP":"1727203457000000",{fields}"MESSAGE":"notice: vmiop_log: (0x0): vGPU license state: Unlicensed (Restricted)"}}"#
            )
        };
        let ok = entry(r#""_UID":"0","_COMM":"nvidia-vgpu-mgr","_PID":"77","#);
        let log = scan(format!("{ok}\n").as_bytes());
        assert_eq!(log.states.len(), 1);
        assert_eq!(log.states[0].state, VmState::Restricted);
        assert_eq!(log.states[0].pid, Some(77));
        assert_eq!(
            log.states[0].when().as_deref(),
            Some("2024-09-24T18:44:17Z")
        );
        // A user's `logger -t nvidia-vgpu-mgr`: journald names the sender `logger`.
        let forged =
            entry(r#""_UID":"1000","_COMM":"logger","SYSLOG_IDENTIFIER":"nvidia-vgpu-mgr","#);
        assert!(!scan(format!("{forged}\n").as_bytes()).any());
        let forged = entry(r#""_UID":"0","_COMM":"logger","SYSLOG_IDENTIFIER":"nvidia-vgpu-mgr","#);
        assert!(!scan(format!("{forged}\n").as_bytes()).any());
        // A trimmed export with the identifier alone is taken at its word.
        let bare = entry(r#""SYSLOG_IDENTIFIER":"nvidia-vgpu-mgr","#);
        assert_eq!(scan(format!("{bare}\n").as_bytes()).states.len(), 1);
        // The service's follower acts on the same entries, and on no other.
        assert!(is_own_entry(ok.as_bytes()));
        assert!(!is_own_entry(forged.as_bytes()));
        assert!(!is_own_entry(
            b"Sep 24 18:43:42 g nvidia-vgpu-mgr[7]: text, no entry"
        ));
    }

    #[test]
    fn the_newest_lines_are_kept_and_the_rest_counted() {
        let mut text = String::new();
        for i in 0..(MAX_LINES + 5) {
            text.push_str(&format!(
                "Sep 24 18:43:42 g nvidia-vgpu-mgr[{}]: vGPU license state: Licensed\n",
                i % 3
            ));
        }
        let log = scan(text.as_bytes());
        assert_eq!(log.states.len(), MAX_LINES);
        assert_eq!(log.omitted, 5);
        assert_eq!(log.last_by_process.len(), 3);
        // An overlong line is skipped whole, and the next one read.
        let mut s = Scan::new();
        s.feed(&vec![b'x'; MAX_LINE + 10]);
        s.feed(b"x\nSep 24 18:43:42 g nvidia-vgpu-mgr[1]: vGPU license state: Licensed\n");
        assert_eq!(s.finish().states.len(), 1);
    }
}
