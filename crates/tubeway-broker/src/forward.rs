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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;
use tubeway_proto::{Message, ResponseStatus};
use uuid::Uuid;

use crate::broker::{no_answer_within, BrokerError};
use crate::function::{Function, Pick};
use crate::session::{Forward, ReplyTo, SessionShared};

/// A worker connection's calls in flight, by the id of the forwarded request.
#[derive(Debug, Default)]
pub(crate) struct WorkerCalls {
    calls: HashMap<Uuid, Reply>,
    /// When the sweeper looks for expired calls next; `None` while it waits
    /// for a deadline. Never later than a deadline in `calls`.
    next_sweep: Option<Instant>,
    /// The sweeper task runs.
    sweeping: bool,
    /// The size at which calls whose caller has left are dropped next.
    purge_at: usize,
    /// The calls the worker owes for functions it serves with a limit
    /// ([`SessionShared::owe_call`]), by forwarded id: so that their
    /// answers, late ones too, give back room under the limit. A call stays
    /// here after it leaves `calls` (timed out, or its caller left) until
    /// the worker answers it: it still takes a place among the worker's
    /// calls. At most the largest limit the worker declared, since no
    /// limited call is forwarded while it owes that many.
    limited: HashSet<Uuid>,
}

/// The smallest table that is purged of calls whose caller has left.
const PURGE_MIN: usize = 64;

/// Where a forwarded call's answer goes.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A caller inside the broker's process, waiting on a channel.
    Waiter(oneshot::Sender<Message>),
    /// A client's call, answered on its connection.
    Route(Route),
}

/// The way back to a client that called a worker (nowhere for a oneway
/// call, whose answer a worker with a limit gives all the same: see
/// [`crate::function::counts`]).
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
    /// The request as forwarded, kept while its payload is small (up to
    /// [`KEPT_FOR_RETRY`]), to give to another worker if this one refuses
    /// it: a refused call has not run, so giving it again runs it once.
    pub request: Option<Box<Message>>,
    /// How many more times the call may be given to another worker.
    pub retries: u8,
}

/// The largest payload of a forwarded request kept for another worker: a
/// larger one is freed once written, as it was before, rather than held
/// until the answer.
pub(crate) const KEPT_FOR_RETRY: usize = 64 * 1024;

/// How many times a call refused by its worker is given to another.
pub(crate) const RETRIES: u8 = 3;

/// Whether a worker's answer refuses the call without having run it:
/// `unavailable` (it has no room) or `function_not_found` (it no longer
/// serves the function, and the broker sent the call before it knew).
fn refused(resp: &Message) -> bool {
    matches!(
        resp.response_status,
        Some(ResponseStatus::Unavailable | ResponseStatus::FunctionNotFound)
    )
}

impl WorkerCalls {
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    #[cfg(test)]
    pub fn limited_len(&self) -> usize {
        self.limited.len()
    }

