//! The wire codec: one message per frame.
//!
//! ```text
//! prefix (12 bytes)
//!   0..2   magic        0x54 0x57 ("TW")
//!   2      version      1
//!   3      flags        bit 0: payload compressed (reserved; must be 0 in v1)
//!                       bits 1-7: reserved, must be 0
//!   4..8   frame_len    u32 LE: the whole frame, prefix included
//!   8..12  header_len   u32 LE: the header section after the prefix
//! header (header_len bytes)
//!   0      type             u8
//!   1      response_status  u8 (0: none)
//!   2      bits             u8: bit 0 oneway, bit 1 durable; others 0
//!   3      reserved         u8, 0
//!   4..20  id               16 bytes, UUID
//!   20..28 timestamp        u64 LE, ms since the epoch
//!   28..   fields           tag u8, len u16 LE, value; tags strictly ascending
//! payload (frame_len - 12 - header_len bytes)
//! ```
//!
//! See `docs/protocol.md` for the field tags and the versioning rule.

use bytes::{Buf, Bytes, BytesMut};
use uuid::Uuid;

use crate::message::{Message, MessageType, ResponseStatus};

/// Frame magic, "TW".
pub const MAGIC: [u8; 2] = *b"TW";
/// Length of the fixed prefix.
pub const PREFIX_LEN: usize = 12;
/// Length of the fixed part of the header section.
pub const FIXED_HEADER_LEN: usize = 28;
/// The smallest valid frame.
pub const MIN_FRAME_LEN: usize = PREFIX_LEN + FIXED_HEADER_LEN;
/// Longest value of one header field.
pub const MAX_FIELD_LEN: usize = u16::MAX as usize;
/// Flag bit: the payload is compressed (reserved for a later version).
pub const FLAG_COMPRESSED: u8 = 0b0000_0001;
/// Flags a v1 decoder accepts.
const KNOWN_FLAGS: u8 = 0;

const BIT_ONEWAY: u8 = 0b01;
const BIT_DURABLE: u8 = 0b10;

/// Header field tags. Tags below 128 are critical: a decoder that does not
/// know one rejects the message. Tags 128 and above are optional extensions
/// a decoder skips.
pub mod tag {
    /// `expires_at`, u64 LE.
    pub const EXPIRES_AT: u8 = 1;
    /// `timeout`, u64 LE milliseconds.
    pub const TIMEOUT: u8 = 2;
    /// `request_id`, UTF-8.
    pub const REQUEST_ID: u8 = 3;
    /// `correlation_id`, 16 bytes.
    pub const CORRELATION_ID: u8 = 4;
    /// `subject`, UTF-8.
    pub const SUBJECT: u8 = 5;
    /// `destination`, UTF-8.
    pub const DESTINATION: u8 = 6;
    /// `reply_to`, UTF-8.
    pub const REPLY_TO: u8 = 7;
    /// `payload_mimetype`, UTF-8.
    pub const PAYLOAD_MIMETYPE: u8 = 8;
    /// `payload_charset`, UTF-8.
    pub const PAYLOAD_CHARSET: u8 = 9;
    /// First tag of the optional (skippable) range.
    pub const FIRST_OPTIONAL: u8 = 128;
}

/// Why a message could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A header field is longer than 65535 bytes.
    #[error("field {field} is {len} bytes; the limit is {MAX_FIELD_LEN}")]
    FieldTooLong {
        /// The field's name.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// The frame would exceed the maximum message size.
    #[error("message is {len} bytes; the limit is {max}")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The limit in force.
        max: usize,
    },
}

