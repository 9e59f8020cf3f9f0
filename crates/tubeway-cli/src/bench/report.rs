//! The report: every figure with its bare limits, as the table, the JSON and
//! the plot see it.

use serde::Serialize;

use super::args::Group;
use super::latency::{CurvePoint, Latency};
use super::machine::Machine;
use super::modes::ClientKind;
use super::placement::Placement;
use super::transport::Transport;

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The command line, as given.
    pub command: String,
    /// `tubeway` version.
    pub version: &'static str,
    /// `release` or `debug`: a debug build's figures mean little.
    pub build: &'static str,
    /// The machine, with its load before and after the run.
    pub machine: Machine,
    /// How each figure was measured.
    pub method: Method,
    /// One per transport and mode, and one per transport for its limits.
    pub sections: Vec<Section>,
}

/// How figures were measured.
#[derive(Debug, Serialize)]
pub struct Method {
    /// Warm-up before each figure, not measured.
    pub warmup_ms: u64,
    /// Measuring time of each run.
    pub duration_ms: u64,
    /// Runs of each figure; figures are the median, with the min and max.
    pub runs: usize,
    /// Length of the fixed-rate latency run (one run).
    pub latency_duration_ms: u64,
    /// Offered rate of the latency figure, msg/s.
    pub rate: u64,
    /// Whether `--quick` chose the defaults.
    pub quick: bool,
    /// Whether everything ran on one CPU (`--one-cpu`).
    pub one_cpu: bool,
    /// Whether the bench ran on CPU 0 and its child processes on CPU 1
    /// (`--split-cpus`).
    pub split_cpus: bool,
    /// Worker threads of the runtime that runs the `AsyncClient` tasks
    /// (`TOKIO_WORKER_THREADS`, else one per CPU): on a small machine the
    /// async figures over shm depend on it (docs/performance.md).
    pub runtime_workers: usize,
    /// In words.
    pub summary: String,
}

/// The figures of one transport and mode (or of a transport's limits).
#[derive(Debug, Serialize)]
pub struct Section {
    /// The transport.
    pub transport: Transport,
    /// The mode; `None` for the transport's limits.
    pub mode: Option<&'static str>,
    /// How every side waited (`--wait`): `default`, or a strategy.
    pub wait: String,
    /// What one operation is, or what the limits section holds.
    pub about: String,
    /// Whether the operations go through a broker (else to a channel peer).
    pub brokered: bool,
    /// Where the broker (or the channel peer) runs.
    pub broker: String,
    /// The figures, in the order measured.
    pub figures: Vec<Figure>,
}

/// One figure.
#[derive(Debug, Default, Serialize)]
pub struct Figure {
    /// Its group; `None` for a bare limit or memory figure.
    pub group: Option<Group>,
    /// A label for people: `5 KB`, `4 connections`, `16 in flight`.
    pub label: String,
    /// Payload of each message, bytes.
    pub payload: usize,
    /// Connections sending.
    pub connections: usize,
    /// Requests in flight per connection.
    pub in_flight: usize,
    /// The client that drove the operations.
    pub client: Option<ClientKind>,
    /// Operations completed per second.
    pub msgs_per_sec: Option<Stat>,
    /// Payload megabytes (10^6 bytes) per second, one way.
    pub mb_per_sec: Option<Stat>,
    /// Deliveries to subscribers per second (publish).
    pub deliveries_per_sec: Option<Stat>,
    /// Deliveries dropped by the broker over all runs (publish).
    pub drops: Option<u64>,
    /// Latency, when the figure measures it.
    pub latency: Option<LatencyFigure>,
    /// The bare limits beside this figure.
    pub baselines: Vec<Baseline>,
    /// Peak resident memory during the last run.
    pub rss: Option<Rss>,
    /// The broker's memory idle and with idle connections.
    pub memory: Option<IdleMemory>,
    /// Anything a reader must know about this figure.
    pub note: Option<String>,
}

/// A bare ping-pong that made at least this share of its exchanges with
/// both ends on one CPU, while nothing pinned them, is noted: its
/// wake-ups were switches on one CPU, not signals to another.
pub const SHARED_CPU_NOTED: f64 = 0.1;

