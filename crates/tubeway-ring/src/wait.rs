//! Waiting for records or space, and waking the peer.
//!
//! # The wake protocol
//!
//! Each side has a waiting word in the ring header: the reader's says it
//! waits for records, the writer's that it waits for space. The hot path
//! makes no system call: a sleeper announces itself, and the other side
//! wakes it only when the word says someone sleeps.
//!
//! That is the classic store-load (Dekker) pattern, and it needs a full
//! fence on both sides:
//!
//! ```text
//! publisher (writer or reader)        sleeper
//! store index (Release)               swap waiting word <- FUTEX
//! fence(SeqCst)                       fence(SeqCst)
//! load waiting word                   load index; still nothing? futex_wait
//! ```
//!
//! Without the fences each load could be satisfied before the other side's
//! store became visible (x86 reorders a store with a later load), both
//! sides would miss each other, and the sleeper would sleep through a
//! publication. With a SeqCst fence between each store and load, the two
//! fences are ordered one before the other, and the side whose fence comes
//! second sees the other's store: either the sleeper sees the new index and
//! does not sleep, or the publisher sees the announcement and wakes it.
//! `futex_wait` sleeps only if the word still holds FUTEX, so a wake that
//! lands between the sleeper's check and its sleep is not lost either.
//!
//! The publisher clears the word with a swap before waking, so one
//! announcement costs the publisher at most one system call (or one
//! doorbell), however many records it publishes meanwhile.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::{fence, futex, spin_loop, yield_now, AtomicU32, Ordering};

/// Waiting word: nobody waits.
pub(crate) const NOT_WAITING: u32 = 0;
/// Waiting word: the owner sleeps on this word's futex.
pub(crate) const FUTEX: u32 = 1;
/// Waiting word: the owner sleeps on its doorbell socket.
pub(crate) const DOORBELL: u32 = 2;

/// The default spin budget of [`WaitStrategy::SpinPark`]: 50 µs.
///
/// On the reference machine a blocking wake-up from another core costs
/// 50-70 µs, while a round trip through shared memory costs about 0.1 µs.
/// Spinning for about as long as a wake-up costs is the classic
/// spin-then-block rule: when the wait turns out longer, the CPU spent
/// spinning is at most what the wake-up would have cost, so the total is
/// never more than twice that of a clairvoyant choice; when it turns out
/// shorter (a request answered within 50 µs), the answer is seen within
/// a fraction of a microsecond instead of 50 µs later. Waits longer than
/// that, the idle connections, cost no CPU at all.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How a waiting end passes the time, like Aeron's idle strategies.
///
/// The choice trades CPU for latency: spinning reacts within a cache-line
/// transfer (~0.1 µs) but keeps a core busy; sleeping costs nothing while
/// idle but a wake-up costs tens of microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// Spin until ready: the lowest latency, a full core per waiting end.
    /// For dedicated cores only.
    BusySpin,
    /// Spin for `spin`, then call `sched_yield` in a loop: frees the core
    /// for other runnable threads but never sleeps, so it still burns CPU
    /// on an idle machine.
    SpinYield {
        /// How long to spin before yielding.
        spin: Duration,
    },
    /// Spin for `spin`, then sleep on a futex in the ring header until the
    /// peer wakes it (the default, with [`DEFAULT_SPIN`]).
    SpinPark {
        /// How long to spin before sleeping; zero sleeps at once.
        spin: Duration,
    },
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::SpinPark { spin: DEFAULT_SPIN }
    }
}

/// What publishing did about a sleeping peer.
#[must_use = "Wake::Doorbell means the peer sleeps on its doorbell, which must be rung"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wake {
    /// The peer was not sleeping.
    None,
    /// The peer slept on the futex and has been woken.
    Futex,
    /// The peer sleeps on its doorbell and this end has no [`Doorbell`]:
    /// the caller must ring it (write a byte to the doorbell socket).
    Doorbell,
    /// The peer slept on its doorbell, and this end's [`Doorbell`] has been
    /// rung.
    DoorbellRung,
}

impl Wake {
    /// Whether the caller must ring the peer's doorbell.
    pub fn must_ring(self) -> bool {
        self == Wake::Doorbell
    }

    /// The wake to report for two publications: the one that still needs
    /// action wins.
    pub(crate) fn and(self, other: Wake) -> Wake {
        match (self, other) {
            (Wake::Doorbell, _) | (_, Wake::Doorbell) => Wake::Doorbell,
            (Wake::None, w) => w,
            (w, _) => w,
        }
    }
}

