//! The decoders against hostile input: random bytes, truncations and bit flips
//! of valid frames. They must never panic, never accept a truncated frame, and
//! never buffer more than the maximum frame size allows.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tubeway_proto::codec::{self, tag};
use tubeway_proto::{Decoded, Decoder, Message, MAX_MESSAGE_SIZE_LIMIT};

/// The decoders' limit in these tests.
const MAX_FRAME: usize = 64 * 1024;
/// Largest chunk fed to the streaming decoder at once.
const MAX_CHUNK: usize = 4096;
/// What a buffer may grow to: the decoder reserves at most `MAX_FRAME` at a
/// time, plus the growth policy of `BytesMut` and the chunk being appended.
const CAPACITY_BOUND: usize = 3 * MAX_FRAME + 2 * MAX_CHUNK;
/// Each randomised test stops after this long, whatever its iteration count.
const TIME_BUDGET: Duration = Duration::from_secs(3);

fn valid_frames() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut frames = Vec::new();
    for path in paths {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for v in doc["vectors"].as_array().unwrap() {
            if v.get("message").is_some() {
                frames.push(hex::decode(v["hex"].as_str().unwrap()).unwrap());
            }
        }
    }
    assert!(frames.len() > 50);
    frames
}

/// A decoded message must survive encode → decode unchanged.
fn assert_round_trip(m: &Message) {
    let again = codec::encode(m, MAX_MESSAGE_SIZE_LIMIT).expect("a decoded message must encode");
    let back = codec::decode(Bytes::from(again.to_vec())).expect("its encoding must decode");
    assert_eq!(&back, m);
}

/// Runs `input` through `codec::decode`; returns whether it decoded.
fn check_whole(input: &[u8]) -> bool {
    match codec::decode(Bytes::copy_from_slice(input)) {
        Ok(m) => {
            let declared = u32::from_le_bytes(input[4..8].try_into().unwrap());
            assert_eq!(
                declared as usize,
                input.len(),
                "accepted a frame of the wrong length"
            );
            assert_round_trip(&m);
            true
        }
        Err(_) => false,
    }
}

/// What a run of the streaming decoder produced.
#[derive(Default, Debug)]
struct StreamOutcome {
    messages: usize,
    items: usize,
    fatal: bool,
}

/// Feeds `input` to a streaming decoder in chunks of random size, checking
/// the buffer's capacity after every step. Stops at a fatal error, as a
/// connection would close.
fn check_stream(input: &[u8], rng: &mut StdRng, max_chunk: usize) -> StreamOutcome {
    let mut d = Decoder::new(MAX_FRAME);
    let mut buf = BytesMut::new();
    let mut out = StreamOutcome::default();
    let mut rest = input;
    while !rest.is_empty() {
        let n = rng.random_range(1..=max_chunk.min(rest.len()));
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            assert!(d.wanted(&buf) <= MAX_FRAME, "wants more than the maximum");
            let step = d.decode(&mut buf);
            assert!(
                buf.capacity() <= CAPACITY_BOUND,
                "buffer grew to {} bytes",
                buf.capacity()
            );
            match step {
                Ok(Some(item)) => {
                    out.items += 1;
                    match item {
                        Decoded::Message(m) => {
                            out.messages += 1;
                            assert_round_trip(&m);
                        }
                        Decoded::Invalid { error, .. } => assert!(!error.is_fatal()),
                        Decoded::TooLarge { frame_len, max, .. } => {
                            assert_eq!(max, MAX_FRAME);
                            assert!(frame_len > MAX_FRAME as u64);
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    assert!(e.is_fatal(), "non-fatal error {e:?} returned as Err");
                    out.fatal = true;
                    return out;
                }
            }
        }
    }
    out
}

#[test]
fn every_truncation_is_rejected() {
    let mut rng = StdRng::seed_from_u64(1);
    let deadline = Instant::now() + TIME_BUDGET;
    for frame in valid_frames().iter().filter(|f| f.len() <= 8192) {
        for k in 0..frame.len() {
            let cut = &frame[..k];
            assert!(
                codec::decode(Bytes::copy_from_slice(cut)).is_err(),
                "accepted a frame cut to {k} of {} bytes",
                frame.len()
            );
            // A stream holding part of a valid frame has nothing to give yet.
            let mut d = Decoder::new(MAX_MESSAGE_SIZE_LIMIT);
            let mut buf = BytesMut::from(cut);
            assert!(matches!(d.decode(&mut buf), Ok(None)), "cut to {k}");
            assert_eq!(buf.len(), k, "consumed part of an incomplete frame");
            assert!(k == 0 || !d.is_idle(&buf));
        }
        // Fed in random chunks, a whole frame gives exactly one message.
        let out = check_stream(frame, &mut rng, 7);
        if frame.len() <= MAX_FRAME {
            assert_eq!((out.messages, out.items), (1, 1));
        } else {
            assert_eq!((out.messages, out.items), (0, 1));
        }
        if Instant::now() > deadline {
            break;
        }
    }
}

#[test]
fn bit_flips_never_panic() {
    let mut rng = StdRng::seed_from_u64(2);
    let deadline = Instant::now() + TIME_BUDGET;
    let mut accepted = 0usize;
    let mut tried = 0usize;
    'frames: for frame in valid_frames().iter().filter(|f| f.len() <= 1024) {
        for bit in 0..frame.len() * 8 {
            let mut f = frame.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            if check_whole(&f) {
                accepted += 1;
            }
            check_stream(&f, &mut rng, 64);
            tried += 1;
            if Instant::now() > deadline {
                break 'frames;
            }
        }
    }
    assert!(tried > 1000, "only {tried} flips in the time budget");
    // Flips in payloads, strings, ids and timestamps still give valid frames.
    assert!(accepted > 0);
}

