//! Ring benchmarks, each beside its bare limit measured in the same run.
//!
//! ```text
//! cargo bench -p tubeway-ring --bench ring
//! ```
//!
//! - `pingpong_64B`: a 64-byte record to an echo thread and back, with
//!   `BusySpin` and with the default `SpinPark`, beside the bare ping-pong
//!   (one cache line each way, [`PingPong`]): the hardware's round trip.
//! - `stream_64KiB`: 64 KiB records from a writer thread to a reader that
//!   copies each out, with the default strategy, beside: the two copies done
//!   by one thread (`memcpy`: into a 1 MiB area and out again); the same two
//!   copies on two threads synchronised only by two counters
//!   (`bare_stream`: the streaming limit); and the bare ping-pong.
//!
//! Both threads of a pair need a core each: on a machine that is compiling
//! at the same time the figures are noise. After criterion's report the
//! program prints each figure's median as a ratio to its group's bare
//! ping-pong, measured in the same run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::indexing_slicing
)]

use std::cell::UnsafeCell;
use std::hint::black_box;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput};
use tubeway_ring::{Consumer, PingPong, Producer, Region, RingConfig, Side, WaitStrategy};

const RECORD: usize = 64;
const STREAM_RECORD: usize = 64 * 1024;

/// Time per iteration of each sample of each benchmark, for the ratios.
static SAMPLES: Mutex<Vec<(String, Vec<f64>)>> = Mutex::new(Vec::new());

fn record_sample(name: &str, elapsed: Duration, iters: u64) {
    let per_iter = elapsed.as_nanos() as f64 / iters.max(1) as f64;
    let mut samples = SAMPLES.lock().unwrap();
    match samples.iter_mut().find(|(n, _)| n == name) {
        Some((_, times)) => times.push(per_iter),
        None => samples.push((name.to_owned(), vec![per_iter])),
    }
}

/// The median time per iteration of the samples of `name`: robust to the
/// samples in which a thread lost its core.
fn median(name: &str) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let (_, times) = samples.iter().find(|(n, _)| n == name)?;
    let mut times = times.clone();
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied()
}

fn configure(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

/// Times `iters` calls of `f`, and records the mean under `name`.
fn timed(name: &str, iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = start.elapsed();
    record_sample(name, elapsed, iters);
    elapsed
}

/// The bare ping-pong: an echo thread, and a benchmark of round trips.
fn bare_pingpong(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, name: &str) {
    let pp = Arc::new(PingPong::heap().unwrap());
    let echo = {
        let pp = Arc::clone(&pp);
        thread::spawn(move || {
            let mut next = 1;
            loop {
                let seq = pp.wait(Side::Opener, next, None).unwrap();
                if seq == u64::MAX {
                    break;
                }
                pp.post(Side::Opener, seq);
                next = seq + 1;
            }
        })
    };
    let mut seq = 0;
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| {
            timed(name, iters, || {
                seq += 1;
                pp.post(Side::Creator, seq);
                black_box(pp.wait(Side::Creator, seq, None).unwrap());
            })
        });
    });
    pp.post(Side::Creator, u64::MAX);
    echo.join().unwrap();
}

/// Both sides' ends of a heap region.
fn ends(capacity: usize) -> ((Producer, Consumer), (Producer, Consumer)) {
    let region = Arc::new(Region::heap(&RingConfig::default().capacity(capacity)).unwrap());
    (
        region.ends(Side::Creator).unwrap(),
        region.ends(Side::Opener).unwrap(),
    )
}

/// An echo thread for 64-byte records; ends when the ring closes.
fn echo(mut tx: Producer, mut rx: Consumer, strategy: WaitStrategy) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; RECORD];
        while let Ok(record) = rx.read(&strategy, None) {
            buf.copy_from_slice(&record);
            drop(record);
            if tx.write_message(&[&buf], &strategy, None).is_err() {
                break;
            }
        }
    })
}

fn pingpong(c: &mut Criterion) {
    let mut group = c.benchmark_group("pingpong_64B");
    configure(&mut group);
    bare_pingpong(&mut group, "pingpong_64B/bare");
    for (label, strategy) in [
        ("busy_spin", WaitStrategy::BusySpin),
        ("spin_park_default", WaitStrategy::default()),
    ] {
        let ((mut tx, mut rx), (echo_tx, echo_rx)) = ends(64 * 1024);
        let echo = echo(echo_tx, echo_rx, strategy);
        let name = format!("pingpong_64B/{label}");
        let payload = [7u8; RECORD];
        group.bench_function(label, |b| {
            b.iter_custom(|iters| {
                timed(&name, iters, || {
                    let _ = tx.write_message(&[&payload], &strategy, None).unwrap();
                    let record = rx.read(&strategy, None).unwrap();
                    black_box(&*record);
                })
            });
        });
        let _ = tx.close();
        echo.join().unwrap();
    }
    group.finish();
}

