//! One client connection: handshake, request dispatch, deliveries, clean-up.
//!
//! Requests that complete at once (publish, an offer with room, a poll that
//! finds a message, management) are handled in order on the reading task, so
//! pipelined publishes and offers keep their order. Requests that may wait (a
//! poll on an empty queue, an offer to a full one, a function call) run on
//! tasks of their own, so they never block the connection or the broker.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tubeway_proto::ops::{self, Hello, Welcome};
use tubeway_proto::{
    codec, Decoded, EncodedFrame, Message, MessageType, PayloadKind, ResponseStatus, MIME_JSON,
    MIME_TEXT, PROTOCOL_VERSION,
};
use tubeway_transport::{Connection, FrameReader, FrameWriter, ReadError, SpinGroup, WaitStrategy};
use uuid::Uuid;

use crate::access::{self, Identity};
use crate::broker::{check_name, queue_error, within, BrokerError, Inner};
use crate::forward::{self, Reply, Route, WorkerCalls};
use crate::function::{Function, Inline, Pick, Unplaced, WorkerRef};
use crate::queue::QueueError;
use crate::stats::{Counters, OwnCounter};

/// Largest per-subscriber buffer a client may ask for.
const MAX_SUBSCRIBER_BUFFER: u64 = 1 << 20;
/// How long a closing connection's writer may take to flush.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Capabilities this broker offers.
const CAPABILITIES: &[&str] = &[
    ops::CAP_PING,
    ops::CAP_WORKERS,
    ops::CAP_CANCEL,
    ops::CAP_REQUEUE,
];
/// How many of a connection's latest polls answered with a message it
/// remembers for `requeue`.
const HANDED_REMEMBERED: usize = 16;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a response needs to know of the request it answers.
#[derive(Debug, Clone)]
pub(crate) struct ReplyTo {
    pub id: Uuid,
    pub request_id: Option<String>,
    pub oneway: bool,
}

impl ReplyTo {
    fn of(m: &Message) -> Self {
        ReplyTo {
            id: m.id,
            request_id: m.request_id.clone(),
            oneway: m.oneway,
        }
    }

    fn response(&self, status: ResponseStatus) -> Message {
        Message::response_to(self.id, self.request_id.clone(), status)
    }

    fn error(&self, e: &BrokerError) -> Message {
        self.response(e.status)
            .with_text(e.reason.clone(), MIME_TEXT, "utf-8")
    }

    fn json<T: Serialize>(&self, body: &T) -> Message {
        let mut r = self.response(ResponseStatus::Ok);
        r.set_payload(
            serde_json::to_vec(body).unwrap_or_default().into(),
            Some(MIME_JSON),
            None,
        );
        r
    }
}

/// The part of a session other tasks hold: the way to write to the peer, and
/// the calls forwarded to it as a worker.
#[derive(Debug)]
pub(crate) struct SessionShared {
    pub id: u64,
    peer: String,
    inner: Arc<Inner>,
    writer: FrameWriter,
    /// Calls forwarded to this connection as a worker (see [`crate::forward`]).
    worker_calls: Mutex<WorkerCalls>,
    /// Calls forwarded to this connection as a worker that it has not
    /// answered yet, those that timed out included: the load by which
    /// the broker picks among a function's workers.
    owed: AtomicUsize,
    /// Of `owed`, the calls of functions this connection serves with a
    /// limit (`ops::CreateFunction::max_calls`): what the limit counts. A
    /// connection that serves some functions with synchronous handlers,
    /// limited by its threads, and others with async ones, not limited,
    /// takes calls of the first while the second's are in flight.
    owed_limited: AtomicUsize,
    /// The functions this connection serves with a limit on its calls:
    /// each answer it gives to one may let a call waiting for room go on.
    limited: Mutex<Vec<std::sync::Weak<Function>>>,
    /// Wakes the sweeper of `worker_calls` for a deadline sooner than the
    /// one it sleeps until.
    pub(crate) sweep_sooner: Notify,
    /// The runtime the connection is served on, which runs its sweeper: a
    /// task of the caller's would keep the caller's thread alive.
    pub(crate) runtime: tokio::runtime::Handle,
    /// Cancelled when the peer is gone: waiting requests stop at once.
    pub(crate) gone: CancellationToken,
    /// Set with `gone`: what every send checks (a look at the token takes
    /// a lock).
    is_gone: AtomicBool,
    /// Requests of this connection running on tasks of their own.
    inflight: Arc<Semaphore>,
    /// Polls and offers of this connection that wait, by request id, for
    /// `cancel` to withdraw.
    waiting: Mutex<HashMap<Uuid, CancellationToken>>,
    /// The latest messages handed to polls of this connection.
    handed: Mutex<Handed>,
    /// Messages read, counted by the connection's reader alone (what it
    /// sends its writer counts: see [`Traffic`](crate::stats::Traffic)).
    messages_in: OwnCounter,
}

/// The latest polls of a connection answered with a message, as (poll id,
/// message id, queue serial), oldest overwritten first. A `requeue` naming
/// one of them puts its message back at the head of the queue; any other
/// is offered, so that `requeue` cannot jump a queue or overfill one.
#[derive(Debug, Default)]
struct Handed {
    latest: [Option<(Uuid, Uuid, u64)>; HANDED_REMEMBERED],
    next: usize,
}

impl Handed {
    fn record(&mut self, poll: Uuid, message: Uuid, queue: u64) {
        if let Some(slot) = self.latest.get_mut(self.next) {
            *slot = Some((poll, message, queue));
        }
        self.next = (self.next + 1) % HANDED_REMEMBERED;
    }

    /// Whether `message` was handed to `poll` from `queue`; forgets it.
    fn take(&mut self, poll: Uuid, message: Uuid, queue: u64) -> bool {
        let entry = Some((poll, message, queue));
        match self.latest.iter_mut().find(|e| **e == entry) {
            Some(e) => {
                *e = None;
                true
            }
            None => false,
        }
    }
}

/// A waiting request's entry in [`SessionShared::waiting`], removed however
/// the request ends.
struct Waiting {
    shared: Arc<SessionShared>,
    id: Uuid,
    token: CancellationToken,
}

/// What [`SessionShared::send_now`] did.
pub(crate) enum SendNow {
    /// Written, or queued for writing.
    Sent,
    /// The writer's queue is full: the frame, to send by waiting.
    Full(EncodedFrame),
    /// The connection is gone.
    Gone,
}

impl SessionShared {
    /// The shared part of connection `id`, which writes with `writer`.
    /// Must be called within the runtime that serves the connection.
    pub(crate) fn new(id: u64, peer: String, inner: Arc<Inner>, writer: FrameWriter) -> Arc<Self> {
        let max_in_flight = inner.config.max_in_flight_per_connection;
        Arc::new(SessionShared {
            id,
            peer,
            inner,
            writer,
            worker_calls: Mutex::default(),
            owed: AtomicUsize::new(0),
            owed_limited: AtomicUsize::new(0),
            limited: Mutex::default(),
            sweep_sooner: Notify::new(),
            runtime: tokio::runtime::Handle::current(),
            gone: CancellationToken::new(),
            is_gone: AtomicBool::new(false),
            inflight: Arc::new(Semaphore::new(max_in_flight)),
            waiting: Mutex::default(),
            handed: Mutex::default(),
            messages_in: OwnCounter::default(),
        })
    }

    /// Messages read from the peer and accepted for it so far.
    pub(crate) fn traffic(&self) -> (u64, u64) {
        (self.messages_in.get(), self.writer.stats().accepted)
    }

