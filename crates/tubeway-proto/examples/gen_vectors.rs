//! Regenerates the wire test vectors in `spec/vectors/`.
//!
//! ```text
//! cargo run -p tubeway-proto --example gen_vectors
//! ```
//!
//! The committed JSON files are the source of truth: this program only makes
//! them easy to extend. It checks every vector against the codec before it
//! writes anything, and fails if a message type, response status or decode
//! error kind has no vector.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Map, Value};
use tubeway_proto::codec::{self, tag, DecodeError};
use tubeway_proto::ops;
use tubeway_proto::{
    Message, MessageType, ResponseStatus, MAX_MESSAGE_SIZE_LIMIT, MIME_BINARY, MIME_JSON, MIME_TEXT,
};
use uuid::Uuid;

/// Base timestamp of the vectors: 2023-11-14T22:13:20Z.
const TS: u64 = 1_700_000_000_000;

fn id(n: u32) -> Uuid {
    Uuid::from_u128(0x7d44_4840_9dc0_41d1_b245_5ffd_0000_0000 + u128::from(n))
}

/// A message of `t` with a fixed id and timestamp derived from `n`.
fn msg(n: u32, t: MessageType) -> Message {
    let mut m = Message::new(t);
    m.id = id(n);
    m.timestamp = TS + u64::from(n) * 1000;
    m
}

fn data(m: Message, v: &Value) -> Message {
    m.with_data(v)
}

fn text(m: Message, s: &str) -> Message {
    m.with_text(s, MIME_TEXT, "utf-8")
}

fn response(n: u32, status: ResponseStatus, to: u32) -> Message {
    let mut m = msg(n, MessageType::Response);
    m.response_status = Some(status);
    m.correlation_id = Some(id(to));
    m
}

/// The JSON form of a message with its keys in model order.
#[derive(Serialize)]
struct Ordered {
    id: Value,
    r#type: Value,
    oneway: Value,
    durable: Value,
    response_status: Value,
    timestamp: Value,
    expires_at: Value,
    timeout: Value,
    request_id: Value,
    correlation_id: Value,
    subject: Value,
    destination: Value,
    reply_to: Value,
    payload_mimetype: Value,
    payload_charset: Value,
    payload_encoding: Value,
    payload: Value,
}

fn ordered(m: &Message) -> Ordered {
    let mut map: Map<String, Value> = m.to_map();
    let mut take = |k: &str| map.remove(k).unwrap_or_else(|| panic!("to_map lacks {k}"));
    let o = Ordered {
        id: take("id"),
        r#type: take("type"),
        oneway: take("oneway"),
        durable: take("durable"),
        response_status: take("response_status"),
        timestamp: take("timestamp"),
        expires_at: take("expires_at"),
        timeout: take("timeout"),
        request_id: take("request_id"),
        correlation_id: take("correlation_id"),
        subject: take("subject"),
        destination: take("destination"),
        reply_to: take("reply_to"),
        payload_mimetype: take("payload_mimetype"),
        payload_charset: take("payload_charset"),
        payload_encoding: take("payload_encoding"),
        payload: take("payload"),
    };
    assert!(
        map.is_empty(),
        "to_map has fields the generator does not know: {map:?}"
    );
    o
}

#[derive(Serialize)]
struct Vector {
    name: String,
    description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reencode: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Ordered>,
    hex: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fatal: Option<bool>,
}

#[derive(Serialize)]
struct File {
    description: &'static str,
    vectors: Vec<Vector>,
}

fn error_kind(e: &DecodeError) -> &'static str {
    match e {
        DecodeError::BadMagic(_) => "bad_magic",
        DecodeError::UnsupportedVersion(_) => "unsupported_version",
        DecodeError::UnknownFlags(_) => "unknown_flags",
        DecodeError::BadLength { .. } => "bad_length",
        DecodeError::Truncated(_) => "truncated",
        DecodeError::UnknownType(_) => "unknown_type",
        DecodeError::UnknownStatus(_) => "unknown_status",
        DecodeError::ReservedBits(_) => "reserved_bits",
        DecodeError::UnknownTag(_) => "unknown_tag",
        DecodeError::TagOrder(_) => "tag_order",
        DecodeError::FieldLength { .. } => "field_length",
        DecodeError::InvalidUtf8(_) => "invalid_utf8",
        other => panic!("no vector kind for {other:?}"),
    }
}

#[derive(Default)]
struct Group {
    vectors: Vec<Vector>,
}

impl Group {
    /// A valid vector: `m` encodes to the frame, and the frame decodes to `m`.
    fn valid(&mut self, name: &str, description: &str, m: Message) {
        let frame = codec::encode(&m, MAX_MESSAGE_SIZE_LIMIT)
            .expect(name)
            .to_vec();
        let back = codec::decode(Bytes::from(frame.clone())).expect(name);
        assert_eq!(back, m, "{name}: decode");
        let via_json = Message::from_json_value(&Value::Object(m.to_map())).expect(name);
        assert_eq!(via_json, m, "{name}: JSON form does not round-trip");
        self.push_valid(name, description, &m, frame, None);
    }

