//! One broker connection: a writer, a reader, and the routing table the
//! reader uses to hand each incoming message to whoever waits for it.
//!
//! The reader is a future ([`Reader`]): the async client spawns it as a
//! task, or, when it spins on a multi-threaded runtime, a task that runs it
//! from a slot between the callers that borrow it (see `slot.rs`); the
//! blocking client lets the thread that waits for an answer poll it, so the
//! answer is read on the thread that wants it. A call with no other in
//! flight asks the reader for its own answer ([`Reader::poll_read`]), which
//! then needs no registration, no channel and no wake-up.

use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tubeway_broker::handlers::Handlers;
use tubeway_proto::{
    codec, ops, Decoded, EncodedFrame, Message, MessageType, ResponseStatus, MIME_TEXT,
};
use tubeway_transport::{FramePool, FrameReader, FrameWriter, Lent, SpinGroup, Url, WaitStrategy};
use uuid::Uuid;

use super::worker::HandlerError;
use crate::{Error, Result};

/// Why a handler gave no result.
pub(crate) enum HandlerFailure {
    Panicked,
}

/// A handler's outcome on one request.
pub(crate) type Outcome =
    std::result::Result<std::result::Result<Message, HandlerError>, HandlerFailure>;

/// An async handler's run on one request, for the task that answers it.
pub(crate) type HandlerRun = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A synchronous handler.
pub(crate) type BlockingHandler =
    dyn Fn(Message) -> std::result::Result<Message, HandlerError> + Send + Sync;

/// How the handler of one worker registration runs a request.
#[derive(Clone)]
pub(crate) enum Dispatch {
    /// On the reader until it waits, then on a task of its own.
    Async(Arc<dyn Fn(Message) -> HandlerRun + Send + Sync>),
    /// On the connection's handler threads, which also send the answers.
    Blocking(Arc<BlockingHandler>),
    /// On the reader, which hands it a responder to answer with later,
    /// from any thread.
    Deferred(Arc<dyn Fn(Message, Responder) + Send + Sync>),
}

/// State shared by the client handle, the reader task and the writer task.
pub(crate) struct Conn {
    state: Mutex<State>,
    /// Kept out of `state`: a send needs neither its lock nor a clone.
    /// Closed (not dropped) on close, which lets it flush and stop.
    writer: FrameWriter,
    /// The broker understands `cancel`.
    can_cancel: AtomicBool,
    /// The broker understands `requeue`.
    can_requeue: AtomicBool,
    /// The runtime the connection was made on: a frame sent from a drop
    /// outside it waits there for room to be written.
    runtime: tokio::runtime::Handle,
    /// What keeps `runtime` running while a task spawned there has work
    /// (the blocking client's background duty); unset where the runtime
    /// runs by itself.
    keep_running: OnceLock<KeepRunning>,
    /// A task sees the write queue drained (see [`Conn::flush_behind`]).
    flushing: Arc<AtomicBool>,
    /// Cancelled on close: the reader stops, wherever it runs.
    stop: CancellationToken,
    /// Set on close, before `stop` is cancelled: what the reader checks
    /// between frames (a look at the token takes a lock).
    stopping: AtomicBool,
    /// The broker's limit from the handshake; larger messages are refused locally.
    max_send: AtomicUsize,
    /// A task expires this connection's calls (see [`Conn::sweeper`]).
    swept: AtomicBool,
    /// Wakes the sweeper for a deadline earlier than the one it sleeps until.
    sweep_sooner: Notify,
    /// Requests waiting for room in the write queue, in the order they
    /// were made (see [`Conn::hand_over`]).
    line: Arc<Line>,
    /// Calls of synchronous handlers running, and how many may.
    blocking_calls: AtomicUsize,
    max_blocking_calls: AtomicUsize,
    /// The threads that run them.
    handlers: Handlers,
}

/// Requests whose write waits for room, in line: while it is not empty, a
/// request made later joins it rather than write first.
#[derive(Debug)]
struct Line {
    /// How many are in it.
    waiting: AtomicUsize,
    /// Whose turn it is to write: one at a time, first come first served.
    turns: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    /// Why the connection closed, once it has.
    closed: Option<String>,
    /// Calls waiting for a `response`, by the id of the message they sent.
    pending: HashMap<Uuid, Waiter>,
    /// Subscriptions, by the id of their `subscribe` message.
    subscriptions: HashMap<Uuid, mpsc::Sender<Message>>,
    /// Worker registrations, by the id of their `create_function` message.
    workers: HashMap<Uuid, Dispatch>,
    /// Polls their caller gave up on, by id: a message the broker took for
    /// one before it learnt is put back, not lost.
    abandoned: HashMap<Uuid, Abandoned>,
    /// The id of the last call made without registering (see
    /// [`Conn::begin_unregistered`]): a call starting meanwhile must not
    /// take it. Left behind once that call ends; it then costs at most a
    /// fresh id for a message sent again.
    unregistered: Option<Uuid>,
    /// When the sweeper looks for expired calls next; `None` while it waits
    /// for a deadline. Never later than a deadline among `pending`.
    next_sweep: Option<Instant>,
}

impl State {
    /// Remembers poll `id` on `queue` as given up by its caller.
    fn abandon(&mut self, id: Uuid, queue: String) {
        if self.abandoned.len() >= MAX_ABANDONED {
            self.abandoned.clear();
        }
        let _settled = None;
        self.abandoned.insert(id, Abandoned { queue, _settled });
    }
}

/// A poll given up by its caller, whose answer the broker may still send.
struct Abandoned {
    queue: String,
    /// Dropped, never sent on, once the answer is in (or will never
    /// come), which tells whoever waits for that (see [`Conn::settled`]).
    _settled: Option<oneshot::Sender<()>>,
}

/// A call waiting for its response.
struct Waiter {
    tx: oneshot::Sender<Box<Message>>,
    /// What the call waits for at the broker, if anything.
    waits: Waits,
    /// When the sweeper fails the call, if it watches it.
    expires: Option<Instant>,
}

/// Withdrawn polls remembered at most; past it all are forgotten at once
/// (the broker withdraws the polls themselves: only a message that crossed
/// a forgotten withdrawal would then go unreturned).
const MAX_ABANDONED: usize = 4096;

/// A request's place in the line of those waiting for room (see
/// [`Conn::hand_over`]).
pub(crate) struct HandedOver {
    line: Arc<Line>,
    turn: Turn,
}

