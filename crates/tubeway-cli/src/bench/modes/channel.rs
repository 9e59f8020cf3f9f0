//! `channel`: a raw point-to-point channel (`tubeway::channel`), no broker.
//!
//! An operation is one message to the peer and back: the peer (a
//! `bench-peer` child process, or a thread of this process for `mem`)
//! echoes every message. Echo, not a one-way stream, because the issue's
//! channel target is a round trip, and because it makes every channel figure
//! comparable with the bare ping-pongs and with `echo` through the broker.
//!
//! One message in flight is a send and a receive on the lane's thread. With
//! more in flight, the same thread keeps the window full with `try_send`
//! and receives the echoes (a writer thread of its own would add a third
//! busy thread, and a wake-up whenever the window fills, which on a small
//! machine costs more than it saves). A fixed-rate run paces a writer thread
//! by the schedule while another thread receives, so a late echo delays no
//! send.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use tubeway::channel::{self, Duplex, Reader, SendError, TrySendError};

use super::{ClientKind, Exchange, Lane, Mode, Setup, Tally, Workload};
use crate::bench::latency;
use crate::bench::rate::{wait_for, Schedule};
use crate::bench::runner::{Count, RateOutcome, GRACE};
use crate::bench::threads::off_runtime;

/// The length prefix of a message on a stream channel (the bytes a bare
/// socket ping-pong adds to the payload).
const PREFIX: usize = 4;
/// How long a stream window waits for an echo before it looks again at
/// the rest of a message to write.
const STREAM_SLICE: Duration = Duration::from_micros(200);

/// See the module.
#[derive(Debug)]
pub struct Channel;

impl Mode for Channel {
    fn name(&self) -> &'static str {
        "channel"
    }

    fn about(&self) -> &'static str {
        "point-to-point channel, no broker: the payload to a peer and back (echo)"
    }

    fn exchanges(&self, payload: usize) -> Vec<Exchange> {
        vec![Exchange {
            up: PREFIX + payload,
            down: PREFIX + payload,
        }]
    }

    fn needs_broker(&self) -> bool {
        false
    }

    fn client(&self, _connections: usize, _in_flight: usize) -> ClientKind {
        ClientKind::Channel
    }

    fn prepare<'a>(&'a self, setup: &'a Setup) -> BoxFuture<'a, anyhow::Result<Arc<dyn Workload>>> {
        Box::pin(async move {
            let (url, options, n) = (setup.url.clone(), setup.channel.clone(), setup.connections);
            let duplexes = off_runtime("connecting channels", move || {
                (0..n)
                    .map(|_| channel::connect_with(&url, &options))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?
            .with_context(|| format!("connecting to the channel peer at {}", setup.url))?;
            let url: tubeway::Url = setup.url.parse()?;
            let stream = matches!(
                url,
                tubeway::Url::Tcp { .. } | tubeway::Url::Unix(_) | tubeway::Url::Fifo(_)
            );
            Ok(Arc::new(Channels {
                slots: duplexes.into_iter().map(|d| Mutex::new(Some(d))).collect(),
                payload: setup.payload.clone(),
                in_flight: setup.in_flight.max(1),
                stream,
            }) as Arc<dyn Workload>)
        })
    }
}

/// The channels of a figure. A lane takes its channel out of its slot for
/// the run and puts it back when done.
struct Channels {
    slots: Vec<Mutex<Option<Duplex>>>,
    payload: Bytes,
    in_flight: usize,
    /// Whether the channels are byte streams (unix, tcp, fifo), not rings.
    stream: bool,
}

impl Channels {
    fn take(&self, lane: usize) -> anyhow::Result<(&Mutex<Option<Duplex>>, Duplex)> {
        let slot = super::pick(&self.slots, lane)?;
        let duplex = slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| anyhow::anyhow!("channel {lane} is in use or broken"))?;
        Ok((slot, duplex))
    }
}

