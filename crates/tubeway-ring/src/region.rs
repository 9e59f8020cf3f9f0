//! A region: one mapping holding a ring in each direction.

use std::mem::size_of;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool as StdAtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::consumer::Consumer;
use crate::error::{ConfigError, CreateError, EndsError, OpenError};
use crate::layout::{
    Geometry, RegionHeader, RingDescriptor, RingGeometry, RingHeader, LAYOUT_VERSION, REGION_MAGIC,
    RING_MAGIC,
};
use crate::producer::Producer;
use crate::ring::Ring;
use crate::shm::Mapping;
use crate::sync::{fence, futex, AtomicBool, Ordering};

/// The smallest ring capacity.
pub const MIN_CAPACITY: usize = 64;
/// The largest ring capacity: 1 GiB (a record length must fit in 32 bits).
pub const MAX_CAPACITY: usize = 1 << 30;
/// The default ring capacity: 4 MiB per direction.
///
/// A message many times the ring's size is refilled through it again and
/// again; 4 MiB rings, larger than a core's 1 MiB L2 cache, moved 200 MB
/// messages faster than 1 MiB ones (docs/performance/investigations.md,
/// "Rings larger than a core's cache"). Pages are only resident once
/// written: a connection carrying requests and replies keeps reusing the
/// start of its rings, and one that streams holds at most 8 MiB, less than
/// Linux lets a busy TCP connection's socket buffers hold by default (4 MiB
/// to send, 6 MiB to receive).
pub const DEFAULT_CAPACITY: usize = 4 << 20;
/// The default largest capacity accepted from a peer: 64 MiB per direction.
pub const DEFAULT_MAX_CAPACITY: usize = 64 << 20;

/// The name memfds are created with (shown in `/proc/PID/fd`).
const MEMFD_NAME: &str = "tubeway-ring";

/// How to lay out a new region.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingConfig {
    /// Bytes of data area per direction: a power of two, at least
    /// [`MIN_CAPACITY`], at most [`MAX_CAPACITY`] (default 4 MiB). The
    /// largest record is half of it, less its 8-byte header; larger messages
    /// are fragmented.
    pub capacity: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            capacity: DEFAULT_CAPACITY,
        }
    }
}

impl RingConfig {
    /// Sets the capacity of each direction.
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    fn geometry(&self) -> Result<Geometry, ConfigError> {
        check_capacity(self.capacity as u64)?;
        // In range, so the sums cannot overflow.
        Geometry::new([self.capacity; 2]).ok_or(ConfigError::OutOfRange {
            capacity: self.capacity,
            min: MIN_CAPACITY,
            max: MAX_CAPACITY,
        })
    }
}

/// What a region received from a peer may be.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The largest capacity accepted for either ring (default 64 MiB). It
    /// bounds the memory a peer can make this process map.
    pub max_capacity: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_capacity: DEFAULT_MAX_CAPACITY,
        }
    }
}

impl Limits {
    /// Sets the largest capacity accepted for either ring.
    pub fn max_capacity(mut self, bytes: usize) -> Self {
        self.max_capacity = bytes;
        self
    }
}

/// Which side of a region a process is: decides which ring it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The side that created the region: writes ring 0, reads ring 1.
    Creator,
    /// The side that opened a region received from the creator: writes
    /// ring 1, reads ring 0.
    Opener,
}

impl Side {
    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::Creator => Side::Opener,
            Side::Opener => Side::Creator,
        }
    }

    /// This side's element of a pair indexed by side (0: creator); also the
    /// ring this side writes, of the pair of rings.
    pub(crate) fn of<T>(self, pair: &[T; 2]) -> &T {
        let [creator, opener] = pair;
        match self {
            Side::Creator => creator,
            Side::Opener => opener,
        }
    }
}

