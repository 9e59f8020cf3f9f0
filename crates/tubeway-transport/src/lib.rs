//! Tubeway transports behind one API.
//!
//! Every transport is addressed by a URL — `tcp://host:port`, `unix:///path`,
//! `shm://name` (shared-memory rings between processes), `mem://name` — so
//! code changes transport by changing a string. A
//! [`Listener`] accepts [`Connection`]s; a connection splits into a
//! [`FrameReader`] and a [`FrameWriter`], whose flusher batches
//! queued frames into one vectored system call.
#![warn(missing_docs)]
#![warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

pub mod channel;
mod conn;
mod framed;
mod large;
mod mem;
mod on_demand;
mod pool;
mod shm;
mod stream;
#[cfg(test)]
mod test_wakes;
mod url;
mod wait;

pub use conn::{connect, Connection, Listener};
pub use framed::{
    FrameReader, FrameWriter, Lent, ReadError, WriteError, WriteStats, WRITE_QUEUE_BYTES,
};
pub use large::LargeBuffer;
pub use pool::FramePool;
pub use stream::{ReadHalf, WriteHalf};
pub use url::{Url, UrlError};
pub use wait::{SpinGroup, WaitStrategy, WaitStrategyError, DEFAULT_SPIN, SPIN_YIELD_EVERY};
