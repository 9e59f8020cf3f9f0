//! A channel's steady state allocates nothing: messages are borrowed in
//! place (rings) or from a reused buffer (streams), and writes go straight
//! from the caller's slices. Counted with a heap profiler as the global
//! allocator, so this file holds one test only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::thread;

use tubeway_transport::channel::{self, ChannelListener, ChannelOptions};
use tubeway_transport::WaitStrategy;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const WARM_UP: usize = 200;
const ROUNDS: usize = 5_000;

#[test]
fn steady_state_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let dir = std::env::temp_dir();
    let id = std::process::id();
    for url in [
        format!("mem://alloc-{id}"),
        format!("shm://alloc-{id}?ring=64KiB"),
        format!("unix://{}/alloc-{id}.sock", dir.display()),
        "tcp://127.0.0.1:0".to_owned(),
        format!("fifo://{}/alloc-{id}", dir.display()),
    ] {
        // Spinning: a parked reader's wake-ups are system calls, not
        // allocations, but spinning keeps the run short.
        let options = ChannelOptions::default().wait(WaitStrategy::SpinYield {
            spin: std::time::Duration::from_micros(100),
        });
        let mut listener = ChannelListener::bind_with(&url, options.clone()).unwrap();
        let bound = listener.local_url().to_string();
        let echo = thread::spawn(move || {
            let mut d = channel::connect_with(&bound, &options).unwrap();
            let mut copy = [0u8; 256];
            for _ in 0..WARM_UP + ROUNDS {
                let n = {
                    let m = d.recv().unwrap();
                    copy[..m.len()].copy_from_slice(&m);
                    m.len()
                };
                d.send(&copy[..n]).unwrap();
            }
        });
        let mut d = listener.accept().unwrap();
        let msg = [42u8; 200];
        let ping = |d: &mut channel::Duplex| {
            d.writer
                .send_vectored(&[&msg[..8], &msg[8..]], None)
                .unwrap();
            assert_eq!(d.recv().unwrap().len(), msg.len());
        };
        for _ in 0..WARM_UP {
            ping(&mut d);
        }
        // Helper threads (a shared-memory end's hang-up watcher) start up
        // on their own time; their start-up is not the steady state.
        thread::sleep(std::time::Duration::from_millis(100));
        let before = dhat::HeapStats::get();
        for _ in 0..ROUNDS {
            ping(&mut d);
        }
        let after = dhat::HeapStats::get();
        echo.join().unwrap();
        assert_eq!(
            after.total_blocks - before.total_blocks,
            0,
            "{url}: {} allocations in {ROUNDS} round trips",
            after.total_blocks - before.total_blocks
        );
    }
}
