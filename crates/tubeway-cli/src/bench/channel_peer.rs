//! The far end of `--mode channel`: a channel listener that echoes every
//! message of every channel it accepts. It runs in a `bench-peer --channel`
//! child process, or, for `mem://` (which exists only inside one process),
//! on a thread of the bench.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tubeway::channel::{self, ChannelListener, ChannelOptions, Duplex, RecvError, SendError};

use super::args::PeerArgs;
use super::child::{ChildError, ChildProc};
use super::memory::Proc;
use super::transport::Transport;
use super::wait::Wait;

/// Echoes every message of `duplex` until its peer closes: each message is
/// read in place and written straight back.
pub fn serve_echo(duplex: Duplex) -> anyhow::Result<()> {
    let (mut writer, mut reader) = duplex.split();
    loop {
        let message = match reader.recv() {
            Ok(m) => m,
            Err(RecvError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        match writer.send(&message) {
            Ok(()) => {}
            Err(SendError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Accepts channels until `stop` is set, each echoed on a thread of its own.
fn accept_loop(mut listener: ChannelListener, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let Ok(duplex) = listener.accept() else {
            // Out of descriptors, say: try again, without spinning.
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        };
        if stop.load(Ordering::Acquire) {
            return;
        }
        // A failed channel only ends that channel; the bench sees it.
        let _ = std::thread::Builder::new()
            .name("tubeway-bench-echo".into())
            .spawn(move || serve_echo(duplex));
    }
}

fn options(wait: Option<tubeway::WaitStrategy>, max_message_size: usize) -> ChannelOptions {
    let options = ChannelOptions::default().max_message_size(max_message_size);
    match wait {
        Some(w) => options.wait(w),
        None => options,
    }
}

/// `bench-peer --channel`: listens, says where, echoes until the process ends.
pub fn run(args: &PeerArgs) -> anyhow::Result<()> {
    let listener =
        ChannelListener::bind_with(&args.listen, options(args.wait, args.max_message_size))
            .map_err(|e| anyhow::anyhow!("bench-peer: cannot listen on {}: {e}", args.listen))?;
    println!("listening on {}", listener.local_url());
    accept_loop(listener, &AtomicBool::new(false));
    Ok(())
}

/// The echoing peer of one transport's channel figures.
#[derive(Debug)]
pub struct ChannelPeer {
    url: String,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Child(ChildProc),
    Thread {
        stop: Arc<AtomicBool>,
        handle: JoinHandle<()>,
    },
}

impl ChannelPeer {
    /// Starts a peer for `transport` whose channel ends wait by `wait` and
    /// take messages up to `max_message_size` bytes.
    pub fn start(
        transport: Transport,
        dir: &Path,
        wait: Wait,
        max_message_size: usize,
    ) -> anyhow::Result<ChannelPeer> {
        let listen = transport.listen_url(dir, "channel");
        if transport.in_process() {
            let listener =
                ChannelListener::bind_with(&listen, options(wait.strategy(), max_message_size))?;
            let url = listener.local_url().to_string();
            let stop = Arc::new(AtomicBool::new(false));
            let until = stop.clone();
            let handle = std::thread::Builder::new()
                .name("tubeway-bench-channels".into())
                .spawn(move || accept_loop(listener, &until))?;
            return Ok(ChannelPeer {
                url,
                kind: Kind::Thread { stop, handle },
            });
        }
        let mut args = vec![
            "bench-peer".to_owned(),
            "--channel".to_owned(),
            "--listen".to_owned(),
            listen,
            "--max-message-size".to_owned(),
            max_message_size.to_string(),
        ];
        if let Some(w) = wait.strategy() {
            args.extend(["--wait".to_owned(), w.to_string()]);
        }
        let proc = ChildProc::start(
            ChildProc::command(&args)?,
            &format!("{transport} channel peer process"),
        )?;
        Ok(ChannelPeer {
            url: proc.url().to_owned(),
            kind: Kind::Child(proc),
        })
    }

    /// Its address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where it runs, for the report.
    pub fn description(&self) -> String {
        match &self.kind {
            Kind::Child(c) => format!(
                "echoes every message; {}",
                c.describe("tubeway bench-peer --channel")
            ),
            Kind::Thread { .. } => "echoes every message; a thread of the bench process".to_owned(),
        }
    }

    /// Its process, when it is a child of ours.
    pub fn proc(&self) -> Option<Proc> {
        match &self.kind {
            Kind::Child(c) => Some(Proc::Pid(c.pid())),
            Kind::Thread { .. } => None,
        }
    }

    /// An error if the peer process has exited.
    pub fn check(&mut self) -> Result<(), ChildError> {
        match &mut self.kind {
            Kind::Child(c) => c.check(),
            Kind::Thread { .. } => Ok(()),
        }
    }

    /// Stops the peer.
    pub fn stop(self) {
        match self.kind {
            Kind::Child(c) => c.stop(),
            Kind::Thread { stop, handle } => {
                stop.store(true, Ordering::Release);
                // One more connection wakes the accept, which then sees the flag.
                if channel::connect(&self.url).is_ok() {
                    let _ = handle.join();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_in_process_peer_echoes_and_stops() {
        let dir = std::env::temp_dir();
        let peer = ChannelPeer::start(Transport::Mem, &dir, Wait::DEFAULT, 1 << 20).unwrap();
        let mut d = channel::connect(peer.url()).unwrap();
        for msg in [&b"hello"[..], &[7u8; 100_000][..], b""] {
            d.send(msg).unwrap();
            assert_eq!(&*d.recv().unwrap(), msg);
        }
        drop(d);
        peer.stop();
    }
}
