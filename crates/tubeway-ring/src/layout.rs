//! The `#[repr(C)]` types laid over shared memory, and where they go.
//!
//! `docs/shared-memory.md` draws each of them byte by byte; the compile-time
//! asserts at the end of this file keep the two in step. Every field is an
//! atomic, because another process may write any of them at any time: with
//! atomics a concurrent (even hostile) write is a value we validate, never a
//! data race. Multi-byte words are in the machine's own byte order; both ends
//! of a region are on one machine.
//!
//! The lines written by the producer and by the consumer are 128 bytes apart
//! and 128-byte aligned, so they never share a cache line nor the pair of
//! lines that the adjacent-line prefetcher of x86 CPUs fetches together.

use std::mem::size_of;
use std::sync::atomic::{AtomicU32 as StdAtomicU32, AtomicU64 as StdAtomicU64};

use crate::sync::{AtomicU32, AtomicU64};

/// Size of a cache line, the unit in which cores hand memory over.
pub(crate) const CACHE_LINE: usize = 64;

/// Size of a "line": two cache lines, the unit the adjacent-line
/// prefetcher moves.
pub(crate) const LINE: usize = 2 * CACHE_LINE;

/// Alignment of the data areas: a page, so a data area never shares a page
/// with a header.
pub(crate) const DATA_ALIGN: usize = 4096;

/// The version of every layout in this file. A reader refuses any other.
pub(crate) const LAYOUT_VERSION: u32 = 3;

/// `TWREGION` as it appears in memory.
pub(crate) const REGION_MAGIC: u64 = u64::from_ne_bytes(*b"TWREGION");
/// `TWRING01` as it appears in memory.
pub(crate) const RING_MAGIC: u64 = u64::from_ne_bytes(*b"TWRING01");
/// `TWPINGPG` as it appears in memory.
pub(crate) const PINGPONG_MAGIC: u64 = u64::from_ne_bytes(*b"TWPINGPG");

/// Marks the types that may be viewed in place in shared memory.
///
/// # Safety
///
/// The type must be `#[repr(C)]` and made only of atomics (or arrays and
/// structs of them) and padding, so that every bit pattern, the all-zero one
/// of a fresh memfd included, is a valid value, and concurrent writes from
/// other processes are allowed through a shared reference. Under `cfg(loom)`
/// the ring lines hold loom's atomics instead, which are valid only once
/// constructed; such memory is only ever initialised by writing a whole new
/// value (see `Mapping::init`).
pub(crate) unsafe trait SharedLayout: Sized {}

/// The start of a ring region: what the opener needs to find the two rings.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: StdAtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: StdAtomicU32,
    /// `size_of::<RegionHeader>()`.
    pub header_size: StdAtomicU32,
    /// Length of the whole region in bytes (the memfd's size).
    pub region_size: StdAtomicU64,
    /// Ring 0 carries creator → opener, ring 1 opener → creator.
    pub rings: [RingDescriptor; 2],
}

/// Where one ring lives in the region.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct RingDescriptor {
    /// Offset of the ring's [`RingHeader`] from the start of the region.
    pub header_offset: StdAtomicU64,
    /// Offset of the ring's data area from the start of the region.
    pub data_offset: StdAtomicU64,
    /// Size of the data area in bytes (a power of two).
    pub capacity: StdAtomicU64,
}

// SAFETY: repr(C), only atomics and padding.
unsafe impl SharedLayout for RegionHeader {}

/// The header of one ring: a constant line, then a line written by the
/// producer and a line written by the consumer.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct RingHeader {
    /// Written once, by the creator.
    pub meta: RingMeta,
    /// Written by the producer to sleep or close (and, to wake it, by the
    /// consumer).
    pub producer: ProducerLine,
    /// Written by the consumer for every record it releases.
    pub consumer: ConsumerLine,
    /// Written by the consumer only to sleep or close (and, to wake it, by
    /// the producer): the producer reads it for every record, so it must
    /// not share a line with `head`.
    pub reader: ReaderLine,
}

/// The constant line of a ring header.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct RingMeta {
    /// [`RING_MAGIC`].
    pub magic: StdAtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: StdAtomicU32,
    /// Zero; room for flags in a later version.
    pub reserved: StdAtomicU32,
    /// Size of the data area in bytes (a power of two).
    pub capacity: StdAtomicU64,
}

