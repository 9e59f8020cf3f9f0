//! The async client and its options.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot::error::RecvError;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tubeway_proto::{ops, EncodedFrame, Message, MessageType, ResponseStatus};
use tubeway_transport::{SpinGroup, Url, WaitStrategy};

use crate::{Error, Result};

pub mod blocking;
mod connection;
mod slot;
mod subscription;
mod worker;

pub use connection::Responder;
use connection::{poll_queue, Conn, HandedOver, Waits};
use slot::ReaderSlot;
pub use subscription::{Batch, Subscription, SubscriptionHandle};
pub use worker::{HandlerError, Worker};

/// How long the client waits beyond a timeout it asked the broker to apply,
/// so the broker's own answer (`timeout`, `queue_empty`, ...) arrives first.
const BROKER_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// Connection settings. Build them from the default, so that fields added
/// later keep their defaults: `ClientOptions { timeout, ..ClientOptions::default() }`.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long a call waits for its response unless told otherwise (30 s).
    pub timeout: Duration,
    /// How long connecting and the handshake may take (5 s).
    pub connect_timeout: Duration,
    /// The largest message this client accepts from the broker; larger ones
    /// are skipped unread. Defaults to [`tubeway_proto::DEFAULT_MAX_MESSAGE_SIZE`].
    pub max_message_size: usize,
    /// The client name sent in the handshake, shown in the broker's logs.
    pub name: String,
    /// How the connection's reader waits for the broker; `None` takes the
    /// transport's default: sleep in the kernel on sockets, spin for about
    /// a wake-up's cost and then sleep on shared memory. A spinning strategy
    /// on a socket is latency mode: polling instead of sleeping cuts the
    /// wake-up (tens of microseconds across cores) out of every round trip,
    /// at the price of a core kept busy while waiting. Spinning suits the
    /// blocking [`Client`](blocking::Client), whose waiting thread has
    /// nothing else to do. An [`AsyncClient`] spins on a thread of its
    /// runtime, a multi-threaded one only: a call with no other in flight
    /// spins for its own answer within its task's poll, for at most one
    /// slice (50 µs), and the connection's reader sleeps while nothing else
    /// is expected. Its socket is registered with the runtime's reactor only
    /// while its reader sleeps (or a write waits for room), so that an
    /// answer its caller reads wakes no idle worker; what the broker sends
    /// unasked between calls is read within 2 ms. Every turn a spinning task gives a multi-threaded
    /// runtime wakes one of its idle workers (tokio's rule), so calls in a
    /// loop on two CPUs still see a few such wake-ups in their tail (one
    /// per 128 calls, when the task's budget is spent); a runtime of one
    /// worker has none to wake (see docs/performance/investigations.md, "The
    /// async caller reads its own answer").
    pub wait: Option<WaitStrategy>,
    /// How many calls of this connection's synchronous handlers
    /// ([`AsyncClient::serve`]) may run at once (512), each on a thread of
    /// its own. The connection tells the broker so when it serves a
    /// function with such a handler (unless
    /// [`max_worker_calls`](Self::max_worker_calls) says otherwise), and the
    /// broker holds further calls until one ends. A call beyond them that
    /// reaches the connection all the same is answered `unavailable` at
    /// once (the broker then gives it to another worker with room, if one
    /// has): queued instead, calls to a handler that hangs would pile up
    /// without bound, since each caller's call times out and it calls again.
    pub max_blocking_calls: usize,
    /// The most calls the broker forwards to this connection at once when
    /// it serves functions (counting calls it has not answered, timed out
    /// or not), declared with every function it serves; further calls wait
    /// at the broker for room here or at another worker, until their
    /// timeout. `None` (the default): no limit for async handlers, and
    /// [`max_blocking_calls`](Self::max_blocking_calls) for synchronous ones.
    pub max_worker_calls: Option<usize>,
    /// How long a thread of this connection's synchronous handlers that has
    /// answered a call polls for the next one before it sleeps. Zero (the
    /// default): it sleeps at once, and the next call wakes the thread that
    /// slept last. Polling saves that wake-up (5-50 µs across cores) for
    /// calls that come in quick succession, at the price of a CPU kept busy
    /// meanwhile; one thread polls at a time. It pays where cores are to
    /// spare: on a machine with few, the polling thread takes its CPU from
    /// the connection's reader and from the broker, and a lone call gets
    /// slower (see docs/performance/investigations.md, "Threads for
    /// synchronous handlers").
    pub handler_spin: Duration,
    /// Bytes of memory kept, at most, from the buffers of large messages
    /// (64 KiB and up) received and dropped, for the next ones to be read
    /// into (256 MiB by default; 0 keeps none). Each connection keeps its
    /// own, and a buffer unused for 5 s goes back to the system. Fresh
    /// memory for every large message costs a page fault per 4 KiB, more
    /// than reading the bytes (see [`tubeway_transport::FramePool`]).
    pub frame_pool: usize,
}

/// The default of [`ClientOptions::max_blocking_calls`].
pub(crate) const DEFAULT_MAX_BLOCKING_CALLS: usize = 512;

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_message_size: tubeway_proto::DEFAULT_MAX_MESSAGE_SIZE,
            name: ops::Hello::default().client,
            wait: None,
            max_blocking_calls: DEFAULT_MAX_BLOCKING_CALLS,
            max_worker_calls: None,
            handler_spin: Duration::ZERO,
            frame_pool: tubeway_transport::FramePool::DEFAULT_MAX_HELD,
        }
    }
}

