//! Cancelling a `get` of `tubeway.aio`'s queue without losing an object.
//!
//! The asyncio `get` waits on a thread of a pool; cancelled, it cannot stop
//! that thread's wait, and an object the thread then took would be lost.
//! So the wait and the cancel race for the token: the wait claims an object
//! for its caller only if the cancel has not come first; otherwise the
//! object is kept for the next `get`. A cancel that comes second is told so,
//! and the caller takes the object after all.

use std::sync::atomic::{AtomicU8, Ordering};

use pyo3::prelude::*;
use tokio::sync::Notify;

const WAITING: u8 = 0;
const CLAIMED: u8 = 1;
const CANCELLED: u8 = 2;

/// Decides whether a waiting `get` ends with an object or cancelled.
#[pyclass(name = "_GetToken", module = "tubeway", frozen)]
#[derive(Debug, Default)]
pub struct PyGetToken {
    state: AtomicU8,
    cancelled: Notify,
}

impl PyGetToken {
    /// Claims what the wait got for its caller: false once cancelled.
    pub fn claim(&self) -> bool {
        self.state
            .compare_exchange(WAITING, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            || self.state.load(Ordering::Acquire) == CLAIMED
    }

    /// Resolves once the token is cancelled.
    pub async fn cancelled(&self) {
        let notified = self.cancelled.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.state.load(Ordering::Acquire) != CANCELLED {
            notified.await;
        }
    }
}

#[pymethods]
impl PyGetToken {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Cancels the wait unless it has claimed an object already: true if
    /// the cancel came first (the `get` ends without one), false if the
    /// object is the caller's.
    fn cancel(&self) -> bool {
        let first = self
            .state
            .compare_exchange(WAITING, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            self.cancelled.notify_waiters();
        }
        first || self.state.load(Ordering::Acquire) == CANCELLED
    }
}
