//! The reading end of a ring.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::time::Instant;

use crate::error::{Corrupt, ReadError, ReadMessageError, TryReadError};
use crate::producer::check_indices;
use crate::record::{self, FLAG_MORE, FLAG_PADDING, FLAG_PUBLISHED, KNOWN_FLAGS};
use crate::ring::Ring;
use crate::sync::{fence, Ordering};
use crate::wait::{self, Doorbell, Sleeper, WaitStrategy, Wake, DOORBELL, FUTEX};

/// The reading end of a ring: one per ring, `Send` but not `Sync`.
///
/// Borrows each record in place ([`Record`]) and releases it when done. The
/// head index it publishes is kept in this process and only ever stored to
/// shared memory; it finds records by polling the word at its head, and
/// reads every record header once and validates it. Dropping the consumer
/// closes it.
///
/// One thread reads at a time; it is not `Sync`:
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<tubeway_ring::Consumer>();
/// ```
#[derive(Debug)]
pub struct Consumer {
    ring: Ring,
    cursor: Cursor,
    /// Closed by this end.
    closed: bool,
    doorbell: Option<Doorbell>,
    /// One thread at a time uses an end (`Cell` is `Send` but not `Sync`).
    _not_sync: PhantomData<Cell<()>>,
}

/// A validated record: its payload at `pos` (data-area offset), `len`
/// bytes, `flags`; the head after it is `next`.
#[derive(Clone, Copy, Debug)]
struct Found {
    pos: u64,
    len: u64,
    flags: u32,
    next: u64,
}

impl Consumer {
    pub(crate) fn new(ring: Ring) -> Result<Consumer, Corrupt> {
        let head = ring.header().consumer.head.load(Ordering::Acquire);
        check_indices(head, head, ring.capacity())?;
        Ok(Consumer {
            ring,
            cursor: Cursor { head, taken: 0 },
            closed: false,
            doorbell: None,
            _not_sync: PhantomData,
        })
    }

    /// Sets the doorbell rung when the writer sleeps on its doorbell waiting
    /// for space ([`Producer::announce_doorbell_wait`](crate::Producer::announce_doorbell_wait)).
    ///
    /// Without one, [`Record::release`] reports [`Wake::Doorbell`] when the
    /// caller must ring it, and a record released by being dropped cannot.
    pub fn set_doorbell(&mut self, doorbell: Option<Doorbell>) {
        self.doorbell = doorbell;
    }

    /// Bytes of data area.
    pub fn capacity(&self) -> usize {
        self.ring.capacity() as usize
    }

    /// The largest payload of one record.
    pub fn max_record(&self) -> usize {
        record::max_payload(self.ring.capacity()) as usize
    }

    /// How the writer is waiting for space, if it is.
    pub fn peer_waiting(&self) -> Option<Sleeper> {
        Sleeper::from_word(
            self.ring
                .header()
                .producer
                .writer_waiting
                .load(Ordering::Relaxed),
        )
    }