/// A shared-memory region holding two rings, one per direction.
///
/// Made by [`create`](Region::create) (a sealed memfd to pass to a peer),
/// [`heap`](Region::heap) (for use inside one process) or
/// [`open`](Region::open) (from a memfd a peer passed). Each side takes its
/// [`Producer`] and [`Consumer`] with [`ends`](Region::ends).
#[derive(Debug)]
pub struct Region {
    map: Mapping,
    /// Where ring 0 and ring 1 are, found once from the validated geometry;
    /// never read from shared memory again.
    rings: [RingPlace; 2],
    /// Per side: its peer was declared dead. Process-local, so a peer can
    /// neither set nor clear it.
    peer_dead: [AtomicBool; 2],
    /// Per side: its ends were handed out.
    taken: [StdAtomicBool; 2],
    /// Per ring, one atomic per word of its data area: what the record
    /// headers are modelled by (see `Ring::word`).
    #[cfg(loom)]
    words: [Box<[crate::sync::AtomicU64]>; 2],
}

impl Region {
    /// Creates a region in a new memfd, sealed against resizing, to be
    /// passed to a peer (see [`fd`](Region::fd)).
    pub fn create(config: &RingConfig) -> Result<Region, CreateError> {
        let geometry = config.geometry()?;
        let map = Mapping::create_memfd(MEMFD_NAME, geometry.region_size)?;
        Region::init(map, geometry, config)
    }

    /// Creates a region in anonymous memory, for two ends in this process.
    pub fn heap(config: &RingConfig) -> Result<Region, CreateError> {
        let geometry = config.geometry()?;
        let map = Mapping::anonymous(geometry.region_size)?;
        Region::init(map, geometry, config)
    }

    /// Writes the headers of a fresh region.
    fn init(
        mut map: Mapping,
        geometry: Geometry,
        config: &RingConfig,
    ) -> Result<Region, CreateError> {
        let rings = geometry.rings.map(|g| RingDescriptor {
            header_offset: (g.header_offset as u64).into(),
            data_offset: (g.data_offset as u64).into(),
            capacity: (g.capacity as u64).into(),
        });
        let header = RegionHeader {
            magic: REGION_MAGIC.into(),
            version: LAYOUT_VERSION.into(),
            header_size: (size_of::<RegionHeader>() as u32).into(),
            region_size: (geometry.region_size as u64).into(),
            rings,
        };
        let mut fits = map.init(0, header);
        for ring in geometry.rings {
            fits &= map.init(ring.header_offset, RingHeader::new(ring.capacity as u64));
        }
        // The mapping was made for this geometry, so this cannot fail.
        let unfit = ConfigError::OutOfRange {
            capacity: config.capacity,
            min: MIN_CAPACITY,
            max: MAX_CAPACITY,
        };
        if fits {
            Region::new(map, &geometry).ok_or(unfit.into())
        } else {
            Err(unfit.into())
        }
    }

    fn new(map: Mapping, geometry: &Geometry) -> Option<Region> {
        let [ring0, ring1] = geometry.rings;
        let rings = [RingPlace::find(&map, ring0)?, RingPlace::find(&map, ring1)?];
        Some(Region {
            map,
            rings,
            peer_dead: [AtomicBool::new(false), AtomicBool::new(false)],
            taken: [StdAtomicBool::new(false), StdAtomicBool::new(false)],
            #[cfg(loom)]
            words: rings.map(|ring| {
                (0..ring.capacity / crate::record::HEADER)
                    .map(|_| crate::sync::AtomicU64::new(0))
                    .collect()
            }),
        })
    }

    /// The modelled word at `pos` of the data area of the ring at `place`.
    #[cfg(loom)]
    pub(crate) fn loom_word(&self, place: &RingPlace, pos: u64) -> &crate::sync::AtomicU64 {
        let ([ring0, _], [words0, words1]) = (&self.rings, &self.words);
        let words = if place.data == ring0.data {
            words0
        } else {
            words1
        };
        match words.get((pos / crate::record::HEADER) as usize) {
            Some(word) => word,
            None => panic!("data access out of bounds: {pos}"),
        }
    }

