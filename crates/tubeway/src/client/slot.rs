//! Where a connection's reader waits for whoever runs it next.
//!
//! A caller that waits for one answer, with no other call in flight, reads
//! it best itself: it takes the reader, writes its request and polls the
//! reader for the answer right there, so that no other task or thread has
//! to run, and nothing has to be woken. The blocking client does so on the
//! thread that waits; the async client within the calling task's poll
//! (see [`AsyncClient::request_timeout`](super::AsyncClient::request_timeout)).
//! Whoever else reads (the async client's reader task, the blocking
//! client's waiting threads and background driver) takes the reader from
//! here when it is free.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tubeway_proto::Message;
use uuid::Uuid;

use super::connection::Reader;
use tubeway_transport::Lent;

/// How long a resting reader may sleep unwatched: callers of a connection
/// whose socket the reactor watches only on demand leave it so (see
/// [`tubeway_transport::Connection::watch_on_demand`]), and its task then
/// watches it again once this much has passed. Only what the broker sends
/// unasked (a ping, a close) waits so long; a call reads the connection
/// itself.
const UNWATCHED_FOR: Duration = Duration::from_millis(2);

/// A connection's reader while nobody runs it.
#[derive(Default)]
pub(crate) struct ReaderSlot {
    /// Boxed: it changes hands on every call.
    reader: Mutex<Option<Box<Reader>>>,
    /// Signalled when the reader is put back, if anyone waits for it.
    free: Notify,
    /// Waiters for [`free`](Self::free) (see [`ReaderSlot::waiter`]): while
    /// there are none, a reader put back after a call signals nobody, which
    /// saves a locked instruction per call.
    waiters: AtomicUsize,
    /// The reader task (see [`ReaderSlot::run`]), to wake when the reader
    /// comes back in a state that needs its poll, or while it waits for it.
    task: AtomicWaker,
    /// The reader task found the reader lent, and waits for it.
    task_waits: AtomicBool,
    /// The reader task last let the reader sleep, the connection expecting
    /// nothing: a call made now is most likely alone.
    resting: AtomicBool,
    /// The connection has ended, and the reader with it.
    ended: AtomicBool,
    /// The reader task has a timer armed to watch the reader again, a
    /// caller having left it asleep unwatched. Changed under the lock.
    watchdog: AtomicBool,
    /// Answers read by their callers, for tests to see that they were.
    #[cfg(test)]
    pub(crate) answered_inline: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for ReaderSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderSlot").finish_non_exhaustive()
    }
}

impl ReaderSlot {
    fn lock(&self) -> MutexGuard<'_, Option<Box<Reader>>> {
        self.reader.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `reader` here, for the first to run it.
    pub(crate) fn put(&self, reader: Reader) {
        *self.lock() = Some(Box::new(reader));
        self.free.notify_one();
    }

    /// Takes the reader if nobody runs it; the holder puts it back when
    /// dropped.
    pub(crate) fn take(&self) -> Option<Held<'_>> {
        let r = self.lock().take()?;
        Some(Held {
            slot: self,
            reader: Some(r),
            lent: None,
            undisturbed: false,
        })
    }

    /// Whether the reader task last let the reader sleep, the connection
    /// expecting nothing: a call may then read its own answer. Not while
    /// calls are in flight, which a call would only learn with a lock.
    pub(crate) fn resting(&self) -> bool {
        self.resting.load(Ordering::Relaxed)
    }

    /// Completes once the reader is put back (after this was made). It
    /// borrows `waiter`, made before it, so that it cannot outlive that
    /// count: the reader is put back without a signal while nobody counts.
    pub(crate) fn notified<'w>(&'w self, _waiter: &'w Waiter<'_>) -> Notified<'w> {
        self.free.notified()
    }

    /// Counts its holder among those waiting for the reader until dropped.
    /// Made before the [`notified`](Self::notified) it covers and before
    /// the holder's look at the slot: a reader put back after that look
    /// then sees the count (the slot's lock orders the two) and signals.
    pub(crate) fn waiter(&self) -> Waiter<'_> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Waiter { slot: self }
    }

    /// Runs the reader whenever nobody else does, until the connection
    /// ends: the async client's reader task. While the connection expects
    /// nothing (no call in flight, no subscription, no served function) the
    /// reader sleeps instead of spinning, and waits here between polls, so
    /// that a call takes it (see the module doc): spinning, it would give
    /// its runtime a turn again and again, and tokio answers each turn by
    /// waking an idle worker, which takes the CPU the broker and the caller
    /// need (measured in docs/performance/investigations.md, "One call at a
    /// time from async code, over shm"). Otherwise the task keeps it,
    /// spinning by the strategy.
    pub(crate) async fn run(self: Arc<Self>) {
        // Kept here between polls while no caller would borrow it (see
        // `resting`): then the slot costs nothing per poll.
        let mut kept: Option<Box<Reader>> = None;
        // Armed while callers may leave the reader asleep unwatched: when
        // it fires, the look below registers it again.
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        std::future::poll_fn(|cx| {
            if timer.is_none() && self.watchdog.load(Ordering::Relaxed) {
                timer = Some(Box::pin(tokio::time::sleep(UNWATCHED_FOR)));
            }
            if timer
                .as_mut()
                .is_some_and(|t| t.as_mut().poll(cx).is_ready())
            {
                timer = None;
                // Under the lock: a caller that leaves the reader unwatched
                // after the look re-arms it.
                let _slot = self.lock();
                self.watchdog.store(false, Ordering::Relaxed);
            }
            // A reader kept is busy: it slept at the last look, not now.
            let (mut reader, look) = match kept.take() {
                Some(r) => (r, false),
                None => {
                    // Before the look: a reader put back after it wakes this task.
                    self.task.register(cx.waker());
                    self.task_waits.store(true, Ordering::Relaxed);
                    let taken = self.lock().take();
                    let Some(r) = taken else {
                        if self.ended.load(Ordering::Acquire) {
                            return Poll::Ready(());
                        }
                        // Lent: the borrower wakes this task when it puts it back.
                        return Poll::Pending;
                    };
                    self.task_waits.store(false, Ordering::Relaxed);
                    (r, true)
                }
            };
            if look && reader.may_rest() {
                reader.sleep_next();
            }
            if reader.poll_read(cx, None).is_ready() {
                self.ended.store(true, Ordering::Release);
                return Poll::Ready(());
            }
            // As it is now: the poll may have routed the answer the
            // connection waited for, and the caller's next call comes
            // before this task's next poll.
            let rest = reader.may_rest();
            if rest {
                // For a borrower to wake this task with, if it must.
                self.task.register(cx.waker());
                *self.lock() = Some(reader);
            } else {
                kept = Some(reader);
            }
            // Written only when it changes: callers read it on every call.
            if self.resting.load(Ordering::Relaxed) != rest {
                self.resting.store(rest, Ordering::Relaxed);
            }
            Poll::Pending
        })
        .await;
    }
}

