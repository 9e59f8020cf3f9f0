//! The waiting words: doorbell announcements and what publishing reports.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{pair, Pair};
use crate::{Doorbell, Sleeper, Wake};

#[test]
fn a_reader_announces_a_doorbell_wait_only_on_an_empty_ring() {
    let mut p = pair(4096);
    assert!(p.rx.announce_doorbell_wait());
    assert_eq!(p.tx.peer_waiting(), Some(Sleeper::Doorbell));
    // The first write owes the doorbell, and clears the announcement so
    // later writes do not ring again.
    assert_eq!(p.tx.try_write(&[b"a"]), Ok(Wake::Doorbell));
    assert_eq!(p.tx.peer_waiting(), None);
    assert_eq!(p.tx.try_write(&[b"b"]), Ok(Wake::None));
    // Records waiting: no announcement.
    assert!(!p.rx.announce_doorbell_wait());
    assert_eq!(p.tx.peer_waiting(), None);
    assert_eq!(p.read().map(|r| r.0), Some(b"a".to_vec()));
    assert_eq!(p.read().map(|r| r.0), Some(b"b".to_vec()));
    // Announce, then withdraw: nobody to wake.
    assert!(p.rx.announce_doorbell_wait());
    p.rx.withdraw_wait();
    assert_eq!(p.tx.try_write(&[b"c"]), Ok(Wake::None));
}

#[test]
fn a_doorbell_set_on_the_end_is_rung_for_it() {
    let mut p = pair(4096);
    let rung = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&rung);
    p.tx.set_doorbell(Some(Doorbell::new(move || {
        count.fetch_add(1, Ordering::Relaxed);
    })));
    assert!(p.rx.announce_doorbell_wait());
    assert_eq!(p.tx.try_write(&[b"a"]), Ok(Wake::DoorbellRung));
    assert_eq!(p.tx.try_write(&[b"b"]), Ok(Wake::None));
    assert_eq!(rung.load(Ordering::Relaxed), 1);
    // Closing wakes a sleeping reader too.
    let _ = p.read();
    let _ = p.read();
    assert!(p.rx.announce_doorbell_wait());
    assert_eq!(p.tx.close(), Wake::DoorbellRung);
    assert_eq!(rung.load(Ordering::Relaxed), 2);
    // A closed ring is never worth sleeping on.
    assert!(!p.rx.announce_doorbell_wait());
}

#[test]
fn a_writer_waiting_for_space_is_woken_once_its_record_fits() {
    let mut p = pair(256);
    // Indices at 8, so that the ring fills up to the end of its area.
    let _ = p.tx.try_write(&[]).unwrap();
    let _ = p.read();
    for _ in 0..3 {
        let _ = p.tx.try_write(&[&[0; 56]]).unwrap(); // 64 bytes each
    }
    let _ = p.tx.try_write(&[&[0; 48]]).unwrap(); // 56 bytes
    assert_eq!(p.tx.free(), 0);
    // Full: a record of 120 bytes (128 with its header, and the zero word
    // after it) needs two records released.
    assert!(p.tx.announce_doorbell_wait(120));
    assert_eq!(p.rx.peer_waiting(), Some(Sleeper::Doorbell));
    let record = p.rx.try_read().unwrap().unwrap();
    assert_eq!(record.release(), Wake::None);
    assert_eq!(p.rx.peer_waiting(), Some(Sleeper::Doorbell));
    let record = p.rx.try_read().unwrap().unwrap();
    assert_eq!(record.release(), Wake::Doorbell);
    assert_eq!(p.rx.peer_waiting(), None);
    // It fits now: no announcement.
    assert!(!p.tx.announce_doorbell_wait(120));
    let _ = p.tx.try_write(&[&[0; 120]]).unwrap();
    // A closing reader wakes a writer whatever it waits for.
    assert!(p.tx.announce_doorbell_wait(120));
    assert_eq!(p.rx.close(), Wake::Doorbell);
    assert!(!p.tx.announce_doorbell_wait(120));
}

