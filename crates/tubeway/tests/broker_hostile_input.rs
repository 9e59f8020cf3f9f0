//! A running broker against hostile peers: random bytes, truncated and
//! oversized frames, invalid frames, silent clients, disconnects mid-frame,
//! refused handshakes. Every case runs over tcp and unix sockets with raw
//! bytes, and after every case a client connected before the attack and a
//! new client must both still be served.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

mod hostile;

use std::time::{Duration, Instant};

use bytes::Bytes;
use hostile::{
    assert_error, echo_request, frame, hello_with, logs, ping, proc_status_kib, Bystander, Event,
    Fixture, Raw, HANDSHAKE_TIMEOUT, MAX_MESSAGE,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tubeway::{ops, Message, MessageType, ResponseStatus};
use tubeway_proto::codec::{self, PREFIX_LEN};
use uuid::Uuid;

/// Byte offsets in a frame (prefix, then the fixed header).
const FRAME_LEN_AT: usize = 4;
const HEADER_LEN_AT: usize = 8;
const TYPE_AT: usize = PREFIX_LEN;
const STATUS_AT: usize = PREFIX_LEN + 1;
const BITS_AT: usize = PREFIX_LEN + 2;
const FIRST_TAG_AT: usize = codec::MIN_FRAME_LEN;

fn put_u32(frame: &mut [u8], at: usize, v: u32) {
    frame[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(frame: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(frame[at..at + 4].try_into().unwrap())
}

/// (1) Random bytes, before and after the handshake: the broker closes the
/// connection, at most after one uncorrelated `bad_request`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_close_the_connection() {
    let fx = Fixture::start("random").await;
    let mut rng = StdRng::seed_from_u64(0x7475_6265_7761_7901);
    for t in &fx.targets {
        let by = Bystander::connect(t).await;
        for round in 0..4 {
            let after_hello = round % 2 == 1;
            let what = format!(
                "{}: random bytes #{round} (after hello: {after_hello})",
                t.name
            );
            let mut junk = vec![0u8; rng.random_range(1024..8192)];
            rng.fill_bytes(&mut junk);
            // Random bytes are not a frame; make sure of it for this seed.
            if junk.starts_with(&codec::MAGIC) {
                junk[0] ^= 0xff;
            }
            let mut raw = if after_hello {
                Raw::handshake(t).await
            } else {
                Raw::connect(t).await
            };
            // The broker may close before it has read everything: a failed
            // write is fine, only a connection left open is not.
            let _ = raw.send(&junk).await;
            let frames = raw.closed_by_broker(&what).await;
            eprintln!("{what}: closed after {} frame(s)", frames.len());
            assert!(frames.len() <= 1, "{what}: {frames:?}");
            if let Some(m) = frames.first() {
                let reason = assert_error(m, ResponseStatus::BadRequest, None, &what);
                assert!(reason.contains("magic"), "{what}: {reason}");
            }
            by.others_still_served(&what).await;
            fx.wait_connections(1, &what).await;
        }
    }
    fx.shutdown().await;
}

/// (2) A truncated frame left idle does not disturb anyone; closing the
/// socket mid-frame is logged and the connection is cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_left_idle_then_closed() {
    let fx = Fixture::start("truncated").await;
    for t in &fx.targets {
        let what = format!("{}: truncated frame", t.name);
        // Settled: the last round waited for its clients to be gone.
        let settled = fx.connections();
        let by = Bystander::connect(t).await;
        let before = fx.connections();
        let mut raw = Raw::handshake(t).await;
        fx.wait_connections(before + 1, &what).await;

        let bytes = frame(&echo_request("this frame is cut short"));
        let cut = bytes.len() / 2;
        raw.send(&bytes[..cut]).await.unwrap();
        // Everyone else is served while the partial frame sits in the broker.
        by.others_still_served(&what).await;
        // ...and the broker neither answers nor drops the idle connection.
        let idle = tokio::time::timeout(HANDSHAKE_TIMEOUT + Duration::from_millis(200), raw.next());
        assert!(
            idle.await.is_err(),
            "{what}: the broker reacted to a partial frame"
        );
        // Still there (the count waited for, as the new client made just
        // before may not have been let go yet).
        fx.wait_connections(before + 1, &what).await;
        by.others_still_served(&what).await;

        let peer = raw.peer.clone();
        drop(raw);
        fx.wait_connections(before, &what).await;
        logs::wait_for(&[
            "peer closed mid-frame",
            &format!("peer={peer} "),
            &format!("partial={cut} "),
        ])
        .await;
        by.others_still_served(&what).await;
        by.leave(&fx, settled, &what).await;
    }
    fx.shutdown().await;
}

/// (3) Declared lengths beyond the maximum are never allocated; a real
/// oversized frame is answered `too_large` and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_are_not_buffered() {
    let fx = Fixture::start("oversized").await;
    let rss_before = proc_status_kib("VmRSS");
    let vm_before = proc_status_kib("VmSize");
    let check_memory = |what: &str| {
        let rss = proc_status_kib("VmRSS");
        let vm = proc_status_kib("VmSize");
        eprintln!("{what}: VmRSS {rss_before} -> {rss} KiB, VmSize {vm_before} -> {vm} KiB");
        // The whole process: broker, clients and the test itself.
        assert!(
            rss.saturating_sub(rss_before) < 64 * 1024,
            "{what}: RSS grew from {rss_before} KiB to {rss} KiB"
        );
        // A reservation of the declared ~4 GiB would show here even untouched.
        assert!(
            vm.saturating_sub(vm_before) < 2 * 1024 * 1024,
            "{what}: virtual size grew from {vm_before} KiB to {vm} KiB"
        );
    };
    let huge = |msg: &Message| {
        let mut head = frame(msg);
        put_u32(&mut head, FRAME_LEN_AT, u32::MAX - 1);
        head.truncate(codec::MIN_FRAME_LEN);
        head
    };

    for t in &fx.targets {
        let by = Bystander::connect(t).await;

        // Before hello, only a prefix declaring ~4 GiB, then nothing: the
        // broker waits for the hello it will not get, then closes.
        let what = format!("{}: 4 GiB prefix before hello", t.name);
        let mut raw = Raw::connect(t).await;
        raw.send(&huge(&ping())[..PREFIX_LEN]).await.unwrap();
        by.others_still_served(&what).await;
        check_memory(&what);
        let frames = raw.closed_by_broker(&what).await;
        assert!(frames.is_empty(), "{what}: {frames:?}");
        check_memory(&what);

        // After hello, the fixed header of a ~4 GiB frame, then nothing: it
        // is answered `too_large` at once and its bytes are discarded.
        let what = format!("{}: 4 GiB frame after hello", t.name);
        let mut raw = Raw::handshake(t).await;
        let big = ping();
        raw.send(&huge(&big)).await.unwrap();
        let r = raw.response_to(big.id).await;
        let reason = assert_error(&r, ResponseStatus::TooLarge, Some(big.id), &what);
        assert!(
            reason.contains(&(u32::MAX - 1).to_string()),
            "{what}: {reason}"
        );
        check_memory(&what);
        // What follows is skipped as it arrives, never kept.
        let zeros = vec![0u8; 64 * 1024];
        for _ in 0..128 {
            raw.send(&zeros).await.unwrap();
        }
        raw.send(&frame(&ping())).await.unwrap(); // swallowed by the skip
        by.others_still_served(&what).await;
        check_memory(&format!("{what}, 8 MiB discarded"));
        drop(raw);

        // A real 2 MiB frame on a connection that completed its handshake:
        // `too_large`, and the same connection keeps working.
        let what = format!("{}: 2 MiB frame", t.name);
        let mut raw = Raw::handshake(t).await;
        let big = Message::binary(vec![0x5a; 2 << 20], None).with_destination("echo");
        let r = raw.call(&big).await;
        assert_error(&r, ResponseStatus::TooLarge, Some(big.id), &what);
        raw.still_usable(&what).await;
        // Just under the limit still goes through.
        let fits = Message::binary(vec![0xa5; MAX_MESSAGE - 256], None).with_destination("echo");
        let r = raw.call(&fits).await;
        assert_eq!(r.status(), ResponseStatus::Ok, "{what}: {r:?}");
        assert_eq!(r.payload.len(), MAX_MESSAGE - 256, "{what}");
        raw.still_usable(&what).await;
        check_memory(&what);
        by.others_still_served(&what).await;
        drop(raw);
        fx.wait_connections(1, &what).await;
    }
    fx.shutdown().await;
}