/// A connection to a Tubeway broker, for async code (tokio).
///
/// Cheap to clone: clones share one connection, on which any number of calls
/// may be in flight at once; responses are matched to calls by id. The
/// connection closes when the last clone (and every [`Subscription`] and
/// [`Worker`] made from it) is dropped, or on [`AsyncClient::close`].
#[derive(Clone, Debug)]
pub struct AsyncClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Arc<Conn>,
    writer: Mutex<Option<JoinHandle<()>>>,
    url: Url,
    options: ClientOptions,
    welcome: ops::Welcome,
    wait: WaitStrategy,
    /// Where the connection's reader waits between polls, when callers
    /// may read their own answers (see [`AsyncClient::request_timeout`]).
    slot: OnceLock<Arc<ReaderSlot>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The reader task holds the connection state, not the client, so it
        // must be stopped explicitly; the writer flushes and ends by itself.
        self.conn.close("the client was dropped");
    }
}

/// The readers of the async clients of this process, which share the
/// worker threads of a multi-thread runtime. A process normally has one such
/// runtime; the group counts the workers of the first it saw.
fn async_readers(handle: &tokio::runtime::Handle) -> &'static SpinGroup {
    static GROUP: std::sync::OnceLock<SpinGroup> = std::sync::OnceLock::new();
    GROUP.get_or_init(|| SpinGroup::new(handle.metrics().num_workers()))
}

impl AsyncClient {
    /// Connects to the broker at `url` (`tcp://host:port`, `unix:///path`,
    /// `mem://name`) with default options.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects with `options`.
    ///
    /// The connection's reader runs as a task of the current runtime. On a
    /// current-thread runtime it never spins, whatever `options.wait` says: a
    /// task that polls its connection would keep every other task of that
    /// thread, the caller's included, from running until it gives up (use
    /// the blocking [`crate::Client`], which waits on the calling thread, or
    /// a multi-thread runtime, for the lowest latency). On a multi-thread
    /// runtime, while more clients' readers spin than it has worker threads,
    /// each looks at its connection once per turn instead of spinning in
    /// place, so that the workers poll every connection in turn (see
    /// [`tubeway_transport::SpinGroup`]).
    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Self> {
        let handle = tokio::runtime::Handle::current();
        let multi_thread = !matches!(
            handle.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        );
        let group = multi_thread.then(|| async_readers(&handle));
        let (client, reader) = Self::connect_parts(url, options, multi_thread, group).await?;
        if client.wait_strategy().spins() {
            // Callers may read their own answers: the reader waits for them
            // in a slot between the polls of its task.
            let slot = Arc::new(ReaderSlot::default());
            slot.put(reader);
            tokio::spawn(slot.clone().run());
            let _ = client.inner.slot.set(slot);
        } else {
            tokio::spawn(reader);
        }
        tokio::spawn(client.conn_arc().sweeper());
        Ok(client)
    }

    /// Connects, leaving the connection's reader for the caller to run; it
    /// may spin (by `options.wait` or the transport's default) if `may_spin`,
    /// in turn with the other readers of `group` if there is one.
    pub(crate) async fn connect_parts(
        url: &str,
        options: ClientOptions,
        may_spin: bool,
        group: Option<&SpinGroup>,
    ) -> Result<(Self, connection::Reader)> {
        let url: Url = url.parse()?;
        let hello = ops::Hello {
            client: options.name.clone(),
            ..ops::Hello::default()
        };
        let est = connection::establish(&url, &hello, &options, may_spin, group).await?;
        est.conn.set_max_blocking_calls(options.max_blocking_calls);
        est.conn.set_handler_spin(options.handler_spin);
        tracing::debug!(%url, server = %est.welcome.server, "connected");
        let client = AsyncClient {
            inner: Arc::new(Inner {
                conn: est.conn,
                writer: Mutex::new(Some(est.writer)),
                url,
                options,
                welcome: est.welcome,
                wait: est.wait,
                slot: OnceLock::new(),
            }),
        };
        Ok((client, est.reader))
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.inner.conn
    }