    /// A valid frame written by hand that decodes to `m` but that `m` does not
    /// encode back to (it carries optional fields the decoder skips).
    fn valid_raw(&mut self, name: &str, description: &str, m: Message, frame: Vec<u8>) {
        let back = codec::decode(Bytes::from(frame.clone())).expect(name);
        assert_eq!(back, m, "{name}: decode");
        let again = codec::encode(&m, MAX_MESSAGE_SIZE_LIMIT).unwrap().to_vec();
        assert_ne!(again, frame, "{name}: re-encodes identically; use valid()");
        self.push_valid(name, description, &m, frame, Some(false));
    }

    fn push_valid(
        &mut self,
        name: &str,
        description: &str,
        m: &Message,
        frame: Vec<u8>,
        reencode: Option<bool>,
    ) {
        assert!(
            self.vectors.iter().all(|v| v.name != name),
            "duplicate {name}"
        );
        self.vectors.push(Vector {
            name: name.into(),
            description: description.into(),
            reencode,
            message: Some(ordered(m)),
            hex: hex::encode(frame),
            error: None,
            fatal: None,
        });
    }

    /// An invalid frame that must fail with `kind`.
    fn invalid(&mut self, name: &str, description: &str, frame: Vec<u8>, kind: &'static str) {
        let err = codec::decode(Bytes::from(frame.clone()))
            .map(|m| panic!("{name}: decoded {m:?}"))
            .unwrap_err();
        assert_eq!(error_kind(&err), kind, "{name}: {err}");
        assert!(
            self.vectors.iter().all(|v| v.name != name),
            "duplicate {name}"
        );
        self.vectors.push(Vector {
            name: name.into(),
            description: description.into(),
            reencode: None,
            message: None,
            hex: hex::encode(frame),
            error: Some(kind),
            fatal: Some(err.is_fatal()),
        });
    }

    fn into_file(self, description: &'static str) -> File {
        File {
            description,
            vectors: self.vectors,
        }
    }
}

fn messages() -> File {
    let mut g = Group::default();
    for (i, &t) in MessageType::ALL.iter().enumerate() {
        let n = 100 + i as u32;
        let (m, what) = match t {
            MessageType::Request => (
                text(msg(n, t), "hello")
                    .with_destination("echo")
                    .with_request_id("req-1")
                    .with_timeout(Duration::from_millis(5000)),
                "call function `echo` with a text payload and a 5 s timeout",
            ),
            MessageType::Response => {
                let m =
                    text(response(n, ResponseStatus::Ok, 100), "hello").with_request_id("req-1");
                (m, "ok answer to the request vector, request_id echoed")
            }
            MessageType::Publish => (
                text(msg(n, t), "match starts at 20:00")
                    .with_destination("news")
                    .with_subject("sports"),
                "publish a text message with a subject to topic `news`",
            ),
            MessageType::Subscribe => (
                data(msg(n, t), &json!(ops::Subscribe { buffer: Some(64) }))
                    .with_destination("news"),
                "subscribe to `news` with a 64-message buffer (ops::Subscribe body)",
            ),
            MessageType::Unsubscribe => {
                let mut m = msg(n, t).with_destination("news");
                m.correlation_id = Some(id(103));
                (m, "end the subscription made by the subscribe vector")
            }
            MessageType::Offer => {
                let mut m = msg(n, t)
                    .with_binary(
                        vec![0x00, 0x01, 0xfe, 0xff],
                        Some("application/octet-stream"),
                    )
                    .with_destination("jobs")
                    .with_durable(true)
                    .with_ttl(Duration::from_secs(60))
                    .with_timeout(Duration::from_millis(1000));
                m.request_id = Some("job-7".into());
                (
                    m,
                    "offer a durable binary message that expires in 60 s; wait up to 1 s if the queue is full",
                )
            }
            MessageType::Poll => (
                msg(n, t)
                    .with_destination("jobs")
                    .with_timeout(Duration::from_millis(30_000)),
                "take a message from `jobs`, waiting up to 30 s",
            ),
            MessageType::CreateQueue => (
                data(
                    msg(n, t),
                    &json!(ops::CreateQueue {
                        capacity: 1000,
                        kind: ops::QueueKind::Bounded,
                        durable: false
                    }),
                )
                .with_destination("jobs"),
                "create bounded queue `jobs` of 1000 messages (ops::CreateQueue body)",
            ),
            MessageType::RemoveQueue => (msg(n, t).with_destination("jobs"), "remove queue `jobs`"),
            MessageType::QueueStatus => {
                (msg(n, t).with_destination("jobs"), "status of queue `jobs`")
            }
            MessageType::ExistsQueue => (
                msg(n, t).with_destination("jobs"),
                "whether queue `jobs` exists",
            ),
            MessageType::CreateTemporaryQueue => (
                data(
                    msg(n, t),
                    &json!(ops::CreateQueue {
                        capacity: 16,
                        kind: ops::QueueKind::Circular,
                        durable: false
                    }),
                ),
                "create a circular temporary queue; the broker picks the name",
            ),
            MessageType::ListQueues => (msg(n, t), "status of every queue"),
            MessageType::CreateTopic => (msg(n, t).with_destination("news"), "create topic `news`"),
            MessageType::RemoveTopic => (msg(n, t).with_destination("news"), "remove topic `news`"),
            MessageType::TopicStatus => {
                (msg(n, t).with_destination("news"), "status of topic `news`")
            }
            MessageType::ListTopics => (msg(n, t), "status of every topic"),
            MessageType::CreateFunction => (
                msg(n, t).with_destination("resize-image"),
                "register this connection as a worker for `resize-image`",
            ),
            MessageType::RemoveFunction => (
                msg(n, t).with_destination("resize-image"),
                "stop serving (or remove) function `resize-image`",
            ),
            MessageType::FunctionStatus => (
                msg(n, t).with_destination("resize-image"),
                "status of function `resize-image`",
            ),
            MessageType::ListFunctions => (msg(n, t), "status of every function"),
            MessageType::Stats => (msg(n, t), "broker statistics"),
            MessageType::Hello => (
                data(
                    msg(n, t),
                    &json!(ops::Hello {
                        min_version: 1,
                        max_version: 1,
                        capabilities: vec![ops::CAP_PING.into(), ops::CAP_WORKERS.into()],
                        client: "tubeway-rust/0.1.0".into(),
                    }),
                ),
                "handshake offering version 1 and capabilities ping, workers (ops::Hello body)",
            ),
            MessageType::Ping => (msg(n, t), "liveness probe: the smallest possible frame"),
            MessageType::Cancel => {
                let mut m = msg(n, t);
                m.correlation_id = Some(id(n + 1000));
                m.oneway = true;
                (
                    m,
                    "withdraws the waiting request named by correlation_id (a poll, say)",
                )
            }
            MessageType::Requeue => {
                // As the poll's answer carried it, the answer's own fields
                // aside: its id and payload, and the queue's name.
                let mut m = msg(n, t).with_destination("jobs").with_text(
                    "resize 42.png",
                    MIME_TEXT,
                    "utf-8",
                );
                m.correlation_id = Some(id(n + 1000));
                m.oneway = true;
                (
                    m,
                    "puts a message handed to the poll named by correlation_id back at the head of queue `jobs`",
                )
            }
            other => panic!("add a vector for message type {other}"),
        };
        g.valid(t.as_str(), what, m);
    }
    g.into_file("One vector per message type, as a client or broker would send it.")
}

