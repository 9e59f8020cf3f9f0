//! Frames over a byte stream: a reader that checks every length before it
//! allocates, and a writer shared by every task that sends on a connection.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::Notify;
use tubeway_proto::{DecodeError, Decoded, Decoder, EncodedFrame};

use crate::pool::{FrameBuf, FramePool};
use crate::wait::{SpinSeat, SPIN_YIELD_EVERY};
use crate::{ReadHalf, SpinGroup, WaitStrategy, WriteHalf};

/// Smallest read buffer; also the chunk size used while skipping an oversized frame.
const READ_CHUNK: usize = 64 * 1024;
/// Room below which the read buffer is grown before a read.
const MIN_READ: usize = 4 * 1024;
/// The flusher writes at most this many bytes per batch before accounting...
const BATCH_BYTES: usize = 1 << 20;
/// Slices passed to one `writev` (Linux's IOV_MAX is 1024).
const MAX_IOV: usize = 512;
/// Bytes a writer queues before senders wait: a stalled peer pushes back on
/// the senders instead of growing memory. One frame is always accepted, so a
/// frame larger than this still goes out, alone.
pub const WRITE_QUEUE_BYTES: usize = 4 << 20;
/// Polls between two looks at the clock while spinning.
const SPINS_PER_CLOCK_CHECK: u32 = 16;
/// Bytes held back by a cork before they go anyway.
const CORK_LIMIT: usize = 256 * 1024;
/// A spinning reader gives the runtime a turn, with a look at its reactor
/// and timers, at least this often, so that the other tasks of its thread
/// are not starved. A writer of that thread waiting for room in a full
/// socket or ring learns of it no sooner: 200 µs held a 5 MB echo to half
/// its speed over unix, less over shm. Each look while idle is one
/// `epoll_wait` that returns at once, on a core the spinner burns anyway.
const SPIN_SLICE: std::time::Duration = std::time::Duration::from_micros(50);

/// The least a reader of shared memory that spins at all spins for the
/// rest of a frame it has begun to read. Its sender is writing that rest
/// now, so the wait lasts as long as copying a ring's worth (1 MiB takes
/// about 0.1 ms at 10 GB/s), and ends on the first bytes. A reader that
/// parked there instead would wait for a wake-up (5-50 µs on this kind of
/// machine) between every two fragments of a large message: over shared
/// memory with the default 50 µs budget, 200 MB messages went at 6.5-7.5
/// GB/s against 8.5-10 GB/s for readers that spun 0.5 ms
/// (docs/performance/investigations.md, "Large messages over shm: spinning
/// for the rest of a frame").
const MID_FRAME_SPIN: Duration = Duration::from_millis(1);

/// The least a socket reader whose peer is on this machine spins for the
/// rest of a frame it has begun to read, whatever its strategy (`park`
/// too): about a wake-up's cost, so a wait that outlasts it costs at most
/// twice what sleeping at once would. The sender is copying that rest
/// now; a reader asleep makes it wake the reader (across CPUs here, tens
/// of microseconds) each time the socket runs dry: 200 MB messages over
/// loopback TCP went at 2.7 GB/s to a `tubeway server` that slept, 3.8-3.9
/// GB/s to one that polled (docs/performance/investigations.md, "Large
/// messages over TCP"). A peer across a network sends at the network's pace,
/// for which a reader keeps its strategy.
const LOCAL_MID_FRAME_SPIN: Duration = Duration::from_micros(50);

/// Why reading frames stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The socket failed.
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    /// The stream's framing is lost.
    #[error("protocol error: {0}")]
    Decode(#[from] DecodeError),
    /// The peer closed the stream in the middle of a frame.
    #[error("peer closed the connection mid-frame ({0} bytes of a partial frame)")]
    UnexpectedEof(usize),
}

/// Where a spinning reader is in its wait.
#[derive(Debug, Default)]
struct Spin {
    /// Gave the runtime a turn since the last read: tasks woken by the last
    /// frame (on this thread) run before this reader spins.
    yielded: bool,
    /// When this wait's spinning began.
    started: Option<Instant>,
    /// The spin budget is spent: sleep until the stream is readable.
    parked: bool,
    /// [`FrameReader::wait_readable`] found the stream readable: the next
    /// read asks the kernel, not the reactor.
    readable: bool,
}

/// A large frame being read into a buffer of a [`FramePool`].
#[derive(Debug)]
struct Recycling {
    buf: FrameBuf,
    /// Bytes of the frame read so far.
    got: usize,
    /// The frame's length.
    len: usize,
}

impl Recycling {
    /// Where the rest of the frame goes.
    fn rest(&mut self) -> &mut [u8] {
        (self.buf.frame_mut(self.len).get_mut(self.got..)).unwrap_or_default()
    }
}

/// Reads frames from a byte stream, checking every length before allocating.
#[derive(Debug)]
pub struct FrameReader {
    reader: ReadHalf,
    buf: BytesMut,
    decoder: Decoder,
    wait: WaitStrategy,
    spin: Spin,
    pool: Option<FramePool>,
    /// A large frame being read into a pooled buffer. Kept here, not in the
    /// future, so that `next` stays cancel-safe.
    recycling: Option<Recycling>,
    /// The last poll of `next` was pending with its task already woken.
    woke_itself: bool,
    /// The readers this one shares its threads with.
    seat: Option<SpinSeat>,
    /// Frames returned since the reader last waited or gave a turn.
    in_a_row: u32,
    /// The last poll was pending, waiting to be woken through the stream.
    asleep: bool,
    /// A frame decoded where the stream holds it, for `next` to return.
    /// Never kept past the `next` that read it: `try_fill_now` sets it
    /// only for `next`, which takes it as soon as the fill returns.
    ready: Option<Decoded>,
}

/// How a reader was when [lent](FrameReader::lend).
#[derive(Debug)]
#[must_use = "a lent reader is taken back with it"]
pub struct Lent {
    asleep: bool,
    /// A wait announced on shared memory was withdrawn.
    withdrew: bool,
}

impl FrameReader {
    /// Reads frames of at most `max_frame` bytes from `reader`, sleeping
    /// whenever nothing is there to read ([`WaitStrategy::PARK`]).
    pub fn new(reader: ReadHalf, max_frame: usize) -> Self {
        FrameReader {
            reader,
            buf: BytesMut::with_capacity(READ_CHUNK),
            decoder: Decoder::new(max_frame),
            wait: WaitStrategy::PARK,
            spin: Spin::default(),
            pool: None,
            recycling: None,
            woke_itself: false,
            seat: None,
            in_a_row: 0,
            asleep: false,
            ready: None,
        }
    }

    /// Counts this reader in `group`, the readers polled by the same
    /// threads, until it is dropped: while the group has more members than
    /// threads, the reader spins by looking once per poll instead of in
    /// place (see [`SpinGroup`]).
    pub fn join_spin_group(&mut self, group: &SpinGroup) {
        self.seat = Some(group.join());
    }

    /// Reads frames of at least `pool.min_frame` bytes into buffers that
    /// `pool` recycles once every part of the message is dropped, instead of
    /// into fresh memory: see [`FramePool`].
    pub fn recycle_large_frames(&mut self, pool: FramePool) {
        self.pool = Some(pool);
    }

    /// Waits for data by `wait` from now on.
    pub fn set_wait_strategy(&mut self, wait: WaitStrategy) {
        self.wait = wait;
        self.spin = Spin::default();
    }

    /// The next wait sleeps at once, without spinning; the waits after the
    /// next frame spin again by the strategy. For a reader whose owner
    /// expects nothing soon: another polled it for the answer it wanted,
    /// and will again for the next.
    pub fn sleep_next(&mut self) {
        self.spin.parked = self.wait.spins();
    }

    /// Whether this reader shares its threads with more spinning readers
    /// than they number: it then looks once per poll, in turn with them,
    /// instead of spinning in place (see [`SpinGroup`]).
    pub fn crowded(&self) -> bool {
        self.seat.as_ref().is_some_and(SpinSeat::crowded)
    }

    /// Lends this reader to someone who polls it for a while without
    /// sleeping, with a waker that wakes nothing (a caller reading its own
    /// answer): it stops waiting to be woken through the stream, and spins
    /// anew by the strategy, at once. What it returns tells
    /// [`take_back`](Self::take_back) how to put the reader back as it was.
    pub fn lend(&mut self) -> Lent {
        let lent = Lent {
            asleep: std::mem::take(&mut self.asleep),
            withdrew: self.reader.withdraw_wait(),
        };
        self.spin = Spin {
            yielded: true,
            ..Spin::default()
        };
        lent
    }

    /// Takes back a reader [lent](Self::lend), once the borrower got what
    /// it wanted without its poll ever having been pending: one that was
    /// asleep sleeps again, waiting to be woken through the stream as
    /// before, with the waker it had. False when it cannot, and must be
    /// polled: bytes of a next frame were read with the borrower's, or came
    /// meanwhile, or the peer hung up, or the borrower's poll registered its
    /// own waker with the stream on its way to what it got (its spin ran
    /// out, and it waited: see [`ReadHalf::waited_since_withdraw`]); the
    /// stream would then wake the borrower, not the owner. A wake-up of
    /// the owner's waker while the reader was lent (a socket's reactor saw
    /// the borrower's bytes come) stands: its owner polls it as after any,
    /// which registers it again. Shared memory wakes nobody for what the
    /// borrower reads. An on-demand socket sleeps unwatched: see
    /// [`watched`](Self::watched).
    pub fn take_back(&mut self, lent: Lent) -> bool {
        if self.has_buffered() {
            return false;
        }
        if !lent.asleep {
            // Its owner polls it again anyway.
            return true;
        }
        if self.reader.waited_since_withdraw() {
            return false;
        }
        self.spin = Spin {
            parked: self.wait.spins(),
            ..Spin::default()
        };
        self.asleep = true;
        !lent.withdrew || self.reader.resume_wait()
    }

    /// Whether something wakes the reader's task for what comes: false
    /// while it is asleep on an on-demand socket that the reactor does not
    /// watch, having been [lent](Self::lend) and
    /// [taken back](Self::take_back) (see
    /// [`crate::Connection::watch_on_demand`]). Its next poll registers
    /// the socket again.
    pub fn watched(&self) -> bool {
        !self.asleep || self.reader.watched()
    }

