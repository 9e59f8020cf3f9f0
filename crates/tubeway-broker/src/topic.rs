//! Publish/subscribe topics.
//!
//! Every subscriber has its own bounded buffer. Publishing never waits: when a
//! subscriber's buffer is full, that subscriber misses the message (drop-newest)
//! and the drop is counted, so a slow subscriber never slows the publisher or
//! the other subscribers, and no loss is silent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tubeway_proto::ops::TopicStatus;
use tubeway_proto::{Message, MessageType};
use uuid::Uuid;

/// What a subscriber receives: a `publish` or, when the topic goes away, an `unsubscribe`.
pub(crate) type Delivery = Message;

#[derive(Debug)]
pub(crate) struct Subscriber {
    pub id: Uuid,
    /// The connection that subscribed; `None` for subscribers inside the broker process.
    pub conn: Option<u64>,
    tx: mpsc::Sender<Delivery>,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Topic {
    pub name: String,
    // A mutex, not a read-write lock: it serialises publishers so every
    // subscriber sees the same order.
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Topic {
    pub fn new(name: String) -> Self {
        Topic {
            name,
            subscribers: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// Adds a subscriber with a buffer of `buffer` deliveries; returns its receiving end.
    pub fn subscribe(
        &self,
        id: Uuid,
        conn: Option<u64>,
        buffer: usize,
    ) -> mpsc::Receiver<Delivery> {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        lock(&self.subscribers).push(Arc::new(Subscriber {
            id,
            conn,
            tx,
            dropped: AtomicU64::new(0),
        }));
        rx
    }

    /// Removes the subscriptions of `conn` matching `id` (all of them when `id` is `None`).
    pub fn unsubscribe(&self, conn: Option<u64>, id: Option<Uuid>) -> usize {
        let mut subs = lock(&self.subscribers);
        let before = subs.len();
        subs.retain(|s| !(s.conn == conn && id.is_none_or(|id| id == s.id)));
        before - subs.len()
    }

    /// Delivers `msg` to every current subscriber without waiting.
    /// Returns (delivered, dropped).
    pub fn publish(&self, msg: &Message) -> (u64, u64) {
        self.counters.published.fetch_add(1, Ordering::Relaxed);
        let (mut delivered, mut dropped) = (0, 0);
        let subs = lock(&self.subscribers);
        // One delivery is made and cloned for each subscriber but the last,
        // which takes it (the payload is shared, not copied): a clone of the
        // published message would copy its destination only to replace it.
        let make = || {
            let mut d = msg.clone();
            d.r#type = MessageType::Publish;
            d.destination = Some(self.name.clone());
            d
        };
        let mut template = None;
        for (i, s) in subs.iter().enumerate() {
            let mut d = if i + 1 < subs.len() {
                template.get_or_insert_with(make).clone()
            } else {
                template.take().unwrap_or_else(make)
            };
            d.correlation_id = Some(s.id);
            match s.tx.try_send(d) {
                Ok(()) => delivered += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    s.dropped.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                }
                // The subscriber is going away; its removal is in progress.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        drop(subs);
        self.counters
            .delivered
            .fetch_add(delivered, Ordering::Relaxed);
        self.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
        (delivered, dropped)
    }

    /// Ends every subscription, telling each subscriber with an `unsubscribe`.
    pub fn close(&self) {
        let subs = std::mem::take(&mut *lock(&self.subscribers));
        for s in subs {
            let mut m = Message::new(MessageType::Unsubscribe);
            m.correlation_id = Some(s.id);
            m.destination = Some(self.name.clone());
            // A full buffer still ends: dropping the sender closes the channel.
            let _ = s.tx.try_send(m);
        }
    }

    pub fn status(&self) -> TopicStatus {
        TopicStatus {
            name: self.name.clone(),
            subscribers: lock(&self.subscribers).len() as u64,
            published: self.counters.published.load(Ordering::Relaxed),
            delivered: self.counters.delivered.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fan_out_in_order_and_drops_counted() {
        let t = Topic::new("t".into());
        let (fast_id, slow_id) = (Uuid::new_v4(), Uuid::new_v4());
        let mut fast = t.subscribe(fast_id, Some(1), 100);
        let mut slow = t.subscribe(slow_id, Some(2), 2);
        for i in 0..10 {
            t.publish(&Message::plain_text(i.to_string()).with_destination("elsewhere"));
        }
        // Each delivery is addressed from the topic to its own subscriber,
        // the last subscriber's as much as the others'.
        for (rx, id, n) in [(&mut fast, fast_id, 10), (&mut slow, slow_id, 2)] {
            for i in 0..n {
                let m = rx.recv().await.unwrap();
                assert_eq!(m.text_payload().unwrap(), i.to_string());
                assert_eq!(m.r#type, MessageType::Publish);
                assert_eq!(m.destination.as_deref(), Some("t"));
                assert_eq!(m.correlation_id, Some(id));
            }
        }
        let s = t.status();
        assert_eq!((s.published, s.delivered, s.dropped), (10, 12, 8));
    }

    #[tokio::test]
    async fn close_tells_subscribers() {
        let t = Topic::new("t".into());
        let id = Uuid::new_v4();
        let mut rx = t.subscribe(id, None, 4);
        t.close();
        let m = rx.recv().await.unwrap();
        assert_eq!(m.r#type, MessageType::Unsubscribe);
        assert_eq!(m.correlation_id, Some(id));
        assert!(rx.recv().await.is_none());
    }
}
