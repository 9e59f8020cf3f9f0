//! How Python threads wait: with the GIL released, waking every
//! [`SIGNAL_CHECK`] to let Ctrl-C interrupt the wait, either in a call of
//! the blocking client ([`blocking`]) or on the process-wide runtime that
//! binds queues' listeners and runs the embedded servers' calls ([`wait`]).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::{Builder, Runtime};
use tubeway::{Url, WaitStrategy};

use crate::errors::Error;

/// How often a blocked call looks for a pending signal (Ctrl-C). Waking this
/// rarely costs nothing measurable and keeps interruption prompt.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Whether this process has used tubeway.
static USED: AtomicBool = AtomicBool::new(false);
/// Set in a child forked after its parent used tubeway: it has none of the
/// parent's threads, and shares its connections.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Called by `os.fork` in the child (registered with `os.register_at_fork`
/// when the module loads): a flag, where comparing process ids would cost a
/// system call on every call.
#[pyfunction]
pub fn after_fork_in_child() {
    if USED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    }
}

/// Fails in a child forked after its parent used tubeway.
pub fn check_fork() -> PyResult<()> {
    if !USED.load(Ordering::Relaxed) {
        USED.store(true, Ordering::Relaxed);
    }
    if !FORKED.load(Ordering::Relaxed) {
        return Ok(());
    }
    Err(Error::new_err(
        "tubeway was used before this process was forked; a forked child must not use it: \
         start child processes with the 'spawn' or 'forkserver' method, or fork before \
         the first use of tubeway",
    ))
}

fn shared() -> PyResult<&'static Runtime> {
    static SHARED: OnceLock<Result<Runtime, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("tubeway-py-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::new_err(format!("cannot start the tubeway runtime: {e}")))
}

/// The process-wide runtime; an error in a child forked after it started.
pub fn runtime() -> PyResult<&'static Runtime> {
    check_fork()?;
    shared()
}

thread_local! {
    /// The exception a signal handler raised during a blocking call of this
    /// thread's, kept for the call to raise (see [`blocking`]).
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The interrupt check of [`blocking`]: runs pending signal handlers.
fn signal_raised() -> bool {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            RAISED.with(|r| *r.borrow_mut() = Some(e));
            true
        }
    })
}

thread_local! {
    /// Whether this is Python's main thread, once asked.
    static MAIN_THREAD: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether this is Python's main thread, the only one that runs signal
/// handlers (and so the only one Ctrl-C interrupts).
fn on_main_thread(py: Python<'_>) -> bool {
    MAIN_THREAD.with(|main| {
        *main.get().get_or_insert_with(|| {
            let is_main = || -> PyResult<bool> {
                let threading = py.import("threading")?;
                let current = threading.call_method0("current_thread")?;
                Ok(current.is(&threading.call_method0("main_thread")?))
            };
            // When in doubt, look for signals: it costs a little, never misses one.
            is_main().unwrap_or(true)
        })
    })
}

/// Runs `op`, a call of the blocking client, with the GIL released: the
/// calling thread drives the client's connection itself (no hand-off to
/// an I/O thread). On Python's main thread, every [`SIGNAL_CHECK`] of
/// waiting, it runs pending signal handlers; one that raises (Ctrl-C's
/// `KeyboardInterrupt`) ends the wait, abandoning the operation as a
/// timeout would, and the call raises it. Other threads never run signal
/// handlers, so they wait without taking the GIL back to look: a waiting
/// thread that holds the connection's reader (reading for every caller)
/// then never waits for the GIL meanwhile.
pub fn blocking<T, F>(py: Python<'_>, op: F) -> PyResult<T>
where
    F: FnOnce() -> tubeway::Result<T> + Send,
    T: Send,
{
    check_fork()?;
    let out = if on_main_thread(py) {
        py.detach(|| tubeway::blocking::interruptible(SIGNAL_CHECK, signal_raised, op))
    } else {
        py.detach(op)
    };
    match out {
        Ok(v) => Ok(v),
        Err(tubeway::Error::Interrupted) => Err(RAISED
            .with(|r| r.borrow_mut().take())
            .unwrap_or_else(|| pyo3::exceptions::PyKeyboardInterrupt::new_err(()))),
        Err(e) => Err(crate::errors::to_py(e)),
    }
}

/// Drops `value` on a thread of its own: what the Rust side must finish
/// when its last handle goes (flushing a connection) then waits without
/// the GIL, which a Python object's finalizer holds.
pub fn drop_detached<T: Send + 'static>(value: T) {
    // Should no thread start, the closure, and `value` in it, drop here.
    let _ = std::thread::Builder::new()
        .name("tubeway-drop".into())
        .spawn(move || drop(value));
}

/// What `slot` still holds, dropped by [`drop_detached`]: for the finalizer
/// of an object that was not closed.
pub fn drop_slot_detached<T: Send + 'static>(slot: &mut Mutex<Option<T>>) {
    if let Some(value) = slot
        .get_mut()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        drop_detached(value);
    }
}

/// Runs `fut` to completion with the GIL released. A pending signal handler
/// that raises (Ctrl-C's `KeyboardInterrupt`) ends the wait and drops `fut`,
/// which cancels the operation.
pub fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let handle = runtime()?.handle();
    let mut fut = std::pin::pin!(fut);
    loop {
        let step = py.detach(|| {
            // The timer must be created on the runtime, hence the async block.
            handle.block_on(async { tokio::time::timeout(SIGNAL_CHECK, fut.as_mut()).await })
        });
        match step {
            Ok(out) => return Ok(out),
            Err(_) => py.check_signals()?,
        }
    }
}

/// Spawns `fut` on the runtime.
pub fn spawn<F>(fut: F) -> PyResult<tokio::task::JoinHandle<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Ok(runtime()?.spawn(fut))
}

/// A timeout in float seconds as a duration; `None` stays `None`.
pub fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "timeout must be a non-negative number of seconds, not {s}"
                ))
            })
        })
        .transpose()
}

/// A wait strategy (`park`, `spin-park:50us`): only strategies that end up
/// sleeping, so that nothing spins a core for as long as a wait lasts.
/// `default` is the transport's own: on shared memory a spin about as long
/// as a wake-up costs, then sleep; on sockets, sleep at once.
pub fn wait_strategy(wait: &str, url: &Url) -> PyResult<WaitStrategy> {
    if wait == "default" {
        return Ok(url.default_wait());
    }
    let strategy: WaitStrategy =
        wait.parse()
            .map_err(|e: tubeway_transport::WaitStrategyError| {
                pyo3::exceptions::PyValueError::new_err(e.to_string())
            })?;
    match (strategy.parks(), strategy.spin()) {
        (true, Some(_)) => Ok(strategy),
        _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "wait strategy {wait:?} never sleeps; use 'default', 'park' or 'spin-park:DURATION'"
        ))),
    }
}