fn put_back(slot: &Mutex<Option<Duplex>>, duplex: Duplex) {
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(duplex);
}

/// Receives one echo of `len` bytes before `give_up`.
fn recv_echo(reader: &mut Reader, len: usize, give_up: Instant) -> anyhow::Result<()> {
    let echo = reader
        .recv_deadline(Some(give_up))?
        .ok_or_else(|| anyhow::anyhow!("no echo from the channel peer in time"))?;
    anyhow::ensure!(
        echo.len() == len,
        "the channel peer echoed {} bytes for {len}",
        echo.len()
    );
    Ok(())
}

impl Workload for Channels {
    fn client(&self) -> ClientKind {
        ClientKind::Channel
    }

    fn lane(&self, lane: usize, give_up: Instant) -> anyhow::Result<Box<dyn Lane + '_>> {
        let (slot, duplex) = self.take(lane)?;
        if self.in_flight == 1 {
            return Ok(Box::new(RoundTrips {
                slot,
                duplex: Some(duplex),
                payload: &self.payload,
                give_up,
            }));
        }
        Ok(Box::new(Window {
            slot,
            duplex: Some(duplex),
            payload: &self.payload,
            window: self.in_flight,
            outstanding: 0,
            stream: self.stream,
            started: Instant::now(),
            give_up,
        }))
    }

    fn fixed_rate(
        &self,
        rate: u64,
        d: Duration,
    ) -> Option<BoxFuture<'_, anyhow::Result<RateOutcome>>> {
        Some(Box::pin(async move {
            let (slot, duplex) = self.take(0)?;
            let payload = self.payload.clone();
            let (outcome, duplex) = off_runtime("a fixed-rate channel run", move || {
                paced(duplex, payload, rate, d)
            })
            .await??;
            put_back(slot, duplex);
            Ok(outcome)
        }))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        // Dropping an end closes it; the peer's thread then ends.
        for slot in &self.slots {
            slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
        Box::pin(async {})
    }
}

/// One message in flight: send, then receive its echo.
struct RoundTrips<'a> {
    slot: &'a Mutex<Option<Duplex>>,
    duplex: Option<Duplex>,
    payload: &'a [u8],
    give_up: Instant,
}

impl Lane for RoundTrips<'_> {
    fn op(&mut self) -> anyhow::Result<()> {
        let d = self
            .duplex
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("channel gone"))?;
        d.writer
            .send_vectored(&[self.payload], Some(self.give_up))?;
        recv_echo(&mut d.reader, self.payload.len(), self.give_up)
    }
}

impl Drop for RoundTrips<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.duplex.take() {
            put_back(self.slot, d);
        }
    }
}

/// Several messages in flight, on the lane's thread alone: it tops the
/// window up with `try_send` (which never waits), then receives one echo.
/// It never blocks on a send while the peer may be blocked on an echo to
/// it, so the two cannot wait for each other.
struct Window<'a> {
    slot: &'a Mutex<Option<Duplex>>,
    duplex: Option<Duplex>,
    payload: &'a [u8],
    window: usize,
    outstanding: usize,
    /// A stream channel: `try_send` may take a message in part, and the
    /// rest must go out before its echo can come back.
    stream: bool,
    /// When the lane started: a deadline already passed, for a flush that
    /// must not wait.
    started: Instant,
    give_up: Instant,
}

