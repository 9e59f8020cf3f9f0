//! Tubeway: request/reply functions, queues and pub/sub topics through one broker.
//!
//! [`AsyncClient`] is the client for async (tokio) code, [`Client`] the
//! blocking one; both share one connection among any number of concurrent
//! calls. Messages are [`Message`]s; management operations exchange the
//! bodies in [`ops`].
//!
//! ```no_run
//! # fn main() -> tubeway::Result<()> {
//! let client = tubeway::Client::connect("tcp://127.0.0.1:7000")?;
//! let reply = client.send("echo", tubeway::Message::plain_text("hello"))?;
//! println!("{}", reply.text_payload()?);
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod error;
mod server;

pub use client::blocking::{self, Client};
pub use client::{
    AsyncClient, Batch, ClientOptions, HandlerError, Responder, Subscription, SubscriptionHandle,
    Worker,
};
pub use error::{Error, Result};
pub use server::Server;
/// The embeddable broker: run one inside any program.
pub use tubeway_broker as broker;
pub use tubeway_broker::{Broker, BrokerConfig};
pub use tubeway_proto::{
    ops, Message, MessageType, PayloadError, PayloadKind, ResponseStatus, MIME_BINARY, MIME_JSON,
    MIME_TEXT,
};
pub use tubeway_transport::{channel, LargeBuffer, Url, WaitStrategy};
