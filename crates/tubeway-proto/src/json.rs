//! The JSON form of a message, for printing, debugging, the CLI's `--json`
//! and the language-neutral test vectors.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::message::{Message, MessageType, PayloadKind, ResponseStatus};

/// Why a JSON document could not be read as a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// Not valid JSON.
    #[error("invalid JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    /// A field is missing or of the wrong type.
    #[error("field {field}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn field_err(field: &'static str, reason: impl Into<String>) -> JsonError {
    JsonError::Field {
        field,
        reason: reason.into(),
    }
}

fn opt_str(v: &Option<String>) -> Value {
    v.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))
}

impl Message {
    /// The message as a JSON map with every field of the model. The payload is
    /// rendered by kind: text as a string, data as its JSON value, binary as
    /// base64; `payload_encoding` says which.
    pub fn to_map(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), Value::String(self.id.to_string()));
        m.insert("type".into(), Value::String(self.r#type.as_str().into()));
        m.insert("oneway".into(), Value::Bool(self.oneway));
        m.insert("durable".into(), Value::Bool(self.durable));
        m.insert(
            "response_status".into(),
            self.response_status
                .map_or(Value::Null, |s| Value::String(s.as_str().into())),
        );
        m.insert("timestamp".into(), Value::from(self.timestamp));
        m.insert(
            "expires_at".into(),
            self.expires_at.map_or(Value::Null, Value::from),
        );
        m.insert(
            "timeout".into(),
            self.timeout.map_or(Value::Null, |t| {
                Value::from(u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
            }),
        );
        m.insert("request_id".into(), opt_str(&self.request_id));
        m.insert(
            "correlation_id".into(),
            self.correlation_id
                .map_or(Value::Null, |c| Value::String(c.to_string())),
        );
        m.insert("subject".into(), opt_str(&self.subject));
        m.insert("destination".into(), opt_str(&self.destination));
        m.insert("reply_to".into(), opt_str(&self.reply_to));
        m.insert("payload_mimetype".into(), opt_str(&self.payload_mimetype));
        m.insert("payload_charset".into(), opt_str(&self.payload_charset));
        let (encoding, payload) = self.payload_json();
        m.insert("payload_encoding".into(), Value::String(encoding.into()));
        m.insert("payload".into(), payload);
        m
    }

    fn payload_json(&self) -> (&'static str, Value) {
        let base64 = || {
            (
                "base64",
                Value::String(base64::engine::general_purpose::STANDARD.encode(&self.payload)),
            )
        };
        match self.payload_kind() {
            PayloadKind::Empty => ("none", Value::Null),
            PayloadKind::Data => match serde_json::from_slice::<Value>(&self.payload) {
                Ok(v) => ("json", v),
                Err(_) => base64(),
            },
            PayloadKind::Text => match self.text_payload() {
                Ok(t) if self.is_utf8_charset() => ("text", Value::String(t.into_owned())),
                _ => base64(),
            },
            _ => base64(),
        }
    }

    fn is_utf8_charset(&self) -> bool {
        self.payload_charset
            .as_deref()
            .is_none_or(|c| c.eq_ignore_ascii_case("utf-8") || c.eq_ignore_ascii_case("utf8"))
    }

    /// Compact JSON, one line.
    pub fn to_json(&self) -> String {
        Value::Object(self.to_map()).to_string()
    }

    /// Indented JSON.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(&Value::Object(self.to_map())).unwrap_or_default()
    }

    /// Reads the JSON form produced by [`Message::to_map`]. A `json` payload is
    /// re-serialised compactly, so only canonical (compact) payloads round-trip
    /// byte for byte.
    pub fn from_json(text: &str) -> Result<Message, JsonError> {
        let v: Value = serde_json::from_str(text)?;
        Message::from_json_value(&v)
    }

    /// Reads a parsed JSON form.
    pub fn from_json_value(v: &Value) -> Result<Message, JsonError> {
        let o = v
            .as_object()
            .ok_or_else(|| field_err("message", "not a JSON object"))?;
        let s = |f: &'static str| -> Result<Option<String>, JsonError> {
            match o.get(f) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(field_err(f, "not a string")),
            }
        };
        let u = |f: &'static str| -> Result<Option<u64>, JsonError> {
            match o.get(f) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| field_err(f, "not an unsigned integer")),
            }
        };
        let b = |f: &'static str| -> Result<bool, JsonError> {
            match o.get(f) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(x)) => Ok(*x),
                Some(_) => Err(field_err(f, "not a boolean")),
            }
        };
        let uuid = |f: &'static str, x: Option<String>| -> Result<Option<Uuid>, JsonError> {
            x.map(|s| Uuid::parse_str(&s).map_err(|e| field_err(f, e.to_string())))
                .transpose()
        };
        let type_name = s("type")?.ok_or_else(|| field_err("type", "missing"))?;
        let r#type = MessageType::from_name(&type_name)
            .ok_or_else(|| field_err("type", format!("unknown type {type_name:?}")))?;
        let mut m = Message::new(r#type);
        if let Some(id) = uuid("id", s("id")?)? {
            m.id = id;
        }
        m.oneway = b("oneway")?;
        m.durable = b("durable")?;
        m.response_status = s("response_status")?
            .map(|n| {
                ResponseStatus::from_name(&n)
                    .ok_or_else(|| field_err("response_status", format!("unknown status {n:?}")))
            })
            .transpose()?;
        if let Some(t) = u("timestamp")? {
            m.timestamp = t;
        }
        m.expires_at = u("expires_at")?;
        m.timeout = u("timeout")?.map(std::time::Duration::from_millis);
        m.request_id = s("request_id")?;
        m.correlation_id = uuid("correlation_id", s("correlation_id")?)?;
        m.subject = s("subject")?;
        m.destination = s("destination")?;
        m.reply_to = s("reply_to")?;
        m.payload_mimetype = s("payload_mimetype")?;
        m.payload_charset = s("payload_charset")?;
        let payload = o.get("payload").unwrap_or(&Value::Null);
        let encoding = s("payload_encoding")?;
        m.payload = match (encoding.as_deref(), payload) {
            (_, Value::Null) | (Some("none"), _) => Bytes::new(),
            (Some("base64"), Value::String(b64)) => Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| field_err("payload", e.to_string()))?,
            ),
            (Some("text") | None, Value::String(t)) => Bytes::from(t.clone().into_bytes()),
            (Some("json") | None, other) => Bytes::from(serde_json::to_vec(other)?),
            (Some(e), _) => {
                return Err(field_err(
                    "payload_encoding",
                    format!("unknown encoding {e:?} for this payload"),
                ))
            }
        };
        Ok(m)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_each_kind() {
        let msgs = [
            Message::plain_text("héllo"),
            Message::data(&serde_json::json!({"a": [1, 2.5, null, true, "x"]})),
            Message::binary(vec![0u8, 255, 7], Some("image/png")),
            Message::text("<a/>", "application/xml", "utf-8"),
            Message::request(),
        ];
        for m in msgs {
            let back = Message::from_json(&m.to_json()).unwrap();
            assert_eq!(m, back, "{}", m.to_json_pretty());
        }
    }

    #[test]
    fn map_has_every_field() {
        let map = Message::plain_text("x").to_map();
        for f in [
            "id",
            "type",
            "oneway",
            "durable",
            "response_status",
            "timestamp",
            "expires_at",
            "timeout",
            "request_id",
            "subject",
            "destination",
            "reply_to",
            "payload_mimetype",
            "payload_charset",
            "payload",
        ] {
            assert!(map.contains_key(f), "{f}");
        }
    }
}
