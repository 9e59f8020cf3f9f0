//! Channels over a pair of named pipes: `PATH.up` carries the connector's
//! messages to the listener, `PATH.down` the listener's to the connector.
//!
//! A pipe has no connections, so a listener serves one peer at a time: the
//! next [`accept`](super::ChannelListener::accept) waits for the next peer
//! once the last one has gone. A peer that dies closes its pipe ends, which
//! the other side reads as end of stream (or `EPIPE` when writing).

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags, CWD};
use rustix::io::Errno;

use super::{stream, AcceptError, ChannelOptions, ConnectError, Duplex};

/// How often a listener retries opening the connector's pipe for writing.
const OPEN_RETRY: Duration = Duration::from_millis(2);

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn open(path: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        flags | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn io_err(e: Errno) -> io::Error {
    e.into()
}

pub(crate) fn connect(path: &Path, options: &ChannelOptions) -> Result<Duplex, ConnectError> {
    // Fails with ENXIO unless a listener holds `.up` open for reading. Opened
    // first, so that the listener, which waits for `.down` to have a reader,
    // never reads `.up` before it has a writer (it would read end of stream).
    let up = match open(&with_suffix(path, ".up"), OFlags::WRONLY) {
        Ok(fd) => fd,
        Err(Errno::NXIO) => {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("no channel listener on fifo://{}", path.display()),
            )
            .into())
        }
        Err(e) => return Err(io::Error::from(e).into()),
    };
    let down = open(&with_suffix(path, ".down"), OFlags::RDONLY).map_err(io_err)?;
    // A pipe without a writer reads as ended: wait for the listener's
    // greeting, which says its end is open, before anything is read.
    let deadline = Instant::now() + options.connect_timeout;
    let mut greeting = [0u8; 1];
    loop {
        match rustix::io::read(&down, &mut greeting) {
            Ok(1) if greeting == [GREETING] => break,
            Ok(1) => return Err(ConnectError::Setup("not a tubeway fifo listener".into())),
            Ok(_) | Err(Errno::AGAIN | Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        if Instant::now() >= deadline {
            return Err(ConnectError::TimedOut(options.connect_timeout));
        }
        std::thread::sleep(OPEN_RETRY);
    }
    Ok(stream::duplex(Arc::new(down), Arc::new(up), options))
}

/// The byte a listener writes first, once its end of `.down` is open.
const GREETING: u8 = 0x01;

/// Owns the two pipes; removes them when dropped.
#[derive(Debug)]
pub(crate) struct FifoListener {
    path: PathBuf,
    /// `.up` held open for reading, so connectors can open it for writing
    /// whenever they come.
    _up: OwnedFd,
}

impl FifoListener {
    pub(crate) fn bind(path: &Path) -> Result<FifoListener, ConnectError> {
        for suffix in [".up", ".down"] {
            let p = with_suffix(path, suffix);
            match rustix::fs::mknodat(
                CWD,
                &p,
                rustix::fs::FileType::Fifo,
                Mode::RUSR | Mode::WUSR,
                0,
            ) {
                Ok(()) => {}
                // A pipe left by an earlier listener is reused; anything else is in the way.
                Err(Errno::EXIST) if is_fifo(&p) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        let up = open(&with_suffix(path, ".up"), OFlags::RDONLY).map_err(io_err)?;
        Ok(FifoListener {
            path: path.to_owned(),
            _up: up,
        })
    }

    pub(crate) fn accept(&mut self, options: &ChannelOptions) -> Result<Duplex, AcceptError> {
        let down_path = with_suffix(&self.path, ".down");
        // Opening `.down` for writing succeeds once a connector reads it.
        let started = Instant::now();
        let down = loop {
            match open(&down_path, OFlags::WRONLY) {
                Ok(fd) => break fd,
                Err(Errno::NXIO) => std::thread::sleep(
                    OPEN_RETRY.min(started.elapsed() / 10 + Duration::from_micros(100)),
                ),
                Err(e) => return Err(io::Error::from(e).into()),
            }
        };
        // The connector has `.up` open for writing by now, and waits for this.
        let up = open(&with_suffix(&self.path, ".up"), OFlags::RDONLY).map_err(io_err)?;
        rustix::io::write(&down, &[GREETING]).map_err(io_err)?;
        Ok(stream::duplex(Arc::new(up), Arc::new(down), options))
    }
}

fn is_fifo(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_fifo())
}

impl Drop for FifoListener {
    fn drop(&mut self) {
        for suffix in [".up", ".down"] {
            let _ = std::fs::remove_file(with_suffix(&self.path, suffix));
        }
    }
}
