//! The fixed-rate schedule: when each message is meant to be sent.
//!
//! Message `i` is due at `start + i / rate`, whatever happened before it.
//! Its latency is measured from that intended time, not from when the
//! sender got round to sending it, so a sender held up by a slow response
//! (or by the scheduler) cannot hide the wait: coordinated omission is
//! measured, not omitted.

use std::time::{Duration, Instant};

/// Send times of a fixed rate.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    start: Instant,
    rate: f64,
    total: u64,
}

impl Schedule {
    /// `rate` messages per second from `start`, for `duration`.
    pub fn new(start: Instant, rate: u64, duration: Duration) -> Schedule {
        let rate = rate.max(1) as f64;
        // At least one message, so that any run measures something.
        let total = ((duration.as_secs_f64() * rate) as u64).max(1);
        Schedule { start, rate, total }
    }

    /// How many messages the schedule sends.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// When message `i` is meant to be sent.
    pub fn intended(&self, i: u64) -> Instant {
        self.start + Duration::from_secs_f64(i as f64 / self.rate)
    }

    /// How many messages are due by `now` (all of those before it and the one at it).
    pub fn due_by(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        let due = (elapsed * self.rate).floor() as u64 + 1;
        due.min(self.total)
    }
}

/// How a pacer waits for a send time `ahead` in the future: park when the
/// gap is longer than a sleep's own inaccuracy, else yield the CPU and look
/// again. A thread's sleep on Linux overshoots by some 50-60 µs, which would
/// otherwise be counted as the system's latency. Parked, not slept: a pacer
/// whose operations wake it (see `runner::pace`) times an operation that
/// ends meanwhile when it ends; others sleep alike. Either may return
/// early, so the caller looks at the time again.
pub fn wait_for(ahead: Duration) {
    if ahead > SLEEP_SLACK * 2 {
        std::thread::park_timeout(ahead - SLEEP_SLACK);
    } else {
        std::thread::yield_now();
    }
}

/// What a wait leaves for its wake-up's overshoot.
const SLEEP_SLACK: Duration = Duration::from_micros(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_times_do_not_drift() {
        let start = Instant::now();
        let s = Schedule::new(start, 100_000, Duration::from_secs(30));
        assert_eq!(s.total(), 3_000_000);
        assert_eq!(s.intended(0), start);
        assert_eq!(s.intended(1) - start, Duration::from_micros(10));
        // The millionth send is due at exactly 10 s: times are computed, not accumulated.
        let t = s.intended(1_000_000) - start;
        assert!(
            t.abs_diff(Duration::from_secs(10)) < Duration::from_nanos(10),
            "{t:?}"
        );
    }

    #[test]
    fn messages_due() {
        let start = Instant::now();
        let s = Schedule::new(start, 1000, Duration::from_secs(1));
        assert_eq!(s.due_by(start), 1);
        assert_eq!(s.due_by(start + Duration::from_micros(999)), 1);
        assert_eq!(s.due_by(start + Duration::from_millis(1)), 2);
        assert_eq!(s.due_by(start + Duration::from_millis(10)), 11);
        // A late sender owes every message it missed, but never more than the run.
        assert_eq!(s.due_by(start + Duration::from_secs(5)), 1000);
        assert_eq!(s.due_by(start - Duration::from_secs(1)), 1);
    }

    #[test]
    fn a_tiny_run_sends_one() {
        let s = Schedule::new(Instant::now(), 1, Duration::from_millis(1));
        assert_eq!(s.total(), 1);
    }
}