/// The reader, held by whoever runs it; put back for the next when dropped.
pub(crate) struct Held<'a> {
    slot: &'a ReaderSlot,
    reader: Option<Box<Reader>>,
    /// How the reader was when [lent](Held::lend).
    lent: Option<Lent>,
    /// Since lent, it was polled only to completion. A poll that completes
    /// may still have registered the borrower's waker (which wakes nothing)
    /// on its way: [`Reader::take_back`] tells.
    undisturbed: bool,
}

impl Held<'_> {
    /// Polls the reader; false once it has ended (the connection closed).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        self.poll_for(cx, None).is_pending()
    }

    /// Whether the reader spins (see [`Reader::spinning`]).
    pub(crate) fn spinning(&self) -> bool {
        self.reader.as_ref().is_some_and(|r| r.spinning())
    }

    /// Polls the reader for the response to `id`, a call that is not
    /// registered (see [`Reader::poll_read`]): `None` once the connection
    /// has ended.
    pub(crate) fn poll_answer(
        &mut self,
        cx: &mut Context<'_>,
        id: Uuid,
    ) -> Poll<Option<Box<Message>>> {
        self.poll_for(cx, Some(id))
    }

    /// Blocks until the connection may have bytes to read, or `deadline`
    /// passes (see [`Reader::wait_readable`]).
    pub(crate) fn wait_readable(&mut self, deadline: Option<Instant>) -> bool {
        self.reader
            .as_mut()
            .is_some_and(|r| r.wait_readable(deadline))
    }

    /// Lends the reader to this holder, which polls it with a waker that
    /// wakes nothing (see [`Reader::lend`]); put back, it is as it was, or
    /// its task is woken to poll it. False, lending nothing, when the
    /// reader takes turns with others (see [`Reader::lendable`]).
    pub(crate) fn lend(&mut self) -> bool {
        match self.reader.as_mut() {
            Some(r) if r.lendable() => {
                self.lent = Some(r.lend());
                true
            }
            _ => false,
        }
    }

    /// Says that the lent reader's last poll completed: the reader can go
    /// back to sleep as it was, without its task.
    pub(crate) fn undisturbed(&mut self) {
        self.undisturbed = true;
    }

    fn poll_for(&mut self, cx: &mut Context<'_>, id: Option<Uuid>) -> Poll<Option<Box<Message>>> {
        let Some(reader) = self.reader.as_mut() else {
            return Poll::Ready(None);
        };
        let read = reader.poll_read(cx, id);
        if let Poll::Ready(None) = read {
            self.reader = None;
            // For whoever waits to take it, the reader task above all.
            self.slot.ended.store(true, Ordering::Release);
            self.slot.free.notify_one();
            self.slot.task.wake();
        }
        read
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(mut r) = self.reader.take() else {
            return;
        };
        // A reader lent and polled with a waker that wakes nothing may have
        // registered that waker where its task's was: the task must poll
        // it again, unless it goes back to sleep as it was.
        let wake = match self.lent.take() {
            Some(lent) => !(self.undisturbed && r.take_back(lent)),
            None => false,
        };
        let unwatched = !wake && !r.watched();
        let mut slot = self.slot.lock();
        *slot = Some(r);
        // Asleep, but the reactor would not wake its task: that task arms
        // a timer to watch it again, unless one runs.
        let arm = unwatched && !self.slot.watchdog.swap(true, Ordering::Relaxed);
        drop(slot);
        if self.slot.waiters.load(Ordering::SeqCst) != 0 {
            self.slot.free.notify_one();
        }
        // The lock orders this look after the task's mark, when the task's
        // look found the slot empty.
        if wake || arm || self.slot.task_waits.load(Ordering::Relaxed) {
            self.slot.task_waits.store(false, Ordering::Relaxed);
            self.slot.task.wake();
        }
    }
}

/// One waiting for the reader (see [`ReaderSlot::waiter`]).
pub(crate) struct Waiter<'a> {
    slot: &'a ReaderSlot,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.slot.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}
