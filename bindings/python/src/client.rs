//! `tubeway.Client`: every client operation, blocking with the GIL released.
//!
//! Built on the blocking Rust client: the Python thread that calls drives
//! the connection itself, GIL released (it writes the request, waits for
//! the answer on the connection, reads it and returns), so a call costs no
//! hand-off between threads. While a worker, a subscription's callback or
//! a `send_async` future needs serving with nobody calling, a thread of
//! the client's own reads instead.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use tubeway::ops::QueueKind;
use tubeway::{Client, ClientOptions, Message};

use crate::inbox::{Credits, Poster, PyCredits, PyLoopInbox, Reply};
use crate::message::{to_message, PyMessage};
use crate::runtime::{blocking, check_fork, drop_slot_detached, seconds, wait_strategy};
use crate::subscription::{PySubscription, PyWorker};
use crate::{errors, handler, json, pyfuture};

/// Deliveries of a `tubeway.aio` subscription in its loop's inbox and
/// callback at once, by default: the client-side buffer of a subscription.
const LOOP_CREDITS: usize = 1024;

/// A connection to a Tubeway broker, shared by any number of Python threads.
#[pyclass(name = "Client", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyClient {
    inner: Mutex<Option<Client>>,
    timeout: Duration,
}

/// The queue kind named by `kind` ("bounded" or "circular").
pub fn queue_kind(kind: &str) -> PyResult<QueueKind> {
    match kind {
        "bounded" => Ok(QueueKind::Bounded),
        "circular" => Ok(QueueKind::Circular),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "queue kind must be 'bounded' or 'circular', not {other:?}"
        ))),
    }
}

impl PyClient {
    fn client(&self) -> PyResult<Client> {
        check_fork()?;
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| errors::closed("client"))
    }

    /// Runs one operation on the client from this thread, GIL released.
    fn run<T, F>(&self, py: Python<'_>, op: F) -> PyResult<T>
    where
        F: FnOnce(&Client) -> tubeway::Result<T> + Send,
        T: Send,
    {
        let client = self.client()?;
        blocking(py, || op(&client))
    }

    /// Starts an operation in the background whose outcome `start` has
    /// posted (by its `Poster`) to `inbox`, for `future` on its loop.
    fn to_loop<R>(
        &self,
        inbox: &PyLoopInbox,
        future: Py<PyAny>,
        start: impl FnOnce(&Client, Poster) -> tubeway::Result<R>,
    ) -> PyResult<R> {
        let client = self.client()?;
        start(&client, inbox.poster(future)).map_err(|e| {
            inbox.not_sent();
            errors::to_py(e)
        })
    }

    fn timeout_or_default(&self, timeout: Option<f64>) -> PyResult<Duration> {
        Ok(seconds(timeout)?.unwrap_or(self.timeout))
    }
}

/// Withdraws a poll or an offer of `tubeway.aio` (see
/// `Client._poll_to_loop`, `Client._offer_to_loop`).
#[pyclass(name = "_WaitHandle", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyWaitHandle {
    handle: tubeway::blocking::WaitHandle,
}

#[pymethods]
impl PyWaitHandle {
    /// Withdraws the call unless its outcome is in already.
    fn withdraw(&self) {
        self.handle.withdraw();
    }
}

impl Drop for PyClient {
    fn drop(&mut self) {
        drop_slot_detached(&mut self.inner);
    }
}

