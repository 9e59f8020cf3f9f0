//! Replies handed straight to an asyncio event loop.
//!
//! `tubeway.aio` awaits a call on an asyncio future that the thread reading
//! the connection cannot resolve itself: it must not wait for the GIL, and
//! an asyncio future belongs to its loop's thread. So the reader puts the
//! reply in the loop's inbox and, when the inbox was empty, writes a byte to
//! a socket the loop watches (`loop.add_reader`); the loop's thread then
//! resolves every future whose reply is in, in one go. One wake-up of the
//! loop per batch of replies, no thread of Python's in between (the way of
//! `concurrent.futures` and `call_soon_threadsafe` costs a hand-off to the
//! thread that resolves futures, then one to the loop, for every call).
//!
//! A function served by `tubeway.aio` too: each call goes into the inbox
//! with a [`PyResponder`], and the loop runs the handler and answers
//! through it, the handler never on a thread of its own; the loop's thread
//! writes the answer itself.
//!
//! A subscription of `tubeway.aio` comes the same way: its deliveries go
//! into the inbox, and the loop hands each to the subscription's callback.
//! The thread that delivers holds at most so many in the inbox and the
//! callback at once ([`Credits`]), so a loop that falls behind slows the
//! subscription (and the broker counts drops) rather than queue without
//! bound.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use tubeway::blocking::Polled;
use tubeway::{HandlerError, Message};

use crate::message::{to_message, PyMessage};
use crate::{errors, handler, pyfuture};

/// Replies waiting for the loop, and how it is woken.
#[derive(Debug)]
pub struct Shared {
    ready: Mutex<Ready>,
    /// The writing end of the loop's wake-up socket.
    bell: UnixStream,
    /// Futures handed out and deliveries posted, not yet taken by the loop.
    in_flight: AtomicUsize,
}

/// What waits for the loop.
type Ready = Vec<Entry>;

#[derive(Debug)]
enum Entry {
    /// A reply, with the future it resolves.
    Reply(Py<PyAny>, Reply),
    /// A delivery, with what takes it on the loop.
    Delivery(Arc<Py<PyAny>>, Message),
    /// A call of a served function, with what runs it on the loop and
    /// what answers it.
    Call(Arc<Py<PyAny>>, Message, Answer),
}

/// What answers a served call: the loop's thread writes the answer itself.
pub type Answer = tubeway::Responder;

/// Posts calls of a function served on an event loop to its inbox.
#[derive(Debug)]
pub struct Caller {
    shared: Arc<Shared>,
    /// Runs each call on the loop.
    target: Arc<Py<PyAny>>,
}

impl Caller {
    /// Hands `msg` to the loop; the outcome comes back through `answer`.
    pub fn call(&self, msg: Message, answer: Answer) {
        self.shared
            .post_counted(Entry::Call(self.target.clone(), msg, answer));
    }
}

/// Answers one call of a function served by `tubeway.aio`, once: with what
/// its handler returned, or with the exception it raised. Dropped
/// unanswered, the call fails.
#[pyclass(name = "_Responder", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyResponder {
    answer: Mutex<Option<Answer>>,
}

impl PyResponder {
    fn send(&self, outcome: Result<Message, HandlerError>) {
        let answer = self
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(answer) = answer {
            answer.answer(outcome);
        }
    }
}

#[pymethods]
impl PyResponder {
    /// Answers with `value` made a reply (`None`: empty; a `Message`,
    /// str, bytes-like or JSON-compatible value: the payload).
    fn reply(&self, value: &Bound<'_, PyAny>) {
        let outcome = if value.is_none() {
            Ok(Message::request())
        } else {
            to_message(value).map_err(|e| handler::exception_text(value.py(), &e))
        };
        self.send(outcome);
    }

    /// Answers with the failure `error` (the handler's exception).
    fn fail(&self, error: &Bound<'_, PyAny>) {
        let err = PyErr::from_value(error.clone());
        self.send(Err(handler::exception_text(error.py(), &err)));
    }
}

/// What resolves a future.
pub enum Reply {
    /// A function call's reply.
    Call(tubeway::Result<Message>),
    /// The outcome of an operation that returns nothing (an offer, a publish).
    Done(tubeway::Result<()>),
    /// A poll's result; a message whose future was cancelled meanwhile goes
    /// back to its queue (as [`Polled`] drops).
    Poll(tubeway::Result<Option<Polled>>),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Call(r) => f.debug_tuple("Call").field(r).finish(),
            Reply::Done(r) => f.debug_tuple("Done").field(r).finish(),
            Reply::Poll(r) => f.debug_tuple("Poll").field(r).finish(),
        }
    }
}