    /// Opens a region from a memfd received from the creator.
    ///
    /// Trusts nothing: checks the seals, the size against `limits`, the
    /// magic numbers and versions, and that the offsets and size are exactly
    /// the layout of the capacities found. The geometry is read once here;
    /// later changes by the peer are never looked at.
    ///
    /// Open a memfd once per process: two `Region`s of one memfd in one
    /// process could each hand out the same side's ends, and two producers
    /// (or consumers) of one ring break it like a misbehaving peer would.
    pub fn open(fd: OwnedFd, limits: &Limits) -> Result<Region, OpenError> {
        let smallest = Geometry::new([MIN_CAPACITY; 2]).map_or(u64::MAX, |g| g.region_size as u64);
        let max_capacity = limits.max_capacity.clamp(MIN_CAPACITY, MAX_CAPACITY);
        let largest = Geometry::new([max_capacity; 2]).map_or(u64::MAX, |g| g.region_size as u64);
        let map = Mapping::open_memfd(fd, smallest, largest)?;
        let geometry = validate(&map, limits)?;
        Region::new(map, &geometry).ok_or(OpenError::Geometry("rings outside the region"))
    }

    /// The memfd to pass to the peer (none for a [`heap`](Region::heap)
    /// region). It is close-on-exec: send it over a Unix socket
    /// (`SCM_RIGHTS`), or duplicate it for a child process to inherit.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.map.fd()
    }

    /// Length of the region in bytes.
    pub fn size(&self) -> usize {
        self.map.len()
    }

    /// The capacity of the ring `side` writes.
    pub fn tx_capacity(&self, side: Side) -> usize {
        side.of(&self.rings).capacity as usize
    }

    /// Hands out the producer of the ring `side` writes and the consumer of
    /// the ring it reads. Each side's ends can be taken once per `Region`.
    pub fn ends(self: &Arc<Self>, side: Side) -> Result<(Producer, Consumer), EndsError> {
        if side.of(&self.taken).swap(true, Relaxed) {
            return Err(EndsError::Taken(side));
        }
        let tx = Ring::new(Arc::clone(self), *side.of(&self.rings), side);
        let rx = Ring::new(Arc::clone(self), *side.peer().of(&self.rings), side);
        Ok((Producer::new(tx)?, Consumer::new(rx)?))
    }

    /// Declares the peer of `side` dead (its process hung up): the ends of
    /// `side` treat their rings as closed by the peer, and every thread of
    /// this process sleeping in them wakes at once. A reader still gets the
    /// records published before, then [`Closed`](crate::ReadError::Closed).
    ///
    /// The flag is kept in this process, out of the peer's reach.
    pub fn mark_peer_dead(&self, side: Side) {
        // Dekker pair with a sleeper's announcement: the flag is stored
        // before the fence, the waiting words are read after it (see
        // `wait.rs`).
        side.of(&self.peer_dead).store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        let rx = &side.peer().of(&self.rings).header().reader.reader_waiting;
        let tx = &side.of(&self.rings).header().producer.writer_waiting;
        for word in [rx, tx] {
            if word.swap(0, Ordering::Relaxed) != 0 {
                futex::wake_all(word);
            }
        }
    }

    /// Where ring `index` is, for tests that corrupt it.
    #[cfg(test)]
    pub(crate) fn place(&self, index: usize) -> RingPlace {
        self.rings[index]
    }

    /// Whether the peer of `side` was declared dead.
    pub(crate) fn peer_dead(&self, side: Side) -> bool {
        side.of(&self.peer_dead).load(Ordering::Acquire)
    }
}

/// Where one ring is in a region's mapping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingPlace {
    /// The ring's header, a valid view into the mapping.
    pub header: NonNull<RingHeader>,
    /// The start of its data area, `capacity` bytes inside the mapping.
    pub data: NonNull<u8>,
    /// Size of the data area (a validated power of two).
    pub capacity: u64,
}

// SAFETY: the pointers are plain addresses into a `Mapping` (Send + Sync);
// whoever dereferences them keeps the region alive (see `RingPlace::header`).
unsafe impl Send for RingPlace {}
// SAFETY: as for Send.
unsafe impl Sync for RingPlace {}

impl RingPlace {
    fn find(map: &Mapping, g: RingGeometry) -> Option<RingPlace> {
        Some(RingPlace {
            header: map.view::<RingHeader>(g.header_offset)?.into(),
            data: map.ptr(g.data_offset, g.capacity)?,
            capacity: g.capacity as u64,
        })
    }

