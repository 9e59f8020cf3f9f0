//! `tubeway._tubeway.Endpoint`: the native half of `tubeway.queue`, a
//! point-to-point link between processes with no broker. The server role
//! listens and numbers its peers from 1; a client connects to one server,
//! its peer 0. Python (`tubeway/_queue.py`) adds the serializers.
//!
//! An endpoint's connections live on a runtime of its own, driven by the
//! thread that waits in `get` (`driver.rs`): with one peer, `get` reads and
//! decodes the next object on its own thread; with several, their
//! read-ahead tasks run there and `get` takes from the inbox. Listening and
//! connecting happen on the process-wide runtime; each connection then
//! moves to the endpoint's.

mod driver;
mod framing;
mod outbox;
mod peer;
mod token;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tubeway_transport::{connect, Listener, Url, WaitStrategy};

use crate::message::COPY_BELOW;
use crate::runtime::{seconds, wait, wait_strategy};
use crate::{buffer, errors, gil_jobs, pyfuture};
use driver::{within, Driver, Duties, Farewell};
use peer::{Event, Peer};
pub use token::PyGetToken;

/// Received bytes an endpoint holds for `get` before its readers wait.
const INBOX_BUDGET: u32 = 16 << 20;
/// Pause between attempts while a client waits for its server to listen.
const CONNECT_RETRY: Duration = Duration::from_millis(20);

#[derive(Debug, Default)]
struct Peers {
    live: HashMap<u64, Peer>,
    closed: bool,
}

/// Everything the endpoint's tasks share.
#[derive(Debug)]
struct Shared {
    peers: Mutex<Peers>,
    /// Signalled whenever a peer joins.
    joined: tokio::sync::Notify,
    max_frame: usize,
    inbox_tx: mpsc::UnboundedSender<Event>,
    budget: Arc<Semaphore>,
    next_peer: AtomicU64,
    /// The endpoint's own runtime, where its connections are served.
    runtime: Handle,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Peers> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves `conn` to the endpoint's runtime and serves it as peer `id`.
    fn add(&self, id: u64, conn: tubeway_transport::Connection) -> std::io::Result<()> {
        if self.lock().closed {
            return Ok(());
        }
        let conn = {
            let _entered = self.runtime.enter();
            conn.reregister()?
        };
        let peer = peer::start(
            &self.runtime,
            id,
            conn,
            self.max_frame,
            self.inbox_tx.clone(),
            self.budget.clone(),
            INBOX_BUDGET,
        );
        let mut peers = self.lock();
        if peers.closed {
            peer.reader.abort();
            return Ok(());
        }
        peers.live.insert(id, peer);
        if peers.live.len() > 1 {
            // `get` reads inline only while there is one peer.
            for p in peers.live.values() {
                p.reading.resume();
            }
        }
        drop(peers);
        self.joined.notify_waiters();
        Ok(())
    }
}

impl Duties for Shared {
    fn pending(&self) -> bool {
        self.lock().live.values().any(|p| p.outbox.has_backlog())
    }

    fn on_duty(&self) {
        for p in self.lock().live.values() {
            p.reading.resume();
        }
    }
}

impl Drop for PyEndpoint {
    /// An endpoint dropped without `close()` stops listening and closes its
    /// connections in the background (on its duty thread), after writing
    /// what was put.
    fn drop(&mut self) {
        let peers = self.shut();
        let farewells: Vec<Farewell> = if peers.is_empty() {
            Vec::new()
        } else {
            vec![Box::pin(close_peers(peers))]
        };
        self.driver.stop(farewells);
    }
}

/// Writes what was put to each peer, then closes its connection.
async fn close_peers(peers: Vec<Peer>) {
    for p in peers {
        p.outbox.close().await;
        let _ = p.writer_task.await;
        p.reader.abort();
    }
}

/// The native queue endpoint.
#[pyclass(name = "Endpoint", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyEndpoint {
    shared: Arc<Shared>,
    driver: Arc<Driver>,
    inbox: tokio::sync::Mutex<mpsc::UnboundedReceiver<Event>>,
    /// Taken by a `get` cancelled meanwhile: the next `get` has it first.
    /// At most one: every `get` takes it before it reads anything else.
    held: Mutex<Option<Event>>,
    accept: Mutex<Option<JoinHandle<()>>>,
    url: String,
    server: bool,
    /// How `get` waits: `park`, or polling first (latency mode).
    wait: WaitStrategy,
}

