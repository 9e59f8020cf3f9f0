//! Request/reply functions: handlers inside the broker process, and remote
//! workers (client connections that serve a function).
//!
//! A call goes to the worker that owes the fewest answers, round-robin
//! among equals: a worker that is slow, or hung, takes new calls only when
//! the others are as busy, instead of every n-th call waiting on it (what
//! plain round-robin does). A call that timed out still counts against its
//! worker until the worker answers it, so a hung worker does not look idle
//! again once its calls expire. Past [`SCAN_ALL`] workers, two candidates are
//! compared, not all (the power of two choices): nearly as even a spread,
//! and a pick that costs the same for any number of workers.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::FutureExt as _;
use tokio::sync::Notify;
use tubeway_proto::ops::FunctionStatus;
use tubeway_proto::{Message, MessageType, ResponseStatus};
use uuid::Uuid;

use crate::broker::BrokerError;
use crate::handlers::Handlers;
use crate::session::SessionShared;

/// The error a function handler returns; its `Display` becomes the reason of
/// the `handler_error` response.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The future an async function handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Message, HandlerError>> + Send>>;

type SyncFn = dyn Fn(Message) -> Result<Message, HandlerError> + Send + Sync;
type AsyncFn = dyn Fn(Message) -> HandlerFuture + Send + Sync;

#[derive(Clone)]
pub(crate) enum Handler {
    /// Runs on the reader of the caller's connection.
    Sync(Arc<SyncFn>),
    /// Runs on the reader until it first waits, then on a task.
    Async(Arc<AsyncFn>),
    /// Runs on the broker's handler threads (see [`crate::handlers`]),
    /// whose thread sends the answer.
    Blocking(Arc<SyncFn>),
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handler::Sync(_) => "Handler::Sync",
            Handler::Async(_) => "Handler::Async",
            Handler::Blocking(_) => "Handler::Blocking",
        })
    }
}

/// Workers up to which a call's pick looks at every one.
pub(crate) const SCAN_ALL: usize = 8;

/// A well-spread 64-bit hash of `x` (splitmix64's finaliser).
fn spread(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How a handler's run ended: what it gave, its error, or its panic.
type Outcome<T = Message> = std::thread::Result<Result<T, HandlerError>>;

impl Handler {
    /// Runs the handler, one that may block on a thread of `pool`; its
    /// error or panic is the outcome's.
    async fn run(&self, req: Message, pool: &Handlers) -> Outcome {
        match self {
            Handler::Sync(f) => std::panic::catch_unwind(AssertUnwindSafe(|| f(req))),
            Handler::Async(f) => {
                let f = f.clone();
                AssertUnwindSafe(async move { f(req).await })
                    .catch_unwind()
                    .await
            }
            Handler::Blocking(f) => {
                let (f, runtime) = (f.clone(), tokio::runtime::Handle::current());
                let (tx, ran) = tokio::sync::oneshot::channel();
                pool.run(Box::new(move |ready| {
                    let _rt = runtime.enter();
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| f(req)));
                    ready.now();
                    let _ = tx.send(outcome);
                }));
                ran.await
                    .unwrap_or_else(|_| Err(Box::new("the handler's thread ended")))
            }
        }
    }
}

/// Runs an async handler on `req` until it ends or first waits: then its
/// future, to go on with. What the handler gives is taken into `r` (see
/// [`Function::call_inline`]).
fn start_async(
    f: &AsyncFn,
    req: Box<Message>,
    r: Option<&mut Message>,
) -> Result<Outcome<()>, HandlerFuture> {
    let mut fut = match std::panic::catch_unwind(AssertUnwindSafe(|| f(*req))) {
        Ok(fut) => fut,
        Err(panic) => return Ok(Err(panic)),
    };
    // Polled with a waker that does nothing: a call that waits is polled
    // again by its task, which registers its own.
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    match std::panic::catch_unwind(AssertUnwindSafe(|| {
        fut.as_mut().poll(&mut cx).map(|given| {
            given.map(|mut m| {
                if let Some(r) = r {
                    take_answer(r, &mut m);
                }
            })
        })
    })) {
        Ok(Poll::Pending) => Err(fut),
        Ok(Poll::Ready(given)) => Ok(Ok(given)),
        Err(panic) => Ok(Err(panic)),
    }
}

