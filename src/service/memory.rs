//! The service's memory: what start-up and bursts of gridd's lines touched, given back.
//!
//! A licensed, quiet agent runs a small part of its code (the loop, a report, a reading of
//! nvidia-smi every few minutes), but start-up runs much more of it once (the config, the
//! journal of this boot, the first token look), and the kernel maps the executable's pages
//! around each one touched: most of the executable stays resident, counted in the agent's
//! RSS, never used again. glibc keeps, as well, the heap a burst of lines grew, and an arena
//! per thread that allocated.

/// One malloc arena for every thread: the blocking jobs' threads allocate little, and an
/// arena of their own each is memory kept for nothing. Called before any thread starts.
pub fn one_arena() {
    // SAFETY: mallopt only sets the allocator's parameter; no thread runs yet.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

/// Gives back the free memory at the heap's end and between its chunks, and drops the
/// executable's clean read-only pages from the process: those the loop uses come back as it
/// runs (from the page cache, a minor fault each), the rest stay out.
pub fn release() {
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        nix::libc::malloc_trim(0);
    }
    let (Ok(exe), Ok(smaps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/smaps"),
    ) else {
        return;
    };
    for (start, end) in clean_read_only_mappings_of(&smaps, &exe.to_string_lossy()) {
        // SAFETY: the range is a private mapping of the executable that cannot be written
        // (no `w`) and holds no page of its own (no `Anonymous`: not the relocated
        // read-only data, which the dynamic linker wrote before it was made read-only):
        // every page in it is the file's, and the next access reads it from the file again.
        // The mapping itself stays.
        unsafe {
            nix::libc::madvise(
                start as *mut nix::libc::c_void,
                end - start,
                nix::libc::MADV_DONTNEED,
            );
        }
    }
}

/// The address ranges of `/proc/self/smaps` entries that map `path` privately, without
/// write permission, and hold no anonymous page.
fn clean_read_only_mappings_of(smaps: &str, path: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut candidate = None;
    for line in smaps.lines() {
        if let Some(range) = mapping_of(line, path) {
            candidate = Some(range);
            continue;
        }
        let Some(kb) = line.strip_prefix("Anonymous:") else {
            continue;
        };
        if let Some(range) = candidate.take()
            && kb.trim() == "0 kB"
        {
            out.push(range);
        }
    }
    out
}

/// The range of a mapping line of `path` that is private and read-only (`r--p`, `r-xp`).
fn mapping_of(line: &str, path: &str) -> Option<(usize, usize)> {
    let mut f = line.split_ascii_whitespace();
    let (range, perms) = (f.next()?, f.next()?);
    let file = f.nth(3)?;
    let read_only = perms.len() == 4 && perms.starts_with('r') && &perms[1..2] == "-";
    if file != path || !read_only || !perms.ends_with('p') || f.next().is_some() {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_executables_clean_read_only_private_mappings() {
        let entry = |line: &str, anon: u32| {
            format!("{line}\nRss: 8 kB\nAnonymous: {anon} kB\nVmFlags: rd\n")
        };
        let exe = "/usr/bin/vgpu-license-agent";
        let smaps = [
            entry(
                &format!("55d0c0a00000-55d0c0a80000 r--p 00000000 fd:01 123 {exe}"),
                0,
            ),
            entry(
                &format!("55d0c0a80000-55d0c0e00000 r-xp 00080000 fd:01 123 {exe}"),
                0,
            ),
            entry(
                &format!("55d0c0e00000-55d0c0e40000 r--p 00400000 fd:01 123 {exe}"),
                0,
            ),
            // The relocated read-only data: written at start, then made read-only.
            entry(
                &format!("55d0c0e40000-55d0c0e48000 r--p 00440000 fd:01 123 {exe}"),
                32,
            ),
            entry(
                &format!("55d0c0e48000-55d0c0e4a000 rw-p 00448000 fd:01 123 {exe}"),
                0,
            ),
            entry(
                "55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0 [heap]",
                132,
            ),
            entry(
                "7f0000000000-7f0000100000 r-xp 00000000 fd:01 77 /usr/lib/libc.so.6",
                0,
            ),
            entry(
                &format!("7f0000200000-7f0000201000 r--s 00000000 fd:01 123 {exe}"),
                0,
            ),
            entry(
                &format!("7f0000300000-7f0000301000 r--p 00000000 fd:01 124 {exe} (deleted)"),
                0,
            ),
        ]
        .concat();
        assert_eq!(
            clean_read_only_mappings_of(&smaps, exe),
            [
                (0x55d0c0a00000, 0x55d0c0a80000),
                (0x55d0c0a80000, 0x55d0c0e00000),
                (0x55d0c0e00000, 0x55d0c0e40000),
            ]
        );
    }
}