/// A handed-over call's place in the line of them.
enum Turn {
    Waiting(Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send>>),
    /// Its request is next to go; the others wait until this drops.
    Now {
        _permit: Option<OwnedSemaphorePermit>,
    },
}

impl HandedOver {
    /// Waits until every call handed over before this one has written its
    /// request (or given up); false if `until` passes first.
    pub(crate) async fn my_turn(&mut self, until: Option<Instant>) -> bool {
        let Turn::Waiting(waiting) = &mut self.turn else {
            return true;
        };
        let permit = match until {
            Some(at) => match tokio::time::timeout_at(at, waiting).await {
                Ok(permit) => permit,
                Err(_) => return false,
            },
            None => waiting.await,
        };
        self.turn = Turn::Now { _permit: permit };
        true
    }
}

impl Drop for HandedOver {
    fn drop(&mut self) {
        self.line.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Conn")
            .field("closed", &s.closed)
            .field("pending", &s.pending.len())
            .field("subscriptions", &s.subscriptions.len())
            .field("workers", &s.workers.len())
            .finish_non_exhaustive()
    }
}

/// The connection's reader: reads and routes every incoming message until
/// the connection closes. Someone must poll it (see the module doc).
pub(crate) struct Reader {
    conn: Arc<Conn>,
    frames: FrameReader,
    /// Completes on close.
    stopped: Pin<Box<WaitForCancellationFutureOwned>>,
    /// What routing the last message still waits for (a full subscription,
    /// an answer to write); finished before the next frame is read.
    routing: Option<Routing>,
    /// The connection has ended.
    ended: bool,
}

/// Routing that must wait.
type Routing = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Makes a guard that keeps a connection's runtime running while it lives
/// (see [`Conn::set_keep_running`]); none if it cannot.
pub(crate) type KeepRunning = Box<dyn Fn() -> Option<Box<dyn Send>> + Send + Sync>;

/// What a successful [`establish`] returns.
pub(crate) struct Established {
    pub(crate) conn: Arc<Conn>,
    pub(crate) writer: JoinHandle<()>,
    pub(crate) reader: Reader,
    pub(crate) welcome: ops::Welcome,
    /// How the reader waits for the broker.
    pub(crate) wait: WaitStrategy,
}

/// Connects, performs the `hello` handshake and starts the writer; returns
/// the reader for the caller to run.
pub(crate) async fn establish(
    url: &Url,
    hello: &ops::Hello,
    options: &super::ClientOptions,
    may_spin: bool,
    group: Option<&SpinGroup>,
) -> Result<Established> {
    let (connect_timeout, max_receive) = (options.connect_timeout, options.max_message_size);
    let connect_err = |source| Error::Connect {
        url: url.to_string(),
        source,
    };
    let stream = tokio::time::timeout(connect_timeout, tubeway_transport::connect(url))
        .await
        .map_err(|_| {
            connect_err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection within {connect_timeout:?}"),
            ))
        })?
        .map_err(connect_err)?;

    let wait = options.wait.unwrap_or(stream.default_wait);
    let wait = if may_spin || !wait.spins() {
        wait
    } else {
        WaitStrategy::PARK
    };
    // A reader spinning on a multi-threaded runtime (`group`): the reactor
    // would wake an idle worker at every answer it reads itself.
    let stream = if group.is_some() && wait.spins() {
        stream.watch_on_demand().map_err(connect_err)?
    } else {
        stream
    };
    stream.writer.set_wait_strategy(&wait);
    let (frame_writer, flusher) = FrameWriter::new(stream.writer);
    let conn = Arc::new(Conn {
        can_cancel: AtomicBool::new(false),
        can_requeue: AtomicBool::new(false),
        runtime: tokio::runtime::Handle::current(),
        keep_running: OnceLock::new(),
        flushing: Arc::new(AtomicBool::new(false)),
        stop: CancellationToken::new(),
        stopping: AtomicBool::new(false),
        state: Mutex::default(),
        writer: frame_writer,
        max_send: AtomicUsize::new(max_receive),
        swept: AtomicBool::new(false),
        sweep_sooner: Notify::new(),
        line: Arc::new(Line {
            waiting: AtomicUsize::new(0),
            turns: Arc::new(Semaphore::new(1)),
        }),
        blocking_calls: AtomicUsize::new(0),
        max_blocking_calls: AtomicUsize::new(super::DEFAULT_MAX_BLOCKING_CALLS),
        handlers: Handlers::new(),
    });
    let writer = tokio::spawn(write_loop(flusher, Arc::downgrade(&conn)));
    let mut frames = FrameReader::new(stream.reader, max_receive);
    frames.set_wait_strategy(wait);
    if options.frame_pool > 0 {
        let pool = FramePool::new(FramePool::DEFAULT_MIN_FRAME, options.frame_pool);
        frames.recycle_large_frames(pool);
    }
    if let Some(group) = group.filter(|_| wait.spins()) {
        frames.join_spin_group(group);
    }

    let handshake = async {
        let msg = Message::serialize(hello)?.with_type(MessageType::Hello);
        conn.send_frame(conn.encode(&msg)?).await?;
        read_welcome(&mut frames, msg.id).await
    };
    let welcome = match tokio::time::timeout(connect_timeout, handshake).await {
        Ok(Ok(welcome)) => welcome,
        Ok(Err(e)) => {
            conn.close("handshake failed");
            return Err(match e {
                Error::ConnectionClosed(why) => Error::Handshake(why),
                other => other,
            });
        }
        Err(_) => {
            conn.close("handshake timed out");
            return Err(Error::Handshake(format!(
                "no welcome from the broker within {connect_timeout:?}"
            )));
        }
    };
    let max_send = match usize::try_from(welcome.max_message_size) {
        Ok(0) => tubeway_proto::DEFAULT_MAX_MESSAGE_SIZE,
        Ok(n) => n.min(tubeway_proto::MAX_MESSAGE_SIZE_LIMIT),
        Err(_) => tubeway_proto::MAX_MESSAGE_SIZE_LIMIT,
    };
    conn.max_send.store(max_send, Ordering::Relaxed);
    let can = |cap: &str| welcome.capabilities.iter().any(|c| c == cap);
    conn.can_cancel
        .store(can(ops::CAP_CANCEL), Ordering::Relaxed);
    conn.can_requeue
        .store(can(ops::CAP_REQUEUE), Ordering::Relaxed);

    let reader = Reader::new(conn.clone(), frames);
    Ok(Established {
        conn,
        writer,
        reader,
        welcome,
        wait,
    })
}