    /// Says that handling the last frame woke no task on this thread: a
    /// spinning reader then spins for the next at once, instead of first
    /// giving the runtime a turn (which costs a look at its reactor).
    pub fn skip_yield(&mut self) {
        self.spin.yielded = true;
    }

    /// Whether the last poll of [`next`](Self::next) was pending only to
    /// give the runtime a turn (a spinning reader does, now and then): its
    /// task is already woken and polls it again at once, so whatever else
    /// the task waits for need not be polled for a wake-up.
    pub fn woke_itself(&self) -> bool {
        self.woke_itself
    }

    /// Whether bytes of a next frame are already read: more frames follow
    /// at once. Frames a shared-memory ring still holds do not count: small
    /// ones are read in place one at a time, never buffered (the corking of
    /// answers this drives saves system calls that shared memory does not
    /// make).
    pub fn has_buffered(&self) -> bool {
        !self.buf.is_empty() || self.recycling.is_some()
    }

    /// Blocks this thread until the stream may have bytes to read, or
    /// `deadline` passes, without the runtime: for a thread with nothing
    /// else to do (a blocking call waiting for its answer), which is then
    /// woken by the kernel alone. False, without sleeping, once `deadline`
    /// has passed, and on shared memory (whose readers spin). Poll
    /// [`next`](Self::next) after: it then asks the kernel itself.
    pub fn wait_readable(&mut self, deadline: Option<Instant>) -> io::Result<bool> {
        let readable = self.reader.wait_readable(deadline)?;
        self.spin.readable = readable;
        Ok(readable)
    }

    /// Changes the maximum for frames not yet started.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.decoder.set_max_frame(max_frame);
    }

    /// The next decoded item; `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Decoded>, ReadError> {
        if self.seat.is_some() {
            self.in_a_row += 1;
            if self.in_a_row > FAIR_SHARE {
                // Cancel-safe: nothing is read before the turn is over.
                self.in_a_row = 0;
                let mut turned = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut turned, true) {
                        Poll::Ready(())
                    } else {
                        self.yield_now(cx)
                    }
                })
                .await;
            }
        }
        loop {
            if self.recycling.is_none() {
                if let (Some(len), Some(pool)) = (self.recyclable_frame(), &self.pool) {
                    let mut buf = pool.take(len);
                    let got = self.buf.len();
                    if let Some(start) = buf.frame_mut(len).get_mut(..got) {
                        start.copy_from_slice(&self.buf);
                    }
                    self.buf.clear();
                    self.recycling = Some(Recycling { buf, got, len });
                }
            }
            if self.recycling.is_some() {
                return self.read_recycled().await.map(Some);
            }
            if let Some(d) = self.ready.take() {
                return Ok(Some(d));
            }
            if let Some(d) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(d));
            }
            // `wanted` is bounded by the maximum frame size, so a hostile length
            // never makes us reserve more than that. The buffer is only
            // grown when what is left of it is too small: a decoded payload
            // that is not copied out keeps a slice of it alive, so growing it
            // whenever it is not a whole chunk would cost an allocation per
            // message.
            let wanted = self.decoder.wanted(&self.buf);
            if self.buf.capacity() - self.buf.len() < wanted.max(MIN_READ) {
                self.buf.reserve(wanted.max(READ_CHUNK));
            }
            let n = poll_fn(|cx| self.poll_fill(cx)).await?;
            if n == 0 {
                if self.decoder.is_idle(&self.buf) {
                    return Ok(None);
                }
                return Err(ReadError::UnexpectedEof(self.buf.len()));
            }
        }
    }

    /// The length of the frame that starts the buffer, when it is one to
    /// read into a recycled buffer: large, within the limit, not all here.
    fn recyclable_frame(&self) -> Option<usize> {
        let pool = self.pool.as_ref()?;
        if !self.decoder.at_frame_start() {
            return None;
        }
        let len = tubeway_proto::codec::decode_prefix(&self.buf)
            .ok()?
            .frame_len as usize;
        (len >= pool.min_frame() && len <= self.decoder.max_frame() && self.buf.len() < len)
            .then_some(len)
    }

    /// Reads the rest of the frame in `recycling` and decodes it there.
    /// Cancel-safe: what is read stays in `recycling`.
    async fn read_recycled(&mut self) -> Result<Decoded, ReadError> {
        while let Some(r) = self.recycling.as_ref().filter(|r| r.got < r.len) {
            let got = r.got;
            if poll_fn(|cx| self.poll_fill(cx)).await? == 0 {
                self.recycling = None;
                return Err(ReadError::UnexpectedEof(got));
            }
        }
        let (Some(Recycling { buf, len, .. }), Some(pool)) = (self.recycling.take(), &self.pool)
        else {
            return Err(io::Error::other("no frame being read").into());
        };
        Ok(tubeway_proto::decode_frame(pool.share(buf, len)))
    }

    /// Reads more bytes into the buffer, waiting by the strategy.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.woke_itself = false;
        self.asleep = false;
        if self.spin.parked || !self.spins() {
            if std::mem::take(&mut self.spin.readable) {
                if let Poll::Ready(r) = self.try_fill_now() {
                    return Poll::Ready(r);
                }
            }
            let read = match &mut self.recycling {
                Some(r) => self.reader.poll_read_into(cx, r.rest()),
                None => self.reader.poll_read_buf(cx, &mut self.buf),
            };
            let Poll::Ready(r) = read else {
                // Asleep: the thread's other tasks run meanwhile.
                self.in_a_row = 0;
                self.asleep = true;
                return Poll::Pending;
            };
            return Poll::Ready(self.count(r));
        }
        let in_turn = self.seat.as_ref().is_some_and(SpinSeat::crowded);
        if let Poll::Ready(r) = self.try_fill_now() {
            if in_turn {
                THREAD_TURNS.with(ThreadTurns::data);
            }
            return Poll::Ready(r);
        }
        if in_turn {
            return self.poll_fill_in_turn(cx);
        }
        if !self.spin.yielded && self.wait.spins() {
            // Tasks woken by the last frame (on this thread) run before this
            // reader spins. (A reader that spins only for the rest of a
            // frame has delivered none since.)
            self.spin.yielded = true;
            return self.yield_now(cx);
        }
        // The clock is first read at the first check, not on entry: most
        // waits end before it, and the budget is tens of microseconds.
        let mut slice: Option<(Instant, Instant)> = None;
        let mut spins = 0u32;
        loop {
            tubeway_ring::pause_after(spins);
            if let Poll::Ready(r) = self.try_fill_now() {
                return Poll::Ready(r);
            }
            // A look at the clock costs more than a look at a ring.
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) {
                continue;
            }
            let now = Instant::now();
            let started = *self.spin.started.get_or_insert(now);
            let (slice_end, next_yield) =
                slice.get_or_insert((now + SPIN_SLICE, now + SPIN_YIELD_EVERY));
            let budget = self.budget();
            if budget.is_some_and(|b| now - started >= b) {
                break;
            }
            if budget.is_some() && now >= *next_yield {
                // The thread that will answer may be waiting for this very
                // CPU (schedulers do put a waker and its wakee together):
                // let it run. A no-op costing a system call when nobody waits.
                std::thread::yield_now();
                *next_yield = now + SPIN_YIELD_EVERY;
            }
            if now >= *slice_end {
                self.spin.yielded = false;
                return self.yield_to_driver(cx);
            }
        }
        // The budget is spent.
        if self.wait.parks() {
            self.spin.parked = true;
            return self.poll_fill(cx);
        }
        // Polling on (spin-yield): each poll gives up the CPU, so 61 of them
        // could take a while; the reactor gets its look every time.
        std::thread::yield_now();
        self.yield_to_driver(cx)
    }

    /// The wait of a reader that shares its thread with more spinning
    /// readers: it has looked once; now the others get their turn. Its
    /// budget runs while the thread finds nothing for any of its readers:
    /// on a thread kept busy by others a reader would otherwise park during
    /// every wait that lasts a round of theirs, and each wait would end in
    /// a doorbell (a system call on each side).
    fn poll_fill_in_turn(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        THREAD_TURNS.with(ThreadTurns::turn);
        let Some(budget) = self.budget() else {
            return self.yield_now(cx);
        };
        let (now, thread_idle) = THREAD_TURNS.with(|t| {
            let now = t.now();
            (now, t.idle_for(now))
        });
        let started = *self.spin.started.get_or_insert(now);
        let waited = now.saturating_duration_since(started);
        if waited >= budget && (thread_idle >= budget || waited >= budget * IN_TURN_PATIENCE) {
            if self.wait.parks() {
                self.spin.parked = true;
                return self.poll_fill(cx);
            }
            std::thread::yield_now();
        } else if thread_idle >= SPIN_YIELD_EVERY {
            // As a reader spinning in place does, but once per thread
            // however many readers it polls, and only while none has data.
            THREAD_TURNS.with(|t| t.yield_now_and_then(now));
        }
        self.yield_now(cx)
    }

    /// Whether this wait spins before it sleeps: by its strategy, or, on a
    /// socket whose peer is on this machine, for the rest of a frame (see
    /// [`budget`](Self::budget)).
    fn spins(&self) -> bool {
        self.wait.spins()
            || (!self.reader.reads_memory() && self.reader.peer_is_local() && self.mid_frame())
    }

    /// Whether part of a frame has been read (or skipped), and not its rest.
    fn mid_frame(&self) -> bool {
        self.recycling.is_some() || !self.decoder.is_idle(&self.buf)
    }

    /// How long this wait spins before it parks (`None`: for ever). In the
    /// middle of a frame (skipping the rest of one too large too), a reader
    /// of shared memory that spins at all spins at least
    /// [`MID_FRAME_SPIN`], and a socket reader whose peer is on this
    /// machine at least [`LOCAL_MID_FRAME_SPIN`].
    fn budget(&self) -> Option<Duration> {
        let spin = self.wait.spin()?;
        Some(if !self.mid_frame() {
            spin
        } else if self.reader.reads_memory() {
            if spin.is_zero() {
                spin
            } else {
                spin.max(MID_FRAME_SPIN)
            }
        } else if self.reader.peer_is_local() {
            spin.max(LOCAL_MID_FRAME_SPIN)
        } else {
            spin
        })
    }

    /// Pending, with the task woken: the runtime gets a turn, then polls
    /// this reader again.
    fn yield_now<T>(&mut self, cx: &mut Context<'_>) -> Poll<T> {
        self.woke_itself = true;
        self.in_a_row = 0;
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// [`yield_now`](Self::yield_now), and the runtime looks at its reactor
    /// and timers before it polls this reader again. A task that only wakes
    /// itself runs again first: a current-thread runtime looks at them once
    /// every 61 task polls, so a reader spinning there would keep the
    /// writers of its own thread waiting for room (and timers firing) for
    /// 61 of its polls, every other one a slice of spinning.
    fn yield_to_driver<T>(&mut self, cx: &mut Context<'_>) -> Poll<T> {
        self.woke_itself = true;
        self.in_a_row = 0;
        // Tokio's yield defers the wake-up until its driver has been polled;
        // its first poll is always pending, and the future may then go.
        let turn = std::pin::pin!(tokio::task::yield_now());
        if std::future::Future::poll(turn, cx).is_ready() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// One non-blocking read straight from the kernel, for spinning.
    fn try_fill_now(&mut self) -> Poll<io::Result<usize>> {
        // A small frame alone in a record of shared memory is decoded
        // there: no copy into the buffer first (see
        // docs/performance/investigations.md, "Where a call's time goes").
        if self.recycling.is_none() && self.buf.is_empty() && self.reader.reads_memory() {
            let decoder = &self.decoder;
            match self
                .reader
                .try_read_whole(|bytes| decoder.decode_whole(bytes).map(|d| (d, bytes.len())))
            {
                Ok(Some((d, len))) => {
                    self.ready = Some(d);
                    return Poll::Ready(self.count(Ok(len)));
                }
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(self.count(Err(e))),
            }
        }
        let r = match &mut self.recycling {
            Some(r) => self.reader.try_read_now_into(r.rest()),
            None => self.reader.try_read_now(&mut self.buf),
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            r => Poll::Ready(self.count(r)),
        }
    }

    /// Notes what a read gave: the wait is over.
    fn count(&mut self, r: io::Result<usize>) -> io::Result<usize> {
        if let Ok(n) = r {
            self.spin = Spin::default();
            if let Some(r) = &mut self.recycling {
                r.got += n;
            }
        }
        r
    }
}

/// Frames a reader that shares its thread returns in a row before it gives
/// the runtime a turn: a peer that never stops sending must not keep the
/// thread's other connections waiting (a reader that has bytes never waits,
/// so it would never give one otherwise).
const FAIR_SHARE: u32 = 64;

/// How many spin budgets a reader polled in turn waits for data of its own,
/// on a thread that keeps finding data for others, before it parks.
const IN_TURN_PATIENCE: u32 = 20;

thread_local! {
    /// What the readers polled in turn on this thread have seen.
    static THREAD_TURNS: ThreadTurns = const { ThreadTurns::new() };
}

/// In-turn polls between two looks at the clock: a round of many readers
/// is a few microseconds, the budgets tens.
const IN_TURN_POLLS_PER_CLOCK_CHECK: u32 = 16;

/// The readers of one thread that are polled in turn, as a whole.
struct ThreadTurns {
    polls: std::cell::Cell<u32>,
    /// The clock as last read, for readers to share.
    now: std::cell::Cell<Option<Instant>>,
    /// When one of the readers last read data.
    last_data: std::cell::Cell<Option<Instant>>,
    /// When the thread last gave the CPU away for them.
    last_yield: std::cell::Cell<Option<Instant>>,
}

impl ThreadTurns {
    const fn new() -> ThreadTurns {
        ThreadTurns {
            polls: std::cell::Cell::new(0),
            now: std::cell::Cell::new(None),
            last_data: std::cell::Cell::new(None),
            last_yield: std::cell::Cell::new(None),
        }
    }

    /// Counts a poll in turn.
    fn turn(&self) {
        self.polls.set(self.polls.get().wrapping_add(1));
    }

    /// The time, read afresh every few polls.
    fn now(&self) -> Instant {
        let due = self
            .polls
            .get()
            .is_multiple_of(IN_TURN_POLLS_PER_CLOCK_CHECK);
        match self.now.get() {
            Some(t) if !due => t,
            _ => {
                let t = Instant::now();
                self.now.set(Some(t));
                t
            }
        }
    }

    /// A reader of this thread read data. The time is that of the next poll
    /// in turn, whose clock is read only every few polls: a look at the
    /// clock per frame would cost more than the look at the ring, and a few
    /// polls are a small part of a budget.
    fn data(&self) {
        self.last_data.set(None);
    }

    /// How long since a reader of this thread last read data (none, the
    /// first time).
    fn idle_for(&self, now: Instant) -> std::time::Duration {
        match self.last_data.get() {
            Some(t) => now.saturating_duration_since(t),
            None => {
                self.last_data.set(Some(now));
                std::time::Duration::ZERO
            }
        }
    }

    /// Gives the CPU to whoever waits for it, at most every
    /// [`SPIN_YIELD_EVERY`].
    fn yield_now_and_then(&self, now: Instant) {
        match self.last_yield.get() {
            Some(t) if now.saturating_duration_since(t) < SPIN_YIELD_EVERY => {}
            _ => {
                std::thread::yield_now();
                self.last_yield.set(Some(now));
                // The thread may have been away for long.
                self.now.set(None);
            }
        }
    }
}

/// Counters a writer keeps, as of one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Frames accepted: written, being written or queued. Counted before
    /// a frame's first byte goes, so that a peer that has read the frame
    /// finds it counted.
    pub accepted: u64,
    /// Frames written.
    pub frames: u64,
    /// Vectored write calls made.
    pub syscalls: u64,
    /// Frames written at once by the task that sent them, without a hand-off.
    pub direct: u64,
}

