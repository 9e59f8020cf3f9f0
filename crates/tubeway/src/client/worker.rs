//! Serving a function: this connection answers calls the broker forwards.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt as _;
use tubeway_proto::{Message, MessageType};
use uuid::Uuid;

use super::connection::{Dispatch, HandlerFailure, Responder};
use super::AsyncClient;
use crate::Result;

/// What a handler returns on failure; its `Display` becomes the
/// `handler_error` reason the caller sees.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// A function this connection serves, from [`AsyncClient::serve`].
///
/// Calls run concurrently (see [`AsyncClient::serve`] and
/// [`AsyncClient::serve_async`]). Dropping the worker stops serving as
/// [`Worker::stop`] does, without waiting: it asks the broker to remove
/// it and goes on answering the calls that come until the broker confirms;
/// [`Worker::stop`] waits for that.
#[must_use = "dropping a Worker stops serving the function"]
#[derive(Debug)]
pub struct Worker {
    client: AsyncClient,
    function: String,
    id: Uuid,
    active: bool,
}

impl Worker {
    pub(crate) fn new(client: AsyncClient, function: String, id: Uuid) -> Self {
        Worker {
            client,
            function,
            id,
            active: true,
        }
    }

    /// The function served.
    pub fn function(&self) -> &str {
        &self.function
    }

    /// The id of the registration (the `create_function` message's id).
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Stops serving: sends `remove_function` and waits for the broker's answer.
    /// Calls that arrive before the broker has processed it are still answered.
    pub async fn stop(mut self) -> Result<()> {
        self.active = false;
        if self.client.is_closed() {
            return Ok(());
        }
        let result = self.client.call(self.remove_message()).await;
        self.client.conn().remove_worker(self.id);
        result.map(drop)
    }

    fn remove_message(&self) -> Message {
        let mut msg = Message::new(MessageType::RemoveFunction).with_destination(&self.function);
        msg.correlation_id = Some(self.id);
        msg
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let conn = self.client.conn();
        if !self.active || !conn.has_worker(self.id) {
            return;
        }
        // Served until the broker confirms, as `stop` does: the calls it
        // forwards before it reads the removal are answered, not refused,
        // though another worker may serve the function. The removal is
        // written from here; only its answer is awaited by a task.
        match self.client.launch(self.remove_message()) {
            Ok(removal) => {
                let (id, client) = (self.id, self.client.clone());
                conn.spawn_kept(async move {
                    let _ = removal.reply().await;
                    client.conn().remove_worker(id);
                });
            }
            // The connection is closing: nothing more is forwarded.
            Err(_) => {
                conn.remove_worker(self.id);
            }
        }
    }
}

/// Runs a synchronous handler on the blocking pool, so a slow handler never
/// stalls the connection's reader or the async runtime.
pub(crate) fn sync_dispatch<F>(handler: F) -> Dispatch
where
    F: Fn(Message) -> std::result::Result<Message, HandlerError> + Send + Sync + 'static,
{
    Dispatch::Blocking(Arc::new(move |msg| {
        super::blocking::allow_blocking(|| handler(msg))
    }))
}

/// Runs a handler on the connection's reader with a responder to answer
/// the call with later.
pub(crate) fn deferred_dispatch<F>(handler: F) -> Dispatch
where
    F: Fn(Message, Responder) + Send + Sync + 'static,
{
    Dispatch::Deferred(Arc::new(handler))
}

/// Runs an async handler in the task that answers the call, a panic caught
/// and reported: a task of its own would cost a second spawn per call. The
/// handler is called where the call is first polled, which may be the
/// connection's reader: a panic before it returns its future is caught too.
pub(crate) fn async_dispatch<F, Fut>(handler: F) -> Dispatch
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<Message, HandlerError>> + Send + 'static,
{
    Dispatch::Async(Arc::new(move |msg| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| handler(msg))) {
            Ok(fut) => {
                let run = AssertUnwindSafe(fut).catch_unwind();
                Box::pin(async move { run.await.map_err(|_| HandlerFailure::Panicked) })
            }
            Err(_) => Box::pin(std::future::ready(Err(HandlerFailure::Panicked))),
        }
    }))
}
