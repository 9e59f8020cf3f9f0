//! How a reader waits for bytes that have not arrived yet: the strategies of
//! the shared-memory rings, applied to every transport.
//!
//! On sockets every poll is a system call, so their default is to sleep at
//! once ([`WaitStrategy::PARK`]); a spinning strategy there is latency mode.
//! Shared memory defaults to spinning for about a wake-up's cost
//! ([`DEFAULT_SPIN`]), then sleeping.

pub use tubeway_ring::{WaitStrategy, WaitStrategyError, DEFAULT_SPIN};
