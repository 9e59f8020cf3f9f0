//! Threads for handlers that may block: a broker's blocking functions, and
//! a client connection's synchronous handlers (shared with the `tubeway`
//! crate, not part of the public API).
//!
//! Such a handler never runs on a connection's reader or on a worker of the
//! runtime. tokio's blocking pool would do, but it wakes the idle thread
//! that has slept longest, and a thread that has just answered a call, and
//! is about to look for more work, counts as busy there: the call its
//! answer brings wakes another. Here a thread
//! counts itself free before its answer leaves ([`Ready::now`]), so the
//! next call, which that answer may bring at once, is its own to take, with
//! no wake-up on either side; a call that finds no thread free wakes the
//! thread that went idle last, whose stack is the likeliest to be in cache.
//! Each queued call has a thread of its own that is free, woken or started
//! for it, so none waits behind a running one. Idle threads sleep at once
//! unless told to poll first ([`Handlers::set_spin`]); one polls at a time.
//! A thread idle for the keep-alive ends.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use tubeway_transport::SPIN_YIELD_EVERY;

/// How long a thread with nothing to run sleeps before it ends.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// One call of a handler, answer included.
pub type Job = Box<dyn FnOnce(&Ready<'_>) + Send>;

/// Handed to a running job: see [`Ready::now`].
pub struct Ready<'a> {
    inner: Option<&'a Inner>,
    counted: Cell<bool>,
}

impl std::fmt::Debug for Ready<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ready")
            .field("counted", &self.counted.get())
            .finish()
    }
}

impl Ready<'_> {
    /// Counts the job's thread free for the next job from now on, before
    /// the job ends: for the last act of a job (sending an answer) that may
    /// bring the next job at once, which the thread then takes itself
    /// instead of another being woken for it. That act must not block.
    pub fn now(&self) {
        if let Some(inner) = self.inner {
            if !self.counted.replace(true) {
                inner.lock().ready += 1;
            }
        }
    }
}

/// A pool of handler threads. Dropped, it lets its threads end once the
/// calls queued have run.
pub struct Handlers {
    inner: Arc<Inner>,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers::new()
    }
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.lock();
        f.debug_struct("Handlers")
            .field("threads", &s.threads)
            .field("sleeping", &s.sleeping.len())
            .field("queued", &s.queue.len())
            .finish()
    }
}

struct Inner {
    state: Mutex<State>,
    /// The length of `state.queue`, for the polling thread to watch
    /// without taking the lock.
    queued: AtomicUsize,
    /// How long an idle thread polls before it sleeps, in nanoseconds.
    spin: AtomicU64,
    keep_alive: Duration,
    closed: AtomicBool,
    /// Threads started, and sleeping threads woken: for tests.
    started: AtomicUsize,
    woken: AtomicUsize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Threads that will look at the queue without being woken: running
    /// their last job's end, polling, woken or just started. Never fewer
    /// than the jobs queued, so that each has a thread.
    ready: usize,
    /// Sleeping threads, the most recently idle last.
    sleeping: Vec<Thread>,
    /// One of the ready threads polls.
    polling: bool,
    /// Threads alive.
    threads: usize,
}

impl Handlers {
    /// A pool with no thread yet; idle threads sleep at once.
    pub fn new() -> Handlers {
        Handlers::with_keep_alive(KEEP_ALIVE)
    }

