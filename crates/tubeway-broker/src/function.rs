//! Request/reply functions: handlers inside the broker process, and remote
//! workers (client connections that serve a function), chosen round-robin.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use tubeway_proto::ops::FunctionStatus;
use tubeway_proto::{Message, MessageType, ResponseStatus};
use uuid::Uuid;

use crate::broker::BrokerError;
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
    Sync(Arc<SyncFn>),
    Async(Arc<AsyncFn>),
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handler::Sync(_) => "Handler::Sync",
            Handler::Async(_) => "Handler::Async",
        })
    }
}

type Outcome = std::thread::Result<Result<Message, HandlerError>>;

impl Handler {
    /// Runs the handler, turning an error or a panic into a reason.
    async fn run(&self, req: Message) -> Result<Message, String> {
        let outcome = match self {
            Handler::Sync(f) => run_sync(f.as_ref(), req),
            Handler::Async(f) => {
                let f = f.clone();
                AssertUnwindSafe(async move { f(req).await })
                    .catch_unwind()
                    .await
            }
        };
        reason(outcome)
    }
}

fn run_sync(f: &SyncFn, req: Message) -> Outcome {
    std::panic::catch_unwind(AssertUnwindSafe(|| f(req)))
}

fn reason(outcome: Outcome) -> Result<Message, String> {
    match outcome {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!("handler panicked: {}", panic_text(&*panic))),
    }
}

/// Whether an answer says the call failed (a oneway call has none).
fn is_failure(answer: Option<&Message>) -> bool {
    answer.is_some_and(|r| r.response_status != Some(ResponseStatus::Ok))
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
// Returned and matched at once, never stored: boxing the answer would cost
// an allocation per call, where the request is boxed already.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Inline {
    /// The call ran; the response to send, if any.
    Done(Option<Message>),
    /// The function does not run inline: the request, back.
    NotInline(Box<Message>),
}

#[derive(Debug, Clone)]
pub(crate) struct WorkerRef {
    pub registration: Uuid,
    pub session: Arc<SessionShared>,
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
        }
    }

    /// Marks the function as no longer in the broker's table; called by
    /// whoever takes it out.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
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
    }

    /// Removes `conn`'s workers (those registered as `registration`, or all).
    /// Returns how many workers remain.
    pub fn remove_workers(&self, conn: u64, registration: Option<Uuid>) -> usize {
        let mut ws = lock(&self.workers);
        ws.retain(|w| !(w.session.id == conn && registration.is_none_or(|r| r == w.registration)));
        ws.len()
    }

    pub fn is_unserved(&self) -> bool {
        self.local.is_none() && lock(&self.workers).is_empty()
    }

    /// The next worker, round-robin.
    pub(crate) fn pick_worker(&self) -> Option<WorkerRef> {
        let ws = lock(&self.workers);
        if ws.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % ws.len();
        ws.get(i).cloned()
    }

    /// Calls the function. `Ok(None)` for a oneway call; otherwise the
    /// response to send to the caller (ok or `handler_error`).
    pub async fn call(&self, req: Message) -> Result<Option<Message>, BrokerError> {
        let result = self.dispatch(req).await;
        self.count(match &result {
            Ok(answer) => is_failure(answer.as_ref()),
            Err(_) => true,
        });
        result
    }

    /// [`call`](Self::call) without a future, for a function whose calls
    /// run inline on the caller's connection: a synchronous handler inside
    /// the broker, quick by contract. Any other function hands the request
    /// back.
    pub fn call_inline(&self, req: Box<Message>) -> Inline {
        let Some(Handler::Sync(f)) = &self.local else {
            return Inline::NotInline(req);
        };
        let caller = Caller::of(&req);
        let answer = self.local_answer(caller, reason(run_sync(f.as_ref(), *req)));
        self.count(is_failure(answer.as_ref()));
        Inline::Done(answer)
    }

    /// Counts a call that ended, and whether it failed.
    pub(crate) fn count(&self, failed: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The response to a call of the local handler from `caller`, made of
    /// what the handler gave (its payload and subject, moved, not copied).
    fn local_answer(&self, caller: Caller, out: Result<Message, String>) -> Option<Message> {
        if caller.oneway {
            if let Err(reason) = out {
                tracing::warn!(function = %self.name, %reason, "oneway call failed");
            }
            return None;
        }
        let mut r = Message::new(MessageType::Response);
        r.correlation_id = Some(caller.id);
        r.request_id = caller.request_id;
        Some(match out {
            Ok(m) => {
                r.response_status = Some(ResponseStatus::Ok);
                r.payload = m.payload;
                r.payload_mimetype = m.payload_mimetype;
                r.payload_charset = m.payload_charset;
                r.subject = m.subject;
                r
            }
            Err(reason) => {
                r.response_status = Some(ResponseStatus::HandlerError);
                r.with_text(reason, tubeway_proto::MIME_TEXT, "utf-8")
            }
        })
    }

    async fn dispatch(&self, req: Message) -> Result<Option<Message>, BrokerError> {
        if let Some(h) = &self.local {
            let caller = Caller::of(&req);
            let out = h.run(req).await;
            return Ok(self.local_answer(caller, out));
        }
        let worker = self.pick_worker().ok_or_else(|| {
            BrokerError::new(
                ResponseStatus::FunctionNotFound,
                format!("function {:?} has no workers", self.name),
            )
        })?;
        worker.session.forward_call(req, worker.registration).await
    }

    pub fn status(&self) -> FunctionStatus {
        FunctionStatus {
            name: self.name.clone(),
            local: self.local.is_some(),
            workers: lock(&self.workers).len() as u64,
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}