/// A header field with a plausible tag and a length that is sometimes right.
fn random_field(rng: &mut StdRng, t: u8) -> Vec<u8> {
    let len: usize = match t {
        tag::EXPIRES_AT | tag::TIMEOUT if rng.random_bool(0.8) => 8,
        tag::CORRELATION_ID if rng.random_bool(0.8) => 16,
        _ => rng.random_range(0..24),
    };
    let mut v = vec![t];
    let declared = if rng.random_bool(0.95) {
        len as u16
    } else {
        rng.random()
    };
    v.extend_from_slice(&declared.to_le_bytes());
    for _ in 0..len {
        let b = if rng.random_bool(0.8) {
            rng.random_range(b'a'..=b'z')
        } else {
            rng.random()
        };
        v.push(b);
    }
    v
}

/// A frame with a mostly well-formed prefix and header and random content.
fn random_frame(rng: &mut StdRng) -> Vec<u8> {
    let mut header = vec![
        rng.random_range(0..=27),
        if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(0..=18)
        },
        if rng.random_bool(0.9) {
            rng.random_range(0..4)
        } else {
            rng.random()
        },
        if rng.random_bool(0.95) {
            0
        } else {
            rng.random()
        },
    ];
    let mut rest = [0u8; 24];
    rng.fill(&mut rest[..]);
    header.extend_from_slice(&rest);
    let mut t = 0u8;
    for _ in 0..rng.random_range(0..6) {
        let max_step = if rng.random_bool(0.9) { 3 } else { 130 };
        let step = rng.random_range(0..=max_step);
        t = if rng.random_bool(0.95) {
            t.saturating_add(step).max(1)
        } else {
            rng.random()
        };
        header.extend(random_field(rng, t));
    }
    let mut payload = vec![0u8; rng.random_range(0..64)];
    rng.fill(&mut payload[..]);
    let mut frame_len = (12 + header.len() + payload.len()) as u32;
    let mut header_len = header.len() as u32;
    match rng.random_range(0..20) {
        0 => frame_len = rng.random(),
        1 => header_len = rng.random(),
        2 => frame_len = rng.random_range(MAX_FRAME as u32..=u32::MAX),
        3 => frame_len = frame_len.saturating_add(rng.random_range(1..100)),
        _ => {}
    }
    let mut f = b"TW".to_vec();
    f.push(if rng.random_bool(0.97) {
        1
    } else {
        rng.random()
    });
    f.push(if rng.random_bool(0.97) {
        0
    } else {
        rng.random()
    });
    f.extend_from_slice(&frame_len.to_le_bytes());
    f.extend_from_slice(&header_len.to_le_bytes());
    f.extend_from_slice(&header);
    f.extend_from_slice(&payload);
    f
}

#[test]
fn random_frames_never_panic() {
    let mut rng = StdRng::seed_from_u64(3);
    let deadline = Instant::now() + TIME_BUDGET;
    let mut accepted = 0usize;
    let mut iterations = 0usize;
    while iterations < 200_000 && Instant::now() < deadline {
        let f = random_frame(&mut rng);
        if check_whole(&f) {
            accepted += 1;
        }
        iterations += 1;
    }
    assert!(iterations > 1000, "only {iterations} iterations");
    assert!(
        accepted > 0,
        "no random frame was valid: the generator is too crude"
    );
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = StdRng::seed_from_u64(4);
    let deadline = Instant::now() + TIME_BUDGET;
    let mut iterations = 0usize;
    while iterations < 200_000 && Instant::now() < deadline {
        let mut f = vec![0u8; rng.random_range(0..128)];
        rng.fill(&mut f[..]);
        if rng.random_bool(0.5) && f.len() >= 4 {
            f[..4].copy_from_slice(b"TW\x01\x00");
        }
        check_whole(&f);
        check_stream(&f, &mut rng, 16);
        iterations += 1;
    }
    assert!(iterations > 1000, "only {iterations} iterations");
}

