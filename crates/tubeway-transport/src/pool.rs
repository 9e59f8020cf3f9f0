//! Buffers for large frames, used again once the message read into one is
//! dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
// Tokio's clock, which its tests can stop.
use tokio::time::Instant;

use crate::LargeBuffer;

/// Buffers for large frames, used again once the message read into one is
/// dropped.
///
/// A received payload is lent out without a copy, so the memory of each
/// large frame lives as long as its message does. Fresh memory for every
/// frame costs the allocator a `mmap` and `munmap` and the kernel a page
/// fault and a zeroed page per 4 KiB, more than reading the bytes costs:
/// without a pool, 50 MB echoes through a broker ran at a quarter to a third
/// of the speed they run at with one.
/// A pool keeps the buffers of dropped messages for the next frames:
///
/// - at most `max_held` bytes of them, and at most 256 buffers, the oldest
///   given up first;
/// - each for at most [`idle`](FramePool::release_after) unused (5 s by
///   default), after which it goes back to the system: a task looks while
///   the pool holds anything, and never otherwise, on the runtime of the
///   thread that gave the pool its first buffer (or else the one the pool
///   was made in; with neither, idle buffers go at the next frame);
/// - a frame takes a kept buffer only if it is at most twice the size of
///   the frame's own, so that a small message never pins a large buffer.
///
/// Buffers of frames from about 4 MiB up are [`LargeBuffer`]s, in huge
/// pages.
///
/// Cheap to clone: the clones share their buffers, so one pool can serve
/// every connection of a process (as a broker's does).
#[derive(Debug, Clone)]
pub struct FramePool {
    inner: Arc<Mutex<PoolInner>>,
    min_frame: usize,
}

#[derive(Debug)]
struct PoolInner {
    /// Kept buffers, oldest first; each is initialised memory, its length
    /// its size.
    free: VecDeque<Kept>,
    /// Bytes in `free`.
    held: usize,
    max_held: usize,
    idle: Duration,
    /// The runtime the pool was made in, for the task that gives idle
    /// buffers back when a buffer comes back outside any runtime.
    runtime: Option<Handle>,
    /// That task, while the pool holds buffers. It may have ended with its
    /// runtime (a thread's own, say).
    trimmer: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Kept {
    buf: FrameBuf,
    since: Instant,
}

/// Free buffers kept at most, whatever their size: a frame looks through
/// all of them for the best fit.
const MAX_KEPT: usize = 256;

/// Frames start this far into a page of their buffer. The ring of a
/// shared-memory connection is page-aligned and its records start 8 bytes
/// into a page when the ring starts afresh, so a frame that started near the
/// beginning of a page would be copied into and out of the ring between two
/// addresses a few bytes apart within their pages, which the CPU takes for
/// a dependence (4K aliasing): 500 KB echoes ran at a third of the speed
/// (docs/performance/investigations.md, "Buffers of large messages").
const PAGE_OFFSET: usize = 2048;
const PAGE: usize = 4096;

/// A pooled buffer: initialised memory whose frames start
/// [`PAGE_OFFSET`] into a page, wherever the allocator put it.
#[derive(Debug, Default)]
pub(crate) struct FrameBuf {
    buf: LargeBuffer,
}

impl FrameBuf {
    fn new(len: usize) -> FrameBuf {
        FrameBuf {
            buf: LargeBuffer::new(len.saturating_add(PAGE)),
        }
    }

    /// The size of a new buffer for a frame of `len` bytes, with room for
    /// the frame's offset into its first page.
    fn size_for(len: usize) -> usize {
        LargeBuffer::size_for(len.saturating_add(PAGE))
    }

    /// Where frames start.
    fn start(&self) -> usize {
        let in_page = self.buf.as_ptr() as usize % PAGE;
        (PAGE + PAGE_OFFSET - in_page) % PAGE
    }

    /// The longest frame it takes.
    fn room(&self) -> usize {
        self.buf.len().saturating_sub(self.start())
    }

