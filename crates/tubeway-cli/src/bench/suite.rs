//! The whole run: for each transport, its limits, then each mode's figures.

use std::path::{Path, PathBuf};

use super::args::{Group, Settings};
use super::bare::Peer;
use super::figures::{
    limit_figure, relate_to_first, size_label, Bench, SHM_MISSING, SHM_PING_PONG,
};
use super::idle;
use super::progress::Progress;
use super::report::{Figure, Section};
use super::target::{Target, HEADER_ROOM};
use super::transport::{BareKind, Transport};

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
    let per_transport = 1 + s.modes.len() * per_mode + usize::from(s.wants(Group::Memory));
    (s.transports.len() * per_transport) as u64
}

/// Measures everything `settings` asks for.
pub async fn run(s: &Settings, progress: &Progress) -> anyhow::Result<Vec<Section>> {
    let dir = WorkDir::new()?;
    let mut sections = Vec::new();
    for &transport in &s.transports {
        progress.doing(format!("{transport}: starting the broker"));
        let mut target = Target::start(
            transport,
            s.url.as_deref(),
            s.largest_payload(),
            dir.path(),
            "broker",
        )
        .await?;
        let mut peer = match transport.bare() {
            BareKind::Socket => {
                let d = dir.path().to_owned();
                Some(tokio::task::spawn_blocking(move || Peer::start(transport, &d)).await??)
            }
            BareKind::None | BareKind::SharedMemory => None,
        };
        let result = transport_sections(s, &mut target, peer.as_mut(), progress, dir.path()).await;
        target.stop().await;
        if let Some(p) = peer {
            let _ = tokio::task::spawn_blocking(move || p.stop()).await;
        }
        sections.extend(result?);
    }
    Ok(sections)
}

async fn transport_sections(
    s: &Settings,
    target: &mut Target,
    peer: Option<&mut Peer>,
    progress: &Progress,
    dir: &Path,
) -> anyhow::Result<Vec<Section>> {
    let transport = target.transport;
    let broker = target.description.clone();
    let mut bench = Bench {
        settings: s,
        target,
        peer,
        progress,
        next_tag: 0,
        dir,
    };
    let stream = bench.measure_stream().await?;
    progress.done_one();
    let mut sections = Vec::new();
    for &mode in &s.modes {
        let mut figures = Vec::new();
        if s.wants(Group::Size) {
            for &p in &s.payloads {
                let limit = bench.target.max_message_size;
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
                progress.done_one();
            }
        }
        for (group, list, first) in [
            (Group::Connections, &s.connections, "1 connection"),
            (Group::InFlight, &s.in_flight, "1 in flight"),
        ] {
            if !s.wants(group) {
                continue;
            }
            let mut sweep = Vec::new();
            for &n in list {
                let (c, k) = if group == Group::InFlight {
                    (1, n)
                } else {
                    (n, 1)
                };
                sweep.push(bench.sweep(mode, group, c, k).await?);
                progress.done_one();
            }
            // Only a sweep that starts at 1 has a same-run reference to relate to.
            if list.first() == Some(&1) {
                relate_to_first(&mut sweep, first);
            }
            figures.extend(sweep);
        }
        if s.wants(Group::RoundTrip) {
            figures.push(bench.round_trip(mode).await?);
            progress.done_one();
        }
        if s.wants(Group::Rate) {
            figures.push(bench.rate(mode).await?);
            progress.done_one();
        }
        sections.push(Section {
            transport,
            mode: Some(mode.name()),
            about: mode.about().to_owned(),
            broker: broker.clone(),
            figures,
        });
    }
    let mut limits = vec![limits_figure(transport, stream)];
    limits.push(limit_figure(SHM_PING_PONG, None, Some(SHM_MISSING)));
    if s.wants(Group::Memory) {
        progress.doing(format!(
            "{transport} broker memory, {} idle connections",
            s.idle_connections
        ));
        let memory = if s.url.is_some() || transport.in_process() {
            None
        } else {
            idle::measure(transport, s.idle_connections, dir).await?
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
        progress.done_one();
    }
    sections.push(Section {
        transport,
        mode: None,
        about: "bare limits of the transport and the broker's idle memory".into(),
        broker,
        figures: limits,
    });
    Ok(sections)
}

fn limits_figure(transport: Transport, stream: Option<super::report::Stat>) -> Figure {
    let label = "bare socket streaming, 1 MiB writes, two processes";
    match transport.bare() {
        BareKind::Socket => limit_figure(label, stream, None),
        BareKind::None | BareKind::SharedMemory => limit_figure(
            label,
            None,
            Some("not applicable: no socket on this transport"),
        ),
    }
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
        // Per transport: streaming, 2 modes × (3 sizes + 2 + 1 + rate), memory.
        assert_eq!(planned(&s), 2 * (1 + 2 * 7 + 1));
    }
}
