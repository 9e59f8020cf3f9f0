//! The bare limits of a transport, measured for one figure or for the
//! transport's limits section: the socket ping-pong of the figure's bytes
//! and bare streaming (sockets), the shared-memory ping-pongs (shm, and
//! between threads for the in-process transport), memcpy.

use std::time::Duration;

use tubeway_ring::PingPong;

use super::bare::{self, STREAM_CHUNK};
use super::figures::{size_label, Bench};
use super::latency::{self, Latency};
use super::modes::Exchange;
use super::report::{Baseline, Figure, LatencyFigure, Stat};
use super::runner::Count;
use super::shm;
use super::socket::Request;

/// Payload of the shared-memory ping-pong in the limits section when the
/// latency payload does not fit one (the 64 B).
const LIMIT_PAYLOAD: usize = 64;

/// One run of one bare round-trip limit.
#[derive(Debug)]
pub struct BareRun {
    /// What was measured.
    pub name: String,
    /// Round trips in the run's time.
    pub count: Count,
    /// Each round trip's time, if recorded.
    pub latency: Option<Latency>,
    /// For a socket ping-pong: the share of its exchanges made with both
    /// ends on one CPU.
    pub shared_cpu: Option<f64>,
}

/// The median over `runs` of the share of exchanges made on one CPU, for a
/// limit that counts it.
fn shared_cpu(runs: &[BareRun]) -> Option<f64> {
    let shares: Vec<f64> = runs.iter().filter_map(|r| r.shared_cpu).collect();
    Stat::of(shares).map(|s| s.median)
}

/// The runs of each bare limit of a figure, by name, in the order measured.
#[derive(Debug, Default)]
pub struct BareRuns(Vec<(String, Vec<BareRun>)>);

impl BareRuns {
    /// Adds one run of each limit.
    pub fn add(&mut self, runs: Vec<BareRun>) {
        for run in runs {
            match self.0.iter_mut().find(|(name, _)| *name == run.name) {
                Some((_, all)) => all.push(run),
                None => self.0.push((run.name.clone(), vec![run])),
            }
        }
    }

    /// Each limit's rate (round trips per second) beside `figure` (msg/s),
    /// measured run for run with it.
    pub fn rates(&self, figure: Option<&Stat>) -> Vec<Baseline> {
        self.0
            .iter()
            .map(|(name, runs)| {
                let rates = runs.iter().map(|r| r.count.rate()).collect();
                Baseline::paired(name.clone(), "msg/s", Stat::of(rates), figure)
                    .on_one_cpu(shared_cpu(runs))
            })
            .collect()
    }

    /// Each limit's median round trip beside `figure` (the p50 of each run,
    /// µs), measured run for run with it.
    pub fn p50s(&self, figure: Option<&Stat>) -> Vec<Baseline> {
        self.0
            .iter()
            .map(|(name, runs)| {
                let p50 = runs
                    .iter()
                    .filter_map(|r| r.latency.map(|l| l.p50_us))
                    .collect();
                Baseline::paired(format!("{name} p50"), "us", Stat::of(p50), figure)
                    .on_one_cpu(shared_cpu(runs))
            })
            .collect()
    }

    /// Each limit as a figure of the limits section.
    fn figures(self) -> Vec<Figure> {
        self.0
            .into_iter()
            .map(|(name, runs)| {
                let lat: Vec<Latency> = runs.iter().filter_map(|r| r.latency).collect();
                Figure {
                    label: name,
                    in_flight: 1,
                    msgs_per_sec: Stat::of(runs.iter().map(|r| r.count.rate()).collect()),
                    latency: Some(LatencyFigure {
                        median: Latency::median(&lat),
                        runs: lat,
                        curve: Vec::new(),
                        offered_rate: None,
                        achieved_rate: None,
                        sender_lag_us: None,
                    }),
                    ..Figure::default()
                }
            })
            .collect()
    }
}

/// Bytes per second as MB/s (10^6 bytes), the unit of every bandwidth figure.
pub(super) fn mb(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1e6
}

