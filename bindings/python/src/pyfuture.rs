//! Work on the runtime whose result a `concurrent.futures.Future` carries.

use std::future::Future;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::{gil_jobs, runtime};

/// A new, pending `concurrent.futures.Future`.
pub fn new_future(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static FUTURE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let class = FUTURE.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("concurrent.futures")?.getattr("Future")?.unbind())
    })?;
    class.bind(py).call0()
}

/// Resolves `future` with `result`, from any thread holding the GIL. A
/// future cancelled meanwhile is left as it is.
pub fn resolve(py: Python<'_>, future: &Py<PyAny>, result: PyResult<Py<PyAny>>) {
    let future = future.bind(py);
    if future
        .call_method0("done")
        .and_then(|d| d.is_truthy())
        .unwrap_or(true)
    {
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

/// Runs `work` on the runtime and returns a `concurrent.futures.Future` of
/// its result. `work` yields a function that makes the Python result; it
/// runs on the GIL thread, never on an I/O thread.
pub fn spawn<W, R>(py: Python<'_>, work: W) -> PyResult<Py<PyAny>>
where
    W: Future<Output = R> + Send + 'static,
    R: FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let future = new_future(py)?.unbind();
    let target = future.clone_ref(py);
    runtime::spawn(async move {
        let make = work.await;
        gil_jobs::post(move |py| {
            let result = make(py);
            resolve(py, &target, result);
        });
    })?;
    Ok(future)
}
