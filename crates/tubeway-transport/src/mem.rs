//! In-process transport: a registry of named listeners handing out
//! connected socket pairs, so `mem://` behaves exactly like the other
//! stream transports without a file or a port.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// In-process names: what a `mem://` listener leaves for its connectors to
/// find (here and in the channels).
#[derive(Debug)]
pub(crate) struct Names<T> {
    map: Mutex<HashMap<String, (u64, T)>>,
    next: AtomicU64,
}

/// A name bound in a [`Names`]; released when dropped.
#[derive(Debug)]
pub(crate) struct Binding<T: 'static> {
    names: &'static Names<T>,
    name: String,
    /// Which binding of the name this is, so that dropping it never removes
    /// a successor's.
    token: u64,
}

impl<T> Names<T> {
    pub(crate) fn new() -> Names<T> {
        Names {
            map: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }
}

impl<T: Clone> Names<T> {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, (u64, T)>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Binds `name` to `value`; an error if it is taken.
    pub(crate) fn bind(&'static self, name: &str, value: T) -> io::Result<Binding<T>> {
        let mut map = self.lock();
        if map.contains_key(name) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("mem://{name} is already bound"),
            ));
        }
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        map.insert(name.to_owned(), (token, value));
        Ok(Binding {
            names: self,
            name: name.to_owned(),
            token,
        })
    }

    /// What `name` is bound to; `ConnectionRefused` if nothing.
    pub(crate) fn get(&self, name: &str) -> io::Result<T> {
        self.lock()
            .get(name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("no listener at mem://{name}"),
                )
            })
    }
}

impl<T> Drop for Binding<T> {
    fn drop(&mut self) {
        let mut map = self
            .names
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.get(&self.name).is_some_and(|(t, _)| *t == self.token) {
            map.remove(&self.name);
        }
    }
}

static LISTENERS: LazyLock<Names<mpsc::Sender<StdUnixStream>>> = LazyLock::new(Names::new);

#[derive(Debug)]
pub(crate) struct MemListener {
    rx: mpsc::Receiver<StdUnixStream>,
    _binding: Binding<mpsc::Sender<StdUnixStream>>,
}

impl MemListener {
    pub(crate) fn bind(name: &str) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel(128);
        let binding = LISTENERS.bind(name, tx)?;
        Ok(MemListener {
            rx,
            _binding: binding,
        })
    }

    pub(crate) async fn accept(&mut self) -> io::Result<UnixStream> {
        let s = self
            .rx
            .recv()
            .await
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "mem listener closed"))?;
        // Registered with the accepting runtime's reactor, not the connector's.
        UnixStream::from_std(s)
    }
}

pub(crate) async fn connect(name: &str) -> io::Result<UnixStream> {
    let tx = LISTENERS.get(name)?;
    let (ours, theirs) = StdUnixStream::pair()?;
    ours.set_nonblocking(true)?;
    theirs.set_nonblocking(true)?;
    tx.send(theirs).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("listener at mem://{name} closed"),
        )
    })?;
    UnixStream::from_std(ours)
}