/// Why bytes could not be decoded into a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame does not start with the magic: not a Tubeway peer, or the
    /// stream lost its framing. The connection cannot continue.
    #[error("bad frame magic {0:02x?}: not a Tubeway frame")]
    BadMagic([u8; 2]),
    /// A frame version this decoder does not speak.
    #[error("unsupported frame version {0} (this peer speaks {v})", v = crate::PROTOCOL_VERSION)]
    UnsupportedVersion(u8),
    /// Flags this decoder does not know.
    #[error("unknown frame flags {0:#04x}")]
    UnknownFlags(u8),
    /// The declared lengths are inconsistent.
    #[error("bad frame lengths: frame_len {frame_len}, header_len {header_len}")]
    BadLength {
        /// Declared frame length.
        frame_len: u32,
        /// Declared header length.
        header_len: u32,
    },
    /// The frame ended early.
    #[error("frame truncated: {0}")]
    Truncated(&'static str),
    /// Unknown message type code.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// Unknown response status code.
    #[error("unknown response status {0}")]
    UnknownStatus(u8),
    /// Reserved bits are set.
    #[error("reserved header bits set: {0:#04x}")]
    ReservedBits(u8),
    /// An unknown critical field tag.
    #[error("unknown header field tag {0}")]
    UnknownTag(u8),
    /// Field tags out of order or repeated.
    #[error("header field tag {0} out of order or repeated")]
    TagOrder(u8),
    /// A field has the wrong length.
    #[error("header field {field} has length {len}, expected {expected}")]
    FieldLength {
        /// Field name.
        field: &'static str,
        /// Found length.
        len: usize,
        /// Expected length.
        expected: usize,
    },
    /// A text field is not UTF-8.
    #[error("header field {0} is not valid UTF-8")]
    InvalidUtf8(&'static str),
}

impl DecodeError {
    /// Whether the stream's framing is lost, so the connection must close.
    /// Other errors concern one well-delimited frame, which can be skipped.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            DecodeError::BadMagic(_)
                | DecodeError::UnsupportedVersion(_)
                | DecodeError::UnknownFlags(_)
                | DecodeError::BadLength { .. }
        )
    }
}

/// An encoded frame: prefix and header in `head`, the payload shared, so a
/// writer can send both with one vectored write and never copy the payload.
#[derive(Debug, Clone)]
pub struct EncodedFrame {
    /// Prefix and header section.
    pub head: Bytes,
    /// Payload, shared with the message.
    pub payload: Bytes,
}

impl EncodedFrame {
    /// Total frame length.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Never true: a frame has at least a prefix and fixed header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The frame as one contiguous buffer (copies the payload).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.payload);
        v
    }
}

fn put_str_field(
    buf: &mut Vec<u8>,
    t: u8,
    field: &'static str,
    v: &Option<String>,
) -> Result<(), EncodeError> {
    if let Some(s) = v {
        if s.len() > MAX_FIELD_LEN {
            return Err(EncodeError::FieldTooLong {
                field,
                len: s.len(),
            });
        }
        put_field(buf, t, s.as_bytes());
    }
    Ok(())
}

/// One tag-length-value field; `value` is at most [`MAX_FIELD_LEN`] long.
fn put_field(buf: &mut Vec<u8>, t: u8, value: &[u8]) {
    let [l0, l1] = (value.len() as u16).to_le_bytes();
    buf.extend_from_slice(&[t, l0, l1]);
    buf.extend_from_slice(value);
}

/// Encodes `msg`, refusing frames larger than `max_frame` bytes. The
/// frame shares the message's payload.
pub fn encode(msg: &Message, max_frame: usize) -> Result<EncodedFrame, EncodeError> {
    let head = encode_head(msg, max_frame)?;
    Ok(EncodedFrame {
        head,
        payload: msg.payload.clone(),
    })
}

/// [`encode`], taking the message's payload instead of sharing it: for a
/// sender done with the message. Sharing a payload made from a `Vec` costs
/// an allocation (`Bytes` sets up its reference count on the first clone).
pub fn encode_owned(msg: Message, max_frame: usize) -> Result<EncodedFrame, EncodeError> {
    let head = encode_head(&msg, max_frame)?;
    Ok(EncodedFrame {
        head,
        payload: msg.payload,
    })
}