    /// The peer is gone: sends fail, waiting requests stop.
    pub(crate) fn set_gone(&self) {
        self.is_gone.store(true, Ordering::Release);
        self.gone.cancel();
    }

    /// Whether the peer is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.is_gone.load(Ordering::Acquire)
    }

    fn waiting(self: &Arc<Self>, id: Uuid) -> Waiting {
        let token = CancellationToken::new();
        lock(&self.waiting).insert(id, token.clone());
        Waiting {
            shared: self.clone(),
            id,
            token,
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        lock(&self.shared.waiting).remove(&self.id);
    }
}

impl SessionShared {
    /// Sends `msg` to the peer: at once when it is the only thing this
    /// connection is doing, with the other answers in one system call when
    /// several requests run at the same time. False when the connection is gone.
    pub async fn send(&self, msg: &Message) -> bool {
        self.send_as(msg, self.pipelined()).await
    }

    /// Whether other requests of this connection are in flight beside the
    /// one being answered, which holds one permit: then answers go out
    /// together.
    fn pipelined(&self) -> bool {
        let max = self.inner.config.max_in_flight_per_connection;
        self.inflight.available_permits() + 1 < max
    }

    /// Sends `msg`, written with whatever else is queued when `batch`.
    pub async fn send_as(&self, msg: &Message, batch: bool) -> bool {
        if self.is_gone.load(Ordering::Acquire) {
            return false;
        }
        let Some(frame) = self.encode_out(msg) else {
            return true;
        };
        self.send_frame(frame, batch).await
    }

    /// [`send`](Self::send) of a message encoded already.
    async fn send_encoded(&self, frame: EncodedFrame) -> bool {
        if self.is_gone.load(Ordering::Acquire) {
            return false;
        }
        self.send_frame(frame, self.pipelined()).await
    }

    /// Sends `frame`, waiting while the writer's queue is full.
    async fn send_frame(&self, frame: EncodedFrame, batch: bool) -> bool {
        // Counted by the writer (see `Traffic`).
        // Tried without a future first: most frames go at once, and a
        // future made to send one is copied into this one's.
        let sent = match self.try_admit(frame, batch) {
            Ok(None) => Ok(()),
            Ok(Some(frame)) if batch => self.writer.send_batched(frame).await,
            Ok(Some(frame)) => self.writer.send(frame).await,
            Err(e) => Err(e),
        };
        sent.is_ok()
    }

    /// Whether a frame sent at once is a copy into shared memory, which
    /// costs the sender no system call.
    pub(crate) fn writes_to_memory(&self) -> bool {
        self.writer.writes_to_memory()
    }

    /// Sends `msg` if that needs no waiting, from code that cannot wait;
    /// with whatever else is queued when `batch`.
    pub(crate) fn send_now(&self, msg: &Message, batch: bool) -> SendNow {
        self.send_encoded_now(self.encode_out(msg), batch)
    }

    /// [`send_now`](Self::send_now) of a message encoded already
    /// ([`encode_out`](Self::encode_out)).
    fn send_encoded_now(&self, frame: Option<EncodedFrame>, batch: bool) -> SendNow {
        if self.is_gone.load(Ordering::Acquire) {
            return SendNow::Gone;
        }
        let Some(frame) = frame else {
            return SendNow::Sent;
        };
        match self.try_admit(frame, batch) {
            Ok(None) => SendNow::Sent,
            Ok(Some(frame)) => SendNow::Full(frame),
            Err(_) => SendNow::Gone,
        }
    }

    /// Hands `frame` to the writer if that needs no waiting; back if its
    /// queue is full.
    fn try_admit(
        &self,
        frame: EncodedFrame,
        batch: bool,
    ) -> Result<Option<EncodedFrame>, tubeway_transport::WriteError> {
        if batch {
            self.writer.try_send_batched_or_return(frame)
        } else {
            self.writer.try_send_or_return(frame)
        }
    }

