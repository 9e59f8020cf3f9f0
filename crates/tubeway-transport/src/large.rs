//! Memory for large messages.

use memmap2::{Advice, MmapMut};

/// Zeroed memory for a large message: from [`LargeBuffer::HUGE_MIN`] up, a
/// mapping of its own advised into huge pages; below that, from the
/// allocator.
///
/// A message that large cannot stay in the caches, so copying it in or out
/// walks memory page by page. With 4 KiB pages every page costs a TLB miss
/// (a dearer one in a virtual machine) and a fresh buffer a fault per page.
/// Large frames are read into these (see [`FramePool`](crate::FramePool)),
/// and the bench's bare limits use them, so that they are measured with the
/// memory the transport itself uses. A program that builds large payloads
/// can build them in one too and send it without a copy
/// (`Bytes::from_owner`). Where the system gives no huge pages (transparent
/// huge pages `never`, or a process launched with `PR_SET_THP_DISABLE`), the
/// mapping works with 4 KiB ones.
///
/// Measured (docs/performance/investigations.md, "Huge pages for large
/// frames"): 1 MiB TCP writes read into a 200 MiB buffer ran at 4.2-4.4 GB/s
/// into huge pages and 3.1-3.9 GB/s into 4 KiB ones; memcpy of 200 MiB at
/// 12.3-13.5 against 8.3-9.6 GB/s.
#[derive(Debug, Default)]
pub struct LargeBuffer {
    mem: Memory,
    /// Bytes lent out: the mapping may be longer.
    len: usize,
}

#[derive(Debug)]
enum Memory {
    Heap(Vec<u8>),
    Mapped(MmapMut),
}

/// The size of a huge page on x86-64 and the usual one on arm64. An
/// anonymous mapping whose length is a multiple of it starts on one, so all
/// of it can be huge pages.
const HUGE_PAGE: usize = 2 << 20;

impl LargeBuffer {
    /// Buffers from this size up are mapped on their own, in huge pages.
    pub const HUGE_MIN: usize = 4 << 20;

    /// `len` zeroed bytes, faulted in as they are written, in memory of
    /// [`size_for(len)`](Self::size_for) bytes (of `len` from the allocator
    /// if the system refuses a mapping).
    pub fn new(len: usize) -> LargeBuffer {
        let size = Self::size_for(len);
        let mem = (size >= Self::HUGE_MIN)
            .then(|| MmapMut::map_anon(size).ok())
            .flatten()
            .map_or_else(
                || Memory::Heap(vec![0; len]),
                |m| {
                    // Advice only: without huge pages the mapping works as it is.
                    let _ = m.advise(Advice::HugePage);
                    Memory::Mapped(m)
                },
            );
        LargeBuffer { mem, len }
    }

    /// `len` filled with `byte`, every page in place.
    pub fn filled(len: usize, byte: u8) -> LargeBuffer {
        let mut b = Self::new(len);
        b.fill(byte);
        b
    }

    /// The memory a buffer of `len` bytes holds: whole huge pages from
    /// [`HUGE_MIN`](Self::HUGE_MIN) up.
    pub fn size_for(len: usize) -> usize {
        if len < Self::HUGE_MIN {
            return len;
        }
        len.checked_next_multiple_of(HUGE_PAGE).unwrap_or(len)
    }

    /// The memory it holds.
    pub fn size(&self) -> usize {
        self.mem.all().len()
    }

    /// Whether it is a mapping of its own, advised into huge pages.
    pub fn is_mapped(&self) -> bool {
        matches!(self.mem, Memory::Mapped(_))
    }
}

impl Memory {
    /// All of it, past the bytes lent out too.
    fn all(&self) -> &[u8] {
        match self {
            Memory::Heap(v) => v,
            Memory::Mapped(m) => m,
        }
    }

    fn all_mut(&mut self) -> &mut [u8] {
        match self {
            Memory::Heap(v) => v,
            Memory::Mapped(m) => m,
        }
    }
}

impl Default for Memory {
    fn default() -> Self {
        Memory::Heap(Vec::new())
    }
}

impl std::ops::Deref for LargeBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.mem.all().get(..self.len).unwrap_or_default()
    }
}

impl std::ops::DerefMut for LargeBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.mem.all_mut().get_mut(..self.len).unwrap_or_default()
    }
}

impl AsRef<[u8]> for LargeBuffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_come_from_the_allocator_and_large_ones_in_huge_pages() {
        let small = LargeBuffer::new(LargeBuffer::HUGE_MIN - 1);
        assert!(!small.is_mapped());
        assert_eq!(small.len(), LargeBuffer::HUGE_MIN - 1);
        assert!(small.iter().all(|&b| b == 0));

        let len = LargeBuffer::HUGE_MIN + 1;
        let mut large = LargeBuffer::new(len);
        assert!(large.is_mapped());
        assert_eq!(large.len(), len, "no more than asked for");
        assert_eq!(
            large.size(),
            LargeBuffer::HUGE_MIN + HUGE_PAGE,
            "whole huge pages"
        );
        assert_eq!(LargeBuffer::size_for(len), large.size());
        assert!(large.iter().all(|&b| b == 0), "zeroed");
        large.fill(7);
        assert!(large.iter().all(|&b| b == 7));
        if huge_pages_on_advice() {
            assert_eq!(
                thp_eligible(large.as_ptr() as usize),
                Some(true),
                "advised into huge pages"
            );
        }
        // A payload built in one is sent without a copy.
        let payload = bytes::Bytes::from_owner(LargeBuffer::filled(10, 3));
        assert_eq!(payload.as_ref(), &[3; 10]);
    }

    /// Whether this system gives huge pages to memory advised into them.
    fn huge_pages_on_advice() -> bool {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
    }

    /// `THPeligible` of the mapping holding `addr`, from `/proc/self/smaps`.
    fn thp_eligible(addr: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            // A mapping's first line starts with its range; its fields do not.
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((Ok(lo), Ok(hi))) =
                range.map(|(lo, hi)| (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
            if let Some(v) = line.strip_prefix("THPeligible:").filter(|_| inside) {
                return Some(v.trim() == "1");
            }
        }
        None
    }
}