/// The prefix and header section of `msg`'s frame.
fn encode_head(msg: &Message, max_frame: usize) -> Result<Bytes, EncodeError> {
    // Exactly the size: a `Bytes` made of a full `Vec` needs no second
    // allocation for a reference count, nor an atomic update to drop.
    let len = head_len(msg);
    let total = len + msg.payload.len();
    let mut head = Vec::with_capacity(len);
    // Written a few pieces at a time rather than field by field: every
    // write checks the vector's capacity.
    let [f0, f1, f2, f3] = (total as u32).to_le_bytes();
    let [h0, h1, h2, h3] = ((len - PREFIX_LEN) as u32).to_le_bytes();
    let mut bits = 0;
    if msg.oneway {
        bits |= BIT_ONEWAY;
    }
    if msg.durable {
        bits |= BIT_DURABLE;
    }
    let [m0, m1] = MAGIC;
    head.extend_from_slice(&[
        m0,
        m1,
        crate::PROTOCOL_VERSION,
        0,
        f0,
        f1,
        f2,
        f3,
        h0,
        h1,
        h2,
        h3,
        msg.r#type.code(),
        msg.response_status.map_or(0, ResponseStatus::code),
        bits,
        0,
    ]);
    head.extend_from_slice(msg.id.as_bytes());
    head.extend_from_slice(&msg.timestamp.to_le_bytes());

    if let Some(t) = msg.expires_at {
        put_field(&mut head, tag::EXPIRES_AT, &t.to_le_bytes());
    }
    if let Some(t) = msg.timeout {
        let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        put_field(&mut head, tag::TIMEOUT, &ms.to_le_bytes());
    }
    put_str_field(&mut head, tag::REQUEST_ID, "request_id", &msg.request_id)?;
    if let Some(c) = msg.correlation_id {
        put_field(&mut head, tag::CORRELATION_ID, c.as_bytes());
    }
    put_str_field(&mut head, tag::SUBJECT, "subject", &msg.subject)?;
    put_str_field(&mut head, tag::DESTINATION, "destination", &msg.destination)?;
    put_str_field(&mut head, tag::REPLY_TO, "reply_to", &msg.reply_to)?;
    put_str_field(
        &mut head,
        tag::PAYLOAD_MIMETYPE,
        "payload_mimetype",
        &msg.payload_mimetype,
    )?;
    put_str_field(
        &mut head,
        tag::PAYLOAD_CHARSET,
        "payload_charset",
        &msg.payload_charset,
    )?;

    if total > max_frame || total > u32::MAX as usize {
        return Err(EncodeError::TooLarge {
            len: total,
            max: max_frame.min(u32::MAX as usize),
        });
    }
    debug_assert_eq!(head.len(), len);
    debug_assert_eq!(head.capacity(), len);
    Ok(Bytes::from(head))
}

/// The length of `msg`'s prefix and header section. A field too long to
/// encode counts as the longest allowed: the encoder refuses it, and must
/// not allocate its length first.
fn head_len(msg: &Message) -> usize {
    let fixed = |present: bool, len: usize| if present { 3 + len } else { 0 };
    let text = |v: &Option<String>| v.as_ref().map_or(0, |s| 3 + s.len().min(MAX_FIELD_LEN));
    PREFIX_LEN
        + FIXED_HEADER_LEN
        + fixed(msg.expires_at.is_some(), 8)
        + fixed(msg.timeout.is_some(), 8)
        + fixed(msg.correlation_id.is_some(), 16)
        + text(&msg.request_id)
        + text(&msg.subject)
        + text(&msg.destination)
        + text(&msg.reply_to)
        + text(&msg.payload_mimetype)
        + text(&msg.payload_charset)
}

/// The fixed prefix of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Flags byte.
    pub flags: u8,
    /// Whole frame length.
    pub frame_len: u32,
    /// Header section length.
    pub header_len: u32,
}

/// Parses and checks a frame prefix. `buf` must hold at least [`PREFIX_LEN`] bytes.
pub fn decode_prefix(mut buf: &[u8]) -> Result<Prefix, DecodeError> {
    if buf.len() < PREFIX_LEN {
        return Err(DecodeError::Truncated("prefix"));
    }
    let magic = [buf.get_u8(), buf.get_u8()];
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = buf.get_u8();
    if version != crate::PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let flags = buf.get_u8();
    if flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::UnknownFlags(flags));
    }
    let frame_len = buf.get_u32_le();
    let header_len = buf.get_u32_le();
    let fits = (header_len as u64) >= FIXED_HEADER_LEN as u64
        && (PREFIX_LEN as u64 + header_len as u64) <= frame_len as u64;
    if !fits {
        return Err(DecodeError::BadLength {
            frame_len,
            header_len,
        });
    }
    Ok(Prefix {
        flags,
        frame_len,
        header_len,
    })
}