    /// How many of this client's calls read their own answers (see
    /// [`AsyncClient::call_inline`]).
    #[cfg(test)]
    pub(crate) fn answered_inline(&self) -> usize {
        self.inner.slot.get().map_or(0, |s| {
            s.answered_inline.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    pub(crate) fn conn_arc(&self) -> Arc<Conn> {
        self.inner.conn.clone()
    }

    /// How this client waits for the broker's answers: `options.wait`, or
    /// the transport's default; never a spinning strategy for a client whose
    /// reader shares a current-thread runtime with other tasks.
    pub fn wait_strategy(&self) -> WaitStrategy {
        self.inner.wait
    }

    /// The broker's URL.
    pub fn url(&self) -> &Url {
        &self.inner.url
    }

    /// The options this client was created with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// What the broker said in the handshake.
    pub fn welcome(&self) -> &ops::Welcome {
        &self.inner.welcome
    }

    /// The largest message the broker accepts; larger ones fail locally with
    /// [`Error::TooLarge`] before anything is sent.
    pub fn max_message_size(&self) -> usize {
        self.conn().max_send()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.conn().is_closed()
    }

    /// Completes once the connection is closed, by either end or because
    /// it was lost: for a program that only serves functions, which makes
    /// no call that would fail to tell it the broker is gone.
    pub async fn closed(&self) {
        self.conn().stopped().await;
    }

    /// Closes the connection gracefully: calls in flight fail with
    /// [`Error::ConnectionClosed`], messages already queued (oneway sends)
    /// are written, then the stream is shut down.
    pub async fn close(&self) {
        self.conn().close("closed by the client");
        let writer = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = writer {
            // Bounded: a broker that stopped reading must not hang the caller.
            let _ = tokio::time::timeout(self.inner.options.connect_timeout, writer).await;
        }
    }

    // ----- low level -----

    /// Sends any message and returns its response, whatever its status.
    /// Waits for the message's own `timeout` plus a margin if it has one,
    /// else for the default timeout. A `oneway` message gets no response:
    /// send it with [`AsyncClient::request_oneway`].
    pub async fn request(&self, msg: Message) -> Result<Message> {
        let wait = self.wait_for(msg.timeout);
        self.request_timeout(msg, wait).await
    }

    /// Sends any message and returns its response, waiting at most `timeout`.
    pub async fn request_timeout(&self, msg: Message, timeout: Duration) -> Result<Message> {
        let msg = match self.inner.slot.get().filter(|slot| slot.resting()) {
            Some(slot) => {
                // As any tokio resource: a task calling in a loop must still
                // let the others of its thread run. Before the call, never
                // after its answer is read: a future dropped there would
                // lose it, a polled message with it.
                tokio::task::consume_budget().await;
                match self.call_inline(slot, msg)? {
                    Inline::Answered(answer) => return Ok(*answer),
                    Inline::Waiting(started) => return started.finish(timeout).await,
                    Inline::Declined(msg) => msg,
                }
            }
            None => msg,
        };
        // None past the clock's range: no deadline, as a timer would not fire either.
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        self.start_until(msg, deadline)?.finish(timeout).await
    }

    /// Starts a call that may be answered at once, as the blocking client's
    /// calls are: when the reader rests (nothing else is expected) and no
    /// other call is in flight, writes it and polls the connection's reader
    /// for its answer right here, for one slice of the reader's spin. A
    /// call answered so costs no registration, no channel, and no task
    /// woken; the reader's own task, whose spinning would give the runtime
    /// a turn and wake an idle worker each time, sleeps meanwhile (see
    /// [`ReaderSlot::run`]). Otherwise the call is registered before the
    /// reader is put back, and waits as any other; or, when the reader is
    /// busy or another call is in flight, it is declined, to start as
    /// usual.
    fn call_inline(&self, slot: &ReaderSlot, msg: Message) -> Result<Inline<'_>> {
        // With calls in flight (many, when they are pipelined) the reader
        // is left alone, and that is known without a lock.
        let conn = self.conn();
        if !slot.resting() || !conn.begin_unregistered(&msg)? {
            return Ok(Inline::Declined(msg));
        }
        // Lent before the request goes: a reader asleep on shared memory
        // stops asking the broker to ring for the answer.
        let lent = slot.take().and_then(|mut held| held.lend().then_some(held));
        let Some(mut held) = lent else {
            conn.unbegin(msg.id);
            return Ok(Inline::Declined(msg));
        };
        let (id, waits) = (msg.id, Waits::of(&msg));
        let frame = conn.encode_owned(msg)?;
        let unsent = conn.try_send_as(frame, false)?;
        // Unless the frame waits for the writer's task, which only the
        // runtime runs.
        if unsent.is_none() && !conn.write_backlog() {
            // Nothing to wake: this poll is the wait. Polled once, the
            // reader spins for at most one slice and then gives up, so the
            // task keeps its thread no longer than the reader's task would.
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            match held.poll_answer(&mut cx, id) {
                Poll::Ready(Some(answer)) => {
                    held.undisturbed();
                    #[cfg(test)]
                    slot.answered_inline
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(Inline::Answered(answer));
                }
                Poll::Ready(None) => return Err(conn.closed_error()),
                Poll::Pending => {}
            }
        }
        // Registered before the reader is put back: its answer has not been
        // read, so whoever reads next routes it to the call.
        let started = self.started_unregistered(id, waits, unsent)?;
        drop(held);
        Ok(Inline::Waiting(started))
    }

    /// The part of a request that needs no waiting: registered for its
    /// response and encoded. What is left to wait for is a small future;
    /// the message itself stays out of it.
    pub(crate) fn start(&self, msg: Message) -> Result<Started<'_>> {
        self.start_until(msg, None)
    }

    /// [`start`](Self::start) for a call that gives up at `deadline`.
    fn start_until(
        &self,
        mut msg: Message,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Started<'_>> {
        let conn = self.conn();
        let (rx, pipelined, swept) = conn.register_pending_until(&mut msg, deadline)?;
        let queue = poll_queue(&msg).map(Box::from);
        let pending = PendingGuard::new(conn, msg.id, rx, queue);
        let frame = conn.encode_owned(msg)?;
        Ok(Started {
            pending,
            frame: Some(frame),
            pipelined,
            swept: deadline.filter(|_| swept),
            handed_over: None,
        })
    }

    /// A call begun unregistered (see [`Conn::begin_unregistered`]), now
    /// registered to wait for its answer as any other: `unsent`, its frame
    /// if the writer had no room for it yet.
    pub(crate) fn started_unregistered(
        &self,
        id: uuid::Uuid,
        waits: Waits,
        unsent: Option<EncodedFrame>,
    ) -> Result<Started<'_>> {
        let conn = self.conn();
        let queue = waits.queue().map(Box::from);
        let rx = conn.register_sent(id, waits)?;
        let mut pending = PendingGuard::new(conn, id, rx, queue);
        pending.set_written(unsent.is_none());
        Ok(Started {
            pending,
            frame: unsent,
            pipelined: false,
            swept: None,
            handed_over: None,
        })
    }

