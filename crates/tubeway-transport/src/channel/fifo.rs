//! Channels over named pipes.
//!
//! A listener owns one pipe at `PATH`, where connectors ask for a channel.
//! A connector makes a fresh pair of pipes, `PATH.<id>.up` (its messages to
//! the listener) and `PATH.<id>.down` (the listener's to it), and writes a
//! request naming them into `PATH`; the listener opens its ends and writes
//! a greeting on `.down`, and the names are removed as soon as both sides
//! hold their ends (the open pipes live on).
//!
//! Pipes of its own per connection are what make a session clean: a pipe
//! shared between sessions carries what the last one left unread into the
//! next, and its ends may be held by the next connector before the last
//! session has seen its peer go, which then reads the wrong peer's bytes.
//! A request is shorter than `PIPE_BUF`, so requests from many connectors
//! at once arrive whole, and a listener serves any number of peers.
//!
//! A peer that dies closes its pipe ends, which the other side reads as end
//! of stream (or `EPIPE` when writing).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::fs::{FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::stream;
use super::{AcceptError, ChannelOptions, ConnectError, Duplex};
use crate::wait::poll_until;

/// What a request starts with; then the connection's id, zero-padded.
const REQUEST_MAGIC: [u8; 8] = *b"TWFIFO\x02\x00";
const ID_LEN: usize = 24;
const REQUEST_LEN: usize = REQUEST_MAGIC.len() + ID_LEN;

/// What a listener writes first on `.down`, once both its ends are open.
const GREETING: [u8; 8] = *b"\xffTWFIFO\x01";

/// What a connector writes first on `.up`, once it holds it open.
const ACK: u8 = 0x06;

/// How often a connector retries a request into a full rendezvous pipe.
const RETRY: Duration = Duration::from_millis(1);

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

fn mkfifo(path: &Path) -> rustix::io::Result<()> {
    rustix::fs::mknodat(CWD, path, FileType::Fifo, Mode::RUSR | Mode::WUSR, 0)
}

fn is_fifo(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_fifo())
}

/// The names of one connection's pair of pipes.
struct Pair {
    up: PathBuf,
    down: PathBuf,
}

/// Removes a connector's pipes however its set-up ends: once it holds both
/// ends, the names are no longer needed.
struct RemoveOnDrop(Pair);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0.up);
        let _ = std::fs::remove_file(&self.0.down);
    }
}

fn pair_paths(path: &Path, id: &str) -> Pair {
    Pair {
        up: with_suffix(path, &format!(".{id}.up")),
        down: with_suffix(path, &format!(".{id}.down")),
    }
}

