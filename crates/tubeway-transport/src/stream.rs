//! The two halves of an established byte stream.
//!
//! Unlike `tokio::io::split`, both halves keep the non-blocking operations
//! of the socket underneath, so that a frame can be written straight from
//! the task (or thread) that produced it and a reader can poll without
//! parking: see [`crate::FrameWriter`] and [`crate::WaitStrategy`].
//!
//! Two details matter for latency. Tokio answers a `try_read` from its
//! cached readiness, which only its reactor updates; a reader that spins
//! must ask the kernel itself ([`ReadHalf::try_read_now`]). And a socket
//! reports readiness to the reactor of the runtime it was registered with;
//! a connection handed to a thread of its own must be registered there
//! ([`crate::Connection::reregister`]), or every wake-up would take a
//! second hop through the first runtime.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::on_demand::{would_block, OnDemandRead, OnDemandWrite};
use crate::shm::{ShmReader, ShmWriter};

/// Bytes a spinning reader takes per system call.
const SPIN_READ: usize = 64 * 1024;

/// A socket's read side: tokio's own half, whose `poll_read` also clears
/// the reactor's readiness after a short read (the socket is drained), which
/// saves the system call that would only answer `EAGAIN`.
#[derive(Debug)]
enum SocketRead {
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Unix(tokio::net::unix::OwnedReadHalf),
}

#[derive(Debug)]
enum SocketWrite {
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Unix(tokio::net::unix::OwnedWriteHalf),
}

impl SocketRead {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            SocketRead::Tcp(s) => s.as_ref().as_fd(),
            SocketRead::Unix(s) => s.as_ref().as_fd(),
        }
    }

    /// Reads into `buf`'s spare capacity what the reactor says is there,
    /// registering nothing: `WouldBlock`, without a system call, when it
    /// says nothing is; a miss clears the readiness it saw.
    fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            SocketRead::Tcp(s) => s.try_read_buf(buf),
            SocketRead::Unix(s) => s.try_read_buf(buf),
        }
    }

    /// [`try_read_buf`](Self::try_read_buf) into `buf`.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            SocketRead::Tcp(s) => s.try_read(buf),
            SocketRead::Unix(s) => s.try_read(buf),
        }
    }
}

impl SocketWrite {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            SocketWrite::Tcp(s) => s.as_ref().as_fd(),
            SocketWrite::Unix(s) => s.as_ref().as_fd(),
        }
    }
}

pub(crate) fn shm((r, w): (ShmReader, ShmWriter)) -> (ReadHalf, WriteHalf) {
    (
        ReadHalf::new(ReadInner::Shm(Box::new(r))),
        WriteHalf {
            inner: WriteInner::Shm(w),
        },
    )
}

#[derive(Debug)]
enum ReadInner {
    Socket(SocketRead),
    /// See [`on_demand`].
    OnDemand(OnDemandRead),
    Shm(Box<ShmReader>),
}

impl ReadInner {
    /// The socket, and whether it is a Unix one; none on shared memory.
    fn socket(&self) -> Option<(BorrowedFd<'_>, bool)> {
        match self {
            ReadInner::Socket(s) => Some((s.fd(), matches!(s, SocketRead::Unix(_)))),
            ReadInner::OnDemand(s) => Some((s.fd(), s.is_unix())),
            ReadInner::Shm(_) => None,
        }
    }
}

#[derive(Debug)]
enum WriteInner {
    Socket(SocketWrite),
    OnDemand(OnDemandWrite),
    Shm(ShmWriter),
}

fn socket_halves(r: SocketRead, w: SocketWrite) -> (ReadHalf, WriteHalf) {
    (
        ReadHalf::new(ReadInner::Socket(r)),
        WriteHalf {
            inner: WriteInner::Socket(w),
        },
    )
}

pub(crate) fn tcp(s: TcpStream) -> (ReadHalf, WriteHalf) {
    let (r, w) = s.into_split();
    socket_halves(SocketRead::Tcp(r), SocketWrite::Tcp(w))
}

