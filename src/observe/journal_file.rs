//! A large saved gridd log (`journalctl -o json` of a whole fleet's node, hundreds of MB),
//! read by `analyze` with a thread per CPU (at most 4): each takes a section of the file at a
//! time and searches it ([`journal::section_hits`], the model's, pure over any reader), and
//! the model parses the sections' hits in the file's order ([`journal::SectionFold`]): the
//! events and stats are those of one stream, and memory stays flat, a few sections in
//! flight at once. Text logs and small files are one stream.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use crate::model::observe::journal::{self, GriddEvent, ScanStats};

/// Sections of this size are what the threads search, one at a time.
const SECTION: u64 = 8 << 20;

/// Reads a saved log from the first `len` bytes of a regular file, as
/// [`journal::scan`] would, faster for a large JSON export.
pub fn scan_file<F: FnMut(GriddEvent)>(file: &File, len: u64, sink: F) -> io::Result<ScanStats> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    scan_file_with(file, len, SECTION, workers, sink)
}

fn scan_file_with<F: FnMut(GriddEvent)>(
    file: &File,
    len: u64,
    section: u64,
    workers: usize,
    sink: F,
) -> io::Result<ScanStats> {
    let at = |pos: u64| At {
        file,
        pos,
        end: len,
    };
    if workers < 2 || len < 2 * section || !journal::starts_with_json(at(0))? {
        return journal::scan(at(0), sink);
    }
    let mut fold = journal::SectionFold::new(sink);
    let sections = len.div_ceil(section);
    std::thread::scope(|scope| -> io::Result<()> {
        let mut results = Vec::new();
        for w in 0..workers {
            let (tx, rx) = std::sync::mpsc::sync_channel(2);
            results.push(rx);
            scope.spawn(move || {
                let mut buf = Vec::new();
                for k in (w as u64..sections).step_by(workers) {
                    let start = k * section;
                    let end = (start + section).min(len);
                    let hits =
                        journal::section_hits(at(start.saturating_sub(1)), start, end, &mut buf);
                    let failed = hits.is_err();
                    if tx.send(hits).is_err() || failed {
                        break;
                    }
                }
            });
        }
        for k in 0..sections {
            let hits = results[(k % workers as u64) as usize]
                .recv()
                .map_err(|_| io::Error::other("a reading thread stopped"))??;
            fold.add(hits);
        }
        Ok(())
    })?;
    Ok(fold.finish())
}

/// `len` bytes of a file from `pos`, read at their offsets (threads share the file).
struct At<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let max = buf.len().min(left);
        if max == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..max], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::observe::journal::{MAX_LINE, scan};

    fn events(text: &str) -> (Vec<GriddEvent>, ScanStats) {
        let mut v = Vec::new();
        let st = scan(text.as_bytes(), |e| v.push(e)).unwrap();
        (v, st)
    }

    /// A `journalctl -o json` export made of every gridd line of the bundled samples, with
    /// other programs' entries, blank and CRLF lines, and gridd's name in other fields between.
    fn export_of_samples() -> Vec<u8> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/samples");
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("gridd-log-")
            })
            .collect();
        names.sort();
        let mut out = Vec::new();
        let mut us = 1_700_000_000_000_000i64;
        for (n, path) in names.iter().enumerate() {
            for (i, line) in std::fs::read_to_string(path).unwrap().lines().enumerate() {
                us += 1_000_000;
                let message = serde_json::to_string(line).unwrap();
                let entry = match (n + i) % 5 {
                    0 => {
                        format!(r#"{{"__REALTIME_TIMESTAMP":"{us}","_COMM":"sshd","MESSAGE":"x"}}"#)
                    }
                    1 => format!(
                        r#"{{"__REALTIME_TIMESTAMP":"{us}","_COMM":"bash","MESSAGE":{message}}}"#
                    ),
                    2 => "\r".to_string(),
                    _ => format!(
                        r#"{{"__REALTIME_TIMESTAMP":"{us}","_UID":"0","_COMM":"nvidia-gridd","_PID":"{}","MESSAGE":{message}}}"#,
                        100 + n
                    ),
                };
                out.extend_from_slice(entry.as_bytes());
                out.push(b'\n');
            }
        }
        out
    }

    fn file_of(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        f
    }

    fn by_sections(bytes: &[u8], section: u64, workers: usize) -> (Vec<GriddEvent>, ScanStats) {
        let mut v = Vec::new();
        let st = scan_file_with(&file_of(bytes), bytes.len() as u64, section, workers, |e| {
            v.push(e)
        })
        .unwrap();
        (v, st)
    }

    #[test]
    fn a_file_read_in_sections_gives_what_one_stream_gives() {
        let export = export_of_samples();
        let (want, want_stats) = events(std::str::from_utf8(&export).unwrap());
        assert!(want.len() > 50, "{}", want.len());
        assert!(want_stats.last_stamp.is_some());
        for section in [1, 7, 64, 333, 4096] {
            for workers in [2, 3] {
                let (got, stats) = by_sections(&export, section, workers);
                assert_eq!(got, want, "sections of {section}, {workers} threads");
                assert_eq!(
                    stats, want_stats,
                    "sections of {section}, {workers} threads"
                );
            }
        }
        // Without a newline at its end, and cut at every line's edge.
        let cut = export.strip_suffix(b"\n").unwrap();
        let (want, want_stats) = events(std::str::from_utf8(cut).unwrap());
        assert_eq!(by_sections(cut, 64, 2), (want, want_stats));
    }

    #[test]
    fn a_line_longer_than_any_log_line_is_skipped_once_across_sections() {
        let mut export = export_of_samples();
        let n = export.len();
        let long = format!(
            r#"{{"_COMM":"nvidia-gridd","MESSAGE":"{}"}}"#,
            "x".repeat(MAX_LINE)
        );
        export.splice(n / 2..n / 2, long.bytes().chain([b'\n']));
        let export = [export.as_slice(), b"\n"].concat();
        let mut want = Vec::new();
        let want_stats = scan(&export[..], |e| want.push(e)).unwrap();
        assert_eq!(want_stats.skipped_long_lines, 1);
        let (got, stats) = by_sections(&export, 1 << 20, 2);
        assert_eq!(stats, want_stats);
        assert_eq!(got.len(), want.len());
        assert_eq!(got, want);
    }

    #[test]
    fn text_and_small_files_are_read_as_one_stream() {
        let text = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/samples/gridd-log-fastapi-dls-1.txt"
        ))
        .unwrap();
        let (want, want_stats) = events(std::str::from_utf8(&text).unwrap());
        assert!(!want.is_empty());
        assert_eq!(
            by_sections(&text, 16, 2),
            (want.clone(), want_stats.clone())
        );
        assert_eq!(by_sections(&text, 1 << 30, 2), (want, want_stats));
    }
}
