//! Checks the codec against the language-neutral vectors in `spec/vectors/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use tubeway_proto::codec::{self, DecodeError};
use tubeway_proto::{
    Decoded, Decoder, Message, MessageType, ResponseStatus, MAX_MESSAGE_SIZE_LIMIT,
};

const ERROR_KINDS: [&str; 12] = [
    "bad_magic",
    "unsupported_version",
    "unknown_flags",
    "bad_length",
    "truncated",
    "unknown_type",
    "unknown_status",
    "reserved_bits",
    "unknown_tag",
    "tag_order",
    "field_length",
    "invalid_utf8",
];

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
        _ => "unlisted",
    }
}

struct Vector {
    file: String,
    name: String,
    body: Value,
    bytes: Vec<u8>,
}

impl Vector {
    fn label(&self) -> String {
        format!("{}:{}", self.file, self.name)
    }
}

fn load() -> Vec<Vector> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no vector files in {}", dir.display());
    let mut out = Vec::new();
    for path in paths {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(doc["description"].is_string(), "{file}: no description");
        let vectors = doc["vectors"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: no vectors"));
        assert!(!vectors.is_empty(), "{file}: empty");
        for v in vectors {
            let name = v["name"]
                .as_str()
                .unwrap_or_else(|| panic!("{file}: unnamed vector"));
            let hex_text = v["hex"]
                .as_str()
                .unwrap_or_else(|| panic!("{file}:{name}: no hex"));
            assert_eq!(
                hex_text,
                hex_text.to_lowercase(),
                "{file}:{name}: hex not lowercase"
            );
            out.push(Vector {
                file: file.clone(),
                name: name.to_owned(),
                body: v.clone(),
                bytes: hex::decode(hex_text).unwrap_or_else(|e| panic!("{file}:{name}: {e}")),
            });
        }
    }
    let names: BTreeSet<String> = out.iter().map(Vector::label).collect();
    assert_eq!(names.len(), out.len(), "duplicate vector names");
    out
}

/// Feeds `bytes` one at a time and collects everything the decoder gives.
fn stream(bytes: &[u8], max_frame: usize) -> (Vec<Decoded>, Option<DecodeError>, bool) {
    let mut d = Decoder::new(max_frame);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for &b in bytes {
        buf.extend_from_slice(&[b]);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(x)) => out.push(x),
                Ok(None) => break,
                Err(e) => return (out, Some(e), false),
            }
        }
    }
    let idle = d.is_idle(&buf);
    (out, None, idle)
}