    /// Starts a request for a task to finish (see [`Launched`]), from the
    /// thread that makes it: registered, and written right here unless that
    /// would wait for room, or a request launched earlier has yet to be
    /// written. Requests thus leave in the order they were made, and the
    /// task has only the answer to wait for. Waits as
    /// [`request`](Self::request) does.
    pub(crate) fn launch(&self, msg: Message) -> Result<Launched> {
        let wait = self.wait_for(msg.timeout);
        let deadline = tokio::time::Instant::now().checked_add(wait);
        let Started {
            mut pending,
            frame,
            pipelined,
            swept,
            handed_over: _,
        } = self.start_until(msg, deadline)?;
        let conn = pending.conn;
        let unsent = match frame {
            Some(frame) if conn.none_handed_over() => conn.try_send_as(frame, pipelined)?,
            unsent => unsent,
        };
        pending.set_written(unsent.is_none());
        let handed_over = unsent.as_ref().map(|_| Box::new(conn.hand_over()));
        Ok(Launched {
            client: self.clone(),
            call: Some(LaunchedCall {
                answer: pending.into_parts(),
                frame: unsent,
                pipelined,
                swept,
                handed_over,
                wait,
            }),
        })
    }

    /// Writes `msg` oneway from this thread if that needs no waiting, as
    /// [`launch`](Self::launch) writes a request: `None` then. Otherwise
    /// what a task must write (see [`Oneway::write`]), in the line of
    /// requests that wait for room.
    pub(crate) fn launch_oneway(&self, mut msg: Message) -> Result<Option<Oneway>> {
        msg.oneway = true;
        let conn = self.conn();
        let frame = conn.encode_owned(msg)?;
        let frame = if conn.none_handed_over() {
            match conn.try_send_as(frame, false)? {
                None => {
                    // Written, or queued behind a write under way.
                    conn.flush_behind();
                    return Ok(None);
                }
                Some(frame) => frame,
            }
        } else {
            frame
        };
        Ok(Some(Oneway {
            client: self.clone(),
            frame,
            line: conn.hand_over(),
        }))
    }

    /// [`launch`](Self::launch) of a call of `function`, made as
    /// [`send`](Self::send) makes it.
    pub(crate) fn launch_call(&self, function: &str, msg: Message) -> Result<Launched> {
        let timeout = self.call_timeout(&msg);
        self.launch(function_call(function, msg, timeout))
    }

    /// Sends any message with `oneway` set; returns once it is queued for writing.
    pub async fn request_oneway(&self, msg: Message) -> Result<()> {
        match self.launch_oneway(msg)? {
            None => Ok(()),
            Some(waiting) => waiting.write().await,
        }
    }

    /// How long a call of a function with `msg` may take: its own timeout,
    /// else the default.
    pub(crate) fn call_timeout(&self, msg: &Message) -> Duration {
        msg.timeout.unwrap_or(self.inner.options.timeout)
    }

    /// The client-side wait for a message the broker may hold for `broker_timeout`.
    pub(crate) fn wait_for(&self, broker_timeout: Option<Duration>) -> Duration {
        broker_timeout.map_or(self.inner.options.timeout, |t| {
            t.saturating_add(BROKER_TIMEOUT_MARGIN)
        })
    }

    /// Sends `msg`; an error status becomes [`Error::Status`].
    pub(crate) async fn call(&self, msg: Message) -> Result<Message> {
        ok_response(self.request(msg).await?)
    }

    async fn call_as<T: DeserializeOwned>(&self, msg: Message) -> Result<T> {
        Ok(self.call(msg).await?.data_payload_as()?)
    }

    // ----- functions -----

    /// Calls `function` with `msg` and returns its response; an error status
    /// (`handler_error`, `function_not_found`, `timeout`, ...) becomes
    /// [`Error::Status`]. Uses the message's `timeout` if set, else the
    /// default timeout, and tells the broker so it gives up too.
    pub async fn send(&self, function: &str, msg: Message) -> Result<Message> {
        let timeout = self.call_timeout(&msg);
        self.send_timeout(function, msg, timeout).await
    }

    /// Calls `function`, giving up after `timeout` (the broker is told, and
    /// answers `timeout` itself when the handler is slower).
    pub async fn send_timeout(
        &self,
        function: &str,
        msg: Message,
        timeout: Duration,
    ) -> Result<Message> {
        self.call(function_call(function, msg, timeout)).await
    }

    /// Calls `function` without waiting for, or getting, a response.
    pub async fn send_oneway(&self, function: &str, msg: Message) -> Result<()> {
        self.request_oneway(oneway_call(function, msg)).await
    }