/// The producer's line, written only to sleep or close (and, to wake it,
/// by the consumer): the consumer reads it for every record it releases.
///
/// There is no shared tail: each record header publishes its record (see
/// `record.rs`), so a reader never reads an index in another line first.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct ProducerLine {
    /// While `writer_waiting` is set: the head at which the writer's next
    /// record fits, so the consumer wakes it only when that much is free.
    pub writer_wake_at: AtomicU64,
    /// How the writer waits for space: 0 not waiting, 1 futex, 2 doorbell.
    pub writer_waiting: AtomicU32,
    /// 1 once the producer has closed: nothing follows what was published.
    pub closed: AtomicU32,
}

/// The consumer's line.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct ConsumerLine {
    /// Bytes ever released: `[head, head + capacity)` minus the readable
    /// records is free for the producer.
    pub head: AtomicU64,
}

/// The consumer's line that the producer reads for every record.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct ReaderLine {
    /// How the reader waits for records: 0 not waiting, 1 futex, 2 doorbell.
    pub reader_waiting: AtomicU32,
    /// 1 once the consumer has closed: it reads no more.
    pub closed: AtomicU32,
}

impl RingHeader {
    /// A fresh header for a ring of `capacity` bytes, empty and open.
    pub(crate) fn new(capacity: u64) -> RingHeader {
        RingHeader {
            meta: RingMeta {
                magic: StdAtomicU64::new(RING_MAGIC),
                version: StdAtomicU32::new(LAYOUT_VERSION),
                reserved: StdAtomicU32::new(0),
                capacity: StdAtomicU64::new(capacity),
            },
            producer: ProducerLine {
                writer_wake_at: AtomicU64::new(0),
                writer_waiting: AtomicU32::new(0),
                closed: AtomicU32::new(0),
            },
            consumer: ConsumerLine {
                head: AtomicU64::new(0),
            },
            reader: ReaderLine {
                reader_waiting: AtomicU32::new(0),
                closed: AtomicU32::new(0),
            },
        }
    }
}

// SAFETY: repr(C), only atomics and padding (see the trait for loom).
unsafe impl SharedLayout for RingHeader {}

/// The bare ping-pong layout: two sequence numbers (each with room for a
/// small payload) on lines of their own.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct PingPongLayout {
    /// [`PINGPONG_MAGIC`].
    pub magic: StdAtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: StdAtomicU32,
    /// Zero.
    pub reserved: StdAtomicU32,
    /// Index 0 is written by the creator, 1 by the opener.
    pub posted: [SeqLine; 2],
}

/// Words of payload a [`SeqLine`] holds after its number and length.
pub(crate) const PINGPONG_PAYLOAD_WORDS: usize = 14;

/// One side's line: its sequence number, then the payload posted with it.
#[repr(C, align(128))]
#[derive(Debug)]
pub(crate) struct SeqLine {
    /// The last number posted by this line's owner.
    pub seq: StdAtomicU64,
    /// Bytes of `payload` posted with `seq` (0 for a bare number).
    pub len: StdAtomicU32,
    /// Zero.
    pub reserved: StdAtomicU32,
    /// The payload, in native-endian words; the rest of the last word is zero.
    pub payload: [StdAtomicU64; PINGPONG_PAYLOAD_WORDS],
}

impl SeqLine {
    /// A line with nothing posted.
    pub(crate) fn new() -> SeqLine {
        SeqLine {
            seq: StdAtomicU64::new(0),
            len: StdAtomicU32::new(0),
            reserved: StdAtomicU32::new(0),
            payload: std::array::from_fn(|_| StdAtomicU64::new(0)),
        }
    }
}

// SAFETY: repr(C), only atomics and padding.
unsafe impl SharedLayout for PingPongLayout {}

/// Where everything of a ring region goes, computed from the two capacities.
///
/// This is the only layout a creator writes and the only one an opener
/// accepts: an opener recomputes it from the capacities it reads and refuses
/// a region whose offsets or size differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Total length of the region.
    pub region_size: usize,
    /// Ring 0 and ring 1.
    pub rings: [RingGeometry; 2],
}