#[test]
fn valid_vectors_decode_and_reencode() {
    let mut types = HashSet::new();
    let mut statuses = HashSet::new();
    let mut count = 0;
    for v in load().iter().filter(|v| v.body.get("message").is_some()) {
        let label = v.label();
        let json = &v.body["message"];
        let expected = Message::from_json_value(json).unwrap_or_else(|e| panic!("{label}: {e}"));
        let decoded = codec::decode(Bytes::from(v.bytes.clone()))
            .unwrap_or_else(|e| panic!("{label}: decode: {e}"));
        assert_eq!(decoded, expected, "{label}: decoded message differs");
        assert_eq!(
            &Value::Object(decoded.to_map()),
            json,
            "{label}: JSON form of the decoded message differs"
        );

        let reencode = v
            .body
            .get("reencode")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let encoded = codec::encode(&expected, MAX_MESSAGE_SIZE_LIMIT)
            .unwrap_or_else(|e| panic!("{label}: encode: {e}"))
            .to_vec();
        if reencode {
            assert_eq!(
                hex::encode(&encoded),
                hex::encode(&v.bytes),
                "{label}: re-encoding differs"
            );
        } else {
            assert_ne!(
                encoded, v.bytes,
                "{label}: marked reencode=false but re-encodes identically"
            );
            let again = codec::decode(Bytes::from(encoded)).unwrap();
            assert_eq!(
                again, expected,
                "{label}: canonical re-encoding does not decode back"
            );
        }

        // The streaming decoder, one byte at a time, twice in a row.
        let twice = [v.bytes.as_slice(), v.bytes.as_slice()].concat();
        let (items, err, idle) = stream(&twice, MAX_MESSAGE_SIZE_LIMIT);
        assert!(err.is_none(), "{label}: streaming error {err:?}");
        assert!(idle, "{label}: decoder not idle after whole frames");
        assert_eq!(items.len(), 2, "{label}: streaming produced {items:?}");
        for item in items {
            match item {
                Decoded::Message(m) => {
                    assert_eq!(*m, expected, "{label}: streamed message differs")
                }
                other => panic!("{label}: streaming produced {other:?}"),
            }
        }

        // A limit one byte too small turns it into too_large, and the stream goes on.
        let (items, err, idle) = stream(&twice, v.bytes.len() - 1);
        assert!(err.is_none() && idle, "{label}: oversize streaming {err:?}");
        assert_eq!(items.len(), 2, "{label}");
        for item in items {
            match item {
                Decoded::TooLarge {
                    id,
                    type_code,
                    oneway,
                    frame_len,
                    ..
                } => {
                    assert_eq!(id, Some(expected.id), "{label}");
                    assert_eq!(type_code, Some(expected.r#type.code()), "{label}");
                    assert_eq!(oneway, expected.oneway, "{label}");
                    assert_eq!(frame_len, v.bytes.len() as u64, "{label}");
                }
                other => panic!("{label}: expected too_large, got {other:?}"),
            }
        }

        types.insert(expected.r#type);
        if let Some(s) = expected.response_status {
            statuses.insert(s);
        }
        count += 1;
    }
    assert!(count > 50, "only {count} valid vectors");
    for t in MessageType::ALL {
        assert!(types.contains(t), "no vector for message type {t}");
    }
    for s in ResponseStatus::ALL {
        assert!(statuses.contains(s), "no vector for response status {s}");
    }
}

#[test]
fn invalid_vectors_fail_with_their_kind() {
    let mut kinds = BTreeSet::new();
    for v in load().iter().filter(|v| v.body.get("error").is_some()) {
        let label = v.label();
        assert!(
            v.body.get("message").is_none(),
            "{label}: both message and error"
        );
        let kind = v.body["error"].as_str().unwrap();
        assert!(
            ERROR_KINDS.contains(&kind),
            "{label}: unknown error kind {kind}"
        );
        kinds.insert(kind.to_owned());

        let err = match codec::decode(Bytes::from(v.bytes.clone())) {
            Ok(m) => panic!("{label}: decoded {m:?}"),
            Err(e) => e,
        };
        assert_eq!(error_kind(&err), kind, "{label}: got {err}");
        if let Some(fatal) = v.body.get("fatal").and_then(Value::as_bool) {
            assert_eq!(err.is_fatal(), fatal, "{label}: fatality");
        }

        // The streaming decoder: fatal errors end the stream; per-frame errors
        // yield Decoded::Invalid; a frame cut short leaves it waiting.
        let (items, stream_err, idle) = stream(&v.bytes, MAX_MESSAGE_SIZE_LIMIT);
        let declared = v
            .bytes
            .get(4..8)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()));
        let incomplete = declared.is_none_or(|len| (v.bytes.len() as u64) < u64::from(len));
        if err.is_fatal() {
            assert!(items.is_empty(), "{label}: {items:?}");
            assert_eq!(stream_err.as_ref().map(error_kind), Some(kind), "{label}");
        } else if incomplete {
            assert!(
                items.is_empty() && stream_err.is_none(),
                "{label}: {items:?} {stream_err:?}"
            );
            assert!(!idle, "{label}: decoder idle with a partial frame buffered");
        } else {
            assert!(stream_err.is_none(), "{label}: {stream_err:?}");
            assert!(idle, "{label}: decoder not idle after a whole frame");
            match items.as_slice() {
                [Decoded::Invalid {
                    error,
                    id,
                    type_code,
                }] => {
                    assert_eq!(error, &err, "{label}");
                    assert!(
                        id.is_some() && type_code.is_some(),
                        "{label}: frame not named"
                    );
                }
                other => panic!("{label}: streaming produced {other:?}"),
            }
        }
    }
    for k in ERROR_KINDS {
        assert!(kinds.contains(k), "no invalid vector of kind {k}");
    }
}

#[test]
fn every_vector_is_valid_or_invalid() {
    for v in load() {
        let label = v.label();
        assert!(v.body["description"].is_string(), "{label}: no description");
        let has_message = v.body.get("message").is_some();
        let has_error = v.body.get("error").is_some();
        assert!(
            has_message != has_error,
            "{label}: needs exactly one of message, error"
        );
        if has_message {
            let map = v.body["message"].as_object().unwrap();
            let expected = Message::from_json_value(&v.body["message"])
                .unwrap()
                .to_map();
            let want: BTreeSet<&String> = expected.keys().collect();
            let got: BTreeSet<&String> = map.keys().collect();
            assert_eq!(got, want, "{label}: message must list every field");
        }
    }
}
