//! The errors of every operation, one enum each.

use std::io;

use crate::region::Side;

/// A ring configuration that cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The capacity is not a power of two.
    #[error("ring capacity {0} is not a power of two")]
    NotPowerOfTwo(usize),
    /// The capacity is outside what a ring supports.
    #[error("ring capacity {capacity} is outside {min}..={max}")]
    OutOfRange {
        /// The capacity asked for.
        capacity: usize,
        /// The smallest capacity.
        min: usize,
        /// The largest capacity.
        max: usize,
    },
}

/// Why a shared-memory region could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `memfd_create` failed.
    #[error("cannot create the memfd: {0}")]
    Memfd(#[source] io::Error),
    /// Sizing the memfd failed (out of memory or a limit on shared memory).
    #[error("cannot size the memfd to {size} bytes: {source}")]
    Resize {
        /// The size asked for.
        size: usize,
        /// The error from `ftruncate`.
        #[source]
        source: io::Error,
    },
    /// Sealing the memfd failed.
    #[error("cannot seal the memfd: {0}")]
    Seal(#[source] io::Error),
    /// Mapping the memory failed.
    #[error("cannot map {size} bytes: {source}")]
    Map {
        /// The size asked for.
        size: usize,
        /// The error from `mmap`.
        #[source]
        source: io::Error,
    },
}

/// Why a region received from a peer was refused.
///
/// Nothing of the region is trusted before all of these checks pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// `fstat` failed.
    #[error("cannot stat the region's file: {0}")]
    Stat(#[source] io::Error),
    /// The file is smaller than any valid region or larger than the limit.
    #[error("region file of {size} bytes is outside the accepted {min}..={max}")]
    Size {
        /// The file's size.
        size: u64,
        /// The smallest valid region.
        min: u64,
        /// The largest region the caller accepts.
        max: u64,
    },
    /// The file's seals cannot be read: it is not a memfd.
    #[error("cannot read the region's seals (not a memfd?): {0}")]
    Seals(#[source] io::Error),
    /// The file is not sealed against resizing, so the peer could truncate
    /// it under the mapping (which would kill this process with SIGBUS).
    #[error("region is not sealed against shrinking, growing and resealing")]
    Unsealed,
    /// Mapping the file failed.
    #[error("cannot map the region: {0}")]
    Map(#[source] io::Error),
    /// The region does not start with the expected magic number.
    #[error("not a tubeway region (magic {found:#018x})")]
    Magic {
        /// The word found.
        found: u64,
    },
    /// The region has a layout version this build does not speak.
    #[error("region layout version {found}, expected {expected}")]
    Version {
        /// The version found.
        found: u32,
        /// The version this build speaks.
        expected: u32,
    },
    /// A ring's capacity is not acceptable.
    #[error("ring {ring}: {source}")]
    Capacity {
        /// The ring (0: creator to opener, 1: the reverse).
        ring: usize,
        /// What is wrong with it.
        #[source]
        source: ConfigError,
    },
    /// A ring's capacity exceeds what the caller accepts.
    #[error("ring {ring}: capacity {capacity} exceeds the accepted {max}")]
    CapacityLimit {
        /// The ring.
        ring: usize,
        /// Its capacity.
        capacity: u64,
        /// The caller's limit.
        max: usize,
    },
    /// The header's sizes and offsets are not the layout of its capacities.
    #[error("region geometry does not match its capacities: {0}")]
    Geometry(&'static str),
    /// A ring header is invalid.
    #[error("ring {ring} header: {what}")]
    RingHeader {
        /// The ring.
        ring: usize,
        /// What is wrong with it.
        what: &'static str,
    },
}

/// The shared memory broke the ring protocol: the peer is buggy or hostile.
///
/// The end that reports it has read or written nothing out of bounds; the
/// ring cannot be used any more and should be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corrupt {
    /// The peer's index is behind ours, further ahead than the capacity,
    /// or not a multiple of 8.
    #[error("ring indices out of order: head {head}, tail {tail}, capacity {capacity}")]
    Indices {
        /// The head (consumer's index).
        head: u64,
        /// The tail (producer's index).
        tail: u64,
        /// The ring's capacity.
        capacity: u64,
    },
    /// A record header has a flag this version does not know, or both
    /// padding and more-fragments.
    #[error("record at index {at} has unknown flags {flags:#x}")]
    Flags {
        /// Where the record is.
        at: u64,
        /// Its flags.
        flags: u32,
    },
    /// A record is longer than a record can be, or runs past the end of the
    /// data area, or has become shorter than the part of it already read as
    /// a byte stream.
    #[error("record at index {at} of {len} bytes does not fit (readable {readable})")]
    Length {
        /// Where the record is.
        at: u64,
        /// Its payload length.
        len: u64,
        /// Bytes from `at` to the end of the data area, or of the record
        /// already read as a byte stream.
        readable: u64,
    },
    /// A padding record that does not run exactly to the end of the data
    /// area, or one at its very start.
    #[error("padding record at index {at} of {len} bytes does not end the data area")]
    Padding {
        /// Where the record is.
        at: u64,
        /// Its payload length.
        len: u64,
    },
}

/// Why [`Region::ends`](crate::Region::ends) handed out no ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndsError {
    /// The ends of this side were already taken from this region: a ring has
    /// one producer and one consumer.
    #[error("the {0:?} ends of this region are already taken")]
    Taken(Side),
    /// The shared indices are already corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// Why [`Producer::try_write`](crate::Producer::try_write) wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TryWriteError {
    /// Not enough free space now; the record fits once the reader catches up.
    #[error("ring full: {need} bytes needed")]
    Full {
        /// Bytes of space the record needs (header and padding included).
        need: usize,
    },
    /// The reader closed, its process died, or this end was closed.
    #[error("ring closed")]
    Closed,
    /// The record is larger than a record of this ring can be; use
    /// [`Producer::write_message`](crate::Producer::write_message).
    #[error("record of {len} bytes exceeds the largest record, {max} bytes")]
    TooLarge {
        /// The record's length.
        len: usize,
        /// The largest record.
        max: usize,
    },
    /// The shared memory is corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// Why [`Producer::write_some`](crate::Producer::write_some) wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteSomeError {
    /// Not even one byte fits now.
    #[error("ring full")]
    Full,
    /// The reader closed, its process died, or this end was closed.
    #[error("ring closed")]
    Closed,
    /// The shared memory is corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// Why [`Producer::write_message`](crate::Producer::write_message) did not
/// write the whole message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteMessageError {
    /// The reader closed, its process died, or this end was closed.
    #[error("ring closed")]
    Closed,
    /// The deadline passed before any of the message was written; nothing
    /// was written and the ring is usable.
    #[error("timed out waiting for space")]
    TimedOut,
    /// The deadline passed after some fragments were written. The reader
    /// has an unfinished message, so this end has closed the ring.
    #[error("timed out after writing {written} bytes of a fragmented message; ring closed")]
    TimedOutMidMessage {
        /// Payload bytes already written.
        written: usize,
    },
    /// The shared memory is corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// Why [`Consumer::try_read`](crate::Consumer::try_read) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TryReadError {
    /// Every record has been read and the writer closed (or died), or this
    /// end was closed.
    #[error("ring closed")]
    Closed,
    /// The shared memory is corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// Why [`Consumer::read`](crate::Consumer::read) returned no record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Every record has been read and the writer closed (or died), or this
    /// end was closed.
    #[error("ring closed")]
    Closed,
    /// The deadline passed with nothing to read.
    #[error("timed out waiting for a record")]
    TimedOut,
    /// The shared memory is corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

impl From<TryReadError> for ReadError {
    fn from(e: TryReadError) -> Self {
        match e {
            TryReadError::Closed => ReadError::Closed,
            TryReadError::Corrupt(c) => ReadError::Corrupt(c),
        }
    }
}

/// Why [`Consumer::read_message`](crate::Consumer::read_message) returned no
/// message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadMessageError {
    /// Every record has been read and the writer closed (or died), or this
    /// end was closed.
    #[error("ring closed")]
    Closed,
    /// The deadline passed before the message was complete.
    #[error("timed out waiting for a record")]
    TimedOut,
    /// The message is longer than the caller accepts.
    #[error("message longer than {max} bytes")]
    TooLarge {
        /// The caller's limit.
        max: usize,
    },
    /// The shared memory is corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

impl From<ReadError> for ReadMessageError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Closed => ReadMessageError::Closed,
            ReadError::TimedOut => ReadMessageError::TimedOut,
            ReadError::Corrupt(c) => ReadMessageError::Corrupt(c),
        }
    }
}

/// The deadline passed before the peer's number arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("timed out waiting for the peer")]
#[non_exhaustive]
pub struct TimedOut;

/// Why [`PingPong::post_payload`](crate::PingPong::post_payload) posted nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The payload is longer than a side's line holds.
    #[error("ping-pong payload of {len} bytes is larger than the {max} bytes a line holds")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// [`PingPong::MAX_PAYLOAD`](crate::PingPong::MAX_PAYLOAD).
        max: usize,
    },
}
