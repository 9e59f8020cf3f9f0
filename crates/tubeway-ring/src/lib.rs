//! Lock-free single-producer / single-consumer byte rings in shared memory.
//!
//! A [`Region`] is one mapping (a sealed memfd to share with another
//! process, or anonymous memory for one process) holding two rings, one per
//! direction. Each side takes a [`Producer`] for the ring it writes and a
//! [`Consumer`] for the ring it reads with [`Region::ends`].
//!
//! ```
//! use std::sync::Arc;
//! use tubeway_ring::{Region, RingConfig, Side, WaitStrategy};
//!
//! let region = Arc::new(Region::heap(&RingConfig::default().capacity(64 * 1024))?);
//! let (mut tx, _rx) = region.ends(Side::Creator)?;
//! let (_tx, mut rx) = region.ends(Side::Opener)?;
//!
//! let _ = tx.try_write(&[b"head:", b"payload"])?;
//! let record = rx.read(&WaitStrategy::default(), None)?;
//! assert_eq!(&*record, b"head:payload");
//! assert!(record.is_last());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Records are variable-length and borrowed in place; messages larger than a
//! record are fragmented ([`Producer::write_message`],
//! [`Consumer::read_message`]). Waiting follows a [`WaitStrategy`]; the
//! hot path makes no system call, and a sleeper is woken through a futex in
//! the ring header or, for async code, a [`Doorbell`] the transport rings.
//!
//! Everything read from shared memory is treated as hostile: indices,
//! lengths and flags are validated and a violation is reported as
//! [`Corrupt`], never a panic nor an access outside the mapping.
//! `docs/shared-memory.md` describes the layouts, the protocols and the
//! assumptions made about the peer.
//!
//! This is the one crate of the workspace with `unsafe` code; every block
//! says why it is sound. It knows nothing of Tubeway messages or of async
//! runtimes: it moves bytes.
#![warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(
    test,
    allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)
)]

mod consumer;
mod error;
mod layout;
mod parts;
mod pingpong;
mod producer;
mod record;
mod region;
mod ring;
mod shm;
mod strategy;
mod sync;
mod wait;

#[cfg(test)]
mod tests;

pub use consumer::{Consumer, Record};
pub use error::{
    ConfigError, Corrupt, CreateError, EndsError, OpenError, PostError, ReadError,
    ReadMessageError, TimedOut, TryReadError, TryWriteError, WriteMessageError, WriteSomeError,
};
pub use pingpong::PingPong;
pub use producer::{Producer, FRAGMENT_ROOM_MAX, STREAM_RECORD_MAX};
pub use region::{
    Limits, Region, RingConfig, Side, DEFAULT_CAPACITY, DEFAULT_MAX_CAPACITY, MAX_CAPACITY,
    MIN_CAPACITY,
};
pub use strategy::WaitStrategyError;
pub use wait::{
    pause_after, Doorbell, Sleeper, WaitStrategy, Wake, DEFAULT_SPIN, EAGER_SPINS, SPIN_YIELD_EVERY,
};
