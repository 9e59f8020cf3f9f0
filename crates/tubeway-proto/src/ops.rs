//! Bodies of management operations, carried as `application/json` payloads.
//!
//! Both the broker and every client use these types, so the operation
//! contract is defined once. Each struct documents which message carries it.
//! Unknown fields are ignored on input so later versions can add fields.

use serde::{Deserialize, Serialize};

/// Capability: the peer understands `ping`.
pub const CAP_PING: &str = "ping";
/// Capability: the peer can serve functions as a worker.
pub const CAP_WORKERS: &str = "workers";
/// Capability: the peer understands `cancel` (withdrawing a waiting poll or
/// offer, so that a poller that gave up is not sent a message it will not read).
pub const CAP_CANCEL: &str = "cancel";
/// Capability: the peer understands `requeue` (a message handed to a poll
/// whose caller had given up goes back to the head of its queue).
pub const CAP_REQUEUE: &str = "requeue";

/// Payload of `hello`, the first frame a client sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Lowest protocol version the client speaks.
    pub min_version: u8,
    /// Highest protocol version the client speaks.
    pub max_version: u8,
    /// Capabilities the client offers (compression, auth mechanisms, ...).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Free-form client name and version, for logs.
    #[serde(default)]
    pub client: String,
}

impl Default for Hello {
    fn default() -> Self {
        Hello {
            min_version: crate::PROTOCOL_VERSION,
            max_version: crate::PROTOCOL_VERSION,
            capabilities: vec![
                CAP_PING.into(),
                CAP_WORKERS.into(),
                CAP_CANCEL.into(),
                CAP_REQUEUE.into(),
            ],
            client: concat!("tubeway-rust/", env!("CARGO_PKG_VERSION")).into(),
        }
    }
}

/// Payload of the `ok` response to `hello`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The protocol version chosen for this connection.
    pub version: u8,
    /// Capabilities both sides have.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Largest frame the broker accepts.
    pub max_message_size: u64,
    /// Free-form server name and version.
    #[serde(default)]
    pub server: String,
    /// The broker's id for this connection, for logs and statistics.
    #[serde(default)]
    pub connection_id: u64,
}

/// How a queue behaves when full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum QueueKind {
    /// A full queue makes `offer` wait up to its timeout, then `queue_full`.
    #[default]
    Bounded,
    /// A full queue drops its oldest message to take the new one.
    Circular,
}

impl QueueKind {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueKind::Bounded => "bounded",
            QueueKind::Circular => "circular",
        }
    }
}

/// Payload of `create_queue` (and of `create_temporary_queue`, whose name the broker picks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateQueue {
    /// Maximum number of messages held.
    pub capacity: u64,
    /// Behaviour when full.
    #[serde(default)]
    pub kind: QueueKind,
    /// Keep messages across restarts (requires a durable store).
    #[serde(default)]
    pub durable: bool,
}

/// Payload of the `ok` response to `queue_status`, `create_queue`,
/// `create_temporary_queue`; elements of `list_queues`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// Queue name.
    pub name: String,
    /// Behaviour when full.
    pub kind: QueueKind,
    /// Maximum number of messages held.
    pub capacity: u64,
    /// Messages held now.
    pub size: u64,
    /// Whether messages survive a restart.
    pub durable: bool,
    /// Whether the queue goes away with the connection that created it.
    pub temporary: bool,
}

/// Payload of the `ok` response to `exists_queue`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exists {
    /// Whether the destination exists.
    pub exists: bool,
}

/// Payload of `subscribe` (optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    /// Messages buffered for this subscriber before new ones are dropped;
    /// the broker's default when absent.
    #[serde(default)]
    pub buffer: Option<u64>,
}

/// Status of a topic: `topic_status`, `create_topic`, elements of `list_topics`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicStatus {
    /// Topic name.
    pub name: String,
    /// Current subscribers.
    pub subscribers: u64,
    /// Messages published.
    pub published: u64,
    /// Deliveries made (one per subscriber per message).
    pub delivered: u64,
    /// Deliveries dropped because a subscriber's buffer was full.
    pub dropped: u64,
}

/// Payload of `create_function` from a worker (optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateFunction {
    /// The most calls the broker forwards to the worker's connection at
    /// once (counting those it has not answered yet, timed out or not, of
    /// the functions it registered with a limit); further calls wait at
    /// the broker for room, or for another worker. No limit when absent.
    #[serde(default)]
    pub max_calls: Option<u64>,
}

/// Status of a function: `function_status`, elements of `list_functions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionStatus {
    /// Function name.
    pub name: String,
    /// Whether a handler is registered inside the broker process.
    pub local: bool,
    /// Remote workers registered.
    pub workers: u64,
    /// Calls received.
    pub calls: u64,
    /// Calls answered with an error status.
    pub errors: u64,
    /// Calls waiting at the broker for a worker with room for them.
    #[serde(default)]
    pub waiting: u64,
}

/// Per-queue counters, beside its status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Current status.
    #[serde(flatten)]
    pub status: QueueStatus,
    /// Messages accepted.
    pub offered: u64,
    /// Messages handed to pollers.
    pub polled: u64,
    /// Messages dropped because they expired.
    pub expired: u64,
    /// Messages overwritten in a circular queue.
    pub overwritten: u64,
    /// Offers refused with `queue_full`.
    pub rejected: u64,
}

/// Payload of the `ok` response to `stats`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Time since the broker started, in ms.
    pub uptime_ms: u64,
    /// Live connections.
    pub connections: u64,
    /// Connections accepted since start.
    pub connections_total: u64,
    /// Connections refused (limit reached, handshake failed).
    pub connections_rejected: u64,
    /// Frames received.
    pub messages_in: u64,
    /// Frames sent.
    pub messages_out: u64,
    /// Requests answered with an error status, and protocol errors.
    pub errors: u64,
    /// Bytes of memory kept from the buffers of large messages for the next
    /// ones to be read into (absent from brokers that predate it).
    #[serde(default)]
    pub frame_pool_bytes: u64,
    /// Every queue.
    pub queues: Vec<QueueStats>,
    /// Every topic.
    pub topics: Vec<TopicStatus>,
    /// Every function.
    pub functions: Vec<FunctionStatus>,
}
