use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tubeway_proto::name;
use tubeway_proto::ops::{FunctionStatus, QueueKind, QueueStatus, Stats, TopicStatus};
use tubeway_proto::{Message, ResponseStatus};
use tubeway_transport::{Connection, FramePool, Listener, Url};
use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::function::{Function, Handler, HandlerError, HandlerFuture};
use crate::handlers::Handlers;
use crate::queue::{Queue, QueueError};
use crate::spin_pool::SpinPool;
use crate::stats::{Counters, Traffic};
use crate::topic::Topic;

/// Why the broker refused an operation: the response status a client would
/// receive, and a short reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {reason}")]
#[non_exhaustive]
pub struct BrokerError {
    /// The response status.
    pub status: ResponseStatus,
    /// A short human-readable reason.
    pub reason: String,
}

impl BrokerError {
    pub(crate) fn new(status: ResponseStatus, reason: impl Into<String>) -> Self {
        BrokerError {
            status,
            reason: reason.into(),
        }
    }

    pub(crate) fn bad_request(reason: impl Into<String>) -> Self {
        BrokerError::new(ResponseStatus::BadRequest, reason)
    }

    pub(crate) fn shutting_down() -> Self {
        BrokerError::new(ResponseStatus::Unavailable, "broker is shutting down")
    }
}

pub(crate) type Refusal = BrokerError;

pub(crate) fn check_name(n: Option<&str>) -> Result<&str, BrokerError> {
    let n = n.ok_or_else(|| BrokerError::bad_request("missing destination"))?;
    name::validate(n).map_err(|e| BrokerError::bad_request(format!("bad name {n:?}: {e}")))?;
    Ok(n)
}

/// The answer to a call that had `t` to be answered and was not.
pub(crate) fn no_answer_within(t: Duration) -> BrokerError {
    BrokerError::new(
        ResponseStatus::Timeout,
        format!("no answer within {} ms", t.as_millis()),
    )
}

/// Waits for `call` at most `timeout` (a call's timeout: none, or zero,
/// is no bound).
pub(crate) async fn within<T>(
    timeout: Option<Duration>,
    call: impl std::future::Future<Output = T>,
) -> Result<T, BrokerError> {
    match timeout.filter(|t| !t.is_zero()) {
        Some(t) => tokio::time::timeout(t, call)
            .await
            .map_err(|_| no_answer_within(t)),
        None => Ok(call.await),
    }
}