fn stream(c: &mut Criterion) {
    let mut group = c.benchmark_group("stream_64KiB");
    configure(&mut group);
    bare_pingpong(&mut group, "stream_64KiB/bare");
    group.throughput(Throughput::Bytes(STREAM_RECORD as u64));

    // The bound: the two copies a record takes, into a 1 MiB area like the
    // ring's and out of it again, on one core. The ring makes them on two
    // cores at once.
    let source = vec![3u8; STREAM_RECORD];
    let mut area = vec![0u8; 1 << 20];
    let mut out = vec![0u8; STREAM_RECORD];
    let mut at = 0;
    group.bench_function("memcpy", |b| {
        b.iter_custom(|iters| {
            timed("stream_64KiB/memcpy", iters, || {
                area[at..at + STREAM_RECORD].copy_from_slice(black_box(&source));
                out.copy_from_slice(black_box(&area[at..at + STREAM_RECORD]));
                black_box(&out);
                at = (at + STREAM_RECORD) % area.len();
            })
        });
    });

    bare_stream(&mut group);

    let strategy = WaitStrategy::default();
    let ((mut tx, _), (_, mut rx)) = ends(1 << 20);
    let (order, orders) = mpsc::channel::<u64>();
    let writer = thread::spawn(move || {
        let record = vec![5u8; STREAM_RECORD];
        // Each order: write that many records.
        for n in orders {
            for _ in 0..n {
                let _ = tx.write_message(&[&record], &strategy, None).unwrap();
            }
        }
    });
    // The reader copies each record out, as a consumer handing the bytes
    // on would.
    let mut out = vec![0u8; STREAM_RECORD];
    group.bench_function("ring", |b| {
        b.iter_custom(|iters| {
            order.send(iters).unwrap();
            timed("stream_64KiB/ring", iters, || {
                let record = rx.read(&strategy, None).unwrap();
                out.copy_from_slice(&record);
                black_box(&out);
            })
        });
    });
    drop(order);
    writer.join().unwrap();
    group.finish();
}

/// Sixteen 64 KiB slots shared by two threads: the bare stream's buffer.
struct Slots(Box<[UnsafeCell<u8>]>);

// SAFETY: a slot is written by the writer only while the reader's posted
// count says it is free, and read by the reader only once the writer's
// posted count (a Release store, read with Acquire) says it is full.
unsafe impl Sync for Slots {}

impl Slots {
    const COUNT: u64 = 16;

    fn new() -> Slots {
        Slots(
            (0..Self::COUNT as usize * STREAM_RECORD)
                .map(|_| UnsafeCell::new(0))
                .collect(),
        )
    }

    /// The slot for record `n`.
    fn slot(&self, n: u64) -> *mut u8 {
        let start = (n % Self::COUNT) as usize * STREAM_RECORD;
        UnsafeCell::raw_get(self.0[start..start + STREAM_RECORD].as_ptr())
    }
}

/// The streaming limit: the same two copies across cores through the same
/// amount of memory, synchronised by nothing but two counters in a
/// [`PingPong`] (records written, records read), both threads spinning.
fn bare_stream(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let slots = Arc::new(Slots::new());
    let pp = Arc::new(PingPong::heap().unwrap());
    let (order, orders) = mpsc::channel::<u64>();
    let writer = {
        let (slots, pp) = (Arc::clone(&slots), Arc::clone(&pp));
        thread::spawn(move || {
            let source = vec![5u8; STREAM_RECORD];
            let mut written: u64 = 0;
            for n in orders {
                for _ in 0..n {
                    // Wait for the slot to be free.
                    let _ = pp.wait(
                        Side::Creator,
                        (written + 1).saturating_sub(Slots::COUNT),
                        None,
                    );
                    // SAFETY: the reader has read record `written - 16`, the
                    // last one in this slot, and reads it again only after
                    // the post below.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            source.as_ptr(),
                            slots.slot(written),
                            STREAM_RECORD,
                        )
                    };
                    written += 1;
                    pp.post(Side::Creator, written);
                }
            }
        })
    };
    let mut out = vec![0u8; STREAM_RECORD];
    let mut read = 0;
    group.bench_function("bare_stream", |b| {
        b.iter_custom(|iters| {
            order.send(iters).unwrap();
            timed("stream_64KiB/bare_stream", iters, || {
                let _ = pp.wait(Side::Opener, read + 1, None);
                // SAFETY: the writer posted record `read` (Release, seen
                // with Acquire) and writes this slot again only after the
                // post below.
                unsafe {
                    std::ptr::copy_nonoverlapping(slots.slot(read), out.as_mut_ptr(), STREAM_RECORD)
                };
                black_box(&out);
                read += 1;
                pp.post(Side::Opener, read);
            })
        });
    });
    drop(order);
    writer.join().unwrap();
}

fn print_ratios() {
    println!("\nratios to the bare ping-pong of the same group (median time per iteration):");
    let names: Vec<String> = SAMPLES
        .lock()
        .unwrap()
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    for group in ["pingpong_64B", "stream_64KiB"] {
        let Some(bare) = median(&format!("{group}/bare")) else {
            continue;
        };
        for name in names.iter().filter(|n| n.starts_with(group)) {
            let ns = median(name).unwrap_or(f64::NAN);
            println!("  {name:32} {ns:>12.1} ns  {:>8.2} x bare", ns / bare);
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    pingpong(&mut c);
    stream(&mut c);
    c.final_summary();
    print_ratios();
}
