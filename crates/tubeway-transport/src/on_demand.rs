//! Sockets the runtime's reactor watches only while a task sleeps on them.
//!
//! Tokio registers a socket with its reactor (epoll, edge-triggered) for
//! reads and writes for as long as it lives. Each segment that arrives, and
//! on a Unix socket each buffer the peer frees, then wakes whichever worker
//! sleeps in `epoll_wait`, whether or not a task waits. For a reader that
//! spins (latency mode) every round trip so wakes an idle worker for
//! nothing, and on a machine with few CPUs that worker runs where the peer
//! needs to be (docs/performance/investigations.md, "The reactor wakes an
//! idle worker for every answer"). Here the read side is registered, for
//! reads alone, only while a task sleeps on it, and the write side, for
//! writes alone, only while a write waits for room. Registering and
//! deregistering cost an `epoll_ctl` each.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::Handle;

pub(crate) fn would_block<T>(r: &io::Result<T>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// A second descriptor of a socket, registered with a reactor for one
/// interest while someone waits on it. The socket's I/O goes through the
/// first, which is never registered, so it outlives every registration.
#[derive(Debug)]
struct Watch {
    interest: Interest,
    registered: Option<AsyncFd<OwnedFd>>,
    /// The descriptor while it is not registered.
    spare: Option<OwnedFd>,
    /// The runtime whose reactor registers it: the one the connection's
    /// tasks run on, wherever a registration is made from.
    runtime: Handle,
}

impl Watch {
    fn new(interest: Interest) -> io::Result<Watch> {
        let runtime = Handle::try_current().map_err(io::Error::other)?;
        Ok(Watch {
            interest,
            registered: None,
            spare: None,
            runtime,
        })
    }

    /// The registration, made if there is none.
    fn on(&mut self, socket: BorrowedFd<'_>) -> io::Result<&AsyncFd<OwnedFd>> {
        let registered = match self.registered.take() {
            Some(r) => r,
            None => {
                let fd = match self.spare.take() {
                    Some(fd) => fd,
                    None => socket.try_clone_to_owned()?,
                };
                let _in = self.runtime.enter();
                // Deprecated for a descriptor its `AsyncFd` does not own,
                // which could be closed while registered; an `OwnedFd`
                // cannot (its replacement is `unsafe`, which this crate
                // does not allow). On failure the duplicate is closed, and
                // made again next time.
                #[allow(deprecated)]
                AsyncFd::with_interest(fd, self.interest)?
            }
        };
        Ok(self.registered.insert(registered))
    }

    /// Deregisters it, keeping the descriptor for the next registration.
    fn off(&mut self) {
        if let Some(r) = self.registered.take() {
            self.spare = Some(r.into_inner());
        }
    }

    fn move_to_current_runtime(&mut self) -> io::Result<()> {
        self.off();
        self.runtime = Handle::try_current().map_err(io::Error::other)?;
        Ok(())
    }
}

/// Makes the two halves of an on-demand socket from a connected one in
/// non-blocking mode. Must be called within the runtime its tasks run on.
pub(crate) fn split(socket: OwnedFd, unix: bool) -> io::Result<(OnDemandRead, OnDemandWrite)> {
    Ok((
        OnDemandRead {
            watch: Watch::new(Interest::READABLE)?,
            socket: socket.try_clone()?,
            unix,
        },
        OnDemandWrite {
            watch: Mutex::new(Watch::new(Interest::WRITABLE)?),
            watched: AtomicBool::new(false),
            socket,
        },
    ))
}

/// The read side of an on-demand socket.
#[derive(Debug)]
pub(crate) struct OnDemandRead {
    watch: Watch,
    socket: OwnedFd,
    unix: bool,
}

impl OnDemandRead {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// A Unix socket, rather than tcp.
    pub(crate) fn is_unix(&self) -> bool {
        self.unix
    }

    /// Reads with `read`, or sleeps until the socket may be readable
    /// (registering it, and `cx`), as a tokio socket's `poll_read` does.
    pub(crate) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        mut read: impl FnMut(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        // A new registration knows of no readiness until the reactor's next
        // turn: ask the kernel first.
        let r = read(self.socket.as_fd());
        if !would_block(&r) {
            return Poll::Ready(r);
        }
        let socket = self.socket.as_fd();
        let watch = self.watch.on(socket)?;
        loop {
            // Read under the guard, so that a `WouldBlock` clears only the
            // readiness it saw, never an event after it.
            let mut guard = ready!(watch.poll_read_ready(cx))?;
            if let Ok(r) = guard.try_io(|_| read(socket)) {
                return Poll::Ready(r);
            }
        }
    }

    /// Waits until the socket may be readable, registering `cx`.
    pub(crate) fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let watch = self.watch.on(self.socket.as_fd())?;
        ready!(watch.poll_read_ready(cx))?.retain_ready();
        Poll::Ready(Ok(()))
    }

    /// Stops being watched (its reader spins, asking the kernel itself, or
    /// is lent to someone who does). The next sleep registers it again.
    pub(crate) fn unwatch(&mut self) {
        self.watch.off();
    }

    /// Whether the reactor watches the socket for a task asleep on it.
    pub(crate) fn watched(&self) -> bool {
        self.watch.registered.is_some()
    }

    /// Registers from now on with the reactor of the runtime this is
    /// called in.
    pub(crate) fn move_to_current_runtime(&mut self) -> io::Result<()> {
        self.watch.move_to_current_runtime()
    }
}

/// The write side of an on-demand socket. Shared by the connection's
/// writers, hence the lock, which only a write that waits for room takes.
/// One writer at a time waits (the connection's writers take turns).
#[derive(Debug)]
pub(crate) struct OnDemandWrite {
    watch: Mutex<Watch>,
    /// The socket is registered: the next write that goes through ends it.
    watched: AtomicBool,
    socket: OwnedFd,
}

impl OnDemandWrite {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    fn lock(&self) -> MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes with `write`, or waits until the socket may have room
    /// (registering it, and `cx`).
    pub(crate) fn poll_write(
        &self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let r = write(self.fd());
        if !would_block(&r) {
            if self.watched.swap(false, Ordering::Relaxed) {
                self.lock().off();
            }
            return Poll::Ready(r);
        }
        let mut watch = self.lock();
        self.watched.store(true, Ordering::Relaxed);
        let watch = watch.on(self.fd())?;
        loop {
            let mut guard = ready!(watch.poll_write_ready(cx))?;
            if let Ok(r) = guard.try_io(|_| write(self.fd())) {
                return Poll::Ready(r);
            }
        }
    }

    /// Waits until the socket may have room, registering `cx`.
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut watch = self.lock();
        self.watched.store(true, Ordering::Relaxed);
        ready!(watch.on(self.fd())?.poll_write_ready(cx))?.retain_ready();
        Poll::Ready(Ok(()))
    }

    /// See [`OnDemandRead::move_to_current_runtime`].
    pub(crate) fn move_to_current_runtime(&self) -> io::Result<()> {
        self.watched.store(false, Ordering::Relaxed);
        self.lock().move_to_current_runtime()
    }
}