    fn with_keep_alive(keep_alive: Duration) -> Handlers {
        Handlers {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                queued: AtomicUsize::new(0),
                spin: AtomicU64::new(0),
                keep_alive,
                closed: AtomicBool::new(false),
                started: AtomicUsize::new(0),
                woken: AtomicUsize::new(0),
            }),
        }
    }

    /// How long a thread that finds nothing to run polls for a job before
    /// it sleeps (zero: it sleeps at once).
    pub fn set_spin(&self, spin: Duration) {
        let nanos = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
        self.inner.spin.store(nanos, Ordering::Relaxed);
    }

    /// Lets every thread end once nothing is queued: none polls or sleeps
    /// any more. A job run later still runs, on a thread started for it.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let mut s = self.inner.lock();
        let sleeping = std::mem::take(&mut s.sleeping);
        s.ready += sleeping.len();
        drop(s);
        for t in sleeping {
            t.unpark();
        }
    }

    /// Runs `job` on a thread of the pool: one already awake if one is
    /// free (the polling one, say), else the most recently idle of the
    /// sleeping ones, else a new one.
    pub fn run(&self, job: Job) {
        let mut s = self.inner.lock();
        s.queue.push_back(job);
        self.inner.queued.fetch_add(1, Ordering::Release);
        if s.queue.len() <= s.ready {
            return;
        }
        s.ready += 1;
        if let Some(t) = s.sleeping.pop() {
            drop(s);
            self.inner.woken.fetch_add(1, Ordering::Relaxed);
            t.unpark();
            return;
        }
        s.threads += 1;
        drop(s);
        let inner = self.inner.clone();
        let spawned = thread::Builder::new()
            .name("tubeway-handler".into())
            .spawn(move || inner.work());
        match spawned {
            Ok(_) => {
                self.inner.started.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // Never lose the call: run it here, late, rather than not at all.
                tracing::error!("cannot start a handler thread ({e}); the call runs on the reader");
                let job = {
                    let mut s = self.inner.lock();
                    s.ready -= 1;
                    s.threads -= 1;
                    let job = s.queue.pop_front();
                    if job.is_some() {
                        self.inner.queued.fetch_sub(1, Ordering::Relaxed);
                    }
                    job
                };
                if let Some(job) = job {
                    job(&Ready {
                        inner: None,
                        counted: Cell::new(true),
                    });
                }
            }
        }
    }
}

impl Handlers {
    /// Threads asleep.
    pub fn sleeping(&self) -> usize {
        self.inner.lock().sleeping.len()
    }

    /// Threads alive.
    pub fn threads(&self) -> usize {
        self.inner.lock().threads
    }

