//! The one error type of the client.

use std::io;
use std::time::Duration;

use tubeway_proto::{EncodeError, Message, PayloadError, ResponseStatus};
use tubeway_transport::UrlError;

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL could not be parsed.
    #[error(transparent)]
    InvalidUrl(#[from] UrlError),
    /// The transport connection could not be established.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The URL connected to.
        url: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// An embedded server could not listen on an address.
    #[error("cannot listen on {url}: {source}")]
    Listen {
        /// The URL asked for.
        url: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The broker refused the handshake (unsupported version, connection
    /// limit) or did not complete it.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The broker answered with an error status.
    #[error("{status}: {reason}")]
    Status {
        /// The response status.
        status: ResponseStatus,
        /// The reason the broker gave (the response's text payload).
        reason: String,
    },
    /// No answer arrived in time.
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The connection is closed, or closed while the call was in flight.
    #[error("connection closed: {0}")]
    ConnectionClosed(String),
    /// The subscription ended: it was unsubscribed, its topic was removed, or
    /// the connection closed.
    #[error("subscription ended")]
    SubscriptionEnded,
    /// The message exceeds the broker's maximum message size; it was not sent.
    #[error("message is {len} bytes; the broker accepts at most {max}")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The broker's limit.
        max: usize,
    },
    /// The message could not be encoded.
    #[error(transparent)]
    Encode(EncodeError),
    /// A payload could not be built or read as asked.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// A blocking call's wait was cut short by its thread's interrupt check
    /// (see [`crate::blocking::interruptible`]), or a background poll or
    /// offer was withdrawn (see [`crate::blocking::WaitHandle::withdraw`]); what it
    /// waited for is abandoned, as on a timeout.
    #[error("interrupted while waiting")]
    Interrupted,
    /// The blocking API was called where it cannot block (inside an async
    /// runtime), or its background runtime could not start.
    #[error("{0}")]
    Runtime(String),
}

impl Error {
    /// The response status this error corresponds to, if any: the broker's
    /// status for [`Error::Status`], `too_large` and `timeout` for the local
    /// equivalents.
    pub fn status(&self) -> Option<ResponseStatus> {
        match self {
            Error::Status { status, .. } => Some(*status),
            Error::TooLarge { .. } => Some(ResponseStatus::TooLarge),
            Error::Timeout(_) => Some(ResponseStatus::Timeout),
            _ => None,
        }
    }

    /// The error for a response whose status is not `ok`.
    pub(crate) fn from_response(response: &Message) -> Error {
        Error::Status {
            status: response.status(),
            reason: reason(response),
        }
    }
}

/// The reason an error response gives: its text payload.
pub(crate) fn reason(response: &Message) -> String {
    response
        .text_payload()
        .map(|t| t.into_owned())
        .unwrap_or_default()
}

impl From<EncodeError> for Error {
    fn from(e: EncodeError) -> Self {
        match e {
            EncodeError::TooLarge { len, max } => Error::TooLarge { len, max },
            other => Error::Encode(other),
        }
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Payload(PayloadError::InvalidData(e))
    }
}

/// The result of client calls.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping() {
        let e: Error = EncodeError::TooLarge { len: 10, max: 5 }.into();
        assert!(matches!(e, Error::TooLarge { len: 10, max: 5 }));
        assert_eq!(e.status(), Some(ResponseStatus::TooLarge));
        assert_eq!(
            Error::Timeout(Duration::from_secs(1)).status(),
            Some(ResponseStatus::Timeout)
        );
        assert_eq!(Error::ConnectionClosed("x".into()).status(), None);

        let req = Message::plain_text("hi");
        let resp = req.error_response(ResponseStatus::QueueFull, "queue q is full");
        let e = Error::from_response(&resp);
        assert_eq!(e.status(), Some(ResponseStatus::QueueFull));
        assert_eq!(e.to_string(), "queue_full: queue q is full");
    }
}