/// How a sleeper waits, as read from its waiting word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sleeper {
    /// On the futex in the ring header.
    Futex,
    /// On its doorbell socket.
    Doorbell,
}

impl Sleeper {
    /// Decodes a waiting word (`None`: nobody waits; any unknown value is
    /// treated as a futex sleeper, to which a wake-up is harmless).
    pub(crate) fn from_word(word: u32) -> Option<Sleeper> {
        match word {
            NOT_WAITING => None,
            DOORBELL => Some(Sleeper::Doorbell),
            _ => Some(Sleeper::Futex),
        }
    }
}

/// Rings a peer's doorbell: set on an end with
/// [`Producer::set_doorbell`](crate::Producer::set_doorbell) or
/// [`Consumer::set_doorbell`](crate::Consumer::set_doorbell), called
/// whenever publishing finds the peer asleep on its doorbell.
///
/// It is called on the publishing thread, in the middle of a write or a
/// release: it should only write a byte to a non-blocking socket (a full
/// socket buffer already holds a byte that will wake the peer).
#[derive(Clone)]
pub struct Doorbell(Arc<dyn Fn() + Send + Sync>);

impl Doorbell {
    /// A doorbell that calls `ring`.
    pub fn new(ring: impl Fn() + Send + Sync + 'static) -> Doorbell {
        Doorbell(Arc::new(ring))
    }

    /// Rings it.
    pub fn ring(&self) {
        (self.0)();
    }
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Doorbell")
    }
}

/// Wakes the owner of `word` if it announced a sleep. The caller has just
/// published (stored an index or a closed flag) and must have executed
/// `fence(SeqCst)` since.
pub(crate) fn wake(word: &AtomicU32, doorbell: Option<&Doorbell>) -> Wake {
    // The common case: a plain load of a line we read anyway, no write.
    if word.load(Ordering::Relaxed) == NOT_WAITING {
        return Wake::None;
    }
    // Whoever clears the announcement owes the wake-up: exactly one waker
    // per announcement.
    match Sleeper::from_word(word.swap(NOT_WAITING, Ordering::Relaxed)) {
        None => Wake::None,
        Some(Sleeper::Futex) => {
            futex::wake_all(word);
            Wake::Futex
        }
        Some(Sleeper::Doorbell) => match doorbell {
            Some(bell) => {
                bell.ring();
                Wake::DoorbellRung
            }
            None => Wake::Doorbell,
        },
    }
}

/// Publishes an end's closed flag and wakes the peer if it sleeps, whatever
/// it waits for: a closed ring is always worth waking up for.
pub(crate) fn close(flag: &AtomicU32, peer_word: &AtomicU32, doorbell: Option<&Doorbell>) -> Wake {
    flag.store(1, Ordering::Release);
    fence(Ordering::SeqCst);
    wake(peer_word, doorbell)
}

/// Publishes `announce` (a store of the waiting word, and anything that goes
/// with it), then checks `ready` once more: the sleeper's half of the Dekker
/// pair. Returns what `ready` found; if it found something the announcement
/// has been withdrawn.
pub(crate) fn announce_then_check<T>(
    word: &AtomicU32,
    announce: impl FnOnce(),
    ready: impl FnOnce() -> Option<T>,
) -> Option<T> {
    announce();
    fence(Ordering::SeqCst);
    let found = ready();
    if found.is_some() {
        withdraw(word);
    }
    found
}

/// Announces that the owner of `word` sleeps, and how (`FUTEX` or
/// `DOORBELL`). Release: whatever the sleeper stored before (a writer's wake
/// target) is visible to a waker that reads the announcement.
///
/// A swap rather than a store, like the waker's clearing swap and
/// [`withdraw`]: with only read-modify-writes on the word, each reads the
/// latest value, and its history is a plain sequence of announcements and
/// clears. (Loom does not model the atomicity of a read-modify-write against
/// a plain store, and reports a lost wake-up that cannot happen otherwise.)
pub(crate) fn announce(word: &AtomicU32, how: u32) {
    word.swap(how, Ordering::Release);
}

/// Withdraws an announcement.
pub(crate) fn withdraw(word: &AtomicU32) {
    word.swap(NOT_WAITING, Ordering::Relaxed);
}

/// Looks a spinning waiter takes back to back before it pauses between
/// looks (`PAUSE` on x86, which costs some 20 ns on the CPUs this was
/// measured on). An answer usually comes within about a microsecond, the
/// time of this many looks; a pause then only delays noticing it. Longer
/// waits pause, as spin loops should: it leaves the core's resources to a
/// hyperthread sibling and saves power. Over shm, a 64-byte call through
/// the broker took 1.03-1.05 µs with these looks unpaused and 1.05-1.07 µs
/// with every look paused; a channel round trip 0.505-0.509 against
/// 0.546-0.557 µs.
pub const EAGER_SPINS: u32 = 64;

