use std::sync::atomic::{AtomicU64, Ordering};

/// Broker-wide counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub messages_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub errors: AtomicU64,
}

impl Counters {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
