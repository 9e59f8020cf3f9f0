//! Drives a workload: closed loops (throughput, round trips) and an open
//! loop at a fixed rate (latency without coordinated omission). A closed
//! loop runs as tasks on the runtime (async clients) or as one plain
//! thread per connection (blocking clients, channels), as the workload says.
//!
//! Every measurement is bounded in time: a broker that stops answering
//! ends the run with an error instead of a hang.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::stream::{FuturesUnordered, StreamExt as _};
use hdrhistogram::Histogram;

use super::latency;
use super::modes::{ClientKind, Tally, Workload};
use super::rate::{wait_for, Schedule};

/// How long a measurement may overrun its duration before it is abandoned.
pub const GRACE: Duration = Duration::from_secs(120);
/// Operations a fixed-rate run keeps outstanding at most; past that the
/// sender falls behind its schedule, which the latencies then show.
const MAX_OUTSTANDING: usize = 10_000;

/// Operations (or bytes) done in a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Count {
    /// Operations completed (bytes, for streaming and memcpy).
    pub ops: u64,
    /// Seconds taken.
    pub secs: f64,
}

impl Count {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// What a closed loop measured.
#[derive(Debug)]
pub struct Outcome {
    /// Operations done, until everything was accounted for.
    pub count: Count,
    /// Deliveries and drops (publish).
    pub tally: Tally,
    /// Each operation's time, if asked for.
    pub hist: Option<Histogram<u64>>,
}

/// Operations run back to back for `d` on `lanes` connections with
/// `in_flight` each. With `record`, every operation's time goes into a
/// histogram.
pub async fn closed_loop(
    work: &Arc<dyn Workload>,
    lanes: usize,
    in_flight: usize,
    d: Duration,
    record: bool,
) -> anyhow::Result<Outcome> {
    if work.client() == ClientKind::Async {
        tasks_closed_loop(work, lanes, in_flight, d, record).await
    } else {
        threads_closed_loop(work, lanes, d, record).await
    }
}

/// `lanes × in_flight` tasks each run operations back to back for `d`.
async fn tasks_closed_loop(
    work: &Arc<dyn Workload>,
    lanes: usize,
    in_flight: usize,
    d: Duration,
    record: bool,
) -> anyhow::Result<Outcome> {
    let run = async {
        let start = Instant::now();
        let deadline = start + d;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..lanes * in_flight {
            let work = work.clone();
            let lane = i / in_flight.max(1);
            tasks.spawn(async move {
                let mut hist = record.then(latency::histogram);
                let mut ops = 0u64;
                loop {
                    let t0 = Instant::now();
                    if t0 >= deadline {
                        return anyhow::Ok((ops, hist));
                    }
                    work.op(lane).await?;
                    if let Some(h) = hist.as_mut() {
                        latency::record(h, t0.elapsed());
                    }
                    ops += 1;
                }
            });
        }
        let mut ops = 0;
        let mut merged = record.then(latency::histogram);
        while let Some(done) = tasks.join_next().await {
            // The first failure ends the run; the other tasks are aborted on drop.
            let (n, h) = done.context("a bench task panicked")??;
            ops += n;
            if let (Some(m), Some(h)) = (merged.as_mut(), h) {
                m.add(h).context("merging latency histograms")?;
            }
        }
        let tally = work.settle().await?;
        anyhow::Ok(Outcome {
            count: Count {
                ops,
                secs: start.elapsed().as_secs_f64(),
            },
            tally,
            hist: merged,
        })
    };
    tokio::time::timeout(d + GRACE, run)
        .await
        .map_err(|_| anyhow::anyhow!("no progress {GRACE:?} past the end of a {d:?} run"))?
}

/// One plain thread per lane runs its operations back to back for `d`
/// (the lane keeps its own operations in flight).
async fn threads_closed_loop(
    work: &Arc<dyn Workload>,
    lanes: usize,
    d: Duration,
    record: bool,
) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let deadline = start + d;
    let give_up = deadline + GRACE;
    let threads = {
        let work = work.clone();
        // A blocking-pool thread waits for the lanes; the lanes themselves
        // run on threads of their own, outside the runtime.
        tokio::task::spawn_blocking(move || {
            // Set by the first lane that fails, so the others stop too.
            let failed = AtomicBool::new(false);
            std::thread::scope(|scope| {
                let running: Vec<_> = (0..lanes)
                    .map(|lane| {
                        let (work, failed) = (&work, &failed);
                        scope.spawn(move || {
                            let r =
                                run_lane(work.as_ref(), lane, deadline, give_up, record, failed);
                            if r.is_err() {
                                failed.store(true, Ordering::Relaxed);
                            }
                            r
                        })
                    })
                    .collect();
                let mut ops = 0;
                let mut merged = record.then(latency::histogram);
                let mut first_error = None;
                for t in running {
                    match t.join() {
                        Ok(Ok((n, h))) => {
                            ops += n;
                            if let (Some(m), Some(h)) = (merged.as_mut(), h) {
                                m.add(h).context("merging latency histograms")?;
                            }
                        }
                        Ok(Err(e)) => {
                            first_error.get_or_insert(e);
                        }
                        Err(_) => {
                            first_error.get_or_insert(anyhow::anyhow!("a bench lane panicked"));
                        }
                    }
                }
                match first_error {
                    Some(e) => Err(e),
                    None => Ok((ops, merged)),
                }
            })
        })
    };
    let (ops, hist) = tokio::time::timeout(d + GRACE, threads)
        .await
        .map_err(|_| anyhow::anyhow!("no progress {GRACE:?} past the end of a {d:?} run"))?
        .context("the lane threads panicked")??;
    let tally = work.settle().await?;
    Ok(Outcome {
        count: Count {
            ops,
            secs: start.elapsed().as_secs_f64(),
        },
        tally,
        hist,
    })
}