/// (4) Well-delimited frames with invalid content after the handshake are
/// answered `bad_request`, correlated with their id; the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_frames_are_answered_and_skipped() {
    type Patch = fn(&mut Vec<u8>);
    let cases: &[(&str, Patch, &str)] = &[
        (
            "unknown type 200",
            |f| f[TYPE_AT] = 200,
            "unknown message type 200",
        ),
        (
            "unknown type 0",
            |f| f[TYPE_AT] = 0,
            "unknown message type 0",
        ),
        (
            "unknown status",
            |f| f[STATUS_AT] = 99,
            "unknown response status 99",
        ),
        ("reserved bits", |f| f[BITS_AT] = 0x80, "reserved"),
        ("unknown critical tag", |f| f[FIRST_TAG_AT] = 42, "tag 42"),
        (
            "field cut by header_len",
            |f| {
                let h = get_u32(f, HEADER_LEN_AT);
                put_u32(f, HEADER_LEN_AT, h - 1);
            },
            "truncated",
        ),
    ];
    let fx = Fixture::start("invalid").await;
    for t in &fx.targets {
        let by = Bystander::connect(t).await;
        let mut raw = Raw::handshake(t).await;
        for (name, patch, expected) in cases {
            let what = format!("{}: {name}", t.name);
            let msg = echo_request("patched");
            let mut bytes = frame(&msg);
            patch(&mut bytes);
            raw.send(&bytes).await.unwrap();
            let r = raw.response_to(msg.id).await;
            let reason = assert_error(&r, ResponseStatus::BadRequest, Some(msg.id), &what);
            assert!(reason.contains(expected), "{what}: {reason}");
            raw.still_usable(&what).await;
            by.others_still_served(&what).await;
        }
        drop(raw);
        fx.wait_connections(1, t.name).await;
    }
    fx.shutdown().await;
}

