//! Plain std sockets for the bare limits: one type over TCP and Unix
//! sockets, and the few bytes that tell the peer what to do.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use tubeway::Url;

/// How long a bare socket may wait for the other side before failing.
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// The most exchanges one ping-pong cycles through.
pub const MAX_EXCHANGES: usize = 16;
/// The largest frame a bare exchange moves (the broker's own limit).
pub const MAX_FRAME: u64 = crate::cli::MAX_MESSAGE_SIZE_LIMIT;

/// The length of a request's head.
pub const HEAD: usize = 6;

/// What a connection to the peer asks for, sent first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Cycle through these exchanges: read `up` bytes, write `down` bytes,
    /// once one byte has answered that the peer's buffers are ready. With
    /// `poll`, both sides poll a non-blocking socket instead of sleeping in
    /// `read` (latency mode's floor).
    PingPong {
        /// `(up, down)` byte counts.
        exchanges: Vec<(u64, u64)>,
        /// Poll instead of sleeping.
        poll: bool,
    },
    /// Read to the end into a buffer of `buffer` bytes, from its start
    /// again each time it is full, then write the byte count (u64 LE); one
    /// byte first, once the buffer is made and touched.
    Sink {
        /// Bytes of the reader's buffer: 1 ..= [`MAX_FRAME`].
        buffer: u32,
    },
    /// Echo the shared-memory ping-pong whose memfd comes with this request
    /// (SCM_RIGHTS), for at most `secs` seconds; answer one byte once it is
    /// mapped.
    ShmPingPong {
        /// How long the peer echoes at most.
        secs: u32,
    },
}

impl Request {
    /// The request: a kind byte, a flags byte, a count (u32 LE), then for a
    /// ping-pong each exchange's `up` and `down` (u64 LE).
    pub fn encode(&self) -> Vec<u8> {
        let (kind, flags, n, exchanges): (u8, u8, u32, &[(u64, u64)]) = match self {
            Request::PingPong { exchanges, poll } => (
                1,
                u8::from(*poll),
                u32::try_from(exchanges.len()).unwrap_or(0),
                exchanges,
            ),
            Request::Sink { buffer } => (2, 0, *buffer, &[]),
            Request::ShmPingPong { secs } => (3, 0, *secs, &[]),
        };
        let mut out = vec![kind, flags];
        out.extend_from_slice(&n.to_le_bytes());
        for (up, down) in exchanges {
            out.extend_from_slice(&up.to_le_bytes());
            out.extend_from_slice(&down.to_le_bytes());
        }
        out
    }

    /// Reads the rest of a request whose head is read, refusing anything
    /// out of bounds.
    pub fn read_rest(head: [u8; HEAD], r: &mut impl Read) -> io::Result<Request> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
        let [kind, flags, n @ ..] = head;
        let n = u32::from_le_bytes(n);
        let count = usize::try_from(n).map_err(|_| bad("exchange count"))?;
        match (kind, flags) {
            (2, 0) if n > 0 && u64::from(n) <= MAX_FRAME => Ok(Request::Sink { buffer: n }),
            (3, 0) => Ok(Request::ShmPingPong { secs: n }),
            (1, 0 | 1) if (1..=MAX_EXCHANGES).contains(&count) => {
                let mut exchanges = Vec::with_capacity(count);
                for _ in 0..count {
                    let mut pair = [0u8; 16];
                    r.read_exact(&mut pair)?;
                    let (up, down) = pair.split_at(8);
                    let num = |b: &[u8]| -> io::Result<u64> {
                        let v = u64::from_le_bytes(b.try_into().map_err(|_| bad("length"))?);
                        if v > MAX_FRAME {
                            return Err(bad("exchange larger than the largest frame"));
                        }
                        Ok(v)
                    };
                    exchanges.push((num(up)?, num(down)?));
                }
                Ok(Request::PingPong {
                    exchanges,
                    poll: flags == 1,
                })
            }
            _ => Err(bad("unknown bare request")),
        }
    }
}

/// A connected std socket.
#[derive(Debug)]
pub enum Stream {
    /// TCP, with Nagle off.
    Tcp(TcpStream),
    /// A Unix socket.
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `url` (tcp:// or unix://), with I/O timeouts set.
    pub fn connect(url: &str) -> io::Result<Stream> {
        let s = match url.parse::<Url>().map_err(io::Error::other)? {
            Url::Tcp { host, port } => {
                let s = TcpStream::connect((host.as_str(), port))?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Url::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
            other => return Err(io::Error::other(format!("no bare socket for {other}"))),
        };
        s.set_timeouts()?;
        Ok(s)
    }

    /// Bounds every read and write.
    pub fn set_timeouts(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.set_write_timeout(Some(IO_TIMEOUT))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.set_write_timeout(Some(IO_TIMEOUT))
            }
        }
    }

