//! The bare ping-pong: the hardware's limit for a round trip through shared
//! memory, for benchmarks to set the rings against.
//!
//! Two sequence numbers, each alone on its 128-byte line, one written by
//! each side. A round trip is: post `n`, spin until the peer's number is
//! `n`. Each one-way trip is then exactly one cache-line transfer between
//! cores, the least any shared-memory transport can cost.
//!
//! A side may post a small payload with its number (up to
//! [`PingPong::MAX_PAYLOAD`] bytes, the rest of its line), which the peer
//! copies out once it sees the number: the least a transport can cost for a
//! message of that size, a copy in and a copy out included.

use std::mem::size_of;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::error::{CreateError, OpenError, PostError, TimedOut};
use crate::layout::{
    PingPongLayout, SeqLine, LAYOUT_VERSION, PINGPONG_MAGIC, PINGPONG_PAYLOAD_WORDS,
};
use crate::region::Side;
use crate::shm::Mapping;
use crate::wait::pause_after;

/// Size of a ping-pong memfd: one page.
const PAGE: usize = 4096;

/// Spins between two looks at the clock while waiting with a deadline.
const SPINS_PER_CLOCK_CHECK: u32 = 1024;

/// Two cache-line-aligned sequence numbers in shared memory, one per side.
///
/// `Sync`: share it between threads with an `Arc`, or between processes
/// through its memfd.
#[derive(Debug)]
pub struct PingPong {
    map: Mapping,
}

impl PingPong {
    /// The largest payload a side posts with its number: the 112 bytes of
    /// its line after the number and the length.
    pub const MAX_PAYLOAD: usize = PINGPONG_PAYLOAD_WORDS * 8;

    /// Creates one in a new sealed memfd, to pass to another process.
    pub fn create() -> Result<PingPong, CreateError> {
        PingPong::init(Mapping::create_memfd("tubeway-pingpong", PAGE)?)
    }

    /// Creates one in anonymous memory, for two threads of this process.
    pub fn heap() -> Result<PingPong, CreateError> {
        PingPong::init(Mapping::anonymous(PAGE)?)
    }

    fn init(mut map: Mapping) -> Result<PingPong, CreateError> {
        let layout = PingPongLayout {
            magic: PINGPONG_MAGIC.into(),
            version: LAYOUT_VERSION.into(),
            reserved: 0.into(),
            posted: [SeqLine::new(), SeqLine::new()],
        };
        // A page always holds the layout (asserted in layout.rs).
        if !map.init(0, layout) {
            return Err(CreateError::Map {
                size: PAGE,
                source: std::io::Error::other("page too small for the ping-pong layout"),
            });
        }
        Ok(PingPong { map })
    }

    /// Opens one from a memfd received from its creator, after checking its
    /// seals, size, magic and version.
    pub fn open(fd: OwnedFd) -> Result<PingPong, OpenError> {
        let map = Mapping::open_memfd(fd, size_of::<PingPongLayout>() as u64, PAGE as u64)?;
        let layout = map
            .view::<PingPongLayout>(0)
            .ok_or(OpenError::Geometry("ping-pong layout outside the file"))?;
        let magic = layout.magic.load(Ordering::Relaxed);
        if magic != PINGPONG_MAGIC {
            return Err(OpenError::Magic { found: magic });
        }
        let version = layout.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(OpenError::Version {
                found: version,
                expected: LAYOUT_VERSION,
            });
        }
        Ok(PingPong { map })
    }

    /// The memfd to pass to the peer (none for a heap one).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.map.fd()
    }

    fn layout(&self) -> &PingPongLayout {
        // Checked when made (init wrote it, open validated it); the mapping
        // never shrinks.
        match self.map.view::<PingPongLayout>(0) {
            Some(layout) => layout,
            None => unreachable!("ping-pong mapping smaller than its layout"),
        }
    }

    /// Posts `seq` as `side`'s number (a Release store: whatever `side`
    /// wrote before is visible to a peer that sees the number).
    pub fn post(&self, side: Side, seq: u64) {
        side.of(&self.layout().posted)
            .seq
            .store(seq, Ordering::Release);
    }

    /// The peer of `side`'s number now.
    pub fn peer(&self, side: Side) -> u64 {
        side.peer()
            .of(&self.layout().posted)
            .seq
            .load(Ordering::Acquire)
    }

    /// Spins until the peer of `side` has posted `seq` or more; returns the
    /// number seen. With a deadline, gives up once it has passed (the clock
    /// is read every 1024 spins, so that the spin itself stays a bare load).
    pub fn wait(&self, side: Side, seq: u64, deadline: Option<Instant>) -> Result<u64, TimedOut> {
        let word = &side.peer().of(&self.layout().posted).seq;
        // Spins as the rings' waiters do, so that the bare limit is the
        // best they could do.
        let mut spins = 0u32;
        loop {
            for _ in 0..SPINS_PER_CLOCK_CHECK {
                let seen = word.load(Ordering::Acquire);
                if seen >= seq {
                    return Ok(seen);
                }
                pause_after(spins);
                spins = spins.saturating_add(1);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(TimedOut);
            }
        }
    }

    /// Posts `seq` with `payload` as `side`'s number: the payload first,
    /// then the number (Release), so a peer that sees the number sees the
    /// payload. Fails, posting nothing, if the payload is longer than
    /// [`MAX_PAYLOAD`](Self::MAX_PAYLOAD).
    pub fn post_payload(&self, side: Side, seq: u64, payload: &[u8]) -> Result<(), PostError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|_| payload.len() <= Self::MAX_PAYLOAD)
            .ok_or(PostError::TooLarge {
                len: payload.len(),
                max: Self::MAX_PAYLOAD,
            })?;
        let line = side.of(&self.layout().posted);
        // Words, not bytes: every access to shared memory is atomic, and a
        // word at a time is as fast as a byte copy.
        for (word, chunk) in line.payload.iter().zip(payload.chunks(8)) {
            let mut bytes = [0u8; 8];
            if let Some(head) = bytes.get_mut(..chunk.len()) {
                head.copy_from_slice(chunk);
            }
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        line.len.store(len, Ordering::Relaxed);
        line.seq.store(seq, Ordering::Release);
        Ok(())
    }

    /// Copies the payload that the peer of `side` posted with its number
    /// into `out`, and returns its length (at most `out.len()`). Call it
    /// after [`wait`](Self::wait) has seen the number: the peer does not
    /// write its line again before this side posts.
    pub fn read_payload(&self, side: Side, out: &mut [u8]) -> usize {
        let line = side.peer().of(&self.layout().posted);
        // The peer's word: clamped, never trusted as a length.
        let len = usize::try_from(line.len.load(Ordering::Relaxed))
            .unwrap_or(usize::MAX)
            .min(Self::MAX_PAYLOAD)
            .min(out.len());
        let out = out.get_mut(..len).unwrap_or_default();
        for (chunk, word) in out.chunks_mut(8).zip(&line.payload) {
            let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
            if let Some(head) = bytes.get(..chunk.len()) {
                chunk.copy_from_slice(head);
            }
        }
        len
    }
}
