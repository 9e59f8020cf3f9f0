//! The modes: what one benchmarked operation is.
//!
//! A mode is a [`Mode`] (its name, the bytes one operation moves, how to set
//! it up) that prepares a [`Workload`] (the connections and whatever else one
//! figure needs). The runner drives a workload in one of two ways, by its
//! [`ClientKind`]: tasks calling [`Workload::op`] (the `AsyncClient`, any
//! number in flight), or one thread per connection running the
//! [`Lane`] that [`Workload::lane`] gives (the blocking `Client` and
//! channels). A new mode is one file here and one line in [`MODES`]; a mode
//! without a broker (a raw point-to-point channel) says so with
//! [`Mode::needs_broker`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use tubeway::channel::ChannelOptions;
use tubeway::{AsyncClient, Client, ClientOptions, Message};

use super::runner::RateOutcome;
use super::threads::off_runtime;
use super::transport::names;
use crate::cli::UsageError;

mod call;
mod channel;
mod echo;
mod oneway;
mod publish;
mod queue;
mod worker;

/// Every mode, in the order the report shows them.
pub static MODES: &[&dyn Mode] = &[
    &call::Call { blocking: false },
    &call::Call { blocking: true },
    &echo::Echo,
    &worker::Worker { sync: false },
    &worker::Worker { sync: true },
    &oneway::Oneway,
    &queue::Queue,
    &publish::Publish,
    &channel::Channel,
];

/// One kind of operation to benchmark.
pub trait Mode: Send + Sync + fmt::Debug {
    /// The name on the command line and in the report.
    fn name(&self) -> &'static str;

    /// One line: what one operation is.
    fn about(&self) -> &'static str;

    /// The frames one operation moves, in order, for the bare ping-pong that
    /// moves the same bytes. An exchange with nothing coming back is matched
    /// by bare streaming instead.
    fn exchanges(&self, payload: usize) -> Vec<Exchange>;

    /// Whether the mode goes through a broker.
    fn needs_broker(&self) -> bool {
        true
    }

    /// The client that drives `connections` connections of `in_flight`
    /// operations each: one operation in flight is the blocking `Client`'s
    /// (it drives its connection from the calling thread, the best a
    /// caller can do), anything pipelined the `AsyncClient`'s.
    fn client(&self, connections: usize, in_flight: usize) -> ClientKind {
        if connections == 1 && in_flight == 1 {
            ClientKind::Blocking
        } else {
            ClientKind::Async
        }
    }

    /// Connects and sets up what one figure needs.
    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>>;
}

/// Which client drives a figure's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientKind {
    /// `tubeway::Client`, one thread per connection, each call driven from
    /// that thread.
    Blocking,
    /// `tubeway::AsyncClient`, tasks on the bench's runtime.
    Async,
    /// A `tubeway::channel` end, one thread per channel.
    Channel,
}

impl ClientKind {
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            ClientKind::Blocking => "blocking Client",
            ClientKind::Async => "AsyncClient",
            ClientKind::Channel => "channel",
        }
    }
}

/// A prepared figure: connections, queues, topics, subscribers.
pub trait Workload: Send + Sync {
    /// The client that drives it: tasks calling [`op`](Workload::op)
    /// ([`ClientKind::Async`]), or lane threads.
    fn client(&self) -> ClientKind;

