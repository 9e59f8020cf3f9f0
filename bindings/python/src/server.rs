//! `tubeway.Server`: the broker embedded in a Python process.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use tubeway::broker::BrokerError;
use tubeway::{Broker, BrokerConfig, Message};

use crate::client::queue_kind;
use crate::message::{to_message, PyMessage};
use crate::{errors, handler, json, runtime};

/// A broker running on threads of its own inside this process.
#[pyclass(name = "Server", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyServer {
    broker: Broker,
    urls: Vec<String>,
    server: Mutex<Option<tubeway::Server>>,
}

fn broker_error(e: BrokerError) -> PyErr {
    errors::status_error(e.status, &e.reason)
}

impl PyServer {
    fn broker(&self) -> PyResult<&Broker> {
        if self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
        {
            return Err(errors::closed("server"));
        }
        Ok(&self.broker)
    }
}

#[pymethods]
impl PyServer {
    /// Starts a broker serving every URL in `listen` (`tcp://127.0.0.1:0`
    /// picks a free port: see `urls`). Sizes in bytes, times in seconds.
    #[new]
    #[pyo3(signature = (listen=vec!["tcp://127.0.0.1:0".to_owned()], *, max_message_size=None, max_connections=None, subscriber_buffer=None, shutdown_timeout=None))]
    fn new(
        py: Python<'_>,
        listen: Vec<String>,
        max_message_size: Option<usize>,
        max_connections: Option<usize>,
        subscriber_buffer: Option<usize>,
        shutdown_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let mut config = BrokerConfig::default();
        if let Some(n) = max_message_size {
            config = config.max_message_size(n);
        }
        if let Some(n) = max_connections {
            config = config.max_connections(n);
        }
        if let Some(n) = subscriber_buffer {
            config = config.subscriber_buffer(n);
        }
        if let Some(t) = runtime::seconds(shutdown_timeout)? {
            config = config.shutdown_timeout(t);
        }
        let server = py
            .detach(|| {
                let listen: Vec<&str> = listen.iter().map(String::as_str).collect();
                tubeway::Server::start(config, &listen)
            })
            .map_err(errors::to_py)?;
        Ok(PyServer {
            broker: server.broker().clone(),
            urls: server.urls().iter().map(ToString::to_string).collect(),
            server: Mutex::new(Some(server)),
        })
    }

    /// The addresses served, with the real ports where 0 was asked for.
    #[getter]
    fn urls(&self) -> Vec<String> {
        self.urls.clone()
    }

    /// The first address served.
    #[getter]
    fn url(&self) -> String {
        self.urls.first().cloned().unwrap_or_default()
    }

    /// Whether the server is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Serves `name` with `handler(message)`, run on a worker thread for each
    /// call: its return value is the reply; an exception it raises is a
    /// handler_error with the exception's message, and serving goes on. A
    /// call that outlasts its timeout is answered `timeout`.
    fn create_function(&self, name: &str, handler: Py<PyAny>) -> PyResult<()> {
        self.broker()?
            // On the blocking pool: an I/O thread never waits for the GIL.
            // Python code there may use the blocking client.
            .create_blocking_function(name, move |m: Message| {
                tubeway::blocking::allow_blocking(|| handler::call_function(&handler, m))
            })
            .map_err(broker_error)
    }

    /// Removes a function.
    fn remove_function(&self, name: &str) -> PyResult<()> {
        self.broker()?.remove_function(name).map_err(broker_error)
    }

    /// Creates a queue; returns its status.
    #[pyo3(signature = (name, capacity=1000, kind="bounded"))]
    fn create_queue<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        capacity: u64,
        kind: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let status = self
            .broker()?
            .create_queue(name, capacity, queue_kind(kind)?)
            .map_err(broker_error)?;
        json::to_py(py, &status)
    }

    /// Removes a queue.
    fn remove_queue(&self, name: &str) -> PyResult<()> {
        self.broker()?.remove_queue(name).map_err(broker_error)
    }

    /// Creates a topic; returns its status.
    fn create_topic<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let status = self.broker()?.create_topic(name).map_err(broker_error)?;
        json::to_py(py, &status)
    }

    /// Removes a topic.
    fn remove_topic(&self, name: &str) -> PyResult<()> {
        self.broker()?.remove_topic(name).map_err(broker_error)
    }

    /// Publishes `message` to `topic` from inside the process.
    fn publish(&self, topic: &str, message: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = to_message(message)?;
        self.broker()?.publish(topic, msg).map_err(broker_error)
    }

    /// Calls a function from inside the process.
    fn call(
        &self,
        py: Python<'_>,
        function: String,
        message: &Bound<'_, PyAny>,
    ) -> PyResult<PyMessage> {
        let msg = to_message(message)?;
        let broker = self.broker()?.clone();
        // The broker's handlers run on the server's own runtime; this call
        // only waits, so any runtime may drive it.
        let reply = runtime::wait(py, async move { broker.call(&function, msg).await })?;
        reply.map(PyMessage::new).map_err(broker_error)
    }

    /// Broker statistics, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json::to_py(py, &self.broker()?.stats())
    }

    /// Shuts the broker down: stops accepting, answers waiting polls and
    /// offers with `unavailable`, lets calls in flight finish, closes every
    /// connection. Closing twice is harmless.
    fn close(&self, py: Python<'_>) {
        let server = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(server) = server {
            py.detach(move || server.shutdown());
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("tubeway.Server({:?})", self.urls)
    }
}

impl Drop for PyServer {
    /// A server dropped without `close()` shuts down on a thread of its own:
    /// shutting down waits for calls in flight, whose Python handlers need
    /// the GIL that the dropping thread holds.
    fn drop(&mut self) {
        let server = self
            .server
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(server) = server {
            let _ = std::thread::Builder::new()
                .name("tubeway-py-shutdown".into())
                .spawn(move || server.shutdown());
        }
    }
}
