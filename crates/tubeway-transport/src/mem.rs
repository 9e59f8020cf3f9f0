//! In-process transport: a registry of named listeners handing out
//! connected socket pairs, so `mem://` behaves exactly like the other
//! stream transports without a file or a port.

use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, OnceLock};

use std::os::unix::net::UnixStream as StdUnixStream;

use tokio::net::UnixStream;
use tokio::sync::mpsc;

type Registry = Mutex<HashMap<String, mpsc::Sender<StdUnixStream>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<String, mpsc::Sender<StdUnixStream>>> {
    registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
pub(crate) struct MemListener {
    name: String,
    rx: mpsc::Receiver<StdUnixStream>,
    // Identifies this listener's registry entry, so dropping it never removes a successor's.
    tx: mpsc::Sender<StdUnixStream>,
}

impl MemListener {
    pub(crate) fn bind(name: &str) -> io::Result<Self> {
        let mut reg = lock();
        if reg.contains_key(name) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("mem://{name} is already bound"),
            ));
        }
        let (tx, rx) = mpsc::channel(128);
        reg.insert(name.to_owned(), tx.clone());
        Ok(MemListener {
            name: name.to_owned(),
            rx,
            tx,
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

impl Drop for MemListener {
    fn drop(&mut self) {
        let mut reg = lock();
        if reg
            .get(&self.name)
            .is_some_and(|tx| tx.same_channel(&self.tx))
        {
            reg.remove(&self.name);
        }
    }
}

pub(crate) async fn connect(name: &str) -> io::Result<UnixStream> {
    let tx = lock().get(name).cloned().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("no listener at mem://{name}"),
        )
    })?;
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
