//! A checked stream of messages for the stress tests: varied sizes (most
//! small, a few fragmented), each with a sequence number and a CRC-32C of
//! its payload, written as two parts (head and payload) and verified on
//! arrival.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tubeway_ring::{Consumer, Producer, ReadMessageError, WaitStrategy};

/// Bytes of message head: sequence number, payload length, CRC.
const HEAD: usize = 16;

/// Longest payload: several times the largest record of the test rings.
pub const MAX_PAYLOAD: usize = 200 * 1024;

/// How long any one read or write may wait: the bound on a stuck test.
pub const STALL: Duration = Duration::from_secs(60);

/// The source of payload bytes: random, so any misplaced byte shows.
fn noise() -> &'static [u8] {
    static NOISE: OnceLock<Vec<u8>> = OnceLock::new();
    NOISE.get_or_init(|| {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        (0..MAX_PAYLOAD * 2)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

/// A cheap hash of (stream, seq), for sizes and offsets.
fn mix(stream: u64, seq: u64) -> u64 {
    let mut x = (stream << 48) ^ seq ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The payload of message `seq` of `stream`: mostly a few bytes, sometimes
/// a few KiB, one in a thousand up to 200 KiB.
pub fn payload(stream: u64, seq: u64) -> &'static [u8] {
    let r = mix(stream, seq);
    let len = match r % 1000 {
        0 => (r >> 10) as usize % MAX_PAYLOAD,
        1..=49 => (r >> 10) as usize % 8192,
        50..=249 => (r >> 10) as usize % 512,
        _ => (r >> 10) as usize % 33,
    };
    let start = (r >> 32) as usize % MAX_PAYLOAD;
    &noise()[start..start + len]
}

/// Writes `count` messages of `stream`, then closes.
pub fn write_stream(tx: &mut Producer, stream: u64, count: u64, strategy: &WaitStrategy) {
    for seq in 0..count {
        let payload = payload(stream, seq);
        let mut head = [0u8; HEAD];
        head[..8].copy_from_slice(&seq.to_le_bytes());
        head[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[12..].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let _ = tx
            .write_message(&[&head, payload], strategy, Some(Instant::now() + STALL))
            .unwrap_or_else(|e| panic!("stream {stream} message {seq}: {e}"));
    }
    let _ = tx.close();
}

/// Reads `count` messages of `stream` and checks each, then expects the
/// writer's close.
pub fn read_stream(rx: &mut Consumer, stream: u64, count: u64, strategy: &WaitStrategy) {
    let mut buf = Vec::with_capacity(HEAD + MAX_PAYLOAD);
    for seq in 0..count {
        buf.clear();
        let deadline = Some(Instant::now() + STALL);
        let len = rx
            .read_message(&mut buf, HEAD + MAX_PAYLOAD, strategy, deadline)
            .unwrap_or_else(|e| panic!("stream {stream} message {seq}: {e}"));
        assert_eq!(len, buf.len());
        let (head, body) = buf.split_at(HEAD);
        let got_seq = u64::from_le_bytes(head[..8].try_into().unwrap());
        let got_len = u32::from_le_bytes(head[8..12].try_into().unwrap()) as usize;
        let got_crc = u32::from_le_bytes(head[12..].try_into().unwrap());
        assert_eq!(got_seq, seq, "stream {stream}: sequence");
        assert_eq!(got_len, body.len(), "stream {stream} message {seq}: length");
        assert_eq!(
            got_crc,
            crc32c::crc32c(body),
            "stream {stream} message {seq}: crc"
        );
        assert_eq!(body, payload(stream, seq), "stream {stream} message {seq}");
    }
    buf.clear();
    assert_eq!(
        rx.read_message(&mut buf, 1, strategy, Some(Instant::now() + STALL)),
        Err(ReadMessageError::Closed),
        "stream {stream}: expected the end"
    );
}