/// Why a frame could not be sent.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The writer was closed, by [`FrameWriter::close`] or because the stream failed.
    #[error("connection closed: {0}")]
    Closed(Arc<str>),
}

/// Sends frames on one connection, from any number of tasks and threads.
///
/// A frame sent while the connection is idle is written at once by the
/// sender itself: no task hand-off and no wake-up on the way to the socket.
/// Frames sent while another write is under way are queued, and the writer's
/// flusher task writes everything queued in one vectored system call
/// (heads and payloads as separate slices, so payloads are never copied).
/// Frames stay whole and in the order their `send` calls took effect.
///
/// Cheap to clone. Dropping the last clone closes it: what is queued is
/// flushed, then the stream's write side is shut down.
#[derive(Clone, Debug)]
pub struct FrameWriter {
    handle: Arc<Handle>,
}

#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.close();
    }
}

#[derive(Debug)]
struct Shared {
    io: WriteHalf,
    state: Mutex<State>,
    /// Wakes the flusher: frames are queued and nobody writes.
    work: Notify,
    /// Wakes senders waiting for the queue to drain below its bound.
    room: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Queued slices: frame heads and payloads, in order.
    chunks: VecDeque<Bytes>,
    /// Frames in `chunks` (a frame is one or two chunks).
    frames: u64,
    /// Bytes queued or being flushed.
    queued: usize,
    /// Someone is writing to the stream; only that one may.
    writing: bool,
    /// Close requested: flush, shut down, accept nothing more.
    closing: bool,
    /// Frames wait for [`FrameWriter::uncork`] instead of going out at once.
    corked: bool,
    /// Someone waits in [`FrameWriter::drained`]: a direct write that
    /// leaves nothing queued wakes it, as the flusher does after each batch.
    drain_waiters: bool,
    /// Why the writer ended, once it has.
    closed: Option<Arc<str>>,
    /// Kept under the lock the writes take anyway: no atomic per frame.
    stats: WriteStats,
}

impl FrameWriter {
    /// A writer for `io`, and the flusher future that must be spawned (or
    /// otherwise driven) for queued frames to go out. The flusher ends once
    /// the writer is closed and flushed, or when the stream fails.
    pub fn new(
        io: WriteHalf,
    ) -> (
        FrameWriter,
        impl std::future::Future<Output = io::Result<()>>,
    ) {
        let shared = Arc::new(Shared {
            io,
            state: Mutex::default(),
            work: Notify::new(),
            room: Notify::new(),
        });
        let flusher = flush_loop(shared.clone());
        (
            FrameWriter {
                handle: Arc::new(Handle { shared }),
            },
            flusher,
        )
    }

    /// Whether a frame written at once is a copy into memory, not a system
    /// call (see [`WriteHalf::writes_to_memory`]).
    pub fn writes_to_memory(&self) -> bool {
        self.handle.shared.io.writes_to_memory()
    }

    /// Sends one frame: written at once when the stream is idle and has room,
    /// queued otherwise. Waits only while the queue is over its bound.
    pub async fn send(&self, frame: EncodedFrame) -> Result<(), WriteError> {
        self.send_as(frame, false).await
    }

    /// Sends one frame among others being sent at the same time (pipelined
    /// calls, say): queued for the flusher, which writes everything queued
    /// in one system call, instead of one call per frame.
    pub async fn send_batched(&self, frame: EncodedFrame) -> Result<(), WriteError> {
        self.send_as(frame, true).await
    }

    async fn send_as(&self, mut frame: EncodedFrame, batch: bool) -> Result<(), WriteError> {
        let shared = &self.handle.shared;
        // Most frames are admitted at once; waiting for room (which costs a
        // registration with the notifier) only once the queue was full.
        match shared.admit(frame, batch)? {
            None => return Ok(()),
            Some(back) => frame = back,
        }
        loop {
            // Registered before the check, so room made in between is not missed.
            let room = shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            match shared.admit(frame, batch)? {
                None => return Ok(()),
                Some(back) => frame = back,
            }
            room.await;
        }
    }

    /// Sends a frame only if that needs no waiting: false when the queue is full.
    pub fn try_send(&self, frame: EncodedFrame) -> Result<bool, WriteError> {
        Ok(self.try_send_or_return(frame)?.is_none())
    }

    /// [`try_send`](Self::try_send), giving the frame back when the queue is full.
    pub fn try_send_or_return(
        &self,
        frame: EncodedFrame,
    ) -> Result<Option<EncodedFrame>, WriteError> {
        self.handle.shared.admit(frame, false)
    }

    /// [`try_send_or_return`](Self::try_send_or_return) for a frame among
    /// others being sent at the same time, as
    /// [`send_batched`](Self::send_batched) sends it.
    pub fn try_send_batched_or_return(
        &self,
        frame: EncodedFrame,
    ) -> Result<Option<EncodedFrame>, WriteError> {
        self.handle.shared.admit(frame, true)
    }