/// A name no other live connection in this directory has: a process id is
/// unique while the process lives, and the counter within it.
fn fresh_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn connect(path: &Path, options: &ChannelOptions) -> Result<Duplex, ConnectError> {
    let refused = || {
        ConnectError::from(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("no channel listener on fifo://{}", path.display()),
        ))
    };
    if !is_fifo(path) {
        return Err(refused());
    }
    let deadline = Instant::now() + options.connect_timeout;
    let id = fresh_id();
    let pair = RemoveOnDrop(pair_paths(path, &id));
    mkfifo(&pair.0.up).map_err(io::Error::from)?;
    mkfifo(&pair.0.down).map_err(io::Error::from)?;
    // Open for reading first: the listener's write end then opens at once.
    let down = open(&pair.0.down, OFlags::RDONLY).map_err(io::Error::from)?;

    // Fails with ENXIO unless a listener holds the rendezvous pipe open.
    let rendezvous = match open(path, OFlags::WRONLY) {
        Ok(fd) => fd,
        Err(Errno::NXIO) => return Err(refused()),
        Err(e) => return Err(io::Error::from(e).into()),
    };
    let mut request = [0u8; REQUEST_LEN];
    let (magic, rest) = request.split_at_mut(REQUEST_MAGIC.len());
    magic.copy_from_slice(&REQUEST_MAGIC);
    let id_bytes = id.as_bytes();
    let id_field = rest
        .get_mut(..id_bytes.len())
        .ok_or_else(|| ConnectError::Setup("connection id too long".into()))?;
    id_field.copy_from_slice(id_bytes);
    loop {
        // Shorter than PIPE_BUF: written whole or not at all.
        match rustix::io::write(&rendezvous, &request) {
            Ok(_) => break,
            Err(Errno::AGAIN | Errno::INTR) if Instant::now() < deadline => {
                std::thread::sleep(RETRY)
            }
            Err(Errno::AGAIN) => return Err(ConnectError::TimedOut(options.connect_timeout)),
            Err(Errno::PIPE) => return Err(refused()),
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
    drop(rendezvous);

    // The listener opens `.up` for reading before it greets.
    let mut greeting = [0u8; GREETING.len()];
    let mut got = 0;
    while got < GREETING.len() {
        if !poll_until(&down, PollFlags::IN, Some(deadline))? {
            return Err(ConnectError::TimedOut(options.connect_timeout));
        }
        let rest = greeting.get_mut(got..).unwrap_or_default();
        match rustix::io::read(&down, rest) {
            Ok(0) => return Err(refused()),
            Ok(n) => got += n,
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
    if greeting != GREETING {
        return Err(ConnectError::Setup("not a tubeway fifo listener".into()));
    }
    let up = open(&pair.0.up, OFlags::WRONLY).map_err(io::Error::from)?;
    drop(pair);
    // Until a writer has opened `.up`, the listener would read it as ended.
    match rustix::io::write(&up, &[ACK]) {
        Ok(1) => {}
        Ok(_) => return Err(refused()),
        Err(e) => return Err(io::Error::from(e).into()),
    }
    Ok(stream::duplex(
        Arc::new(down),
        Arc::new(up),
        stream::Kind::Pipes,
        options,
    ))
}

/// Owns the rendezvous pipe; removes it when dropped.
#[derive(Debug)]
pub(crate) struct FifoListener {
    path: PathBuf,
    /// Open for reading and writing, so that it never reads as ended while
    /// no connector has it open, and connectors can always open it.
    rendezvous: OwnedFd,
}

impl FifoListener {
    pub(crate) fn bind(path: &Path) -> Result<FifoListener, ConnectError> {
        match mkfifo(path) {
            Ok(()) => {}
            // A pipe left by an earlier listener is reused; anything else is in the way.
            Err(Errno::EXIST) if is_fifo(path) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        let rendezvous = open(path, OFlags::RDWR).map_err(io::Error::from)?;
        // Requests left by connectors that came to an earlier listener and
        // gave up long ago.
        let mut scrap = [0u8; 4096];
        while matches!(rustix::io::read(&rendezvous, &mut scrap), Ok(1..)) {}
        Ok(FifoListener {
            path: path.to_owned(),
            rendezvous,
        })
    }

    pub(crate) fn accept(&mut self, options: &ChannelOptions) -> Result<Duplex, AcceptError> {
        loop {
            let Some(id) = self.next_request()? else {
                continue;
            };
            let pair = pair_paths(&self.path, &id);
            // A connector that gave up has removed its pipes: the next one.
            let Ok(up) = open(&pair.up, OFlags::RDONLY) else {
                continue;
            };
            let Ok(down) = open(&pair.down, OFlags::WRONLY) else {
                continue;
            };
            // The connector has `.down` open already; it opens `.up` after
            // the greeting and then removes that name itself.
            let _ = std::fs::remove_file(&pair.down);
            if rustix::io::write(&down, &GREETING).is_err() {
                continue; // The connector left after all.
            }
            // Its acknowledgement says it holds `.up` open for writing.
            let deadline = Instant::now() + options.connect_timeout;
            let mut ack = [0u8; 1];
            loop {
                if !poll_until(&up, PollFlags::IN, Some(deadline))? {
                    break;
                }
                match rustix::io::read(&up, &mut ack) {
                    Ok(1) if ack == [ACK] => {
                        return Ok(stream::duplex(
                            Arc::new(up),
                            Arc::new(down),
                            stream::Kind::Pipes,
                            options,
                        ))
                    }
                    Err(Errno::AGAIN | Errno::INTR) => {}
                    _ => break,
                }
            }
        }
    }

    /// Waits for the next request; `None` for one that is not well formed.
    fn next_request(&mut self) -> Result<Option<String>, AcceptError> {
        let mut request = [0u8; REQUEST_LEN];
        loop {
            poll_until(&self.rendezvous, PollFlags::IN, None)?;
            match rustix::io::read(self.rendezvous.as_fd(), &mut request) {
                Ok(REQUEST_LEN) => break,
                // Requests arrive whole; anything else is not a connector.
                Ok(_) => return Ok(None),
                Err(Errno::AGAIN | Errno::INTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        let (magic, id) = request.split_at(REQUEST_MAGIC.len());
        if magic != REQUEST_MAGIC {
            return Ok(None);
        }
        let id = id.split(|&b| b == 0).next().unwrap_or_default();
        // Only digits and a dash: never a path of somebody else's choosing.
        if id.is_empty() || !id.iter().all(|b| b.is_ascii_digit() || *b == b'-') {
            return Ok(None);
        }
        Ok(std::str::from_utf8(id).ok().map(str::to_owned))
    }
}

impl Drop for FifoListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