/// A resolved future, shared by every `put` whose data was copied.
fn done_future(py: Python<'_>) -> PyResult<Py<PyAny>> {
    static DONE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    DONE.get_or_try_init(py, || {
        let f = pyfuture::new_future(py)?;
        f.call_method1("set_result", (py.None(),))?;
        Ok::<_, PyErr>(f.unbind())
    })
    .map(|f| f.clone_ref(py))
}

/// Resolves a put's future when the last of its borrowed buffers is released.
struct PutDone(Option<Py<PyAny>>);

impl Drop for PutDone {
    fn drop(&mut self) {
        if let Some(future) = self.0.take() {
            gil_jobs::post(move |py| pyfuture::resolve(py, &future, Ok(py.None())));
        }
    }
}

impl PyEndpoint {
    /// Stops listening and marks the endpoint closed; returns its peers.
    fn shut(&self) -> Vec<Peer> {
        if let Some(task) = self
            .accept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
        let mut state = self
            .shared
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        state.live.drain().map(|(_, p)| p).collect()
    }

    /// The peer, its read side and whether its writer has a backlog, when
    /// exactly one peer is connected.
    fn only_peer(&self) -> Option<(u64, Arc<peer::Reading>, bool)> {
        let state = self.shared.lock();
        let mut live = state.live.iter();
        match (live.next(), live.next()) {
            (Some((id, p)), None) => Some((*id, p.reading.clone(), p.outbox.has_backlog())),
            _ => None,
        }
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Option<Event>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_closed(&self) -> bool {
        self.shared
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed
    }

    fn senders(&self, peers: &[u64]) -> PyResult<Vec<Arc<outbox::Outbox>>> {
        let state = self
            .shared
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return Err(errors::closed("queue"));
        }
        if peers.is_empty() {
            if state.live.is_empty() {
                return Err(errors::ConnectionClosed::new_err("no peer is connected"));
            }
            return Ok(state.live.values().map(|p| p.outbox.clone()).collect());
        }
        peers
            .iter()
            .map(|id| {
                state.live.get(id).map(|p| p.outbox.clone()).ok_or_else(|| {
                    errors::ConnectionClosed::new_err(format!("peer {id} is not connected"))
                })
            })
            .collect()
    }
}

