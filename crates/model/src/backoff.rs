//! Exponential backoff, one shape for every retry of the agent: a first wait, doubled after
//! each failure up to a cap, and the first wait again once things go well. Pure and without
//! jitter: a caller that must not act in step with a fleet spreads the wait it is given.

use std::time::Duration;

/// The wait before the next try after failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits of `base`, then twice as long after each failure, at most `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            next: base,
        }
    }

    /// The wait the next failure gets.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// A failure: the wait it gets; the one after is twice as long, at most the cap.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        wait
    }

    /// Things went well: the next failure waits the first wait again.
    pub fn reset(&mut self) {
        self.next = self.base;
    }

    /// New bounds (a reloaded config): the wait reached so far is kept within them.
    pub fn rebound(&mut self, base: Duration, cap: Duration) {
        self.base = base;
        self.cap = cap;
        self.next = self.next.clamp(base, cap.max(base));
    }

    /// The waits of `n` failures in a row from now, without changing this one.
    pub fn schedule(&self, n: usize) -> Vec<Duration> {
        let mut b = *self;
        (0..n).map(|_| b.failed()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn doubles_up_to_the_cap_and_starts_again_after_a_success() {
        let mut b = Backoff::new(S(5), S(300));
        assert_eq!(
            b.schedule(8),
            [5, 10, 20, 40, 80, 160, 300, 300].map(S).to_vec()
        );
        for _ in 0..4 {
            b.failed();
        }
        assert_eq!(b.peek(), S(80));
        b.reset();
        assert_eq!(b.failed(), S(5));
    }

    #[test]
    fn new_bounds_keep_the_wait_reached_within_them() {
        let mut b = Backoff::new(S(60), S(1800));
        for _ in 0..3 {
            b.failed();
        }
        assert_eq!(b.peek(), S(480));
        b.rebound(S(60), S(100));
        assert_eq!(b.peek(), S(100));
        b.rebound(S(200), S(1800));
        assert_eq!(b.peek(), S(200));
        b.reset();
        assert_eq!(b.schedule(5), [200, 400, 800, 1600, 1800].map(S).to_vec());
    }
}
