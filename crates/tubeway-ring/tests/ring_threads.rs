//! A writer and a reader on two threads, with every wait strategy; parked
//! ends are woken, by data, by space, by a close and by a dead peer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tubeway_ring::{
    Consumer, Doorbell, Producer, ReadError, Region, RingConfig, Side, Sleeper, TryWriteError,
    WaitStrategy, WriteMessageError,
};

/// How long a woken end may take to report back: far beyond any wake-up,
/// only there so that a lost one fails the test instead of hanging it.
const BOUND: Duration = Duration::from_secs(20);

/// Ring 0's producer (the creator's) and consumer (the opener's), with the
/// ends of ring 1 kept open (the ends keep the region alive).
struct Pair {
    tx: Producer,
    rx: Consumer,
    _back: (Producer, Consumer),
}

fn pair(capacity: usize) -> Pair {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(capacity)).unwrap());
    let (tx, back_rx) = region.ends(Side::Creator).unwrap();
    let (back_tx, rx) = region.ends(Side::Opener).unwrap();
    Pair {
        tx,
        rx,
        _back: (back_tx, back_rx),
    }
}

/// Waits, without sleeping, until `sleeping` reports a futex sleeper.
fn until_parked(sleeping: impl Fn() -> Option<Sleeper>) {
    let deadline = Instant::now() + BOUND;
    while sleeping() != Some(Sleeper::Futex) {
        assert!(Instant::now() < deadline, "the end never parked");
        thread::yield_now();
    }
}

fn stream(strategy: WaitStrategy, messages: u64) {
    let mut p = pair(64 * 1024);
    thread::scope(|s| {
        let tx = &mut p.tx;
        s.spawn(move || common::write_stream(tx, 7, messages, &strategy));
        common::read_stream(&mut p.rx, 7, messages, &strategy);
    });
}

#[test]
fn stream_with_busy_spin() {
    stream(WaitStrategy::BusySpin, 100_000);
}

#[test]
fn stream_with_spin_yield() {
    stream(
        WaitStrategy::SpinYield {
            spin: Duration::from_micros(20),
        },
        100_000,
    );
}

#[test]
fn stream_with_spin_park() {
    stream(WaitStrategy::default(), 200_000);
}

#[test]
fn stream_parking_at_once() {
    stream(
        WaitStrategy::SpinPark {
            spin: Duration::ZERO,
        },
        100_000,
    );
}

/// Both ends park on every wait: a lost wake-up anywhere in the protocol
/// would stall a round trip until its deadline.
#[test]
fn ping_pong_parking_every_time_loses_no_wake_up() {
    let park = WaitStrategy::SpinPark {
        spin: Duration::ZERO,
    };
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(4096)).unwrap());
    let (mut a_tx, mut a_rx) = region.ends(Side::Creator).unwrap();
    let (mut b_tx, mut b_rx) = region.ends(Side::Opener).unwrap();
    let rounds = 20_000u32;
    thread::scope(|s| {
        s.spawn(|| {
            for i in 0..rounds {
                let deadline = Some(Instant::now() + BOUND);
                let got =
                    u32::from_le_bytes(b_rx.read(&park, deadline).unwrap()[..].try_into().unwrap());
                assert_eq!(got, i);
                let _ = b_tx
                    .write_message(&[&got.to_le_bytes()], &park, deadline)
                    .unwrap();
            }
        });
        for i in 0..rounds {
            let deadline = Some(Instant::now() + BOUND);
            let _ = a_tx
                .write_message(&[&i.to_le_bytes()], &park, deadline)
                .unwrap();
            let got =
                u32::from_le_bytes(a_rx.read(&park, deadline).unwrap()[..].try_into().unwrap());
            assert_eq!(got, i);
        }
    });
}

#[test]
fn a_parked_reader_is_woken_by_a_record() {
    let mut p = pair(4096);
    let (done, result) = mpsc::channel();
    let mut rx = p.rx;
    let reader = thread::spawn(move || {
        let park = WaitStrategy::SpinPark {
            spin: Duration::ZERO,
        };
        let got = rx.read(&park, None).map(|r| r.to_vec());
        done.send(got).unwrap();
    });
    until_parked(|| p.tx.peer_waiting());
    let _ = p.tx.try_write(&[b"wake up"]).unwrap();
    assert_eq!(result.recv_timeout(BOUND).unwrap(), Ok(b"wake up".to_vec()));
    reader.join().unwrap();
}

#[test]
fn a_parked_writer_is_woken_by_space() {
    let mut p = pair(4096);
    let max = p.tx.max_record();
    // Full: the second record is 8 bytes short of half, which the zero word
    // after it takes.
    let _ = p.tx.try_write(&[&vec![1; max]]).unwrap();
    let _ = p.tx.try_write(&[&vec![2; max - 8]]).unwrap();
    let (done, result) = mpsc::channel();
    let mut tx = p.tx;
    let writer = thread::spawn(move || {
        let park = WaitStrategy::SpinPark {
            spin: Duration::ZERO,
        };
        // Fits (with 8 bytes of padding) once the first record is read.
        done.send(tx.write_message(&[&vec![3; max - 8]], &park, None))
            .unwrap();
        tx
    });
    until_parked(|| p.rx.peer_waiting());
    assert_eq!(p.rx.try_read().unwrap().unwrap()[0], 1);
    assert!(result.recv_timeout(BOUND).unwrap().is_ok());
    let _tx = writer.join().unwrap();
    assert_eq!(p.rx.try_read().unwrap().unwrap()[0], 2);
    assert_eq!(p.rx.try_read().unwrap().unwrap()[0], 3);
}