    /// Holds frames back until [`uncork`](FrameWriter::uncork): for a
    /// sender that knows more frames follow at once (answers to requests
    /// that arrived together), so they leave together.
    pub fn cork(&self) {
        self.handle.shared.lock().corked = true;
    }

    /// Ends [`cork`](FrameWriter::cork): writes what was held back, from
    /// this thread when the stream takes it at once.
    pub fn uncork(&self) {
        self.handle.shared.uncork();
    }

    /// Stops accepting frames; what is queued is flushed, then the stream's
    /// write side is shut down. Idempotent.
    pub fn close(&self) {
        self.handle.shared.close();
    }

    /// Ends the stream's read direction, for a connection whose reader
    /// stops: a thread asleep reading it (in [`FrameReader::wait_readable`])
    /// wakes and reads end of stream. Writing is not affected.
    pub fn stop_reading(&self) {
        self.handle.shared.io.stop_reading();
    }

    /// Whether frames are queued or being written: the flusher has work.
    pub fn has_backlog(&self) -> bool {
        let s = self.handle.shared.lock();
        s.writing || !s.chunks.is_empty()
    }

    /// Waits until nothing is queued or being written, or the writer has
    /// closed.
    pub async fn drained(&self) {
        let shared = &self.handle.shared;
        loop {
            let room = shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut s = shared.lock();
                if s.closed.is_some() || (!s.writing && s.chunks.is_empty()) {
                    return;
                }
                s.drain_waiters = true;
            }
            room.await;
        }
    }

    /// Whether the writer is closed or closing.
    pub fn is_closed(&self) -> bool {
        let s = self.handle.shared.lock();
        s.closing || s.closed.is_some()
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriteStats {
        self.handle.shared.lock().stats
    }
}

impl State {
    fn enqueue(&mut self, frame: EncodedFrame) {
        self.queued += frame.len();
        self.frames += 1;
        self.chunks.push_back(frame.head);
        if !frame.payload.is_empty() {
            self.chunks.push_back(frame.payload);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `frame` at once if the stream is idle (and it is not a
    /// batch), or queues it if the queue has room; hands it back when the
    /// queue is full.
    fn admit(&self, frame: EncodedFrame, batch: bool) -> Result<Option<EncodedFrame>, WriteError> {
        let mut s = self.lock();
        if let Some(why) = &s.closed {
            return Err(WriteError::Closed(why.clone()));
        }
        if s.closing {
            return Err(WriteError::Closed("the writer is closing".into()));
        }
        if !batch && !s.corked && !s.writing && s.chunks.is_empty() {
            // A copy into shared memory takes less time than the unlock and
            // second lock that letting go around it costs (30 ns of a 1.28
            // µs call over shm), so it is made under the lock; a rare wake
            // of a sleeping reader then is too. A system call is made
            // without it, so that other senders queue meanwhile.
            s.stats.accepted += 1;
            if self.io.writes_to_memory() {
                self.write_direct(frame, Some(s));
            } else {
                s.writing = true;
                drop(s);
                self.write_direct(frame, None);
            }
            return Ok(None);
        }
        if s.queued != 0 && s.queued + frame.len() > WRITE_QUEUE_BYTES {
            if s.corked && !s.writing {
                // Held back frames fill the queue: they must go now.
                drop(s);
                self.work.notify_one();
            }
            return Ok(Some(frame));
        }
        s.enqueue(frame);
        s.stats.accepted += 1;
        let wake = !s.writing && (!s.corked || s.queued >= CORK_LIMIT);
        drop(s);
        if wake {
            self.work.notify_one();
        }
        Ok(None)
    }

    fn uncork(&self) {
        let mut s = self.lock();
        s.corked = false;
        if s.writing || s.chunks.is_empty() || s.closed.is_some() {
            return;
        }
        s.writing = true;
        let mut batch = std::mem::take(&mut s.chunks);
        let frames = std::mem::take(&mut s.frames);
        drop(s);
        let bytes: usize = batch.iter().map(Bytes::len).sum();
        let mut syscalls = 0;
        let result = self.write_now(&mut batch, &mut syscalls);
        let mut s = self.lock();
        s.stats.syscalls += syscalls;
        if let Err(e) = result {
            drop(s);
            return self.fail(&e);
        }
        let left: usize = batch.iter().map(Bytes::len).sum();
        if batch.is_empty() {
            s.stats.frames += frames;
            // Hand the allocation back for the next batch.
            if s.chunks.is_empty() {
                s.chunks = batch;
            }
        } else {
            // The rest goes first: frames queued meanwhile came later.
            while let Some(b) = batch.pop_back() {
                s.chunks.push_front(b);
            }
            s.frames += frames;
        }
        s.queued = s.queued.saturating_sub(bytes - left);
        s.writing = false;
        let more = !s.chunks.is_empty() || s.closing;
        drop(s);
        self.room.notify_waiters();
        if more {
            self.work.notify_one();
        }
    }

    /// Writes from `batch` without waiting, until it is empty or the stream
    /// is full, counting the calls made in `syscalls`.
    fn write_now(&self, batch: &mut VecDeque<Bytes>, syscalls: &mut u64) -> io::Result<()> {
        while !batch.is_empty() {
            let n = {
                let mut slices = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                for (slot, b) in slices.iter_mut().zip(batch.iter()) {
                    *slot = IoSlice::new(b);
                    k += 1;
                }
                match self
                    .io
                    .try_write_vectored(slices.get(..k).unwrap_or_default())
                {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e),
                }
            };
            *syscalls += 1;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            advance(batch, n);
        }
        Ok(())
    }

    fn close(&self) {
        let mut s = self.lock();
        if s.closing {
            return;
        }
        s.closing = true;
        drop(s);
        self.work.notify_one();
        self.room.notify_waiters();
    }

    fn fail(&self, e: &io::Error) {
        let mut s = self.lock();
        s.closed.get_or_insert_with(|| e.to_string().into());
        s.chunks.clear();
        s.queued = 0;
        s.frames = 0;
        s.writing = false;
        drop(s);
        self.work.notify_one();
        self.room.notify_waiters();
    }

    /// Writes `frame` from the sender's own thread, under `held` if given,
    /// else with `writing` set by the caller; whatever does not fit goes to
    /// the flusher.
    fn write_direct(&self, frame: EncodedFrame, held: Option<MutexGuard<'_, State>>) {
        let total = frame.len();
        let written = {
            let slices = [IoSlice::new(&frame.head), IoSlice::new(&frame.payload)];
            let n = if frame.payload.is_empty() { 1 } else { 2 };
            self.io
                .try_write_vectored(slices.get(..n).unwrap_or_default())
        };
        let (n, calls) = match written {
            Ok(n) => (n, 1),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => (0, 0),
            Err(e) => {
                drop(held);
                return self.fail(&e);
            }
        };
        let mut s = held.unwrap_or_else(|| self.lock());
        s.stats.syscalls += calls;
        if n == total {
            s.stats.frames += 1;
            s.stats.direct += 1;
        } else {
            // The rest goes first: frames queued meanwhile came later.
            let mut rest = [frame.head, frame.payload];
            let mut skip = n;
            for b in &mut rest {
                let k = skip.min(b.len());
                b.advance(k);
                skip -= k;
            }
            let [head, payload] = rest;
            if !payload.is_empty() {
                s.chunks.push_front(payload);
            }
            if !head.is_empty() {
                s.chunks.push_front(head);
            }
            s.queued += total - n;
            s.frames += 1;
        }
        s.writing = false;
        let more = !s.chunks.is_empty() || s.closing;
        let drained = !more && std::mem::take(&mut s.drain_waiters);
        drop(s);
        if more {
            self.work.notify_one();
        }
        if drained {
            self.room.notify_waiters();
        }
    }
}

/// Writes whatever is queued while nobody else writes; ends once closed and
/// flushed, or when the stream fails.
async fn flush_loop(shared: Arc<Shared>) -> io::Result<()> {
    // If this future is dropped unfinished (its runtime shut down), senders
    // must learn it rather than wait for room that never comes.
    struct Stopped<'a>(&'a Shared);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0
                .fail(&io::Error::other("the connection's writer stopped"));
        }
    }
    let _stopped = Stopped(&shared);
    let mut batch: VecDeque<Bytes> = VecDeque::new();
    loop {
        let work = shared.work.notified();
        tokio::pin!(work);
        let frames = {
            let mut s = shared.lock();
            if let Some(why) = &s.closed {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, why.to_string()));
            }
            if s.writing || s.chunks.is_empty() {
                if s.closing && !s.writing {
                    drop(s);
                    let r = shared.io.shutdown();
                    shared.lock().closed = Some("closed".into());
                    shared.room.notify_waiters();
                    return r;
                }
                work.as_mut().enable();
                None
            } else {
                s.writing = true;
                std::mem::swap(&mut batch, &mut s.chunks);
                Some(std::mem::take(&mut s.frames))
            }
        };
        let Some(frames) = frames else {
            work.await;
            continue;
        };
        let bytes: usize = batch.iter().map(Bytes::len).sum();
        let mut syscalls = 0;
        let written = write_all(&shared, &mut batch, &mut syscalls).await;
        let mut s = shared.lock();
        s.stats.syscalls += syscalls;
        if let Err(e) = written {
            drop(s);
            shared.fail(&e);
            return Err(e);
        }
        s.stats.frames += frames;
        s.queued = s.queued.saturating_sub(bytes);
        s.writing = false;
        drop(s);
        shared.room.notify_waiters();
    }
}

/// Writes every chunk of `batch`, waiting for the stream to take them,
/// counting the calls made in `syscalls`.
async fn write_all(
    shared: &Shared,
    batch: &mut VecDeque<Bytes>,
    syscalls: &mut u64,
) -> io::Result<()> {
    while !batch.is_empty() {
        let n = poll_fn(|cx| poll_write_some(shared, batch, cx)).await?;
        *syscalls += 1;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        advance(batch, n);
    }
    Ok(())
}