    /// `msg` as a frame; for a response too large to send, the `too_large`
    /// answer that replaces it; `None` for anything else that cannot be sent.
    fn encode_out(&self, msg: &Message) -> Option<EncodedFrame> {
        let max = self.inner.config.max_message_size;
        match codec::encode(msg, max) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(peer = %self.peer, error = %e, "cannot encode outgoing message");
                if msg.r#type != MessageType::Response {
                    return None;
                }
                // The caller still gets an answer, just not the oversized one.
                let mut r = Message::new(MessageType::Response);
                r.correlation_id = msg.correlation_id;
                r.request_id.clone_from(&msg.request_id);
                r.response_status = Some(ResponseStatus::TooLarge);
                let r = r.with_text(format!("response not sent: {e}"), MIME_TEXT, "utf-8");
                codec::encode(&r, max).ok()
            }
        }
    }

    /// The message that answers `to` with `result`, counting errors; `None`
    /// for a oneway request, which gets nothing.
    fn answer_message(
        &self,
        to: &ReplyTo,
        result: Result<Message, BrokerError>,
    ) -> Option<Message> {
        let msg = match result {
            Ok(m) => m,
            Err(e) => {
                Counters::inc(&self.inner.counters.errors);
                tracing::debug!(peer = %self.peer, status = %e.status, reason = %e.reason, "refused");
                to.error(&e)
            }
        };
        (!to.oneway).then_some(msg)
    }

    /// [`answer`](Self::answer) from code that cannot wait: written at once
    /// if the writer has room, else by a task that waits for it.
    pub(crate) fn answer_now(self: &Arc<Self>, to: &ReplyTo, result: Result<Message, BrokerError>) {
        if let Some(msg) = self.answer_message(to, result) {
            self.send_answer_now(&msg);
        }
    }

    /// Sends `msg`, an answer, from code that cannot wait: written at once
    /// if the writer has room, else by a task that waits for it.
    pub(crate) fn send_answer_now(self: &Arc<Self>, msg: &Message) {
        let batch = self.pipelined();
        if let SendNow::Full(frame) = self.send_now(msg, batch) {
            let shared = self.clone();
            self.inner.tracker.spawn(async move {
                shared.send_frame(frame, batch).await;
            });
        }
    }

    pub(crate) fn worker_calls(&self) -> std::sync::MutexGuard<'_, WorkerCalls> {
        lock(&self.worker_calls)
    }

    /// Sends `reply`, counting errors; a oneway request gets nothing.
    async fn answer(&self, to: &ReplyTo, result: Result<Message, BrokerError>) -> bool {
        let Some(msg) = self.answer_message(to, result) else {
            return true;
        };
        self.send(&msg).await
    }

    /// Forwards a call from inside the broker's process to this
    /// connection, which serves the function as `worker`, and waits for its
    /// answer. Calls from clients go without waiting (see [`crate::forward`]).
    pub async fn forward_call(
        self: &Arc<Self>,
        req: Message,
        worker: &WorkerRef,
    ) -> Result<Option<Message>, BrokerError> {
        let caller = ReplyTo::of(&req);
        let limited = worker.max_calls.is_some();
        let answered = crate::function::counts(caller.oneway, worker);
        let mut fwd = req;
        fwd.id = tubeway_proto::fresh_id();
        fwd.correlation_id = Some(worker.registration);
        // Asked for an answer, which nobody waits for, if it counts.
        fwd.oneway = !answered;
        let fwd_id = fwd.id;
        let rx = if answered {
            let (tx, rx) = oneshot::channel();
            self.await_worker(fwd_id, Reply::Waiter(tx), limited);
            Some(rx)
        } else {
            None
        };
        // Removes the entry however this call ends (answer, timeout, caller
        // gone); a call given up before its request left, which the worker
        // will never answer, no longer counts against it.
        struct Pending<'a> {
            worker: &'a SessionShared,
            id: Uuid,
            owed_unsent: bool,
        }
        impl Drop for Pending<'_> {
            fn drop(&mut self) {
                if self.owed_unsent {
                    let limited = self.worker.worker_calls().unsent(&self.id);
                    self.worker.call_paid(limited);
                } else {
                    self.worker.worker_calls().remove(&self.id);
                }
            }
        }
        let mut pending = Pending {
            worker: self,
            id: fwd_id,
            owed_unsent: answered,
        };
        if !self.send(&fwd).await {
            return Err(forward::worker_gone());
        }
        pending.owed_unsent = false;
        let Some(rx) = rx.filter(|_| !caller.oneway) else {
            return Ok(None);
        };
        let mut resp = rx.await.map_err(|_| forward::worker_gone())?;
        forward::readdress(&mut resp, &caller);
        Ok(Some(resp))
    }

    /// Forwards a client's call to `worker` (see [`Session::forward`]);
    /// true when a task was spawned to finish the write.
    pub(crate) fn forward_to(self: &Arc<Self>, worker: WorkerRef, call: Forward) -> bool {
        let Forward {
            f,
            to,
            m,
            permit,
            expires,
            retries,
        } = call;
        let mut fwd = m;
        fwd.id = tubeway_proto::fresh_id();
        fwd.correlation_id = Some(worker.registration);
        let fwd_id = fwd.id;
        let limited = worker.max_calls.is_some();
        let answered = crate::function::counts(to.oneway, &worker);
        // Asked for an answer, dropped by the route, if it counts.
        fwd.oneway = !answered;
        let w = worker.session;
        // Encoded first: the route keeps the request itself.
        let frame = w.encode_out(&fwd);
        // A call that counts against its worker gives its reply address
        // and its slot to its route, until answered; a oneway one that does
        // not keeps them, the slot while its request waits for room.
        let oneway = if !answered {
            Some((to, permit))
        } else {
            let route = Route {
                caller: self.clone(),
                to,
                function: f.clone(),
                expires,
                _permit: permit,
                request: (fwd.payload.len() <= forward::KEPT_FOR_RETRY).then_some(fwd),
                retries,
            };
            w.await_worker(fwd_id, Reply::Route(route), limited);
            None
        };
        // A call with an answer is counted when that comes; a oneway one
        // once it is sent. Calls pipelined by their caller reach the worker
        // together, as their answers go back.
        match w.send_encoded_now(frame, self.pipelined()) {
            SendNow::Sent if oneway.is_some() => f.count(false),
            SendNow::Sent => {}
            SendNow::Full(frame) => {
                let caller = self.clone();
                self.inner.tracker.spawn(async move {
                    let sent = w.send_frame(frame, false).await;
                    let to = oneway.as_ref().map(|(to, _)| to);
                    if to.is_some() {
                        f.count(!sent);
                    }
                    if !sent {
                        forwarding_failed(&w, fwd_id, &caller, to);
                    }
                });
                return true;
            }
            SendNow::Gone => {
                let to = oneway.as_ref().map(|(to, _)| to);
                if to.is_some() {
                    f.count(true);
                }
                forwarding_failed(&w, fwd_id, self, to);
            }
        }
        false
    }

    /// Calls this connection owes as a worker (see [`Self::owed`]).
    pub(crate) fn owed_calls(&self) -> usize {
        self.owed.load(Ordering::Relaxed)
    }

    /// Calls this connection owes as a worker of functions it serves with
    /// a limit (see [`Self::owed_limited`]).
    pub(crate) fn owed_limited_calls(&self) -> usize {
        self.owed_limited.load(Ordering::Relaxed)
    }

    /// One more call owed by this worker connection; with `max`, a call of
    /// a function it serves with that limit, unless it owes `max` such
    /// calls already.
    pub(crate) fn owe_call(&self, max: Option<usize>) -> bool {
        if let Some(max) = max {
            let room = self
                .owed_limited
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                });
            if room.is_err() {
                return false;
            }
        }
        self.owed.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// One call fewer owed by this worker connection; when `limited`, one
    /// of a function it serves with a limit, so that a call waiting for
    /// room there may now go on.
    pub(crate) fn call_paid(&self, limited: bool) {
        // Saturating: a worker cannot owe less than nothing, however many
        // answers it makes up.
        let less = |n: usize| n.checked_sub(1);
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, less);
        if !limited {
            return;
        }
        let _ = self
            .owed_limited
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, less);
        for f in lock(&self.limited)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
        {
            f.room_freed();
        }
    }

    /// Notes that this connection serves `f` with a limit on its calls.
    pub(crate) fn limited_by(&self, f: &Arc<Function>) {
        let mut fs = lock(&self.limited);
        fs.retain(|w| w.strong_count() > 0);
        if !fs.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(f))) {
            fs.push(Arc::downgrade(f));
        }
    }

    fn worker_answered(&self, resp: Box<Message>) {
        // Any answer, a late one too, is a call the worker no longer works on.
        let (waiter, limited) = match resp.correlation_id {
            Some(c) => self.worker_calls().answered(&c),
            None => (None, false),
        };
        self.call_paid(limited);
        match waiter {
            Some(Reply::Waiter(tx)) => {
                let _ = tx.send(*resp);
            }
            Some(Reply::Route(route)) => route.answered(resp, self.id),
            // The call timed out or its caller left; nothing to do.
            None => tracing::debug!(peer = %self.peer, "response to no pending call"),
        }
    }
}

/// What the session must undo when it ends.
#[derive(Debug, Default)]
struct Owned {
    temporary_queues: Vec<String>,
    subscriptions: Vec<(String, Uuid)>,
    workers: Vec<(String, Uuid)>,
}

struct Session {
    /// A task was spawned on this thread since the last request was read:
    /// the reader must let it run before it spins for the next request.
    spawned: bool,
    inner: Arc<Inner>,
    shared: Arc<SessionShared>,
    identity: Identity,
    inflight: Arc<Semaphore>,
    owned: Owned,
    /// The function this connection called last: a client calling one
    /// function in a loop skips the table's lock, hash and reference count.
    last_function: Option<Arc<Function>>,
}

/// The function named `name`: `last` if it is that one and still in the
/// table, else looked up (and kept in `last`).
fn function<'a>(
    inner: &Inner,
    last: &'a mut Option<Arc<Function>>,
    name: Option<&str>,
) -> Result<&'a Arc<Function>, BrokerError> {
    let hit = matches!((&*last, name), (Some(f), Some(n)) if f.name == n && !f.is_retired());
    if !hit {
        *last = None;
    }
    match last {
        Some(f) => Ok(f),
        None => Ok(last.insert(inner.function(check_name(name)?)?)),
    }
}

