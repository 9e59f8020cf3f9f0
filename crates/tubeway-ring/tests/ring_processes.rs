//! A writer and a reader in two processes, each way at once, through one
//! memfd region: millions of checked messages, some fragmented.
//!
//! The child is this test binary run again, with only the ignored test
//! `child_side` selected; it inherits a descriptor of the memfd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Arc;

use tubeway_ring::{Limits, Region, RingConfig, Side, WaitStrategy};

/// The environment variable that tells the child its descriptor.
const CHILD_FD: &str = "TUBEWAY_RING_TEST_CHILD_FD";

/// Messages each way.
const MESSAGES: u64 = 3_000_000;

/// Streams: creator to opener, opener to creator.
const TO_OPENER: u64 = 1;
const TO_CREATOR: u64 = 2;

fn config() -> RingConfig {
    // Small enough that the largest messages are fragmented.
    RingConfig::default().capacity(64 * 1024)
}

/// Writes one stream on a thread and reads the other, as `side`.
fn run_side(region: Region, side: Side) {
    let region = Arc::new(region);
    let (mut tx, mut rx) = region.ends(side).unwrap();
    let (out, inn) = match side {
        Side::Creator => (TO_OPENER, TO_CREATOR),
        Side::Opener => (TO_CREATOR, TO_OPENER),
    };
    let strategy = WaitStrategy::default();
    std::thread::scope(|s| {
        s.spawn(|| common::write_stream(&mut tx, out, MESSAGES, &strategy));
        common::read_stream(&mut rx, inn, MESSAGES, &strategy);
    });
}

#[test]
fn two_processes_stream_both_ways() {
    let region = Region::create(&config()).unwrap();
    // A descriptor without close-on-exec, for the child to inherit.
    let inheritable = rustix::io::dup(region.fd().unwrap()).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_side", "--ignored", "--test-threads=1"])
        .env(CHILD_FD, inheritable.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(inheritable);
    run_side(region, Side::Creator);
    // The child ends by itself: each of its waits has a deadline.
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
#[ignore = "the child process of two_processes_stream_both_ways"]
fn child_side() {
    let fd: i32 = std::env::var(CHILD_FD).unwrap().parse().unwrap();
    // SAFETY: the parent passed this descriptor, inherited across exec and
    // owned by nothing else in this process.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let region = Region::open(fd, &Limits::default()).unwrap();
    run_side(region, Side::Opener);
}
