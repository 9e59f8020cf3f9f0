//! The threads that serve connections whose readers spin.
//!
//! A connection that sleeps between requests is a task of the broker's
//! runtime. One whose reader spins (shared memory by default, sockets in
//! latency mode) would hold a worker of that runtime while it spins, so it
//! is served on a thread of this pool instead, each with a current-thread
//! runtime of its own. A connection alone on its thread spins in place, for
//! the shortest round trip; connections sharing a thread look at their
//! streams in turn, so that the thread polls every one of them, as Aeron's
//! conductor polls its rings (see [`SpinGroup`]). A thread per connection
//! would put more spinners than CPUs on the machine as soon as a few
//! connections were busy, and each frame would wait for the scheduler to
//! give its thread a turn.
//!
//! Threads start when a connection needs one and end once they serve none
//! and no task of theirs is left, so a broker with no spinning connection
//! has no thread here.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;
use tubeway_transport::SpinGroup;

/// How often a thread with no connection left looks whether its last tasks
/// (a request still being answered, say) have ended.
const IDLE_CHECK: Duration = Duration::from_millis(5);

/// The pool of one broker.
#[derive(Debug)]
pub(crate) struct SpinPool {
    threads: usize,
    slots: Arc<Mutex<Vec<Slot>>>,
    next_id: AtomicUsize,
}

/// One thread of the pool.
#[derive(Debug, Clone)]
struct Slot {
    id: usize,
    handle: Handle,
    /// The readers of its connections.
    group: SpinGroup,
    /// Connections handed to it and not yet ended.
    connections: Arc<AtomicUsize>,
    /// Told when its last connection ends.
    idle: Arc<Notify>,
}

/// What a connection's task needs from the slot it runs on.
pub(crate) struct Seat {
    /// The readers it spins in turn with.
    pub group: SpinGroup,
    connections: Arc<AtomicUsize>,
    idle: Arc<Notify>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        if self.connections.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_one();
        }
    }
}

impl SpinPool {
    /// A pool of at most `threads` threads (at least one).
    pub(crate) fn new(threads: usize) -> SpinPool {
        SpinPool {
            threads: threads.max(1),
            slots: Arc::default(),
            next_id: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        lock(&self.slots)
    }

    /// Runs `serve` on the thread with the fewest connections, starting one
    /// while the pool has fewer than its maximum; `serve` gets its seat and
    /// is tracked by `tracker`, as is the thread.
    pub(crate) fn spawn<F, Fut>(&self, tracker: &TaskTracker, serve: F) -> std::io::Result<()>
    where
        F: FnOnce(Seat) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut slots = self.lock();
        let slot = if slots.len() < self.threads {
            let slot = self.start(tracker)?;
            slots.push(slot.clone());
            slot
        } else {
            slots
                .iter()
                .min_by_key(|s| s.connections.load(Ordering::Acquire))
                .cloned()
                .ok_or_else(|| std::io::Error::other("the spin pool has no thread"))?
        };
        // Counted under the lock, so the thread cannot decide to end now.
        slot.connections.fetch_add(1, Ordering::AcqRel);
        let seat = Seat {
            group: slot.group.clone(),
            connections: slot.connections.clone(),
            idle: slot.idle.clone(),
        };
        drop(slots);
        slot.handle.spawn(tracker.track_future(serve(seat)));
        Ok(())
    }