async fn read_welcome(frames: &mut FrameReader, hello_id: Uuid) -> Result<ops::Welcome> {
    let msg = match frames.next().await {
        Ok(Some(Decoded::Message(m))) => m,
        Ok(Some(other)) => {
            return Err(Error::Handshake(format!(
                "unexpected frame during the handshake: {other:?}"
            )))
        }
        Ok(None) => {
            return Err(Error::Handshake(
                "the broker closed the connection during the handshake".into(),
            ))
        }
        Err(e) => return Err(Error::Handshake(e.to_string())),
    };
    if msg.r#type != MessageType::Response || msg.correlation_id != Some(hello_id) {
        return Err(Error::Handshake(format!(
            "expected the response to hello, got {} message",
            msg.r#type
        )));
    }
    if !msg.status().is_ok() {
        return Err(Error::Handshake(format!(
            "{}: {}",
            msg.status(),
            crate::error::reason(&msg)
        )));
    }
    msg.data_payload_as::<ops::Welcome>()
        .map_err(|e| Error::Handshake(format!("bad welcome: {e}")))
}

async fn write_loop(flusher: impl std::future::Future<Output = io::Result<()>>, conn: Weak<Conn>) {
    if let Err(e) = flusher.await {
        tracing::debug!("tubeway connection write failed: {e}");
        if let Some(conn) = conn.upgrade() {
            conn.close(&format!("write failed: {e}"));
        }
    }
}

impl Reader {
    /// Blocks this thread until the connection may have bytes to read, or
    /// `deadline` passes, outside the runtime (see
    /// [`FrameReader::wait_readable`]); false once `deadline` has passed or
    /// when the transport does not wait so.
    pub(crate) fn wait_readable(&mut self, deadline: Option<std::time::Instant>) -> bool {
        // A failure shows in the next read.
        self.frames.wait_readable(deadline).unwrap_or(true)
    }

    /// The next wait sleeps at once (see [`FrameReader::sleep_next`]).
    pub(crate) fn sleep_next(&mut self) {
        self.frames.sleep_next();
    }

    /// Lends the reader to a caller reading its own answer (see
    /// [`FrameReader::lend`]).
    pub(crate) fn lend(&mut self) -> Lent {
        self.frames.lend()
    }

    /// Takes back a reader lent (see [`FrameReader::take_back`]): false
    /// when its owner must poll it.
    pub(crate) fn take_back(&mut self, lent: Lent) -> bool {
        self.routing.is_none() && self.frames.take_back(lent)
    }

    /// Whether something wakes the reader's task for what comes (see
    /// [`FrameReader::watched`]).
    pub(crate) fn watched(&self) -> bool {
        self.frames.watched()
    }

    /// Whether a caller may read its own answer with this reader: it
    /// spins, and in place, not in turn with other readers of its threads
    /// (see [`FrameReader::crowded`]).
    pub(crate) fn lendable(&self) -> bool {
        !self.ended && !self.frames.crowded()
    }

    /// Whether the reader may sleep until something comes: nothing on the
    /// connection waits for the broker (see [`Conn::expects_nothing`]),
    /// and a caller would read its own answer.
    pub(crate) fn may_rest(&self) -> bool {
        self.lendable() && self.conn.expects_nothing()
    }

    fn new(conn: Arc<Conn>, frames: FrameReader) -> Reader {
        // Made once: a fresh `cancelled()` per frame would register and
        // deregister a waiter every time.
        let stopped = Box::pin(conn.stop.clone().cancelled_owned());
        Reader {
            conn,
            frames,
            stopped,
            routing: None,
            ended: false,
        }
    }

    /// Reads and routes what arrives until the connection ends (`None`)
    /// or, when `answer_to` names a call nobody registered for (its caller
    /// polls this reader itself), until its response arrives, which is
    /// returned instead of routed.
    /// Whether the last [`poll_read`](Self::poll_read) was pending only
    /// to give the runtime a turn while its reader spins (see
    /// `FrameReader::woke_itself`), not to sleep.
    pub(crate) fn spinning(&self) -> bool {
        !self.ended && self.frames.woke_itself()
    }

    pub(crate) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        answer_to: Option<Uuid>,
    ) -> Poll<Option<Box<Message>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            if let Some(routing) = self.routing.as_mut() {
                ready!(routing.as_mut().poll(cx));
                self.routing = None;
            }
            if self.conn.stopping.load(Ordering::Acquire) {
                self.ended = true;
                continue;
            }
            let polled = std::pin::pin!(self.frames.next()).poll(cx);
            let next = match polled {
                Poll::Ready(next) => next,
                // The token (whose every look takes locks) is looked at
                // only when the reader waits to be woken: a spinning reader
                // gives the runtime a turn after each frame, and the flag
                // does then. `next` is cancel-safe, so one per poll is fine.
                Poll::Pending if self.frames.woke_itself() => return Poll::Pending,
                Poll::Pending => {
                    ready!(self.stopped.as_mut().poll(cx));
                    self.ended = true;
                    continue;
                }
            };
            let m = match next {
                Ok(Some(Decoded::Message(m))) => m,
                Ok(Some(other)) => {
                    self.routing = self.conn.skipped(other);
                    continue;
                }
                Ok(None) => return Poll::Ready(self.end("the broker closed the connection")),
                Err(e) => return Poll::Ready(self.end(&e.to_string())),
            };
            if answer_to.is_some()
                && m.correlation_id == answer_to
                && m.r#type == MessageType::Response
            {
                return Poll::Ready(Some(m));
            }
            // The common case, a response to a waiting call, without a future.
            if let Some(m) = self.conn.answer_waiting_call(m) {
                self.routing = self.conn.route_now(*m);
            }
        }
    }

    fn end(&mut self, reason: &str) -> Option<Box<Message>> {
        tracing::debug!("tubeway connection closed: {reason}");
        self.conn.close(reason);
        self.ended = true;
        None
    }
}