/// Long streams mixing valid frames, random frames, oversized frames with
/// absurd declared lengths, and raw noise.
#[test]
fn random_streams_stay_bounded() {
    let mut rng = StdRng::seed_from_u64(5);
    let deadline = Instant::now() + TIME_BUDGET;
    let valid = valid_frames();
    let mut streams = 0usize;
    let mut fatal = 0usize;
    while streams < 2_000 && Instant::now() < deadline {
        let mut s = Vec::new();
        let mut expect_messages = 0usize;
        let mut clean = true;
        for _ in 0..rng.random_range(1..12) {
            match rng.random_range(0..10) {
                0..=4 => {
                    let f = &valid[rng.random_range(0..valid.len())];
                    if clean && f.len() <= MAX_FRAME {
                        expect_messages += 1;
                    }
                    s.extend_from_slice(f);
                }
                5..=7 => {
                    clean = false;
                    s.extend(random_frame(&mut rng));
                }
                8 => {
                    // An oversized frame whose bytes really follow: skipped.
                    let len = rng.random_range(MAX_FRAME + 1..3 * MAX_FRAME);
                    let m = Message::binary(vec![0x5a; len], None);
                    s.extend(codec::encode(&m, MAX_MESSAGE_SIZE_LIMIT).unwrap().to_vec());
                }
                _ => {
                    clean = false;
                    let mut noise = vec![0u8; rng.random_range(1..64)];
                    rng.fill(&mut noise[..]);
                    s.extend(noise);
                }
            }
        }
        let out = check_stream(&s, &mut rng, MAX_CHUNK);
        if out.fatal {
            fatal += 1;
        }
        if clean {
            assert!(
                !out.fatal,
                "valid and oversized frames alone must not break the stream"
            );
            assert_eq!(out.messages, expect_messages);
        } else {
            assert!(out.messages >= expect_messages);
        }
        streams += 1;
    }
    assert!(streams > 20, "only {streams} streams");
    assert!(fatal > 0);
}

/// A declared length of 4 GiB must not make the decoder reserve it.
#[test]
fn absurd_lengths_reserve_nothing() {
    for frame_len in [MAX_FRAME as u32 + 1, 1 << 30, u32::MAX] {
        let mut f = b"TW\x01\x00".to_vec();
        f.extend_from_slice(&frame_len.to_le_bytes());
        f.extend_from_slice(&28u32.to_le_bytes());
        f.extend_from_slice(&[1u8; 28]);
        f[13] = 0;
        f[14] = 0;
        f[15] = 0;
        let mut d = Decoder::new(MAX_FRAME);
        let mut buf = BytesMut::new();
        for &b in &f[..39] {
            buf.extend_from_slice(&[b]);
            assert!(matches!(d.decode(&mut buf), Ok(None)));
            assert!(buf.capacity() <= 1024, "reserved {} bytes", buf.capacity());
        }
        buf.extend_from_slice(&f[39..]);
        match d.decode(&mut buf) {
            Ok(Some(Decoded::TooLarge { frame_len: got, .. })) => {
                assert_eq!(got, u64::from(frame_len));
            }
            other => panic!("{other:?}"),
        }
        assert!(buf.capacity() <= 1024);
        // The rest of the frame is discarded as it arrives, never buffered.
        let mut remaining = u64::from(frame_len) - 40;
        for _ in 0..100 {
            let n = remaining.min(1000) as usize;
            buf.extend_from_slice(&vec![0u8; n]);
            assert!(matches!(d.decode(&mut buf), Ok(None)));
            assert!(buf.is_empty());
            remaining -= n as u64;
            if remaining > 0 {
                assert_eq!(d.wanted(&buf), 0, "wants bytes of a frame it discards");
            }
        }
        // Once the oversized frame is consumed, the next frame decodes.
        if remaining == 0 {
            assert!(d.is_idle(&buf));
            let ping = Message::new(tubeway_proto::MessageType::Ping);
            buf.extend_from_slice(&codec::encode(&ping, MAX_FRAME).unwrap().to_vec());
            match d.decode(&mut buf) {
                Ok(Some(Decoded::Message(m))) => assert_eq!(*m, ping),
                other => panic!("{other:?}"),
            }
        }
    }
}
