//! A connection's write side, written from the caller's thread when idle.
//!
//! A `put` on an idle connection writes its frames at once, from the thread
//! that calls it (without the GIL), with a non-blocking vectored write: a
//! small message goes out without waking any other thread, which is most of
//! a round trip's cost. What the socket does not take at once is left to the
//! connection's writer task, which the caller wakes. Only one of them writes
//! at a time (the state's lock), and the caller writes only while nothing is
//! queued, so the task's registration for writability is never disturbed
//! while it waits for it. Payloads are written from their own memory.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::Notify;
use tubeway_proto::EncodedFrame;
use tubeway_transport::{consume, BoxWrite};

/// Slices passed to one vectored write (Linux's IOV_MAX is 1024).
const MAX_IOV: usize = 512;

/// A waker that does nothing: the caller's own attempt never waits, and
/// the writer task polls again with its real waker when woken.
struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn noop_waker() -> &'static Waker {
    static NOOP: OnceLock<Waker> = OnceLock::new();
    NOOP.get_or_init(|| Waker::from(Arc::new(Noop)))
}

#[derive(Default)]
struct State {
    w: Option<BoxWrite>,
    queue: VecDeque<Bytes>,
    failed: Option<String>,
    closing: bool,
}

/// The write side of one connection.
pub struct Writer {
    state: Mutex<State>,
    wake: Notify,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// Why frames could not be queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The connection failed or was closed.
    #[error("the connection is closed: {0}")]
    Closed(String),
}

impl Writer {
    /// A writer for `w`; its task is [`Writer::run`].
    pub fn new(w: BoxWrite) -> Arc<Writer> {
        Arc::new(Writer {
            state: Mutex::new(State {
                w: Some(w),
                ..State::default()
            }),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `frames` and writes what the connection takes at once.
    pub fn send(&self, frames: Vec<EncodedFrame>) -> Result<(), SendError> {
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return Err(SendError::Closed(why.clone()));
        }
        if state.closing {
            return Err(SendError::Closed("the queue is closing".into()));
        }
        let idle = state.queue.is_empty();
        for f in frames {
            state.queue.push_back(f.head);
            if !f.payload.is_empty() {
                state.queue.push_back(f.payload);
            }
        }
        if idle {
            // Never waits: a write the socket cannot take now is Pending.
            let mut cx = Context::from_waker(noop_waker());
            if let Poll::Ready(Err(e)) = flush(&mut state, &mut cx) {
                fail(&mut state, &e);
                return Ok(());
            }
        }
        if !state.queue.is_empty() {
            drop(state);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Writes everything queued, then shuts the stream down; no more sends.
    pub fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }

    /// Writes whatever [`Writer::send`] leaves queued, until closed or failed.
    pub async fn run(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            let flushed = poll_fn(|cx| flush(&mut self.lock(), cx)).await;
            if let Err(e) = flushed {
                fail(&mut self.lock(), &e);
                return;
            }
            if self.lock().closing {
                let w = self.lock().w.take();
                if let Some(mut w) = w {
                    let _ = poll_fn(|cx| Pin::new(&mut w).poll_shutdown(cx)).await;
                }
                return;
            }
        }
    }
}

/// Records the failure and drops what was queued, which releases the
/// buffers (and resolves the futures) of the puts it held.
fn fail(state: &mut State, e: &io::Error) {
    state.failed = Some(e.to_string());
    state.queue.clear();
    state.w = None;
}

/// Writes queued chunks until none is left (Ready(Ok)), the stream would
/// block (Pending) or fails.
fn flush(state: &mut State, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    let State { w, queue, .. } = state;
    let Some(w) = w.as_mut() else {
        return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
    };
    while !queue.is_empty() {
        let n = {
            let slices: Vec<IoSlice<'_>> = queue
                .iter()
                .take(MAX_IOV)
                .map(|b| IoSlice::new(b))
                .collect();
            match Pin::new(&mut *w).poll_write_vectored(cx, &slices) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        };
        consume(queue, n);
    }
    Poll::Ready(Ok(()))
}
