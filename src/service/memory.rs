//! The service's memory: what start-up and bursts of gridd's lines took, given back.
//!
//! glibc keeps the heap a burst of lines grew, and an arena per thread that allocated (the
//! release binary is static against musl, whose allocator returns freed pages by itself: there
//! these calls are not made; test and development builds link against glibc). The
//! executable's pages are another matter: they are clean file pages, which the kernel takes
//! back by itself when memory is short; dropping them from the process lowers its RSS figure
//! but makes the next reading fault them back, from the disk if they have left the page cache
//! meanwhile (a wakeup each), so the service leaves them be.

/// One malloc arena for every thread: the blocking jobs' threads allocate little, and an
/// arena of their own each is memory kept for nothing. Called before any thread starts.
pub fn one_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameter; no thread runs yet.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

/// Gives back the free memory at the heap's end and between its chunks.
pub fn release() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}
