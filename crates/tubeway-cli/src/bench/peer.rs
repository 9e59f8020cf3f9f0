//! `tubeway bench-peer`: the far end of the bare socket limits, in a child
//! process of its own, with std sockets and nothing else.
//!
//! It prints `listening on URL`, then serves each connection on a thread:
//! a ping-pong (read a request's bytes, write the answer's) or a sink (read
//! to the end, then write the byte count). It exits when its stdin closes,
//! that is, when the bench ends.

use std::io::{self, Read, Write};

use super::args::PeerArgs;
use super::socket::{Listener, Request, Stream};

/// Runs the peer until stdin closes.
pub fn run(args: &PeerArgs) -> anyhow::Result<()> {
    let listener = Listener::bind(&args.listen)
        .map_err(|e| anyhow::anyhow!("bench-peer: cannot listen on {}: {e}", args.listen))?;
    println!("listening on {}", listener.url()?);
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    loop {
        let stream = listener.accept()?;
        std::thread::spawn(move || {
            // A failed connection only ends that connection; the bench sees it.
            let _ = serve(stream);
        });
    }
}

fn serve(mut s: Stream) -> io::Result<()> {
    match Request::read(&mut s)? {
        Request::Sink => {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                match s.read(&mut buf)? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            s.write_all(&total.to_le_bytes())
        }
        Request::PingPong(exchanges) => {
            let len = |n: u64| usize::try_from(n).map_err(io::Error::other);
            let largest = exchanges.iter().map(|&(up, _)| up).max().unwrap_or(0);
            let mut request = vec![0u8; len(largest)?];
            let answers = exchanges
                .iter()
                .map(|&(up, down)| Ok((len(up)?, vec![0x41u8; len(down)?])))
                .collect::<io::Result<Vec<_>>>()?;
            loop {
                for (up, answer) in &answers {
                    let buf = request.get_mut(..*up).unwrap_or_default();
                    match s.read_exact(buf) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e),
                    }
                    s.write_all(answer)?;
                }
            }
        }
    }
}