impl Reply {
    /// The future's result, made on the loop's thread.
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let message = match self {
            Reply::Call(reply) => reply.map_err(errors::to_py)?,
            Reply::Done(done) => {
                done.map_err(errors::to_py)?;
                return Ok(py.None());
            }
            Reply::Poll(polled) => polled
                .map_err(errors::to_py)?
                .ok_or_else(errors::queue_empty)?
                .into_message(),
        };
        Ok(Py::new(py, PyMessage::new(message))?.into_any())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`post`](Self::post) of an entry no future was handed out for
    /// (a delivery, a call): counted in flight here.
    fn post_counted(&self, entry: Entry) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.post(entry);
    }

    /// Hands `entry` to the loop, from any thread, without the GIL.
    fn post(&self, entry: Entry) {
        let first = {
            let mut ready = self.lock();
            ready.push(entry);
            ready.len() == 1
        };
        if first {
            // Full means bytes are there already: the loop wakes anyway.
            let _ = (&self.bell).write(&[1]);
        }
    }
}

/// Posts one future's reply to its loop's inbox, from any thread. The
/// client's `*_then` calls hand their callback (which posts) the outcome
/// exactly once, however the call ends, so no future is left waiting.
#[derive(Debug)]
pub struct Poster {
    shared: Arc<Shared>,
    future: Py<PyAny>,
}

impl Poster {
    /// Hands the reply over; the loop resolves the future with it.
    pub fn post(self, reply: Reply) {
        self.shared.post(Entry::Reply(self.future, reply));
    }
}

/// Posts a subscription's deliveries to its loop's inbox, from the thread
/// that delivers, each once the subscription has credit for it.
#[derive(Debug)]
pub struct Deliverer {
    shared: Arc<Shared>,
    /// Takes each delivery on the loop.
    target: Arc<Py<PyAny>>,
    credits: Arc<Credits>,
}

impl Deliverer {
    /// Waits for credit, then hands `msg` to the loop; drops it once the
    /// subscription has ended.
    pub fn deliver(&self, msg: Message) {
        if self.credits.take() {
            self.shared
                .post_counted(Entry::Delivery(self.target.clone(), msg));
        }
    }
}

/// How many deliveries of a subscription may be in the loop's inbox or in
/// its callback at once.
#[derive(Debug)]
pub struct Credits {
    /// Credit left, and whether the subscription has ended.
    state: Mutex<(usize, bool)>,
    freed: Condvar,
}

impl Credits {
    pub fn new(n: usize) -> Self {
        Credits {
            state: Mutex::new((n.max(1), false)),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, bool)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one credit, waiting for it; false once ended.
    fn take(&self) -> bool {
        let mut s = self.lock();
        while s.0 == 0 && !s.1 {
            s = self.freed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.1 {
            return false;
        }
        s.0 -= 1;
        true
    }

    /// Gives back the credit of a delivery the callback is done with.
    pub fn give(&self) {
        self.lock().0 += 1;
        self.freed.notify_one();
    }

    /// The subscription has ended: a thread waiting for credit stops.
    pub fn end(&self) {
        self.lock().1 = true;
        self.freed.notify_all();
    }
}

/// Gives a subscription of `tubeway.aio` room for one more delivery (see
/// [`Credits`]).
#[pyclass(name = "_Credits", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyCredits {
    pub credits: Arc<Credits>,
}

#[pymethods]
impl PyCredits {
    /// The callback is done with one delivery.
    fn release(&self) {
        self.credits.give();
    }
}

/// An event loop's inbox of replies (see the module's doc).
#[pyclass(name = "_LoopInbox", module = "tubeway", frozen)]
#[derive(Debug)]
pub struct PyLoopInbox {
    shared: Arc<Shared>,
    /// The end the loop watches.
    wake: UnixStream,
    /// Replies that came back through it so far.
    resolved: AtomicUsize,
    /// Its client is closed: the loop stops watching once nothing is in flight.
    closing: AtomicBool,
    /// The loop, and whether it still watches.
    event_loop: Py<PyAny>,
    watched: AtomicBool,
}

impl PyLoopInbox {
    /// What the reading thread posts `future`'s reply with; counts one
    /// more in flight.
    pub fn poster(&self, future: Py<PyAny>) -> Poster {
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        Poster {
            shared: self.shared.clone(),
            future,
        }
    }

