//! The figures of one transport and mode, each warmed up, then measured
//! `runs` times with its bare limits measured in the same runs,
//! interleaved, so that noise hits both sides of each ratio. The points of
//! a sweep (connections, requests in flight) are interleaved too, since
//! each is the other's reference.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tubeway::channel::ChannelOptions;
use tubeway::ClientOptions;

use super::args::{Group, LoneClient, Settings};
use super::bare::{self, Peer, STREAM_CHUNK};
use super::baselines::{mb, BareRuns};
use super::channel_peer::ChannelPeer;
use super::latency::{self, Latency};
use super::memory::Proc;
use super::modes::{ClientKind, Mode, Setup, Workload};
use super::progress::Progress;
use super::report::{Baseline, Figure, LatencyFigure, Rss, Stat};
use super::runner;
use super::shm::Far;
use super::target::Target;
use super::transport::Transport;
use super::wait::Wait;

/// The name of bare streaming through message-sized buffers, beside the
/// throughput of messages larger than a streaming write.
pub const STREAM_THROUGH_MEMORY: &str = "bare socket streaming through message-sized buffers";

/// In-flight count that stands for an open loop (the fixed-rate figure):
/// pipelined, so an async client's.
const OPEN_LOOP: usize = 0;

/// Everything the figures of one transport and way of waiting share.
#[derive(Debug)]
pub struct Bench<'a> {
    /// The options.
    pub settings: &'a Settings,
    /// The transport measured.
    pub transport: Transport,
    /// How every side waits.
    pub wait: Wait,
    /// The broker under test, if a mode needs one.
    pub target: Option<&'a mut Target>,
    /// The bare socket peer, for socket transports.
    pub peer: Option<&'a mut Peer>,
    /// The far end of the shared-memory ping-pongs.
    pub far: Option<&'a mut Far>,
    /// The echoing peer of the channel mode.
    pub channels: Option<&'a mut ChannelPeer>,
    /// The progress line.
    pub progress: &'a Progress,
    /// Makes queue and topic names unique.
    pub next_tag: usize,
    /// Where socket files go.
    pub dir: &'a Path,
}

/// Each run's payload MB/s at the rates (msg/s) of `msgs`.
fn mb_per_sec(msgs: Option<&Stat>, payload: usize) -> Option<Stat> {
    msgs.and_then(|m| Stat::of(m.runs.iter().map(|r| mb(r * payload as f64)).collect()))
}

/// `5 KB`, `2 MiB`, `64 B`: the way sizes were given.
pub fn size_label(n: usize) -> String {
    let n64 = n as u64;
    for (unit, div) in [("GB", 1_000_000_000u64), ("MB", 1_000_000), ("KB", 1000)] {
        if n64 >= div && n64.is_multiple_of(div) {
            return format!("{} {unit}", n64 / div);
        }
    }
    for (unit, div) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n64 >= div && n64.is_multiple_of(div) {
            return format!("{} {unit}", n64 / div);
        }
    }
    format!("{n} B")
}

