use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::mem::{self, MemListener};
use crate::shm::{self, ShmListener};
use crate::stream::{self, ReadHalf, WriteHalf};
use crate::{Url, WaitStrategy};

/// An established byte stream on any transport.
pub struct Connection {
    /// Read half.
    pub reader: ReadHalf,
    /// Write half.
    pub writer: WriteHalf,
    /// The peer, for logs: an address, a socket path, or a mem name.
    pub peer: String,
    /// How this transport's readers wait unless told otherwise.
    pub default_wait: WaitStrategy,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Registers the connection with the reactor of the runtime this is
    /// called in, instead of the one that accepted it: for a connection
    /// served on a thread (and runtime) of its own, so that its wake-ups do
    /// not take a hop through the accepting runtime.
    pub fn reregister(self) -> io::Result<Connection> {
        let (reader, writer) = crate::stream::reregister(self.reader, self.writer)?;
        Ok(Connection {
            reader,
            writer,
            ..self
        })
    }

    /// Has the runtime's reactor watch a socket only while a task sleeps
    /// on it, for reads, or waits for room to write: for a connection whose
    /// reader spins (latency mode) on a multi-threaded runtime, where each
    /// arrival would otherwise wake an idle worker for nothing (see
    /// `on_demand.rs`). Each sleep then costs two more system calls, to
    /// register the socket and to deregister it. Must be called within the
    /// runtime the connection's tasks run on. Shared memory is returned as
    /// it is: it wakes nobody unless asked to.
    pub fn watch_on_demand(self) -> io::Result<Connection> {
        let (reader, writer) = crate::stream::on_demand(self.reader, self.writer)?;
        Ok(Connection {
            reader,
            writer,
            ..self
        })
    }

    fn tcp(s: TcpStream) -> io::Result<Self> {
        // Request/reply latency matters more than packet count.
        s.set_nodelay(true)?;
        let peer = s
            .peer_addr()
            .map_or_else(|_| "tcp:?".to_owned(), |a| format!("tcp://{a}"));
        let (reader, writer) = stream::tcp(s);
        Ok(Connection {
            reader,
            writer,
            peer,
            default_wait: WaitStrategy::PARK,
        })
    }

    fn shm(halves: (shm::ShmReader, shm::ShmWriter), peer: String) -> Self {
        let (reader, writer) = stream::shm(halves);
        Connection {
            reader,
            writer,
            peer,
            // See `Url::default_wait`.
            default_wait: WaitStrategy::default(),
        }
    }

    fn unix(s: UnixStream, peer: String) -> Self {
        let (reader, writer) = stream::unix(s);
        Connection {
            reader,
            writer,
            peer,
            default_wait: WaitStrategy::PARK,
        }
    }
}

/// Connects to `url`.
pub async fn connect(url: &Url) -> io::Result<Connection> {
    match url {
        Url::Tcp { host, port } => {
            Connection::tcp(TcpStream::connect((host.as_str(), *port)).await?)
        }
        Url::Unix(path) => Ok(Connection::unix(
            UnixStream::connect(path).await?,
            url.to_string(),
        )),
        Url::Mem(name) => Ok(Connection::unix(mem::connect(name).await?, url.to_string())),
        Url::Shm { name, ring } => {
            let halves = shm::connect(name, ring.unwrap_or(0)).await?;
            Ok(Connection::shm(halves, url.to_string()))
        }
        Url::Fifo(_) => Err(fifo_is_for_channels(url)),
    }
}

fn fifo_is_for_channels(url: &Url) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{url}: named pipes carry point-to-point channels only (tubeway::channel)"),
    )
}

/// [`bind_unix`] for blocking code.
pub(crate) fn bind_unix_blocking(
    path: &std::path::Path,
) -> io::Result<std::os::unix::net::UnixListener> {
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a live server", path.display()),
                ))
            }
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    std::os::unix::net::UnixListener::bind(path)
}

/// Binds a Unix socket at `path`, replacing a stale socket file left by a
/// dead process; a live one is an error.
pub(crate) async fn bind_unix(path: &std::path::Path) -> io::Result<UnixListener> {
    if path.exists() {
        match UnixStream::connect(path).await {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a live server", path.display()),
                ))
            }
            // Nobody listens: a stale file from a process that died.
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    UnixListener::bind(path)
}

#[derive(Debug)]
enum Inner {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
    Mem(MemListener),
    Shm(ShmListener),
}

/// Accepts connections on one address.
#[derive(Debug)]
pub struct Listener {
    inner: Inner,
    url: Url,
}

impl Listener {
    /// Binds exactly `url`: `tcp://127.0.0.1:...` is loopback only, port 0
    /// picks a free port (see [`Listener::local_url`]). A unix socket file
    /// left by a dead process is replaced; a live one is an error.
    pub async fn bind(url: &Url) -> io::Result<Listener> {
        let (inner, url) = match url {
            Url::Tcp { host, port } => {
                let l = TcpListener::bind((host.as_str(), *port)).await?;
                let local: SocketAddr = l.local_addr()?;
                let url = Url::Tcp {
                    host: host.clone(),
                    port: local.port(),
                };
                (Inner::Tcp(l), url)
            }
            Url::Unix(path) => {
                let listener = bind_unix(path).await?;
                (
                    Inner::Unix {
                        listener,
                        path: path.clone(),
                    },
                    url.clone(),
                )
            }
            Url::Mem(name) => (Inner::Mem(MemListener::bind(name)?), url.clone()),
            Url::Fifo(_) => return Err(fifo_is_for_channels(url)),
            Url::Shm { name, .. } => (
                Inner::Shm(ShmListener::bind(name).await?),
                Url::Shm {
                    name: name.clone(),
                    ring: None,
                },
            ),
        };
        Ok(Listener { inner, url })
    }

    /// The address actually bound (with the real port when 0 was asked for).
    pub fn local_url(&self) -> &Url {
        &self.url
    }

    /// Waits for the next connection.
    pub async fn accept(&mut self) -> io::Result<Connection> {
        match &mut self.inner {
            Inner::Tcp(l) => Connection::tcp(l.accept().await?.0),
            Inner::Unix { listener, path } => {
                let (s, _) = listener.accept().await?;
                Ok(Connection::unix(s, format!("unix://{}", path.display())))
            }
            Inner::Mem(l) => Ok(Connection::unix(l.accept().await?, self.url.to_string())),
            Inner::Shm(l) => Ok(Connection::shm(l.accept().await?, self.url.to_string())),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Inner::Unix { path, .. } = &self.inner {
            let _ = std::fs::remove_file(path);
        }
    }
}
