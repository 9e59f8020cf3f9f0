//! Fresh message ids, which every message made draws: a call draws two (its
//! request and its answer).
//!
//! A random version 4 UUID costs a round of the thread's random generator,
//! 9 ns here. Instead each thread draws one random UUID when it first needs
//! an id and counts up from it: an id then costs an addition. Ids made so
//! are unique (a thread would have to make 2^62 of them to come back to its
//! start, and two threads' starts differ in 122 random bits), which is all
//! the protocol asks of them; they are not unpredictable, which it does not
//! ask (responses and cancellations are matched on their own connection).
//! They are marked version 8 (RFC 9562's custom layout), since their bits
//! are not all random.
//!
//! A process that forks carries the generator into its child, as it does a
//! random generator's state (`rand`'s thread generator is not reseeded on
//! fork either): both then count up from the same point. A child that
//! talks to a broker opens a connection of its own, on which ids need only
//! be unique among its own messages.

use std::cell::Cell;

use uuid::Uuid;

/// The version nibble (bits 76-79) and the variant's two bits (62-63).
const VERSION_MASK: u128 = 0xf << 76;
const VARIANT_MASK: u128 = 0b11 << 62;
/// Version 8, and the RFC's variant (`10`).
const VERSION_8: u128 = 0x8 << 76;
const VARIANT_RFC: u128 = 0b10 << 62;

thread_local! {
    /// The last id this thread made; zero before its first.
    static LAST: Cell<u128> = const { Cell::new(0) };
}

/// A fresh id, unique among the ids of every thread and process that has
/// not forked from this one since it made its first.
pub fn fresh() -> Uuid {
    LAST.with(|last| {
        let mut v = last.get();
        if v == 0 {
            v = Uuid::new_v4().as_u128();
        }
        // The count runs in the low 62 bits, below the variant's.
        let next = stamp(v.wrapping_add(1));
        last.set(next);
        Uuid::from_u128(next)
    })
}

fn stamp(v: u128) -> u128 {
    (v & !(VERSION_MASK | VARIANT_MASK)) | VERSION_8 | VARIANT_RFC
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_version_8_of_the_rfc_variant() {
        for _ in 0..4 {
            let id = fresh();
            assert_eq!(id.get_version_num(), 8);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        }
    }

    #[test]
    fn a_thread_counts_up_from_a_random_start() {
        let (a, b) = (fresh().as_u128(), fresh().as_u128());
        assert_eq!(b, a + 1);
        // Two threads start apart.
        let other = std::thread::spawn(|| fresh().as_u128()).join().unwrap();
        assert!(other.abs_diff(a) > 1_000_000, "{other:x} {a:x}");
    }

    #[test]
    fn ids_do_not_repeat_across_threads() {
        let ids: Vec<Vec<Uuid>> = (0..4)
            .map(|_| std::thread::spawn(|| (0..10_000).map(|_| fresh()).collect()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let all: HashSet<Uuid> = ids.iter().flatten().copied().collect();
        assert_eq!(all.len(), 40_000);
    }

    #[test]
    fn the_count_keeps_the_version_and_variant() {
        // A start whose low bits are all ones carries into the variant's
        // bits, which are then set again.
        let start = stamp(u128::MAX >> 66 | (0x1234 << 80));
        let next = stamp(start.wrapping_add(1));
        let id = Uuid::from_u128(next);
        assert_eq!(id.get_version_num(), 8);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
    }
}
