//! One error type per channel operation.

use std::io;

use crate::UrlError;

/// Why connecting (or binding) a channel failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is malformed.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The socket, pipe or memory could not be set up.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer is not a channel listener of this kind, or refused.
    #[error("channel set-up failed: {0}")]
    Setup(String),
    /// The set-up took longer than the connect timeout.
    #[error("no channel set up within {0:?}")]
    TimedOut(std::time::Duration),
}

/// Why accepting a channel connection failed. The listener stays usable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// Accepting failed (out of descriptors, say).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The connector did not complete the set-up correctly or in time.
    #[error("channel set-up failed: {0}")]
    Setup(String),
}

/// Why a message was not sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The peer closed its end or died.
    #[error("the channel is closed")]
    Closed,
    /// The deadline passed before the message went out; nothing of it was
    /// sent, and the channel is usable.
    #[error("timed out waiting for room")]
    TimedOut,
    /// The deadline passed with part of the message sent: the peer would
    /// read a broken message, so the channel was closed.
    #[error("timed out in the middle of a message; the channel is closed")]
    TimedOutMidMessage,
    /// The message is longer than a stream channel can frame (4 GiB).
    #[error("message of {len} bytes is larger than the {max}-byte limit")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The shared memory is corrupt (a buggy or hostile peer).
    #[error("{0}")]
    Corrupt(String),
}

/// Why [`Writer::try_send`](super::Writer::try_send) did not send.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrySendError {
    /// No room now; nothing was sent.
    #[error("the channel is full")]
    Full,
    /// The peer closed its end or died.
    #[error("the channel is closed")]
    Closed,
    /// The message cannot be sent without waiting whatever the room: on a
    /// ring, it is larger than one record and must go as fragments
    /// ([`Writer::send`](super::Writer::send) does that); on a stream, it is
    /// over the 4 GiB frame limit.
    #[error("message of {len} bytes is larger than the {max}-byte limit of try_send")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The shared memory is corrupt (a buggy or hostile peer).
    #[error("{0}")]
    Corrupt(String),
}

/// Why no message was received.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// The peer closed its end or died, and every message it sent was read.
    #[error("the channel is closed")]
    Closed,
    /// The peer sent a message larger than this end accepts; the channel
    /// is out of step and closed.
    #[error("message of {len} bytes is larger than the {max}-byte limit")]
    TooLarge {
        /// The announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The peer closed in the middle of a message.
    #[error("the peer closed the channel in the middle of a message")]
    Truncated,
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The shared memory is corrupt (a buggy or hostile peer).
    #[error("{0}")]
    Corrupt(String),
}