/// Decodes one complete frame. The payload is a slice of `frame`, not a copy.
pub fn decode(frame: Bytes) -> Result<Message, DecodeError> {
    // The header is read in place; only the payload becomes a new handle on
    // the frame (each one costs an atomic increment and decrement).
    decode_with(&frame, |at| frame.slice(at..)).map(|m| *m)
}

/// [`decode`] of a frame that is borrowed: the payload is copied out.
fn decode_copied(frame: &[u8]) -> Result<Box<Message>, DecodeError> {
    decode_with(frame, |at| {
        Bytes::copy_from_slice(frame.get(at..).unwrap_or_default())
    })
}

/// Decodes `frame`, whose payload (from the offset given) `payload` makes.
fn decode_with(
    frame: &[u8],
    payload: impl FnOnce(usize) -> Bytes,
) -> Result<Box<Message>, DecodeError> {
    let prefix = decode_prefix(frame)?;
    if frame.len() != prefix.frame_len as usize {
        return Err(DecodeError::Truncated("frame shorter than frame_len"));
    }
    let payload_at = PREFIX_LEN + prefix.header_len as usize;
    let header = frame
        .get(PREFIX_LEN..payload_at)
        .ok_or(DecodeError::Truncated("header"))?;
    decode_header(header, payload(payload_at))
}

/// Decodes a header into a message made on the heap, where the reader's
/// caller keeps it: a message returned by value would be copied whole (some
/// 300 bytes) at each step up.
fn decode_header(mut h: &[u8], payload: Bytes) -> Result<Box<Message>, DecodeError> {
    if h.remaining() < FIXED_HEADER_LEN {
        return Err(DecodeError::Truncated("fixed header"));
    }
    let type_code = h.get_u8();
    let r#type = MessageType::from_code(type_code).ok_or(DecodeError::UnknownType(type_code))?;
    let status_code = h.get_u8();
    let response_status = match status_code {
        0 => None,
        c => Some(ResponseStatus::from_code(c).ok_or(DecodeError::UnknownStatus(c))?),
    };
    let bits = h.get_u8();
    if bits & !(BIT_ONEWAY | BIT_DURABLE) != 0 {
        return Err(DecodeError::ReservedBits(bits));
    }
    let reserved = h.get_u8();
    if reserved != 0 {
        return Err(DecodeError::ReservedBits(reserved));
    }
    let mut id = [0u8; 16];
    h.copy_to_slice(&mut id);
    let timestamp = h.get_u64_le();

    // Allocated first and written in place: a message made on the stack and
    // then boxed is copied whole right after the stores that made it, and
    // the copy waits for them to reach the cache.
    let mut msg = Box::write(
        Box::new_uninit(),
        Message::with_identity(r#type, Uuid::from_bytes(id), timestamp),
    );
    msg.oneway = bits & BIT_ONEWAY != 0;
    msg.durable = bits & BIT_DURABLE != 0;
    msg.response_status = response_status;
    msg.payload = payload;

    let mut last_tag: Option<u8> = None;
    while h.has_remaining() {
        if h.remaining() < 3 {
            return Err(DecodeError::Truncated("field header"));
        }
        let t = h.get_u8();
        let len = h.get_u16_le() as usize;
        let (value, rest) = h
            .split_at_checked(len)
            .ok_or(DecodeError::Truncated("field value"))?;
        h = rest;
        if last_tag.is_some_and(|l| t <= l) {
            return Err(DecodeError::TagOrder(t));
        }
        last_tag = Some(t);
        match t {
            tag::EXPIRES_AT => msg.expires_at = Some(fixed_u64(value, "expires_at")?),
            tag::TIMEOUT => {
                msg.timeout = Some(std::time::Duration::from_millis(fixed_u64(
                    value, "timeout",
                )?))
            }
            tag::REQUEST_ID => msg.request_id = Some(utf8(value, "request_id")?),
            tag::CORRELATION_ID => {
                let bytes: [u8; 16] = value.try_into().map_err(|_| DecodeError::FieldLength {
                    field: "correlation_id",
                    len,
                    expected: 16,
                })?;
                msg.correlation_id = Some(Uuid::from_bytes(bytes));
            }
            tag::SUBJECT => msg.subject = Some(utf8(value, "subject")?),
            tag::DESTINATION => msg.destination = Some(utf8(value, "destination")?),
            tag::REPLY_TO => msg.reply_to = Some(utf8(value, "reply_to")?),
            tag::PAYLOAD_MIMETYPE => msg.payload_mimetype = Some(utf8(value, "payload_mimetype")?),
            tag::PAYLOAD_CHARSET => msg.payload_charset = Some(utf8(value, "payload_charset")?),
            t if t >= tag::FIRST_OPTIONAL => {}
            t => return Err(DecodeError::UnknownTag(t)),
        }
    }
    Ok(msg)
}

fn fixed_u64(v: &[u8], field: &'static str) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = v.try_into().map_err(|_| DecodeError::FieldLength {
        field,
        len: v.len(),
        expected: 8,
    })?;
    Ok(u64::from_le_bytes(bytes))
}

