//! The blocking client, for code without an async runtime.
//!
//! Each [`Client`] has a runtime of its own, a single-threaded one that has
//! no thread of its own either: the thread that waits for a call drives the
//! connection itself. It writes the request, takes the connection's reader,
//! sleeps in the kernel (or spins, by [`ClientOptions::wait`]) until the
//! response is readable, reads it and returns, so a round trip costs what a
//! hand-written ping-pong costs: no hand-off to an I/O thread, no second
//! wake-up, no task switch. A call with no other in flight is not even
//! registered for its answer: its thread writes it and reads the answer
//! itself, spinning on the connection or, when the reader does not spin,
//! asleep in `poll(2)` on the socket alone (not the runtime's reactor), and
//! registers it only if the spin ends first (or, asleep, if other messages
//! come first). A response that arrives so is taken without entering the
//! runtime's scheduler or arming a timer. While several
//! threads call at once, the one holding the reader reads for all and wakes
//! the others as their responses arrive; when it is done, another takes
//! over. While something must be served with nobody calling (a [`Worker`],
//! a [`SubscriptionHandle`], a [`ResponseFuture`] not yet waited for), a
//! background thread holds the reader instead.
//!
//! Every call is bounded by a timeout, as in [`AsyncClient`], and a wait
//! can be cut short from outside: inside [`interruptible`], it asks a check
//! of the caller's at a set interval (Ctrl-C, for a language binding).
//! Calling from inside an async runtime fails with [`Error::Runtime`]
//! instead of blocking one of its threads: use [`AsyncClient`] there. The
//! synchronous handlers of [`Client::serve`] and [`Client::subscribe_with`]
//! run on blocking threads and may use the blocking client.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tubeway_proto::{ops, Message};
use tubeway_transport::Url;
use uuid::Uuid;

use super::connection::{Conn, Waits};
use super::slot::{Held, ReaderSlot};
use super::{function_call, AsyncClient, ClientOptions, HandlerError, Started};
use crate::{Error, Result};

/// How long dropping the last handle of a client may wait for what it
/// queued (oneway sends, say) to be written.
const DROP_FLUSH: Duration = Duration::from_secs(2);

/// The largest future [`Exec::block_on`] keeps on the stack.
pub(crate) const INLINE_FUTURE: usize = 1024;

/// The process-wide runtime that runs clients made by [`Client::from_async`]
/// while they are waited for.
fn shared_runtime() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("tubeway-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::Runtime(format!("cannot start the tubeway runtime: {e}")))
}

thread_local! {
    /// Set while this crate runs a synchronous handler on a thread where
    /// blocking is allowed although a runtime is current.
    static HANDLER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, which may use the blocking [`Client`] although this thread
/// belongs to an async runtime: for code on a runtime's blocking pool
/// ([`tokio::task::spawn_blocking`]), which may block, where the client
/// cannot tell it from one of the runtime's workers, which must not. The
/// synchronous handlers of [`Client::serve`] and [`Client::subscribe_with`]
/// already run so.
pub fn allow_blocking<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            HANDLER_THREAD.with(|h| h.set(self.0));
        }
    }
    let _reset = Reset(HANDLER_THREAD.with(|h| h.replace(true)));
    f()
}

/// Whether this thread may block.
fn may_block() -> bool {
    Handle::try_current().is_err() || HANDLER_THREAD.with(Cell::get)
}

/// What the blocking waits of a thread inside [`interruptible`] ask.
#[derive(Clone, Copy)]
struct Interrupt {
    every: Duration,
    check: fn() -> bool,
}

thread_local! {
    static INTERRUPT: Cell<Option<Interrupt>> = const { Cell::new(None) };
}

/// Runs `f`, in which every wait of a blocking client on this thread calls
/// `check` at least once per `every` while it waits (never while the
/// answer is there to take); once `check` returns true, the wait ends with
/// [`Error::Interrupted`] and what it waited for is abandoned, as on a
/// timeout (a `poll` is withdrawn at the broker). For a language binding
/// whose Ctrl-C must reach a thread blocked in a call, or a program that
/// stops its threads by a flag. Nests: the innermost check applies.
///
/// ```no_run
/// # fn main() -> tubeway::Result<()> {
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
///
/// static STOP: AtomicBool = AtomicBool::new(false);
/// let client = tubeway::Client::connect("tcp://127.0.0.1:7000")?;
/// let got = tubeway::blocking::interruptible(
///     Duration::from_millis(50),
///     || STOP.load(Ordering::Relaxed),
///     || client.poll("jobs", Duration::from_secs(3600)),
/// );
/// # Ok(())
/// # }
/// ```
pub fn interruptible<R>(every: Duration, check: fn() -> bool, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Interrupt>);
    impl Drop for Reset {
        fn drop(&mut self) {
            INTERRUPT.with(|i| i.set(self.0));
        }
    }
    let _reset = Reset(INTERRUPT.with(|i| i.replace(Some(Interrupt { every, check }))));
    f()
}

/// Why a wait ended without what it waited for.
enum Stop {
    TimedOut,
    Interrupted,
}

/// Waits by `step`, which gives up at the instant it is given (`None`:
/// never), until it is done, `deadline` passes or this thread's interrupt
/// check (see [`interruptible`]) says to stop. Without a check, one step.
fn in_slices<T>(
    deadline: Option<Instant>,
    mut step: impl FnMut(Option<Instant>) -> Option<T>,
) -> std::result::Result<T, Stop> {
    let Some(interrupt) = INTERRUPT.with(Cell::get) else {
        return step(deadline).ok_or(Stop::TimedOut);
    };
    loop {
        let until = earliest(deadline, Instant::now().checked_add(interrupt.every));
        if let Some(v) = step(until) {
            return Ok(v);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Stop::TimedOut);
        }
        if (interrupt.check)() {
            return Err(Stop::Interrupted);
        }
    }
}

/// The earlier of two instants, `None` being never.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Ends a sleep of [`Driver::call`] at the next look of the thread's
/// interrupt check, if it has one.
fn next_look(deadline: Option<Instant>) -> Option<Instant> {
    let look = INTERRUPT
        .with(Cell::get)
        .and_then(|i| Instant::now().checked_add(i.every));
    earliest(deadline, look)
}

