//! How a reader waits for bytes that have not arrived yet: the strategies of
//! the shared-memory rings, applied to every transport.
//!
//! On sockets every poll is a system call, so their default is to sleep at
//! once ([`WaitStrategy::PARK`]); a spinning strategy there is latency mode.
//! Shared memory defaults to spinning for about a wake-up's cost
//! ([`DEFAULT_SPIN`]), then sleeping.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::sockopt::Timeout;

pub use tubeway_ring::{WaitStrategy, WaitStrategyError, DEFAULT_SPIN, SPIN_YIELD_EVERY};

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

/// The longest receive timeout [`set_recv_deadline`] sets: a wait for a
/// later deadline wakes this often to look at it, and the timeout, unchanged
/// meanwhile, need not be set again for every wait.
const LONGEST_RECV_TIMEOUT: Duration = Duration::from_secs(1);

/// Sets the receive timeout of socket `fd` for a blocking `recv` that is to
/// end at `deadline` (`None`: never): whole milliseconds rounded up, so that
/// waits of about the same length set it once, and at most
/// [`LONGEST_RECV_TIMEOUT`]. `set` is the timeout as last set, and is kept
/// up to date. False, setting nothing, once `deadline` has passed.
pub(crate) fn set_recv_deadline(
    fd: impl AsFd,
    set: &mut Option<Duration>,
    deadline: Option<Instant>,
) -> Result<bool, Errno> {
    let timeout = match deadline {
        None => None,
        Some(d) => match d.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => {
                let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
                let whole = Duration::from_millis(ms.saturating_add(1));
                Some(whole.min(LONGEST_RECV_TIMEOUT))
            }
            _ => return Ok(false),
        },
    };
    if timeout != *set {
        rustix::net::sockopt::set_socket_timeout(fd, Timeout::Recv, timeout)?;
        *set = timeout;
    }
    Ok(true)
}

/// Whether this process may run on more than one CPU, as it could when it
/// started (its affinity and quota; a later change is not seen).
pub(crate) fn several_cpus() -> bool {
    static SEVERAL: OnceLock<bool> = OnceLock::new();
    *SEVERAL.get_or_init(|| std::thread::available_parallelism().map_or(true, |n| n.get() > 1))
}

/// Readers that spin on the same threads, such as the connections a broker
/// serves on one thread or the async clients of one runtime.
///
/// A spinning reader alone on its thread waits in place: it polls its
/// stream in a tight loop, which is the fastest way to see the next frame.
/// Readers more numerous than the threads that poll them cannot all do
/// that: one spinning in place keeps the thread from every other, whose
/// frames then wait for its spin to end. A reader that has joined a group
/// with more members than threads therefore looks at its stream once per
/// poll and gives the runtime a turn between looks, so that the thread
/// polls every stream in turn, as one conductor thread polling many rings
/// does. Each reader keeps its own spin budget, and parks when it is spent.
#[derive(Clone, Debug)]
pub struct SpinGroup {
    inner: Arc<GroupInner>,
}

#[derive(Debug)]
struct GroupInner {
    members: AtomicUsize,
    threads: usize,
}

impl SpinGroup {
    /// A group of readers polled by `threads` threads (at least one).
    pub fn new(threads: usize) -> SpinGroup {
        SpinGroup {
            inner: Arc::new(GroupInner {
                members: AtomicUsize::new(0),
                threads: threads.max(1),
            }),
        }
    }

    /// Readers in the group now.
    pub fn members(&self) -> usize {
        self.inner.members.load(Ordering::Relaxed)
    }

    /// The threads that poll the group's readers.
    pub fn threads(&self) -> usize {
        self.inner.threads
    }

    /// A place in the group, held until dropped.
    pub(crate) fn join(&self) -> SpinSeat {
        self.inner.members.fetch_add(1, Ordering::Relaxed);
        SpinSeat {
            group: self.clone(),
        }
    }
}

/// A reader's membership of a [`SpinGroup`].
#[derive(Debug)]
pub(crate) struct SpinSeat {
    group: SpinGroup,
}

impl SpinSeat {
    /// More members than threads: spinning in place would hold up others.
    pub(crate) fn crowded(&self) -> bool {
        self.group.members() > self.group.threads()
    }
}

impl Drop for SpinSeat {
    fn drop(&mut self) {
        self.group.inner.members.fetch_sub(1, Ordering::Relaxed);
    }
}