/// Why a handler failed, for its `handler_error` answer or the log.
fn failure<T>(outcome: &Outcome<T>) -> Option<String> {
    match outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(panic) => Some(format!("handler panicked: {}", panic_text(&**panic))),
    }
}

/// Whether an answer says the call failed (a oneway call has none).
fn is_failure(answer: Option<&Message>) -> bool {
    answer.is_some_and(|r| r.response_status != Some(ResponseStatus::Ok))
}

/// Takes into `r`, a response, what a handler gave: its payload and text
/// fields, moved, not copied.
fn take_answer(r: &mut Message, m: &mut Message) {
    r.payload = std::mem::take(&mut m.payload);
    r.payload_mimetype = m.payload_mimetype.take();
    r.payload_charset = m.payload_charset.take();
    r.subject = m.subject.take();
}

/// Makes `r` the answer to `caller`: ok, with what [`take_answer`] took,
/// or why the handler failed.
fn finish_response<T>(r: &mut Message, caller: Caller, outcome: &Outcome<T>) {
    r.correlation_id = Some(caller.id);
    r.request_id = caller.request_id;
    match failure(outcome) {
        None => r.response_status = Some(ResponseStatus::Ok),
        Some(reason) => {
            r.response_status = Some(ResponseStatus::HandlerError);
            let text = Some(tubeway_proto::MIME_TEXT);
            r.set_payload(reason.into(), text, Some("utf-8"));
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// What the response to a local call needs of its request, which the
/// handler takes.
struct Caller {
    id: Uuid,
    request_id: Option<String>,
    oneway: bool,
}

impl Caller {
    fn of(req: &Message) -> Caller {
        Caller {
            id: req.id,
            request_id: req.request_id.clone(),
            oneway: req.oneway,
        }
    }
}

/// What [`Function::call_inline`] did.
pub(crate) enum Inline<R> {
    /// The call ran; what was made of its response (none for a oneway call).
    Done(Option<R>),
    /// The call's async handler waits: the rest of the call.
    Waits(Waiting),
    /// The call's handler may block: the call, to run on a handler thread.
    Blocking(BlockingCall),
    /// The function is served by workers: the request, back.
    Remote(Box<Message>),
}

/// A local call of a handler that may block, for a handler thread.
pub(crate) struct BlockingCall {
    handler: Arc<SyncFn>,
    req: Box<Message>,
    caller: Caller,
}

impl BlockingCall {
    /// Runs the handler on this thread, which may block; the response to
    /// send (none for a oneway call) and whether the call failed. Not
    /// counted: the call may have timed out meanwhile.
    pub fn run(self, f: &Function) -> (Option<Message>, bool) {
        let handler = self.handler;
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| handler(*self.req)));
        let answer = f.local_answer(self.caller, outcome);
        let failed = is_failure(answer.as_ref());
        (answer, failed)
    }
}

/// A local call whose async handler waited when first polled.
pub(crate) struct Waiting {
    fut: HandlerFuture,
    caller: Caller,
}

impl Waiting {
    /// Runs the handler to its end; the response to send (none for a
    /// oneway call). Counted as a call of `f` when it ends.
    pub async fn finish(self, f: &Function) -> Option<Message> {
        let outcome = AssertUnwindSafe(self.fut).catch_unwind().await;
        let answer = f.local_answer(self.caller, outcome);
        f.count(is_failure(answer.as_ref()));
        answer
    }
}

#[derive(Debug, Clone)]
pub(crate) struct WorkerRef {
    pub registration: Uuid,
    pub session: Arc<SessionShared>,
    /// The most calls its connection may owe of the functions it serves
    /// with a limit: while it owes this many, it is given no more of them
    /// (`ops::CreateFunction::max_calls`); no limit when `None`.
    pub max_calls: Option<usize>,
}

impl WorkerRef {
    /// The calls its connection owes; `usize::MAX` when it takes no more.
    fn load(&self) -> usize {
        match self.max_calls {
            Some(max) if self.session.owed_limited_calls() >= max => usize::MAX,
            _ => self.session.owed_calls(),
        }
    }
}

/// Whether a call counts against worker `w` from its pick until the worker
/// answers it: every call to be answered, and a oneway call to a worker
/// with a limit, which is forwarded as one to be answered (its answer is
/// dropped) so that it takes a place until it has run. A worker that runs
/// a limited number of calls would otherwise be given oneway calls beyond
/// them, which it could neither run nor refuse to anyone.
pub(crate) fn counts(oneway: bool, w: &WorkerRef) -> bool {
    !oneway || w.max_calls.is_some()
}

/// What [`Function::pick_worker`] found for a call.
#[derive(Debug)]
pub(crate) enum Pick {
    /// The worker to forward the call to.
    Worker(WorkerRef),
    /// Every worker owes as many calls as it takes, or calls wait for room
    /// already: the call waits its turn ([`Function::worker_with_room`]).
    Full,
    /// No worker serves the function.
    NoWorkers,
}

/// Why [`Function::worker_with_room`] found no worker.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unplaced {
    /// The deadline passed first.
    Timeout,
    /// The last worker left, or the function was removed.
    NoWorkers,
}

