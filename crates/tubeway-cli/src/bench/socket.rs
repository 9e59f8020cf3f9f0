//! Plain std sockets for the bare limits: one type over TCP and Unix
//! sockets, and the few bytes that tell the peer what to do.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use tubeway::Url;

/// How long a bare socket may wait for the other side before failing.
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// The most exchanges one ping-pong cycles through.
pub const MAX_EXCHANGES: usize = 16;
/// The largest frame a bare exchange moves (the broker's own limit).
pub const MAX_FRAME: u64 = crate::cli::MAX_MESSAGE_SIZE_LIMIT;

/// What a connection to the peer asks for, sent first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Cycle through these exchanges: read `up` bytes, write `down` bytes.
    PingPong(Vec<(u64, u64)>),
    /// Read to the end, then write the byte count (u64 LE).
    Sink,
}

impl Request {
    /// The preamble: a kind byte, an exchange count (u32 LE), then each
    /// exchange's `up` and `down` (u64 LE).
    pub fn encode(&self) -> Vec<u8> {
        let (kind, exchanges): (u8, &[(u64, u64)]) = match self {
            Request::PingPong(x) => (1, x),
            Request::Sink => (2, &[]),
        };
        let mut out = vec![kind];
        out.extend_from_slice(&u32::try_from(exchanges.len()).unwrap_or(0).to_le_bytes());
        for (up, down) in exchanges {
            out.extend_from_slice(&up.to_le_bytes());
            out.extend_from_slice(&down.to_le_bytes());
        }
        out
    }

    /// Reads a preamble, refusing anything out of bounds.
    pub fn read(r: &mut impl Read) -> io::Result<Request> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
        let mut head = [0u8; 5];
        r.read_exact(&mut head)?;
        let [kind, n @ ..] = head;
        let n = usize::try_from(u32::from_le_bytes(n)).map_err(|_| bad("exchange count"))?;
        match kind {
            2 if n == 0 => Ok(Request::Sink),
            1 if (1..=MAX_EXCHANGES).contains(&n) => {
                let mut exchanges = Vec::with_capacity(n);
                for _ in 0..n {
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
                Ok(Request::PingPong(exchanges))
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

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Sink,
            Request::PingPong(vec![(5_000, 59)]),
            Request::PingPong(vec![(1, 2), (3, 4)]),
        ] {
            assert_eq!(Request::read(&mut r.encode().as_slice()).unwrap(), r);
        }
    }

    #[test]
    fn hostile_requests_are_refused() {
        let too_big = Request::PingPong(vec![(MAX_FRAME + 1, 0)]).encode();
        let too_many = Request::PingPong(vec![(1, 1); MAX_EXCHANGES + 1]).encode();
        let none = Request::PingPong(Vec::new()).encode();
        for bad in [
            too_big,
            too_many,
            none,
            vec![9, 0, 0, 0, 0],
            vec![1, 1, 0, 0, 0, 7],
        ] {
            assert!(Request::read(&mut bad.as_slice()).is_err(), "{bad:?}");
        }
    }
}
