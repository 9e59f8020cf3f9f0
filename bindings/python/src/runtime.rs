//! The runtime that runs every client and queue of the process, and the one
//! way Python threads wait on it: with the GIL released, waking every
//! [`SIGNAL_CHECK`] to let Ctrl-C interrupt the wait.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::{Builder, Runtime};

use crate::errors::Error;

/// How often a blocked call looks for a pending signal (Ctrl-C). Waking this
/// rarely costs nothing measurable and keeps interruption prompt.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

struct Shared {
    runtime: Runtime,
    /// The process that started the runtime: a forked child has none of its
    /// threads and must not use it.
    pid: u32,
}

fn shared() -> PyResult<&'static Shared> {
    static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("tubeway-py-io")
                .enable_all()
                .build()
                .map(|runtime| Shared {
                    runtime,
                    pid: std::process::id(),
                })
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::new_err(format!("cannot start the tubeway runtime: {e}")))
}

/// The process-wide runtime; an error in a child forked after it started.
pub fn runtime() -> PyResult<&'static Runtime> {
    let shared = shared()?;
    if shared.pid != std::process::id() {
        return Err(Error::new_err(
            "tubeway was used before this process was forked; a forked child must not use it: \
             start child processes with the 'spawn' or 'forkserver' method, or fork before \
             the first use of tubeway",
        ));
    }
    Ok(&shared.runtime)
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