fn utf8(v: &[u8], field: &'static str) -> Result<String, DecodeError> {
    std::str::from_utf8(v)
        .map(str::to_owned)
        .map_err(|_| DecodeError::InvalidUtf8(field))
}

/// Frames up to this size leave the read buffer by a copy of their payload
/// rather than as a slice of it: for a small payload an allocation and a
/// short copy cost less than sharing the buffer (the atomic reference-count
/// updates of the slice, and a buffer that is then never reused).
const COPY_FRAME_MAX: usize = 1024;

/// What the streaming [`Decoder`] produced.
#[derive(Debug)]
#[non_exhaustive]
pub enum Decoded {
    /// A complete, valid message.
    Message(Box<Message>),
    /// A well-delimited frame whose content is invalid. The stream continues;
    /// answer `bad_request` to `id` when it is known.
    Invalid {
        /// The frame's message id, if the fixed header could be read.
        id: Option<Uuid>,
        /// The frame's type code, if it could be read.
        type_code: Option<u8>,
        /// What is wrong.
        error: DecodeError,
    },
    /// A frame longer than the maximum. Its bytes are being discarded, never
    /// buffered; answer `too_large` to `id` when it is known.
    TooLarge {
        /// The frame's message id, if the fixed header could be read.
        id: Option<Uuid>,
        /// The frame's type code.
        type_code: Option<u8>,
        /// Whether the sender asked for no response.
        oneway: bool,
        /// Declared frame length.
        frame_len: u64,
        /// The limit in force.
        max: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum State {
    Head,
    Skip { remaining: u64 },
}

/// A streaming frame decoder: feed it bytes as they arrive, take messages out.
///
/// It checks every declared length against the maximum message size before
/// reserving any memory, and discards oversized frames without buffering them.
#[derive(Debug)]
pub struct Decoder {
    max_frame: usize,
    state: State,
}

impl Decoder {
    /// A decoder that accepts frames of at most `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Decoder {
            max_frame,
            state: State::Head,
        }
    }

    /// The maximum frame size.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Sets the maximum frame size for frames not yet started.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// How many more bytes the decoder wants before it can make progress, at least.
    /// Readers use it to size their buffer; it never exceeds the maximum frame size.
    pub fn wanted(&self, buf: &BytesMut) -> usize {
        match self.state {
            State::Skip { .. } => 0,
            State::Head => {
                if buf.len() < PREFIX_LEN {
                    return PREFIX_LEN - buf.len();
                }
                match decode_prefix(buf) {
                    Ok(p) if (p.frame_len as usize) <= self.max_frame => {
                        (p.frame_len as usize).saturating_sub(buf.len())
                    }
                    _ => 0,
                }
            }
        }
    }

    /// Whether the next bytes of the stream start a frame (none is being
    /// skipped): a reader may then read a whole frame itself, into memory of
    /// its choosing, and decode it with [`decode_frame`].
    pub fn at_frame_start(&self) -> bool {
        matches!(self.state, State::Head)
    }

    /// Whether the decoder sits at a frame boundary (nothing partly read).
    pub fn is_idle(&self, buf: &BytesMut) -> bool {
        matches!(self.state, State::Head) && buf.is_empty()
    }

