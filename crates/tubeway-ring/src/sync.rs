//! The atomics, spin hints and futex the ring protocol is written with.
//!
//! Normally std's atomics and the kernel's futex. Under `cfg(loom)` the same
//! names are loom's models, so the model test (`tests/ring_loom.rs`) checks
//! the real producer and consumer code, not a copy of it.

#[cfg(loom)]
pub(crate) use loom::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering},
    thread::yield_now,
};
#[cfg(not(loom))]
pub(crate) use std::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering},
    thread::yield_now,
};

/// Sleeping on a 32-bit word in shared memory.
///
/// Always the shared (not `FUTEX_PRIVATE`) futex: the word lives in a mapping
/// that another process may wait on or wake, and the kernel must key it by the
/// underlying file page, not by this process's address space.
#[cfg(not(loom))]
pub(crate) mod futex {
    use std::time::Duration;

    use rustix::thread::futex::{self, Flags, Timespec};

    use super::AtomicU32;

    /// Sleeps while `word` holds `expected`, at most `timeout` (none: until
    /// woken). Returns early, without telling why, on a wake-up, a signal, a
    /// changed value or a time-out: the caller always re-checks its condition.
    pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        // A timeout too large for a timespec is as good as none.
        let timeout = timeout.and_then(|d| Timespec::try_from(d).ok());
        // Every error (EAGAIN, EINTR, ETIMEDOUT, even ENOSYS) means "look
        // again"; the caller's deadline bounds the loop.
        let _ = futex::wait(word, Flags::empty(), expected, timeout.as_ref());
    }

    /// Wakes every thread, in any process, sleeping on `word`.
    pub(crate) fn wake_all(word: &AtomicU32) {
        // Nothing useful can be done about an error here: a failed wake of a
        // word nobody sleeps on is harmless, and sleepers bound their own
        // sleep by their deadlines.
        let _ = futex::wake(word, Flags::empty(), u32::MAX);
    }
}

/// The futex modelled for loom: a value check and a sleep that are atomic
/// with respect to wakes, as the kernel's hash-bucket lock makes them. One
/// condition variable serves every word (extra wake-ups are allowed).
#[cfg(loom)]
pub(crate) mod futex {
    use std::sync::PoisonError;
    use std::time::Duration;

    use loom::sync::{Condvar, Mutex};

    use super::{AtomicU32, Ordering};

    loom::lazy_static! {
        static ref PARKING: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    /// Sleeps while `word` holds `expected`. Loom has no time: the model
    /// never uses deadlines, so `_timeout` is ignored.
    pub(crate) fn wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
        let (lock, cond) = &*PARKING;
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if word.load(Ordering::SeqCst) == expected {
            drop(cond.wait(guard).unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// Wakes every sleeper.
    pub(crate) fn wake_all(_word: &AtomicU32) {
        let (lock, cond) = &*PARKING;
        let _guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        cond.notify_all();
    }
}