impl Window<'_> {
    fn duplex(&mut self) -> anyhow::Result<&mut Duplex> {
        self.duplex
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("channel gone"))
    }

    fn top_up(&mut self) -> anyhow::Result<()> {
        let (payload, give_up) = (self.payload, self.give_up);
        while self.outstanding < self.window {
            let outstanding = self.outstanding;
            let d = self.duplex()?;
            match d.writer.try_send_vectored(&[payload]) {
                Ok(()) => {}
                Err(TrySendError::Full) => break,
                // Larger than a ring's record: sent in fragments, waiting for
                // room, only while no echo is on its way to block the peer.
                Err(TrySendError::TooLarge { .. }) if outstanding == 0 => {
                    d.writer.send_vectored(&[payload], Some(give_up))?;
                }
                Err(TrySendError::TooLarge { .. }) => break,
                Err(e) => return Err(e.into()),
            }
            self.outstanding += 1;
        }
        Ok(())
    }

    fn recv_one(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.outstanding > 0, "no message in flight");
        let (len, give_up, stream, past) =
            (self.payload.len(), self.give_up, self.stream, self.started);
        let d = self.duplex()?;
        if !stream {
            recv_echo(&mut d.reader, len, give_up)?;
        } else {
            // Writes what it can of the rest of a message taken in part
            // (without waiting: the peer may be busy echoing to us), then
            // waits a slice of time for an echo.
            loop {
                match d.writer.flush(Some(past)) {
                    Ok(()) | Err(SendError::TimedOut) => {}
                    Err(e) => return Err(e.into()),
                }
                let soon = Instant::now() + STREAM_SLICE;
                if let Some(echo) = d.reader.recv_deadline(Some(soon))? {
                    anyhow::ensure!(
                        echo.len() == len,
                        "the channel peer echoed {} bytes for {len}",
                        echo.len()
                    );
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < give_up,
                    "no echo from the channel peer in time"
                );
            }
        }
        self.outstanding -= 1;
        Ok(())
    }
}

impl Lane for Window<'_> {
    fn op(&mut self) -> anyhow::Result<()> {
        self.top_up()?;
        self.recv_one()
    }

    fn finish(&mut self) -> anyhow::Result<u64> {
        let mut done = 0;
        while self.outstanding > 0 {
            self.recv_one()?;
            done += 1;
        }
        Ok(done)
    }
}

impl Drop for Window<'_> {
    fn drop(&mut self) {
        // Echoes still on their way (after a failure) would confuse the
        // next figure: only a drained channel goes back.
        if let Some(d) = self.duplex.take() {
            if self.outstanding == 0 {
                put_back(self.slot, d);
            }
        }
    }
}

/// Sends at `rate` for `d` from a writer thread, whatever the echoes do,
/// and times each echo from its message's intended send time. Echoes come
/// back in order, so the `i`-th echo answers message `i`.
fn paced(
    duplex: Duplex,
    payload: Bytes,
    rate: u64,
    d: Duration,
) -> anyhow::Result<(RateOutcome, Duplex)> {
    let (mut writer, mut reader) = duplex.split();
    let start = Instant::now();
    let schedule = Schedule::new(start, rate, d);
    let give_up = start + d + GRACE;
    let len = payload.len();
    let pacer = std::thread::Builder::new()
        .name("tubeway-bench-pacer".into())
        .spawn(move || {
            let mut lag = Duration::ZERO;
            for i in 0..schedule.total() {
                loop {
                    let now = Instant::now();
                    if schedule.due_by(now) > i {
                        lag = lag.max(now.saturating_duration_since(schedule.intended(i)));
                        break;
                    }
                    wait_for(schedule.intended(i).saturating_duration_since(now));
                }
                writer.send_vectored(&[&payload], Some(give_up))?;
            }
            anyhow::Ok((writer, lag))
        })?;
    let mut hist = latency::histogram();
    let mut received = 0;
    let result = (|| {
        for i in 0..schedule.total() {
            recv_echo(&mut reader, len, give_up)?;
            latency::record(&mut hist, schedule.intended(i).elapsed());
            received += 1;
        }
        anyhow::Ok(())
    })();
    let secs = start.elapsed().as_secs_f64();
    let (writer, lag) = pacer
        .join()
        .map_err(|_| anyhow::anyhow!("the pacer thread panicked"))??;
    result?;
    let outcome = RateOutcome {
        count: Count {
            ops: received,
            secs,
        },
        tally: Tally::default(),
        hist,
        lag,
    };
    Ok((outcome, Duplex { writer, reader }))
}
