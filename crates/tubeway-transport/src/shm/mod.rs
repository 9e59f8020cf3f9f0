//! The shared-memory transport, `shm://name`.
//!
//! A connection is a memfd region holding two rings, one per direction
//! (`tubeway-ring`), set up over a Unix socket: the connector asks for a ring
//! size, the listener creates the region (sealed, so the connector can never
//! shrink it under the listener), and passes its descriptor back with
//! SCM_RIGHTS. Nothing is left in `/dev/shm` or on disk when a process dies:
//! the memory goes away with the last process that maps it. The socket then
//! serves as a doorbell for sleepers and as the hang-up detector.
//!
//! `shm://name` names a socket in a private directory of the user:
//! `$XDG_RUNTIME_DIR/tubeway/NAME.sock`, or `/tmp/tubeway-UID/NAME.sock`
//! without a runtime directory. `shm:///absolute/path.sock` names the socket
//! itself, for peers of different users.

mod bell;
pub(crate) mod setup;
mod stream;

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::AbortHandle;
use tubeway_ring::{Limits, Region, Side};

pub(crate) use stream::{reregister, ShmReader, ShmWriter};

use setup::Packet;

/// How long a connector has to complete the set-up exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections in set-up at once per listener; more wait to be accepted.
const MAX_PENDING_SETUPS: usize = 64;
/// The largest ring the listener grants per direction.
pub const MAX_RING_CAPACITY: usize = 64 << 20;

/// The socket path of `name`: an absolute path as is, a plain name in the
/// user's private directory (created if `create`).
pub(crate) fn socket_path(name: &str, create: bool) -> io::Result<PathBuf> {
    if name.starts_with('/') {
        return Ok(PathBuf::from(name));
    }
    let dir = private_dir(create)?;
    Ok(dir.join(format!("{name}.sock")))
}

fn private_dir(create: bool) -> io::Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("tubeway"),
        _ => std::env::temp_dir().join(format!("tubeway-{uid}")),
    };
    if !create {
        return Ok(dir);
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Another user could have made it first to catch our connections.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory private to this user; remove it or use shm:///absolute/path",
                dir.display()
            ),
        ));
    }
    Ok(dir)
}

/// Connects to the listener of `name`, asking for rings of `capacity`
/// bytes per direction (0: the listener's default).
pub(crate) async fn connect(name: &str, capacity: usize) -> io::Result<(ShmReader, ShmWriter)> {
    let path = socket_path(name, false)?;
    let sock = UnixStream::connect(&path).await?;
    setup::send(&sock, Packet::request(capacity as u64), None).await?;
    let (reply, fd) = setup::recv(&sock).await?;
    setup::check_reply(&reply)?;
    let fd = fd.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the listener sent no memory region",
        )
    })?;
    let limits = Limits::default().max_capacity(MAX_RING_CAPACITY);
    let region =
        Region::open(fd, &limits).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    stream::halves(sock, Arc::new(region), Side::Opener)
}

/// Accepts shared-memory connections on a Unix socket.
#[derive(Debug)]
pub(crate) struct ShmListener {
    rx: mpsc::Receiver<(ShmReader, ShmWriter)>,
    accepting: AbortHandle,
    path: PathBuf,
}

impl ShmListener {
    /// Binds the socket of `name`; a stale socket file left by a dead
    /// process is replaced, a live one is an error.
    pub(crate) async fn bind(name: &str) -> io::Result<ShmListener> {
        let path = socket_path(name, true)?;
        let listener = crate::conn::bind_unix(&path).await?;
        let (tx, rx) = mpsc::channel(MAX_PENDING_SETUPS);
        let accepting = tokio::spawn(accept_loop(listener, tx)).abort_handle();
        Ok(ShmListener {
            rx,
            accepting,
            path,
        })
    }

    /// The next connection whose set-up completed.
    pub(crate) async fn accept(&mut self) -> io::Result<(ShmReader, ShmWriter)> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "shm listener stopped"))
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        self.accepting.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Accepts sockets and runs each set-up on a task of its own, so a peer
/// that never sends its request holds up nobody.
async fn accept_loop(listener: UnixListener, tx: mpsc::Sender<(ShmReader, ShmWriter)>) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_SETUPS));
    loop {
        let Ok(permit) = pending.clone().acquire_owned().await else {
            return;
        };
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, "shm accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(SETUP_TIMEOUT, accept_setup(sock)).await {
                Ok(Ok(halves)) => {
                    let _ = tx.send(halves).await;
                }
                Ok(Err(e)) => tracing::info!(error = %e, "shm set-up failed"),
                Err(_) => tracing::info!("shm set-up timed out"),
            }
        });
    }
}

async fn accept_setup(sock: UnixStream) -> io::Result<(ShmReader, ShmWriter)> {
    // A descriptor sent by the connector is unexpected; dropping closes it.
    let (request, _fd) = setup::recv(&sock).await?;
    let (reply, region) = setup::answer(&request);
    let region = match region {
        Ok(region) => region,
        Err(e) => {
            let _ = setup::send(&sock, reply, None).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    };
    setup::send(&sock, reply, region.fd()).await?;
    stream::halves(sock, Arc::new(region), Side::Creator)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes_are_clamped_to_powers_of_two() {
        use setup::granted_capacity;
        use tubeway_ring::{DEFAULT_CAPACITY, MIN_CAPACITY};
        assert_eq!(granted_capacity(0), DEFAULT_CAPACITY);
        assert_eq!(granted_capacity(1), MIN_CAPACITY);
        assert_eq!(granted_capacity(5000), 8192);
        assert_eq!(granted_capacity(u64::MAX), MAX_RING_CAPACITY);
        assert_eq!(granted_capacity(1 << 20), 1 << 20);
    }

    #[test]
    fn names_live_in_a_private_directory() {
        let p = socket_path("svc", true).unwrap();
        assert!(p.ends_with("svc.sock"));
        let dir = p.parent().unwrap();
        let mode = std::fs::metadata(dir).unwrap().mode();
        assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", dir.display());
        assert_eq!(
            socket_path("/x/y.sock", false).unwrap(),
            PathBuf::from("/x/y.sock")
        );
    }
}
