//! One suite, run over every channel transport.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::*;

/// A fresh address of each transport; shm with small rings, so that large
/// messages go as fragments.
fn addresses(tag: &str) -> Vec<String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let id = format!("{}-{tag}-{n}", std::process::id());
    let dir = std::env::temp_dir();
    vec![
        format!("mem://ch-{id}"),
        format!("shm://ch-{id}?ring=16KiB"),
        format!("unix://{}/ch-{id}.sock", dir.display()),
        "tcp://127.0.0.1:0".to_owned(),
        format!("fifo://{}/ch-{id}", dir.display()),
    ]
}

/// A connected pair: (listener side, connector side).
fn pair(url: &str, options: &ChannelOptions) -> (Duplex, Duplex, ChannelListener) {
    let mut l = ChannelListener::bind_with(url, options.clone()).unwrap();
    let bound = l.local_url().to_string();
    let opts = options.clone();
    let connector = thread::spawn(move || connect_with(&bound, &opts).unwrap());
    let accepted = l.accept().unwrap();
    (accepted, connector.join().unwrap(), l)
}

fn each(tag: &str, options: ChannelOptions, test: impl Fn(&str, Duplex, Duplex)) {
    for url in addresses(tag) {
        let started = Instant::now();
        let (a, b, _l) = pair(&url, &options);
        test(&url, a, b);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{url}: too slow"
        );
    }
}

fn message(i: u64, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len);
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while m.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        m.push(x as u8);
    }
    m
}

#[test]
fn messages_arrive_whole_and_in_order() {
    let sizes = [0usize, 1, 7, 64, 1000, 5000, 70_000, 300_000];
    each("order", ChannelOptions::default(), |url, a, b| {
        let (mut w, _) = b.split();
        let (_, mut r) = a.split();
        let sender = thread::spawn(move || {
            for (i, len) in sizes.iter().cycle().take(200).enumerate() {
                w.send(&message(i as u64, *len)).unwrap();
            }
            w
        });
        for (i, len) in sizes.iter().cycle().take(200).enumerate() {
            let got = r.recv().unwrap();
            assert_eq!(got.len(), *len, "{url} message {i}");
            assert!(
                *got == message(i as u64, *len)[..],
                "{url} message {i} corrupt"
            );
        }
        drop(sender.join().unwrap());
        assert!(matches!(r.recv(), Err(RecvError::Closed)), "{url}");
    });
}

#[test]
fn both_directions_at_once() {
    each("duplex", ChannelOptions::default(), |url, mut a, mut b| {
        let other = thread::spawn(move || {
            for i in 0..500u64 {
                b.send(&message(i, 100)).unwrap();
                let got = b.recv().unwrap();
                assert!(*got == message(i + 1_000_000, 90)[..]);
            }
        });
        for i in 0..500u64 {
            {
                let got = a.recv().unwrap();
                assert!(*got == message(i, 100)[..], "{url}");
            }
            a.send(&message(i + 1_000_000, 90)).unwrap();
        }
        other.join().unwrap();
    });
}

#[test]
fn vectored_send_is_one_message() {
    each("vectored", ChannelOptions::default(), |url, a, mut b| {
        b.writer
            .send_vectored(&[b"head:", b"", b"body"], None)
            .unwrap();
        let (_, mut r) = a.split();
        assert_eq!(&*r.recv().unwrap(), b"head:body", "{url}");
    });
}

#[test]
fn recv_times_out_and_try_recv_does_not_wait() {
    each("timeout", ChannelOptions::default(), |url, mut a, _b| {
        let t = Instant::now();
        assert!(
            a.reader
                .recv_timeout(Duration::from_millis(30))
                .unwrap()
                .is_none(),
            "{url}"
        );
        assert!(t.elapsed() >= Duration::from_millis(30), "{url}");
        assert!(a.reader.try_recv().unwrap().is_none(), "{url}");
    });
}

