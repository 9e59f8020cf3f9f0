//! Point-to-point queues.
//!
//! Messages live in memory in FIFO order; each goes to exactly one poller.
//! Durable queues will keep the same interface and append to a write-ahead
//! log before an offer is acknowledged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;
use tubeway_proto::ops::{QueueKind, QueueStats, QueueStatus};
use tubeway_proto::{now_millis, Message};

/// Why an offer or a poll did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueError {
    Full,
    Empty,
    Removed,
    Expired,
}

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Message>,
    removed: bool,
}

#[derive(Debug, Default)]
struct Counters {
    offered: AtomicU64,
    polled: AtomicU64,
    expired: AtomicU64,
    overwritten: AtomicU64,
    rejected: AtomicU64,
}

/// Tells queues apart across removal and re-creation under one name.
static SERIALS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub(crate) struct Queue {
    pub name: String,
    /// This queue's own among every queue the process made.
    pub serial: u64,
    pub kind: QueueKind,
    pub capacity: u64,
    /// The connection that owns a temporary queue.
    pub owner: Option<u64>,
    state: Mutex<State>,
    not_empty: Notify,
    not_full: Notify,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding a queue lock; recover rather than cascade if it ever did.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Queue {
    pub fn new(name: String, capacity: u64, kind: QueueKind, owner: Option<u64>) -> Self {
        Queue {
            name,
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
            kind,
            capacity: capacity.max(1),
            owner,
            state: Mutex::default(),
            not_empty: Notify::new(),
            not_full: Notify::new(),
            counters: Counters::default(),
        }
    }

    fn is_full(&self, s: &State) -> bool {
        s.items.len() as u64 >= self.capacity
    }

    /// Adds `msg` without waiting. A refused message is handed back (not
    /// cloned) so the caller can wait and retry with it.
    #[allow(clippy::result_large_err)]
    fn try_offer(&self, msg: Message) -> Result<(), (QueueError, Message)> {
        if msg.is_expired() {
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
            return Err((QueueError::Expired, msg));
        }
        let mut s = lock(&self.state);
        if s.removed {
            return Err((QueueError::Removed, msg));
        }
        if self.is_full(&s) {
            match self.kind {
                QueueKind::Circular => {
                    s.items.pop_front();
                    self.counters.overwritten.fetch_add(1, Ordering::Relaxed);
                }
                _ => return Err((QueueError::Full, msg)),
            }
        }
        s.items.push_back(msg);
        drop(s);
        self.counters.offered.fetch_add(1, Ordering::Relaxed);
        self.not_empty.notify_one();
        Ok(())
    }

    /// Takes the oldest unexpired message without waiting.
    fn try_poll(&self) -> Result<Message, QueueError> {
        let now = now_millis();
        let mut s = lock(&self.state);
        if s.removed {
            return Err(QueueError::Removed);
        }
        while let Some(m) = s.items.pop_front() {
            if m.is_expired_at(now) {
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let more = !s.items.is_empty();
            drop(s);
            self.counters.polled.fetch_add(1, Ordering::Relaxed);
            self.not_full.notify_one();
            if more {
                // Pass the baton: another poller may be waiting for what is left.
                self.not_empty.notify_one();
            }
            return Ok(m);
        }
        Err(QueueError::Empty)
    }

    /// Offers `msg`, waiting until `deadline` for room in a full bounded queue.
    pub async fn offer(
        &self,
        mut msg: Message,
        deadline: Option<Instant>,
    ) -> Result<(), QueueError> {
        loop {
            let notified = self.not_full.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_offer(msg) {
                Ok(()) => return Ok(()),
                Err((QueueError::Full, m)) => msg = m,
                Err((e, _)) => return Err(e),
            }
            let Some(deadline) = deadline else {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(QueueError::Full);
            };
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                // One last look: room may have appeared as the timer fired.
                return match self.try_offer(msg) {
                    Ok(()) => Ok(()),
                    Err((e, _)) => {
                        if e == QueueError::Full {
                            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e)
                    }
                };
            }
        }
    }

    /// Offers without waiting; the fast path the session tries before spawning a waiter.
    #[allow(clippy::result_large_err)]
    pub fn offer_now(&self, msg: Message) -> Result<(), (QueueError, Message)> {
        self.try_offer(msg)
    }

    /// Polls, waiting until `deadline` for a message.
    pub async fn poll(&self, deadline: Option<Instant>) -> Result<Message, QueueError> {
        loop {
            let notified = self.not_empty.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_poll() {
                Err(QueueError::Empty) => {}
                other => return other,
            }
            let Some(deadline) = deadline else {
                return Err(QueueError::Empty);
            };
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.try_poll();
            }
        }
    }

    /// Counts an offer refused without waiting.
    pub fn count_rejected(&self) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Polls without waiting.
    pub fn poll_now(&self) -> Result<Message, QueueError> {
        self.try_poll()
    }

    /// Puts a message taken by a poller that vanished or gave up back at
    /// the head of the queue, so it is not lost: past a bounded queue's
    /// capacity if need be, since it was counted there before it was taken.
    /// A full circular queue has overwritten it already, as its oldest.
    pub fn requeue(&self, msg: Message) {
        let mut s = lock(&self.state);
        if s.removed {
            return;
        }
        self.counters.polled.fetch_sub(1, Ordering::Relaxed);
        if self.kind == QueueKind::Circular && self.is_full(&s) {
            self.counters.overwritten.fetch_add(1, Ordering::Relaxed);
            return;
        }
        s.items.push_front(msg);
        drop(s);
        self.not_empty.notify_one();
    }

    /// Marks the queue removed and wakes every waiter so it can answer `queue_not_found`.
    pub fn close(&self) {
        let mut s = lock(&self.state);
        s.removed = true;
        s.items.clear();
        drop(s);
        self.not_empty.notify_waiters();
        self.not_full.notify_waiters();
    }

    pub fn len(&self) -> u64 {
        lock(&self.state).items.len() as u64
    }

    pub fn status(&self) -> QueueStatus {
        QueueStatus {
            name: self.name.clone(),
            kind: self.kind,
            capacity: self.capacity,
            size: self.len(),
            durable: false,
            temporary: self.owner.is_some(),
        }
    }

    pub fn stats(&self) -> QueueStats {
        let c = &self.counters;
        QueueStats {
            status: self.status(),
            offered: c.offered.load(Ordering::Relaxed),
            polled: c.polled.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            overwritten: c.overwritten.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn msg(i: u32) -> Message {
        Message::plain_text(i.to_string())
    }

    fn text(m: &Message) -> String {
        m.text_payload().unwrap().into_owned()
    }

    #[tokio::test]
    async fn fifo_and_bounded_full() {
        let q = Queue::new("q".into(), 2, QueueKind::Bounded, None);
        q.offer(msg(1), None).await.unwrap();
        q.offer(msg(2), None).await.unwrap();
        assert_eq!(q.offer(msg(3), None).await, Err(QueueError::Full));
        assert_eq!(text(&q.poll(None).await.unwrap()), "1");
        assert_eq!(text(&q.poll(None).await.unwrap()), "2");
        assert_eq!(q.poll(None).await.unwrap_err(), QueueError::Empty);
        assert_eq!(q.stats().rejected, 1);
    }

    #[tokio::test]
    async fn circular_overwrites_oldest() {
        let q = Queue::new("q".into(), 2, QueueKind::Circular, None);
        for i in 1..=3 {
            q.offer(msg(i), None).await.unwrap();
        }
        assert_eq!(text(&q.poll(None).await.unwrap()), "2");
        assert_eq!(q.stats().overwritten, 1);
    }

    #[tokio::test]
    async fn requeued_goes_to_the_head_even_when_full() {
        let q = Queue::new("q".into(), 2, QueueKind::Bounded, None);
        for i in 1..=2 {
            q.offer(msg(i), None).await.unwrap();
        }
        let first = q.poll(None).await.unwrap();
        q.offer(msg(3), None).await.unwrap();
        q.requeue(first);
        assert_eq!(q.status().size, 3);
        assert_eq!(q.offer(msg(4), None).await, Err(QueueError::Full));
        for want in ["1", "2", "3"] {
            assert_eq!(text(&q.poll(None).await.unwrap()), want);
        }
        assert_eq!(q.stats().polled, 3);
    }

    #[tokio::test]
    async fn requeued_to_a_full_circular_queue_is_overwritten() {
        let q = Queue::new("q".into(), 2, QueueKind::Circular, None);
        for i in 1..=2 {
            q.offer(msg(i), None).await.unwrap();
        }
        let first = q.poll(None).await.unwrap();
        q.offer(msg(3), None).await.unwrap();
        q.requeue(first);
        assert_eq!(q.status().size, 2);
        assert_eq!(q.stats().overwritten, 1);
        assert_eq!(text(&q.poll(None).await.unwrap()), "2");
    }

    #[tokio::test]
    async fn waiting_offer_completes_when_room_appears() {
        let q = Arc::new(Queue::new("q".into(), 1, QueueKind::Bounded, None));
        q.offer(msg(1), None).await.unwrap();
        let q2 = q.clone();
        let t = tokio::spawn(async move {
            q2.offer(msg(2), Some(Instant::now() + Duration::from_secs(10)))
                .await
        });
        assert_eq!(text(&q.poll(None).await.unwrap()), "1");
        t.await.unwrap().unwrap();
        assert_eq!(text(&q.poll(None).await.unwrap()), "2");
    }

    #[tokio::test]
    async fn removal_wakes_pollers() {
        let q = Arc::new(Queue::new("q".into(), 1, QueueKind::Bounded, None));
        let q2 = q.clone();
        let t = tokio::spawn(async move {
            q2.poll(Some(Instant::now() + Duration::from_secs(30)))
                .await
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .unwrap()
                .unwrap(),
            Err(QueueError::Removed)
        );
    }

    #[tokio::test]
    async fn expired_messages_are_never_handed_out() {
        let q = Queue::new("q".into(), 10, QueueKind::Bounded, None);
        q.offer(msg(1), None).await.unwrap();
        q.offer(msg(2), None).await.unwrap();
        // Let the first message lapse while queued, without waiting on the clock.
        lock(&q.state).items.front_mut().unwrap().expires_at = Some(1);
        assert_eq!(text(&q.poll(None).await.unwrap()), "2");
        assert_eq!(q.stats().expired, 1);
    }
}
