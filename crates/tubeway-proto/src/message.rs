use std::fmt;
use std::time::Duration;

use crate::clock::now_millis;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Mimetype of plain text payloads.
pub const MIME_TEXT: &str = "text/plain";
/// Mimetype of structured-data payloads.
pub const MIME_JSON: &str = "application/json";
/// Mimetype of a non-empty payload that names none: senders leave it out.
pub const MIME_BINARY: &str = "application/octet-stream";

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $code:expr => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[non_exhaustive]
        pub enum $name { $($(#[$vmeta])* $variant,)* }

        impl $name {
            /// Every value, in wire-code order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The one-byte wire code.
            pub fn code(self) -> u8 { match self { $($name::$variant => $code,)* } }

            /// The value for a wire code, if the code is known.
            pub fn from_code(code: u8) -> Option<Self> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }

            /// The snake_case name used in JSON, the CLI and the docs.
            pub fn as_str(self) -> &'static str { match self { $($name::$variant => $text,)* } }

            /// Parses the snake_case name.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { $($text => Some($name::$variant),)* _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

wire_enum! {
    /// What a message asks for or answers.
    MessageType {
        /// Call a function; answered by a `response`.
        Request = 1 => "request",
        /// The answer to any request-like message; see `correlation_id`.
        Response = 2 => "response",
        /// Publish to a topic; also the type of messages delivered to subscribers.
        Publish = 3 => "publish",
        /// Subscribe to a topic.
        Subscribe = 4 => "subscribe",
        /// End a subscription.
        Unsubscribe = 5 => "unsubscribe",
        /// Put a message on a queue.
        Offer = 6 => "offer",
        /// Take a message from a queue.
        Poll = 7 => "poll",
        /// Create a queue.
        CreateQueue = 8 => "create_queue",
        /// Remove a queue.
        RemoveQueue = 9 => "remove_queue",
        /// Status of one queue.
        QueueStatus = 10 => "queue_status",
        /// Whether a queue exists.
        ExistsQueue = 11 => "exists_queue",
        /// Create a queue owned by this connection, named by the broker.
        CreateTemporaryQueue = 12 => "create_temporary_queue",
        /// Status of every queue.
        ListQueues = 13 => "list_queues",
        /// Create a topic.
        CreateTopic = 14 => "create_topic",
        /// Remove a topic.
        RemoveTopic = 15 => "remove_topic",
        /// Status of one topic.
        TopicStatus = 16 => "topic_status",
        /// Status of every topic.
        ListTopics = 17 => "list_topics",
        /// Register this connection as a worker for a function.
        CreateFunction = 18 => "create_function",
        /// Stop serving a function (a worker), or remove it.
        RemoveFunction = 19 => "remove_function",
        /// Status of one function.
        FunctionStatus = 20 => "function_status",
        /// Status of every function.
        ListFunctions = 21 => "list_functions",
        /// Broker statistics.
        Stats = 22 => "stats",
        /// Connection handshake: version and capability negotiation.
        Hello = 23 => "hello",
        /// Liveness probe; answered with an `ok` response.
        Ping = 24 => "ping",
        /// Withdraws a waiting request of this connection (a poll or an
        /// offer), named by `correlation_id`. Never answered itself; the
        /// withdrawn request is answered as if its wait had ended
        /// (`queue_empty`, `queue_full`). Needs the `cancel` capability.
        Cancel = 25 => "cancel",
        /// Puts back a message this connection was handed by a poll it had
        /// given up on (`correlation_id` = that poll): at the head of its
        /// queue, as if never taken. Sent `oneway`. Needs the `requeue`
        /// capability.
        Requeue = 26 => "requeue",
    }
}

wire_enum! {
    /// The outcome carried by a `response`.
    ResponseStatus {
        /// Success.
        Ok = 1 => "ok",
        /// The broker failed; the reason says how.
        ServerError = 2 => "server_error",
        /// The request was malformed or not allowed in this form.
        BadRequest = 3 => "bad_request",
        /// The function handler returned an error or panicked.
        HandlerError = 4 => "handler_error",
        /// No queue of that name.
        QueueNotFound = 5 => "queue_not_found",
        /// The queue stayed empty until the poll's timeout.
        QueueEmpty = 6 => "queue_empty",
        /// The bounded queue stayed full until the offer's timeout.
        QueueFull = 7 => "queue_full",
        /// No topic of that name.
        TopicNotFound = 8 => "topic_not_found",
        /// No function of that name.
        FunctionNotFound = 9 => "function_not_found",
        /// The message exceeds the maximum message size.
        TooLarge = 10 => "too_large",
        /// The operation did not complete in time.
        Timeout = 11 => "timeout",
        /// The peer is not authenticated.
        Unauthorized = 12 => "unauthorized",
        /// The authenticated peer may not do this.
        NoPermission = 13 => "no_permission",
        /// The destination exists with different settings.
        Conflict = 14 => "conflict",
        /// The broker cannot take this now (connection limit, shutting down).
        Unavailable = 15 => "unavailable",
        /// No protocol version or capability in common.
        UnsupportedVersion = 16 => "unsupported_version",
        /// The message expired before it could be handed out or answered.
        Expired = 17 => "expired",
    }
}

impl ResponseStatus {
    /// Whether this status reports success.
    pub fn is_ok(self) -> bool {
        self == ResponseStatus::Ok
    }
}

/// How a payload is to be read, derived from `payload_mimetype` and `payload_charset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PayloadKind {
    /// No payload bytes and no mimetype.
    Empty,
    /// Text in `payload_charset` (UTF-8 unless stated).
    Text,
    /// Structured data carried as `application/json`.
    Data,
    /// Opaque bytes.
    Binary,
}

/// Why a payload could not be read as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The payload is not of the kind asked for.
    #[error("payload is {actual:?}, not {expected:?}")]
    WrongKind {
        /// What the caller asked for.
        expected: PayloadKind,
        /// What the message carries.
        actual: PayloadKind,
    },
    /// The bytes are not valid in the declared charset.
    #[error("payload is not valid {charset}: {detail}")]
    InvalidText {
        /// The declared charset.
        charset: String,
        /// Where decoding failed.
        detail: String,
    },
    /// The charset is not one this implementation decodes.
    #[error("unsupported charset {0:?} (supported: utf-8, us-ascii, iso-8859-1)")]
    UnsupportedCharset(String),
    /// The structured payload is not valid JSON or not of the expected shape.
    #[error("payload is not valid JSON data: {0}")]
    InvalidData(#[from] serde_json::Error),
}

/// One Tubeway message: the unit every transport carries and every API exchanges.
///
/// Field names match the wire protocol, the JSON form and the docs.
#[derive(Clone, PartialEq, Eq)]
pub struct Message {
    /// Unique per message (UUID v4).
    pub id: Uuid,
    /// What the message asks for or answers.
    pub r#type: MessageType,
    /// The sender wants no response.
    pub oneway: bool,
    /// The message must survive a broker restart (durable queues).
    pub durable: bool,
    /// Set on responses only.
    pub response_status: Option<ResponseStatus>,
    /// Creation time, ms since the epoch.
    pub timestamp: u64,
    /// After this time (ms since the epoch) the message is never handed out.
    pub expires_at: Option<u64>,
    /// How long the broker may wait in an offer or poll (or a call may take).
    pub timeout: Option<std::time::Duration>,
    /// Set by the sender and echoed in the response; idempotency key.
    pub request_id: Option<String>,
    /// On a response: the `id` of the message it answers. On a delivery: the
    /// `id` of the subscribe or worker registration it belongs to.
    pub correlation_id: Option<Uuid>,
    /// Free-form subject, for routing by the application.
    pub subject: Option<String>,
    /// The queue, topic or function the message is for.
    pub destination: Option<String>,
    /// A queue name where an answer should be offered.
    pub reply_to: Option<String>,
    /// The payload's mimetype.
    pub payload_mimetype: Option<String>,
    /// The payload's charset, for text payloads only.
    pub payload_charset: Option<String>,
    /// The payload bytes; shared, never copied when forwarded.
    pub payload: Bytes,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("type", &self.r#type)
            .field("response_status", &self.response_status)
            .field("destination", &self.destination)
            .field("correlation_id", &self.correlation_id)
            .field("payload_mimetype", &self.payload_mimetype)
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

impl Message {
    /// A new message of `type` with a fresh id, the current timestamp and no payload.
    #[inline]
    pub fn new(r#type: MessageType) -> Self {
        Message::with_identity(r#type, crate::id::fresh(), now_millis())
    }

    /// A message of `type` with the given id and timestamp and nothing else:
    /// what the decoder starts from, without drawing an id or reading the
    /// clock for values it then overwrites.
    #[inline]
    pub(crate) fn with_identity(r#type: MessageType, id: Uuid, timestamp: u64) -> Self {
        Message {
            id,
            r#type,
            oneway: false,
            durable: false,
            response_status: None,
            timestamp,
            expires_at: None,
            timeout: None,
            request_id: None,
            correlation_id: None,
            subject: None,
            destination: None,
            reply_to: None,
            payload_mimetype: None,
            payload_charset: None,
            payload: Bytes::new(),
        }
    }

    /// A `request` (function call) message with no payload yet.
    #[inline]
    pub fn request() -> Self {
        Message::new(MessageType::Request)
    }

    /// A message with a UTF-8 `text/plain` payload.
    pub fn plain_text(text: impl Into<String>) -> Self {
        Message::request().with_text(text, MIME_TEXT, "utf-8")
    }

    /// A message with a text payload of any mimetype (JSON, XML, ...) and charset.
    ///
    /// The text is stored as UTF-8; `charset` records what the receiver should
    /// expect and must be `utf-8` for `String` input to round-trip.
    pub fn text(text: impl Into<String>, mimetype: &str, charset: &str) -> Self {
        Message::request().with_text(text, mimetype, charset)
    }

    /// A message with a binary payload. Without a `mimetype` none is written:
    /// a receiver reads a non-empty payload with no mimetype as
    /// `application/octet-stream` (docs/protocol.md, section 10).
    #[inline]
    pub fn binary(data: impl Into<Bytes>, mimetype: Option<&str>) -> Self {
        // One literal, made where the caller keeps it. Through a builder or
        // a local the message would be copied whole, and such a copy reads
        // back stores just made, which the CPU cannot forward to its wider
        // loads: a stall per copy (see docs/performance/investigations.md,
        // "Copies that read back fresh stores").
        Message {
            payload: data.into(),
            payload_mimetype: mimetype.map(str::to_owned),
            ..Message::request()
        }
    }

    /// A message carrying structured data (maps, lists, numbers, strings,
    /// booleans, null) as `application/json`.
    pub fn data(value: &serde_json::Value) -> Self {
        Message::request().with_data(value)
    }

    /// A message carrying any serialisable value as `application/json`.
    pub fn serialize<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        let bytes = serde_json::to_vec(value)?;
        let mut m = Message::request();
        m.set_payload(Bytes::from(bytes), Some(MIME_JSON), None);
        Ok(m)
    }

    /// Replaces the payload with text.
    pub fn with_text(mut self, text: impl Into<String>, mimetype: &str, charset: &str) -> Self {
        let text: String = text.into();
        self.set_payload(Bytes::from(text), Some(mimetype), Some(charset));
        self
    }

    /// Replaces the payload with binary data; see [`Message::binary`] for a
    /// `mimetype` of `None`.
    pub fn with_binary(mut self, data: impl Into<Bytes>, mimetype: Option<&str>) -> Self {
        self.set_payload(data.into(), mimetype, None);
        self
    }

    /// Replaces the payload with structured data.
    pub fn with_data(mut self, value: &serde_json::Value) -> Self {
        // Serialising a `Value` cannot fail: its map keys are always strings.
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        self.set_payload(Bytes::from(bytes), Some(MIME_JSON), None);
        self
    }

    /// Replaces the payload and its description.
    pub fn set_payload(&mut self, payload: Bytes, mimetype: Option<&str>, charset: Option<&str>) {
        self.payload = payload;
        self.payload_mimetype = mimetype.map(str::to_owned);
        self.payload_charset = charset.map(str::to_owned);
    }

    /// Copies the payload (shared, not copied) and its description from `other`.
    pub fn with_payload_of(mut self, other: &Message) -> Self {
        self.payload = other.payload.clone();
        self.payload_mimetype.clone_from(&other.payload_mimetype);
        self.payload_charset.clone_from(&other.payload_charset);
        self
    }

    /// Sets the message type.
    pub fn with_type(mut self, r#type: MessageType) -> Self {
        self.r#type = r#type;
        self
    }

    /// Sets the destination (queue, topic or function name).
    pub fn with_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Sets the subject.
    pub fn with_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// Sets the request id.
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// Sets the reply-to queue.
    pub fn with_reply_to(mut self, queue: impl Into<String>) -> Self {
        self.reply_to = Some(queue.into());
        self
    }

    /// Marks the message durable.
    pub fn with_durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Marks the message one-way (no response wanted).
    pub fn with_oneway(mut self, oneway: bool) -> Self {
        self.oneway = oneway;
        self
    }

    /// Sets how long the broker may wait for this operation.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Makes the message expire `ttl` after its timestamp.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.expires_at = Some(self.timestamp.saturating_add(ttl_ms));
        self
    }

    /// Whether the message has expired at `now` (ms since the epoch).
    pub fn is_expired_at(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }

    /// Whether the message has expired now. Reads the clock only for a
    /// message that can expire.
    pub fn is_expired(&self) -> bool {
        self.expires_at.is_some_and(|t| t <= now_millis())
    }

    /// A response to this message: fresh id, `correlation_id` set to this
    /// message's id, `request_id` echoed, no payload.
    pub fn response(&self, status: ResponseStatus) -> Message {
        Message::response_to(self.id, self.request_id.clone(), status)
    }

    /// A response with `status` to the request whose `id` and `request_id`
    /// these are: for an answer made where the request is no longer at hand.
    pub fn response_to(id: Uuid, request_id: Option<String>, status: ResponseStatus) -> Message {
        let mut r = Message::new(MessageType::Response);
        r.response_status = Some(status);
        r.correlation_id = Some(id);
        r.request_id = request_id;
        r
    }

    /// An error response carrying `reason` as its plain-text payload.
    pub fn error_response(&self, status: ResponseStatus, reason: impl Into<String>) -> Message {
        self.response(status).with_text(reason, MIME_TEXT, "utf-8")
    }

    /// The response status, treating a missing status as `server_error`.
    pub fn status(&self) -> ResponseStatus {
        self.response_status.unwrap_or(ResponseStatus::ServerError)
    }

    /// The payload's mimetype as a receiver reads it: the one named, else
    /// `application/octet-stream` for a non-empty payload, else none.
    pub fn mimetype(&self) -> Option<&str> {
        match self.payload_mimetype.as_deref() {
            Some(m) => Some(m),
            None if self.payload.is_empty() => None,
            None => Some(MIME_BINARY),
        }
    }

    /// How to read the payload.
    pub fn payload_kind(&self) -> PayloadKind {
        // The broker asks this of every message: the mimetypes this crate
        // writes itself are recognised without parsing.
        match (self.payload_mimetype.as_deref(), &self.payload_charset) {
            (Some(MIME_BINARY), None) => return PayloadKind::Binary,
            (Some(MIME_JSON), _) => return PayloadKind::Data,
            (Some(MIME_TEXT), _) => return PayloadKind::Text,
            _ => {}
        }
        let mime = self.payload_mimetype.as_deref().map(mime_essence);
        match mime {
            None if self.payload.is_empty() => PayloadKind::Empty,
            None => PayloadKind::Binary,
            Some(m) if m.eq_ignore_ascii_case(MIME_JSON) || m.ends_with("+json") => {
                PayloadKind::Data
            }
            Some(m) if self.payload_charset.is_some() || m.starts_with("text/") => {
                PayloadKind::Text
            }
            Some(_) => PayloadKind::Binary,
        }
    }

    /// The payload as text. Valid for text payloads and for JSON data (which is
    /// UTF-8 text). UTF-8, US-ASCII and ISO-8859-1 are decoded.
    pub fn text_payload(&self) -> Result<std::borrow::Cow<'_, str>, PayloadError> {
        match self.payload_kind() {
            PayloadKind::Text | PayloadKind::Data | PayloadKind::Empty => {}
            actual => {
                return Err(PayloadError::WrongKind {
                    expected: PayloadKind::Text,
                    actual,
                })
            }
        }
        let charset = self.payload_charset.as_deref().unwrap_or("utf-8");
        decode_text(&self.payload, charset)
    }

    /// The payload bytes, whatever their kind.
    pub fn binary_payload(&self) -> &Bytes {
        &self.payload
    }

    /// The structured-data payload, decoded.
    pub fn data_payload(&self) -> Result<serde_json::Value, PayloadError> {
        self.data_payload_as()
    }

    /// The structured-data payload decoded into `T`.
    pub fn data_payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, PayloadError> {
        match self.payload_kind() {
            PayloadKind::Data => Ok(serde_json::from_slice(&self.payload)?),
            actual => Err(PayloadError::WrongKind {
                expected: PayloadKind::Data,
                actual,
            }),
        }
    }

    /// Checks what the broker checks on every message it receives: a text
    /// payload must be valid in its charset, and a data payload valid JSON
    /// when the message is a management operation the broker must read.
    pub fn validate_payload(&self) -> Result<(), PayloadError> {
        if self.payload_kind() == PayloadKind::Text {
            self.text_payload()?;
        }
        Ok(())
    }
}

fn mime_essence(mime: &str) -> &str {
    mime.split(';').next().unwrap_or(mime).trim()
}

fn decode_text<'a>(
    bytes: &'a [u8],
    charset: &str,
) -> Result<std::borrow::Cow<'a, str>, PayloadError> {
    let cs = charset.trim().to_ascii_lowercase();
    match cs.as_str() {
        "utf-8" | "utf8" => std::str::from_utf8(bytes)
            .map(std::borrow::Cow::Borrowed)
            .map_err(|e| PayloadError::InvalidText {
                charset: charset.to_owned(),
                detail: e.to_string(),
            }),
        "us-ascii" | "ascii" => {
            if let Some(pos) = bytes.iter().position(|b| !b.is_ascii()) {
                return Err(PayloadError::InvalidText {
                    charset: charset.to_owned(),
                    detail: format!("non-ASCII byte at offset {pos}"),
                });
            }
            std::str::from_utf8(bytes)
                .map(std::borrow::Cow::Borrowed)
                .map_err(|e| PayloadError::InvalidText {
                    charset: charset.to_owned(),
                    detail: e.to_string(),
                })
        }
        "iso-8859-1" | "latin1" | "latin-1" => Ok(std::borrow::Cow::Owned(
            bytes.iter().map(|&b| char::from(b)).collect(),
        )),
        _ => Err(PayloadError::UnsupportedCharset(charset.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_message_with_a_past_expiry_is_expired() {
        let mut m = Message::new(MessageType::Offer);
        assert!(!m.is_expired(), "no expiry");
        m.expires_at = Some(now_millis() + 60_000);
        assert!(!m.is_expired(), "expires in a minute");
        m.expires_at = Some(now_millis().saturating_sub(1));
        assert!(m.is_expired(), "expired a millisecond ago");
    }

    #[test]
    fn payload_kinds_follow_mimetype_and_charset() {
        let kind = |mime: Option<&str>, charset: Option<&str>, payload: &'static [u8]| {
            let mut m = Message::request();
            m.set_payload(Bytes::from_static(payload), mime, charset);
            m.payload_kind()
        };
        use PayloadKind::*;
        assert_eq!(kind(None, None, b""), Empty);
        assert_eq!(kind(None, None, b"x"), Binary);
        assert_eq!(kind(Some(MIME_BINARY), None, b"x"), Binary);
        // A charset makes any payload text, the common binary type too.
        assert_eq!(kind(Some(MIME_BINARY), Some("utf-8"), b"x"), Text);
        assert_eq!(kind(Some(MIME_JSON), None, b"1"), Data);
        assert_eq!(kind(Some(MIME_JSON), Some("utf-8"), b"1"), Data);
        assert_eq!(kind(Some("APPLICATION/JSON"), None, b"1"), Data);
        assert_eq!(kind(Some("application/vnd.x+json; v=2"), None, b"1"), Data);
        assert_eq!(kind(Some(MIME_TEXT), None, b"a"), Text);
        assert_eq!(kind(Some("text/plain; charset=utf-8"), None, b"a"), Text);
        assert_eq!(kind(Some("image/png"), None, b"x"), Binary);
    }

    #[test]
    fn a_binary_payload_without_a_mimetype_carries_none_and_reads_as_octet_stream() {
        let m = Message::binary(Bytes::from_static(b"\x00\x01"), None);
        assert_eq!(m.payload_mimetype, None, "nothing written for the default");
        assert_eq!(m.mimetype(), Some(MIME_BINARY));
        assert_eq!(m.payload_kind(), PayloadKind::Binary);

        let named = Message::binary(Bytes::from_static(b"x"), Some("image/png"));
        assert_eq!(named.payload_mimetype.as_deref(), Some("image/png"));
        assert_eq!(named.mimetype(), Some("image/png"));

        let empty = Message::binary(Bytes::new(), None);
        assert_eq!(empty.mimetype(), None);
        assert_eq!(empty.payload_kind(), PayloadKind::Empty);
    }
}
