//! Harness for the hostile-input tests: an embedded broker on tcp and unix,
//! raw sockets that speak (or mangle) the wire format, a well-behaved
//! bystander client, and a capture of the broker's log lines.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tubeway::{
    ops, AsyncClient, Broker, BrokerConfig, Message, MessageType, ResponseStatus, Url, MIME_TEXT,
};
use tubeway_proto::{codec, Decoded, Decoder, MAX_MESSAGE_SIZE_LIMIT};
use uuid::Uuid;

/// The broker's maximum message size in these tests.
pub const MAX_MESSAGE: usize = 1 << 20;
/// The broker's handshake timeout in these tests.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on every single wait: generous, for a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(15);

/// Awaits `f` for at most [`WAIT`], failing the test with `what` otherwise.
pub async fn bounded<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: nothing happened within {WAIT:?}"),
    }
}

// ----- the broker -----

/// One transport the broker serves.
#[derive(Clone, Debug)]
pub struct Target {
    /// `tcp` or `unix`, for messages.
    pub name: &'static str,
    /// The address served.
    pub url: Url,
}

/// An embedded broker serving tcp://127.0.0.1:0 and a unix socket.
#[derive(Debug)]
pub struct Fixture {
    pub broker: Broker,
    pub targets: Vec<Target>,
    socket: PathBuf,
}

