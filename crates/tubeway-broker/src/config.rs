use std::time::Duration;

use tubeway_proto::{DEFAULT_MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE_LIMIT};
use tubeway_transport::{FramePool, WaitStrategy};

/// Broker settings. Defaults are safe for a shared machine.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BrokerConfig {
    /// Largest frame accepted or sent, in bytes (default 20 MiB; at most 1 GiB).
    pub max_message_size: usize,
    /// Live connections allowed at once; further ones are refused with `unavailable`.
    pub max_connections: usize,
    /// Deliveries buffered per subscriber before new ones are dropped (and counted).
    pub subscriber_buffer: usize,
    /// Largest queue capacity a client may ask for.
    pub max_queue_capacity: u64,
    /// Requests one connection may have waiting at once (polls, offers, calls);
    /// past this the broker stops reading from that connection.
    pub max_in_flight_per_connection: usize,
    /// How long a new connection has to send `hello`.
    pub handshake_timeout: Duration,
    /// How long [`crate::Broker::shutdown`] lets in-flight requests finish.
    pub shutdown_timeout: Duration,
    /// Name reported in the handshake.
    pub server_name: String,
    /// How connections wait for their next request; `None` takes each
    /// transport's own default (sleep in the kernel, for sockets). A spinning
    /// strategy is the socket latency mode: such connections are served by
    /// the threads of [`BrokerConfig::spin_threads`], which poll instead of
    /// sleeping; that cuts a wake-up out of every request at the price of a
    /// busy core while a connection is active (see [`WaitStrategy`]).
    pub wait: Option<WaitStrategy>,
    /// Threads that serve the connections whose readers spin (shared memory,
    /// and sockets in latency mode); default half the CPUs, at least one:
    /// a shared-memory client runs on the same machine, and spins too, so a
    /// broker spinning on every CPU would leave its clients none. A
    /// connection alone on its thread spins in place; connections sharing
    /// one are polled in turn. Each thread starts with its first connection
    /// and ends with its last.
    pub spin_threads: usize,
    /// Bytes of memory kept, at most, from the buffers of large messages
    /// (64 KiB and up) whose messages are done, for the next ones to be read
    /// into (default 256 MiB; 0 keeps none). One pool serves every
    /// connection, and a buffer unused for 5 s goes back to the system.
    /// Fresh memory for every large message costs a page fault per 4 KiB,
    /// more than reading the bytes (see [`tubeway_transport::FramePool`]).
    pub frame_pool: usize,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            max_connections: 10_000,
            subscriber_buffer: 1024,
            max_queue_capacity: 10_000_000,
            max_in_flight_per_connection: 4096,
            handshake_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(5),
            server_name: concat!("tubeway/", env!("CARGO_PKG_VERSION")).to_owned(),
            wait: None,
            spin_threads: default_spin_threads(),
            frame_pool: FramePool::DEFAULT_MAX_HELD,
        }
    }
}

/// Half the CPUs, at least one (see [`BrokerConfig::spin_threads`]).
fn default_spin_threads() -> usize {
    (std::thread::available_parallelism().map_or(1, usize::from) / 2).max(1)
}

impl BrokerConfig {
    /// Sets the maximum message size, clamped to 1 GiB and to at least 64 KiB.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes.clamp(64 * 1024, MAX_MESSAGE_SIZE_LIMIT);
        self
    }

    /// Sets the connection limit.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets the requests one connection may have waiting at once (at least one).
    pub fn max_in_flight_per_connection(mut self, n: usize) -> Self {
        self.max_in_flight_per_connection = n.max(1);
        self
    }

    /// Sets the per-subscriber buffer.
    pub fn subscriber_buffer(mut self, n: usize) -> Self {
        self.subscriber_buffer = n.max(1);
        self
    }

    /// Sets the shutdown grace period.
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }

    /// Sets how every connection waits for requests (see [`BrokerConfig::wait`]).
    pub fn wait(mut self, wait: WaitStrategy) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Sets the threads that serve spinning connections (at least one; see
    /// [`BrokerConfig::spin_threads`]).
    pub fn spin_threads(mut self, n: usize) -> Self {
        self.spin_threads = n.max(1);
        self
    }

    /// Sets the memory kept for the buffers of large messages (see
    /// [`BrokerConfig::frame_pool`]).
    pub fn frame_pool(mut self, bytes: usize) -> Self {
        self.frame_pool = bytes;
        self
    }

    /// Sets the handshake timeout.
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }
}
