//! The writing end of a ring.

use std::cell::Cell;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::error::{Corrupt, TryWriteError, WriteMessageError, WriteSomeError};
use crate::layout::CACHE_LINE;
use crate::parts;
use crate::record::{self, FLAG_MORE, FLAG_PADDING};
use crate::ring::Ring;
use crate::sync::{fence, Ordering};
use crate::wait::{self, Doorbell, Sleeper, Spun, WaitStrategy, Wake, DOORBELL, FUTEX};

/// Records up to this size (header included) are demoted to the shared
/// cache once published (see [`Ring::demote`]). Over shm, a 64-byte call
/// through the broker took 1.08-1.10 µs with the demotion and 1.15-1.17 µs
/// without; demoting every record cut 200 MB messages from 5.9-6.5 to
/// 5.2-5.7 GB/s.
const DEMOTE_MAX: u64 = 1024;

/// The writing end of a ring: one per ring, `Send` but not `Sync`.
///
/// Writes records (each a sequence of bytes with an end) into the ring. Its
/// tail index is kept in this process: each record's header publishes the
/// record, and the word after the last record is kept zero. The reader's
/// head is read from shared memory and validated on every read. Dropping
/// the producer closes it.
///
/// One thread writes at a time; it is not `Sync`:
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<tubeway_ring::Producer>();
/// ```
#[derive(Debug)]
pub struct Producer {
    ring: Ring,
    cursor: Cursor,
    /// Closed by this end.
    closed: bool,
    doorbell: Option<Doorbell>,
    /// Whether the CPU can claim lines ahead ([`CLAIM_AHEAD`]).
    claims: bool,
    /// One thread at a time uses an end (`Cell` is `Send` but not `Sync`).
    _not_sync: PhantomData<Cell<()>>,
}

/// Where a record goes: `pad` bytes of padding at `pos` first (0: none),
/// then the record of `len` payload bytes.
#[derive(Clone, Copy, Debug)]
struct Slot {
    pos: u64,
    pad: u64,
    len: u64,
}

impl Producer {
    pub(crate) fn new(ring: Ring) -> Result<Producer, Corrupt> {
        // A ring's ends are taken once, so its writer starts where its
        // reader is: at the zero word of a fresh data area.
        let head = ring.header().consumer.head.load(Ordering::Acquire);
        check_indices(head, head, ring.capacity())?;
        let tail = head;
        Ok(Producer {
            ring,
            cursor: Cursor {
                tail,
                head,
                rewind_checked: tail / REWIND_EVERY,
            },
            closed: false,
            doorbell: None,
            claims: crate::ring::claims_lines(),
            _not_sync: PhantomData,
        })
    }

    /// Sets the doorbell rung when the reader sleeps on its doorbell
    /// ([`Consumer::announce_doorbell_wait`](crate::Consumer::announce_doorbell_wait)).
    ///
    /// Without one, every write reports [`Wake::Doorbell`] when the caller
    /// must ring it, and [`write_message`](Producer::write_message) cannot
    /// wake such a reader between fragments.
    pub fn set_doorbell(&mut self, doorbell: Option<Doorbell>) {
        self.doorbell = doorbell;
    }

    /// The largest payload of one record: half the capacity less the 8-byte
    /// record header.
    pub fn max_record(&self) -> usize {
        record::max_payload(self.ring.capacity()) as usize
    }

    /// The room a writer of a message larger than one record waits for
    /// before it writes the next fragment: a quarter of the largest record,
    /// at most [`FRAGMENT_ROOM_MAX`]. Waiting for more would keep the reader
    /// idle longer between fragments and make the writer's spin for room
    /// outlast a reader that keeps up, so that it sleeps instead.
    pub fn fragment_room(&self) -> usize {
        (self.max_record() / 4).clamp(1, FRAGMENT_ROOM_MAX)
    }

    /// Bytes of data area.
    pub fn capacity(&self) -> usize {
        self.ring.capacity() as usize
    }