impl Bench<'_> {
    fn what(&self, mode: &dyn Mode, label: &str) -> String {
        if self.wait.is_default() {
            format!("{} {} {label}", self.transport, mode.name())
        } else {
            format!(
                "{} {} {label} (wait {})",
                self.transport,
                mode.name(),
                self.wait
            )
        }
    }

    /// Turns a failure into the clearest error: the death of a process of
    /// ours if one died.
    fn explain(&mut self, e: anyhow::Error, what: &str) -> anyhow::Error {
        if let Some(Err(dead)) = self.target.as_deref_mut().map(Target::check) {
            return dead.context(format!("during {what}"));
        }
        if let Some(Err(dead)) = self.peer.as_deref_mut().map(Peer::check) {
            return anyhow::Error::new(dead).context(format!("during {what}"));
        }
        if let Some(Err(dead)) = self.far.as_deref_mut().map(Far::check) {
            return dead.context(format!("during {what}"));
        }
        if let Some(Err(dead)) = self.channels.as_deref_mut().map(ChannelPeer::check) {
            return anyhow::Error::new(dead).context(format!("during {what}"));
        }
        e.context(format!("during {what}"))
    }

    /// The largest message a figure sends (for a broker we started, its limit).
    pub fn max_message_size(&self) -> usize {
        match &self.target {
            Some(t) => t.max_message_size,
            None => super::target::max_message_size(self.settings.largest_payload()),
        }
    }

    async fn prepare(
        &mut self,
        mode: &dyn Mode,
        payload: usize,
        connections: usize,
        in_flight: usize,
    ) -> anyhow::Result<Arc<dyn Workload>> {
        self.next_tag += 1;
        let tag = format!("{}{}", self.transport, self.next_tag);
        let (url, options) = if mode.needs_broker() {
            let t = self
                .target
                .as_deref()
                .ok_or_else(|| anyhow::anyhow!("no broker for {}", mode.name()))?;
            (t.url.clone(), t.options.clone())
        } else {
            let peer = self
                .channels
                .as_deref()
                .ok_or_else(|| anyhow::anyhow!("no channel peer for {}", mode.name()))?;
            (peer.url().to_owned(), ClientOptions::default())
        };
        let mut channel = ChannelOptions::default().max_message_size(self.max_message_size());
        if let Some(w) = self.wait.strategy() {
            channel = channel.wait(w);
        }
        let setup = Setup {
            url,
            connections,
            in_flight,
            client: match mode.client(connections, in_flight) {
                ClientKind::Blocking if self.settings.lone_client == LoneClient::Async => {
                    ClientKind::Async
                }
                kind => kind,
            },
            // In the memory the docs advise for large payloads and the
            // memcpy limit copies (huge pages from 4 MiB up), so that the
            // ratio compares copies of the same memory.
            payload: Bytes::from_owner(tubeway::LargeBuffer::filled(payload, 0x5a)),
            subscribers: self.settings.subscribers,
            options,
            channel,
            tag,
        };
        mode.prepare(&setup).await
    }

    /// Throughput by payload size: one connection, one in flight.
    pub async fn size(&mut self, mode: &dyn Mode, payload: usize) -> anyhow::Result<Figure> {
        let label = size_label(payload);
        let what = self.what(mode, &label);
        self.size_inner(mode, payload, &label)
            .await
            .map_err(|e| self.explain(e, &what))
    }

    async fn size_inner(
        &mut self,
        mode: &dyn Mode,
        payload: usize,
        label: &str,
    ) -> anyhow::Result<Figure> {
        let s = self.settings;
        let exchanges = mode.exchanges(payload);
        let work = self.prepare(mode, payload, 1, 1).await?;
        runner::closed_loop(&work, 1, 1, s.warmup, false).await?;
        self.bare_round_trips(&exchanges, payload, s.warmup, false)
            .await?;
        let (mut ops, mut deliveries, mut drops) = (Vec::new(), Vec::new(), 0);
        let (mut bare, mut stream, mut copy) = (BareRuns::default(), Vec::new(), Vec::new());
        // A message larger than a streaming write cannot stay in the caches
        // as the bare streaming's buffer does: streamed again through
        // buffers of its size, to see what that costs the hardware.
        let through_memory = payload > STREAM_CHUNK;
        let mut stream_memory = Vec::new();
        let mut rss = Rss::default();
        let broker = if mode.needs_broker() {
            self.target.as_deref().and_then(Target::broker_proc)
        } else {
            self.channels.as_deref().and_then(ChannelPeer::proc)
        };
        for run in 0..s.runs {
            self.progress.doing(format!(
                "{} run {}/{}",
                self.what(mode, label),
                run + 1,
                s.runs
            ));
            bare.add(
                self.bare_round_trips(&exchanges, payload, s.duration, false)
                    .await?,
            );
            if let Some(r) = self.bare_stream(STREAM_CHUNK, s.duration).await? {
                stream.push(mb(r));
            }
            if through_memory {
                if let Some(r) = self.bare_stream(payload, s.duration).await? {
                    stream_memory.push(mb(r));
                }
            }
            let d = s.duration;
            let c = tokio::task::spawn_blocking(move || bare::memcpy(payload, d)).await?;
            copy.push(mb(c.rate()));
            // The peaks from here on belong to this run.
            let reset = Proc::This.reset_peak() && broker.is_none_or(|b| b.reset_peak());
            let out = runner::closed_loop(&work, 1, 1, s.duration, false).await?;
            ops.push(out.count.rate());
            deliveries.push(out.tally.deliveries as f64 / out.count.secs);
            drops += out.tally.drops;
            rss = Rss {
                bench_kib: Proc::This.peak_kib(),
                broker_kib: broker.and_then(Proc::peak_kib),
            };
            if !reset {
                rss.bench_kib = None;
                rss.broker_kib = None;
            }
        }
        work.close().await;
        let msgs = Stat::of(ops);
        let mbs = mb_per_sec(msgs.as_ref(), payload);
        let mut baselines = bare.rates(msgs.as_ref());
        if let Some(stream) = Stat::of(stream) {
            baselines.push(Baseline::paired(
                "bare socket streaming",
                "MB/s",
                Some(stream),
                mbs.as_ref(),
            ));
        }
        if let Some(stream) = Stat::of(stream_memory) {
            baselines.push(Baseline::paired(
                STREAM_THROUGH_MEMORY,
                "MB/s",
                Some(stream),
                mbs.as_ref(),
            ));
        }
        baselines.push(Baseline::paired(
            "memcpy, same size",
            "MB/s",
            Stat::of(copy),
            mbs.as_ref(),
        ));
        let publish = mode.name() == "publish";
        Ok(Figure {
            group: Some(Group::Size),
            label: label.to_owned(),
            payload,
            connections: 1,
            in_flight: 1,
            client: Some(work.client()),
            msgs_per_sec: msgs,
            mb_per_sec: mbs,
            deliveries_per_sec: publish.then(|| Stat::of(deliveries)).flatten(),
            drops: publish.then_some(drops),
            baselines,
            rss: Some(rss).filter(|r| r.bench_kib.is_some()),
            ..Figure::default()
        })
    }

    /// Throughput at every point of a sweep (`connections` or `in_flight`
    /// from `list`). The points are measured in turn within each run, on
    /// connections made for that run (see [`interleaved`]), so that a
    /// machine that changes speed during the sweep weighs on every point
    /// alike and the ratios between points stay ratios of the same time.
    pub async fn sweep(
        &mut self,
        mode: &dyn Mode,
        group: Group,
        list: &[usize],
    ) -> anyhow::Result<Vec<Figure>> {
        let s = self.settings;
        let points: Vec<SweepPoint> = list.iter().map(|&n| SweepPoint::new(group, n)).collect();
        let mut runs: Vec<SweepRuns> = points.iter().map(|_| SweepRuns::default()).collect();
        for (run, i) in interleaved(points.len(), s.runs) {
            let (point, runs) = (&points[i], &mut runs[i]);
            let what = self.what(mode, &point.label);
            self.progress
                .doing(format!("{what} run {}/{}", run + 1, s.runs));
            let one = self.sweep_run(mode, point).await;
            runs.add(one.map_err(|e| self.explain(e, &what))?);
            if runs.ops.len() == s.runs {
                self.progress.done_one();
            }
        }
        Ok(points
            .into_iter()
            .zip(runs)
            .map(|(point, runs)| point.figure(mode, s.sweep_payload, runs))
            .collect())
    }

    /// One run of one point: connections made, warmed up, measured once and
    /// closed.
    async fn sweep_run(&mut self, mode: &dyn Mode, point: &SweepPoint) -> anyhow::Result<SweepRun> {
        let s = self.settings;
        let (lanes, in_flight) = (point.connections, point.in_flight);
        let work = self
            .prepare(mode, s.sweep_payload, lanes, in_flight)
            .await?;
        let measured = async {
            runner::closed_loop(&work, lanes, in_flight, s.warmup, false).await?;
            runner::closed_loop(&work, lanes, in_flight, s.duration, false).await
        }
        .await;
        work.close().await;
        let out = measured?;
        Ok(SweepRun {
            ops: out.count.rate(),
            deliveries: out.tally.deliveries as f64 / out.count.secs,
            drops: out.tally.drops,
            client: work.client(),
        })
    }

    /// Round-trip latency, one in flight, beside the bare round trips'.
    pub async fn round_trip(&mut self, mode: &dyn Mode) -> anyhow::Result<Figure> {
        let s = self.settings;
        let payload = s.latency_payload;
        let label = format!("{}, 1 in flight", size_label(payload));
        let what = self.what(mode, "round trip");
        let exchanges = mode.exchanges(payload);
        let run = async {
            let work = self.prepare(mode, payload, 1, 1).await?;
            runner::closed_loop(&work, 1, 1, s.warmup, false).await?;
            self.bare_round_trips(&exchanges, payload, s.warmup, false)
                .await?;
            let (mut ops, mut lat, mut bare) = (Vec::new(), Vec::new(), BareRuns::default());
            let mut curves = Vec::new();
            for run in 0..s.runs {
                self.progress
                    .doing(format!("{what} run {}/{}", run + 1, s.runs));
                bare.add(
                    self.bare_round_trips(&exchanges, payload, s.duration, true)
                        .await?,
                );
                let out = runner::closed_loop(&work, 1, 1, s.duration, true).await?;
                ops.push(out.count.rate());
                if let Some(h) = out.hist {
                    lat.push(Latency::of(&h));
                    curves.push(latency::curve(&h));
                }
            }
            let curve = latency::median_run(&lat)
                .and_then(|i| curves.into_iter().nth(i))
                .unwrap_or_default();
            work.close().await;
            anyhow::Ok((ops, lat, bare, curve, work.client()))
        };
        let (ops, lat, bare, curve, client) = run.await.map_err(|e| self.explain(e, &what))?;
        let median = Latency::median(&lat);
        let p50s = Stat::of(lat.iter().map(|l| l.p50_us).collect());
        Ok(Figure {
            group: Some(Group::RoundTrip),
            label,
            payload,
            connections: 1,
            in_flight: 1,
            client: Some(client),
            msgs_per_sec: Stat::of(ops),
            latency: Some(LatencyFigure {
                median,
                runs: lat,
                curve,
                offered_rate: None,
                achieved_rate: None,
                sender_lag_us: None,
            }),
            baselines: bare.p50s(p50s.as_ref()),
            ..Figure::default()
        })
    }

    /// Latency at a fixed offered rate: one run of `latency_duration`.
    pub async fn rate(&mut self, mode: &dyn Mode) -> anyhow::Result<Figure> {
        let s = self.settings;
        let payload = s.latency_payload;
        let label = format!("{}, {} msg/s offered", size_label(payload), s.rate);
        let what = self.what(mode, "fixed rate");
        let run = async {
            let work = self.prepare(mode, payload, 1, OPEN_LOOP).await?;
            if !s.warmup.is_zero() {
                runner::fixed_rate(&work, 1, s.rate, s.warmup).await?;
            }
            self.progress.doing(format!(
                "{what}: {} msg/s for {:?}",
                s.rate, s.latency_duration
            ));
            let out = runner::fixed_rate(&work, 1, s.rate, s.latency_duration).await?;
            work.close().await;
            anyhow::Ok((out, work.client()))
        };
        let (out, client) = run.await.map_err(|e| self.explain(e, &what))?;
        let l = Latency::of(&out.hist);
        let publish = mode.name() == "publish";
        Ok(Figure {
            group: Some(Group::Rate),
            label,
            payload,
            connections: 1,
            in_flight: 0,
            client: Some(client),
            msgs_per_sec: Stat::of(vec![out.count.rate()]),
            deliveries_per_sec: publish
                .then(|| Stat::of(vec![out.tally.deliveries as f64 / out.count.secs]))
                .flatten(),
            drops: publish.then_some(out.tally.drops),
            latency: Some(LatencyFigure {
                median: l,
                runs: vec![l],
                curve: latency::curve(&out.hist),
                offered_rate: Some(s.rate),
                achieved_rate: Some(out.count.rate()),
                sender_lag_us: Some(out.lag.as_secs_f64() * 1e6),
            }),
            ..Figure::default()
        })
    }
}

