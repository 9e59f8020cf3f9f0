//! One ring as an end sees it: its header and raw access to its data area.
//!
//! Every access to a data area goes through here, each checked against the
//! capacity (a failed check is a bug of this crate, never the peer's doing:
//! positions are computed from our own index and validated lengths).

use std::sync::Arc;

use crate::layout::{RingHeader, CACHE_LINE};
use crate::record;
use crate::region::{Region, RingPlace, Side};
#[cfg(loom)]
use crate::sync::AtomicU64;
use crate::sync::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::AtomicU64;

/// A ring of a region, kept alive by its `Arc<Region>`.
#[derive(Debug)]
pub(crate) struct Ring {
    region: Arc<Region>,
    place: RingPlace,
    /// The side whose end this is.
    side: Side,
}

impl Ring {
    pub(crate) fn new(region: Arc<Region>, place: RingPlace, side: Side) -> Ring {
        Ring {
            region,
            place,
            side,
        }
    }

    /// The ring's header.
    pub(crate) fn header(&self) -> &RingHeader {
        // `self.region` keeps the mapping alive.
        self.place.header()
    }

    /// Bytes of data area.
    pub(crate) fn capacity(&self) -> u64 {
        self.place.capacity
    }

    /// The region.
    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The side whose end this is.
    pub(crate) fn side(&self) -> Side {
        self.side
    }

    /// Whether the peer of this end's side was declared dead.
    pub(crate) fn peer_dead(&self) -> bool {
        self.region.peer_dead(self.side)
    }

    /// A pointer to `len` bytes at `pos` of the data area.
    fn at(&self, pos: u64, len: u64) -> *mut u8 {
        assert!(
            pos.checked_add(len)
                .is_some_and(|end| end <= self.place.capacity),
            "data access out of bounds: {pos}+{len} > {}",
            self.place.capacity
        );
        // SAFETY: pos + len <= capacity (asserted), and the data area has
        // capacity bytes inside the mapping, so the result is inside it.
        unsafe { self.place.data.as_ptr().add(pos as usize) }
    }

    /// Reads the word at `pos` (a multiple of 8) exactly once, with
    /// `Acquire`: a record header, which publishes the record's payload.
    pub(crate) fn load_record_header(&self, pos: u64) -> u64 {
        self.word(pos).load(Ordering::Acquire)
    }

    /// Writes the word at `pos` (a multiple of 8) without publishing it: a
    /// header that a later [`publish_record_header`](Ring::publish_record_header)
    /// publishes, or the zero word after the last record.
    pub(crate) fn store_record_header(&self, pos: u64, word: u64) {
        self.word(pos).store(word, Ordering::Relaxed);
    }

    /// Writes the header at `pos` with `Release`, publishing the record's
    /// payload and everything stored before it.
    pub(crate) fn publish_record_header(&self, pos: u64, word: u64) {
        self.word(pos).store(word, Ordering::Release);
    }

    /// The word at `pos` of the data area, as an atomic, so that a
    /// concurrent write by the peer yields some value to validate rather
    /// than a torn or re-read one.
    #[cfg(not(loom))]
    fn word(&self, pos: u64) -> &AtomicU64 {
        let ptr = self.at(pos, record::HEADER).cast::<u64>();
        assert!(ptr.is_aligned(), "record header misaligned at {pos}");
        // SAFETY: aligned and inside the mapping (checked above), which
        // lives as long as `self.region`; the words of a data area are only
        // ever accessed by whole-word atomic operations or, as payload,
        // after a header's Release/Acquire orders them.
        unsafe { AtomicU64::from_ptr(ptr) }
    }

    /// Loom does not model plain memory: the words of the data area are
    /// modelled by atomics of the region's own, one per word.
    #[cfg(loom)]
    fn word(&self, pos: u64) -> &AtomicU64 {
        assert!(
            pos.is_multiple_of(record::HEADER),
            "record header misaligned at {pos}"
        );
        self.region.loom_word(&self.place, pos)
    }