/// Whether the thread's interrupt check says to stop.
fn interrupted() -> bool {
    INTERRUPT.with(Cell::get).is_some_and(|i| (i.check)())
}

/// A client's own runtime: current-thread, driven by whoever waits on it.
struct Driver {
    rt: Option<Runtime>,
    background: Arc<BackgroundShared>,
    /// The connection's reader while nobody runs it.
    slot: ReaderSlot,
    conn: OnceLock<Arc<Conn>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

/// How [`Driver::call`] left a call.
enum Call<'a> {
    /// Its answer, read by the caller's thread.
    Answered(Box<Message>),
    /// Registered; what is left to drive, and for how long.
    Waiting(Started<'a>, Duration),
}

/// The background driver, running while anything needs serving.
#[derive(Debug, Default)]
struct Background {
    duties: usize,
    stop: Option<Arc<Notify>>,
    /// Its thread runs: serving, or waiting a while for the next duty.
    thread: bool,
    /// The client is gone: a waiting thread ends at once.
    gone: bool,
}

/// The background driver's state, and how its waiting thread is woken.
#[derive(Debug, Default)]
struct BackgroundShared {
    state: Mutex<Background>,
    next: Condvar,
}

impl BackgroundShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Background> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How long the background thread waits for the next duty before it ends:
/// a loop of `send_async` calls, each waited for, must not start a thread
/// per call (that costs more than the call).
const LINGER: Duration = Duration::from_secs(1);

impl Driver {
    fn new() -> Result<Arc<Driver>> {
        let rt = Builder::new_current_thread()
            .enable_all()
            // The waiting thread's own call is checked after every task: a
            // reader that spins must not keep a response it routed waiting
            // for tokio's default 61 task polls.
            .event_interval(1)
            .thread_name("tubeway-client")
            .build()
            .map_err(|e| Error::Runtime(format!("cannot start the client's runtime: {e}")))?;
        Ok(Arc::new(Driver {
            rt: Some(rt),
            background: Arc::default(),
            slot: ReaderSlot::default(),
            conn: OnceLock::new(),
        }))
    }

    /// Takes the reader if nobody runs it.
    fn take_reader(&self) -> Option<Held<'_>> {
        self.slot.take()
    }

    /// Whether the connection's writer has frames for its task to write.
    fn write_backlog(&self) -> bool {
        self.conn.get().is_some_and(|c| c.write_backlog())
    }

    /// Runs `f` to completion on this thread, running the connection's
    /// reader meanwhile whenever nobody else does, giving up once `timeout`
    /// (if any) has passed or the thread's interrupt check says so.
    fn block_on_within<F: Future>(
        &self,
        f: F,
        timeout: Option<Duration>,
    ) -> std::result::Result<F::Output, Stop> {
        // A large future goes on the heap once, not copied again by every
        // layer below; a small one (a started call's) is not worth an
        // allocation.
        if std::mem::size_of::<F>() > INLINE_FUTURE {
            self.run(Box::pin(f).as_mut(), timeout)
        } else {
            self.run(std::pin::pin!(f), timeout)
        }
    }

    fn run<F: Future>(
        &self,
        mut f: Pin<&mut F>,
        timeout: Option<Duration>,
    ) -> std::result::Result<F::Output, Stop> {
        if let Some(v) = self.spin_on(f.as_mut()) {
            return Ok(v);
        }
        // The clock is read only now, for a wait that outlasts the spin: the
        // timeout then runs late by that spin (at most one slice of it,
        // 50 µs), which the timer's resolution (1 ms) would hide anyway.
        // A timeout too long for the clock is as good as none.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        in_slices(deadline, |until| self.drive(f.as_mut(), until))
    }