pub(crate) fn unix(s: UnixStream) -> (ReadHalf, WriteHalf) {
    let (r, w) = s.into_split();
    socket_halves(SocketRead::Unix(r), SocketWrite::Unix(w))
}

/// Makes a socket's halves [on-demand](crate::on_demand): the reactor
/// watches the socket only while a task sleeps on it. Shared memory's, and
/// halves already so, are returned as they are.
pub(crate) fn on_demand(r: ReadHalf, w: WriteHalf) -> io::Result<(ReadHalf, WriteHalf)> {
    let (socket, unix) = match (r.inner, w.inner) {
        (ReadInner::Socket(r), WriteInner::Socket(w)) => take_back(r, w)?,
        (r, w) => return Ok((ReadHalf::new(r), WriteHalf { inner: w })),
    };
    let (r, w) = crate::on_demand::split(socket, unix)?;
    Ok((
        ReadHalf::new(ReadInner::OnDemand(r)),
        WriteHalf {
            inner: WriteInner::OnDemand(w),
        },
    ))
}

/// The socket of a tokio socket's two halves, deregistered from its
/// reactor and still non-blocking (`into_std`), and whether it is a Unix
/// one.
fn take_back(r: SocketRead, w: SocketWrite) -> io::Result<(OwnedFd, bool)> {
    let mismatch = || io::Error::other("halves of two different connections");
    match (r, w) {
        (SocketRead::Tcp(r), SocketWrite::Tcp(w)) => {
            let s = r.reunite(w).map_err(|_| mismatch())?;
            Ok((s.into_std()?.into(), false))
        }
        (SocketRead::Unix(r), SocketWrite::Unix(w)) => {
            let s = r.reunite(w).map_err(|_| mismatch())?;
            Ok((s.into_std()?.into(), true))
        }
        _ => Err(mismatch()),
    }
}

/// Registers both halves with the current runtime's reactor instead of the
/// one they were made in. Must be called within a runtime.
pub(crate) fn reregister(r: ReadHalf, w: WriteHalf) -> io::Result<(ReadHalf, WriteHalf)> {
    let mismatch = || io::Error::other("halves of two different connections");
    match (r.inner, w.inner) {
        (ReadInner::OnDemand(mut r), WriteInner::OnDemand(w)) => {
            r.move_to_current_runtime()?;
            w.move_to_current_runtime()?;
            Ok((
                ReadHalf::new(ReadInner::OnDemand(r)),
                WriteHalf {
                    inner: WriteInner::OnDemand(w),
                },
            ))
        }
        (ReadInner::Socket(r), WriteInner::Socket(w)) => match take_back(r, w)? {
            (s, true) => Ok(unix(UnixStream::from_std(s.into())?)),
            (s, false) => Ok(tcp(TcpStream::from_std(s.into())?)),
        },
        (ReadInner::Shm(r), WriteInner::Shm(w)) => Ok(shm(crate::shm::reregister(*r, w)?)),
        _ => Err(mismatch()),
    }
}

/// See [`ReadHalf::wait_readable`]; `timeout_set` is the socket's receive
/// timeout as last set.
fn sleep_in_recv(
    fd: BorrowedFd<'_>,
    timeout_set: &mut Option<Duration>,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    if !crate::wait::set_recv_deadline(fd, timeout_set, deadline)? {
        return Ok(false);
    }
    let _blocking = Blocking::new(fd)?;
    let mut byte = [0u8; 1];
    // Whatever ends it (data, the end of the stream, a timeout, a signal or
    // an error), the caller's read that follows learns which.
    let _ = rustix::net::recv(fd, &mut byte, RecvFlags::PEEK);
    Ok(true)
}

/// A socket in blocking mode until this is dropped.
struct Blocking<'a>(BorrowedFd<'a>);

impl<'a> Blocking<'a> {
    fn new(fd: BorrowedFd<'a>) -> io::Result<Blocking<'a>> {
        rustix::io::ioctl_fionbio(fd, false)?;
        Ok(Blocking(fd))
    }
}

impl Drop for Blocking<'_> {
    fn drop(&mut self) {
        // Cannot fail on a descriptor that took the first call.
        let _ = rustix::io::ioctl_fionbio(self.0, true);
    }
}