    /// Sleeping threads woken for a job so far.
    pub fn woken(&self) -> usize {
        self.inner.woken.load(Ordering::Relaxed)
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        self.close();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `job` on this pool's thread; true if it counted the thread
    /// ready itself.
    fn run_job(&self, job: Job) -> bool {
        let ready = Ready {
            inner: Some(self),
            counted: Cell::new(false),
        };
        // The jobs catch their handlers' panics; this keeps a thread, and
        // the count of ready ones, from dying with one that slipped by.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| job(&ready)));
        ready.counted.get()
    }

    /// A thread's life, begun counted among the ready: run the queued jobs,
    /// poll for the next one if no other thread does, else sleep until
    /// woken; end once idle for the keep-alive, or once the pool is gone
    /// and nothing is queued.
    fn work(&self) {
        let me = thread::current();
        let mut polled = false;
        let mut s = self.lock();
        loop {
            if let Some(job) = s.queue.pop_front() {
                s.ready -= 1;
                self.queued.fetch_sub(1, Ordering::Relaxed);
                drop(s);
                let counted = self.run_job(job);
                polled = false;
                s = self.lock();
                if !counted {
                    s.ready += 1;
                }
                continue;
            }
            if self.closed.load(Ordering::Acquire) {
                break;
            }
            if !polled && !s.polling && self.spin() > Duration::ZERO {
                s.polling = true;
                drop(s);
                // A job seen but taken by another thread first is no
                // reason to sleep: the poll starts again.
                polled = !self.poll();
                s = self.lock();
                s.polling = false;
                continue;
            }
            s.ready -= 1;
            s.sleeping.push(me.clone());
            drop(s);
            if !self.sleep(&me) {
                return;
            }
            polled = false;
            s = self.lock();
        }
        s.ready -= 1;
        s.threads -= 1;
    }

    fn spin(&self) -> Duration {
        Duration::from_nanos(self.spin.load(Ordering::Relaxed))
    }

    /// Polls until a job is queued (true) or the spin budget is spent.
    fn poll(&self) -> bool {
        let spin = self.spin();
        let start = Instant::now();
        let mut next_yield = start + SPIN_YIELD_EVERY;
        loop {
            for _ in 0..64 {
                if self.queued.load(Ordering::Acquire) > 0 {
                    return true;
                }
                std::hint::spin_loop();
            }
            let now = Instant::now();
            if now.duration_since(start) >= spin || self.closed.load(Ordering::Acquire) {
                return false;
            }
            if now >= next_yield {
                thread::yield_now();
                next_yield = now + SPIN_YIELD_EVERY;
            }
        }
    }

    /// Sleeps, listed among the sleeping, until taken off the list and
    /// woken (true: the waker counted this thread ready again), or until
    /// the keep-alive passes (false: the thread ends).
    fn sleep(&self, me: &Thread) -> bool {
        let until = Instant::now() + self.keep_alive;
        loop {
            thread::park_timeout(until.saturating_duration_since(Instant::now()));
            let mut s = self.lock();
            let Some(at) = s.sleeping.iter().position(|t| t.id() == me.id()) else {
                return true;
            };
            if Instant::now() >= until {
                s.sleeping.remove(at);
                s.threads -= 1;
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Barrier;

    use super::*;

    /// Bounds every wait of these tests.
    const LIMIT: Duration = Duration::from_secs(10);

    /// Waits until `f` holds, failing the test after [`LIMIT`].
    fn eventually(what: &str, f: impl Fn() -> bool) {
        let give_up = Instant::now() + LIMIT;
        while !f() {
            assert!(Instant::now() < give_up, "never: {what}");
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs a job that reports its thread, and returns that thread's id.
    fn run_and_wait(h: &Handlers) -> thread::ThreadId {
        let (tx, rx) = mpsc::channel();
        h.run(Box::new(move |ready: &Ready<'_>| {
            ready.now();
            let _ = tx.send(thread::current().id());
        }));
        rx.recv_timeout(LIMIT).expect("the job ran")
    }

    fn polling(spin: Duration) -> Handlers {
        let h = Handlers::new();
        h.set_spin(spin);
        h
    }

    #[test]
    fn every_job_runs_once_whoever_queues_it() {
        let h = Arc::new(polling(Duration::from_micros(50)));
        let ran = Arc::new(AtomicUsize::new(0));
        let queuers: Vec<_> = (0..4)
            .map(|_| {
                let (h, ran) = (h.clone(), ran.clone());
                thread::spawn(move || {
                    for _ in 0..2_000 {
                        let ran = ran.clone();
                        h.run(Box::new(move |_: &Ready<'_>| {
                            ran.fetch_add(1, Ordering::Relaxed);
                        }));
                    }
                })
            })
            .collect();
        for q in queuers {
            q.join().expect("a queuer");
        }
        eventually("8,000 jobs ran", || ran.load(Ordering::Relaxed) == 8_000);
        let s = h.inner.lock();
        assert!(s.queue.is_empty());
        assert!(s.ready <= s.threads, "{} ready of {}", s.ready, s.threads);
    }

    #[test]
    fn a_running_job_holds_up_no_other() {
        // Eight jobs that each wait for all eight: done only if each had a
        // thread of its own, although a thread polls throughout.
        let h = polling(Duration::from_secs(5));
        let all = Arc::new(Barrier::new(8));
        let (tx, rx) = mpsc::channel();
        for _ in 0..8 {
            let (all, tx) = (all.clone(), tx.clone());
            h.run(Box::new(move |_: &Ready<'_>| {
                all.wait();
                let _ = tx.send(());
            }));
        }
        for _ in 0..8 {
            rx.recv_timeout(LIMIT).expect("every job ended");
        }
        assert_eq!(h.threads(), 8);
    }

    #[test]
    fn the_idle_thread_polls_for_the_next_job() {
        let h = polling(Duration::from_secs(5));
        let first = run_and_wait(&h);
        let second = run_and_wait(&h);
        assert_eq!(first, second);
        assert_eq!(h.inner.started.load(Ordering::Relaxed), 1);
        assert_eq!(h.inner.woken.load(Ordering::Relaxed), 0, "no thread slept");
    }

    #[test]
    fn by_default_the_idle_thread_sleeps_and_is_woken() {
        let h = Handlers::new();
        let first = run_and_wait(&h);
        eventually("the thread sleeps", || h.inner.lock().sleeping.len() == 1);
        let second = run_and_wait(&h);
        assert_eq!(first, second);
        assert_eq!(h.inner.started.load(Ordering::Relaxed), 1);
        assert_eq!(h.inner.woken.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_most_recently_idle_thread_is_woken_first() {
        let h = Handlers::new();
        // Two jobs running at once, made to end in a known order.
        let (first_tx, first_rx) = mpsc::channel::<()>();
        let (second_tx, second_rx) = mpsc::channel::<()>();
        let (running_tx, running_rx) = mpsc::channel();
        let (ids_tx, ids_rx) = mpsc::channel();
        for release in [first_rx, second_rx] {
            let (running_tx, ids_tx) = (running_tx.clone(), ids_tx.clone());
            h.run(Box::new(move |_: &Ready<'_>| {
                let _ = running_tx.send(());
                let _ = release.recv_timeout(LIMIT);
                let _ = ids_tx.send(thread::current().id());
            }));
        }
        for _ in 0..2 {
            running_rx.recv_timeout(LIMIT).expect("both jobs run");
        }
        first_tx.send(()).expect("the first job waits");
        let earlier = ids_rx.recv_timeout(LIMIT).expect("the first job ended");
        eventually("one thread sleeps", || h.inner.lock().sleeping.len() == 1);
        second_tx.send(()).expect("the second job waits");
        let later = ids_rx.recv_timeout(LIMIT).expect("the second job ended");
        eventually("both threads sleep", || h.inner.lock().sleeping.len() == 2);
        assert_ne!(earlier, later);
        assert_eq!(run_and_wait(&h), later);
    }

    #[test]
    fn a_job_that_panics_costs_no_thread() {
        let h = Handlers::new();
        h.run(Box::new(|_: &Ready<'_>| {
            panic!("a handler's panic that slipped by")
        }));
        eventually("the one thread sleeps", || {
            h.inner.lock().sleeping.len() == 1
        });
        let ran = run_and_wait(&h);
        assert_eq!(run_and_wait(&h), ran);
        assert_eq!(h.threads(), 1);
    }

    #[test]
    fn idle_threads_end_after_the_keep_alive() {
        let h = Handlers::with_keep_alive(Duration::from_millis(20));
        h.set_spin(Duration::from_micros(50));
        run_and_wait(&h);
        eventually("the thread ended", || h.threads() == 0);
        // And one is started again for the next job.
        run_and_wait(&h);
        assert_eq!(h.inner.started.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_dropped_pool_runs_what_is_queued_then_its_threads_end() {
        let h = polling(Duration::from_secs(5));
        let inner = h.inner.clone();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let done = done_tx.clone();
        h.run(Box::new(move |_: &Ready<'_>| {
            let _ = release_rx.recv_timeout(LIMIT);
            let _ = done.send(1);
        }));
        h.run(Box::new(move |_: &Ready<'_>| {
            let _ = done_tx.send(2);
        }));
        let second = done_rx.recv_timeout(LIMIT).expect("the second job ran");
        assert_eq!(second, 2);
        eventually("the second thread polls", || inner.lock().polling);
        drop(h);
        release_tx.send(()).expect("the first job waits");
        assert_eq!(done_rx.recv_timeout(LIMIT), Ok(1));
        eventually("every thread ended", || inner.lock().threads == 0);
    }
}
