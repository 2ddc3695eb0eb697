//! Complete lines of a reader, a large buffer at a time: what the log scanners search.

use std::io::{self, Read};

use memchr::{memchr, memrchr};

/// Each read lands at the same offset within a 64-byte line as the input's bytes have in
/// the file. The kernel copies the page cache's page-aligned pages to the buffer with `rep
/// movsb`, which runs up to ten times slower when the destination is a few bytes past the
/// source's offset in a page (a buffer 16 bytes into a page, as the allocator gives one, or
/// the rest of a line moved to the buffer's front): 1 GB into a buffer 16 bytes off took
/// 0.39 s on this project's machines, 0.08 s in line.
const ALIGN: u64 = 64;

/// The lines of a reader, given as regions: each region is every complete line read so far
/// (up to and including the last newline), and at the end of the input what remains. A line
/// longer than `max_line` is dropped, up to its newline, and counted.
pub struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    /// The first byte not given out yet.
    start: usize,
    /// The end of what was read.
    end: usize,
    /// Dropping a line up to its newline (too long, or the first line of a section that
    /// belongs to the section before).
    skipping: bool,
    eof: bool,
    max_line: usize,
    /// The reader's offset in its file when it was handed over (see [`ALIGN`]).
    origin: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Lines dropped because they were longer than `max_line`.
    pub skipped_long: u64,
}

impl<R: Read> Lines<R> {
    /// Reads `reader` in reads of `chunk` bytes. With `skip_first`, the bytes up to and
    /// including the first newline are dropped (they end a line that began before).
    pub fn new(reader: R, chunk: usize, max_line: usize, skip_first: bool) -> Self {
        Self::with_buffer(reader, Vec::new(), chunk, max_line, skip_first)
    }

    /// As [`Lines::new`], reading into `buf`: the buffer of a reader done with
    /// ([`Lines::into_buffer`]) serves the next one without being allocated and faulted in
    /// again (an allocator may give a large block back to the system when it is freed).
    pub fn with_buffer(
        reader: R,
        mut buf: Vec<u8>,
        chunk: usize,
        max_line: usize,
        skip_first: bool,
    ) -> Self {
        buf.resize(chunk, 0);
        let mut lines = Lines {
            reader,
            buf,
            start: 0,
            end: 0,
            skipping: skip_first,
            eof: false,
            max_line: max_line.max(chunk),
            origin: 0,
            bytes: 0,
            skipped_long: 0,
        };
        lines.align_first_read();
        lines
    }

    /// The reader is at `origin` in its file (a section of it read with `pread`): the reads
    /// are laid in line with it ([`ALIGN`]). Before the first read.
    pub fn at_offset(mut self, origin: u64) -> Self {
        self.origin = origin;
        self.align_first_read();
        self
    }

    fn align_first_read(&mut self) {
        let front = self.front(0);
        if front < self.buf.len() / 2 {
            (self.start, self.end) = (front, front);
        }
    }

    /// Where `pending` bytes kept for the next read put that read in line with the input.
    fn front(&self, pending: usize) -> usize {
        let want = self.origin.wrapping_add(self.bytes) % ALIGN;
        let at = (self.buf.as_ptr() as u64).wrapping_add(pending as u64) % ALIGN;
        ((want + ALIGN - at) % ALIGN) as usize
    }