/// A limit beside a figure whose runs differ by more than this factor was
/// measured in more than one of the machine's modes (docs/performance.md,
/// "Method"): a ratio to its median says little. On this kind of machine a
/// bare socket ping-pong measured 6 µs in one run and 74 µs in the next,
/// its two ends left on one CPU in the first and on two in the second.
pub const UNSTEADY_LIMIT: f64 = 3.0;

impl Figure {
    /// Notes each limit beside this figure whose runs differ by more than
    /// [`UNSTEADY_LIMIT`], after any note it has.
    pub fn note_unsteady_limits(&mut self) {
        let unsteady: Vec<String> = self
            .baselines
            .iter()
            .filter_map(|b| {
                let v = b.value.as_ref()?;
                (v.min > 0.0 && v.max / v.min > UNSTEADY_LIMIT).then(|| {
                    format!(
                        "{} {}-{} {}",
                        b.name,
                        super::table::num(v.min),
                        super::table::num(v.max),
                        b.unit
                    )
                })
            })
            .collect();
        if unsteady.is_empty() {
            return;
        }
        let mut text = format!(
            "the machine changed modes during the runs of a limit, whose ratio says little: {}",
            unsteady.join("; ")
        );
        if Placement::current() == Placement::Free {
            // The likeliest mode of all: where the scheduler put the ends.
            text.push_str(" (--split-cpus or --one-cpu fix where the two ends run)");
        }
        self.add_note(text);
    }

    /// Notes each limit beside this figure that ran with both ends on one
    /// CPU in at least [`SHARED_CPU_NOTED`] of its exchanges, when nothing
    /// pinned the processes: the scheduler put them together, and the
    /// figure beside it may have run across the CPUs (docs/performance.md,
    /// "Results").
    pub fn note_shared_cpu(&mut self) {
        if Placement::current() != Placement::Free {
            return;
        }
        let shared: Vec<String> = self
            .baselines
            .iter()
            .filter_map(|b| {
                let share = b.shared_cpu.filter(|s| *s >= SHARED_CPU_NOTED)?;
                Some(format!(
                    "{}: {:.0}% of its exchanges",
                    b.name,
                    share * 100.0
                ))
            })
            .collect();
        if shared.is_empty() {
            return;
        }
        let mut text = format!(
            "both ends on one CPU (a wake-up there is a switch on that CPU, not a signal to the \
             other): {}",
            shared.join("; ")
        );
        if !self
            .note
            .as_ref()
            .is_some_and(|n| n.contains("--split-cpus"))
        {
            text.push_str(" (--split-cpus puts every pair of ends on two CPUs)");
        }
        self.add_note(text);
    }

    fn add_note(&mut self, text: String) {
        self.note = Some(match self.note.take() {
            Some(note) => format!("{note}; {text}"),
            None => text,
        });
    }
}

/// A figure over several runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stat {
    /// Median of the runs.
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Every run, in order.
    pub runs: Vec<f64>,
}

impl Stat {
    /// The statistics of `runs`; `None` when there are none.
    pub fn of(runs: Vec<f64>) -> Option<Stat> {
        let median = median(&runs)?;
        let min = runs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Stat {
            median,
            min,
            max,
            runs,
        })
    }
}

/// The median of `v`; the mean of the middle two for an even count.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let mid = |i: usize| s.get(i).copied();
    match n {
        0 => None,
        _ if n % 2 == 1 => mid(n / 2),
        _ => Some((mid(n / 2 - 1)? + mid(n / 2)?) / 2.0),
    }
}

/// A latency figure.
#[derive(Debug, Serialize)]
pub struct LatencyFigure {
    /// Field by field, the median of the runs.
    pub median: Latency,
    /// Each run.
    pub runs: Vec<Latency>,
    /// The percentile curve of the run whose p50 is the median
    /// ([`super::latency::median_run`]), for plots.
    pub curve: Vec<CurvePoint>,
    /// For a fixed-rate figure: the rate offered, msg/s.
    pub offered_rate: Option<u64>,
    /// For a fixed-rate figure: the rate completed, msg/s.
    pub achieved_rate: Option<f64>,
    /// For a fixed-rate figure: how late the sender fell behind its
    /// schedule at worst, in microseconds (included in the latencies).
    pub sender_lag_us: Option<f64>,
}