/// A socket's reader sleeps in `recv` with a receive timeout of at most a
/// second: a longer wait is several such sleeps and still ends at its
/// deadline, not at the first; a message that comes meanwhile ends it.
#[test]
fn a_wait_longer_than_the_longest_receive_timeout_keeps_its_deadline() {
    for url in addresses("long-wait") {
        if !(url.starts_with("unix") || url.starts_with("tcp")) {
            continue;
        }
        let (mut a, mut b, _l) = pair(&url, &ChannelOptions::default());
        let t = Instant::now();
        let nothing = a.reader.recv_timeout(Duration::from_millis(1300)).unwrap();
        assert!(nothing.is_none(), "{url}");
        drop(nothing);
        assert!(t.elapsed() >= Duration::from_millis(1300), "{url}");
        let sender = thread::spawn(move || {
            thread::sleep(Duration::from_millis(1100));
            b.writer.send(b"late").unwrap();
            b
        });
        let got = a.reader.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(got.as_deref(), Some(&b"late"[..]), "{url}");
        drop(got);
        drop(sender.join().unwrap());
    }
}

#[test]
fn try_send_fails_fast_when_full_and_recovers() {
    each("full", ChannelOptions::default(), |url, a, b| {
        let (mut w, _r) = b.split();
        let (_w, mut r) = a.split();
        let msg = message(1, 1000);
        let t = Instant::now();
        let mut sent = 0;
        loop {
            match w.try_send(&msg) {
                Ok(()) => sent += 1,
                Err(TrySendError::Full) => break,
                Err(e) => panic!("{url}: {e}"),
            }
            assert!(sent < 100_000, "{url}: never full");
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{url}: try_send waited"
        );
        // Once the reader catches up, the writer goes on; nothing was lost.
        for i in 0..sent {
            let got = r.recv().unwrap();
            assert!(*got == msg[..], "{url} message {i}");
            if i == 0 {
                drop(got);
                w.flush(None).unwrap();
            }
        }
        w.try_send(b"after").unwrap();
        w.flush(None).unwrap();
        assert_eq!(&*r.recv().unwrap(), b"after", "{url}");
    });
}

#[test]
fn send_waits_for_room_until_its_deadline() {
    each("deadline", ChannelOptions::default(), |url, _a, b| {
        let (mut w, _r) = b.split();
        let msg = message(2, 1000);
        while w.try_send(&msg).is_ok() {}
        // A socket's buffers may still drain into the peer's: keep going
        // until the stream is truly full.
        for _ in 0..1000 {
            let t = Instant::now();
            match w.send_vectored(&[&msg], Some(Instant::now() + Duration::from_millis(40))) {
                Ok(()) => continue,
                Err(SendError::TimedOut) => {
                    assert!(t.elapsed() >= Duration::from_millis(40), "{url}");
                    return;
                }
                Err(e) => panic!("{url}: {e}"),
            }
        }
        panic!("{url}: a full channel never timed out");
    });
}

#[test]
fn a_closed_peer_is_reported_after_its_messages() {
    each("closed", ChannelOptions::default(), |url, a, mut b| {
        b.send(b"one").unwrap();
        b.send(b"two").unwrap();
        drop(b);
        let (mut w, mut r) = a.split();
        assert_eq!(&*r.recv().unwrap(), b"one", "{url}");
        assert_eq!(&*r.recv().unwrap(), b"two", "{url}");
        assert!(matches!(r.recv(), Err(RecvError::Closed)), "{url}");
        // Writing to a gone peer fails (a pipe may take a few writes to notice).
        let mut failed = false;
        for _ in 0..10_000 {
            if w.send_vectored(
                &[&[0u8; 1024]],
                Some(Instant::now() + Duration::from_millis(50)),
            )
            .is_err()
            {
                failed = true;
                break;
            }
        }
        assert!(
            failed || url.starts_with("fifo"),
            "{url}: writes to a closed peer succeed"
        );
    });
}

#[test]
fn a_sleeping_reader_wakes_when_the_peer_closes() {
    let park = ChannelOptions::default().wait(WaitStrategy::PARK);
    each("wake-close", park, |url, a, b| {
        let (_, mut r) = a.split();
        let reader = thread::spawn(move || {
            let t = Instant::now();
            let r = r.recv().map(|m| m.len());
            (r, t.elapsed())
        });
        thread::sleep(Duration::from_millis(50));
        drop(b);
        let (r, took) = reader.join().unwrap();
        assert!(matches!(r, Err(RecvError::Closed)), "{url}: {r:?}");
        assert!(took < Duration::from_secs(2), "{url}: {took:?}");
    });
}