    /// Memory it holds.
    fn size(&self) -> usize {
        self.buf.size()
    }

    /// The first `len` bytes of the frame (none if it has no room for `len`).
    pub(crate) fn frame(&self, len: usize) -> &[u8] {
        let start = self.start();
        self.buf
            .get(start..start.saturating_add(len))
            .unwrap_or_default()
    }

    /// [`frame`](Self::frame), to write.
    pub(crate) fn frame_mut(&mut self, len: usize) -> &mut [u8] {
        let start = self.start();
        (self.buf.get_mut(start..start.saturating_add(len))).unwrap_or_default()
    }
}

impl FramePool {
    /// Frames from this size up go into pooled buffers, unless said
    /// otherwise: those longer than a reader's read chunk, which need memory
    /// of their own anyway.
    pub const DEFAULT_MIN_FRAME: usize = 64 << 10;
    /// Bytes of free buffers kept at most, unless said otherwise.
    pub const DEFAULT_MAX_HELD: usize = 256 << 20;
    /// How long a free buffer is kept unused, unless said otherwise.
    pub const DEFAULT_IDLE: Duration = Duration::from_secs(5);

    /// Recycles buffers of frames of at least `min_frame` bytes, keeping at
    /// most `max_held` bytes of free buffers, each for at most
    /// [`FramePool::DEFAULT_IDLE`] unused.
    pub fn new(min_frame: usize, max_held: usize) -> FramePool {
        FramePool {
            inner: Arc::new(Mutex::new(PoolInner {
                free: VecDeque::new(),
                held: 0,
                max_held,
                idle: Self::DEFAULT_IDLE,
                runtime: Handle::try_current().ok(),
                trimmer: None,
            })),
            min_frame: min_frame.max(1),
        }
    }

    /// Gives a free buffer back to the system once it has been unused for
    /// `idle`.
    pub fn release_after(self, idle: Duration) -> FramePool {
        self.lock().idle = idle;
        self
    }

    /// The smallest frame read into a pooled buffer.
    pub fn min_frame(&self) -> usize {
        self.min_frame
    }

    /// Bytes of free buffers kept.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> MutexGuard<'_, PoolInner> {
        lock(&self.inner)
    }

    /// A buffer with room for a frame of `len` bytes: the smallest kept one
    /// that fits, if it is at most twice the size of a new one, else a new
    /// one.
    pub(crate) fn take(&self, len: usize) -> FrameBuf {
        let (found, expired) = {
            let mut inner = self.lock();
            let expired = inner.expire(Instant::now());
            let best = (inner.free.iter().enumerate())
                .filter(|(_, k)| k.buf.room() >= len && k.buf.size() / 2 <= FrameBuf::size_for(len))
                .min_by_key(|(_, k)| k.buf.size())
                .map(|(i, _)| i);
            let found = best.and_then(|i| inner.free.remove(i));
            if let Some(k) = &found {
                inner.held -= k.buf.size();
            }
            (found, expired)
        };
        // Memory goes back to the system outside the lock: a `munmap` of a
        // large buffer takes a while.
        drop(expired);
        match found {
            Some(k) => k.buf,
            None => FrameBuf::new(len),
        }
    }

    /// The frame of `len` bytes in `buf` as shared bytes, whose buffer
    /// comes back to the pool once the last reference is dropped.
    pub(crate) fn share(&self, buf: FrameBuf, len: usize) -> Bytes {
        Bytes::from_owner(Lent {
            len,
            buf,
            pool: Arc::downgrade(&self.inner),
        })
    }
}