    /// The next record, if one is published; `Closed` once every record is
    /// read and the writer closed (or died), or this end closed.
    pub fn try_read(&mut self) -> Result<Option<Record<'_>>, TryReadError> {
        Ok(self.poll()?.map(|found| Record::new(self, found)))
    }

    /// The next record, waiting for it with `strategy` until `deadline`.
    pub fn read(
        &mut self,
        strategy: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<Record<'_>, ReadError> {
        let found = self.wait_next(strategy, deadline)?;
        Ok(Record::new(self, found))
    }

    /// Reads the ring as a byte stream, without waiting: copies published
    /// bytes into `buf`, at most the rest of one record, and releases each
    /// record once it is read to its end (a record read in part is returned
    /// from where it stopped, by this or by [`try_read`](Consumer::try_read)).
    /// Empty records are skipped. `None`: nothing is published.
    ///
    /// The counterpart of [`Producer::write_some`](crate::Producer::write_some).
    pub fn try_read_bytes(
        &mut self,
        buf: &mut [u8],
    ) -> Result<Option<(usize, Wake)>, TryReadError> {
        let mut wake = Wake::None;
        loop {
            let Some(found) = self.poll()? else {
                return Ok(None);
            };
            match self.take_bytes(found, buf) {
                (Some(n), w) => return Ok(Some((n, wake.and(w)))),
                (None, w) => wake = wake.and(w),
            }
        }
    }

    /// [`try_read_bytes`](Consumer::try_read_bytes), waiting for bytes with
    /// `strategy` until `deadline`.
    pub fn read_bytes(
        &mut self,
        buf: &mut [u8],
        strategy: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<(usize, Wake), ReadError> {
        let mut wake = Wake::None;
        loop {
            let found = self.wait_next(strategy, deadline)?;
            match self.take_bytes(found, buf) {
                (Some(n), w) => return Ok((n, wake.and(w))),
                (None, w) => wake = wake.and(w),
            }
        }
    }

    /// Reads one whole message, appending its fragments to `out`; returns
    /// its length. Waits with `strategy` until `deadline` for each fragment.
    /// Refuses a message longer than `max_len`: its fragments read so far
    /// are in `out` and released, its rest is still in the ring, so the
    /// stream is out of step and should be closed.
    ///
    /// On `TimedOut` part of a message may be in `out`; a call with the same
    /// `out` continues it.
    pub fn read_message(
        &mut self,
        out: &mut Vec<u8>,
        max_len: usize,
        strategy: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<usize, ReadMessageError> {
        let start = out.len();
        loop {
            let record = self.read(strategy, deadline)?;
            if out.len() - start + record.len() > max_len {
                return Err(ReadMessageError::TooLarge { max: max_len });
            }
            out.extend_from_slice(&record);
            if record.is_last() {
                return Ok(out.len() - start);
            }
        }
    }

    /// Announces that the reader will sleep on its doorbell, unless a record
    /// is already there or the ring is closed: then withdraws and returns
    /// false, and the caller must not sleep. After waking, call
    /// [`withdraw_wait`](Consumer::withdraw_wait).
    pub fn announce_doorbell_wait(&mut self) -> bool {
        let ring = &self.ring;
        let cursor = &mut self.cursor;
        let closed = self.closed;
        let word = &ring.header().reader.reader_waiting;
        let ready = wait::announce_then_check(
            word,
            || wait::announce(word, DOORBELL),
            // The same look as before a futex sleep. A record, the close or
            // a corruption is worth a call of `try_read`, which reports it.
            || match cursor.poll(ring, closed) {
                Ok(None) => None,
                Ok(Some(_)) | Err(_) => Some(()),
            },
        );
        ready.is_none()
    }

    /// Withdraws an announcement made by
    /// [`announce_doorbell_wait`](Consumer::announce_doorbell_wait).
    pub fn withdraw_wait(&self) {
        wait::withdraw(&self.ring.header().reader.reader_waiting);
    }

    /// Closes this end: the writer's writes fail with `Closed` from now on.
    /// Idempotent; also done on drop.
    pub fn close(&mut self) -> Wake {
        if self.closed {
            return Wake::None;
        }
        self.closed = true;
        let header = self.ring.header();
        wait::close(
            &header.reader.closed,
            &header.producer.writer_waiting,
            self.doorbell.as_ref(),
        )
    }

    /// Declares the writer's process dead (see
    /// [`Region::mark_peer_dead`](crate::Region::mark_peer_dead)).
    pub fn mark_peer_dead(&self) {
        self.ring.region().mark_peer_dead(self.ring.side());
    }

    fn poll(&mut self) -> Result<Option<Found>, TryReadError> {
        self.cursor.poll(&self.ring, self.closed)
    }

    /// The next record, waiting for it.
    fn wait_next(
        &mut self,
        strategy: &WaitStrategy,
        deadline: Option<Instant>,
    ) -> Result<Found, ReadError> {
        let ring = &self.ring;
        let cursor = &mut self.cursor;
        let closed = self.closed;
        let word = &ring.header().reader.reader_waiting;
        let found = wait::wait_for(
            strategy,
            deadline,
            word,
            || wait::announce(word, FUTEX),
            || cursor.poll(ring, closed),
        )?;
        found.ok_or(ReadError::TimedOut)
    }

    /// Copies as much of `found` as fits into `buf`, and releases the record
    /// if that was its end. The count is `None` for an empty record (which
    /// is released): there is nothing to return yet.
    fn take_bytes(&mut self, found: Found, buf: &mut [u8]) -> (Option<usize>, Wake) {
        let n = (found.len as usize).min(buf.len());
        if let Some(dst) = buf.get_mut(..n) {
            dst.copy_from_slice(self.ring.payload(found.pos, n as u64));
        }
        let wake = if n as u64 == found.len {
            self.release(found.next)
        } else {
            self.cursor.taken += n as u64;
            Wake::None
        };
        ((n > 0 || buf.is_empty()).then_some(n), wake)
    }

    /// Releases the record that ends at `next`, publishing the new head, and
    /// wakes the writer if it sleeps waiting for that much space.
    fn release(&mut self, next: u64) -> Wake {
        self.cursor.head = next;
        self.cursor.taken = 0;
        let header = self.ring.header();
        header.consumer.head.store(next, Ordering::Release);
        // The publisher's half of the Dekker pair (see wait.rs).
        fence(Ordering::SeqCst);
        let line = &header.producer;
        if line.writer_waiting.load(Ordering::Relaxed) == 0
            || next < line.writer_wake_at.load(Ordering::Relaxed)
        {
            return Wake::None;
        }
        wait::wake(&line.writer_waiting, self.doorbell.as_ref())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Whether the writer closed or its process was declared dead. Acquire: a
/// closed writer's last record is visible after this returns true.
fn writer_gone(ring: &Ring) -> bool {
    ring.header().producer.closed.load(Ordering::Acquire) != 0 || ring.peer_dead()
}

/// The consumer's indices and the validation of what it reads.
#[derive(Debug)]
struct Cursor {
    /// Bytes ever released; the authoritative copy, only ever stored to
    /// shared memory.
    head: u64,
    /// Bytes of the record at the head already read as a byte stream.
    taken: u64,
}

impl Cursor {
    /// The next record, if any; `Closed` when there is none and there will
    /// be none.
    fn poll(&mut self, ring: &Ring, closed: bool) -> Result<Option<Found>, TryReadError> {
        if closed {
            return Err(TryReadError::Closed);
        }
        if let Some(found) = self.next(ring)? {
            return Ok(Some(self.skip_taken(found)?));
        }
        // Look at the closed flag, then at the head again: if the flag is
        // set, what is read after it is all the writer published.
        let gone = writer_gone(ring);
        match self.next(ring)? {
            Some(found) => Ok(Some(self.skip_taken(found)?)),
            None if gone => Err(TryReadError::Closed),
            // No prefetch of the record's later lines while waiting: the
            // writer is storing into them, and each prefetch takes a line
            // back from it before its header can be published
            // (docs/performance/investigations.md, "The reader's prefetch,
            // taken out").
            None => Ok(None),
        }
    }

    /// The part of `found` not yet read as a byte stream. The header is read
    /// again each time, so a peer may have shortened the record meanwhile.
    fn skip_taken(&self, found: Found) -> Result<Found, Corrupt> {
        if found.len < self.taken {
            return Err(Corrupt::Length {
                at: self.head,
                len: found.len,
                readable: self.taken,
            });
        }
        Ok(Found {
            pos: found.pos + self.taken,
            len: found.len - self.taken,
            ..found
        })
    }

    /// The record at the head, if one is published; validated.
    fn next(&self, ring: &Ring) -> Result<Option<Found>, Corrupt> {
        let capacity = ring.capacity();
        let pos = self.head & (capacity - 1);
        let word = ring.load_record_header(pos);
        if word == 0 {
            return Ok(None);
        }
        let (len, flags) = record::decode(word);
        check_flags(self.head, flags)?;
        if flags & FLAG_PADDING == 0 {
            return check_record(self.head, pos, len, flags, capacity).map(Some);
        }
        // Padding runs exactly to the end of the area, and is never needed
        // at its start.
        let pad = capacity - pos;
        if pos == 0 || len + record::HEADER != pad {
            return Err(Corrupt::Padding { at: self.head, len });
        }
        let at = self.head + pad;
        // Ordered after the padding's header, which published it.
        let word = ring.load_record_header(0);
        if word == 0 {
            // Padding published on its own: the record is still to come.
            return Ok(None);
        }
        let (len, flags) = record::decode(word);
        check_flags(at, flags)?;
        if flags & FLAG_PADDING != 0 {
            return Err(Corrupt::Padding { at, len });
        }
        check_record(at, 0, len, flags, capacity).map(Some)
    }
}

/// Flags must be known and mark a published header, and padding is never a
/// fragment.
fn check_flags(at: u64, flags: u32) -> Result<(), Corrupt> {
    let padding_fragment = FLAG_PADDING | FLAG_MORE;
    if flags & !KNOWN_FLAGS != 0
        || flags & FLAG_PUBLISHED == 0
        || flags & padding_fragment == padding_fragment
    {
        return Err(Corrupt::Flags { at, flags });
    }
    Ok(())
}

/// A record of `len` bytes at index `at` (data offset `pos`) must be no
/// larger than a record can be, and lie within the data area.
fn check_record(at: u64, pos: u64, len: u64, flags: u32, capacity: u64) -> Result<Found, Corrupt> {
    let size = record::size(len);
    if len > record::max_payload(capacity) || pos + size > capacity {
        return Err(Corrupt::Length {
            at,
            len,
            readable: capacity - pos,
        });
    }
    Ok(Found {
        pos: pos + record::HEADER,
        len,
        flags,
        next: at + size,
    })
}

/// A record borrowed in place from the ring.
///
/// Dereferences to its payload. Releasing it (explicitly, or by dropping
/// it) hands its space back to the writer; until then the writer cannot
/// overwrite it. Forgetting it (`std::mem::forget`) leaves it unreleased,
/// and the next read returns it again.
///
/// The payload is the peer's memory: a hostile peer can change it while it
/// is borrowed. Copy it out (`to_vec`) before parsing data from a peer that
/// is not trusted, or read each field of it once (see "Assumptions" in
/// `docs/shared-memory.md`).
pub struct Record<'a> {
    consumer: &'a mut Consumer,
    found: Found,
    released: bool,
}

impl<'a> Record<'a> {
    /// Where the payload starts in the data area.
    #[cfg(test)]
    pub(crate) fn offset(&self) -> u64 {
        self.found.pos
    }

    fn new(consumer: &'a mut Consumer, found: Found) -> Record<'a> {
        Record {
            consumer,
            found,
            released: false,
        }
    }

    /// The payload.
    pub fn bytes(&self) -> &[u8] {
        self.consumer.ring.payload(self.found.pos, self.found.len)
    }

    /// Whether this record ends a message (no more fragments follow).
    pub fn is_last(&self) -> bool {
        self.found.flags & FLAG_MORE == 0
    }

    /// Releases the record; reports whether the writer must be woken by
    /// ringing its doorbell.
    pub fn release(mut self) -> Wake {
        self.released = true;
        self.consumer.release(self.found.next)
    }
}

impl Deref for Record<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        if !self.released {
            // A doorbell, if set, is rung; without one the caller chose to
            // release explicitly when it needs to know.
            let _ = self.consumer.release(self.found.next);
        }
    }
}

impl fmt::Debug for Record<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("len", &self.found.len)
            .field("last", &self.is_last())
            .finish_non_exhaustive()
    }
}