/// One lane: operations until `deadline` (or another lane's failure), each
/// timed from the end of the one before (one clock read per operation),
/// then what is still in flight.
fn run_lane(
    work: &dyn Workload,
    lane: usize,
    deadline: Instant,
    give_up: Instant,
    record: bool,
    failed: &AtomicBool,
) -> anyhow::Result<(u64, Option<Histogram<u64>>)> {
    let mut ops = work.lane(lane, give_up)?;
    let mut hist = record.then(latency::histogram);
    let mut done = 0u64;
    let mut t0 = Instant::now();
    while t0 < deadline {
        if failed.load(Ordering::Relaxed) {
            // The run fails with that lane's error; this one stops quietly.
            return Ok((done, hist));
        }
        ops.op()?;
        let t1 = Instant::now();
        if let Some(h) = hist.as_mut() {
            latency::record(h, t1 - t0);
        }
        done += 1;
        t0 = t1;
    }
    done += ops.finish()?;
    Ok((done, hist))
}

/// What a fixed-rate run measured.
#[derive(Debug)]
pub struct RateOutcome {
    /// Operations completed, and the time until the last one completed.
    pub count: Count,
    /// Deliveries and drops (publish).
    pub tally: Tally,
    /// Latency of each operation from its intended send time.
    pub hist: Histogram<u64>,
    /// How far the sender fell behind its schedule at worst.
    pub lag: Duration,
}

/// Sends at `rate` for `d`, spread over `lanes`, whatever the responses
/// do; each latency runs from the operation's intended send time. A
/// workload that paces itself (a channel) does so.
pub async fn fixed_rate(
    work: &Arc<dyn Workload>,
    lanes: usize,
    rate: u64,
    d: Duration,
) -> anyhow::Result<RateOutcome> {
    if let Some(run) = work.fixed_rate(rate, d) {
        return tokio::time::timeout(d + GRACE, run)
            .await
            .map_err(|_| anyhow::anyhow!("no progress {GRACE:?} past the end of a {d:?} run"))?;
    }
    let start = Instant::now();
    let schedule = Schedule::new(start, rate, d);
    let runtime = tokio::runtime::Handle::current();
    // The pacer is a thread, not a task: a task's timer is only as fine as
    // a millisecond, which would be counted as latency. It polls the
    // operations it starts itself: a task spawned for each would be handed
    // to a worker of the runtime, which costs a wake-up of tens of
    // microseconds whenever the worker sleeps, counted as latency too.
    let pacer = {
        let work = work.clone();
        tokio::task::spawn_blocking(move || pace(&work, lanes, &schedule, &runtime))
    };
    let run = async {
        let (hist, lag) = pacer.await.context("the pacer thread panicked")??;
        let secs = start.elapsed().as_secs_f64();
        let tally = work.settle().await?;
        anyhow::Ok(RateOutcome {
            count: Count {
                ops: hist.len(),
                secs,
            },
            tally,
            hist,
            lag,
        })
    };
    tokio::time::timeout(d + GRACE, run)
        .await
        .map_err(|_| anyhow::anyhow!("no progress {GRACE:?} past the end of a {d:?} run"))?
}

