//! The set-up exchange of a shared-memory connection, over its Unix socket.
//!
//! ```text
//! request (connector -> listener), 16 bytes
//!   0..4   magic      "TWSH"
//!   4..6   version    u16 LE, 1
//!   6..8   reserved   0
//!   8..16  capacity   u64 LE: ring bytes per direction asked for (0: the listener's default)
//! reply (listener -> connector), 16 bytes, with the region's memfd (SCM_RIGHTS) when accepted
//!   0..4   magic      "TWSH"
//!   4..6   version    u16 LE, 1
//!   6..8   status     u16 LE: 0 accepted, 1 unsupported version, 2 refused
//!   8..16  capacity   u64 LE: ring bytes per direction granted
//! ```
//!
//! After the reply the socket carries no data, only doorbell bytes (see
//! `bell.rs`); its hang-up is how each side learns that the other died.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;
use tubeway_ring::{Region, RingConfig, DEFAULT_CAPACITY, MIN_CAPACITY};

use super::MAX_RING_CAPACITY;

/// Set-up magic.
const MAGIC: [u8; 4] = *b"TWSH";
/// Set-up version.
pub(crate) const VERSION: u16 = 1;
/// Length of a request and of a reply.
pub(crate) const LEN: usize = 16;

/// What the listener answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Accepted,
    UnsupportedVersion,
    Refused,
}

impl Status {
    fn code(self) -> u16 {
        match self {
            Status::Accepted => 0,
            Status::UnsupportedVersion => 1,
            Status::Refused => 2,
        }
    }

    fn from_code(c: u16) -> Option<Status> {
        match c {
            0 => Some(Status::Accepted),
            1 => Some(Status::UnsupportedVersion),
            2 => Some(Status::Refused),
            _ => None,
        }
    }
}

/// A request or a reply: the same shape, `word` being reserved or the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packet {
    pub version: u16,
    pub word: u16,
    pub capacity: u64,
}

impl Packet {
    pub(crate) fn request(capacity: u64) -> Packet {
        Packet {
            version: VERSION,
            word: 0,
            capacity,
        }
    }

    pub(crate) fn reply(status: Status, capacity: u64) -> Packet {
        Packet {
            version: VERSION,
            word: status.code(),
            capacity,
        }
    }

    pub(crate) fn status(&self) -> Option<Status> {
        Status::from_code(self.word)
    }

    pub(crate) fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        let (magic, rest) = b.split_at_mut(4);
        magic.copy_from_slice(&MAGIC);
        let (version, rest) = rest.split_at_mut(2);
        version.copy_from_slice(&self.version.to_le_bytes());
        let (word, capacity) = rest.split_at_mut(2);
        word.copy_from_slice(&self.word.to_le_bytes());
        capacity.copy_from_slice(&self.capacity.to_le_bytes());
        b
    }

    /// Decodes a packet; `None` when the magic is wrong.
    pub(crate) fn decode(b: &[u8; LEN]) -> Option<Packet> {
        let (magic, rest) = b.split_first_chunk::<4>()?;
        if *magic != MAGIC {
            return None;
        }
        let (version, rest) = rest.split_first_chunk::<2>()?;
        let (word, rest) = rest.split_first_chunk::<2>()?;
        let capacity = rest.first_chunk::<8>()?;
        Some(Packet {
            version: u16::from_le_bytes(*version),
            word: u16::from_le_bytes(*word),
            capacity: u64::from_le_bytes(*capacity),
        })
    }
}

/// The ring size a listener grants for a request of `asked` bytes.
pub(crate) fn granted_capacity(asked: u64) -> usize {
    if asked == 0 {
        return DEFAULT_CAPACITY;
    }
    let asked = usize::try_from(asked).unwrap_or(usize::MAX);
    asked
        .clamp(MIN_CAPACITY, MAX_RING_CAPACITY)
        .checked_next_power_of_two()
        .unwrap_or(MAX_RING_CAPACITY)
        .min(MAX_RING_CAPACITY)
}

/// The listener's answer to `request`, and the region it made for it.
pub(crate) fn answer(request: &Packet) -> (Packet, Result<Region, String>) {
    if request.version != VERSION {
        return (
            Packet::reply(Status::UnsupportedVersion, 0),
            Err(format!(
                "set-up version {} is not supported",
                request.version
            )),
        );
    }
    let capacity = granted_capacity(request.capacity);
    match Region::create(&RingConfig::default().capacity(capacity)) {
        Ok(region) => (Packet::reply(Status::Accepted, capacity as u64), Ok(region)),
        Err(e) => (Packet::reply(Status::Refused, 0), Err(e.to_string())),
    }
}