/// (5) A text payload that is not valid in its charset is refused before
/// any handler sees it; the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_payload_is_refused() {
    let fx = Fixture::start("utf8").await;
    let echo_calls = || {
        fx.broker
            .list_functions()
            .into_iter()
            .find(|f| f.name == "echo")
            .unwrap()
            .calls
    };
    for t in &fx.targets {
        let what = format!("{}: invalid UTF-8", t.name);
        let by = Bystander::connect(t).await;
        let mut raw = Raw::handshake(t).await;
        let calls_before = echo_calls();
        for bad in [&b"caf\xc3"[..], b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf"] {
            let mut msg = echo_request("");
            msg.payload = Bytes::copy_from_slice(bad);
            assert_eq!(msg.payload_charset.as_deref(), Some("utf-8"));
            let r = raw.call(&msg).await;
            let reason = assert_error(&r, ResponseStatus::BadRequest, Some(msg.id), &what);
            assert!(reason.contains("utf-8"), "{what}: {reason}");
        }
        assert_eq!(echo_calls(), calls_before, "{what}: the handler ran");
        raw.still_usable(&what).await;
        by.others_still_served(&what).await;
        drop(raw);
        fx.wait_connections(1, &what).await;
    }
    fx.shutdown().await;
}

/// (6) A client that connects and sends nothing is closed after the
/// handshake timeout; nobody else notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_is_closed_after_the_handshake_timeout() {
    let fx = Fixture::start("silent").await;
    for t in &fx.targets {
        let what = format!("{}: silent client", t.name);
        let by = Bystander::connect(t).await;
        let rejected = fx.broker.stats().connections_rejected;
        let mut raw = Raw::connect(t).await;
        let start = Instant::now();
        by.others_still_served(&what).await;
        let frames = raw.closed_by_broker(&what).await;
        let waited = start.elapsed();
        assert!(frames.is_empty(), "{what}: {frames:?}");
        eprintln!("{what}: closed without a word after {waited:?}");
        // The broker's clock starts at accept, a moment before ours.
        assert!(
            waited >= HANDSHAKE_TIMEOUT - Duration::from_millis(100),
            "{what}: closed after {waited:?}"
        );
        logs::wait_for(&["no hello in time", &format!("peer={} ", raw.peer)]).await;
        fx.wait_connections(1, &what).await;
        assert_eq!(fx.broker.stats().connections_rejected, rejected + 1);
        by.others_still_served(&what).await;
    }
    fx.shutdown().await;
}