    /// One operation on connection `lane` (taken modulo the connections);
    /// returns once it is complete. For [`ClientKind::Async`].
    fn op(&self, lane: usize) -> BoxFuture<'_, anyhow::Result<()>> {
        let _ = lane;
        Box::pin(async { Err(anyhow::anyhow!("this workload runs on lane threads")) })
    }

    /// The operations of connection `lane`, for a thread of its own (not a
    /// runtime's); no wait of theirs outlasts `give_up`.
    fn lane(&self, lane: usize, give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        let _ = (lane, give_up);
        anyhow::bail!("this workload runs on tasks")
    }

    /// A fixed-rate run that the workload paces itself; `None` lets the
    /// runner pace [`op`](Workload::op).
    fn fixed_rate(
        &self,
        rate: u64,
        d: Duration,
    ) -> Option<BoxFuture<'_, anyhow::Result<RateOutcome>>> {
        let _ = (rate, d);
        None
    }

    /// Waits (bounded) until everything sent so far is accounted for, and
    /// returns the deliveries and drops since the last call.
    fn settle(&self) -> BoxFuture<'_, anyhow::Result<Tally>> {
        Box::pin(async { Ok(Tally::default()) })
    }

    /// Closes the connections and removes what `prepare` created.
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// One connection's operations, run back to back on a thread of its own.
pub trait Lane: Send {
    /// One operation, complete when it returns.
    fn op(&mut self) -> anyhow::Result<()>;

    /// Once the run is over, completes what is still in flight and returns
    /// how many operations that completed.
    fn finish(&mut self) -> anyhow::Result<u64> {
        Ok(0)
    }
}

/// A closure as a lane with one operation in flight.
pub struct FnLane<F>(pub F);

impl<F: FnMut() -> anyhow::Result<()> + Send> Lane for FnLane<F> {
    fn op(&mut self) -> anyhow::Result<()> {
        (self.0)()
    }
}

/// What a workload is built from.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The broker's address; for a mode without a broker, its peer's.
    pub url: String,
    /// Connections that send.
    pub connections: usize,
    /// Operations in flight per connection.
    pub in_flight: usize,
    /// The client that drives the operations.
    pub client: ClientKind,
    /// The payload of every message.
    pub payload: Bytes,
    /// Subscribers, for publish.
    pub subscribers: usize,
    /// Client settings.
    pub options: ClientOptions,
    /// Channel settings, for a channel mode.
    pub channel: ChannelOptions,
    /// Unique within the run: names queues and topics.
    pub tag: String,
}

impl Setup {
    /// The message every operation sends: the payload as binary.
    pub fn message(&self) -> Message {
        Message::binary(self.payload.clone(), None)
    }

    /// `n` async connections to the broker, opened concurrently.
    pub async fn connect(&self, n: usize) -> anyhow::Result<Vec<AsyncClient>> {
        let all = (0..n).map(|_| AsyncClient::connect_with(&self.url, self.options.clone()));
        Ok(futures::future::try_join_all(all).await?)
    }
}

/// Connections of the kind a figure asks for.
#[derive(Debug)]
pub enum Conns {
    /// Driven by tasks.
    Async(Vec<AsyncClient>),
    /// Driven by lane threads.
    Blocking(Vec<Client>),
}

impl Conns {
    /// Opens `n` connections of the kind `setup.client` names.
    pub async fn open(setup: &Setup, n: usize) -> anyhow::Result<Conns> {
        if setup.client != ClientKind::Blocking {
            return Ok(Conns::Async(setup.connect(n).await?));
        }
        let (url, options) = (setup.url.clone(), setup.options.clone());
        let clients = off_runtime("connecting blocking clients", move || {
            (0..n)
                .map(|_| Client::connect_with(&url, options.clone()))
                .collect::<tubeway::Result<Vec<_>>>()
        })
        .await??;
        Ok(Conns::Blocking(clients))
    }

    /// The kind of client.
    pub fn kind(&self) -> ClientKind {
        match self {
            Conns::Async(_) => ClientKind::Async,
            Conns::Blocking(_) => ClientKind::Blocking,
        }
    }

    /// The async client of `lane`.
    pub fn async_client(&self, lane: usize) -> anyhow::Result<&AsyncClient> {
        match self {
            Conns::Async(c) => pick(c, lane),
            Conns::Blocking(_) => anyhow::bail!("blocking connections run on lane threads"),
        }
    }

    /// The blocking client of `lane`.
    pub fn blocking(&self, lane: usize) -> anyhow::Result<&Client> {
        match self {
            Conns::Blocking(c) => pick(c, lane),
            Conns::Async(_) => anyhow::bail!("async connections run on tasks"),
        }
    }