/// Checks the listener's reply: accepted, in this version.
pub(crate) fn check_reply(reply: &Packet) -> io::Result<()> {
    let refused = |why: &str| io::Error::new(io::ErrorKind::ConnectionRefused, why.to_owned());
    match reply.status() {
        Some(Status::Accepted) if reply.version == VERSION => Ok(()),
        Some(Status::Accepted) => Err(refused("the listener answered in another set-up version")),
        Some(Status::UnsupportedVersion) => Err(refused(
            "the listener does not speak this shared-memory set-up version",
        )),
        Some(Status::Refused) | None => Err(refused("the listener refused the connection")),
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// A packet being read: its bytes so far and the descriptor that came.
struct Incoming {
    buf: [u8; LEN],
    got: usize,
    fd: Option<OwnedFd>,
}

impl Incoming {
    fn new() -> Incoming {
        Incoming {
            buf: [0; LEN],
            got: 0,
            fd: None,
        }
    }

    /// One read; true once the packet is whole.
    fn read_from(&mut self, sock: BorrowedFd<'_>) -> io::Result<bool> {
        let rest = self.buf.get_mut(self.got..).unwrap_or_default();
        let n = recv_some(sock, rest, &mut self.fd)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the shared-memory set-up socket",
            ));
        }
        self.got += n;
        Ok(self.got == LEN)
    }

    fn finish(self) -> io::Result<(Packet, Option<OwnedFd>)> {
        let packet =
            Packet::decode(&self.buf).ok_or_else(|| invalid("not a tubeway shared-memory peer"))?;
        Ok((packet, self.fd))
    }
}

/// A packet being written, with the descriptor it carries on its first byte.
struct Outgoing<'a> {
    bytes: [u8; LEN],
    sent: usize,
    fd: Option<BorrowedFd<'a>>,
}

impl<'a> Outgoing<'a> {
    fn new(packet: Packet, fd: Option<BorrowedFd<'a>>) -> Outgoing<'a> {
        Outgoing {
            bytes: packet.encode(),
            sent: 0,
            fd,
        }
    }

    /// One write; true once the packet is out.
    fn write_to(&mut self, sock: BorrowedFd<'_>) -> io::Result<bool> {
        let rest = self.bytes.get(self.sent..).unwrap_or_default();
        let first = self.sent == 0;
        let fds = match (&self.fd, first) {
            (Some(fd), true) => std::slice::from_ref(fd),
            _ => &[],
        };
        self.sent += send_some(sock, rest, fds)?;
        Ok(self.sent == LEN)
    }
}

/// Retries `op` on EINTR, for blocking sockets.
fn retrying(mut op: impl FnMut() -> io::Result<bool>) -> io::Result<()> {
    loop {
        match op() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads one packet, and the descriptor sent with it if any.
pub(crate) async fn recv(sock: &UnixStream) -> io::Result<(Packet, Option<OwnedFd>)> {
    let mut incoming = Incoming::new();
    while !sock
        .async_io(Interest::READABLE, || incoming.read_from(sock.as_fd()))
        .await?
    {}
    incoming.finish()
}

/// [`recv`] on a blocking socket (its timeouts bound the wait).
pub(crate) fn recv_blocking(
    sock: &std::os::unix::net::UnixStream,
) -> io::Result<(Packet, Option<OwnedFd>)> {
    let mut incoming = Incoming::new();
    retrying(|| incoming.read_from(sock.as_fd()))?;
    incoming.finish()
}

/// Writes one packet, passing `fd` with it.
pub(crate) async fn send(
    sock: &UnixStream,
    packet: Packet,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut outgoing = Outgoing::new(packet, fd);
    while !sock
        .async_io(Interest::WRITABLE, || outgoing.write_to(sock.as_fd()))
        .await?
    {}
    Ok(())
}

/// [`send`] on a blocking socket.
pub(crate) fn send_blocking(
    sock: &std::os::unix::net::UnixStream,
    packet: Packet,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut outgoing = Outgoing::new(packet, fd);
    retrying(|| outgoing.write_to(sock.as_fd()))
}

fn recv_some(sock: BorrowedFd<'_>, buf: &mut [u8], fd: &mut Option<OwnedFd>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for received in fds {
                // One descriptor is expected; any other is closed at once.
                if fd.is_none() {
                    *fd = Some(received);
                }
            }
        }
    }
    Ok(msg.bytes)
}

fn send_some(sock: BorrowedFd<'_>, buf: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("cannot attach the descriptor"));
    }
    let iov = [IoSlice::new(buf)];
    Ok(rustix::net::sendmsg(
        sock,
        &iov,
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_and_bad_magic_is_refused() {
        let p = Packet::reply(Status::Refused, 1 << 20);
        assert_eq!(Packet::decode(&p.encode()), Some(p));
        assert_eq!(p.status(), Some(Status::Refused));
        let mut b = Packet::request(0).encode();
        b[0] = b'X';
        assert_eq!(Packet::decode(&b), None);
        let mut b = Packet::request(0).encode();
        b[6] = 9;
        assert_eq!(Packet::decode(&b).unwrap().status(), None);
    }

    #[tokio::test]
    async fn a_descriptor_travels_with_the_packet() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        send(&a, Packet::request(4096), Some(file.as_fd()))
            .await
            .unwrap();
        let (p, fd) = recv(&b).await.unwrap();
        assert_eq!(p.capacity, 4096);
        assert!(fd.is_some());
        send(&a, Packet::request(1), None).await.unwrap();
        let (_, fd) = recv(&b).await.unwrap();
        assert!(fd.is_none());
        drop(a);
        assert_eq!(
            recv(&b).await.unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
