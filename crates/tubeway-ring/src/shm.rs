//! Shared memory: a sealed memfd or an anonymous mapping, and views of the
//! layouts placed in it.

use std::mem::size_of;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use memmap2::{MmapMut, MmapOptions};
use rustix::fs::{self, MemfdFlags, SealFlags};

use crate::error::{CreateError, OpenError};
use crate::layout::SharedLayout;

/// The seals a region must carry: its size can never change, and no one can
/// remove or add seals. Without them a peer could shrink the file under our
/// mapping, and our next access would die of SIGBUS.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A mapping of shared memory, with the memfd behind it if there is one.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// Start of the mapping. Derived once from the map, so that no reference
    /// to the whole mapping is ever made: parts of it change under us.
    base: NonNull<u8>,
    len: usize,
    /// Owns the mapping; unmapped on drop.
    _map: MmapMut,
    fd: Option<OwnedFd>,
}

// SAFETY: `base` points into `_map`, which is itself Send and Sync and lives
// as long as the Mapping. The mapping is only accessed through atomics (the
// layouts) or through the data areas, whose exclusive use the ring ends
// guarantee (one producer and one consumer per ring, enforced by `Region`).
unsafe impl Send for Mapping {}
// SAFETY: as for Send; `&Mapping` only gives out shared views of atomics and
// raw pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(mut map: MmapMut, fd: Option<OwnedFd>) -> Mapping {
        let len = map.len();
        let base = NonNull::new(map.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Mapping {
            base,
            len,
            _map: map,
            fd,
        }
    }

    /// A new memfd of `len` zero bytes, sealed against resizing, mapped.
    pub(crate) fn create_memfd(name: &str, len: usize) -> Result<Mapping, CreateError> {
        let fd = fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| CreateError::Memfd(e.into()))?;
        fs::ftruncate(&fd, len as u64).map_err(|e| CreateError::Resize {
            size: len,
            source: e.into(),
        })?;
        fs::fcntl_add_seals(&fd, REQUIRED_SEALS).map_err(|e| CreateError::Seal(e.into()))?;
        // SAFETY: the file is a memfd that nobody else has yet, sealed so it
        // can never be truncated under the mapping. Its contents will be
        // shared with a peer: they are only accessed through atomics or as
        // documented for the data areas.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&fd) }
            .map_err(|source| CreateError::Map { size: len, source })?;
        Ok(Mapping::new(map, Some(fd)))
    }

    /// `len` zero bytes of anonymous memory, for use inside this process.
    pub(crate) fn anonymous(len: usize) -> Result<Mapping, CreateError> {
        let map =
            MmapMut::map_anon(len).map_err(|source| CreateError::Map { size: len, source })?;
        Ok(Mapping::new(map, None))
    }

    /// Maps a memfd received from a peer, after checking that it is sealed
    /// against resizing and that its size is within `min..=max`.
    pub(crate) fn open_memfd(fd: OwnedFd, min: u64, max: u64) -> Result<Mapping, OpenError> {
        // Seals first: once they hold, the size read next can never change.
        let seals = fs::fcntl_get_seals(&fd).map_err(|e| OpenError::Seals(e.into()))?;
        if !seals.contains(REQUIRED_SEALS) {
            return Err(OpenError::Unsealed);
        }
        let stat = fs::fstat(&fd).map_err(|e| OpenError::Stat(e.into()))?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if size < min || size > max {
            return Err(OpenError::Size { size, min, max });
        }
        let len = usize::try_from(size).map_err(|_| OpenError::Size { size, min, max })?;
        // SAFETY: the memfd is sealed against shrinking and growing (checked
        // above, and the SEAL seal means that cannot be undone), so the
        // mapping stays backed for its whole length. The peer may write the
        // contents at any time: they are only accessed through atomics or as
        // documented for the data areas.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&fd) }.map_err(OpenError::Map)?;
        Ok(Mapping::new(map, Some(fd)))
    }

    /// The memfd, if this mapping has one.
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A pointer `offset` bytes into the mapping, if `len` bytes from there
    /// are inside it.
    pub(crate) fn ptr(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: offset <= self.len (checked), so the result is inside the
        // mapping or one past its end, and not null.
        Some(unsafe { self.base.add(offset) })
    }

    /// A pointer to the `T` at `offset`, if it is inside and aligned.
    fn typed<T: SharedLayout>(&self, offset: usize) -> Option<NonNull<T>> {
        let ptr = self.ptr(offset, size_of::<T>())?.cast::<T>();
        ptr.as_ptr().is_aligned().then_some(ptr)
    }

    /// The `T` at `offset`, if it is inside the mapping and aligned.
    pub(crate) fn view<T: SharedLayout>(&self, offset: usize) -> Option<&T> {
        let ptr = self.typed::<T>(offset)?;
        // SAFETY: in bounds and aligned (checked by `typed`); a SharedLayout
        // is valid for any bytes and only changes through its atomics, so a
        // shared reference is sound while others write it; the mapping lives
        // as long as `self`, which the reference borrows.
        Some(unsafe { ptr.as_ref() })
    }

    /// Writes a fresh `value` at `offset`. Returns false if it does not fit.
    ///
    /// Takes `&mut self`: only while a mapping is being set up, before any
    /// view of it exists.
    pub(crate) fn init<T: SharedLayout>(&mut self, offset: usize, value: T) -> bool {
        let Some(ptr) = self.typed::<T>(offset) else {
            return false;
        };
        // SAFETY: in bounds and aligned (checked by `typed`); no reference to
        // this memory exists (`&mut self`), and the old bytes need no drop.
        unsafe { ptr.as_ptr().write(value) };
        true
    }
}
