//! Channels over byte streams: tcp and unix sockets, and named pipes.
//!
//! Each message is a 4-byte little-endian length and its bytes. The reader
//! reads into a buffer of its own, which grows to the largest message seen
//! and is then reused, and lends each message out of it.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::io::Errno;

use super::{
    strategy, AcceptError, ChannelOptions, ConnectError, Duplex, Reader, ReaderInner, Received,
    ReceivedInner, RecvError, SendError, TrySendError, Writer, WriterInner,
};
use crate::wait::poll_until;
use crate::{Url, WaitStrategy};

/// Length prefix of a message.
const PREFIX: usize = 4;
/// The largest message a 4-byte prefix can frame.
const MAX_FRAMED: usize = u32::MAX as usize;
/// The reader's buffer starts this large.
const INITIAL_BUFFER: usize = 64 * 1024;
/// How long dropping a writer may wait to write out what it buffered.
const DROP_FLUSH: Duration = Duration::from_secs(2);

/// Builds a channel side over `read` and `write` (the same socket, or two pipes).
pub(crate) fn duplex(read: Arc<OwnedFd>, write: Arc<OwnedFd>, options: &ChannelOptions) -> Duplex {
    let wait = strategy(options, WaitStrategy::PARK);
    Duplex {
        writer: Writer::new(
            WriterInner::Stream(StreamWriter {
                fd: write,
                pending: Vec::new(),
                wait,
            }),
            wait,
        ),
        reader: Reader::new(
            ReaderInner::Stream(StreamReader {
                fd: read,
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
    rustix::io::ioctl_fionbio(&fd, true)?;
    let fd = Arc::new(fd);
    Ok(duplex(fd.clone(), fd, options))
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
    let now = Instant::now();
    if deadline.is_some_and(|d| now >= d) {
        return Ok(false);
    }
    let spinning = wait.spin().is_none_or(|budget| now - started < budget);
    if spinning {
        std::hint::spin_loop();
        return Ok(true);
    }
    if !wait.parks() {
        std::thread::yield_now();
        return Ok(true);
    }
    poll_until(fd, flags, deadline)
}

/// Sends on a stream.
#[derive(Debug)]
pub(crate) struct StreamWriter {
    fd: Arc<OwnedFd>,
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
        let n = n.min(slices.len());
        match rustix::io::writev(&*self.fd, slices.get(..n).unwrap_or_default()) {
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
            match rustix::io::read(&*self.fd, self.buf.get_mut(self.end..).unwrap_or_default()) {
                Ok(0) if unread == 0 => return Err(RecvError::Closed),
                Ok(0) => return Err(RecvError::Truncated),
                Ok(n) => self.end += n,
                Err(Errno::AGAIN | Errno::INTR) => {
                    if !wait_fd(&self.fd, PollFlags::IN, wait, started, deadline)? {
                        return Ok(None);
                    }
                }
                Err(Errno::CONNRESET) if unread == 0 => return Err(RecvError::Closed),
                Err(Errno::CONNRESET) => return Err(RecvError::Truncated),
                Err(e) => return Err(RecvError::Io(e.into())),
            }
        }
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
