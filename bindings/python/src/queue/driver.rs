//! An endpoint's own runtime, and who drives it.
//!
//! Each endpoint serves its connections on a current-thread runtime that
//! has no thread of its own: the thread that waits in `get` (or `close`)
//! drives it, GIL released. That thread sleeps in the kernel on the
//! endpoint's sockets itself (or polls them, by the endpoint's wait
//! strategy), reads the object and returns it: no hand-off to an I/O
//! thread, no second wake-up, no task switch — what a plain socket costs.
//!
//! While nobody calls, a thread of the endpoint's own, the *duty thread*,
//! drives the runtime instead: it reads ahead (into the endpoint's bounded
//! inbox, so a peer's large `put` completes before anyone here calls
//! `get`), writes what `put` could not write at once (a full socket), and
//! closes the connections of an endpoint dropped without `close`. It steps
//! aside as soon as a caller comes. It takes over only once callers have
//! stayed away for a while ([`IDLE`], or [`GRACE`] when `put` left frames
//! to write), so a `get` loop keeps the runtime to itself and pays no
//! hand-off; an idle endpoint's duty thread sleeps in the kernel.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::{Builder, Runtime};
use tokio::sync::Notify;

use crate::errors::Error;

/// How often a blocked caller looks for a pending signal (Ctrl-C), as in
/// [`crate::runtime::wait`].
const SIGNAL_CHECK: Duration = Duration::from_millis(50);
/// How long callers must stay away before the duty thread drives the
/// runtime: a caller that comes back sooner (a `get` loop) finds it free
/// instead of asking the duty thread to step aside. The duty thread looks
/// once per period while callers come and go.
const IDLE: Duration = Duration::from_millis(5);
/// The same while frames wait to be written.
const GRACE: Duration = Duration::from_micros(300);
/// How often the driving duty thread looks whether the frames that made
/// it hurry are written.
const RECHECK: Duration = Duration::from_millis(1);
/// Turns of the runtime a wait gets after its time is up: one to see what
/// the reactor has, one for the tasks it woke, one for what they passed on.
const LAST_LOOKS: u32 = 3;
/// How long the connections of a dropped endpoint may take to flush.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Work the duty thread is there for, told by the endpoint.
pub trait Duties: Send + Sync + 'static {
    /// Whether frames wait to be written.
    fn pending(&self) -> bool;
    /// Called each time the duty thread starts driving: lets the
    /// endpoint's readers read ahead meanwhile.
    fn on_duty(&self);
}

/// A new endpoint runtime: current-thread, without a thread of its own.
pub fn runtime() -> PyResult<Runtime> {
    Builder::new_current_thread()
        .enable_all()
        // A reader polled inline is checked after every task: a spinning
        // one must not wait for tokio's default 61 task polls.
        .event_interval(1)
        .build()
        .map_err(|e| Error::new_err(format!("cannot start a queue's runtime: {e}")))
}

/// Runs `fut` for at most `timeout` (`None`: as long as it takes). When
/// time is up, it gets a last look: a few turns of the runtime, so that
/// what arrived meanwhile but was not noticed yet (nobody drove the
/// runtime; a zero timeout) is still taken. `None` if that found nothing.
pub async fn within<F: Future>(timeout: Option<Duration>, fut: F) -> Option<F::Output> {
    let Some(timeout) = timeout else {
        return Some(fut.await);
    };
    let mut fut = std::pin::pin!(fut);
    let mut expiry = std::pin::pin!(tokio::time::sleep(timeout));
    let mut looks = 0;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if looks == 0 && expiry.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if looks == LAST_LOOKS {
            return Poll::Ready(None);
        }
        // Woken at once: the runtime polls its reactor and runs its tasks
        // (those that read ahead) before polling `fut` again.
        looks += 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Work to finish before the runtime goes: the closing of connections.
pub type Farewell = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Default)]
struct State {
    /// Threads waiting on the runtime (in `get`, `close`).
    callers: usize,
    /// Counts callers that came: the duty thread's wait restarts with each.
    arrivals: u64,
    /// Frames wait to be written (see [`Duties::pending`]): the duty thread
    /// takes over sooner.
    wanted: bool,
    /// The duty thread is driving the runtime.
    driving: bool,
    /// The duty thread sleeps until the last caller leaves.
    watching: bool,
    /// The duty thread runs (it may be asleep).
    started: bool,
    /// The endpoint is done: finish `farewells` and end the duty thread.
    stopping: bool,
    farewells: Vec<Farewell>,
}

