//! Calls forwarded to workers.
//!
//! A call from a client to a function that workers serve is forwarded to
//! one of them and remembered in the worker connection's table of calls in
//! flight with the way back to its caller: the worker's answer is handed
//! straight to the caller's connection by whichever thread reads it. No
//! task waits for it and no timer is armed for it: the table's deadlines
//! are swept by one task per worker connection, and a worker that goes away
//! fails what it still owed. That is how a broker routes replies; a task,
//! a timer and a cancellation hook per call cost more than the rest of the
//! forwarding put together.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;
use tubeway_proto::{Message, ResponseStatus};
use uuid::Uuid;

use crate::broker::BrokerError;
use crate::function::Function;
use crate::session::{ReplyTo, SessionShared};

/// A worker connection's calls in flight, by the id of the forwarded request.
#[derive(Debug, Default)]
pub(crate) struct WorkerCalls {
    calls: HashMap<Uuid, Reply>,
    /// When the sweeper looks for expired calls next; `None` while it waits
    /// for a deadline. Never later than a deadline in `calls`.
    next_sweep: Option<Instant>,
    /// The sweeper task runs.
    sweeping: bool,
}

/// Where a forwarded call's answer goes.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A caller inside the broker's process, waiting on a channel.
    Waiter(oneshot::Sender<Message>),
    /// A client's call, answered on its connection.
    Route(Route),
}

/// The way back to a client that called a worker.
#[derive(Debug)]
pub(crate) struct Route {
    pub caller: Arc<SessionShared>,
    pub to: ReplyTo,
    /// Counts the call once it ends.
    pub function: Arc<Function>,
    /// When the call fails with `timeout`, and the timeout it was given.
    pub expires: Option<(Instant, Duration)>,
    /// The caller's slot among its requests in flight, free once answered.
    pub _permit: OwnedSemaphorePermit,
}

impl WorkerCalls {
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Adds a call; true when the sweeper must start or look sooner.
    fn insert(&mut self, id: Uuid, reply: Reply) -> bool {
        let expires = match &reply {
            Reply::Route(r) => r.expires.map(|(at, _)| at),
            Reply::Waiter(_) => None,
        };
        self.calls.insert(id, reply);
        // Calls of one timeout come in the order they expire: only the first
        // after a sweep, or one with a shorter timeout, moves the sweep.
        match expires {
            Some(at) if self.next_sweep.is_none_or(|next| at < next) => {
                self.next_sweep = Some(at);
                true
            }
            _ => false,
        }
    }

    pub fn remove(&mut self, id: &Uuid) -> Option<Reply> {
        self.calls.remove(id)
    }

    /// Takes every call whose deadline is `now` or earlier, and sets the
    /// next sweep.
    fn expired(&mut self, now: Instant) -> Vec<Route> {
        let ids: Vec<Uuid> = self
            .calls
            .iter()
            .filter_map(|(id, r)| match r {
                Reply::Route(Route {
                    expires: Some((at, _)),
                    ..
                }) if *at <= now => Some(*id),
                _ => None,
            })
            .collect();
        let expired = ids
            .iter()
            .filter_map(|id| match self.calls.remove(id) {
                Some(Reply::Route(r)) => Some(r),
                _ => None,
            })
            .collect();
        self.next_sweep = self
            .calls
            .values()
            .filter_map(|r| match r {
                Reply::Route(r) => r.expires.map(|(at, _)| at),
                Reply::Waiter(_) => None,
            })
            .min();
        expired
    }

    /// Takes every call, for a worker that is gone.
    pub fn take_all(&mut self) -> Vec<Reply> {
        self.next_sweep = None;
        self.calls.drain().map(|(_, r)| r).collect()
    }
}

/// The answer to a forwarded call, as its caller must see it.
pub(crate) fn readdressed(mut resp: Message, to: &ReplyTo) -> Message {
    resp.id = Uuid::new_v4();
    resp.correlation_id = Some(to.id);
    resp.request_id.clone_from(&to.request_id);
    if resp.response_status.is_none() {
        resp.response_status = Some(ResponseStatus::ServerError);
    }
    resp
}

/// The error of a call whose worker went away before answering.
pub(crate) fn worker_gone() -> BrokerError {
    BrokerError::new(
        ResponseStatus::ServerError,
        "worker disconnected before answering",
    )
}

impl Route {
    /// Answers the caller with the worker's response.
    pub fn answered(self, resp: Message) {
        let resp = readdressed(resp, &self.to);
        self.function
            .count(resp.response_status != Some(ResponseStatus::Ok));
        self.caller.answer_now(&self.to, Ok(resp));
    }

    /// Fails the call with `e`.
    pub fn failed(self, e: BrokerError) {
        self.function.count(true);
        self.caller.answer_now(&self.to, Err(e));
    }
}

impl SessionShared {
    /// Remembers a forwarded call to this worker connection, starting the
    /// sweeper of its deadlines if it does not run yet.
    pub(crate) fn await_worker(self: &Arc<Self>, id: Uuid, reply: Reply) {
        let (sooner, start) = {
            let mut calls = self.worker_calls();
            let sooner = calls.insert(id, reply);
            let start = sooner && !std::mem::replace(&mut calls.sweeping, true);
            (sooner, start)
        };
        if start {
            self.runtime.spawn(sweep(self.clone()));
        } else if sooner {
            self.sweep_sooner.notify_one();
        }
    }

    /// Fails every call still owed by this worker connection, which is gone.
    pub(crate) fn fail_worker_calls(&self) {
        let owed = self.worker_calls().take_all();
        for reply in owed {
            match reply {
                // Dropped: the waiting caller learns that the worker is gone.
                Reply::Waiter(_) => {}
                Reply::Route(r) => r.failed(worker_gone()),
            }
        }
    }
}

/// Fails the calls to `worker` whose deadline has passed, until the worker
/// connection is gone.
async fn sweep(worker: Arc<SessionShared>) {
    loop {
        // Made before the deadline is read: a deadline moved sooner after
        // the read still wakes it (`notify_one` keeps a permit).
        let sooner = worker.sweep_sooner.notified();
        let next = worker.worker_calls().next_sweep;
        tokio::select! {
            biased;
            () = worker.gone.cancelled() => return,
            () = sooner => continue,
            () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)),
                if next.is_some() => {}
        }
        let expired = worker.worker_calls().expired(Instant::now());
        for r in expired {
            let t = r.expires.map_or(Duration::ZERO, |(_, t)| t);
            r.failed(BrokerError::new(
                ResponseStatus::Timeout,
                format!("no answer within {} ms", t.as_millis()),
            ));
        }
    }
}