    /// The buffer, for [`Lines::with_buffer`].
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// The next region of complete lines, with the offset of its first byte in the input;
    /// `None` at the end.
    pub fn next_region(&mut self) -> io::Result<Option<(u64, &[u8])>> {
        loop {
            if self.eof {
                if self.start < self.end && !self.skipping {
                    let from = self.start;
                    self.start = self.end;
                    return Ok(Some((self.offset_of(from), &self.buf[from..self.end])));
                }
                return Ok(None);
            }
            self.make_room();
            let n = match self.reader.read(&mut self.buf[self.end..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.bytes += n as u64;
            if n == 0 {
                self.eof = true;
                continue;
            }
            let new_from = self.end;
            self.end += n;
            if self.skipping {
                match memchr(b'\n', &self.buf[new_from..self.end]) {
                    Some(i) => {
                        self.start = new_from + i + 1;
                        self.skipping = false;
                    }
                    None => {
                        self.start = self.end;
                        continue;
                    }
                }
            }
            // Only the bytes just read are searched: the pending ones hold no newline (the
            // complete lines were given out), and searching them again on every read would
            // make a long line trickled in small reads cost its square.
            let from = new_from.max(self.start);
            if let Some(i) = memrchr(b'\n', &self.buf[from..self.end]) {
                let (region_start, region_end) = (self.start, from + i + 1);
                self.start = region_end;
                return Ok(Some((
                    self.offset_of(region_start),
                    &self.buf[region_start..region_end],
                )));
            }
        }
    }

    /// The offset in the input of `buf[i]`.
    fn offset_of(&self, i: usize) -> u64 {
        self.bytes - (self.end - i) as u64
    }

    /// Room to read into: the pending bytes moved to the front (in line with the input
    /// where that leaves room), the buffer doubled for a long line, or a line longer than
    /// `max_line` dropped.
    fn make_room(&mut self) {
        if self.end < self.buf.len() {
            return;
        }
        if self.start > 0 {
            let pending = self.end - self.start;
            let front = self.front(pending);
            let to = if front < self.start { front } else { 0 };
            self.buf.copy_within(self.start..self.end, to);
            (self.start, self.end) = (to, to + pending);
        } else if self.skipping {
            self.end = 0;
        } else if self.buf.len() < self.max_line {
            let len = (self.buf.len() * 2).min(self.max_line);
            self.buf.resize(len, 0);
        } else {
            self.skipping = true;
            self.skipped_long += 1;
            self.end = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that gives at most `n` bytes a read.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(self.1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn regions(input: &[u8], chunk: usize, max: usize, skip: bool, trickle: usize) -> Vec<u8> {
        let mut lines = Lines::new(Trickle(input, trickle), chunk, max, skip);
        let mut out = Vec::new();
        let mut expect_at = None;
        while let Some((off, r)) = lines.next_region().unwrap() {
            assert!(r.ends_with(b"\n") || !input[off as usize..].contains(&b'\n'));
            assert_eq!(&input[off as usize..off as usize + r.len()], r);
            if let Some(at) = expect_at {
                assert!(off >= at);
            }
            expect_at = Some(off + r.len() as u64);
            out.extend_from_slice(r);
        }
        assert_eq!(lines.bytes, input.len() as u64);
        out
    }

    #[test]
    fn gives_every_line_once_in_order_whatever_the_reads() {
        let input = b"one\ntwo two\n\nthree\nfour without newline";
        for chunk in [1, 2, 3, 7, 64] {
            for trickle in [1, 2, 5, 100] {
                assert_eq!(
                    regions(input, chunk, 64, false, trickle),
                    input,
                    "{chunk} {trickle}"
                );
            }
        }
    }

    /// A reader of `input` as if it began at `origin` in a file, that records how each read's
    /// destination lines up with its source.
    struct Recording<'a> {
        input: &'a [u8],
        origin: u64,
        at: usize,
        misaligned: usize,
        reads: usize,
    }

    impl Read for Recording<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = (self.input.len() - self.at).min(buf.len()).min(700);
            if n > 0 {
                self.reads += 1;
                let source = self.origin + self.at as u64;
                if buf.as_ptr() as u64 % ALIGN != source % ALIGN {
                    self.misaligned += 1;
                }
            }
            buf[..n].copy_from_slice(&self.input[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn every_read_lands_in_line_with_its_source() {
        let input: Vec<u8> = (0..3000)
            .flat_map(|i| {
                let mut l = vec![b'x'; i % 97];
                l.push(b'\n');
                l
            })
            .collect();
        for origin in [0u64, 1, 17, 63, 4095, (8 << 20) - 1] {
            let reader = Recording {
                input: &input,
                origin,
                at: 0,
                misaligned: 0,
                reads: 0,
            };
            let mut lines = Lines::new(reader, 4096, 1 << 20, false).at_offset(origin);
            let mut out = Vec::new();
            while let Some((_, r)) = lines.next_region().unwrap() {
                out.extend_from_slice(r);
            }
            assert_eq!(out, input);
            let r = &lines.reader;
            assert!(r.reads > 100, "{}", r.reads);
            assert_eq!(r.misaligned, 0, "origin {origin}: of {} reads", r.reads);
        }
    }

    #[test]
    fn drops_the_first_line_when_told() {
        let input = b"tail of a line\nnext\nlast\n";
        for chunk in [1, 4, 64] {
            assert_eq!(regions(input, chunk, 64, true, 3), b"next\nlast\n");
        }
        assert_eq!(regions(b"\nfirst\n", 4, 64, true, 3), b"first\n");
        assert_eq!(regions(b"no newline at all", 4, 64, true, 3), b"");
    }

    #[test]
    fn drops_and_counts_a_line_longer_than_the_limit() {
        let long = "x".repeat(100);
        let input = format!("a\n{long}\nb\n{long}");
        let mut lines = Lines::new(Trickle(input.as_bytes(), 7), 4, 16, false);
        let mut out = Vec::new();
        while let Some((_, r)) = lines.next_region().unwrap() {
            out.extend_from_slice(r);
        }
        assert_eq!(out, b"a\nb\n");
        assert_eq!(lines.skipped_long, 2);
    }
}