pub(crate) fn queue_error(q: &str, e: QueueError) -> BrokerError {
    match e {
        QueueError::Full => {
            BrokerError::new(ResponseStatus::QueueFull, format!("queue {q:?} is full"))
        }
        QueueError::Empty => {
            BrokerError::new(ResponseStatus::QueueEmpty, format!("queue {q:?} is empty"))
        }
        QueueError::Removed => BrokerError::new(
            ResponseStatus::QueueNotFound,
            format!("queue {q:?} was removed"),
        ),
        QueueError::Expired => BrokerError::new(
            ResponseStatus::Expired,
            "message expired before it was queued",
        ),
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub config: BrokerConfig,
    pub queues: RwLock<HashMap<String, Arc<Queue>>>,
    pub topics: RwLock<HashMap<String, Arc<Topic>>>,
    pub functions: RwLock<HashMap<String, Arc<Function>>>,
    pub counters: Counters,
    /// Messages in and out, per connection.
    pub traffic: Traffic,
    pub shutdown: CancellationToken,
    /// Set when shutdown begins, before `shutdown` is cancelled: what a
    /// connection checks between requests (a look at the token takes a lock).
    pub shutting_down: AtomicBool,
    pub tracker: TaskTracker,
    /// The threads of connections whose readers spin.
    spin_pool: SpinPool,
    /// The threads that run blocking functions' handlers.
    pub handlers: Handlers,
    /// Buffers of large frames, shared by every connection.
    pub frame_pool: Option<FramePool>,
    next_conn: std::sync::atomic::AtomicU64,
    started: Instant,
    listening: Mutex<Vec<Url>>,
}

impl Inner {
    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn queue(&self, name: &str) -> Result<Arc<Queue>, BrokerError> {
        read(&self.queues).get(name).cloned().ok_or_else(|| {
            BrokerError::new(
                ResponseStatus::QueueNotFound,
                format!("no queue named {name:?}"),
            )
        })
    }

    pub fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        read(&self.topics).get(name).cloned().ok_or_else(|| {
            BrokerError::new(
                ResponseStatus::TopicNotFound,
                format!("no topic named {name:?}"),
            )
        })
    }

    pub fn function(&self, name: &str) -> Result<Arc<Function>, BrokerError> {
        read(&self.functions).get(name).cloned().ok_or_else(|| {
            BrokerError::new(
                ResponseStatus::FunctionNotFound,
                format!("no function named {name:?}"),
            )
        })
    }

    pub fn create_queue(
        &self,
        name: &str,
        capacity: u64,
        kind: QueueKind,
        owner: Option<u64>,
    ) -> Result<QueueStatus, BrokerError> {
        name::validate(name)
            .map_err(|e| BrokerError::bad_request(format!("bad queue name {name:?}: {e}")))?;
        if capacity == 0 || capacity > self.config.max_queue_capacity {
            return Err(BrokerError::bad_request(format!(
                "capacity must be between 1 and {}",
                self.config.max_queue_capacity
            )));
        }
        let mut qs = write(&self.queues);
        if let Some(q) = qs.get(name) {
            // Declaring an existing queue with the same settings succeeds, as in AMQP.
            if q.capacity == capacity && q.kind == kind && q.owner.is_none() && owner.is_none() {
                return Ok(q.status());
            }
            return Err(BrokerError::new(
                ResponseStatus::Conflict,
                format!(
                    "queue {name:?} exists as {} with capacity {}",
                    q.kind.as_str(),
                    q.capacity
                ),
            ));
        }
        let q = Arc::new(Queue::new(name.to_owned(), capacity, kind, owner));
        let status = q.status();
        qs.insert(name.to_owned(), q);
        Ok(status)
    }

    pub fn remove_queue(&self, name: &str) -> Result<(), BrokerError> {
        let q = write(&self.queues).remove(name);
        match q {
            Some(q) => {
                q.close();
                Ok(())
            }
            None => Err(BrokerError::new(
                ResponseStatus::QueueNotFound,
                format!("no queue named {name:?}"),
            )),
        }
    }

    pub fn create_topic(&self, name: &str) -> Result<TopicStatus, BrokerError> {
        name::validate(name)
            .map_err(|e| BrokerError::bad_request(format!("bad topic name {name:?}: {e}")))?;
        let mut ts = write(&self.topics);
        let t = ts
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Topic::new(name.to_owned())));
        Ok(t.status())
    }

    pub fn remove_topic(&self, name: &str) -> Result<(), BrokerError> {
        let t = write(&self.topics).remove(name);
        match t {
            Some(t) => {
                t.close();
                Ok(())
            }
            None => Err(BrokerError::new(
                ResponseStatus::TopicNotFound,
                format!("no topic named {name:?}"),
            )),
        }
    }

    pub fn remove_function(&self, name: &str) -> Result<(), BrokerError> {
        write(&self.functions)
            .remove(name)
            .map(|f| f.retire())
            .ok_or_else(|| {
                BrokerError::new(
                    ResponseStatus::FunctionNotFound,
                    format!("no function named {name:?}"),
                )
            })
    }

    pub fn list_queues(&self) -> Vec<QueueStatus> {
        let mut v: Vec<_> = read(&self.queues).values().map(|q| q.status()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn list_topics(&self) -> Vec<TopicStatus> {
        let mut v: Vec<_> = read(&self.topics).values().map(|t| t.status()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn list_functions(&self) -> Vec<FunctionStatus> {
        let mut v: Vec<_> = read(&self.functions).values().map(|f| f.status()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let (messages_in, messages_out) = self.traffic.totals();
        let mut queues: Vec<_> = read(&self.queues).values().map(|q| q.stats()).collect();
        queues.sort_by(|a, b| a.status.name.cmp(&b.status.name));
        Stats {
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            connections: Counters::get(&c.connections),
            connections_total: Counters::get(&c.connections_total),
            connections_rejected: Counters::get(&c.connections_rejected),
            messages_in,
            messages_out,
            errors: Counters::get(&c.errors),
            frame_pool_bytes: (self.frame_pool.as_ref()).map_or(0, |p| p.held() as u64),
            queues,
            topics: self.list_topics(),
            functions: self.list_functions(),
        }
    }

    fn add_function(&self, name: &str, handler: Handler) -> Result<(), BrokerError> {
        name::validate(name)
            .map_err(|e| BrokerError::bad_request(format!("bad function name {name:?}: {e}")))?;
        let mut fs = write(&self.functions);
        if fs.get(name).is_some_and(|f| !f.is_unserved()) {
            return Err(BrokerError::new(
                ResponseStatus::Conflict,
                format!("function {name:?} already exists"),
            ));
        }
        let new = Arc::new(Function::local(name.to_owned(), handler));
        if let Some(unserved) = fs.insert(name.to_owned(), new) {
            unserved.retire();
        }
        Ok(())
    }
}

/// An embeddable broker. Cheap to clone: clones share one broker.
///
/// The broker runs on the tokio runtime that calls [`Broker::listen`].
#[derive(Debug, Clone)]
pub struct Broker {
    pub(crate) inner: Arc<Inner>,
}

impl Broker {
    /// A broker with `config`, serving nothing until [`Broker::listen`].
    pub fn new(config: BrokerConfig) -> Broker {
        let spin_pool = SpinPool::new(config.spin_threads);
        let frame_pool = (config.frame_pool > 0)
            .then(|| FramePool::new(FramePool::DEFAULT_MIN_FRAME, config.frame_pool));
        Broker {
            inner: Arc::new(Inner {
                config,
                queues: RwLock::default(),
                topics: RwLock::default(),
                functions: RwLock::default(),
                counters: Counters::default(),
                traffic: Traffic::default(),
                shutdown: CancellationToken::new(),
                shutting_down: AtomicBool::new(false),
                tracker: TaskTracker::new(),
                spin_pool,
                handlers: Handlers::new(),
                frame_pool,
                next_conn: Default::default(),
                started: Instant::now(),
                listening: Mutex::default(),
            }),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    /// Starts serving `url` (any number of addresses may be served at once)
    /// and returns the address actually bound: with `tcp://host:0`, the port
    /// the OS chose. Must be called within a tokio runtime.
    pub async fn listen(&self, url: &Url) -> io::Result<Url> {
        if self.inner.shutdown.is_cancelled() {
            return Err(io::Error::other("broker is shut down"));
        }
        let mut listener = Listener::bind(url).await?;
        let bound = listener.local_url().clone();
        self.inner
            .listening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(bound.clone());
        tracing::info!(url = %bound, "listening");
        let inner = self.inner.clone();
        self.inner.tracker.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = inner.shutdown.cancelled() => break,
                    a = listener.accept() => a,
                };
                match accepted {
                    Ok(conn) => serve(&inner, conn),
                    Err(e) => {
                        // Out of descriptors or similar: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            drop(listener);
        });
        Ok(bound)
    }

    /// The addresses being served.
    pub fn local_urls(&self) -> Vec<Url> {
        self.inner
            .listening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Registers a function served by `handler` inside this process. The
    /// handler runs on the reader of the caller's connection, at once and
    /// without a task of its own (the cheapest call there is), so it must be
    /// quick: calls on that connection wait for it, in order. Use
    /// [`Broker::create_async_function`] for handlers that wait; their calls
    /// run concurrently. An error or a panic becomes a `handler_error`
    /// response; the broker keeps serving.
    pub fn create_function<F>(&self, name: &str, handler: F) -> Result<(), BrokerError>
    where
        F: Fn(Message) -> Result<Message, HandlerError> + Send + Sync + 'static,
    {
        self.inner
            .add_function(name, Handler::Sync(Arc::new(handler)))
    }

    /// Registers a function served by an async handler. A call runs on the
    /// caller's connection until its handler first waits, then on a task of
    /// its own: a handler that completes without waiting costs no task, and
    /// calls that wait run concurrently. Work that computes long without
    /// waiting belongs in [`tokio::task::spawn_blocking`], or it holds up its
    /// connection's next calls meanwhile.
    pub fn create_async_function<F, Fut>(&self, name: &str, handler: F) -> Result<(), BrokerError>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Message, HandlerError>> + Send + 'static,
    {
        let f = move |m: Message| -> HandlerFuture { Box::pin(handler(m)) };
        self.inner.add_function(name, Handler::Async(Arc::new(f)))
    }

    /// Registers a function served by a synchronous handler that may block
    /// or compute long (a language binding's callback, a database query).
    /// Each call runs on a thread of the broker's handler threads, which
    /// sends the answer, so calls run concurrently, up to the connection's
    /// in-flight limit, and no connection waits for them. A call that outlasts its
    /// timeout is answered `timeout` while its handler runs on; what the
    /// handler gives then is dropped, and the call keeps its in-flight slot
    /// until the handler ends. Otherwise as
    /// [`Broker::create_function`].
    pub fn create_blocking_function<F>(&self, name: &str, handler: F) -> Result<(), BrokerError>
    where
        F: Fn(Message) -> Result<Message, HandlerError> + Send + Sync + 'static,
    {
        self.inner
            .add_function(name, Handler::Blocking(Arc::new(handler)))
    }

    /// Removes a function (its local handler and its workers).
    pub fn remove_function(&self, name: &str) -> Result<(), BrokerError> {
        self.inner.remove_function(name)
    }

    /// Calls a function from inside the process, as a client would: the
    /// message's `timeout`, if it has one, bounds the wait as it bounds a
    /// client's call (`timeout` status), whoever serves the function.
    pub async fn call(&self, function: &str, mut msg: Message) -> Result<Message, BrokerError> {
        msg.destination = Some(function.to_owned());
        msg.oneway = false;
        let f = self.inner.function(function)?;
        let answer = match within(msg.timeout, f.call(msg, &self.inner.handlers)).await {
            Ok(answer) => answer,
            Err(e) => {
                // A call that timed out failed, whoever serves the function.
                f.count(true);
                return Err(e);
            }
        };
        let resp =
            answer?.ok_or_else(|| BrokerError::new(ResponseStatus::ServerError, "no response"))?;
        match resp.status() {
            ResponseStatus::Ok => Ok(resp),
            status => Err(BrokerError::new(
                status,
                resp.text_payload()
                    .map(|t| t.into_owned())
                    .unwrap_or_default(),
            )),
        }
    }

    /// Creates a queue; succeeds without change if it exists with the same settings.
    pub fn create_queue(
        &self,
        name: &str,
        capacity: u64,
        kind: QueueKind,
    ) -> Result<QueueStatus, BrokerError> {
        self.inner.create_queue(name, capacity, kind, None)
    }

    /// Removes a queue; waiting pollers are answered `queue_not_found`.
    pub fn remove_queue(&self, name: &str) -> Result<(), BrokerError> {
        self.inner.remove_queue(name)
    }

    /// The status of a queue.
    pub fn queue_status(&self, name: &str) -> Result<QueueStatus, BrokerError> {
        Ok(self.inner.queue(name)?.status())
    }

    /// Every queue's status.
    pub fn list_queues(&self) -> Vec<QueueStatus> {
        self.inner.list_queues()
    }

    /// Offers a message, waiting up to `timeout` for room in a full bounded queue.
    pub async fn offer(
        &self,
        queue: &str,
        msg: Message,
        timeout: Duration,
    ) -> Result<(), BrokerError> {
        let q = self.inner.queue(queue)?;
        let deadline = tokio::time::Instant::now() + timeout;
        q.offer(msg, Some(deadline))
            .await
            .map_err(|e| queue_error(queue, e))
    }

    /// Polls a message, waiting up to `timeout`; `None` when the queue stayed empty.
    pub async fn poll(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Result<Option<Message>, BrokerError> {
        let q = self.inner.queue(queue)?;
        let deadline = tokio::time::Instant::now() + timeout;
        match q.poll(Some(deadline)).await {
            Ok(m) => Ok(Some(m)),
            Err(QueueError::Empty) => Ok(None),
            Err(e) => Err(queue_error(queue, e)),
        }
    }

    /// Creates a topic; succeeds if it exists.
    pub fn create_topic(&self, name: &str) -> Result<TopicStatus, BrokerError> {
        self.inner.create_topic(name)
    }

    /// Removes a topic; its subscribers are told.
    pub fn remove_topic(&self, name: &str) -> Result<(), BrokerError> {
        self.inner.remove_topic(name)
    }

    /// Every topic's status.
    pub fn list_topics(&self) -> Vec<TopicStatus> {
        self.inner.list_topics()
    }

    /// Publishes to every current subscriber of `topic` without waiting.
    pub fn publish(&self, topic: &str, msg: Message) -> Result<(), BrokerError> {
        self.inner.topic(topic)?.publish(&msg);
        Ok(())
    }

    /// Subscribes `handler` inside this process; it is called once per
    /// message, in publish order, on a task of its own. Returns the
    /// subscription id for [`Broker::unsubscribe`].
    pub fn subscribe<F>(&self, topic: &str, handler: F) -> Result<Uuid, BrokerError>
    where
        F: Fn(Message) + Send + Sync + 'static,
    {
        let t = self.inner.topic(topic)?;
        let id = Uuid::new_v4();
        let mut rx = t.subscribe(id, None, self.inner.config.subscriber_buffer);
        let name = topic.to_owned();
        self.inner.tracker.spawn(async move {
            while let Some(m) = rx.recv().await {
                if m.r#type != tubeway_proto::MessageType::Publish {
                    continue;
                }
                // One bad message must not end the subscription.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(m)));
                if run.is_err() {
                    tracing::error!(topic = %name, "subscriber handler panicked; subscription continues");
                }
            }
        });
        Ok(id)
    }

    /// Ends a subscription made with [`Broker::subscribe`].
    pub fn unsubscribe(&self, topic: &str, id: Uuid) -> Result<bool, BrokerError> {
        Ok(self.inner.topic(topic)?.unsubscribe(None, Some(id)) > 0)
    }

    /// Every function's status.
    pub fn list_functions(&self) -> Vec<FunctionStatus> {
        self.inner.list_functions()
    }

    /// Broker statistics.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Whether [`Broker::shutdown`] has begun.
    pub fn is_shut_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }

    /// Shuts down gracefully: stops accepting, answers waiting pollers and
    /// offers with `unavailable`, lets in-flight requests finish, closes every
    /// connection. Returns within [`BrokerConfig::shutdown_timeout`] (plus a
    /// little to flush).
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
        self.inner.shutdown.cancel();
        // Ending every subscription first lets subscriber tasks finish, and
        // tells remote subscribers why their deliveries stop.
        for t in read(&self.inner.topics).values() {
            t.close();
        }
        self.inner.tracker.close();
        let grace = self.inner.config.shutdown_timeout + Duration::from_millis(500);
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                tasks = self.inner.tracker.len(),
                "shutdown grace period over; abandoning tasks"
            );
        }
        for q in read(&self.inner.queues).values() {
            q.close();
        }
    }
}

/// Starts serving a connection: on the broker's runtime when its reader
/// sleeps between requests, on a thread of the spin pool when it spins, so
/// a spinning connection never holds up a worker of the runtime.
fn serve(inner: &Arc<Inner>, conn: Connection) {
    let wait = inner.config.wait.unwrap_or(conn.default_wait);
    if !wait.spins() {
        inner
            .tracker
            .spawn(crate::session::run(inner.clone(), conn, wait, None));
        return;
    }
    let session = inner.clone();
    let spawned = inner
        .spin_pool
        .spawn(&inner.tracker, move |seat| async move {
            // Its wake-ups must come from this thread's reactor.
            let conn = match conn.reregister() {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot move a connection to its thread; dropped");
                    return;
                }
            };
            crate::session::run(session, conn, wait, Some(&seat.group)).await;
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a spinning thread; connection dropped");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shutdown_does_not_wait_out_the_grace_period_for_local_subscribers() {
        // A grace period far longer than the bound below: reaching the bound
        // means shutdown waited on a subscriber task that never ends.
        let b = Broker::new(BrokerConfig::default().shutdown_timeout(Duration::from_secs(60)));
        b.create_topic("t").unwrap();
        b.subscribe("t", |_| {}).unwrap();
        tokio::time::timeout(Duration::from_secs(20), b.shutdown())
            .await
            .expect("shutdown finished");
    }

    #[tokio::test]
    async fn local_calls_report_handler_errors_and_panics() {
        let b = Broker::new(BrokerConfig::default());
        b.create_function("fails", |_| Err("no luck".into()))
            .unwrap();
        b.create_function("panics", |_| panic!("boom")).unwrap();
        let e = b.call("fails", Message::request()).await.unwrap_err();
        assert_eq!(e.status, ResponseStatus::HandlerError);
        assert_eq!(e.reason, "no luck");
        let e = b.call("panics", Message::request()).await.unwrap_err();
        assert_eq!(e.status, ResponseStatus::HandlerError);
        assert!(e.reason.contains("boom"), "{}", e.reason);
        let e = b.call("missing", Message::request()).await.unwrap_err();
        assert_eq!(e.status, ResponseStatus::FunctionNotFound);
    }

    /// A blocking function called from inside the process runs on the
    /// broker's handler threads, inside the runtime, and may block there;
    /// its errors and panics are reported as any function's.
    #[tokio::test]
    async fn local_calls_of_blocking_functions_run_on_handler_threads() {
        let b = Broker::new(BrokerConfig::default());
        b.create_blocking_function("where", |_| {
            std::thread::sleep(Duration::from_millis(5));
            let name = std::thread::current().name().unwrap_or_default().to_owned();
            let in_runtime = tokio::runtime::Handle::try_current().is_ok();
            Ok(Message::plain_text(format!("{name} {in_runtime}")))
        })
        .unwrap();
        b.create_blocking_function("panics", |_| panic!("blocked boom"))
            .unwrap();
        let r = b.call("where", Message::request()).await.unwrap();
        assert_eq!(r.text_payload().unwrap(), "tubeway-handler true");
        let e = b.call("panics", Message::request()).await.unwrap_err();
        assert_eq!(e.status, ResponseStatus::HandlerError);
        assert!(e.reason.contains("blocked boom"), "{}", e.reason);
        assert_eq!(b.inner.handlers.threads(), 1, "one thread ran both");
    }
}