#[test]
fn every_wait_strategy_delivers() {
    for wait in [
        WaitStrategy::BusySpin,
        WaitStrategy::SpinYield {
            spin: Duration::from_micros(20),
        },
        WaitStrategy::SpinPark {
            spin: Duration::from_micros(20),
        },
        WaitStrategy::PARK,
    ] {
        each(
            "wait",
            ChannelOptions::default().wait(wait),
            |url, mut a, mut b| {
                let echo = thread::spawn(move || {
                    for _ in 0..200 {
                        let m = b.reader.recv().unwrap().to_vec();
                        b.writer.send(&m).unwrap();
                    }
                });
                for i in 0..200u64 {
                    a.send(&message(i, 64)).unwrap();
                    assert!(*a.recv().unwrap() == message(i, 64)[..], "{url} {wait}");
                }
                echo.join().unwrap();
            },
        );
    }
}

#[test]
fn oversized_messages_are_refused_by_the_reader() {
    let small = ChannelOptions::default().max_message_size(1000);
    each("limit", small, |url, a, mut b| {
        let (_, mut r) = a.split();
        let sender = thread::spawn(move || {
            let _ = b.send(&message(3, 5000));
            b
        });
        assert!(matches!(r.recv(), Err(RecvError::TooLarge { .. })), "{url}");
        drop(r);
        drop(sender.join().unwrap());
    });
}

#[test]
fn bad_addresses_are_errors() {
    assert!(matches!(connect("nope://x"), Err(ConnectError::Url(_))));
    assert!(connect("mem://no-such-channel").is_err());
    assert!(connect("shm://no-such-channel-here").is_err());
    let dir = std::env::temp_dir();
    assert!(connect(&format!("fifo://{}/no-such-fifo", dir.display())).is_err());
}

/// Each fifo connection has pipes of its own: peers may come at once, and
/// a peer that comes right after another left (before the listener has
/// seen it go) never reads the last one's leftovers.
#[test]
fn a_fifo_listener_serves_peers_at_once_and_one_after_another() {
    let path = std::env::temp_dir().join(format!("ch-{}-many", std::process::id()));
    let url = format!("fifo://{}", path.display());
    let mut l = ChannelListener::bind(&url).unwrap();
    // A request from somebody who is not a connector, and one from a
    // connector that gave up (its pipes are gone): both skipped.
    {
        use std::io::Write;
        let mut rendezvous = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        rendezvous.write_all(&[7u8; 32]).unwrap();
        let mut gone = b"TWFIFO\x02\x00".to_vec();
        gone.extend_from_slice(b"1-999999");
        gone.resize(32, 0);
        rendezvous.write_all(&gone).unwrap();
    }
    let server = thread::spawn(move || {
        // Each accepted peer echoes on a thread of its own, leaving one
        // extra message unread behind it.
        let mut echoes = Vec::new();
        for _ in 0..12 {
            let mut d = l.accept().unwrap();
            echoes.push(thread::spawn(move || {
                while let Ok(m) = d.reader.recv() {
                    let m = m.to_vec();
                    if d.writer.send(&m).is_err() {
                        break;
                    }
                    let _ = d.writer.send(b"left behind");
                }
            }));
        }
        for e in echoes {
            e.join().unwrap();
        }
    });
    // Four at once, then eight one right after another.
    let together: Vec<_> = (0..4u64)
        .map(|i| {
            let url = url.clone();
            thread::spawn(move || {
                let mut d = connect(&url).unwrap();
                d.send(&message(i, 300)).unwrap();
                assert!(*d.recv().unwrap() == message(i, 300)[..], "peer {i}");
            })
        })
        .collect();
    for t in together {
        t.join().unwrap();
    }
    for i in 10..18u64 {
        let mut d = connect(&url).unwrap();
        d.send(&message(i, 100)).unwrap();
        assert!(*d.recv().unwrap() == message(i, 100)[..], "peer {i}");
    }
    server.join().unwrap();
    // Nothing is left in the directory but the listener's own pipe.
    let dir = std::fs::read_dir(std::env::temp_dir()).unwrap();
    let prefix = format!("ch-{}-many.", std::process::id());
    let left: Vec<_> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
