//! How a reader waits for bytes that have not arrived yet: the strategies of
//! the shared-memory rings, applied to every transport.
//!
//! On sockets every poll is a system call, so their default is to sleep at
//! once ([`WaitStrategy::PARK`]); a spinning strategy there is latency mode.
//! Shared memory defaults to spinning for about a wake-up's cost
//! ([`DEFAULT_SPIN`]), then sleeping.

use std::io;
use std::os::fd::AsFd;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;

pub use tubeway_ring::{WaitStrategy, WaitStrategyError, DEFAULT_SPIN};

/// Sleeps in `poll` until `fd` may be ready for `flags`, `deadline` passes
/// (never, for `None`) or a signal comes; false, without sleeping, when
/// `deadline` has passed already. The caller then tries its operation.
pub(crate) fn poll_until(
    fd: impl AsFd,
    flags: PollFlags,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    let now = Instant::now();
    if deadline.is_some_and(|d| now >= d) {
        return Ok(false);
    }
    let timeout = deadline.map(|d| {
        let left = d.saturating_duration_since(now);
        // A timeout too long for the kernel is as good as none.
        Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        })
    });
    let mut fds = [PollFd::new(&fd, flags)];
    match rustix::event::poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(Errno::INTR) => Ok(true),
        Err(e) => Err(e.into()),
    }
}