/// Wakes the pacer's thread when an operation it polls can go on.
struct Unpark(std::thread::Thread);

impl futures::task::ArcWake for Unpark {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.unpark();
    }
}

/// Starts each operation of `work` at its time by `schedule`, spread over
/// `lanes`, and polls those in flight, on this thread; at most
/// [`MAX_OUTSTANDING`] (past that it falls behind its schedule, which the
/// latencies then show). Returns each operation's latency from its
/// intended start, and how far behind schedule a start came at worst.
fn pace(
    work: &Arc<dyn Workload>,
    lanes: usize,
    schedule: &Schedule,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    // The clients' futures may spawn or arm timers on their runtime.
    let _context = runtime.enter();
    let waker = futures::task::waker(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut hist = latency::histogram();
    let mut lag = Duration::ZERO;
    let mut in_flight = FuturesUnordered::new();
    let mut i = 0u64;
    loop {
        while let std::task::Poll::Ready(Some((took, result))) = in_flight.poll_next_unpin(&mut cx)
        {
            result?;
            latency::record(&mut hist, took);
        }
        if i >= schedule.total() {
            if in_flight.is_empty() {
                return Ok((hist, lag));
            }
            // Woken by the next end.
            std::thread::park_timeout(Duration::from_millis(1));
            continue;
        }
        let now = Instant::now();
        let due = schedule.due_by(now);
        if i >= due || in_flight.len() >= MAX_OUTSTANDING {
            // An operation that ends wakes this thread early.
            wait_for(schedule.intended(i).saturating_duration_since(now));
            continue;
        }
        while i < due && in_flight.len() < MAX_OUTSTANDING {
            let intended = schedule.intended(i);
            lag = lag.max(Instant::now().saturating_duration_since(intended));
            let lane = usize::try_from(i).unwrap_or(0) % lanes.max(1);
            let work = work.clone();
            in_flight.push(async move {
                let result = work.op(lane).await;
                (intended.elapsed(), result)
            });
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::modes::Lane;
    use futures::future::BoxFuture;
    use std::sync::atomic::AtomicU64;

    /// An operation that takes a fixed time.
    struct Sleepy {
        took: Duration,
        done: AtomicU64,
        fail_after: u64,
    }

    impl Workload for Sleepy {
        fn client(&self) -> ClientKind {
            ClientKind::Async
        }

        fn op(&self, _lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(self.took).await;
                let n = self.done.fetch_add(1, Ordering::Relaxed);
                anyhow::ensure!(n < self.fail_after, "broken after {n}");
                Ok(())
            })
        }

        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    fn sleepy(took: Duration, fail_after: u64) -> Arc<dyn Workload> {
        Arc::new(Sleepy {
            took,
            done: AtomicU64::new(0),
            fail_after,
        })
    }

    #[tokio::test]
    async fn closed_loops_count_and_time_operations() {
        let w = sleepy(Duration::from_millis(2), u64::MAX);
        let out = closed_loop(&w, 2, 3, Duration::from_millis(50), true)
            .await
            .unwrap();
        // 6 tasks, each at most 50 ms / 2 ms operations (and at least one).
        assert!(out.count.ops >= 6 && out.count.ops <= 6 * 26, "{out:?}");
        let h = out.hist.unwrap();
        assert_eq!(h.len(), out.count.ops);
        assert!(h.min() >= 2_000_000, "{}", h.min());
    }

    #[tokio::test]
    async fn a_failing_operation_ends_the_run() {
        // Four tasks; the first failure ends the run long before its 60 s.
        let w = sleepy(Duration::ZERO, 10);
        let run = closed_loop(&w, 2, 2, Duration::from_secs(60), false);
        let err = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the run ended at the first failure")
            .unwrap_err();
        assert!(err.to_string().contains("broken after"), "{err}");
        let w = sleepy(Duration::ZERO, 10);
        let err = fixed_rate(&w, 1, 10_000, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("broken after"), "{err}");
    }

    /// Blocking operations of a fixed time on lane threads, each lane with
    /// `tail` more completed by `finish`; lane 1 fails after `fail_after`.
    struct Blocking {
        took: Duration,
        tail: u64,
        fail_after: u64,
    }

    struct BlockingLane<'a> {
        w: &'a Blocking,
        lane: usize,
        done: u64,
    }

    impl Lane for BlockingLane<'_> {
        fn op(&mut self) -> anyhow::Result<()> {
            // A runtime thread would make the blocking client refuse.
            anyhow::ensure!(
                tokio::runtime::Handle::try_current().is_err(),
                "on a runtime"
            );
            std::thread::sleep(self.w.took);
            self.done += 1;
            anyhow::ensure!(
                self.lane != 1 || self.done <= self.w.fail_after,
                "lane broke"
            );
            Ok(())
        }

        fn finish(&mut self) -> anyhow::Result<u64> {
            Ok(self.w.tail)
        }
    }

    impl Workload for Blocking {
        fn client(&self) -> ClientKind {
            ClientKind::Blocking
        }

        fn lane(&self, lane: usize, _give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
            Ok(Box::new(BlockingLane {
                w: self,
                lane,
                done: 0,
            }))
        }

        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn lanes_run_on_plain_threads() {
        let w: Arc<dyn Workload> = Arc::new(Blocking {
            took: Duration::from_millis(2),
            tail: 5,
            fail_after: u64::MAX,
        });
        let out = closed_loop(&w, 3, 1, Duration::from_millis(50), true)
            .await
            .unwrap();
        // 3 lanes of at most 26 operations, plus 5 finished by each.
        assert!(out.count.ops >= 3 * 6 && out.count.ops <= 3 * 31, "{out:?}");
        let h = out.hist.unwrap();
        assert_eq!(h.len() + 15, out.count.ops);
        assert!(h.min() >= 2_000_000, "{}", h.min());
        let w: Arc<dyn Workload> = Arc::new(Blocking {
            took: Duration::ZERO,
            tail: 0,
            fail_after: 10,
        });
        let run = closed_loop(&w, 2, 1, Duration::from_secs(60), false);
        let err = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the run ended at the first failure")
            .unwrap_err();
        assert!(err.to_string().contains("lane broke"), "{err}");
    }

    /// The pacer times a completion when it comes, not at its next start:
    /// at 50 msg/s (20 ms apart), operations of 2 ms take about 2 ms.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_completion_is_timed_when_it_comes() {
        let w = sleepy(Duration::from_millis(2), u64::MAX);
        let out = fixed_rate(&w, 1, 50, Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(out.count.ops, 10);
        let l = latency::Latency::of(&out.hist);
        assert!(l.p50_us >= 2_000.0, "{l:?}");
        assert!(l.max_us < 12_000.0, "{l:?}");
    }

    /// A system that serves one operation at a time, 2 ms each: 500 msg/s at most.
    struct OneAtATime(tokio::sync::Mutex<()>);

    impl Workload for OneAtATime {
        fn client(&self) -> ClientKind {
            ClientKind::Async
        }

        fn op(&self, _lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
            Box::pin(async move {
                let _busy = self.0.lock().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(())
            })
        }

        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queueing_behind_a_slow_system_is_not_omitted() {
        // Offered 1000 msg/s for 200 ms, served at most 500 msg/s: the queue
        // grows, and the last messages wait some 200 ms. A closed loop would
        // see 2 ms per operation; the fixed-rate run must see the wait.
        let w: Arc<dyn Workload> = Arc::new(OneAtATime(tokio::sync::Mutex::new(())));
        let out = fixed_rate(&w, 1, 1000, Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(out.count.ops, 200);
        let l = latency::Latency::of(&out.hist);
        assert!(l.p50_us > 50_000.0, "{l:?}");
        assert!(l.max_us > 150_000.0, "{l:?}");
        let closed = closed_loop(&w, 1, 1, Duration::from_millis(50), true)
            .await
            .unwrap();
        let c = latency::Latency::of(&closed.hist.unwrap());
        assert!(c.p50_us < 20_000.0, "{c:?}");
    }
}
