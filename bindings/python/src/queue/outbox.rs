//! A peer's outgoing objects: written at once when the connection takes
//! them, kept in order otherwise, never blocking the sender.
//!
//! [`FrameWriter`] writes a frame from the sender's own thread when the
//! connection is idle (no hand-off, no wake-up) and queues it otherwise, up
//! to a bound past which its senders wait. A `put` must never wait, so
//! objects the writer does not take at once wait here, in a backlog that one
//! task feeds to the writer in order; while the backlog is not empty every
//! new object joins it, so objects never overtake each other.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tubeway_proto::EncodedFrame;
use tubeway_transport::{FrameWriter, WriteError};

#[derive(Debug, Default)]
struct Backlog {
    frames: VecDeque<EncodedFrame>,
    /// A task is feeding the backlog to the writer.
    draining: bool,
}

/// The sending side of one peer.
#[derive(Debug)]
pub struct Outbox {
    writer: FrameWriter,
    /// The endpoint's runtime, where a backlog is drained.
    runtime: Handle,
    backlog: Mutex<Backlog>,
    /// Signalled when the backlog has been fed to the writer.
    drained: Notify,
}

impl Outbox {
    /// An outbox writing to `writer`, draining a backlog on `runtime`.
    pub fn new(writer: FrameWriter, runtime: Handle) -> Arc<Outbox> {
        Arc::new(Outbox {
            writer,
            runtime,
            backlog: Mutex::default(),
            drained: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one object's frames, in order and whole; never waits. What the
    /// connection does not take at once is written by tasks of the runtime:
    /// see [`Outbox::has_backlog`].
    pub fn send(self: &Arc<Self>, frames: Vec<EncodedFrame>) -> Result<(), WriteError> {
        let mut backlog = self.lock();
        let mut frames = frames.into_iter();
        if !backlog.draining {
            for frame in frames.by_ref() {
                // Rejected frames come back only when the writer is full.
                if !self.writer.try_send(frame.clone())? {
                    backlog.frames.push_back(frame);
                    break;
                }
            }
        }
        backlog.frames.extend(frames);
        if !backlog.frames.is_empty() && !backlog.draining {
            backlog.draining = true;
            self.runtime.spawn(self.clone().drain());
        }
        Ok(())
    }

    /// Whether frames wait to be written: the runtime must be driven for
    /// them to go out.
    pub fn has_backlog(&self) -> bool {
        self.lock().draining || self.writer.has_backlog()
    }

    async fn drain(self: Arc<Self>) {
        loop {
            let next = {
                let mut backlog = self.lock();
                match backlog.frames.pop_front() {
                    Some(frame) => frame,
                    None => {
                        backlog.draining = false;
                        self.drained.notify_waiters();
                        return;
                    }
                }
            };
            if self.writer.send(next).await.is_err() {
                // The connection is gone: drop what waits, which releases the
                // buffers (and resolves the futures) of its puts.
                let mut backlog = self.lock();
                backlog.frames.clear();
                backlog.draining = false;
                self.drained.notify_waiters();
                return;
            }
        }
    }

    /// Hands the backlog to the writer, then closes it: what was sent is
    /// written, then the write side is shut down.
    pub async fn close(&self) {
        loop {
            let drained = self.drained.notified();
            if !self.lock().draining {
                break;
            }
            drained.await;
        }
        self.writer.close();
    }
}