    /// The common case without the runtime's machinery (entering its
    /// scheduler, arming a timer, being woken through it): when nobody else
    /// holds the reader and nothing waits for the writer's task, polls `f`
    /// and the reader, which spins by the wait strategy for what `f` waits
    /// for. `None` when `f` is not done by then (the reader went to sleep,
    /// another thread reads, a frame was queued for the writer's task):
    /// [`drive`](Self::drive) takes over. Bounded by one slice of the
    /// reader's spin (it then gives its runtime a turn), so a busy-spinning
    /// reader still lets `drive` see the deadline; nothing is lost by
    /// giving up, `f` is only polled.
    fn spin_on<F: Future>(&self, mut f: Pin<&mut F>) -> Option<F::Output> {
        let mut held = self.take_reader()?;
        // The runtime's context, for what `f` and the reader register.
        let _context = self.rt().enter();
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
        // What `f` sent was written, not queued for the writer's task (which
        // only the runtime runs); a frame another thread queues meanwhile is
        // that thread's to see written.
        if self.write_backlog() {
            return None;
        }
        // As in `drive`: twice, for a reader that yields after a message.
        for _ in 0..2 {
            if !held.poll(&mut cx) {
                return None;
            }
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return Some(v);
            }
        }
        None
    }

    /// Starts a call from the thread that will wait for it, at most
    /// `timeout`. When nobody else reads and no other call is in flight,
    /// writes it and reads its answer right here: no registration, no
    /// channel, no wake-up through the runtime. A reader that spins spins
    /// for it; one that does not sleeps in the kernel on the socket alone,
    /// as a hand-written ping-pong does. Otherwise, or once that is over
    /// without the answer, the call is registered and waits as any other.
    fn call<'a>(
        &self,
        client: &'a AsyncClient,
        msg: Message,
        timeout: Duration,
    ) -> Result<Call<'a>> {
        let conn = client.conn();
        let waiting = |started| Call::Waiting(started, timeout);
        let Some(mut held) = self.take_reader() else {
            return client.start(msg).map(waiting);
        };
        if !conn.begin_unregistered(&msg)? {
            drop(held);
            return client.start(msg).map(waiting);
        }
        let (id, waits) = (msg.id, Waits::of(&msg));
        let frame = conn.encode_owned(msg)?;
        let unsent = conn.try_send_as(frame, false)?;
        // No runtime context while the reader is polled for the answer:
        // what routing another message starts enters the connection's
        // runtime itself (`serve_now`), so a call pays for the context (a
        // reference count taken and given back, a thread-local set and
        // restored) only once it has to wait.
        let sleeps = !client.wait_strategy().spins();
        // A sleeping reader waits until the call's deadline: a shorter wait
        // of its own would cost more than the round trip (arming the CPU's
        // timer anew each time measured about 15 µs a call here). None when
        // the timeout is too long for the clock.
        let deadline = sleeps
            .then(|| Instant::now().checked_add(timeout))
            .flatten();
        let left = || deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
        // Unless the frame waits for the writer's task, which only the
        // runtime runs.
        if unsent.is_none() && !self.write_backlog() {
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            // Twice: for a spinning reader that yields once before it spins;
            // for a sleeping one, a second wait is for the rest of a large
            // answer or for the answer after another message.
            for _ in 0..2 {
                if sleeps && (self.write_backlog() || !held.wait_readable(next_look(deadline))) {
                    if left().is_zero() {
                        return Err(Error::Timeout(timeout));
                    }
                    if interrupted() {
                        return Err(Error::Interrupted);
                    }
                    break;
                }
                match held.poll_answer(&mut cx, id) {
                    Poll::Ready(Some(answer)) => return Ok(Call::Answered(answer)),
                    Poll::Ready(None) => return Err(conn.closed_error()),
                    Poll::Pending => {}
                }
            }
        }
        // Registered before the reader is put back: its answer has not been
        // read, so whoever reads next routes it to the call.
        let _context = self.rt().enter();
        let started = client.started_unregistered(id, waits, unsent)?;
        drop(held);
        Ok(Call::Waiting(started, left()))
    }

    /// Runs `f` on the runtime until it is done or `deadline` passes.
    fn drive<F: Future>(&self, mut f: Pin<&mut F>, deadline: Option<Instant>) -> Option<F::Output> {
        self.rt().block_on(async {
            let mut held: Option<Held<'_>> = None;
            let waiter = self.slot.waiter();
            let free = self.slot.notified(&waiter);
            tokio::pin!(free);
            let expiry = deadline.map(|d| tokio::time::sleep_until(d.into()));
            tokio::pin!(expiry);
            // Pending, unless the deadline has passed.
            let pending =
                |expiry: Pin<&mut Option<tokio::time::Sleep>>, cx: &mut Context<'_>| match expiry
                    .as_pin_mut()
                    .map(|s| s.poll(cx))
                {
                    Some(Poll::Ready(())) => Poll::Ready(None),
                    _ => Poll::Pending,
                };
            std::future::poll_fn(|cx| loop {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    return Poll::Ready(Some(v));
                }
                if held.is_none() {
                    // Interest first, so a reader put back meanwhile is not missed.
                    free.as_mut().enable();
                    held = self.take_reader();
                    if held.is_none() {
                        if free.as_mut().poll(cx).is_ready() {
                            free.set(self.slot.notified(&waiter));
                            continue;
                        }
                        // Another thread reads; it wakes us with our answer.
                        return pending(expiry.as_mut(), cx);
                    }
                }
                let Some(h) = held.as_mut() else {
                    return pending(expiry.as_mut(), cx);
                };
                // Twice: a reader that spins first yields once (for tasks its
                // last message woke), then spins for the answer; polling it
                // again here saves a trip through the scheduler, unless the
                // writer's task has frames to write first.
                for _ in 0..2 {
                    if !h.poll(cx) {
                        // The connection ended; `f` learns it from its call.
                        held = None;
                        break;
                    }
                    if let Poll::Ready(v) = f.as_mut().poll(cx) {
                        return Poll::Ready(Some(v));
                    }
                    if self.write_backlog() {
                        break;
                    }
                }
                return pending(expiry.as_mut(), cx);
            })
            .await
        })
    }

    /// Runs the reader until `until` is signalled: the background driver.
    async fn serve(&self, until: Arc<Notify>) {
        let stop = until.notified();
        tokio::pin!(stop);
        stop.as_mut().enable();
        let mut held = loop {
            let waiter = self.slot.waiter();
            let free = self.slot.notified(&waiter);
            tokio::pin!(free);
            free.as_mut().enable();
            if let Some(h) = self.take_reader() {
                break h;
            }
            tokio::select! {
                () = &mut stop => return,
                () = free => {}
            }
        };
        // Until stopped (then `held` puts the reader back for the callers),
        // even once the connection has ended: the tasks it runs (a
        // `send_async` call, a worker's handler) still have to learn that.
        // Stopped while its reader spins, it goes on until the reader would
        // sleep: a duty that comes meanwhile (the next `send_async` of a
        // loop) finds the thread awake, with no wake-up to pay.
        let mut stopped = false;
        std::future::poll_fn(|cx| {
            stopped = stopped || stop.as_mut().poll(cx).is_ready();
            // Ended, it stays ended: pending on `stop` alone.
            held.poll(cx);
            if stopped && !held.spinning() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }

    fn rt(&self) -> &Runtime {
        // Only `drop` takes it.
        self.rt
            .as_ref()
            .unwrap_or_else(|| unreachable!("runtime taken before drop"))
    }

    /// Keeps a thread driving the runtime until the returned guard drops.
    fn duty(self: &Arc<Self>) -> Result<Duty> {
        let shared = &self.background;
        let mut b = shared.lock();
        if b.duties == 0 {
            if !b.thread {
                let (driver, theirs) = (Arc::downgrade(self), shared.clone());
                std::thread::Builder::new()
                    .name("tubeway-client".into())
                    .spawn(move || background(&driver, &theirs))
                    .map_err(|e| {
                        Error::Runtime(format!("cannot start the client's driver thread: {e}"))
                    })?;
                b.thread = true;
            }
            b.stop = Some(Arc::new(Notify::new()));
            shared.next.notify_one();
        }
        b.duties += 1;
        Ok(Duty {
            driver: self.clone(),
        })
    }
}

/// The background thread: drives the runtime while duties are held, then
/// waits up to [`LINGER`] for the next. It holds the driver only while it
/// drives, so a client dropped meanwhile goes at once.
fn background(driver: &std::sync::Weak<Driver>, shared: &BackgroundShared) {
    loop {
        let until = {
            let b = shared.lock();
            b.stop.clone().filter(|_| b.duties > 0)
        };
        if let Some(until) = until {
            let Some(d) = driver.upgrade() else { break };
            d.rt().block_on(d.serve(until));
        }
        let mut b = shared.lock();
        let deadline = Instant::now() + LINGER;
        while b.duties == 0 && !b.gone {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            b = shared
                .next
                .wait_timeout(b, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if b.duties == 0 {
            b.thread = false;
            return;
        }
    }
    shared.lock().thread = false;
}

impl Drop for Driver {
    fn drop(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        if may_block() {
            // The connection was closed when its last handle dropped; give
            // its writer a moment to flush what is queued.
            let handle = rt.handle().clone();
            rt.block_on(async move {
                let _ = tokio::time::timeout(DROP_FLUSH, async {
                    while handle.metrics().num_alive_tasks() > 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
            });
        }
        rt.shutdown_background();
        let mut b = self.background.lock();
        b.gone = true;
        self.background.next.notify_all();
    }
}

/// Keeps the client's background driver running.
#[derive(Debug)]
struct Duty {
    driver: Arc<Driver>,
}

impl Drop for Duty {
    fn drop(&mut self) {
        let mut b = self.driver.background.lock();
        b.duties -= 1;
        if b.duties == 0 {
            if let Some(stop) = b.stop.take() {
                // A stored permit: the driver stops even if it has not started waiting yet.
                stop.notify_one();
            }
        }
    }
}

/// Where a blocking client's futures run.
#[derive(Clone, Debug)]
enum Exec {
    /// The client's own runtime.
    Own(Arc<Driver>),
    /// The process-wide runtime, for an [`AsyncClient`] of another runtime.
    Shared,
}

impl Exec {
    /// Fails when this thread must not block.
    fn check(&self) -> Result<()> {
        if may_block() {
            return Ok(());
        }
        // Blocking here would stall (or, on a current-thread runtime, deadlock) the caller's runtime.
        Err(Error::Runtime(
            "the blocking tubeway::Client was called inside an async runtime; use AsyncClient in async code"
                .into(),
        ))
    }

    /// Runs `f` to completion, driving the connection from this thread;
    /// [`Error::Interrupted`] if the thread's interrupt check stops it.
    fn block_on<F: Future>(&self, f: F) -> Result<F::Output> {
        self.block_within(f, None)
    }

    /// [`block_on`](Self::block_on), failing with [`Error::Timeout`] once
    /// `timeout` has passed.
    fn block_on_timeout<F: Future>(&self, f: F, timeout: Duration) -> Result<F::Output> {
        self.block_within(f, Some(timeout))
    }

    fn block_within<F: Future>(&self, f: F, timeout: Option<Duration>) -> Result<F::Output> {
        self.check()?;
        let stopped = match self {
            Exec::Own(d) => d.block_on_within(f, timeout),
            Exec::Shared => {
                let handle = shared_runtime()?.handle();
                let mut f = std::pin::pin!(f);
                let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
                in_slices(deadline, |until| {
                    // The timer must be created on the runtime, hence the async block.
                    handle.block_on(async {
                        match until {
                            Some(u) => tokio::time::timeout_at(u.into(), f.as_mut()).await.ok(),
                            None => Some(f.as_mut().await),
                        }
                    })
                })
            }
        };
        stopped.map_err(|stop| match (stop, timeout) {
            (Stop::TimedOut, Some(t)) => Error::Timeout(t),
            // Only a wait with a timeout times out.
            (Stop::TimedOut, None) | (Stop::Interrupted, _) => Error::Interrupted,
        })
    }

    /// The runtime this client's futures run on.
    fn runtime(&self) -> Result<&Runtime> {
        match self {
            Exec::Own(d) => Ok(d.rt()),
            Exec::Shared => shared_runtime(),
        }
    }

    /// Runs `f` in the background.
    fn spawn<F>(&self, f: F) -> Result<(JoinHandle<F::Output>, Option<Duty>)>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let duty = self.duty()?;
        Ok((self.runtime()?.spawn(f), duty))
    }

    /// Keeps the connection served while the guard lives.
    fn duty(&self) -> Result<Option<Duty>> {
        match self {
            Exec::Own(d) => d.duty().map(Some),
            Exec::Shared => Ok(None),
        }
    }
}

/// A blocking connection to a Tubeway broker.
///
/// Cheap to clone; clones share one connection and may be used from many
/// threads at once. The methods are those of [`AsyncClient`], blocking.
#[derive(Clone, Debug)]
pub struct Client {
    inner: AsyncClient,
    exec: Exec,
}

impl Client {
    /// Connects to the broker at `url` with default options.
    pub fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ClientOptions::default())
    }

    /// Connects with `options`.
    pub fn connect_with(url: &str, options: ClientOptions) -> Result<Self> {
        let driver = Driver::new()?;
        let exec = Exec::Own(driver.clone());
        let (inner, reader) =
            exec.block_on(AsyncClient::connect_parts(url, options, true, None))??;
        driver.slot.put(reader);
        // A task left with work when the call that made it returns (a
        // oneway message still queued, a message going back to its queue)
        // has the background thread run it.
        let weak = Arc::downgrade(&driver);
        inner.conn().set_keep_running(Box::new(move || {
            let duty = weak.upgrade()?.duty().ok()?;
            Some(Box::new(duty) as Box<dyn Send>)
        }));
        let _ = driver.conn.set(inner.conn_arc());
        Ok(Client { inner, exec })
    }

    /// Wraps an async client. Its tasks keep running on the runtime that
    /// created it, which must outlive this client; calls wait on a
    /// process-wide runtime, so they cost a hand-off that a client made by
    /// [`Client::connect`] avoids.
    pub fn from_async(inner: AsyncClient) -> Self {
        Client {
            inner,
            exec: Exec::Shared,
        }
    }

    fn block_on<F: Future>(&self, f: F) -> Result<F::Output> {
        self.exec.block_on(f)
    }

    /// The async client underneath, for use in async code.
    pub fn as_async(&self) -> &AsyncClient {
        &self.inner
    }

    /// The broker's URL.
    pub fn url(&self) -> &Url {
        self.inner.url()
    }

    /// How this client waits for the broker's answers (see
    /// [`AsyncClient::wait_strategy`]).
    pub fn wait_strategy(&self) -> tubeway_transport::WaitStrategy {
        self.inner.wait_strategy()
    }

    /// What the broker said in the handshake.
    pub fn welcome(&self) -> &ops::Welcome {
        self.inner.welcome()
    }

    /// The largest message the broker accepts.
    pub fn max_message_size(&self) -> usize {
        self.inner.max_message_size()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Closes the connection gracefully; see [`AsyncClient::close`].
    pub fn close(&self) -> Result<()> {
        self.block_on(self.inner.close())
    }

    /// Sends any message and returns its response, whatever its status.
    pub fn request(&self, msg: Message) -> Result<Message> {
        let wait = self.inner.wait_for(msg.timeout);
        self.request_timeout(msg, wait)
    }

    /// Sends any message and returns its response, waiting at most `timeout`.
    pub fn request_timeout(&self, msg: Message, timeout: Duration) -> Result<Message> {
        self.exchange(msg, timeout).map(|r| *r)
    }

    /// [`request_timeout`](Self::request_timeout), its answer left where
    /// the reader put it: every move of a message copies all of it.
    fn exchange(&self, msg: Message, timeout: Duration) -> Result<Box<Message>> {
        // Started before blocking, so that only a small future is driven:
        // the message never enters it.
        self.exec.check()?;
        let (started, left) = match &self.exec {
            Exec::Own(d) => match d.call(&self.inner, msg, timeout)? {
                Call::Answered(m) => return Ok(m),
                Call::Waiting(started, left) => (started, left),
            },
            Exec::Shared => (self.inner.start(msg)?, timeout),
        };
        match self.exec.block_on_timeout(started.exchange(), left) {
            Ok(r) => r,
            // The timeout the caller gave, not what was left of it.
            Err(Error::Timeout(_)) => Err(Error::Timeout(timeout)),
            Err(e) => Err(e),
        }
    }

    /// Sends any message with `oneway` set.
    pub fn request_oneway(&self, msg: Message) -> Result<()> {
        self.block_on(self.inner.request_oneway(msg))?
    }

    /// Calls `function`; see [`AsyncClient::send`].
    pub fn send(&self, function: &str, msg: Message) -> Result<Message> {
        let timeout = self.inner.call_timeout(&msg);
        self.send_timeout(function, msg, timeout)
    }

    /// Calls `function`, giving up after `timeout`.
    pub fn send_timeout(&self, function: &str, msg: Message, timeout: Duration) -> Result<Message> {
        let wait = self.inner.wait_for(Some(timeout));
        // Made where `exchange` takes it (see `function_call`).
        let r = self.exchange(function_call(function, msg, timeout), wait)?;
        if r.status().is_ok() {
            Ok(*r)
        } else {
            Err(Error::from_response(&r))
        }
    }

    /// Calls `function` without waiting for the response: the call runs in
    /// the background and the returned [`ResponseFuture`] yields its result,
    /// by `.await` or [`ResponseFuture::wait`]. Usable from any context.
    pub fn send_async(&self, function: &str, msg: Message) -> ResponseFuture {
        // The request is written from this thread (see `AsyncClient::launch`);
        // the background thread has only the answer to read.
        let launched = self.inner.launch_call(function, msg);
        match launched.and_then(|call| self.exec.spawn(call.reply())) {
            Ok((task, duty)) => ResponseFuture {
                task: Ok(task),
                exec: self.exec.clone(),
                _duty: duty,
            },
            Err(e) => ResponseFuture {
                task: Err(Some(e)),
                exec: self.exec.clone(),
                _duty: None,
            },
        }
    }

    /// Calls `function` without waiting for the response: the call runs in
    /// the background and `then` gets its result there, on the client's
    /// background thread (it must not block: it holds up the connection).
    /// Where [`send_async`](Self::send_async) needs a thread to wait for its
    /// future, this hands the reply on at once (a language binding resolves
    /// its own kind of future so). Fails only if the background cannot start.
    pub fn send_then<F>(&self, function: &str, msg: Message, then: F) -> Result<()>
    where
        F: FnOnce(Result<Message>) + Send + 'static,
    {
        self.request_then(|c| c.launch_call(function, msg), Ok, then, None)
    }

    /// Offers `msg` to `queue` in the background, the broker waiting up to
    /// `timeout` for room; `then` gets the outcome as
    /// [`send_then`](Self::send_then)'s callback gets a reply. The returned
    /// handle withdraws the offer: one the broker had not queued yet is
    /// then not queued at all.
    pub fn offer_then<F>(
        &self,
        queue: &str,
        msg: Message,
        timeout: Duration,
        then: F,
    ) -> Result<WaitHandle>
    where
        F: FnOnce(Result<()>) + Send + 'static,
    {
        let msg = super::offer_request(queue, msg, timeout);
        let handle = WaitHandle::new();
        let withdrawn = Some(handle.withdrawn.clone());
        self.request_then(|c| c.launch(msg), |_| Ok(()), then, withdrawn)?;
        Ok(handle)
    }

    /// Publishes `msg` to `topic` in the background; `then` gets the
    /// outcome as [`send_then`](Self::send_then)'s callback gets a reply.
    pub fn publish_then<F>(&self, topic: &str, msg: Message, then: F) -> Result<()>
    where
        F: FnOnce(Result<()>) + Send + 'static,
    {
        let msg = super::publish_request(topic, msg);
        self.request_then(|c| c.launch(msg), |_| Ok(()), then, None)
    }

    /// The body of the `*_then` calls: the request written from this
    /// thread (see `AsyncClient::launch`), its answer, made `T` by `answer`
    /// when its status is `ok`, handed to `then` on the background thread;
    /// or [`Error::Interrupted`] once `withdrawn` is cancelled, if given,
    /// which gives the call up (and withdraws it at the broker).
    fn request_then<T, F>(
        &self,
        launch: impl FnOnce(&AsyncClient) -> Result<super::Launched>,
        answer: fn(Message) -> Result<T>,
        then: F,
        withdrawn: Option<CancellationToken>,
    ) -> Result<()>
    where
        T: Send + 'static,
        F: FnOnce(Result<T>) + Send + 'static,
    {
        // Kept by the call: the connection is served until the reply is in.
        // (Never the driver's last handle there: whoever runs the task holds
        // one, so the runtime is not dropped from inside itself.)
        let duty = self.exec.duty()?;
        // A call that cannot start still ends in `then`, on the background thread.
        let launched = launch(&self.inner);
        let call = async move {
            let _duty = duty;
            let reply = match (launched, withdrawn) {
                (Ok(call), None) => call.reply().await,
                (Ok(call), Some(withdrawn)) => tokio::select! {
                    biased;
                    reply = call.reply() => reply,
                    () = withdrawn.cancelled() => Err(Error::Interrupted),
                },
                (Err(e), _) => Err(e),
            };
            then(reply.and_then(answer));
        };
        drop(self.exec.runtime()?.spawn(call));
        Ok(())
    }

    /// Polls `queue` in the background, waiting up to `timeout` for a
    /// message: `then` gets the result on the background thread (it must
    /// not block), `None` if the queue stayed empty. The returned handle
    /// withdraws the poll. No message is lost on the way: one the broker
    /// had taken for a poll withdrawn meanwhile, or one `then` got but
    /// dropped (see [`Polled`]), goes back to its queue. Fails only if the
    /// background cannot start.
    pub fn poll_then<F>(&self, queue: &str, timeout: Duration, then: F) -> Result<WaitHandle>
    where
        F: FnOnce(Result<Option<Polled>>) + Send + 'static,
    {
        let duty = self.exec.duty()?;
        let launched = self.inner.launch(super::poll_request(queue, timeout));
        let id = launched.as_ref().ok().and_then(super::Launched::id);
        let conn = self.inner.conn_arc();
        let handle = WaitHandle::new();
        let (withdrawn, queue) = (handle.withdrawn.clone(), queue.to_owned());
        let call = async move {
            let duty = duty;
            let answer = match launched {
                // Given up, the call withdraws the poll at the broker, or
                // never writes it if it still waits for room; a message
                // the broker had taken for it meanwhile goes back.
                Ok(call) => tokio::select! {
                    biased;
                    answer = call.finish() => answer.and_then(super::polled),
                    () = withdrawn.cancelled() => Err(Error::Interrupted),
                },
                Err(e) => Err(e),
            };
            let settling = id.filter(|_| withdrawn.is_cancelled()).map(|id| {
                // The connection is read, the duty kept, until the broker's
                // answer to the withdrawn poll is in: a message in it
                // must go back, not wait unread in the socket.
                let conn = conn.clone();
                async move {
                    let _duty = duty;
                    let bound = timeout.saturating_add(Duration::from_secs(5));
                    let _ = tokio::time::timeout(bound, conn.settled(id)).await;
                }
            });
            let answer = answer.map(|m| {
                m.map(|message| Polled {
                    message: Some(message),
                    queue,
                    conn,
                })
            });
            // A message in before the withdrawal goes back as `Polled` drops.
            then(match answer {
                Ok(_) if withdrawn.is_cancelled() => Err(Error::Interrupted),
                answer => answer,
            });
            if let Some(settling) = settling {
                settling.await;
            }
        };
        drop(self.exec.runtime()?.spawn(call));
        Ok(handle)
    }

    /// Calls `function` without waiting for, or getting, a response.
    pub fn send_oneway(&self, function: &str, msg: Message) -> Result<()> {
        self.block_on(self.inner.send_oneway(function, msg))?
    }

    /// [`send_oneway`](Self::send_oneway) that never blocks: `Ok(true)`
    /// when written from this thread at once; else (the write queue is
    /// full) the background thread writes it once there is room, and
    /// `then` gets the outcome there (`Ok(false)`). Messages written so
    /// keep the order they were sent in.
    pub fn send_oneway_then<F>(&self, function: &str, msg: Message, then: F) -> Result<bool>
    where
        F: FnOnce(Result<()>) + Send + 'static,
    {
        self.oneway_then(super::oneway_call(function, msg), then)
    }

    /// [`publish_oneway`](Self::publish_oneway) that never blocks, as
    /// [`send_oneway_then`](Self::send_oneway_then).
    pub fn publish_oneway_then<F>(&self, topic: &str, msg: Message, then: F) -> Result<bool>
    where
        F: FnOnce(Result<()>) + Send + 'static,
    {
        self.oneway_then(super::publish_request(topic, msg), then)
    }

    fn oneway_then<F>(&self, msg: Message, then: F) -> Result<bool>
    where
        F: FnOnce(Result<()>) + Send + 'static,
    {
        let Some(oneway) = self.inner.launch_oneway(msg)? else {
            return Ok(true);
        };
        let duty = self.exec.duty()?;
        let write = async move {
            let _duty = duty;
            then(oneway.write().await);
        };
        drop(self.exec.runtime()?.spawn(write));
        Ok(false)
    }

    /// Serves `function` on this connection; see [`AsyncClient::serve`].
    pub fn serve<F>(&self, function: &str, handler: F) -> Result<Worker>
    where
        F: Fn(Message) -> std::result::Result<Message, HandlerError> + Send + Sync + 'static,
    {
        self.served(self.inner.serve(function, handler))
    }

    /// Serves `function` with an async handler, run on the client's
    /// background thread; see [`AsyncClient::serve_async`]. For a handler
    /// whose work is done elsewhere (a language binding's event loop, say)
    /// and which only waits for it here.
    pub fn serve_async<F, Fut>(&self, function: &str, handler: F) -> Result<Worker>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Message, HandlerError>> + Send + 'static,
    {
        self.served(self.inner.serve_async(function, handler))
    }

    /// Serves `function` with a handler that answers later, through the
    /// responder it is given, from any thread; see
    /// [`AsyncClient::serve_deferred`]. The handler runs where the
    /// connection is read (the client's background thread, or a thread
    /// waiting in a call of its own) and must return at once.
    pub fn serve_deferred<F>(&self, function: &str, handler: F) -> Result<Worker>
    where
        F: Fn(Message, super::Responder) + Send + Sync + 'static,
    {
        self.served(self.inner.serve_deferred(function, handler))
    }

    fn served(&self, registered: impl Future<Output = Result<super::Worker>>) -> Result<Worker> {
        let duty = self.exec.duty()?;
        let inner = self.block_on(registered)??;
        Ok(Worker {
            inner,
            exec: self.exec.clone(),
            _duty: duty,
        })
    }

    /// Removes `function`.
    pub fn remove_function(&self, function: &str) -> Result<()> {
        self.block_on(self.inner.remove_function(function))?
    }

    /// The status of `function`.
    pub fn function_status(&self, function: &str) -> Result<ops::FunctionStatus> {
        self.block_on(self.inner.function_status(function))?
    }

    /// The status of every function.
    pub fn list_functions(&self) -> Result<Vec<ops::FunctionStatus>> {
        self.block_on(self.inner.list_functions())?
    }

    /// Puts `msg` on `queue`; see [`AsyncClient::offer`].
    pub fn offer(&self, queue: &str, msg: Message, timeout: Duration) -> Result<()> {
        self.block_on(self.inner.offer(queue, msg, timeout))?
    }

    /// Takes the next message from `queue`; see [`AsyncClient::poll`].
    pub fn poll(&self, queue: &str, timeout: Duration) -> Result<Option<Message>> {
        self.block_on(self.inner.poll(queue, timeout))?
    }

    /// Creates a queue.
    pub fn create_queue(
        &self,
        name: &str,
        capacity: u64,
        kind: ops::QueueKind,
    ) -> Result<ops::QueueStatus> {
        self.block_on(self.inner.create_queue(name, capacity, kind))?
    }

    /// Creates a queue named by the broker, removed when this connection closes.
    pub fn create_temporary_queue(
        &self,
        capacity: u64,
        kind: ops::QueueKind,
    ) -> Result<ops::QueueStatus> {
        self.block_on(self.inner.create_temporary_queue(capacity, kind))?
    }

    /// Removes a queue.
    pub fn remove_queue(&self, name: &str) -> Result<()> {
        self.block_on(self.inner.remove_queue(name))?
    }

    /// Whether a queue exists.
    pub fn exists_queue(&self, name: &str) -> Result<bool> {
        self.block_on(self.inner.exists_queue(name))?
    }

    /// The status of a queue.
    pub fn queue_status(&self, name: &str) -> Result<ops::QueueStatus> {
        self.block_on(self.inner.queue_status(name))?
    }

    /// The status of every queue.
    pub fn list_queues(&self) -> Result<Vec<ops::QueueStatus>> {
        self.block_on(self.inner.list_queues())?
    }

    /// Creates a topic.
    pub fn create_topic(&self, name: &str) -> Result<ops::TopicStatus> {
        self.block_on(self.inner.create_topic(name))?
    }

    /// Removes a topic.
    pub fn remove_topic(&self, name: &str) -> Result<()> {
        self.block_on(self.inner.remove_topic(name))?
    }

    /// The status of a topic.
    pub fn topic_status(&self, name: &str) -> Result<ops::TopicStatus> {
        self.block_on(self.inner.topic_status(name))?
    }

    /// The status of every topic.
    pub fn list_topics(&self) -> Result<Vec<ops::TopicStatus>> {
        self.block_on(self.inner.list_topics())?
    }

    /// Publishes `msg` to `topic` and waits for the broker to accept it.
    pub fn publish(&self, topic: &str, msg: Message) -> Result<()> {
        self.block_on(self.inner.publish(topic, msg))?
    }

    /// Publishes without waiting for the broker.
    pub fn publish_oneway(&self, topic: &str, msg: Message) -> Result<()> {
        self.block_on(self.inner.publish_oneway(topic, msg))?
    }

    /// Subscribes to `topic`; see [`super::Subscription`] on back-pressure.
    pub fn subscribe(&self, topic: &str) -> Result<Subscription> {
        let inner = self.block_on(self.inner.subscribe(topic))??;
        Ok(Subscription {
            inner,
            exec: self.exec.clone(),
        })
    }

    /// Subscribes with a buffer of `buffer` deliveries.
    pub fn subscribe_with_buffer(&self, topic: &str, buffer: usize) -> Result<Subscription> {
        let inner = self.block_on(self.inner.subscribe_with_buffer(topic, buffer))??;
        Ok(Subscription {
            inner,
            exec: self.exec.clone(),
        })
    }

    /// Subscribes and runs `handler` on each delivery, in order, on a
    /// background thread.
    pub fn subscribe_with<F>(&self, topic: &str, handler: F) -> Result<SubscriptionHandle>
    where
        F: Fn(Message) + Send + 'static,
    {
        let duty = self.exec.duty()?;
        let inner = self.block_on(self.inner.subscribe_with(topic, handler))??;
        Ok(SubscriptionHandle {
            inner,
            exec: self.exec.clone(),
            _duty: duty,
        })
    }

    /// Broker statistics.
    pub fn stats(&self) -> Result<ops::Stats> {
        self.block_on(self.inner.stats())?
    }

    /// Measures one round trip to the broker.
    pub fn ping(&self) -> Result<Duration> {
        self.block_on(self.inner.ping())?
    }
}

/// The result of [`Client::send_async`]: `.await` it or [`wait`](ResponseFuture::wait) for it.
///
/// Dropping it does not cancel the call.
#[derive(Debug)]
#[must_use = "the response is lost unless awaited or waited for"]
pub struct ResponseFuture {
    task: std::result::Result<JoinHandle<Result<Message>>, Option<Error>>,
    exec: Exec,
    /// Someone drives the connection until the response is in.
    _duty: Option<Duty>,
}

impl ResponseFuture {
    /// Blocks until the response arrives (bounded by the call's timeout).
    pub fn wait(self) -> Result<Message> {
        let exec = self.exec.clone();
        exec.block_on(self)?
    }
}

impl Future for ResponseFuture {
    type Output = Result<Message>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.task {
            Ok(task) => Pin::new(task).poll(cx).map(|joined| {
                joined.unwrap_or_else(|e| Err(Error::Runtime(format!("call failed: {e}"))))
            }),
            Err(e) => Poll::Ready(Err(e
                .take()
                .unwrap_or_else(|| Error::Runtime("response already taken".into())))),
        }
    }
}

/// A message polled by [`Client::poll_then`]. Take it with
/// [`into_message`](Polled::into_message); dropped untaken (its receiver
/// had gone, say), it goes back to the end of its queue.
#[derive(Debug)]
pub struct Polled {
    message: Option<Message>,
    queue: String,
    conn: Arc<Conn>,
}

impl Polled {
    /// The message.
    pub fn message(&self) -> &Message {
        self.message
            .as_ref()
            .unwrap_or_else(|| unreachable!("taken only by into_message"))
    }

    /// Takes the message: it is this receiver's now.
    pub fn into_message(mut self) -> Message {
        self.message
            .take()
            .unwrap_or_else(|| unreachable!("taken only once"))
    }
}

impl Drop for Polled {
    fn drop(&mut self) {
        if let Some(m) = self.message.take() {
            self.conn.put_back_now(m, std::mem::take(&mut self.queue));
        }
    }
}

/// Withdraws a background call that waits at the broker: a poll started
/// by [`Client::poll_then`] or an offer started by [`Client::offer_then`].
#[derive(Debug)]
pub struct WaitHandle {
    withdrawn: CancellationToken,
}

impl WaitHandle {
    fn new() -> Self {
        WaitHandle {
            withdrawn: CancellationToken::new(),
        }
    }

    /// Withdraws the call unless its outcome is in already: its callback
    /// gets [`Error::Interrupted`] at once, and the broker ends the call's
    /// wait (if it understands `cancel`; a request still waiting for room
    /// to be written is never sent). A message the broker had taken for a
    /// poll meanwhile goes back to its queue; an offer it had queued
    /// already stays queued.
    pub fn withdraw(&self) {
        self.withdrawn.cancel();
    }
}

/// A blocking subscription; see [`super::Subscription`].
///
/// Iterating yields deliveries until the subscription ends.
#[derive(Debug)]
#[must_use = "dropping a Subscription unsubscribes"]
pub struct Subscription {
    inner: super::Subscription,
    exec: Exec,
}

impl Subscription {
    /// The next delivery, waiting at most `timeout`: `Ok(None)` on timeout,
    /// [`Error::SubscriptionEnded`] once the subscription has ended.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Message>> {
        // The timer must be created on the runtime, hence the async block.
        let inner = &mut self.inner;
        match self
            .exec
            .block_on(async { tokio::time::timeout(timeout, inner.recv()).await })?
        {
            Ok(Some(msg)) => Ok(Some(msg)),
            Ok(None) => Err(Error::SubscriptionEnded),
            Err(_) => Ok(None),
        }
    }

    /// The next delivery, waiting as long as it takes;
    /// [`Error::SubscriptionEnded`] once the subscription has ended.
    pub fn recv(&mut self) -> Result<Message> {
        self.exec
            .block_on(self.inner.recv())?
            .ok_or(Error::SubscriptionEnded)
    }

    /// The subscription id.
    pub fn id(&self) -> Uuid {
        self.inner.id()
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        self.inner.topic()
    }

    /// Ends the subscription and waits for the broker to confirm.
    pub fn unsubscribe(self) -> Result<()> {
        self.exec.block_on(self.inner.unsubscribe())?
    }

    /// From now on, runs `handler` on each delivery (those already
    /// buffered first), in order, on a background thread, as
    /// [`Client::subscribe_with`] does; with
    /// [`Client::subscribe_with_buffer`], a handler with a buffer size.
    pub fn with_handler<F>(self, handler: F) -> Result<SubscriptionHandle>
    where
        F: Fn(Message) + Send + 'static,
    {
        self.handled(|inner| inner.with_handler(handler))
    }

    /// [`with_handler`](Self::with_handler) for a handler that takes the
    /// deliveries buffered at the moment in one call; see
    /// [`super::Subscription::with_batch_handler`].
    pub fn with_batch_handler<F>(self, handler: F) -> Result<SubscriptionHandle>
    where
        F: Fn(&mut super::Batch<'_>) + Send + 'static,
    {
        self.handled(|inner| inner.with_batch_handler(handler))
    }

    /// The subscription served by what `serve` makes of it, on the
    /// client's runtime, the background thread kept running meanwhile.
    fn handled(
        self,
        serve: impl FnOnce(super::Subscription) -> super::SubscriptionHandle,
    ) -> Result<SubscriptionHandle> {
        let duty = self.exec.duty()?;
        let inner = {
            let _context = self.exec.runtime()?.enter();
            serve(self.inner)
        };
        Ok(SubscriptionHandle {
            inner,
            exec: self.exec,
            _duty: duty,
        })
    }
}

impl Iterator for Subscription {
    type Item = Message;

    fn next(&mut self) -> Option<Message> {
        self.recv().ok()
    }
}

/// A subscription served by a handler; see [`super::SubscriptionHandle`].
#[derive(Debug)]
#[must_use = "dropping a SubscriptionHandle unsubscribes"]
pub struct SubscriptionHandle {
    inner: super::SubscriptionHandle,
    exec: Exec,
    _duty: Option<Duty>,
}

impl SubscriptionHandle {
    /// The subscription id.
    pub fn id(&self) -> Uuid {
        self.inner.id()
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        self.inner.topic()
    }

    /// Ends the subscription and waits for the broker to confirm.
    pub fn unsubscribe(self) -> Result<()> {
        self.exec.block_on(self.inner.unsubscribe())?
    }
}

/// A function served by this connection; see [`super::Worker`].
#[derive(Debug)]
#[must_use = "dropping a Worker stops serving the function"]
pub struct Worker {
    inner: super::Worker,
    exec: Exec,
    _duty: Option<Duty>,
}

impl Worker {
    /// The function served.
    pub fn function(&self) -> &str {
        self.inner.function()
    }

    /// Stops serving and waits for the broker to confirm.
    pub fn stop(self) -> Result<()> {
        self.exec.block_on(self.inner.stop())?
    }
}
