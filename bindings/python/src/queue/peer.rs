//! One connection of a queue endpoint: a writer fed without ever blocking
//! the sender, and a reader that assembles objects.
//!
//! While the endpoint has one peer, `get` reads the next object on its own
//! thread ([`Reading::inline`]), waiting by the endpoint's strategy: the
//! read-ahead task goes dormant. The task reads objects ahead into the
//! endpoint's inbox when there are several peers (`get` then waits on the
//! inbox) and while the duty thread drives the runtime with nobody calling
//! `get` ([`Reading::resume`]). Either way it runs on the endpoint's own
//! runtime, on whichever thread drives it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, Mutex, Notify, Semaphore};
use tokio::task::JoinHandle;
use tubeway_proto::Decoded;
use tubeway_transport::{Connection, FramePool, FrameReader, FrameWriter, WaitStrategy};

use super::framing::{Assembler, Received};
use super::outbox::Outbox;

/// Frames from this size up are read into buffers used again once the
/// objects made of them are dropped: fresh memory for each would cost a
/// page fault and a zeroed page per 4 KiB, about as much as reading it.
const RECYCLE_FROM: usize = 256 << 10;
/// Free buffers a peer keeps for its next large frames, at most: enough
/// for the few large objects a pipeline has in flight at once (with 64 MiB,
/// arrays of up to 64 MiB mostly missed the pool and moved at 60 % of the
/// speed they move at with this). Each is freed after 5 s unused, the rest
/// with the queue.
const RECYCLE_HELD: usize = 128 << 20;

/// What a reader reports to the endpoint's inbox.
#[derive(Debug)]
pub enum Event {
    /// A whole object from `peer`, holding `permits` bytes of the inbox budget.
    Object {
        peer: u64,
        received: Received,
        permits: u32,
    },
    /// `peer` is gone (closed, died or broke the framing).
    Left { peer: u64, reason: String },
}

/// A connection's read side and where reading stands.
#[derive(Debug)]
pub struct PeerReader {
    frames: FrameReader,
    assembler: Assembler,
    /// The peer is gone; nothing more will be read.
    ended: bool,
}

impl PeerReader {
    /// The next whole object, or why the peer is gone. Cancel-safe: bytes
    /// and frames read stay here for the next call.
    async fn next_object(&mut self) -> Result<Received, String> {
        loop {
            let msg = match self.frames.next().await {
                Ok(Some(Decoded::Message(msg))) => *msg,
                Ok(Some(other)) => return Err(format!("peer sent an invalid frame: {other:?}")),
                Ok(None) => return Err("the peer closed the connection".to_owned()),
                Err(e) => return Err(format!("the connection failed: {e}")),
            };
            match self.assembler.push(msg) {
                Ok(None) => {}
                Ok(Some(received)) => return Ok(received),
                Err(e) => return Err(format!("the peer broke the queue framing: {e}")),
            }
        }
    }

    /// [`next_object`](Self::next_object), polling for it until `deadline`
    /// before sleeping until it comes: one non-blocking look at the
    /// transport (the kernel, or the ring), then the CPU to whoever waits
    /// for it, in turns.
    ///
    /// Not the transport's own spinning, which gives the CPU away every
    /// 5 µs: when the peer runs on this same CPU (schedulers put a waker and
    /// its wakee together), each direction would wait for that, which is
    /// slower than sleeping. Giving it away after every look costs a system
    /// call when the CPU is this thread's alone, and hands it over at once
    /// when it is not.
    async fn next_object_polling(&mut self, deadline: Instant) -> Result<Received, String> {
        std::future::poll_fn(|cx| {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                // A spinning strategy, set afresh, looks once and returns:
                // it gives its runtime a turn before it would spin.
                self.frames
                    .set_wait_strategy(WaitStrategy::SpinPark { spin: left });
                let next = self.next_object();
                if let Poll::Ready(r) = std::pin::pin!(next).poll(cx) {
                    return Poll::Ready(r);
                }
                std::thread::yield_now();
            }
            self.frames.set_wait_strategy(WaitStrategy::PARK);
            let next = self.next_object();
            std::pin::pin!(next).poll(cx)
        })
        .await
    }
}

/// The read side, shared by the read-ahead task and inline readers.
#[derive(Debug)]
pub struct Reading {
    state: Mutex<PeerReader>,
    /// `get` reads inline; the read-ahead task leaves `state` alone.
    dormant: AtomicBool,
    /// Asks the read-ahead task to let go of `state`.
    step_aside: Notify,
    /// Wakes the read-ahead task when it is no longer dormant.
    resumed: Notify,
}

impl Reading {
    /// Lets the read-ahead task read again (a second peer joined, or the
    /// duty thread drives the runtime with nobody calling `get`).
    pub fn resume(&self) {
        self.dormant.store(false, Ordering::SeqCst);
        self.resumed.notify_waiters();
    }