/// Whether the peer of TCP socket `fd` is on this machine; false when
/// either address is unknown.
fn tcp_peer_is_local(fd: BorrowedFd<'_>) -> bool {
    let (Ok(local), Ok(Some(peer))) = (rustix::net::getsockname(fd), rustix::net::getpeername(fd))
    else {
        return false;
    };
    match (
        std::net::SocketAddr::try_from(local),
        std::net::SocketAddr::try_from(peer),
    ) {
        (Ok(local), Ok(peer)) => same_host(local.ip(), peer.ip()),
        _ => false,
    }
}

/// Whether a peer at `peer` talks to an end at `local` on the same host.
fn same_host(local: std::net::IpAddr, peer: std::net::IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || peer == local.to_canonical()
}

/// One `recv` that does not wait; an interrupted one counts as nothing there.
fn recv_now(fd: BorrowedFd<'_>, into: &mut [u8]) -> io::Result<usize> {
    match rustix::net::recv(fd, into, RecvFlags::DONTWAIT) {
        Ok((n, _)) => Ok(n),
        Err(Errno::INTR) => Err(io::ErrorKind::WouldBlock.into()),
        Err(e) => Err(e.into()),
    }
}

/// [`recv_now`] into `buf`'s spare capacity, through `scratch`: safe code
/// cannot read into uninitialised memory.
fn recv_now_buf(
    fd: BorrowedFd<'_>,
    scratch: &mut Vec<u8>,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    if scratch.is_empty() {
        *scratch = vec![0; SPIN_READ];
    }
    let room = (buf.capacity() - buf.len()).clamp(1, SPIN_READ);
    let into = scratch.get_mut(..room).unwrap_or_default();
    let n = recv_now(fd, into)?;
    buf.extend_from_slice(into.get(..n).unwrap_or_default());
    Ok(n)
}

/// The read half of a connection.
///
/// Implements [`AsyncRead`]; [`crate::FrameReader`] uses the non-blocking
/// operations underneath to poll according to a [`crate::WaitStrategy`].
#[derive(Debug)]
pub struct ReadHalf {
    inner: ReadInner,
    /// Where a spinning socket reader reads before copying into the
    /// caller's buffer: safe code cannot read into uninitialised memory.
    scratch: Vec<u8>,
    /// The socket's receive timeout as last set (`None`: none), for
    /// [`wait_readable`](ReadHalf::wait_readable).
    recv_timeout: Option<Duration>,
    /// A poll since [`withdraw_wait`](Self::withdraw_wait) registered its
    /// waker to be woken through the stream, or may have (see
    /// [`waited_since_withdraw`](Self::waited_since_withdraw)).
    waited: bool,
    /// See [`peer_is_local`](Self::peer_is_local).
    local_peer: bool,
}

impl ReadHalf {
    fn new(inner: ReadInner) -> ReadHalf {
        let local_peer = match inner.socket() {
            None | Some((_, true)) => true,
            Some((fd, false)) => tcp_peer_is_local(fd),
        };
        ReadHalf {
            inner,
            scratch: Vec::new(),
            recv_timeout: None,
            waited: false,
            local_peer,
        }
    }

    /// Whether the peer runs on this machine (shared memory, a Unix socket,
    /// TCP to a loopback address or to this end's own), so that the rest of
    /// a frame it has begun to send comes at the speed of memory, not of a
    /// network.
    pub fn peer_is_local(&self) -> bool {
        self.local_peer
    }

