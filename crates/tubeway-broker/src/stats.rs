use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::session::SessionShared;

/// Broker-wide counters of events that are not per message.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_rejected: AtomicU64,
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

/// A counter that one task adds to (a connection's reader) and any thread
/// reads: a load and a store, not the locked read-modify-write an atomic
/// add costs on every message.
#[derive(Debug, Default)]
pub(crate) struct OwnCounter(AtomicU64);

impl OwnCounter {
    /// Adds one. Only the counter's one task may call this: two adding at
    /// once would lose a count.
    pub fn inc(&self) {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Messages in and out, counted by each connection for itself and summed
/// when asked. One broker-wide counter added to on every message would
/// bounce between the CPUs serving different connections, and costs a
/// locked instruction on each message even when it does not: a connection
/// counts what it reads with an [`OwnCounter`], and what it sends is
/// counted by its writer under the lock it takes anyway.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    state: Mutex<TrafficState>,
}

#[derive(Debug, Default)]
struct TrafficState {
    live: HashMap<u64, Arc<SessionShared>>,
    /// What the connections closed so far counted, in and out.
    retired: (u64, u64),
}

impl Traffic {
    fn lock(&self) -> std::sync::MutexGuard<'_, TrafficState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `session`'s messages from now on, until
    /// [`retire`](Traffic::retire)d.
    pub fn join(&self, session: &Arc<SessionShared>) {
        self.lock().live.insert(session.id, session.clone());
    }

    /// Adds what connection `id` counted to the closed connections' totals.
    /// Called once it neither reads nor sends any more, so its counts are
    /// final; under the lock, so that no sum sees them twice or not at all.
    pub fn retire(&self, id: u64) {
        let mut s = self.lock();
        if let Some(session) = s.live.remove(&id) {
            let (m_in, m_out) = session.traffic();
            s.retired.0 += m_in;
            s.retired.1 += m_out;
        }
    }

    /// Messages in and out of every connection, the closed ones included.
    pub fn totals(&self) -> (u64, u64) {
        let s = self.lock();
        s.live.values().fold(s.retired, |(i, o), session| {
            let (m_in, m_out) = session.traffic();
            (i + m_in, o + m_out)
        })
    }
}
