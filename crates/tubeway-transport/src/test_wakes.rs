//! A task's waker for tests: it counts its wake-ups and signals each, so a
//! test waits for a wake-up instead of polling for it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

use tokio::sync::Notify;

/// Counts its wake-ups and signals each.
#[derive(Default)]
pub(crate) struct Wakes {
    count: AtomicUsize,
    woken: Notify,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.woken.notify_one();
    }
}

impl Wakes {
    /// A task's wake-up counter and its waker.
    pub(crate) fn new() -> (Arc<Wakes>, Waker) {
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        (wakes, waker)
    }

    /// The wake-ups so far.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether the waker is woken more than `before` times within 5 s.
    pub(crate) async fn woken_since(&self, before: usize) -> bool {
        let woken = async {
            // A wake-up between the look and the wait leaves a permit.
            while self.count() == before {
                self.woken.notified().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .is_ok()
    }
}