/// Serves one connection until it closes or the broker shuts down; its
/// reader waits for requests by `wait`, in turn with the readers of `group`
/// if it has one.
pub(crate) async fn run(
    inner: Arc<Inner>,
    conn: Connection,
    wait: WaitStrategy,
    group: Option<&SpinGroup>,
) {
    let Connection {
        reader,
        writer,
        peer,
        ..
    } = conn;
    let id = inner.next_conn_id();
    Counters::inc(&inner.counters.connections_total);
    let live = inner.counters.connections.fetch_add(1, Ordering::Relaxed) + 1;
    writer.set_wait_strategy(&wait);
    let (writer, flusher) = FrameWriter::new(writer);
    let writer_task = tokio::spawn(flusher);
    let shared = SessionShared::new(id, peer.clone(), inner.clone(), writer);
    inner.traffic.join(&shared);
    // Last, once the writer is closed: however the task ends, its counts
    // join the closed connections'.
    let _retire = Retire(&inner, id);
    let mut reader = FrameReader::new(reader, inner.config.max_message_size);
    reader.set_wait_strategy(wait);
    if let Some(pool) = &inner.frame_pool {
        reader.recycle_large_frames(pool.clone());
    }
    if let Some(group) = group {
        reader.join_spin_group(group);
    }
    let over_limit = live > inner.config.max_connections as u64;

    if handshake(&inner, &shared, &mut reader, over_limit).await {
        tracing::debug!(conn = id, %peer, "connected");
        let mut session = Session {
            spawned: false,
            inner: inner.clone(),
            shared: shared.clone(),
            identity: Identity::anonymous(),
            inflight: shared.inflight.clone(),
            owned: Owned::default(),
            last_function: None,
        };
        session.serve(&mut reader).await;
        session.close().await;
    }
    shared.set_gone();
    shared.writer.close();
    drop(shared);
    drop(reader);
    // The writer flushes what is queued and ends; a peer that stopped
    // reading must not hold the task forever.
    let abort = writer_task.abort_handle();
    match tokio::time::timeout(FLUSH_TIMEOUT, writer_task).await {
        Ok(Ok(Err(e))) => tracing::debug!(conn = id, error = %e, "writer ended"),
        Err(_) => {
            abort.abort();
            tracing::debug!(conn = id, "writer did not flush in time");
        }
        _ => {}
    }
    inner.counters.connections.fetch_sub(1, Ordering::Relaxed);
    tracing::debug!(conn = id, %peer, "closed");
}

/// Retires a connection's message counts (see [`Traffic::retire`](crate::stats::Traffic::retire)).
struct Retire<'a>(&'a Inner, u64);

impl Drop for Retire<'_> {
    fn drop(&mut self) {
        self.0.traffic.retire(self.1);
    }
}

/// Reads `hello` and answers it. False when the connection must close,
/// counted as rejected.
async fn handshake(
    inner: &Inner,
    shared: &SessionShared,
    reader: &mut FrameReader,
    over_limit: bool,
) -> bool {
    // Counted before any refusal is written: a client that reads it may ask
    // for statistics at once.
    let mut rejected = Some(&inner.counters.connections_rejected);
    let mut reject = || {
        if let Some(c) = rejected.take() {
            Counters::inc(c);
        }
    };
    let first = tokio::select! {
        _ = inner.shutdown.cancelled() => {
            reject();
            return false;
        }
        r = tokio::time::timeout(inner.config.handshake_timeout, reader.next()) => r,
    };
    let hello = match first {
        Err(_) => {
            reject();
            tracing::info!(peer = %shared.peer, "no hello in time; closing");
            return false;
        }
        Ok(Ok(Some(Decoded::Message(m)))) => m,
        Ok(Ok(None)) => {
            reject();
            return false;
        }
        Ok(Ok(Some(other))) => {
            reject();
            tracing::warn!(peer = %shared.peer, frame = ?other, "bad first frame; closing");
            send_uncorrelated(shared, ResponseStatus::BadRequest, "expected hello").await;
            return false;
        }
        Ok(Err(e)) => {
            reject();
            report_read_error(shared, &e).await;
            return false;
        }
    };
    shared.messages_in.inc();
    let to = ReplyTo::of(&hello);
    let refuse = |status, reason: String| Err(BrokerError::new(status, reason));
    let outcome: Result<Welcome, BrokerError> = if hello.r#type != MessageType::Hello {
        refuse(
            ResponseStatus::BadRequest,
            format!("expected hello as the first frame, got {}", hello.r#type),
        )
    } else if over_limit {
        refuse(
            ResponseStatus::Unavailable,
            format!(
                "connection limit of {} reached",
                inner.config.max_connections
            ),
        )
    } else {
        match hello.data_payload_as::<Hello>() {
            Err(e) => refuse(ResponseStatus::BadRequest, format!("bad hello: {e}")),
            Ok(h) if h.min_version > PROTOCOL_VERSION || h.max_version < PROTOCOL_VERSION => {
                refuse(
                    ResponseStatus::UnsupportedVersion,
                    format!(
                        "client speaks versions {}..={}, this broker speaks {PROTOCOL_VERSION}",
                        h.min_version, h.max_version
                    ),
                )
            }
            Ok(h) => Ok(Welcome {
                version: PROTOCOL_VERSION,
                capabilities: h
                    .capabilities
                    .into_iter()
                    .filter(|c| CAPABILITIES.contains(&c.as_str()))
                    .collect(),
                max_message_size: inner.config.max_message_size as u64,
                server: inner.config.server_name.clone(),
                connection_id: shared.id,
            }),
        }
    };
    let ok = outcome.is_ok();
    if let Err(e) = &outcome {
        reject();
        tracing::info!(peer = %shared.peer, reason = %e.reason, "handshake refused");
    }
    if !shared.answer(&to, outcome.map(|w| to.json(&w))).await {
        reject();
        return false;
    }
    ok
}

async fn send_uncorrelated(shared: &SessionShared, status: ResponseStatus, reason: &str) {
    let mut r = Message::new(MessageType::Response);
    r.response_status = Some(status);
    let r = r.with_text(reason, MIME_TEXT, "utf-8");
    shared.send(&r).await;
}

async fn report_read_error(shared: &SessionShared, e: &ReadError) {
    match e {
        ReadError::Decode(d) => {
            Counters::inc(&shared.inner.counters.errors);
            tracing::warn!(peer = %shared.peer, error = %d, "protocol error; closing");
            send_uncorrelated(
                shared,
                ResponseStatus::BadRequest,
                &format!("protocol error: {d}; closing the connection"),
            )
            .await;
        }
        ReadError::UnexpectedEof(n) => {
            tracing::info!(peer = %shared.peer, partial = n, "peer closed mid-frame")
        }
        other => tracing::debug!(peer = %shared.peer, error = %other, "read ended"),
    }
}

fn deadline(m: &Message) -> Option<Instant> {
    m.timeout
        .filter(|t| !t.is_zero())
        .map(|t| Instant::now() + t)
}