/// The order of a sweep's measurements, as `(run, point)`: every point
/// once per run, forward in even runs and backward in odd ones. A shared
/// or virtual machine drifts, and switches between speeds of its own from
/// one second to the next; points measured one after the other would
/// each see a different stretch of it, and the ratio between two points
/// would measure the machine. In turn, and with the order reversed every
/// other run, each point sees the same stretches and a steady drift
/// weighs on the first and the last alike.
pub fn interleaved(points: usize, runs: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..runs).flat_map(move |run| {
        (0..points).map(move |k| (run, if run % 2 == 0 { k } else { points - 1 - k }))
    })
}

/// A point of a sweep: how many connections, and how many in flight on each.
struct SweepPoint {
    group: Group,
    connections: usize,
    in_flight: usize,
    label: String,
}

impl SweepPoint {
    fn new(group: Group, n: usize) -> SweepPoint {
        let (connections, in_flight, label) = match group {
            Group::InFlight => (1, n, format!("{n} in flight")),
            _ => (
                n,
                1,
                format!("{n} connection{}", if n == 1 { "" } else { "s" }),
            ),
        };
        SweepPoint {
            group,
            connections,
            in_flight,
            label,
        }
    }

    fn figure(self, mode: &dyn Mode, payload: usize, runs: SweepRuns) -> Figure {
        let msgs = Stat::of(runs.ops);
        let publish = mode.name() == "publish";
        Figure {
            group: Some(self.group),
            label: self.label,
            payload,
            connections: self.connections,
            in_flight: self.in_flight,
            client: runs.client,
            mb_per_sec: mb_per_sec(msgs.as_ref(), payload),
            msgs_per_sec: msgs,
            deliveries_per_sec: publish.then(|| Stat::of(runs.deliveries)).flatten(),
            drops: publish.then_some(runs.drops),
            ..Figure::default()
        }
    }
}