#[pymethods]
impl PyEndpoint {
    /// Listens on `url` (role "server") or connects to it (role "client",
    /// retrying until `timeout` seconds while the server is not up yet).
    #[new]
    #[pyo3(signature = (url, role, *, timeout=10.0, max_message_size=1<<30, wait="default"))]
    fn new(
        py: Python<'_>,
        url: &str,
        role: &str,
        timeout: f64,
        max_message_size: usize,
        wait: &str,
    ) -> PyResult<Self> {
        let parsed: Url = url.parse().map_err(|e: tubeway_transport::UrlError| {
            pyo3::exceptions::PyValueError::new_err(e.to_string())
        })?;
        let wait = wait_strategy(wait, &parsed)?;
        let server = match role {
            "server" => true,
            "client" => false,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "role must be 'server' or 'client', not {other:?}"
                )))
            }
        };
        let timeout = seconds(Some(timeout))?.unwrap_or_default();
        let (inbox_tx, inbox_rx) = mpsc::unbounded_channel();
        let rt = driver::runtime()?;
        let shared = Arc::new(Shared {
            peers: Mutex::default(),
            joined: tokio::sync::Notify::new(),
            max_frame: max_message_size.clamp(64 << 10, tubeway_proto::MAX_MESSAGE_SIZE_LIMIT),
            inbox_tx,
            budget: Arc::new(Semaphore::new(INBOX_BUDGET as usize)),
            next_peer: AtomicU64::new(1),
            runtime: rt.handle().clone(),
        });
        let driver = Driver::new(rt, shared.clone());
        let (accept, bound) = if server {
            let mut listener = crate::runtime::wait(py, Listener::bind(&parsed))?.map_err(|e| {
                errors::ConnectError::new_err(format!("cannot listen on {url}: {e}"))
            })?;
            let bound = listener.local_url().to_string();
            let state = shared.clone();
            let task = crate::runtime::spawn(async move {
                while let Ok(conn) = listener.accept().await {
                    let id = state.next_peer.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = state.add(id, conn) {
                        tracing::warn!(peer = id, "cannot serve a queue connection: {e}");
                    }
                }
            })?;
            (Some(task), bound)
        } else {
            let deadline = Instant::now() + timeout;
            let conn = crate::runtime::wait(py, async {
                loop {
                    match connect(&parsed).await {
                        Ok(conn) => return Ok(conn),
                        Err(e) if Instant::now() >= deadline => return Err(e),
                        Err(_) => tokio::time::sleep(CONNECT_RETRY).await,
                    }
                }
            })?
            .map_err(|e| errors::ConnectError::new_err(format!("cannot connect to {url}: {e}")))?;
            shared.add(0, conn).map_err(|e| {
                errors::ConnectError::new_err(format!("cannot serve the connection to {url}: {e}"))
            })?;
            (None, url.to_owned())
        };
        driver.start();
        Ok(PyEndpoint {
            shared,
            driver,
            inbox: tokio::sync::Mutex::new(inbox_rx),
            held: Mutex::default(),
            accept: Mutex::new(accept),
            url: bound,
            server,
            wait,
        })
    }

    /// The address: for a server, the one bound (with the real port).
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// "server" or "client".
    #[getter]
    fn role(&self) -> &'static str {
        if self.server {
            "server"
        } else {
            "client"
        }
    }

    /// The ids of the peers connected now.
    #[getter]
    fn peers(&self) -> Vec<u64> {
        let state = self
            .shared
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut ids: Vec<u64> = state.live.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Waits until at least `count` peers are connected; False on timeout.
    #[pyo3(signature = (count=1, timeout=None))]
    fn wait_for_peers(&self, py: Python<'_>, count: usize, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = seconds(timeout)?;
        let shared = self.shared.clone();
        let enough = move || {
            shared
                .peers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .live
                .len()
                >= count
        };
        let shared = self.shared.clone();
        wait(py, async move {
            let waiting = async {
                loop {
                    let joined = shared.joined.notified();
                    if enough() {
                        return;
                    }
                    joined.await;
                }
            };
            match timeout {
                Some(t) => tokio::time::timeout(t, waiting).await.is_ok(),
                None => {
                    waiting.await;
                    true
                }
            }
        })
    }

    /// Sends one object, its serialized `head` and its out-of-band
    /// `buffers`, to `peers` (every connected peer when empty). Never
    /// blocks: returns a concurrent.futures.Future that resolves once the
    /// buffers may be reused (at once when they were small enough to copy).
    #[pyo3(signature = (mimetype, head, buffers, peers))]
    fn send(
        &self,
        py: Python<'_>,
        mimetype: &str,
        head: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyList>,
        peers: Vec<u64>,
    ) -> PyResult<Py<PyAny>> {
        let senders = self.senders(&peers)?;
        let head = buffer::copy(head)?;
        let mut parts = Vec::with_capacity(buffers.len());
        let mut total = head.len();
        let mut future = None;
        let mut done: Option<Arc<PutDone>> = None;
        for item in buffers.iter() {
            let len = buffer::len(&item)?;
            total += len;
            if len >= COPY_BELOW {
                let d = done.get_or_insert_with(|| {
                    let f = pyfuture::new_future(py).map(Bound::unbind);
                    let f = f.ok();
                    future = f.as_ref().map(|f| f.clone_ref(py));
                    Arc::new(PutDone(f))
                });
                parts.push(buffer::borrow(
                    &item,
                    Some(d.clone() as Arc<dyn Send + Sync>),
                )?);
            } else {
                parts.push(buffer::copy(&item)?);
            }
        }
        drop(done);
        let frames =
            framing::encode(mimetype, head, parts, self.shared.max_frame).map_err(|e| {
                errors::TooLarge::new_err(format!("cannot send an object of {total} bytes: {e}"))
            })?;
        // A frame written whole at once releases its buffers in here (its
        // last reference is `frames`, moved in): the jobs that releases them
        // run on this thread, not the GIL thread.
        let sent = gil_jobs::detach_collecting(py, || {
            let frames = frames;
            senders
                .iter()
                .filter(|outbox| outbox.send(frames.clone()).is_ok())
                .count()
        });
        if senders.iter().any(|outbox| outbox.has_backlog()) {
            // Written by the runtime's tasks: whoever drives it next, or
            // the duty thread if nobody calls.
            self.driver.want();
        }
        // Some peers may have failed meanwhile; get() reports each. When
        // none took the object, nothing will be delivered: say so now.
        if sent == 0 {
            return Err(errors::ConnectionClosed::new_err(
                "no peer could take the object: the connection is closed",
            ));
        }
        match future {
            Some(f) => Ok(f),
            None => done_future(py),
        }
    }

    /// The next object: (peer, mimetype, head, buffers), buffers a list of
    /// the payloads as read-only memoryviews. Waits up to `timeout` seconds (None: as long as
    /// it takes) and raises Timeout; raises ConnectionClosed once for each
    /// peer that leaves, and at once when a client's server is gone.
    /// With `token`, the wait ends (raising `asyncio.CancelledError`) when
    /// the token is cancelled, and an object taken after the cancel is kept
    /// for the next `recv`, not lost (see `token.rs`).
    #[pyo3(signature = (timeout=None, token=None))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        token: Option<&PyGetToken>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let timeout = seconds(timeout)?;
        crate::runtime::runtime()?; // a forked child must not go on
        let shared = &self.shared;
        let server = self.server;
        let strategy = self.wait;
        let inline = self.only_peer();
        if self.is_closed() {
            return Err(errors::closed("queue"));
        }
        // `Err` when the token was cancelled as the event came: the event is
        // then held for the next get, under the inbox's lock, which every get
        // holds while it looks at what is held.
        let next = async {
            // Another thread's get() may hold the inbox: that wait counts
            // against this timeout too.
            let mut inbox = self.inbox.lock().await;
            let next = async {
                if let Some(ev) = self.lock_held().take() {
                    return Some(ev);
                }
                if let Ok(ev) = inbox.try_recv() {
                    return Some(ev);
                }
                let orphan = {
                    let state = shared.lock();
                    state.closed || (!server && state.live.is_empty())
                };
                if orphan {
                    return None;
                }
                // One peer: read on this thread, which this thread's own
                // wake-up (or polling) serves; no I/O thread in between.
                if let Some((peer, reading, flushing)) = inline {
                    if let Some(ev) = reading.inline(peer, &mut inbox, strategy, flushing).await {
                        return Some(ev);
                    }
                }
                inbox.recv().await
            };
            match next.await {
                Some(ev) if !token.is_none_or(PyGetToken::claim) => {
                    // Empty: this get took what was held before it read.
                    *self.lock_held() = Some(ev);
                    Err(())
                }
                next => Ok(next),
            }
        };
        let raced = async {
            let Some(token) = token else {
                return next.await;
            };
            tokio::select! {
                biased;
                next = next => next,
                () = token.cancelled() => Err(()),
            }
        };
        let event = match self.driver.wait(py, within(timeout, raced))? {
            Some(Err(())) => {
                return Err(pyo3::exceptions::asyncio::CancelledError::new_err(
                    "the get was cancelled",
                ))
            }
            Some(Ok(next)) => Some(next),
            // Timed out.
            None => None,
        };
        let event = event.ok_or(());
        match event {
            Err(()) => Err(errors::Timeout::new_err("no object arrived in time")),
            Ok(None) => Err(if self.is_closed() {
                errors::closed("queue")
            } else {
                errors::ConnectionClosed::new_err("the server is gone")
            }),
            Ok(Some(Event::Left { .. })) if self.is_closed() => Err(errors::closed("queue")),
            Ok(Some(Event::Left { peer, reason })) => {
                let removed = self
                    .shared
                    .peers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .live
                    .remove(&peer);
                if let Some(p) = removed {
                    p.reader.abort();
                }
                let err = errors::ConnectionClosed::new_err(format!("peer {peer} left: {reason}"));
                err.value(py).setattr("peer", peer)?;
                Err(err)
            }
            Ok(Some(Event::Object {
                peer,
                received,
                permits,
            })) => {
                self.shared.budget.add_permits(permits as usize);
                let head = buffer::export(py, received.head)?;
                let buffers = received
                    .buffers
                    .into_iter()
                    .map(|b| buffer::export(py, b))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(
                    py,
                    [
                        peer.into_pyobject(py)?.into_any(),
                        received.mimetype.into_pyobject(py)?.into_any(),
                        head,
                        PyList::new(py, buffers)?.into_any(),
                    ],
                )
            }
        }
    }

    /// Stops listening and closes every connection after what was put is
    /// written (waiting at most `timeout` seconds). Harmless twice.
    #[pyo3(signature = (timeout=5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = seconds(Some(timeout))?.unwrap_or_default();
        let peers = self.shut();
        if !peers.is_empty() {
            self.driver.wait(py, async move {
                let _ = tokio::time::timeout(timeout, close_peers(peers)).await;
            })?;
        }
        self.driver.stop(Vec::new());
        // Wake a get() waiting on the inbox.
        let _ = self.shared.inbox_tx.send(Event::Left {
            peer: u64::MAX,
            reason: "the queue was closed".into(),
        });
        Ok(())
    }
}