    /// The next event for `peer`: one the read-ahead task queued already,
    /// or else the next object read on the caller's thread, sleeping until
    /// it comes, after polling for it for as long as `wait` says (unless
    /// `flushing`: the connection's writer has frames queued, whose tasks
    /// must not wait for the polling).
    /// Whatever reaches the inbox meanwhile (the endpoint was closed) ends
    /// the wait too. `None` when the peer had already ended.
    pub async fn inline(
        &self,
        peer: u64,
        inbox: &mut mpsc::UnboundedReceiver<Event>,
        wait: WaitStrategy,
        flushing: bool,
    ) -> Option<Event> {
        if !self.dormant.swap(true, Ordering::SeqCst) {
            self.step_aside.notify_one();
        }
        let mut state = self.state.lock().await;
        if let Ok(queued) = inbox.try_recv() {
            return Some(queued);
        }
        if state.ended {
            return None;
        }
        // Polling would hold up the writer's tasks, which must run first.
        let poll_until = wait
            .spin()
            .filter(|_| !flushing)
            .map(|d| Instant::now() + d);
        let next = match poll_until {
            Some(deadline) => tokio::select! {
                biased;
                next = state.next_object_polling(deadline) => next,
                queued = inbox.recv() => return queued,
            },
            None => {
                state.frames.set_wait_strategy(WaitStrategy::PARK);
                tokio::select! {
                    biased;
                    next = state.next_object() => next,
                    queued = inbox.recv() => return queued,
                }
            }
        };
        Some(match next {
            Ok(received) => Event::Object {
                peer,
                received,
                permits: 0,
            },
            Err(reason) => {
                state.ended = true;
                Event::Left { peer, reason }
            }
        })
    }
}

/// One connected peer.
#[derive(Debug)]
pub struct Peer {
    /// Where its objects are sent; never blocks the sender.
    pub outbox: Arc<Outbox>,
    /// Its read side.
    pub reading: Arc<Reading>,
    /// The writer's flusher.
    pub writer_task: JoinHandle<()>,
    /// The read-ahead task.
    pub reader: JoinHandle<()>,
}

/// Starts the tasks of a new connection to `peer` on `runtime`, the
/// endpoint's, with whose reactor `conn` is registered.
pub fn start(
    runtime: &Handle,
    peer: u64,
    conn: Connection,
    max_frame: usize,
    inbox: mpsc::UnboundedSender<Event>,
    budget: Arc<Semaphore>,
    budget_max: u32,
) -> Peer {
    let (writer, flusher) = FrameWriter::new(conn.writer);
    let writer_task = runtime.spawn(async move {
        if let Err(e) = flusher.await {
            tracing::debug!(peer, "queue writer stopped: {e}");
        }
    });
    // The read-ahead task always sleeps, whatever the transport would poll
    // by default: it reads while a `get` waits on the inbox or the duty
    // thread drives, where polling would only take a core. Polling is for
    // `get`'s own reads.
    let mut frames = FrameReader::new(conn.reader, max_frame);
    // Made within the runtime, whose task then gives idle buffers back:
    // objects are dropped on Python's threads, outside any runtime.
    let pool = {
        let _in = runtime.enter();
        FramePool::new(RECYCLE_FROM, RECYCLE_HELD)
    };
    frames.recycle_large_frames(pool);
    let reading = Arc::new(Reading {
        state: Mutex::new(PeerReader {
            frames,
            assembler: Assembler::default(),
            ended: false,
        }),
        dormant: AtomicBool::new(false),
        step_aside: Notify::new(),
        resumed: Notify::new(),
    });
    let reader = runtime.spawn(read_ahead(peer, reading.clone(), inbox, budget, budget_max));
    Peer {
        outbox: Outbox::new(writer, runtime.clone()),
        reading,
        writer_task,
        reader,
    }
}

/// Reads objects into the inbox while no `get` reads inline.
async fn read_ahead(
    peer: u64,
    reading: Arc<Reading>,
    inbox: mpsc::UnboundedSender<Event>,
    budget: Arc<Semaphore>,
    budget_max: u32,
) {
    loop {
        loop {
            let resumed = reading.resumed.notified();
            if !reading.dormant.load(Ordering::SeqCst) {
                break;
            }
            resumed.await;
        }
        let mut state = reading.state.lock().await;
        if state.ended {
            return;
        }
        // `get` may have read inline last, waiting by its own strategy.
        state.frames.set_wait_strategy(WaitStrategy::PARK);
        let stepped_aside = reading.step_aside.notified();
        tokio::pin!(stepped_aside);
        stepped_aside.as_mut().enable();
        if reading.dormant.load(Ordering::SeqCst) {
            continue;
        }
        let next = tokio::select! {
            biased;
            _ = &mut stepped_aside => continue,
            next = state.next_object() => next,
        };
        match next {
            Ok(received) => {
                // The read side stays locked until the object is in the
                // inbox, so that an inline reader, which looks in the inbox
                // first, never overtakes it. Bounded memory: wait for room in the inbox's byte budget
                // (an object larger than the whole budget takes all of it).
                let permits = u32::try_from(received.size())
                    .unwrap_or(u32::MAX)
                    .clamp(1, budget_max);
                let Ok(permit) = budget.acquire_many(permits).await else {
                    return;
                };
                permit.forget();
                let event = Event::Object {
                    peer,
                    received,
                    permits,
                };
                if inbox.send(event).is_err() {
                    return;
                }
                drop(state);
            }
            Err(reason) => {
                state.ended = true;
                let _ = inbox.send(Event::Left { peer, reason });
                return;
            }
        }
    }
}
