//! Records: parts, sizes, wrap-around, fullness, fragments.

use std::time::{Duration, Instant};

use super::{header, pair, pattern};
use crate::record::{self, FLAG_PADDING, FLAG_PUBLISHED};
use crate::sync::Ordering;
use crate::{ReadMessageError, TryWriteError, WaitStrategy, WriteSomeError, STREAM_RECORD_MAX};

const WAIT: WaitStrategy = WaitStrategy::SpinPark {
    spin: Duration::from_micros(10),
};

fn deadline() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(20))
}

#[test]
fn a_record_is_its_parts_concatenated() {
    let mut p = pair(4096);
    let _ = p.tx.try_write(&[b"frame-head|", b"", b"payload"]).unwrap();
    assert_eq!(p.read(), Some((b"frame-head|payload".to_vec(), true)));
    assert_eq!(p.read(), None);
}

#[test]
fn zero_length_records_take_a_header_each() {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[]).unwrap();
    let _ = p.tx.try_write(&[b""]).unwrap();
    // Less the zero word always kept after the last record.
    assert_eq!(p.tx.free(), 256 - 16 - 8);
    assert_eq!(p.read(), Some((vec![], true)));
    assert_eq!(p.read(), Some((vec![], true)));
    assert_eq!(p.read(), None);
    assert_eq!(p.tx.free(), 256 - 8);
}

#[test]
fn exactly_full_then_one_byte_too_many() {
    let mut p = pair(256);
    assert_eq!(p.tx.max_record(), 120);
    // 128 + 112 bytes of records: 16 left, of which the last 8 stay free
    // (the zero word after the last record): room for one empty record.
    let _ = p.tx.try_write(&[&[1; 120]]).unwrap();
    let _ = p.tx.try_write(&[&[2; 104]]).unwrap();
    assert_eq!(p.tx.free(), 8);
    // A byte needs 16 bytes.
    assert_eq!(
        p.tx.try_write(&[&[3]]),
        Err(TryWriteError::Full { need: 16 })
    );
    let _ = p.tx.try_write(&[]).unwrap();
    assert_eq!(p.tx.free(), 0);
    assert_eq!(p.tx.try_write(&[]), Err(TryWriteError::Full { need: 8 }));
    assert_eq!(p.read(), Some((vec![1; 120], true)));
    assert_eq!(p.tx.free(), 128);
    // 8 bytes to the end: padding, then 112 at the start, then the zero word.
    let _ = p.tx.try_write(&[&[4; 100]]).unwrap();
    assert_eq!(p.tx.free(), 8);
    assert_eq!(p.read(), Some((vec![2; 104], true)));
    assert_eq!(p.read(), Some((vec![], true)));
    assert_eq!(p.read(), Some((vec![4; 100], true)));
    assert_eq!(p.read(), None);
}

#[test]
fn a_record_larger_than_the_largest_is_refused() {
    let mut p = pair(256);
    assert_eq!(
        p.tx.try_write(&[&[0; 100], &[0; 21]]),
        Err(TryWriteError::TooLarge { len: 121, max: 120 })
    );
    let _ = p.tx.try_write(&[&[0; 100], &[0; 20]]).unwrap();
}

#[test]
fn a_record_that_does_not_fit_before_the_end_wraps_after_padding() {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[1; 100]]).unwrap(); // [0, 112)
    assert_eq!(p.read(), Some((vec![1; 100], true)));
    let _ = p.tx.try_write(&[&[2; 120]]).unwrap(); // [112, 240)

    // 16 bytes to the end: padding, then the record at 0; 144 needed but only
    // 120 free until the reader catches up (128 less the zero word).
    assert_eq!(
        p.tx.try_write(&[&[3; 120]]),
        Err(TryWriteError::Full { need: 144 })
    );
    assert_eq!(p.read(), Some((vec![2; 120], true)));
    let _ = p.tx.try_write(&[&[3; 120]]).unwrap();
    let raw = p.raw();
    let (len, flags) = record::decode(raw.load_record_header(240));
    assert_eq!((len, flags), (8, FLAG_PADDING | FLAG_PUBLISHED));
    assert_eq!(
        record::decode(raw.load_record_header(0)),
        (120, FLAG_PUBLISHED)
    );
    // Where the next record goes: zero, not the first record's old header.
    assert_eq!(raw.load_record_header(128), 0);
    assert_eq!(p.read(), Some((vec![3; 120], true)));
    assert_eq!(p.read(), None);
    assert_eq!(header(&raw).consumer.head.load(Ordering::Relaxed), 384);
}