#[derive(Debug)]
pub(crate) struct Function {
    pub name: String,
    pub local: Option<Handler>,
    workers: Mutex<Vec<WorkerRef>>,
    next: AtomicUsize,
    calls: AtomicU64,
    errors: AtomicU64,
    /// Set once the function has left the broker's table (removed, or
    /// replaced): a session that kept it to skip the lookup looks again.
    retired: AtomicBool,
    /// Wakes calls that wait for a worker with room.
    room: Notify,
    /// Calls waiting for a worker with room; while any do, new calls queue
    /// behind them.
    waiting: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Function {
    fn with(name: String, local: Option<Handler>) -> Self {
        Function {
            name,
            local,
            workers: Mutex::default(),
            next: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            room: Notify::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Marks the function as no longer in the broker's table; called by
    /// whoever takes it out.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        // Calls waiting for room learn that they never get any.
        self.room.notify_waiters();
    }

    /// Whether the function has left the broker's table.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// A function served by a handler inside the broker process.
    pub fn local(name: String, handler: Handler) -> Self {
        Function::with(name, Some(handler))
    }

    /// A function served by remote workers only.
    pub fn remote(name: String) -> Self {
        Function::with(name, None)
    }

    pub fn add_worker(&self, w: WorkerRef) {
        lock(&self.workers).push(w);
        self.room_freed();
    }

    /// Removes `conn`'s workers (those registered as `registration`, or all).
    /// Returns how many workers remain.
    pub fn remove_workers(&self, conn: u64, registration: Option<Uuid>) -> usize {
        let left = {
            let mut ws = lock(&self.workers);
            ws.retain(|w| {
                !(w.session.id == conn && registration.is_none_or(|r| r == w.registration))
            });
            ws.len()
        };
        if left == 0 {
            // Calls waiting for room learn that no worker is left.
            self.room.notify_waiters();
        }
        left
    }

    /// A worker of the function may take a call more: the first call
    /// waiting for room looks again. (A permit kept when none waits makes
    /// the next one look once for nothing.)
    pub(crate) fn room_freed(&self) {
        self.room.notify_one();
    }

    pub fn is_unserved(&self) -> bool {
        self.local.is_none() && lock(&self.workers).is_empty()
    }

    /// The worker for a new call: of those looked at, the one owing the
    /// fewest answers, the first in round-robin order among equals; none
    /// that owes as many calls as it takes. While calls wait for room, a new
    /// call waits behind them. The call counts against the worker from here
    /// (see [`counts`]): picks for other functions of its connection, made
    /// meanwhile, see it.
    pub(crate) fn pick_worker(&self, oneway: bool) -> Pick {
        self.pick(true, None, |w| counts(oneway, w))
    }

    /// [`pick_worker`](Self::pick_worker) of a worker other than those of
    /// connection `conn`, for a call that one refused.
    pub(crate) fn pick_worker_except(&self, oneway: bool, conn: u64) -> Pick {
        self.pick(true, Some(conn), |w| counts(oneway, w))
    }

    /// [`pick_worker`](Self::pick_worker); `in_turn`: behind calls that
    /// wait; `except`: a connection whose workers are passed over;
    /// `counted`: whether the call counts against the worker picked.
    fn pick(
        &self,
        in_turn: bool,
        except: Option<u64>,
        counted: impl Fn(&WorkerRef) -> bool,
    ) -> Pick {
        let ws = lock(&self.workers);
        let n = ws.len();
        if n == 0 {
            return Pick::NoWorkers;
        }
        if in_turn && self.waiting.load(Ordering::Acquire) > 0 {
            return Pick::Full;
        }
        // Another function's pick may take the room between the look and
        // the count (this function's hold the lock): look again.
        for _ in 0..=n {
            match self.pick_from(&ws, except) {
                Some(w) if !counted(w) || w.session.owe_call(w.max_calls) => {
                    return Pick::Worker(w.clone());
                }
                Some(_) => {}
                None => return Pick::Full,
            }
        }
        Pick::Full
    }

    /// The worker with room that `ws` offers a call, if any, other than
    /// those of connection `except`.
    fn pick_from<'w>(&self, ws: &'w [WorkerRef], except: Option<u64>) -> Option<&'w WorkerRef> {
        let n = ws.len();
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        let first = turn % n;
        let load = |i: usize| match ws.get(i) {
            Some(w) if except != Some(w.session.id) => w.load(),
            _ => usize::MAX,
        };
        let least_of_all = || {
            (0..n)
                .map(|k| (first + k) % n)
                .min_by_key(|&i| load(i))
                .unwrap_or(first)
        };
        let best = if n <= SCAN_ALL {
            least_of_all()
        } else {
            // Another worker than the first, spread over all of them by a
            // hash of the turn.
            let skip = spread(turn as u64) % (n as u64 - 1);
            let other = (first + 1 + skip as usize) % n;
            match (load(first), load(other)) {
                // Both full: another may not be.
                (usize::MAX, usize::MAX) => least_of_all(),
                (a, b) if b < a => other,
                _ => first,
            }
        };
        ws.get(best).filter(|_| load(best) != usize::MAX)
    }

