//! `tubeway bench-peer`: the far end of the bare limits, or of the
//! channels of `--mode channel`, in a child process of its own.
//!
//! It prints `listening on URL`, then serves each connection on a thread.
//! For the bare limits (std sockets and nothing else): a socket ping-pong
//! (read a request's bytes, write the answer's; blocking, or polling a
//! non-blocking socket), a sink (read to the end, then write the byte
//! count), or the echo of a shared-memory ping-pong whose memfd comes with
//! the request. With `--channel`: a channel listener that echoes every
//! message. It exits when its stdin closes, that is, when the bench ends.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use tubeway::LargeBuffer;
use tubeway_ring::PingPong;

use super::args::PeerArgs;
use super::bare;
use super::channel_peer;
use super::fdpass::recv_with_fd;
use super::runner::GRACE;
use super::shm;
use super::socket::{Listener, Request, Stream, HEAD};

/// Runs the peer until stdin closes.
pub fn run(args: &PeerArgs) -> anyhow::Result<()> {
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    if args.channel {
        return channel_peer::run(args);
    }
    let listener = Listener::bind(&args.listen)
        .map_err(|e| anyhow::anyhow!("bench-peer: cannot listen on {}: {e}", args.listen))?;
    println!("listening on {}", listener.url()?);
    loop {
        let stream = listener.accept()?;
        std::thread::spawn(move || {
            // A failed connection only ends that connection; the bench sees it.
            let _ = serve(stream);
        });
    }
}

fn serve(mut s: Stream) -> io::Result<()> {
    // On a Unix socket a descriptor may come with the head.
    let mut head = [0u8; HEAD];
    let fd = match s.unix() {
        Some(unix) => recv_with_fd(unix, &mut head)?,
        None => {
            s.read_exact(&mut head)?;
            None
        }
    };
    match Request::read_rest(head, &mut s)? {
        Request::Sink { buffer } => {
            // Filled, so that every page is faulted in before the writer
            // starts its clock.
            let mut buf = LargeBuffer::filled(buffer as usize, 1);
            s.write_all(&[1])?;
            let (mut total, mut at) = (0u64, 0usize);
            loop {
                let rest = buf.get_mut(at..).unwrap_or_default();
                match s.read(rest)? {
                    0 => break,
                    n => {
                        total += n as u64;
                        at = if at + n >= buffer as usize { 0 } else { at + n };
                    }
                }
            }
            // Given back before the count goes, so that whatever the bench
            // measures next does not meet the unmapping of a large buffer.
            drop(buf);
            s.write_all(&total.to_le_bytes())
        }
        Request::ShmPingPong { secs } => {
            let fd = fd.ok_or_else(|| io::Error::other("no memfd came with the request"))?;
            let pp = PingPong::open(fd).map_err(io::Error::other)?;
            s.write_all(&[1])?;
            let give_up = Instant::now() + Duration::from_secs(secs.into());
            shm::echo(&pp, give_up).map_err(io::Error::other)
        }
        Request::PingPong { exchanges, poll } => {
            let len = |n: u64| usize::try_from(n).map_err(io::Error::other);
            let largest = exchanges.iter().map(|&(up, _)| up).max().unwrap_or(0);
            // Written, so every page is in place before the clock starts: a
            // bare limit has no page faults in it (a zeroed allocation would
            // fault them in during the first exchanges).
            let mut request = LargeBuffer::filled(len(largest)?, 0xa5);
            let mut answers = exchanges
                .iter()
                .map(|&(up, down)| Ok((len(up)?, LargeBuffer::filled(len(down)?, 0x41))))
                .collect::<io::Result<Vec<_>>>()?;
            s.write_all(&[1])?;
            s.set_nonblocking(poll)?;
            loop {
                for (up, answer) in &mut answers {
                    let buf = request.get_mut(..*up).unwrap_or_default();
                    let read = if poll {
                        // Polls for as long as a bench run may last.
                        s.poll_read_exact(buf, Instant::now() + GRACE)
                    } else {
                        s.read_exact(buf)
                    };
                    match read {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e),
                    }
                    // Where this end ran, for the bench to compare with
                    // where it runs when the answer comes.
                    if let Some(first) = answer.first_mut() {
                        *first = bare::cpu_byte();
                    }
                    if poll {
                        s.poll_write_all(answer, Instant::now() + GRACE)?;
                    } else {
                        s.write_all(answer)?;
                    }
                }
            }
        }
    }
}
