//! Channels over byte streams: tcp and unix sockets, and named pipes.
//!
//! Each message is a 4-byte little-endian length and its bytes. The reader
//! reads into a buffer of its own, which grows to the largest message seen
//! and is then reused, and lends each message out of it.
//!
//! A socket stays in blocking mode: its reader sleeps in `recv` itself,
//! which a peer on the other CPU wakes 5-7 µs sooner than a sleep in `poll`
//! (docs/performance/investigations.md, "Why one-in-flight socket ratios
//! depend on the regime"), and its writer never blocks (`MSG_DONTWAIT`).
//! Named pipes have no per-call flag, so theirs are non-blocking and wait in
//! `poll`.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::io::Errno;
use rustix::net::RecvFlags;

use super::{
    strategy, AcceptError, ChannelOptions, ConnectError, Duplex, Reader, ReaderInner, Received,
    ReceivedInner, RecvError, SendError, TrySendError, Writer, WriterInner,
};
use crate::wait::{poll_until, set_recv_deadline};
use crate::{Url, WaitStrategy};

/// Length prefix of a message.
const PREFIX: usize = 4;
/// The largest message a 4-byte prefix can frame.
const MAX_FRAMED: usize = u32::MAX as usize;
/// The reader's buffer starts this large.
const INITIAL_BUFFER: usize = 64 * 1024;
/// How long dropping a writer may wait to write out what it buffered.
const DROP_FLUSH: Duration = Duration::from_secs(2);

/// What the descriptors of a channel side are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One socket, in blocking mode.
    Socket,
    /// Two non-blocking pipes.
    Pipes,
}

/// Builds a channel side over `read` and `write` (the same socket, or two pipes).
pub(crate) fn duplex(
    read: Arc<OwnedFd>,
    write: Arc<OwnedFd>,
    kind: Kind,
    options: &ChannelOptions,
) -> Duplex {
    let wait = strategy(options, WaitStrategy::PARK);
    Duplex {
        writer: Writer::new(
            WriterInner::Stream(StreamWriter {
                fd: write,
                kind,
                pending: Vec::new(),
                wait,
            }),
            wait,
        ),
        reader: Reader::new(
            ReaderInner::Stream(StreamReader {
                fd: read,
                kind,
                recv_timeout: None,
                buf: Vec::new(),
                start: 0,
                end: 0,
                max: options.max_message_size,
            }),
            wait,
        ),
    }
}

fn socket_duplex(fd: OwnedFd, options: &ChannelOptions) -> io::Result<Duplex> {
    rustix::io::ioctl_fionbio(&fd, false)?;
    let fd = Arc::new(fd);
    Ok(duplex(fd.clone(), fd, Kind::Socket, options))
}

pub(crate) fn connect(url: &Url, options: &ChannelOptions) -> Result<Duplex, ConnectError> {
    let fd: OwnedFd = match url {
        Url::Tcp { host, port } => {
            let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))?;
            let mut last = None;
            let mut stream = None;
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, options.connect_timeout) {
                    Ok(s) => {
                        stream = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            let s = stream.ok_or_else(|| {
                last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
            })?;
            s.set_nodelay(true)?;
            s.into()
        }
        Url::Unix(path) => UnixStream::connect(path)?.into(),
        other => {
            return Err(ConnectError::Setup(format!(
                "{other} is not a stream address"
            )))
        }
    };
    Ok(socket_duplex(fd, options)?)
}

/// Accepts tcp or unix channel connections.
#[derive(Debug)]
pub(crate) enum StreamListener {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
}

impl StreamListener {
    pub(crate) fn bind(url: &Url) -> Result<(StreamListener, Url), ConnectError> {
        match url {
            Url::Tcp { host, port } => {
                let l = TcpListener::bind((host.as_str(), *port))?;
                let bound = Url::Tcp {
                    host: host.clone(),
                    port: l.local_addr()?.port(),
                };
                Ok((StreamListener::Tcp(l), bound))
            }
            Url::Unix(path) => {
                let listener = crate::conn::bind_unix_blocking(path)?;
                Ok((
                    StreamListener::Unix {
                        listener,
                        path: path.clone(),
                    },
                    url.clone(),
                ))
            }
            other => Err(ConnectError::Setup(format!(
                "{other} is not a stream address"
            ))),
        }
    }

