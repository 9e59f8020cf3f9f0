//! Every way a peer can corrupt a ring, each reported as `Corrupt`.

use super::{header, pair, pattern, Pair};
use crate::record::{self, FLAG_MORE, FLAG_PADDING, FLAG_PUBLISHED};
use crate::sync::Ordering;
use crate::{Corrupt, TryReadError, TryWriteError};

fn read_err(p: &mut Pair) -> Corrupt {
    match p.rx.try_read() {
        Err(TryReadError::Corrupt(c)) => c,
        other => panic!(
            "expected corruption, got {:?}",
            other.map(|r| r.map(|r| r.to_vec()))
        ),
    }
}

fn set_head(p: &Pair, head: u64) {
    header(&p.raw())
        .consumer
        .head
        .store(head, Ordering::Relaxed);
}

fn set_record(p: &Pair, pos: u64, len: u64, flags: u32) {
    p.raw()
        .store_record_header(pos, record::encode(len as u32, flags));
}

/// A ring of 256 bytes, empty, its indices at 240: 16 bytes to the end,
/// the old header of a 112-byte record at 0.
fn empty_at_240() -> Pair {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[0; 112]]).unwrap();
    let _ = p.tx.try_write(&[&[0; 112]]).unwrap();
    let _ = p.read();
    let _ = p.read();
    p
}

#[test]
fn a_word_at_the_head_that_is_neither_zero_nor_a_header() {
    let mut p = pair(256);
    // A length without the published flag: not what a writer leaves there.
    p.raw().store_record_header(0, 16);
    assert_eq!(read_err(&mut p), Corrupt::Flags { at: 0, flags: 0 });
}

#[test]
fn a_head_ahead_of_the_tail_misaligned_or_going_backwards() {
    for head in [1000, 3] {
        let mut p = pair(256);
        let _ = p.tx.try_write(&[&[0; 120]]).unwrap();
        let _ = p.tx.try_write(&[&[0; 112]]).unwrap();
        set_head(&p, head);
        // The producer looks at the head only when the ring seems full.
        assert!(matches!(
            p.tx.try_write(&[b"x"]),
            Err(TryWriteError::Corrupt(Corrupt::Indices { .. }))
        ));
        assert_eq!(p.tx.free(), 0);
    }
    // Backwards, though within a capacity of the tail.
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[0; 120]]).unwrap();
    let _ = p.read(); // head 128
    let _ = p.tx.try_write(&[&[0; 120]]).unwrap(); // tail 256, sees head 128
    let _ = p.tx.try_write(&[&[0; 56]]).unwrap(); // tail 320, no need to look
    set_head(&p, 120);
    assert!(matches!(
        p.tx.try_write(&[&[0; 64]]),
        Err(TryWriteError::Corrupt(Corrupt::Indices { head: 120, .. }))
    ));
}

#[test]
fn unknown_flags_and_padding_fragments() {
    for flags in [8, 1 << 31, FLAG_PADDING | FLAG_MORE] {
        let mut p = pair(256);
        let _ = p.tx.try_write(&[&[0; 16]]).unwrap();
        set_record(&p, 0, 16, flags);
        let flags = flags | FLAG_PUBLISHED;
        assert_eq!(read_err(&mut p), Corrupt::Flags { at: 0, flags });
    }
}

#[test]
fn a_record_longer_than_a_record() {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[0; 16]]).unwrap();
    set_record(&p, 0, 121, 0);
    assert_eq!(
        read_err(&mut p),
        Corrupt::Length {
            at: 0,
            len: 121,
            readable: 256
        }
    );
    set_record(&p, 0, u32::MAX.into(), 0);
    assert!(matches!(read_err(&mut p), Corrupt::Length { .. }));
}

#[test]
fn a_record_shortened_after_part_of_it_was_read() {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[0; 20]]).unwrap();
    let mut buf = [0; 10];
    assert!(p.rx.try_read_bytes(&mut buf).unwrap().is_some());
    set_record(&p, 0, 5, 0);
    assert_eq!(
        read_err(&mut p),
        Corrupt::Length {
            at: 0,
            len: 5,
            readable: 10
        }
    );
}

#[test]
fn a_record_running_past_the_end_of_the_data_area() {
    let mut p = empty_at_240();
    // A proper record wraps with padding; this one claims to run on.
    let _ = p.tx.try_write(&[&[0; 100]]).unwrap();
    set_record(&p, 240, 100, 0);
    assert!(matches!(read_err(&mut p), Corrupt::Length { at: 240, .. }));
}

#[test]
fn padding_that_does_not_end_the_area_or_starts_it() {
    let mut p = empty_at_240();
    let _ = p.tx.try_write(&[&[0; 100]]).unwrap(); // padding at 240, record at 0
    set_record(&p, 240, 0, FLAG_PADDING);
    assert_eq!(read_err(&mut p), Corrupt::Padding { at: 240, len: 0 });
    // Padding again at offset 0, after the first.
    set_record(&p, 240, 8, FLAG_PADDING);
    set_record(&p, 0, 248, FLAG_PADDING);
    assert_eq!(read_err(&mut p), Corrupt::Padding { at: 256, len: 248 });
    // Padding at the very start of the area.
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[0; 16]]).unwrap();
    set_record(&p, 0, 248, FLAG_PADDING);
    assert_eq!(read_err(&mut p), Corrupt::Padding { at: 0, len: 248 });
}

#[test]
fn padding_published_alone_is_not_yet_a_record() {
    let mut p = empty_at_240();
    // As a writer might: padding first, the record at 0 later (its word
    // zero meanwhile).
    p.raw().store_record_header(0, 0);
    set_record(&p, 240, 8, FLAG_PADDING);
    assert!(p.rx.try_read().unwrap().is_none());
    // Nothing to read yet: an async reader may sleep.
    assert!(p.rx.announce_doorbell_wait());
}

/// A peer writing garbage at random over every shared word never makes an
/// end panic or hand out anything but records inside the ring.
#[test]
fn random_garbage_is_always_reported_never_a_panic() {
    let mut rng = 0x5eed_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..2000 {
        let mut p = pair(256);
        for i in 0..(next() % 6) {
            let _ = p.tx.try_write(&[&pattern(i, (next() % 121) as usize)]);
            if next() % 2 == 0 {
                let _ = p.read();
            }
        }
        let raw = p.raw();
        for _ in 0..(next() % 4) {
            let value = match next() % 3 {
                0 => next(),
                1 => next() % 512,
                _ => (next() % 64) * 8,
            };
            match next() % 3 {
                0 => set_head(&p, value),
                _ => raw.store_record_header((next() % 32) * 8, value),
            }
        }
        for _ in 0..4 {
            if let Ok(Some(record)) = p.rx.try_read() {
                assert!(record.len() <= 120, "round {round}");
            }
            let _ = p.tx.try_write(&[&[1; 40]]);
            let _ = p.tx.write_some(&[&[1; 200]]);
            let _ = p.tx.free();
        }
    }
}
