//! `concurrent.futures.Future`s resolved from Rust threads.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::gil_jobs;

/// A new, pending `concurrent.futures.Future`.
pub fn new_future(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static FUTURE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let class = FUTURE.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("concurrent.futures")?.getattr("Future")?.unbind())
    })?;
    class.bind(py).call0()
}

/// Whether `future` (concurrent or asyncio) is done: cancelled, say.
pub fn is_done(future: &Bound<'_, PyAny>) -> bool {
    future
        .call_method0("done")
        .and_then(|d| d.is_truthy())
        .unwrap_or(true)
}

/// Resolves `future` with `result`, from any thread holding the GIL. A
/// future cancelled meanwhile is left as it is.
pub fn resolve(py: Python<'_>, future: &Py<PyAny>, result: PyResult<Py<PyAny>>) {
    let future = future.bind(py);
    if is_done(future) {
        return;
    }
    let outcome = match result {
        Ok(value) => future.call_method1("set_result", (value,)),
        Err(e) => future.call_method1("set_exception", (e.into_value(py),)),
    };
    if let Err(e) = outcome {
        e.write_unraisable(py, Some(future));
    }
}

/// What resolves a pending `concurrent.futures.Future` from any thread.
pub struct Promise(Py<PyAny>);

impl Promise {
    /// A new pending future, and its promise.
    pub fn new(py: Python<'_>) -> PyResult<(Py<PyAny>, Promise)> {
        let future = new_future(py)?.unbind();
        let target = future.clone_ref(py);
        Ok((future, Promise(target)))
    }

    /// Resolves the future with what `make` makes; `make` runs on the GIL
    /// thread, never on the thread that calls this (an I/O thread).
    pub fn fulfil<R>(self, make: R)
    where
        R: FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        gil_jobs::post(move |py| {
            let result = make(py);
            resolve(py, &self.0, result);
        });
    }
}