/// (7) Disconnects at every stage of a frame: each is logged with what was
/// left unread, and the connection is cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_frame_is_cleaned_up() {
    let fx = Fixture::start("midframe").await;
    for t in &fx.targets {
        // Settled: the last round waited for its clients to be gone (closing
        // is asynchronous, so a count taken while one closes would be off).
        let settled = fx.connections();
        let by = Bystander::connect(t).await;
        let before = fx.connections();
        let hello = frame(&hello_with(&ops::Hello::default()));
        let echo = frame(&echo_request("never finished"));
        let large = frame(&Message::binary(vec![1u8; 512 << 10], None).with_destination("echo"));

        // (stage, handshake first?, bytes sent, partial frame the broker holds)
        let stages: Vec<(&str, bool, &[u8], usize)> = vec![
            ("inside the first prefix", false, &hello[..5], 5),
            ("inside the hello header", false, &hello[..30], 30),
            ("inside a request header", true, &echo[..20], 20),
            ("inside a 512 KiB payload", true, &large[..300_001], 300_001),
        ];
        for (stage, handshake, bytes, partial) in stages {
            let what = format!("{}: disconnect {stage}", t.name);
            let mut raw = if handshake {
                Raw::handshake(t).await
            } else {
                Raw::connect(t).await
            };
            raw.send(bytes).await.unwrap();
            let peer = raw.peer.clone();
            drop(raw);
            logs::wait_for(&[
                "peer closed mid-frame",
                &format!("peer={peer} "),
                &format!("partial={partial} "),
            ])
            .await;
            fx.wait_connections(before, &what).await;
            by.others_still_served(&what).await;
        }

        // Inside an oversized frame being discarded: nothing is buffered.
        let what = format!("{}: disconnect inside a discarded frame", t.name);
        let mut raw = Raw::handshake(t).await;
        let big = Message::binary(vec![2u8; 2 << 20], None).with_destination("echo");
        let bytes = frame(&big);
        raw.send(&bytes[..1 << 20]).await.unwrap();
        let r = raw.response_to(big.id).await;
        assert_error(&r, ResponseStatus::TooLarge, Some(big.id), &what);
        let peer = raw.peer.clone();
        drop(raw);
        logs::wait_for(&[
            "peer closed mid-frame",
            &format!("peer={peer} "),
            "partial=0 ",
        ])
        .await;
        fx.wait_connections(before, &what).await;
        by.others_still_served(&what).await;
        by.leave(&fx, settled, &what).await;
    }
    fx.shutdown().await;
}

/// (8) A first frame other than `hello` is answered `bad_request`, then the
/// connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_frame_not_hello_is_refused() {
    let fx = Fixture::start("nohello").await;
    for t in &fx.targets {
        let by = Bystander::connect(t).await;
        let valid: [(&str, Message); 3] = [
            ("ping", ping()),
            ("echo request", echo_request("too early")),
            ("stats", Message::new(MessageType::Stats)),
        ];
        for (name, first) in valid {
            let what = format!("{}: {name} before hello", t.name);
            let rejected = fx.broker.stats().connections_rejected;
            let mut raw = Raw::connect(t).await;
            raw.send(&frame(&first)).await.unwrap();
            let frames = raw.closed_by_broker(&what).await;
            assert_eq!(frames.len(), 1, "{what}: {frames:?}");
            let reason = assert_error(
                &frames[0],
                ResponseStatus::BadRequest,
                Some(first.id),
                &what,
            );
            assert!(reason.contains("expected hello"), "{what}: {reason}");
            fx.wait_connections(1, &what).await;
            assert_eq!(
                fx.broker.stats().connections_rejected,
                rejected + 1,
                "{what}"
            );
            by.others_still_served(&what).await;
        }

        // A first frame that is not even valid: answered without correlation.
        let what = format!("{}: invalid frame before hello", t.name);
        let mut raw = Raw::connect(t).await;
        let mut bytes = frame(&hello_with(&ops::Hello::default()));
        bytes[TYPE_AT] = 250;
        raw.send(&bytes).await.unwrap();
        let frames = raw.closed_by_broker(&what).await;
        assert_eq!(frames.len(), 1, "{what}: {frames:?}");
        let reason = assert_error(&frames[0], ResponseStatus::BadRequest, None, &what);
        assert!(reason.contains("expected hello"), "{what}: {reason}");
        fx.wait_connections(1, &what).await;
        by.others_still_served(&what).await;
    }
    fx.shutdown().await;
}

