//! Channels over rings: `shm://` between processes, `mem://` in one.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, LazyLock};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags};
use rustix::net::SendFlags;
use tubeway_ring::{
    Consumer, Doorbell, Limits, Producer, ReadError, Region, RingConfig, Side, TryWriteError,
    WriteMessageError,
};

use super::{
    strategy, AcceptError, ChannelOptions, ConnectError, Duplex, Reader, ReaderInner, Received,
    ReceivedInner, RecvError, SendError, TrySendError, Writer, WriterInner,
};
use crate::mem::{Binding, Names};
use crate::shm::{self, setup};
use crate::WaitStrategy;

/// Rings spin about as long as a wake-up costs, then sleep on their futex.
const DEFAULT_WAIT: WaitStrategy = WaitStrategy::SpinPark {
    spin: crate::wait::DEFAULT_SPIN,
};

/// What one side keeps alive while either of its ends lives: the region,
/// and for shared memory the socket and the thread watching it.
#[derive(Debug)]
struct End {
    _region: Arc<Region>,
    watch: Option<Watch>,
}

#[derive(Debug)]
struct Watch {
    sock: Arc<UnixStream>,
    stop: Arc<AtomicBool>,
}

impl Drop for End {
    fn drop(&mut self) {
        if let Some(w) = &self.watch {
            w.stop.store(true, Ordering::Release);
            // Wakes the watcher (it reads end of stream) and tells the peer.
            let _ = rustix::net::shutdown(w.sock.as_fd(), rustix::net::Shutdown::Both);
        }
    }
}

/// Builds one side's ends. For shared memory, a thread sleeps in `poll` on
/// the socket, so that a sleeper on the futex learns at once that the peer
/// died: it costs no CPU while nothing happens.
fn duplex(
    region: Arc<Region>,
    side: Side,
    sock: Option<UnixStream>,
    options: &ChannelOptions,
) -> io::Result<Duplex> {
    let (mut tx, mut rx) = region.ends(side).map_err(io::Error::other)?;
    let watch = match sock {
        None => None,
        Some(sock) => {
            let sock = Arc::new(sock);
            let stop = Arc::new(AtomicBool::new(false));
            // A peer that sleeps on its doorbell (an async end) is woken by a byte.
            let ring = {
                let sock = sock.clone();
                move || {
                    let _ = rustix::net::send(
                        sock.as_fd(),
                        b"!",
                        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
                    );
                }
            };
            tx.set_doorbell(Some(Doorbell::new(ring.clone())));
            rx.set_doorbell(Some(Doorbell::new(ring)));
            let (s, r, st) = (sock.clone(), region.clone(), stop.clone());
            std::thread::Builder::new()
                .name("tubeway-channel-watch".into())
                .spawn(move || watch_peer(&s, &r, side, &st))?;
            Some(Watch { sock, stop })
        }
    };
    let wait = strategy(options, DEFAULT_WAIT);
    let end = Arc::new(End {
        _region: region,
        watch,
    });
    Ok(Duplex {
        writer: Writer::new(
            WriterInner::Ring(RingWriter {
                tx,
                _end: end.clone(),
            }),
            wait,
        ),
        reader: Reader::new(
            ReaderInner::Ring(RingReader {
                rx,
                assembly: Vec::new(),
                assembled: false,
                max: options.max_message_size,
                _end: end,
            }),
            wait,
        ),
    })
}

