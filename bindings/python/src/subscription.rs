//! Subscriptions and served functions, as Python objects that end them.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use tubeway::blocking::{Subscription, SubscriptionHandle, Worker};

use crate::inbox::{Credits, Deliverer};
use crate::message::PyMessage;
use crate::runtime::{blocking, drop_slot_detached, seconds};
use crate::{errors, handler};

#[derive(Debug)]
enum Kind {
    Pull(Subscription),
    /// Deliveries go to the callback on a thread of the client's, one at a
    /// time and in order; unsubscribing waits for a call in progress.
    Callback(SubscriptionHandle),
    /// Deliveries go to an event loop's inbox (see [`crate::inbox`]).
    Loop(OnLoop),
}

/// A subscription of `tubeway.aio`. Ended, its delivering thread stops
/// waiting for credit the loop may never give.
#[derive(Debug)]
struct OnLoop {
    handle: Option<SubscriptionHandle>,
    credits: Arc<Credits>,
}

impl OnLoop {
    fn unsubscribe(mut self) -> tubeway::Result<()> {
        self.credits.end();
        match self.handle.take() {
            Some(handle) => handle.unsubscribe(),
            None => Ok(()),
        }
    }
}

impl Drop for OnLoop {
    fn drop(&mut self) {
        self.credits.end();
    }
}

/// Ending something the closing of the connection has ended already is no error.
fn ended(r: tubeway::Result<()>) -> tubeway::Result<()> {
    match r {
        Err(tubeway::Error::ConnectionClosed(_)) => Ok(()),
        r => r,
    }
}

/// A subscription to a topic. Use it as a context manager, or call
/// `unsubscribe()`; deleting it unsubscribes too.
#[pyclass(name = "Subscription", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PySubscription {
    inner: Mutex<Option<Kind>>,
    topic: String,
    id: String,
}

impl PySubscription {
    /// A subscription read with `recv()`.
    pub fn pull(sub: Subscription) -> Self {
        PySubscription {
            topic: sub.topic().to_owned(),
            id: sub.id().to_string(),
            inner: Mutex::new(Some(Kind::Pull(sub))),
        }
    }

    /// A subscription whose deliveries go to `callback`.
    pub fn with_callback(sub: Subscription, callback: Py<PyAny>) -> tubeway::Result<Self> {
        let topic = sub.topic().to_owned();
        let id = sub.id().to_string();
        let callback = Arc::new(callback);
        let handle =
            sub.with_batch_handler(move |batch| handler::call_subscriber(&callback, batch))?;
        Ok(PySubscription {
            topic,
            id,
            inner: Mutex::new(Some(Kind::Callback(handle))),
        })
    }

    /// A subscription whose deliveries `deliverer` posts to an event loop.
    pub fn on_loop(
        sub: Subscription,
        deliverer: Deliverer,
        credits: Arc<Credits>,
    ) -> tubeway::Result<Self> {
        let topic = sub.topic().to_owned();
        let id = sub.id().to_string();
        let handle = sub.with_handler(move |m| deliverer.deliver(m))?;
        let on_loop = OnLoop {
            handle: Some(handle),
            credits,
        };
        Ok(PySubscription {
            topic,
            id,
            inner: Mutex::new(Some(Kind::Loop(on_loop))),
        })
    }

    fn take(&self) -> Option<Kind> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn put_back(&self, kind: Kind) {
        *self.inner.lock().unwrap_or_else(PoisonError::into_inner) = Some(kind);
    }
}

impl Drop for PySubscription {
    fn drop(&mut self) {
        drop_slot_detached(&mut self.inner);
    }
}

#[pymethods]
impl PySubscription {
    /// The topic.
    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }

    /// The subscription id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// The next delivery, waiting up to `timeout` seconds (None: as long as
    /// it takes). Raises Timeout, or ConnectionClosed once the subscription
    /// has ended. Only for subscriptions made without a callback.
    #[pyo3(signature = (timeout=None))]
    pub fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyMessage> {
        let timeout = seconds(timeout)?;
        let mut sub = match self.take() {
            Some(Kind::Pull(sub)) => sub,
            Some(other) => {
                self.put_back(other);
                return Err(errors::Error::new_err(
                    "this subscription delivers to its callback; recv() is for subscriptions without one",
                ));
            }
            None => {
                return Err(errors::closed(
                    "subscription (or another thread is receiving on it)",
                ))
            }
        };
        let got = blocking(py, || match timeout {
            Some(t) => sub.recv_timeout(t),
            None => sub.recv().map(Some),
        });
        self.put_back(Kind::Pull(sub));
        match got? {
            Some(msg) => Ok(PyMessage::new(msg)),
            None => Err(errors::Timeout::new_err("no delivery in time")),
        }
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyMessage>> {
        match self.recv(py, None) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.is_instance_of::<errors::ConnectionClosed>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends the subscription and waits for the broker to confirm. Harmless
    /// when already ended.
    pub fn unsubscribe(&self, py: Python<'_>) -> PyResult<()> {
        match self.take() {
            Some(Kind::Pull(sub)) => blocking(py, || ended(sub.unsubscribe())),
            Some(Kind::Callback(handle)) => blocking(py, || ended(handle.unsubscribe())),
            Some(Kind::Loop(on_loop)) => blocking(py, || ended(on_loop.unsubscribe())),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.unsubscribe(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "tubeway.Subscription(topic={:?}, id={:?})",
            self.topic, self.id
        )
    }
}

/// A function this process serves through a client. `stop()` ends it;
/// deleting it stops too.
#[pyclass(name = "Worker", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyWorker {
    inner: Mutex<Option<Worker>>,
    function: String,
}

impl PyWorker {
    /// Wraps a worker.
    pub fn new(worker: Worker) -> Self {
        PyWorker {
            function: worker.function().to_owned(),
            inner: Mutex::new(Some(worker)),
        }
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        drop_slot_detached(&mut self.inner);
    }
}

#[pymethods]
impl PyWorker {
    /// The function served.
    #[getter]
    fn function(&self) -> &str {
        &self.function
    }

    /// Stops serving and waits for the broker to confirm. Harmless when stopped.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let worker = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match worker {
            Some(w) => blocking(py, || ended(w.stop())),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("tubeway.Worker(function={:?})", self.function)
    }
}
