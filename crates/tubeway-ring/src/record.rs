//! Records in a ring's data area.
//!
//! A record is an 8-byte header, then its payload, padded to a multiple of
//! 8 bytes, so every header is 8-byte aligned. The header is one 64-bit word
//! (so it is written and read in one access): the payload length in the low
//! 32 bits, flags in the high 32 bits.
//!
//! The header is also what publishes the record: the writer stores it last,
//! with `Release`, and leaves the word after the record zero, so the reader
//! polls the word at its head and finds either zero (nothing yet) or a
//! header with [`FLAG_PUBLISHED`]. The reader's wait thus ends on the line
//! that holds the record's first bytes, not on an index in another line.
//!
//! A record never wraps: one that would not fit before the end of the data
//! area is preceded by a padding record that fills the area to its end, and
//! starts at offset 0. So every payload is contiguous and can be borrowed in
//! place.

/// Bytes of a record header.
pub(crate) const HEADER: u64 = 8;

/// Bytes the writer always leaves free after its last record: the zero word
/// where the reader looks for the next one.
pub(crate) const RESERVE: u64 = 8;

/// Every record starts on a multiple of this.
pub(crate) const ALIGN: u64 = 8;

/// Flag: a padding record. Its payload runs to the end of the data area and
/// is skipped; the next record starts at offset 0.
pub(crate) const FLAG_PADDING: u32 = 1;

/// Flag: more fragments of the same message follow this record.
pub(crate) const FLAG_MORE: u32 = 2;

/// Flag: set in every header, so that a published header is never the zero
/// word that marks where nothing is published yet.
pub(crate) const FLAG_PUBLISHED: u32 = 4;

/// Every flag this version knows; any other bit makes a record corrupt.
pub(crate) const KNOWN_FLAGS: u32 = FLAG_PADDING | FLAG_MORE | FLAG_PUBLISHED;

/// Packs a record header, with [`FLAG_PUBLISHED`] added to `flags`.
pub(crate) fn encode(len: u32, flags: u32) -> u64 {
    (u64::from(flags | FLAG_PUBLISHED) << 32) | u64::from(len)
}

/// Unpacks a record header into (payload length, flags).
pub(crate) fn decode(word: u64) -> (u64, u32) {
    // The shift leaves exactly the 32 flag bits.
    let flags = u32::try_from(word >> 32).unwrap_or(u32::MAX);
    (word & u64::from(u32::MAX), flags)
}

/// Bytes a record with `payload` bytes occupies: header, payload, padding.
pub(crate) fn size(payload: u64) -> u64 {
    HEADER + payload.div_ceil(ALIGN) * ALIGN
}

/// The largest payload of one record in a ring of `capacity` bytes.
///
/// A record may take at most half the data area: when the ring is empty
/// its head can be anywhere, and then the longer of the two stretches
/// (to the end, or from the start after padding) is at least half of it.
/// So a record of that size always fits once the ring has drained, and a
/// writer waiting for space can never wait forever. (The [`RESERVE`] word
/// after it fits too: a stretch that ends the area is followed by its start,
/// free in an empty ring, and one after padding starts on a record boundary
/// at least 8 bytes past half of the area.)
pub(crate) fn max_payload(capacity: u64) -> u64 {
    capacity / 2 - HEADER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let word = encode(0xdead_beef, FLAG_MORE);
        assert_eq!(decode(word), (0xdead_beef, FLAG_MORE | FLAG_PUBLISHED));
        // Never the zero word, even for an empty record.
        assert_eq!(decode(encode(0, 0)), (0, FLAG_PUBLISHED));
    }

    #[test]
    fn sizes_are_aligned() {
        assert_eq!(size(0), 8);
        assert_eq!(size(1), 16);
        assert_eq!(size(8), 16);
        assert_eq!(size(9), 24);
        assert_eq!(max_payload(64), 24);
        assert_eq!(size(max_payload(4096)), 2048);
    }
}
