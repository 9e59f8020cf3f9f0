//! The wall clock that message timestamps and expiry read, in milliseconds.
//!
//! Every message made reads it, so a call reads it twice (its request and
//! its answer). The system clock costs 25-35 ns a read on the hosts this was
//! measured on (a vDSO `clock_gettime`); the CPU's time-stamp counter,
//! through `quanta`, 10 ns. Each thread anchors the counter to the system
//! clock and anchors it again once [`ANCHOR_FOR`] has passed, so a reading
//! strays from the system clock by the counter's drift over that time at
//! most (26 ppm measured: under 3 µs), and a step of the system clock shows
//! within it. Where the counter is not reliable `quanta` reads the OS's
//! monotonic clock instead, which is as correct and as slow as before.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// How long a thread's anchor serves before the system clock is read again.
const ANCHOR_FOR: u64 = 100_000_000;

/// The counter, once calibrated.
static COUNTER: OnceLock<quanta::Clock> = OnceLock::new();

/// Readings taken from the system clock so far: the counter is calibrated
/// once there have been [`CALIBRATE_AFTER`] of them.
static UNCALIBRATED_READS: AtomicU32 = AtomicU32::new(0);

/// Readings after which a process is worth the counter's calibration.
const CALIBRATE_AFTER: u32 = 1_000;

thread_local! {
    /// The counter's raw value and the system clock (ns since the epoch)
    /// read together, if this thread has read the clock.
    static ANCHOR: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// The counter if it is calibrated; else `None`, and the calibration
/// starts at the [`CALIBRATE_AFTER`]th reading, on a thread of its own.
///
/// Calibrating costs 0.6 ms of a CPU here. A process that makes a message
/// or two (a CLI command, whose whole run takes 2.5 ms) never pays it: done
/// at the first reading, even on another thread, it made such a command
/// 0.5-0.7 ms slower. Until it is done, readings come from the system clock.
fn counter() -> Option<&'static quanta::Clock> {
    if let Some(counter) = COUNTER.get() {
        return Some(counter);
    }
    if UNCALIBRATED_READS.fetch_add(1, Ordering::Relaxed) == CALIBRATE_AFTER {
        let calibrate = || {
            let _ = COUNTER.set(quanta::Clock::new());
        };
        // No thread to be had: the system clock it stays.
        let _ = std::thread::Builder::new()
            .name("tubeway-clock".into())
            .spawn(calibrate);
    }
    None
}

/// Milliseconds since the Unix epoch, as carried in `timestamp` and `expires_at`.
pub fn now_millis() -> u64 {
    let Some(counter) = counter() else {
        return system_nanos() / 1_000_000;
    };
    let raw = counter.raw();
    let anchored = ANCHOR.with(|anchor| {
        let (at, wall) = anchor.get()?;
        // Zero if the counter went backwards (a core whose counter lags).
        let since = counter.delta_as_nanos(at, raw);
        (since < ANCHOR_FOR).then(|| wall.saturating_add(since))
    });
    let nanos = anchored.unwrap_or_else(|| {
        let wall = system_nanos();
        ANCHOR.with(|anchor| anchor.set(Some((counter.raw(), wall))));
        wall
    });
    nanos / 1_000_000
}

/// The system clock in nanoseconds since the epoch (0 before it).
fn system_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The system clock in milliseconds, as the clock used to be read.
    fn system_millis() -> u64 {
        system_nanos() / 1_000_000
    }

    #[test]
    fn readings_stay_with_the_system_clock_across_anchors() {
        calibrated();
        // Three anchors' worth, read throughout: every reading lies between
        // the system clock read just before and just after it, give or take
        // a millisecond for the counter's drift and rounding.
        let until = Instant::now() + Duration::from_nanos(3 * ANCHOR_FOR);
        let mut reads = 0u64;
        while Instant::now() < until {
            let before = system_millis();
            let ours = now_millis();
            let after = system_millis();
            assert!(
                before.saturating_sub(1) <= ours && ours <= after + 1,
                "{ours} outside [{before}, {after}]"
            );
            reads += 1;
        }
        assert!(reads > 1_000, "only {reads} readings");
    }

    /// Waits until the counter is calibrated.
    fn calibrated() {
        let until = Instant::now() + Duration::from_secs(10);
        while counter().is_none() {
            assert!(Instant::now() < until, "the counter was never calibrated");
            let _ = now_millis();
        }
    }

    #[test]
    fn each_thread_anchors_on_its_own() {
        calibrated();
        let t = std::thread::spawn(|| {
            assert!(ANCHOR.with(Cell::get).is_none());
            let ms = now_millis();
            assert!(ANCHOR.with(Cell::get).is_some());
            ms
        });
        let theirs = t.join().unwrap_or_default();
        assert!(theirs.abs_diff(system_millis()) < 1_000);
    }
}