impl Session {
    async fn serve(&mut self, reader: &mut FrameReader) {
        // Answers to requests that arrived together leave together: while
        // more of them are already read, the writer holds answers back.
        let mut corked = false;
        // Made once: a fresh `cancelled()` per request would register and
        // deregister a waiter every time.
        let shutdown = self.inner.shutdown.clone();
        let shutting_down = shutdown.cancelled();
        tokio::pin!(shutting_down);
        loop {
            if self.inner.shutting_down.load(Ordering::Acquire) {
                return self.drain(reader).await;
            }
            // The token is looked at only when no request is ready, and
            // polled (registering the task) once per wait: a reader that
            // spins in turn with others is pending on every look at its
            // stream, and the flag, set before the token is cancelled, is
            // cheaper to read.
            let item = {
                let mut next = std::pin::pin!(reader.next());
                let mut registered = false;
                let stopping = &self.inner.shutting_down;
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(r) = next.as_mut().poll(cx) {
                        return Poll::Ready(Some(r));
                    }
                    if stopping.load(Ordering::Acquire) {
                        return Poll::Ready(None);
                    }
                    if !std::mem::replace(&mut registered, true)
                        && shutting_down.as_mut().poll(cx).is_ready()
                    {
                        return Poll::Ready(None);
                    }
                    Poll::Pending
                })
                .await
            };
            let Some(item) = item else {
                return self.drain(reader).await;
            };
            let counted = &self.shared.messages_in;
            match item {
                Ok(Some(Decoded::Message(m))) => {
                    counted.inc();
                    let more = reader.has_buffered();
                    if more && !corked {
                        self.shared.writer.cork();
                        corked = true;
                    }
                    self.handle(m).await;
                    if !std::mem::take(&mut self.spawned) {
                        // Nothing here to run first: spin for the next one at once.
                        reader.skip_yield();
                    }
                    if !more && corked {
                        self.shared.writer.uncork();
                        corked = false;
                    }
                }
                Ok(Some(Decoded::Invalid { id, error, .. })) => {
                    counted.inc();
                    tracing::warn!(peer = %self.shared.peer, %error, "invalid frame");
                    if let Some(id) = id {
                        let to = ReplyTo {
                            id,
                            request_id: None,
                            oneway: false,
                        };
                        let e = BrokerError::bad_request(format!("invalid message: {error}"));
                        self.shared.answer(&to, Err(e)).await;
                    }
                }
                Ok(Some(Decoded::TooLarge {
                    id,
                    oneway,
                    frame_len,
                    max,
                    ..
                })) => {
                    counted.inc();
                    tracing::warn!(peer = %self.shared.peer, frame_len, max, "message too large; skipped");
                    if let Some(id) = id {
                        let to = ReplyTo {
                            id,
                            request_id: None,
                            oneway,
                        };
                        let e = BrokerError::new(
                            ResponseStatus::TooLarge,
                            format!("message is {frame_len} bytes; the maximum is {max}"),
                        );
                        self.shared.answer(&to, Err(e)).await;
                    }
                }
                Ok(Some(other)) => {
                    tracing::warn!(peer = %self.shared.peer, frame = ?other, "unhandled frame")
                }
                Ok(None) => return,
                Err(e) => {
                    report_read_error(&self.shared, &e).await;
                    return;
                }
            }
        }
    }

    /// During shutdown: keeps reading while calls forwarded to this
    /// connection (as a worker) await their answers, so they can finish;
    /// anything else is answered `unavailable`.
    async fn drain(&mut self, reader: &mut FrameReader) {
        let until = Instant::now() + self.inner.config.shutdown_timeout;
        while !self.shared.worker_calls().is_empty() {
            let item = tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                r = reader.next() => r,
            };
            match item {
                Ok(Some(Decoded::Message(m))) if m.r#type == MessageType::Response => {
                    self.shared.messages_in.inc();
                    self.shared.worker_answered(m);
                }
                Ok(Some(Decoded::Message(m))) => {
                    self.shared.messages_in.inc();
                    let to = ReplyTo::of(&m);
                    self.shared
                        .answer(&to, Err(BrokerError::shutting_down()))
                        .await;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }

    // Boxed all the way to where it is taken apart: each await point
    // holding a message by value would copy all of it into its future.
    async fn handle(&mut self, m: Box<Message>) {
        if m.r#type == MessageType::Response {
            self.shared.worker_answered(m);
            return;
        }
        let to = ReplyTo::of(&m);
        if let Err(e) = m.validate_payload() {
            let e = BrokerError::bad_request(e.to_string());
            self.shared.answer(&to, Err(e)).await;
            return;
        }
        if let Err(e) = access::authorize(&self.identity, m.r#type, m.destination.as_deref()) {
            self.shared.answer(&to, Err(e)).await;
            return;
        }
        let result = match m.r#type {
            MessageType::Request => return self.call(m).await,
            MessageType::Offer => return self.offer(m).await,
            MessageType::Requeue => return self.requeue(m).await,
            MessageType::Poll => return self.poll(m).await,
            MessageType::Subscribe => return self.subscribe(m).await,
            MessageType::Publish => return self.publish(m).await,
            _ => self.immediate(&to, *m),
        };
        self.shared.answer(&to, result).await;
    }

    /// Operations that complete without waiting.
    fn immediate(&mut self, to: &ReplyTo, m: Message) -> Result<Message, BrokerError> {
        let inner = &self.inner;
        let dest = || check_name(m.destination.as_deref());
        match m.r#type {
            MessageType::Ping => Ok(to.response(ResponseStatus::Ok)),
            MessageType::Cancel => {
                // Nothing to withdraw is no error: the request may have ended.
                if let Some(id) = m.correlation_id {
                    if let Some(t) = lock(&self.shared.waiting).get(&id) {
                        t.cancel();
                    }
                }
                Ok(to.response(ResponseStatus::Ok))
            }
            MessageType::Unsubscribe => {
                let name = dest()?;
                let removed = inner
                    .topic(name)?
                    .unsubscribe(Some(self.shared.id), m.correlation_id);
                self.owned
                    .subscriptions
                    .retain(|(t, id)| !(t == name && m.correlation_id.is_none_or(|c| c == *id)));
                if removed == 0 {
                    return Err(BrokerError::bad_request(format!(
                        "no such subscription to {name:?}"
                    )));
                }
                Ok(to.response(ResponseStatus::Ok))
            }
            MessageType::CreateQueue => {
                let body: ops::CreateQueue = body(&m)?;
                durable_unsupported(body.durable)?;
                Ok(to.json(&inner.create_queue(dest()?, body.capacity, body.kind, None)?))
            }
            MessageType::CreateTemporaryQueue => {
                let body: ops::CreateQueue = body(&m)?;
                durable_unsupported(body.durable)?;
                let name = format!("tmp.{}.{}", self.shared.id, Uuid::new_v4().simple());
                let status =
                    inner.create_queue(&name, body.capacity, body.kind, Some(self.shared.id))?;
                self.owned.temporary_queues.push(name);
                Ok(to.json(&status))
            }
            MessageType::RemoveQueue => {
                let name = dest()?;
                inner.remove_queue(name)?;
                self.owned.temporary_queues.retain(|q| q != name);
                Ok(to.response(ResponseStatus::Ok))
            }
            MessageType::QueueStatus => Ok(to.json(&inner.queue(dest()?)?.status())),
            MessageType::ExistsQueue => Ok(to.json(&ops::Exists {
                exists: inner.queue(dest()?).is_ok(),
            })),
            MessageType::ListQueues => Ok(to.json(&inner.list_queues())),
            MessageType::CreateTopic => Ok(to.json(&inner.create_topic(dest()?)?)),
            MessageType::RemoveTopic => {
                let name = dest()?;
                inner.remove_topic(name)?;
                self.owned.subscriptions.retain(|(t, _)| t != name);
                Ok(to.response(ResponseStatus::Ok))
            }
            MessageType::TopicStatus => Ok(to.json(&inner.topic(dest()?)?.status())),
            MessageType::ListTopics => Ok(to.json(&inner.list_topics())),
            MessageType::CreateFunction => {
                self.register_worker(&m)?;
                Ok(to.response(ResponseStatus::Ok))
            }
            MessageType::RemoveFunction => {
                let name = dest()?;
                if self.owned.workers.iter().any(|(f, _)| f == name) {
                    self.deregister_workers(name, m.correlation_id);
                } else {
                    inner.remove_function(name)?;
                }
                Ok(to.response(ResponseStatus::Ok))
            }
            MessageType::FunctionStatus => Ok(to.json(&inner.function(dest()?)?.status())),
            MessageType::ListFunctions => Ok(to.json(&inner.list_functions())),
            MessageType::Stats => Ok(to.json(&inner.stats())),
            other => Err(BrokerError::bad_request(format!(
                "{other} is not a request a client may send here"
            ))),
        }
    }

    /// Runs `op` on a task of its own, bounded by the connection's in-flight
    /// limit. An operation whose answer is awaited stops early if the peer goes
    /// away; a oneway one runs to completion, since nobody waits to see it.
    async fn spawn<F>(&mut self, to: ReplyTo, op: F)
    where
        F: Future<Output = Option<Result<Message, BrokerError>>> + Send + 'static,
    {
        if let Some(permit) = self.slot().await {
            self.spawn_in(Some(permit), to, op);
        }
    }

    /// One of the connection's in-flight slots; none once the session ends.
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.inflight.clone().try_acquire_owned() {
            return Some(permit);
        }
        // Answers held back to leave with those of the requests read with
        // this one go now: a slot may stay taken long after its call was
        // answered (by a blocking handler that outlasted its timeout).
        self.shared.writer.uncork();
        // Waiting here stops this connection's reads: back-pressure on a client
        // that floods requests it does not wait for.
        self.inflight.clone().acquire_owned().await.ok()
    }

    /// [`spawn`](Self::spawn) in a slot taken already, which the task holds
    /// if given it.
    fn spawn_in<F>(&mut self, permit: Option<OwnedSemaphorePermit>, to: ReplyTo, op: F)
    where
        F: Future<Output = Option<Result<Message, BrokerError>>> + Send + 'static,
    {
        let shared = self.shared.clone();
        self.spawned = true;
        self.inner.tracker.spawn(async move {
            let _permit = permit;
            let result = if to.oneway {
                op.await
            } else {
                tokio::select! {
                    _ = shared.gone.cancelled() => return,
                    r = op => r,
                }
            };
            if let Some(result) = result {
                shared.answer(&to, result).await;
            }
        });
    }

    async fn call(&mut self, m: Box<Message>) {
        let to = ReplyTo::of(&m);
        let f = match function(
            &self.inner,
            &mut self.last_function,
            m.destination.as_deref(),
        ) {
            Ok(f) => f,
            Err(e) => {
                self.shared.answer(&to, Err(e)).await;
                return;
            }
        };
        if m.is_expired() {
            let e = BrokerError::new(
                ResponseStatus::Expired,
                "request expired before it was handled",
            );
            self.shared.answer(&to, Err(e)).await;
            return;
        }
        // A local call that completes at once takes no task, no timer and
        // no future.
        let shared = &self.shared;
        let timeout = m.timeout;
        match f.call_inline(m, |r| shared.encode_out(r)) {
            Inline::Done(Some(Some(frame))) => {
                shared.send_encoded(frame).await;
            }
            Inline::Done(_) => {}
            Inline::Waits(call) => {
                let f = f.clone();
                self.spawn(to, async move {
                    match within(timeout, call.finish(&f)).await {
                        Ok(answer) => answer.map(Ok),
                        Err(e) => {
                            f.count(true);
                            Some(Err(e))
                        }
                    }
                })
                .await;
            }
            Inline::Blocking(call) => {
                let f = f.clone();
                let Some(permit) = self.slot().await else {
                    return;
                };
                // Started here, not by the task below: that task would first
                // have to be run, by a thread of the runtime woken for it.
                // The handler's thread sends the answer itself, for the same
                // reason; whichever ends the call first, the handler or the
                // timeout, answers it. The handler's thread holds the call's
                // slot: a handler cannot be stopped, and one that hangs must
                // not let its caller pile up more calls on the pool.
                let ended = Arc::new(AtomicBool::new(false));
                let (by_handler, counted) = (ended.clone(), f.clone());
                let shared = self.shared.clone();
                let runtime = tokio::runtime::Handle::current();
                let (done, run) = tokio::sync::oneshot::channel::<()>();
                self.inner.handlers.run(Box::new(move |ready| {
                    // An answer the connection cannot take at once is sent
                    // by a task of its runtime.
                    let _rt = runtime.enter();
                    let _done = done;
                    let _slot = permit;
                    let (answer, failed) = call.run(&counted);
                    // What is left does not block: the caller's next call,
                    // which the answer may bring at once, is this thread's.
                    ready.now();
                    if !by_handler.swap(true, Ordering::AcqRel) {
                        counted.count(failed);
                        if let Some(answer) = answer {
                            shared.send_answer_now(&answer);
                        }
                    }
                }));
                self.spawn_in(None, to, async move {
                    match within(timeout, run).await {
                        Err(e) if !ended.swap(true, Ordering::AcqRel) => {
                            f.count(true);
                            Some(Err(e))
                        }
                        _ => None,
                    }
                });
            }
            Inline::Remote(m) => {
                let f = f.clone();
                self.forward(f, to, m).await;
            }
        }
    }

    /// Forwards a client's call to one of the function's workers. The
    /// answer goes from the worker's connection straight to this one; no
    /// task waits for it (see [`crate::forward`]).
    async fn forward(&mut self, f: Arc<Function>, to: ReplyTo, m: Box<Message>) {
        // Back-pressure on a client that floods calls, as for requests that
        // run on tasks.
        let Some(permit) = self.slot().await else {
            return;
        };
        let expires = m
            .timeout
            .filter(|t| !t.is_zero())
            .and_then(|t| Instant::now().checked_add(t).map(|at| (at, t)));
        let call = Forward {
            f,
            to,
            m,
            permit,
            expires,
            retries: forward::RETRIES,
        };
        match call.f.pick_worker(call.to.oneway) {
            Pick::Worker(worker) => {
                if self.shared.forward_to(worker, call) {
                    self.spawned = true;
                }
            }
            Pick::NoWorkers => {
                call.f.count(true);
                let e = call.f.no_workers();
                self.shared.answer(&call.to, Err(e)).await;
            }
            Pick::Full => {
                // Rare, and long: a task waits for room, holding the slot.
                self.spawned = true;
                let shared = self.shared.clone();
                let shutdown = self.inner.shutdown.clone();
                self.inner.tracker.spawn(async move {
                    let deadline = call.expires.map(|(at, _)| at);
                    // A oneway call is delivered even if its caller leaves.
                    let placed = tokio::select! {
                        () = shared.gone.cancelled(), if !call.to.oneway => return,
                        () = shutdown.cancelled() => Err(None),
                        placed = call.f.worker_with_room(deadline, call.to.oneway) => placed.map_err(Some),
                    };
                    let e = match placed {
                        Ok(worker) => {
                            let mut call = call;
                            if let Some((at, _)) = call.expires {
                                // The worker has what is left of the timeout.
                                let left = at.saturating_duration_since(Instant::now());
                                call.m.timeout = Some(left.max(Duration::from_millis(1)));
                            }
                            shared.forward_to(worker, call);
                            return;
                        }
                        Err(Some(Unplaced::Timeout)) => call.f.no_room_within(
                            call.expires.map_or(Duration::ZERO, |(_, t)| t),
                        ),
                        Err(Some(Unplaced::NoWorkers)) => call.f.no_workers(),
                        Err(None) => BrokerError::shutting_down(),
                    };
                    call.f.count(true);
                    shared.answer(&call.to, Err(e)).await;
                });
            }
        }
    }

    /// The queue `m` names, or none once `to` is answered why.
    async fn queue_named_by(&self, m: &Message, to: &ReplyTo) -> Option<Arc<crate::queue::Queue>> {
        match check_name(m.destination.as_deref()).and_then(|n| self.inner.queue(n)) {
            Ok(q) => Some(q),
            Err(e) => {
                self.shared.answer(to, Err(e)).await;
                None
            }
        }
    }

    async fn offer(&mut self, mut m: Box<Message>) {
        let to = ReplyTo::of(&m);
        let Some(q) = self.queue_named_by(&m, &to).await else {
            return;
        };
        let wait_until = deadline(&m);
        // The offer's own options are not part of the queued message.
        m.timeout = None;
        m.oneway = false;
        let ok = |to: &ReplyTo| to.response(ResponseStatus::Ok);
        match q.offer_now(*m) {
            Ok(()) => {
                self.shared.answer(&to, Ok(ok(&to))).await;
            }
            Err((QueueError::Full, m)) if wait_until.is_some() => {
                let shutdown = self.inner.shutdown.clone();
                let to2 = to.clone();
                let waiting = self.shared.waiting(to.id);
                self.spawn(to, async move {
                    // The withdrawal first: room that appeared as it came
                    // must not take an offer its client has given up.
                    let r = tokio::select! {
                        biased;
                        () = waiting.token.cancelled() => Err(BrokerError::new(
                            ResponseStatus::QueueFull,
                            "offer withdrawn by the client",
                        )),
                        _ = shutdown.cancelled() => Err(BrokerError::shutting_down()),
                        r = q.offer(m, wait_until) => r.map(|()| ok(&to2)).map_err(|e| queue_error(&q.name, e)),
                    };
                    Some(r)
                })
                .await;
            }
            Err((e, _)) => {
                if e == QueueError::Full {
                    q.count_rejected();
                }
                self.shared.answer(&to, Err(queue_error(&q.name, e))).await;
            }
        }
    }

    /// A message handed to a poll of this connection whose caller had
    /// given up: back to the head of its queue if it is among the latest
    /// handed over here, offered otherwise.
    async fn requeue(&mut self, mut m: Box<Message>) {
        let to = ReplyTo::of(&m);
        let Some(q) = self.queue_named_by(&m, &to).await else {
            return;
        };
        let handed = m
            .correlation_id
            .is_some_and(|poll| lock(&self.shared.handed).take(poll, m.id, q.serial));
        // Back as it was queued: the poll's answer had replaced these.
        m.r#type = MessageType::Offer;
        m.correlation_id = None;
        if !handed {
            return self.offer(m).await;
        }
        m.timeout = None;
        m.oneway = false;
        q.requeue(*m);
        self.shared
            .answer(&to, Ok(to.response(ResponseStatus::Ok)))
            .await;
    }

    async fn poll(&mut self, m: Box<Message>) {
        let to = ReplyTo {
            oneway: false,
            ..ReplyTo::of(&m)
        };
        let Some(q) = self.queue_named_by(&m, &to).await else {
            return;
        };
        match q.poll_now() {
            Ok(found) => deliver_polled(&self.shared, &q, &to, found).await,
            Err(QueueError::Empty) if deadline(&m).is_some() => {
                let wait_until = deadline(&m);
                let shared = self.shared.clone();
                let shutdown = self.inner.shutdown.clone();
                let to2 = to.clone();
                let waiting = self.shared.waiting(to.id);
                self.spawn(to, async move {
                    let r = tokio::select! {
                        biased;
                        () = waiting.token.cancelled() => return Some(Err(BrokerError::new(
                            ResponseStatus::QueueEmpty,
                            "poll withdrawn by the client",
                        ))),
                        _ = shutdown.cancelled() => return Some(Err(BrokerError::shutting_down())),
                        r = q.poll(wait_until) => r,
                    };
                    match r {
                        // Withdrawn while the message was being taken: it
                        // goes back rather than to a poller that gave up.
                        Ok(found) if waiting.token.is_cancelled() => {
                            q.requeue(found);
                            None
                        }
                        Ok(found) => {
                            deliver_polled(&shared, &q, &to2, found).await;
                            None
                        }
                        Err(e) => Some(Err(queue_error(&q.name, e))),
                    }
                })
                .await;
            }
            Err(e) => {
                self.shared.answer(&to, Err(queue_error(&q.name, e))).await;
            }
        }
    }

    /// Publishes to a topic. The publisher is answered first: its answer
    /// says the broker took the message, and the deliveries, which may have
    /// to wake sleeping subscribers, then cost it no time.
    async fn publish(&mut self, mut m: Box<Message>) {
        let to = ReplyTo::of(&m);
        let topic = match check_name(m.destination.as_deref()).and_then(|n| self.inner.topic(n)) {
            Ok(topic) if !m.is_expired() => topic,
            refused => {
                let e = refused.err().unwrap_or_else(|| {
                    BrokerError::new(
                        ResponseStatus::Expired,
                        "message expired before it was published",
                    )
                });
                self.shared.answer(&to, Err(e)).await;
                return;
            }
        };
        self.shared
            .answer(&to, Ok(to.response(ResponseStatus::Ok)))
            .await;
        m.timeout = None;
        m.oneway = false;
        topic.publish(&m);
    }

    async fn subscribe(&mut self, m: Box<Message>) {
        let to = ReplyTo::of(&m);
        let result = (|| {
            let name = check_name(m.destination.as_deref())?;
            let topic = self.inner.topic(name)?;
            let buffer = if m.payload_kind() == PayloadKind::Data {
                body::<ops::Subscribe>(&m)?.buffer
            } else {
                None
            };
            let buffer = buffer
                .unwrap_or(self.inner.config.subscriber_buffer as u64)
                .clamp(1, MAX_SUBSCRIBER_BUFFER) as usize;
            Ok((topic, buffer))
        })();
        let (topic, buffer) = match result {
            Ok(x) => x,
            Err(e) => {
                self.shared.answer(&to, Err(e)).await;
                return;
            }
        };
        let sub = topic.subscribe_client(m.id, &self.shared, buffer);
        self.owned.subscriptions.push((topic.name.clone(), m.id));
        // The answer is queued before any delivery, so the client knows the
        // subscription before its first message arrives.
        self.shared
            .answer(&to, Ok(to.response(ResponseStatus::Ok)))
            .await;
        let shared = self.shared.clone();
        self.spawned = true;
        self.inner.tracker.spawn(async move {
            let crate::topic::Subscribed { mut rx, queued } = sub;
            // The answer is out: deliveries may now skip the buffer once it
            // is empty.
            queued.fetch_sub(1, Ordering::AcqRel);
            while let Some(d) = rx.recv().await {
                // More deliveries right behind: they leave together.
                let sent = shared.send_as(&d, !rx.is_empty()).await;
                queued.fetch_sub(1, Ordering::AcqRel);
                if !sent {
                    break;
                }
            }
        });
    }

    fn register_worker(&mut self, m: &Message) -> Result<(), BrokerError> {
        let name = check_name(m.destination.as_deref())?;
        let max_calls = if m.payload_kind() == PayloadKind::Data {
            match body::<ops::CreateFunction>(m)?.max_calls {
                Some(0) => return Err(BrokerError::bad_request("max_calls must be at least 1")),
                Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                None => None,
            }
        } else {
            None
        };
        let registration = m.id;
        let mut fs = self
            .inner
            .functions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let f = fs
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Function::remote(name.to_owned())));
        if f.local.is_some() {
            return Err(BrokerError::new(
                ResponseStatus::Conflict,
                format!("function {name:?} is served inside the broker"),
            ));
        }
        if max_calls.is_some() {
            self.shared.limited_by(f);
        }
        f.add_worker(WorkerRef {
            registration,
            session: self.shared.clone(),
            max_calls,
        });
        self.owned.workers.push((name.to_owned(), registration));
        Ok(())
    }

    fn deregister_workers(&mut self, name: &str, registration: Option<Uuid>) {
        let mut fs = self
            .inner
            .functions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = fs.get(name) {
            if f.remove_workers(self.shared.id, registration) == 0 && f.is_unserved() {
                if let Some(f) = fs.remove(name) {
                    f.retire();
                }
            }
        }
        self.owned
            .workers
            .retain(|(f, r)| !(f == name && registration.is_none_or(|x| x == *r)));
    }

    /// Undoes everything the connection set up.
    async fn close(mut self) {
        if self.inner.shutdown.is_cancelled() {
            // Graceful: let this connection's in-flight requests finish first.
            let all = self.inner.config.max_in_flight_per_connection as u32;
            let _ = tokio::time::timeout(
                self.inner.config.shutdown_timeout,
                self.inflight.acquire_many(all),
            )
            .await;
        }
        self.shared.set_gone();
        for q in std::mem::take(&mut self.owned.temporary_queues) {
            let _ = self.inner.remove_queue(&q);
        }
        for (t, id) in std::mem::take(&mut self.owned.subscriptions) {
            if let Ok(topic) = self.inner.topic(&t) {
                topic.unsubscribe(Some(self.shared.id), Some(id));
            }
        }
        let names: Vec<String> = self.owned.workers.iter().map(|(f, _)| f.clone()).collect();
        for f in names {
            self.deregister_workers(&f, None);
        }
        // Callers waiting on this worker get "worker disconnected".
        self.shared.fail_worker_calls();
    }
}