/// Where one ring goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingGeometry {
    /// Offset of its [`RingHeader`].
    pub header_offset: usize,
    /// Offset of its data area.
    pub data_offset: usize,
    /// Size of its data area.
    pub capacity: usize,
}

impl Geometry {
    /// The layout for two rings of the given (already validated) capacities:
    /// region header, ring header 0, ring header 1, then each data area on a
    /// page boundary.
    pub(crate) fn new(capacities: [usize; 2]) -> Option<Geometry> {
        let header0 = size_of::<RegionHeader>();
        let header1 = header0 + size_of::<RingHeader>();
        let data0 = align_up(header1 + size_of::<RingHeader>(), DATA_ALIGN)?;
        let data1 = data0.checked_add(align_up(capacities[0], DATA_ALIGN)?)?;
        let region_size = data1.checked_add(align_up(capacities[1], DATA_ALIGN)?)?;
        Some(Geometry {
            region_size,
            rings: [
                RingGeometry {
                    header_offset: header0,
                    data_offset: data0,
                    capacity: capacities[0],
                },
                RingGeometry {
                    header_offset: header1,
                    data_offset: data1,
                    capacity: capacities[1],
                },
            ],
        })
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two).
fn align_up(n: usize, align: usize) -> Option<usize> {
    Some(n.checked_add(align - 1)? & !(align - 1))
}

// The layouts documented in docs/shared-memory.md. Loom's atomics are larger
// than std's, so the ring lines are only checked in normal builds.
const _: () = {
    use std::mem::{align_of, offset_of};

    assert!(size_of::<RegionHeader>() == LINE);
    assert!(align_of::<RegionHeader>() == LINE);
    assert!(offset_of!(RegionHeader, magic) == 0);
    assert!(offset_of!(RegionHeader, version) == 8);
    assert!(offset_of!(RegionHeader, header_size) == 12);
    assert!(offset_of!(RegionHeader, region_size) == 16);
    assert!(offset_of!(RegionHeader, rings) == 24);
    assert!(size_of::<RingDescriptor>() == 24);
    assert!(offset_of!(RingDescriptor, header_offset) == 0);
    assert!(offset_of!(RingDescriptor, data_offset) == 8);
    assert!(offset_of!(RingDescriptor, capacity) == 16);

    assert!(size_of::<RingMeta>() == LINE);
    assert!(offset_of!(RingMeta, magic) == 0);
    assert!(offset_of!(RingMeta, version) == 8);
    assert!(offset_of!(RingMeta, reserved) == 12);
    assert!(offset_of!(RingMeta, capacity) == 16);

    assert!(size_of::<PingPongLayout>() == 3 * LINE);
    assert!(offset_of!(PingPongLayout, magic) == 0);
    assert!(offset_of!(PingPongLayout, version) == 8);
    assert!(offset_of!(PingPongLayout, posted) == LINE);
    assert!(size_of::<SeqLine>() == LINE);
    assert!(offset_of!(SeqLine, seq) == 0);
    assert!(offset_of!(SeqLine, len) == 8);
    assert!(offset_of!(SeqLine, reserved) == 12);
    assert!(offset_of!(SeqLine, payload) == 16);
};

#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of};

    assert!(size_of::<RingHeader>() == 4 * LINE);
    assert!(align_of::<RingHeader>() == LINE);
    assert!(offset_of!(RingHeader, meta) == 0);
    assert!(offset_of!(RingHeader, producer) == LINE);
    assert!(offset_of!(RingHeader, consumer) == 2 * LINE);
    assert!(size_of::<ProducerLine>() == LINE);
    assert!(offset_of!(ProducerLine, writer_wake_at) == 0);
    assert!(offset_of!(ProducerLine, writer_waiting) == 8);
    assert!(offset_of!(ProducerLine, closed) == 12);
    assert!(size_of::<ConsumerLine>() == LINE);
    assert!(offset_of!(ConsumerLine, head) == 0);
    assert!(offset_of!(RingHeader, reader) == 3 * LINE);
    assert!(size_of::<ReaderLine>() == LINE);
    assert!(offset_of!(ReaderLine, reader_waiting) == 0);
    assert!(offset_of!(ReaderLine, closed) == 4);
    // Region header, two ring headers, then the first data area at 4096.
    assert!(LINE + 2 * 4 * LINE <= DATA_ALIGN);
};