/// Sends `count` records of `len` bytes through a ring of `capacity`, the
/// reader `behind` records behind the writer, checking each; returns the
/// furthest offset in the data area the reader's head reached.
fn furthest_head(capacity: usize, count: u64, len: usize, behind: u64) -> u64 {
    let mut p = pair(capacity);
    let raw = p.raw();
    let mut furthest = 0;
    for i in 0..count + behind {
        if i < count {
            let _ = p.tx.try_write(&[&pattern(i, len)]).unwrap();
        }
        if i >= behind {
            assert_eq!(p.read(), Some((pattern(i - behind, len), true)));
        }
        let head = header(&raw).consumer.head.load(Ordering::Relaxed);
        furthest = furthest.max(head & (raw.capacity() - 1));
    }
    furthest
}

#[test]
fn an_emptied_ring_starts_again_at_the_beginning() {
    // One record at a time, as requests and replies go: the writer starts
    // again at offset 0 once it has moved past 16 KiB and the reader has
    // read everything, so the ring's first lines are used over and over.
    let furthest = furthest_head(1 << 20, 1000, 5000, 0);
    assert!(furthest <= 16 * 1024 + 5016, "walked to {furthest}");
}

#[test]
fn a_ring_that_is_not_empty_does_not_start_again() {
    // A reader behind by one record: the writer walks on through the ring
    // (wrapping only at its end), and every record arrives in order.
    let furthest = furthest_head(1 << 20, 400, 5000, 1);
    assert!(furthest > 1 << 19, "stopped at {furthest}");
}

#[test]
fn a_small_ring_never_starts_again_early() {
    // Rings under 64 KiB wrap only at their end, as before.
    let furthest = furthest_head(32 * 1024, 100, 1000, 0);
    assert!(furthest > 30 * 1024, "stopped at {furthest}");
}

#[test]
fn the_largest_record_fits_an_empty_ring_wherever_its_head_is() {
    let mut p = pair(256);
    for step in 0..64 {
        let big = pattern(step, p.tx.max_record());
        let _ = p.tx.try_write(&[&big]).unwrap();
        assert_eq!(p.read(), Some((big, true)));
        // Move on by one record header.
        let _ = p.tx.try_write(&[]).unwrap();
        assert_eq!(p.read(), Some((vec![], true)));
    }
}