/// Sleeps until the socket hangs up (the peer died or closed) or this side
/// stops; then marks the peer dead, which wakes every sleeper of this side.
fn watch_peer(sock: &UnixStream, region: &Region, side: Side, stop: &AtomicBool) {
    let mut buf = [0u8; 64];
    loop {
        let mut fds = [PollFd::new(sock, PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        match rustix::net::recv(sock.as_fd(), &mut buf, rustix::net::RecvFlags::DONTWAIT) {
            // Doorbell bytes mean nothing here: this side sleeps on futexes.
            Ok((n, _)) if n > 0 => {}
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            _ => break,
        }
    }
    if !stop.load(Ordering::Acquire) {
        region.mark_peer_dead(side);
    }
}

/// Sends on a ring.
#[derive(Debug)]
pub(crate) struct RingWriter {
    tx: Producer,
    _end: Arc<End>,
}

impl RingWriter {
    pub(crate) fn send(
        &mut self,
        parts: &[&[u8]],
        wait: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        match self.tx.write_message(parts, wait, deadline) {
            Ok(_) => Ok(()),
            Err(WriteMessageError::Closed) => Err(SendError::Closed),
            Err(WriteMessageError::TimedOut) => Err(SendError::TimedOut),
            Err(WriteMessageError::TimedOutMidMessage { .. }) => Err(SendError::TimedOutMidMessage),
            Err(e) => Err(SendError::Corrupt(e.to_string())),
        }
    }

    pub(crate) fn try_send(&mut self, parts: &[&[u8]]) -> Result<(), TrySendError> {
        match self.tx.try_write(parts) {
            Ok(_) => Ok(()),
            Err(TryWriteError::Full { .. }) => Err(TrySendError::Full),
            Err(TryWriteError::Closed) => Err(TrySendError::Closed),
            Err(TryWriteError::TooLarge { len, max }) => Err(TrySendError::TooLarge { len, max }),
            Err(e) => Err(TrySendError::Corrupt(e.to_string())),
        }
    }
}

/// Receives from a ring.
#[derive(Debug)]
pub(crate) struct RingReader {
    rx: Consumer,
    /// A fragmented message is copied here; one record is read in place.
    assembly: Vec<u8>,
    /// `assembly` holds a whole message handed out last time.
    assembled: bool,
    max: usize,
    _end: Arc<End>,
}

fn recv_error(e: ReadError, mid_message: bool) -> RecvError {
    match e {
        ReadError::Closed if mid_message => RecvError::Truncated,
        ReadError::Closed => RecvError::Closed,
        e => RecvError::Corrupt(e.to_string()),
    }
}

impl RingReader {
    pub(crate) fn recv(
        &mut self,
        wait: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<Option<Received<'_>>, RecvError> {
        if self.assembled {
            self.assembly.clear();
            self.assembled = false;
        }
        if self.assembly.is_empty() {
            let first = match self.rx.read(wait, deadline) {
                Ok(r) => r,
                Err(ReadError::TimedOut) => return Ok(None),
                Err(e) => return Err(recv_error(e, false)),
            };
            if first.is_last() {
                if first.len() > self.max {
                    return Err(RecvError::TooLarge {
                        len: first.len() as u64,
                        max: self.max,
                    });
                }
                // Left unreleased and read again below: the borrow that is
                // handed out must not come from a read the loop also uses.
                std::mem::forget(first);
                return match self.rx.try_read() {
                    Ok(Some(record)) => Ok(Some(Received {
                        inner: ReceivedInner::Record(record),
                    })),
                    Ok(None) => Err(RecvError::Corrupt("a read record vanished".into())),
                    Err(e) => Err(recv_error(e.into(), false)),
                };
            }
            append(&mut self.assembly, self.max, &first)?;
        }
        // The rest of a fragmented message; a timeout keeps what was read
        // for the next call.
        loop {
            let record = match self.rx.read(wait, deadline) {
                Ok(r) => r,
                Err(ReadError::TimedOut) => return Ok(None),
                Err(e) => return Err(recv_error(e, true)),
            };
            append(&mut self.assembly, self.max, &record)?;
            if record.is_last() {
                break;
            }
        }
        self.assembled = true;
        Ok(Some(Received {
            inner: ReceivedInner::Slice {
                bytes: &self.assembly,
                consumed: None,
            },
        }))
    }
}

fn append(assembly: &mut Vec<u8>, max: usize, fragment: &[u8]) -> Result<(), RecvError> {
    let len = assembly.len() + fragment.len();
    if len > max {
        return Err(RecvError::TooLarge {
            len: len as u64,
            max,
        });
    }
    assembly.extend_from_slice(fragment);
    Ok(())
}

// ----- shm -----

fn setup_error(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub(crate) fn connect_shm(
    name: &str,
    capacity: usize,
    options: &ChannelOptions,
) -> Result<Duplex, ConnectError> {
    let path = shm::socket_path(name, false)?;
    let sock = UnixStream::connect(&path)?;
    sock.set_read_timeout(Some(options.connect_timeout))?;
    sock.set_write_timeout(Some(options.connect_timeout))?;
    setup::send_blocking(&sock, setup::Packet::request(capacity as u64), None)?;
    let (reply, fd) = setup::recv_blocking(&sock)?;
    setup::check_reply(&reply).map_err(|e| ConnectError::Setup(e.to_string()))?;
    let fd = fd.ok_or_else(|| ConnectError::Setup("the listener sent no memory region".into()))?;
    let limits = Limits::default().max_capacity(shm::MAX_RING_CAPACITY);
    let region = Region::open(fd, &limits).map_err(|e| ConnectError::Setup(setup_error(e)))?;
    sock.set_read_timeout(None)?;
    sock.set_write_timeout(None)?;
    Ok(duplex(Arc::new(region), Side::Opener, Some(sock), options)?)
}

/// Accepts ring channels.
#[derive(Debug)]
pub(crate) enum RingListener {
    Shm {
        listener: UnixListener,
        path: PathBuf,
    },
    Mem(MemListener),
}

impl RingListener {
    pub(crate) fn bind_shm(name: &str) -> Result<RingListener, ConnectError> {
        let path = shm::socket_path(name, true)?;
        let listener = crate::conn::bind_unix_blocking(&path)?;
        Ok(RingListener::Shm { listener, path })
    }

    pub(crate) fn bind_mem(name: &str) -> Result<RingListener, ConnectError> {
        Ok(RingListener::Mem(MemListener::bind(name)?))
    }

    pub(crate) fn accept(&mut self, options: &ChannelOptions) -> Result<Duplex, AcceptError> {
        match self {
            RingListener::Shm { listener, .. } => {
                let (sock, _) = listener.accept()?;
                accept_shm(sock, options).map_err(AcceptError::Setup)
            }
            RingListener::Mem(l) => {
                let region = l.rx.recv().map_err(|_| {
                    AcceptError::Io(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "mem listener closed",
                    ))
                })?;
                Ok(duplex(region, Side::Creator, None, options)?)
            }
        }
    }
}

impl Drop for RingListener {
    fn drop(&mut self) {
        if let RingListener::Shm { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The listener's half of the set-up: bounded by the connect timeout.
fn accept_shm(sock: UnixStream, options: &ChannelOptions) -> Result<Duplex, String> {
    let io = |e: io::Error| e.to_string();
    sock.set_read_timeout(Some(options.connect_timeout))
        .map_err(io)?;
    sock.set_write_timeout(Some(options.connect_timeout))
        .map_err(io)?;
    let (request, _unexpected_fd) = setup::recv_blocking(&sock).map_err(io)?;
    let (reply, region) = setup::answer(&request);
    let region = match region {
        Ok(region) => region,
        Err(e) => {
            let _ = setup::send_blocking(&sock, reply, None);
            return Err(e);
        }
    };
    setup::send_blocking(&sock, reply, region.fd()).map_err(io)?;
    sock.set_read_timeout(None).map_err(io)?;
    sock.set_write_timeout(None).map_err(io)?;
    duplex(Arc::new(region), Side::Creator, Some(sock), options).map_err(io)
}

// ----- mem -----

static CHANNELS: LazyLock<Names<mpsc::SyncSender<Arc<Region>>>> = LazyLock::new(Names::new);

/// An in-process listener: connectors hand it a region they made.
#[derive(Debug)]
pub(crate) struct MemListener {
    rx: mpsc::Receiver<Arc<Region>>,
    _binding: Binding<mpsc::SyncSender<Arc<Region>>>,
}

impl MemListener {
    fn bind(name: &str) -> io::Result<MemListener> {
        let (tx, rx) = mpsc::sync_channel(64);
        let binding = CHANNELS.bind(name, tx)?;
        Ok(MemListener {
            rx,
            _binding: binding,
        })
    }
}

pub(crate) fn connect_mem(name: &str, options: &ChannelOptions) -> Result<Duplex, ConnectError> {
    let tx = CHANNELS.get(name)?;
    let region = Arc::new(
        Region::heap(&RingConfig::default()).map_err(|e| ConnectError::Setup(setup_error(e)))?,
    );
    tx.send(region.clone()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("channel listener at mem://{name} closed"),
        )
    })?;
    Ok(duplex(region, Side::Opener, None, options)?)
}
