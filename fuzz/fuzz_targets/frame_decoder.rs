//! Arbitrary bytes through both frame decoders. Every message they accept
//! must survive encode → decode unchanged, and the streaming decoder must
//! never buffer much more than its maximum frame size.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use tubeway_proto::{codec, Decoded, Decoder, Message, MAX_MESSAGE_SIZE_LIMIT};

const MAX_FRAME: usize = 64 * 1024;

fn assert_round_trip(m: &Message) {
    let frame = codec::encode(m, MAX_MESSAGE_SIZE_LIMIT).expect("a decoded message must encode");
    let back = codec::decode(Bytes::from(frame.to_vec())).expect("its encoding must decode");
    assert_eq!(&back, m);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = codec::decode(Bytes::copy_from_slice(data)) {
        assert_round_trip(&m);
    }

    // The same bytes as a stream, in chunks whose size depends on the input.
    let chunk = data.len() % 61 + 1;
    let mut decoder = Decoder::new(MAX_FRAME);
    let mut buf = BytesMut::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            assert!(decoder.wanted(&buf) <= MAX_FRAME);
            let step = decoder.decode(&mut buf);
            assert!(
                buf.capacity() <= 4 * MAX_FRAME,
                "buffer grew to {}",
                buf.capacity()
            );
            match step {
                Ok(Some(Decoded::Message(m))) => assert_round_trip(&m),
                Ok(Some(Decoded::Invalid { error, .. })) => assert!(!error.is_fatal()),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    assert!(e.is_fatal());
                    return;
                }
            }
        }
    }
});