    /// Pings every connection: answered, it means the broker has read
    /// everything sent on it before.
    pub async fn ping_all(&self) -> anyhow::Result<()> {
        match self {
            Conns::Async(c) => {
                futures::future::try_join_all(c.iter().map(AsyncClient::ping)).await?;
            }
            Conns::Blocking(c) => {
                let c = c.clone();
                off_runtime("pinging", move || {
                    c.iter().try_for_each(|c| c.ping().map(drop))
                })
                .await??;
            }
        }
        Ok(())
    }

    /// Closes every connection, bounded by the client's own close timeout.
    pub async fn close(&self) {
        match self {
            Conns::Async(c) => close_all(c).await,
            Conns::Blocking(c) => {
                let c = c.clone();
                let _ = off_runtime("closing", move || {
                    for client in &c {
                        let _ = client.close();
                    }
                })
                .await;
            }
        }
    }
}

/// The sending connections of a workload, and what it sends.
pub struct Senders {
    /// One client per connection.
    pub conns: Conns,
    /// What the workload was built from.
    pub setup: Setup,
}

impl Senders {
    /// Opens `setup.connections` connections.
    pub async fn open(setup: &Setup) -> anyhow::Result<Senders> {
        Ok(Senders {
            conns: Conns::open(setup, setup.connections).await?,
            setup: setup.clone(),
        })
    }

    /// The message to send.
    pub fn message(&self) -> Message {
        self.setup.message()
    }
}

/// Deliveries and drops counted by a workload (publish).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Messages that reached a subscriber.
    pub deliveries: u64,
    /// Deliveries the broker dropped because a subscriber's buffer was full.
    pub drops: u64,
}

/// One request frame up and its answer down, in bytes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Bytes sent.
    pub up: usize,
    /// Bytes received; 0 for none.
    pub down: usize,
}

/// How long the broker may hold an offer or a poll before answering.
pub const BROKER_WAIT: Duration = Duration::from_secs(30);

/// The length of a frame with header fields of these value lengths and this
/// payload: a 12-byte prefix, a 28-byte fixed header, 3 bytes of tag and
/// length per field (docs/protocol.md, section 2).
pub fn frame_len(fields: &[usize], payload: usize) -> usize {
    12 + 28 + fields.iter().map(|f| 3 + f).sum::<usize>() + payload
}

/// Header field lengths: a u64 `timeout` and a UUID `correlation_id`. A
/// binary payload without a mimetype adds no field.
pub const TIMEOUT: usize = 8;
/// See [`TIMEOUT`].
pub const CORRELATION: usize = 16;

/// An empty `ok` answer: only the correlation field.
pub fn empty_ok() -> usize {
    frame_len(&[CORRELATION], 0)
}

/// Parses `--mode`: names from [`MODES`], or `all`.
pub fn parse_list(list: &[String]) -> Result<Vec<&'static dyn Mode>, UsageError> {
    let mut out: Vec<&'static dyn Mode> = Vec::new();
    for name in list {
        let name = name.trim().to_ascii_lowercase();
        let found: Vec<&'static dyn Mode> = if name == "all" {
            MODES.to_vec()
        } else {
            let m = MODES.iter().find(|m| m.name() == name).ok_or_else(|| {
                let known: Vec<&str> = MODES.iter().map(|m| m.name()).collect();
                UsageError(format!(
                    "unknown mode {name:?}; expected {} (or all)",
                    names(&known)
                ))
            })?;
            vec![*m]
        };
        for m in found {
            if !out.iter().any(|o| o.name() == m.name()) {
                out.push(m);
            }
        }
    }
    if out.is_empty() {
        return Err(UsageError("--mode needs at least one mode".into()));
    }
    Ok(out)
}

/// The item of `lane`, lanes spread over the items.
pub fn pick<T>(items: &[T], lane: usize) -> anyhow::Result<&T> {
    items
        .get(lane % items.len().max(1))
        .ok_or_else(|| anyhow::anyhow!("no connection for lane {lane}"))
}

