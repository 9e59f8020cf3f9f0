//! The whole run: for each way of waiting and each transport, its limits,
//! then each mode's figures; last, latency mode related to the default.

use std::path::{Path, PathBuf};

use super::args::{Group, Settings};
use super::bare::Peer;
use super::channel_peer::ChannelPeer;
use super::figures::{relate_to_first, size_label, Bench};
use super::idle;
use super::modes::Mode;
use super::progress::Progress;
use super::report::{Baseline, Figure, Section};
use super::shm::Far;
use super::target::{Target, HEADER_ROOM};
use super::transport::{BareKind, Transport};
use super::wait::Wait;

/// A private directory for socket files, removed when dropped.
#[derive(Debug)]
pub struct WorkDir(PathBuf);

impl WorkDir {
    /// Creates `tubeway-bench-PID` in the temporary directory.
    pub fn new() -> anyhow::Result<WorkDir> {
        let dir = std::env::temp_dir().join(format!("tubeway-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(WorkDir(dir))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The modes measured on `transport`: a transport without a broker carries
/// only the modes that need none.
fn modes_of(s: &Settings, transport: Transport) -> Vec<&'static dyn Mode> {
    s.modes
        .iter()
        .copied()
        .filter(|m| transport.brokered() || !m.needs_broker())
        .collect()
}

/// Whether the broker's idle memory is measured in pass `pass`: once per
/// transport, in the first pass, on a broker that waits by default.
fn wants_memory(s: &Settings, transport: Transport, pass: usize) -> bool {
    s.wants(Group::Memory) && pass == 0 && modes_of(s, transport).iter().any(|m| m.needs_broker())
}

/// How many figures `settings` asks for, for the progress line.
pub fn planned(s: &Settings) -> u64 {
    let per_mode = [
        (Group::Size, s.payloads.len()),
        (Group::Connections, s.connections.len()),
        (Group::InFlight, s.in_flight.len()),
        (Group::RoundTrip, 1),
        (Group::Rate, 1),
    ]
    .iter()
    .filter(|(g, _)| s.wants(*g))
    .map(|(_, n)| n)
    .sum::<usize>();
    let mut total = 0;
    for pass in 0..s.waits.len() {
        for &t in &s.transports {
            let memory = usize::from(wants_memory(s, t, pass));
            total += 1 + modes_of(s, t).len() * per_mode + memory;
        }
    }
    total as u64
}

/// What one transport's figures run against; stopped when done.
#[derive(Default)]
struct Ends {
    target: Option<Target>,
    peer: Option<Peer>,
    far: Option<Far>,
    channels: Option<ChannelPeer>,
}

impl Ends {
    /// Starts what `modes` need on `transport`, each side waiting by `wait`.
    async fn start(
        s: &Settings,
        transport: Transport,
        wait: Wait,
        modes: &[&'static dyn Mode],
        dir: &Path,
        progress: &Progress,
    ) -> anyhow::Result<Ends> {
        // Each end is kept as soon as it runs, so a failure stops what did start.
        let mut ends = Ends::default();
        let started = async {
            if modes.iter().any(|m| m.needs_broker()) {
                progress.doing(format!("{transport}: starting the broker"));
                let (url, largest) = (s.url.as_deref(), s.largest_payload());
                let target = Target::start(transport, url, largest, dir, "broker", wait).await?;
                ends.target = Some(target);
            }
            let d = dir.to_owned();
            let peer = || tokio::task::spawn_blocking(move || Peer::start(transport, &d));
            match transport.bare() {
                BareKind::Socket => ends.peer = Some(peer().await??),
                BareKind::SharedMemory => ends.far = Some(Far::Process(peer().await??)),
                BareKind::Threads => ends.far = Some(Far::Thread),
                BareKind::None => {}
            }
            if modes.iter().any(|m| !m.needs_broker()) {
                progress.doing(format!("{transport}: starting the channel peer"));
                let max = super::target::max_message_size(s.largest_payload());
                let d = dir.to_owned();
                let start = move || ChannelPeer::start(transport, &d, wait, max);
                ends.channels = Some(tokio::task::spawn_blocking(start).await??);
            }
            anyhow::Ok(())
        }
        .await;
        match started {
            Ok(()) => Ok(ends),
            Err(e) => {
                ends.stop().await;
                Err(e)
            }
        }
    }

    async fn stop(self) {
        if let Some(t) = self.target {
            t.stop().await;
        }
        let (peer, far, channels) = (self.peer, self.far, self.channels);
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(p) = peer {
                p.stop();
            }
            if let Some(Far::Process(p)) = far {
                p.stop();
            }
            if let Some(c) = channels {
                c.stop();
            }
        })
        .await;
    }
}

/// Measures everything `settings` asks for.
pub async fn run(s: &Settings, progress: &Progress) -> anyhow::Result<Vec<Section>> {
    let dir = WorkDir::new()?;
    let mut sections = Vec::new();
    for (pass, &wait) in s.waits.iter().enumerate() {
        for &transport in &s.transports {
            let modes = modes_of(s, transport);
            let mut ends = Ends::start(s, transport, wait, &modes, dir.path(), progress).await?;
            let bench = Bench {
                settings: s,
                transport,
                wait,
                target: ends.target.as_mut(),
                peer: ends.peer.as_mut(),
                far: ends.far.as_mut(),
                channels: ends.channels.as_mut(),
                progress,
                next_tag: 0,
                dir: dir.path(),
            };
            let result = transport_sections(bench, &modes, pass).await;
            ends.stop().await;
            sections.extend(result?);
        }
    }
    relate_waits(&mut sections);
    Ok(sections)
}

async fn transport_sections(
    mut bench: Bench<'_>,
    modes: &[&'static dyn Mode],
    pass: usize,
) -> anyhow::Result<Vec<Section>> {
    let s = bench.settings;
    let (transport, wait) = (bench.transport, bench.wait);
    let broker = bench.target.as_deref().map(|t| t.description.clone());
    let peer = bench.channels.as_deref().map(ChannelPeer::description);
    let mut limits = bench.measure_limits().await?;
    bench.progress.done_one();
    let mut sections = Vec::new();
    for &mode in modes {
        let mut figures = Vec::new();
        if s.wants(Group::Size) {
            for &p in &s.payloads {
                let limit = bench.max_message_size();
                if p.saturating_add(HEADER_ROOM) > limit {
                    // Only a broker at --url can be too small: ours are sized to fit.
                    figures.push(Figure {
                        group: Some(Group::Size),
                        label: size_label(p),
                        payload: p,
                        note: Some(format!(
                            "not measured: larger than the broker's maximum message size ({limit} bytes)"
                        )),
                        ..Figure::default()
                    });
                } else {
                    figures.push(bench.size(mode, p).await?);
                }
                bench.progress.done_one();
            }
        }
        for (group, list) in [
            (Group::Connections, &s.connections),
            (Group::InFlight, &s.in_flight),
        ] {
            if !s.wants(group) {
                continue;
            }
            let mut sweep = bench.sweep(mode, group, list).await?;
            relate_to_first(&mut sweep);
            figures.extend(sweep);
        }
        if s.wants(Group::RoundTrip) {
            figures.push(bench.round_trip(mode).await?);
            bench.progress.done_one();
        }
        if s.wants(Group::Rate) {
            figures.push(bench.rate(mode).await?);
            bench.progress.done_one();
        }
        for f in &mut figures {
            f.note_unsteady_limits();
            f.note_shared_cpu();
        }
        let runs_on = if mode.needs_broker() { &broker } else { &peer };
        sections.push(Section {
            transport,
            mode: Some(mode.name()),
            wait: wait.to_string(),
            brokered: mode.needs_broker(),
            about: mode.about().to_owned(),
            broker: runs_on.clone().unwrap_or_default(),
            figures,
        });
    }
    if wants_memory(s, transport, pass) {
        bench.progress.doing(format!(
            "{transport} broker memory, {} idle connections",
            s.idle_connections
        ));
        let memory = if s.url.is_some() || transport.in_process() {
            None
        } else {
            idle::measure(transport, s.idle_connections, bench.dir).await?
        };
        limits.push(Figure {
            group: Some(Group::Memory),
            label: format!("broker memory, {} idle connections", s.idle_connections),
            connections: s.idle_connections,
            memory,
            note: memory
                .is_none()
                .then(|| "not measured: the broker is not a child process of the bench".into()),
            ..Figure::default()
        });
        bench.progress.done_one();
    }
    if !limits.is_empty() {
        sections.push(Section {
            transport,
            mode: None,
            wait: wait.to_string(),
            brokered: broker.is_some(),
            about: if broker.is_some() {
                "bare limits of the transport and the broker's idle memory"
            } else {
                "bare limits of the transport"
            }
            .into(),
            broker: broker.or(peer).unwrap_or_default(),
            figures: limits,
        });
    }
    Ok(sections)
}

/// Sets each round trip measured with a wait strategy beside the same
/// figure with the default wait, from the same run: latency mode against
/// the default mode.
fn relate_waits(sections: &mut [Section]) {
    let defaults: Vec<(Transport, &'static str, f64)> = sections
        .iter()
        .filter(|s| s.wait == Wait::DEFAULT.to_string())
        .filter_map(|s| Some((s.transport, s.mode?, round_trip_p50(s)?)))
        .collect();
    for section in sections
        .iter_mut()
        .filter(|s| s.wait != Wait::DEFAULT.to_string())
    {
        let Some(&(_, _, default_p50)) = defaults
            .iter()
            .find(|(t, m, _)| *t == section.transport && Some(*m) == section.mode)
        else {
            continue;
        };
        for f in &mut section.figures {
            if f.group != Some(Group::RoundTrip) {
                continue;
            }
            let p50 = f.latency.as_ref().map(|l| l.median.p50_us);
            f.baselines.push(Baseline::measured(
                "p50 with the default wait",
                "us",
                super::report::Stat::of(vec![default_p50]),
                p50,
            ));
        }
    }
}

fn round_trip_p50(s: &Section) -> Option<f64> {
    s.figures
        .iter()
        .find(|f| f.group == Some(Group::RoundTrip))
        .and_then(|f| f.latency.as_ref())
        .map(|l| l.median.p50_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::args::BenchArgs;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn the_plan_counts_every_figure() {
        let cli = Cli::try_parse_from([
            "tubeway",
            "bench",
            "--transport",
            "tcp,unix",
            "--mode",
            "call,echo",
            "--payload",
            "1KB,2KB,3KB",
            "--connections",
            "1,2",
            "--in-flight",
            "1",
            "--figures",
            "size,connections,in-flight,rate,memory",
        ])
        .unwrap();
        let Command::Bench(args) = cli.command else {
            panic!()
        };
        let s = Settings::resolve(&BenchArgs { ..args }).unwrap();
        // Per transport: limits, 2 modes × (3 sizes + 2 + 1 + rate), memory.
        assert_eq!(planned(&s), 2 * (1 + 2 * 7 + 1));
    }
}
