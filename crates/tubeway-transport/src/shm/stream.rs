//! The two halves of a shared-memory connection, as a byte stream.
//!
//! Each direction is a ring in the shared region. The writer copies what
//! it is given into the ring as one record per write; the reader copies
//! records out into its buffer, a record at a time or part of one. Neither
//! makes a system call while the other keeps up; sleeping and waking go
//! through the doorbell (see `bell.rs`).

use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tubeway_ring::{
    Consumer, Doorbell, Producer, Region, Side, TryReadError, WaitStrategy, WriteSomeError,
};

use super::bell::{Bell, Readable, Waiter};

/// Polls of an empty ring between two looks at the socket for a hang-up,
/// for readers that spin and never sleep on it.
const HANG_UP_CHECK_EVERY: u32 = 4096;
/// Slices handed to one record; the rest waits for the next write.
const MAX_PARTS: usize = 16;
/// The longest a writer that found the ring full spins for room before it
/// sleeps on the doorbell, and how long it spins unless told otherwise
/// ([`ShmWriter::set_wait_strategy`]). A reader that keeps up frees the
/// room the writer waits for in about 13 µs (at most 128 KiB at 10 GB/s,
/// [`Producer::fragment_room`]); sleeping instead costs a wake-up
/// (5-50 µs here) and the reader a doorbell ring, every time, which held
/// 200 MB messages at 0.29-0.63x of memcpy against 0.62-0.77x with this spin
/// (docs/performance/investigations.md, "Large messages over shm: spinning
/// for the rest of a frame"). A reader that does not keep up costs the
/// writer this much CPU per wait; the spin holds the writer's thread, so it
/// is not longer.
const ROOM_SPIN: Duration = tubeway_ring::DEFAULT_SPIN;

/// Waits for room that sleep at once after a spin for room found none. A
/// reader that drains the ring more slowly than the spin lasts (a consumer
/// taking in 1 GB/s frees 128 KiB in 0.13 ms) would otherwise cost the
/// writer a whole spin at every refill: with one subscriber taking about
/// 0.9 GB/s, the broker's CPU went from a median of 34 % to 56 % with the
/// spin, and back to 38-40 % with this (docs/performance/investigations.md,
/// "Large messages over shm: spinning for the rest of a frame"). So the
/// writer sleeps at once for the next this many waits, then tries a spin
/// again.
const SKIP_AFTER_EMPTY_SPIN: u32 = 15;

/// Builds both halves of one side of a connection.
pub(crate) fn halves(
    sock: tokio::net::UnixStream,
    region: Arc<Region>,
    side: Side,
) -> io::Result<(ShmReader, ShmWriter)> {
    let bell = Bell::new(&sock, region.clone(), side)?;
    let waiter = Waiter {
        sock: Arc::new(sock),
        bell: bell.clone(),
    };
    let (mut tx, mut rx) = region.ends(side).map_err(io::Error::other)?;
    let b = bell.clone();
    tx.set_doorbell(Some(Doorbell::new(move || b.ring())));
    let b = bell.clone();
    rx.set_doorbell(Some(Doorbell::new(move || b.ring())));
    let reader = ShmReader {
        rx,
        offset: 0,
        waiter: waiter.clone(),
        readable: None,
        announced: false,
        idle_polls: 0,
        unreleased: false,
    };
    let writer = ShmWriter {
        inner: Mutex::new(WriterInner {
            tx,
            readable: None,
            announced: false,
            room_spin: ROOM_SPIN,
            skip_spins: 0,
        }),
        waiter,
    };
    Ok((reader, writer))
}