/// Closes every client, bounded by the client's own close timeout.
pub async fn close_all(clients: &[AsyncClient]) {
    futures::future::join_all(clients.iter().map(AsyncClient::close)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_lists() {
        let names = |l: &[&str]| -> Result<Vec<&str>, String> {
            let owned: Vec<String> = l.iter().map(|s| (*s).to_owned()).collect();
            parse_list(&owned)
                .map(|v| v.iter().map(|m| m.name()).collect())
                .map_err(|e| e.0)
        };
        assert_eq!(names(&["call"]).unwrap(), ["call"]);
        assert_eq!(names(&["echo", "CALL", "echo"]).unwrap(), ["echo", "call"]);
        assert_eq!(
            names(&["all"]).unwrap(),
            [
                "call",
                "call-blocking",
                "echo",
                "worker",
                "worker-sync",
                "oneway",
                "queue",
                "publish",
                "channel"
            ]
        );
        let err = names(&["carrier-pigeon"]).unwrap_err();
        assert!(err.contains("unknown mode \"carrier-pigeon\""), "{err}");
    }

    #[test]
    fn frame_lengths_follow_the_protocol() {
        // The worked example of docs/protocol.md: 92 bytes for `hello` with
        // a timeout, request_id "req-1", destination "echo", text/plain utf-8.
        assert_eq!(frame_len(&[TIMEOUT, 5, 4, 10, 5], 5), 92);
        assert_eq!(empty_ok(), 59);
    }

    #[test]
    fn frame_lengths_match_the_encoder_for_calls_and_their_answers() {
        let encoded = |m: &Message| tubeway_proto::codec::encode(m, usize::MAX).unwrap().len();
        let payload = Bytes::from_static(&[7u8; 64]);
        // Built as the client builds a call: type, destination, timeout.
        let request = Message::binary(payload.clone(), None)
            .with_type(tubeway::MessageType::Request)
            .with_destination(call::ACK)
            .with_timeout(BROKER_WAIT);
        assert_eq!(
            call::request_len(call::ACK, payload.len()),
            encoded(&request)
        );

        let ack = request.response(tubeway::ResponseStatus::Ok);
        assert_eq!(empty_ok(), encoded(&ack));

        // `echo` answers with the request's payload and its description.
        let echoed = ack.with_payload_of(&request);
        let down = echo::Echo.exchanges(payload.len())[0].down;
        assert_eq!(down, encoded(&echoed));
    }

    #[test]
    fn a_forwarded_call_is_the_frame_the_worker_mode_expects() {
        let encoded = |m: &Message| tubeway_proto::codec::encode(m, usize::MAX).unwrap().len();
        let payload = Bytes::from_static(&[7u8; 64]);
        let name = "bench-shm12";
        // As the broker forwards a call: its correlation is the worker's registration.
        let mut forwarded = Message::binary(payload.clone(), None)
            .with_type(tubeway::MessageType::Request)
            .with_destination(name)
            .with_timeout(BROKER_WAIT);
        forwarded.correlation_id = Some(Message::request().id);
        let [up, fwd] = worker::Worker { sync: false }.exchanges(payload.len())[..] else {
            panic!("two exchanges");
        };
        assert_eq!(fwd.up, encoded(&forwarded) + 10 - name.len());
        assert_eq!(
            up.up,
            call::request_len(name, payload.len()) + 10 - name.len()
        );
        // The worker's answer, like the broker's to the caller, is an empty ok.
        let answer = forwarded.response(tubeway::ResponseStatus::Ok);
        assert_eq!(fwd.down, encoded(&answer));
        assert_eq!(up.down, encoded(&answer));
    }

    #[test]
    fn every_mode_moves_its_payload() {
        for m in MODES {
            let small: usize = m.exchanges(0).iter().map(|e| e.up + e.down).sum();
            let big: usize = m.exchanges(1000).iter().map(|e| e.up + e.down).sum();
            assert!(big >= small + 1000, "{}", m.name());
        }
    }
}
