//! The Tubeway message model and wire codec.
//!
//! This crate performs no I/O and contains no `unsafe`: it takes bytes in and
//! gives messages out, so every transport and every language binding shares one
//! definition of the protocol. The format is specified in `docs/protocol.md`;
//! `spec/vectors/` holds byte-exact test vectors.
#![forbid(unsafe_code)]
#![warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs)]

mod clock;
pub mod codec;
mod id;
mod json;
mod message;
pub mod name;
pub mod ops;

pub use clock::now_millis;
pub use codec::{decode_frame, DecodeError, Decoded, Decoder, EncodeError, EncodedFrame};
pub use id::fresh as fresh_id;
pub use json::JsonError;
pub use message::{
    Message, MessageType, PayloadError, PayloadKind, ResponseStatus, MIME_BINARY, MIME_JSON,
    MIME_TEXT,
};

/// Default maximum size of one encoded message: 20 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 20 * 1024 * 1024;
/// The largest maximum message size a peer may configure: 1 GiB.
pub const MAX_MESSAGE_SIZE_LIMIT: usize = 1024 * 1024 * 1024;
/// The wire format version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 1;