    /// Reads what is available into `buf`'s spare capacity, without waiting,
    /// as far as the runtime's reactor knows: `WouldBlock` when it believes
    /// nothing is there; `Ok(0)` at end of stream. For a reader that sleeps
    /// between reads.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match &mut self.inner {
            ReadInner::Socket(s) => s.try_read_buf(buf),
            ReadInner::OnDemand(s) => recv_now_buf(s.fd(), &mut self.scratch, buf),
            ReadInner::Shm(r) => r.try_read_buf(buf),
        }
    }

    /// Reads what is available into `buf`'s spare capacity, or registers `cx`
    /// to be woken when something may be; `Ok(0)` at end of stream. For a
    /// reader that sleeps between reads.
    pub fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        match &mut self.inner {
            ReadInner::Socket(socket) => {
                // Without registering first (see `waited_since_withdraw`);
                // a miss leaves the poll below nothing to read again.
                let read = socket.try_read_buf(buf);
                if !would_block(&read) {
                    return Poll::Ready(read);
                }
                self.waited = true;
                match socket {
                    SocketRead::Tcp(s) => tokio_util::io::poll_read_buf(Pin::new(s), cx, buf),
                    SocketRead::Unix(s) => tokio_util::io::poll_read_buf(Pin::new(s), cx, buf),
                }
            }
            ReadInner::OnDemand(s) => {
                let scratch = &mut self.scratch;
                s.poll_read(cx, |fd| recv_now_buf(fd, scratch, buf))
            }
            ReadInner::Shm(r) => loop {
                match r.try_read_buf(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.waited = true;
                        ready!(r.poll_read_ready(cx))?;
                    }
                    other => return Poll::Ready(other),
                }
            },
        }
    }

    /// Reads into `buf` (not empty), or registers `cx` to be woken when
    /// something may be there; `Ok(0)` at end of stream. For reading a large
    /// frame straight into memory of the caller's, by a reader that sleeps
    /// between reads.
    pub fn poll_read_into(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let socket = match &mut self.inner {
            ReadInner::Socket(s) => s,
            ReadInner::OnDemand(s) => return s.poll_read(cx, |fd| recv_now(fd, buf)),
            ReadInner::Shm(r) => loop {
                let len = buf.len();
                match r.try_read_into(&mut &mut *buf, len) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.waited = true;
                        ready!(r.poll_read_ready(cx))?;
                    }
                    other => return Poll::Ready(other),
                }
            },
        };
        // As in `poll_read_buf`.
        let read = socket.try_read(buf);
        if !would_block(&read) {
            return Poll::Ready(read);
        }
        self.waited = true;
        let mut into = ReadBuf::new(buf);
        ready!(match socket {
            SocketRead::Tcp(s) => Pin::new(s).poll_read(cx, &mut into),
            SocketRead::Unix(s) => Pin::new(s).poll_read(cx, &mut into),
        })?;
        Poll::Ready(Ok(into.filled().len()))
    }

    /// Stops waiting to be woken through the stream, for a reader that
    /// polls without sleeping for a while: true when a wait announced to
    /// the peer was withdrawn (shared memory), to announce again with
    /// [`resume_wait`](Self::resume_wait). An on-demand socket (see
    /// [`crate::Connection::watch_on_demand`]) is deregistered from the
    /// reactor, until its next sleep: see [`watched`](Self::watched).
    /// Another socket's wait stays registered with the reactor, which costs
    /// the peer nothing.
    pub fn withdraw_wait(&mut self) -> bool {
        self.waited = false;
        match &mut self.inner {
            ReadInner::Shm(r) => r.withdraw_wait(),
            ReadInner::OnDemand(s) => {
                s.unwatch();
                false
            }
            ReadInner::Socket(_) => false,
        }
    }

    /// Whether this reads shared memory, which its peer writes at the
    /// speed of memory, rather than a socket.
    pub fn reads_memory(&self) -> bool {
        matches!(self.inner, ReadInner::Shm(_))
    }

    /// Whether a task asleep on this stream would be woken by what comes:
    /// false for an on-demand socket not registered with the reactor since
    /// it was last polled without sleeping.
    pub fn watched(&self) -> bool {
        match &self.inner {
            ReadInner::OnDemand(s) => s.watched(),
            ReadInner::Socket(_) | ReadInner::Shm(_) => true,
        }
    }

    /// Whether a poll since [`withdraw_wait`](Self::withdraw_wait) left its
    /// waker registered to be woken through the stream, or may have: a
    /// poll that registers may still complete (tokio looks at a socket's
    /// readiness again after registering, a shared-memory reader at its
    /// ring after announcing its sleep). Whoever was woken through the
    /// stream before must then poll again, to register its own waker.
    /// Polls that read without waiting never register.
    pub fn waited_since_withdraw(&self) -> bool {
        match &self.inner {
            // Withdrawing unregistered it.
            ReadInner::OnDemand(s) => s.watched(),
            ReadInner::Socket(_) | ReadInner::Shm(_) => self.waited,
        }
    }

    /// Announces again the wait [`withdraw_wait`](Self::withdraw_wait)
    /// withdrew, for the task registered before; false when something came
    /// meanwhile or the peer hung up: the reader must then be polled.
    pub fn resume_wait(&mut self) -> bool {
        match &mut self.inner {
            ReadInner::Shm(r) => r.resume_wait(),
            ReadInner::Socket(_) | ReadInner::OnDemand(_) => true,
        }
    }

    /// Reads what is available now, asking the kernel itself (one system
    /// call on a socket, none on shared memory): for a reader that spins,
    /// since the reactor's view is only as fresh as its last poll.
    /// An on-demand socket stops being watched by the reactor meanwhile.
    pub fn try_read_now(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let fd = match &mut self.inner {
            ReadInner::Shm(r) => return r.try_read_buf(buf),
            ReadInner::Socket(s) => s.fd(),
            ReadInner::OnDemand(s) => {
                s.unwatch();
                s.fd()
            }
        };
        recv_now_buf(fd, &mut self.scratch, buf)
    }

    /// On shared memory, hands the next record to `f` in place (see
    /// `ShmReader::try_read_whole`): `Ok(None)` when `f` makes nothing of
    /// it, `WouldBlock` when there is none. A socket has no records:
    /// `Ok(None)`, always.
    pub fn try_read_whole<T>(
        &mut self,
        f: impl FnOnce(&[u8]) -> Option<T>,
    ) -> io::Result<Option<T>> {
        match &mut self.inner {
            ReadInner::Shm(r) => r.try_read_whole(f),
            ReadInner::Socket(_) | ReadInner::OnDemand(_) => Ok(None),
        }
    }

    /// [`try_read_now`](Self::try_read_now) into `buf` (not empty), which is
    /// initialised memory, so a socket reads straight into it.
    pub fn try_read_now_into(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            ReadInner::Shm(r) => {
                let len = buf.len();
                r.try_read_into(&mut &mut *buf, len)
            }
            ReadInner::Socket(s) => recv_now(s.fd(), buf),
            ReadInner::OnDemand(s) => {
                s.unwatch();
                recv_now(s.fd(), buf)
            }
        }
    }

    /// Blocks this thread until the stream may have bytes to read (or has
    /// ended or failed), `deadline` passes or a signal comes, outside the
    /// runtime's reactor; then read with [`try_read_now`](Self::try_read_now),
    /// since the reactor has not seen what woke this. False, without
    /// sleeping, once `deadline` has passed, and on shared memory, which
    /// waits by its own means.
    ///
    /// On a Unix socket it sleeps in a blocking `recv` that peeks, which the
    /// peer wakes from the other CPU sooner than a sleep in `poll` (see
    /// docs/performance/investigations.md, "Why one-in-flight socket ratios
    /// depend on the regime"). The socket is in blocking mode meanwhile.
    /// That is safe because this thread is then its only reader, and every
    /// write on it is `MSG_DONTWAIT` ([`WriteHalf::try_write_vectored`]).
    /// Not when the process has a single CPU: there is no wake-up from
    /// another CPU to gain, and switching the socket's mode costs two more
    /// system calls.
    pub fn wait_readable(&mut self, deadline: Option<Instant>) -> io::Result<bool> {
        match self.inner.socket() {
            Some((fd, true)) if crate::wait::several_cpus() => {
                sleep_in_recv(fd, &mut self.recv_timeout, deadline)
            }
            Some((fd, _)) => crate::wait::poll_until(fd, rustix::event::PollFlags::IN, deadline),
            None => Ok(false),
        }
    }

    /// Whether a socket is in non-blocking mode, as the runtime needs it.
    #[cfg(test)]
    pub(crate) fn is_nonblocking(&self) -> bool {
        self.inner.socket().is_none_or(|(fd, _)| {
            rustix::fs::fcntl_getfl(fd).is_ok_and(|f| f.contains(rustix::fs::OFlags::NONBLOCK))
        })
    }

    /// Waits until the stream may be readable, registering `cx` to be woken.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.waited = true;
        match &mut self.inner {
            ReadInner::Socket(SocketRead::Tcp(s)) => s.as_ref().poll_read_ready(cx),
            ReadInner::Socket(SocketRead::Unix(s)) => s.as_ref().poll_read_ready(cx),
            ReadInner::OnDemand(s) => s.poll_read_ready(cx),
            ReadInner::Shm(r) => r.poll_read_ready(cx),
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // It may register (see `waited_since_withdraw`).
        self.waited = true;
        match &mut self.inner {
            ReadInner::Socket(SocketRead::Tcp(s)) => Pin::new(s).poll_read(cx, buf),
            ReadInner::Socket(SocketRead::Unix(s)) => Pin::new(s).poll_read(cx, buf),
            ReadInner::OnDemand(s) => {
                let into = buf.initialize_unfilled();
                let n = ready!(s.poll_read(cx, |fd| recv_now(fd, into)))?;
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            ReadInner::Shm(r) => {
                // Bounded by what `buf` has room for.
                let mut b = BytesMut::with_capacity(buf.remaining());
                loop {
                    match r.try_read_buf(&mut b) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            ready!(r.poll_read_ready(cx))?;
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                        Ok(_) => {
                            buf.put_slice(&b);
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
            }
        }
    }
}

/// The most one `sendmsg` hands a socket. One call with all of a large
/// message keeps the socket locked while the kernel copies as much as the
/// send buffer takes, and the peer's acknowledgements wait behind the lock:
/// over loopback TCP here, 200 MB written 1 MiB at a time went at 4.5-4.8
/// GB/s to a reader that polls, 2.5-2.7 GB/s in 16 MiB or 200 MB calls
/// (docs/performance/investigations.md, "Large messages over TCP").
const SEND_MAX: usize = 1 << 20;

/// Slices of one capped `sendmsg`: as many as the frame writers pass at
/// once, so that a backlog of small frames still goes in calls of up to
/// [`SEND_MAX`] bytes.
const SEND_MAX_IOV: usize = 512;

/// One non-blocking `sendmsg` of `bufs`, or of their first [`SEND_MAX`]
/// bytes, without SIGPIPE.
fn send_now(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    if bufs.iter().map(|b| b.len()).sum::<usize>() <= SEND_MAX {
        return send_all_now(fd, bufs);
    }
    let mut capped = [IoSlice::new(&[]); SEND_MAX_IOV];
    send_all_now(fd, cap_send(bufs, &mut capped))
}

/// One non-blocking `sendmsg` of all of `bufs`, without SIGPIPE.
fn send_all_now(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let mut control = SendAncillaryBuffer::default();
    loop {
        match rustix::net::sendmsg(
            fd,
            bufs,
            &mut control,
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        ) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The first [`SEND_MAX`] bytes of `bufs`, as slices in `room` (at most
/// its length of them).
fn cap_send<'a>(bufs: &'a [IoSlice<'a>], room: &'a mut [IoSlice<'a>]) -> &'a [IoSlice<'a>] {
    let mut left = SEND_MAX;
    let mut n = 0;
    for (slot, b) in room.iter_mut().zip(bufs) {
        let take = b.len().min(left);
        *slot = IoSlice::new(b.get(..take).unwrap_or_default());
        n += 1;
        left -= take;
        if left == 0 {
            break;
        }
    }
    room.get(..n).unwrap_or_default()
}

/// The write half of a connection.
///
/// Every operation takes `&self`, so the half can be shared by the tasks and
/// threads that write to the connection (see [`crate::FrameWriter`], which
/// keeps their frames whole and in order). Implements [`AsyncWrite`] for
/// plain byte-stream use.
#[derive(Debug)]
pub struct WriteHalf {
    inner: WriteInner,
}

impl WriteHalf {
    /// How a write that finds a shared-memory ring full waits for room:
    /// spinning for `wait`'s budget (at most 50 µs, since the spin holds the
    /// writer's thread) before sleeping until the reader makes room. The
    /// default is the default strategy's 50 µs; a strategy that does not spin
    /// sleeps at once. Sockets wait for room in the reactor whatever it is.
    pub fn set_wait_strategy(&self, wait: &crate::WaitStrategy) {
        if let WriteInner::Shm(w) = &self.inner {
            w.set_wait_strategy(wait);
        }
    }

    /// Whether a write copies into memory the peer reads (shared memory)
    /// rather than making a system call.
    pub fn writes_to_memory(&self) -> bool {
        matches!(self.inner, WriteInner::Shm(_))
    }

    /// Writes what fits now, without waiting: `WouldBlock` when nothing
    /// does. Always asks the kernel (the reactor's view may be stale), and
    /// never raises SIGPIPE: a closed peer is a `BrokenPipe` error.
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &self.inner {
            WriteInner::Shm(w) => w.try_write_vectored(bufs),
            WriteInner::Socket(s) => send_now(s.fd(), bufs),
            WriteInner::OnDemand(s) => send_now(s.fd(), bufs),
        }
    }

    /// Writes what fits, or waits until something may, registering `cx`.
    /// The reactor learns of a full socket from this (it clears its
    /// readiness on `WouldBlock`), so a writer that waits uses this one.
    pub fn poll_write_vectored_some(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            let r = match &self.inner {
                WriteInner::Socket(SocketWrite::Tcp(s)) => {
                    let s = s.as_ref();
                    s.try_io(Interest::WRITABLE, || send_now(s.as_fd(), bufs))
                }
                WriteInner::Socket(SocketWrite::Unix(s)) => {
                    let s = s.as_ref();
                    s.try_io(Interest::WRITABLE, || send_now(s.as_fd(), bufs))
                }
                WriteInner::OnDemand(s) => return s.poll_write(cx, |fd| send_now(fd, bufs)),
                WriteInner::Shm(w) => w.try_write_vectored(bufs),
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.poll_write_ready(cx))?;
                }
                r => return Poll::Ready(r),
            }
        }
    }

    /// Waits until the stream may be writable, registering `cx` to be woken.
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &self.inner {
            WriteInner::Socket(SocketWrite::Tcp(s)) => s.as_ref().poll_write_ready(cx),
            WriteInner::Socket(SocketWrite::Unix(s)) => s.as_ref().poll_write_ready(cx),
            WriteInner::OnDemand(s) => s.poll_write_ready(cx),
            WriteInner::Shm(w) => w.poll_write_ready(cx),
        }
    }

    /// Ends the read direction: a thread asleep reading the stream wakes
    /// and reads end of stream (see [`crate::FrameWriter::stop_reading`]).
    /// Nothing to do on shared memory, whose readers do not sleep so.
    pub fn stop_reading(&self) {
        let fd = match &self.inner {
            WriteInner::Socket(s) => s.fd(),
            WriteInner::OnDemand(s) => s.fd(),
            WriteInner::Shm(_) => return,
        };
        // Fails only on a socket no longer connected, whose readers that
        // wakes already.
        let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Read);
    }

    /// Ends the write direction: the peer reads end of stream once it has
    /// read everything written before.
    pub fn shutdown(&self) -> io::Result<()> {
        let r = match &self.inner {
            WriteInner::Socket(s) => rustix::net::shutdown(s.fd(), rustix::net::Shutdown::Write),
            WriteInner::OnDemand(s) => rustix::net::shutdown(s.fd(), rustix::net::Shutdown::Write),
            WriteInner::Shm(w) => {
                w.shutdown();
                Ok(())
            }
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
        self.poll_write_vectored_some(cx, bufs)
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_peer_on_a_loopback_address_or_on_our_own_is_on_this_host() {
        assert!(same_host(ip("127.0.0.1"), ip("127.0.0.1")));
        assert!(same_host(ip("10.0.0.5"), ip("127.0.0.2")));
        assert!(same_host(ip("::1"), ip("::1")));
        assert!(same_host(ip("10.0.0.5"), ip("10.0.0.5")));
        // The same address, as IPv4 and as IPv4-mapped IPv6.
        assert!(same_host(ip("::ffff:10.0.0.5"), ip("10.0.0.5")));
        assert!(same_host(ip("::ffff:10.0.0.5"), ip("::ffff:127.0.0.1")));
        assert!(!same_host(ip("10.0.0.5"), ip("10.0.0.6")));
        assert!(!same_host(ip("127.0.0.1"), ip("192.168.1.9")));
    }

    fn lens(slices: &[IoSlice<'_>]) -> Vec<usize> {
        slices.iter().map(|s| s.len()).collect()
    }

    #[test]
    fn one_send_takes_at_most_send_max_bytes() {
        let head = [1u8; 40];
        let payload = vec![2u8; 3 * SEND_MAX];
        let mut room = [IoSlice::new(&[]); SEND_MAX_IOV];
        let whole = [IoSlice::new(&head), IoSlice::new(&payload)];
        let capped = cap_send(&whole, &mut room);
        assert_eq!(lens(capped), [40, SEND_MAX - 40]);
        assert!(capped[1].iter().all(|&b| b == 2));

        let third = vec![3u8; SEND_MAX / 2 - 1];
        let parts = [
            IoSlice::new(&third),
            IoSlice::new(&third),
            IoSlice::new(&third),
        ];
        let mut room = [IoSlice::new(&[]); SEND_MAX_IOV];
        assert_eq!(
            lens(cap_send(&parts, &mut room)),
            [SEND_MAX / 2 - 1, SEND_MAX / 2 - 1, 2]
        );

        // Within the cap, the slices as given.
        let small = [IoSlice::new(&head), IoSlice::new(&third)];
        let mut room = [IoSlice::new(&[]); SEND_MAX_IOV];
        assert_eq!(lens(cap_send(&small, &mut room)), [40, SEND_MAX / 2 - 1]);

        // A backlog of small frames: as many slices as make the cap.
        let frame = [4u8; 5000];
        let backlog: Vec<IoSlice<'_>> = (0..400).map(|_| IoSlice::new(&frame)).collect();
        let mut room = [IoSlice::new(&[]); SEND_MAX_IOV];
        let capped = lens(cap_send(&backlog, &mut room));
        assert_eq!(capped.iter().sum::<usize>(), SEND_MAX);
        assert_eq!(capped.len(), SEND_MAX.div_ceil(5000));
    }

    #[tokio::test]
    async fn a_large_write_goes_in_pieces_and_arrives_whole() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(l.accept(), TcpStream::connect(addr));
        let (mut r, _) = tcp(a.unwrap().0);
        let (_, w) = tcp(b.unwrap());
        assert!(r.peer_is_local());
        let payload: Vec<u8> = (0..3 * SEND_MAX + 7).map(|i| i as u8).collect();
        let len = payload.len();
        let reader = tokio::spawn(async move {
            let mut got = BytesMut::with_capacity(len);
            while got.len() < len {
                let n = std::future::poll_fn(|cx| r.poll_read_buf(cx, &mut got))
                    .await
                    .unwrap();
                assert!(n > 0, "end of stream after {} bytes", got.len());
            }
            got
        });
        let mut sent = 0;
        while sent < payload.len() {
            let n = std::future::poll_fn(|cx| {
                w.poll_write_vectored_some(cx, &[IoSlice::new(&payload[sent..])])
            })
            .await
            .unwrap();
            assert!(n <= SEND_MAX, "{n} bytes in one write");
            sent += n;
        }
        let got = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .unwrap()
            .unwrap();
        assert!(got[..] == payload[..]);
    }
}
