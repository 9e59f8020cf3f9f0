//! One connection of a queue endpoint: a writer fed without ever blocking
//! the sender, and a reader that assembles objects into the inbox.

use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tubeway_proto::Decoded;
use tubeway_transport::{Connection, FrameReader, FrameWriter};

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

/// One connected peer.
#[derive(Debug)]
pub struct Peer {
    /// Where its objects are sent; never blocks the sender.
    pub outbox: Arc<Outbox>,
    pub writer_task: JoinHandle<()>,
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
    let mut frames = FrameReader::new(conn.reader, max_frame);
    frames.set_wait_strategy(conn.default_wait);
    let reader = tokio::spawn(read(peer, frames, inbox, budget, budget_max));
    Peer {
        outbox: Outbox::new(writer),
        writer_task,
        reader,
    }
}

async fn read(
    peer: u64,
    mut frames: FrameReader,
    inbox: mpsc::UnboundedSender<Event>,
    budget: Arc<Semaphore>,
    budget_max: u32,
) {
    let mut assembler = Assembler::default();
    let reason = loop {
        let msg = match frames.next().await {
            Ok(Some(Decoded::Message(msg))) => msg,
            Ok(Some(other)) => break format!("peer sent an invalid frame: {other:?}"),
            Ok(None) => break "the peer closed the connection".to_owned(),
            Err(e) => break format!("the connection failed: {e}"),
        };
        match assembler.push(msg) {
            Ok(None) => {}
            Ok(Some(received)) => {
                // Bounded memory: wait for room in the inbox's byte budget
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
            }
            Err(e) => break format!("the peer broke the queue framing: {e}"),
        }
    };
    let _ = inbox.send(Event::Left { peer, reason });
}