#[test]
fn a_parked_reader_is_woken_by_the_writers_close() {
    let mut p = pair(4096);
    let (done, result) = mpsc::channel();
    let mut rx = p.rx;
    thread::spawn(move || {
        let got = rx.read(&WaitStrategy::default(), None).map(|r| r.to_vec());
        done.send(got).unwrap();
    });
    until_parked(|| p.tx.peer_waiting());
    let _ = p.tx.close();
    assert_eq!(result.recv_timeout(BOUND).unwrap(), Err(ReadError::Closed));
}

#[test]
fn marking_the_peer_dead_wakes_every_sleeper_at_once() {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(4096)).unwrap());
    let (mut c_tx, mut c_rx) = region.ends(Side::Creator).unwrap();
    let (o_tx, o_rx) = region.ends(Side::Opener).unwrap();
    let max = c_tx.max_record();
    let _ = c_tx.try_write(&[&vec![0; max]]).unwrap();
    let _ = c_tx.try_write(&[&vec![0; max - 8]]).unwrap();
    let (done, result) = mpsc::channel();
    let reader_done = done.clone();
    // The creator's reader waits for records, its writer for space; neither
    // has a deadline.
    thread::spawn(move || {
        let got = c_rx
            .read(&WaitStrategy::default(), None)
            .map(|r| r.to_vec());
        reader_done.send(format!("{got:?}")).unwrap();
    });
    thread::spawn(move || {
        let got = c_tx.write_message(&[b"x"], &WaitStrategy::default(), None);
        done.send(format!("{got:?}")).unwrap();
    });
    until_parked(|| o_tx.peer_waiting());
    until_parked(|| o_rx.peer_waiting());
    // The opener's process is gone, says the creator's hang-up watcher.
    region.mark_peer_dead(Side::Creator);
    let mut got = [
        result.recv_timeout(BOUND).unwrap(),
        result.recv_timeout(BOUND).unwrap(),
    ];
    got.sort();
    assert_eq!(
        got,
        [
            format!("{:?}", Err::<Vec<u8>, _>(ReadError::Closed)),
            format!("{:?}", Err::<(), _>(WriteMessageError::Closed)),
        ]
    );
}

/// A doorbell as an async transport has one, with a channel standing in for
/// the socket: ringing sends a byte, sleeping receives one.
fn doorbell() -> (Doorbell, mpsc::Receiver<()>) {
    let (ring, bell) = mpsc::sync_channel(1);
    let doorbell = Doorbell::new(move || {
        // A full channel already holds a wake-up, like a full socket.
        let _ = ring.try_send(());
    });
    (doorbell, bell)
}

/// A reader that sleeps on its doorbell, as an async task would, gets
/// fragmented messages from a blocking writer, which must ring the doorbell
/// between fragments before it can wait for more space.
#[test]
fn a_reader_sleeping_on_its_doorbell_gets_fragmented_messages() {
    let mut p = pair(4096);
    let (bell, rung) = doorbell();
    p.tx.set_doorbell(Some(bell));
    let message = vec![9u8; 10 * p.tx.max_record() + 3];
    thread::scope(|s| {
        let tx = &mut p.tx;
        let message = &message;
        s.spawn(move || {
            for _ in 0..20 {
                let deadline = Some(Instant::now() + BOUND);
                let _ = tx
                    .write_message(&[message], &WaitStrategy::default(), deadline)
                    .unwrap();
            }
        });
        let mut got = Vec::new();
        let mut messages = 0;
        while messages < 20 {
            if let Some(record) = p.rx.try_read().unwrap() {
                got.extend_from_slice(&record);
                if record.is_last() {
                    assert_eq!(&got, message);
                    got.clear();
                    messages += 1;
                }
                continue;
            }
            if p.rx.announce_doorbell_wait() {
                rung.recv_timeout(BOUND)
                    .expect("the doorbell was never rung");
            }
            p.rx.withdraw_wait();
        }
    });
}

/// A writer that sleeps on its doorbell for space, as an async task would,
/// is woken by a blocking reader's releases.
#[test]
fn a_writer_sleeping_on_its_doorbell_gets_space() {
    let mut p = pair(4096);
    let (bell, rung) = doorbell();
    p.rx.set_doorbell(Some(bell));
    let max = p.tx.max_record();
    let records = 2000u32;
    thread::scope(|s| {
        let rx = &mut p.rx;
        s.spawn(move || {
            for i in 0..records {
                let deadline = Some(Instant::now() + BOUND);
                let record = rx.read(&WaitStrategy::default(), deadline).unwrap();
                assert_eq!(record.len(), max);
                assert_eq!(record[0], i as u8);
            }
        });
        let mut i = 0;
        while i < records {
            let record = vec![i as u8; max];
            match p.tx.try_write(&[&record]) {
                Ok(_) => i += 1,
                Err(TryWriteError::Full { .. }) => {
                    if p.tx.announce_doorbell_wait(max) {
                        rung.recv_timeout(BOUND)
                            .expect("the doorbell was never rung");
                    }
                    p.tx.withdraw_wait();
                }
                Err(e) => panic!("{e}"),
            }
        }
    });
}