    pub(crate) fn accept(&mut self, options: &ChannelOptions) -> Result<Duplex, AcceptError> {
        let fd: OwnedFd = match self {
            StreamListener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                s.into()
            }
            StreamListener::Unix { listener, .. } => listener.accept()?.0.into(),
        };
        Ok(socket_duplex(fd, options)?)
    }
}

impl Drop for StreamListener {
    fn drop(&mut self) {
        if let StreamListener::Unix { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What a wait that began at `started` does now, by `wait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pace {
    /// Look again at once.
    Spin,
    /// Give the CPU away, then look again.
    Yield,
    /// Sleep in the kernel.
    Sleep,
    /// The deadline has passed.
    Over,
}

fn pace(wait: &WaitStrategy, started: Instant, deadline: Option<Instant>) -> Pace {
    let now = Instant::now();
    if deadline.is_some_and(|d| now >= d) {
        Pace::Over
    } else if wait.spin().is_none_or(|budget| now - started < budget) {
        Pace::Spin
    } else if wait.parks() {
        Pace::Sleep
    } else {
        Pace::Yield
    }
}

/// Waits for `fd` to be ready for `flags` by `wait`, having waited since
/// `started`: returns at once while spinning (the caller retries), sleeps in
/// `poll` once a park strategy's budget is spent. False when `deadline` passed.
fn wait_fd(
    fd: &OwnedFd,
    flags: PollFlags,
    wait: &WaitStrategy,
    started: Instant,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    match pace(wait, started, deadline) {
        Pace::Sleep => poll_until(fd, flags, deadline),
        other => Ok(pause(other)),
    }
}

/// Spins or yields as `pace` says; false once the deadline has passed. A
/// wait that is to sleep returns at once, for the caller to sleep its way.
fn pause(pace: Pace) -> bool {
    match pace {
        Pace::Over => false,
        Pace::Spin => {
            std::hint::spin_loop();
            true
        }
        Pace::Yield => {
            std::thread::yield_now();
            true
        }
        Pace::Sleep => true,
    }
}

/// Sends on a stream.
#[derive(Debug)]
pub(crate) struct StreamWriter {
    fd: Arc<OwnedFd>,
    kind: Kind,
    /// The unwritten rest of a message `try_send` accepted.
    pending: Vec<u8>,
    /// For the flush on drop.
    wait: WaitStrategy,
}

/// What one vectored write did.
enum Wrote {
    All,
    /// Some bytes, or none (the stream is full).
    Some(usize),
}

impl StreamWriter {
    /// One non-blocking vectored write of `parts` from byte `skip` on.
    fn write_from(&self, parts: &[&[u8]], skip: usize) -> Result<Wrote, SendError> {
        let mut slices = [io::IoSlice::new(&[]); 8];
        let mut n = 0;
        let mut skip_left = skip;
        let mut total_left = 0;
        for p in parts {
            let k = skip_left.min(p.len());
            skip_left -= k;
            let rest = p.get(k..).unwrap_or_default();
            total_left += rest.len();
            if !rest.is_empty() && n < slices.len() {
                if let Some(slot) = slices.get_mut(n) {
                    *slot = io::IoSlice::new(rest);
                }
                n += 1;
            }
        }
        if total_left == 0 {
            return Ok(Wrote::All);
        }
        let slices = slices.get(..n.min(slices.len())).unwrap_or_default();
        let wrote = match self.kind {
            // The socket blocks; this write must not.
            Kind::Socket => rustix::net::sendmsg(
                &*self.fd,
                slices,
                &mut rustix::net::SendAncillaryBuffer::default(),
                rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
            ),
            Kind::Pipes => rustix::io::writev(&*self.fd, slices),
        };
        match wrote {
            Ok(w) if w == total_left => Ok(Wrote::All),
            Ok(w) => Ok(Wrote::Some(w)),
            Err(Errno::AGAIN | Errno::INTR) => Ok(Wrote::Some(0)),
            Err(Errno::PIPE | Errno::CONNRESET) => Err(SendError::Closed),
            Err(e) => Err(SendError::Io(e.into())),
        }
    }

    /// Writes `parts` whole, waiting by `wait` until `deadline`; a message
    /// partly written when the deadline passes keeps its rest in `pending`.
    fn write_all(
        &mut self,
        parts: &[&[u8]],
        wait: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let started = Instant::now();
        let mut done = 0;
        loop {
            match self.write_from(parts, done)? {
                Wrote::All => return Ok(()),
                Wrote::Some(n) => done += n,
            }
            if !wait_fd(&self.fd, PollFlags::OUT, wait, started, deadline)? {
                if done == 0 {
                    return Err(SendError::TimedOut);
                }
                self.keep_rest(parts, done);
                return Ok(());
            }
        }
    }

    fn keep_rest(&mut self, parts: &[&[u8]], mut skip: usize) {
        for p in parts {
            let k = skip.min(p.len());
            skip -= k;
            self.pending
                .extend_from_slice(p.get(k..).unwrap_or_default());
        }
    }

    pub(crate) fn flush(
        &mut self,
        wait: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        // On success, what the deadline left unwritten is the new `pending`.
        let r = self.write_all(&[&pending], wait, deadline);
        if r.is_err() {
            // Nothing was written (timed out), or the channel is dead.
            self.pending = pending;
        }
        r
    }

    pub(crate) fn send(
        &mut self,
        parts: &[&[u8]],
        wait: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        if len > MAX_FRAMED {
            return Err(SendError::TooLarge {
                len,
                max: MAX_FRAMED,
            });
        }
        self.flush(wait, deadline)?;
        if !self.pending.is_empty() {
            return Err(SendError::TimedOut);
        }
        let prefix = (len as u32).to_le_bytes();
        let mut all: [&[u8]; 8] = [&[]; 8];
        let n = build_parts(&mut all, &prefix, parts);
        if n > all.len() {
            // Many parts: join them (rare; the common case is a head and a body).
            let mut joined = Vec::with_capacity(PREFIX + len);
            joined.extend_from_slice(&prefix);
            for p in parts {
                joined.extend_from_slice(p);
            }
            return self.write_all(&[&joined], wait, deadline);
        }
        self.write_all(all.get(..n).unwrap_or_default(), wait, deadline)
    }

    pub(crate) fn try_send(&mut self, parts: &[&[u8]]) -> Result<(), TrySendError> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        if len > MAX_FRAMED {
            return Err(TrySendError::TooLarge {
                len,
                max: MAX_FRAMED,
            });
        }
        // Whatever an earlier message left must go first.
        let now = Some(Instant::now());
        match self.flush(&WaitStrategy::BusySpin, now) {
            Ok(()) | Err(SendError::TimedOut) => {}
            Err(e) => return Err(to_try(e)),
        }
        if !self.pending.is_empty() {
            return Err(TrySendError::Full);
        }
        let prefix = (len as u32).to_le_bytes();
        let mut all: [&[u8]; 8] = [&[]; 8];
        let n = build_parts(&mut all, &prefix, parts);
        let joined;
        let parts: &[&[u8]] = if n > all.len() {
            let mut j = Vec::with_capacity(PREFIX + len);
            j.extend_from_slice(&prefix);
            for p in parts {
                j.extend_from_slice(p);
            }
            joined = j;
            all[0] = &joined;
            all.get(..1).unwrap_or_default()
        } else {
            all.get(..n).unwrap_or_default()
        };
        match self.write_from(parts, 0).map_err(to_try)? {
            Wrote::All => Ok(()),
            Wrote::Some(0) => Err(TrySendError::Full),
            Wrote::Some(w) => {
                // Accepted: the rest goes out with the next send or flush.
                self.keep_rest(parts, w);
                Ok(())
            }
        }
    }
}

/// Puts the prefix and `parts` in `out`; returns how many slots that takes
/// (more than `out` holds means the caller must join them).
fn build_parts<'a>(out: &mut [&'a [u8]; 8], prefix: &'a [u8; 4], parts: &[&'a [u8]]) -> usize {
    let n = parts.len() + 1;
    if n > out.len() {
        return n;
    }
    out[0] = prefix;
    for (slot, p) in out.iter_mut().skip(1).zip(parts) {
        *slot = p;
    }
    n
}

fn to_try(e: SendError) -> TrySendError {
    match e {
        SendError::Closed => TrySendError::Closed,
        SendError::TooLarge { len, max } => TrySendError::TooLarge { len, max },
        SendError::Io(e) => TrySendError::Io(e),
        SendError::Corrupt(c) => TrySendError::Corrupt(c),
        SendError::TimedOut | SendError::TimedOutMidMessage => TrySendError::Full,
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let wait = self.wait;
            let _ = self.flush(&wait, Some(Instant::now() + DROP_FLUSH));
        }
    }
}

/// Receives from a stream.
#[derive(Debug)]
pub(crate) struct StreamReader {
    fd: Arc<OwnedFd>,
    kind: Kind,
    /// The socket's receive timeout as last set (`None`: none).
    recv_timeout: Option<Duration>,
    buf: Vec<u8>,
    /// Unread bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    max: usize,
}

impl StreamReader {
    pub(crate) fn recv(
        &mut self,
        wait: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<Option<Received<'_>>, RecvError> {
        let started = Instant::now();
        loop {
            let unread = self.end - self.start;
            let mut need = PREFIX;
            if let Some(prefix) = self
                .buf
                .get(self.start..)
                .and_then(|b| b.first_chunk::<4>())
            {
                if unread >= PREFIX {
                    let len = u32::from_le_bytes(*prefix) as usize;
                    if len > self.max {
                        return Err(RecvError::TooLarge {
                            len: len as u64,
                            max: self.max,
                        });
                    }
                    need = PREFIX + len;
                    if unread >= need {
                        let body = self.start + PREFIX..self.start + need;
                        return Ok(Some(Received {
                            inner: ReceivedInner::Slice {
                                bytes: self.buf.get(body).unwrap_or_default(),
                                consumed: Some((&mut self.start, need)),
                            },
                        }));
                    }
                }
            }
            self.make_room(need);
            // A socket's reader sleeps in `recv` itself (see the module's
            // comment), once its strategy says to sleep.
            let sleep = self.kind == Kind::Socket && pace(wait, started, deadline) == Pace::Sleep;
            let read = if sleep {
                self.recv_blocking(deadline)
            } else {
                self.read_now()
            };
            match read {
                Ok(0) if unread == 0 => return Err(RecvError::Closed),
                Ok(0) => return Err(RecvError::Truncated),
                Ok(n) => self.end += n,
                // Woken by a signal, or the receive timeout ran out: the
                // next pass looks at the deadline.
                Err(Errno::AGAIN | Errno::INTR) if sleep => {}
                Err(Errno::AGAIN | Errno::INTR) => {
                    let waited = match self.kind {
                        // The next pass sleeps in `recv` if it is time to.
                        Kind::Socket => pause(pace(wait, started, deadline)),
                        Kind::Pipes => wait_fd(&self.fd, PollFlags::IN, wait, started, deadline)?,
                    };
                    if !waited {
                        return Ok(None);
                    }
                }
                Err(Errno::CONNRESET) if unread == 0 => return Err(RecvError::Closed),
                Err(Errno::CONNRESET) => return Err(RecvError::Truncated),
                Err(e) => return Err(RecvError::Io(e.into())),
            }
        }
    }

    /// Reads what is there now into the free part of the buffer.
    fn read_now(&mut self) -> Result<usize, Errno> {
        let into = self.buf.get_mut(self.end..).unwrap_or_default();
        match self.kind {
            Kind::Socket => rustix::net::recv(&*self.fd, into, RecvFlags::DONTWAIT).map(|(n, _)| n),
            Kind::Pipes => rustix::io::read(&*self.fd, into),
        }
    }

    /// Reads into the free part of the buffer, sleeping in `recv` until
    /// something comes or `deadline` passes (`AGAIN` then), at most a second
    /// at a time (see [`set_recv_deadline`]).
    fn recv_blocking(&mut self, deadline: Option<Instant>) -> Result<usize, Errno> {
        if !set_recv_deadline(&*self.fd, &mut self.recv_timeout, deadline)? {
            return Err(Errno::AGAIN);
        }
        let into = self.buf.get_mut(self.end..).unwrap_or_default();
        rustix::net::recv(&*self.fd, into, RecvFlags::empty()).map(|(n, _)| n)
    }

    /// Makes room after `end` for a message of `need` bytes from `start`;
    /// called when fewer than `need` bytes are unread.
    fn make_room(&mut self, need: usize) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.start > 0 && self.start + need > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        // Grows to the largest message seen, at most the limit, then stays.
        let want = need.max(INITIAL_BUFFER);
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
    }
}
