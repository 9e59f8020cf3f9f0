//! The native module of the Python package `tubeway` (`tubeway._tubeway`).
//!
//! Python code sees `tubeway.Client`, `tubeway.Server`, `tubeway.Message`,
//! the exception hierarchy and `tubeway.queue`; the package in
//! `python/tubeway` re-exports them with stubs and docs. Every wait releases
//! the GIL; Python callbacks run on blocking-pool threads, never on the I/O
//! threads.

mod buffer;
mod client;
mod errors;
mod gil_jobs;
mod handler;
mod inbox;
mod json;
mod message;
mod pyfuture;
mod queue;
mod runtime;
mod server;
mod subscription;
mod thread_state;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _tubeway(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<message::PyMessage>()?;
    m.add_class::<client::PyClient>()?;
    m.add_class::<server::PyServer>()?;
    m.add_class::<subscription::PySubscription>()?;
    m.add_class::<subscription::PyWorker>()?;
    m.add_class::<queue::PyEndpoint>()?;
    m.add_class::<queue::PyGetToken>()?;
    m.add_class::<inbox::PyLoopInbox>()?;
    m.add_class::<inbox::PyCredits>()?;
    m.add_class::<inbox::PyResponder>()?;
    m.add_class::<client::PyWaitHandle>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // POSIX only; where there is no fork there is nothing to tell.
    if let Ok(register) = m.py().import("os")?.getattr("register_at_fork") {
        let kwargs = pyo3::types::PyDict::new(m.py());
        kwargs.set_item(
            "after_in_child",
            wrap_pyfunction!(runtime::after_fork_in_child, m)?,
        )?;
        register.call((), Some(&kwargs))?;
    }
    let at_exit = wrap_pyfunction!(gil_jobs::at_exit, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (at_exit,))?;
    Ok(())
}