    /// Serves `function` on this connection with a synchronous handler.
    ///
    /// Each call runs on a thread of the connection's handler threads, so
    /// calls run concurrently and a slow handler never stalls the
    /// connection; that thread sends the answer. An idle thread sleeps
    /// (after polling for [`ClientOptions::handler_spin`]) until a call
    /// wakes it, the one that went idle last first; one idle for 10 s
    /// ends. At most [`ClientOptions::max_blocking_calls`] run at once (of
    /// all this connection's synchronous handlers); a call beyond them is
    /// answered `unavailable`. The returned message's
    /// payload, mimetype, charset and subject form the `ok` response; an
    /// `Err` becomes `handler_error` with its `Display` as the reason, and so
    /// does a panic ("handler panicked"). Oneway calls get no response.
    pub async fn serve<F>(&self, function: &str, handler: F) -> Result<Worker>
    where
        F: Fn(Message) -> std::result::Result<Message, HandlerError> + Send + Sync + 'static,
    {
        self.register_worker(function, worker::sync_dispatch(handler))
            .await
    }

    /// Serves `function` with an async handler. A call runs on the
    /// connection's reader until its handler first waits, then on a task of
    /// its own, so calls that wait run concurrently; like any async code,
    /// a handler must not block. Otherwise as [`AsyncClient::serve`].
    pub async fn serve_async<F, Fut>(&self, function: &str, handler: F) -> Result<Worker>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Message, HandlerError>> + Send + 'static,
    {
        self.register_worker(function, worker::async_dispatch(handler))
            .await
    }

    /// Serves `function` with a handler that answers later, through the
    /// [`Responder`] it is given, from any thread: for work handed to a
    /// thread, a pool or an event loop of the program's own, whose thread
    /// then writes the answer itself, with no hand-off back to this
    /// client's threads. The handler runs on the connection's reader and
    /// must return at once. A responder dropped unanswered answers
    /// `handler_error`, and so does a panic. Otherwise as
    /// [`AsyncClient::serve`].
    pub async fn serve_deferred<F>(&self, function: &str, handler: F) -> Result<Worker>
    where
        F: Fn(Message, Responder) + Send + Sync + 'static,
    {
        self.register_worker(function, worker::deferred_dispatch(handler))
            .await
    }

    async fn register_worker(
        &self,
        function: &str,
        dispatch: connection::Dispatch,
    ) -> Result<Worker> {
        let options = &self.inner.options;
        let max_calls = match (options.max_worker_calls, &dispatch) {
            (Some(n), _) => Some(n),
            (None, connection::Dispatch::Blocking(_)) => Some(options.max_blocking_calls),
            (None, _) => None,
        };
        let msg = match max_calls {
            None => op(MessageType::CreateFunction, function),
            Some(n) => {
                let body = ops::CreateFunction {
                    max_calls: Some(u64::try_from(n.max(1)).unwrap_or(u64::MAX)),
                };
                json_op(MessageType::CreateFunction, Some(function), &body)?
            }
        };
        let id = msg.id;
        // Routed before sending: the first call may follow the `ok` immediately.
        self.conn().add_worker(id, dispatch)?;
        match self.call(msg).await {
            Ok(_) => Ok(Worker::new(self.clone(), function.to_owned(), id)),
            Err(e) => {
                self.conn().remove_worker(id);
                Err(e)
            }
        }
    }

    /// Removes `function` (a local handler or every worker's registration).
    pub async fn remove_function(&self, function: &str) -> Result<()> {
        self.call(op(MessageType::RemoveFunction, function))
            .await
            .map(drop)
    }

    /// The status of `function`.
    pub async fn function_status(&self, function: &str) -> Result<ops::FunctionStatus> {
        self.call_as(op(MessageType::FunctionStatus, function))
            .await
    }

    /// The status of every function.
    pub async fn list_functions(&self) -> Result<Vec<ops::FunctionStatus>> {
        self.call_as(Message::new(MessageType::ListFunctions)).await
    }

    // ----- queues -----

    /// Puts `msg` on `queue`. If a bounded queue is full, the broker waits
    /// up to `timeout` for room, then answers `queue_full`.
    pub async fn offer(&self, queue: &str, msg: Message, timeout: Duration) -> Result<()> {
        self.call(offer_request(queue, msg, timeout))
            .await
            .map(drop)
    }

    /// Takes the next message from `queue`, waiting up to `timeout` for one;
    /// `None` if the queue stayed empty. The message keeps the fields it was
    /// offered with (id, subject, request_id, reply_to, payload, ...); its
    /// type is `response`.
    pub async fn poll(&self, queue: &str, timeout: Duration) -> Result<Option<Message>> {
        polled(self.request(poll_request(queue, timeout)).await?)
    }

    /// Creates `name` holding at most `capacity` messages; `conflict` if it
    /// exists with other settings.
    pub async fn create_queue(
        &self,
        name: &str,
        capacity: u64,
        kind: ops::QueueKind,
    ) -> Result<ops::QueueStatus> {
        let body = ops::CreateQueue {
            capacity,
            kind,
            durable: false,
        };
        self.call_as(json_op(MessageType::CreateQueue, Some(name), &body)?)
            .await
    }

    /// Creates a queue named by the broker and removed when this connection closes.
    pub async fn create_temporary_queue(
        &self,
        capacity: u64,
        kind: ops::QueueKind,
    ) -> Result<ops::QueueStatus> {
        let body = ops::CreateQueue {
            capacity,
            kind,
            durable: false,
        };
        self.call_as(json_op(MessageType::CreateTemporaryQueue, None, &body)?)
            .await
    }

    /// Removes `name` and the messages it holds.
    pub async fn remove_queue(&self, name: &str) -> Result<()> {
        self.call(op(MessageType::RemoveQueue, name))
            .await
            .map(drop)
    }