/// Drops the first `n` bytes of `batch`.
fn advance(batch: &mut VecDeque<Bytes>, n: usize) {
    let mut left = n;
    while left > 0 {
        let Some(front) = batch.front_mut() else {
            break;
        };
        if front.len() <= left {
            left -= front.len();
            batch.pop_front();
        } else {
            front.advance(left);
            left = 0;
        }
    }
}

fn poll_write_some(
    shared: &Shared,
    batch: &VecDeque<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    let mut slices = [IoSlice::new(&[]); MAX_IOV];
    let mut n = 0;
    let mut bytes = 0;
    for (slot, b) in slices.iter_mut().zip(batch) {
        *slot = IoSlice::new(b);
        n += 1;
        bytes += b.len();
        if bytes >= BATCH_BYTES {
            break;
        }
    }
    shared
        .io
        .poll_write_vectored_some(cx, slices.get(..n).unwrap_or_default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::test_wakes::Wakes;
    use crate::{connect, Listener, Url};
    use tokio::io::AsyncWriteExt;
    use tubeway_proto::{codec, Message};

    /// Bounds a step of a test.
    async fn within<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(std::time::Duration::from_secs(30), f)
            .await
            .expect("test step timed out")
    }

    async fn pair(url: &str) -> (crate::Connection, crate::Connection) {
        let url: Url = url.parse().unwrap();
        let mut l = Listener::bind(&url).await.unwrap();
        let bound = l.local_url().clone();
        let (a, b) = tokio::join!(l.accept(), connect(&bound));
        (a.unwrap(), b.unwrap())
    }

    async fn exchange(url: &str, wait: WaitStrategy) {
        exchange_with(url, wait, None).await;
    }

    /// 100 frames from 4 concurrent senders arrive whole, each sender's in
    /// order; the large ones into recycled buffers when `pool` is given.
    async fn exchange_with(url: &str, wait: WaitStrategy, pool: Option<FramePool>) {
        exchange_over(pair(url).await, wait, pool).await;
    }

    async fn exchange_over(
        (server, client): (crate::Connection, crate::Connection),
        wait: WaitStrategy,
        pool: Option<FramePool>,
    ) {
        let (writer, flusher) = FrameWriter::new(client.writer);
        let flusher = tokio::spawn(flusher);
        let senders: Vec<_> = (0..4u8)
            .map(|k| {
                let writer = writer.clone();
                tokio::spawn(async move {
                    for i in 0..25usize {
                        let m = Message::binary(vec![k; i * 3000], None)
                            .with_subject(format!("{k}/{i}"));
                        writer
                            .send(codec::encode(&m, 1 << 24).unwrap())
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        let mut r = FrameReader::new(server.reader, 1 << 24);
        r.set_wait_strategy(wait);
        if let Some(pool) = pool {
            r.recycle_large_frames(pool);
        }
        let mut next = [0usize; 4];
        for _ in 0..100 {
            match r.next().await.unwrap() {
                Some(Decoded::Message(got)) => {
                    let (k, i) = got.subject.as_deref().unwrap().split_once('/').unwrap();
                    let (k, i): (usize, usize) = (k.parse().unwrap(), i.parse().unwrap());
                    assert_eq!(i, next[k], "sender {k} out of order");
                    next[k] += 1;
                    assert_eq!(got.payload.len(), i * 3000);
                    assert!(got.payload.iter().all(|&b| usize::from(b) == k));
                }
                other => panic!("{other:?}"),
            }
        }
        for s in senders {
            s.await.unwrap();
        }
        let stats = writer.stats();
        assert_eq!((stats.frames, stats.accepted), (100, 100));
        drop(writer);
        assert!(
            r.next().await.unwrap().is_none(),
            "close flushes, then ends the stream"
        );
        flusher.await.unwrap().unwrap();
    }

    /// A reader that has part of a frame spins for the rest longer than
    /// between frames: over shared memory at least [`MID_FRAME_SPIN`] if
    /// its strategy spins at all; over a socket whose peer is on this
    /// machine at least [`LOCAL_MID_FRAME_SPIN`], with `park` too. Between
    /// frames each keeps its strategy, and busy-spin spins for ever.
    #[tokio::test]
    async fn a_reader_spins_longer_for_the_rest_of_a_frame() {
        let short = Duration::from_micros(20);
        assert_eq!(
            budgets_mid_frame(&shm_url("midframe"), short).await,
            [
                Some(short),
                Some(MID_FRAME_SPIN),
                Some(Duration::ZERO),
                Some(short)
            ]
        );
        let p = std::env::temp_dir().join(format!("tw-mid-{}.sock", std::process::id()));
        let unix = format!("unix://{}", p.display());
        for url in ["tcp://127.0.0.1:0", unix.as_str(), "mem://framed-midframe"] {
            assert_eq!(
                budgets_mid_frame(url, short).await,
                [
                    Some(short),
                    Some(LOCAL_MID_FRAME_SPIN),
                    Some(LOCAL_MID_FRAME_SPIN),
                    Some(short)
                ],
                "{url}"
            );
        }
    }

    /// Skipping the rest of a frame too large is being in the middle of one.
    #[tokio::test]
    async fn a_reader_of_shared_memory_skipping_a_frame_spins_longer_for_its_rest() {
        let short = Duration::from_micros(20);
        let (server, client) = pair(&shm_url("midskip")).await;
        let mut r = FrameReader::new(server.reader, 1000);
        r.set_wait_strategy(WaitStrategy::SpinPark { spin: short });
        let frame = codec::encode(&Message::binary(vec![3u8; 4000], None), 1 << 20).unwrap();
        let head = [&frame.head[..], &frame.payload[..500]].concat();
        let w = &client.writer;
        let n = within(poll_fn(|cx| {
            w.poll_write_vectored_some(cx, &[IoSlice::new(&head)])
        }))
        .await
        .unwrap();
        assert_eq!(n, head.len());
        match within(r.next()).await.unwrap() {
            Some(Decoded::TooLarge { .. }) => {}
            other => panic!("expected the frame refused, got {other:?}"),
        }
        // Once the bytes read are skipped, the rest is still to come.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let next = std::future::Future::poll(std::pin::pin!(r.next()), &mut cx);
        assert!(next.is_pending());
        assert!(!r.has_buffered());
        assert_eq!(r.budget(), Some(MID_FRAME_SPIN));
    }

    /// The budgets of a reader spinning `short` between frames: before a
    /// frame, with part of it read (and so with `park`), and once it is
    /// whole.
    async fn budgets_mid_frame(url: &str, short: Duration) -> [Option<Duration>; 4] {
        let (server, client) = pair(url).await;
        let mut r = FrameReader::new(server.reader, 1 << 20);
        r.set_wait_strategy(WaitStrategy::SpinPark { spin: short });
        let before = r.budget();
        r.set_wait_strategy(WaitStrategy::PARK);
        assert!(!r.spins(), "{url}: between frames, park sleeps at once");
        r.set_wait_strategy(WaitStrategy::SpinPark { spin: short });

        let frame = codec::encode(&Message::binary(vec![3u8; 4000], None), 1 << 20).unwrap();
        let bytes: Vec<u8> = [&frame.head[..], &frame.payload[..]].concat();
        let (first, rest) = bytes.split_at(100);
        let write = |part: &[u8]| {
            let mut left = part.to_vec();
            let w = &client.writer;
            async move {
                while !left.is_empty() {
                    let n = poll_fn(|cx| w.poll_write_vectored_some(cx, &[IoSlice::new(&left)]))
                        .await
                        .unwrap();
                    left.drain(..n);
                }
            }
        };
        write(first).await;
        let got = within(poll_fn(|cx| r.poll_fill(cx))).await.unwrap();
        assert!(got > 0 && got < bytes.len());
        let mid = r.budget();
        r.set_wait_strategy(WaitStrategy::PARK);
        let mid_park = r.budget();
        // What the wait does follows the budget.
        assert_eq!(r.spins(), mid_park != Some(Duration::ZERO), "{url}");
        r.set_wait_strategy(WaitStrategy::BusySpin);
        assert_eq!(r.budget(), None);
        r.set_wait_strategy(WaitStrategy::SpinPark { spin: short });

        write(rest).await;
        match within(r.next()).await.unwrap().unwrap() {
            Decoded::Message(m) => assert_eq!(m.payload.len(), 4000),
            other => panic!("expected the message, got {other:?}"),
        }
        [before, mid, mid_park, r.budget()]
    }

    #[tokio::test]
    async fn frames_over_tcp() {
        exchange("tcp://127.0.0.1:0", WaitStrategy::PARK).await;
    }

    #[tokio::test]
    async fn frames_over_unix() {
        let p = std::env::temp_dir().join(format!("tw-t-{}.sock", std::process::id()));
        exchange(&format!("unix://{}", p.display()), WaitStrategy::PARK).await;
    }

    #[tokio::test]
    async fn frames_over_mem() {
        exchange("mem://framed-test", WaitStrategy::PARK).await;
    }

    fn shm_url(tag: &str) -> String {
        format!("shm://tw-{tag}-{}", std::process::id())
    }

    #[tokio::test]
    async fn frames_over_shm() {
        exchange(&shm_url("park"), WaitStrategy::PARK).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_over_shm_spinning_and_tiny_rings() {
        // 64-byte rings: every frame streams through in many pieces.
        let url = format!("{}?ring=64", shm_url("tiny"));
        exchange(&url, WaitStrategy::BusySpin).await;
        exchange(
            &shm_url("spinpark"),
            WaitStrategy::SpinPark {
                spin: std::time::Duration::from_micros(30),
            },
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spinning_readers_get_every_frame() {
        exchange("mem://framed-spin", WaitStrategy::BusySpin).await;
        exchange(
            "mem://framed-spin-park",
            WaitStrategy::SpinPark {
                spin: std::time::Duration::from_micros(30),
            },
        )
        .await;
        exchange(
            "mem://framed-spin-yield",
            WaitStrategy::SpinYield {
                spin: std::time::Duration::from_micros(30),
            },
        )
        .await;
    }

    /// A reader spinning on a current-thread runtime lets the runtime look
    /// at its reactor at the end of each slice of spinning, and at each
    /// poll once a `spin-yield` budget is spent: I/O that another task of
    /// its thread waits for (a flusher waiting for room, say) is seen after
    /// a poll or two, not after 61 polls of the spinning reader.
    #[tokio::test(flavor = "current_thread")]
    async fn a_spinning_reader_lets_its_thread_see_other_io() {
        let past_budget = WaitStrategy::SpinYield {
            spin: std::time::Duration::from_micros(1),
        };
        for (tag, wait) in [("busy", WaitStrategy::BusySpin), ("yield", past_budget)] {
            sees_other_io(&format!("mem://framed-spin-driver-{tag}"), wait).await;
        }
    }

    async fn sees_other_io(url: &str, wait: WaitStrategy) {
        let (server, _client) = pair(url).await;
        let mut r = FrameReader::new(server.reader, 1 << 20);
        r.set_wait_strategy(wait);
        let polls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = polls.clone();
        let spinning = tokio::spawn(std::future::poll_fn(move |cx| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let next = std::pin::pin!(r.next());
            std::future::Future::poll(next, cx).map(|_| ())
        }));
        // Readable before it is registered: only a look at the reactor tells.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &a, b"!").unwrap();
        b.set_nonblocking(true).unwrap();
        let b = tokio::net::UnixStream::from_std(b).unwrap();
        b.readable().await.unwrap();
        let seen_after = polls.load(std::sync::atomic::Ordering::Relaxed);
        spinning.abort();
        assert!(
            seen_after <= 8,
            "{url}: the reactor was polled after {seen_after} polls of the spinning reader"
        );
    }

    /// In-turn polls this thread has made so far.
    fn turns() -> u32 {
        THREAD_TURNS.with(|t| t.polls.get())
    }

    /// Polls `r` once for a frame, with a waker that does nothing.
    fn poll_once(r: &mut FrameReader) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let next = std::pin::pin!(r.next());
        std::future::Future::poll(next, &mut cx).is_pending()
    }

    /// Readers of `group`, over fresh shm connections whose writers are
    /// returned too (nothing is sent).
    async fn readers(
        tag: &str,
        n: usize,
        group: &SpinGroup,
        wait: WaitStrategy,
    ) -> Vec<(FrameReader, crate::Connection)> {
        let mut out = Vec::new();
        for i in 0..n {
            let (server, client) = pair(&shm_url(&format!("{tag}{i}"))).await;
            let mut r = FrameReader::new(server.reader, 1 << 20);
            r.set_wait_strategy(wait);
            r.join_spin_group(group);
            out.push((r, client));
        }
        out
    }

    #[tokio::test]
    async fn readers_outnumbering_their_threads_look_once_per_poll() {
        let forever = WaitStrategy::SpinPark {
            spin: std::time::Duration::from_secs(3600),
        };
        // Two readers, one thread: each poll of an empty stream is one look,
        // then the task wakes itself for its next turn.
        let crowded = SpinGroup::new(1);
        let mut two = readers("turn", 2, &crowded, forever).await;
        assert_eq!(crowded.members(), 2);
        let before = turns();
        for _ in 0..10 {
            for (r, _) in &mut two {
                assert!(poll_once(r));
                assert!(r.woke_itself());
            }
        }
        assert_eq!(turns() - before, 20);

        // Two readers, two threads: each spins in place, not in turn.
        let roomy = SpinGroup::new(2);
        let mut alone = readers("place", 2, &roomy, forever).await;
        let before = turns();
        assert!(poll_once(&mut alone[0].0));
        assert_eq!(turns(), before);

        // Leaving a group is dropping the reader.
        drop(two.pop());
        assert_eq!(crowded.members(), 1);
    }

    #[tokio::test]
    async fn a_reader_in_turn_parks_once_its_budget_is_spent() {
        let group = SpinGroup::new(1);
        let short = WaitStrategy::SpinPark {
            spin: std::time::Duration::from_micros(1),
        };
        let mut rs = readers("parks", 2, &group, short).await;
        let give_up = Instant::now() + std::time::Duration::from_secs(10);
        let mut polls = 0;
        // Each poll is one look in turn, woken by itself, until the budget
        // is spent; then it is pending on the doorbell, not woken by itself.
        loop {
            let before = turns();
            assert!(poll_once(&mut rs[0].0));
            assert_eq!(turns() - before, 1, "the reader did not wait in turn");
            polls += 1;
            if !rs[0].0.woke_itself() {
                break;
            }
            assert!(Instant::now() < give_up, "no park after {polls} polls");
        }
        assert!(polls > 1, "parked before its budget was spent");
    }

    /// Sends frames on `conn` from a thread of its own, `n` of them (or
    /// until the peer is gone) once `go` says so.
    fn send_from_a_thread(
        conn: crate::Connection,
        n: usize,
        go: impl Fn() -> bool + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        on_a_thread(move || async move {
            let conn = conn.reregister().unwrap();
            let (writer, flusher) = FrameWriter::new(conn.writer);
            tokio::spawn(flusher);
            while !go() {
                tokio::task::yield_now().await;
            }
            let frame = codec::encode(&Message::binary(vec![1; 16], None), 1 << 20).unwrap();
            for _ in 0..n {
                if writer.send(frame.clone()).await.is_err() {
                    return;
                }
            }
        })
    }

    /// Runs `body` on a thread of its own, in a current-thread runtime.
    fn on_a_thread<F>(body: impl FnOnce() -> F + Send + 'static) -> std::thread::JoinHandle<()>
    where
        F: std::future::Future<Output = ()>,
    {
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(body());
        })
    }

    /// A reader whose peer never stops sending never waits, so it must give
    /// the other readers of its thread their turns by itself.
    #[test]
    fn a_reader_with_endless_input_lets_the_others_of_its_thread_read() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let (done, finished) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flood = stop.clone();
        on_a_thread(move || async move {
            let group = SpinGroup::new(1);
            let mut rs = readers("fair", 2, &group, WaitStrategy::BusySpin).await;
            let (mut quiet, quiet_peer) = rs.pop().unwrap();
            let (mut flooded, flood_peer) = rs.pop().unwrap();
            let seen = Arc::new(AtomicUsize::new(0));
            let flooding = {
                let stop = stop_flood.clone();
                send_from_a_thread(flood_peer, usize::MAX, move || {
                    !stop.load(Ordering::Relaxed)
                })
            };
            let seen_by_flood = seen.clone();
            tokio::spawn(async move {
                while let Ok(Some(_)) = flooded.next().await {
                    seen_by_flood.fetch_add(1, Ordering::Relaxed);
                    // Slower than its peer, as a busy connection is:
                    // its ring never runs dry.
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(5) {
                        std::hint::spin_loop();
                    }
                }
            });
            // The quiet peer's one frame comes while the flood is read.
            let seen_now = seen.clone();
            let quiet_sender = send_from_a_thread(quiet_peer, 1, move || {
                seen_now.load(Ordering::Relaxed) > 1_000
            });
            let got = quiet.next().await.unwrap();
            assert!(matches!(got, Some(Decoded::Message(_))));
            stop_flood.store(true, Ordering::Relaxed);
            let _ = done.send(());
            drop(quiet_sender);
            drop(flooding);
        });
        let r = finished.recv_timeout(std::time::Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        assert!(r.is_ok(), "the quiet reader got no frame: {r:?}");
    }

    /// Three connections served by one current-thread runtime, their
    /// readers busy-spinning in turn: every frame of each arrives.
    #[tokio::test]
    async fn readers_in_turn_on_one_thread_get_every_frame() {
        let group = SpinGroup::new(1);
        let rs = readers("every", 3, &group, WaitStrategy::BusySpin).await;
        let before = turns();
        let mut tasks = Vec::new();
        for (k, (mut r, client)) in rs.into_iter().enumerate() {
            let (writer, flusher) = FrameWriter::new(client.writer);
            tasks.push(tokio::spawn(async move {
                let _ = flusher.await;
            }));
            // Readers first, and writers that let them catch up after each
            // frame, so that the readers find their rings empty and wait.
            tasks.push(tokio::spawn(async move {
                for i in 0..50usize {
                    match r.next().await.unwrap() {
                        Some(Decoded::Message(m)) => {
                            assert_eq!(m.payload, vec![k as u8; i * 100]);
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }));
            tasks.push(tokio::spawn(async move {
                for i in 0..50usize {
                    let m = Message::binary(vec![k as u8; i * 100], None);
                    writer
                        .send(codec::encode(&m, 1 << 20).unwrap())
                        .await
                        .unwrap();
                    tokio::task::yield_now().await;
                }
            }));
        }
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .unwrap();
        // The test's runtime is this thread: its readers waited here, in turn.
        assert!(turns() > before, "the readers never waited in turn");
    }

    /// An idle writer writes on the sender's own task, without the flusher.
    /// Polls `r`'s fill until it has read something.
    async fn fill(r: &mut FrameReader) -> usize {
        within(poll_fn(|_| r.try_fill_now())).await.unwrap()
    }

    #[tokio::test]
    async fn a_small_frame_alone_in_a_record_is_decoded_where_it_lies() {
        let (server, client) = pair(&shm_url("whole")).await;
        let mut r = FrameReader::new(server.reader, 1 << 20);
        let w = &client.writer;
        let write = |bytes: Vec<u8>| async move {
            let n = poll_fn(|cx| w.poll_write_vectored_some(cx, &[IoSlice::new(&bytes)]))
                .await
                .unwrap();
            assert_eq!(n, bytes.len(), "one record");
        };
        let frame = |text: &str| {
            let f = codec::encode(&Message::plain_text(text), 1 << 20).unwrap();
            [&f.head[..], &f.payload[..]].concat()
        };
        let text = |d: Option<Decoded>| match d {
            Some(Decoded::Message(m)) => m.text_payload().unwrap().into_owned(),
            other => panic!("{other:?}"),
        };

        // Alone in its record: decoded in place, never in the buffer.
        write(frame("alone")).await;
        let n = fill(&mut r).await;
        assert_eq!(n, frame("alone").len());
        assert!(r.ready.is_some() && r.buf.is_empty());
        assert_eq!(text(r.next().await.unwrap()), "alone");

        // Two in one record, half of one, one over the size decoded in
        // place: through the buffer, as any stream.
        write([frame("one"), frame("two")].concat()).await;
        let big = frame(&"x".repeat(2000));
        write(big[..50].to_vec()).await;
        write(big[50..].to_vec()).await;
        for expected in ["one", "two"] {
            assert_eq!(text(within(r.next()).await.unwrap()), expected);
        }
        assert_eq!(text(within(r.next()).await.unwrap()).len(), 2000);
        assert!(r.ready.is_none() && r.buf.is_empty());
    }

    #[tokio::test]
    async fn idle_writer_writes_directly() {
        let (server, client) = pair("mem://framed-direct").await;
        // The flusher is never run: every frame must go out directly.
        let (writer, _flusher) = FrameWriter::new(client.writer);
        let mut r = FrameReader::new(server.reader, 1 << 20);
        for i in 0..10 {
            let m = Message::plain_text(format!("m{i}"));
            writer
                .send(codec::encode(&m, 1 << 20).unwrap())
                .await
                .unwrap();
            match r.next().await.unwrap() {
                Some(Decoded::Message(got)) => {
                    assert_eq!(got.text_payload().unwrap(), format!("m{i}"))
                }
                other => panic!("{other:?}"),
            }
        }
        let stats = writer.stats();
        assert_eq!((stats.direct, stats.accepted), (10, 10));
    }

    /// A thread may sleep on a socket itself until it is readable, outside
    /// the reactor; the reader then reads what came although the reactor
    /// has not seen it. Shared memory does not wait so.
    #[tokio::test]
    async fn a_reader_waits_on_the_socket_outside_the_reactor() {
        let p = std::env::temp_dir().join(format!("tw-w-{}.sock", std::process::id()));
        let unix = format!("unix://{}", p.display());
        for url in ["tcp://127.0.0.1:0", unix.as_str(), "mem://framed-wait"] {
            let (server, client) = pair(url).await;
            let (writer, _flusher) = FrameWriter::new(client.writer);
            let mut r = FrameReader::new(server.reader, 1 << 20);
            // Nothing comes: woken by the deadline; once it has passed, no
            // sleep at all.
            let soon = Instant::now() + std::time::Duration::from_millis(20);
            assert!(r.wait_readable(Some(soon)).unwrap(), "{url}");
            assert!(Instant::now() >= soon, "{url}");
            // A Unix socket sleeps in a blocking `recv`: the runtime's
            // reads need it non-blocking again after.
            assert!(r.reader.is_nonblocking(), "{url}");
            assert!(!r.wait_readable(Some(soon)).unwrap(), "{url}");
            let m = Message::plain_text("woke");
            writer
                .send(codec::encode(&m, 1 << 20).unwrap())
                .await
                .unwrap();
            assert!(r.wait_readable(None).unwrap(), "{url}");
            assert!(r.reader.is_nonblocking(), "{url}");
            // Polled once, without the runtime having had a turn.
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let polled = std::future::Future::poll(std::pin::pin!(r.next()), &mut cx);
            match polled {
                Poll::Ready(Ok(Some(Decoded::Message(got)))) => {
                    assert_eq!(got.text_payload().unwrap(), "woke", "{url}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let (server, _client) = pair(&shm_url("wait")).await;
        let mut r = FrameReader::new(server.reader, 1 << 20);
        assert!(!r.wait_readable(None).unwrap());
    }

    /// A busy-spinning reader of `server`, what sends it a text from
    /// `client`, and a task's waker that counts its wake-ups.
    struct Lending {
        writer: FrameWriter,
        r: FrameReader,
        wakes: std::sync::Arc<Wakes>,
        task: std::task::Waker,
    }

    impl Lending {
        fn new(server: crate::Connection, client: crate::Connection) -> Lending {
            let (writer, flusher) = FrameWriter::new(client.writer);
            tokio::spawn(flusher);
            let mut r = FrameReader::new(server.reader, 1 << 20);
            r.set_wait_strategy(WaitStrategy::BusySpin);
            let (wakes, task) = Wakes::new();
            Lending {
                writer,
                r,
                wakes,
                task,
            }
        }

        async fn send(&self, text: &str) {
            let frame = codec::encode(&Message::plain_text(text), 1 << 20).unwrap();
            self.writer.send(frame).await.unwrap();
        }

        /// Puts the reader to sleep, for the task of `task`.
        fn sleep(&mut self, url: &str) {
            self.r.sleep_next();
            let polled = std::future::Future::poll(
                std::pin::pin!(self.r.next()),
                &mut Context::from_waker(&self.task),
            );
            assert!(polled.is_pending() && !self.r.woke_itself(), "{url}");
        }

        /// Polls the reader with a waker that wakes nothing, as a borrower
        /// does, until it reads a message, which must be `text`.
        fn borrow_next(&mut self, url: &str, text: &str) {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let polled = std::future::Future::poll(std::pin::pin!(self.r.next()), &mut cx);
                match polled {
                    Poll::Ready(Ok(Some(Decoded::Message(m)))) => {
                        assert_eq!(m.text_payload().unwrap(), text, "{url}");
                        return;
                    }
                    Poll::Pending => assert!(Instant::now() < deadline, "{url}: no answer"),
                    other => panic!("{url}: {other:?}"),
                }
            }
        }

        /// The next message, as the task reads it: polled at each of its
        /// wake-ups (a wake-up from before, such as the one a socket's
        /// reactor made for a borrower's frame, counts too). It must be `text`.
        async fn woken_next(&mut self, url: &str, text: &str) {
            let mut seen = 0;
            loop {
                let woken = self.wakes.woken_since(seen).await;
                assert!(woken, "{url}: the sleeping task was not woken");
                seen = self.wakes.count();
                let polled = std::future::Future::poll(
                    std::pin::pin!(self.r.next()),
                    &mut Context::from_waker(&self.task),
                );
                match polled {
                    Poll::Ready(Ok(Some(Decoded::Message(m)))) => {
                        assert_eq!(m.text_payload().unwrap(), text, "{url}");
                        return;
                    }
                    Poll::Pending => assert!(!self.r.woke_itself(), "{url}"),
                    other => panic!("{url}: {other:?}"),
                }
            }
        }
    }

    fn lend_urls(tag: &str) -> [String; 4] {
        let p = std::env::temp_dir().join(format!("tw-{tag}-{}.sock", std::process::id()));
        [
            "tcp://127.0.0.1:0".into(),
            format!("unix://{}", p.display()),
            format!("mem://framed-{tag}"),
            shm_url(tag),
        ]
    }

    /// A reader asleep, lent to someone who polls it for one frame with a
    /// waker that wakes nothing, then taken back, sleeps as it was: the
    /// next frame wakes the task it slept for. On shared memory that takes
    /// the request for a doorbell withdrawn for the lend, and made again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_reader_goes_back_to_sleep_as_it_was() {
        for url in lend_urls("lend") {
            let (server, client) = pair(&url).await;
            let mut l = Lending::new(server, client);
            l.sleep(&url);
            let lent = l.r.lend();
            l.send("answer").await;
            l.borrow_next(&url, "answer");
            assert!(l.r.take_back(lent), "{url}");
            l.send("after").await;
            l.woken_next(&url, "after").await;
        }
    }

    /// A reader whose borrower waited on the stream itself is not put back
    /// to sleep: the stream may hold the borrower's waker, which wakes
    /// nothing. Its owner polls it, which registers the owner's waker, and
    /// the next frame wakes the owner.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_reader_whose_borrower_waited_is_polled_by_its_task() {
        for url in lend_urls("lend-waited") {
            let (server, client) = pair(&url).await;
            let mut l = Lending::new(server, client);
            l.r.set_wait_strategy(WaitStrategy::PARK);
            l.sleep(&url);
            let lent = l.r.lend();
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let polled = std::future::Future::poll(std::pin::pin!(l.r.next()), &mut cx);
            assert!(polled.is_pending(), "{url}");
            l.send("answer").await;
            l.borrow_next(&url, "answer");
            assert!(!l.r.take_back(lent), "{url}");
            // Woken by its borrower, the task polls it.
            let polled = std::future::Future::poll(
                std::pin::pin!(l.r.next()),
                &mut Context::from_waker(&l.task),
            );
            assert!(polled.is_pending(), "{url}");
            l.send("after").await;
            l.woken_next(&url, "after").await;
        }
    }

    /// A borrower that finds its answer without waiting (it was there at
    /// its first look) registers nothing: the reader is taken back asleep,
    /// for its owner, whom the next frame wakes. On shared memory, where
    /// the answer is in the ring once written; a socket's reader counts a
    /// look the reactor has not caught up with as a wait (see
    /// `ReadHalf::waited_since_withdraw`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_reader_whose_borrower_did_not_wait_sleeps_for_its_owner() {
        let url = shm_url("lend-found");
        let (server, client) = pair(&url).await;
        let mut r = FrameReader::new(server.reader, 1 << 20);
        let (wakes, task) = Wakes::new();
        let poll = |r: &mut FrameReader, waker: &std::task::Waker| {
            std::future::Future::poll(std::pin::pin!(r.next()), &mut Context::from_waker(waker))
        };
        let write = |text: &str| {
            let frame = codec::encode(&Message::plain_text(text), 1 << 20).unwrap();
            let bytes = [&frame.head[..], &frame.payload[..]].concat();
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let written = client
                .writer
                .poll_write_vectored_some(&mut cx, &[IoSlice::new(&bytes)]);
            assert!(matches!(written, Poll::Ready(Ok(n)) if n == bytes.len()));
        };
        assert!(poll(&mut r, &task).is_pending());
        let lent = r.lend();
        write("answer");
        match poll(&mut r, std::task::Waker::noop()) {
            Poll::Ready(Ok(Some(Decoded::Message(m)))) => {
                assert_eq!(m.text_payload().unwrap(), "answer");
            }
            other => panic!("{other:?}"),
        }
        assert!(r.take_back(lent));
        let before = wakes.count();
        write("after");
        assert!(wakes.woken_since(before).await, "the owner was not woken");
        match poll(&mut r, &task) {
            Poll::Ready(Ok(Some(Decoded::Message(m)))) => {
                assert_eq!(m.text_payload().unwrap(), "after");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Sockets the reactor watches only on demand carry what others do, read
    /// by a reader that sleeps and by one that spins, and written faster
    /// than read (so that writes wait for room).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_over_on_demand_sockets() {
        let p = std::env::temp_dir().join(format!("tw-od-{}.sock", std::process::id()));
        let unix = format!("unix://{}", p.display());
        for url in ["tcp://127.0.0.1:0", unix.as_str(), "mem://framed-on-demand"] {
            for wait in [WaitStrategy::PARK, WaitStrategy::BusySpin] {
                let (server, client) = pair(url).await;
                let on_demand = (
                    server.watch_on_demand().unwrap(),
                    client.watch_on_demand().unwrap(),
                );
                within(exchange_over(on_demand, wait, None)).await;
            }
        }
    }

    /// An on-demand socket is registered with the reactor while its reader
    /// sleeps, and not after a lend: taken back, the reader sleeps
    /// unwatched (nothing wakes its task), until its next poll registers
    /// it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_on_demand_reader_sleeps_unwatched_until_polled() {
        for url in ["tcp://127.0.0.1:0", "mem://framed-lend-on-demand"] {
            let (server, client) = pair(url).await;
            let server = server.watch_on_demand().unwrap();
            let mut l = Lending::new(server, client);
            let poll = |r: &mut FrameReader, waker: &std::task::Waker| {
                std::future::Future::poll(std::pin::pin!(r.next()), &mut Context::from_waker(waker))
            };
            l.r.sleep_next();
            assert!(poll(&mut l.r, &l.task).is_pending(), "{url}");
            assert!(l.r.watched(), "{url}: asleep, registered");
            let lent = l.r.lend();
            l.send("answer").await;
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            loop {
                match poll(&mut l.r, std::task::Waker::noop()) {
                    Poll::Ready(Ok(Some(Decoded::Message(m)))) => {
                        assert_eq!(m.text_payload().unwrap(), "answer");
                        break;
                    }
                    Poll::Pending => assert!(Instant::now() < deadline, "{url}: no answer"),
                    other => panic!("{url}: {other:?}"),
                }
            }
            assert!(l.r.take_back(lent), "{url}");
            assert!(!l.r.watched(), "{url}: asleep, not registered");
            // Polled again (the task's timer, in the client), it reads
            // what came meanwhile, then sleeps registered: the next frame
            // wakes its task.
            l.send("meanwhile").await;
            let got = within(async {
                loop {
                    match poll(&mut l.r, &l.task) {
                        Poll::Ready(Ok(Some(Decoded::Message(m)))) => break m,
                        Poll::Pending => {
                            tokio::time::sleep(std::time::Duration::from_millis(1)).await
                        }
                        other => panic!("{url}: {other:?}"),
                    }
                }
            })
            .await;
            assert_eq!(got.text_payload().unwrap(), "meanwhile", "{url}");
            let before = l.wakes.count();
            assert!(poll(&mut l.r, &l.task).is_pending(), "{url}");
            assert!(l.r.watched(), "{url}: asleep, registered again");
            l.send("after").await;
            let woken = l.wakes.woken_since(before).await;
            assert!(woken, "{url}: the sleeping task was not woken");
            match poll(&mut l.r, &l.task) {
                Poll::Ready(Ok(Some(Decoded::Message(m)))) => {
                    assert_eq!(m.text_payload().unwrap(), "after", "{url}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    /// A peer that stops reading fills the queue; senders then wait instead of
    /// growing memory, and carry on once the peer reads again.
    #[tokio::test]
    async fn stalled_peer_pushes_back() {
        let (server, client) = pair("mem://framed-stall").await;
        let (writer, flusher) = FrameWriter::new(client.writer);
        tokio::spawn(flusher);
        let frame =
            || codec::encode(&Message::binary(vec![7u8; 256 * 1024], None), 1 << 20).unwrap();
        // Fill the socket buffer and the queue.
        let mut sent = 0usize;
        loop {
            let w = writer.clone();
            let f = frame();
            match tokio::time::timeout(std::time::Duration::from_millis(200), async move {
                w.send(f).await
            })
            .await
            {
                Ok(r) => {
                    r.unwrap();
                    sent += 1;
                    assert!(sent < 1000, "the queue never pushed back");
                }
                Err(_) => break,
            }
        }
        assert!(
            !writer.try_send(frame()).unwrap(),
            "a full queue refuses try_send"
        );
        // Queued frames count as accepted before they are written; the
        // refused one, and the send given up while it waited, do not.
        let stats = writer.stats();
        assert_eq!(stats.accepted, sent as u64);
        assert!(stats.frames < stats.accepted, "{stats:?}");
        let mut r = FrameReader::new(server.reader, 1 << 20);
        let reader = tokio::spawn(async move {
            let mut n = 0;
            while let Some(Decoded::Message(_)) = r.next().await.unwrap() {
                n += 1;
            }
            n
        });
        writer.send(frame()).await.unwrap();
        assert_eq!(writer.stats().accepted, sent as u64 + 1);
        drop(writer);
        assert_eq!(reader.await.unwrap(), sent + 1);
    }

    #[tokio::test]
    async fn writer_fails_once_the_peer_is_gone() {
        let (server, client) = pair("mem://framed-gone").await;
        let (writer, flusher) = FrameWriter::new(client.writer);
        let flusher = tokio::spawn(flusher);
        drop(server);
        let frame =
            || codec::encode(&Message::binary(vec![1u8; 64 * 1024], None), 1 << 20).unwrap();
        let mut failed = false;
        for _ in 0..100 {
            if writer.send(frame()).await.is_err() {
                failed = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(failed, "sending to a closed peer must fail");
        assert!(flusher.await.unwrap().is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_frames_into_recycled_buffers_over_every_transport() {
        let p = std::env::temp_dir().join(format!("tw-pool-{}.sock", std::process::id()));
        for wait in [WaitStrategy::PARK, WaitStrategy::BusySpin] {
            for url in [
                "tcp://127.0.0.1:0".to_owned(),
                format!("unix://{}", p.display()),
                "mem://framed-pool-all".to_owned(),
                format!("{}?ring=16KiB", shm_url("pool")),
            ] {
                // Frames from 10 KB up go into the pool's buffers.
                let pool = FramePool::new(10_000, 1 << 20);
                exchange_with(&url, wait, Some(pool.clone())).await;
                assert!(
                    pool.held() > 0,
                    "{url}, {wait}: dropped messages give their buffers back"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_recycled_buffer_is_used_again_and_the_pool_is_bounded() {
        let (server, client) = pair("mem://framed-pool-reuse").await;
        let (writer, flusher) = FrameWriter::new(client.writer);
        let flusher = tokio::spawn(flusher);
        for (fill, len) in [(1u8, 100_000), (2, 100_000), (3, 10), (4, 500_000)] {
            let m = Message::binary(vec![fill; len], None);
            writer
                .send(codec::encode(&m, 1 << 24).unwrap())
                .await
                .unwrap();
        }
        let pool = FramePool::new(1000, 300_000);
        let mut r = FrameReader::new(server.reader, 1 << 24);
        r.recycle_large_frames(pool.clone());
        async fn next(r: &mut FrameReader) -> Message {
            match r.next().await.unwrap() {
                Some(Decoded::Message(m)) => *m,
                other => panic!("{other:?}"),
            }
        }
        let first = next(&mut r).await;
        assert!(first.payload.iter().all(|&b| b == 1) && first.payload.len() == 100_000);
        let at = first.payload.as_ptr();
        assert_eq!(pool.held(), 0);
        drop(first);
        assert!(pool.held() >= 100_000, "the buffer came back");
        let second = next(&mut r).await;
        assert!(second.payload.iter().all(|&b| b == 2) && second.payload.len() == 100_000);
        assert_eq!(second.payload.as_ptr(), at, "the same memory, used again");
        assert_eq!(pool.held(), 0);
        let small = next(&mut r).await;
        assert_eq!(&small.payload[..], &[3u8; 10]);
        let big = next(&mut r).await;
        assert!(big.payload.iter().all(|&b| b == 4) && big.payload.len() == 500_000);
        drop(big);
        assert_eq!(pool.held(), 0, "larger than the bound: not kept");
        drop(second);
        assert!(pool.held() >= 100_000);
        drop(writer);
        assert!(r.next().await.unwrap().is_none());
        flusher.await.unwrap().unwrap();
    }

    /// `next` may be dropped mid-frame (a timeout, a select): the part of
    /// a large frame read so far is kept for the next call.
    #[tokio::test]
    async fn a_large_frame_survives_a_cancelled_read() {
        let (server, mut client) = pair("mem://pool-cancel-test").await;
        let m = Message::binary(vec![7u8; 200_000], None);
        let bytes = codec::encode(&m, 1 << 20).unwrap().to_vec();
        let mut r = FrameReader::new(server.reader, 1 << 20);
        r.recycle_large_frames(FramePool::new(1000, 1 << 20));
        client.writer.write_all(&bytes[..80_000]).await.unwrap();
        let cut = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(cut, r.next()).await.is_err());
        assert!(r.has_buffered());
        client.writer.write_all(&bytes[80_000..]).await.unwrap();
        match r.next().await.unwrap() {
            Some(Decoded::Message(got)) => {
                assert_eq!(got.payload.len(), 200_000);
                assert!(got.payload.iter().all(|&b| b == 7));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_large_frame_cut_short_is_an_error() {
        let (server, mut client) = pair("mem://pool-eof-test").await;
        let m = Message::binary(vec![9u8; 100_000], None);
        let bytes = codec::encode(&m, 1 << 20).unwrap().to_vec();
        client.writer.write_all(&bytes[..50_000]).await.unwrap();
        client.writer.shutdown().unwrap();
        let mut r = FrameReader::new(server.reader, 1 << 20);
        r.recycle_large_frames(FramePool::new(1000, 1 << 20));
        assert!(matches!(
            r.next().await,
            Err(ReadError::UnexpectedEof(50_000))
        ));
    }

    #[tokio::test]
    async fn eof_mid_frame_is_an_error() {
        let (server, mut client) = pair("mem://eof-test").await;
        let bytes = codec::encode(&Message::plain_text("abc"), 1024)
            .unwrap()
            .to_vec();
        client
            .writer
            .write_all(&bytes[..bytes.len() - 1])
            .await
            .unwrap();
        client.writer.shutdown().unwrap();
        let mut r = FrameReader::new(server.reader, 1024);
        assert!(matches!(r.next().await, Err(ReadError::UnexpectedEof(_))));
    }

    #[tokio::test]
    async fn stale_unix_socket_is_replaced_live_one_is_not() {
        let p = std::env::temp_dir().join(format!("tw-stale-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap()); // leaves the file behind
        let url = Url::Unix(p.clone());
        let l = Listener::bind(&url).await.unwrap();
        assert!(Listener::bind(&url).await.is_err());
        drop(l);
        assert!(!p.exists());
    }
}