    /// Decodes `bytes` when it is exactly one small frame, starting where
    /// the stream is at a frame boundary, of at most the maximum size: what
    /// [`decode`](Self::decode) would make of it, without the bytes first
    /// going into a buffer. `None` otherwise, the bytes untouched: feed them
    /// to `decode`, which then says what is wrong, if anything.
    pub fn decode_whole(&self, bytes: &[u8]) -> Option<Decoded> {
        if !self.at_frame_start() || bytes.len() > COPY_FRAME_MAX.min(self.max_frame) {
            return None;
        }
        let prefix = decode_prefix(bytes).ok()?;
        (prefix.frame_len as usize == bytes.len()).then(|| decode_frame_copied(bytes))
    }

    /// Takes the next item out of `buf`. `Ok(None)` means more bytes are needed.
    /// An `Err` is fatal: the stream's framing is lost.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, DecodeError> {
        loop {
            match self.state {
                State::Skip { remaining } => {
                    let n = remaining.min(buf.len() as u64) as usize;
                    buf.advance(n);
                    let remaining = remaining - n as u64;
                    if remaining > 0 {
                        self.state = State::Skip { remaining };
                        return Ok(None);
                    }
                    self.state = State::Head;
                }
                State::Head => {
                    if buf.len() < PREFIX_LEN {
                        return Ok(None);
                    }
                    let prefix = decode_prefix(buf)?;
                    let frame_len = prefix.frame_len as usize;
                    if frame_len > self.max_frame {
                        // Read the fixed header (if it has arrived) to name the frame, then skip.
                        if buf.len() < MIN_FRAME_LEN {
                            return Ok(None);
                        }
                        let (id, type_code, oneway) = peek_fixed(buf);
                        buf.advance(MIN_FRAME_LEN);
                        self.state = State::Skip {
                            remaining: prefix.frame_len as u64 - MIN_FRAME_LEN as u64,
                        };
                        return Ok(Some(Decoded::TooLarge {
                            id,
                            type_code,
                            oneway,
                            frame_len: prefix.frame_len as u64,
                            max: self.max_frame,
                        }));
                    }
                    if buf.len() < frame_len {
                        buf.reserve(frame_len - buf.len());
                        return Ok(None);
                    }
                    if frame_len > COPY_FRAME_MAX {
                        return Ok(Some(decode_frame(buf.split_to(frame_len).freeze())));
                    }
                    let frame = buf.get(..frame_len).unwrap_or_default();
                    let decoded = decode_frame_copied(frame);
                    buf.advance(frame_len);
                    return Ok(Some(decoded));
                }
            }
        }
    }
}

/// Decodes one whole, well-delimited frame (its length already checked
/// against the maximum): a message, or what is wrong with it.
pub fn decode_frame(frame: Bytes) -> Decoded {
    let (id, type_code, _) = peek_fixed(&frame);
    decoded(decode_with(&frame, |at| frame.slice(at..)), id, type_code)
}

/// [`decode_frame`] of a borrowed frame: the payload is copied out.
fn decode_frame_copied(frame: &[u8]) -> Decoded {
    let (id, type_code, _) = peek_fixed(frame);
    decoded(decode_copied(frame), id, type_code)
}

fn decoded(
    r: Result<Box<Message>, DecodeError>,
    id: Option<Uuid>,
    type_code: Option<u8>,
) -> Decoded {
    match r {
        Ok(m) => Decoded::Message(m),
        Err(error) => Decoded::Invalid {
            id,
            type_code,
            error,
        },
    }
}