fn lock(inner: &Mutex<PoolInner>) -> MutexGuard<'_, PoolInner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PoolInner {
    /// Takes out the buffers unused for `idle` as of `now`.
    fn expire(&mut self, now: Instant) -> Vec<Kept> {
        let mut expired = Vec::new();
        while let Some(k) = self.free.front() {
            if now.saturating_duration_since(k.since) < self.idle {
                break;
            }
            if let Some(k) = self.free.pop_front() {
                self.held -= k.buf.size();
                expired.push(k);
            }
        }
        expired
    }

    /// Keeps `buf`, giving up the oldest buffers to stay within the bound,
    /// and makes sure a task will give it back once idle; returns what is
    /// given up.
    fn keep(&mut self, buf: FrameBuf, pool: &Arc<Mutex<PoolInner>>) -> Vec<Kept> {
        let now = Instant::now();
        let mut given_up = self.expire(now);
        if buf.size() > self.max_held {
            given_up.push(Kept { buf, since: now });
            return given_up;
        }
        self.held += buf.size();
        self.free.push_back(Kept { buf, since: now });
        while self.held > self.max_held || self.free.len() > MAX_KEPT {
            let Some(k) = self.free.pop_front() else {
                break;
            };
            self.held -= k.buf.size();
            given_up.push(k);
        }
        if self.trimmer.as_ref().is_none_or(JoinHandle::is_finished) {
            // Spawning does not run the task: it takes the lock later.
            let runtime = Handle::try_current().ok().or_else(|| self.runtime.clone());
            self.trimmer = runtime.map(|r| r.spawn(trim(Arc::downgrade(pool))));
        }
        given_up
    }
}

/// Gives idle buffers back to the system while the pool holds any; ends
/// when it holds none, or is gone.
async fn trim(pool: Weak<Mutex<PoolInner>>) {
    loop {
        let next = {
            let Some(pool) = pool.upgrade() else {
                return;
            };
            let (expired, next) = {
                let mut inner = lock(&pool);
                let expired = inner.expire(Instant::now());
                let next = inner.free.front().map(|k| k.since + inner.idle);
                if next.is_none() {
                    inner.trimmer = None;
                }
                (expired, next)
            };
            drop(expired);
            match next {
                Some(at) => at,
                None => return,
            }
        };
        tokio::time::sleep_until(next).await;
    }
}

/// A pooled frame's memory while a message uses it.
struct Lent {
    buf: FrameBuf,
    len: usize,
    pool: Weak<Mutex<PoolInner>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf.frame(self.len)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let buf = std::mem::take(&mut self.buf);
        let given_up = lock(&pool).keep(buf, &pool);
        drop(given_up);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame's buffer from `pool`, filled with `fill`, lent out as bytes.
    fn lent(pool: &FramePool, len: usize, fill: u8) -> Bytes {
        let mut buf = pool.take(len);
        buf.frame_mut(len).fill(fill);
        pool.share(buf, len)
    }

    /// The memory a new buffer for a frame of `len` bytes holds.
    fn size(len: usize) -> usize {
        FrameBuf::size_for(len)
    }