fn responses() -> File {
    let mut g = Group::default();
    for (i, &s) in ResponseStatus::ALL.iter().enumerate() {
        let n = 200 + i as u32;
        let reason = match s {
            ResponseStatus::Ok => None,
            ResponseStatus::ServerError => Some("worker disconnected"),
            ResponseStatus::BadRequest => Some("first frame must be hello"),
            ResponseStatus::HandlerError => Some("handler panicked"),
            ResponseStatus::QueueNotFound => Some("no queue named jobs"),
            ResponseStatus::QueueEmpty => Some("queue jobs is empty"),
            ResponseStatus::QueueFull => Some("queue jobs is full"),
            ResponseStatus::TopicNotFound => Some("no topic named news"),
            ResponseStatus::FunctionNotFound => Some("no function named resize-image"),
            ResponseStatus::TooLarge => Some("message is 31457280 bytes; the limit is 20971520"),
            ResponseStatus::Timeout => Some("no response within 5000 ms"),
            ResponseStatus::Unauthorized => Some("not authenticated"),
            ResponseStatus::NoPermission => Some("not permitted"),
            ResponseStatus::Conflict => Some("queue jobs exists with other settings"),
            ResponseStatus::Unavailable => Some("connection limit reached"),
            ResponseStatus::UnsupportedVersion => {
                Some("no protocol version in common; this broker speaks 1")
            }
            ResponseStatus::Expired => Some("message expired before it was queued"),
            other => panic!("add a vector for response status {other}"),
        };
        let mut m = response(n, s, 100).with_request_id("req-1");
        let description = match reason {
            Some(r) => {
                m = text(m, r);
                format!("{s} response with its reason as a text/plain payload")
            }
            None => format!("{s} response with no payload"),
        };
        g.valid(s.as_str(), &description, m);
    }

    let welcome = data(
        response(250, ResponseStatus::Ok, 122),
        &json!(ops::Welcome {
            version: 1,
            capabilities: vec![ops::CAP_PING.into(), ops::CAP_WORKERS.into()],
            max_message_size: 20 * 1024 * 1024,
            server: "tubeway-broker/0.1.0".into(),
            connection_id: 17,
        }),
    );
    g.valid(
        "ok_welcome",
        "ok answer to hello carrying ops::Welcome",
        welcome,
    );

    let status = data(
        response(251, ResponseStatus::Ok, 109),
        &json!(ops::QueueStatus {
            name: "jobs".into(),
            kind: ops::QueueKind::Bounded,
            capacity: 1000,
            size: 3,
            durable: false,
            temporary: false,
        }),
    );
    g.valid(
        "ok_queue_status",
        "ok answer to queue_status carrying ops::QueueStatus",
        status,
    );

    // A poll answer carries the queued message's own fields.
    let mut polled = Message::new(MessageType::Response);
    polled.id = id(105);
    polled.timestamp = TS + 105 * 1000;
    polled.expires_at = Some(TS + 105 * 1000 + 60_000);
    polled.request_id = Some("job-7".into());
    polled.subject = Some("thumbnail".into());
    polled.destination = Some("jobs".into());
    polled.reply_to = Some("results".into());
    polled.response_status = Some(ResponseStatus::Ok);
    polled.correlation_id = Some(id(106));
    let polled = polled.with_binary(
        vec![0x00, 0x01, 0xfe, 0xff],
        Some("application/octet-stream"),
    );
    g.valid(
        "ok_poll",
        "ok answer to poll: the queued message's id, timestamp, expires_at, request_id, subject, destination, reply_to and payload, with correlation_id = the poll's id",
        polled,
    );

    let mut worker_call = text(msg(252, MessageType::Request), "photo.jpg")
        .with_destination("resize-image")
        .with_request_id("req-9")
        .with_timeout(Duration::from_millis(2000));
    worker_call.correlation_id = Some(id(117));
    g.valid(
        "worker_request",
        "a call the broker forwards to a remote worker: fresh id, correlation_id = the worker's create_function id",
        worker_call,
    );

    let mut delivery = text(msg(253, MessageType::Publish), "match starts at 20:00")
        .with_destination("news")
        .with_subject("sports");
    delivery.correlation_id = Some(id(103));
    g.valid(
        "publish_delivery",
        "a publish delivered to a subscriber: correlation_id = the subscribe message's id",
        delivery,
    );
    g.into_file("One response per status, plus typical ok bodies and broker deliveries.")
}