    /// Spins until `need` bytes are free, for at most `spin`, yielding the
    /// CPU every few microseconds as a budgeted spin does (the reader that
    /// makes the room may be waiting for it); whether they are. For a writer
    /// that then waits its own way, such as on a doorbell.
    pub fn spin_for_room(&self, need: usize, spin: Duration) -> bool {
        let mut poll = || Ok::<_, Infallible>((self.free() >= need).then_some(()));
        matches!(wait::spin(Some(spin), None, &mut poll), Ok(Spun::Ready(())))
    }

    /// Free bytes in the ring now (0 if the reader's index is corrupt). A
    /// record needs 8 bytes of header and padding to 8 bytes, and possibly
    /// a padding record before it; the 8 bytes always kept free after the
    /// last record are not counted.
    pub fn free(&self) -> usize {
        let head = self.ring.header().consumer.head.load(Ordering::Acquire);
        let tail = self.cursor.tail;
        match check_indices(head, tail, self.ring.capacity()) {
            Ok(()) => free_space(head, tail, self.ring.capacity()) as usize,
            Err(_) => 0,
        }
    }

    /// Whether writes fail with `Closed`: this end closed, the reader
    /// closed, or its process was declared dead.
    pub fn is_closed(&self) -> bool {
        self.closed || reader_gone(&self.ring)
    }

    /// How the reader is waiting, if it is.
    pub fn peer_waiting(&self) -> Option<Sleeper> {
        Sleeper::from_word(
            self.ring
                .header()
                .reader
                .reader_waiting
                .load(Ordering::Relaxed),
        )
    }

    /// Writes one record made of `parts`, all or nothing, without waiting.
    pub fn try_write(&mut self, parts: &[&[u8]]) -> Result<Wake, TryWriteError> {
        if self.is_closed() {
            return Err(TryWriteError::Closed);
        }
        let len = parts::total_len(parts);
        if len > self.max_record() {
            return Err(TryWriteError::TooLarge {
                len,
                max: self.max_record(),
            });
        }
        match self.cursor.reserve(&self.ring, len as u64)? {
            Some(slot) => Ok(self.commit(slot, parts, 0, 0)),
            None => Err(TryWriteError::Full {
                need: self.cursor.space_needed(&self.ring, len as u64) as usize,
            }),
        }
    }

    /// Writes as much of `parts` as fits now as one record, at most
    /// [`STREAM_RECORD_MAX`] bytes, for a byte stream; returns the bytes
    /// written (0 only for empty `parts`, which writes nothing). `Full` when
    /// not a byte fits.
    pub fn write_some(&mut self, parts: &[&[u8]]) -> Result<(usize, Wake), WriteSomeError> {
        if self.is_closed() {
            return Err(WriteSomeError::Closed);
        }
        let total = parts::total_len(parts);
        if total == 0 {
            return Ok((0, Wake::None));
        }
        self.write_record(parts, 0, total)?
            .ok_or(WriteSomeError::Full)
    }

    /// [`write_some`](Self::write_some) record after record while they
    /// fit: as much of `parts` as fits now, so that a writer of a byte
    /// stream hands over at once what it can.
    pub fn write_fitting(&mut self, parts: &[&[u8]]) -> Result<(usize, Wake), WriteSomeError> {
        if self.is_closed() {
            return Err(WriteSomeError::Closed);
        }
        let total = parts::total_len(parts);
        let (mut written, mut wake) = (0, Wake::None);
        while written < total {
            match self.write_record(parts, written, total) {
                Ok(Some((n, w))) => {
                    written += n;
                    wake = wake.and(w);
                }
                Ok(None) => break,
                // What was written stands; the next write reports it.
                Err(_) if written > 0 => break,
                Err(e) => return Err(e.into()),
            }
        }
        if written == 0 && total > 0 {
            return Err(WriteSomeError::Full);
        }
        Ok((written, wake))
    }

