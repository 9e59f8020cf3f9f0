//! How one Python object travels between queue endpoints: as consecutive
//! frames of the Tubeway codec on one connection.
//!
//! - The **head** frame: a oneway `publish` message whose `subject` is
//!   [`SUBJECT`], whose `payload_mimetype` names the serializer and whose
//!   `request_id` is the number of buffer frames that follow (decimal); its
//!   payload is the serialized object (for pickle, without the out-of-band
//!   buffers).
//! - That many **buffer** frames: oneway `publish` messages whose
//!   `correlation_id` is the head's id, each carrying one out-of-band buffer
//!   as its binary payload, sent from the object's own memory.
//!
//! The frames of one object are queued together, so they are never
//! interleaved with another object's on the same connection.

use bytes::Bytes;
use tubeway::{Message, MessageType};
use tubeway_proto::{codec, EncodeError, EncodedFrame};
use uuid::Uuid;

/// The head frame's subject: the framing's name and version.
pub const SUBJECT: &str = "tubeway.queue/1";
/// The most buffer frames one object may have.
pub const MAX_BUFFERS: usize = 1 << 16;

/// Encodes an object: its head payload and its out-of-band buffers.
pub fn encode(
    mimetype: &str,
    head: Bytes,
    buffers: Vec<Bytes>,
    max_frame: usize,
) -> Result<Vec<EncodedFrame>, EncodeError> {
    let mut msg = Message::new(MessageType::Publish).with_oneway(true);
    msg.subject = Some(SUBJECT.to_owned());
    msg.request_id = Some(buffers.len().to_string());
    msg.set_payload(head, Some(mimetype), None);
    let id = msg.id;
    let mut frames = Vec::with_capacity(1 + buffers.len());
    frames.push(codec::encode(&msg, max_frame)?);
    for buffer in buffers {
        frames.push(codec::encode(&buffer_message(id, buffer), max_frame)?);
    }
    Ok(frames)
}

fn buffer_message(head: Uuid, payload: Bytes) -> Message {
    let mut msg = Message::new(MessageType::Publish).with_oneway(true);
    msg.correlation_id = Some(head);
    msg.set_payload(payload, Some(tubeway::MIME_BINARY), None);
    msg
}

/// An object received whole.
#[derive(Debug)]
pub struct Received {
    /// The serializer's mimetype.
    pub mimetype: String,
    /// The serialized object.
    pub head: Bytes,
    /// Its out-of-band buffers.
    pub buffers: Vec<Bytes>,
}

impl Received {
    /// Payload bytes held.
    pub fn size(&self) -> usize {
        self.head.len() + self.buffers.iter().map(Bytes::len).sum::<usize>()
    }
}

/// Why a peer's frames were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FramingError {
    /// A frame that is not a head arrived where a head was expected.
    #[error("expected an object's head frame (subject {SUBJECT:?}), got a {0} message")]
    NotAHead(&'static str),
    /// The head's buffer count is missing or out of range.
    #[error("bad buffer count {0:?} in a head frame")]
    BadCount(Option<String>),
    /// A buffer frame does not belong to the object being received.
    #[error("a buffer frame does not belong to the object being received")]
    Stray,
}

/// Assembles objects from a peer's frames.
#[derive(Debug, Default)]
pub struct Assembler {
    pending: Option<(Uuid, usize, Received)>,
}

impl Assembler {
    /// Takes the next frame; returns an object once its last frame arrived.
    pub fn push(&mut self, msg: Message) -> Result<Option<Received>, FramingError> {
        match self.pending.take() {
            None => {
                if msg.subject.as_deref() != Some(SUBJECT) {
                    return Err(FramingError::NotAHead(msg.r#type.as_str()));
                }
                let count = msg
                    .request_id
                    .as_deref()
                    .and_then(|c| c.parse::<usize>().ok())
                    .filter(|&c| c <= MAX_BUFFERS)
                    .ok_or_else(|| FramingError::BadCount(msg.request_id.clone()))?;
                let received = Received {
                    // Read as the protocol reads it: a non-empty payload
                    // without a mimetype is raw bytes.
                    mimetype: msg.mimetype().unwrap_or_default().to_owned(),
                    head: msg.payload,
                    buffers: Vec::with_capacity(count),
                };
                if count == 0 {
                    return Ok(Some(received));
                }
                self.pending = Some((msg.id, count, received));
                Ok(None)
            }
            Some((id, count, mut received)) => {
                if msg.correlation_id != Some(id) {
                    return Err(FramingError::Stray);
                }
                received.buffers.push(msg.payload);
                if received.buffers.len() == count {
                    return Ok(Some(received));
                }
                self.pending = Some((id, count, received));
                Ok(None)
            }
        }
    }
}