/// Registers the halves' socket with the current runtime's reactor.
pub(crate) fn reregister(mut r: ShmReader, w: ShmWriter) -> io::Result<(ShmReader, ShmWriter)> {
    let ShmWriter { inner, waiter } = w;
    let mut inner = inner.into_inner().unwrap_or_else(PoisonError::into_inner);
    // Pending waits hold the socket too.
    inner.readable = None;
    r.readable = None;
    drop(waiter);
    let Waiter { sock, bell } = r.waiter;
    let sock = Arc::try_unwrap(sock)
        .map_err(|_| io::Error::other("the doorbell socket is shared beyond its two halves"))?;
    let sock = Arc::new(tokio::net::UnixStream::from_std(sock.into_std()?)?);
    let waiter = Waiter { sock, bell };
    r.waiter = waiter.clone();
    Ok((
        r,
        ShmWriter {
            inner: Mutex::new(inner),
            waiter,
        },
    ))
}

/// Counts a poll of a reader that found nothing, now and then looking
/// whether the peer is gone: `WouldBlock`.
fn found_nothing(idle_polls: &mut u32, waiter: &Waiter) -> io::Error {
    *idle_polls = idle_polls.wrapping_add(1);
    if (*idle_polls).is_multiple_of(HANG_UP_CHECK_EVERY) {
        // Marks the rings closed if the peer is gone; the next read sees it.
        waiter.drain();
    }
    io::ErrorKind::WouldBlock.into()
}

fn corrupt(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The reading half.
pub(crate) struct ShmReader {
    rx: Consumer,
    /// Bytes of the head record already handed out; it stays in the ring
    /// (unreleased) until all of it has been.
    offset: usize,
    waiter: Waiter,
    readable: Option<Readable>,
    /// Announced as sleeping on the doorbell; withdrawn before the next
    /// read, so a reader that spins again does not make the peer ring.
    announced: bool,
    idle_polls: u32,
    /// The head record was decoded in place and is released by the next
    /// read or wait, off the path of the message it held.
    unreleased: bool,
}

impl std::fmt::Debug for ShmReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmReader")
            .field("offset", &self.offset)
            .field("announced", &self.announced)
            .finish_non_exhaustive()
    }
}