#[test]
fn wakes_combine_with_the_one_needing_action_first() {
    assert_eq!(Wake::None.and(Wake::Futex), Wake::Futex);
    assert_eq!(Wake::Futex.and(Wake::Doorbell), Wake::Doorbell);
    assert_eq!(Wake::Doorbell.and(Wake::None), Wake::Doorbell);
    assert_eq!(Wake::DoorbellRung.and(Wake::None), Wake::DoorbellRung);
    assert!(Wake::Doorbell.must_ring());
    assert!(!Wake::DoorbellRung.must_ring());
}

/// Fills ring 0 with 1000-byte records; the room a writer of fragments
/// waits for is then gone.
fn full(capacity: usize) -> (Pair, usize) {
    let mut p = pair(capacity);
    while p.tx.try_write(&[&[7u8; 1000]]).is_ok() {}
    let need = p.tx.fragment_room();
    (p, need)
}

#[test]
fn a_writer_facing_a_full_ring_spins_until_the_reader_makes_room() {
    use std::time::{Duration, Instant};
    let (Pair { tx, mut rx, .. }, need) = full(64 << 10);
    assert!(!tx.spin_for_room(need, Duration::ZERO));
    // The reader drains the ring a while after the writer began to spin:
    // the spin, not a first look, finds the room.
    let started = Instant::now();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        while let Some(record) = rx.try_read().unwrap() {
            drop(record);
        }
    });
    assert!(tx.spin_for_room(need, Duration::from_secs(10)));
    assert!(started.elapsed() >= Duration::from_millis(20));
    reader.join().unwrap();
}

#[test]
fn a_writer_spins_for_room_no_longer_than_asked() {
    use std::time::{Duration, Instant};
    let (p, need) = full(64 << 10);
    let started = Instant::now();
    assert!(!p.tx.spin_for_room(need, Duration::from_millis(5)));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(5), "gave up after {took:?}");
    assert!(took < Duration::from_secs(5), "spun for {took:?}");
}

#[test]
fn a_writer_of_fragments_is_woken_once_its_fragment_fits_and_no_later() {
    use std::time::{Duration, Instant};
    let (mut p, need) = full(64 << 10);
    let message = vec![3u8; 4 * p.tx.max_record()];
    let Pair { tx, rx, .. } = &mut p;
    let deadline = Instant::now() + Duration::from_secs(10);
    let sent = &message;
    std::thread::scope(|s| {
        let writer =
            s.spawn(move || tx.write_message(&[sent], &crate::WaitStrategy::PARK, Some(deadline)));
        // Nothing fits: the writer sleeps.
        while rx.peer_waiting() != Some(Sleeper::Futex) {
            assert!(Instant::now() < deadline, "the writer never slept");
            std::thread::yield_now();
        }
        // Released one at a time, records free room 1008 bytes each (1000
        // and their header): the release that makes a fragment fit wakes
        // the writer, not one before, nor a later one.
        let mut freed = 0;
        loop {
            let record = rx.try_read().unwrap().unwrap();
            freed += record.len() + 8;
            if record.release() == Wake::Futex {
                break;
            }
            assert!(freed < need, "{freed} bytes free, and the writer sleeps on");
        }
        assert!(
            (need..need + 1008 + 16).contains(&freed),
            "woken with {freed} bytes free for {need}"
        );
        // The rest of the filler (7s), then the message (3s), whole.
        let mut got = 0;
        while got < message.len() {
            match rx.try_read().unwrap() {
                Some(record) if record.first() == Some(&7) => {}
                Some(record) => {
                    assert!(record.iter().all(|b| *b == 3));
                    got += record.len();
                }
                None => assert!(Instant::now() < deadline, "the message stopped at {got}"),
            }
        }
        assert!(writer.join().unwrap().is_ok());
    });
}