impl Future for Reader {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Without a call named, it reads until the connection ends.
        self.poll_read(cx, None).map(drop)
    }
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent, so a panic
        // elsewhere must not disable the connection.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands a response to the call waiting for it; any other message back.
    pub(crate) fn answer_waiting_call(&self, m: Box<Message>) -> Option<Box<Message>> {
        let cid = match (m.r#type, m.correlation_id) {
            (MessageType::Response, Some(cid)) => cid,
            _ => return Some(m),
        };
        let Some(waiter) = self.lock().pending.remove(&cid) else {
            return Some(m);
        };
        let m = waiter.tx.send(m).err()?;
        // The caller gave up just now, after the entry was taken: a polled
        // message is put back like one for a withdrawn poll.
        let Waits::Message(queue) = waiter.waits else {
            return None;
        };
        self.lock().abandon(cid, queue);
        Some(m)
    }

    /// Routes one message from the broker that is not a response to a
    /// waiting call.
    #[cfg(test)]
    pub(crate) async fn route(self: &Arc<Self>, m: Message) {
        if let Some(routing) = self.route_now(m) {
            routing.await;
        }
    }

    /// Routes one message from the broker that is not a response to a
    /// waiting call, as far as it can without waiting; what is left to
    /// wait for, if anything, must finish before the next message is routed.
    fn route_now(self: &Arc<Self>, m: Message) -> Option<Routing> {
        let Some(cid) = m.correlation_id else {
            if m.r#type == MessageType::Ping && !m.oneway {
                return Some(self.reply_later(m.id, ResponseStatus::Ok, ""));
            }
            tracing::warn!("ignored a {} message without correlation_id", m.r#type);
            return None;
        };
        match m.r#type {
            MessageType::Response => {
                let abandoned = self.lock().abandoned.remove(&cid);
                match abandoned.map(|a| a.queue) {
                    Some(queue) if m.status().is_ok() => {
                        let conn = self.clone();
                        return Some(Box::pin(async move { conn.put_back(m, queue).await }));
                    }
                    _ => tracing::debug!("response to a call no longer waiting: {cid}"),
                }
            }
            MessageType::Publish => {
                let sub = self.lock().subscriptions.get(&cid).cloned();
                let Some(sub) = sub else {
                    tracing::debug!("delivery for an ended subscription: {cid}");
                    return None;
                };
                // Waiting (not dropping) when the subscription is full is
                // deliberate: a slow subscriber slows this connection, so the
                // broker sees its buffer fill and counts the drops where they
                // can be observed. A subscription whose handle is gone takes
                // nothing.
                if let Err(mpsc::error::TrySendError::Full(m)) = sub.try_send(m) {
                    return Some(Box::pin(async move {
                        let _ = sub.send(m).await;
                    }));
                }
            }
            MessageType::Unsubscribe => {
                // The topic was removed: dropping the sender ends the subscription
                // once its buffered deliveries are read.
                self.remove_subscription(cid);
            }
            MessageType::Request => {
                let worker = self.lock().workers.get(&cid).cloned();
                match worker {
                    Some(dispatch) => serve_now(self.clone(), dispatch, m),
                    None if m.oneway => {}
                    None => {
                        let reason = "this connection no longer serves the function";
                        return Some(self.reply_later(
                            m.id,
                            ResponseStatus::FunctionNotFound,
                            reason,
                        ));
                    }
                }
            }
            other => tracing::warn!("ignored an unexpected {other} message"),
        }
        None
    }

    /// Handles a frame that is not a message; what is left to wait for, if
    /// anything (an answer to write).
    fn skipped(self: &Arc<Self>, frame: Decoded) -> Option<Routing> {
        match frame {
            Decoded::TooLarge {
                id,
                type_code,
                oneway,
                frame_len,
                max,
            } => {
                // A response or delivery we cannot read is lost (its caller times out);
                // a call for our worker is refused so the caller learns why at once.
                tracing::warn!("skipped a {frame_len}-byte frame (limit {max})");
                if let (Some(id), false) = (id, oneway) {
                    if type_code == Some(MessageType::Request.code()) {
                        let reason = format!(
                            "request is {frame_len} bytes; this worker accepts at most {max}"
                        );
                        return Some(self.reply_later(id, ResponseStatus::TooLarge, &reason));
                    }
                }
            }
            Decoded::Invalid {
                id,
                type_code,
                error,
            } => {
                tracing::warn!("skipped an invalid frame: {error}");
                if let Some(id) = id {
                    if type_code == Some(MessageType::Request.code()) {
                        let reason = error.to_string();
                        return Some(self.reply_later(id, ResponseStatus::BadRequest, &reason));
                    }
                }
            }
            other => tracing::warn!("skipped an unknown frame: {other:?}"),
        }
        None
    }

    /// [`reply`](Self::reply), as a future that owns what it needs.
    fn reply_later(self: &Arc<Self>, to: Uuid, status: ResponseStatus, reason: &str) -> Routing {
        let (conn, reason) = (self.clone(), reason.to_owned());
        Box::pin(async move { conn.reply(to, status, &reason).await })
    }

    /// Puts back a message the broker handed to a poll its caller had
    /// given up on: it goes back to its queue, not to waste.
    async fn put_back(&self, polled: Message, queue: String) {
        if let Some(frame) = self.put_back_frame(polled, queue) {
            if self.send_frame(frame).await.is_ok() {
                // Whoever waited for this answer (see `settled`) may let
                // the runtime stop now: the frame must not stay queued.
                self.flush_behind();
            }
        }
    }

    /// [`put_back`](Self::put_back) from a drop path, which cannot wait.
    pub(crate) fn put_back_now(&self, polled: Message, queue: String) {
        if let Some(frame) = self.put_back_frame(polled, queue) {
            self.send_soon(frame);
        }
    }

    fn put_back_frame(&self, polled: Message, queue: String) -> Option<EncodedFrame> {
        tracing::warn!(
            "a poll on {queue:?} was answered after its caller gave up; putting its message back"
        );
        let mut back = polled;
        back.response_status = None;
        back.destination = Some(queue);
        back.oneway = true;
        // What the broker does not take as requeued it offers, waiting
        // this long for room in a full queue.
        back.timeout = Some(Duration::from_secs(30));
        if self.can_requeue.load(Ordering::Relaxed) {
            // To the head of its queue, past its capacity: its id and the
            // poll's (the answer's `correlation_id`) say which it was.
            back.r#type = MessageType::Requeue;
        } else {
            back.r#type = MessageType::Offer;
            back.id = tubeway_proto::fresh_id();
            back.correlation_id = None;
        }
        self.encode(&back).ok()
    }

    /// Answers message `to` with `status` and an optional text reason.
    async fn reply(&self, to: Uuid, status: ResponseStatus, reason: &str) {
        let mut r = Message::response_to(to, None, status);
        if !reason.is_empty() {
            r = r.with_text(reason, MIME_TEXT, "utf-8");
        }
        if let Ok(frame) = self.encode(&r) {
            let _ = self.send_frame(frame).await;
        }
    }

    /// Encodes `msg`, refusing it when it exceeds the broker's limit.
    pub(crate) fn encode(&self, msg: &Message) -> Result<EncodedFrame> {
        Ok(codec::encode(msg, self.max_send())?)
    }

    /// [`encode`](Self::encode), taking the payload rather than sharing it.
    pub(crate) fn encode_owned(&self, msg: Message) -> Result<EncodedFrame> {
        Ok(codec::encode_owned(msg, self.max_send())?)
    }

    /// The broker's maximum message size.
    pub(crate) fn max_send(&self) -> usize {
        self.max_send.load(Ordering::Relaxed)
    }

    /// Sends a frame: written at once when the connection is idle, queued
    /// otherwise; waits while the write queue is full.
    pub(crate) async fn send_frame(&self, frame: EncodedFrame) -> Result<()> {
        self.send_frame_as(frame, false).await
    }

    /// [`send_frame`](Self::send_frame), or, when `batched` (the frame is
    /// one of several in flight), one that waits to be written with
    /// whatever else is queued at the moment, in one system call.
    pub(crate) async fn send_frame_as(&self, frame: EncodedFrame, batched: bool) -> Result<()> {
        let sent = if batched {
            self.writer.send_batched(frame).await
        } else {
            self.writer.send(frame).await
        };
        sent.map_err(|_| self.closed_error())
    }

    /// Sends a frame as [`send_frame_as`](Self::send_frame_as) would if that
    /// needs no waiting; gives it back otherwise.
    pub(crate) fn try_send_as(
        &self,
        frame: EncodedFrame,
        batched: bool,
    ) -> Result<Option<EncodedFrame>> {
        let tried = if batched {
            self.writer.try_send_batched_or_return(frame)
        } else {
            self.writer.try_send_or_return(frame)
        };
        tried.map_err(|_| self.closed_error())
    }

    /// Whether no request waits in line for room: one made now may be
    /// written at once.
    pub(crate) fn none_handed_over(&self) -> bool {
        self.line.waiting.load(Ordering::Acquire) == 0
    }

    /// How many requests wait in line.
    #[cfg(test)]
    pub(crate) fn in_line(&self) -> usize {
        self.line.waiting.load(Ordering::Acquire)
    }

    /// Puts a call whose request could not be written at once in the line
    /// of such calls, whose requests go in the order they joined it (a
    /// small request that would fit must not overtake a large one waiting
    /// for room); it counts as handed over until the returned guard drops,
    /// once its request is written or given up.
    pub(crate) fn hand_over(&self) -> HandedOver {
        self.line.waiting.fetch_add(1, Ordering::AcqRel);
        // The line is never closed, so the permit always comes.
        let mut waiting: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(
            self.line
                .turns
                .clone()
                .acquire_owned()
                .map(std::result::Result::ok),
        );
        // Polled now, on the thread making the call, so that its place in
        // the line is that of the call, whenever its task first runs.
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let turn = match waiting.as_mut().poll(&mut cx) {
            Poll::Ready(permit) => Turn::Now { _permit: permit },
            Poll::Pending => Turn::Waiting(waiting),
        };
        HandedOver {
            line: self.line.clone(),
            turn,
        }
    }

    /// [`register_pending_until`](Self::register_pending_until) with no deadline.
    #[cfg(test)]
    pub(crate) fn register_pending(
        &self,
        msg: &mut Message,
    ) -> Result<(oneshot::Receiver<Box<Message>>, bool)> {
        let (rx, pipelined, _) = self.register_pending_until(msg, None)?;
        Ok((rx, pipelined))
    }

    /// Registers a call waiting for the response to `msg`. A message id
    /// already in flight (the same message sent twice at once) is replaced
    /// by a fresh one, so each response finds its own caller. Also says
    /// whether other calls are in flight (then this one is pipelined, and
    /// its request may wait to be written with theirs), and whether the
    /// connection's sweeper watches the call's `deadline`: then the call's
    /// channel closes once that has passed.
    pub(crate) fn register_pending_until(
        &self,
        msg: &mut Message,
        deadline: Option<Instant>,
    ) -> Result<(oneshot::Receiver<Box<Message>>, bool, bool)> {
        let waits = Waits::of(msg);
        let expires = deadline.filter(|_| self.swept.load(Ordering::Relaxed));
        let mut s = self.lock();
        if let Some(reason) = &s.closed {
            return Err(Error::ConnectionClosed(reason.clone()));
        }
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter { tx, waits, expires };
        // Calls of one timeout come in the order they expire: only the
        // first after a sweep, or one with a shorter timeout, moves the
        // sweep forward.
        let sooner = expires.filter(|&e| s.next_sweep.is_none_or(|next| e < next));
        if sooner.is_some() {
            s.next_sweep = sooner;
        }
        if s.unregistered == Some(msg.id) {
            msg.id = tubeway_proto::fresh_id();
        }
        // One lookup for the common case, a fresh id.
        loop {
            match s.pending.entry(msg.id) {
                Entry::Vacant(slot) => {
                    slot.insert(waiter);
                    break;
                }
                Entry::Occupied(_) => msg.id = tubeway_proto::fresh_id(),
            }
        }
        let pipelined = s.pending.len() > 1;
        drop(s);
        if sooner.is_some() {
            self.sweep_sooner.notify_one();
        }
        Ok((rx, pipelined, expires.is_some()))
    }

    /// The task that fails this connection's calls once their deadline
    /// has passed, for whoever runs the reader to spawn. One timer per
    /// connection, moved about once per timeout, instead of a timer armed
    /// and disarmed for every call: on a connection with many calls in
    /// flight that was a lock on the runtime's timer wheel twice per call.
    pub(crate) fn sweeper(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        self.swept.store(true, Ordering::Relaxed);
        let conn = self.clone();
        async move {
            let stopped = conn.stop.clone().cancelled_owned();
            tokio::pin!(stopped);
            loop {
                // Made before the deadline is read: a deadline moved sooner
                // after the read still wakes it (`notify_one` keeps a permit).
                let sooner = conn.sweep_sooner.notified();
                let next = conn.lock().next_sweep;
                tokio::select! {
                    biased;
                    () = &mut stopped => return,
                    () = sooner => continue,
                    () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)),
                        if next.is_some() => {}
                }
                conn.expire(Instant::now());
            }
        }
    }

    /// Fails the calls whose deadline is `now` or earlier, as if each
    /// caller had given up, and sets the next sweep.
    fn expire(&self, now: Instant) {
        let expired: Vec<Uuid> = {
            let mut s = self.lock();
            let mut next: Option<Instant> = None;
            let mut expired = Vec::new();
            for (id, w) in &s.pending {
                match w.expires {
                    Some(e) if e <= now => expired.push(*id),
                    Some(e) => next = Some(next.map_or(e, |n| n.min(e))),
                    None => {}
                }
            }
            s.next_sweep = next;
            expired
        };
        // Each as its caller would: an answer that came meanwhile still wins.
        for id in expired {
            self.remove_pending(id);
        }
    }

    /// Starts a call whose caller reads its answer itself, holding the
    /// reader, so that nothing needs registering: true when that is sound,
    /// no other call being in flight (none can then take its answer or its
    /// id); false to register it as usual.
    pub(crate) fn begin_unregistered(&self, msg: &Message) -> Result<bool> {
        let mut s = self.lock();
        if let Some(reason) = &s.closed {
            return Err(Error::ConnectionClosed(reason.clone()));
        }
        if !s.pending.is_empty() {
            return Ok(false);
        }
        s.unregistered = Some(msg.id);
        Ok(true)
    }

    /// Forgets call `id` begun unregistered and then not made after all:
    /// its message may start again as any other, with its id.
    pub(crate) fn unbegin(&self, id: Uuid) {
        let mut s = self.lock();
        if s.unregistered == Some(id) {
            s.unregistered = None;
        }
    }

    /// Registers a call begun unregistered whose answer its caller will
    /// now wait for as any other's: it must not have been read yet.
    pub(crate) fn register_sent(
        &self,
        id: Uuid,
        waits: Waits,
    ) -> Result<oneshot::Receiver<Box<Message>>> {
        let mut s = self.lock();
        if let Some(reason) = &s.closed {
            return Err(Error::ConnectionClosed(reason.clone()));
        }
        let (tx, rx) = oneshot::channel();
        // Vacant: no call registered meanwhile took this id.
        let waiter = Waiter {
            tx,
            waits,
            expires: None,
        };
        s.pending.insert(id, waiter);
        s.unregistered = None;
        Ok(rx)
    }

    /// Forgets a call once it has ended. A poll or an offer that ended
    /// unanswered (its caller gave up) is withdrawn at the broker, so that
    /// an offer given up is not queued later; a poll is remembered in case
    /// the broker had already sent it a message.
    pub(crate) fn remove_pending(&self, id: Uuid) {
        let withdraw = {
            let mut s = self.lock();
            let unanswered = s.pending.remove(&id);
            match unanswered.map(|w| w.waits) {
                _ if s.closed.is_some() => false,
                Some(Waits::Message(queue)) => {
                    s.abandon(id, queue);
                    self.can_cancel.load(Ordering::Relaxed)
                }
                Some(Waits::Room) => self.can_cancel.load(Ordering::Relaxed),
                Some(Waits::Nothing) | None => false,
            }
        };
        if withdraw {
            self.send_cancel(id);
        }
    }

    /// Forgets a call given up before its request was written: there is
    /// nothing to withdraw, and no answer will come.
    pub(crate) fn forget_pending(&self, id: Uuid) {
        let unsent = self.lock().pending.remove(&id);
        drop(unsent);
    }

    /// Waits until the answer to poll `id`, given up by its caller, is in
    /// (and its message, if any, on its way back to its queue), or can no
    /// longer come; at once if `id` is no such poll. What waits so keeps
    /// the connection read until then.
    pub(crate) async fn settled(&self, id: Uuid) {
        let (tx, rx) = oneshot::channel();
        match self.lock().abandoned.get_mut(&id) {
            Some(a) => a._settled = Some(tx),
            None => return,
        }
        let _ = rx.await;
    }

    /// Asks the broker to end the wait of request `id` at once; it then
    /// answers the request as if its wait had timed out (or with the
    /// message it had already taken for it).
    fn send_cancel(&self, id: Uuid) {
        let mut cancel = Message::new(MessageType::Cancel);
        cancel.correlation_id = Some(id);
        cancel.oneway = true;
        if let Ok(frame) = self.encode(&cancel) {
            self.send_soon(frame);
        }
    }

    /// Sends `frame` from a path that cannot wait (a drop): when the write
    /// queue is full, a task on the connection's runtime waits for room.
    pub(crate) fn send_soon(&self, frame: EncodedFrame) {
        if let Ok(Some(frame)) = self.writer.try_send_or_return(frame) {
            let writer = self.writer.clone();
            self.spawn_kept(async move {
                if writer.send(frame).await.is_ok() {
                    writer.drained().await;
                }
            });
        }
    }

    /// Sets how many calls of synchronous handlers may run at once.
    pub(crate) fn set_max_blocking_calls(&self, max: usize) {
        self.max_blocking_calls.store(max, Ordering::Relaxed);
    }

    /// See [`ClientOptions::handler_spin`](super::ClientOptions::handler_spin).
    pub(crate) fn set_handler_spin(&self, spin: Duration) {
        self.handlers.set_spin(spin);
    }

    #[cfg(test)]
    pub(crate) fn idle_handler_threads(&self) -> usize {
        self.handlers.sleeping()
    }

    #[cfg(test)]
    pub(crate) fn handler_threads_woken(&self) -> usize {
        self.handlers.woken()
    }

    #[cfg(test)]
    pub(crate) fn handler_threads(&self) -> usize {
        self.handlers.threads()
    }

    /// A place for one more call of a synchronous handler, held until
    /// dropped; none when as many run as may.
    fn blocking_call(self: &Arc<Self>) -> Option<BlockingCall> {
        let max = self.max_blocking_calls.load(Ordering::Relaxed);
        if self.blocking_calls.fetch_add(1, Ordering::AcqRel) >= max {
            self.blocking_calls.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(BlockingCall(self.clone()))
    }

    /// Sets what keeps the connection's runtime running (see
    /// [`keep_running`](Self::keep_running)); once.
    pub(crate) fn set_keep_running(&self, keep: KeepRunning) {
        let _ = self.keep_running.set(keep);
    }

    /// Spawns `task` on the connection's runtime, kept running until the
    /// task is done.
    pub(crate) fn spawn_kept(&self, task: impl Future<Output = ()> + Send + 'static) {
        let kept = self.keep_running.get().and_then(|keep| keep());
        drop(self.runtime.spawn(async move {
            let _kept = kept;
            task.await;
        }));
    }

    /// Sees frames left in the write queue written: a oneway message
    /// queued by a caller that then waits for nothing must not wait for the
    /// caller's next call to go out. At most one task at a time.
    pub(crate) fn flush_behind(&self) {
        if !self.writer.has_backlog() || self.flushing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (writer, flushing) = (self.writer.clone(), self.flushing.clone());
        self.spawn_kept(async move {
            loop {
                writer.drained().await;
                flushing.store(false, Ordering::Release);
                // A caller that queued more meanwhile left it to this task.
                if !writer.has_backlog() || flushing.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
        });
    }

    /// Routes deliveries correlated with `id` to `tx`.
    pub(crate) fn add_subscription(&self, id: Uuid, tx: mpsc::Sender<Message>) -> Result<()> {
        let mut s = self.lock();
        if let Some(reason) = &s.closed {
            return Err(Error::ConnectionClosed(reason.clone()));
        }
        s.subscriptions.insert(id, tx);
        Ok(())
    }

    /// Stops routing deliveries for `id`; whether the subscription was still active.
    pub(crate) fn remove_subscription(&self, id: Uuid) -> bool {
        let sub = self.lock().subscriptions.remove(&id);
        sub.is_some()
    }

    /// Routes requests correlated with `id` to `dispatch`.
    pub(crate) fn add_worker(&self, id: Uuid, dispatch: Dispatch) -> Result<()> {
        let mut s = self.lock();
        if let Some(reason) = &s.closed {
            return Err(Error::ConnectionClosed(reason.clone()));
        }
        s.workers.insert(id, dispatch);
        Ok(())
    }

    /// Whether requests for `id` are still routed to its handler.
    pub(crate) fn has_worker(&self, id: Uuid) -> bool {
        self.lock().workers.contains_key(&id)
    }

    /// Stops routing requests for `id`; whether the registration was still active.
    pub(crate) fn remove_worker(&self, id: Uuid) -> bool {
        let w = self.lock().workers.remove(&id);
        w.is_some()
    }

    /// Calls waiting for a response.
    #[cfg(test)]
    pub(crate) fn pending_len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether nothing on this connection waits for the broker: no call in
    /// flight, none given up whose answer may still come, no subscription,
    /// no served function. Only a close (or a stray answer) can arrive then.
    pub(crate) fn expects_nothing(&self) -> bool {
        let s = self.lock();
        s.pending.is_empty()
            && s.abandoned.is_empty()
            && s.subscriptions.is_empty()
            && s.workers.is_empty()
    }

    /// Whether frames wait to be written: the writer's task must run.
    pub(crate) fn write_backlog(&self) -> bool {
        self.writer.has_backlog()
    }

    /// Whether the connection is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }

    /// Completes once the connection is closed.
    pub(crate) fn stopped(&self) -> WaitForCancellationFutureOwned {
        self.stop.clone().cancelled_owned()
    }

    /// The error for a call on a closed connection.
    pub(crate) fn closed_error(&self) -> Error {
        let reason = self.lock().closed.clone();
        Error::ConnectionClosed(reason.unwrap_or_else(|| "the connection is closing".into()))
    }

    /// Closes the connection: fails every pending call, ends every
    /// subscription and worker, stops the reader, and lets the writer flush
    /// what is queued and shut the stream down. Idempotent.
    pub(crate) fn close(&self, reason: &str) {
        let (pending, subscriptions, workers, abandoned) = {
            let mut s = self.lock();
            if s.closed.is_some() {
                return;
            }
            s.closed = Some(reason.to_owned());
            (
                std::mem::take(&mut s.pending),
                std::mem::take(&mut s.subscriptions),
                std::mem::take(&mut s.workers),
                std::mem::take(&mut s.abandoned),
            )
        };
        self.writer.close();
        // A blocking call asleep on the socket for its answer (unregistered,
        // so not among `pending`) wakes and fails too.
        self.writer.stop_reading();
        // Dropped outside the lock: waking waiters must not contend on it.
        drop((pending, subscriptions, workers, abandoned));
        // Handlers running finish, and their threads end.
        self.handlers.close();
        self.stopping.store(true, Ordering::Release);
        self.stop.cancel();
    }
}

/// The queue of a poll.
pub(crate) fn poll_queue(msg: &Message) -> Option<&str> {
    (msg.r#type == MessageType::Poll)
        .then_some(msg.destination.as_deref())
        .flatten()
}

/// What a call waits for at the broker, which its caller's giving up
/// withdraws.
pub(crate) enum Waits {
    Nothing,
    /// An offer: room in its queue.
    Room,
    /// A poll: a message from this queue, which must not be lost if the
    /// caller is gone when it arrives.
    Message(String),
}

impl Waits {
    pub(crate) fn of(msg: &Message) -> Waits {
        match poll_queue(msg) {
            Some(queue) => Waits::Message(queue.to_owned()),
            None if msg.r#type == MessageType::Offer && msg.timeout.is_some() => Waits::Room,
            None => Waits::Nothing,
        }
    }

    /// A poll's queue.
    pub(crate) fn queue(&self) -> Option<&str> {
        match self {
            Waits::Message(queue) => Some(queue),
            _ => None,
        }
    }
}

/// Answers a call to a function this connection serves.
///
/// An async handler's call is answered right here when the handler
/// completes without waiting, as most do, else on a task of its own. A task
/// for every call would be scheduled on another of the runtime's threads
/// while this one reads, and wake it to run.
///
/// A synchronous handler runs on the connection's handler threads (see
/// [`Handlers`]), and the handler's thread sends the answer itself: handing
/// it back to a task would wake a thread of the runtime (the background
/// thread of a blocking client, often asleep) for every call.
fn serve_now(conn: Arc<Conn>, dispatch: Dispatch, req: Message) {
    // The connection's runtime: a blocking call reading its own answer
    // routes what comes before it outside any runtime, and a handler's
    // first poll, and the task it may need, need one.
    let runtime = conn.runtime.clone();
    let _context = runtime.enter();
    let oneway = req.oneway;
    match dispatch {
        Dispatch::Async(start) => {
            let reply = req.response(ResponseStatus::Ok);
            let mut call = Box::pin(async move {
                let outcome = start(req).await;
                if let Some(frame) = answer_frame(&conn, reply, oneway, outcome) {
                    let _ = conn.send_frame(frame).await;
                }
            });
            // Polled first with a waker that does nothing: a call that waits is
            // polled again by its task at once, and registers that task's waker then.
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            if call.as_mut().poll(&mut cx).is_pending() {
                tokio::spawn(call);
            }
        }
        Dispatch::Blocking(handler) => {
            let Some(place) = conn.blocking_call() else {
                refuse_busy(&conn, &req);
                return;
            };
            let reply = req.response(ResponseStatus::Ok);
            let pool = conn.clone();
            pool.handlers.run(Box::new(move |ready| {
                // As on the runtime's blocking pool, where handlers ran before.
                let _rt = conn.runtime.enter();
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(req)))
                        .map_err(|_| HandlerFailure::Panicked);
                // Free before the answer leaves: the broker may forward the
                // next call as soon as it has the answer, and this thread
                // is the one to run it.
                drop(place);
                ready.now();
                send_answer(&conn, reply, oneway, outcome);
            }));
        }
        Dispatch::Deferred(handler) => {
            let responder = Responder {
                conn: Some(conn),
                call: req.id,
                request_id: req.request_id.clone(),
                oneway,
            };
            // A panic drops the responder, which answers the call.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler(req, responder);
            }));
        }
    }
}