/// A bare limit beside a figure.
#[derive(Debug, Serialize)]
pub struct Baseline {
    /// What was measured.
    pub name: String,
    /// `msg/s`, `MB/s` or `us`.
    pub unit: &'static str,
    /// The figure; `None` when no run measured it.
    pub value: Option<Stat>,
    /// The figure divided by this limit. For a limit measured run for run
    /// with the figure (every bare limit, and the first point of a sweep),
    /// the median of the runs' ratios; otherwise the ratio of the medians.
    pub ratio: Option<f64>,
    /// For a socket ping-pong: the share of its exchanges made with both
    /// ends on one CPU (the median over the runs).
    pub shared_cpu: Option<f64>,
}

impl Baseline {
    /// A measured limit; `figure` is the median it is compared with.
    pub fn measured(
        name: impl Into<String>,
        unit: &'static str,
        value: Option<Stat>,
        figure: Option<f64>,
    ) -> Baseline {
        let ratio = match (&value, figure) {
            (Some(v), Some(f)) if v.median > 0.0 => Some(f / v.median),
            _ => None,
        };
        Baseline {
            name: name.into(),
            unit,
            value,
            ratio,
            shared_cpu: None,
        }
    }

    /// The same, with the share of its exchanges made on one CPU.
    pub fn on_one_cpu(self, shared_cpu: Option<f64>) -> Baseline {
        Baseline { shared_cpu, ..self }
    }

    /// A limit measured run for run beside `figure`: the ratio is the
    /// median of the runs' ratios, so that a run in which the machine was
    /// slow counts as one run, whichever of the two it fell on, instead of
    /// setting the median of one side against a run of another speed on
    /// the other. Runs without a partner (unequal counts) are left out.
    pub fn paired(
        name: impl Into<String>,
        unit: &'static str,
        value: Option<Stat>,
        figure: Option<&Stat>,
    ) -> Baseline {
        let ratio = match (&value, figure) {
            (Some(v), Some(f)) => {
                let ratios: Vec<f64> = f
                    .runs
                    .iter()
                    .zip(&v.runs)
                    .filter(|(_, v)| **v > 0.0)
                    .map(|(f, v)| f / v)
                    .collect();
                median(&ratios)
            }
            _ => None,
        };
        Baseline {
            ratio,
            ..Baseline::measured(name, unit, value, None)
        }
    }
}

/// Peak resident memory (VmHWM) during a run, KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Rss {
    /// The bench process.
    pub bench_kib: Option<u64>,
    /// The broker (or channel peer) process; `None` when it is this
    /// process or unknown.
    pub broker_kib: Option<u64>,
}