impl ShmReader {
    /// Copies what the ring holds into `buf`'s spare capacity; `WouldBlock`
    /// when it holds nothing, `Ok(0)` once the peer closed or died and
    /// everything it wrote has been read.
    pub(crate) fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let room = buf.capacity() - buf.len();
        self.try_read_into(buf, room)
    }

    /// Hands the next record to `f` in place, and releases it if `f` makes
    /// something of it (a whole frame, say): no copy into a buffer first.
    /// `Ok(None)` when `f` does not, or when part of the record has been
    /// read: read on with [`try_read_buf`](Self::try_read_buf), which finds
    /// the record still there. `WouldBlock` when the ring holds nothing.
    ///
    /// The record is released by the next read or wait: its release (a
    /// store, a fence and a look at whether the writer sleeps for room)
    /// then comes after the message it held has been handled, not before.
    pub(crate) fn try_read_whole<T>(
        &mut self,
        f: impl FnOnce(&[u8]) -> Option<T>,
    ) -> io::Result<Option<T>> {
        self.release_read();
        if self.offset != 0 {
            return Ok(None);
        }
        if self.announced {
            self.rx.withdraw_wait();
            self.announced = false;
        }
        let made = match self.rx.try_read() {
            Ok(Some(record)) => {
                let made = f(record.bytes());
                // Left in the ring: released by the next call if made,
                // read again by the copying read that follows if not.
                std::mem::forget(record);
                self.unreleased = made.is_some();
                made
            }
            Ok(None) => return Err(found_nothing(&mut self.idle_polls, &self.waiter)),
            Err(TryReadError::Closed) => return Ok(None),
            Err(e) => return Err(corrupt(e)),
        };
        if made.is_some() {
            self.idle_polls = 0;
        }
        Ok(made)
    }

    /// Releases the record [`try_read_whole`](Self::try_read_whole) left
    /// in the ring, if it left one. Every read and every wait starts so.
    fn release_read(&mut self) {
        if std::mem::take(&mut self.unreleased) {
            // The same record again (only this reader moves the head), now
            // dropped, which releases it and rings the writer if it sleeps
            // for room. An error is the next read's to report.
            if let Ok(Some(record)) = self.rx.try_read() {
                drop(record);
            }
        }
    }

    /// Copies what the ring holds into `buf`, at most `limit` bytes;
    /// otherwise as [`ShmReader::try_read_buf`].
    pub(crate) fn try_read_into(
        &mut self,
        buf: &mut impl BufMut,
        limit: usize,
    ) -> io::Result<usize> {
        self.release_read();
        if self.announced {
            self.rx.withdraw_wait();
            self.announced = false;
        }
        let mut total = 0;
        loop {
            let spare = limit - total;
            if spare == 0 {
                break;
            }
            match self.rx.try_read() {
                Ok(Some(record)) => {
                    let bytes = record.bytes();
                    let rest = bytes.get(self.offset..).unwrap_or_default();
                    let n = rest.len().min(spare);
                    buf.put_slice(rest.get(..n).unwrap_or_default());
                    total += n;
                    if n == rest.len() {
                        self.offset = 0;
                        // Dropping releases it (ringing the writer if it sleeps).
                        drop(record);
                    } else {
                        self.offset += n;
                        // Kept for the next read: the writer must not reuse it yet.
                        std::mem::forget(record);
                        break;
                    }
                }
                Ok(None) => break,
                Err(TryReadError::Closed) if total == 0 => return Ok(0),
                Err(TryReadError::Closed) => break,
                Err(e) => return Err(corrupt(e)),
            }
        }
        if total > 0 {
            self.idle_polls = 0;
            return Ok(total);
        }
        Err(found_nothing(&mut self.idle_polls, &self.waiter))
    }

    /// Withdraws the announcement that this reader sleeps, if it made one.
    pub(crate) fn withdraw_wait(&mut self) -> bool {
        if !self.announced {
            return false;
        }
        self.rx.withdraw_wait();
        self.announced = false;
        true
    }

    /// Announces again that this reader sleeps, the task it last registered
    /// on the doorbell to be woken; false, announcing nothing, when that
    /// task is not registered, the ring holds something, or the peer hung up.
    pub(crate) fn resume_wait(&mut self) -> bool {
        self.release_read();
        if self.readable.is_none() || self.waiter.bell.hung_up() {
            return false;
        }
        if !self.rx.announce_doorbell_wait() {
            return false;
        }
        self.announced = true;
        true
    }

    /// Sleeps on the doorbell until the ring may have something.
    pub(crate) fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.release_read();
        loop {
            // Registered first, so a ring after the announcement is never missed.
            if self.waiter.poll_readable(&mut self.readable, cx).is_ready() {
                self.waiter.drain();
                if self.announced {
                    self.rx.withdraw_wait();
                    self.announced = false;
                    return Poll::Ready(Ok(()));
                }
                if self.waiter.bell.hung_up() {
                    // A hung-up socket stays readable: the ring, now marked
                    // closed, tells the rest.
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if self.waiter.bell.hung_up() || !self.rx.announce_doorbell_wait() {
                return Poll::Ready(Ok(()));
            }
            self.announced = true;
            return Poll::Pending;
        }
    }
}

/// The writing half; `&self` everywhere, as the frame writer shares it.
pub(crate) struct ShmWriter {
    inner: Mutex<WriterInner>,
    waiter: Waiter,
}

struct WriterInner {
    tx: Producer,
    readable: Option<Readable>,
    announced: bool,
    /// How long a wait for room spins before it sleeps.
    room_spin: Duration,
    /// Waits for room left that sleep at once, after a spin that found none.
    skip_spins: u32,
}