    #[test]
    fn a_dropped_frame_lends_its_memory_to_the_next() {
        let pool = FramePool::new(1000, 1 << 20);
        let first = lent(&pool, 100_000, 1);
        assert_eq!(first.len(), 100_000);
        let at = first.as_ptr();
        assert_eq!(pool.held(), 0);
        drop(first);
        assert_eq!(pool.held(), size(100_000));
        let second = lent(&pool, 80_000, 2);
        assert_eq!((second.as_ptr(), second.len()), (at, 80_000), "used again");
        assert!(second.iter().all(|&b| b == 2));
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn frames_start_half_a_page_in() {
        let pool = FramePool::new(1000, 1 << 20);
        for len in [1000, 4095, 4096, 100_001, 300_000] {
            let frame = lent(&pool, len, 1);
            assert_eq!(frame.len(), len);
            assert_eq!(frame.as_ptr() as usize % PAGE, PAGE_OFFSET);
        }
    }

    #[test]
    fn a_large_frame_is_read_into_a_mapping_of_its_own_and_kept() {
        let pool = FramePool::new(1000, 64 << 20);
        let len = LargeBuffer::HUGE_MIN;
        let frame = lent(&pool, len, 7);
        assert!(frame.iter().all(|&b| b == 7));
        assert_eq!(frame.as_ptr() as usize % PAGE, PAGE_OFFSET);
        let at = frame.as_ptr();
        drop(frame);
        assert_eq!(pool.held(), LargeBuffer::size_for(len + PAGE));
        let again = pool.take(len);
        assert!(again.buf.is_mapped());
        assert_eq!(again.frame(len).as_ptr(), at, "kept and used again");
    }

    #[test]
    fn a_small_frame_does_not_pin_a_large_buffer() {
        let pool = FramePool::new(1000, 1 << 20);
        drop(lent(&pool, 300_000, 1));
        let small = lent(&pool, 100_000, 2);
        assert_eq!(
            pool.held(),
            size(300_000),
            "more than twice its size: left alone"
        );
        drop(small);
        assert_eq!(pool.held(), size(300_000) + size(100_000));
        let half = lent(&pool, 160_000, 3);
        assert_eq!(pool.held(), size(100_000), "at most twice: taken");
        drop(half);
    }

    #[test]
    fn the_bound_gives_up_the_oldest_buffers_first() {
        let pool = FramePool::new(1000, 250_000);
        let (a, b, c) = (
            lent(&pool, 100_000, 1),
            lent(&pool, 110_000, 2),
            lent(&pool, 120_000, 3),
        );
        let (a_at, c_at) = (a.as_ptr(), c.as_ptr());
        drop(a);
        drop(b);
        assert_eq!(pool.held(), size(100_000) + size(110_000));
        drop(c);
        assert_eq!(
            pool.held(),
            size(110_000) + size(120_000),
            "the oldest, a's, went"
        );
        let again = lent(&pool, 100_000, 4);
        assert_ne!(again.as_ptr(), a_at);
        drop(again);
        drop(lent(&pool, 300_000, 5));
        assert!(pool.held() <= 250_000, "larger than the bound: not kept");
        let c_again = lent(&pool, 120_000, 6);
        assert_eq!(c_again.as_ptr(), c_at);
    }

    #[test]
    fn at_most_so_many_buffers_are_kept() {
        let pool = FramePool::new(1000, 1 << 30);
        let frames: Vec<_> = (0..MAX_KEPT + 10)
            .map(|i| lent(&pool, 1000, i as u8))
            .collect();
        let first_kept = frames.get(10).map(|b| b.as_ptr());
        drop(frames);
        assert_eq!(pool.held(), MAX_KEPT * size(1000), "the 10 oldest went");
        let taken: Vec<_> = (0..MAX_KEPT).map(|_| lent(&pool, 1000, 0)).collect();
        assert_eq!(pool.held(), 0);
        assert!(taken.iter().any(|b| Some(b.as_ptr()) == first_kept));
    }

    #[test]
    fn outside_a_runtime_idle_buffers_go_at_the_next_take() {
        let pool = FramePool::new(1000, 1 << 20).release_after(Duration::ZERO);
        drop(lent(&pool, 100_000, 1));
        assert_eq!(
            pool.held(),
            size(100_000),
            "nothing looks until the next take"
        );
        drop(lent(&pool, 200_000, 2));
        assert_eq!(
            pool.held(),
            size(200_000),
            "the take gave the idle one back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_buffers_go_back_to_the_system() {
        let pool = FramePool::new(1000, 1 << 20).release_after(Duration::from_secs(5));
        drop(lent(&pool, 100_000, 1));
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(lent(&pool, 100_000, 2));
        drop(lent(&pool, 200_000, 3));
        let both = size(100_000) + size(200_000);
        assert_eq!(pool.held(), both);
        tokio::time::sleep(Duration::from_millis(4_990)).await;
        assert_eq!(pool.held(), both, "used 3 s ago, and 5 s is not up");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(pool.held(), 0, "5 s unused: all given back");
        assert!(
            lock(&pool.inner).trimmer.is_none(),
            "the task ended with nothing to look at"
        );
        drop(lent(&pool, 100_000, 4));
        assert!(
            lock(&pool.inner).trimmer.is_some(),
            "and starts again with the next"
        );
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(pool.held(), 0);
    }
}