    /// The ring's header.
    ///
    /// Sound only while the region this place came from is alive: every
    /// holder of a `RingPlace` outside `Region` keeps an `Arc<Region>`.
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: made from a checked view of the mapping (in bounds,
        // aligned, a SharedLayout); the mapping is alive as long as the
        // region, which the holder keeps alive (see above).
        unsafe { self.header.as_ref() }
    }
}

/// Checks that a capacity is a power of two within the supported range.
pub(crate) fn check_capacity(capacity: u64) -> Result<(), ConfigError> {
    let as_usize = usize::try_from(capacity).unwrap_or(usize::MAX);
    if !capacity.is_power_of_two() {
        return Err(ConfigError::NotPowerOfTwo(as_usize));
    }
    if !(MIN_CAPACITY as u64..=MAX_CAPACITY as u64).contains(&capacity) {
        return Err(ConfigError::OutOfRange {
            capacity: as_usize,
            min: MIN_CAPACITY,
            max: MAX_CAPACITY,
        });
    }
    Ok(())
}

/// Validates the headers of a region from a peer; returns its geometry.
fn validate(map: &Mapping, limits: &Limits) -> Result<Geometry, OpenError> {
    let header = map
        .view::<RegionHeader>(0)
        .ok_or(OpenError::Geometry("region too small for its header"))?;
    // Each field is read exactly once, into a local.
    let magic = header.magic.load(Relaxed);
    if magic != REGION_MAGIC {
        return Err(OpenError::Magic { found: magic });
    }
    let version = header.version.load(Relaxed);
    if version != LAYOUT_VERSION {
        return Err(OpenError::Version {
            found: version,
            expected: LAYOUT_VERSION,
        });
    }
    if header.header_size.load(Relaxed) as usize != size_of::<RegionHeader>() {
        return Err(OpenError::Geometry("region header size"));
    }
    let region_size = header.region_size.load(Relaxed);
    let [ring0, ring1] = &header.rings;
    let capacities = [
        read_capacity(0, ring0, limits)?,
        read_capacity(1, ring1, limits)?,
    ];
    let offsets = [ring0, ring1].map(|desc| {
        (
            desc.header_offset.load(Relaxed),
            desc.data_offset.load(Relaxed),
        )
    });
    let geometry = Geometry::new(capacities).ok_or(OpenError::Geometry("capacities overflow"))?;
    if region_size != geometry.region_size as u64 || map.len() != geometry.region_size {
        return Err(OpenError::Geometry("region size"));
    }
    for (ring, (g, (header_offset, data_offset))) in geometry.rings.iter().zip(offsets).enumerate()
    {
        if header_offset != g.header_offset as u64 || data_offset != g.data_offset as u64 {
            return Err(OpenError::Geometry("ring offsets"));
        }
        let rh = map
            .view::<RingHeader>(g.header_offset)
            .ok_or(OpenError::Geometry("ring header outside the region"))?;
        if rh.meta.magic.load(Relaxed) != RING_MAGIC {
            return Err(OpenError::RingHeader {
                ring,
                what: "bad magic",
            });
        }
        if rh.meta.version.load(Relaxed) != LAYOUT_VERSION {
            return Err(OpenError::RingHeader {
                ring,
                what: "bad version",
            });
        }
        if rh.meta.capacity.load(Relaxed) != g.capacity as u64 {
            return Err(OpenError::RingHeader {
                ring,
                what: "capacity differs from the region header",
            });
        }
    }
    Ok(geometry)
}

/// Reads and checks the capacity of ring `ring` of a peer's region.
fn read_capacity(ring: usize, desc: &RingDescriptor, limits: &Limits) -> Result<usize, OpenError> {
    let capacity = desc.capacity.load(Relaxed);
    check_capacity(capacity).map_err(|source| OpenError::Capacity { ring, source })?;
    match usize::try_from(capacity) {
        Ok(capacity) if capacity <= limits.max_capacity => Ok(capacity),
        _ => Err(OpenError::CapacityLimit {
            ring,
            capacity,
            max: limits.max_capacity,
        }),
    }
}