#[test]
fn random_sizes_survive_many_wraps() {
    let mut p = pair(1024);
    let max = p.tx.max_record() as u64;
    let (mut written, mut read) = (0u64, 0u64);
    let mut rng = 0x1234_5678_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    while read < 5000 {
        // Write until full, then read a random number of records.
        loop {
            let len = next(max + 1) as usize;
            let data = pattern(written, len);
            match p.tx.try_write(&[&data[..len / 2], &data[len / 2..]]) {
                Ok(_) => written += 1,
                Err(TryWriteError::Full { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        for _ in 0..=next(written - read) {
            let Some((bytes, last)) = p.read() else { break };
            assert!(last);
            assert_eq!(bytes, pattern(read, bytes.len()), "record {read}");
            read += 1;
        }
    }
}

#[test]
fn a_record_is_whole_wherever_it_starts_in_a_cache_line() {
    // The payload's bytes in the header's line are written apart from the
    // rest: every length around one and two lines, from three parts, with
    // its header at each of the eight places a line has for one.
    let mut p = pair(4096);
    for len in 0..=136 {
        let data = pattern(len as u64, len);
        let (a, rest) = data.split_at(len / 3);
        let (b, c) = rest.split_at(rest.len() / 2);
        let mut seen = 0u32;
        let mut rounds = 0;
        while seen != 0xff {
            rounds += 1;
            assert!(rounds < 1000, "{len} bytes: header places seen {seen:#b}");
            let _ = p.tx.try_write(&[a, b, c]).unwrap();
            let record = p.rx.try_read().unwrap().unwrap();
            assert_eq!(&*record, &data[..], "{len} bytes at {}", record.offset());
            seen |= 1 << ((record.offset() - record::HEADER) % 64 / 8);
            drop(record);
            // Empty records move the next one on by a header each.
            for _ in 0..rounds % 8 {
                let _ = p.tx.try_write(&[]).unwrap();
                assert_eq!(p.read(), Some((vec![], true)));
            }
        }
    }
    // In fragments of at most 120 bytes, which start inside the parts.
    let mut p = pair(256);
    for len in 0..=400 {
        let data = pattern(len as u64, len);
        let (a, rest) = data.split_at(len / 3);
        let (b, c) = rest.split_at(rest.len() / 2);
        std::thread::scope(|s| {
            let tx = &mut p.tx;
            s.spawn(move || tx.write_message(&[a, b, c], &WAIT, deadline()).unwrap());
            let mut got = Vec::new();
            loop {
                let record = p.rx.read(&WAIT, deadline()).unwrap();
                got.extend_from_slice(&record);
                if record.is_last() {
                    break;
                }
            }
            assert_eq!(got, data, "{len} bytes in fragments");
        });
    }
}

#[test]
fn write_some_writes_what_fits_as_one_record() {
    let mut p = pair(256);
    let data = pattern(7, 1000);
    // Empty ring: the largest record.
    assert_eq!(p.tx.write_some(&[&data]).unwrap().0, 120); // [0, 128)
    let _ = p.tx.try_write(&[&[0; 40]]).unwrap(); // [128, 176)
    assert_eq!(p.read(), Some((data[..120].to_vec(), true)));
    // 80 bytes to the end, 128 free at the start after padding, less the
    // zero word: the larger.
    assert_eq!(p.tx.write_some(&[&data[..3], &data[3..]]).unwrap().0, 112);
    assert_eq!(p.read(), Some((vec![0; 40], true)));
    assert_eq!(p.read(), Some((data[..112].to_vec(), true)));
    // Nothing to write writes nothing.
    assert_eq!(p.tx.write_some(&[]).unwrap().0, 0);
    assert_eq!(p.read(), None);
}

#[test]
fn write_some_writes_one_record_of_a_stream_record_at_most() {
    let mut p = pair(1 << 20);
    let data = pattern(3, STREAM_RECORD_MAX * 2);
    assert_eq!(p.tx.write_some(&[&data]).unwrap().0, STREAM_RECORD_MAX);
    assert_eq!(p.read(), Some((data[..STREAM_RECORD_MAX].to_vec(), true)));
    assert_eq!(p.read(), None);
}

#[test]
fn write_fitting_writes_record_after_record_while_they_fit() {
    let mut p = pair(1 << 20);
    let data = pattern(5, STREAM_RECORD_MAX * 2 + 100);
    // All of it at once, split across the parts' boundary.
    let (head, rest) = data.split_at(10);
    assert_eq!(p.tx.write_fitting(&[head, rest]).unwrap().0, data.len());
    for want in [
        &data[..STREAM_RECORD_MAX],
        &data[STREAM_RECORD_MAX..STREAM_RECORD_MAX * 2],
        &data[STREAM_RECORD_MAX * 2..],
    ] {
        assert_eq!(p.read(), Some((want.to_vec(), true)));
    }
    assert_eq!(p.read(), None);
    // More than the ring holds: as much as fits, then nothing.
    let big = pattern(7, 2 << 20);
    let n = p.tx.write_fitting(&[&big]).unwrap().0;
    assert!((1 << 19..1 << 20).contains(&n), "{n} bytes written");
    assert_eq!(p.tx.write_fitting(&[&big]), Err(WriteSomeError::Full));
    let mut got = Vec::new();
    while let Some((record, _)) = p.read() {
        assert!(record.len() <= STREAM_RECORD_MAX);
        got.extend(record);
    }
    assert!(got == big[..n], "{} bytes read for {n}", got.len());
    assert_eq!(p.tx.write_fitting(&[]).unwrap().0, 0);
}

#[test]
fn write_some_takes_the_stretch_before_the_end_when_larger() {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[&[0; 24]]).unwrap(); // [0, 32)
    let _ = p.tx.try_write(&[&[0; 56]]).unwrap(); // [32, 96)
    assert_eq!(p.read().map(|r| r.0.len()), Some(24));
    // Free: [96, 256) straight (160) and [0, 32) wrapped: straight wins,
    // capped by the largest record.
    assert_eq!(p.tx.write_some(&[&[1; 500]]).unwrap().0, 120); // [96, 224)

    // Free: [224, 256) straight (32), [0, 24) wrapped before the zero word
    // (24): straight.
    assert_eq!(p.tx.write_some(&[&[2; 500]]).unwrap().0, 24); // [224, 256)
    assert_eq!(p.tx.write_some(&[&[3; 500]]).unwrap().0, 16); // [0, 24)
    assert_eq!(p.tx.write_some(&[&[4; 500]]), Err(WriteSomeError::Full));
    assert_eq!(p.tx.free(), 0);
}

#[test]
fn the_room_a_writer_of_fragments_waits_for_is_a_quarter_record_at_most_its_cap() {
    assert_eq!(pair(256).tx.fragment_room(), 30);
    // (512 KiB - 8) / 4: just under the cap.
    assert_eq!(pair(1 << 20).tx.fragment_room(), (128 << 10) - 2);
    // A larger ring frees its writer as soon as a smaller one does.
    assert_eq!(pair(4 << 20).tx.fragment_room(), crate::FRAGMENT_ROOM_MAX);
    assert_eq!(pair(64 << 20).tx.fragment_room(), crate::FRAGMENT_ROOM_MAX);
}

#[test]
fn a_message_larger_than_a_record_is_fragmented_and_reassembled() {
    let mut p = pair(1024);
    let max = p.tx.max_record();
    let message = pattern(3, 10 * max + 17);
    let (head, body) = message.split_at(5);
    std::thread::scope(|s| {
        let tx = &mut p.tx;
        s.spawn(move || {
            let _ = tx.write_message(&[head, body], &WAIT, deadline()).unwrap();
        });
        let mut fragments = 0;
        let mut out = Vec::new();
        loop {
            let record = p.rx.read(&WAIT, deadline()).unwrap();
            assert!(record.len() <= max);
            out.extend_from_slice(&record);
            fragments += 1;
            if record.is_last() {
                break;
            }
        }
        assert!(fragments >= 11, "{fragments} fragments");
        assert_eq!(out, message);
    });
}

#[test]
fn a_fragment_is_a_stream_record_at_most() {
    // Largest record 512 KiB: the whole message fits in the ring at once,
    // in fragments the size a writer of fragments waits for.
    let mut p = pair(1 << 20);
    let message = pattern(4, 600 << 10);
    let _ = p.tx.write_message(&[&message], &WAIT, deadline()).unwrap();
    let mut out = Vec::new();
    let mut sizes = Vec::new();
    while let Some((record, last)) = p.read() {
        sizes.push(record.len());
        out.extend(record);
        if last {
            break;
        }
    }
    let max = STREAM_RECORD_MAX;
    assert_eq!(sizes, [max, max, max, max, (600 << 10) - 4 * max]);
    assert!(out == message);
}

#[test]
fn read_message_reassembles_and_bounds_the_length() {
    let mut p = pair(1024);
    let big = pattern(9, 3000);
    std::thread::scope(|s| {
        let tx = &mut p.tx;
        let big = &big;
        s.spawn(move || {
            let _ = tx.write_message(&[b"small"], &WAIT, deadline()).unwrap();
            let _ = tx.write_message(&[big], &WAIT, deadline()).unwrap();
            let _ = tx.write_message(&[big], &WAIT, deadline()).unwrap();
        });
        let mut out = Vec::new();
        assert_eq!(p.rx.read_message(&mut out, 5, &WAIT, deadline()), Ok(5));
        assert_eq!(out, b"small");
        out.clear();
        assert_eq!(
            p.rx.read_message(&mut out, 3000, &WAIT, deadline()),
            Ok(3000)
        );
        assert_eq!(&out, big);
        out.clear();
        assert_eq!(
            p.rx.read_message(&mut out, 2999, &WAIT, deadline()),
            Err(ReadMessageError::TooLarge { max: 2999 })
        );
        // Refused at its last fragment, which is released with the rest.
        assert!(out.len() < 3000);
    });
}

#[test]
fn a_message_of_a_record_or_less_is_one_record() {
    let mut p = pair(256);
    let _ = p.tx.write_message(&[&[5; 120]], &WAIT, deadline()).unwrap();
    assert_eq!(p.read(), Some((vec![5; 120], true)));
    let _ = p.tx.write_message(&[], &WAIT, deadline()).unwrap();
    assert_eq!(p.read(), Some((vec![], true)));
}

#[test]
fn a_byte_stream_survives_any_chunking() {
    let mut p = pair(256);
    let data = pattern(11, 20_000);
    let (mut sent, mut got) = (0, Vec::new());
    let mut chunk = 1;
    while got.len() < data.len() {
        if sent < data.len() {
            let end = (sent + 333).min(data.len());
            if let Ok((n, _)) = p.tx.write_some(&[&data[sent..end]]) {
                sent += n;
            }
        }
        let mut buf = vec![0; chunk];
        while let Some((n, _)) = p.rx.try_read_bytes(&mut buf).unwrap() {
            got.extend_from_slice(&buf[..n]);
        }
        chunk = chunk % 37 + 1;
    }
    assert_eq!(got, data);
}

#[test]
fn a_record_read_in_part_is_continued_by_any_read() {
    let mut p = pair(256);
    let _ = p.tx.try_write(&[]).unwrap();
    let _ = p.tx.try_write(&[b"hello world"]).unwrap();
    let _ = p.tx.try_write(&[b"!"]).unwrap();
    let mut buf = [0; 5];
    // The empty record is skipped.
    assert_eq!(p.rx.try_read_bytes(&mut buf).unwrap().map(|r| r.0), Some(5));
    assert_eq!(&buf, b"hello");
    assert_eq!(p.read(), Some((b" world".to_vec(), true)));
    assert_eq!(p.rx.try_read_bytes(&mut buf).unwrap().map(|r| r.0), Some(1));
    assert_eq!(p.rx.try_read_bytes(&mut buf).unwrap(), None);
    // Nothing asked, nothing taken.
    let _ = p.tx.try_write(&[b"abc"]).unwrap();
    assert_eq!(p.rx.try_read_bytes(&mut []).unwrap().map(|r| r.0), Some(0));
    let _ = p.tx.close();
    let mut buf = [0; 8];
    assert_eq!(
        p.rx.read_bytes(&mut buf, &WAIT, deadline()).map(|r| r.0),
        Ok(3)
    );
    assert_eq!(
        p.rx.read_bytes(&mut buf, &WAIT, deadline()),
        Err(crate::ReadError::Closed)
    );
}
