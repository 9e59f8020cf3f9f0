//! Unit tests: records, closing, waking, corruption and region validation,
//! on heap regions whose shared memory the tests can poke at.

mod close;
mod corrupt;
mod records;
mod region;
mod wake;

use std::sync::Arc;

use crate::layout::RingHeader;
use crate::ring::Ring;
use crate::{Consumer, Producer, Region, RingConfig, Side};

/// Ring 0 of a heap region: the creator's producer and the opener's
/// consumer, with the region to poke at.
struct Pair {
    region: Arc<Region>,
    tx: Producer,
    rx: Consumer,
    /// The ends of ring 1, kept open.
    _back: (Producer, Consumer),
}

fn pair(capacity: usize) -> Pair {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(capacity)).unwrap());
    let (tx, back_rx) = region.ends(Side::Creator).unwrap();
    let (back_tx, rx) = region.ends(Side::Opener).unwrap();
    Pair {
        region,
        tx,
        rx,
        _back: (back_tx, back_rx),
    }
}

impl Pair {
    /// Ring 0 as raw memory.
    fn raw(&self) -> Ring {
        Ring::new(
            Arc::clone(&self.region),
            self.region.place(0),
            Side::Creator,
        )
    }

    /// Reads the next record into a vector, with its last flag.
    fn read(&mut self) -> Option<(Vec<u8>, bool)> {
        let record = self.rx.try_read().unwrap()?;
        Some((record.to_vec(), record.is_last()))
    }
}

/// The header of ring 0 of `ring`'s region.
fn header(ring: &Ring) -> &RingHeader {
    ring.header()
}

#[test]
fn the_ends_can_move_to_other_threads() {
    fn send<T: Send>() {}
    send::<Producer>();
    send::<Consumer>();
    fn shared<T: Send + Sync>() {}
    shared::<Region>();
    shared::<crate::PingPong>();
}

/// `len` bytes of a pattern that differs with `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