impl WriterInner {
    /// Spins for `need` bytes of room, unless one of the last few spins
    /// found none; whether there is room.
    fn spin_for_room(&mut self, need: usize) -> bool {
        if self.skip_spins > 0 {
            self.skip_spins -= 1;
            return false;
        }
        let found = self.tx.spin_for_room(need, self.room_spin);
        if !found {
            self.skip_spins = SKIP_AFTER_EMPTY_SPIN;
        }
        found
    }
}

impl std::fmt::Debug for ShmWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmWriter").finish_non_exhaustive()
    }
}

impl ShmWriter {
    fn lock(&self) -> MutexGuard<'_, WriterInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what fits now, in records of at most
    /// [`tubeway_ring::STREAM_RECORD_MAX`]; `WouldBlock` when nothing does.
    pub(crate) fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut w = self.lock();
        if w.announced {
            w.tx.withdraw_wait();
            w.announced = false;
        }
        let mut parts: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        let mut k = 0;
        for (slot, b) in parts.iter_mut().zip(bufs) {
            *slot = b;
            k += 1;
        }
        // Record after record while they fit: a frame larger than one goes
        // now as far as the ring takes it, not a record now and the rest by
        // a flusher that must be woken.
        match w.tx.write_fitting(parts.get(..k).unwrap_or_default()) {
            // The doorbell, if the reader sleeps on it, was rung by the ring.
            Ok((n, _)) => Ok(n),
            Err(WriteSomeError::Full) => Err(io::ErrorKind::WouldBlock.into()),
            Err(WriteSomeError::Closed) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the shared-memory peer closed or died",
            )),
            Err(e) => Err(corrupt(e)),
        }
    }

    /// Waits for room by `wait`: spinning for its budget, at most
    /// [`ROOM_SPIN`], before sleeping; not at all for a strategy that does
    /// not spin.
    pub(crate) fn set_wait_strategy(&self, wait: &WaitStrategy) {
        self.lock().room_spin = wait.spin().map_or(ROOM_SPIN, |s| s.min(ROOM_SPIN));
    }

    /// Spins for room for a while (see [`ShmWriter::set_wait_strategy`]),
    /// then sleeps on the doorbell until the room the ring's own writer of
    /// fragments waits for fits ([`Producer::fragment_room`]).
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut w = self.lock();
        let w = &mut *w;
        loop {
            if self.waiter.poll_readable(&mut w.readable, cx).is_ready() {
                self.waiter.drain();
                if w.announced {
                    w.tx.withdraw_wait();
                    w.announced = false;
                    return Poll::Ready(Ok(()));
                }
                if self.waiter.bell.hung_up() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let need = w.tx.fragment_room();
            if w.spin_for_room(need) {
                return Poll::Ready(Ok(()));
            }
            if self.waiter.bell.hung_up() || !w.tx.announce_doorbell_wait(need) {
                return Poll::Ready(Ok(()));
            }
            w.announced = true;
            return Poll::Pending;
        }
    }

    /// Closes this direction: the peer reads what was written, then the end.
    pub(crate) fn shutdown(&self) {
        // The ring wakes the reader itself if it sleeps.
        let _ = self.lock().tx.close();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_wakes::Wakes;
    use std::time::Instant;
    use tubeway_ring::RingConfig;

    fn fill(tx: &mut Producer) {
        while tx.try_write(&[&[7u8; 1000]]).is_ok() {}
    }

    #[tokio::test]
    async fn a_writer_spins_for_room_by_its_strategy() {
        let region = Arc::new(Region::heap(&RingConfig::default()).unwrap());
        let (sock, _peer) = tokio::net::UnixStream::pair().unwrap();
        let (_r, w) = halves(sock, region, Side::Creator).unwrap();
        let spin = |w: &ShmWriter| w.lock().room_spin;
        assert_eq!(spin(&w), ROOM_SPIN);
        let us = Duration::from_micros;
        for (wait, expected) in [
            (WaitStrategy::PARK, Duration::ZERO),
            (WaitStrategy::SpinPark { spin: us(10) }, us(10)),
            (WaitStrategy::SpinYield { spin: us(20) }, us(20)),
            (WaitStrategy::SpinPark { spin: us(500) }, ROOM_SPIN),
            (WaitStrategy::BusySpin, ROOM_SPIN),
        ] {
            w.set_wait_strategy(&wait);
            assert_eq!(spin(&w), expected, "{wait:?}");
        }
    }

    #[tokio::test]
    async fn a_spin_that_finds_no_room_makes_the_next_waits_sleep_at_once() {
        let region = Arc::new(Region::heap(&RingConfig::default().capacity(64 << 10)).unwrap());
        let (sock, _peer) = tokio::net::UnixStream::pair().unwrap();
        let (_r, w) = halves(sock, region, Side::Creator).unwrap();
        let mut w = w.lock();
        fill(&mut w.tx);
        let need = w.tx.fragment_room();
        let spin = Duration::from_millis(50);
        w.room_spin = spin;
        let timed = |w: &mut WriterInner| {
            let started = Instant::now();
            let found = w.spin_for_room(need);
            (found, started.elapsed())
        };
        let (found, took) = timed(&mut w);
        assert!(!found && took >= spin, "{found} after {took:?}");
        for _ in 0..SKIP_AFTER_EMPTY_SPIN {
            let (found, took) = timed(&mut w);
            assert!(!found && took < spin, "{found} after {took:?}");
        }
        let (found, took) = timed(&mut w);
        assert!(!found && took >= spin, "spun again: {found} after {took:?}");
    }

    #[tokio::test]
    async fn a_writer_out_of_room_is_rung_once_a_fragment_fits_and_no_later() {
        let (mut r, w) = reader_and_peer_writer();
        w.set_wait_strategy(&WaitStrategy::PARK);
        while w.try_write_vectored(&[IoSlice::new(&[7u8; 1000])]).is_ok() {}
        let (task, waker) = Wakes::new();
        assert!(w
            .poll_write_ready(&mut Context::from_waker(&waker))
            .is_pending());
        let need = w.lock().tx.fragment_room();
        // Records of 1000 bytes free 1008 each, with their header.
        let mut freed = 0;
        loop {
            let record = r.rx.try_read().unwrap().unwrap();
            freed += record.len() + 8;
            if record.release() == tubeway_ring::Wake::DoorbellRung {
                break;
            }
            assert!(freed < need, "{freed} bytes free, and the writer sleeps on");
        }
        assert!(
            (need..need + 1008 + 16).contains(&freed),
            "rung with {freed} bytes free for {need}"
        );
        assert!(task.woken_since(0).await, "the writer's task was not woken");
        assert!(w
            .poll_write_ready(&mut Context::from_waker(&waker))
            .is_ready());
    }

    /// A write larger than a record goes as far as the ring takes it, in
    /// records of at most a stream record, its parts in order.
    #[tokio::test]
    async fn a_write_fills_the_ring_record_after_record() {
        let region = Arc::new(Region::heap(&RingConfig::default().capacity(1 << 20)).unwrap());
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut r, _) = halves(a, region.clone(), Side::Creator).unwrap();
        let (_, w) = halves(b, region, Side::Opener).unwrap();
        let head: Vec<u8> = (0..100u8).collect();
        let body: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let n = w
            .try_write_vectored(&[IoSlice::new(&head), IoSlice::new(&body)])
            .unwrap();
        // Half the ring is the largest record; the whole ring less what its
        // headers and the word kept free take is what fits.
        assert!(n > 1 << 19 && n < 1 << 20, "{n} bytes written");
        let mut got = Vec::new();
        while let Some(record) = r.rx.try_read().unwrap() {
            assert!(record.len() <= tubeway_ring::STREAM_RECORD_MAX);
            got.extend_from_slice(&record);
            let _ = record.release();
        }
        let sent: Vec<u8> = head.iter().chain(&body).copied().take(n).collect();
        assert!(got == sent, "{} bytes read for {n} written", got.len());
        // The rest, once there is room.
        let m = w
            .try_write_vectored(&[IoSlice::new(body.get(n - 100..).unwrap())])
            .unwrap();
        assert_eq!(n + m, head.len() + body.len());
        // A ring with no room at all says so.
        while w.try_write_vectored(&[IoSlice::new(&body)]).is_ok() {}
        let full = w.try_write_vectored(&[IoSlice::new(&body)]).unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
    }

    /// Both ends of a connection: this side's reader, the peer's writer.
    fn reader_and_peer_writer() -> (ShmReader, ShmWriter) {
        let region = Arc::new(Region::heap(&RingConfig::default().capacity(64 << 10)).unwrap());
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (r, _) = halves(a, region.clone(), Side::Creator).unwrap();
        let (_, w) = halves(b, region, Side::Opener).unwrap();
        (r, w)
    }

    /// A record decoded in place stays in the ring until the reader's next
    /// read or wait, each of which releases it; one it could make nothing
    /// of is there for the copying read.
    #[tokio::test]
    async fn a_record_read_in_place_is_released_by_the_next_read_or_wait() {
        let (mut r, peer) = reader_and_peer_writer();
        let free = || peer.lock().tx.free();
        let empty = free();
        let write = |bytes: &[u8]| {
            peer.try_write_vectored(&[IoSlice::new(bytes)]).unwrap();
            assert!(free() < empty);
        };
        let whole = |r: &mut ShmReader| r.try_read_whole(|b| Some(b.to_vec()));

        write(b"first");
        assert_eq!(whole(&mut r).unwrap().as_deref(), Some(&b"first"[..]));
        assert!(free() < empty, "released before the message was handled");
        let nothing = whole(&mut r).unwrap_err();
        assert_eq!(nothing.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(free(), empty, "the next read released it");

        write(b"second");
        assert_eq!(whole(&mut r).unwrap().as_deref(), Some(&b"second"[..]));
        let (_task, waker) = Wakes::new();
        assert!(r
            .poll_read_ready(&mut Context::from_waker(&waker))
            .is_pending());
        assert_eq!(free(), empty, "a wait released it");

        assert!(r.withdraw_wait());
        write(b"third");
        assert_eq!(whole(&mut r).unwrap().as_deref(), Some(&b"third"[..]));
        assert!(r.resume_wait());
        assert_eq!(free(), empty, "a wait resumed released it");

        assert!(r.withdraw_wait());
        write(b"copied");
        assert!(r.try_read_whole(|_| None::<()>).unwrap().is_none());
        let mut buf = BytesMut::with_capacity(64);
        assert_eq!(r.try_read_buf(&mut buf).unwrap(), 6);
        assert_eq!(&buf[..], b"copied");
        assert_eq!(free(), empty);
    }

    /// A reader asleep on its doorbell, lent to a caller that reads its
    /// answer without waiting (the answer comes unrung, the wait having
    /// been withdrawn), then taken back: the next record wakes the task it
    /// slept for.
    #[tokio::test]
    async fn a_wait_resumed_after_a_lend_wakes_the_task_it_was_for() {
        let (mut r, peer) = reader_and_peer_writer();
        let (task, waker) = Wakes::new();
        assert!(r
            .poll_read_ready(&mut Context::from_waker(&waker))
            .is_pending());
        assert!(r.withdraw_wait());
        peer.try_write_vectored(&[IoSlice::new(b"answer")]).unwrap();
        let mut buf = BytesMut::with_capacity(64);
        assert_eq!(r.try_read_buf(&mut buf).unwrap(), 6);
        assert!(r.resume_wait());
        assert_eq!(task.count(), 0, "woken for what the borrower read");
        peer.try_write_vectored(&[IoSlice::new(b"next")]).unwrap();
        assert!(task.woken_since(0).await, "the task was not woken");
    }
}