    /// Starts a thread and its runtime.
    fn start(&self, tracker: &TaskTracker) -> std::io::Result<Slot> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let slot = Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            handle: rt.handle().clone(),
            group: SpinGroup::new(1),
            connections: Arc::default(),
            idle: Arc::default(),
        };
        let (me, slots) = (slot.clone(), self.slots.clone());
        let ends = tracker.track_future(async move {
            loop {
                if me.connections.load(Ordering::Acquire) == 0 {
                    let mut slots = lock(&slots);
                    let alive = Handle::current().metrics().num_alive_tasks();
                    if me.connections.load(Ordering::Acquire) == 0 && alive == 0 {
                        slots.retain(|s| s.id != me.id);
                        return;
                    }
                    drop(slots);
                    tokio::time::sleep(IDLE_CHECK).await;
                } else {
                    me.idle.notified().await;
                }
            }
        });
        let mut rt = Unstarted(Some(rt));
        std::thread::Builder::new()
            .name("tubeway-spin".into())
            .spawn(move || {
                if let Some(rt) = rt.0.take() {
                    rt.block_on(ends);
                }
            })?;
        Ok(slot)
    }
}

/// A runtime on its way to its thread. Should the thread not start, the
/// runtime is dropped here, on a thread of the broker's runtime, where a
/// plain drop (which waits for the runtime's blocking tasks) would panic.
struct Unstarted(Option<tokio::runtime::Runtime>);

impl Drop for Unstarted {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

fn lock(slots: &Mutex<Vec<Slot>>) -> MutexGuard<'_, Vec<Slot>> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Instant;
    use tokio::sync::{mpsc, oneshot};

    /// Waits (bounded) until `done` holds.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < give_up, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn connections_share_at_most_the_threads_asked_for_which_end_with_them() {
        let pool = SpinPool::new(2);
        let tracker = TaskTracker::new();
        let (ran, mut threads) = mpsc::unbounded_channel();
        let mut ends = Vec::new();
        for _ in 0..5 {
            let (end, ended) = oneshot::channel::<()>();
            ends.push(end);
            let ran = ran.clone();
            pool.spawn(&tracker, move |seat| async move {
                let _ = ran.send((std::thread::current().id(), seat.group.clone()));
                let _ = ended.await;
            })
            .unwrap();
        }
        let mut ids = HashSet::new();
        let mut groups = Vec::new();
        for _ in 0..5 {
            let (id, group) = threads.recv().await.unwrap();
            assert_ne!(id, std::thread::current().id());
            ids.insert(id);
            groups.push(group);
        }
        assert_eq!(ids.len(), 2, "five connections on two threads");
        // Three on one thread, two on the other.
        let mut loads: Vec<usize> = pool
            .lock()
            .iter()
            .map(|s| s.connections.load(Ordering::Acquire))
            .collect();
        loads.sort_unstable();
        assert_eq!(loads, [2, 3]);
        assert!(groups.iter().all(|g| g.threads() == 1));

        drop(ends);
        until("the threads end with their connections", || {
            pool.lock().is_empty()
        })
        .await;
        tracker.close();
        tokio::time::timeout(Duration::from_secs(10), tracker.wait())
            .await
            .unwrap();

        // A new connection starts a thread again.
        let (tx, rx) = oneshot::channel();
        pool.spawn(&tracker, move |_| async move {
            let _ = tx.send(());
        })
        .unwrap();
        rx.await.unwrap();
    }

    #[tokio::test]
    async fn a_runtime_whose_thread_never_started_is_dropped_without_a_panic() {
        // A plain drop here, in an async context, would panic.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        drop(Unstarted(Some(rt)));
    }

    #[tokio::test]
    async fn a_thread_outlives_its_connection_until_its_tasks_end() {
        let pool = SpinPool::new(1);
        let tracker = TaskTracker::new();
        let (finish, finished) = oneshot::channel::<()>();
        let (started, spawned) = oneshot::channel();
        pool.spawn(&tracker, move |_| async move {
            // A request still being answered when its connection closed.
            tokio::spawn(async move {
                let _ = finished.await;
            });
            let _ = started.send(());
        })
        .unwrap();
        spawned.await.unwrap();
        tokio::time::sleep(IDLE_CHECK * 4).await;
        assert_eq!(pool.lock().len(), 1, "ended while a task was left");
        drop(finish);
        until("the thread ends with its last task", || {
            pool.lock().is_empty()
        })
        .await;
    }
}
