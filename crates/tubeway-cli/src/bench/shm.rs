//! The bare shared-memory limits: round trips through a
//! `tubeway_ring::PingPong` with no payload (one cache line each way, the
//! floor of any shared-memory transport) or with a small payload copied in
//! and out (the floor of a small message). The far end is a `bench-peer`
//! child process, which gets the memfd over its Unix socket (SCM_RIGHTS, as
//! the shm transport passes its memory), or a thread of the bench for the
//! in-process transport.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tubeway_ring::{PingPong, Side, TimedOut};

use super::bare::Peer;
use super::latency;
use super::runner::{Count, GRACE};
use super::socket::Request;

/// The number that ends the far end's echo.
const STOP: u64 = u64::MAX;

/// Spins until the peer of `side` has posted `seq`, yielding the CPU
/// whenever a batch of polls (1024, some microseconds) finds nothing: on a
/// quiet machine an answer comes within the first batch, so this is a pure
/// spin; on a busy one a spinner whose peer was descheduled gives it the
/// core instead of burning its whole time slice. The clock is read only
/// between batches, never on the way to an answer: `past` is any instant
/// already passed, a deadline after which `wait` returns after one batch.
fn wait_yielding(
    pp: &PingPong,
    side: Side,
    seq: u64,
    past: Instant,
    give_up: Instant,
) -> Result<u64, TimedOut> {
    loop {
        match pp.wait(side, seq, Some(past)) {
            Ok(seen) => return Ok(seen),
            Err(_) if Instant::now() < give_up => std::thread::yield_now(),
            Err(e) => return Err(e),
        }
    }
}

/// The far end of the ping-pongs.
#[derive(Debug)]
pub enum Far {
    /// A `bench-peer` child listening on a Unix socket.
    Process(Peer),
    /// A thread of this process.
    Thread,
}

impl Far {
    /// Where the far end runs, as the report names the limit.
    pub fn between(&self) -> &'static str {
        match self {
            Far::Process(_) => "two processes",
            Far::Thread => "two threads",
        }
    }

    /// A fresh ping-pong whose far end echoes for at most `d` and a grace.
    pub fn open(&mut self, d: Duration) -> anyhow::Result<Arc<PingPong>> {
        let bound = d + GRACE;
        match self {
            Far::Process(peer) => {
                let pp = PingPong::create()?;
                let fd = pp
                    .fd()
                    .ok_or_else(|| anyhow::anyhow!("a memfd ping-pong has no descriptor"))?;
                let secs = u32::try_from(bound.as_secs() + 1).unwrap_or(u32::MAX);
                peer.open_with_fd(&Request::ShmPingPong { secs }, fd)?;
                Ok(Arc::new(pp))
            }
            Far::Thread => {
                let pp = Arc::new(PingPong::heap()?);
                let far = pp.clone();
                let give_up = Instant::now() + bound;
                std::thread::Builder::new()
                    .name("tubeway-bench-echo".into())
                    .spawn(move || {
                        let _ = echo(&far, give_up);
                    })?;
                Ok(pp)
            }
        }
    }

    /// An error if the far end's process has exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        match self {
            Far::Process(peer) => Ok(peer.check()?),
            Far::Thread => Ok(()),
        }
    }
}

/// The far end: answers each number the creator posts with the same number
/// and a copy of its payload, until [`STOP`] or `give_up`.
pub fn echo(pp: &PingPong, give_up: Instant) -> Result<(), TimedOut> {
    let mut buf = [0u8; PingPong::MAX_PAYLOAD];
    let past = Instant::now();
    let mut next = 1;
    loop {
        let seen = wait_yielding(pp, Side::Opener, next, past, give_up)?;
        if seen == STOP {
            return Ok(());
        }
        let n = pp.read_payload(Side::Opener, &mut buf);
        // `n` is at most MAX_PAYLOAD, so the post cannot fail.
        let _ = pp.post_payload(Side::Opener, seen, buf.get(..n).unwrap_or_default());
        next = seen + 1;
    }
}

/// Posts [`STOP`] when dropped: the far end stops however the run ends.
struct StopFarEnd<'a>(&'a PingPong);

impl Drop for StopFarEnd<'_> {
    fn drop(&mut self) {
        self.0.post(Side::Creator, STOP);
    }
}

/// Round trips with `payload` bytes each way (0: the bare cache-line
/// ping-pong) for `d`, each timed into `hist` if given; then stops the far
/// end. The payload is at most [`PingPong::MAX_PAYLOAD`].
pub fn round_trips(
    pp: &PingPong,
    payload: usize,
    d: Duration,
    mut hist: Option<&mut Histogram<u64>>,
) -> anyhow::Result<Count> {
    let _stop = StopFarEnd(pp);
    anyhow::ensure!(
        payload <= PingPong::MAX_PAYLOAD,
        "a ping-pong payload is at most {} bytes",
        PingPong::MAX_PAYLOAD
    );
    let sent = vec![0x5au8; payload];
    let mut back = vec![0u8; payload];
    let start = Instant::now();
    let (end, give_up) = (start + d, start + d + GRACE);
    let mut seq = 0;
    let mut t0 = start;
    while t0 < end {
        seq += 1;
        if payload == 0 {
            pp.post(Side::Creator, seq);
        } else {
            // Within MAX_PAYLOAD (checked above): cannot fail.
            let _ = pp.post_payload(Side::Creator, seq, &sent);
        }
        if wait_yielding(pp, Side::Creator, seq, start, give_up).is_err() {
            anyhow::bail!("the ping-pong peer stopped answering");
        }
        if payload > 0 {
            let n = pp.read_payload(Side::Creator, &mut back);
            anyhow::ensure!(
                n == payload,
                "the ping-pong peer echoed {n} bytes for {payload}"
            );
        }
        let t1 = Instant::now();
        if let Some(h) = hist.as_deref_mut() {
            latency::record(h, t1 - t0);
        }
        t0 = t1;
    }
    Ok(Count {
        ops: seq,
        secs: t0.duration_since(start).as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ping_pongs_echo_and_stop() {
        for payload in [0, 64, PingPong::MAX_PAYLOAD] {
            let mut far = Far::Thread;
            let pp = far.open(Duration::from_secs(5)).unwrap();
            let mut h = latency::histogram();
            let c = round_trips(&pp, payload, Duration::from_millis(20), Some(&mut h)).unwrap();
            assert!(c.ops > 0 && c.secs >= 0.02, "{c:?}");
            assert_eq!(h.len(), c.ops);
        }
        // Too large a payload fails at once, and the far end is stopped.
        let mut far = Far::Thread;
        let pp = far.open(Duration::from_secs(5)).unwrap();
        let too_big = PingPong::MAX_PAYLOAD + 1;
        assert!(round_trips(&pp, too_big, Duration::from_millis(5), None).is_err());
        assert_eq!(pp.peer(Side::Opener), STOP);
    }
}