/// A running call of a synchronous handler (see [`Conn::blocking_call`]).
struct BlockingCall(Arc<Conn>);

impl Drop for BlockingCall {
    fn drop(&mut self) {
        self.0.blocking_calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers `unavailable` to a call that finds as many calls of synchronous
/// handlers running as may; a oneway one is dropped, and logged.
fn refuse_busy(conn: &Conn, req: &Message) {
    let max = conn.max_blocking_calls.load(Ordering::Relaxed);
    let reason = format!("the worker runs {max} calls of synchronous handlers already");
    if req.oneway {
        tracing::warn!("a oneway call was dropped: {reason}");
        return;
    }
    if let Ok(frame) = conn.encode(&req.error_response(ResponseStatus::Unavailable, reason)) {
        conn.send_soon(frame);
        conn.flush_behind();
    }
}

/// Sends the answer to a call from the thread its handler ended on.
fn send_answer(conn: &Conn, reply: Message, oneway: bool, outcome: Outcome) {
    if let Some(frame) = answer_frame(conn, reply, oneway, outcome) {
        conn.send_soon(frame);
        // What the stream did not take at once must go out even if the
        // worker stopped meanwhile, and with it the duty that drives a
        // blocking client's connection.
        conn.flush_behind();
    }
}

/// Answers one call of a function served by
/// [`AsyncClient::serve_deferred`](super::AsyncClient::serve_deferred),
/// once, from any thread: the answer is written by the thread that gives
/// it. Dropped unanswered, it answers `handler_error`, so no caller waits
/// for an answer that will not come.
#[must_use = "a dropped Responder answers the call with an error"]
pub struct Responder {
    /// Taken when answered.
    conn: Option<Arc<Conn>>,
    /// What the response needs of the request (kept small: a responder
    /// travels with the request to where it is handled).
    call: Uuid,
    request_id: Option<String>,
    oneway: bool,
}

impl Responder {
    /// Answers the call: with the message's payload, mimetype, charset and
    /// subject as the `ok` response, or with the error's `Display` as the
    /// reason of a `handler_error`. A oneway call gets nothing.
    pub fn answer(mut self, outcome: std::result::Result<Message, HandlerError>) {
        self.send(outcome);
    }

    /// Whether the caller expects no answer (a oneway call).
    pub fn is_oneway(&self) -> bool {
        self.oneway
    }

    fn send(&mut self, outcome: std::result::Result<Message, HandlerError>) {
        let Some(conn) = self.conn.take() else { return };
        let reply = Message::response_to(self.call, self.request_id.take(), ResponseStatus::Ok);
        send_answer(&conn, reply, self.oneway, Ok(outcome));
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.send(Err("the handler ended without answering the call".into()));
    }
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("call", &self.call)
            .field("answered", &self.conn.is_none())
            .field("oneway", &self.oneway)
            .finish()
    }
}

/// The frame that answers a call, `reply` filled in from the handler's
/// outcome; none for a oneway call.
fn answer_frame(
    conn: &Conn,
    mut reply: Message,
    oneway: bool,
    outcome: Outcome,
) -> Option<EncodedFrame> {
    let error = match outcome {
        Ok(Ok(out)) => {
            reply.subject = out.subject.clone();
            reply = reply.with_payload_of(&out);
            None
        }
        Ok(Err(e)) => Some(e.to_string()),
        Err(HandlerFailure::Panicked) => Some("handler panicked".to_owned()),
    };
    if oneway {
        if let Some(e) = error {
            tracing::warn!("handler failed on a oneway request: {e}");
        }
        return None;
    }
    if let Some(reason) = error {
        reply.response_status = Some(ResponseStatus::HandlerError);
        reply = reply.with_text(reason, MIME_TEXT, "utf-8");
    }
    match conn.encode(&reply) {
        Ok(frame) => Some(frame),
        Err(e) => {
            // The answer cannot be sent as is; tell the caller why instead.
            let status = e.status().unwrap_or(ResponseStatus::HandlerError);
            let mut r = Message::new(MessageType::Response);
            r.response_status = Some(status);
            r.correlation_id = reply.correlation_id;
            r.request_id = reply.request_id.take();
            let r = r.with_text(format!("response not sent: {e}"), MIME_TEXT, "utf-8");
            conn.encode(&r).ok()
        }
    }
}
