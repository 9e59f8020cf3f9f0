//! Point-to-point channels: a lower layer for when a broker is too much.
//!
//! A channel is a pair of ends joined by one transport, each with a
//! [`Writer`] and a [`Reader`] (together a [`Duplex`]). It moves messages —
//! byte strings, kept whole and in order — and nothing else: no headers, no
//! routing, no broker. The API is blocking and the same on every transport,
//! so code switches transport by changing the URL:
//!
//! - `shm://name` — rings in shared memory between processes (set up over a
//!   Unix socket that passes the memory's descriptor; see `shm`);
//! - `mem://name` — the same rings in this process's memory;
//! - `unix:///path`, `tcp://host:port` — sockets;
//! - `fifo:///path` — a pair of named pipes, `PATH.up` (connector to
//!   listener) and `PATH.down`, for peers that can only share files.
//!
//! Reads borrow the message in place ([`Received`]) until it is dropped: in a
//! ring the bytes are read where the writer put them; on a stream they are
//! read from the reader's buffer. Either way the steady state allocates
//! nothing. A writer facing a full ring or socket waits by the channel's
//! [`WaitStrategy`], or fails at once with [`Writer::try_send`].
//!
//! A peer that dies, even by SIGKILL, is noticed at once: a reader gets
//! [`RecvError::Closed`] after the messages already sent, a writer
//! [`SendError::Closed`].

mod error;
mod fifo;
mod ring;
mod stream;

use std::time::{Duration, Instant};

pub use error::{AcceptError, ConnectError, RecvError, SendError, TrySendError};

use crate::{Url, WaitStrategy};

/// The largest message a stream channel accepts unless told otherwise.
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 20;

/// How a channel end behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ChannelOptions {
    /// How the reader waits for messages and the writer for room; `None`
    /// takes the transport's default (spin, then sleep, on shared memory;
    /// sleep at once on sockets).
    pub wait: Option<WaitStrategy>,
    /// The largest message this end accepts from its peer (default 64 MiB);
    /// a larger one ends the channel with [`RecvError::TooLarge`], since
    /// skipping it would leave the stream out of step.
    pub max_message_size: usize,
    /// How long connecting, and a listener's set-up of each connection, may take.
    pub connect_timeout: Duration,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            wait: None,
            max_message_size: DEFAULT_MAX_MESSAGE,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl ChannelOptions {
    /// Sets the wait strategy of both directions.
    pub fn wait(mut self, wait: WaitStrategy) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Sets the largest message accepted.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Sets the connect and set-up timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

/// Connects to the channel listener at `url`.
pub fn connect(url: &str) -> Result<Duplex, ConnectError> {
    connect_with(url, &ChannelOptions::default())
}

/// Connects with `options`.
pub fn connect_with(url: &str, options: &ChannelOptions) -> Result<Duplex, ConnectError> {
    let url: Url = url.parse()?;
    match &url {
        Url::Shm { name, ring } => ring::connect_shm(name, ring.unwrap_or(0), options),
        Url::Mem(name) => ring::connect_mem(name, options),
        Url::Tcp { .. } | Url::Unix(_) => stream::connect(&url, options),
        Url::Fifo(path) => fifo::connect(path, options),
    }
}

/// Accepts channel connections at one address.
#[derive(Debug)]
pub struct ChannelListener {
    inner: ListenerInner,
    url: Url,
    options: ChannelOptions,
}

#[derive(Debug)]
enum ListenerInner {
    Ring(ring::RingListener),
    Stream(stream::StreamListener),
    Fifo(fifo::FifoListener),
}

impl ChannelListener {
    /// Binds `url` with default options.
    pub fn bind(url: &str) -> Result<ChannelListener, ConnectError> {
        Self::bind_with(url, ChannelOptions::default())
    }

    /// Binds `url`; accepted ends take `options`.
    pub fn bind_with(url: &str, options: ChannelOptions) -> Result<ChannelListener, ConnectError> {
        let url: Url = url.parse()?;
        let (inner, bound) = match &url {
            Url::Shm { name, .. } => {
                let l = ring::RingListener::bind_shm(name)?;
                (ListenerInner::Ring(l), url.clone())
            }
            Url::Mem(name) => (
                ListenerInner::Ring(ring::RingListener::bind_mem(name)?),
                url.clone(),
            ),
            Url::Tcp { .. } | Url::Unix(_) => {
                let (l, bound) = stream::StreamListener::bind(&url)?;
                (ListenerInner::Stream(l), bound)
            }
            Url::Fifo(path) => (
                ListenerInner::Fifo(fifo::FifoListener::bind(path)?),
                url.clone(),
            ),
        };
        Ok(ChannelListener {
            inner,
            url: bound,
            options,
        })
    }

    /// The address bound (with the real port when port 0 was asked for).
    pub fn local_url(&self) -> &Url {
        &self.url
    }

    /// Waits for the next peer and completes its set-up.
    pub fn accept(&mut self) -> Result<Duplex, AcceptError> {
        match &mut self.inner {
            ListenerInner::Ring(l) => l.accept(&self.options),
            ListenerInner::Stream(l) => l.accept(&self.options),
            ListenerInner::Fifo(l) => l.accept(&self.options),
        }
    }
}

/// Both ends of one side of a channel.
#[derive(Debug)]
pub struct Duplex {
    /// Sends to the peer.
    pub writer: Writer,
    /// Receives from the peer.
    pub reader: Reader,
}

impl Duplex {
    /// Splits into the writer and the reader, to use from two threads.
    pub fn split(self) -> (Writer, Reader) {
        (self.writer, self.reader)
    }

    /// Sends a message; see [`Writer::send`].
    pub fn send(&mut self, msg: &[u8]) -> Result<(), SendError> {
        self.writer.send(msg)
    }

    /// Receives a message; see [`Reader::recv`].
    pub fn recv(&mut self) -> Result<Received<'_>, RecvError> {
        self.reader.recv()
    }
}