impl Bench<'_> {
    /// One run of each bare round-trip limit of this transport for a figure
    /// moving `exchanges` with `payload` bytes of payload: the socket
    /// ping-pong of the same bytes (polling in latency mode); or the
    /// shared-memory cache-line ping-pong and, when the payload fits one,
    /// the ping-pong with that payload.
    pub async fn bare_round_trips(
        &mut self,
        exchanges: &[Exchange],
        payload: usize,
        d: Duration,
        record: bool,
    ) -> anyhow::Result<Vec<BareRun>> {
        let mut out = Vec::new();
        let poll = self.wait.spins();
        if let (Some(peer), Some(request)) = (
            self.peer.as_deref_mut(),
            bare::ping_pong_request(exchanges, poll),
        ) {
            let mut s = peer.open(&request)?;
            let exchanges = exchanges.to_vec();
            let (run, latency) = tokio::task::spawn_blocking(move || {
                let mut hist = record.then(latency::histogram);
                let run = bare::ping_pong(&mut s, &exchanges, d, poll, hist.as_mut())?;
                anyhow::Ok((run, hist.map(|h| Latency::of(&h))))
            })
            .await??;
            let name = if poll {
                "bare socket ping-pong, same bytes, polling"
            } else {
                "bare socket ping-pong, same bytes"
            };
            out.push(BareRun {
                name: name.to_owned(),
                count: run.count,
                latency,
                shared_cpu: Some(run.shared_cpu),
            });
        }
        if self.far.is_some() {
            let with_payload = (1..=PingPong::MAX_PAYLOAD).contains(&payload);
            for p in [0].into_iter().chain(with_payload.then_some(payload)) {
                out.push(self.shm_round_trips(p, d, record).await?);
            }
        }
        Ok(out)
    }

    /// One run of the shared-memory ping-pong with `payload` bytes each way.
    async fn shm_round_trips(
        &mut self,
        payload: usize,
        d: Duration,
        record: bool,
    ) -> anyhow::Result<BareRun> {
        let Some(far) = self.far.as_deref_mut() else {
            anyhow::bail!("no shared-memory ping-pong on this transport");
        };
        let between = far.between();
        let pp = far.open(d)?;
        let (count, latency) = tokio::task::spawn_blocking(move || {
            let mut hist = record.then(latency::histogram);
            let count = shm::round_trips(&pp, payload, d, hist.as_mut())?;
            anyhow::Ok((count, hist.map(|h| Latency::of(&h))))
        })
        .await??;
        let name = if payload == 0 {
            format!("shared-memory cache-line ping-pong, {between}")
        } else {
            format!(
                "shared-memory ping-pong, {} payload, {between}",
                size_label(payload)
            )
        };
        Ok(BareRun {
            name,
            count,
            latency,
            shared_cpu: None,
        })
    }

    /// Bare streaming, one run, in bytes per second; `None` without a peer.
    /// `memory`: the bytes of each side's buffer (see [`bare::stream`]).
    pub async fn bare_stream(&mut self, memory: usize, d: Duration) -> anyhow::Result<Option<f64>> {
        let Some(peer) = self.peer.as_deref_mut() else {
            return Ok(None);
        };
        let memory = memory.max(STREAM_CHUNK);
        let buffer = u32::try_from(memory)?;
        let s = peer.open(&Request::Sink { buffer })?;
        let c = tokio::task::spawn_blocking(move || bare::stream(s, memory, d)).await??;
        Ok(Some(c.rate()))
    }

    /// The transport's limits section: bare streaming (sockets), and the
    /// shared-memory ping-pongs with no payload and a small one, each warmed
    /// up, then measured `runs` times.
    pub async fn measure_limits(&mut self) -> anyhow::Result<Vec<Figure>> {
        let s = self.settings;
        let mut figures = Vec::new();
        if self.peer.is_some() {
            self.progress
                .doing(format!("{} bare streaming", self.transport));
            self.bare_stream(STREAM_CHUNK, s.warmup).await?;
            let mut runs = Vec::new();
            for _ in 0..s.runs {
                if let Some(r) = self.bare_stream(STREAM_CHUNK, s.duration).await? {
                    runs.push(mb(r));
                }
            }
            figures.push(Figure {
                label: "bare socket streaming, 1 MiB writes, two processes".to_owned(),
                mb_per_sec: Stat::of(runs),
                ..Figure::default()
            });
        }
        if self.far.is_some() {
            self.progress
                .doing(format!("{} bare shared-memory ping-pongs", self.transport));
            let payload = if (1..=PingPong::MAX_PAYLOAD).contains(&s.latency_payload) {
                s.latency_payload
            } else {
                LIMIT_PAYLOAD
            };
            let mut runs = BareRuns::default();
            for p in [0, payload] {
                self.shm_round_trips(p, s.warmup, false).await?;
                for _ in 0..s.runs {
                    runs.add(vec![self.shm_round_trips(p, s.duration, true).await?]);
                }
            }
            figures.extend(runs.figures());
        }
        Ok(figures)
    }
}