/// (9) A `hello` offering no version the broker speaks is answered
/// `unsupported_version`, then the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_versions_are_refused() {
    let fx = Fixture::start("versions").await;
    for t in &fx.targets {
        let by = Bystander::connect(t).await;
        for (min, max) in [(9, 9), (2, 255), (0, 0)] {
            let what = format!("{}: hello for versions {min}..={max}", t.name);
            let hello = hello_with(&ops::Hello {
                min_version: min,
                max_version: max,
                ..ops::Hello::default()
            });
            let mut raw = Raw::connect(t).await;
            raw.send(&frame(&hello)).await.unwrap();
            let frames = raw.closed_by_broker(&what).await;
            assert_eq!(frames.len(), 1, "{what}: {frames:?}");
            let reason = assert_error(
                &frames[0],
                ResponseStatus::UnsupportedVersion,
                Some(hello.id),
                &what,
            );
            assert!(
                reason.contains(&format!("{min}..={max}")),
                "{what}: {reason}"
            );
            fx.wait_connections(1, &what).await;
            by.others_still_served(&what).await;
        }

        // A hello whose body is not a hello: bad_request, closed.
        let what = format!("{}: hello with a bad body", t.name);
        let hello = Message::plain_text("hi").with_type(MessageType::Hello);
        let mut raw = Raw::connect(t).await;
        raw.send(&frame(&hello)).await.unwrap();
        let frames = raw.closed_by_broker(&what).await;
        assert_eq!(frames.len(), 1, "{what}: {frames:?}");
        assert_error(
            &frames[0],
            ResponseStatus::BadRequest,
            Some(hello.id),
            &what,
        );
        fx.wait_connections(1, &what).await;
        by.others_still_served(&what).await;
    }
    fx.shutdown().await;
}

/// (10) Framing errors after a good handshake (bad magic, version, flags,
/// lengths) are fatal: one uncorrelated `bad_request`, then the broker closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_errors_after_the_handshake_close_the_connection() {
    type Patch = fn(&mut Vec<u8>);
    let cases: &[(&str, Patch, &str)] = &[
        ("bad magic", |f| f[..2].copy_from_slice(b"XX"), "magic"),
        ("version 2", |f| f[2] = 2, "version 2"),
        ("unknown flags", |f| f[3] = 0x01, "flags"),
        (
            "header_len below 28",
            |f| put_u32(f, HEADER_LEN_AT, 27),
            "lengths",
        ),
        (
            "header_len past frame_len",
            |f| {
                let n = get_u32(f, FRAME_LEN_AT);
                put_u32(f, HEADER_LEN_AT, n);
            },
            "lengths",
        ),
    ];
    let fx = Fixture::start("framing").await;
    for t in &fx.targets {
        let by = Bystander::connect(t).await;
        for (name, patch, expected) in cases {
            let what = format!("{}: {name} after hello", t.name);
            let mut raw = Raw::handshake(t).await;
            raw.still_usable(&what).await;
            let msg = echo_request("framing lost");
            let mut bytes = frame(&msg);
            patch(&mut bytes);
            raw.send(&bytes).await.unwrap();
            let frames = raw.closed_by_broker(&what).await;
            assert_eq!(frames.len(), 1, "{what}: {frames:?}");
            let reason = assert_error(&frames[0], ResponseStatus::BadRequest, None, &what);
            assert!(reason.contains(expected), "{what}: {reason}");
            assert!(reason.contains("closing"), "{what}: {reason}");
            fx.wait_connections(1, &what).await;
            by.others_still_served(&what).await;
        }
    }
    fx.shutdown().await;
}