    /// Copies `len` bytes of the concatenated `parts`, from byte `skip` on,
    /// to `pos` of the data area; the first `last` of them (at most a
    /// cache line's worth, [`CACHE_LINE`]) after all the others.
    ///
    /// The caller owns `[pos, pos + len)`: free space of the ring it
    /// produces into.
    pub(crate) fn write_payload(
        &self,
        pos: u64,
        parts: &[&[u8]],
        skip: usize,
        len: usize,
        last: usize,
    ) {
        let dst = self.at(pos, len as u64);
        // Gathered here in the one pass over the parts, stored at the end.
        let mut staged = [0u8; CACHE_LINE];
        let last = last.min(len).min(CACHE_LINE);
        let mut at = 0;
        for chunk in crate::parts::chunks(parts, skip, len) {
            let (early, rest) = chunk.split_at(last.saturating_sub(at).min(chunk.len()));
            if let Some(stage) = staged.get_mut(at..at + early.len()) {
                stage.copy_from_slice(early);
            }
            at += early.len();
            // SAFETY: the chunks add up to at most `len` bytes, so every
            // copy stays inside the `len` bytes checked by `at`; that space
            // is free, so no reader looks at it; a slice of the caller's
            // never overlaps the mapping's free space (the caller cannot
            // hold a reference into space it does not own).
            unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), dst.add(at), rest.len()) };
            at += rest.len();
        }
        // SAFETY: `last` <= `len`, inside the space checked above; the
        // staging array is the caller's stack, which never overlaps it.
        unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst, last) };
    }

    /// Hands the cache lines holding `[pos, pos + len)` from this core's
    /// caches to the cache all cores share, so the peer's reads of a record
    /// just published find them there instead of fetching each from this
    /// core. A hint only: nothing is written, and a CPU without `cldemote`
    /// runs it as a no-op.
    pub(crate) fn demote(&self, pos: u64, len: u64) {
        let line = CACHE_LINE as u64;
        let first = pos - pos % line;
        // Data areas are page-aligned and a multiple of a line long, so the
        // lines start at line offsets and end inside the area.
        let lines = (pos - first + len).div_ceil(line);
        let start = self.at(first, lines * line);
        for k in 0..lines as usize {
            // SAFETY: inside the `lines` lines checked by `at`.
            demote_line(unsafe { start.add(k * CACHE_LINE) });
        }
    }

    /// Asks for the cache line at `pos` (a line's start) in this core's
    /// cache, writable, ahead of the stores that will need it. A hint only:
    /// nothing is read or written. Only where [`claims_lines`] says the CPU
    /// can.
    pub(crate) fn claim_line(&self, pos: u64) {
        claim_line(self.at(pos, CACHE_LINE as u64));
    }

    /// The `len` payload bytes at `pos`, borrowed in place.
    ///
    /// The caller owns `[pos, pos + len)`: a published, unreleased record of
    /// the ring it consumes.
    pub(crate) fn payload(&self, pos: u64, len: u64) -> &[u8] {
        let ptr = self.at(pos, len);
        // SAFETY: inside the mapping (checked by `at`), which lives as long
        // as `self.region`, so as long as the borrow of `self`. The bytes
        // were published by the producer before the header we acquired, and
        // it will not write them until we release them: that is the
        // protocol a correct peer keeps. A peer that breaks it changes bytes
        // under this slice; see "Assumptions" in docs/shared-memory.md.
        unsafe { std::slice::from_raw_parts(ptr, len as usize) }
    }
}

/// A cache hint on the line at `p`, `$insn` on x86-64 and nothing
/// elsewhere, nor under the model checker: one audited `asm!` for each hint.
macro_rules! cache_hint {
    ($(#[$doc:meta])* $name:ident, $insn:literal) => {
        $(#[$doc])*
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        fn $name(p: *const u8) {
            // SAFETY: a cache hint: it reads and writes no memory (a bad
            // address does not even fault) and touches no register but its
            // operand. One whose encoding is not a no-op on older CPUs is
            // run only where the CPU reports it (see its documentation).
            unsafe {
                std::arch::asm!(
                    concat!($insn, " [{0}]"),
                    in(reg) p,
                    options(nostack, preserves_flags, readonly)
                )
            };
        }

        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        fn $name(_: *const u8) {}
    };
}

cache_hint!(
    /// `cldemote` of the line at `p`: encoded among the hint no-ops, so
    /// older x86-64 CPUs skip it.
    demote_line,
    "cldemote"
);

cache_hint!(
    /// `prefetchw` of the line at `p`: the line comes to this core
    /// exclusive, the other cores' copies invalidated, so later stores into
    /// it need not wait for that. Only where [`claims_lines`] found the
    /// instruction.
    claim_line,
    "prefetchw"
);

/// Whether this CPU has `prefetchw` (CPUID leaf 0x8000_0001, ECX bit 8),
/// asked once per process: under a hypervisor `cpuid` traps. Without it
/// the instruction's encoding is not a documented no-op, so it is not run.
#[cfg(all(target_arch = "x86_64", not(loom)))]
pub(crate) fn claims_lines() -> bool {
    static HAS_PREFETCHW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS_PREFETCHW.get_or_init(|| {
        // An `unsafe fn` in older Rust (the MSRV's), a safe one in newer.
        #[allow(unused_unsafe)]
        // SAFETY: `cpuid` exists on every x86-64 CPU, and leaf 0x8000_0001
        // with it (long mode is reported there).
        let leaf = unsafe { std::arch::x86_64::__cpuid(0x8000_0001) };
        leaf.ecx & (1 << 8) != 0
    })
}

#[cfg(not(all(target_arch = "x86_64", not(loom))))]
pub(crate) fn claims_lines() -> bool {
    false
}