/// An endpoint's runtime and the bookkeeping of who drives it.
pub struct Driver {
    rt: Option<Runtime>,
    duties: Arc<dyn Duties>,
    state: Mutex<State>,
    /// Wakes the sleeping duty thread.
    wake: Condvar,
    /// Asks the driving duty thread to let go of the runtime.
    step_aside: Notify,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

impl Driver {
    /// A driver of `rt` (see [`runtime`]), whose duty thread serves `duties`.
    pub fn new(rt: Runtime, duties: Arc<dyn Duties>) -> Arc<Driver> {
        Arc::new(Driver {
            rt: Some(rt),
            duties,
            state: Mutex::default(),
            wake: Condvar::new(),
            step_aside: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn rt(&self) -> &Runtime {
        // Only `drop` takes it.
        self.rt
            .as_ref()
            .unwrap_or_else(|| unreachable!("runtime taken before drop"))
    }

    /// Runs `fut` to completion on this thread with the GIL released,
    /// driving the endpoint's runtime meanwhile (or, while another thread
    /// drives it, sleeping until woken). A pending signal handler that raises
    /// (Ctrl-C's `KeyboardInterrupt`) ends the wait and drops `fut`.
    pub fn wait<F>(&self, py: Python<'_>, fut: F) -> PyResult<F::Output>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let _caller = self.arrive();
        let mut fut = std::pin::pin!(fut);
        let rt = self.rt();
        loop {
            // Buffers of frames written meanwhile are released, and their
            // `put` futures resolved, on this thread once it has the GIL.
            let step = crate::gil_jobs::detach_collecting(py, || {
                // The timer must be created on the runtime, hence the async block.
                rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, fut.as_mut()).await })
            });
            match step {
                Ok(out) => return Ok(out),
                Err(_) => py.check_signals()?,
            }
        }
    }

    /// Counts a caller in; the duty thread, if it drives, steps aside.
    fn arrive(&self) -> Caller<'_> {
        let mut s = self.lock();
        s.callers += 1;
        s.arrivals = s.arrivals.wrapping_add(1);
        if s.driving {
            self.step_aside.notify_one();
        }
        Caller(self)
    }

    /// Starts the duty thread (once); the endpoint calls it when made.
    pub fn start(self: &Arc<Self>) {
        let mut s = self.lock();
        self.ensure_thread(&mut s);
    }

    /// Says that frames wait to be written: if nobody calls, the duty thread
    /// takes over after [`GRACE`] rather than [`IDLE`].
    pub fn want(&self) {
        let mut s = self.lock();
        if s.wanted || s.stopping {
            return;
        }
        s.wanted = true;
        if s.callers == 0 && !s.driving {
            self.wake.notify_one();
        }
    }

    /// Ends the duty thread after it has run `farewells` (bounded by
    /// [`CLOSE_TIMEOUT`]); no more duties are taken.
    pub fn stop(self: &Arc<Self>, farewells: Vec<Farewell>) {
        let mut s = self.lock();
        s.stopping = true;
        s.farewells.extend(farewells);
        self.step_aside.notify_one();
        self.wake.notify_one();
    }

    fn ensure_thread(self: &Arc<Self>, s: &mut State) {
        if s.started {
            return;
        }
        let driver = self.clone();
        match std::thread::Builder::new()
            .name("tubeway-queue".into())
            .spawn(move || driver.duty_thread())
        {
            Ok(_) => s.started = true,
            // Then only callers drive: what `put` queued goes out during
            // the next `get` or `close`.
            Err(e) => tracing::warn!("cannot start a queue's duty thread: {e}"),
        }
    }

    fn duty_thread(self: Arc<Self>) {
        let rt = self.rt();
        let mut s = self.lock();
        // Callers counted at the last look: while they keep coming, one look
        // per period; while one call lasts, a wake-up when it ends.
        let mut seen = s.arrivals.wrapping_sub(1);
        loop {
            if s.stopping {
                let farewells = std::mem::take(&mut s.farewells);
                drop(s);
                rt.block_on(async {
                    let all = async {
                        for f in farewells {
                            f.await;
                        }
                    };
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, all).await;
                });
                return;
            }
            if s.callers > 0 && s.arrivals == seen {
                // One long call: its caller wakes this thread when it leaves.
                s.watching = true;
                s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            s.watching = false;
            seen = s.arrivals;
            let quiet = if s.wanted { GRACE } else { IDLE };
            let (guard, waited) = self
                .wake
                .wait_timeout(s, quiet)
                .unwrap_or_else(PoisonError::into_inner);
            s = guard;
            // Woken early (`want`, `stop`, a call ended), or callers came:
            // look again.
            if !waited.timed_out() || s.stopping || s.callers > 0 || s.arrivals != seen {
                continue;
            }
            s.driving = true;
            drop(s);
            self.duties.on_duty();
            rt.block_on(self.drive());
            s = self.lock();
            s.driving = false;
        }
    }

    /// The duty thread's turn: until a caller comes or the endpoint stops.
    async fn drive(&self) {
        loop {
            let aside = self.step_aside.notified();
            tokio::pin!(aside);
            aside.as_mut().enable();
            let hurry = {
                let mut s = self.lock();
                if s.callers > 0 || s.stopping {
                    return;
                }
                // Under the lock: a `want` after this look sets it again.
                if s.wanted && !self.duties.pending() {
                    s.wanted = false;
                }
                s.wanted
            };
            if hurry {
                tokio::select! {
                    () = &mut aside => {}
                    () = tokio::time::sleep(RECHECK) => {}
                }
            } else {
                aside.await;
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Never blocks, wherever the last handle goes.
            rt.shutdown_background();
        }
    }
}

/// A caller waiting on the runtime; counted out when dropped.
struct Caller<'a>(&'a Driver);

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.callers -= 1;
        if s.callers == 0 && s.watching {
            s.watching = false;
            self.0.wake.notify_one();
        }
    }
}
