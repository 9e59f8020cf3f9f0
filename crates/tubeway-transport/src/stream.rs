//! The two halves of an established byte stream.
//!
//! Unlike `tokio::io::split`, both halves keep the non-blocking `try_*`
//! operations of the socket underneath, so that a frame can be written
//! straight from the task (or thread) that produced it and a reader can
//! poll without parking: see [`crate::FrameWriter`] and [`crate::WaitStrategy`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

#[derive(Debug, Clone)]
enum Socket {
    Tcp(Arc<TcpStream>),
    Unix(Arc<UnixStream>),
}

/// Splits a socket into its halves; both share the socket.
fn halves(s: Socket) -> (ReadHalf, WriteHalf) {
    (ReadHalf { socket: s.clone() }, WriteHalf { socket: s })
}

pub(crate) fn tcp(s: TcpStream) -> (ReadHalf, WriteHalf) {
    halves(Socket::Tcp(Arc::new(s)))
}

pub(crate) fn unix(s: UnixStream) -> (ReadHalf, WriteHalf) {
    halves(Socket::Unix(Arc::new(s)))
}

/// The read half of a connection.
///
/// Implements [`AsyncRead`]; [`crate::FrameReader`] uses the non-blocking
/// operations underneath to poll according to a [`crate::WaitStrategy`].
#[derive(Debug)]
pub struct ReadHalf {
    socket: Socket,
}

impl ReadHalf {
    /// Reads what is available now into `buf`'s spare capacity, without
    /// waiting: `WouldBlock` when nothing is; `Ok(0)` at end of stream.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match &self.socket {
            Socket::Tcp(s) => s.try_read_buf(buf),
            Socket::Unix(s) => s.try_read_buf(buf),
        }
    }

    /// Waits until the stream may be readable, registering `cx` to be woken.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &self.socket {
            Socket::Tcp(s) => s.poll_read_ready(cx),
            Socket::Unix(s) => s.poll_read_ready(cx),
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.poll_read_ready(cx))?;
            let r = match &self.socket {
                Socket::Tcp(s) => s.try_read(buf.initialize_unfilled()),
                Socket::Unix(s) => s.try_read(buf.initialize_unfilled()),
            };
            match r {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale; tokio has cleared it, so this registers anew.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// The write half of a connection.
///
/// Every operation takes `&self`, so the half can be shared by the tasks and
/// threads that write to the connection (see [`crate::FrameWriter`], which
/// keeps their frames whole and in order). Implements [`AsyncWrite`] for
/// plain byte-stream use.
#[derive(Debug)]
pub struct WriteHalf {
    socket: Socket,
}

impl WriteHalf {
    /// Writes what fits now, without waiting: `WouldBlock` when nothing does.
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &self.socket {
            Socket::Tcp(s) => s.try_write_vectored(bufs),
            Socket::Unix(s) => s.try_write_vectored(bufs),
        }
    }

    /// Waits until the stream may be writable, registering `cx` to be woken.
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &self.socket {
            Socket::Tcp(s) => s.poll_write_ready(cx),
            Socket::Unix(s) => s.poll_write_ready(cx),
        }
    }

    /// Ends the write direction: the peer reads end of stream once it has
    /// read everything written before.
    pub fn shutdown(&self) -> io::Result<()> {
        let r = match &self.socket {
            Socket::Tcp(s) => rustix::net::shutdown(&**s, rustix::net::Shutdown::Write),
            Socket::Unix(s) => rustix::net::shutdown(&**s, rustix::net::Shutdown::Write),
        };
        match r {
            // The peer is gone already: the stream is as shut as it gets.
            Err(rustix::io::Errno::NOTCONN) => Ok(()),
            r => r.map_err(io::Error::from),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.poll_write_ready(cx))?;
            match self.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.shutdown())
    }
}