/// What one run of a sweep's point measured.
struct SweepRun {
    ops: f64,
    deliveries: f64,
    drops: u64,
    client: ClientKind,
}

/// The runs of one point so far.
#[derive(Default)]
struct SweepRuns {
    ops: Vec<f64>,
    deliveries: Vec<f64>,
    drops: u64,
    client: Option<ClientKind>,
}

impl SweepRuns {
    fn add(&mut self, run: SweepRun) {
        self.ops.push(run.ops);
        self.deliveries.push(run.deliveries);
        self.drops += run.drops;
        self.client = Some(run.client);
    }
}

/// Adds to each figure of a sweep its ratio to the sweep's first figure
/// (1 connection, say, or 4 connections for `--connections 4,100`),
/// measured in turn with it in the same runs.
pub fn relate_to_first(figures: &mut [Figure]) {
    let Some((first, rest)) = figures.split_first_mut() else {
        return;
    };
    if first.msgs_per_sec.is_none() {
        return;
    }
    for f in rest {
        let baseline = Baseline::paired(
            first.label.as_str(),
            "msg/s",
            first.msgs_per_sec.clone(),
            f.msgs_per_sec.as_ref(),
        );
        f.baselines.push(baseline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(64), "64 B");
        assert_eq!(size_label(5_000), "5 KB");
        assert_eq!(size_label(200_000_000), "200 MB");
        assert_eq!(size_label(2 << 20), "2 MiB");
        assert_eq!(size_label(1536), "1536 B");
        assert_eq!(size_label(0), "0 B");
    }

    #[test]
    fn a_sweep_measures_its_points_in_turn_and_reverses_every_other_run() {
        let order: Vec<_> = interleaved(3, 3).collect();
        assert_eq!(
            order,
            [
                (0, 0),
                (0, 1),
                (0, 2),
                (1, 2),
                (1, 1),
                (1, 0),
                (2, 0),
                (2, 1),
                (2, 2)
            ]
        );
        // A machine that halves its speed halfway through two runs: measured
        // point after point, the first point would be twice the second; in
        // turn, both see both halves.
        let speed = |step: usize| if step < 2 { 2.0 } else { 1.0 };
        let mut seen = [0.0f64; 2];
        for (step, (_, point)) in interleaved(2, 2).enumerate() {
            seen[point] += speed(step);
        }
        assert_eq!(seen[0], seen[1]);
        assert_eq!(interleaved(0, 3).count(), 0);
        assert_eq!(interleaved(4, 0).count(), 0);
    }

    #[test]
    fn sweeps_relate_to_their_first_figure() {
        let fig = |label: &str, runs: &[f64]| Figure {
            label: label.into(),
            msgs_per_sec: Stat::of(runs.to_vec()),
            ..Figure::default()
        };
        let mut figs = vec![
            fig("4 connections", &[100.0]),
            fig("100 connections", &[400.0]),
        ];
        relate_to_first(&mut figs);
        assert!(figs[0].baselines.is_empty());
        assert_eq!(figs[1].baselines[0].name, "4 connections");
        assert_eq!(figs[1].baselines[0].ratio, Some(4.0));

        // Run by run: the machine halved its speed in the third run, between
        // the two points. The ratio of the medians (300 against 500) would
        // say 0.6x; every run but that third says 1.2x, and it counts as
        // one run.
        let mut figs = vec![
            fig("4 connections", &[500.0, 500.0, 500.0, 250.0, 250.0]),
            fig("100 connections", &[600.0, 600.0, 300.0, 300.0, 300.0]),
        ];
        relate_to_first(&mut figs);
        let ratio = figs[1].baselines[0].ratio.unwrap_or_default();
        assert!((ratio - 1.2).abs() < 1e-9, "{ratio}");
    }
}