    /// Adds a call; true when the sweeper must start or look sooner.
    ///
    /// A call whose caller has left stays until the worker answers it or
    /// its deadline passes, and a call may have no deadline: each time the
    /// table has doubled, such calls are dropped, which bounds it by twice
    /// the calls of callers still there (each caller has its in-flight limit).
    fn insert(&mut self, id: Uuid, reply: Reply, limited: bool) -> bool {
        if limited {
            self.limited.insert(id);
        }
        if self.calls.len() >= self.purge_at.max(PURGE_MIN) {
            self.calls.retain(|_, r| match r {
                Reply::Route(r) => !r.caller.is_gone(),
                Reply::Waiter(tx) => !tx.is_closed(),
            });
            self.purge_at = 2 * self.calls.len();
        }
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

    /// Takes the call `id` out, for an end other than its answer; a
    /// call with a limit still counts against the worker (see `limited`).
    pub fn remove(&mut self, id: &Uuid) -> Option<Reply> {
        self.calls.remove(id)
    }

    /// Takes out the call `id` that the worker answered: where the answer
    /// goes (none when the call ended otherwise already), and whether the
    /// call was one of a function with a limit.
    pub fn answered(&mut self, id: &Uuid) -> (Option<Reply>, bool) {
        (self.calls.remove(id), self.forget_limited(id))
    }

    /// Whether `id` was a limited call, which it no longer is. Most
    /// workers declare no limit: their answers skip the hash.
    fn forget_limited(&mut self, id: &Uuid) -> bool {
        !self.limited.is_empty() && self.limited.remove(id)
    }

    /// Takes out the call `id`, whose request never left for the worker;
    /// whether it was one with a limit.
    pub fn unsent(&mut self, id: &Uuid) -> bool {
        self.calls.remove(id);
        self.forget_limited(id)
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
        self.limited.clear();
        self.calls.drain().map(|(_, r)| r).collect()
    }
}

/// Makes a worker's answer to a forwarded call the answer its caller must see.
pub(crate) fn readdress(resp: &mut Message, to: &ReplyTo) {
    resp.id = tubeway_proto::fresh_id();
    resp.correlation_id = Some(to.id);
    resp.request_id.clone_from(&to.request_id);
    if resp.response_status.is_none() {
        resp.response_status = Some(ResponseStatus::ServerError);
    }
}

/// The error of a call whose worker went away before answering.
pub(crate) fn worker_gone() -> BrokerError {
    BrokerError::new(
        ResponseStatus::ServerError,
        "worker disconnected before answering",
    )
}

impl Route {
    /// Answers the caller with the worker's response, changed in place
    /// and sent from where the reader put it: a message moved is copied
    /// whole.
    /// A call that worker connection `from` refused goes to another worker
    /// with room instead, if there is one (see [`Route::request`]).
    pub fn answered(self, resp: Box<Message>, from: u64) {
        let route = if refused(&resp) {
            match self.retry(from) {
                Some(route) => route,
                None => return,
            }
        } else {
            self
        };
        route.answer(resp);
    }

    fn answer(self, mut resp: Box<Message>) {
        readdress(&mut resp, &self.to);
        self.function
            .count(resp.response_status != Some(ResponseStatus::Ok));
        if !self.to.oneway {
            self.caller.send_answer_now(&resp);
        }
    }

