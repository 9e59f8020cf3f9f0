//! The bare limits, measured from the bench's side: a std socket ping-pong
//! and streaming against a `bench-peer` child process, and memcpy. (The
//! shared-memory ping-pongs are in `shm`.)

use std::hint::black_box;
use std::io::{Read, Write};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tubeway::LargeBuffer;

use super::child::{ChildError, ChildProc};
use super::fdpass::send_with_fd;
use super::latency;
use super::modes::Exchange;
use super::runner::{Count, GRACE};
use super::socket::{Request, Stream};
use super::transport::Transport;

/// Write size of bare streaming.
pub const STREAM_CHUNK: usize = 1 << 20;

/// A `bench-peer` child process serving one transport.
#[derive(Debug)]
pub struct Peer {
    proc: ChildProc,
}

impl Peer {
    /// Starts a peer listening on a fresh address of `transport`; for shared
    /// memory, on a Unix socket that takes the ping-pongs' descriptors.
    pub fn start(transport: Transport, dir: &Path) -> Result<Peer, ChildError> {
        let listen = match transport {
            Transport::Shm => Transport::Unix.listen_url(dir, "bare-shm"),
            _ => transport.listen_url(dir, "bare"),
        };
        let cmd = ChildProc::command(&["bench-peer".into(), "--listen".into(), listen])?;
        Ok(Peer {
            proc: ChildProc::start(cmd, &format!("bare {transport} peer process"))?,
        })
    }

    /// Sends `request` with `fd` over a new Unix connection, and waits for
    /// the peer's one-byte answer that it took them.
    pub fn open_with_fd(&mut self, request: &Request, fd: BorrowedFd<'_>) -> anyhow::Result<()> {
        self.proc.check()?;
        let Stream::Unix(s) = Stream::connect(self.proc.url())? else {
            anyhow::bail!("descriptors travel over Unix sockets only");
        };
        send_with_fd(&s, &request.encode(), fd)?;
        let mut ok = [0u8; 1];
        (&s).read_exact(&mut ok)?;
        Ok(())
    }

    /// A new connection asking for `request`.
    pub fn open(&mut self, request: &Request) -> anyhow::Result<Stream> {
        self.proc.check()?;
        let mut s = Stream::connect(self.proc.url())?;
        s.write_all(&request.encode())?;
        Ok(s)
    }

    /// An error if the peer process has exited.
    pub fn check(&mut self) -> Result<(), ChildError> {
        self.proc.check()
    }

    /// Stops the peer.
    pub fn stop(self) {
        self.proc.stop();
    }
}

/// The ping-pong request matching a mode's exchanges, polling or not;
/// `None` when nothing comes back (that is bare streaming).
pub fn ping_pong_request(exchanges: &[Exchange], poll: bool) -> Option<Request> {
    if exchanges.iter().any(|e| e.down == 0) {
        return None;
    }
    Some(Request::PingPong {
        exchanges: exchanges
            .iter()
            .map(|e| (e.up as u64, e.down as u64))
            .collect(),
        poll,
    })
}

/// The CPU this thread runs on, as one byte (modulo 256): the peer puts
/// it first in each answer of a ping-pong, and the bench compares it with
/// its own when the answer comes.
pub fn cpu_byte() -> u8 {
    (rustix::thread::sched_getcpu() % 256) as u8
}

/// What a socket ping-pong measured.
#[derive(Clone, Copy, Debug)]
pub struct PingPongRun {
    /// Operations in the run's time.
    pub count: Count,
    /// The share of exchanges whose answer was sent from the CPU the bench
    /// read it on: both ends on one CPU, where a wake-up is a switch on
    /// that CPU, not a signal to another.
    pub shared_cpu: f64,
}