    /// The most of `rest` bytes that one record of a byte stream or one
    /// fragment takes: the largest record, at most [`STREAM_RECORD_MAX`].
    fn record_len(&self, rest: usize) -> usize {
        rest.min(self.max_record()).min(STREAM_RECORD_MAX)
    }

    /// One record of `parts` from `skip` on (of `total` bytes), as large as
    /// fits up to [`STREAM_RECORD_MAX`]; `None` when not a byte fits.
    fn write_record(
        &mut self,
        parts: &[&[u8]],
        skip: usize,
        total: usize,
    ) -> Result<Option<(usize, Wake)>, Corrupt> {
        let want = self.record_len(total - skip);
        Ok(self
            .cursor
            .largest_fit(&self.ring, want as u64)?
            .map(|slot| {
                let n = slot.len as usize;
                (n, self.commit(slot, parts, skip, 0))
            }))
    }

    /// Writes `parts` as one message of any size, waiting for space with
    /// `strategy` until `deadline`.
    ///
    /// A message up to [`max_record`](Producer::max_record) bytes is one
    /// record. A larger one is written as fragments, each flagged
    /// more-fragments-follow but the last, so that the ring never limits
    /// the size of a message. A fragment is as large as fits, up to
    /// [`STREAM_RECORD_MAX`], when at least
    /// [`fragment_room`](Producer::fragment_room) (or the rest of the
    /// message) fits, so the reader can drain the start of a message while
    /// the rest is written, and frees room as often as the writer waits for
    /// it.
    ///
    /// If the deadline passes after some fragments were written, the reader
    /// has an unfinished message: the ring is closed
    /// ([`WriteMessageError::TimedOutMidMessage`]).
    pub fn write_message(
        &mut self,
        parts: &[&[u8]],
        strategy: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<Wake, WriteMessageError> {
        let total = parts::total_len(parts);
        let max = self.max_record();
        if total <= max {
            return match self.wait_for_slot(total as u64, total as u64, strategy, deadline)? {
                Some(slot) => Ok(self.commit(slot, parts, 0, 0)),
                None => Err(WriteMessageError::TimedOut),
            };
        }
        let mut written = 0;
        let mut wake = Wake::None;
        while written < total {
            let want = self.record_len(total - written);
            let least = want.min(self.fragment_room());
            let Some(slot) = self.wait_for_slot(least as u64, want as u64, strategy, deadline)?
            else {
                if written == 0 {
                    return Err(WriteMessageError::TimedOut);
                }
                let _ = self.close();
                return Err(WriteMessageError::TimedOutMidMessage { written });
            };
            let n = slot.len as usize;
            let flags = if written + n < total { FLAG_MORE } else { 0 };
            wake = wake.and(self.commit(slot, parts, written, flags));
            written += n;
        }
        Ok(wake)
    }

    /// Announces that the writer will sleep on its doorbell until a record
    /// of `need` payload bytes fits, unless it already fits (or the ring is
    /// closed): then withdraws and returns false, and the caller must not
    /// sleep. After waking, call [`withdraw_wait`](Producer::withdraw_wait).
    pub fn announce_doorbell_wait(&self, need: usize) -> bool {
        let need = (need as u64).min(record::max_payload(self.ring.capacity()));
        let line = &self.ring.header().producer;
        let wake_at = self.cursor.wake_at(&self.ring, need);
        let tail = self.cursor.tail;
        let ready = wait::announce_then_check(
            &line.writer_waiting,
            || {
                line.writer_wake_at.store(wake_at, Ordering::Relaxed);
                wait::announce(&line.writer_waiting, DOORBELL);
            },
            || {
                let head = self.ring.header().consumer.head.load(Ordering::Acquire);
                // A corrupt head is reported by the next write.
                let fits =
                    check_indices(head, tail, self.ring.capacity()).is_err() || head >= wake_at;
                (fits || self.is_closed()).then_some(())
            },
        );
        ready.is_none()
    }

    /// Withdraws an announcement made by
    /// [`announce_doorbell_wait`](Producer::announce_doorbell_wait).
    pub fn withdraw_wait(&self) {
        wait::withdraw(&self.ring.header().producer.writer_waiting);
    }

    /// Closes this end: the reader gets what was written, then `Closed`.
    /// Idempotent; also done on drop.
    pub fn close(&mut self) -> Wake {
        if self.closed {
            return Wake::None;
        }
        self.closed = true;
        let header = self.ring.header();
        wait::close(
            &header.producer.closed,
            &header.reader.reader_waiting,
            self.doorbell.as_ref(),
        )
    }

    /// Declares the reader's process dead (see
    /// [`Region::mark_peer_dead`](crate::Region::mark_peer_dead)).
    pub fn mark_peer_dead(&self) {
        self.ring.region().mark_peer_dead(self.ring.side());
    }

    /// Waits until a record of at least `least` bytes fits, and returns a
    /// slot for as much of `want` as fits then. `None`: deadline passed.
    fn wait_for_slot(
        &mut self,
        least: u64,
        want: u64,
        strategy: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<Option<Slot>, WriteMessageError> {
        let ring = &self.ring;
        let cursor = &mut self.cursor;
        let closed = self.closed;
        let line = &ring.header().producer;
        let wake_at = cursor.wake_at(ring, least);
        wait::wait_for(
            strategy,
            deadline,
            &line.writer_waiting,
            || {
                line.writer_wake_at.store(wake_at, Ordering::Relaxed);
                wait::announce(&line.writer_waiting, FUTEX);
            },
            || {
                if closed || reader_gone(ring) {
                    return Err(WriteMessageError::Closed);
                }
                let slot = cursor.largest_fit(ring, want)?;
                Ok(slot.filter(|s| s.len >= least))
            },
        )
    }

    /// Writes `slot`: a zero word after it, `slot.len` bytes of `parts`
    /// from `skip` on, then the record header (and the padding's before it,
    /// if any), which publishes the record; wakes the reader if it sleeps.
    ///
    /// The payload's bytes in the header's cache line go last, just before
    /// the header: a reader waiting for the record polls that line, and
    /// takes it back each time it looks. Written first, those bytes would
    /// make the line cross to this core once for them and once more for
    /// the header, after the other lines' stores; written together with
    /// the header, it crosses once. A 64-byte call through the broker over
    /// shm took 1.39-1.41 µs the other way and 1.28-1.29 µs this way.
    fn commit(&mut self, slot: Slot, parts: &[&[u8]], skip: usize, flags: u32) -> Wake {
        let capacity = self.ring.capacity();
        // After padding, the record starts the data area.
        let at = if slot.pad > 0 { 0 } else { slot.pos };
        let size = record::size(slot.len);
        // Where the reader looks once it has read this record: zero until
        // the next record is published there. The space reserved free
        // after every record is this word.
        self.ring
            .store_record_header((at + size) & (capacity - 1), 0);
        // Data areas are page-aligned, so offsets and addresses agree on
        // where a cache line starts.
        let line = CACHE_LINE as u64;
        let in_header_line = (line - at % line - record::HEADER) as usize;
        self.ring.write_payload(
            at + record::HEADER,
            parts,
            skip,
            slot.len as usize,
            in_header_line,
        );
        // At most half the capacity, so it fits in 32 bits.
        let len32 = u32::try_from(slot.len).unwrap_or(u32::MAX);
        let header = record::encode(len32, flags);
        if slot.pad > 0 {
            // Published by the padding's header, stored after it.
            self.ring.store_record_header(at, header);
            // Less than a record, so it fits in 32 bits.
            let pad_len = u32::try_from(slot.pad - record::HEADER).unwrap_or(u32::MAX);
            self.ring
                .publish_record_header(slot.pos, record::encode(pad_len, FLAG_PADDING));
        } else {
            self.ring.publish_record_header(at, header);
        }
        self.cursor.tail += slot.pad + size;
        // The publisher's half of the Dekker pair (see wait.rs).
        fence(Ordering::SeqCst);
        let wake = wait::wake(
            &self.ring.header().reader.reader_waiting,
            self.doorbell.as_ref(),
        );
        // Once published (the fence has made the stores visible): a reader
        // that sees the header then reads the record's other lines, each
        // from this core's cache; from the shared one they come sooner. For
        // a large record the demotions cost the writer more than they save.
        if size <= DEMOTE_MAX {
            self.ring.demote(at, size);
        }
        self.claim_ahead();
        wake
    }

    /// Claims the [`CLAIM_AHEAD`] lines after the one holding the zero word
    /// at the tail, if they are free: where the next record's later bytes,
    /// and often its zero word, will go.
    fn claim_ahead(&self) {
        if !self.claims {
            return;
        }
        let capacity = self.ring.capacity();
        if let Some(first) = lines_ahead(self.cursor.head, self.cursor.tail, capacity) {
            let line = CACHE_LINE as u64;
            for k in 0..CLAIM_AHEAD {
                self.ring.claim_line((first + k * line) & (capacity - 1));
            }
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // A doorbell, if set, is rung; without one the caller chose to ring
        // it by hand and can no longer.
        let _ = self.close();
    }
}

/// Whether the reader closed or its process was declared dead.
fn reader_gone(ring: &Ring) -> bool {
    ring.header().reader.closed.load(Ordering::Relaxed) != 0 || ring.peer_dead()
}

/// The most room [`Producer::fragment_room`] asks for: a reader copying at
/// 10 GB/s frees it in 13 µs, well inside a writer's spin for room
/// ([`DEFAULT_SPIN`](crate::DEFAULT_SPIN), 50 µs), whatever the ring's size.
pub const FRAGMENT_ROOM_MAX: usize = 128 << 10;

/// The most [`Producer::write_some`] puts in one record: as much as a writer
/// waiting for room waits for. A reader releases room a whole record at a
/// time, so a byte stream written in records of a megabyte or two made a
/// writer that found the ring full wait for the reader to copy all of one
/// (some 200 µs), longer than its spin for room, and sleep; the reader then
/// emptied the ring while the writer woke. In records of at most this size,
/// 200 MB messages over shm went from 0.57-0.62x of memcpy to 0.71x
/// (docs/performance/investigations.md, "200 MB over shm on the second
/// host: where the writer waits"). A byte stream has no use for larger
/// records: its reader copies them out either way. Nor has a fragmented
/// message ([`Producer::write_message`]), whose reader copies its
/// fragments out to assemble it: in fragments of at most this size, a 200
/// MB message over a shm channel went from 0.27-0.28x of memcpy to
/// 0.34-0.36x (there and back), 5 MB from 0.27x to 0.37-0.38x.
pub const STREAM_RECORD_MAX: usize = FRAGMENT_ROOM_MAX;

/// Bytes written between two looks at whether the ring is empty, to start
/// again at the beginning of the data area (see [`Cursor::rewind`]).
const REWIND_EVERY: u64 = 16 * 1024;

/// The producer's indices and the space arithmetic on them.
#[derive(Debug)]
struct Cursor {
    /// Bytes ever published; the authoritative copy, only ever stored to
    /// shared memory.
    tail: u64,
    /// The reader's head as last read and validated, so that its line is
    /// read only when the cached value says the ring is too full.
    head: u64,
    /// `tail / REWIND_EVERY` when the ring was last looked at for a rewind.
    rewind_checked: u64,
}

impl Cursor {
    /// Where a record of `len` bytes goes at the current tail.
    fn place(&self, ring: &Ring, len: u64) -> Slot {
        let capacity = ring.capacity();
        let pos = self.tail & (capacity - 1);
        let to_end = capacity - pos;
        let pad = if record::size(len) <= to_end {
            0
        } else {
            to_end
        };
        Slot { pos, pad, len }
    }

    /// Bytes of ring a record of `len` bytes takes at the current tail,
    /// with the padding before it if it does not fit before the end.
    fn space_needed(&self, ring: &Ring, len: u64) -> u64 {
        self.place(ring, len).pad + record::size(len)
    }

    /// The reader's head at which a record of `len` bytes fits.
    fn wake_at(&self, ring: &Ring, len: u64) -> u64 {
        (self.tail + self.space_needed(ring, len) + record::RESERVE).saturating_sub(ring.capacity())
    }

    /// A slot at the start of the data area, after padding, when the
    /// reader has read everything and the tail has moved on by
    /// [`REWIND_EVERY`] since the last look. Request and reply traffic
    /// (one record in the ring at a time) then keeps reusing the first few
    /// kilobytes of the ring, which stay in the caches of both cores,
    /// instead of walking through all of it and meeting every line cold;
    /// with many connections, the rings' memory would not fit in any cache.
    /// The reader's line is read once per `REWIND_EVERY` bytes at most.
    fn rewind(&mut self, ring: &Ring, len: u64) -> Result<Option<Slot>, Corrupt> {
        let capacity = ring.capacity();
        let block = self.tail / REWIND_EVERY;
        if capacity < 4 * REWIND_EVERY || block == self.rewind_checked {
            return Ok(None);
        }
        self.rewind_checked = block;
        let pos = self.tail & (capacity - 1);
        if pos == 0 {
            return Ok(None);
        }
        self.refresh_head(ring)?;
        let pad = capacity - pos;
        let fits = pad + record::size(len) <= free_space(self.head, self.tail, capacity);
        if self.head != self.tail || !fits {
            return Ok(None);
        }
        // The next look is once the start of the area is left behind.
        self.rewind_checked = (self.tail + pad) / REWIND_EVERY;
        Ok(Some(Slot { pos, pad, len }))
    }

    /// A slot for exactly `len` bytes, if it fits now.
    fn reserve(&mut self, ring: &Ring, len: u64) -> Result<Option<Slot>, Corrupt> {
        if let Some(slot) = self.rewind(ring, len)? {
            return Ok(Some(slot));
        }
        let need = self.space_needed(ring, len);
        if need > free_space(self.head, self.tail, ring.capacity()) {
            self.refresh_head(ring)?;
            if need > free_space(self.head, self.tail, ring.capacity()) {
                return Ok(None);
            }
        }
        Ok(Some(self.place(ring, len)))
    }

    /// A slot for as much of `want` bytes as fits now (at least one byte),
    /// either before the end of the data area or, after padding, at its
    /// start, whichever holds more.
    fn largest_fit(&mut self, ring: &Ring, want: u64) -> Result<Option<Slot>, Corrupt> {
        if let Some(slot) = self.reserve(ring, want)? {
            return Ok(Some(slot));
        }
        // `reserve` has just refreshed the head.
        let capacity = ring.capacity();
        let free = free_space(self.head, self.tail, capacity);
        let pos = self.tail & (capacity - 1);
        let to_end = capacity - pos;
        let straight = free.min(to_end);
        let wrapped = free.saturating_sub(to_end);
        let (pad, space) = if straight >= wrapped {
            (0, straight)
        } else {
            (to_end, wrapped)
        };
        // A record of `space` bytes (a multiple of 8) holds `space - 8`
        // payload bytes.
        let len = space.saturating_sub(record::HEADER).min(want);
        Ok((len > 0).then_some(Slot { pos, pad, len }))
    }

    /// Re-reads the reader's head, validated.
    fn refresh_head(&mut self, ring: &Ring) -> Result<(), Corrupt> {
        // Read once into a local.
        let head = ring.header().consumer.head.load(Ordering::Acquire);
        check_indices(head, self.tail, ring.capacity())?;
        // Going backwards would hand out space the reader still reads.
        if head < self.head {
            return Err(Corrupt::Indices {
                head,
                tail: self.tail,
                capacity: ring.capacity(),
            });
        }
        self.head = head;
        Ok(())
    }
}

/// Lines a producer claims after each record, past the line of the zero
/// word after it (`Ring::claim_line`): a store into a line the reader still
/// holds waits for the reader's copy to be invalidated, and the header
/// that publishes a record is ordered after every other store of it. A
/// record that ends where a line ends puts its zero word alone in the next
/// line, a line the record does not otherwise touch, and unclaimed that
/// line's invalidation came on top of the record's own: over shm, payloads
/// of 56 and 120 bytes (records of exactly one and two lines) made a
/// channel round trip of 0.60-0.64 and 0.66-0.72 µs unclaimed against
/// 0.53-0.57 and 0.56-0.59 µs claimed, where 64 and 128 bytes made
/// 0.50-0.57 µs either way (docs/performance/investigations.md, "Records
/// that end where a line ends").
const CLAIM_AHEAD: u64 = 2;

/// Where the [`CLAIM_AHEAD`] lines after the line of the zero word at
/// `tail` start (an index), if all of them are free space; a stale `head`
/// only makes that rarer. Free space past the zero word is not the
/// reader's until a record is published there.
fn lines_ahead(head: u64, tail: u64, capacity: u64) -> Option<u64> {
    let line = CACHE_LINE as u64;
    let first = tail - tail % line + line;
    (first + CLAIM_AHEAD * line <= head + capacity).then_some(first)
}

/// Bytes a writer at `tail` may fill: the ring's free space less the zero
/// word kept after the last record. `head` and `tail` are checked.
fn free_space(head: u64, tail: u64, capacity: u64) -> u64 {
    (capacity - (tail - head)).saturating_sub(record::RESERVE)
}

/// Checks a (head, tail) pair read from shared memory: head not past tail,
/// at most a capacity apart, both on record boundaries.
pub(crate) fn check_indices(head: u64, tail: u64, capacity: u64) -> Result<(), Corrupt> {
    let aligned = head.is_multiple_of(record::ALIGN) && tail.is_multiple_of(record::ALIGN);
    if aligned && head <= tail && tail - head <= capacity {
        Ok(())
    } else {
        Err(Corrupt::Indices {
            head,
            tail,
            capacity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: u64 = CACHE_LINE as u64;

    #[test]
    fn the_lines_after_the_zero_words_line_are_claimed() {
        // The zero word at the start of a line, or anywhere in it: the
        // claimed lines start at the next line.
        assert_eq!(lines_ahead(0, 0, 4096), Some(LINE));
        assert_eq!(lines_ahead(0, 56, 4096), Some(LINE));
        assert_eq!(lines_ahead(64, 136, 4096), Some(3 * LINE));
        // The zero word in the area's last line: the claimed lines are the
        // area's first two (the caller masks the index).
        let tail = 8192 + 4032;
        assert_eq!(lines_ahead(tail, tail, 4096), Some(8192 + 4096));
    }

    /// Linux names the CPUID bit `claims_lines` reads `3dnowprefetch`.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    #[test]
    fn prefetchw_is_found_where_linux_reports_it() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap();
        let has = flags.split_whitespace().any(|f| f == "3dnowprefetch");
        assert_eq!(crate::ring::claims_lines(), has);
    }

    #[test]
    fn lines_the_reader_has_not_released_are_not_claimed() {
        // Free space ends at head + capacity: the two lines after the zero
        // word's must lie before it.
        let capacity = 4096;
        let tail = 4096 + 1000; // zero word in the line at 4096 + 960
        let first = 4096 + 1024;
        let head_just_enough = first + 2 * LINE - capacity;
        assert_eq!(lines_ahead(head_just_enough, tail, capacity), Some(first));
        assert_eq!(lines_ahead(head_just_enough - 8, tail, capacity), None);
        // A full ring claims nothing.
        assert_eq!(lines_ahead(tail - capacity, tail, capacity), None);
    }
}