/// Reads id, type and oneway from a buffer that starts with a prefix, if present.
fn peek_fixed(buf: &[u8]) -> (Option<Uuid>, Option<u8>, bool) {
    let Some(fixed) = buf.get(PREFIX_LEN..MIN_FRAME_LEN) else {
        return (None, None, false);
    };
    let type_code = fixed.first().copied();
    let oneway = fixed.get(2).is_some_and(|b| b & BIT_ONEWAY != 0);
    let id = fixed
        .get(4..20)
        .and_then(|s| <[u8; 16]>::try_from(s).ok())
        .map(Uuid::from_bytes);
    (id, type_code, oneway)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn sample() -> Message {
        Message::plain_text("hello")
            .with_destination("echo")
            .with_subject("s")
            .with_request_id("r-1")
            .with_ttl(std::time::Duration::from_secs(5))
            .with_timeout(std::time::Duration::from_millis(250))
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let f = encode(&m, 1 << 20).unwrap();
        let back = decode(Bytes::from(f.to_vec())).unwrap();
        assert_eq!(m, back);
    }

    #[test]
    fn a_whole_small_frame_decodes_in_place_and_nothing_else_does() {
        let m = sample();
        let f = encode(&m, 1 << 20).unwrap();
        let bytes = [&f.head[..], &f.payload[..]].concat();
        let d = Decoder::new(1 << 20);
        match d.decode_whole(&bytes) {
            Some(Decoded::Message(back)) => assert_eq!(*back, m),
            other => panic!("{other:?}"),
        }
        // Not exactly one frame.
        assert!(d.decode_whole(&bytes[..bytes.len() - 1]).is_none());
        assert!(d.decode_whole(&[&bytes[..], &bytes[..]].concat()).is_none());
        assert!(d.decode_whole(&bytes[..5]).is_none());
        assert!(d.decode_whole(&[]).is_none());
        // Not a frame: left to `decode`, which says so.
        let mut garbage = bytes.clone();
        garbage[0] = b'X';
        assert!(d.decode_whole(&garbage).is_none());
        assert!(Decoder::new(1 << 20)
            .decode(&mut BytesMut::from(&garbage[..]))
            .is_err());
        // Larger than the decoder takes, or than is worth decoding in place.
        assert!(Decoder::new(bytes.len() - 1).decode_whole(&bytes).is_none());
        let big = encode(&Message::binary(vec![1u8; COPY_FRAME_MAX], None), 1 << 20).unwrap();
        assert!(d
            .decode_whole(&[&big.head[..], &big.payload[..]].concat())
            .is_none());
        // In the middle of skipping a frame too large: not at a boundary.
        let mut skipping = Decoder::new(64);
        let mut buf = BytesMut::from(&big.head[..]);
        assert!(matches!(
            skipping.decode(&mut buf),
            Ok(Some(Decoded::TooLarge { .. }))
        ));
        assert!(skipping.decode_whole(&bytes).is_none());
    }

    #[test]
    fn an_owned_encoding_is_the_same_frame_holding_the_payload_alone() {
        let m = sample();
        let shared = encode(&m, 1 << 20).unwrap();
        let owned = encode_owned(m.clone(), 1 << 20).unwrap();
        assert_eq!(owned.to_vec(), shared.to_vec());
        // Sharing leaves two handles while the message lives; the owned
        // frame holds the only one, to the same bytes.
        let m = Message::binary(vec![1u8; 64], None);
        let payload_ptr = m.payload.as_ptr();
        assert!(!encode(&m, 1 << 20).unwrap().payload.is_unique());
        let owned = encode_owned(m, 1 << 20).unwrap();
        assert!(owned.payload.is_unique());
        assert_eq!(owned.payload.as_ptr(), payload_ptr, "moved, not copied");
        let big = Message::binary(vec![1u8; 64], None);
        assert!(matches!(
            encode_owned(big, 70),
            Err(EncodeError::TooLarge { max: 70, .. })
        ));
    }

    #[test]
    fn streaming_in_single_bytes() {
        let m = sample();
        let bytes = encode(&m, 1 << 20).unwrap().to_vec();
        let mut d = Decoder::new(1 << 20);
        let mut buf = BytesMut::new();
        let mut out = vec![];
        for b in bytes.iter().chain(bytes.iter()) {
            buf.put_u8(*b);
            while let Some(x) = d.decode(&mut buf).unwrap() {
                out.push(x);
            }
        }
        assert_eq!(out.len(), 2);
        assert!(matches!(&out[0], Decoded::Message(x) if **x == m));
    }

    #[test]
    fn a_small_payload_is_copied_out_and_a_large_one_shares_the_buffer() {
        let small = Message::binary(vec![1u8; 64], None);
        let large = Message::binary(vec![2u8; COPY_FRAME_MAX], None);
        let mut bytes = encode(&small, 1 << 20).unwrap().to_vec();
        bytes.extend(encode(&large, 1 << 20).unwrap().to_vec());
        let mut buf = BytesMut::from(&bytes[..]);
        let read = buf.as_ptr_range();
        let mut d = Decoder::new(1 << 20);
        let Some(Decoded::Message(got)) = d.decode(&mut buf).unwrap() else {
            panic!("expected the small message");
        };
        assert_eq!(*got, small);
        // Copied, so the read buffer stays unshared and is reused.
        assert!(!read.contains(&got.payload.as_ptr()));
        assert!(got.payload.is_unique());
        let Some(Decoded::Message(got)) = d.decode(&mut buf).unwrap() else {
            panic!("expected the large message");
        };
        assert_eq!(*got, large);
        assert!(
            read.contains(&got.payload.as_ptr()),
            "a slice of the read bytes"
        );
    }

    #[test]
    fn a_head_is_encoded_into_exactly_its_size() {
        // Every field present: a wrong size fails the encoder's own check.
        let mut m = sample().with_reply_to("replies");
        m.correlation_id = Some(Uuid::new_v4());
        m.response_status = Some(ResponseStatus::Ok);
        let f = encode(&m, 1 << 20).unwrap();
        assert_eq!(f.head.len(), head_len(&m));
        assert_eq!(decode(Bytes::from(f.to_vec())).unwrap(), m);
        let bare = Message::new(MessageType::Ping);
        assert_eq!(encode(&bare, 1 << 20).unwrap().head.len(), MIN_FRAME_LEN);
    }

    #[test]
    fn a_field_longer_than_its_length_prefix_is_refused() {
        let ok = Message::new(MessageType::Ping).with_subject("s".repeat(MAX_FIELD_LEN));
        let f = encode(&ok, 1 << 20).unwrap();
        assert_eq!(decode(Bytes::from(f.to_vec())).unwrap(), ok);
        let long = Message::new(MessageType::Ping).with_subject("s".repeat(MAX_FIELD_LEN + 1));
        assert!(matches!(
            encode(&long, 1 << 20),
            Err(EncodeError::FieldTooLong { field: "subject", len }) if len == MAX_FIELD_LEN + 1
        ));
    }

    #[test]
    fn oversized_frame_is_skipped_not_buffered() {
        let big = Message::binary(vec![7u8; 4096], None);
        let small = sample();
        let mut bytes = encode(&big, 1 << 20).unwrap().to_vec();
        bytes.extend(encode(&small, 1 << 20).unwrap().to_vec());
        let mut d = Decoder::new(1024);
        let mut buf = BytesMut::from(&bytes[..]);
        match d.decode(&mut buf).unwrap().unwrap() {
            Decoded::TooLarge { id, .. } => assert_eq!(id, Some(big.id)),
            other => panic!("{other:?}"),
        }
        match d.decode(&mut buf).unwrap().unwrap() {
            Decoded::Message(m) => assert_eq!(*m, small),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn absurd_length_does_not_reserve() {
        let mut bytes = encode(&sample(), 1 << 20).unwrap().to_vec();
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut d = Decoder::new(1024);
        let mut buf = BytesMut::from(&bytes[..]);
        let cap_before = buf.capacity();
        assert!(matches!(
            d.decode(&mut buf).unwrap(),
            Some(Decoded::TooLarge { .. })
        ));
        assert!(buf.capacity() <= cap_before);
        assert_eq!(d.wanted(&buf), 0);
    }

    #[test]
    fn bad_magic_is_fatal() {
        let mut d = Decoder::new(1024);
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
        let e = d.decode(&mut buf).unwrap_err();
        assert!(e.is_fatal());
    }

    #[test]
    fn unknown_type_is_recoverable() {
        let mut bytes = encode(&sample(), 1 << 20).unwrap().to_vec();
        bytes[PREFIX_LEN] = 250;
        let mut d = Decoder::new(1 << 20);
        let mut buf = BytesMut::from(&bytes[..]);
        match d.decode(&mut buf).unwrap().unwrap() {
            Decoded::Invalid { error, id, .. } => {
                assert_eq!(error, DecodeError::UnknownType(250));
                assert!(id.is_some());
            }
            other => panic!("{other:?}"),
        }
    }
}