impl Fixture {
    /// Starts a broker with an `echo` function; `test` names the unix socket.
    pub async fn start(test: &str) -> Fixture {
        logs::init();
        let config = BrokerConfig::default()
            .max_message_size(MAX_MESSAGE)
            .handshake_timeout(HANDSHAKE_TIMEOUT)
            .shutdown_timeout(Duration::from_secs(1));
        let broker = Broker::new(config);
        broker.create_function("echo", Ok).unwrap();
        let tcp = broker
            .listen(&"tcp://127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let socket =
            std::env::temp_dir().join(format!("tw-hostile-{}-{test}.sock", std::process::id()));
        let unix = broker.listen(&Url::Unix(socket.clone())).await.unwrap();
        Fixture {
            broker,
            targets: vec![
                Target {
                    name: "tcp",
                    url: tcp,
                },
                Target {
                    name: "unix",
                    url: unix,
                },
            ],
            socket,
        }
    }

    /// Live connections, as the broker's statistics count them.
    pub fn connections(&self) -> u64 {
        self.broker.stats().connections
    }

    /// Polls the statistics until exactly `n` connections are live.
    pub async fn wait_connections(&self, n: u64, what: &str) {
        let start = Instant::now();
        loop {
            let now = self.connections();
            if now == n {
                return;
            }
            assert!(
                start.elapsed() < WAIT,
                "{what}: {now} connections after {WAIT:?}, expected {n}\nbroker log:\n{}",
                logs::tail(30)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Shuts the broker down (bounded).
    pub async fn shutdown(self) {
        bounded("broker shutdown", self.broker.shutdown()).await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

// ----- well-behaved clients -----

/// Calls `echo` on `client` and checks the answer.
pub async fn echo_ok(client: &AsyncClient, what: &str) {
    let text = format!("still serving: {what}");
    let reply = bounded(what, client.send("echo", Message::plain_text(text.clone())))
        .await
        .unwrap_or_else(|e| panic!("{what}: echo failed: {e}"));
    assert_eq!(reply.text_payload().unwrap(), text, "{what}");
}

/// A client connected before an attack, which must be served throughout.
#[derive(Debug)]
pub struct Bystander {
    client: AsyncClient,
    target: Target,
}

impl Bystander {
    /// Closes the bystander and waits until the broker has let it go, and
    /// the clients [`others_still_served`](Self::others_still_served) made:
    /// `left` connections remain. Closing is asynchronous, so a count taken
    /// right after it may still include them.
    pub async fn leave(self, fx: &Fixture, left: u64, what: &str) {
        self.client.close().await;
        fx.wait_connections(left, what).await;
    }

    pub async fn connect(target: &Target) -> Bystander {
        let client = bounded(
            "bystander connect",
            AsyncClient::connect(&target.url.to_string()),
        )
        .await
        .unwrap();
        echo_ok(&client, "bystander before the attack").await;
        Bystander {
            client,
            target: target.clone(),
        }
    }

    /// The bystander still gets answers, and a new client can connect and call.
    pub async fn others_still_served(&self, case: &str) {
        echo_ok(&self.client, &format!("{case}: bystander")).await;
        let fresh = bounded(
            "new client connect",
            AsyncClient::connect(&self.target.url.to_string()),
        )
        .await
        .unwrap_or_else(|e| panic!("{case}: a new client cannot connect: {e}"));
        echo_ok(&fresh, &format!("{case}: new client")).await;
        fresh.close().await;
    }
}

// ----- raw frames -----

/// Any byte stream.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// What a raw connection read next.
#[derive(Debug)]
pub enum Event {
    /// A decoded frame.
    Frame(Message),
    /// A frame our decoder could not read (never expected from the broker).
    Other(Decoded),
    /// End of stream.
    Eof,
    /// The read failed (a reset, typically).
    Error(io::Error),
}

/// Encodes `msg` as a contiguous frame, whatever its size.
pub fn frame(msg: &Message) -> Vec<u8> {
    codec::encode(msg, MAX_MESSAGE_SIZE_LIMIT).unwrap().to_vec()
}

/// A `hello` message with `body` as its payload.
pub fn hello_with(body: &ops::Hello) -> Message {
    Message::serialize(body)
        .unwrap()
        .with_type(MessageType::Hello)
}

/// A ping message.
pub fn ping() -> Message {
    Message::new(MessageType::Ping)
}

/// A call of `echo` with a text payload.
pub fn echo_request(text: &str) -> Message {
    Message::plain_text(text).with_destination("echo")
}

/// A socket that writes arbitrary bytes and reads frames with the reference decoder.
pub struct Raw {
    io: Box<dyn Stream>,
    buf: BytesMut,
    decoder: Decoder,
    /// How the broker names this peer in its logs.
    pub peer: String,
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw").field("peer", &self.peer).finish()
    }
}

impl Raw {
    /// Opens a plain socket to `target`; nothing is sent.
    pub async fn connect(target: &Target) -> Raw {
        let (io, peer): (Box<dyn Stream>, String) = match &target.url {
            Url::Tcp { host, port } => {
                let s = bounded("tcp connect", TcpStream::connect((host.as_str(), *port)))
                    .await
                    .unwrap();
                s.set_nodelay(true).unwrap();
                let peer = format!("tcp://{}", s.local_addr().unwrap());
                (Box::new(s), peer)
            }
            Url::Unix(path) => {
                let s = bounded("unix connect", UnixStream::connect(path))
                    .await
                    .unwrap();
                (Box::new(s), target.url.to_string())
            }
            other => panic!("no raw connections to {other}"),
        };
        Raw {
            io,
            buf: BytesMut::new(),
            decoder: Decoder::new(MAX_MESSAGE_SIZE_LIMIT),
            peer,
        }
    }

    /// Opens a socket and completes the `hello` handshake.
    pub async fn handshake(target: &Target) -> Raw {
        let mut raw = Raw::connect(target).await;
        let hello = hello_with(&ops::Hello::default());
        raw.send(&frame(&hello)).await.unwrap();
        let welcome = raw.response_to(hello.id).await;
        assert_eq!(welcome.status(), ResponseStatus::Ok, "handshake refused");
        let w: ops::Welcome = welcome.data_payload_as().unwrap();
        assert_eq!(w.max_message_size, MAX_MESSAGE as u64);
        raw
    }

    /// Writes `bytes` (bounded).
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        bounded("raw write", async {
            self.io.write_all(bytes).await?;
            self.io.flush().await
        })
        .await
    }

    /// The next frame, end of stream or read error (bounded).
    pub async fn next(&mut self) -> Event {
        bounded("raw read", async {
            loop {
                match self.decoder.decode(&mut self.buf) {
                    Ok(Some(Decoded::Message(m))) => return Event::Frame(*m),
                    Ok(Some(other)) => return Event::Other(other),
                    Ok(None) => {}
                    Err(e) => panic!("the broker sent a frame we cannot delimit: {e}"),
                }
                self.buf.reserve(64 * 1024);
                match self.io.read_buf(&mut self.buf).await {
                    Ok(0) => return Event::Eof,
                    Ok(_) => {}
                    Err(e) => return Event::Error(e),
                }
            }
        })
        .await
    }

    /// The next frame, which must be there.
    pub async fn frame(&mut self) -> Message {
        match self.next().await {
            Event::Frame(m) => m,
            other => panic!("expected a frame from the broker, got {other:?}"),
        }
    }

    /// The next frame, which must be the response to `id`.
    pub async fn response_to(&mut self, id: Uuid) -> Message {
        let m = self.frame().await;
        assert_eq!(m.r#type, MessageType::Response, "{m:?}");
        assert_eq!(
            m.correlation_id,
            Some(id),
            "response to another message: {m:?}"
        );
        m
    }

    /// Sends `msg` and returns the response to it.
    pub async fn call(&mut self, msg: &Message) -> Message {
        self.send(&frame(msg)).await.unwrap();
        self.response_to(msg.id).await
    }

    /// The connection still works: a ping and an echo are answered `ok`.
    pub async fn still_usable(&mut self, what: &str) {
        let r = self.call(&ping()).await;
        assert_eq!(r.status(), ResponseStatus::Ok, "{what}: ping after: {r:?}");
        let text = format!("echo after {what}");
        let r = self.call(&echo_request(&text)).await;
        assert_eq!(r.status(), ResponseStatus::Ok, "{what}: echo after: {r:?}");
        assert_eq!(r.text_payload().unwrap(), text, "{what}");
    }

    /// Reads until the broker closes the stream; returns the frames it sent
    /// first. A reset counts as closed: a peer that closes with unread input
    /// resets the connection, which may discard what it had sent.
    pub async fn closed_by_broker(&mut self, what: &str) -> Vec<Message> {
        let mut frames = Vec::new();
        loop {
            match self.next().await {
                Event::Frame(m) => frames.push(m),
                Event::Eof => return frames,
                Event::Error(e) if e.kind() == io::ErrorKind::ConnectionReset => return frames,
                Event::Error(e) => panic!("{what}: read failed: {e}"),
                Event::Other(d) => panic!("{what}: undecodable frame from the broker: {d:?}"),
            }
            assert!(
                frames.len() <= 16,
                "{what}: the broker keeps talking: {frames:?}"
            );
        }
    }
}

/// Asserts `m` is a `bad_request` (or `status`) response with a text reason,
/// correlated with `to` (or with nothing); returns the reason.
pub fn assert_error(m: &Message, status: ResponseStatus, to: Option<Uuid>, what: &str) -> String {
    assert_eq!(m.r#type, MessageType::Response, "{what}: {m:?}");
    assert_eq!(m.status(), status, "{what}: {m:?}");
    assert_eq!(m.correlation_id, to, "{what}: correlation of {m:?}");
    assert_eq!(m.payload_mimetype.as_deref(), Some(MIME_TEXT), "{what}");
    let reason = m.text_payload().unwrap().into_owned();
    assert!(!reason.is_empty(), "{what}: no reason given");
    // The observed behaviour, for `--nocapture` runs.
    eprintln!("{what}: {status} {reason:?}");
    reason
}

// ----- memory -----

/// A field of /proc/self/status, in KiB.
pub fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

// ----- the broker's log -----

/// Captures the log events of the tubeway crates (INFO and above) in memory,
/// so tests can check what the broker reported.
pub mod logs {
    use super::*;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn lines() -> std::sync::MutexGuard<'static, Vec<String>> {
        LINES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    struct Capture;

    struct Line(String);

    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                let _ = write!(self.0, " {value:?}");
            } else {
                let _ = write!(self.0, " {}={value:?}", field.name());
            }
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            *m.level() <= Level::INFO && m.target().starts_with("tubeway")
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            let mut line = Line(format!(
                "{} {}:",
                e.metadata().level(),
                e.metadata().target()
            ));
            e.record(&mut line);
            // A trailing space lets tests match `name=value ` exactly.
            line.0.push(' ');
            lines().push(line.0);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Installs the capture (once per test binary).
    pub fn init() {
        static ONCE: OnceLock<()> = OnceLock::new();
        ONCE.get_or_init(|| {
            let _ = tracing::subscriber::set_global_default(Capture);
        });
    }

    /// Whether a captured line contains every one of `parts`.
    pub fn contains(parts: &[&str]) -> bool {
        lines().iter().any(|l| parts.iter().all(|p| l.contains(p)))
    }

    /// Waits (bounded) until a captured line contains every one of `parts`.
    pub async fn wait_for(parts: &[&str]) {
        let start = Instant::now();
        while !contains(parts) {
            assert!(
                start.elapsed() < WAIT,
                "no log line with {parts:?} within {WAIT:?}; last lines:\n{}",
                tail(30)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The last `n` captured lines.
    pub fn tail(n: usize) -> String {
        let l = lines();
        l[l.len().saturating_sub(n)..].join("\n")
    }
}