    /// Whether queue `name` exists.
    pub async fn exists_queue(&self, name: &str) -> Result<bool> {
        let e: ops::Exists = self.call_as(op(MessageType::ExistsQueue, name)).await?;
        Ok(e.exists)
    }

    /// The status of queue `name`.
    pub async fn queue_status(&self, name: &str) -> Result<ops::QueueStatus> {
        self.call_as(op(MessageType::QueueStatus, name)).await
    }

    /// The status of every queue.
    pub async fn list_queues(&self) -> Result<Vec<ops::QueueStatus>> {
        self.call_as(Message::new(MessageType::ListQueues)).await
    }

    // ----- topics -----

    /// Creates topic `name` (existing topics are left as they are).
    pub async fn create_topic(&self, name: &str) -> Result<ops::TopicStatus> {
        self.call_as(op(MessageType::CreateTopic, name)).await
    }

    /// Removes topic `name`; its subscriptions end.
    pub async fn remove_topic(&self, name: &str) -> Result<()> {
        self.call(op(MessageType::RemoveTopic, name))
            .await
            .map(drop)
    }

    /// The status of topic `name`.
    pub async fn topic_status(&self, name: &str) -> Result<ops::TopicStatus> {
        self.call_as(op(MessageType::TopicStatus, name)).await
    }

    /// The status of every topic.
    pub async fn list_topics(&self) -> Result<Vec<ops::TopicStatus>> {
        self.call_as(Message::new(MessageType::ListTopics)).await
    }

    /// Publishes `msg` to `topic` and waits for the broker to accept it.
    pub async fn publish(&self, topic: &str, msg: Message) -> Result<()> {
        self.call(publish_request(topic, msg)).await.map(drop)
    }

    /// Publishes without waiting for the broker; returns once queued for writing.
    pub async fn publish_oneway(&self, topic: &str, msg: Message) -> Result<()> {
        self.request_oneway(publish_request(topic, msg)).await
    }

    /// Subscribes to `topic` with the broker's default buffer and a
    /// client-side buffer of 1024 deliveries. See [`Subscription`] on
    /// back-pressure.
    pub async fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.subscribe_inner(topic, None).await
    }

    /// Subscribes asking the broker to buffer up to `buffer` deliveries for
    /// this subscriber; the client buffers as many.
    pub async fn subscribe_with_buffer(&self, topic: &str, buffer: usize) -> Result<Subscription> {
        self.subscribe_inner(topic, Some(buffer)).await
    }

    /// Subscribes and runs `handler` on each delivery, in order, on a
    /// blocking-pool thread.
    pub async fn subscribe_with<F>(&self, topic: &str, handler: F) -> Result<SubscriptionHandle>
    where
        F: Fn(Message) + Send + 'static,
    {
        Ok(self.subscribe(topic).await?.with_handler(handler))
    }

    async fn subscribe_inner(&self, topic: &str, buffer: Option<usize>) -> Result<Subscription> {
        let msg = match buffer {
            None => op(MessageType::Subscribe, topic),
            Some(n) => {
                let body = ops::Subscribe {
                    buffer: Some(u64::try_from(n).unwrap_or(u64::MAX)),
                };
                json_op(MessageType::Subscribe, Some(topic), &body)?
            }
        };
        let id = msg.id;
        let (tx, rx) = mpsc::channel(buffer.unwrap_or(subscription::DEFAULT_BUFFER).max(1));
        // Routed before sending: deliveries may follow the `ok` immediately.
        self.conn().add_subscription(id, tx)?;
        match self.call(msg).await {
            Ok(_) => Ok(Subscription::new(self.clone(), topic.to_owned(), id, rx)),
            Err(e) => {
                self.conn().remove_subscription(id);
                Err(e)
            }
        }
    }

    // ----- broker -----

    /// Broker statistics.
    pub async fn stats(&self) -> Result<ops::Stats> {
        self.call_as(Message::new(MessageType::Stats)).await
    }

    /// Measures one round trip to the broker.
    pub async fn ping(&self) -> Result<Duration> {
        let start = Instant::now();
        self.call(Message::new(MessageType::Ping)).await?;
        Ok(start.elapsed())
    }
}

/// How [`AsyncClient::call_inline`] left a call.
enum Inline<'a> {
    /// Its answer, read by the caller.
    Answered(Box<Message>),
    /// Registered, waiting for its answer as any other.
    Waiting(Started<'a>),
    /// Not started: to start as usual.
    Declined(Message),
}

/// A oneway message that [`AsyncClient::launch_oneway`] could not write at
/// once.
pub(crate) struct Oneway {
    client: AsyncClient,
    frame: EncodedFrame,
    line: HandedOver,
}

impl Oneway {
    /// Writes it once the requests in line before it are written and there
    /// is room, waiting at most the client's default timeout.
    pub(crate) async fn write(mut self) -> Result<()> {
        let timeout = self.client.inner.options.timeout;
        let conn = self.client.conn();
        let written = async {
            self.line.my_turn(None).await;
            conn.send_frame(self.frame).await
        };
        let written = tokio::time::timeout(timeout, written)
            .await
            .map_err(|_| Error::Timeout(timeout))?;
        conn.flush_behind();
        written
    }
}

/// A call started by [`AsyncClient::launch`]: [`Started`] owning what it
/// borrows, so that it can move into a task.
pub(crate) struct Launched {
    client: AsyncClient,
    /// Until the task takes it.
    call: Option<LaunchedCall>,
}

