//! Codec benchmarks: what encoding and decoding one message costs, with no
//! I/O. Each side of a call pays for one encode and one decode.
//!
//! ```text
//! cargo bench -p tubeway-proto --bench codec
//! ```
//!
//! - `encode/call_64B`: a function call as a client sends it (a 64 B
//!   payload, a destination, a timeout) encoded into a frame.
//! - `decode/call_64B`: that frame decoded, as the broker receives it.
//! - `decode/response_64B`: the response a handler sends back (a
//!   correlation id), decoded as the client receives it.
//! - `encode/5KB`, `decode/5KB`: the same call with a 5 KB payload, which is
//!   never copied (the frame lends it out).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use tubeway_proto::{codec, Message, MessageType, ResponseStatus};

const MAX: usize = 1 << 20;

fn call(payload: usize) -> Message {
    Message::binary(vec![7u8; payload], None)
        .with_type(MessageType::Request)
        .with_destination("echo")
        .with_timeout(Duration::from_secs(5))
}

fn frame(m: &Message) -> Bytes {
    Bytes::from(codec::encode(m, MAX).unwrap().to_vec())
}

fn benches(c: &mut Criterion) {
    let mut encode = c.benchmark_group("encode");
    for (name, len) in [("call_64B", 64), ("5KB", 5000)] {
        let m = call(len);
        encode.bench_function(name, |b| {
            b.iter(|| black_box(codec::encode(black_box(&m), MAX).unwrap()))
        });
    }
    encode.finish();

    let mut decode = c.benchmark_group("decode");
    let response = call(64)
        .response(ResponseStatus::Ok)
        .with_payload_of(&call(64));
    for (name, f) in [
        ("call_64B", frame(&call(64))),
        ("response_64B", frame(&response)),
        ("5KB", frame(&call(5000))),
    ] {
        decode.bench_function(name, |b| {
            b.iter(|| black_box(codec::decode(black_box(f.clone())).unwrap()))
        });
    }
    decode.finish();
}

criterion_group!(codec_benches, benches);
criterion_main!(codec_benches);
