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

impl SubscriptionHandle {
    pub(crate) fn spawn<F>(subscription: Subscription, handler: F) -> Self
    where
        F: Fn(Message) + Send + 'static,
    {
        let Subscription { membership, mut rx } = subscription;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        let topic = membership.topic.clone();
        let handler_thread = Arc::new(OnceLock::new());
        let on_thread = handler_thread.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _ = on_thread.set(std::thread::current().id());
            while let Some(msg) = rx.blocking_recv() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let run = std::panic::AssertUnwindSafe(|| {
                    super::blocking::allow_blocking(|| handler(msg))
                });
                if std::panic::catch_unwind(run).is_err() {
                    tracing::warn!("subscription handler for topic {topic} panicked");
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