struct LaunchedCall {
    answer: Option<AnswerParts>,
    frame: Option<EncodedFrame>,
    pipelined: bool,
    swept: Option<tokio::time::Instant>,
    handed_over: Option<Box<HandedOver>>,
    wait: Duration,
}

impl Launched {
    /// The request's id.
    pub(crate) fn id(&self) -> Option<uuid::Uuid> {
        Some(self.call.as_ref()?.answer.as_ref()?.id)
    }

    /// Writes the request if the launching thread could not, and returns
    /// its response, whatever its status.
    pub(crate) async fn finish(mut self) -> Result<Message> {
        let Some(call) = self.call.take() else {
            unreachable!("a launched call is finished once")
        };
        let started = Started {
            pending: PendingGuard::from_parts(self.client.conn(), call.answer),
            frame: call.frame,
            pipelined: call.pipelined,
            swept: call.swept,
            handed_over: call.handed_over,
        };
        started.finish(call.wait).await
    }

    /// [`finish`](Self::finish) of a function call: its reply, or its
    /// error status as [`Error::Status`].
    pub(crate) async fn reply(self) -> Result<Message> {
        ok_response(self.finish().await?)
    }
}

impl Drop for Launched {
    /// A task dropped before it ran (its runtime shut down)
    /// ends its call as any call given up.
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            drop(PendingGuard::from_parts(self.client.conn(), call.answer));
        }
    }
}

/// A call's entry, and the end its answer comes through. Dropped before the
/// call took its answer (it timed out, was cancelled, its task dropped), it
/// removes the entry, which withdraws a poll the broker has yet to answer,
/// and offers back to its queue a message the reader had already handed
/// over for a poll: a caller that gives up loses no message.
struct PendingGuard<'a> {
    conn: &'a Conn,
    /// None once disarmed.
    answer: Option<AnswerParts>,
}

/// What a [`PendingGuard`] holds besides the connection.
struct AnswerParts {
    id: uuid::Uuid,
    rx: oneshot::Receiver<Box<Message>>,
    /// A poll's queue, where an answer left untaken goes back.
    poll_queue: Option<Box<str>>,
    /// Whether the request was written (or queued for writing): a call
    /// given up before has nothing to withdraw. (Here, not in the guard,
    /// it takes no room in the future of every call.)
    written: bool,
}

impl<'a> PendingGuard<'a> {
    fn new(
        conn: &'a Conn,
        id: uuid::Uuid,
        rx: oneshot::Receiver<Box<Message>>,
        poll_queue: Option<Box<str>>,
    ) -> Self {
        // Until its writer says so: a call refused before (too large, say)
        // has nothing to withdraw.
        let written = false;
        let answer = AnswerParts {
            id,
            rx,
            poll_queue,
            written,
        };
        Self::from_parts(conn, Some(answer))
    }

    fn from_parts(conn: &'a Conn, answer: Option<AnswerParts>) -> Self {
        PendingGuard { conn, answer }
    }

    /// Marks the request written, or not yet.
    fn set_written(&mut self, written: bool) {
        if let Some(a) = self.answer.as_mut() {
            a.written = written;
        }
    }

    /// What it holds, disarmed, for a guard made again elsewhere (a call
    /// moved into a task).
    fn into_parts(mut self) -> Option<AnswerParts> {
        self.answer.take()
    }

    /// Waits for the answer: an error once the connection ends, or once
    /// the sweeper fails the call.
    async fn answer(&mut self) -> std::result::Result<Box<Message>, RecvError> {
        match self.answer.as_mut() {
            Some(a) => (&mut a.rx).await,
            None => unreachable!("a disarmed guard waits for nothing"),
        }
    }

    /// Disarms the guard of a call whose receiver has completed, since
    /// whoever completed it (the reader with the response, `close` with
    /// every entry) took the entry first.
    fn disarm(&mut self) {
        self.answer = None;
    }
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        if !answer.written {
            self.conn.forget_pending(answer.id);
            return;
        }
        self.conn.remove_pending(answer.id);
        // The entry gone, the reader can hand over nothing more; what it
        // handed over before the caller gave up is in the channel.
        if let Some(queue) = answer.poll_queue {
            if let Ok(polled) = answer.rx.try_recv() {
                if polled.status().is_ok() {
                    self.conn.put_back_now(*polled, queue.into());
                }
            }
        }
    }
}

/// A request started by [`AsyncClient::start`].
pub(crate) struct Started<'a> {
    pending: PendingGuard<'a>,
    /// The request, unless it was written already.
    frame: Option<EncodedFrame>,
    pipelined: bool,
    /// The deadline the connection's sweeper fails the call at, if it does.
    swept: Option<tokio::time::Instant>,
    /// Handed to a task before its request could be written (see
    /// [`AsyncClient::launch`]); boxed, being rare.
    handed_over: Option<Box<HandedOver>>,
}

impl<'a> Started<'a> {
    /// Writes the request and waits at most `timeout` for its response.
    pub(crate) async fn finish(self, timeout: Duration) -> Result<Message> {
        let timed_out = || Error::Timeout(timeout);
        let Some(deadline) = self.swept else {
            let answer = tokio::time::timeout(timeout, self.exchange())
                .await
                .map_err(|_| timed_out())??;
            return Ok(*answer);
        };
        let (conn, answer) = self.send_and_wait(Some((deadline, timeout))).await?;
        match answer {
            Ok(answer) => Ok(*answer),
            // The connection's end closes every call's channel; the
            // sweeper, only that of a call whose deadline has passed.
            Err(_) if conn.is_closed() => Err(conn.closed_error()),
            Err(_) => Err(timed_out()),
        }
    }

