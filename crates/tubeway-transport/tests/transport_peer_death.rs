//! A peer process killed with SIGKILL — no chance to close anything — is
//! noticed at once through the hang-up of its socket, whether the survivor
//! sleeps or spins, reads or writes, and even in the middle of a message.
//!
//! The peer is this test binary run again as a child, with `TW_PEER` saying
//! what it should do (see [`peer_process`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tubeway_proto::{codec, Decoded, Message};
use tubeway_transport::channel::{self, ChannelListener, ChannelOptions, RecvError, SendError};
use tubeway_transport::{
    connect, FrameReader, FrameWriter, Listener, ReadError, Url, WaitStrategy,
};

/// How soon a death must be noticed; generous for a loaded 2-core machine,
/// far below any timeout the code under test could be hiding behind.
const PROMPT: Duration = Duration::from_secs(2);

/// The child's side: connects to `TW_PEER_URL`, acts, prints "ready", and
/// sleeps until killed. Does nothing when run as an ordinary test.
#[test]
fn peer_process() {
    let (Ok(role), Ok(url)) = (std::env::var("TW_PEER"), std::env::var("TW_PEER_URL")) else {
        return;
    };
    // Never outlive the test, even if it fails before killing us.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    match role.as_str() {
        // Three whole frames, then the first half of a fourth.
        "frames" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let conn = connect(&url.parse().unwrap()).await.unwrap();
                for i in 0..3 {
                    let f = codec::encode(&Message::plain_text(format!("m{i}")), 1 << 20).unwrap();
                    conn.writer
                        .try_write_vectored(&[std::io::IoSlice::new(&f.to_vec())])
                        .unwrap();
                }
                let f = codec::encode(&Message::binary(vec![7u8; 1000], None), 1 << 20)
                    .unwrap()
                    .to_vec();
                conn.writer
                    .try_write_vectored(&[std::io::IoSlice::new(&f[..f.len() / 2])])
                    .unwrap();
                println!("ready");
                std::future::pending::<()>().await;
            });
        }
        // A channel end that sends two messages, then a fragment of a third.
        "channel" => {
            let mut d = channel::connect(&url).unwrap();
            d.send(b"one").unwrap();
            d.send(b"two").unwrap();
            println!("ready");
            std::thread::sleep(Duration::from_secs(3600));
        }
        // A channel end that never reads: its peer's writes fill the ring.
        "silent" => {
            let _d = channel::connect(&url).unwrap();
            println!("ready");
            std::thread::sleep(Duration::from_secs(3600));
        }
        other => panic!("unknown role {other}"),
    }
}

struct Peer {
    child: Child,
    ready: std::sync::mpsc::Receiver<()>,
}

impl Peer {
    /// Starts the peer; [`Peer::wait_ready`] waits for it to be set up.
    fn start(role: &str, url: &str) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
            .env("TW_PEER", role)
            .env("TW_PEER_URL", url)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                if line.as_deref().is_ok_and(|l| l.contains("ready")) {
                    let _ = tx.send(());
                }
            }
        });
        Peer { child, ready: rx }
    }

    fn wait_ready(&self) {
        self.ready
            .recv_timeout(Duration::from_secs(20))
            .expect("the peer process got ready");
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shm_url(tag: &str) -> String {
    format!("shm://death-{tag}-{}", std::process::id())
}

/// Frames over shm: the reader gets the whole frames, then an error for the
/// cut one, at once after the kill — parked or spinning.
#[test]
fn shm_peer_killed_mid_frame() {
    for wait in [
        WaitStrategy::PARK,
        WaitStrategy::SpinPark {
            spin: Duration::from_micros(50),
        },
        WaitStrategy::BusySpin,
    ] {
        // On a thread of its own, so that a reader stuck in a loop fails the
        // test instead of hanging it.
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let noticed = rt.block_on(killed_mid_frame(wait));
            let _ = done.send(noticed);
        });
        let noticed = result
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{wait}: the reader never noticed the death"));
        assert!(noticed < PROMPT, "{wait}: noticed after {noticed:?}");
    }
}

/// Kills a peer that sent three frames and half a fourth; returns how long
/// after the kill the reader failed.
async fn killed_mid_frame(wait: WaitStrategy) -> Duration {
    let url: Url = shm_url("frames").parse().unwrap();
    let mut listener = Listener::bind(&url).await.unwrap();
    let mut peer = Peer::start("frames", &url.to_string());
    let conn = tokio::time::timeout(Duration::from_secs(20), listener.accept())
        .await
        .unwrap()
        .unwrap();
    // Its frames are in the ring once it says so.
    tokio::task::block_in_place(|| peer.wait_ready());
    // Keeps our side's writer open: only the peer's death may end the stream.
    let (_writer, _flusher) = FrameWriter::new(conn.writer);
    let mut reader = FrameReader::new(conn.reader, 1 << 20);
    reader.set_wait_strategy(wait);
    for i in 0..3 {
        match reader.next().await.unwrap() {
            Some(Decoded::Message(m)) => assert_eq!(m.text_payload().unwrap(), format!("m{i}")),
            other => panic!("{other:?}"),
        }
    }
    let read = tokio::spawn(async move {
        let r = reader.next().await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let killed = Instant::now();
    peer.kill();
    let (r, at) = read.await.unwrap();
    assert!(
        matches!(r, Err(ReadError::UnexpectedEof(_))),
        "{wait}: {r:?}"
    );
    at - killed
}

/// A channel reader blocked in `recv` (futex or spinning) gets the messages
/// sent before the death, then `Closed`.
#[test]
fn shm_channel_reader_sees_the_death() {
    for wait in [
        WaitStrategy::PARK,
        WaitStrategy::SpinPark {
            spin: Duration::from_micros(50),
        },
    ] {
        let url = shm_url("chan-read");
        let mut listener =
            ChannelListener::bind_with(&url, ChannelOptions::default().wait(wait)).unwrap();
        let mut peer = Peer::start("channel", &url);
        let mut d = listener.accept().unwrap();
        peer.wait_ready();
        assert_eq!(&*d.recv().unwrap(), b"one");
        assert_eq!(&*d.recv().unwrap(), b"two");
        let reader = std::thread::spawn(move || {
            let r = d.recv().map(|m| m.to_vec());
            (r, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(50));
        let killed = Instant::now();
        peer.kill();
        let (r, at) = reader.join().unwrap();
        assert!(matches!(r, Err(RecvError::Closed)), "{wait}: {r:?}");
        assert!(
            at - killed < PROMPT,
            "{wait}: noticed after {:?}",
            at - killed
        );
    }
}

/// A channel writer blocked on a full ring gets `Closed` once the reader's
/// process dies.
#[test]
fn shm_channel_writer_sees_the_death() {
    let url = format!("{}?ring=4KiB", shm_url("chan-write"));
    let mut listener = ChannelListener::bind(&url).unwrap();
    let mut peer = Peer::start("silent", &url);
    let d = listener.accept().unwrap();
    peer.wait_ready();
    let (mut w, _r) = d.split();
    let writer = std::thread::spawn(move || {
        let msg = [5u8; 1000];
        loop {
            if let Err(e) = w.send(&msg) {
                return (e, Instant::now());
            }
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    peer.kill();
    let (e, at) = writer.join().unwrap();
    assert!(matches!(e, SendError::Closed), "{e:?}");
    assert!(at - killed < PROMPT);
}
