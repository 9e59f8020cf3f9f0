//! Regions in memfds: sharing one between two mappings, and refusing a
//! region from a peer that is not exactly right.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::io;

use crate::{
    ConfigError, CreateError, Limits, OpenError, PingPong, Region, RingConfig, Side, WaitStrategy,
};

fn config(capacity: usize) -> RingConfig {
    RingConfig::default().capacity(capacity)
}

/// A region in a memfd, and a second descriptor of that memfd as a peer
/// would receive it.
fn shared(capacity: usize) -> (Region, OwnedFd) {
    let region = Region::create(&config(capacity)).unwrap();
    let fd = region.fd().unwrap().try_clone_to_owned().unwrap();
    (region, fd)
}

fn poke(fd: &OwnedFd, offset: u64, bytes: &[u8]) {
    assert_eq!(io::pwrite(fd, bytes, offset).unwrap(), bytes.len());
}

fn open(fd: OwnedFd) -> Result<Region, OpenError> {
    Region::open(fd, &Limits::default())
}

#[test]
fn two_mappings_of_one_memfd_talk_both_ways() {
    let (creator, fd) = shared(4096);
    let opener = Arc::new(open(fd).unwrap());
    let creator = Arc::new(creator);
    assert_eq!(opener.size(), creator.size());
    assert_eq!(opener.tx_capacity(Side::Opener), 4096);
    let (mut c_tx, mut c_rx) = creator.ends(Side::Creator).unwrap();
    let (mut o_tx, mut o_rx) = opener.ends(Side::Opener).unwrap();
    let wait = WaitStrategy::default();
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    let _ = c_tx.try_write(&[b"ping"]).unwrap();
    assert_eq!(&*o_rx.read(&wait, deadline).unwrap(), b"ping");
    let _ = o_tx.try_write(&[b"pong"]).unwrap();
    assert_eq!(&*c_rx.read(&wait, deadline).unwrap(), b"pong");
}

#[test]
fn bad_configurations_are_refused() {
    for (capacity, want) in [
        (100, ConfigError::NotPowerOfTwo(100)),
        (
            32,
            ConfigError::OutOfRange {
                capacity: 32,
                min: 64,
                max: 1 << 30,
            },
        ),
        (
            1 << 31,
            ConfigError::OutOfRange {
                capacity: 1 << 31,
                min: 64,
                max: 1 << 30,
            },
        ),
    ] {
        match Region::heap(&config(capacity)) {
            Err(CreateError::Config(got)) => assert_eq!(got, want),
            other => panic!("{capacity}: {other:?}"),
        }
    }
}

#[test]
fn a_wrong_magic_or_version_is_refused() {
    let (_region, fd) = shared(4096);
    poke(&fd, 0, b"NOTARING");
    assert!(matches!(open(fd), Err(OpenError::Magic { .. })));

    let (_region, fd) = shared(4096);
    // Version 2 published records by a tail index.
    poke(&fd, 8, &2u32.to_ne_bytes());
    assert!(matches!(
        open(fd),
        Err(OpenError::Version {
            found: 2,
            expected: 3
        })
    ));

    let (_region, fd) = shared(4096);
    poke(&fd, 128, b"NOTARING"); // ring 0's magic
    assert!(matches!(
        open(fd),
        Err(OpenError::RingHeader { ring: 0, .. })
    ));

    let (_region, fd) = shared(4096);
    let ring1 = 128 + std::mem::size_of::<crate::layout::RingHeader>() as u64;
    poke(&fd, ring1 + 8, &7u32.to_ne_bytes()); // ring 1's version
    assert!(matches!(
        open(fd),
        Err(OpenError::RingHeader { ring: 1, .. })
    ));
}

#[test]
fn sizes_and_offsets_that_are_not_the_layout_are_refused() {
    let (_region, fd) = shared(4096);
    poke(&fd, 16, &1u64.to_ne_bytes()); // region size
    assert!(matches!(open(fd), Err(OpenError::Geometry(_))));

    let (_region, fd) = shared(4096);
    poke(&fd, 32, &(1u64 << 40).to_ne_bytes()); // ring 0's data offset
    assert!(matches!(open(fd), Err(OpenError::Geometry(_))));

    let (_region, fd) = shared(4096);
    poke(&fd, 12, &64u32.to_ne_bytes()); // header size
    assert!(matches!(open(fd), Err(OpenError::Geometry(_))));

    let (_region, fd) = shared(4096);
    poke(&fd, 64, &8192u64.to_ne_bytes()); // ring 1's capacity: larger region
    assert!(matches!(open(fd), Err(OpenError::Geometry(_))));

    let (_region, fd) = shared(4096);
    poke(&fd, 128 + 16, &2048u64.to_ne_bytes()); // ring 0 header's capacity
    assert!(matches!(
        open(fd),
        Err(OpenError::RingHeader { ring: 0, .. })
    ));

    let (_region, fd) = shared(4096);
    poke(&fd, 40, &1000u64.to_ne_bytes()); // ring 0's capacity
    assert!(matches!(
        open(fd),
        Err(OpenError::Capacity {
            ring: 0,
            source: ConfigError::NotPowerOfTwo(1000)
        })
    ));
}

