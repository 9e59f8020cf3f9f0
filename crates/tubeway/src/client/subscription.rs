//! Topic subscriptions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tubeway_proto::{Message, MessageType};
use uuid::Uuid;

use super::AsyncClient;
use crate::Result;

/// Deliveries buffered in the client when the caller names no buffer size.
pub(crate) const DEFAULT_BUFFER: usize = 1024;
/// Deliveries a batch handler gets at most per call.
const MAX_BATCH: usize = 256;

/// Membership of one topic, shared by [`Subscription`] and [`SubscriptionHandle`].
#[derive(Debug)]
struct Membership {
    client: AsyncClient,
    topic: String,
    id: Uuid,
    active: bool,
}

impl Membership {
    fn message(&self) -> Message {
        let mut msg = Message::new(MessageType::Unsubscribe).with_destination(&self.topic);
        msg.correlation_id = Some(self.id);
        msg
    }

    async fn unsubscribe(&mut self) -> Result<()> {
        self.active = false;
        // Already ended by the broker (topic removed) or by the connection closing.
        if !self.client.conn().remove_subscription(self.id) {
            return Ok(());
        }
        self.client.call(self.message()).await.map(drop)
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        let conn = self.client.conn();
        if self.active && conn.remove_subscription(self.id) {
            // A drop cannot wait for room or for the answer.
            let mut msg = self.message();
            msg.oneway = true;
            if let Ok(frame) = conn.encode(&msg) {
                conn.send_soon(frame);
            }
        }
    }
}

/// A subscription to a topic, from [`AsyncClient::subscribe`].
///
/// Deliveries are `publish` messages whose `correlation_id` is [`Subscription::id`].
/// They wait in a bounded client-side buffer; when it is full the connection's
/// reader waits for [`Subscription::recv`] rather than dropping, so other
/// traffic on this connection waits too and the broker's per-subscriber
/// buffer fills, where drops are counted (`TopicStatus::dropped`). Read
/// promptly, or subscribe on a connection of its own.
///
/// Dropping it unsubscribes best-effort.
#[must_use = "dropping a Subscription unsubscribes"]
#[derive(Debug)]
pub struct Subscription {
    membership: Membership,
    rx: mpsc::Receiver<Message>,
}

impl Subscription {
    pub(crate) fn new(
        client: AsyncClient,
        topic: String,
        id: Uuid,
        rx: mpsc::Receiver<Message>,
    ) -> Self {
        Subscription {
            membership: Membership {
                client,
                topic,
                id,
                active: true,
            },
            rx,
        }
    }

    /// The next delivery; `None` once the subscription has ended (topic
    /// removed, connection closed) and every buffered delivery was read.
    pub async fn recv(&mut self) -> Option<Message> {
        self.rx.recv().await
    }

    /// The subscription id (the `subscribe` message's id).
    pub fn id(&self) -> Uuid {
        self.membership.id
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.membership.topic
    }

    /// From now on, runs `handler` on each delivery (those already
    /// buffered first), in order, on a blocking-pool thread of the current
    /// tokio runtime: see [`SubscriptionHandle`]. Like [`tokio::spawn`], it
    /// panics outside a runtime.
    pub fn with_handler<F>(self, handler: F) -> SubscriptionHandle
    where
        F: Fn(Message) + Send + 'static,
    {
        let topic = self.membership.topic.clone();
        // Each delivery on its own: one that panics does not take the
        // rest of its batch with it.
        SubscriptionHandle::spawn(self, move |batch: &mut Batch<'_>| {
            for msg in batch {
                let run = std::panic::AssertUnwindSafe(|| handler(msg));
                if std::panic::catch_unwind(run).is_err() {
                    tracing::warn!("subscription handler for topic {topic} panicked");
                }
            }
        })
    }

    /// [`with_handler`](Self::with_handler) for a handler that takes the
    /// deliveries buffered at the moment in one call (up to 256; at least
    /// one), as a [`Batch`]: what it costs to enter the handler (a
    /// language runtime's lock, say) is then paid once per batch instead of
    /// once per delivery. Deliveries stay in order. A panic is logged; the
    /// deliveries of the batch not yet taken come in the next call.
    pub fn with_batch_handler<F>(self, handler: F) -> SubscriptionHandle
    where
        F: Fn(&mut Batch<'_>) + Send + 'static,
    {
        SubscriptionHandle::spawn(self, handler)
    }

    /// Ends the subscription and waits for the broker to confirm.
    pub async fn unsubscribe(mut self) -> Result<()> {
        // Closing first frees a reader waiting on a full buffer, so it can
        // read the broker's answer.
        self.rx.close();
        self.membership.unsubscribe().await
    }
}

