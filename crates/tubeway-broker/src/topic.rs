//! Publish/subscribe topics.
//!
//! Every subscriber has its own bounded buffer. Publishing never waits: when a
//! subscriber's buffer is full, that subscriber misses the message (drop-newest)
//! and the drop is counted, so a slow subscriber never slows the publisher or
//! the other subscribers, and no loss is silent.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tubeway_proto::ops::TopicStatus;
use tubeway_proto::{Message, MessageType};
use uuid::Uuid;

use crate::session::{SendNow, SessionShared};

/// What a subscriber receives: a `publish` or, when the topic goes away, an `unsubscribe`.
pub(crate) type Delivery = Message;

#[derive(Debug)]
pub(crate) struct Subscriber {
    pub id: Uuid,
    /// The connection that subscribed; `None` for subscribers inside the broker process.
    pub conn: Option<u64>,
    tx: mpsc::Sender<Delivery>,
    dropped: AtomicU64,
    /// A client's subscription over shared memory: its connection, which a
    /// publish writes to itself while nothing waits in the buffer.
    direct: Option<Arc<SessionShared>>,
    /// Deliveries in the buffer or being written from it, plus one until
    /// the subscription's answer has gone out: while not zero, deliveries
    /// queue behind them, so they keep their order.
    queued: Arc<AtomicUsize>,
}

/// What became of a delivery.
enum Fate {
    Delivered,
    /// The subscriber's buffer is full: dropped.
    Full,
    /// The subscriber is going away; its removal is in progress.
    Closed,
}

impl Subscriber {
    /// Puts `d` in the buffer for the subscription's task.
    fn enqueue(&self, d: Delivery) -> Fate {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let fate = match self.tx.try_send(d) {
            Ok(()) => return Fate::Delivered,
            Err(mpsc::error::TrySendError::Full(_)) => Fate::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Fate::Closed,
        };
        self.queued.fetch_sub(1, Ordering::AcqRel);
        fate
    }

    /// Delivers `d`: written to the subscriber's shared memory at once when
    /// nothing waits before it and the ring has room, else put in the
    /// buffer. A delivery that skips the buffer skips a task wake-up and a
    /// hop between threads. Over a socket a write is a system call, which
    /// the topic's lock must not be held across: there every delivery goes
    /// through the buffer.
    fn deliver(&self, d: Delivery) -> Fate {
        if let Some(conn) = &self.direct {
            if self.queued.load(Ordering::Acquire) == 0 {
                match conn.send_now(&d, false) {
                    SendNow::Sent => return Fate::Delivered,
                    SendNow::Gone => return Fate::Closed,
                    SendNow::Full(_) => {}
                }
            }
        }
        self.enqueue(d)
    }
}

/// A client's subscription, as the connection's task that writes from its
/// buffer sees it.
#[derive(Debug)]
pub(crate) struct Subscribed {
    pub rx: mpsc::Receiver<Delivery>,
    /// See [`Subscriber::queued`]: the task takes one off for each delivery
    /// it has written, and one once the subscription's answer is out.
    pub queued: Arc<AtomicUsize>,
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
            direct: None,
            queued: Arc::default(),
        }));
        rx
    }

    /// Adds the subscription `id` of the client connection `conn`, with a
    /// buffer of `buffer` deliveries (for every delivery over a socket;
    /// over shared memory, for those the ring cannot take at once). Until
    /// the task that writes from the buffer takes one off
    /// [`Subscribed::queued`], deliveries wait in the buffer: the client
    /// must have the subscription's answer before its first delivery.
    pub fn subscribe_client(
        &self,
        id: Uuid,
        conn: &Arc<SessionShared>,
        buffer: usize,
    ) -> Subscribed {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let queued = Arc::new(AtomicUsize::new(1));
        lock(&self.subscribers).push(Arc::new(Subscriber {
            id,
            conn: Some(conn.id),
            tx,
            dropped: AtomicU64::new(0),
            direct: conn.writes_to_memory().then(|| conn.clone()),
            queued: queued.clone(),
        }));
        Subscribed { rx, queued }
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
            match s.deliver(d) {
                Fate::Delivered => delivered += 1,
                Fate::Full => {
                    s.dropped.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                }
                Fate::Closed => {}
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
            s.enqueue(m);
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

    #[tokio::test]
    async fn a_shm_delivery_skips_the_buffer_only_when_nothing_waits_there() {
        use tubeway_proto::Decoded;
        use tubeway_transport::FrameReader;

        let broker = crate::Broker::new(crate::BrokerConfig::default());
        let dir = std::env::temp_dir().join(format!("tubeway-topic-test-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("shm://{}/t.shm", dir.display()).parse().unwrap();
        let (conn, mut listener) = crate::session::tests::session_at(&broker, 7, url).await;
        assert!(conn.writes_to_memory());
        let mut peer = FrameReader::new(listener.accept().await.unwrap().reader, 1 << 20);
        let t = Topic::new("t".into());
        let id = Uuid::new_v4();
        let Subscribed { mut rx, queued } = t.subscribe_client(id, &conn, 10);
        let publish = |i: u32| t.publish(&Message::plain_text(i.to_string()));

        // Until the subscription's answer is out, deliveries wait in the
        // buffer; then a delivery still queues behind those waiting there.
        assert_eq!((publish(0), publish(1)), ((1, 0), (1, 0)));
        queued.fetch_sub(1, Ordering::AcqRel);
        publish(2);
        assert_eq!(rx.len(), 3);
        // Written from the buffer, as the connection's task does...
        while let Ok(d) = rx.try_recv() {
            assert!(conn.send_as(&d, false).await);
            queued.fetch_sub(1, Ordering::AcqRel);
        }
        // ...after which a delivery goes to the connection at once.
        assert_eq!(publish(3), (1, 0));
        assert!(rx.is_empty());
        for i in 0..4 {
            let next = tokio::time::timeout(std::time::Duration::from_secs(10), peer.next());
            let Some(Decoded::Message(m)) = next.await.unwrap().unwrap() else {
                panic!("delivery {i} missing");
            };
            assert_eq!(m.text_payload().unwrap(), i.to_string());
            assert_eq!(m.correlation_id, Some(id));
            assert_eq!(m.destination.as_deref(), Some("t"));
        }
        assert_eq!(t.status().delivered, 4);
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);

        // Over a socket every delivery goes through the buffer: a write
        // there is a system call, not to be made under the topic's lock.
        let (conn, _listener) = crate::session::tests::session(&broker, 8).await;
        assert!(!conn.writes_to_memory());
        let Subscribed { rx, queued } = t.subscribe_client(Uuid::new_v4(), &conn, 10);
        queued.fetch_sub(1, Ordering::AcqRel);
        publish(4);
        assert_eq!(rx.len(), 1);
    }
}