    /// Writes the request and waits for its response, for as long as the
    /// caller lets this future run.
    pub(crate) fn exchange(self) -> impl Future<Output = Result<Box<Message>>> + Send + 'a {
        // A combinator, not an async fn, which would hold a second copy of
        // the call beside the one `send_and_wait` holds.
        futures::FutureExt::map(self.send_and_wait(None), |sent| {
            let (conn, answer) = sent?;
            answer.map_err(|_| conn.closed_error())
        })
    }

    /// Writes the request, giving up at `deadline` (and failing with a
    /// timeout of the duration beside it) if it has to wait for room, and
    /// waits for the call's channel, which closes unanswered when the
    /// connection ends or, for a call the sweeper watches, at its deadline.
    /// Uses the call's fields in place: moved out, they would take room in
    /// the future twice.
    async fn send_and_wait(
        mut self,
        deadline: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<(&'a Conn, std::result::Result<Box<Message>, RecvError>)> {
        let conn = self.pending.conn;
        if let Some(frame) = self.frame.take() {
            if self.handed_over.is_none() && !conn.none_handed_over() {
                // Requests made earlier wait for room: this one waits behind them.
                self.handed_over = Some(Box::new(conn.hand_over()));
            }
            if let Some(line) = self.handed_over.as_mut() {
                // Boxed: a rare wait, kept out of the size of every call's future.
                let until = deadline.map(|(at, _)| at);
                if !Box::pin(line.my_turn(until)).await {
                    return Err(Error::Timeout(deadline.map_or(Duration::ZERO, |(_, t)| t)));
                }
            }
            let mut send = std::pin::pin!(conn.send_frame_as(frame, self.pipelined));
            // Most sends are done at once; only one that waits for room
            // needs a timer, which the sweeper does not stand in for.
            let first = std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await;
            match (first, deadline) {
                (Poll::Ready(sent), _) => sent?,
                (Poll::Pending, None) => send.await?,
                (Poll::Pending, Some((at, timeout))) => {
                    // Boxed: a timer inline would double the size of every
                    // call's future for a wait that is rare.
                    let mut expiry = Box::pin(tokio::time::sleep_until(at));
                    std::future::poll_fn(|cx| match send.as_mut().poll(cx) {
                        Poll::Ready(sent) => Poll::Ready(sent),
                        Poll::Pending => expiry
                            .as_mut()
                            .poll(cx)
                            .map(|()| Err(Error::Timeout(timeout))),
                    })
                    .await?
                }
            }
            self.pending.set_written(true);
        }
        self.handed_over = None;
        let answer = self.pending.answer().await;
        // Until here the guard removes the entry if this future is dropped.
        self.pending.disarm();
        Ok((conn, answer))
    }
}

/// `msg` as a call of `function`, which the broker gives up after `timeout`.
pub(crate) fn function_call(function: &str, msg: Message, timeout: Duration) -> Message {
    // One literal, made where the caller keeps it. Changed in place and then
    // passed on, the message would be copied whole right after those stores,
    // a copy the CPU makes wait for them (the stores are narrower than its
    // loads and cannot be forwarded).
    Message {
        r#type: MessageType::Request,
        destination: Some(function.to_owned()),
        timeout: Some(timeout),
        ..msg
    }
}

/// `msg` offered to `queue`, waiting at the broker up to `timeout` for room.
pub(crate) fn offer_request(queue: &str, msg: Message, timeout: Duration) -> Message {
    msg.with_type(MessageType::Offer)
        .with_destination(queue)
        .with_timeout(timeout)
}

/// `msg` as a call of `function` that wants no reply (see [`AsyncClient::send_oneway`]).
pub(crate) fn oneway_call(function: &str, msg: Message) -> Message {
    msg.with_type(MessageType::Request)
        .with_destination(function)
}

/// `msg` published to `topic`.
pub(crate) fn publish_request(topic: &str, msg: Message) -> Message {
    msg.with_type(MessageType::Publish).with_destination(topic)
}

/// A poll of `queue` that the broker answers `queue_empty` after `timeout`.
pub(crate) fn poll_request(queue: &str, timeout: Duration) -> Message {
    op(MessageType::Poll, queue).with_timeout(timeout)
}

/// The answer to a poll: its message, or none if the queue stayed empty.
pub(crate) fn polled(response: Message) -> Result<Option<Message>> {
    match response.status() {
        ResponseStatus::Ok => Ok(Some(response)),
        ResponseStatus::QueueEmpty => Ok(None),
        _ => Err(Error::from_response(&response)),
    }
}

/// A response, or its error status as [`Error::Status`].
pub(crate) fn ok_response(response: Message) -> Result<Message> {
    if response.status().is_ok() {
        Ok(response)
    } else {
        Err(Error::from_response(&response))
    }
}

/// An operation message on `destination` with no payload.
fn op(r#type: MessageType, destination: &str) -> Message {
    Message::new(r#type).with_destination(destination)
}

/// An operation message with a JSON body.
fn json_op<T: Serialize>(
    r#type: MessageType,
    destination: Option<&str>,
    body: &T,
) -> Result<Message> {
    let mut msg = Message::serialize(body)?.with_type(r#type);
    msg.destination = destination.map(str::to_owned);
    Ok(msg)
}

#[cfg(test)]
mod tests;