    /// Waits, in turn with other calls that wait, for a worker with room
    /// for a call, until `deadline` (none: for as long as the caller lets
    /// this future run).
    pub(crate) async fn worker_with_room(
        &self,
        deadline: Option<tokio::time::Instant>,
        oneway: bool,
    ) -> Result<WorkerRef, Unplaced> {
        struct Waits<'a>(&'a Function);
        impl Drop for Waits<'_> {
            fn drop(&mut self) {
                self.0.waiting.fetch_sub(1, Ordering::AcqRel);
                // A wake-up this call took and did not use goes on to the next.
                self.0.room_freed();
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waits = Waits(self);
        loop {
            // Listening before looking: room made after the look wakes it.
            let freed = self.room.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if self.is_retired() {
                return Err(Unplaced::NoWorkers);
            }
            match self.pick(false, None, |w| counts(oneway, w)) {
                Pick::Worker(w) => return Ok(w),
                Pick::NoWorkers => return Err(Unplaced::NoWorkers),
                Pick::Full => {}
            }
            match deadline {
                Some(at) => tokio::time::timeout_at(at, freed)
                    .await
                    .map_err(|_| Unplaced::Timeout)?,
                None => freed.await,
            }
        }
    }

    /// Calls the function. `Ok(None)` for a oneway call; otherwise the
    /// response to send to the caller (ok or `handler_error`).
    pub async fn call(
        &self,
        req: Message,
        pool: &Handlers,
    ) -> Result<Option<Message>, BrokerError> {
        let result = self.dispatch(req, pool).await;
        self.count(match &result {
            Ok(answer) => is_failure(answer.as_ref()),
            Err(_) => true,
        });
        result
    }

