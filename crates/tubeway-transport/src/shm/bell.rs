//! The doorbell: how an async end of a shared-memory connection sleeps.
//!
//! A tokio task cannot sleep on the futex in the ring header, so it sleeps
//! on the connection's Unix socket instead: it announces in the ring that it
//! waits on its doorbell, and the peer, when it publishes data or frees
//! space, writes one byte to the socket. Any byte wakes both halves of the
//! receiving end, which re-check their rings; the bytes carry no meaning, so
//! a hostile peer can at worst cause spurious wake-ups. The socket's
//! hang-up, seen as end of stream, is how each side learns that the other
//! died, even by SIGKILL.
//!
//! Ringing goes through a plain descriptor ([`Bell`]), usable from any
//! thread; waiting goes through the socket registered with a runtime's
//! reactor ([`Waiter`]), which a connection moved to another thread
//! registers anew there.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rustix::net::SendFlags;
use tokio::net::UnixStream;
use tubeway_ring::{Region, Side};

/// A pending wait for the socket to become readable.
pub(crate) type Readable = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// Rings the peer and records its hang-up; shared by both halves and by
/// the rings' doorbell callbacks.
#[derive(Debug)]
pub(crate) struct Bell {
    /// A duplicate of the socket's descriptor, used only to send.
    ring_fd: OwnedFd,
    region: Arc<Region>,
    side: Side,
    hung_up: AtomicBool,
}

impl Bell {
    pub(crate) fn new(sock: &UnixStream, region: Arc<Region>, side: Side) -> io::Result<Arc<Bell>> {
        Ok(Arc::new(Bell {
            ring_fd: sock.as_fd().try_clone_to_owned()?,
            region,
            side,
            hung_up: AtomicBool::new(false),
        }))
    }

    /// Wakes the peer. Called on the publishing thread: a non-blocking send
    /// of one byte; a full socket buffer already holds a byte that wakes it.
    pub(crate) fn ring(&self) {
        let _ = rustix::net::send(
            &self.ring_fd,
            b"!",
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        );
    }

    /// Whether the peer hung up.
    pub(crate) fn hung_up(&self) -> bool {
        self.hung_up.load(Ordering::Acquire)
    }

    fn hang_up(&self) {
        if !self.hung_up.swap(true, Ordering::AcqRel) {
            // Both ends of this side wake and see their rings closed.
            self.region.mark_peer_dead(self.side);
        }
    }
}

/// The socket as one half waits on it.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub(crate) sock: Arc<UnixStream>,
    pub(crate) bell: Arc<Bell>,
}

impl Waiter {
    /// Reads every doorbell byte waiting, so the socket's readiness clears;
    /// notices a hang-up. Never waits.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 64];
        loop {
            match self.sock.try_read(&mut buf) {
                Ok(0) => return self.bell.hang_up(),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.bell.hang_up(),
            }
        }
    }

    /// Waits until the socket may be readable. The wait is registered when
    /// this returns `Pending`, so a byte sent after that wakes the task even
    /// if the other half drains it first (tokio wakes every waiter).
    pub(crate) fn poll_readable(
        &self,
        slot: &mut Option<Readable>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let fut = slot.get_or_insert_with(|| {
            let sock = self.sock.clone();
            Box::pin(async move { sock.readable().await })
        });
        match fut.as_mut().poll(cx) {
            Poll::Ready(r) => {
                *slot = None;
                if r.is_err() {
                    self.bell.hang_up();
                }
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
