use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::mem::{self, MemListener};
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
    }
}

#[derive(Debug)]
enum Inner {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
    Mem(MemListener),
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
                let listener = UnixListener::bind(path)?;
                (
                    Inner::Unix {
                        listener,
                        path: path.clone(),
                    },
                    url.clone(),
                )
            }
            Url::Mem(name) => (Inner::Mem(MemListener::bind(name)?), url.clone()),
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