    /// Makes reads and writes return `WouldBlock` instead of sleeping.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// `read_exact` on a non-blocking socket: polls until `buf` is full,
    /// or fails with `TimedOut` after `give_up`.
    pub fn poll_read_exact(&mut self, buf: &mut [u8], give_up: Instant) -> io::Result<()> {
        let mut done = 0;
        let mut polls = 0u32;
        while done < buf.len() {
            match self.read(buf.get_mut(done..).unwrap_or_default()) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => idle(&mut polls, give_up)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `write_all` on a non-blocking socket: polls until everything is
    /// written, or fails with `TimedOut` after `give_up`.
    pub fn poll_write_all(&mut self, buf: &[u8], give_up: Instant) -> io::Result<()> {
        let mut done = 0;
        let mut polls = 0u32;
        while done < buf.len() {
            match self.write(buf.get(done..).unwrap_or_default()) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => idle(&mut polls, give_up)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The Unix socket, if it is one (descriptors travel only over those).
    pub fn unix(&self) -> Option<&UnixStream> {
        match self {
            Stream::Unix(s) => Some(s),
            Stream::Tcp(_) => None,
        }
    }

    /// Ends the writing side: the peer reads end-of-file.
    pub fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One poll that found nothing: a spin hint, and a look at the clock every
/// 1024 polls (a clock read costs about as much as a poll).
fn idle(polls: &mut u32, give_up: Instant) -> io::Result<()> {
    *polls = polls.wrapping_add(1);
    if (*polls).is_multiple_of(1024) && Instant::now() >= give_up {
        return Err(io::ErrorKind::TimedOut.into());
    }
    std::hint::spin_loop();
    Ok(())
}

/// A std listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix socket, with its path.
    Unix(UnixListener, std::path::PathBuf),
}

impl Listener {
    /// Binds `url` (tcp:// or unix://).
    pub fn bind(url: &str) -> io::Result<Listener> {
        match url.parse::<Url>().map_err(io::Error::other)? {
            Url::Tcp { host, port } => Ok(Listener::Tcp(TcpListener::bind((host.as_str(), port))?)),
            Url::Unix(path) => {
                // A stale socket file of an earlier run would make bind fail.
                let _ = std::fs::remove_file(&path);
                Ok(Listener::Unix(UnixListener::bind(&path)?, path))
            }
            other => Err(io::Error::other(format!("no bare socket for {other}"))),
        }
    }

    /// The bound address, with the real port.
    pub fn url(&self) -> io::Result<String> {
        match self {
            Listener::Tcp(l) => Ok(format!("tcp://{}", l.local_addr()?)),
            Listener::Unix(_, path) => Ok(format!("unix://{}", path.display())),
        }
    }

    /// The next connection, with timeouts set.
    pub fn accept(&self) -> io::Result<Stream> {
        let s = match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Listener::Unix(l, _) => Stream::Unix(l.accept()?.0),
        };
        s.set_timeouts()?;
        Ok(s)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(mut bytes: &[u8]) -> io::Result<Request> {
        let mut head = [0u8; HEAD];
        bytes.read_exact(&mut head)?;
        Request::read_rest(head, &mut bytes)
    }

    #[test]
    fn requests_round_trip() {
        let ping = |exchanges: Vec<(u64, u64)>, poll| Request::PingPong { exchanges, poll };
        for r in [
            Request::Sink { buffer: 1 << 20 },
            Request::Sink {
                buffer: 200_000_000,
            },
            ping(vec![(5_000, 59)], false),
            ping(vec![(1, 2), (3, 4)], true),
            Request::ShmPingPong { secs: 125 },
        ] {
            assert_eq!(read(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn hostile_requests_are_refused() {
        let ping = |exchanges: Vec<(u64, u64)>| Request::PingPong {
            exchanges,
            poll: false,
        };
        let too_big = ping(vec![(MAX_FRAME + 1, 0)]).encode();
        let too_many = ping(vec![(1, 1); MAX_EXCHANGES + 1]).encode();
        let none = ping(Vec::new()).encode();
        for bad in [
            too_big,
            too_many,
            none,
            vec![9, 0, 0, 0, 0, 0],
            // A sink without a buffer, or with one larger than any frame.
            Request::Sink { buffer: 0 }.encode(),
            Request::Sink { buffer: u32::MAX }.encode(),
            vec![1, 2, 1, 0, 0, 0],
            vec![1, 0, 1, 0, 0, 0, 7],
        ] {
            assert!(read(&bad).is_err(), "{bad:?}");
        }
    }
}
