//! Tubeway transports behind one API.
//!
//! Every transport is addressed by a URL — `tcp://host:port`, `unix:///path`,
//! `mem://name` — so code changes transport by changing a string. A
//! [`Listener`] accepts [`Connection`]s; a connection splits into a
//! [`FrameReader`] and a write half driven by [`write_frames`], which batches
//! queued frames into one vectored system call.
#![warn(missing_docs)]
#![warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

mod conn;
mod framed;
mod mem;
mod url;

pub use conn::{connect, BoxRead, BoxWrite, Connection, Listener};
pub use framed::{consume, write_frames, FrameReader, ReadError, WriteBatch};
pub use url::{Url, UrlError};