fn fields() -> File {
    let mut g = Group::default();
    let base = || msg(300, MessageType::Request);
    g.valid(
        "no_fields",
        "every optional header field absent, no payload",
        base(),
    );
    let mut m = base();
    m.expires_at = Some(TS + 300_000 + 60_000);
    g.valid("expires_at", "only expires_at (tag 1, u64 LE ms)", m);
    g.valid(
        "timeout",
        "only timeout (tag 2, u64 LE ms): 1500 ms",
        base().with_timeout(Duration::from_millis(1500)),
    );
    g.valid(
        "request_id",
        "only request_id (tag 3)",
        base().with_request_id("order-2024-0001"),
    );
    let mut m = base();
    m.correlation_id = Some(Uuid::parse_str("00010203-0405-4607-8809-0a0b0c0d0e0f").unwrap());
    g.valid(
        "correlation_id",
        "only correlation_id (tag 4); bytes 00 01 02 .. 0f show the UUID byte order",
        m,
    );
    g.valid(
        "subject",
        "only subject (tag 5)",
        base().with_subject("eu.orders"),
    );
    g.valid(
        "destination",
        "only destination (tag 6)",
        base().with_destination("orders"),
    );
    g.valid(
        "reply_to",
        "only reply_to (tag 7)",
        base().with_reply_to("answers"),
    );
    let mut m = base();
    m.payload_mimetype = Some("application/octet-stream".into());
    g.valid(
        "payload_mimetype",
        "only payload_mimetype (tag 8), with an empty payload",
        m,
    );
    let mut m = base();
    m.payload_charset = Some("utf-8".into());
    g.valid(
        "payload_charset",
        "only payload_charset (tag 9), with no mimetype and no payload",
        m,
    );
    let mut m = text(base(), "all fields")
        .with_destination("orders")
        .with_subject("eu.orders")
        .with_request_id("order-2024-0001")
        .with_reply_to("answers")
        .with_timeout(Duration::from_millis(1500))
        .with_oneway(true)
        .with_durable(true);
    m.id = Uuid::parse_str("00010203-0405-4607-8809-0a0b0c0d0e0f").unwrap();
    m.expires_at = Some(TS + 300_000 + 60_000);
    m.correlation_id = Some(id(1));
    g.valid(
        "all_fields",
        "every header field present (tags 1-9 in order), both bits set; id bytes 00 01 02 .. 0f",
        m,
    );
    g.valid(
        "oneway",
        "oneway bit (bits byte 0x01)",
        base().with_destination("audit").with_oneway(true),
    );
    g.valid(
        "durable",
        "durable bit (bits byte 0x02)",
        base().with_destination("audit").with_durable(true),
    );
    g.valid(
        "oneway_durable",
        "both bits (bits byte 0x03)",
        base()
            .with_destination("audit")
            .with_oneway(true)
            .with_durable(true),
    );
    let mut m = base();
    m.request_id = Some(String::new());
    m.subject = Some(String::new());
    g.valid(
        "empty_strings",
        "request_id and subject present with length 0: present-but-empty is not absent",
        m,
    );
    let mut m = msg(301, MessageType::Request).with_destination("echo");
    m.response_status = Some(ResponseStatus::Ok);
    g.valid(
        "status_on_request",
        "the codec carries response_status on any type; its meaning is for responses",
        m,
    );
    g.into_file("Each optional header field absent and present, and the oneway/durable bits.")
}