/// Ping-pongs on `s` for `d`: one operation is one pass through
/// `exchanges`. Records each operation's time in `hist` if given. With
/// `poll`, the socket is non-blocking and polled (latency mode's floor).
pub fn ping_pong(
    s: &mut Stream,
    exchanges: &[Exchange],
    d: Duration,
    poll: bool,
    mut hist: Option<&mut Histogram<u64>>,
) -> std::io::Result<PingPongRun> {
    // Both written, so that no page fault falls in the timed loop, and the
    // clock starts once the peer's buffers are ready too.
    let mut bufs: Vec<(LargeBuffer, LargeBuffer)> = exchanges
        .iter()
        .map(|e| {
            (
                LargeBuffer::filled(e.up, 0x5a),
                LargeBuffer::filled(e.down, 0xa5),
            )
        })
        .collect();
    let mut ready = [0u8; 1];
    s.read_exact(&mut ready)?;
    s.set_nonblocking(poll)?;
    let start = Instant::now();
    let give_up = start + d + GRACE;
    let (mut ops, mut shared) = (0u64, 0u64);
    loop {
        let t0 = Instant::now();
        for (req, answer) in &mut bufs {
            if poll {
                s.poll_write_all(black_box(req), give_up)?;
                s.poll_read_exact(answer, give_up)?;
            } else {
                s.write_all(black_box(req))?;
                s.read_exact(answer)?;
            }
            if answer.first() == Some(&cpu_byte()) {
                shared += 1;
            }
        }
        if let Some(h) = hist.as_deref_mut() {
            latency::record(h, t0.elapsed());
        }
        ops += 1;
        let t = start.elapsed();
        if t >= d {
            let exchanges = ops * bufs.len() as u64;
            return Ok(PingPongRun {
                count: Count {
                    ops,
                    secs: t.as_secs_f64(),
                },
                shared_cpu: shared as f64 / exchanges.max(1) as f64,
            });
        }
    }
}

/// Streams [`STREAM_CHUNK`]-byte writes on a sink connection for `d`, one
/// after the other through a buffer of `memory` bytes (at least a chunk);
/// the count is of bytes the peer confirms it read. With `memory` as large
/// as a message, the bytes come from memory and go to memory (the peer's
/// buffer is as large), as a message's do, not from a buffer that stays in
/// the caches.
pub fn stream(mut s: Stream, memory: usize, d: Duration) -> std::io::Result<Count> {
    let chunk = STREAM_CHUNK;
    let buf = LargeBuffer::filled(memory.max(chunk), 0x5a);
    // The peer's buffer is ready.
    s.read_exact(&mut [0u8])?;
    let start = Instant::now();
    let mut at = 0;
    while start.elapsed() < d {
        let Some(part) = buf.get(at..at + chunk) else {
            at = 0;
            continue;
        };
        s.write_all(black_box(part))?;
        at += chunk;
    }
    s.shutdown_write()?;
    let mut total = [0u8; 8];
    s.read_exact(&mut total)?;
    Ok(Count {
        ops: u64::from_le_bytes(total),
        secs: start.elapsed().as_secs_f64(),
    })
}

/// Copies a `size`-byte buffer into another for `d`; counts bytes copied.
pub fn memcpy(size: usize, d: Duration) -> Count {
    let src = LargeBuffer::filled(size.max(1), 0x5a);
    // Filled, not zeroed: a zeroed allocation is only mapped, and its pages
    // would be faulted in by the first copies, on the clock.
    let mut dst = LargeBuffer::filled(size.max(1), 0xa5);
    let start = Instant::now();
    let mut bytes = 0u64;
    loop {
        // Batches keep the clock out of small copies.
        let batch = (1 << 20) / size.max(1) + 1;
        for _ in 0..batch {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        }
        bytes += (batch * size) as u64;
        let t = start.elapsed();
        if t >= d {
            return Count {
                ops: bytes,
                secs: t.as_secs_f64(),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_follow_the_exchanges() {
        let x = [Exchange { up: 100, down: 59 }];
        assert_eq!(
            ping_pong_request(&x, true),
            Some(Request::PingPong {
                exchanges: vec![(100, 59)],
                poll: true
            })
        );
        let oneway = [Exchange { up: 100, down: 0 }];
        assert_eq!(ping_pong_request(&oneway, false), None);
    }

    #[test]
    fn memcpy_counts_bytes() {
        let c = memcpy(4096, Duration::from_millis(5));
        assert!(c.ops > 0 && c.ops.is_multiple_of(4096), "{c:?}");
    }
}
