//! In-process transport: a registry of named listeners handing out duplex pipes.

use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, OnceLock};

use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// Bytes buffered in each direction of an in-process pipe.
const PIPE_CAPACITY: usize = 1 << 20;

type Registry = Mutex<HashMap<String, mpsc::Sender<DuplexStream>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<String, mpsc::Sender<DuplexStream>>> {
    registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
pub(crate) struct MemListener {
    name: String,
    rx: mpsc::Receiver<DuplexStream>,
    // Identifies this listener's registry entry, so dropping it never removes a successor's.
    tx: mpsc::Sender<DuplexStream>,
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

    pub(crate) async fn accept(&mut self) -> io::Result<DuplexStream> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "mem listener closed"))
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

pub(crate) async fn connect(name: &str) -> io::Result<DuplexStream> {
    let tx = lock().get(name).cloned().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("no listener at mem://{name}"),
        )
    })?;
    let (ours, theirs) = tokio::io::duplex(PIPE_CAPACITY);
    tx.send(theirs).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("listener at mem://{name} closed"),
        )
    })?;
    Ok(ours)
}