/// What a spinning waiter does after its `spins`-th fruitless look (counted
/// from 0): nothing for the first [`EAGER_SPINS`], a spin-loop hint after.
#[inline]
pub fn pause_after(spins: u32) {
    if spins >= EAGER_SPINS {
        spin_loop();
    }
}

/// How often a spin with a budget gives its CPU to whoever else waits for
/// it: on a small machine the peer that will end the wait may be waiting
/// for the very CPU the spinner holds. Every spinner of the workspace
/// yields by it: the ring's, the transport's readers, the broker's
/// polling threads.
pub const SPIN_YIELD_EVERY: Duration = Duration::from_micros(5);

/// Spins between two looks at the clock: a look costs ~25 ns, a spin of a
/// few ns, and the budgets are tens of microseconds.
const SPINS_PER_CLOCK_CHECK: u32 = 64;

/// Waits for `poll` to give a value, following `strategy`, until `deadline`.
///
/// `announce` stores the sleeper's announcement in `word` (for a park);
/// `poll` is called after it and a SeqCst fence. Returns `Ok(None)` when the
/// deadline passes; an error from `poll` ends the wait at once.
pub(crate) fn wait_for<T, E>(
    strategy: &WaitStrategy,
    deadline: Option<Instant>,
    word: &AtomicU32,
    announce: impl Fn(),
    mut poll: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    if let Some(v) = poll()? {
        return Ok(Some(v));
    }
    let (budget, after) = match *strategy {
        WaitStrategy::BusySpin => (None, After::Nothing),
        WaitStrategy::SpinYield { spin } => (Some(spin), After::Yield),
        WaitStrategy::SpinPark { spin } => (Some(spin), After::Park),
    };
    match spin(budget, deadline, &mut poll)? {
        Spun::Ready(v) => return Ok(Some(v)),
        Spun::Expired => return Ok(None),
        Spun::BudgetSpent => {}
    }
    match after {
        // Unreachable: a busy spin has no budget to spend.
        After::Nothing => Ok(None),
        After::Yield => loop {
            yield_now();
            if let Some(v) = poll()? {
                return Ok(Some(v));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        },
        After::Park => loop {
            announce();
            fence(Ordering::SeqCst);
            match poll() {
                Ok(None) => {}
                other => {
                    withdraw(word);
                    return other;
                }
            }
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => {
                        withdraw(word);
                        return Ok(None);
                    }
                },
            };
            futex::wait(word, FUTEX, timeout);
            withdraw(word);
            if let Some(v) = poll()? {
                return Ok(Some(v));
            }
        },
    }
}

enum After {
    Nothing,
    Yield,
    Park,
}

pub(crate) enum Spun<T> {
    Ready(T),
    Expired,
    BudgetSpent,
}

/// Spins until `poll` gives a value, `budget` is spent or `deadline` passes.
/// `budget` none: no limit. Reads the clock only when there is a budget or
/// a deadline (a zero budget returns at once, without reading it).
pub(crate) fn spin<T, E>(
    budget: Option<Duration>,
    deadline: Option<Instant>,
    poll: &mut impl FnMut() -> Result<Option<T>, E>,
) -> Result<Spun<T>, E> {
    if budget.is_some_and(|b| b.is_zero()) {
        return Ok(Spun::BudgetSpent);
    }
    let start = (budget.is_some() || deadline.is_some()).then(Instant::now);
    let mut next_yield = start.map(|s| s + SPIN_YIELD_EVERY);
    let mut spins = 0u32;
    loop {
        for _ in 0..SPINS_PER_CLOCK_CHECK {
            if let Some(v) = poll()? {
                return Ok(Spun::Ready(v));
            }
            pause_after(spins);
            spins = spins.saturating_add(1);
        }
        if let Some(start) = start {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(Spun::Expired);
            }
            if budget.is_some_and(|b| now.duration_since(start) >= b) {
                return Ok(Spun::BudgetSpent);
            }
            // A budgeted spin (not a busy spin, which owns its core) lets
            // whoever waits for this CPU run now and then: schedulers put a
            // waker and its wakee on one CPU, and the peer that will answer
            // may be that wakee. Costs a system call when nobody waits.
            if budget.is_some() && next_yield.is_some_and(|y| now >= y) {
                yield_now();
                next_yield = Some(now + SPIN_YIELD_EVERY);
            }
        }
    }
}