    /// A call that could not start, or needs no reply, after
    /// [`poster`](Self::poster).
    pub fn not_sent(&self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// What a function served on this inbox's loop posts its calls with,
    /// for `target` to run on the loop.
    pub fn caller(&self, target: Py<PyAny>) -> Caller {
        Caller {
            shared: self.shared.clone(),
            target: Arc::new(target),
        }
    }

    /// What a subscription's thread posts deliveries with, for `target`
    /// to take on the loop, at most as many at once as `credits` allow.
    pub fn deliverer(&self, target: Py<PyAny>, credits: Arc<Credits>) -> Deliverer {
        Deliverer {
            shared: self.shared.clone(),
            target: Arc::new(target),
            credits,
        }
    }

    fn unwatch_when_done(&self, py: Python<'_>) -> PyResult<()> {
        if self.closing.load(Ordering::Relaxed)
            && self.shared.in_flight.load(Ordering::Relaxed) == 0
            && self.watched.swap(false, Ordering::Relaxed)
        {
            self.event_loop
                .bind(py)
                .call_method1("remove_reader", (self.wake.as_raw_fd(),))?;
        }
        Ok(())
    }
}

#[pymethods]
impl PyLoopInbox {
    /// An inbox of `event_loop`, which must watch [`fileno`](Self::fileno)
    /// with [`drain`](Self::drain) from now on (`loop.add_reader`).
    #[new]
    fn new(event_loop: Py<PyAny>) -> PyResult<Self> {
        let (wake, bell) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        bell.set_nonblocking(true)?;
        Ok(PyLoopInbox {
            shared: Arc::new(Shared {
                ready: Mutex::new(Vec::new()),
                bell,
                in_flight: AtomicUsize::new(0),
            }),
            wake,
            resolved: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            event_loop,
            watched: AtomicBool::new(true),
        })
    }

    /// How many replies (and deliveries) came back through this inbox.
    #[getter]
    fn resolved(&self) -> usize {
        self.resolved.load(Ordering::Relaxed)
    }

    /// The socket the loop watches.
    fn fileno(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// Run by the loop when its socket is readable: resolves every future
    /// whose reply is in (a future cancelled meanwhile is left as it is).
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        // The bell first: a reply posted after this rings it again.
        let mut bytes = [0u8; 64];
        loop {
            match (&self.wake).read(&mut bytes) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let ready = std::mem::take(&mut *self.shared.lock());
        self.shared
            .in_flight
            .fetch_sub(ready.len(), Ordering::Relaxed);
        self.resolved.fetch_add(ready.len(), Ordering::Relaxed);
        for entry in ready {
            match entry {
                Entry::Reply(future, reply) => {
                    if pyfuture::is_done(future.bind(py)) {
                        // Cancelled: nobody takes the reply (a polled message goes back).
                        continue;
                    }
                    pyfuture::resolve(py, &future, reply.into_py(py));
                }
                Entry::Delivery(target, msg) => {
                    // The target runs the callback and reports its own errors.
                    let msg = Py::new(py, PyMessage::new(msg))?;
                    if let Err(e) = target.call1(py, (msg,)) {
                        e.write_unraisable(py, Some(target.bind(py)));
                    }
                }
                Entry::Call(target, msg, answer) => {
                    let msg = Py::new(py, PyMessage::new(msg))?;
                    let responder = Py::new(
                        py,
                        PyResponder {
                            answer: Mutex::new(Some(answer)),
                        },
                    )?;
                    // The target answers through the responder, even when the
                    // handler raises; if the target itself fails, so does the call.
                    if let Err(e) = target.call1(py, (msg, responder.clone_ref(py))) {
                        responder.get().send(Err(handler::exception_text(py, &e)));
                    }
                }
            }
        }
        self.unwatch_when_done(py)
    }

    /// Its client is closed: the loop stops watching once every future
    /// handed out is resolved (each ends, if only with the connection).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.closing.store(true, Ordering::Relaxed);
        self.unwatch_when_done(py)
    }
}