/// (11) `requeue` puts back only what this connection's own recent poll
/// was handed: a forged one (unknown poll, a message the poll was not
/// handed, or one put back already) is an offer, so it neither jumps the
/// queue nor fills it past its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_requeue_neither_jumps_nor_overfills_a_queue() {
    let fx = Fixture::start("requeue").await;
    for t in &fx.targets {
        let what = |case: &str| format!("{}: {case}", t.name);
        let q = format!("requeue-{}", t.name);
        let mut raw = Raw::handshake(t).await;
        let create = Message::serialize(&ops::CreateQueue {
            capacity: 2,
            kind: ops::QueueKind::Bounded,
            durable: false,
        })
        .unwrap()
        .with_type(MessageType::CreateQueue)
        .with_destination(&q);
        assert_eq!(raw.call(&create).await.status(), ResponseStatus::Ok);
        let offer = |text: &str| {
            Message::plain_text(text)
                .with_type(MessageType::Offer)
                .with_destination(&q)
        };
        for text in ["a", "b"] {
            assert_eq!(raw.call(&offer(text)).await.status(), ResponseStatus::Ok);
        }
        let poll = || Message::new(MessageType::Poll).with_destination(&q);
        let requeue = |m: &Message, poll: Uuid| {
            let mut back = m.clone().with_type(MessageType::Requeue);
            back.response_status = None;
            back.correlation_id = Some(poll);
            back
        };

        // A poll that nobody made: offered, and the queue is full.
        let forged = requeue(&offer("x"), Uuid::new_v4());
        let r = raw.call(&forged).await;
        assert_error(
            &r,
            ResponseStatus::QueueFull,
            Some(forged.id),
            &what("unknown poll"),
        );

        // The real thing goes back to the head, past the capacity.
        let p = poll();
        let a = raw.call(&p).await;
        assert_eq!(a.text_payload().unwrap(), "a", "{}", what("first poll"));
        assert_eq!(raw.call(&offer("c")).await.status(), ResponseStatus::Ok);
        // The poll's id with another message's is no requeue either.
        let mut wrong = requeue(&a, p.id);
        wrong.id = Uuid::new_v4();
        let r = raw.call(&wrong).await;
        assert_error(
            &r,
            ResponseStatus::QueueFull,
            Some(wrong.id),
            &what("other message"),
        );
        let back = requeue(&a, p.id);
        assert_eq!(
            raw.call(&back).await.status(),
            ResponseStatus::Ok,
            "{}",
            what("requeue")
        );
        // Only once.
        let again = requeue(&a, p.id);
        let r = raw.call(&again).await;
        assert_error(
            &r,
            ResponseStatus::QueueFull,
            Some(again.id),
            &what("put back twice"),
        );

        let status = Message::new(MessageType::QueueStatus).with_destination(&q);
        let s: ops::QueueStatus = raw.call(&status).await.data_payload_as().unwrap();
        assert_eq!(s.size, 3, "{}", what("size"));
        for want in ["a", "b", "c"] {
            let m = raw.call(&poll()).await;
            assert_eq!(m.text_payload().unwrap(), want, "{}", what("order"));
            assert_eq!(m.r#type, MessageType::Response);
        }
        raw.still_usable(&what("after")).await;
    }
    fx.shutdown().await;
}

/// The helpers' own frames are what the broker expects (guards the patches above).
#[test]
fn patch_offsets_match_the_codec() {
    let msg = echo_request("x");
    let bytes = frame(&msg);
    assert_eq!(&bytes[..2], &codec::MAGIC);
    assert_eq!(get_u32(&bytes, FRAME_LEN_AT) as usize, bytes.len());
    assert_eq!(bytes[TYPE_AT], MessageType::Request.code());
    assert_eq!(bytes[FIRST_TAG_AT], codec::tag::DESTINATION);
    assert!(matches!(
        codec::decode(Bytes::from(bytes)),
        Ok(m) if m == msg
    ));
    // An event type the harness never expects from the broker still prints.
    let _ = format!("{:?}", Event::Eof);
}