#[test]
fn regions_beyond_the_callers_limits_are_refused() {
    let limits = Limits::default().max_capacity(4096);
    let (_region, fd) = shared(64 * 1024);
    assert!(matches!(
        Region::open(fd, &limits),
        Err(OpenError::Size { .. })
    ));
    // A small file claiming a large ring.
    let (_region, fd) = shared(4096);
    poke(&fd, 40, &8192u64.to_ne_bytes());
    assert!(matches!(
        Region::open(fd, &limits),
        Err(OpenError::CapacityLimit {
            ring: 0,
            capacity: 8192,
            max: 4096
        })
    ));
}

#[test]
fn an_unsealed_memfd_is_refused() {
    let (region, fd) = shared(4096);
    let mut bytes = vec![0u8; region.size()];
    assert_eq!(io::pread(&fd, &mut bytes, 0).unwrap(), bytes.len());
    for seals in [
        SealFlags::empty(),
        SealFlags::SHRINK | SealFlags::SEAL,
        SealFlags::SHRINK | SealFlags::GROW,
    ] {
        let copy =
            fs::memfd_create("copy", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        fs::ftruncate(&copy, bytes.len() as u64).unwrap();
        poke(&copy, 0, &bytes);
        if !seals.is_empty() {
            fs::fcntl_add_seals(&copy, seals).unwrap();
        }
        assert!(matches!(open(copy), Err(OpenError::Unsealed)), "{seals:?}");
    }
    // The same bytes, sealed, are fine.
    let copy = fs::memfd_create("copy", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&copy, bytes.len() as u64).unwrap();
    poke(&copy, 0, &bytes);
    fs::fcntl_add_seals(&copy, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).unwrap();
    open(copy).unwrap();
}

#[test]
fn anything_but_a_memfd_or_a_file_of_the_wrong_size_is_refused() {
    let (socket, _other) = UnixStream::pair().unwrap();
    assert!(matches!(
        open(OwnedFd::from(socket)),
        Err(OpenError::Seals(_))
    ));
    let small = fs::memfd_create("small", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&small, 100).unwrap();
    fs::fcntl_add_seals(
        &small,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )
    .unwrap();
    assert!(matches!(
        open(small),
        Err(OpenError::Size { size: 100, .. })
    ));
}

#[test]
fn a_ping_pong_crosses_threads_and_mappings() {
    let created = Arc::new(PingPong::create().unwrap());
    let opened =
        Arc::new(PingPong::open(created.fd().unwrap().try_clone_to_owned().unwrap()).unwrap());
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    let echo = std::thread::spawn(move || {
        for seq in 1..=1000 {
            assert_eq!(opened.wait(Side::Opener, seq, deadline), Ok(seq));
            opened.post(Side::Opener, seq);
        }
    });
    for seq in 1..=1000 {
        created.post(Side::Creator, seq);
        assert_eq!(created.wait(Side::Creator, seq, deadline), Ok(seq));
    }
    echo.join().unwrap();
    assert_eq!(created.peer(Side::Creator), 1000);
    let heap = PingPong::heap().unwrap();
    assert!(heap.fd().is_none());
    assert_eq!(
        heap.wait(Side::Opener, 1, Some(Instant::now())),
        Err(crate::TimedOut)
    );
}

#[test]
fn a_ping_pong_carries_payloads_both_ways() {
    let created = Arc::new(PingPong::create().unwrap());
    let opened =
        Arc::new(PingPong::open(created.fd().unwrap().try_clone_to_owned().unwrap()).unwrap());
    let deadline = Some(Instant::now() + Duration::from_secs(10));
    let max = PingPong::MAX_PAYLOAD;
    // The opener answers each payload with its bytes reversed.
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; max];
        for seq in 1..=(max as u64 + 1) {
            assert_eq!(opened.wait(Side::Opener, seq, deadline), Ok(seq));
            let n = opened.read_payload(Side::Opener, &mut buf);
            buf[..n].reverse();
            opened.post_payload(Side::Opener, seq, &buf[..n]).unwrap();
        }
    });
    let mut back = vec![0u8; max];
    for len in 0..=max {
        let sent: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let seq = len as u64 + 1;
        created.post_payload(Side::Creator, seq, &sent).unwrap();
        assert_eq!(created.wait(Side::Creator, seq, deadline), Ok(seq));
        assert_eq!(created.read_payload(Side::Creator, &mut back), len);
        let mut expected = sent.clone();
        expected.reverse();
        assert_eq!(&back[..len], &expected[..], "{len} bytes");
    }
    echo.join().unwrap();
    // A short buffer gets the start; too long a payload posts nothing.
    let mut three = [0u8; 3];
    assert_eq!(created.read_payload(Side::Creator, &mut three), 3);
    assert_eq!(
        created.post_payload(Side::Creator, 999, &vec![0; max + 1]),
        Err(crate::PostError::TooLarge { len: max + 1, max })
    );
    assert_eq!(created.peer(Side::Opener), max as u64 + 1);
}

#[test]
fn a_ping_pong_with_a_wrong_magic_is_refused() {
    let pp = PingPong::create().unwrap();
    let fd = pp.fd().unwrap().try_clone_to_owned().unwrap();
    poke(&fd, 0, b"NOTAPING");
    assert!(matches!(PingPong::open(fd), Err(OpenError::Magic { .. })));
    let (region, fd) = shared(4096);
    drop(region);
    assert!(matches!(PingPong::open(fd), Err(OpenError::Size { .. })));
    let _ = AsFd::as_fd(&pp.fd().unwrap());
}
