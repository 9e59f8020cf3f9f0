//! One connection of a queue endpoint: a writer fed without ever blocking
//! the sender, and a reader that assembles objects.
//!
//! A task reads objects ahead into the endpoint's inbox. In latency mode,
//! while the endpoint has one peer, `get` reads on its own thread instead
//! ([`Reading::inline`]): the task goes dormant, and the caller polls the
//! socket itself for a while before it sleeps, so an answer that comes
//! quickly wakes no thread at all. The task resumes reading ahead when a
//! second peer joins ([`Reading::resume`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Mutex, Notify, Semaphore};
use tokio::task::JoinHandle;
use tubeway_proto::Decoded;
use tubeway_transport::{Connection, FrameReader, FrameWriter, WaitStrategy};

use super::framing::{Assembler, Received};
use super::outbox::Outbox;

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
                Ok(Some(Decoded::Message(msg))) => msg,
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
    /// Lets the read-ahead task read again (a second peer joined).
    pub fn resume(&self) {
        self.dormant.store(false, Ordering::SeqCst);
        self.resumed.notify_waiters();
    }

    /// The next event for `peer`: one the read-ahead task queued already,
    /// or else the next object read on the caller's thread, polling by
    /// `wait` before sleeping. `None` when the peer had already ended.
    pub async fn inline(
        &self,
        peer: u64,
        inbox: &mut mpsc::UnboundedReceiver<Event>,
        wait: WaitStrategy,
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
        state.frames.set_wait_strategy(wait);
        let next = state.next_object().await;
        state.frames.set_wait_strategy(WaitStrategy::PARK);
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

/// Starts the tasks of a new connection to `peer`. Must run on the runtime.
pub fn start(
    peer: u64,
    conn: Connection,
    max_frame: usize,
    inbox: mpsc::UnboundedSender<Event>,
    budget: Arc<Semaphore>,
    budget_max: u32,
) -> Peer {
    let (writer, flusher) = FrameWriter::new(conn.writer);
    let writer_task = tokio::spawn(async move {
        if let Err(e) = flusher.await {
            tracing::debug!(peer, "queue writer stopped: {e}");
        }
    });
    // The read-ahead task runs on the shared runtime, where polling would
    // take a thread from every other connection: it always sleeps, whatever
    // the transport would poll by default. Polling is for `get`'s own thread.
    let frames = FrameReader::new(conn.reader, max_frame);
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
    let reader = tokio::spawn(read_ahead(peer, reading.clone(), inbox, budget, budget_max));
    Peer {
        outbox: Outbox::new(writer),
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