fn payloads() -> File {
    let mut g = Group::default();
    let base = |n| msg(n, MessageType::Request).with_destination("echo");
    g.valid(
        "empty",
        "no payload and no mimetype: payload kind empty",
        base(400),
    );
    g.valid(
        "text_utf8",
        "text/plain UTF-8 with non-ASCII characters (2-, 3- and 4-byte sequences)",
        text(base(401), "Grüße, 世界! 🚀"),
    );
    g.valid(
        "text_xml",
        "text in another mimetype: application/xml with charset utf-8 is text because a charset is given",
        base(402).with_text(
            "<?xml version=\"1.0\"?><note lang=\"fr\">été</note>",
            "application/xml",
            "utf-8",
        ),
    );
    let mut m = base(403);
    m.set_payload(Bytes::from_static(b"<p>hi</p>"), Some("text/html"), None);
    g.valid(
        "text_no_charset",
        "text/html without a charset: text because the mimetype is text/*, read as UTF-8",
        m,
    );
    let mut m = base(404);
    m.set_payload(
        Bytes::from_static("naïve".as_bytes()),
        Some("text/plain; charset=utf-8"),
        None,
    );
    g.valid(
        "text_mime_params",
        "mimetype with parameters: the kind is derived from the part before ';'",
        m,
    );
    let mut m = base(405);
    m.set_payload(
        Bytes::from_static(b"Caf\xe9 cr\xe8me \xa3 5"),
        Some(MIME_TEXT),
        Some("iso-8859-1"),
    );
    g.valid(
        "text_latin1",
        "ISO-8859-1 text (\"Café crème £ 5\"); the JSON form gives it as base64 since it is not UTF-8",
        m,
    );
    let mut m = base(406);
    m.set_payload(
        Bytes::from_static(b"plain ascii"),
        Some(MIME_TEXT),
        Some("us-ascii"),
    );
    g.valid("text_ascii", "US-ASCII text", m);
    g.valid(
        "binary_png",
        "binary with a mimetype (the PNG signature)",
        base(407).with_binary(
            vec![0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a],
            Some("image/png"),
        ),
    );
    g.valid(
        "binary_octet_stream",
        "binary as application/octet-stream, every byte value once",
        base(408).with_binary((0..=255u8).collect::<Vec<_>>(), Some(MIME_BINARY)),
    );
    let mut m = base(409);
    m.payload = Bytes::from_static(&[0xde, 0xad, 0xbe, 0xef]);
    g.valid(
        "binary_no_mimetype",
        "payload bytes without a mimetype: binary",
        m,
    );
    g.valid(
        "data_object",
        "structured data: a JSON object as application/json (compact, keys sorted)",
        data(
            base(410),
            &json!({"order": {"id": 42, "items": ["a", "b"], "note": null, "paid": true, "total": 12.5}}),
        ),
    );
    g.valid(
        "data_array",
        "structured data: a JSON array at top level",
        data(base(411), &json!([1, "two", 3.5, false, null, {"k": []}])),
    );
    let mut m = base(412);
    m.set_payload(
        Bytes::from_static(br#"{"event":"created"}"#),
        Some("application/vnd.tubeway.event+json"),
        None,
    );
    g.valid(
        "data_plus_json",
        "a +json mimetype is structured data too",
        m,
    );
    let mut m = base(413);
    m.set_payload(
        Bytes::from_static(&[0x68, 0x69, 0xff, 0xfe]),
        Some(MIME_TEXT),
        Some("utf-8"),
    );
    g.valid(
        "text_invalid_utf8",
        "a text payload that is not valid in its charset: the codec accepts the frame (payloads are opaque to it); a broker answers bad_request; the JSON form gives it as base64",
        m,
    );
    let mut m = base(414);
    m.set_payload(Bytes::from_static(b"{not json"), Some(MIME_JSON), None);
    g.valid(
        "data_invalid_json",
        "application/json that is not valid JSON: opaque to the codec; the JSON form gives it as base64",
        m,
    );
    g.into_file("Each payload kind and how the mimetype and charset select it.")
}

fn limits() -> File {
    let mut g = Group::default();
    let name255: String = "q".repeat(250) + "-1234";
    assert_eq!(name255.len(), 255);
    g.valid(
        "name_255",
        "a destination name of 255 bytes, the longest valid name",
        msg(500, MessageType::Poll).with_destination(name255),
    );
    // 65535 bytes mixing 1-, 2-, 3- and 4-byte characters.
    let mut subject = String::new();
    let pattern = ["a", "é", "€", "🚀"];
    let mut i = 0;
    while subject.len() + 4 <= 65535 - 3 {
        subject.push_str(pattern[i % pattern.len()]);
        i += 1;
    }
    while subject.len() < 65535 {
        subject.push('z');
    }
    assert_eq!(subject.len(), 65535);
    g.valid(
        "field_65535",
        "a subject of 65535 bytes (multi-byte UTF-8), the longest header string",
        msg(501, MessageType::Publish)
            .with_destination("news")
            .with_subject(subject),
    );
    let mut m = msg(502, MessageType::Offer).with_destination("jobs");
    m.timestamp = u64::MAX;
    m.expires_at = Some(u64::MAX);
    m.timeout = Some(Duration::from_millis(u64::MAX));
    g.valid(
        "u64_max",
        "timestamp, expires_at and timeout all 2^64-1 (beyond 2^53: JSON readers need 64-bit integers)",
        m,
    );
    let mut m = msg(503, MessageType::Offer).with_destination("jobs");
    m.timestamp = 0;
    m.expires_at = Some(0);
    m.timeout = Some(Duration::ZERO);
    g.valid(
        "zeros",
        "timestamp, expires_at and timeout all 0 (present, not absent)",
        m,
    );
    let mut m = msg(504, MessageType::Response);
    m.id = Uuid::nil();
    m.correlation_id = Some(Uuid::max());
    m.response_status = Some(ResponseStatus::Ok);
    g.valid(
        "uuid_nil_max",
        "nil id and all-ones correlation_id: the codec does not check UUID versions",
        m,
    );
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    g.valid(
        "payload_4k",
        "a 4096-byte binary payload",
        msg(505, MessageType::Offer)
            .with_destination("jobs")
            .with_binary(payload, Some(MIME_BINARY)),
    );
    g.into_file("Boundary values: longest names and fields, extreme integers, larger payloads.")
}

// ---- hand-built frames -------------------------------------------------------

fn fixed(type_code: u8, status: u8, bits: u8, reserved: u8, n: u32) -> Vec<u8> {
    let mut h = vec![type_code, status, bits, reserved];
    h.extend_from_slice(id(n).as_bytes());
    h.extend_from_slice(&(TS + u64::from(n) * 1000).to_le_bytes());
    h
}

fn tlv(t: u8, value: &[u8]) -> Vec<u8> {
    let mut v = vec![t];
    v.extend_from_slice(&(value.len() as u16).to_le_bytes());
    v.extend_from_slice(value);
    v
}

/// A frame with a correct prefix around `header` (fixed part and fields) and `payload`.
fn assemble(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut f = codec::MAGIC.to_vec();
    f.push(1);
    f.push(0);
    f.extend_from_slice(&((codec::PREFIX_LEN + header.len() + payload.len()) as u32).to_le_bytes());
    f.extend_from_slice(&(header.len() as u32).to_le_bytes());
    f.extend_from_slice(header);
    f.extend_from_slice(payload);
    f
}

fn header(fixed: Vec<u8>, fields: &[Vec<u8>]) -> Vec<u8> {
    let mut h = fixed;
    for f in fields {
        h.extend_from_slice(f);
    }
    h
}

fn request_fixed(n: u32) -> Vec<u8> {
    fixed(MessageType::Request.code(), 0, 0, 0, n)
}

fn extensions() -> File {
    let mut g = Group::default();
    let expected = |n: u32| text(msg(n, MessageType::Request), "hi").with_destination("echo");

    let frame = assemble(
        &header(
            request_fixed(600),
            &[
                tlv(tag::DESTINATION, b"echo"),
                tlv(tag::PAYLOAD_MIMETYPE, b"text/plain"),
                tlv(tag::PAYLOAD_CHARSET, b"utf-8"),
                tlv(128, b""),
            ],
        ),
        b"hi",
    );
    g.valid_raw(
        "optional_tag_128_empty",
        "unknown optional tag 128 with an empty value after the known fields: skipped",
        expected(600),
        frame,
    );

    let frame = assemble(
        &header(
            request_fixed(601),
            &[
                tlv(tag::DESTINATION, b"echo"),
                tlv(tag::PAYLOAD_MIMETYPE, b"text/plain"),
                tlv(tag::PAYLOAD_CHARSET, b"utf-8"),
                tlv(130, &[1, 2, 3]),
                tlv(200, b"trace=abc"),
                tlv(255, &[0xff; 20]),
            ],
        ),
        b"hi",
    );
    g.valid_raw(
        "optional_tags_several",
        "unknown optional tags 130, 200 and 255 with values (255's value is not UTF-8: optional values are opaque): all skipped",
        expected(601),
        frame,
    );

    // Optional tags sort with the others: a future tag 130 before a future
    // critical tag would still come after tag 9, so the only valid place for
    // an optional tag is after every critical one.
    let mut m = msg(602, MessageType::Ping);
    m.request_id = Some("p".into());
    let frame = assemble(
        &header(
            fixed(MessageType::Ping.code(), 0, 0, 0, 602),
            &[tlv(tag::REQUEST_ID, b"p"), tlv(129, &[0; 300])],
        ),
        b"",
    );
    g.valid_raw(
        "optional_tag_only_extra",
        "a ping with request_id and a 300-byte optional tag 129: skipped",
        m,
        frame,
    );
    g.into_file(
        "Frames with unknown optional header tags (128-255): a decoder must skip them. These do not re-encode to the same bytes (\"reencode\": false).",
    )
}

fn invalid() -> File {
    let mut g = Group::default();
    let good = || {
        assemble(
            &header(request_fixed(700), &[tlv(tag::DESTINATION, b"echo")]),
            b"hi",
        )
    };
    let patched = |at: usize, b: u8| {
        let mut f = good();
        f[at] = b;
        f
    };
    let with_lengths = |frame_len: u32, header_len: u32| {
        let mut f = good();
        f[4..8].copy_from_slice(&frame_len.to_le_bytes());
        f[8..12].copy_from_slice(&header_len.to_le_bytes());
        f
    };
    let good_len = good().len() as u32;
    let good_header_len = good_len - 12 - 2;

    // Fatal: the stream's framing is lost.
    g.invalid(
        "bad_magic",
        "magic \"TX\" instead of \"TW\"",
        patched(1, b'X'),
        "bad_magic",
    );
    g.invalid(
        "bad_magic_http",
        "an HTTP request sent to the broker port",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        "bad_magic",
    );
    g.invalid(
        "version_0",
        "version byte 0",
        patched(2, 0),
        "unsupported_version",
    );
    g.invalid(
        "version_2",
        "version byte 2",
        patched(2, 2),
        "unsupported_version",
    );
    g.invalid(
        "flags_compressed",
        "flag bit 0 (compressed payload) is reserved in version 1",
        patched(3, 0x01),
        "unknown_flags",
    );
    g.invalid(
        "flags_high",
        "flag bit 7 set",
        patched(3, 0x80),
        "unknown_flags",
    );
    g.invalid(
        "header_len_short",
        "header_len 27, less than the 28-byte fixed header",
        with_lengths(good_len, 27),
        "bad_length",
    );
    g.invalid(
        "header_len_past_frame",
        "12 + header_len exceeds frame_len",
        with_lengths(good_len, good_len - 11),
        "bad_length",
    );
    g.invalid(
        "frame_len_tiny",
        "frame_len 39, shorter than the smallest frame (40)",
        with_lengths(39, 28),
        "bad_length",
    );
    g.invalid(
        "frame_len_zero",
        "frame_len 0",
        with_lengths(0, good_header_len),
        "bad_length",
    );

    // Truncation.
    g.invalid(
        "short_prefix",
        "11 bytes: not even a whole prefix (a stream decoder waits for more)",
        good()[..11].to_vec(),
        "truncated",
    );
    let f = good();
    g.invalid(
        "short_frame",
        "the last payload byte missing: fewer bytes than frame_len (a stream decoder waits for more)",
        f[..f.len() - 1].to_vec(),
        "truncated",
    );
    g.invalid(
        "short_fixed_header",
        "only the prefix: frame_len says 40 bytes, 12 present",
        good()[..12]
            .iter()
            .copied()
            .enumerate()
            .map(|(i, b)| match i {
                4 => 40,
                5..=7 => 0,
                8 => 28,
                _ => b,
            })
            .collect(),
        "truncated",
    );
    // header_len ends 2 bytes into a field's tag and length.
    let h = header(request_fixed(701), &[tlv(tag::DESTINATION, b"echo")]);
    let cut = assemble(&h[..29], b"");
    g.invalid(
        "field_header_cut",
        "the header section ends 1 byte into a field (no room for its length): the frame is whole, its header is not",
        cut,
        "truncated",
    );
    let mut bad = tlv(tag::DESTINATION, b"echo");
    bad[1] = 10;
    g.invalid(
        "field_value_cut",
        "a field's length (10) runs past the end of the header section (4 bytes left)",
        assemble(&header(request_fixed(702), &[bad]), b""),
        "truncated",
    );
    g.invalid(
        "optional_field_cut",
        "an optional tag's length runs past the header section: skipping needs a valid length",
        assemble(&header(request_fixed(703), &[vec![200, 50, 0, 1, 2]]), b""),
        "truncated",
    );

    // Per-frame errors: the frame is well delimited; answered with bad_request.
    for (name, code) in [("type_0", 0u8), ("type_27", 27), ("type_255", 255)] {
        g.invalid(
            name,
            &format!("message type code {code}"),
            assemble(&header(fixed(code, 0, 0, 0, 704), &[]), b""),
            "unknown_type",
        );
    }
    for (name, code) in [("status_18", 18u8), ("status_255", 255)] {
        g.invalid(
            name,
            &format!("response status code {code}"),
            assemble(
                &header(fixed(MessageType::Response.code(), code, 0, 0, 705), &[]),
                b"",
            ),
            "unknown_status",
        );
    }
    g.invalid(
        "bits_0x04",
        "bits byte 0x04: only oneway (0x01) and durable (0x02) are defined",
        assemble(&header(request_fixed(706), &[]), b"")
            .into_iter()
            .enumerate()
            .map(|(i, b)| if i == 14 { 0x04 } else { b })
            .collect(),
        "reserved_bits",
    );
    g.invalid(
        "bits_0x83",
        "bits byte 0x83",
        assemble(&header(fixed(1, 0, 0x83, 0, 707), &[]), b""),
        "reserved_bits",
    );
    g.invalid(
        "reserved_byte",
        "the reserved byte after the bits is 0x01",
        assemble(&header(fixed(1, 0, 0, 1, 708), &[]), b""),
        "reserved_bits",
    );
    for (name, t) in [("tag_0", 0u8), ("tag_10", 10), ("tag_127", 127)] {
        g.invalid(
            name,
            &format!("unknown critical field tag {t} (tags below 128 must be understood)"),
            assemble(&header(request_fixed(709), &[tlv(t, b"x")]), b""),
            "unknown_tag",
        );
    }
    g.invalid(
        "tags_descending",
        "destination (6) before subject (5)",
        assemble(
            &header(
                request_fixed(710),
                &[tlv(tag::DESTINATION, b"echo"), tlv(tag::SUBJECT, b"s")],
            ),
            b"",
        ),
        "tag_order",
    );
    g.invalid(
        "tag_repeated",
        "destination twice",
        assemble(
            &header(
                request_fixed(711),
                &[tlv(tag::DESTINATION, b"a"), tlv(tag::DESTINATION, b"b")],
            ),
            b"",
        ),
        "tag_order",
    );
    g.invalid(
        "optional_tag_out_of_order",
        "optional tag 200 before reply_to (7): optional tags obey the order rule too",
        assemble(
            &header(
                request_fixed(712),
                &[tlv(200, b""), tlv(tag::REPLY_TO, b"r")],
            ),
            b"",
        ),
        "tag_order",
    );
    g.invalid(
        "expires_at_4_bytes",
        "expires_at with a 4-byte value (must be 8)",
        assemble(
            &header(request_fixed(713), &[tlv(tag::EXPIRES_AT, &[1, 2, 3, 4])]),
            b"",
        ),
        "field_length",
    );
    g.invalid(
        "expires_at_empty",
        "expires_at with an empty value (must be 8)",
        assemble(
            &header(request_fixed(714), &[tlv(tag::EXPIRES_AT, &[])]),
            b"",
        ),
        "field_length",
    );
    g.invalid(
        "timeout_16_bytes",
        "timeout with a 16-byte value (must be 8)",
        assemble(
            &header(request_fixed(715), &[tlv(tag::TIMEOUT, &[0; 16])]),
            b"",
        ),
        "field_length",
    );
    g.invalid(
        "correlation_id_15_bytes",
        "correlation_id with a 15-byte value (must be 16)",
        assemble(
            &header(request_fixed(716), &[tlv(tag::CORRELATION_ID, &[7; 15])]),
            b"",
        ),
        "field_length",
    );
    g.invalid(
        "utf8_ff",
        "destination holds byte 0xff",
        assemble(
            &header(request_fixed(717), &[tlv(tag::DESTINATION, b"ec\xffho")]),
            b"",
        ),
        "invalid_utf8",
    );
    g.invalid(
        "utf8_overlong",
        "subject holds the overlong encoding c0 af of '/'",
        assemble(
            &header(request_fixed(718), &[tlv(tag::SUBJECT, b"a\xc0\xaf")]),
            b"",
        ),
        "invalid_utf8",
    );
    g.invalid(
        "utf8_surrogate",
        "request_id holds an encoded surrogate (ed a0 80)",
        assemble(
            &header(request_fixed(719), &[tlv(tag::REQUEST_ID, b"\xed\xa0\x80")]),
            b"",
        ),
        "invalid_utf8",
    );
    g.invalid(
        "utf8_cut_sequence",
        "payload_mimetype ends inside a 3-byte sequence (e2 82)",
        assemble(
            &header(
                request_fixed(720),
                &[tlv(tag::PAYLOAD_MIMETYPE, b"text/\xe2\x82")],
            ),
            b"",
        ),
        "invalid_utf8",
    );
    g.into_file(
        "Frames a decoder must reject, with the error kind. \"fatal\": true means the stream's framing is lost and the connection closes; otherwise the frame is skipped and answered with bad_request.",
    )
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors");
    std::fs::create_dir_all(&dir).unwrap();
    let files = [
        ("messages", messages()),
        ("responses", responses()),
        ("fields", fields()),
        ("payloads", payloads()),
        ("limits", limits()),
        ("extensions", extensions()),
        ("invalid", invalid()),
    ];

    let mut types = BTreeSet::new();
    let mut statuses = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for (_, f) in &files {
        for v in &f.vectors {
            if let Some(m) = &v.message {
                types.insert(m.r#type.as_str().unwrap().to_owned());
                if let Some(s) = m.response_status.as_str() {
                    statuses.insert(s.to_owned());
                }
            }
            if let Some(k) = v.error {
                kinds.insert(k);
            }
        }
    }
    assert_eq!(
        types.len(),
        MessageType::ALL.len(),
        "a message type lacks a vector"
    );
    assert_eq!(
        statuses.len(),
        ResponseStatus::ALL.len(),
        "a status lacks a vector"
    );
    assert_eq!(kinds.len(), 12, "an error kind lacks a vector: {kinds:?}");

    for (name, f) in files {
        let path = dir.join(format!("{name}.json"));
        let mut text = serde_json::to_string_pretty(&f).unwrap();
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        println!("{name}.json: {} vectors", f.vectors.len());
    }
}