/// The broker's resident memory idle and with idle connections, KiB.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct IdleMemory {
    /// No connection.
    pub idle_kib: u64,
    /// One connection.
    pub one_connection_kib: u64,
    /// With `connections` more idle connections.
    pub loaded_kib: u64,
    /// The idle connections added.
    pub connections: usize,
    /// `(loaded - one) / connections`.
    pub per_connection_kib: f64,
    /// CPU time the broker used while holding those connections idle for
    /// `idle_ms`, in milliseconds.
    pub idle_cpu_ms: Option<f64>,
    /// How long the connections were held idle.
    pub idle_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        let s = Stat::of(vec![2.0, 9.0, 4.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (4.0, 2.0, 9.0));
        assert!(Stat::of(Vec::new()).is_none());
    }

    #[test]
    fn ratios_need_both_sides() {
        let bare = Stat::of(vec![200.0]);
        let b = Baseline::measured("bare", "msg/s", bare.clone(), Some(50.0));
        assert_eq!(b.ratio, Some(0.25));
        assert_eq!(Baseline::measured("bare", "msg/s", bare, None).ratio, None);
        assert_eq!(
            Baseline::measured("bare", "msg/s", Stat::of(vec![0.0]), Some(1.0)).ratio,
            None
        );
    }

    #[test]
    fn limits_measured_in_two_modes_are_noted() {
        let with = |runs: Vec<f64>, note: Option<&str>| {
            let mut f = Figure {
                baselines: vec![
                    Baseline::measured("steady", "us", Stat::of(vec![50.0, 60.0]), Some(55.0)),
                    Baseline::measured("bare ping-pong", "us", Stat::of(runs), Some(55.0)),
                ],
                note: note.map(str::to_owned),
                ..Figure::default()
            };
            f.note_unsteady_limits();
            f.note
        };
        // 3x apart at most: one mode.
        assert_eq!(with(vec![20.0, 60.0, 59.0], None), None);
        let note = with(vec![6.0, 74.0, 69.0], None).unwrap_or_default();
        assert!(note.contains("bare ping-pong 6.00-74.0 us"), "{note}");
        assert!(note.ends_with("fix where the two ends run)"), "{note}");
        assert!(!note.contains("steady"), "{note}");
        let note = with(vec![6.0, 74.0], Some("earlier")).unwrap_or_default();
        assert!(
            note.starts_with("earlier; the machine changed modes"),
            "{note}"
        );
        // A limit of 0 (not measured in a run) is no mode.
        assert_eq!(with(vec![0.0, 74.0], None), None);
    }

    #[test]
    fn limits_run_on_one_cpu_are_noted() {
        // Unit tests run unpinned: the placement is the scheduler's.
        assert_eq!(Placement::current(), Placement::Free);
        let with = |shares: [Option<f64>; 2], note: Option<&str>| {
            let mut f = Figure {
                baselines: vec![
                    Baseline::measured("shm ping-pong", "us", Stat::of(vec![0.5]), Some(1.0))
                        .on_one_cpu(shares[0]),
                    Baseline::measured("bare socket ping-pong", "us", Stat::of(vec![6.0]), None)
                        .on_one_cpu(shares[1]),
                ],
                note: note.map(str::to_owned),
                ..Figure::default()
            };
            f.note_shared_cpu();
            f.note
        };
        assert_eq!(with([None, None], None), None);
        assert_eq!(with([None, Some(0.0)], None), None);
        assert_eq!(with([None, Some(0.09)], None), None);
        let note = with([None, Some(0.97)], None).unwrap_or_default();
        assert!(
            note.contains("bare socket ping-pong: 97% of its exchanges"),
            "{note}"
        );
        assert!(note.ends_with("(--split-cpus puts every pair of ends on two CPUs)"));
        assert!(!note.contains("shm"), "{note}");
        let note = with([Some(0.5), Some(1.0)], Some("earlier")).unwrap_or_default();
        assert!(note.starts_with("earlier; both ends on one CPU"), "{note}");
        assert!(note.contains("shm ping-pong: 50%"), "{note}");
        assert!(note.contains("bare socket ping-pong: 100%"), "{note}");
        // Said once is enough.
        let note = with([None, Some(1.0)], Some("(--split-cpus or --one-cpu ...)"));
        assert_eq!(note.unwrap_or_default().matches("--split-cpus").count(), 1);
    }

    #[test]
    fn paired_ratios_are_taken_run_by_run() {
        // The limit went from 200 to 100 in the third run, and the figure
        // with it: each run says 0.5x. The medians (150 against 100) would
        // say 0.67x.
        let bare = Stat::of(vec![200.0, 200.0, 100.0, 100.0]);
        let figure = Stat::of(vec![100.0, 100.0, 50.0, 50.0]);
        let b = Baseline::paired("bare", "msg/s", bare.clone(), figure.as_ref());
        assert_eq!(b.ratio, Some(0.5));
        assert_eq!(b.value, bare);
        // A run without a partner, or with a limit of 0, is left out.
        let b = Baseline::paired(
            "bare",
            "msg/s",
            Stat::of(vec![0.0, 200.0]),
            Stat::of(vec![10.0, 100.0, 300.0]).as_ref(),
        );
        assert_eq!(b.ratio, Some(0.5));
        assert_eq!(Baseline::paired("bare", "msg/s", bare, None).ratio, None);
        assert_eq!(
            Baseline::paired("bare", "msg/s", None, figure.as_ref()).ratio,
            None
        );
    }
}