    /// Gives the call to a worker other than connection `from`'s, which
    /// refused it; back if it cannot go (no request kept, no retries left,
    /// its deadline passed, or no other worker with room).
    fn retry(mut self, from: u64) -> Option<Route> {
        let expired = self.expires.is_some_and(|(at, _)| at <= Instant::now());
        if self.retries == 0 || expired {
            return Some(self);
        }
        let Some(mut m) = self.request.take() else {
            return Some(self);
        };
        let Pick::Worker(worker) = self.function.pick_worker_except(self.to.oneway, from) else {
            self.request = Some(m);
            return Some(self);
        };
        if let Some((at, _)) = self.expires {
            // The worker has what is left of the timeout.
            let left = at.saturating_duration_since(Instant::now());
            m.timeout = Some(left.max(Duration::from_millis(1)));
        }
        let caller = self.caller.clone();
        caller.forward_to(
            worker,
            Forward {
                f: self.function,
                to: self.to,
                m,
                permit: self._permit,
                expires: self.expires,
                retries: self.retries - 1,
            },
        );
        None
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
    /// The call counts against the worker from when it was picked
    /// ([`crate::function::Function::pick_worker`]), against its limit
    /// too when `limited` (the function's worker declared one).
    pub(crate) fn await_worker(self: &Arc<Self>, id: Uuid, reply: Reply, limited: bool) {
        let (sooner, start) = {
            let mut calls = self.worker_calls();
            let sooner = calls.insert(id, reply, limited);
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
            r.failed(no_answer_within(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::Semaphore;

    use super::*;
    use crate::session::tests::session;
    use crate::{Broker, BrokerConfig};

    fn route(caller: &Arc<SessionShared>, function: &Arc<Function>) -> Reply {
        Reply::Route(kept_route(caller, function, None, 0))
    }

    fn kept_route(
        caller: &Arc<SessionShared>,
        function: &Arc<Function>,
        request: Option<Message>,
        retries: u8,
    ) -> Route {
        Route {
            caller: caller.clone(),
            to: ReplyTo {
                id: Uuid::new_v4(),
                request_id: None,
                oneway: false,
            },
            function: function.clone(),
            expires: None,
            _permit: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
            request: request.map(Box::new),
            retries,
        }
    }

    fn answer(status: ResponseStatus) -> Box<Message> {
        let mut m = Message::new(tubeway_proto::MessageType::Response);
        m.response_status = Some(status);
        Box::new(m)
    }

    /// The route of the one call in `worker`'s table.
    fn only_route(worker: &SessionShared) -> Route {
        let mut calls = worker.worker_calls().take_all();
        assert_eq!(calls.len(), 1);
        match calls.pop() {
            Some(Reply::Route(r)) => r,
            _ => panic!("not a route"),
        }
    }

    #[tokio::test]
    async fn a_refused_call_goes_to_another_worker_while_it_may() {
        let broker = Broker::new(BrokerConfig::default());
        let (w1, _l1) = session(&broker, 1).await;
        let (w2, _l2) = session(&broker, 2).await;
        let (caller, _l3) = session(&broker, 3).await;
        let f = Arc::new(Function::remote("f".into()));
        for w in [&w1, &w2] {
            f.add_worker(crate::function::WorkerRef {
                registration: Uuid::new_v4(),
                session: w.clone(),
                max_calls: None,
            });
        }
        let request = Some(Message::plain_text("x"));
        // Refused by 1 as a function it no longer serves: given to 2.
        kept_route(&caller, &f, request.clone(), 1)
            .answered(answer(ResponseStatus::FunctionNotFound), 1);
        assert_eq!((w1.owed_calls(), w2.owed_calls()), (0, 1));
        let again = only_route(&w2);
        assert_eq!(again.retries, 0);
        assert_eq!(
            again.request.as_ref().map(|m| m.payload.clone()),
            request.as_ref().map(|m| m.payload.clone())
        );
        // Refused again with no retries left: answered, not given to 1.
        again.answered(answer(ResponseStatus::Unavailable), 2);
        assert!(w1.worker_calls().is_empty());
        assert_eq!(w1.owed_calls(), 0);
        // Nor without its request (a large one is not kept), nor for an
        // answer that is not a refusal.
        kept_route(&caller, &f, None, 3).answered(answer(ResponseStatus::Unavailable), 2);
        kept_route(&caller, &f, request, 3).answered(answer(ResponseStatus::HandlerError), 2);
        assert!(w1.worker_calls().is_empty());
        let s = f.status();
        assert_eq!((s.calls, s.errors), (3, 3));
    }

    #[tokio::test]
    async fn calls_of_callers_that_left_do_not_pile_up() {
        let broker = Broker::new(BrokerConfig::default());
        let (worker, _l1) = session(&broker, 1).await;
        let (live, _l2) = session(&broker, 2).await;
        let (left, _l3) = session(&broker, 3).await;
        left.set_gone();
        let f = Arc::new(Function::remote("f".into()));
        for _ in 0..100 {
            worker.await_worker(Uuid::new_v4(), route(&live, &f), false);
        }
        // Calls without a deadline, whose caller has gone: never answered.
        for _ in 0..10_000 {
            worker.await_worker(Uuid::new_v4(), route(&left, &f), false);
        }
        let len = worker.worker_calls().len();
        assert!((100..=400).contains(&len), "{len} calls kept");
        // The live caller's calls are all still there.
        let live_calls = worker
            .worker_calls()
            .take_all()
            .into_iter()
            .filter(|r| matches!(r, Reply::Route(r) if Arc::ptr_eq(&r.caller, &live)))
            .count();
        assert_eq!(live_calls, 100);
    }
}