/// A subscription whose deliveries a handler receives, from
/// [`AsyncClient::subscribe_with`].
///
/// The handler runs on a blocking-pool thread, one delivery at a time, in
/// order; a panicking handler is logged and the next delivery still runs.
/// Dropping it unsubscribes best-effort.
#[must_use = "dropping a SubscriptionHandle unsubscribes"]
#[derive(Debug)]
pub struct SubscriptionHandle {
    membership: Membership,
    stopped: Arc<AtomicBool>,
    task: JoinHandle<()>,
    /// The thread the handler runs on, which must not wait for itself.
    handler_thread: Arc<OnceLock<ThreadId>>,
}

/// The deliveries a batch handler takes in one call (see
/// [`Subscription::with_batch_handler`]): those buffered at the moment, in
/// order, each taken only when the iterator is asked for it; none once
/// the subscription is being ended.
#[derive(Debug)]
pub struct Batch<'a> {
    first: Option<Message>,
    rx: &'a mut mpsc::Receiver<Message>,
    stop: &'a AtomicBool,
    left: usize,
}

impl Iterator for Batch<'_> {
    type Item = Message;

    fn next(&mut self) -> Option<Message> {
        if self.left == 0 || self.stop.load(Ordering::Relaxed) {
            return None;
        }
        self.left -= 1;
        self.first.take().or_else(|| self.rx.try_recv().ok())
    }
}

impl SubscriptionHandle {
    /// Runs `handler` on a blocking-pool thread with each batch of
    /// deliveries, until the subscription ends.
    fn spawn<F>(subscription: Subscription, handler: F) -> Self
    where
        F: Fn(&mut Batch<'_>) + Send + 'static,
    {
        let Subscription { membership, mut rx } = subscription;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        let topic = membership.topic.clone();
        let handler_thread = Arc::new(OnceLock::new());
        let on_thread = handler_thread.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _ = on_thread.set(std::thread::current().id());
            // A delivery a panicking handler had not taken yet.
            let mut carried = None;
            loop {
                let first = match carried.take() {
                    Some(m) => m,
                    None => match rx.blocking_recv() {
                        Some(m) => m,
                        None => break,
                    },
                };
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let mut batch = Batch {
                    first: Some(first),
                    rx: &mut rx,
                    stop: &stop,
                    left: MAX_BATCH,
                };
                let run = std::panic::AssertUnwindSafe(|| {
                    super::blocking::allow_blocking(|| handler(&mut batch));
                });
                if std::panic::catch_unwind(run).is_err() {
                    tracing::warn!("subscription handler for topic {topic} panicked");
                    carried = batch.first.take();
                }
            }
        });
        SubscriptionHandle {
            membership,
            stopped,
            task,
            handler_thread,
        }
    }

    /// The subscription id (the `subscribe` message's id).
    pub fn id(&self) -> Uuid {
        self.membership.id
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.membership.topic
    }

    /// Whether the subscription has ended and the handler has returned.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Ends the subscription and waits for the broker to confirm, then for
    /// a handler call in progress to return: once this returns, the handler
    /// runs no more (unless called from the handler itself, which cannot
    /// wait for its own return). Buffered deliveries are discarded.
    pub async fn unsubscribe(mut self) -> Result<()> {
        self.stopped.store(true, Ordering::Relaxed);
        let unsubscribed = self.membership.unsubscribe().await;
        if self.handler_thread.get() != Some(&std::thread::current().id()) {
            // The subscription's channel is closed now, so the handler's
            // loop ends after the call in progress. A panic was logged.
            let _ = (&mut self.task).await;
        }
        unsubscribed
    }
}