#[pymethods]
impl PyClient {
    /// Connects to the broker at `url` (`tcp://host:port`, `unix:///path`,
    /// `shm://name`). `timeout` is the default for every call, in seconds.
    /// `wait` is how a call waits for its answer: `default` (the
    /// transport's: on shm poll briefly, then sleep; on sockets sleep at
    /// once), `park`, or `spin-park:DURATION` (poll that long, then sleep).
    /// `max_blocking_calls` is how many calls of this client's `serve`
    /// handlers may run at once; the broker is told, and holds further
    /// calls until one ends. `max_worker_calls` is the most calls the
    /// broker forwards to this client at once when it serves functions
    /// (default: `max_blocking_calls` for `serve`, no limit for
    /// `tubeway.aio`'s handlers). `handler_spin` is how long, in seconds, a
    /// thread of `serve`'s that has answered a call polls for the next one
    /// before it sleeps (default 0: it sleeps at once).
    #[new]
    #[pyo3(signature = (url, timeout=30.0, *, connect_timeout=5.0, max_message_size=None, name=None, wait="default", max_blocking_calls=None, max_worker_calls=None, handler_spin=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: String,
        timeout: f64,
        connect_timeout: f64,
        max_message_size: Option<usize>,
        name: Option<String>,
        wait: &str,
        max_blocking_calls: Option<usize>,
        max_worker_calls: Option<usize>,
        handler_spin: f64,
    ) -> PyResult<Self> {
        let parsed: tubeway::Url = url.parse().map_err(|e: tubeway_transport::UrlError| {
            pyo3::exceptions::PyValueError::new_err(e.to_string())
        })?;
        let mut options = ClientOptions {
            timeout: seconds(Some(timeout))?.unwrap_or_default(),
            connect_timeout: seconds(Some(connect_timeout))?.unwrap_or_default(),
            // The transport's own, unless asked.
            wait: (wait != "default")
                .then(|| wait_strategy(wait, &parsed))
                .transpose()?,
            ..ClientOptions::default()
        };
        if let Some(max) = max_message_size {
            options.max_message_size = max;
        }
        if let Some(max) = max_blocking_calls {
            options.max_blocking_calls = max;
        }
        options.max_worker_calls = max_worker_calls;
        options.handler_spin = Duration::try_from_secs_f64(handler_spin).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "handler_spin must be a non-negative number of seconds, not {handler_spin}"
            ))
        })?;
        options.name =
            name.unwrap_or_else(|| format!("tubeway-python/{}", env!("CARGO_PKG_VERSION")));
        let timeout = options.timeout;
        let client = blocking(py, || Client::connect_with(&url, options))?;
        Ok(PyClient {
            inner: Mutex::new(Some(client)),
            timeout,
        })
    }

    /// The broker's URL.
    #[getter]
    fn url(&self) -> PyResult<String> {
        Ok(self.client()?.url().to_string())
    }

    /// The largest message the broker accepts, in bytes.
    #[getter]
    fn max_message_size(&self) -> PyResult<usize> {
        Ok(self.client()?.max_message_size())
    }

    /// Whether the client is closed (by `close()` or because the connection ended).
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_none_or(Client::is_closed)
    }

    /// Closes the connection: calls in flight fail with ConnectionClosed;
    /// later calls raise ConnectionClosed. Closing twice is harmless.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let client = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(client) = client {
            // Dropped without the GIL too: the last handle flushes.
            blocking(py, move || client.close())?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// Calls `function` and returns its reply; raises on an error status.
    #[pyo3(signature = (function, message, timeout=None))]
    fn send(
        &self,
        py: Python<'_>,
        function: String,
        message: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<PyMessage> {
        let msg = to_message(message)?;
        let timeout = self.timeout_or_default(timeout)?;
        self.run(py, |c| c.send_timeout(&function, msg, timeout))
            .map(PyMessage::new)
    }

    /// Calls `function` without waiting: returns a concurrent.futures.Future
    /// of the reply (wrap it with asyncio.wrap_future in async code).
    #[pyo3(signature = (function, message, timeout=None))]
    fn send_async(
        &self,
        py: Python<'_>,
        function: String,
        message: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let mut msg = to_message(message)?;
        msg.timeout = Some(self.timeout_or_default(timeout)?);
        let (future, promise) = pyfuture::Promise::new(py)?;
        // The client's background thread reads the reply and hands it to
        // the GIL thread, which resolves the future.
        self.client()?
            .send_then(&function, msg, move |reply| {
                promise.fulfil(move |py| {
                    let reply = reply.map_err(errors::to_py)?;
                    Ok(Py::new(py, PyMessage::new(reply))?.into_any())
                });
            })
            .map_err(errors::to_py)?;
        Ok(future)
    }

    /// Calls `function`; the reply resolves `future`, an asyncio future of
    /// the loop that `inbox` belongs to, on that loop (see `tubeway.aio`).
    #[pyo3(signature = (function, message, inbox, future, timeout=None))]
    fn _send_to_loop(
        &self,
        function: String,
        message: &Bound<'_, PyAny>,
        inbox: &PyLoopInbox,
        future: Py<PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let mut msg = to_message(message)?;
        msg.timeout = Some(self.timeout_or_default(timeout)?);
        self.to_loop(inbox, future, |c, reply| {
            c.send_then(&function, msg, move |r| reply.post(Reply::Call(r)))
        })
    }

    /// Calls `function` without a reply.
    fn send_oneway(
        &self,
        py: Python<'_>,
        function: String,
        message: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let msg = to_message(message)?;
        self.run(py, |c| c.send_oneway(&function, msg))
    }

    /// Calls `destination` (a function, or with `publish` a topic to
    /// publish to) without a reply, without blocking: true when written at
    /// once; else it is written once there is room, and the outcome
    /// resolves `future` (`None`) on `inbox`'s loop.
    #[pyo3(signature = (destination, message, inbox, future, publish=false))]
    fn _oneway_to_loop(
        &self,
        destination: String,
        message: &Bound<'_, PyAny>,
        inbox: &PyLoopInbox,
        future: Py<PyAny>,
        publish: bool,
    ) -> PyResult<bool> {
        let msg = to_message(message)?;
        let written = self.to_loop(inbox, future, |c, reply| {
            let then = move |r| reply.post(Reply::Done(r));
            if publish {
                c.publish_oneway_then(&destination, msg, then)
            } else {
                c.send_oneway_then(&destination, msg, then)
            }
        })?;
        if written {
            // Nothing will come back for `future`.
            inbox.not_sent();
        }
        Ok(written)
    }

    /// Serves `function` from this process: `handler(message)` runs for each
    /// call on a worker thread; what it returns is the reply, an exception
    /// it raises is a handler_error for the caller.
    fn serve(&self, py: Python<'_>, function: String, handler: Py<PyAny>) -> PyResult<PyWorker> {
        let handler = Arc::new(handler);
        let worker = self.run(py, |c| {
            c.serve(&function, move |m: Message| {
                handler::call_function(&handler, m)
            })
        })?;
        Ok(PyWorker::new(worker))
    }

    /// Serves `function` for `tubeway.aio`: each call goes to `target` on
    /// the loop that `inbox` belongs to, as `target(message, responder)`,
    /// and is answered through the responder.
    fn _serve_on_loop(
        &self,
        py: Python<'_>,
        function: String,
        target: Py<PyAny>,
        inbox: &PyLoopInbox,
    ) -> PyResult<PyWorker> {
        let caller = inbox.caller(target);
        let worker = self.run(py, |c| {
            c.serve_deferred(&function, move |m: Message, answer| caller.call(m, answer))
        })?;
        Ok(PyWorker::new(worker))
    }

    /// Removes a function (every worker's registration, or a broker's local handler).
    fn remove_function(&self, py: Python<'_>, function: String) -> PyResult<()> {
        self.run(py, |c| c.remove_function(&function))
    }

    /// The status of a function, as a dict.
    fn function_status<'py>(
        &self,
        py: Python<'py>,
        function: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let status = self.run(py, |c| c.function_status(&function))?;
        json::to_py(py, &status)
    }

    /// Every function's status.
    fn list_functions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let list = self.run(py, Client::list_functions)?;
        json::to_py(py, &list)
    }

    /// Puts `message` on `queue`, waiting up to `timeout` seconds while a
    /// bounded queue is full (then QueueFull).
    #[pyo3(signature = (queue, message, timeout=0.0))]
    fn offer(
        &self,
        py: Python<'_>,
        queue: String,
        message: &Bound<'_, PyAny>,
        timeout: f64,
    ) -> PyResult<()> {
        let msg = to_message(message)?;
        let timeout = seconds(Some(timeout))?.unwrap_or_default();
        self.run(py, |c| c.offer(&queue, msg, timeout))
    }

    /// Takes the next message from `queue`, waiting up to `timeout` seconds;
    /// raises QueueEmpty when none came.
    #[pyo3(signature = (queue, timeout=0.0))]
    fn poll(&self, py: Python<'_>, queue: String, timeout: f64) -> PyResult<PyMessage> {
        let timeout = seconds(Some(timeout))?.unwrap_or_default();
        let got = self.run(py, |c| c.poll(&queue, timeout))?;
        got.map(PyMessage::new).ok_or_else(errors::queue_empty)
    }

    /// Polls `queue`; the result resolves `future`, an asyncio future of the
    /// loop that `inbox` belongs to, on that loop (see `tubeway.aio`). The
    /// returned handle withdraws the poll: a message the broker had taken for
    /// it goes back to its queue, as does one whose future was cancelled.
    #[pyo3(signature = (queue, timeout, inbox, future))]
    fn _poll_to_loop(
        &self,
        queue: String,
        timeout: f64,
        inbox: &PyLoopInbox,
        future: Py<PyAny>,
    ) -> PyResult<PyWaitHandle> {
        let timeout = seconds(Some(timeout))?.unwrap_or_default();
        let handle = self.to_loop(inbox, future, |c, reply| {
            c.poll_then(&queue, timeout, move |r| reply.post(Reply::Poll(r)))
        })?;
        Ok(PyWaitHandle { handle })
    }

    /// Offers `message` to `queue`; the outcome resolves `future` (`None`)
    /// on the loop that `inbox` belongs to (see `tubeway.aio`). The handle
    /// withdraws the offer.
    #[pyo3(signature = (queue, message, timeout, inbox, future))]
    fn _offer_to_loop(
        &self,
        queue: String,
        message: &Bound<'_, PyAny>,
        timeout: f64,
        inbox: &PyLoopInbox,
        future: Py<PyAny>,
    ) -> PyResult<PyWaitHandle> {
        let msg = to_message(message)?;
        let timeout = seconds(Some(timeout))?.unwrap_or_default();
        let handle = self.to_loop(inbox, future, |c, reply| {
            c.offer_then(&queue, msg, timeout, move |r| reply.post(Reply::Done(r)))
        })?;
        Ok(PyWaitHandle { handle })
    }

    /// Creates a queue (idempotent with the same settings); returns its status.
    #[pyo3(signature = (name, capacity=1000, kind="bounded"))]
    fn create_queue<'py>(
        &self,
        py: Python<'py>,
        name: String,
        capacity: u64,
        kind: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kind = queue_kind(kind)?;
        let status = self.run(py, |c| c.create_queue(&name, capacity, kind))?;
        json::to_py(py, &status)
    }

    /// Creates a queue named by the broker and removed when this client
    /// closes; returns its status (its name is `status["name"]`).
    #[pyo3(signature = (capacity=1000, kind="bounded"))]
    fn create_temporary_queue<'py>(
        &self,
        py: Python<'py>,
        capacity: u64,
        kind: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kind = queue_kind(kind)?;
        let status = self.run(py, |c| c.create_temporary_queue(capacity, kind))?;
        json::to_py(py, &status)
    }

    /// Removes a queue.
    fn remove_queue(&self, py: Python<'_>, name: String) -> PyResult<()> {
        self.run(py, |c| c.remove_queue(&name))
    }

    /// Whether a queue exists.
    fn exists_queue(&self, py: Python<'_>, name: String) -> PyResult<bool> {
        self.run(py, |c| c.exists_queue(&name))
    }

    /// The status of a queue, as a dict.
    fn queue_status<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let status = self.run(py, |c| c.queue_status(&name))?;
        json::to_py(py, &status)
    }

    /// Every queue's status.
    fn list_queues<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let list = self.run(py, Client::list_queues)?;
        json::to_py(py, &list)
    }

    /// Creates a topic (idempotent); returns its status.
    fn create_topic<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let status = self.run(py, |c| c.create_topic(&name))?;
        json::to_py(py, &status)
    }

    /// Removes a topic; its subscriptions end.
    fn remove_topic(&self, py: Python<'_>, name: String) -> PyResult<()> {
        self.run(py, |c| c.remove_topic(&name))
    }

    /// The status of a topic, as a dict.
    fn topic_status<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let status = self.run(py, |c| c.topic_status(&name))?;
        json::to_py(py, &status)
    }

    /// Every topic's status.
    fn list_topics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let list = self.run(py, Client::list_topics)?;
        json::to_py(py, &list)
    }

    /// Publishes `message` to `topic` and waits for the broker to accept it.
    fn publish(&self, py: Python<'_>, topic: String, message: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = to_message(message)?;
        self.run(py, |c| c.publish(&topic, msg))
    }

    /// Publishes `message` to `topic`; the outcome resolves `future`
    /// (`None`) on the loop that `inbox` belongs to (see `tubeway.aio`).
    fn _publish_to_loop(
        &self,
        topic: String,
        message: &Bound<'_, PyAny>,
        inbox: &PyLoopInbox,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let msg = to_message(message)?;
        self.to_loop(inbox, future, |c, reply| {
            c.publish_then(&topic, msg, move |r| reply.post(Reply::Done(r)))
        })
    }

    /// Publishes without waiting for the broker.
    fn publish_oneway(
        &self,
        py: Python<'_>,
        topic: String,
        message: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let msg = to_message(message)?;
        self.run(py, |c| c.publish_oneway(&topic, msg))
    }

    /// Subscribes to `topic`. With `callback`, it runs for each delivery, in
    /// order, on a thread of its own; without, read deliveries with
    /// `recv()` or by iterating. `buffer` bounds the deliveries held here.
    #[pyo3(signature = (topic, callback=None, *, buffer=None))]
    fn subscribe(
        &self,
        py: Python<'_>,
        topic: String,
        callback: Option<Py<PyAny>>,
        buffer: Option<usize>,
    ) -> PyResult<PySubscription> {
        self.run(py, |c| {
            let sub = match buffer {
                Some(n) => c.subscribe_with_buffer(&topic, n)?,
                None => c.subscribe(&topic)?,
            };
            Ok(match callback {
                Some(callback) => PySubscription::with_callback(sub, callback)?,
                None => PySubscription::pull(sub),
            })
        })
    }

    /// Subscribes to `topic` for `tubeway.aio`: deliveries go to `target`
    /// on the loop that `inbox` belongs to, at most `buffer` (default
    /// 1024) at once in the inbox and its callback; the returned credits
    /// take `release()` once the callback is done with each.
    #[pyo3(signature = (topic, target, inbox, buffer=None))]
    fn _subscribe_to_loop(
        &self,
        py: Python<'_>,
        topic: String,
        target: Py<PyAny>,
        inbox: &PyLoopInbox,
        buffer: Option<usize>,
    ) -> PyResult<(PySubscription, PyCredits)> {
        let credits = Arc::new(Credits::new(buffer.unwrap_or(LOOP_CREDITS)));
        let deliverer = inbox.deliverer(target, credits.clone());
        let kept = credits.clone();
        let sub = self.run(py, |c| {
            let sub = match buffer {
                Some(n) => c.subscribe_with_buffer(&topic, n)?,
                None => c.subscribe(&topic)?,
            };
            PySubscription::on_loop(sub, deliverer, kept)
        })?;
        Ok((sub, PyCredits { credits }))
    }

    /// Ends `subscription` (the same as `subscription.unsubscribe()`).
    fn unsubscribe(&self, py: Python<'_>, subscription: &PySubscription) -> PyResult<()> {
        subscription.unsubscribe(py)
    }

    /// Broker statistics, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.run(py, Client::stats)?;
        json::to_py(py, &stats)
    }

    /// One round trip to the broker, in seconds.
    fn ping(&self, py: Python<'_>) -> PyResult<f64> {
        self.run(py, Client::ping).map(|d| d.as_secs_f64())
    }

    fn __repr__(&self) -> String {
        match self.client() {
            Ok(c) => format!("tubeway.Client({:?})", c.url().to_string()),
            Err(_) => "tubeway.Client(closed)".to_owned(),
        }
    }
}