    /// [`call`](Self::call) on the caller's connection, without a future
    /// of its own, for a function served inside the broker: a synchronous
    /// handler runs to its end (quick by contract), an async one until it
    /// first waits. A call whose handler waits comes back as
    /// [`Inline::Waits`], to go on as a task; a function served by workers
    /// hands the request back.
    ///
    /// The response is handed to `answer` where it was made, by reference:
    /// every move of a message on the way out copies all of it, and those
    /// copies were a tenth of the broker's time on a call over shm.
    pub fn call_inline<R>(
        &self,
        req: Box<Message>,
        answer: impl FnOnce(&Message) -> R,
    ) -> Inline<R> {
        let Some(handler) = &self.local else {
            return Inline::Remote(req);
        };
        let caller = Caller::of(&req);
        match handler {
            Handler::Sync(f) => {
                if caller.oneway {
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| f(*req)));
                    return self.oneway_done(&outcome);
                }
                let mut r = Message::new(MessageType::Response);
                // What the handler gives is taken apart where it is
                // returned, inside the unwinding boundary: carried out of
                // it, it would be copied whole.
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| match f(*req) {
                    Ok(mut m) => {
                        take_answer(&mut r, &mut m);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }));
                self.answered(&mut r, caller, &outcome, answer)
            }
            Handler::Blocking(f) => Inline::Blocking(BlockingCall {
                handler: f.clone(),
                req,
                caller,
            }),
            Handler::Async(f) => {
                let mut r = (!caller.oneway).then(|| Message::new(MessageType::Response));
                let outcome = match start_async(f.as_ref(), req, r.as_mut()) {
                    Ok(outcome) => outcome,
                    Err(fut) => return Inline::Waits(Waiting { fut, caller }),
                };
                match r.as_mut() {
                    None => self.oneway_done(&outcome),
                    Some(r) => self.answered(r, caller, &outcome, answer),
                }
            }
        }
    }

    /// A oneway local call that ended: counted, and its failure logged.
    fn oneway_done<R, T>(&self, outcome: &Outcome<T>) -> Inline<R> {
        self.log_oneway_failure(outcome);
        self.count(false);
        Inline::Done(None)
    }

    /// A local call that ended: its response `r` finished, counted and
    /// handed to `answer`.
    fn answered<R, T>(
        &self,
        r: &mut Message,
        caller: Caller,
        outcome: &Outcome<T>,
        answer: impl FnOnce(&Message) -> R,
    ) -> Inline<R> {
        finish_response(r, caller, outcome);
        self.count(is_failure(Some(r)));
        Inline::Done(Some(answer(r)))
    }

    /// Counts a call that ended, and whether it failed.
    pub(crate) fn count(&self, failed: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The response to a call of the local handler from `caller`; `None`
    /// for a oneway call.
    fn local_answer(&self, caller: Caller, mut outcome: Outcome) -> Option<Message> {
        if caller.oneway {
            self.log_oneway_failure(&outcome);
            return None;
        }
        let mut r = Message::new(MessageType::Response);
        if let Ok(Ok(m)) = &mut outcome {
            take_answer(&mut r, m);
        }
        finish_response(&mut r, caller, &outcome);
        Some(r)
    }

    /// Logs a oneway call's failure: nobody else hears of it.
    fn log_oneway_failure<T>(&self, outcome: &Outcome<T>) {
        if let Some(reason) = failure(outcome) {
            tracing::warn!(function = %self.name, %reason, "oneway call failed");
        }
    }

    async fn dispatch(
        &self,
        req: Message,
        pool: &Handlers,
    ) -> Result<Option<Message>, BrokerError> {
        if let Some(h) = &self.local {
            let caller = Caller::of(&req);
            let outcome = h.run(req, pool).await;
            return Ok(self.local_answer(caller, outcome));
        }
        let worker = match self.pick_worker(req.oneway) {
            Pick::Worker(w) => w,
            // The caller's own timeout bounds the wait.
            Pick::Full => self
                .worker_with_room(None, req.oneway)
                .await
                .map_err(|_| self.no_workers())?,
            Pick::NoWorkers => return Err(self.no_workers()),
        };
        worker.session.forward_call(req, &worker).await
    }

    /// The error of a call that waited its whole timeout `t` for a worker
    /// with room: it never reached one.
    pub(crate) fn no_room_within(&self, t: std::time::Duration) -> BrokerError {
        BrokerError::new(
            ResponseStatus::Timeout,
            format!(
                "no worker of function {:?} had room for the call within {} ms",
                self.name,
                t.as_millis()
            ),
        )
    }

    /// The error of a call to a function no worker serves.
    pub(crate) fn no_workers(&self) -> BrokerError {
        BrokerError::new(
            ResponseStatus::FunctionNotFound,
            format!("function {:?} has no workers", self.name),
        )
    }

    pub fn status(&self) -> FunctionStatus {
        FunctionStatus {
            name: self.name.clone(),
            local: self.local.is_some(),
            workers: lock(&self.workers).len() as u64,
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::tests::session;
    use crate::{Broker, BrokerConfig};

    /// A remote function of `n` workers, each on a connection of its own,
    /// and the listeners those need.
    async fn workers(broker: &Broker, n: u64) -> (Arc<Function>, Vec<tubeway_transport::Listener>) {
        limited_workers(broker, &vec![None; n as usize]).await
    }

    /// [`workers`], each with the limit on its calls that `max_calls` gives.
    async fn limited_workers(
        broker: &Broker,
        max_calls: &[Option<usize>],
    ) -> (Arc<Function>, Vec<tubeway_transport::Listener>) {
        let f = Arc::new(Function::remote("f".into()));
        let mut listeners = Vec::new();
        for (id, max_calls) in max_calls.iter().enumerate() {
            let (s, l) = session(broker, id as u64).await;
            if max_calls.is_some() {
                s.limited_by(&f);
            }
            f.add_worker(WorkerRef {
                registration: Uuid::new_v4(),
                session: s,
                max_calls: *max_calls,
            });
            listeners.push(l);
        }
        (f, listeners)
    }

    /// The worker a call would go to, not counted against it.
    fn picked(f: &Function) -> Option<u64> {
        match f.pick(true, None, |_| false) {
            Pick::Worker(w) => Some(w.session.id),
            Pick::Full => None,
            Pick::NoWorkers => panic!("no workers"),
        }
    }

    /// Counts `calls` against `worker`, against its limit too if it has
    /// one (past it, as calls that timed out may).
    fn owe(f: &Function, worker: usize, calls: usize) {
        let ws = lock(&f.workers);
        let limit = ws[worker].max_calls.map(|_| usize::MAX);
        for _ in 0..calls {
            assert!(ws[worker].session.owe_call(limit));
        }
    }

    /// How many of `picks` calls went to each worker.
    fn tally(f: &Function, picks: usize) -> Vec<usize> {
        let ids: Vec<u64> = lock(&f.workers).iter().map(|w| w.session.id).collect();
        let mut seen = vec![0; ids.len()];
        for _ in 0..picks {
            let id = picked(f).expect("a worker with room");
            let i = ids.iter().position(|i| *i == id).unwrap();
            seen[i] += 1;
        }
        seen
    }

    #[tokio::test]
    async fn equal_workers_take_turns() {
        let broker = Broker::new(BrokerConfig::default());
        for n in [1, 3, SCAN_ALL as u64, 20] {
            let (f, _l) = workers(&broker, n).await;
            let picks = 10 * n as usize;
            assert_eq!(tally(&f, picks), vec![10; n as usize], "{n} workers");
        }
    }

    #[tokio::test]
    async fn the_worker_owing_fewest_answers_is_picked() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = workers(&broker, 3).await;
        owe(&f, 0, 2);
        owe(&f, 1, 1);
        assert_eq!(tally(&f, 5), vec![0, 0, 5]);
        // Equals again take turns.
        owe(&f, 2, 1);
        assert_eq!(tally(&f, 4), vec![0, 2, 2]);
    }

    #[tokio::test]
    async fn past_scan_all_a_busy_worker_loses_every_comparison() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = workers(&broker, 20).await;
        owe(&f, 7, 1);
        let seen = tally(&f, 2000);
        assert_eq!(seen[7], 0, "{seen:?}");
        // The rest still all get calls.
        assert!(
            seen.iter().enumerate().all(|(i, n)| i == 7 || *n > 0),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn no_workers_no_pick() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = workers(&broker, 0).await;
        assert!(matches!(f.pick_worker(false), Pick::NoWorkers));
    }

    #[tokio::test]
    async fn a_worker_owing_its_max_calls_is_passed_over() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = limited_workers(&broker, &[Some(1), Some(2)]).await;
        owe(&f, 0, 1);
        owe(&f, 1, 1);
        // Worker 0 is full; 1 has room for one more.
        assert_eq!(tally(&f, 3), vec![0, 3]);
        owe(&f, 1, 1);
        assert_eq!(picked(&f), None);
        // Past SCAN_ALL, two full candidates do not hide one with room.
        let mut limits = vec![Some(1); 20];
        limits[13] = None;
        let (f, _l) = limited_workers(&broker, &limits).await;
        for i in (0..20).filter(|i| *i != 13) {
            owe(&f, i, 1);
        }
        owe(&f, 13, 5);
        assert!((0..50).all(|_| picked(&f) == Some(13)));
    }

    #[tokio::test]
    async fn calls_without_a_limit_take_no_room_under_one() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = limited_workers(&broker, &[Some(1)]).await;
        let w = lock(&f.workers)[0].clone();
        // Calls of another function the connection serves without a limit.
        for _ in 0..5 {
            assert!(w.session.owe_call(None));
        }
        assert_eq!(picked(&f), Some(0));
        assert!(w.session.owe_call(Some(1)));
        assert_eq!(picked(&f), None);
        assert!(!w.session.owe_call(Some(1)));
        // An answer to one of the others makes no room.
        w.session.call_paid(false);
        assert_eq!(picked(&f), None);
        w.session.call_paid(true);
        assert_eq!(picked(&f), Some(0));
        assert_eq!(w.session.owed_calls(), 4);
    }

    #[tokio::test]
    async fn a_call_to_be_answered_counts_from_its_pick() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = limited_workers(&broker, &[Some(2), None]).await;
        let picks: Vec<_> = (0..4)
            .map(|_| match f.pick_worker(false) {
                Pick::Worker(w) => w.session.id,
                other => panic!("{other:?}"),
            })
            .collect();
        // Taking turns while they owe as much, until the first is full.
        assert_eq!(picks, [0, 1, 0, 1]);
        let owed: Vec<_> = lock(&f.workers)
            .iter()
            .map(|w| w.session.owed_calls())
            .collect();
        assert_eq!(owed, [2, 2]);
        assert_eq!(tally(&f, 3), vec![0, 3]);
        // A oneway call counts against a worker with a limit only.
        assert!(matches!(f.pick_worker(true), Pick::Worker(w) if w.session.id == 1));
        assert_eq!(lock(&f.workers)[1].session.owed_calls(), 2);
        lock(&f.workers)[0].session.call_paid(true);
        assert!(matches!(f.pick_worker(true), Pick::Worker(w) if w.session.id == 0));
        assert_eq!(lock(&f.workers)[0].session.owed_limited_calls(), 2);
        assert_eq!(picked(&f), Some(1));
    }

    #[tokio::test]
    async fn a_call_waits_for_room_and_in_turn() {
        let broker = Broker::new(BrokerConfig::default());
        let (f, _l) = limited_workers(&broker, &[Some(1)]).await;
        owe(&f, 0, 1);
        let short = tokio::time::Instant::now() + std::time::Duration::from_millis(50);
        assert_eq!(
            f.worker_with_room(Some(short), false).await.unwrap_err(),
            Unplaced::Timeout
        );
        let waiter = tokio::spawn({
            let f = f.clone();
            async move { f.worker_with_room(None, false).await.map(|w| w.session.id) }
        });
        while f.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        // A new call queues behind the waiting one, room or not.
        assert_eq!(picked(&f), None);
        let ws = lock(&f.workers).clone();
        ws[0].session.call_paid(true);
        assert_eq!(waiter.await.unwrap(), Ok(0));
        // It counts from its pick.
        assert_eq!(picked(&f), None);
        ws[0].session.call_paid(true);
        assert_eq!(picked(&f), Some(0));
        // The last worker leaving ends the wait.
        owe(&f, 0, 1);
        let waiter = tokio::spawn({
            let f = f.clone();
            async move { f.worker_with_room(None, false).await.map(|w| w.session.id) }
        });
        while f.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        f.remove_workers(0, None);
        assert_eq!(waiter.await.unwrap(), Err(Unplaced::NoWorkers));
    }
}