/// The sending end of a channel.
#[derive(Debug)]
pub struct Writer {
    inner: WriterInner,
    wait: WaitStrategy,
}

#[derive(Debug)]
enum WriterInner {
    Ring(ring::RingWriter),
    Stream(stream::StreamWriter),
}

impl Writer {
    fn new(inner: WriterInner, wait: WaitStrategy) -> Writer {
        Writer { inner, wait }
    }

    /// Sends `msg`, waiting for room by the wait strategy as long as it takes.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), SendError> {
        self.send_vectored(&[msg], None)
    }

    /// Sends the message made of `parts` (a header and a payload, say)
    /// without joining them first; waits for room until `deadline`.
    pub fn send_vectored(
        &mut self,
        parts: &[&[u8]],
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        match &mut self.inner {
            WriterInner::Ring(w) => w.send(parts, &self.wait, deadline),
            WriterInner::Stream(w) => w.send(parts, &self.wait, deadline),
        }
    }

    /// Sends `msg` if there is room for it now; fails with
    /// [`TrySendError::Full`] instead of waiting.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<(), TrySendError> {
        self.try_send_vectored(&[msg])
    }

    /// [`try_send`](Writer::try_send) for a message made of `parts`.
    pub fn try_send_vectored(&mut self, parts: &[&[u8]]) -> Result<(), TrySendError> {
        match &mut self.inner {
            WriterInner::Ring(w) => w.try_send(parts),
            WriterInner::Stream(w) => w.try_send(parts),
        }
    }

    /// Writes out what an earlier [`try_send`](Writer::try_send) left
    /// buffered (stream transports only; rings never buffer), waiting until
    /// `deadline`.
    pub fn flush(&mut self, deadline: Option<Instant>) -> Result<(), SendError> {
        match &mut self.inner {
            WriterInner::Ring(_) => Ok(()),
            WriterInner::Stream(w) => w.flush(&self.wait, deadline),
        }
    }

    /// The wait strategy in force.
    pub fn wait_strategy(&self) -> WaitStrategy {
        self.wait
    }
}

/// The receiving end of a channel.
#[derive(Debug)]
pub struct Reader {
    inner: ReaderInner,
    wait: WaitStrategy,
}

#[derive(Debug)]
enum ReaderInner {
    Ring(ring::RingReader),
    Stream(stream::StreamReader),
}

impl Reader {
    fn new(inner: ReaderInner, wait: WaitStrategy) -> Reader {
        Reader { inner, wait }
    }

    /// The next message, waiting as long as it takes; borrowed in place
    /// until the [`Received`] is dropped.
    pub fn recv(&mut self) -> Result<Received<'_>, RecvError> {
        match self.recv_deadline(None)? {
            Some(m) => Ok(m),
            None => Err(RecvError::Closed),
        }
    }

    /// The next message, waiting at most `timeout`: `Ok(None)` on timeout.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Received<'_>>, RecvError> {
        self.recv_deadline(Some(Instant::now() + timeout))
    }

    /// The next message if one is there now.
    pub fn try_recv(&mut self) -> Result<Option<Received<'_>>, RecvError> {
        self.recv_deadline(Some(Instant::now()))
    }

    /// The next message, waiting until `deadline` (`None`: forever).
    pub fn recv_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Received<'_>>, RecvError> {
        match &mut self.inner {
            ReaderInner::Ring(r) => r.recv(&self.wait, deadline),
            ReaderInner::Stream(r) => r.recv(&self.wait, deadline),
        }
    }

    /// The wait strategy in force.
    pub fn wait_strategy(&self) -> WaitStrategy {
        self.wait
    }
}

/// A message borrowed from its channel; dereferences to its bytes. Dropping
/// it hands the space back to the writer (rings) or the buffer to the
/// reader (streams).
pub struct Received<'a> {
    inner: ReceivedInner<'a>,
}

enum ReceivedInner<'a> {
    /// A message that is one record, read where the writer put it.
    Record(tubeway_ring::Record<'a>),
    /// A message assembled from fragments, or read from a stream: `bytes`,
    /// and what to advance by when done.
    Slice {
        bytes: &'a [u8],
        consumed: Option<(&'a mut usize, usize)>,
    },
}

impl std::ops::Deref for Received<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.inner {
            ReceivedInner::Record(r) => r,
            ReceivedInner::Slice { bytes, .. } => bytes,
        }
    }
}

impl Drop for Received<'_> {
    fn drop(&mut self) {
        if let ReceivedInner::Slice {
            consumed: Some((at, by)),
            ..
        } = &mut self.inner
        {
            **at += *by;
        }
    }
}

impl std::fmt::Debug for Received<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("len", &self.len())
            .finish()
    }
}

/// The transport's default strategy, or the one asked for.
fn strategy(options: &ChannelOptions, default: WaitStrategy) -> WaitStrategy {
    options.wait.unwrap_or(default)
}

#[cfg(test)]
mod tests;
