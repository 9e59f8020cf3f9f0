//! Model checks of the publishing and wake protocol with loom: every
//! interleaving (up to a preemption bound) of a writer and a reader, each
//! parking on the futex, must deliver every record, lose no wake-up (a lost
//! one is a deadlock, which loom reports), and see the close.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p tubeway-ring --test ring_loom --release
//! ```
//!
//! Under `cfg(loom)` the crate's atomics, fences and futex are loom's, so
//! this runs the real producer and consumer code.
#![cfg(loom)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use loom::model::Builder;
use loom::thread;
use tubeway_ring::{
    Consumer, Producer, ReadError, Region, RingConfig, Side, WaitStrategy, Wake, WriteMessageError,
};

/// Park at once: loom has no clock, and spinning only multiplies the
/// interleavings without adding any new ordering.
const PARK: WaitStrategy = WaitStrategy::SpinPark {
    spin: Duration::ZERO,
};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = Builder::new();
    // Enough to interleave each side's announce/check with the other's
    // publish/check; the exploration stays within seconds.
    builder.preemption_bound = Some(4);
    builder.check(f);
}

/// The smallest ring: records of up to 24 bytes; one of 24 and one of 16
/// fill it (the last 8 bytes are the zero word after the last record).
fn ends() -> (Arc<Region>, Producer, Consumer) {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(64)).unwrap());
    let (tx, _) = region.ends(Side::Creator).unwrap();
    let (_, rx) = region.ends(Side::Opener).unwrap();
    (region, tx, rx)
}

#[test]
fn a_parked_reader_gets_every_record_then_the_close() {
    model(|| {
        let (_region, mut tx, mut rx) = ends();
        let writer = thread::spawn(move || {
            let _ = tx.try_write(&[b"one"]).unwrap();
            let _ = tx.try_write(&[b"two"]).unwrap();
            let _ = tx.close();
        });
        assert_eq!(&*rx.read(&PARK, None).unwrap(), b"one");
        assert_eq!(&*rx.read(&PARK, None).unwrap(), b"two");
        assert_eq!(rx.read(&PARK, None).err(), Some(ReadError::Closed));
        writer.join().unwrap();
    });
}

/// Headers publish records: after padding, the record at the start of the
/// area, and after the last record, the zero word that covers an old header,
/// are seen as written, never as left by the lap before.
#[test]
fn a_reader_never_takes_an_old_header_for_a_record() {
    model(|| {
        let (_region, mut tx, mut rx) = ends();
        // The first lap leaves headers at 0 and 32.
        let _ = tx.try_write(&[&[1; 24]]).unwrap(); // [0, 32)
        let _ = tx.try_write(&[&[2; 16]]).unwrap(); // [32, 56)
        assert_eq!(rx.try_read().unwrap().unwrap().len(), 24);
        assert_eq!(rx.try_read().unwrap().unwrap().len(), 16);
        let writer = thread::spawn(move || {
            // Padding at 56, then [0, 16), then [16, 32): the zero word
            // after it covers the old header at 32.
            let _ = tx.try_write(&[&[3; 8]]).unwrap();
            let _ = tx.try_write(&[&[4; 8]]).unwrap();
            let _ = tx.close();
        });
        for expect in [3, 4] {
            let record = rx.read(&PARK, None).unwrap();
            assert_eq!((record.len(), record[0]), (8, expect));
        }
        assert_eq!(rx.read(&PARK, None).err(), Some(ReadError::Closed));
        writer.join().unwrap();
    });
}

#[test]
fn a_parked_writer_gets_the_space_it_waits_for() {
    model(|| {
        let (_region, mut tx, mut rx) = ends();
        let _ = tx.try_write(&[&[1; 24]]).unwrap();
        let _ = tx.try_write(&[&[2; 16]]).unwrap();
        let writer = thread::spawn(move || {
            // Full: waits until the reader releases a record (then fits
            // after 8 bytes of padding).
            let _ = tx.write_message(&[&[3; 16]], &PARK, None).unwrap();
        });
        for expect in 1..=3 {
            assert_eq!(rx.read(&PARK, None).unwrap()[0], expect);
        }
        writer.join().unwrap();
    });
}

#[test]
fn a_dead_peer_wakes_a_parked_reader() {
    model(|| {
        let (region, _tx, mut rx) = ends();
        let reader = thread::spawn(move || rx.read(&PARK, None).err());
        region.mark_peer_dead(Side::Opener);
        assert_eq!(reader.join().unwrap(), Some(ReadError::Closed));
    });
}

#[test]
fn a_closing_reader_wakes_a_parked_writer() {
    model(|| {
        let (_region, mut tx, mut rx) = ends();
        let _ = tx.try_write(&[&[1; 24]]).unwrap();
        let _ = tx.try_write(&[&[2; 16]]).unwrap();
        let writer = thread::spawn(move || tx.write_message(&[b"x"], &PARK, None).err());
        let _ = rx.close();
        assert_eq!(writer.join().unwrap(), Some(WriteMessageError::Closed));
    });
}

/// The doorbell half: either the reader sees the record and does not sleep,
/// or the writer sees the announcement and owes the doorbell. Never both
/// missed.
#[test]
fn a_doorbell_announcement_is_never_missed() {
    model(|| {
        let (_region, mut tx, mut rx) = ends();
        let writer = thread::spawn(move || {
            let wake = tx.try_write(&[b"x"]).unwrap();
            // Keep the ring open while the reader decides.
            (wake, tx)
        });
        let sleeping = rx.announce_doorbell_wait();
        let (wake, _tx) = writer.join().unwrap();
        assert!(
            !sleeping || wake == Wake::Doorbell,
            "the reader sleeps and nobody rings: {wake:?}"
        );
    });
}