/// A client's call on its way to a worker.
pub(crate) struct Forward {
    pub f: Arc<Function>,
    pub to: ReplyTo,
    pub m: Box<Message>,
    /// The caller's in-flight slot, held until the call is answered.
    pub permit: OwnedSemaphorePermit,
    /// When the call times out, and its timeout.
    pub expires: Option<(Instant, Duration)>,
    /// How many more times the call may go to another worker if refused.
    pub retries: u8,
}

/// A call whose request could not reach worker `w` fails: a oneway one
/// (`oneway`, its reply address) is counted, one with an answer is answered
/// unless the worker's end did so already.
fn forwarding_failed(
    w: &SessionShared,
    fwd_id: Uuid,
    caller: &Arc<SessionShared>,
    oneway: Option<&ReplyTo>,
) {
    if let Some(to) = oneway {
        caller.answer_now(to, Err(forward::worker_gone()));
        return;
    }
    let owed = w.worker_calls().remove(&fwd_id);
    if let Some(Reply::Route(route)) = owed {
        route.failed(forward::worker_gone());
    }
}

/// Hands a polled message to the poller; if the poller is gone, the message
/// goes back to the head of the queue rather than being lost.
async fn deliver_polled(
    shared: &SessionShared,
    q: &crate::queue::Queue,
    to: &ReplyTo,
    mut found: Message,
) {
    // Sent as the answer itself, and put back as it was if it cannot be:
    // a copy kept for that would cost its strings each time.
    let kept = (found.r#type, found.response_status, found.correlation_id);
    lock(&shared.handed).record(to.id, found.id, q.serial);
    found.r#type = MessageType::Response;
    found.response_status = Some(ResponseStatus::Ok);
    found.correlation_id = Some(to.id);
    if !shared.send(&found).await {
        (found.r#type, found.response_status, found.correlation_id) = kept;
        q.requeue(found);
    }
}

fn body<T: serde::de::DeserializeOwned>(m: &Message) -> Result<T, BrokerError> {
    m.data_payload_as()
        .map_err(|e| BrokerError::bad_request(format!("bad {} body: {e}", m.r#type)))
}

fn durable_unsupported(durable: bool) -> Result<(), BrokerError> {
    if durable {
        return Err(BrokerError::bad_request(
            "durable queues are not available in this broker yet",
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use tubeway_proto::ops::QueueKind;
    use tubeway_transport::{Listener, Url};

    use super::*;
    use crate::{Broker, BrokerConfig};

    /// A connection's shared part over an in-process pipe, and the pipe's
    /// listener, which must live as long as it.
    pub(crate) async fn session(broker: &Broker, id: u64) -> (Arc<SessionShared>, Listener) {
        session_at(
            broker,
            id,
            Url::Mem(format!("session-test-{}", Uuid::new_v4())),
        )
        .await
    }

    /// [`session`] over the transport of `url`.
    pub(crate) async fn session_at(
        broker: &Broker,
        id: u64,
        url: Url,
    ) -> (Arc<SessionShared>, Listener) {
        let listener = Listener::bind(&url).await.unwrap();
        let conn = tubeway_transport::connect(&url).await.unwrap();
        let (writer, flusher) = FrameWriter::new(conn.writer);
        tokio::spawn(flusher);
        let shared = SessionShared::new(id, "test".into(), broker.inner.clone(), writer);
        (shared, listener)
    }

    /// A call forwarded from inside the process and given up while its
    /// request waits for room never reaches the worker, which will never
    /// answer it: it must not count against the worker for good.
    #[tokio::test]
    async fn a_forwarded_call_given_up_before_it_left_is_not_owed() {
        let broker = Broker::new(BrokerConfig::default());
        // Nobody reads the far end: the worker's writes fill up.
        let (worker, _listener) = session(&broker, 1).await;
        let to_worker = |max_calls| WorkerRef {
            registration: Uuid::new_v4(),
            session: worker.clone(),
            max_calls,
        };
        let big = Message::binary(vec![0u8; 1 << 20], None);
        let mut waits = false;
        for _ in 0..1000 {
            let mut m = big.clone();
            m.oneway = true;
            let to = to_worker(None);
            let send = worker.forward_call(m, &to);
            if tokio::time::timeout(Duration::from_millis(50), send)
                .await
                .is_err()
            {
                waits = true;
                break;
            }
        }
        assert!(waits, "the worker's writes never filled up");
        // As a pick does, for a call to be answered, with a limit or not.
        for max_calls in [None, Some(1)] {
            assert!(worker.owe_call(max_calls));
            let to = to_worker(max_calls);
            let call = worker.forward_call(big.clone(), &to);
            assert!(tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err());
            assert_eq!(worker.owed_calls(), 0);
            assert_eq!(worker.owed_limited_calls(), 0);
            assert!(worker.worker_calls().is_empty());
            assert_eq!(worker.worker_calls().limited_len(), 0);
        }
    }

    #[tokio::test]
    async fn a_polled_message_that_cannot_be_delivered_goes_back_as_it_was() {
        let broker = Broker::new(BrokerConfig::default());
        broker.create_queue("q", 10, QueueKind::Bounded).unwrap();
        let q = broker.inner.queue("q").unwrap();
        let mut offered = Message::plain_text("kept").with_subject("s");
        offered.r#type = MessageType::Offer;
        offered.correlation_id = Some(Uuid::new_v4());
        q.offer_now(offered.clone()).unwrap();

        let (poller, _listener) = session(&broker, 1).await;
        poller.set_gone();
        let to = ReplyTo {
            id: Uuid::new_v4(),
            request_id: None,
            oneway: false,
        };
        deliver_polled(&poller, &q, &to, q.poll_now().unwrap()).await;

        let back = q.poll_now().unwrap();
        assert_eq!(back.r#type, MessageType::Offer);
        assert_eq!(back.response_status, None);
        assert_eq!(back.correlation_id, offered.correlation_id);
        assert_eq!((back.id, back.timestamp), (offered.id, offered.timestamp));
        assert_eq!(back.payload, offered.payload);
        assert_eq!(back.subject, offered.subject);
    }
}
