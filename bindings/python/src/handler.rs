//! Running Python callables for the Rust side: function handlers and
//! subscribers. Each call takes the GIL only while the Python code runs, on
//! a blocking-pool thread, never on an I/O thread.

use pyo3::prelude::*;
use tubeway::{Batch, HandlerError, Message};

use crate::gil_jobs;
use crate::message::{to_message, PyMessage};

/// Calls `handler(message)` and makes a reply of what it returns: `None` is
/// an empty reply; a `Message`, str, bytes-like or JSON-compatible value is
/// the reply's payload. An exception becomes the error, with its message.
pub fn call_function(handler: &Py<PyAny>, msg: Message) -> Result<Message, HandlerError> {
    gil_jobs::attach(|py| {
        let out = handler
            .call1(py, (PyMessage::new(msg),))
            .map_err(|e| exception_text(py, &e))?;
        let out = out.bind(py);
        if out.is_none() {
            return Ok(Message::request());
        }
        to_message(out).map_err(|e| exception_text(py, &e))
    })
    .unwrap_or_else(|| Err("the Python interpreter is exiting".into()))
}

/// Calls `callback(message)` for each delivery of a subscription's batch,
/// taking the GIL once for the batch (taking it from a thread Python did
/// not start makes and ends a thread state each time). An exception is
/// reported as unraisable (printed to stderr) and the next delivery still
/// runs.
pub fn call_subscriber(callback: &Py<PyAny>, batch: &mut Batch<'_>) {
    let called = gil_jobs::attach(|py| {
        for msg in batch.by_ref() {
            if let Err(e) = callback.call1(py, (PyMessage::new(msg),)) {
                e.write_unraisable(py, Some(callback.bind(py)));
            }
        }
    });
    if called.is_none() {
        // The interpreter is exiting: nobody takes these any more.
        batch.for_each(drop);
    }
}

/// The text of a handler's exception: its message, or its class name when
/// the message is empty.
pub fn exception_text(py: Python<'_>, e: &PyErr) -> HandlerError {
    let text = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    if text.is_empty() {
        let name = e
            .get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "exception".into());
        return name.into();
    }
    text.into()
}
