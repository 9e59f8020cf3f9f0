//! The embeddable Tubeway broker.
//!
//! A [`Broker`] hosts request/reply *functions*, point-to-point *queues* and
//! publish/subscribe *topics*, and serves clients over any number of
//! transport addresses at once. Embed it in a program, or run it as the
//! `tubeway server` binary.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use tubeway_broker::{Broker, BrokerConfig};
//! let broker = Broker::new(BrokerConfig::default());
//! broker.create_function("echo", |m| Ok(m)).unwrap();
//! broker.listen(&"tcp://127.0.0.1:33333".parse().unwrap()).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod access;
mod broker;
mod config;
mod forward;
mod function;
#[doc(hidden)]
pub mod handlers;
mod queue;
mod session;
mod spin_pool;
mod stats;
mod topic;

pub use broker::{Broker, BrokerError};
pub use config::BrokerConfig;
pub use function::{HandlerError, HandlerFuture};
pub use tubeway_proto::ops::QueueKind;
