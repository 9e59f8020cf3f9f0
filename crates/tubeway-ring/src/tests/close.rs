//! Closing, dropping, dead peers, time-outs, and handing out ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pair;
use crate::{
    EndsError, ReadError, Region, RingConfig, Side, TryReadError, TryWriteError, WaitStrategy,
    WriteMessageError, WriteSomeError,
};

const STRATEGIES: [WaitStrategy; 4] = [
    WaitStrategy::BusySpin,
    WaitStrategy::SpinYield {
        spin: Duration::from_micros(5),
    },
    WaitStrategy::SpinPark {
        spin: Duration::ZERO,
    },
    WaitStrategy::SpinPark {
        spin: Duration::from_micros(5),
    },
];

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_millis(20))
}

#[test]
fn the_reader_gets_everything_written_before_the_close_then_closed() {
    let mut p = pair(4096);
    for i in 0..3u8 {
        let _ = p.tx.try_write(&[&[i; 10]]).unwrap();
    }
    let _ = p.tx.close();
    for i in 0..3u8 {
        assert_eq!(p.read(), Some((vec![i; 10], true)));
    }
    assert_eq!(p.rx.try_read().err(), Some(TryReadError::Closed));
    for strategy in STRATEGIES {
        // No deadline: a closed ring must not wait.
        assert_eq!(p.rx.read(&strategy, None).err(), Some(ReadError::Closed));
    }
}

#[test]
fn writes_fail_once_the_reader_closed() {
    let mut p = pair(4096);
    assert!(!p.tx.is_closed());
    let _ = p.rx.close();
    assert!(p.tx.is_closed());
    assert_eq!(p.tx.try_write(&[b"x"]), Err(TryWriteError::Closed));
    assert_eq!(p.tx.write_some(&[b"x"]), Err(WriteSomeError::Closed));
    for strategy in STRATEGIES {
        assert_eq!(
            p.tx.write_message(&[b"x"], &strategy, None),
            Err(WriteMessageError::Closed)
        );
        assert_eq!(
            p.tx.write_message(&[&[0; 5000]], &strategy, None),
            Err(WriteMessageError::Closed)
        );
    }
}

#[test]
fn an_end_closed_by_its_owner_refuses_its_own_work() {
    let mut p = pair(4096);
    let _ = p.tx.try_write(&[b"x"]).unwrap();
    let _ = p.tx.close();
    let _ = p.tx.close(); // idempotent
    assert_eq!(p.tx.try_write(&[b"y"]), Err(TryWriteError::Closed));
    let _ = p.rx.close();
    assert_eq!(p.rx.try_read().err(), Some(TryReadError::Closed));
}

#[test]
fn dropping_an_end_closes_it() {
    let p = pair(4096);
    let (region, mut tx, rx) = (p.region, p.tx, p.rx);
    let _ = tx.try_write(&[b"last words"]).unwrap();
    drop(tx);
    let mut rx = rx;
    assert_eq!(&*rx.try_read().unwrap().unwrap(), b"last words");
    assert_eq!(rx.try_read().err(), Some(TryReadError::Closed));
    drop(region);
}

#[test]
fn a_dead_peer_closes_both_rings_after_what_it_wrote() {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(4096)).unwrap());
    let (mut c_tx, mut c_rx) = region.ends(Side::Creator).unwrap();
    let (mut o_tx, _o_rx) = region.ends(Side::Opener).unwrap();
    let _ = o_tx.try_write(&[b"before"]).unwrap();
    // Declared by the creator's hang-up watcher; the opener's ends, were
    // they in another process, would know nothing of it.
    c_rx.mark_peer_dead();
    assert_eq!(&*c_rx.try_read().unwrap().unwrap(), b"before");
    assert_eq!(c_rx.try_read().err(), Some(TryReadError::Closed));
    assert_eq!(c_tx.try_write(&[b"x"]), Err(TryWriteError::Closed));
    assert!(c_tx.is_closed());
    assert!(!o_tx.is_closed());
}

#[test]
fn deadlines_end_waits_for_every_strategy() {
    let mut p = pair(256);
    for strategy in STRATEGIES {
        assert_eq!(
            p.rx.read(&strategy, soon()).err(),
            Some(ReadError::TimedOut)
        );
    }
    // Fifteen records of 16 bytes: 8 bytes left, too few for another.
    while p.tx.try_write(&[&[0; 8]]).is_ok() {}
    for strategy in STRATEGIES {
        assert_eq!(
            p.tx.write_message(&[b"x"], &strategy, soon()),
            Err(WriteMessageError::TimedOut)
        );
        // A deadline already passed still gives a ready ring its chance.
        assert_eq!(
            p.rx.read(&strategy, Some(Instant::now())).map(|r| r.len()),
            Ok(8)
        );
        let _ = p.tx.try_write(&[&[0; 8]]).unwrap();
    }
}

#[test]
fn a_time_out_in_the_middle_of_a_message_closes_the_ring() {
    let mut p = pair(256);
    let strategy = WaitStrategy::default();
    assert_eq!(
        p.tx.write_message(&[&[7; 1000]], &strategy, soon()),
        Err(WriteMessageError::TimedOutMidMessage { written: 232 })
    );
    assert!(p.tx.is_closed());
    assert_eq!(p.read(), Some((vec![7; 120], false)));
    assert_eq!(p.read(), Some((vec![7; 112], false)));
    assert_eq!(p.rx.try_read().err(), Some(TryReadError::Closed));
}

#[test]
fn each_side_takes_its_ends_once() {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(4096)).unwrap());
    let _creator = region.ends(Side::Creator).unwrap();
    assert_eq!(
        region.ends(Side::Creator).err(),
        Some(EndsError::Taken(Side::Creator))
    );
    let _opener = region.ends(Side::Opener).unwrap();
    assert_eq!(
        region.ends(Side::Opener).err(),
        Some(EndsError::Taken(Side::Opener))
    );
}
